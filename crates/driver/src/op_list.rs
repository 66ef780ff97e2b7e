//! The op lists of the two batch calls: [`CopyOps`] (`cuFabricCpyBatchAsync`)
//! and [`MemcpyOps`] (`cuMemcpyBatchAsync`), and their owning iterator
//! [`OpsIntoIter`].
//!
//! A batch crosses the boundary by value: the list is owned (a wire
//! protocol can carry it, a recorder keep it), and up to [`CopyOps::INLINE`]
//! ops live inside it, so a batch of a few copies allocates nothing on its
//! way to the driver. Longer lists go to the heap, as a `Vec` would. The
//! storage behind them is private: only the methods here are the API.
//!
//! With the `serde` feature a list is a plain sequence, the wire form of a
//! `Vec` of the same ops.

use std::fmt;
use std::ops::{Deref, DerefMut};

use smallvec::SmallVec;

use super::{CopyOp, MemcpyOp};

/// How many ops a list holds without allocating.
const INLINE: usize = 4;

/// The owning iterator of a [`CopyOps`] or [`MemcpyOps`] (`into_iter`).
pub struct OpsIntoIter<T>(smallvec::IntoIter<[T; INLINE]>);

impl<T> Iterator for OpsIntoIter<T> {
    type Item = T;

    #[inline]
    fn next(&mut self) -> Option<T> {
        self.0.next()
    }

    #[inline]
    fn size_hint(&self) -> (usize, Option<usize>) {
        self.0.size_hint()
    }
}

impl<T> DoubleEndedIterator for OpsIntoIter<T> {
    #[inline]
    fn next_back(&mut self) -> Option<T> {
        self.0.next_back()
    }
}

impl<T> ExactSizeIterator for OpsIntoIter<T> {}

impl<T> std::iter::FusedIterator for OpsIntoIter<T> {}

impl<T: Clone> Clone for OpsIntoIter<T> {
    fn clone(&self) -> Self {
        OpsIntoIter(self.0.clone())
    }
}

impl<T: fmt::Debug> fmt::Debug for OpsIntoIter<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("OpsIntoIter")
            .field(&self.0.as_slice())
            .finish()
    }
}

