//! Bring-ups that share one bootstrap at once (issue 20, item 7): eight
//! communicators over the same ranks, each brought up on its own thread,
//! with one TCP or MPI communicator under them all.
//!
//! What this file owns: [`Tagged`], which wraps one rank's bootstrap, and
//! its [`Channel`]s, one per tag, each a [`Bootstrap`] of its own. A
//! collective on a channel is a message `(tag, sequence, bytes)`; the
//! channels of a rank take turns running *rounds* on the shared bootstrap
//! (one allgather of every message waiting on this rank), and each message
//! that arrives is kept for its tag and sequence until that channel's
//! collective takes it. So a channel never takes another tag's message,
//! whatever the order the threads of each rank reach their collectives,
//! and every rank must give one bring-up the same tag (the bring-up's own
//! [`TeamSpec::tag`](super::TeamSpec::tag) / [`PeerSpec::tag`](super::PeerSpec::tag),
//! which its messages carry and check, [`Mismatch::Tag`](super::Mismatch::Tag)).
//!
//! A round needs every rank: a rank runs rounds while one of its channels
//! waits, so a channel's collective completes once every rank's channel of
//! that tag made the same call, within the caller's timeout. Peer bytes are
//! read checked: a malformed batch or a message sent twice is the shared
//! bootstrap's [`BootstrapError::Malformed`], never a panic; at most
//! [`Tagged::MAX_KEPT`] messages, and of each peer at most
//! [`Tagged::MAX_KEPT_BYTES_PER_PEER`] bytes, wait for a channel that did
//! not begin its collective yet; a message for a collective that is over
//! on this rank (taken, timed out or failed) is dropped.
//!
//! A round is one frame of the shared bootstrap, shared among the ranks: a
//! message larger than [`Tagged::max_message`] is refused by its sender
//! before anything is sent, and the other ranks' collective of that tag
//! fails with [`BootstrapError::ContributionTooLarge`] naming the sender;
//! messages that together exceed a round wait for the next one.
//!
//! A round runs on the rank of the channel that waits, within that
//! channel's timeout. A collective that times out *between* rounds leaves
//! the shared bootstrap as it was (its late messages are dropped). One
//! whose timeout passes while its round is in flight abandons that round
//! half-way, and a half-done step cannot be resumed on every bootstrap: on
//! TCP with three ranks or more (the ring) the shared bootstrap is then
//! broken by design. Every later collective of every channel then fails at
//! once, never at its own deadline: on this rank with
//! [`BootstrapError::SharedBroken`] naming the channel and collective whose
//! round failed and why; on the other ranks with what the ring tells them
//! first ([`BootstrapError::Aborted`], or [`BootstrapError::PeerClosed`]
//! for the broken rank, which closed its ring links), and `SharedBroken`
//! after it. So give a
//! channel's collectives a timeout every rank can meet, or bring the
//! channels up again over a new bootstrap.

use std::collections::{HashMap, HashSet};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::bootstrap::{
    Argument, Bootstrap, BootstrapError, Deadline, Exchange, Malformed, Op, Traffic,
};

use super::wire::from_bytes;

/// One message of a round.
#[derive(Serialize, Deserialize)]
struct Item {
    tag: u64,
    seq: u64,
    bytes: Vec<u8>,
    /// The sender refused its message for this collective: it had this
    /// many bytes, more than a round carries ([`Tagged::max_message`]).
    /// `bytes` is then empty.
    refused: Option<u64>,
}

/// The most bytes an [`Item`] encodes to beyond its `bytes`: four varints
/// (tag, sequence, the option and its value, the length) of at most 10
/// bytes each, and the option's byte.
const ITEM_OVERHEAD: usize = 48;
/// The most bytes of a batch beyond its items: the count's varint.
const BATCH_OVERHEAD: usize = 10;
/// Per rank, room in one frame for what the shared bootstrap adds to each
/// rank's batch (the TCP list's length varint at rank 0, the ring's origin).
const RANK_SLACK: usize = 64;

