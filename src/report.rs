//! [`Report`]: what a program's `main` returns so that a failure prints as
//! guidance — the error's message and its causes — rather than as `Debug`.
//!
//! What this file owns: [`Report`] only. Rust prints the error a `main`
//! returns with `{:?}`; the crate's errors say what went wrong, the rule and
//! the fix in their `Display` form, which `Debug` (a derived struct dump)
//! hides. `Report` is `Display` plus every `source()` in its `Debug`, as
//! `anyhow::Error` and `eyre::Report` print (a program that uses either of
//! those already gets the same and needs nothing from here), less the
//! causes whose words end the message they caused: the crate's errors say
//! their cause at the end of their own message and still give it as
//! `source()`, for code that walks the chain.

use std::error::Error as StdError;
use std::fmt;

/// Any error, printed by `Debug` as its message followed by its causes (the
/// [`source`](std::error::Error::source) chain), so that
/// `fn main() -> Result<(), Report>` shows what a user should read:
///
/// ```
/// use cuda_endpoints::{Context, Report, Spec};
///
/// fn main() -> Result<(), Report> {
///     let ctx = Context::model(Default::default()).0;
///     let ep = ctx.reserve_one()?.create(Spec::unicast(0, 2 << 20))?; // `?` on any error
///     # drop(ep);
///     Ok(())
/// }
/// ```
///
/// A failure then prints, e.g.:
///
/// ```text
/// Error: team call failed on rank 0 at step `probe`: unsupported: logical endpoints ...
/// ```
///
/// A cause whose words end the message of the error it caused is not
/// printed again: the crate's errors end with their causes' words, as this
/// one with its [`Error::Unsupported`](crate::Error::Unsupported)'s. Any
/// other cause follows, one a line:
///
/// ```text
/// Error: the run failed
///
/// Caused by:
///     rank 1: fd passing #0: I/O error with rank 0: Connection refused (os error 111)
/// ```
///
/// `Report` does not implement [`std::error::Error`] itself (that is what
/// lets `?` convert every error into it, as with `anyhow::Error`). Unlike
/// `anyhow::Error` it is not `Send`: it takes any error, as
/// `Box<dyn Error>` does, `Send` or not. So a thread (a rank of a threads
/// job, `std::thread::scope`) returns the crate's own
/// [`Error`](crate::Error), which is `Send + Sync`, or a
/// `Box<dyn Error + Send + Sync>`, and its joiner makes the `Report`.
pub struct Report(Box<dyn StdError + 'static>);

/// An error already boxed, `Send`, `Send + Sync` or neither: what
/// [`Report::from_boxed`] takes (sealed: these three only).
pub trait BoxedError: sealed::Sealed {
    /// The box, as `Box<dyn Error>`.
    fn into_dyn(self) -> Box<dyn StdError + 'static>;
}

mod sealed {
    pub trait Sealed {}
}

macro_rules! boxed_error {
    ($($t:ty),*) => {$(
        impl sealed::Sealed for Box<$t> {}
        impl BoxedError for Box<$t> {
            fn into_dyn(self) -> Box<dyn StdError + 'static> {
                self
            }
        }
    )*};
}
boxed_error!(
    dyn StdError + 'static,
    dyn StdError + Send + 'static,
    dyn StdError + Send + Sync + 'static
);

impl Report {
    /// A report of an error already boxed: `run().map_err(Report::from_boxed)`,
    /// whether `run` returns `Box<dyn Error>` or `Box<dyn Error + Send +
    /// Sync>` (a thread's, a rank's), which `?` cannot convert (a `Box<dyn
    /// Error>` is not itself an `Error`):
    ///
    /// ```
    /// fn rank() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    ///     Ok(())
    /// }
    /// fn main() -> Result<(), cuda_endpoints::Report> {
    ///     std::thread::spawn(rank)
    ///         .join()
    ///         .expect("rank panicked")
    ///         .map_err(cuda_endpoints::Report::from_boxed)
    /// }
    /// ```
    pub fn from_boxed(error: impl BoxedError) -> Report {
        Report(error.into_dyn())
    }

