//! Seeded generators for fanfold's fixtures.
//!
//! Everything here is deterministic forever: the same seed and size produce
//! byte-identical output on every platform and with every dependency version,
//! because the committed fixtures and benchmark inputs are compared against
//! answers recorded long ago. That is why the crate carries its own PRNG and
//! date formatting instead of depending on `rand` or `chrono`.

pub mod issues;
pub mod jsonl;
pub mod relations;
pub mod reviews;

mod rng;
mod time;
