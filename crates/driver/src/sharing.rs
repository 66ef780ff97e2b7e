//! Capabilities a backend may offer beside the call table, asked for through
//! [`Driver`](crate::Driver) and answered by the backend itself, so that the
//! typed layer never needs to know which backend it talks to.
//!
//! [`ObjectSharing`] is the one there is: a backend that emulates logical
//! endpoints on objects of its own making (the classic `cuMulticast*`
//! fallback) shares those objects across processes (C5) and reports what
//! this process enrolled (C3). Backends of real logical endpoints share
//! through `cuLogicalEndpointExport`/`Import` and offer none.

use std::fmt;
use std::os::fd::OwnedFd;

use crate::{DriverResult, FabricHandleBytes, ShareableKind};

/// A backend's own multicast object as exported for another process.
#[derive(Debug)]
pub enum ObjectExport {
    /// A POSIX descriptor, for processes of this node (R12.4).
    Fd(OwnedFd),
    /// Fabric bytes, for processes of any node with an IMEX channel.
    Fabric([u8; 64]),
}

/// Sharing of a backend's own multicast objects across processes, for the
/// team bring-up (C3, C5). See the module docs.
pub trait ObjectSharing: Send + Sync + fmt::Debug {
    /// Exports the object behind the shared (exportable) endpoint `id` as
    /// `kind` (`cuMemExportToShareableHandle`, C5). `NOT_SUPPORTED` before
    /// the driver when the object was not made with that handle type.
    fn export_object(&self, id: u32, kind: ShareableKind) -> DriverResult<ObjectExport>;

    /// Stages `what` (received from the exporter) for import as a team of
    /// `num_devices` devices and `size` bytes per device, the values the
    /// ranks agreed on: the returned ticket goes to
    /// `cuLogicalEndpointImport` as the handle bytes. Nothing the exporter
    /// sent decides what is imported but the object itself.
    fn stage_import(
        &self,
        what: ObjectExport,
        num_devices: u32,
        size: u64,
    ) -> DriverResult<FabricHandleBytes>;

    /// Drops a staged import that was not used (its descriptor closes).
    fn unstage(&self, ticket: &FabricHandleBytes);

    /// The object of endpoint `id`, for `cuMemMap` (multimem access): only
    /// once the team is complete, since a map before then blocks as a bind
    /// does (C3). The object stays the backend's: the caller maps it and
    /// unmaps it before the endpoint is destroyed.
    fn mappable_object(&self, id: u32) -> DriverResult<u64>;

    /// Marks the shared endpoint `id` complete: binds may go to the driver
    /// from now on, and a query reports it ready (C3).
    ///
    /// # Safety
    /// Every device of the team was added to the object, by this process
    /// or another (the bring-up's agreement step says so); otherwise a bind
    /// blocks in the driver until they are (C3).
    unsafe fn team_complete(&self, id: u32) -> DriverResult<()>;

    /// How many devices this process added to endpoint `id`, as the
    /// backend recorded them (the team bring-up's enrollment report).
    fn enrolled_here(&self, id: u32) -> Option<usize>;
}
