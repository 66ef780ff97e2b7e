// Misuse: giving the team size as a plain number instead of a typenum value.
use cuda_endpoints::{Context, Spec};

fn main() {
    let (ctx, _model) = Context::model(Default::default());
    let _team = ctx
        .reserve_one()
        .unwrap()
        .create(Spec::team(4, 2 << 20));
}
