//! [`MulticastMapping`]: a multicast virtual address for classic kernels
//! (`multimem` access, C5): an address range reserved for the team's
//! classic multicast object, the object mapped there, and access set for
//! this process's team devices. A store through it reaches the memory bound
//! on every device of the team.
//!
//! The mapping borrows the ready endpoint, so the endpoint (and the memory
//! still bound to it) cannot go before the mapping does: dropping it unmaps
//! and frees the range first, then the endpoint unbinds and releases the
//! object, then the memory is released (the teardown order NCCL, PyTorch
//! and NVSHMEM use). It exists only once the team is complete (C3: a map
//! before every device is added blocks as a bind does).

use std::marker::PhantomData;

use crate::context::Context;
use crate::driver::{Call, Device};
use crate::endpoint::Endpoint;
use crate::error::{Error, Feature, Result};
use crate::kind::Kind;
use crate::state::Ready;
use crate::unwind::OnUnwind;

/// A classic multicast object mapped at a device address with `multimem`
/// access for this process's team devices: a store through it reaches the
/// memory bound on every device of the team.
///
/// It borrows the ready endpoint, so the endpoint (and the memory still
/// bound to it) cannot go first: dropping the mapping unmaps and frees the
/// range, then the endpoint unbinds and releases the object, then the
/// memory is released (C5). It exists only once the team is complete (C3).
///
/// ```
/// # #[cfg(feature = "model")] {
/// use std::sync::Arc;
/// use cuda_endpoints::driver::Classic;
/// use cuda_endpoints::model::{Model, ModelConfig};
/// use cuda_endpoints::{Allocation, Context, Device, MulticastMapping, PosixFd, Spec};
///
/// let model = Model::new(ModelConfig::node(2));
/// let ctx = Context::new(Classic::new(Arc::new(model.clone())));
/// let team = ctx.reserve_one()?
///     .create(Spec::multicast(&[Device(0), Device(1)], 2 << 20))?
///     .wait(std::time::Duration::from_secs(1))?;
/// let mem = [0, 1].map(|d| Allocation::<PosixFd>::on_device(&ctx, d, 2 << 20).unwrap());
/// let bound = [team.bind(0, 0, &mem[0])?, team.bind(1, 0, &mem[1])?];
/// let mapping = MulticastMapping::new(&team)?;
/// // A kernel's multimem.st, as the model simulates it:
/// model.write(mapping.device_ptr(), b"to every device").expect("store");
/// drop(mapping); // unmaps first
/// drop(bound);
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use = "dropping the mapping unmaps it at once"]
pub struct MulticastMapping<'e> {
    ctx: Context,
    ptr: u64,
    size: u64,
    devices: Vec<Device>,
    _endpoint: PhantomData<&'e ()>,
}

impl std::fmt::Debug for MulticastMapping<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MulticastMapping")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("size", &self.size)
            .field("devices", &self.devices)
            .finish()
    }
}

