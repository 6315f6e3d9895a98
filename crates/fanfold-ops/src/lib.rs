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
pub mod compress;
pub mod contract;
pub mod dedupe;
pub mod fold;
pub mod interval;
pub mod jq;
pub mod partition;
pub mod prefilter;
pub mod proxy;
pub mod quotes;
pub mod verify;
pub mod view;

// One module per stage kind, declared by hand so `rustfmt` sees it; the
// list of kinds names each, so a listed kind without its module does not
// compile.
pub mod audit;
pub mod bm25;
pub mod chunk;
pub mod cluster;
pub mod effect;
pub mod embed;
pub mod group;
pub mod map;
pub mod rerank;
pub mod select;
pub mod tool;
pub mod widen;

macro_rules! kind_modules {
    ($($variant:ident($module:ident, $spec:ty) = $tag:literal,)*) => {
        $(#[allow(unused_imports)] use self::$module as _;)*
    };
}

fanfold_core::stage_kinds!(kind_modules);
