//! Shared by `benches/lifecycle.rs` (criterion, wall clock) and
//! `benches/instructions.rs` (gungraun, instruction counts): the two sides of
//! the comparison and a pass-through driver.
//!
//! One unicast lifecycle, the same on both sides: reserve one id, create a
//! unicast endpoint on device 0, wait until it is constructed, bind one
//! allocation, unbind, destroy, release.
//!
//! - [`typed`] goes through the typestate API (`Context`, `Endpoint<S, K>`,
//!   `Binding`).
//! - [`raw`] makes the same driver calls on the same `dyn Driver` by hand:
//!   `id_reserve`, `create` (with `Props::to_c()`), `query` until true,
//!   `bind_mem`, `unbind`, `destroy`, `id_release`.
//! - [`raw_with_limits`] adds the one driver call the typed `create` makes on
//!   top of those, `get_limits` with the size check it feeds (R2.3, R10), so
//!   that the typed layer's own bookkeeping can be told apart from that call.
//!
//! [`Null`] is a driver that does nothing, so that the typed layer's cost is
//! not hidden behind the model's mutex and tables.

#![allow(dead_code)] // each bench uses a part

use std::hint::black_box;
use std::time::Duration;

use cuda_endpoints::driver::prop::{Props, Shape};
use cuda_endpoints::driver::{
    AllocationRequest, Device, Driver, DriverResult, Granularity, Limits, Location, sys,
};
use cuda_endpoints::{Allocation, Context, Spec};

/// Bytes per endpoint and per allocation: one bind alignment of the model's
/// H200-like devices and of [`Null`].
pub const SIZE: u64 = 2 << 20;

/// The owner device of the unicast endpoint and where the memory lives.
pub const OWNER: Device = Device(0);

/// The typed lifecycle.
#[inline(never)]
pub fn typed(ctx: &Context, mem: &Allocation) {
    let ep = ctx.reserve_one().expect("reserve");
    let ep = ep
        .create(Spec::unicast(OWNER, SIZE))
        .expect("create")
        .wait(Duration::from_secs(1))
        .expect("wait");
    let binding = ep.bind(OWNER, 0, mem).expect("bind");
    binding.unbind().expect("unbind");
    ep.destroy().expect("destroy").release().expect("release");
}

/// The same driver calls, by hand.
#[inline(never)]
pub fn raw(d: &dyn Driver, mem_handle: u64) {
    let props = Props {
        shape: Shape::Unicast { owner: OWNER },
        size: SIZE,
        ipc_handle_types: 0,
        flags: 0,
    };
    let id = d.id_reserve(1).expect("reserve");
    d.create(id, &props.to_c()).expect("create");
    while !d.query(id, 1).expect("query") {
        std::hint::spin_loop();
    }
    d.bind_mem(id, OWNER, 0, mem_handle, 0, SIZE, 0)
        .expect("bind");
    d.unbind(id, OWNER, 0, SIZE).expect("unbind");
    d.destroy(id).expect("destroy");
    d.id_release(id, 1).expect("release");
}

/// [`raw`] plus the `get_limits` call (and size check) that the typed
/// `create` makes before `cuLogicalEndpointCreate`.
#[inline(never)]
pub fn raw_with_limits(d: &dyn Driver, mem_handle: u64) {
    let props = Props {
        shape: Shape::Unicast { owner: OWNER },
        size: SIZE,
        ipc_handle_types: 0,
        flags: 0,
    };
    let id = d.id_reserve(1).expect("reserve");
    let limits = d.get_limits(&props.to_c()).expect("limits");
    assert!(SIZE <= limits.max_size && SIZE.is_multiple_of(limits.bind_alignment.max(1)));
    d.create(id, &props.to_c()).expect("create");
    while !d.query(id, 1).expect("query") {
        std::hint::spin_loop();
    }
    d.bind_mem(id, OWNER, 0, mem_handle, 0, SIZE, 0)
        .expect("bind");
    d.unbind(id, OWNER, 0, SIZE).expect("unbind");
    d.destroy(id).expect("destroy");
    d.id_release(id, 1).expect("release");
}

/// A context over `driver` and one allocation on [`OWNER`], made once outside
/// the measured loop and used by both sides (`typed` binds the `Allocation`,
/// `raw` its handle).
pub fn fixture(driver: impl Driver + 'static) -> (Context, Allocation) {
    let ctx = Context::new(driver);
    let mem = Allocation::on_device(&ctx, OWNER, SIZE).expect("allocation");
    // Warm the context's caches (device count, driver version) as a long-lived
    // program has them.
    black_box(ctx.device_count().expect("device count"));
    (ctx, mem)
}

/// A pass-through driver: every call succeeds at once and does nothing.
/// `query` says constructed, `get_limits` says 2 MiB / 1 GiB, 4 devices.
#[derive(Debug, Default)]
pub struct Null;

impl Driver for Null {
    fn name(&self) -> String {
        "null".into()
    }