#[derive(Default)]
struct State {
    /// This rank's messages not sent yet.
    outbox: Vec<Item>,
    /// Messages arrived, by `(tag, sequence)`, per sending rank.
    inbox: HashMap<(u64, u64), Vec<Option<Vec<u8>>>>,
    /// Each tag's next sequence number on this rank.
    next: HashMap<u64, u64>,
    /// The `(tag, sequence)` a channel of this rank waits for now.
    waiting: HashSet<(u64, u64)>,
    /// Per `(tag, sequence)` in `inbox`, the first sender that refused its
    /// message as too large, and the message's length.
    refusals: HashMap<(u64, u64), (usize, u64)>,
    /// Per sending rank, the bytes of its messages in `inbox` that no
    /// channel waits for yet (bounded by `MAX_KEPT_BYTES_PER_PEER`).
    kept_by: Vec<usize>,
    /// A round is running on the shared bootstrap.
    round: bool,
    /// The last round that failed on this rank: the channel and collective
    /// it ran for, and its error, to name when the shared bootstrap then
    /// refuses every later round as broken.
    failed: Option<(u64, u64, String)>,
    /// Rounds in a row that carried no message from any rank.
    idle: u32,
}

/// One rank's bootstrap, shared by bring-ups that run at once, each through
/// its own [`Channel`] ([`Tagged::channel`]).
pub struct Tagged<B> {
    inner: Mutex<B>,
    rank: usize,
    size: usize,
    state: Mutex<State>,
    turn: Condvar,
}

impl<B> std::fmt::Debug for Tagged<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tagged")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .finish_non_exhaustive()
    }
}

impl<B: Bootstrap> Tagged<B> {
    /// The most messages kept for channels that did not take them yet.
    pub const MAX_KEPT: usize = 4096;
    /// The most bytes of one peer's messages kept for channels that did
    /// not take them yet: one frame of the bootstrap.
    pub const MAX_KEPT_BYTES_PER_PEER: usize = crate::bootstrap::MAX_PAYLOAD;

    /// The most bytes one message of a channel may have: one round carries
    /// every waiting message of every rank in one frame of the shared
    /// bootstrap ([`crate::bootstrap::MAX_PAYLOAD`]), so each rank's batch
    /// gets that frame's share of one rank. A larger message is refused by
    /// its sender before anything is sent
    /// ([`Argument::RoundTooLarge`](crate::bootstrap::Argument::RoundTooLarge)),
    /// and the other ranks' collective fails with
    /// [`BootstrapError::ContributionTooLarge`] naming it.
    pub fn max_message(&self) -> usize {
        round_max(self.size)
            .saturating_sub(BATCH_OVERHEAD)
            .saturating_sub(ITEM_OVERHEAD)
    }

    /// Shares `inner` among channels.
    pub fn new(inner: B) -> Tagged<B> {
        Tagged {
            rank: inner.rank(),
            size: inner.size(),
            inner: Mutex::new(inner),
            state: Mutex::new(State::default()),
            turn: Condvar::new(),
        }
    }

