// Not `super::*`: with `Forward` in scope too, calls on `Classic` would be
// ambiguous between the two traits.
use super::{Classic, Code, Device, Driver, EndpointProps, Location, Shape};
use crate::driver::AllocationRequest;
use crate::model::{Model, ModelConfig};
use std::sync::Arc;

fn prop(n: u32, size: u64) -> EndpointProps {
    EndpointProps::new(Shape::Multicast { num_devices: n }, size)
}

#[test]
fn create_happens_only_with_the_last_device() {
    // SAFETY: the test owns every id, handle and binding it names.
    unsafe {
        let model = Model::new(ModelConfig::node(3));
        let c = Classic::new(Arc::new(model.clone()));
        let id = c.id_reserve(1).unwrap();
        c.create(id, prop(3, 2 << 20)).unwrap();
        c.add_device(id, Device(0)).unwrap();
        c.add_device(id, Device(1)).unwrap();
        assert!(!c.query(id, 1).unwrap());
        assert_eq!(model.calls(crate::Call::MulticastCreate), 0);
        c.add_device(id, Device(2)).unwrap();
        assert_eq!(model.calls(crate::Call::MulticastCreate), 1);
        assert_eq!(model.calls(crate::Call::MulticastAddDevice), 3);
        assert!(c.query(id, 1).unwrap());
        assert_eq!(c.live_multicast_objects(), 1);
        c.destroy(id).unwrap();
        c.id_release(id, 1).unwrap();
        assert!(model.live().is_empty());
        assert!(model.violations().is_empty());
    }
}

#[test]
fn a_device_without_attribute_132_is_refused_before_create() {
    // SAFETY: the test owns every id, handle and binding it names.
    unsafe {
        let cfg = ModelConfig::node(2).with_devices(|i, d| d.classic_multicast = i == 0);
        let model = Model::new(cfg);
        let c = Classic::new(Arc::new(model.clone()));
        let id = c.id_reserve(1).unwrap();
        c.create(id, prop(2, 2 << 20)).unwrap();
        c.add_device(id, Device(0)).unwrap();
        assert_eq!(c.add_device(id, Device(1)), Err(Code::NOT_SUPPORTED));
        assert_eq!(model.calls(crate::Call::MulticastCreate), 0);
        assert!(model.violations().is_empty());
    }
}

#[test]
fn mismatched_unbind_never_reaches_the_driver() {
    // SAFETY: the test owns every id, handle and binding it names.
    unsafe {
        let model = Model::new(ModelConfig::node(1));
        let c = Classic::new(Arc::new(model.clone()));
        let id = c.id_reserve(1).unwrap();
        c.create(id, prop(1, 4 << 20)).unwrap();
        c.add_device(id, Device(0)).unwrap();
        let req = AllocationRequest {
            location: Location::Device(Device(0)),
            handle_types: 0,
        };
        let mem = c.mem_create(4 << 20, req).unwrap();
        c.bind_mem(id, Device(0), 0, mem, 0, 2 << 20, 0).unwrap();
        c.bind_mem(id, Device(0), 2 << 20, mem, 2 << 20, 2 << 20, 0)
            .unwrap();
        assert_eq!(
            c.unbind(id, Device(0), 0, 1 << 20),
            Err(Code::INVALID_VALUE)
        );
        assert_eq!(
            c.unbind(id, Device(0), 1 << 20, 2 << 20),
            Err(Code::INVALID_VALUE)
        );
        assert_eq!(model.calls(crate::Call::MulticastUnbind), 0);
        // Two consecutive binds unbound as one range (R6.2): two exact unbinds.
        c.unbind(id, Device(0), 0, 4 << 20).unwrap();
        assert_eq!(model.calls(crate::Call::MulticastUnbind), 2);
        c.destroy(id).unwrap();
        c.mem_release(mem).unwrap();
        c.id_release(id, 1).unwrap();
        assert!(model.live().is_empty());
        assert!(model.violations().is_empty());
    }
}

#[test]
fn unicast_is_bookkeeping_with_no_driver_call() {
    // SAFETY: the test owns every id, handle and binding it names.
    unsafe {
        let mut cfg = ModelConfig::node(1);
        cfg.driver_version = 13000;
        let model = Model::new(cfg);
        let c = Classic::new(Arc::new(model.clone()));
        let id = c.id_reserve(2).unwrap();
        let mut p = EndpointProps::new(Shape::Unicast { owner: Device(0) }, 4 << 20);
        assert_eq!(c.get_limits(p).unwrap().bind_alignment, 2 << 20);
        p.counted_ops = true;
        assert_eq!(c.create(id, p), Err(Code::NOT_SUPPORTED));
        p.counted_ops = false;
        let bad = EndpointProps::new(Shape::Unicast { owner: Device(3) }, 4 << 20);
        assert_eq!(c.create(id, bad), Err(Code::INVALID_DEVICE)); // R2.2
        let odd = EndpointProps::new(Shape::Unicast { owner: Device(0) }, 3 << 20);
        assert_eq!(c.create(id, odd), Err(Code::INVALID_VALUE)); // R2.3
        p.ipc_fabric = true;
        c.create(id, p).unwrap();
        assert!(c.query(id, 1).unwrap()); // ready at once
        assert_eq!(c.add_device(id, Device(0)), Err(Code::INVALID_VALUE)); // R4.1
        let req = AllocationRequest {
            location: Location::Device(Device(0)),
            handle_types: 0,
        };
        let mem = c.mem_create(4 << 20, req).unwrap();
        c.bind_mem(id, Device(0), 0, mem, 0, 2 << 20, 0).unwrap();
        assert_eq!(
            c.bind_mem(id, Device(0), 0, mem, 2 << 20, 2 << 20, 0),
            Err(Code::INVALID_VALUE) // R5.9
        );
        c.bind_mem(id, Device(0), 2 << 20, mem, 2 << 20, 2 << 20, 0)
            .unwrap();
        assert_eq!(
            c.unbind(id, Device(0), 0, 1 << 20),
            Err(Code::INVALID_VALUE)
        );
        c.unbind(id, Device(0), 0, 2 << 20).unwrap();
        // Its ticket, every time the same, imports as an endpoint that
        // binds nothing (R5.7).
        let ticket = c.export(id).unwrap();
        assert_eq!(c.export(id).unwrap(), ticket);
        c.import(id + 1, ticket).unwrap();
        assert!(c.query(id + 1, 1).unwrap());
        assert_eq!(
            c.bind_mem(id + 1, Device(0), 0, mem, 0, 2 << 20, 0),
            Err(Code::INVALID_VALUE)
        );
        assert_eq!(c.export(id + 1), Err(Code::INVALID_VALUE));
        // Not a ticket: refused (R9.4).
        let mut forged = ticket;
        forged.0[30] = 1;
        c.destroy(id + 1).unwrap();
        assert_eq!(c.import(id + 1, forged), Err(Code::INVALID_VALUE));
        assert_eq!(
            c.import(id + 1, super::FabricHandleBytes([7; 64])),
            Err(Code::NOT_SUPPORTED)
        );
        c.destroy(id).unwrap(); // forgets the bind left
        c.mem_release(mem).unwrap();
        c.id_release(id, 2).unwrap();
        for call in [
            crate::Call::MulticastGetGranularity,
            crate::Call::MulticastCreate,
            crate::Call::MulticastBindMem,
            crate::Call::MulticastUnbind,
        ] {
            assert_eq!(model.calls(call), 0, "{call}");
        }
        assert!(model.live().is_empty());
        assert!(model.violations().is_empty());
    }
}
