//! [`DynEndpoint`]: the erased, run-time-checked twin of `Endpoint<S, K>`,
//! for collections and long-lived structs that hold endpoints of several
//! states or kinds (as rp2040-hal's pins have `into_dyn_pin`).
//!
//! Erasing is free and loses nothing: the state and kind are kept as values,
//! and [`DynEndpoint::try_into_typed`] gives the typed endpoint back only
//! when they match. Every typed rule applies again from there.

use std::any::TypeId;
use std::sync::Arc;

use crate::driver::Device;
use crate::endpoint::Endpoint;
use crate::kind::{Kind, NoKind};
use crate::ledger::RangeInner;
use crate::state::{Pending, State};

/// An endpoint whose state and kind are known at run time only.
///
/// Dropping it does what dropping the typed endpoint would: destroy the
/// endpoint if one exists (R7), and give the id back to its range (R1).
pub struct DynEndpoint {
    range: Arc<RangeInner>,
    id: u32,
    state: TypeId,
    kind: TypeId,
    state_name: &'static str,
    kind_name: &'static str,
    created: bool,
}

impl std::fmt::Debug for DynEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DynEndpoint<{}, {}>(id {})",
            self.state_name, self.kind_name, self.id
        )
    }
}

impl<S: State, K: Kind> Endpoint<S, K> {
    /// Erases the state and kind into run-time values, e.g. to keep
    /// endpoints of several kinds in one `Vec`.
    pub fn into_dyn(self) -> DynEndpoint {
        let (range, id) = self.into_parts();
        DynEndpoint {
            range,
            id,
            state: TypeId::of::<S>(),
            kind: TypeId::of::<K>(),
            state_name: S::NAME,
            kind_name: K::NAME,
            created: S::CREATED,
        }
    }
}

impl DynEndpoint {
    /// The id.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// The state's name: `"Reserved"`, `"Pending"` or `"Ready"`.
    pub fn state_name(&self) -> &'static str {
        self.state_name
    }

    /// The kind's name, e.g. `"multicast"`.
    pub fn kind_name(&self) -> &'static str {
        self.kind_name
    }

    /// Whether it is an `Endpoint<S, K>`.
    pub fn is<S: State, K: Kind>(&self) -> bool {
        self.state == TypeId::of::<S>() && self.kind == TypeId::of::<K>()
    }

    /// Bytes that can be bound per device; 0 while reserved.
    pub fn size(&self) -> u64 {
        // SAFETY: `self` holds the id as its endpoint did (a range hands each
        // id out once), borrowed shared for the result's use here.
        unsafe { self.range.facts(self.id) }.size
    }

    /// The owner or the devices this process enrolled.
    pub fn devices(&self) -> &[Device] {
        // SAFETY: as in `size`; the borrow lives as long as `&self`.
        unsafe { &self.range.facts(self.id).devices }
    }

    /// The typed endpoint back, when it is an `Endpoint<S, K>`; else `self`.
    ///
    /// # Errors
    /// `self`, unchanged, when the state or kind differ.
    pub fn try_into_typed<S: State, K: Kind>(self) -> Result<Endpoint<S, K>, DynEndpoint> {
        if !self.is::<S, K>() {
            return Err(self);
        }
        let (range, id) = self.into_parts();
        Ok(Endpoint::from_parts(range, id))
    }

    fn into_parts(self) -> (Arc<RangeInner>, u32) {
        let me = std::mem::ManuallyDrop::new(self);
        // SAFETY: `me` is never used or dropped again; the `Arc` moves out once.
        let range = unsafe { std::ptr::read(&me.range) };
        (range, me.id)
    }
}

impl Drop for DynEndpoint {
    fn drop(&mut self) {
        crate::unwind::in_drop(|| {
            // The typed endpoint's own `Drop` does the teardown: any created
            // state destroys alike, whatever the kind.
            let range = self.range.clone();
            if self.created {
                drop(Endpoint::<Pending, NoKind>::from_parts(range, self.id));
            }
        });
    }
}