    /// The channel of tag `tag`: a bootstrap whose collectives meet only
    /// the same tag's channels of the other ranks. Give each bring-up that
    /// runs at once its own tag, the same on every rank.
    pub fn channel(&self, tag: u64) -> Channel<'_, B> {
        Channel { mux: self, tag }
    }

    /// The shared bootstrap back.
    pub fn into_inner(self) -> B {
        self.inner
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Every rank's `mine` for the next collective of `tag`.
    fn gather(
        &self,
        tag: u64,
        mine: &[u8],
        timeout: Duration,
    ) -> Result<Vec<Vec<u8>>, BootstrapError> {
        let deadline = Deadline::after(timeout);
        let mut st = self.state();
        let next = st.next.entry(tag).or_insert(0);
        let seq = *next;
        *next = next.saturating_add(1);
        let max = self.max_message();
        let too_large = mine.len() > max;
        // Too large for any round: refused here, before anything is sent;
        // the other ranks hear of the refusal (not of bytes they would
        // call malformed) and fail this collective naming this rank.
        st.outbox.push(Item {
            tag,
            seq,
            bytes: if too_large { Vec::new() } else { mine.to_vec() },
            refused: too_large.then_some(mine.len() as u64),
        });
        st.waiting.insert((tag, seq));
        // What arrived for this collective before it began is no longer
        // kept for a channel to come: it is this one's.
        if let Some(slots) = st.inbox.get(&(tag, seq)) {
            let early: Vec<(usize, usize)> = slots
                .iter()
                .enumerate()
                .filter_map(|(peer, b)| b.as_ref().map(|b| (peer, b.len())))
                .collect();
            for (peer, len) in early {
                if let Some(k) = st.kept_by.get_mut(peer) {
                    *k = k.saturating_sub(len);
                }
            }
        }
        let step = Exchange {
            op: Op::Allgather,
            seq,
        };
        let (mut st, got) = self.gather_loop(st, tag, seq, step, deadline);
        // Over, whatever the outcome: what comes for it later is stale, and
        // its message, if no round carried it yet, is not sent.
        st.waiting.remove(&(tag, seq));
        st.inbox.remove(&(tag, seq));
        st.refusals.remove(&(tag, seq));
        st.outbox.retain(|it| (it.tag, it.seq) != (tag, seq));
        if too_large {
            return Err(BootstrapError::InvalidArgument {
                rank: self.rank,
                step,
                what: Argument::RoundTooLarge {
                    len: mine.len(),
                    max,
                },
            });
        }
        got
    }

    fn gather_loop<'s>(
        &'s self,
        mut st: MutexGuard<'s, State>,
        tag: u64,
        seq: u64,
        step: Exchange,
        deadline: Deadline,
    ) -> (MutexGuard<'s, State>, Result<Vec<Vec<u8>>, BootstrapError>) {
        loop {
            // A refusal, this rank's own included (it comes back in the
            // round that carried it), ends the collective.
            if let Some(&(peer, len)) = st.refusals.get(&(tag, seq)) {
                let e = BootstrapError::ContributionTooLarge {
                    rank: self.rank,
                    step,
                    peer,
                    len,
                    max: self.max_message() as u64,
                };
                return (st, Err(e));
            }
            if st
                .inbox
                .get(&(tag, seq))
                .is_some_and(|all| all.iter().all(Option::is_some))
            {
                let all = st.inbox.remove(&(tag, seq)).unwrap_or_default();
                return (
                    st,
                    Ok(all.into_iter().map(Option::unwrap_or_default).collect()),
                );
            }
            if deadline.passed() {
                let waiting_for = st
                    .inbox
                    .get(&(tag, seq))
                    .map(|all| (0..all.len()).filter(|&r| all[r].is_none()).collect())
                    .unwrap_or_else(|| (0..self.size).filter(|&r| r != self.rank).collect());
                return (
                    st,
                    Err(BootstrapError::Timeout {
                        rank: self.rank,
                        step,
                        waiting_for,
                        after: deadline.timeout(),
                    }),
                );
            }
            if st.round {
                // Another channel of this rank runs a round: it carries this
                // message too.
                st = self
                    .turn
                    .wait_timeout(st, deadline.remaining())
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
                continue;
            }
            st.round = true;
            let batch = take_round(&mut st.outbox, round_max(self.size));
            // Nobody had anything to say last time: a short pause, so that
            // ranks waiting for a busy peer do not spin (at most 8 ms).
            let pause = Duration::from_micros(250u64 << st.idle.min(5));
            let idle = st.idle > 0;
            drop(st);
            if idle {
                std::thread::sleep(pause.min(deadline.remaining()));
            }
            let got = self.round(&batch, step, deadline);
            st = self.state();
            st.round = false;
            self.turn.notify_all();
            match got.and_then(|all| self.keep(&mut st, all, step)) {
                Ok(any) => st.idle = if any { 0 } else { st.idle.saturating_add(1) },
                Err(e) => {
                    let e = match (e, &st.failed) {
                        // Broken by an earlier round: say which channel's,
                        // not only the peer that round blamed.
                        (
                            BootstrapError::Broken { .. } | BootstrapError::Poisoned { .. },
                            Some((tag, seq, cause)),
                        ) => BootstrapError::SharedBroken {
                            rank: self.rank,
                            step,
                            tag: *tag,
                            seq: *seq,
                            cause: cause.clone(),
                        },
                        (e, _) => {
                            st.failed = Some((tag, seq, e.to_string()));
                            e
                        }
                    };
                    // Not sent: the messages stay for a later round (which
                    // will most likely fail alike; the shared bootstrap is
                    // broken).
                    let mut batch = batch;
                    batch.append(&mut st.outbox);
                    st.outbox = batch;
                    return (st, Err(e));
                }
            }
        }
    }

    /// One round on the shared bootstrap: every rank's waiting messages.
    /// A batch that does not encode within a round's share is refused here
    /// (never sent as bytes the others would call malformed); `take_round`
    /// and `max_message` keep that from happening.
    fn round(
        &self,
        batch: &[Item],
        step: Exchange,
        deadline: Deadline,
    ) -> Result<Vec<Vec<u8>>, BootstrapError> {
        let max = round_max(self.size);
        let Some(bytes) = crate::bootstrap::codec::encode(&batch, max) else {
            let len = batch.iter().fold(0usize, |a, it| {
                a.saturating_add(it.bytes.len())
                    .saturating_add(ITEM_OVERHEAD)
            });
            return Err(BootstrapError::InvalidArgument {
                rank: self.rank,
                step,
                what: Argument::RoundTooLarge { len, max },
            });
        };
        let inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner.allgather(&bytes, deadline.remaining())
    }

    /// Files what a round brought; whether it brought any message.
    fn keep(
        &self,
        st: &mut State,
        all: Vec<Vec<u8>>,
        step: Exchange,
    ) -> Result<bool, BootstrapError> {
        let bad = |peer: usize, what: Malformed| BootstrapError::Malformed {
            rank: self.rank,
            step,
            peer,
            what,
        };
        let mut any = false;
        for (peer, bytes) in all.iter().enumerate() {
            let items: Vec<Item> = from_bytes(bytes).map_err(|_| bad(peer, Malformed::Encoding))?;
            for it in items {
                any = true;
                let key = (it.tag, it.seq);
                let waited = st.waiting.contains(&key);
                // A sequence this rank's channel is done with (taken or
                // given up): no channel will take it, so it is dropped.
                if !waited && st.next.get(&it.tag).is_some_and(|&n| it.seq < n) {
                    continue;
                }
                if !st.inbox.contains_key(&key) && st.inbox.len() >= Self::MAX_KEPT {
                    return Err(bad(peer, Malformed::Overflow));
                }
                let kept = if waited {
                    None
                } else {
                    let now = st.kept_by.get(peer).copied().unwrap_or(0);
                    match now.checked_add(it.bytes.len()) {
                        Some(k) if k <= Self::MAX_KEPT_BYTES_PER_PEER => Some(k),
                        _ => return Err(bad(peer, Malformed::Overflow)),
                    }
                };
                let slots = st.inbox.entry(key).or_insert_with(|| vec![None; self.size]);
                match slots.get_mut(peer) {
                    Some(slot @ None) => *slot = Some(it.bytes),
                    // The same message twice, or a rank past the job.
                    _ => return Err(bad(peer, Malformed::Trailing)),
                }
                if let Some(len) = it.refused {
                    st.refusals.entry(key).or_insert((peer, len));
                }
                if let Some(k) = kept {
                    if st.kept_by.len() < self.size {
                        st.kept_by.resize(self.size, 0);
                    }
                    if let Some(slot) = st.kept_by.get_mut(peer) {
                        *slot = k;
                    }
                }
            }
        }
        Ok(any)
    }
}