/// One newtype over `SmallVec<[$op; INLINE]>` and its whole API (the two
/// lists are the same but for the op type and the docs).
macro_rules! op_list {
    ($(#[$meta:meta])* $name:ident of $op:ident) => {
        $(#[$meta])*
        #[derive(Clone, Default, PartialEq, Eq, Hash)]
        pub struct $name(SmallVec<[$op; INLINE]>);

        impl $name {
            /// How many ops the list holds without allocating.
            pub const INLINE: usize = INLINE;

            /// An empty list (no allocation).
            #[inline]
            pub fn new() -> Self {
                $name(SmallVec::new())
            }

            /// An empty list with room for `n` ops (allocates only past
            /// [`Self::INLINE`]).
            #[inline]
            pub fn with_capacity(n: usize) -> Self {
                $name(SmallVec::with_capacity(n))
            }

            /// Appends `op` (allocates only when the list is full).
            #[inline]
            pub fn push(&mut self, op: $op) {
                self.0.push(op)
            }

            /// Room for at least `n` more ops.
            #[inline]
            pub fn reserve(&mut self, n: usize) {
                self.0.reserve(n)
            }

            /// The number of ops.
            #[inline]
            pub fn len(&self) -> usize {
                self.0.len()
            }

            /// Whether there is none.
            #[inline]
            pub fn is_empty(&self) -> bool {
                self.0.is_empty()
            }

            /// How many ops the list holds without growing (at least
            /// [`Self::INLINE`]).
            #[inline]
            pub fn capacity(&self) -> usize {
                self.0.capacity()
            }

            /// Removes every op, keeping the capacity.
            #[inline]
            pub fn clear(&mut self) {
                self.0.clear()
            }

            /// The first op's address. Unlike a `Vec`'s, an inline list's
            /// ops live inside the list: the pointer is valid until the
            /// list is moved, grown or dropped.
            #[inline]
            pub fn as_ptr(&self) -> *const $op {
                self.0.as_ptr()
            }

            /// The first op's address, for writing up to
            /// [`Self::capacity`] ops before [`Self::set_len`]. Valid until
            /// the list is moved, grown or dropped (see [`Self::as_ptr`]).
            #[inline]
            pub fn as_mut_ptr(&mut self) -> *mut $op {
                self.0.as_mut_ptr()
            }

            /// Sets the length without touching the ops, as
            /// [`Vec::set_len`].
            ///
            /// # Safety
            /// `new_len` is at most [`Self::capacity`], and the ops at
            /// `old_len..new_len` are initialised (written through
            /// [`Self::as_mut_ptr`] since the list last moved or grew).
            #[inline]
            pub unsafe fn set_len(&mut self, new_len: usize) {
                // SAFETY: the caller's contract, which is `SmallVec::set_len`'s.
                unsafe { self.0.set_len(new_len) }
            }

            /// The ops as a `Vec` (no copy when they are on the heap).
            #[inline]
            pub fn into_vec(self) -> Vec<$op> {
                self.0.into_vec()
            }
        }

        impl Deref for $name {
            type Target = [$op];

            #[inline]
            fn deref(&self) -> &[$op] {
                &self.0
            }
        }

        impl DerefMut for $name {
            #[inline]
            fn deref_mut(&mut self) -> &mut [$op] {
                &mut self.0
            }
        }

        /// A `Vec` of room for at most [`Self::INLINE`] ops is copied inline
        /// (its buffer freed); any other keeps the `Vec`'s buffer, however
        /// few ops it holds (`SmallVec::from_vec` goes by the capacity).
        impl From<Vec<$op>> for $name {
            #[inline]
            fn from(v: Vec<$op>) -> Self {
                $name(SmallVec::from_vec(v))
            }
        }

        impl<const N: usize> From<[$op; N]> for $name {
            #[inline]
            fn from(ops: [$op; N]) -> Self {
                ops.into_iter().collect()
            }
        }

        /// Ops known to spill (the iterator's lower bound past
        /// [`Self::INLINE`]) are collected as a `Vec` is, whose buffer the list
        /// keeps; fewer are pushed in place. (`SmallVec`'s own `collect`
        /// is slower: the raw side of `benches/copy_batch.rs`, collect and
        /// call, takes 162 instructions for 1 op and 18,985 for 1,024 with
        /// it, 116 and 11,145 with this, 241 and 11,664 with a `Vec`.)
        impl FromIterator<$op> for $name {
            #[inline]
            fn from_iter<I: IntoIterator<Item = $op>>(iter: I) -> Self {
                let iter = iter.into_iter();
                if iter.size_hint().0 > INLINE {
                    return $name(SmallVec::from_vec(iter.collect()));
                }
                let mut list = $name::new();
                for op in iter {
                    list.0.push(op);
                }
                list
            }
        }

        impl Extend<$op> for $name {
            #[inline]
            fn extend<I: IntoIterator<Item = $op>>(&mut self, iter: I) {
                let iter = iter.into_iter();
                self.0.reserve(iter.size_hint().0);
                for op in iter {
                    self.0.push(op);
                }
            }
        }

        impl IntoIterator for $name {
            type Item = $op;
            type IntoIter = OpsIntoIter<$op>;

            #[inline]
            fn into_iter(self) -> OpsIntoIter<$op> {
                OpsIntoIter(self.0.into_iter())
            }
        }

        impl<'a> IntoIterator for &'a $name {
            type Item = &'a $op;
            type IntoIter = std::slice::Iter<'a, $op>;

            #[inline]
            fn into_iter(self) -> std::slice::Iter<'a, $op> {
                self.0.iter()
            }
        }

        impl<'a> IntoIterator for &'a mut $name {
            type Item = &'a mut $op;
            type IntoIter = std::slice::IterMut<'a, $op>;

            #[inline]
            fn into_iter(self) -> std::slice::IterMut<'a, $op> {
                self.0.iter_mut()
            }
        }

        /// As a list of ops, as a `Vec`'s.
        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_list().entries(self.0.iter()).finish()
            }
        }

        /// A sequence, as a `Vec`'s.
        #[cfg(feature = "serde")]
        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_seq(self.0.iter())
            }
        }

        /// A sequence, as a `Vec`'s. The length a peer announces reserves
        /// at most 4,096 ops (`MAX_PRESIZE`): the list grows with the ops that
        /// really arrive.
        #[cfg(feature = "serde")]
        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct Seq;
                impl<'de> serde::de::Visitor<'de> for Seq {
                    type Value = $name;
                    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                        f.write_str("a sequence of ops")
                    }
                    fn visit_seq<A: serde::de::SeqAccess<'de>>(
                        self,
                        mut seq: A,
                    ) -> Result<$name, A::Error> {
                        let hint = seq.size_hint().unwrap_or(0).min(MAX_PRESIZE);
                        let mut list = $name::with_capacity(hint);
                        while let Some(op) = seq.next_element()? {
                            list.push(op);
                        }
                        Ok(list)
                    }
                }
                d.deserialize_seq(Seq)
            }
        }
    };
}

/// The most ops a deserialised list reserves from the length its input
/// announces (input a peer wrote: a length claim costs no more than this).
#[cfg(feature = "serde")]
const MAX_PRESIZE: usize = 4096;

