//! The memory shares this process knows, by their fabric handle bytes
//! (issue 29, item 2): what keeps a peer from choosing where this rank's
//! copies land on the portable path.
//!
//! What this file owns: one table per process (the driver's
//! [`process_scope`](crate::driver::Driver::process_scope), as the table of
//! attached endpoint handles in `context`), filled by `windows`: the bytes
//! of every share this process exported for its own memory ([`note_own`]),
//! and of every peer share it imported, with the communicator and the rank
//! it took it as ([`note_peer`]). [`check`] answers, before a peer's share
//! is imported, whether its bytes are memory this process already knows as
//! another rank's (its own included): a window over it would make a copy
//! "to" that peer land in this process's own memory, or in another peer's.
//!
//! An entry lives as long as the memory it names: it holds that memory
//! weakly (the binding's mapping, or the imported window's), so it goes
//! when the memory is freed or the window removed, and keeps nothing
//! alive. What it does not know: a peer's own fabric handle for memory it
//! imported from this rank (new bytes for the same memory), and POSIX
//! descriptors, which carry no bytes (`guide::security` says so).

use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use crate::context::Context;

/// Which process's table: `(true, scope)` for a driver that names its
/// process, `(false, context)` for one that does not.
type Scope = (bool, u64);

fn scope(ctx: &Context) -> Scope {
    match ctx.process_scope() {
        Some(s) => (true, s),
        None => (false, ctx.key() as u64),
    }
}

/// Whose memory an entry is, as this process took it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Whose {
    /// This process's own.
    Own,
    /// Rank `rank`'s, as the communicator whose own endpoint is `comm`
    /// numbers it.
    Peer { comm: u32, rank: usize },
}

struct Entry {
    scope: Scope,
    whose: Whose,
    mem: Weak<dyn Any + Send + Sync>,
}

#[derive(Default)]
struct Table {
    by_bytes: HashMap<[u8; 64], Vec<Entry>>,
    /// Entries after the last sweep of the dead ones.
    swept: usize,
    entries: usize,
}

static TABLE: Mutex<Option<Table>> = Mutex::new(None);

fn note(ctx: &Context, bytes: &[u8; 64], whose: Whose, mem: &Arc<dyn Any + Send + Sync>) {
    if *bytes == [0; 64] {
        return; // a descriptor's share: no bytes to know it by
    }
    let mut t = TABLE.lock().unwrap_or_else(PoisonError::into_inner);
    let t = t.get_or_insert_with(Table::default);
    // Dead entries go when the table doubled since the last sweep.
    if t.entries > t.swept.saturating_mul(2).max(64) {
        t.by_bytes.retain(|_, v| {
            v.retain(|e| e.mem.strong_count() > 0);
            !v.is_empty()
        });
        t.entries = t.by_bytes.values().map(Vec::len).sum();
        t.swept = t.entries;
    }
    let v = t.by_bytes.entry(*bytes).or_default();
    v.retain(|e| e.mem.strong_count() > 0);
    v.push(Entry {
        scope: scope(ctx),
        whose,
        mem: Arc::downgrade(mem),
    });
    t.entries = t.entries.saturating_add(1);
}

/// This process exported `bytes` for peers to reach `mem`, its own memory.
pub(crate) fn note_own(ctx: &Context, bytes: &[u8; 64], mem: &Arc<dyn Any + Send + Sync>) {
    note(ctx, bytes, Whose::Own, mem);
}

/// This process imported `bytes` as rank `rank`'s memory for the
/// communicator whose own endpoint is `comm`, mapped as `mem`.
pub(crate) fn note_peer(
    ctx: &Context,
    comm: u32,
    rank: usize,
    bytes: &[u8; 64],
    mem: &Arc<dyn Any + Send + Sync>,
) {
    note(ctx, bytes, Whose::Peer { comm, rank }, mem);
}

/// Whether rank `rank`'s share `bytes`, for the communicator whose own
/// endpoint is `comm` on this rank (`me`), is memory this process already
/// knows as another rank's: `Err(owner)`, `me` for its own memory. The
/// same rank's memory again (an agreement run again), or memory taken for
/// another communicator (whose ranks are numbered apart), is not refused.
pub(crate) fn check(
    ctx: &Context,
    comm: u32,
    me: usize,
    rank: usize,
    bytes: &[u8; 64],
) -> Result<(), usize> {
    if *bytes == [0; 64] {
        return Ok(());
    }
    let here = scope(ctx);
    let t = TABLE.lock().unwrap_or_else(PoisonError::into_inner);
    let Some(entries) = t.as_ref().and_then(|t| t.by_bytes.get(bytes)) else {
        return Ok(());
    };
    for e in entries
        .iter()
        .filter(|e| e.scope == here && e.mem.strong_count() > 0)
    {
        match e.whose {
            Whose::Own => return Err(me),
            Whose::Peer { comm: c, rank: r } if c == comm && r != rank => return Err(r),
            Whose::Peer { .. } => {}
        }
    }
    Ok(())
}

#[cfg(all(test, feature = "model"))]
mod tests {
    use super::*;

    #[test]
    fn a_share_is_refused_as_own_or_another_ranks_memory_while_that_memory_lives() {
        let (ctx, _model) = Context::model(Default::default());
        let own: Arc<dyn Any + Send + Sync> = Arc::new(1u8);
        let peer: Arc<dyn Any + Send + Sync> = Arc::new(2u8);
        let (a, b) = ([0xa1; 64], [0xb2; 64]);
        note_own(&ctx, &a, &own);
        note_peer(&ctx, 7, 1, &b, &peer);
        assert_eq!(
            check(&ctx, 7, 0, 1, &a),
            Err(0),
            "this process's own memory"
        );
        assert_eq!(
            check(&ctx, 7, 0, 2, &b),
            Err(1),
            "rank 1's memory as rank 2's"
        );
        assert_eq!(check(&ctx, 7, 0, 1, &b), Ok(()), "rank 1 again");
        assert_eq!(check(&ctx, 8, 0, 2, &b), Ok(()), "another communicator");
        assert_eq!(
            check(&ctx, 7, 0, 1, &[0; 64]),
            Ok(()),
            "a descriptor's share"
        );
        // Another process of the same fabric knows none of it.
        let other = Context::new(_model.spawn_process());
        assert_eq!(check(&other, 7, 0, 1, &a), Ok(()));
        // Freed memory is forgotten.
        drop((own, peer));
        assert_eq!(check(&ctx, 7, 0, 1, &a), Ok(()));
        assert_eq!(check(&ctx, 7, 0, 2, &b), Ok(()));
    }
}
