//! fanfold's operators: partition, prefilter, map (prompt, validation,
//! evidence), fold, verify and the stopping controller.
//!
//! Architecture Invariant: operators are pure functions of their inputs.
//! They read no files, open no store and call no model; the engine hands them
//! bytes and values and persists what they return.

pub mod contract;
pub mod fold;
pub mod jq;
pub mod map;
pub mod partition;
pub mod prefilter;
pub mod verify;
