//! Strided blocks in one builder call: [`CopyBatch::put_strided`] and
//! [`CopyBatch::get_strided`], `count` ops of `size` bytes at a fixed stride
//! on each side (an all-to-all's slices, a halo's rows, a gather's columns).
//!
//! What this file owns: [`Strided`], and the one check that proves every
//! block of such a call at once. The first block goes through
//! [`CopyBatch::put`] or [`CopyBatch::get`] (its memory, its endpoint, F2,
//! F9 and F3's order, as any op); when it set the batch's cursor, the last
//! block's ends inside the cursor's memory and bound interval, and a
//! destination stride of at least `size`, prove the rest: the blocks in
//! between lie between the first and the last, and no two destinations
//! overlap (F3). The rest is then written at raw's cost per op (issue 19,
//! item 8: `benches/copy_batch.rs`). Anything else (a gap in the bindings,
//! overlapping destinations, a 0-byte block) goes op by op, as the same
//! `put`s or `get`s one after the other would, and stops at the first op
//! whose local side fails: the batch is refused at enqueue naming the error
//! its ops one by one would.

use super::{BatchInner, CopyBatch, Hot};
use crate::driver::{CopyOp, Pointer};
use crate::endpoint::Endpoint;
use crate::error::Error;
use crate::kind::Kind;
use crate::kind::MemShare;
use crate::memory::{CopyMemory, Mapped};
use crate::state::{Agreed, IsReady, State};

use super::CanGet;

/// `count` blocks of `size` bytes: block `i` starts `i * src_stride` bytes
/// after the first block's source and `i * dst_stride` bytes after its
/// destination ([`CopyBatch::put_strided`], [`CopyBatch::get_strided`]).
///
/// A destination stride below `size` makes blocks overlap: refused at
/// enqueue (F3). A source stride of 0 reads one block into every
/// destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Strided {
    /// Blocks, one op each.
    pub count: u64,
    /// Bytes per block.
    pub size: u64,
    /// Bytes from one block's source to the next one's.
    pub src_stride: u64,
    /// Bytes from one block's destination to the next one's.
    pub dst_stride: u64,
}

impl Strided {
    /// `count` blocks of `size` bytes laid end to end on both sides: one
    /// span of `count * size` bytes, as `count` ops.
    pub const fn contiguous(count: u64, size: u64) -> Strided {
        Strided {
            count,
            size,
            src_stride: size,
            dst_stride: size,
        }
    }

    /// `count` blocks of `size` bytes, `src_stride` apart in the source
    /// and `dst_stride` apart in the destination.
    pub const fn new(count: u64, size: u64, src_stride: u64, dst_stride: u64) -> Strided {
        Strided {
            count,
            size,
            src_stride,
            dst_stride,
        }
    }

    /// Block `i`'s start on a side whose first block starts at `first`
    /// (saturated: a start past `u64::MAX` is refused as out of range).
    fn at(first: u64, stride: u64, i: u64) -> u64 {
        stride
            .checked_mul(i)
            .and_then(|d| d.checked_add(first))
            .unwrap_or(u64::MAX)
    }

    /// The end of the last block on a side whose first block starts at
    /// `first`; `None` past `u64::MAX`.
    fn last_end(&self, first: u64, stride: u64) -> Option<u64> {
        stride
            .checked_mul(self.count.checked_sub(1)?)?
            .checked_add(first)?
            .checked_add(self.size)
    }

    /// Whether the destinations are laid out apart, in order (F3), and the
    /// blocks have bytes (a 0-byte op's own rule is checked op by op).
    fn apart(&self) -> bool {
        self.size > 0 && self.dst_stride >= self.size
    }
}

