//! A multicast virtual address for classic kernels (`MulticastMapping`,
//! C5): reserve, map the classic object, set `multimem` access for the
//! team's devices; a store through it reaches the memory bound on every
//! device; the mapping goes before the endpoint unbinds and releases the
//! object, and before the bound memory is released. All on the model.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use cuda_endpoints::bootstrap::Threads;
use cuda_endpoints::driver::Classic;
use cuda_endpoints::model::{FabricConfig, Model, ModelConfig};
use cuda_endpoints::team::{self, TeamSpec};
use cuda_endpoints::{
    Allocation, Context, Device, Error, MulticastMapping, PosixFd, Spec,
    bootstrap::Bootstrap,
    driver::{Call, Driver},
    error::Feature,
};

const MIB2: u64 = 2 << 20;
const T: Duration = Duration::from_secs(10);

fn classic(model: &Model) -> Context {
    Context::new(Classic::new(Arc::new(model.clone())))
}

#[test]
fn c5_a_store_through_the_multicast_address_reaches_every_bound_memory() {
    let model = Model::new(ModelConfig::node(2));
    let ctx = classic(&model);
    let team = ctx
        .reserve_one()
        .unwrap()
        .create(Spec::multicast(&[Device(0), Device(1)], MIB2))
        .unwrap()
        .wait(T)
        .unwrap();
    let mem: Vec<_> = (0..2)
        .map(|d| {
            Allocation::<PosixFd>::on_device(&ctx, d, MIB2)
                .unwrap()
                .map(&[Device(d)])
                .unwrap()
        })
        .collect();
    let bound: Vec<_> = (0..2)
        .map(|d| team.bind(d, 0, &mem[d as usize]).unwrap())
        .collect();
    let mapping = MulticastMapping::new(&team).unwrap();
    assert_eq!(mapping.size(), MIB2);
    assert_eq!(mapping.devices(), &[Device(0), Device(1)]);
    model
        .write(mapping.device_ptr() + 4096, b"multimem.st")
        .unwrap();
    for m in &mem {
        assert_eq!(
            model.read(m.device_ptr() + 4096, 11).unwrap(),
            b"multimem.st"
        );
    }
    // A plain load of a multicast address has no meaning.
    assert!(model.read(mapping.device_ptr(), 1).is_err());
    // Teardown in the natural order: the mapping, the bindings, the team, the memory.
    drop(mapping);
    drop(bound);
    drop(team);
    drop(mem);
    let trace = model.trace();
    let pos = |c: Call| trace.iter().rposition(|&t| t == c).unwrap();
    // Unmap of the multicast address (the last unmap but the memories')
    // comes before every unbind and before the object's release.
    let first_unbind = trace
        .iter()
        .position(|&t| t == Call::MulticastUnbind)
        .unwrap();
    let mc_unmap = trace[..first_unbind]
        .iter()
        .rposition(|&t| t == Call::MemUnmap)
        .unwrap();
    assert!(mc_unmap < first_unbind && first_unbind < pos(Call::MemRelease));
    common::clean(&ctx, &model);
}

#[test]
fn c5_every_rank_of_a_shared_classic_team_maps_it_and_sees_the_roots_store() {
    let model = Model::fabric(FabricConfig::nodes(1, 3));
    let procs: Vec<Model> = (0..3)
        .map(|r| {
            if r == 0 {
                model.clone()
            } else {
                model.spawn_process()
            }
        })
        .collect();
    let boots = Threads::new(3);
    std::thread::scope(|s| {
        for (r, (m, boot)) in procs.iter().zip(boots).enumerate() {
            s.spawn(move || {
                let ctx = classic(m);
                let dev = Device(r as i32);
                let team =
                    team::multicast(&ctx, &boot, &TeamSpec::new([dev], MIB2).timeout(T)).unwrap();
                let mem = Allocation::<PosixFd>::on_device(&ctx, dev, MIB2)
                    .unwrap()
                    .map(&[dev])
                    .unwrap();
                let binding = team.endpoint().bind(dev, 0, &mem).unwrap();
                let mapping = team.multicast_mapping().unwrap();
                boot.barrier(T).unwrap();
                if r == 0 {
                    m.write(mapping.device_ptr(), b"from rank 0").unwrap();
                }
                boot.barrier(T).unwrap();
                assert_eq!(m.read(mem.device_ptr(), 11).unwrap(), b"from rank 0");
                drop(mapping);
                drop(binding);
                boot.barrier(T).unwrap();
                drop(team);
                drop(mem);
                assert!(ctx.take_teardown_errors().is_empty());
                assert!(m.live().is_empty(), "rank {r}: {:?}", m.live());
            });
        }
    });
    common::fabric_idle(&model);
}

#[test]
fn a_logical_endpoint_has_no_multicast_address() {
    let (ctx, model) = Context::model(ModelConfig::node(2));
    let team = ctx
        .reserve_one()
        .unwrap()
        .create(Spec::multicast(&[Device(0), Device(1)], MIB2))
        .unwrap()
        .wait(T)
        .unwrap();
    let e = MulticastMapping::new(&team).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Unsupported {
                feature: Feature::MulticastAddress,
                ..
            }
        ),
        "{e}"
    );
    drop(team);
    common::clean(&ctx, &model);
}

#[test]
fn c3_the_model_logs_a_map_before_every_device_was_added() {
    let model = Model::new(ModelConfig::node(2));
    let d: &dyn Driver = &model;
    // SAFETY: the test owns every handle and range it names; the map of an
    // incomplete object is the point (the model refuses instead of blocking).
    unsafe {
        let mc = d.multicast_create(2, MIB2, 0).unwrap();
        d.multicast_add_device(mc, Device(0)).unwrap();
        let ptr = d.mem_address_reserve(MIB2, 0).unwrap();
        assert!(d.mem_map(ptr, MIB2, 0, mc).is_err());
        d.mem_address_free(ptr, MIB2).unwrap();
        d.mem_release(mc).unwrap();
    }
    let v = model.violations();
    assert_eq!(v.len(), 1, "{v:?}");
    assert_eq!(v[0].rule, "C3");
    assert!(model.live().is_empty());
}
