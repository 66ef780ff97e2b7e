//! Tests of `view.rs`: the hot run of a batch's pieces and its growth
//! (a child of `view`, in its own file: `view.rs` stays under the floors'
//! 900 lines).

use super::{Order, hot_run};
use crate::copy::MemoryNamed;
use crate::driver::{CopyOp, Device, MemcpyOp, MemcpyOps, Operand, Pointer};
use crate::memory::Locality;

const ID: u32 = 7;

/// A put of 64 bytes from `local` to endpoint offset `offset`.
fn put(local: u64, offset: u64) -> CopyOp {
    CopyOp {
        src: Operand::Pointer(Pointer::device(local)),
        dst: Operand::LogicalEndpoint { id: ID, offset },
        size: 64,
    }
}

/// Allocations here at `(address, size)`.
fn spans(of: &[(u64, u64)]) -> Vec<MemoryNamed> {
    of.iter()
        .map(|&s| (0, Locality::Device(Device(0)), 0, s))
        .collect()
}

/// The pieces of `ops` through the window `(offset, end, addr)`, after
/// `before`.
fn run(
    ops: &[CopyOp],
    win: (u64, u64, u64),
    mem: &[(u64, u64)],
    before: &[MemcpyOp],
) -> Vec<(u64, u64, u64)> {
    let mut copies: MemcpyOps = before.iter().copied().collect();
    let mut order = Order::NEW;
    let n = hot_run(ops, (ID, win), &spans(mem), &mut copies, &mut order);
    assert_eq!(n, Ok(ops.len()));
    copies
        .iter()
        .map(|c| (c.src.ptr, c.dst.ptr, c.size))
        .collect()
}

/// Issue 30, item 5: a piece grows only where one copy moves the same
/// bytes: end to end on both sides, inside one allocation here and one
/// window there, and off its own bytes, whatever the addresses around.
#[test]
fn a_piece_grows_only_inside_one_allocation_and_one_window_and_off_its_own_bytes() {
    let puts: Vec<CopyOp> = (0..8).map(|k| put(0x1000 + 64 * k, 64 * k)).collect();
    let win = (0, 4096, 0x9000);
    // End to end in one allocation and one window: one copy.
    assert_eq!(
        run(&puts, win, &[(0x1000, 4096)], &[]),
        [(0x1000, 0x9000, 512)]
    );
    // Two allocations side by side here: one copy in each.
    assert_eq!(
        run(&puts, win, &[(0x1000, 256), (0x1100, 256)], &[]),
        [(0x1000, 0x9000, 256), (0x1100, 0x9100, 256)]
    );
    // A memory not of the batch: nothing grows.
    assert_eq!(run(&puts, win, &[], &[]).len(), 8);
    // The piece before the run, end to end with it on both sides but
    // in the memory before the window: not grown.
    let before = MemcpyOp {
        dst: Pointer::device(0x9000 - 64),
        src: Pointer::device(0x1000 - 64),
        size: 64,
    };
    assert_eq!(
        run(&puts, win, &[(0x0f00, 4096)], &[before]),
        [(0x0fc0, 0x8fc0, 64), (0x1000, 0x9000, 512)]
    );
    // Grown, the copy would read bytes it writes: each op is its own.
    let shifted: Vec<CopyOp> = (0..4).map(|k| put(0x9000 + 64 * k, 64 + 64 * k)).collect();
    assert_eq!(run(&shifted, win, &[(0x9000, 4096)], &[]).len(), 4);
    // Host memory of the process: `cuMemcpyAsync` stages it; never grown.
    let host: Vec<CopyOp> = (0..4)
        .map(|k| CopyOp {
            src: Operand::Pointer(Pointer::host(0x1000 + 64 * k)),
            ..put(0, 64 * k)
        })
        .collect();
    assert_eq!(run(&host, win, &[(0x1000, 4096)], &[]).len(), 4);
}

/// What the batch call's choice reads (`batchable_in`) of a grown piece
/// is what it read of the pieces it grew by, one by one.
#[test]
fn a_grown_piece_leaves_the_order_its_pieces_would() {
    let win = (0, 4096, 0x9000);
    let mut grown = Order::NEW;
    let mut copies = MemcpyOps::new();
    let puts: Vec<CopyOp> = (0..8).map(|k| put(0x1000 + 64 * k, 64 * k)).collect();
    let mut each = Order::NEW;
    for k in 0..8 {
        each.add(&MemcpyOp {
            dst: Pointer::device(0x9000 + 64 * k),
            src: Pointer::device(0x1000 + 64 * k),
            size: 64,
        });
    }
    let spans = spans(&[(0x1000, 4096)]);
    assert_eq!(
        hot_run(&puts, (ID, win), &spans, &mut copies, &mut grown),
        Ok(8)
    );
    assert_eq!(copies.len(), 1);
    assert_eq!(grown, each);
}