op_list! {
    /// The ops of one `cuFabricCpyBatchAsync`
    /// ([`Driver::fabric_copy_batch`](crate::Driver::fabric_copy_batch)):
    /// owned (a wire protocol can carry it), up to [`CopyOps::INLINE`] (4)
    /// ops inline, so a batch of a few copies allocates nothing. Built as a
    /// `Vec` is: `push`, `collect`, `extend`, `From<Vec<CopyOp>>`, or from an
    /// array; read as a slice.
    ///
    /// ```
    /// use cuda_endpoints::driver::{CopyOp, CopyOps, Operand, Pointer};
    ///
    /// let put = |offset| CopyOp {
    ///     src: Operand::Pointer(Pointer::device(0x1000 + offset)),
    ///     dst: Operand::LogicalEndpoint { id: 7, offset },
    ///     size: 64,
    /// };
    /// let ops: CopyOps = (0..3).map(|i| put(i * 64)).collect();
    /// assert_eq!(ops.len(), 3);
    /// assert_eq!(ops[2].size, 64);
    /// assert_eq!(ops.capacity(), CopyOps::INLINE); // no allocation
    /// ```
    CopyOps of CopyOp
}

op_list! {
    /// The copies of one `cuMemcpyBatchAsync`
    /// ([`Driver::memcpy_batch_async`](crate::Driver::memcpy_batch_async)):
    /// owned (a wire protocol can carry it), up to [`MemcpyOps::INLINE`] (4)
    /// copies inline, so a batch of a few copies allocates nothing. Built
    /// and read as [`CopyOps`].
    MemcpyOps of MemcpyOp
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Operand, Pointer};

    fn op(i: u64) -> CopyOp {
        CopyOp {
            src: Operand::Pointer(Pointer::device(0x1000 + i)),
            dst: Operand::LogicalEndpoint { id: 3, offset: i },
            size: i,
        }
    }

    #[test]
    fn a_few_ops_stay_inline_and_more_spill_as_a_vec_would() {
        let mut ops = CopyOps::new();
        assert!(ops.is_empty());
        let at = ops.as_ptr();
        ops.extend((0..4).map(op));
        assert_eq!((ops.len(), ops.capacity()), (4, CopyOps::INLINE));
        assert_eq!(ops.as_ptr(), at, "still inline");
        ops.push(op(4));
        assert!(ops.capacity() > CopyOps::INLINE);
        assert_eq!(
            ops.iter().map(|o| o.size).collect::<Vec<_>>(),
            [0, 1, 2, 3, 4]
        );
        assert_eq!(ops.clone().into_vec(), (0..5).map(op).collect::<Vec<_>>());
        assert_eq!(ops.clone().into_iter().next_back(), Some(op(4)));
        ops.clear();
        assert!(ops.is_empty());
    }

    #[test]
    fn from_a_vec_an_array_or_raw_writes_is_the_same_list() {
        let v: Vec<CopyOp> = (0..2).map(op).collect();
        let a = CopyOps::from(v.clone());
        let b = CopyOps::from([op(0), op(1)]);
        let mut c = CopyOps::with_capacity(2);
        // SAFETY: two ops written within the capacity, then the length set.
        unsafe {
            c.as_mut_ptr().write(op(0));
            c.as_mut_ptr().add(1).write(op(1));
            c.set_len(2);
        }
        assert_eq!(a, b);
        assert_eq!(a, c);
        assert_eq!(&a[..], &v[..]);
        assert_eq!(format!("{a:?}"), format!("{v:?}"), "Debug is a list");
        for o in &mut c {
            o.size += 1;
        }
        assert_eq!((&c).into_iter().map(|o| o.size).sum::<u64>(), 3);
    }

    #[test]
    fn a_vec_is_copied_inline_by_its_room_not_its_length() {
        let mut v = Vec::with_capacity(16);
        v.push(op(0));
        let at = v.as_ptr();
        let ops = CopyOps::from(v);
        assert_eq!(ops.as_ptr(), at, "a Vec with room for 16 keeps its buffer");
        assert_eq!(ops.capacity(), 16);
        let ops = CopyOps::from(vec![op(0)]);
        assert_eq!(ops.capacity(), CopyOps::INLINE, "room for 1: inline");
    }

    #[cfg(feature = "serde")]
    #[test]
    fn the_wire_form_is_a_vecs() {
        let v: Vec<CopyOp> = (0..6).map(op).collect();
        let ops = CopyOps::from(v.clone());
        let json = serde_json::to_string(&ops).unwrap();
        assert_eq!(json, serde_json::to_string(&v).unwrap());
        assert_eq!(serde_json::from_str::<CopyOps>(&json).unwrap(), ops);
        let m = MemcpyOps::from(vec![MemcpyOp {
            dst: Pointer::host(8),
            src: Pointer::device(16),
            size: 4,
        }]);
        let json = serde_json::to_string(&m).unwrap();
        assert_eq!(json, serde_json::to_string(&m.clone().into_vec()).unwrap());
        assert_eq!(serde_json::from_str::<MemcpyOps>(&json).unwrap(), m);
    }
}