    /// A report of a message alone (no cause), e.g. a check a program
    /// makes of its own results.
    pub fn msg(message: impl fmt::Display) -> Report {
        Report(message.to_string().into())
    }

    /// The error reported.
    pub fn error(&self) -> &(dyn StdError + 'static) {
        &*self.0
    }

    /// The error reported, boxed.
    pub fn into_inner(self) -> Box<dyn StdError + 'static> {
        self.0
    }
}

impl<E: StdError + 'static> From<E> for Report {
    fn from(error: E) -> Report {
        Report(Box::new(error))
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl fmt::Debug for Report {
    /// The message, then `Caused by:` and each source, one a line
    /// (numbered when there are several), but for a source whose words end
    /// the words of the error it is the source of (that error said them).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut above = self.0.to_string();
        f.write_str(&above)?;
        let mut causes: Vec<String> = Vec::new();
        let mut next = self.0.source();
        // Bounded: a chain that loops back on itself still ends.
        for cause in std::iter::from_fn(|| {
            let c = next?;
            next = c.source();
            Some(c)
        })
        .take(64)
        {
            let words = cause.to_string();
            if !above.ends_with(&words) {
                causes.push(words.clone());
            }
            above = words;
        }
        if causes.is_empty() {
            return Ok(());
        }
        write!(f, "\n\nCaused by:")?;
        for (i, cause) in causes.iter().enumerate() {
            if causes.len() == 1 {
                write!(f, "\n    {cause}")?;
            } else {
                write!(f, "\n    {i}: {cause}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Outer(Inner);
    #[derive(Debug)]
    struct Inner;

    impl fmt::Display for Outer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("the team failed")
        }
    }
    impl fmt::Display for Inner {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("install a CUDA 13.3+ driver")
        }
    }
    impl StdError for Outer {
        fn source(&self) -> Option<&(dyn StdError + 'static)> {
            Some(&self.0)
        }
    }
    impl StdError for Inner {}

    #[test]
    fn debug_prints_the_message_and_its_causes_not_the_struct() {
        let r = Report::from(Outer(Inner));
        assert_eq!(
            format!("{r:?}"),
            "the team failed\n\nCaused by:\n    install a CUDA 13.3+ driver"
        );
        assert_eq!(r.to_string(), "the team failed");
        let r = Report::from(Inner);
        assert_eq!(format!("{r:?}"), "install a CUDA 13.3+ driver");
    }

    /// An error that says its cause in its own message and gives it as
    /// `source()` too (the crate's `TeamError`, `BootstrapError::Io`).
    #[derive(Debug)]
    struct Says(Inner);

    impl fmt::Display for Says {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "team call failed on rank 0 at step `probe`: {}", self.0)
        }
    }
    impl StdError for Says {
        fn source(&self) -> Option<&(dyn StdError + 'static)> {
            Some(&self.0)
        }
    }

    /// A message that holds its cause's words elsewhere than at its end
    /// (by chance: a short, common cause) still prints the cause.
    #[derive(Debug)]
    struct Mentions(Inner);

    impl fmt::Display for Mentions {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "{} was the hint; the fetch failed", self.0)
        }
    }
    impl StdError for Mentions {
        fn source(&self) -> Option<&(dyn StdError + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn debug_prints_a_cause_the_message_only_mentions() {
        let r = Report::from(Mentions(Inner));
        assert!(format!("{r:?}").ends_with("Caused by:\n    install a CUDA 13.3+ driver"));
    }

    #[test]
    fn debug_prints_a_cause_the_message_already_holds_once() {
        let r = Report::from(Says(Inner));
        assert_eq!(
            format!("{r:?}"),
            "team call failed on rank 0 at step `probe`: install a CUDA 13.3+ driver"
        );
        assert!(r.error().source().is_some(), "the chain is kept");
    }
}
