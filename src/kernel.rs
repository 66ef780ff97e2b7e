//! [`EndpointRef`]: what kernels get. A `Copy`, `#[repr(transparent)]` value
//! over the id, obtainable only from a ready endpoint and borrowing it, so it
//! cannot outlive the endpoint on the host side (R3.4, R7).

use std::marker::PhantomData;

/// A ready endpoint's id, to pass to kernels (with the `cudarc` feature it
/// implements `cudarc`'s `DeviceRepr`, so it goes straight into a launch's
/// arguments). The same 4 bytes as `CUlogicalEndpointId`.
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct EndpointRef<'a> {
    id: u32,
    _endpoint: PhantomData<&'a ()>,
}

impl std::fmt::Debug for EndpointRef<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "EndpointRef(id {})", self.id)
    }
}

impl EndpointRef<'_> {
    pub(crate) fn new(id: u32) -> Self {
        EndpointRef {
            id,
            _endpoint: PhantomData,
        }
    }

    /// The `CUlogicalEndpointId`.
    pub fn id(self) -> u32 {
        self.id
    }
}

// SAFETY: `#[repr(transparent)]` over a `u32`, exactly the kernel-side
// `CUlogicalEndpointId`.
#[cfg(feature = "cudarc")]
unsafe impl cudarc::driver::DeviceRepr for EndpointRef<'_> {}
