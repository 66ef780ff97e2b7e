//! The one table of driver calls, and what is generated from it: [`Call`]
//! (names, families), the [`Driver`] trait, the [`Forward`] trait that lets a
//! wrapper forward what it does not change, and `Arc<D>` as a driver.
//!
//! Adding a driver call touches three places: a row of
//! [`for_each_driver_call!`](crate::for_each_driver_call), the real backend's
//! C declaration and marshalling (`cuda/`), and the model's rule.
//! Everything else (the `Call` variant, the trait method, forwarding, the
//! trace's argument formatting, the classic fallback's pass-through) follows
//! from the row.

use std::fmt;
use std::sync::Arc;

use super::{Code, DriverResult};

/// Calls `$callback! { rows }` with every driver call of the boundary, one row
/// per C entry point, so that other modules generate code from the same list
/// (the trait, the trace, a wire protocol...).
///
/// Each row reads:
///
/// ```text
/// /// Doc lines (become the trait method's docs).
/// [Family] Variant "cuName" safety "rules the caller takes on"
///     fn method(arg: Type, ...) -> Ret;
/// ```
///
/// - `Family` is a [`Family`] variant name (`Base`, `LogicalEndpoint`, `Vmm`,
///   `Classic`, `Stream`), `Variant` the [`Call`] variant, `"cuName"` the `cuda.h` name;
/// - the `safety` literal is the method's `# Safety` text: the SPEC rules a
///   direct caller must uphold beyond the trait-wide ones;
/// - arguments and the value inside `DriverResult<Ret>` are owned domain
///   types (`Clone + Debug`, serde with the `serde` feature), never C structs;
///   methods take `&self`.
///
/// A callback therefore matches:
///
/// ```text
/// macro_rules! my_callback {
///     ($( $(#[$meta:meta])* [$family:ident] $variant:ident $cname:literal
///         safety $safety:literal
///         fn $method:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty; )*) => { ... };
/// }
/// cuda_endpoints::driver::for_each_driver_call!(my_callback);
/// ```
///
/// Domain types are named by absolute paths (`$crate::Device`...),
/// so the callback needs no imports.
///
/// For example, a request type with one variant per call, and a server
/// side that runs a request on any driver (what a wire protocol needs):
///
/// ```
/// use cuda_endpoints::Device;
/// use cuda_endpoints::driver::{Driver, DriverResult, EndpointProps, Shape, for_each_driver_call};
///
/// macro_rules! protocol {
///     ($( $(#[$meta:meta])* [$family:ident] $variant:ident $cname:literal
///         safety $safety:literal
///         fn $method:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty; )*) => {
///         /// One driver call as a value.
///         #[derive(Clone, Debug)]
///         enum Request { $($variant { $($arg: $ty),* },)* }
///
///         /// Its answer.
///         #[derive(Clone, Debug)]
///         enum Response { $($variant(DriverResult<$ret>),)* }
///
///         impl Request {
///             fn c_name(&self) -> &'static str {
///                 match self { $(Request::$variant { .. } => $cname,)* }
///             }
///
///             /// # Safety
///             /// The contract of the `Driver` method the request names.
///             unsafe fn run(self, d: &dyn Driver) -> Response {
///                 match self {
///                     // SAFETY: passed on to the caller.
///                     $(Request::$variant { $($arg),* } => Response::$variant(unsafe { d.$method($($arg),*) }),)*
///                 }
///             }
///         }
///     };
/// }
/// for_each_driver_call!(protocol);
///
/// # #[cfg(feature = "model")] {
/// let model = cuda_endpoints::model::Model::new(Default::default());
/// let props = EndpointProps::new(Shape::Unicast { owner: Device(0) }, 2 << 20);
/// let r = Request::GetLimits { props };
/// assert_eq!(r.c_name(), "cuLogicalEndpointGetLimits");
/// // SAFETY: a limits query touches nothing anyone owns.
/// let Response::GetLimits(Ok(limits)) = (unsafe { r.run(&model) }) else { panic!() };
/// assert!(limits.max_size >= 2 << 20);
/// # }
/// ```
#[macro_export]
macro_rules! for_each_driver_call {
    ($callback:ident) => {
        $callback! {
            // ---- base calls ----
            /// `cuDriverGetVersion`, e.g. `13030` for 13.3.
            [Base] DriverGetVersion "cuDriverGetVersion" safety "none beyond the trait's"
                fn driver_version() -> i32;
            /// `cuDeviceGetCount`.
            [Base] DeviceGetCount "cuDeviceGetCount" safety "none beyond the trait's"
                fn device_count() -> i32;
            /// `cuDeviceGetAttribute(attr, dev)`; `attr` is the raw attribute
            /// number (see [`attr`](crate::attr)).
            [Base] DeviceGetAttribute "cuDeviceGetAttribute" safety "none beyond the trait's"
                fn device_attribute(dev: $crate::Device, attr: i32) -> i32;
            /// `cuMemGetInfo` on `dev`'s primary context: `(free, total)` bytes.
            [Base] MemGetInfo "cuMemGetInfo" safety "none beyond the trait's"
                fn mem_get_info(dev: $crate::Device) -> (u64, u64);
            /// The id of `dev`'s multicast logical-endpoint clique
            /// (`cuDeviceGetCliqueCount` + `cuDeviceGetCliqueInfo`, type
            /// `CU_CLIQUE_TYPE_MULTICAST_LOGICAL_ENDPOINT`, CUDA 13.4+; SPEC
            /// R4.5): devices of one clique can share a multicast team.
            /// `NOT_SUPPORTED` before 13.4, `NOT_FOUND` for a device in no such clique.
            [Base] DeviceGetCliqueInfo "cuDeviceGetCliqueInfo" safety "none beyond the trait's"
                fn device_clique(dev: $crate::Device) -> u32;

            // ---- logical endpoints (SPEC R1-R10) ----
            /// `cuLogicalEndpointIdReserve(&base, count)` (R1): the first id of
            /// `count` contiguous new ids.
            [LogicalEndpoint] IdReserve "cuLogicalEndpointIdReserve" safety "none beyond the trait's"
                fn id_reserve(count: u32) -> u32;
            /// `cuLogicalEndpointIdRelease(base, count)` (R1).
            [LogicalEndpoint] IdRelease "cuLogicalEndpointIdRelease"
                safety "R1.1, R1.2 and R3.4: the ids are the caller's own, not held by an `IdRange` or `Endpoint`"
                fn id_release(base: u32, count: u32) -> ();
            /// `cuLogicalEndpointGetLimits(&align, &max, &prop)` (R10).
            [LogicalEndpoint] GetLimits "cuLogicalEndpointGetLimits" safety "none beyond the trait's"
                fn get_limits(props: $crate::EndpointProps) -> $crate::Limits;
            /// `cuLogicalEndpointCreate(id, &prop)` (R2); construction goes on
            /// asynchronously (R2.5, R3).
            [LogicalEndpoint] Create "cuLogicalEndpointCreate"
                safety "R2.1 and R3.4: `id` is a reserved id of the caller's own, not held by an `Endpoint`"
                fn create(id: u32, props: $crate::EndpointProps) -> ();
            /// `cuLogicalEndpointAddDevice(id, dev)` (R4).
            [LogicalEndpoint] AddDevice "cuLogicalEndpointAddDevice"
                safety "R4.4: no memory is bound on the endpoint yet; `id` is not held by a typed `Endpoint`"
                fn add_device(id: u32, dev: $crate::Device) -> ();
            /// `cuLogicalEndpointQuery(base, count, &status)` (R3): `true` when
            /// every endpoint in `[base, base+count)` is constructed.
            [LogicalEndpoint] Query "cuLogicalEndpointQuery" safety "none beyond the trait's"
                fn query(base: u32, count: u32) -> bool;
            /// `cuLogicalEndpointBindMem(id, dev, offset, mem, mem_offset, size, flags)` (R5).
            [LogicalEndpoint] BindMem "cuLogicalEndpointBindMem"
                safety "R3.4 (the endpoint was reported constructed) and R7.2: the allocation `mem` outlives the binding, and no typed `Binding` covers the range"
                fn bind_mem(id: u32, dev: $crate::Device, offset: u64, mem: u64, mem_offset: u64, size: u64, flags: u64) -> ();
            /// `cuLogicalEndpointBindAddr(id, dev, offset, ptr, size, flags)` (R5).
            [LogicalEndpoint] BindAddr "cuLogicalEndpointBindAddr"
                safety "R3.4 (the endpoint was reported constructed) and R7.2: the mapping at `ptr` outlives the binding"
                fn bind_addr(id: u32, dev: $crate::Device, offset: u64, ptr: u64, size: u64, flags: u64) -> ();
            /// `cuLogicalEndpointUnbind(id, dev, offset, size)` (R6).
            [LogicalEndpoint] Unbind "cuLogicalEndpointUnbind"
                safety "R6.1, R6.2 and C4: the range is exactly binds the caller made itself, not a typed `Binding`'s"
                fn unbind(id: u32, dev: $crate::Device, offset: u64, size: u64) -> ();
            /// `cuLogicalEndpointDestroy(id)` (R7).
            [LogicalEndpoint] Destroy "cuLogicalEndpointDestroy"
                safety "R3.4 and R7.2: `id` holds an endpoint of the caller's own, not a typed `Endpoint`'s, and no kernel still uses it"
                fn destroy(id: u32) -> ();
            /// `cuLogicalEndpointExport(&handle, id, FABRIC)` (R8): the 64-byte
            /// fabric handle.
            [LogicalEndpoint] Export "cuLogicalEndpointExport" safety "R3.4: `id` holds an endpoint"
                fn export(id: u32) -> $crate::FabricHandleBytes;
            /// `cuLogicalEndpointImport(id, &handle, FABRIC)` (R9).
            [LogicalEndpoint] Import "cuLogicalEndpointImport"
                safety "R2.1 and R3.4: `id` is a free reserved id of the caller's own, not held by an `Endpoint`"
                fn import(id: u32, handle: $crate::FabricHandleBytes) -> ();

            // ---- VMM: the memory that gets bound ----
            /// `cuMemGetAllocationGranularity` for `req`.
            [Vmm] MemGetAllocationGranularity "cuMemGetAllocationGranularity" safety "none beyond the trait's"
                fn mem_granularity(req: $crate::AllocationRequest, kind: $crate::Granularity) -> u64;
            /// `cuMemCreate(&handle, size, &prop, 0)`: a new allocation's handle.
            [Vmm] MemCreate "cuMemCreate" safety "none beyond the trait's"
                fn mem_create(size: u64, req: $crate::AllocationRequest) -> u64;
            /// `cuMemRelease(handle)`: allocations and classic multicast objects (C5).
            [Vmm] MemRelease "cuMemRelease"
                safety "R7.2 and C5: `handle` is the caller's own (not an `Allocation`'s) and nothing bound to or through it is still in use"
                fn mem_release(handle: u64) -> ();
            /// `cuMemGetAllocationPropertiesFromHandle`: where the memory lives (R5.5).
            [Vmm] MemGetAllocationProperties "cuMemGetAllocationPropertiesFromHandle" safety "none beyond the trait's"
                fn mem_properties(handle: u64) -> $crate::AllocationRequest;
            /// `cuMemExportToShareableHandle(&out, handle, kind, 0)` (C5) of an
            /// allocation or classic multicast object created with `kind`
            /// among its handle types: a POSIX descriptor that the caller now
            /// owns (and closes), or 64 fabric bytes.
            [Vmm] MemExportToShareableHandle "cuMemExportToShareableHandle" safety "none beyond the trait's"
                fn mem_export(handle: u64, kind: $crate::ShareableKind) -> $crate::ShareableHandle;
            /// `cuMemImportFromShareableHandle(&handle, os_handle, kind)` (C5,
            /// R12.4): this process's own new handle on the memory or classic
            /// multicast object behind `shared`, released with `cuMemRelease`.
            [Vmm] MemImportFromShareableHandle "cuMemImportFromShareableHandle"
                safety "a `PosixFd` names a descriptor that is open in this process for the whole call"
                fn mem_import(shared: $crate::ShareableHandle) -> u64;
            /// `cuMemAddressReserve(&ptr, size, alignment, 0, 0)`.
            [Vmm] MemAddressReserve "cuMemAddressReserve" safety "none beyond the trait's"
                fn mem_address_reserve(size: u64, alignment: u64) -> u64;
            /// `cuMemAddressFree(ptr, size)`.
            [Vmm] MemAddressFree "cuMemAddressFree"
                safety "the range is the caller's own (not a `Mapped`'s) and nothing is mapped in it"
                fn mem_address_free(ptr: u64, size: u64) -> ();
            /// `cuMemMap(ptr, size, offset, handle, 0)`.
            [Vmm] MemMap "cuMemMap"
                safety "the range at `ptr` is a reservation of the caller's own"
                fn mem_map(ptr: u64, size: u64, offset: u64, handle: u64) -> ();
            /// `cuMemUnmap(ptr, size)`.
            [Vmm] MemUnmap "cuMemUnmap"
                safety "R7.2: the mapping is the caller's own (not a `Mapped`'s) and is bound to no endpoint"
                fn mem_unmap(ptr: u64, size: u64) -> ();
            /// `cuMemSetAccess(ptr, size, [{device, READWRITE}, ...])` for each device.
            [Vmm] MemSetAccess "cuMemSetAccess" safety "the range at `ptr` is a mapping of the caller's own"
                fn mem_set_access(ptr: u64, size: u64, devices: Vec<$crate::Device>) -> ();

            // ---- classic multicast (SPEC C1-C6) ----
            /// `cuMulticastGetGranularity` for a team of `num_devices` (C2).
            [Classic] MulticastGetGranularity "cuMulticastGetGranularity" safety "none beyond the trait's"
                fn multicast_granularity(num_devices: u32, size: u64, handle_types: u64, kind: $crate::Granularity) -> u64;
            /// `cuMulticastCreate(&handle, {num_devices, size, handle_types, flags: 0})` (C1).
            [Classic] MulticastCreate "cuMulticastCreate"
                safety "C6: every team device reports MULTICAST_SUPPORTED; never on the shared GPU test machines"
                fn multicast_create(num_devices: u32, size: u64, handle_types: u64) -> u64;
            /// `cuMulticastAddDevice(mc, dev)` (C3).
            [Classic] MulticastAddDevice "cuMulticastAddDevice"
                safety "C3: `mc` is the caller's own object; no bind or map on it is in flight"
                fn multicast_add_device(mc: u64, dev: $crate::Device) -> ();
            /// `cuMulticastBindMem(mc, mc_offset, mem, mem_offset, size, 0)`.
            [Classic] MulticastBindMem "cuMulticastBindMem"
                safety "C3 (every team device was added, or the call blocks forever) and R7.2 (the memory outlives the binding)"
                fn multicast_bind_mem(mc: u64, mc_offset: u64, mem: u64, mem_offset: u64, size: u64) -> ();
            /// `cuMulticastBindAddr(mc, mc_offset, ptr, size, 0)`.
            [Classic] MulticastBindAddr "cuMulticastBindAddr"
                safety "C3 (every team device was added, or the call blocks forever) and R7.2 (the mapping outlives the binding)"
                fn multicast_bind_addr(mc: u64, mc_offset: u64, ptr: u64, size: u64) -> ();
            /// `cuMulticastUnbind(mc, dev, mc_offset, size)` (C4).
            [Classic] MulticastUnbind "cuMulticastUnbind"
                safety "C4: `(dev, mc_offset, size)` is exactly one earlier bind of the caller's own; anything else is undefined behaviour in the driver"
                fn multicast_unbind(mc: u64, dev: $crate::Device, mc_offset: u64, size: u64) -> ();

            // ---- streams and the data path (SPEC F1-F9, R13.3) ----
            /// `cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING)` in `dev`'s
            /// primary context: a new non-blocking stream, never the legacy
            /// NULL stream (F6), owned by the caller until `cuStreamDestroy`.
            [Stream] StreamCreate "cuStreamCreate" safety "none beyond the trait's"
                fn stream_create(dev: $crate::Device) -> u64;
            /// `cuStreamDestroy_v2(stream)`: work already enqueued still runs.
            [Stream] StreamDestroy "cuStreamDestroy_v2"
                safety "`stream` is the caller's own (not a typed `Stream`'s) and is not used again"
                fn stream_destroy(stream: u64) -> ();
            /// `cuStreamSynchronize(stream)`: every copy enqueued on it has
            /// completed when it returns `Ok` (F4).
            [Stream] StreamSynchronize "cuStreamSynchronize"
                safety "`stream` is a live stream of the caller's own or of a typed `Stream` it borrows"
                fn stream_synchronize(stream: u64) -> ();
            /// `cuStreamQuery(stream)`: `true` when everything enqueued has
            /// completed, `false` for `CUDA_ERROR_NOT_READY`.
            [Stream] StreamQuery "cuStreamQuery"
                safety "`stream` is a live stream of the caller's own or of a typed `Stream` it borrows"
                fn stream_query(stream: u64) -> bool;
            /// `cuFabricCpyBatchAsync(ops.len(), ops, flags, stream)` (CUDA
            /// 13.5+, SPEC F1-F9): enqueues the copies on `stream`; every op's
            /// own `flags` member is 0. `NOT_SUPPORTED` on a driver without it (F7).
            [Stream] FabricCpyBatchAsync "cuFabricCpyBatchAsync"
                safety "F1-F6 and F9 are checked by the model but undefined behaviour in the driver where cuda.h says so: the ops are independent (F3); every endpoint id was reported ready (R13.1) and its range is bound where it is read or written by the time the stream reaches the op (R13.3, F9); no operand is freed, unmapped, unbound or its endpoint destroyed before the stream passed the op (F4); every `Pointer` is valid for `size` bytes until then (readable for a source, writable for a destination), and one hinted `MemHint::Host` is host memory of the calling process"
                fn fabric_copy_batch(stream: u64, ops: $crate::CopyOps, flags: u64) -> ();
            /// `cuMemcpyAsync(dst, src, size, stream)`: device, mapped host-NUMA
            /// or (hinted `MemHint::Host`) host memory, in stream order.
            [Stream] MemcpyAsync "cuMemcpyAsync"
                safety "both ranges are valid for `size` bytes until the stream passed the copy (readable `src`, writable `dst`), are not freed or unmapped before then (F4), do not overlap, and a pointer hinted `MemHint::Host` is host memory of the calling process"
                fn memcpy_async(dst: $crate::Pointer, src: $crate::Pointer, size: u64, stream: u64) -> ();
            /// `cuMemcpyBatchAsync(dsts, srcs, sizes, count, attrs, attrsIdxs,
            /// 1, stream)` (CUDA 12.8+; the real backend binds the 13.0
            /// prototype, exported as `cuMemcpyBatchAsync_v2`, which has no
            /// `failIdx`): the copies enqueued on `stream` as one batch, run
            /// in no order among themselves, with one attribute for all
            /// (the source read in stream order, no location hints, flags
            /// 0). `NOT_SUPPORTED` on a driver without it; an empty list is
            /// `INVALID_VALUE`. On any error, what was enqueued is not
            /// documented: the caller synchronizes the stream before it
            /// frees anything the copies name.
            [Stream] MemcpyBatchAsync "cuMemcpyBatchAsync"
                safety "every copy as for `cuMemcpyAsync` (both ranges valid until the stream passed the batch, not freed or unmapped before then, F4; not overlapping; `MemHint::Host` only for host memory of the calling process), and no copy writes bytes another copy of the batch reads or writes: the batch runs in no order (cuda.h: dependent copies are undefined behaviour)"
                fn memcpy_batch_async(copies: $crate::MemcpyOps, stream: u64) -> ();

            // ---- graphs of copies (SPEC F8) ----
            /// `cuStreamBeginCapture_v2(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)`:
            /// work enqueued on `stream` from now on is recorded into a
            /// graph, not run, until `cuStreamEndCapture`.
            [Stream] StreamBeginCapture "cuStreamBeginCapture_v2"
                safety "`stream` is a live stream of the caller's own or of a typed `Stream` it borrows, not capturing, and nobody synchronizes or queries it until the capture ended"
                fn stream_begin_capture(stream: u64) -> ();
            /// `cuStreamEndCapture(stream, &graph)`: the graph of what was
            /// captured, owned by the caller until `cuGraphDestroy`.
            [Stream] StreamEndCapture "cuStreamEndCapture"
                safety "`stream` is a live stream of the caller's own or of a typed `Stream` it borrows, capturing"
                fn stream_end_capture(stream: u64) -> u64;
            /// `cuGraphInstantiateWithFlags(&exec, graph, 0)`: an executable
            /// graph, owned by the caller until `cuGraphExecDestroy`.
            [Stream] GraphInstantiate "cuGraphInstantiateWithFlags"
                safety "`graph` is a live graph of the caller's own"
                fn graph_instantiate(graph: u64) -> u64;
            /// `cuGraphLaunch(exec, stream)`: the graph's copies, enqueued on
            /// `stream` in capture order.
            [Stream] GraphLaunch "cuGraphLaunch"
                safety "F8: every endpoint id a copy node names is valid and bound for as long as the launch may run (undefined behaviour in the driver; the model logs F8), and every operand as for `cuFabricCpyBatchAsync` (F1-F4, F9) until the stream passed the launch"
                fn graph_launch(exec: u64, stream: u64) -> ();
            /// `cuGraphExecDestroy(exec)`.
            [Stream] GraphExecDestroy "cuGraphExecDestroy"
                safety "`exec` is the caller's own and is not used again"
                fn graph_exec_destroy(exec: u64) -> ();
            /// `cuGraphDestroy(graph)`.
            [Stream] GraphDestroy "cuGraphDestroy"
                safety "`graph` is the caller's own and is not used again"
                fn graph_destroy(graph: u64) -> ();

            // ---- events (F4: "or an event after it observed") ----
            /// `cuEventCreate(&event, CU_EVENT_DISABLE_TIMING)` in `dev`'s
            /// primary context, owned by the caller until `cuEventDestroy`.
            [Stream] EventCreate "cuEventCreate" safety "none beyond the trait's"
                fn event_create(dev: $crate::Device) -> u64;
            /// `cuEventRecord(event, stream)`: the event completes when the
            /// stream passed everything enqueued on it before.
            [Stream] EventRecord "cuEventRecord"
                safety "`event` and `stream` are live, the caller's own or of typed objects it borrows"
                fn event_record(event: u64, stream: u64) -> ();
            /// `cuEventQuery(event)`: `true` when the work before the record
            /// completed, `false` for `CUDA_ERROR_NOT_READY`.
            [Stream] EventQuery "cuEventQuery"
                safety "`event` is live, the caller's own or of a typed object it borrows"
                fn event_query(event: u64) -> bool;
            /// `cuEventSynchronize(event)`: the work before the record has
            /// completed when it returns `Ok` (F4).
            [Stream] EventSynchronize "cuEventSynchronize"
                safety "`event` is live, the caller's own or of a typed object it borrows"
                fn event_synchronize(event: u64) -> ();
            /// `cuEventDestroy_v2(event)`.
            [Stream] EventDestroy "cuEventDestroy_v2"
                safety "`event` is the caller's own and is not used again"
                fn event_destroy(event: u64) -> ();
        }
    };
}

