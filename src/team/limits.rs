//! How large a bring-up's messages may be (issue 29, item 1), and the
//! agreement that carries one larger than a frame.
//!
//! What this file owns:
//! - the limits, every one derived from what the ranks agreed (the
//!   endpoint's size, bind alignment and team size) and bounded by
//!   [`MAX_BINDINGS_PER_DEVICE`] and [`MAX_DEVICES`](super::wire::MAX_DEVICES):
//!   [`bind`] for a rank's every-rank-bound report (`agree_bound`), which
//!   names every binding (its extent) of every device of that rank and, on the portable
//!   path, carries a memory share per binding (`windows`);
//! - [`agree_large`]: [`agree`](super::agree::agree) for a message that may
//!   be larger than one bring-up frame ([`PIECE`]): a first exchange says
//!   each rank's length (and carries its first piece), then as many more as
//!   the longest message needs. A message past its limit is refused by its
//!   sender, which sends a short notice instead ([`Head::TooLarge`]), so that
//!   every rank fails with the same [`Cause::TooLarge`] naming the sender,
//!   the step and the limit. Every length a peer claims is checked against
//!   the limit, the same on every rank, before a byte of it is kept.
//!
//! `guide::sharing` ("How large a message may be") states these limits; a
//! change here changes it.

use serde::{Deserialize, Serialize};

use crate::bootstrap::{Bootstrap, Deadline};
use crate::endpoint::Endpoint;
use crate::kind::Kind;
use crate::state::State;

use super::agree::agree_all;
use super::error::{Cause, Step, TeamError};
use super::wire::{MAX_DEVICES, from_bytes, to_bytes};

/// The most bindings one device of a rank may have at an every-rank-bound
/// agreement (`agree_bound`, `into_bound`): its report names each, and on
/// the portable path carries a memory share for each. A rank past it
/// refuses to send its report, and every rank fails with the same
/// [`Cause::TooLarge`] naming it. Bind larger chunks, or bind the rest
/// after the agreement as a symmetric heap (`OwnedPeers::grow` carries one
/// chunk per agreement).
pub const MAX_BINDINGS_PER_DEVICE: u64 = 256;

/// The most bytes of one rank's message in one exchange: a bring-up frame
/// (`wire`'s 64 KiB payload) less room for the piece's framing.
pub(crate) const PIECE: usize = 60 * 1024;

/// Bytes of the bind report per device (`bound`'s `(device, ranges)`),
/// and before them (the count).
const REPORT_PER_DEVICE: u64 = 8;
const REPORT_HEAD: u64 = 4;
/// Bytes of the bind report per binding: its endpoint offset and size.
pub(crate) const SPAN_BYTES: u64 = 16;

/// What `what` of [`Cause::TooLarge`] says, by its wire code.
const WHAT: [&str; 2] = ["bytes", "bindings on one device"];
/// [`Cause::TooLarge`] counts the message's bytes.
pub(crate) const BYTES: &str = WHAT[0];
/// [`Cause::TooLarge`] counts one device's bindings.
pub(crate) const PER_DEVICE: &str = WHAT[1];

/// The limits of one rank's every-rank-bound report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BindLimit {
    /// Bindings per device: as many as fit the endpoint at its bind
    /// alignment, at most [`MAX_BINDINGS_PER_DEVICE`].
    pub per_device: u64,
    /// The report's bytes, at most: every device a rank may bring (the
    /// team's, at most `MAX_DEVICES`; one for a unicast endpoint), each
    /// with `per_device` shares of `share_bytes`.
    pub bytes: u64,
}

/// The limits of a bind report on `ep`, the same on every rank (the size,
/// alignment and team size are what the ranks agreed); `share_bytes` is
/// one memory share's length on the wire (`windows`).
pub(crate) fn bind<S: State, K: Kind>(ep: &Endpoint<S, K>, share_bytes: u64) -> BindLimit {
    bind_for(
        ep.size(),
        ep.bind_alignment(),
        ep.facts().team_size,
        share_bytes,
    )
}

fn bind_for(size: u64, align: u64, team_size: u32, share_bytes: u64) -> BindLimit {
    let per_device = size
        .div_ceil(align.max(1))
        .clamp(1, MAX_BINDINGS_PER_DEVICE);
    let devices = u64::from(team_size).clamp(1, MAX_DEVICES as u64);
    let per = per_device
        .saturating_mul(share_bytes.saturating_add(SPAN_BYTES))
        .saturating_add(REPORT_PER_DEVICE);
    // The report, then the shares' count.
    let bytes = devices
        .saturating_mul(per)
        .saturating_add(REPORT_HEAD)
        .saturating_add(4);
    BindLimit { per_device, bytes }
}

/// This rank's refusal when one of `ep`'s devices has more bindings than
/// `limit` allows: `Cause::TooLarge` naming the count and the limit.
pub(crate) fn over_per_device<S: State, K: Kind>(
    ep: &Endpoint<S, K>,
    limit: BindLimit,
) -> Option<Cause> {
    let slot = ep.slot();
    ep.devices().iter().find_map(|&d| {
        let n = slot.spans(d).count() as u64;
        (n > limit.per_device).then_some(Cause::TooLarge {
            what: PER_DEVICE,
            len: n,
            limit: limit.per_device,
        })
    })
}