impl<'a> CopyBatch<'a> {
    /// Puts [`Strided`] blocks of `src` into `ep`: block `i` from
    /// `src_offset + i * src_stride` to `offset + i * dst_stride`, one op
    /// each, as `count` calls of [`CopyBatch::put`] would, at a cost per op
    /// near the raw op list's once the first block passed (`Strided`'s
    /// checks are made once, against the last block). `src` is taken as
    /// `put`'s ([`CopyMemory`](crate::bounds::CopyMemory)).
    ///
    /// ```no_run
    /// # use cuda_endpoints::{CopyBatch, Strided};
    /// # fn f(src: &cuda_endpoints::Mapped<cuda_endpoints::Private>,
    /// #      ep: &cuda_endpoints::Endpoint<cuda_endpoints::Ready, cuda_endpoints::Unicast>) {
    /// // Eight 4 KiB rows of `src`, end to end, into the endpoint one
    /// // every 64 KiB: eight ops, checked at once.
    /// let batch = CopyBatch::new().put_strided(src, 0, ep, 0, Strided::new(8, 4096, 4096, 65536));
    /// # }
    /// ```
    #[inline]
    pub fn put_strided<M: CopyMemory<'a>, S, K: Kind>(
        mut self,
        src: M,
        src_offset: u64,
        ep: &'a Endpoint<S, K>,
        offset: u64,
        blocks: Strided,
    ) -> Self
    where
        S: State + IsReady + Agreed,
    {
        let src = src.mapped();
        if blocks.count == 0 {
            return self;
        }
        self = self.put(src, src_offset, ep, offset, blocks.size);
        if blocks.count == 1 {
            // Nothing more (`room_for`): a lone block stays a lone put,
            // which the one-put lane takes (`one.rs`).
            return self;
        }
        let rest = match self.cold(|inner| inner.put_rest(src, src_offset, ep, offset, &blocks)) {
            None => return self,
            Some(Rest::Proven(dst_end)) => {
                // No wrap: the last block's ends were checked, and the
                // cursor's memory does not wrap (`mapped_slow`).
                let from = self.hot.mem_ptr.wrapping_add(src_offset);
                let id = ep.id();
                let Strided {
                    count,
                    size,
                    src_stride,
                    dst_stride,
                } = blocks;
                let (mut from, mut to) = (from, offset);
                if self.hot.extend(count, || {
                    from = from.wrapping_add(src_stride);
                    to = to.wrapping_add(dst_stride);
                    super::put_op(from, id, to, size)
                }) {
                    self.hot.put_from = dst_end;
                    return self;
                }
                count - 1
            }
            Some(Rest::OneByOne(rest)) => rest,
        };
        for i in 1..=rest {
            if self.inner.failed() {
                break;
            }
            self = self.put(
                src,
                Strided::at(src_offset, blocks.src_stride, i),
                ep,
                Strided::at(offset, blocks.dst_stride, i),
                blocks.size,
            );
        }
        self
    }

    /// Gets [`Strided`] blocks of the unicast endpoint `ep` into `dst`:
    /// block `i` from `offset + i * src_stride` to
    /// `dst_offset + i * dst_stride`, one op each, as `count` calls of
    /// [`CopyBatch::get`] would (F1: see [`CanGet`]), its checks made once
    /// as [`CopyBatch::put_strided`]'s are. `dst` is taken as `get`'s
    /// ([`CopyMemory`](crate::bounds::CopyMemory)).
    #[inline]
    pub fn get_strided<M: CopyMemory<'a>, S, K>(
        mut self,
        ep: &'a Endpoint<S, K>,
        offset: u64,
        dst: M,
        dst_offset: u64,
        blocks: Strided,
    ) -> Self
    where
        S: State + IsReady + Agreed,
        K: CanGet,
    {
        let dst = dst.mapped();
        if blocks.count == 0 {
            return self;
        }
        self = self.get(ep, offset, dst, dst_offset, blocks.size);
        let rest = match self.cold(|inner| inner.get_rest(ep, offset, dst, dst_offset, &blocks)) {
            None => return self,
            Some(Rest::Proven(dst_end)) => {
                // No wrap, as in `put_strided`.
                let to = self.hot.mem_ptr.wrapping_add(dst_offset);
                let id = ep.id();
                let Strided {
                    count,
                    size,
                    src_stride,
                    dst_stride,
                } = blocks;
                let (mut from, mut to) = (offset, to);
                if self.hot.extend(count, || {
                    from = from.wrapping_add(src_stride);
                    to = to.wrapping_add(dst_stride);
                    super::get_op(id, from, Pointer::device(to), size)
                }) {
                    self.inner.get_end = self.hot.mem_ptr.wrapping_add(dst_end);
                    return self;
                }
                count - 1
            }
            Some(Rest::OneByOne(rest)) => rest,
        };
        for i in 1..=rest {
            if self.inner.failed() {
                break;
            }
            self = self.get(
                ep,
                Strided::at(offset, blocks.src_stride, i),
                dst,
                Strided::at(dst_offset, blocks.dst_stride, i),
                blocks.size,
            );
        }
        self
    }
}

/// What follows a strided call's first block.
enum Rest {
    /// Every block proven: the end of the last one's destination (an
    /// endpoint offset for a put, an offset in the memory for a get).
    Proven(u64),
    /// This many blocks left, checked one by one.
    OneByOne(u64),
}

impl Hot {
    /// Writes blocks `1..count` (`next()` each, in order) if the list has
    /// room for them all; nothing otherwise.
    #[inline(always)]
    fn extend(&mut self, count: u64, mut next: impl FnMut() -> CopyOp) -> bool {
        let room = (self.stop.addr() - self.at.addr()) / std::mem::size_of::<CopyOp>();
        let Some(rest) = usize::try_from(count)
            .ok()
            .and_then(|n| n.checked_sub(1))
            .filter(|&n| n <= room)
        else {
            return false;
        };
        let end = self.at.wrapping_add(rest);
        while self.at != end {
            self.write(next());
        }
        true
    }
}

