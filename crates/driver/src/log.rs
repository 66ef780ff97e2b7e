//! [`BoundedLog`]: the newest entries of a log, at most a capacity, and a
//! count of the older ones it let go. One definition for every log of the
//! workspace that must not grow without bound (a [`Traced`](crate::Traced)
//! driver's calls, a context's teardown errors).

use std::collections::VecDeque;

/// The newest entries, at most a capacity, oldest first, and how many older
/// ones were let go to keep them.
#[derive(Clone, Debug)]
pub struct BoundedLog<T> {
    entries: VecDeque<T>,
    cap: usize,
    dropped: u64,
}

impl<T> BoundedLog<T> {
    /// An empty log keeping the newest `cap` entries (at least 1).
    pub fn new(cap: usize) -> BoundedLog<T> {
        BoundedLog {
            entries: VecDeque::new(),
            cap: cap.max(1),
            dropped: 0,
        }
    }

    /// Appends `entry`, letting the oldest go (and counting it) when full.
    pub fn push(&mut self, entry: T) {
        if self.entries.len() >= self.cap {
            self.entries.pop_front();
            self.dropped = self.dropped.saturating_add(1);
        }
        self.entries.push_back(entry);
    }

    /// The entries kept, oldest first.
    pub fn entries(&self) -> impl DoubleEndedIterator<Item = &T> + ExactSizeIterator {
        self.entries.iter()
    }

    /// How many entries are kept.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no entry is kept.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// How many entries were let go to keep the newest ones.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Takes the entries kept, oldest first (the count of those let go stays).
    pub fn take(&mut self) -> Vec<T> {
        std::mem::take(&mut self.entries).into()
    }

    /// Empties the log and resets the count of those let go.
    pub fn clear(&mut self) {
        self.entries.clear();
        self.dropped = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::BoundedLog;

    #[test]
    fn keeps_the_newest_and_counts_the_rest() {
        let mut log = BoundedLog::new(2);
        for i in 0..5 {
            log.push(i);
        }
        assert_eq!(log.entries().copied().collect::<Vec<_>>(), [3, 4]);
        assert_eq!(log.dropped(), 3);
        assert_eq!(log.take(), [3, 4]);
        assert!(log.is_empty());
        assert_eq!(log.dropped(), 3);
        log.clear();
        assert_eq!(log.dropped(), 0);
        assert_eq!(BoundedLog::<u8>::new(0).entries().len(), 0);
    }
}