/// What a rank sends first at [`agree_large`].
#[derive(Serialize, Deserialize, Debug, PartialEq, Eq)]
pub(crate) enum Head<'a> {
    /// Its message is `total` bytes; `first` is its first piece.
    Start {
        total: u64,
        #[serde(borrow)]
        first: &'a [u8],
    },
    /// It refused to send its message: `len` of what `WHAT[what]` counts,
    /// past `limit`.
    TooLarge { what: u8, len: u64, limit: u64 },
}

/// [`agree`](super::agree::agree) for messages of up to `max` bytes each,
/// in as many exchanges as the longest needs. Returns every rank's message
/// when all succeeded; otherwise this rank's own failure, or else the
/// failure of the lowest failing rank. A message of this rank past `max`,
/// or a `Cause::TooLarge` of its own, is refused here: the others hear a
/// notice, and every rank fails with the same `Cause::TooLarge`.
pub(crate) fn agree_large(
    boot: &dyn Bootstrap,
    tag: u64,
    step: Step,
    mine: Result<Vec<u8>, (Step, Cause)>,
    max: u64,
    deadline: Deadline,
) -> Result<Vec<Vec<u8>>, TeamError> {
    let me = boot.rank();
    let notice = |at: Step, what: &'static str, len: u64, limit: u64| {
        let code = WHAT.iter().position(|w| *w == what).unwrap_or(0) as u8;
        let head = to_bytes(&Head::TooLarge {
            what: code,
            len,
            limit,
        });
        let own = TeamError::new(me, at, Cause::TooLarge { what, len, limit });
        (Ok(head), Vec::new(), Some(own))
    };
    // What this rank sends first, its message, and its own refusal.
    let (head, mine, refused) = match mine {
        Ok(m) if m.len() as u64 > max => notice(step, BYTES, m.len() as u64, max),
        Ok(m) => {
            let head = to_bytes(&Head::Start {
                total: m.len() as u64,
                first: m.get(..PIECE).unwrap_or(&m),
            });
            (Ok(head), m, None)
        }
        Err((at, Cause::TooLarge { what, len, limit })) => notice(at, what, len, limit),
        Err(e) => (Err(e), Vec::new(), None),
    };
    let heads = agree_all(boot, tag, step, head, deadline)?;
    // This rank's own failure is what it reports, in full.
    if let Some(e) = refused {
        return Err(e);
    }
    let mut got: Vec<Result<(Vec<u8>, usize), TeamError>> = Vec::with_capacity(heads.len());
    for (rank, h) in heads.into_iter().enumerate() {
        got.push(h.and_then(|bytes| read_head(rank, step, &bytes, max)));
    }
    if got.get(me).is_some_and(Result::is_err)
        && let Err(e) = got.swap_remove(me)
    {
        return Err(e);
    }
    let mut all = Vec::with_capacity(got.len());
    for g in got {
        all.push(g?);
    }
    let rounds = all
        .iter()
        .map(|(m, total)| total.saturating_sub(m.len()).div_ceil(PIECE))
        .max()
        .unwrap_or(0);
    for round in 1..=rounds {
        let from = round.saturating_mul(PIECE).min(mine.len());
        let to = from.saturating_add(PIECE).min(mine.len());
        let piece = mine.get(from..to).unwrap_or_default().to_vec();
        let pieces = agree_all(boot, tag, step, Ok(piece), deadline)?;
        for (rank, (p, (m, total))) in pieces.into_iter().zip(all.iter_mut()).enumerate() {
            let p = p?;
            let want = total.saturating_sub(m.len()).min(PIECE);
            if p.len() != want {
                return Err(TeamError::new(
                    rank,
                    step,
                    Cause::BadMessage {
                        reason: "a piece of a message of another length than its first said",
                    },
                ));
            }
            m.extend_from_slice(&p);
        }
    }
    Ok(all.into_iter().map(|(m, _)| m).collect())
}

