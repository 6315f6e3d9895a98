//! The pure core of fanfold: ids, stable content hashing, units, fact records,
//! statuses and the spec's types.
//!
//! Architecture Invariant: this crate does no IO and knows no model, database
//! or jq engine. Everything here is plain data plus pure functions, so every
//! other layer can depend on it and tests can build values by hand.

pub mod fact;
pub mod hash;
pub mod spec;
pub mod status;
pub mod unit;

pub use fact::{ChoiceScore, Cost, Evidence, FACT_SCHEMA, FactRecord, ModelParams};
pub use hash::{Bucket, ContentHash, StableHash, StableHasher};
pub use status::{BatchState, Status, StatusCounts};
pub use unit::{ByteRange, Unit, UnitId};