/// Which API family a driver call belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Family {
    /// Driver and device queries (`cuDriverGetVersion`, `cuDeviceGet*`, `cuMemGetInfo`).
    Base,
    /// `cuLogicalEndpoint*` (CUDA 13.3+, SPEC R1–R10).
    LogicalEndpoint,
    /// Virtual memory management (`cuMem*`): the memory that gets bound.
    Vmm,
    /// The classic `cuMulticast*` API (SPEC C1–C6).
    Classic,
    /// Streams and the data path (`cuStream*`, `cuEvent*`, `cuGraph*` of
    /// captured copies, `cuFabricCpyBatchAsync`, `cuMemcpyAsync`,
    /// `cuMemcpyBatchAsync`; SPEC F1–F9).
    Stream,
}

macro_rules! gen_call {
    ($( $(#[$meta:meta])* [$family:ident] $variant:ident $cname:literal
        safety $safety:literal
        fn $method:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty; )*) => {
        /// A driver entry point, named as in `cuda.h`. Used in errors, traces,
        /// call policies and fault injection.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
        pub enum Call { $(#[doc = concat!("`", $cname, "`")] $variant,)* }

        impl Call {
            /// Every entry point, in table order.
            pub const ALL: &'static [Call] = &[$(Call::$variant,)*];

            /// The C name, e.g. `"cuLogicalEndpointCreate"`.
            pub fn name(self) -> &'static str {
                match self { $(Call::$variant => $cname,)* }
            }

            /// Looks a C name up, e.g. for a deny list read from the environment.
            pub fn from_name(name: &str) -> Option<Call> {
                match name { $($cname => Some(Call::$variant),)* _ => None }
            }

            /// The API family of this call.
            pub fn family(self) -> Family {
                match self { $(Call::$variant => Family::$family,)* }
            }

            /// The `Driver` method that makes this call, e.g. `"create"`.
            pub fn method(self) -> &'static str {
                match self { $(Call::$variant => stringify!($method),)* }
            }
        }

        /// The driver boundary: one method per C entry point of the table
        /// ([`for_each_driver_call!`](crate::for_each_driver_call)), in
        /// domain types.
        ///
        /// Every call method returns `Err(code)` exactly when the C function
        /// would return a code other than `CUDA_SUCCESS`; implementations never
        /// panic. Pointers and handles are plain integers (`CUdeviceptr`,
        /// `CUmemGenericAllocationHandle`).
        ///
        /// Implementing the trait is safe: a backend (the model, a test
        /// double, a remote driver) only has to answer. Implement
        /// [`Forward`] instead for a wrapper that changes a few calls.
        ///
        /// # Safety
        ///
        /// Calling a driver method directly is `unsafe`: the typed API
        /// (`Endpoint`, `Binding`, `Allocation`, `Mapped`, `IdRange`) owns the
        /// ids, endpoints, bindings, allocations and mappings it made, and its
        /// soundness rests on nobody else touching them. A direct caller
        /// promises, for every call:
        /// - it never changes an id, endpoint, handle, address range or
        ///   binding that a typed object of this crate owns (destroying or
        ///   re-creating an id under an `Endpoint<Ready>` is SPEC R3.4;
        ///   releasing memory behind an `Allocation` breaks R7.2); reading
        ///   (queries, limits, attributes) is always fine;
        /// - it does not use an endpoint before a query reported it
        ///   constructed (R3.4);
        /// - plus the rules in each method's own `# Safety` section (C3, C4,
        ///   R6, R7.2...).
        pub trait Driver: Send + Sync + fmt::Debug {
            /// A short name for reports: `"model"`, `"cuda"`, `"classic(cuda)"`.
            fn name(&self) -> String;

            /// Why this backend answers `call` with `CUDA_ERROR_NOT_SUPPORTED`,
            /// in words, when the reason is the backend's own (e.g. the classic
            /// fallback has no unicast endpoint). `None`: the driver's answer
            /// speaks for itself.
            fn explain_unsupported(&self, call: Call) -> Option<&'static str> {
                let _ = call;
                None
            }

            /// Which process this driver's ids and attachments belong to
            /// (R9, R12.1): every `Context` whose driver
            /// answers the same scope shares one table of attached fabric
            /// handles, so that a handle is attached once per process.
            /// `None` (the default): the driver object itself is the scope
            /// (contexts over one `Arc` share the table).
            fn process_scope(&self) -> Option<u64> {
                None
            }

            /// The backend's [`ObjectSharing`](crate::ObjectSharing)
            /// capability: sharing multicast objects of its own across
            /// processes (the classic fallback, C5) and saying what this
            /// process enrolled (C3). `None` (the default) for backends of
            /// real logical endpoints, which share through
            /// `cuLogicalEndpointExport`/`Import`.
            fn object_sharing(&self) -> Option<&dyn $crate::ObjectSharing> {
                None
            }

            /// The error this backend answered to this thread's last `call`
            /// whose `tracing` event panicked ([`UnwoundAnswers`](crate::UnwoundAnswers)),
            /// taken: for the rollback of a call that unwound, which
            /// otherwise takes the driver as having acted. `None` (the
            /// default): nothing known.
            fn unwound_answer(&self, call: Call) -> Option<Code> {
                let _ = call;
                None
            }

            $(
                $(#[$meta])*
                ///
                /// # Safety
                ///
                /// The trait-wide contract of [`Driver`], and:
                #[doc = $safety]
                #[allow(clippy::too_many_arguments)]
                unsafe fn $method(&self $(, $arg: $ty)*) -> DriverResult<$ret>;
            )*
        }

        /// A [`Driver`] wrapper that forwards every call to [`Forward::inner`]
        /// unless it overrides the method: implement `Forward`, and the
        /// blanket `impl<T: Forward> Driver for T` does the rest.
        ///
        /// ```
        /// use cuda_endpoints::driver::{Driver, DriverResult, Forward};
        ///
        /// /// Answers "no devices" and passes everything else through.
        /// #[derive(Debug)]
        /// struct Empty<D>(D);
        ///
        /// impl<D: Driver> Forward for Empty<D> {
        ///     type Inner = D;
        ///     fn inner(&self) -> &D {
        ///         &self.0
        ///     }
        ///     unsafe fn device_count(&self) -> DriverResult<i32> {
        ///         Ok(0)
        ///     }
        /// }
        /// ```
        ///
        /// With both traits in scope, a method call on a `Forward` type is
        /// ambiguous (E0034): import only `Driver` where you call, or write
        /// `Driver::create(&wrapper, ..)`.
        ///
        /// # Safety
        ///
        /// As [`Driver`]: each method has the contract of the `Driver` method
        /// of the same name.
        pub trait Forward: Send + Sync + fmt::Debug {
            /// The driver the calls go to.
            type Inner: Driver + ?Sized;

            /// The driver the calls go to.
            fn inner(&self) -> &Self::Inner;

            /// As [`Driver::name`]; the inner driver's name by default.
            fn name(&self) -> String {
                self.inner().name()
            }

            /// As [`Driver::explain_unsupported`]; the inner driver's by default.
            fn explain_unsupported(&self, call: Call) -> Option<&'static str> {
                self.inner().explain_unsupported(call)
            }

            /// As [`Driver::process_scope`]; the inner driver's by default.
            fn process_scope(&self) -> Option<u64> {
                self.inner().process_scope()
            }



            /// As [`Driver::object_sharing`]; the inner driver's by default.
            #[doc(hidden)]
            fn object_sharing(&self) -> Option<&dyn $crate::ObjectSharing> {
                self.inner().object_sharing()
            }

            /// As [`Driver::unwound_answer`]; the inner driver's by default.
            fn unwound_answer(&self, call: Call) -> Option<Code> {
                self.inner().unwound_answer(call)
            }

            $(
                #[doc = concat!("As [`Driver::", stringify!($method), "`]; forwarded by default.")]
                ///
                /// # Safety
                ///
                #[doc = concat!("As [`Driver::", stringify!($method), "`].")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn $method(&self $(, $arg: $ty)*) -> DriverResult<$ret> {
                    // SAFETY: the caller upholds this method's contract, which
                    // is the inner driver's.
                    unsafe { self.inner().$method($($arg),*) }
                }
            )*
        }

        impl<T: Forward> Driver for T {
            fn name(&self) -> String {
                Forward::name(self)
            }
            fn explain_unsupported(&self, call: Call) -> Option<&'static str> {
                Forward::explain_unsupported(self, call)
            }
            fn process_scope(&self) -> Option<u64> {
                Forward::process_scope(self)
            }
            fn object_sharing(&self) -> Option<&dyn $crate::ObjectSharing> {
                Forward::object_sharing(self)
            }
            fn unwound_answer(&self, call: Call) -> Option<Code> {
                Forward::unwound_answer(self, call)
            }
            $(
                #[allow(clippy::too_many_arguments)]
                unsafe fn $method(&self $(, $arg: $ty)*) -> DriverResult<$ret> {
                    // SAFETY: same contract, passed on unchanged.
                    unsafe { Forward::$method(self $(, $arg)*) }
                }
            )*
        }
    };
}

