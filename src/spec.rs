//! What to create: [`Spec`] carries the `CUlogicalEndpointProp` fields (rule
//! R2) and, in its type, the kind of endpoint it makes.

use std::marker::PhantomData;

use typenum::U0;

use crate::driver::Device;
use crate::driver::{EndpointProps, Shape};
use crate::kind::{
    Creatable, Local, Multicast, SpreadTeam, Team, TeamIsNonEmpty, TeamSize, Unicast,
};

/// The properties of an endpoint to create, typed by the kind it makes.
///
/// - [`Spec::unicast`]: one owner device → `Unicast`.
/// - [`Spec::multicast`]: a team known at run time, enrolled in full by
///   `create` → `Multicast`.
/// - [`Spec::team`]: a team whose size is a compile-time number; devices are
///   enrolled one by one with `add_device`, counted in the type → `Team<N>`.
/// - [`Spec::spread`]: a team spread over processes, each enrolling its own
///   devices → `SpreadTeam`.
///
/// Sizes are bytes *per device* and must be a non-zero multiple of the bind
/// alignment, at most `maxSize` (R2.3, R10); `create` checks both before the
/// driver and says the nearest valid size.
#[derive(Clone, Debug)]
pub struct Spec<K> {
    pub(crate) props: EndpointProps,
    /// Team devices for `Spec::multicast`; empty otherwise.
    pub(crate) devices: Vec<Device>,
    _kind: PhantomData<fn() -> K>,
}

impl<K> Spec<K> {
    fn with(shape: Shape, size: u64, devices: Vec<Device>) -> Spec<K> {
        Spec {
            props: EndpointProps::new(shape, size),
            devices,
            _kind: PhantomData,
        }
    }

    /// Bytes per device.
    pub fn size(&self) -> u64 {
        self.props.size
    }

    /// The properties as the driver gets them.
    pub fn props(&self) -> EndpointProps {
        self.props
    }
}

impl Spec<Unicast<Local>> {
    /// A unicast endpoint owned by `owner`, `bytes` bytes (R2.2).
    pub fn unicast(owner: impl Into<Device>, bytes: u64) -> Self {
        Spec::with(
            Shape::Unicast {
                owner: owner.into(),
            },
            bytes,
            Vec::new(),
        )
    }
}

impl Spec<Multicast<Local>> {
    /// A multicast endpoint over `devices` (the team, known at run time),
    /// `bytes` bytes per device. `create` enrolls them all (R4), so the
    /// endpoint is complete by construction. Use the devices your ranks
    /// really use, e.g. `ctx.devices()?`. The devices as everywhere else:
    /// ordinals (`[0, 1]`) or [`Device`]s (`&[Device(0), Device(1)]`,
    /// `&ctx.devices()?`): see [`TeamDevices`].
    pub fn multicast(devices: impl TeamDevices, bytes: u64) -> Self {
        let devices = devices.team_devices();
        let n = devices.len() as u32;
        Spec::with(Shape::Multicast { num_devices: n }, bytes, devices)
    }
}

/// The devices of a [`Spec::multicast`] team: ordinals, owned as in
/// `TeamSpec::new([dev], ..)` (`[0, 1]`, `Vec<i32>`; or `&[i32]`), or
/// borrowed [`Device`]s (`&[Device]`, `&[Device; N]`, `&Vec<Device>`, e.g.
/// `&ctx.devices()?`). One form each, so that `&[0.into(), 1.into()]` still
/// infers `Device`. Sealed.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a list of team devices",
    note = "pass ordinals (`[0, 1]`, `&[i32]`, `Vec<i32>`) or devices (`&[Device]`, `&ctx.devices()?`)"
)]
pub trait TeamDevices: sealed::Sealed {
    /// The devices, in order.
    #[doc(hidden)]
    fn team_devices(self) -> Vec<Device>;
}

mod sealed {
    pub trait Sealed {}
}

macro_rules! team_devices {
    ($([$($g:tt)*] $t:ty => |$d:ident| $e:expr;)*) => {$(
        impl<$($g)*> sealed::Sealed for $t {}
        impl<$($g)*> TeamDevices for $t {
            fn team_devices(self) -> Vec<Device> {
                let $d = self;
                $e
            }
        }
    )*};
}

team_devices! {
    ['a] &'a [Device] => |d| d.to_vec();
    ['a, const N: usize] &'a [Device; N] => |d| d.to_vec();
    ['a] &'a Vec<Device> => |d| d.clone();
    ['a] &'a [i32] => |d| d.iter().map(|&o| Device(o)).collect();
    [const N: usize] [i32; N] => |d| d.into_iter().map(Device).collect();
    [] Vec<i32> => |d| d.into_iter().map(Device).collect();
}

impl<N> Spec<Team<N, U0, Local>> {
    /// A multicast team of `N` devices (a typenum number, e.g. `U4::new()`),
    /// `bytes` bytes per device; enroll each with `add_device` (R4).
    ///
    /// `numDevices` is a `u32` (R2.2): a larger `N` is a build error (from
    /// `cargo build`; `cargo check` does not evaluate the constant), never a
    /// team size silently truncated:
    ///
    /// ```compile_fail,E0080
    /// use cuda_endpoints::{Spec, typenum::U4294967296};
    /// let _ = Spec::team(U4294967296::new(), 2 << 20);
    /// ```
    // The size's type is `N` through `TeamSize::Count` rather than the
    // argument's type itself: `Spec::team(4, bytes)` then gives one error
    // (`TeamSize` with its note), not six more from inside typenum.
    pub fn team<T>(_size: T, bytes: u64) -> Self
    where
        T: TeamSize<Count = N>,
        T::NonEmpty: TeamIsNonEmpty,
    {
        Spec::with(
            Shape::Multicast {
                num_devices: T::SIZE,
            },
            bytes,
            Vec::new(),
        )
    }
}

impl Spec<SpreadTeam<Local>> {
    /// A multicast team of `num_devices` devices spread over processes, `bytes`
    /// bytes per device: each process enrolls its own with `add_device`, and
    /// readiness comes only through a query (R3.2).
    pub fn spread(num_devices: u32, bytes: u64) -> Self {
        Spec::with(Shape::Multicast { num_devices }, bytes, Vec::new())
    }
}

impl<K: Creatable> Spec<K> {
    /// Adds `FABRIC` to `ipcHandleTypes`: the endpoint can be exported (R8)
    /// and binds only shareable memory (R5.6).
    pub fn exportable(self) -> Spec<K::Exportable> {
        let mut props = self.props;
        props.ipc_fabric = true;
        Spec {
            props,
            devices: self.devices,
            _kind: PhantomData,
        }
    }

    /// Sets `COUNTED_OPS` (R2.4); `create` refuses it where attribute 155 says no.
    pub fn counted_ops(mut self) -> Self {
        self.props.counted_ops = true;
        self
    }
}