impl<'e> MulticastMapping<'e> {
    /// Reserves an address range of the endpoint's size, maps its classic
    /// multicast object there (`cuMemAddressReserve`, `cuMemMap`) and gives
    /// this process's enrolled team devices access (`cuMemSetAccess`).
    ///
    /// # Errors
    /// [`Error::Unsupported`] ([`Feature::MulticastAddress`]) for an
    /// endpoint that is not a classic multicast team (logical endpoints are
    /// reached by id, [`Endpoint::kernel_ref`]); [`Error::EmptyTeam`] when
    /// this process enrolled no device; [`Error::Driver`] from the calls.
    /// Nothing is left reserved or mapped on error.
    pub fn new<K: Kind>(endpoint: &'e Endpoint<Ready, K>) -> Result<MulticastMapping<'e>> {
        let ctx = endpoint.context();
        let unsupported = |detail: &str| {
            Error::unsupported(Feature::MulticastAddress, ctx.driver_version(), detail)
        };
        let Some(classic) = ctx.object_sharing().filter(|_| K::MULTICAST) else {
            return Err(unsupported(&format!(
                "a {} endpoint on the {} backend",
                K::NAME,
                ctx.backend_name()
            )));
        };
        let devices = endpoint.devices().to_vec();
        if devices.is_empty() {
            return Err(Error::EmptyTeam);
        }
        // Complete (C3): a ready endpoint's team is, and the backend checks.
        let mc = classic
            .mappable_object(endpoint.id())
            .map_err(|code| ctx.error(Call::MemMap, code))?;
        let size = endpoint.size();
        let align = Some(endpoint.bind_alignment()).filter(|a| a.is_power_of_two());
        // A new range, owned by the mapping made below.
        let ptr = ctx.check(
            Call::MemAddressReserve,
            ctx.queries().mem_address_reserve(size, align.unwrap_or(0)),
        )?;
        let d = ctx.driver();
        // A panic inside the map is taken as coming after the driver mapped
        // (see `OnUnwind`): unmapped and freed as the mapping's drop does;
        // a map the backend says it refused mapped nothing: only freed.
        let unwind = OnUnwind::new(|| {
            let refused = d.unwound_answer(Call::MemMap).is_some();
            // SAFETY: the mapping made below, bound to nothing.
            if refused || unsafe { d.mem_unmap(ptr, size) }.is_ok() {
                // SAFETY: the reservation made above, unmapped just now.
                let _ = unsafe { d.mem_address_free(ptr, size) };
            }
        });
        // SAFETY: `ptr` is the reservation just made; `mc` is the object of
        // the borrowed endpoint, complete, which outlives the mapping.
        let r = unsafe { d.mem_map(ptr, size, 0, mc) };
        unwind.disarm();
        if let Err(code) = r {
            // SAFETY: the reservation just made; nothing is mapped in it.
            if let Err(c2) = unsafe { d.mem_address_free(ptr, size) } {
                ctx.record_teardown(ctx.error(Call::MemAddressFree, c2));
            }
            return Err(ctx.error(Call::MemMap, code));
        }
        // Built now so that a failure below unmaps and frees through `Drop`.
        let mapping = MulticastMapping {
            ctx: ctx.clone(),
            ptr,
            size,
            devices,
            _endpoint: PhantomData,
        };
        // SAFETY: the mapping just made, owned by `mapping`.
        let access = unsafe { d.mem_set_access(ptr, size, mapping.devices.clone()) };
        ctx.check(Call::MemSetAccess, access)?;
        Ok(mapping)
    }

    /// The multicast device address (`CUdeviceptr`) of the first byte, for
    /// `multimem` instructions in kernels.
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }

    /// Size in bytes: the endpoint's size.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The devices given access: this process's team devices.
    pub fn devices(&self) -> &[Device] {
        &self.devices
    }
}

impl Drop for MulticastMapping<'_> {
    /// Unmaps, then frees the range. A failed unmap keeps the range (it is
    /// still mapped) and is recorded on the context, not swallowed.
    fn drop(&mut self) {
        crate::unwind::in_drop(|| {
            let d = self.ctx.driver();
            let (ptr, size) = (self.ptr, self.size);
            // A panic inside the unmap is taken as coming after the driver
            // unmapped (see `OnUnwind`): the range is still freed, once;
            // not after an unmap the backend says it refused (still mapped).
            let free = OnUnwind::new(|| {
                if d.unwound_answer(Call::MemUnmap).is_none() {
                    // SAFETY: this mapping's range; the unmap was made.
                    let _ = unsafe { d.mem_address_free(ptr, size) };
                }
            });
            // SAFETY: this mapping's own range; nothing binds through it.
            let r = unsafe { d.mem_unmap(ptr, size) };
            free.disarm();
            if let Err(code) = r {
                self.ctx
                    .record_teardown(self.ctx.error(Call::MemUnmap, code));
                return;
            }
            // SAFETY: this mapping's range, unmapped just above.
            if let Err(code) = unsafe { d.mem_address_free(self.ptr, self.size) } {
                self.ctx
                    .record_teardown(self.ctx.error(Call::MemAddressFree, code));
            }
        });
    }
}

static_assertions::assert_impl_all!(MulticastMapping<'static>: Send, Sync);