/// Rank `rank`'s first message at [`agree_large`]: its first piece and its
/// length in all, checked against `max`; its notice as its `TooLarge`.
fn read_head(
    rank: usize,
    step: Step,
    bytes: &[u8],
    max: u64,
) -> Result<(Vec<u8>, usize), TeamError> {
    let bad = |reason| TeamError::new(rank, step, Cause::BadMessage { reason });
    match from_bytes::<Head<'_>>(bytes).map_err(|c| TeamError::new(rank, step, c))? {
        Head::TooLarge { what, len, limit } => {
            let what = WHAT
                .get(usize::from(what))
                .ok_or(bad("a refusal of an unknown kind"))?;
            Err(TeamError::new(
                rank,
                step,
                Cause::TooLarge { what, len, limit },
            ))
        }
        Head::Start { total, first } => {
            if total > max {
                return Err(bad("a message longer than its limit"));
            }
            let total =
                usize::try_from(total).map_err(|_| bad("a message longer than its limit"))?;
            if first.len() != total.min(PIECE) {
                return Err(bad("a first piece of another length than its message's"));
            }
            // Room for what the limit allows, never more than it claims.
            let mut m = Vec::new();
            m.try_reserve_exact(total)
                .map_err(|_| bad("a message longer than this rank can keep"))?;
            m.extend_from_slice(first);
            Ok((m, total))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bind_reports_limit_follows_the_endpoint_and_is_bounded() {
        let share = 101;
        // 512 MiB at 2 MiB: 256 bindings fit, the cap.
        let l = bind_for(512 << 20, 2 << 20, 16, share);
        assert_eq!(l.per_device, MAX_BINDINGS_PER_DEVICE);
        assert_eq!(l.bytes, 16 * (256 * (share + 16) + 8) + 8);
        // A small endpoint allows what fits it.
        assert_eq!(bind_for(8 << 20, 2 << 20, 1, share).per_device, 4);
        // Hostile facts stay bounded.
        let h = bind_for(u64::MAX, 0, u32::MAX, share);
        assert_eq!(h.per_device, MAX_BINDINGS_PER_DEVICE);
        assert_eq!(
            h.bytes,
            MAX_DEVICES as u64 * (256 * (share + 16) + 8) + 8,
            "the team's devices count at most MAX_DEVICES"
        );
    }

    #[test]
    fn heads_round_trip_and_garbage_is_a_bad_message() {
        let s = to_bytes(&Head::Start {
            total: 5,
            first: &[1, 2, 3, 4, 5],
        });
        assert_eq!(
            read_head(1, Step::Bind, &s, 5).ok(),
            Some((vec![1, 2, 3, 4, 5], 5))
        );
        // Past the limit, whatever it carries.
        assert!(matches!(
            read_head(1, Step::Bind, &s, 4),
            Err(TeamError {
                rank: 1,
                cause: Cause::BadMessage { .. },
                ..
            })
        ));
        // A first piece that is not the message's first PIECE bytes.
        let short = to_bytes(&Head::Start {
            total: 5,
            first: &[1],
        });
        assert!(read_head(0, Step::Bind, &short, 64).is_err());
        let huge = to_bytes(&Head::Start {
            total: u64::MAX,
            first: &[],
        });
        assert!(read_head(0, Step::Bind, &huge, u64::MAX).is_err());
        let t = to_bytes(&Head::TooLarge {
            what: 1,
            len: 257,
            limit: 256,
        });
        assert!(matches!(
            read_head(2, Step::Bind, &t, 64),
            Err(TeamError {
                rank: 2,
                step: Step::Bind,
                cause: Cause::TooLarge {
                    what: PER_DEVICE,
                    len: 257,
                    limit: 256
                },
            })
        ));
        let unknown = to_bytes(&Head::TooLarge {
            what: 9,
            len: 1,
            limit: 0,
        });
        assert!(matches!(
            read_head(2, Step::Bind, &unknown, 64),
            Err(TeamError {
                cause: Cause::BadMessage { .. },
                ..
            })
        ));
        for cut in 0..s.len() {
            assert!(
                read_head(0, Step::Bind, &s[..cut], 64).is_err(),
                "cut at {cut}"
            );
        }
    }

    /// Messages of several frames each, of different lengths per rank,
    /// arrive whole on every rank; one past the limit fails every rank
    /// with the same refusal naming its sender.
    #[test]
    fn messages_of_many_pieces_arrive_whole_and_one_past_its_limit_fails_every_rank_alike() {
        use crate::bootstrap::Threads;
        let lens = [3 * PIECE + 7, 0, PIECE, 1];
        let msg =
            |r: usize| -> Vec<u8> { (0..lens[r]).map(|i| (i % 251) as u8 ^ r as u8).collect() };
        let max = (3 * PIECE + 7) as u64;
        let t = std::time::Duration::from_secs(10);
        std::thread::scope(|s| {
            let ranks: Vec<_> = Threads::new(4)
                .into_iter()
                .map(|b| {
                    s.spawn(move || {
                        let r = b.rank();
                        let got =
                            agree_large(&b, 7, Step::Bind, Ok(msg(r)), max, Deadline::after(t));
                        let all = got.expect("every message");
                        for (p, m) in all.iter().enumerate() {
                            assert_eq!(*m, msg(p), "rank {r}: rank {p}'s message");
                        }
                        // Rank 2's message one byte past the limit.
                        let mut m = msg(r);
                        if r == 2 {
                            m = vec![0; max as usize + 1];
                        }
                        let e = agree_large(&b, 7, Step::Bind, Ok(m), max, Deadline::after(t))
                            .expect_err("refused");
                        assert_eq!((e.rank, e.step), (2, Step::Bind), "rank {r}: {e}");
                        assert!(
                            matches!(e.cause, Cause::TooLarge { what: BYTES, len, limit }
                                if len == max + 1 && limit == max),
                            "rank {r}: {e}"
                        );
                    })
                })
                .collect();
            for r in ranks {
                r.join().expect("rank");
            }
        });
    }
}
