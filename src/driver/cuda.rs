//! The real driver backend (stub; being written).
