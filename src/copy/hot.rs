//! The batch's hot part ([`Hot`]): what a loop of builder calls keeps in
//! registers rather than behind the state's pointer, the op list's end
//! and the cursor's few fields the fast paths read and write, and how it
//! is taken from the state and parked back in it.

use super::BatchInner;
use crate::driver::{CopyOp, Operand};

/// What the fast paths write, out of [`BatchInner`] while the batch is
/// built: where `inner.list`'s next op goes (the `Vec`'s own length is set
/// when parked: its ops are plain values, so a stale length leaks nothing)
/// and the end of its capacity, and the cursor's `put_from`, with its
/// `mem_ptr` beside, and the memory and endpoint it names (the rest of the
/// cursor, which only the slow paths write, is read where it is: a compare
/// reads memory at the cost of a register, and fewer values carried around
/// a loop of puts spill none).
#[derive(Clone, Copy)]
pub(super) struct Hot {
    pub(super) at: *mut CopyOp,
    pub(super) stop: *mut CopyOp,
    pub(super) mem_ptr: u64,
    /// Where the next put through the cursor may start (F3's order): the
    /// cursor's `put_from`, kept up by the fast paths; `park` reads the
    /// cursor's back from the list, not from here.
    pub(super) put_from: u64,
    /// The first word of an op's operand naming the cursor's endpoint (its
    /// tag and id, `op_words::endpoint_word`), which a put written here
    /// names (the fast paths write only while `mem` and `ep_at` are the
    /// cursor's: `Hot::named`); any value while the cursor names none.
    /// Made from the cursor after every cold call, as `mem_ptr` is read,
    /// so that a loop of puts holds it in a register the cold call may
    /// clobber rather than spilling `ep.id()` to the stack across that
    /// call (1,024 puts 24,733 -> 23,710 instructions on `Null`,
    /// `benches/copy_batch.rs`), and writes it as one word.
    pub(super) endpoint: u64,
    /// The addresses of the memory and the endpoint an op must name to be
    /// taken here: the cursor's, or, after a builder call that left the
    /// cursor naming others, that call's with `stop` at `at` (no room: the
    /// next op goes cold). So every builder call on them leaves these two
    /// the same, and in a loop of puts on one memory and endpoint the
    /// compiler peels the first and drops their compares from the rest:
    /// 1,024 puts 29,838 -> 24,733 instructions on `Null`
    /// (`benches/copy_batch.rs`, with the fast path's failure marked cold).
    pub(super) mem: usize,
    pub(super) ep_at: usize,
}

// SAFETY: `at` and `stop` point into the batch's own op list buffer (owned
// by `inner.list`, of `Send + Sync` plain values), written only through
// the batch.
unsafe impl Send for Hot {}
// SAFETY: as `Send`; `&Hot` reads no op.
unsafe impl Sync for Hot {}

impl Hot {
    /// `inner`'s list end and cursor.
    #[inline(always)]
    pub(super) fn of(inner: &mut BatchInner) -> Hot {
        // Raw, not through a slice: it writes past the `Vec`'s length.
        let base = inner.list.as_mut_ptr();
        Hot {
            at: base.wrapping_add(inner.list.len()),
            stop: base.wrapping_add(inner.list.capacity()),
            mem_ptr: inner.cursor.mem_ptr,
            put_from: inner.cursor.put_from,
            // Truncated only when it names none (`u64::MAX`): never read.
            endpoint: super::op_words::endpoint_word(inner.cursor.ep as u32),
            mem: inner.cursor.mem,
            ep_at: inner.cursor.ep_at,
        }
    }

    /// After a cold builder call on the memory at `mem` and the endpoint at
    /// `ep_at`: the fast paths name them, as the cursor does, or, when the
    /// cursor names others, have no room until the next cold call.
    #[inline(always)]
    pub(super) fn named(&mut self, mem: usize, ep_at: usize) {
        if self.mem != mem || self.ep_at != ep_at {
            self.stop = self.at;
        }
        self.mem = mem;
        self.ep_at = ep_at;
    }

