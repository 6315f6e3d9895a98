//! fanfold's operators: partition, prefilter, map (prompt, validation,
//! evidence), chunk (many units a context), cluster (a model reducer over
//! facts), embed (texts, keys, scores),
//! select (a typed choice from a catalog), fold, verify, audit and the
//! stopping controller.
//!
//! Architecture Invariant: operators are pure functions of their inputs.
//! They read no files, open no store and call no model; the engine hands them
//! bytes and values and persists what they return.

pub mod audit;
pub mod bm25;
pub mod chunk;
pub mod cluster;
pub mod contract;
pub mod embed;
pub mod fold;
pub mod jq;
pub mod map;
pub mod partition;
pub mod prefilter;
pub mod select;
pub mod verify;
pub mod view;
pub mod widen;
