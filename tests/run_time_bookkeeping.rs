//! The run-time bookkeeping of issue 11, items 3-7: facts kept per process,
//! hostile driver answers, forged handles, errors lost or mislabelled, and
//! the checks made before the driver. Each test is named after its sentence.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::clean;
use cuda_endpoints::driver::Driver;
use cuda_endpoints::model::{Model, ModelConfig};
use cuda_endpoints::{Context, Device, Error, Exportable, FabricHandle, Multicast, Spec};

const ALIGN: u64 = 2 << 20;
const T: Duration = Duration::from_secs(5);

/// Item 3: a handle exported through context A is attached in the process;
/// importing it through context B of the same process is refused.
#[test]
fn one_attachment_per_process_not_per_context() {
    let model = Model::new(ModelConfig::node(2));
    // Two contexts over two handles on one simulated process, as
    // `Context::cuda()` twice is on hardware; and two over one `Arc`.
    let a = Context::new(model.clone());
    let b = Context::new(model.clone());
    let shared: Arc<dyn Driver> = Arc::new(model.clone());
    let c = Context::from_arc(shared.clone());
    let d = Context::from_arc(shared);
    let x = a
        .reserve_one()
        .unwrap()
        .create(Spec::multicast(&[Device(0), Device(1)], ALIGN).exportable())
        .unwrap()
        .wait(T)
        .unwrap();
    let h =
        FabricHandle::<Multicast<Exportable>>::from_bytes(&x.export().unwrap().to_bytes()).unwrap();
    for other in [&b, &c, &d] {
        let f = other.reserve_one().unwrap().import(&h).unwrap_err();
        assert!(
            matches!(f.error, Error::AlreadyAttached { id } if id == x.id()),
            "{}",
            f.error
        );
        f.value.release().unwrap();
    }
    // Another process may import it.
    let peer = Context::new(model.spawn_process());
    let y = peer.reserve_one().unwrap().import(&h).unwrap();
    drop(y);
    // Once destroyed in A, the handle is free in the process again.
    let id = x.destroy().unwrap();
    id.release().unwrap();
    for ctx in [&a, &b, &c, &d, &peer] {
        assert!(ctx.take_teardown_errors().is_empty());
    }
    clean(&a, &model);
}