    fn driver_version(&self) -> DriverResult<i32> {
        Ok(13040)
    }
    fn device_count(&self) -> DriverResult<i32> {
        Ok(4)
    }
    fn device_attribute(&self, _dev: Device, _attr: i32) -> DriverResult<i32> {
        Ok(1)
    }
    fn mem_get_info(&self, _dev: Device) -> DriverResult<(u64, u64)> {
        Ok((1 << 30, 1 << 30))
    }

    fn id_reserve(&self, _count: u32) -> DriverResult<u32> {
        Ok(1)
    }
    fn id_release(&self, _base: u32, _count: u32) -> DriverResult<()> {
        Ok(())
    }
    fn get_limits(&self, _prop: &sys::CUlogicalEndpointProp) -> DriverResult<Limits> {
        Ok(Limits {
            bind_alignment: 2 << 20,
            max_size: 1 << 30,
        })
    }
    fn create(&self, _id: u32, _prop: &sys::CUlogicalEndpointProp) -> DriverResult<()> {
        Ok(())
    }
    fn add_device(&self, _id: u32, _dev: Device) -> DriverResult<()> {
        Ok(())
    }
    fn query(&self, _base: u32, _count: u32) -> DriverResult<bool> {
        Ok(true)
    }
    fn bind_mem(
        &self,
        _id: u32,
        _dev: Device,
        _offset: u64,
        _mem: u64,
        _mem_offset: u64,
        _size: u64,
        _flags: u64,
    ) -> DriverResult<()> {
        Ok(())
    }
    fn bind_addr(
        &self,
        _id: u32,
        _dev: Device,
        _offset: u64,
        _ptr: u64,
        _size: u64,
        _flags: u64,
    ) -> DriverResult<()> {
        Ok(())
    }
    fn unbind(&self, _id: u32, _dev: Device, _offset: u64, _size: u64) -> DriverResult<()> {
        Ok(())
    }
    fn destroy(&self, _id: u32) -> DriverResult<()> {
        Ok(())
    }
    fn export(
        &self,
        _id: u32,
        _handle: &mut sys::CUlogicalEndpointFabricHandle,
        _handle_type: sys::CUlogicalEndpointIpcHandleType,
    ) -> DriverResult<()> {
        Ok(())
    }
    fn import(
        &self,
        _id: u32,
        _handle: &sys::CUlogicalEndpointFabricHandle,
        _handle_type: sys::CUlogicalEndpointIpcHandleType,
    ) -> DriverResult<()> {
        Ok(())
    }

    fn mem_granularity(&self, _req: &AllocationRequest, _kind: Granularity) -> DriverResult<u64> {
        Ok(2 << 20)
    }
    fn mem_create(&self, _size: u64, _req: &AllocationRequest) -> DriverResult<u64> {
        Ok(1)
    }
    fn mem_release(&self, _handle: u64) -> DriverResult<()> {
        Ok(())
    }
    fn mem_properties(&self, _handle: u64) -> DriverResult<AllocationRequest> {
        Ok(AllocationRequest {
            location: Location::Device(OWNER),
            handle_types: 0,
        })
    }
    fn mem_address_reserve(&self, _size: u64, _alignment: u64) -> DriverResult<u64> {
        Ok(1 << 40)
    }
    fn mem_address_free(&self, _ptr: u64, _size: u64) -> DriverResult<()> {
        Ok(())
    }
    fn mem_map(&self, _ptr: u64, _size: u64, _offset: u64, _handle: u64) -> DriverResult<()> {
        Ok(())
    }
    fn mem_unmap(&self, _ptr: u64, _size: u64) -> DriverResult<()> {
        Ok(())
    }
    fn mem_set_access(&self, _ptr: u64, _size: u64, _devices: &[Device]) -> DriverResult<()> {
        Ok(())
    }

    fn multicast_granularity(
        &self,
        _num_devices: u32,
        _size: u64,
        _handle_types: u64,
        _kind: Granularity,
    ) -> DriverResult<u64> {
        Ok(2 << 20)
    }
    fn multicast_create(
        &self,
        _num_devices: u32,
        _size: u64,
        _handle_types: u64,
    ) -> DriverResult<u64> {
        Ok(2)
    }
    fn multicast_add_device(&self, _mc: u64, _dev: Device) -> DriverResult<()> {
        Ok(())
    }
    fn multicast_bind_mem(
        &self,
        _mc: u64,
        _mc_offset: u64,
        _mem: u64,
        _mem_offset: u64,
        _size: u64,
    ) -> DriverResult<()> {
        Ok(())
    }
    fn multicast_bind_addr(
        &self,
        _mc: u64,
        _mc_offset: u64,
        _ptr: u64,
        _size: u64,
    ) -> DriverResult<()> {
        Ok(())
    }
    fn multicast_unbind(
        &self,
        _mc: u64,
        _dev: Device,
        _mc_offset: u64,
        _size: u64,
    ) -> DriverResult<()> {
        Ok(())
    }
}
