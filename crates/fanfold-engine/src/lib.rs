//! fanfold's execution layer: turns a spec into a checked plan, runs it over
//! a bounded number of slots under budgets and the answer contract, folds,
//! verifies and writes the answer, the facts and the run certificate.

pub mod backends;
pub mod batches;
pub mod error;
pub mod models;
pub mod output;
pub mod plan;
pub mod queue;
pub mod report;
pub mod run;
pub mod source;
pub mod stages;

pub use error::{ErrorCategory, RunError};
pub use plan::{Overrides, Plan, PlanError};
pub use report::{EXIT_INCOMPLETE, EXIT_VERIFY_FAILED, RunReport};
pub use run::{RunOptions, run};
pub use source::{Source, SourceError};

/// Receives progress while a run goes. The CLI draws bars from it; tests
/// and `--json` runs pass [`NoProgress`].
pub trait Progress: Sync {
    fn stage_started(&self, _stage: &str, _units: u64, _cached: u64) {}
    fn unit_finished(&self, _stage: &str, _status: fanfold_core::Status) {}
    fn stage_finished(&self, _stage: &str) {}
}

pub struct NoProgress;
impl Progress for NoProgress {}
