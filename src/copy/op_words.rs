//! A put's op written as words ([`write_put`]): the fast path's write of
//! a put into the batch's op list, five 8-byte words and one zeroed pair
//! where the op's fields are seven stores.
//!
//! What this file owns: where each word of a [`CopyOp`] lies (from the
//! driver crate's fixed layout: `#[repr(C)]` `CopyOp` and `Pointer`,
//! `#[repr(u32)]` `Operand` and `MemHint`, with their discriminants), the
//! compile-time checks of it, and the word that names an endpoint
//! ([`endpoint_word`]). The gain, on `benches/copy_batch.rs` (1,024 typed
//! puts, `Null`): 22,741 -> 21,725 instructions (the endpoint operand's
//! tag and id one store of a word made once per run of puts, the source
//! operand's tag and hint one zeroed pair).

use std::mem::{offset_of, size_of};

use crate::driver::{CopyOp, MemHint, Pointer};

/// An `Operand::Pointer` as the Rust reference lays out a variant of a
/// `#[repr(u32)]` enum: a `#[repr(C)]` struct led by the tag.
#[repr(C)]
struct PointerOperand {
    tag: u32,
    pointer: Pointer,
}

/// An `Operand::LogicalEndpoint`, laid out likewise.
#[repr(C)]
struct EndpointOperand {
    tag: u32,
    id: u32,
    offset: u64,
}

/// `Operand::Pointer`'s and `Operand::LogicalEndpoint`'s discriminants
/// (the driver crate's `copy_types.rs`), and `MemHint::None`'s.
const POINTER: u32 = 0;
const LOGICAL_ENDPOINT: u32 = 1;
const HINT_NONE: u32 = 0;

/// The byte offsets of the words a put writes.
const SRC_TAG: usize = offset_of!(CopyOp, src);
const SRC_PTR: usize = SRC_TAG + offset_of!(PointerOperand, pointer) + offset_of!(Pointer, ptr);
const SRC_HINT: usize = SRC_TAG + offset_of!(PointerOperand, pointer) + offset_of!(Pointer, hint);
const DST_TAG: usize = offset_of!(CopyOp, dst);
const DST_OFFSET: usize = DST_TAG + offset_of!(EndpointOperand, offset);
const SIZE: usize = offset_of!(CopyOp, size);

// The words and what each covers: the source's tag word is its tag and the
// padding before its pointer; the hint word is `MemHint::None`'s tag and
// the payload bytes it leaves unused; the endpoint word is the
// destination's tag and id. Every word aligned (a `CopyOp` is 8-aligned).
const _: () = {
    assert!(size_of::<CopyOp>() == 56 && std::mem::align_of::<CopyOp>() == 8);
    assert!(offset_of!(PointerOperand, pointer) == 8);
    assert!(size_of::<MemHint>() == 8);
    assert!(offset_of!(EndpointOperand, id) == 4);
    assert!(size_of::<PointerOperand>() == 24 && size_of::<EndpointOperand>() == 16);
    assert!(SRC_TAG == 0 && SRC_PTR == 8 && SRC_HINT == 16);
    assert!(DST_TAG == 24 && DST_OFFSET == 32 && SIZE == 48);
};

/// A word of the `u32` tag `tag` followed by the `u32` `rest`, as they lie
/// in memory.
#[inline(always)]
const fn tag_word(tag: u32, rest: u32) -> u64 {
    let (t, r) = (tag.to_ne_bytes(), rest.to_ne_bytes());
    u64::from_ne_bytes([t[0], t[1], t[2], t[3], r[0], r[1], r[2], r[3]])
}

/// The first word of a destination operand naming the endpoint `id`: its
/// tag and the id.
#[inline(always)]
pub(super) fn endpoint_word(id: u32) -> u64 {
    tag_word(LOGICAL_ENDPOINT, id)
}

/// Writes at `at` the op of a put of `size` bytes from the device address
/// `from` into the endpoint `endpoint` names ([`endpoint_word`]) at
/// `offset`: the op `copy::put_op` makes, as words (the unused bytes of
/// the destination operand left as they are: padding).
///
/// # Safety
/// `at` is valid for writing one `CopyOp` and aligned for it.
#[inline(always)]
pub(super) unsafe fn write_put(at: *mut CopyOp, from: u64, endpoint: u64, offset: u64, size: u64) {
    // The padding after the source's tag and `MemHint::None`'s unused
    // payload written as zeros.
    const TAG: u64 = tag_word(POINTER, 0);
    const HINT: u64 = tag_word(HINT_NONE, 0);
    let p = at.cast::<u8>();
    // SAFETY: every offset is of an aligned word inside the op (checked at
    // compile time above), which the caller's `at` may write; the words
    // make the op `Operand::Pointer(Pointer::device(from))` to
    // `Operand::LogicalEndpoint { id, offset }` of `size` bytes, every
    // byte of a field written with its value, a tag with its variant's
    // discriminant (`tests::a_puts_words_are_its_op`, also under Miri).
    unsafe {
        p.add(SRC_TAG).cast::<u64>().write(TAG);
        p.add(SRC_PTR).cast::<u64>().write(from);
        p.add(SRC_HINT).cast::<u64>().write(HINT);
        p.add(DST_TAG).cast::<u64>().write(endpoint);
        p.add(DST_OFFSET).cast::<u64>().write(offset);
        p.add(SIZE).cast::<u64>().write(size);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::Operand;

    #[test]
    fn a_puts_words_are_its_op() {
        for (from, id, offset, size) in [
            (0, 0, 0, 0),
            (0x7f00_0000_1000, 7, 64, 64),
            (u64::MAX, u32::MAX, u64::MAX, u64::MAX),
            (1, 0x0102_0304, 0x0a0b_0c0d_0e0f_1011, 3),
        ] {
            let mut slot = std::mem::MaybeUninit::<CopyOp>::uninit();
            // SAFETY: a slot of one op, aligned.
            unsafe { write_put(slot.as_mut_ptr(), from, endpoint_word(id), offset, size) };
            // SAFETY: every field written (`write_put`); under Miri a
            // wrong tag or an unwritten field is reported here.
            let op = unsafe { slot.assume_init() };
            assert_eq!(
                op,
                CopyOp {
                    src: Operand::Pointer(Pointer::device(from)),
                    dst: Operand::LogicalEndpoint { id, offset },
                    size,
                }
            );
        }
    }
}
