//! fanfold's operators: partition, prefilter, map (prompt, validation,
//! evidence), chunk (many units a context), cluster (a model reducer over
//! facts), embed (texts, keys, scores),
//! select (a typed choice from a catalog), fold, verify, audit and the
//! stopping controller.
//!
//! Architecture Invariant: operators are pure functions of their inputs.
//! They read no files, open no store and call no model; the engine hands them
//! bytes and values and persists what they return.

pub mod cascade;
pub mod cascade_accept;
pub mod contract;
pub mod fold;
pub mod jq;
pub mod partition;
pub mod prefilter;
pub mod proxy;
pub mod quotes;
pub mod verify;
pub mod view;

/// One module per stage kind, declared by the list of kinds.
macro_rules! kind_modules {
    ($($variant:ident($module:ident, $spec:ty) = $tag:literal,)*) => {
        $(pub mod $module;)*
    };
}

fanfold_core::stage_kinds!(kind_modules);