    /// How many ops the list of `inner` holds with these written.
    #[inline(always)]
    pub(super) fn len(&self, inner: &BatchInner) -> usize {
        (self.at.addr() - inner.list.as_ptr().addr()) / std::mem::size_of::<CopyOp>()
    }

    /// Back into `inner`: the list's length and the cursor.
    #[inline(always)]
    pub(super) fn park(self, inner: &mut BatchInner) {
        let len = self.len(inner);
        debug_assert!(len <= inner.list.capacity());
        // Its capacity's end, or `at` (`Hot::named`).
        debug_assert!(
            self.stop == inner.list.as_mut_ptr().wrapping_add(inner.list.capacity())
                || self.stop == self.at
        );
        let before = inner.list.len();
        // SAFETY: `inner.list` is the list `self` was taken from (`of`),
        // unchanged since (every change to it goes through `park` and `of`:
        // `CopyBatch::cold`): ops `..len` were written by `write` or
        // `push_put`, plain values, within its capacity.
        unsafe { inner.list.set_len(len) };
        // The cursor's `put_from` is the end of the last put written since
        // `of` (every put a fast path writes goes through the cursor, in
        // F3's order: `Hot::put`, `Hot::extend`), read back from the list
        // rather than from `self.put_from`: a loop of puts then keeps one
        // register for the last put's end, not that and the one before
        // for this exit (1,024 puts 23,710 -> 22,743 instructions on
        // `Null`, `benches/copy_batch.rs`).
        // (`mem_ptr` is written by the slow paths alone.)
        if len > before && inner.cursor.putting {
            inner.put_from_written(before);
        }
    }

    /// Appends `op`, if the list has room.
    #[inline(always)]
    pub(super) fn push(&mut self, op: CopyOp) -> bool {
        if self.at < self.stop {
            self.write(op);
            return true;
        }
        false
    }

    /// Appends the op of a put of `size` bytes from the device address
    /// `from` into the cursor's endpoint at `offset`, if the list has room.
    #[inline(always)]
    pub(super) fn push_put(&mut self, from: u64, offset: u64, size: u64) -> bool {
        if self.at < self.stop {
            // SAFETY: `at` is inside the buffer of `inner.list`, as in
            // `write`; a `CopyOp`'s alignment (the buffer's, `at` a whole
            // number of ops into it). Unsafe for speed: 1,024 puts 22,741
            // -> 21,725 instructions on `Null` (`op_words`).
            unsafe { super::op_words::write_put(self.at, from, self.endpoint, offset, size) };
            self.at = self.at.wrapping_add(1);
            return true;
        }
        false
    }

    /// Appends `op` where the caller saw room (`at < stop`).
    #[inline(always)]
    pub(super) fn write(&mut self, op: CopyOp) {
        debug_assert!(self.at < self.stop);
        // SAFETY: `at` is inside the buffer of `inner.list` (`at < stop`,
        // its capacity's end, `of`: checked by the callers, `push` and
        // `extend`), which no `Vec` call moved since (see `park`); the `Vec`
        // reads it only after `park` set its length over it. The gain, on
        // `benches/copy_batch.rs` (1,024 typed puts, `Null`): 38,987 →
        // 32,371 instructions (37.6 → 30.1 per op), with the op list's end
        // held here by value, which needs it (a `Vec` here would be a drop
        // on every unwind edge, which keeps the batch in memory).
        unsafe { self.at.write(op) };
        self.at = self.at.wrapping_add(1);
    }
}

impl BatchInner {
    /// The cursor's `put_from` after the fast paths wrote ops `from..`: the
    /// end of the last put among them (the last op, but for gets written
    /// after it on the same endpoint), if any.
    #[inline(never)]
    fn put_from_written(&mut self, from: usize) {
        let written = self.list.get(from..).unwrap_or_default();
        if let Some(end) = written.iter().rev().find_map(|o| match o.dst {
            // No wrap: every put's end was checked when it was written.
            Operand::LogicalEndpoint { offset, .. } => Some(offset.wrapping_add(o.size)),
            Operand::Pointer(_) => None,
        }) {
            self.cursor.put_from = end;
        }
    }
}