/// The most bytes of one rank's batch in one round: one frame of the shared
/// bootstrap shared among `size` ranks, less what the bootstrap adds.
fn round_max(size: usize) -> usize {
    (crate::bootstrap::MAX_PAYLOAD / size.max(1)).saturating_sub(RANK_SLACK)
}

/// The oldest messages of `outbox` whose batch encodes within `max` bytes
/// (at least one: every message alone fits, [`Tagged::max_message`]); the
/// rest wait for the next round.
fn take_round(outbox: &mut Vec<Item>, max: usize) -> Vec<Item> {
    let mut used = BATCH_OVERHEAD;
    let mut n = 0;
    for it in outbox.iter() {
        let cost = it.bytes.len().saturating_add(ITEM_OVERHEAD);
        if n > 0 && used.saturating_add(cost) > max {
            break;
        }
        used = used.saturating_add(cost);
        n += 1;
    }
    let rest = outbox.split_off(n);
    std::mem::replace(outbox, rest)
}

/// One tag's view of a [`Tagged`] bootstrap: a [`Bootstrap`] of its own.
pub struct Channel<'a, B> {
    mux: &'a Tagged<B>,
    tag: u64,
}

impl<B> std::fmt::Debug for Channel<'_, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Channel")
            .field("rank", &self.mux.rank)
            .field("tag", &self.tag)
            .finish()
    }
}

