//! [`IdRange`]: reserved ids not yet split into endpoints, and
//! [`Context::reserve`] / [`Context::reserve_one`], where every endpoint
//! starts (R1). Above the ranges' records (`range.rs`), which know nothing
//! of endpoints.

use std::sync::Arc;

use crate::context::Context;
use crate::endpoint::Endpoint;
use crate::error::Result;
use crate::kind::NoKind;
use crate::ledger::RangeInner;
use crate::range::{fresh, release_shared, reserve_ids, reuse};
use crate::state::Reserved;

impl Context {
    /// Reserves `count` contiguous ids (`cuLogicalEndpointIdReserve`, R1).
    ///
    /// # Errors
    /// [`Error::ZeroSize`](crate::Error::ZeroSize) for 0 (R1.3); [`Error::Unsupported`](crate::Error::Unsupported) on a driver
    /// before 13.3; [`Error::Driver`](crate::Error::Driver) (`OUT_OF_MEMORY`).
    pub fn reserve(&self, count: u32) -> Result<IdRange> {
        IdRange::reserve(self, count)
    }

    /// Reserves one id.
    ///
    /// The context keeps the allocation of the last one-id range given back
    /// with [`Endpoint::release`] and reuses it here, so a program that
    /// reserves and releases one id at a time allocates once.
    ///
    /// # Errors
    /// As [`Context::reserve`].
    #[inline]
    pub fn reserve_one(&self) -> Result<Endpoint<Reserved>> {
        IdRange::reserve_one(self)
    }
}

/// A contiguous range of reserved ids `[base, base+len)` (R1), not yet split
/// into endpoints. Dropping it (or every endpoint made from it) releases it.
pub struct IdRange {
    inner: Arc<RangeInner>,
}

impl std::fmt::Debug for IdRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "IdRange[{}..{})",
            self.inner.base,
            self.inner.base + self.inner.count
        )
    }
}

impl IdRange {
    pub(crate) fn reserve(ctx: &Context, count: u32) -> Result<IdRange> {
        if count == 0 {
            return Err(crate::Error::ZeroSize {
                what: crate::error::Arg::IdCount,
                suggested: 1,
                rule: Some(crate::error::Rule::R1_3),
            });
        }
        let base = reserve_ids(ctx, count)?;
        if count == 1
            && let Some(spare) = reuse(ctx, base)
        {
            return Ok(IdRange { inner: spare });
        }
        Ok(IdRange {
            inner: fresh(ctx, base, count),
        })
    }

    /// One id as an endpoint (`Context::reserve_one`): the context's spare
    /// range when it has one, else a new one.
    #[inline]
    pub(crate) fn reserve_one(ctx: &Context) -> Result<Endpoint<Reserved, NoKind>> {
        let base = reserve_ids(ctx, 1)?;
        let inner = match reuse(ctx, base) {
            Some(spare) => spare,
            None => fresh(ctx, base, 1),
        };
        Ok(Endpoint::from_parts(inner, base))
    }

    /// The first id.
    pub fn base(&self) -> u32 {
        self.inner.base
    }

    /// How many ids.
    pub fn len(&self) -> u32 {
        self.inner.count
    }

    /// Never true: ranges hold at least one id (R1.3).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Splits the range into one [`Endpoint<Reserved>`] per id, in id order.
    /// The range is released once all of them (and whatever they become) are gone.
    pub fn into_endpoints(self) -> Vec<Endpoint<Reserved, NoKind>> {
        (self.inner.base..self.inner.base + self.inner.count)
            .map(|id| Endpoint::from_parts(self.inner.clone(), id))
            .collect()
    }

    /// Splits a range of exactly `N` ids into an array.
    ///
    /// # Errors
    /// The range back when it does not hold `N` ids.
    pub fn into_array<const N: usize>(self) -> Result<[Endpoint<Reserved, NoKind>; N], IdRange> {
        if self.inner.count as usize != N {
            return Err(self);
        }
        let (inner, base) = (&self.inner, self.inner.base);
        Ok(std::array::from_fn(|i| {
            Endpoint::from_parts(inner.clone(), base + i as u32)
        }))
    }

    /// Releases the ids now (`cuLogicalEndpointIdRelease`, R1).
    ///
    /// # Errors
    /// [`crate::Error::Driver`] from the driver; the ids are then lost to this
    /// process, as the driver left them.
    pub fn release(self) -> Result<()> {
        release_shared(self.inner)
    }
}
