//! The driver calls on the wire, generated from the boundary's one table
//! ([`for_each_driver_call!`](cuda_endpoints_driver::for_each_driver_call)): the request
//! enum [`WireCall`], the client's [`Driver`] implementation
//! ([`super::Remote`]) and the server's dispatch. A row added to the table
//! crosses the wire with no change here.

use serde::{Deserialize, Serialize};

#[allow(unused_imports)]
use crate::driver::{
    AllocationRequest, Call, Code, CopyOp, Device, Driver, DriverResult, EndpointProps,
    FabricHandleBytes, Granularity, Limits, MemcpyOp, Pointer, ShareableHandle, ShareableKind,
};

/// The body of a `Remote` method: the wire, except for the shareable-handle
/// calls, whose descriptors must be made and read in the client's own OS
/// process (`Remote::mem_export_here` / `mem_import_here`).
macro_rules! remote_body {
    ($self:ident, mem_export, $variant:ident, ($($arg:ident),*)) => {
        $self.mem_export_here($($arg),*)
    };
    ($self:ident, mem_import, $variant:ident, ($($arg:ident),*)) => {
        // SAFETY: the caller upholds `mem_import`'s contract (the
        // descriptor is open for the call).
        unsafe { $self.mem_import_here($($arg),*) }
    };
    // The data path: host bytes travel in the messages (`data.rs`).
    ($self:ident, fabric_copy_batch, $variant:ident, ($($arg:ident),*)) => {
        // SAFETY: the caller upholds `fabric_copy_batch`'s contract.
        unsafe { $self.fabric_copy_here($($arg),*) }
    };
    ($self:ident, memcpy_async, $variant:ident, ($($arg:ident),*)) => {
        // SAFETY: the caller upholds `memcpy_async`'s contract.
        unsafe { $self.memcpy_here($($arg),*) }
    };
    ($self:ident, memcpy_batch_async, $variant:ident, ($($arg:ident),*)) => {
        // SAFETY: the caller upholds `memcpy_batch_async`'s contract.
        unsafe { $self.memcpy_batch_here($($arg),*) }
    };
    ($self:ident, stream_synchronize, $variant:ident, ($($arg:ident),*)) => {
        // SAFETY: the contract of the copies on the stream (their host
        // destinations are writable until the stream passed them).
        unsafe { $self.stream_here(WireCall::$variant { $($arg),* }) }.map(|_| ())
    };
    ($self:ident, stream_destroy, $variant:ident, ($($arg:ident),*)) => {
        // SAFETY: as `stream_synchronize`.
        unsafe { $self.stream_here(WireCall::$variant { $($arg),* }) }.map(|_| ())
    };
    ($self:ident, stream_query, $variant:ident, ($($arg:ident),*)) => {
        // SAFETY: as `stream_synchronize`.
        unsafe { $self.stream_here(WireCall::$variant { $($arg),* }) }
    };
    // An event completes copies as a synchronize does (F4): their host
    // destinations are written here too.
    ($self:ident, event_synchronize, $variant:ident, ($($arg:ident),*)) => {
        // SAFETY: as `stream_synchronize`, for the event's stream.
        unsafe { $self.stream_here(WireCall::$variant { $($arg),* }) }.map(|_| ())
    };
    ($self:ident, event_query, $variant:ident, ($($arg:ident),*)) => {
        // SAFETY: as `stream_synchronize`, for the event's stream.
        unsafe { $self.stream_here(WireCall::$variant { $($arg),* }) }
    };
    ($self:ident, $method:ident, $variant:ident, ($($arg:ident),*)) => {
        $self.call(WireCall::$variant { $($arg),* })
    };
}

/// Whether the server refuses `call` from a client: a shareable handle made
/// in the server would be a descriptor of the server's OS process, which
/// means nothing to the client (clients use `Request::ExportShareable`);
/// a host pointer of the client means nothing here either, so the data path
/// goes as `Request::HostCopy` / `Request::HostSync` (`data.rs`).
fn client_side_only(call: &WireCall) -> bool {
    matches!(
        call,
        WireCall::MemExportToShareableHandle { .. }
            | WireCall::MemImportFromShareableHandle { .. }
            | WireCall::FabricCpyBatchAsync { .. }
            | WireCall::MemcpyAsync { .. }
            | WireCall::MemcpyBatchAsync { .. }
            | WireCall::StreamSynchronize { .. }
            | WireCall::StreamQuery { .. }
            | WireCall::StreamDestroy { .. }
            | WireCall::EventSynchronize { .. }
            | WireCall::EventQuery { .. }
    )
}

macro_rules! wire_calls {
    ($( $(#[$meta:meta])* [$family:ident] $variant:ident $cname:literal
        safety $safety:literal
        fn $method:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty; )*) => {
        /// One driver call with its arguments, as a client sends it.
        #[derive(Clone, Debug, Serialize, Deserialize)]
        pub enum WireCall {
            $(
                #[doc = concat!("`", $cname, "`.")]
                $variant {
                    $(
                        #[allow(missing_docs)]
                        $arg: $ty,
                    )*
                },
            )*
        }

        impl WireCall {
            /// The entry point.
            pub fn call(&self) -> Call {
                match self {
                    $(WireCall::$variant { .. } => Call::$variant,)*
                }
            }
        }

        /// Makes `call` on `driver` (a process of the server's world) and
        /// encodes the return value.
        pub(super) fn dispatch(driver: &dyn Driver, call: WireCall) -> Result<Vec<u8>, Code> {
            if client_side_only(&call) {
                return Err(Code::NOT_SUPPORTED);
            }
            match call {
                $(
                    WireCall::$variant { $($arg),* } => {
                        // SAFETY: the driver is the model's process for
                        // this connection, which no typed object of this
                        // (server) process uses: the ids, handles and
                        // bindings named are the remote process's own, and
                        // the model checks every rule of the contract.
                        let value: $ret = unsafe { driver.$method($($arg),*) }?;
                        postcard::to_stdvec(&value).map_err(|_| Code::UNKNOWN)
                    }
                )*
            }
        }

        impl Driver for super::Remote {
            fn name(&self) -> String {
                "fabric".into()
            }

            $(
                #[allow(clippy::too_many_arguments)]
                unsafe fn $method(&self $(, $arg: $ty)*) -> DriverResult<$ret> {
                    remote_body!(self, $method, $variant, ($($arg),*))
                }
            )*
        }
    };
}

cuda_endpoints_driver::for_each_driver_call!(wire_calls);