impl<B> Channel<'_, B> {
    /// Its tag.
    pub fn tag(&self) -> u64 {
        self.tag
    }
}

impl<B: Bootstrap> Bootstrap for Channel<'_, B> {
    fn rank(&self) -> usize {
        self.mux.rank
    }

    fn size(&self) -> usize {
        self.mux.size
    }

    fn allgather(&self, mine: &[u8], timeout: Duration) -> Result<Vec<Vec<u8>>, BootstrapError> {
        self.mux.gather(self.tag, mine, timeout)
    }

    fn broadcast(
        &self,
        root: usize,
        bytes_if_root: &[u8],
        timeout: Duration,
    ) -> Result<Vec<u8>, BootstrapError> {
        if root >= self.mux.size {
            return Err(BootstrapError::InvalidArgument {
                rank: self.mux.rank,
                step: Exchange {
                    op: Op::Broadcast,
                    seq: 0,
                },
                what: crate::bootstrap::Argument::RankOutOfRange {
                    rank: root,
                    size: self.mux.size,
                },
            });
        }
        let mine = if self.mux.rank == root {
            bytes_if_root
        } else {
            &[]
        };
        let mut all = self.mux.gather(self.tag, mine, timeout)?;
        Ok(std::mem::take(&mut all[root]))
    }

    fn barrier(&self, timeout: Duration) -> Result<(), BootstrapError> {
        self.mux.gather(self.tag, &[], timeout).map(drop)
    }

    fn traffic(&self) -> Traffic {
        self.mux
            .inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .traffic()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bootstrap::Threads;
    use crate::team::wire::to_bytes;

    #[test]
    fn a_round_of_garbage_or_a_message_sent_twice_is_malformed_not_a_panic() {
        let mux = Tagged::new(Threads::new(2).remove(0));
        let step = Exchange {
            op: Op::Allgather,
            seq: 0,
        };
        let one = to_bytes(&vec![Item {
            tag: 1,
            seq: 0,
            bytes: vec![9],
            refused: None,
        }]);
        let mut st = State::default();
        assert_eq!(
            mux.keep(&mut st, vec![one.clone(), Vec::new()], step).ok(),
            None
        );
        let mut st = State::default();
        assert_eq!(
            mux.keep(
                &mut st,
                vec![one.clone(), to_bytes(&Vec::<Item>::new())],
                step
            )
            .ok(),
            Some(true)
        );
        assert!(matches!(
            mux.keep(&mut st, vec![one, to_bytes(&Vec::<Item>::new())], step),
            Err(BootstrapError::Malformed { peer: 0, .. })
        ));
        let mut st = State::default();
        assert!(
            mux.keep(&mut st, vec![vec![0xff; 12], Vec::new()], step)
                .is_err()
        );
        let many: Vec<Item> = (0..=Tagged::<crate::bootstrap::ThreadRank>::MAX_KEPT as u64)
            .map(|seq| Item {
                tag: 2,
                seq,
                bytes: Vec::new(),
                refused: None,
            })
            .collect();
        let mut st = State::default();
        assert!(matches!(
            mux.keep(
                &mut st,
                vec![to_bytes(&many), to_bytes(&Vec::<Item>::new())],
                step
            ),
            Err(BootstrapError::Malformed {
                what: Malformed::Overflow,
                ..
            })
        ));
    }

    /// A peer that floods tags this rank never opened, each message as
    /// large as one round allows, cannot make this rank keep more than
    /// [`Tagged::MAX_KEPT_BYTES_PER_PEER`] of its bytes: the round past it
    /// is the shared bootstrap's `Malformed { Overflow }`, naming it.
    #[test]
    fn bytes_kept_for_channels_not_open_are_bounded_per_peer() {
        let mux = Tagged::new(Threads::new(2).remove(0));
        let step = Exchange {
            op: Op::Allgather,
            seq: 0,
        };
        let chunk = 1 << 20;
        let rounds = Tagged::<crate::bootstrap::ThreadRank>::MAX_KEPT_BYTES_PER_PEER / chunk + 1;
        let mut st = State::default();
        let mut refused = None;
        for seq in 0..rounds as u64 {
            let flood = to_bytes(&vec![Item {
                tag: 99,
                seq,
                bytes: vec![0xab; chunk],
                refused: None,
            }]);
            if let Err(e) = mux.keep(&mut st, vec![to_bytes(&Vec::<Item>::new()), flood], step) {
                refused = Some(e);
                break;
            }
        }
        assert!(
            matches!(
                refused,
                Some(BootstrapError::Malformed {
                    peer: 1,
                    what: Malformed::Overflow,
                    ..
                })
            ),
            "{refused:?}"
        );
        let kept: usize = st.inbox.values().flatten().flatten().map(Vec::len).sum();
        assert!(kept <= Tagged::<crate::bootstrap::ThreadRank>::MAX_KEPT_BYTES_PER_PEER);
    }

    /// A round carries at most one frame's share per rank: messages that
    /// together exceed it wait for the next round, oldest first, so no
    /// batch is ever too large to send.
    #[test]
    fn messages_that_together_exceed_a_round_go_in_later_rounds_oldest_first() {
        let max = round_max(2);
        let big = max / 2;
        let mut outbox: Vec<Item> = (0..3)
            .map(|seq| Item {
                tag: 1,
                seq,
                bytes: vec![7; big],
                refused: None,
            })
            .collect();
        let first = take_round(&mut outbox, max);
        assert_eq!(first.iter().map(|i| i.seq).collect::<Vec<_>>(), vec![0]);
        assert!(crate::bootstrap::codec::encode(&first, max).is_some());
        let second = take_round(&mut outbox, max);
        assert_eq!(second.iter().map(|i| i.seq).collect::<Vec<_>>(), vec![1]);
        assert_eq!(take_round(&mut outbox, max).len(), 1);
        assert!(outbox.is_empty());
        // A message of `max_message` bytes alone encodes within a round.
        let mux = Tagged::new(Threads::new(2).remove(0));
        let one = vec![Item {
            tag: u64::MAX,
            seq: u64::MAX,
            bytes: vec![1; mux.max_message()],
            refused: Some(u64::MAX),
        }];
        assert!(crate::bootstrap::codec::encode(&one, max).is_some());
    }

    /// A message for a sequence this rank's channel already gave up on
    /// (it timed out) is dropped: no channel will ever take it, so keeping
    /// it would hold its bytes and a slot of [`Tagged::MAX_KEPT`] forever.
    #[test]
    fn messages_of_a_collective_that_timed_out_are_not_kept_forever() {
        let mux = Tagged::new(Threads::new(2).remove(0));
        let step = Exchange {
            op: Op::Allgather,
            seq: 1,
        };
        let mut st = State::default();
        // Tag 5's sequence 0 was this rank's, and it is over.
        st.next.insert(5, 1);
        let late = to_bytes(&vec![Item {
            tag: 5,
            seq: 0,
            bytes: vec![1; 100],
            refused: None,
        }]);
        let ahead = to_bytes(&vec![Item {
            tag: 5,
            seq: 1,
            bytes: vec![2; 100],
            refused: None,
        }]);
        for _ in 0..3 {
            assert!(
                mux.keep(
                    &mut st,
                    vec![to_bytes(&Vec::<Item>::new()), late.clone()],
                    step
                )
                .is_ok()
            );
        }
        assert!(
            st.inbox.is_empty(),
            "{:?}",
            st.inbox.keys().collect::<Vec<_>>()
        );
        assert!(
            mux.keep(&mut st, vec![to_bytes(&Vec::<Item>::new()), ahead], step)
                .is_ok()
        );
        assert_eq!(st.inbox.keys().copied().collect::<Vec<_>>(), vec![(5, 1)]);
    }
}