for_each_driver_call!(gen_call);

macro_rules! gen_arc {
    ($( $(#[$meta:meta])* [$family:ident] $variant:ident $cname:literal
        safety $safety:literal
        fn $method:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty; )*) => {
        /// A shared driver is a driver: every call goes to the one behind the
        /// `Arc`. (Not through [`Forward`], so that method calls on an `Arc`
        /// stay unambiguous with both traits in scope.)
        impl<D: Driver + ?Sized> Driver for Arc<D> {
            fn name(&self) -> String {
                (**self).name()
            }
            fn explain_unsupported(&self, call: Call) -> Option<&'static str> {
                (**self).explain_unsupported(call)
            }
            fn process_scope(&self) -> Option<u64> {
                (**self).process_scope()
            }
            fn object_sharing(&self) -> Option<&dyn $crate::ObjectSharing> {
                (**self).object_sharing()
            }
            fn unwound_answer(&self, call: Call) -> Option<Code> {
                (**self).unwound_answer(call)
            }
            $(
                #[allow(clippy::too_many_arguments)]
                #[inline]
                unsafe fn $method(&self $(, $arg: $ty)*) -> DriverResult<$ret> {
                    // SAFETY: same contract, passed on unchanged.
                    unsafe { (**self).$method($($arg),*) }
                }
            )*
        }
    };
}