impl BatchInner {
    /// After a strided put's first block: room for the rest, and the end
    /// of the last block's destination when every block is proven
    /// ([`BatchInner::put_rest_proven`]: the caller writes them at raw's
    /// cost per op, [`Hot::extend`]); else how many blocks are left to put
    /// one by one (`None`: none, or no room).
    #[inline(never)]
    fn put_rest<H: MemShare, S: State, K: Kind>(
        &mut self,
        src: &Mapped<H>,
        src_offset: u64,
        ep: &Endpoint<S, K>,
        offset: u64,
        blocks: &Strided,
    ) -> Option<Rest> {
        let rest = self.room_for(blocks.count)?;
        Some(
            match self.put_rest_proven(src, src_offset, ep, offset, blocks) {
                Some(dst_end) => Rest::Proven(dst_end),
                None => Rest::OneByOne(rest),
            },
        )
    }

    /// After a strided get's first block: as [`BatchInner::put_rest`].
    #[inline(never)]
    fn get_rest<H: MemShare, S: State, K: Kind>(
        &mut self,
        ep: &Endpoint<S, K>,
        offset: u64,
        dst: &Mapped<H>,
        dst_offset: u64,
        blocks: &Strided,
    ) -> Option<Rest> {
        let rest = self.room_for(blocks.count)?;
        Some(
            match self.get_rest_proven(ep, offset, dst, dst_offset, blocks) {
                Some(dst_end) => Rest::Proven(dst_end),
                None => Rest::OneByOne(rest),
            },
        )
    }

    /// Room in the op list for `count - 1` more ops (the first is in):
    /// how many, or `None` after keeping [`Error::CopyTooManyOps`] when
    /// the list cannot hold them, before any of it is allocated.
    fn room_for(&mut self, count: u64) -> Option<u64> {
        let rest = count.checked_sub(1)?;
        if rest == 0 {
            return None;
        }
        match usize::try_from(rest).map(|n| self.list.try_reserve_exact(n)) {
            Ok(Ok(())) => Some(rest),
            _ => {
                self.error
                    .get_or_insert_with(|| Box::new(Error::CopyTooManyOps { ops: count }));
                None
            }
        }
    }

    /// Whether an op so far failed a check of its local side: the batch
    /// is refused at enqueue naming it (before any endpoint side's error),
    /// so a strided call adds no more. After an endpoint side's error alone
    /// it goes on, as its ops one by one would: a later block's local side
    /// would be the error reported.
    fn failed(&self) -> bool {
        self.error.is_some()
    }

    /// After a strided put's first block: the end of its last block's
    /// destination when every block is proven (the first set the cursor on
    /// `mem` and `ep`, the last one's source ends inside `mem`, its
    /// destination inside the cursor's bound interval, destinations apart).
    fn put_rest_proven<H: MemShare, S: State, K: Kind>(
        &self,
        mem: &Mapped<H>,
        src_offset: u64,
        ep: &Endpoint<S, K>,
        offset: u64,
        blocks: &Strided,
    ) -> Option<u64> {
        let c = &self.cursor;
        let first_end = offset.checked_add(blocks.size)?;
        let src_end = blocks.last_end(src_offset, blocks.src_stride)?;
        let dst_end = blocks.last_end(offset, blocks.dst_stride)?;
        (blocks.apart()
            && std::ptr::from_ref(mem).addr() == c.mem
            && std::ptr::from_ref(ep).addr() == c.ep_at
            && c.putting
            && c.put_from == first_end
            && src_end <= c.mem_size
            && dst_end <= c.end)
            .then_some(dst_end)
    }

    /// After a strided get's first block: the end of its last block's
    /// destination (an offset in `mem`) when every block is proven, as
    /// [`BatchInner::put_rest_proven`].
    fn get_rest_proven<H: MemShare, S: State, K: Kind>(
        &self,
        ep: &Endpoint<S, K>,
        offset: u64,
        mem: &Mapped<H>,
        dst_offset: u64,
        blocks: &Strided,
    ) -> Option<u64> {
        let c = &self.cursor;
        let src_end = blocks.last_end(offset, blocks.src_stride)?;
        let dst_end = blocks.last_end(dst_offset, blocks.dst_stride)?;
        (blocks.apart()
            && std::ptr::from_ref(mem).addr() == c.mem
            && std::ptr::from_ref(ep).addr() == c.ep_at
            && offset >= c.start
            && src_end <= c.end
            && dst_end <= c.mem_size)
            .then_some(dst_end)
    }
}
