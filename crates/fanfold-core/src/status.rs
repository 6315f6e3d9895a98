//! The six outcomes of a unit at a stage. They are never collapsed: a timeout
//! is an `error`, not a `negative`, and every aggregate counts all six.

use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// The stage decided the unit answers the question.
    Positive,
    /// The stage decided the unit does not answer the question.
    Negative,
    /// The stage ran and declined to decide (low confidence, missing context).
    Abstain,
    /// The stage could not produce a valid answer (backend fault, invalid
    /// output after every retry, unverifiable evidence).
    Error,
    /// The unit was opened or queued and then dropped because the declared
    /// answer contract proved it could not change the answer.
    Cancelled,
    /// The unit never ran: the run stopped first (budget, interrupt).
    NotRun,
}

impl Status {
    pub const ALL: [Status; 6] = [
        Status::Positive,
        Status::Negative,
        Status::Abstain,
        Status::Error,
        Status::Cancelled,
        Status::NotRun,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Status::Positive => "positive",
            Status::Negative => "negative",
            Status::Abstain => "abstain",
            Status::Error => "error",
            Status::Cancelled => "cancelled",
            Status::NotRun => "not_run",
        }
    }

    pub fn parse(s: &str) -> Option<Status> {
        Status::ALL.into_iter().find(|st| st.as_str() == s)
    }

    /// Only a decided answer may be cached: failures and interruptions are
    /// retried by the next run, never replayed as answers.
    pub fn is_cacheable(self) -> bool {
        matches!(self, Status::Positive | Status::Negative | Status::Abstain)
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How many units ended in each status. Every field is always present.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct StatusCounts {
    pub positive: u64,
    pub negative: u64,
    pub abstain: u64,
    pub error: u64,
    pub cancelled: u64,
    pub not_run: u64,
}

impl StatusCounts {
    pub fn add(&mut self, status: Status, n: u64) {
        *self.slot(status) += n;
    }

    pub fn get(&self, status: Status) -> u64 {
        match status {
            Status::Positive => self.positive,
            Status::Negative => self.negative,
            Status::Abstain => self.abstain,
            Status::Error => self.error,
            Status::Cancelled => self.cancelled,
            Status::NotRun => self.not_run,
        }
    }

    fn slot(&mut self, status: Status) -> &mut u64 {
        match status {
            Status::Positive => &mut self.positive,
            Status::Negative => &mut self.negative,
            Status::Abstain => &mut self.abstain,
            Status::Error => &mut self.error,
            Status::Cancelled => &mut self.cancelled,
            Status::NotRun => &mut self.not_run,
        }
    }

    pub fn merge(&mut self, other: &StatusCounts) {
        for st in Status::ALL {
            self.add(st, other.get(st));
        }
    }

    pub fn total(&self) -> u64 {
        Status::ALL.iter().map(|s| self.get(*s)).sum()
    }
}

/// Where a provider batch stands in the store's ledger.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BatchState {
    /// Submitted; its requests are found by a rerun and collected.
    Open,
    /// Every result was handed back; never matched again.
    Consumed,
    /// Failed or expired as a whole; it can yield nothing.
    Failed,
}

impl BatchState {
    pub const ALL: [BatchState; 3] = [BatchState::Open, BatchState::Consumed, BatchState::Failed];

    pub const fn as_str(self) -> &'static str {
        match self {
            BatchState::Open => "open",
            BatchState::Consumed => "consumed",
            BatchState::Failed => "failed",
        }
    }

    /// The state a stored name stands for.
    pub fn parse(name: &str) -> Option<BatchState> {
        BatchState::ALL.into_iter().find(|s| s.as_str() == name)
    }
}

impl fmt::Display for BatchState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