for_each_driver_call!(gen_arc);

/// The calls whose contract is only the trait-wide one (queries, and calls
/// that make something new: at worst a leak, which is safe), callable from
/// safe code inside the crate. Generated from the rows whose `safety` is
/// exactly "none beyond the trait's".
#[derive(Clone, Copy)]
pub struct Queries<'a>(pub &'a dyn Driver);

macro_rules! query_method {
    ("none beyond the trait's", $method:ident($($arg:ident: $ty:ty),*) -> $ret:ty) => {
        // Inline: a query is one virtual call, and the typed transitions
        // that make it (`poll`, `wait`, `create`'s limits) should be too.
        #[allow(dead_code)]
        #[inline]
        #[doc = concat!("As [`Driver::", stringify!($method), "`]: a call with no contract beyond the trait's.")]
        pub fn $method(self $(, $arg: $ty)*) -> DriverResult<$ret> {
            // SAFETY: this call has no contract beyond the trait's, and it
            // names nothing a typed object owns: it reads, or makes
            // something new that nobody owns yet.
            unsafe { self.0.$method($($arg),*) }
        }
    };
    ($other:literal, $($rest:tt)*) => {};
}

// `$safety` is taken as a token tree (not a `literal` fragment, which would
// be opaque to `query_method!`'s literal match).
macro_rules! gen_queries {
    ($( $(#[$meta:meta])* [$family:ident] $variant:ident $cname:literal
        safety $safety:tt
        fn $method:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty; )*) => {
        impl Queries<'_> {
            /// As [`Driver::name`].
            pub fn name(self) -> String {
                self.0.name()
            }
            $(query_method!($safety, $method($($arg: $ty),*) -> $ret);)*
        }
    };
}

for_each_driver_call!(gen_queries);

impl fmt::Display for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_names_round_trip() {
        for &c in Call::ALL {
            assert_eq!(Call::from_name(c.name()), Some(c));
        }
    }

    #[test]
    fn families_follow_the_c_names() {
        for &c in Call::ALL {
            let by_name = if c.name().starts_with("cuLogicalEndpoint") {
                Family::LogicalEndpoint
            } else if c.name().starts_with("cuMulticast") {
                Family::Classic
            } else if c.name().starts_with("cuStream")
                || c.name().starts_with("cuGraph")
                || c.name().starts_with("cuEvent")
                || c.name().starts_with("cuFabricCpy")
                || c.name().starts_with("cuMemcpy")
            {
                Family::Stream
            } else if c.name().starts_with("cuMem") && c != Call::MemGetInfo {
                Family::Vmm
            } else {
                Family::Base
            };
            assert_eq!(c.family(), by_name, "{c}");
        }
    }
}
