//! fanfold's execution layer: turns a spec into a checked plan, runs it over
//! a bounded number of slots under budgets and the answer contract, folds,
//! verifies and writes the answer, the facts and the run certificate.

pub mod backends;
pub mod batches;
pub mod error;
pub mod fleet;
pub mod folder;
pub mod interval;
pub mod kit;
pub mod markdown;
pub mod models;
pub mod output;
pub mod plan;
pub mod queue;
pub mod recheck;
pub mod report;
pub mod run;
pub mod source;
pub mod stages;
pub mod strategy;

pub use error::{ErrorCategory, RunError};
pub use plan::{Overrides, Plan, PlanError};
pub use report::{EXIT_INCOMPLETE, EXIT_INTERRUPTED, EXIT_VERIFY_FAILED, RunReport};
pub use run::{RunOptions, run};
pub use source::{Source, SourceError};

pub use kit::{NoProgress, Progress};
