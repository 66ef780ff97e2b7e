//! [`Failed`]: a failed consuming transition, the error and the value it
//! was called on.

use std::fmt;

use super::Error;

/// A failed consuming transition: the error, and the value it was called on,
/// unchanged, so nothing leaks and the caller can retry or drop it.
///
/// One pointer ([`Failure`] boxed), so that a transition's
/// `Result<Endpoint<_>, Failed<_>>` is 16 bytes and comes back in two
/// registers: the error is allocated on the error path only. Its fields read
/// as before (`f.error`, `f.value`, moved out with `f.value` or
/// [`Failure::into_parts`]).
///
/// Transparent: `Display` is the [`Error`]'s message and
/// [`std::error::Error::source`] is the error's own source, so `{e}`, a
/// report that walks the chain, and `?` into `Box<dyn Error>` all show the
/// cause's wording once. `Debug` is the error's `Debug` and the type of the
/// value that came back. `?` into [`Error`] keeps only the error (and drops
/// the value).
pub type Failed<T> = Box<Failure<T>>;

/// What a [`Failed`] points to: the error and the value handed back.
pub struct Failure<T> {
    /// What went wrong.
    pub error: Error,
    /// The value handed back, in the state it had before the call.
    pub value: T,
}

impl<T> Failure<T> {
    /// The error and the value, boxed: a [`Failed`].
    #[cold]
    #[inline(never)]
    pub fn new(error: Error, value: T) -> Failed<T> {
        Box::new(Failure { error, value })
    }

    /// Splits into the error and the value.
    pub fn into_parts(self) -> (Error, T) {
        (self.error, self.value)
    }
}

/// `T`'s name without module paths: `Endpoint<Reserved, NoKind>`, not
/// `cuda_endpoints::endpoint::Endpoint<cuda_endpoints::state::Reserved, ..>`.
pub(super) fn short_type_name<T>() -> String {
    let full = std::any::type_name::<T>();
    let mut out = String::with_capacity(full.len());
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String| {
        out.push_str(word.rsplit("::").next().unwrap_or(word));
        word.clear();
    };
    for c in full.chars() {
        if c.is_alphanumeric() || c == '_' || c == ':' {
            word.push(c);
        } else {
            flush(&mut word, &mut out);
            out.push(c);
        }
    }
    flush(&mut word, &mut out);
    out
}

/// Shows a type name without quotes in a `Debug` struct.
struct TypeName(String);

impl fmt::Debug for TypeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

// Hand-written: no `T: Debug` bound, so `?` works for any endpoint type; the
// value is named by its type.
impl<T> fmt::Debug for Failure<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Failed")
            .field("error", &self.error)
            .field("value", &TypeName(short_type_name::<T>()))
            .finish()
    }
}

impl<T> fmt::Display for Failure<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.error, f)
    }
}

impl<T> std::error::Error for Failure<T> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std::error::Error::source(&self.error)
    }
}

impl<T> From<Failed<T>> for Error {
    fn from(f: Failed<T>) -> Error {
        f.error
    }
}
