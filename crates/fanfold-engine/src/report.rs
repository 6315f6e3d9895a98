//! What a run reports: the answer, the certificate that says how it was
//! reached, and the figures the run measured about itself.

use std::collections::BTreeMap;

use fanfold_core::{ContentHash, FactRecord, StatusCounts, UnitId};
use fanfold_model::BackendInfo;
use fanfold_ops::contract::StopReason;
use fanfold_ops::fold::FoldOutcome;
use fanfold_ops::partition::Coverage;
use fanfold_ops::verify::VerifyReport;
use serde::{Deserialize, Serialize};

pub use crate::kit::RunStats;

/// This process's peak resident memory in KiB, from `/proc/self/status`.
pub fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AnswerItem {
    pub unit_id: UnitId,
    pub title: Option<String>,
    pub link: Option<String>,
    pub theme: Option<String>,
    pub score: Option<f64>,
    pub evidence: Vec<fanfold_core::Evidence>,
    /// What the unit's fact extracted beside its decision (a sender, a
    /// subject, a cause): the output schema's scalar fields.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub fields: BTreeMap<String, serde_json::Value>,
    /// The unit's own fields the spec's `output.show` names, in its
    /// order, as the source has them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shown: Vec<(String, String)>,
}

/// One reducer's value, as the answer states it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Aggregate {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(flatten)]
    pub stated: fanfold_ops::fold::Stated,
}

/// What one reducer's `dedupe` collapsed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Collapsed {
    pub reducer: String,
    #[serde(flatten)]
    pub summary: fanfold_ops::dedupe::CollapseSummary,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Theme {
    pub key: String,
    pub count: u64,
    pub ids: Vec<UnitId>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Answer {
    pub schema: String,
    pub question: String,
    pub simulated: bool,
    pub contract: String,
    /// False when the contract's answer needs units that were not decided
    /// (errors, not_run, cancelled by a budget): the items are then only
    /// part of the answer. `incomplete` says why.
    pub complete: bool,
    pub incomplete: Vec<String>,
    /// For a threshold contract: whether the threshold was reached.
    pub reached: Option<bool>,
    /// For an interval contract: the estimate, with its interval and
    /// whether it reached the declared half width.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimate: Option<fanfold_ops::interval::Estimate>,
    /// What is proven of the answer's quality, one line per declared
    /// quality target; empty when none is declared: the quality is then
    /// unmeasured, and answer.md says so at the top.
    #[serde(default)]
    pub quality: Vec<String>,
    pub items: Vec<AnswerItem>,
    /// What the contract's answer reducer states when it is not a set of
    /// units (a mean, a ratio, grouped rows, pairs); `items` are then the
    /// units it cites.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stated: Option<Aggregate>,
    pub themes: Vec<Theme>,
    /// What every other reducer of the fold says.
    #[serde(default)]
    pub aggregates: Vec<Aggregate>,
    /// Each reducer with a `dedupe`: the near-duplicates it collapsed
    /// before counting, each kept unit with the units collapsed into it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub collapsed: Vec<Collapsed>,
    pub statuses: StatusCounts,
    pub excluded: u64,
    /// Input elements that repeat an earlier unit exactly (the same key and
    /// content): each is that unit, judged once, so none leaves the answer
    /// incomplete.
    #[serde(default)]
    pub repeated_identical: u64,
    pub stop: StopReason,
    pub verified: bool,
}

/// The settings a run actually used, after flags and spec were resolved.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunSettingsReport {
    pub slots: usize,
    pub max_unit_bytes: u64,
    pub partition_threads: usize,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Certificate {
    pub schema: String,
    pub run_id: String,
    pub spec: String,
    /// The hash of the spec as it ran: after `--backend`, `--model` and
    /// `--execution`, with every file it names.
    pub spec_hash: ContentHash,
    pub question: String,
    pub source_hash: ContentHash,
    pub source_bytes: u64,
    pub source_origin: String,
    pub settings: RunSettingsReport,
    pub coverage: Coverage,
    pub coverage_complete: bool,
    /// Whether the answer is the whole answer the contract asks for.
    pub complete: bool,
    pub incomplete: Vec<String>,
    /// What the run noticed about its own assumptions (a top-k bound a
    /// score broke).
    pub notes: Vec<String>,
    pub rejected_by_reason: BTreeMap<String, u64>,
    /// The first rejections in full (where, why, what to do).
    pub rejections: Vec<String>,
    /// The first identical repeats in full (`coverage.repeated_identical`
    /// counts them all).
    #[serde(default)]
    pub repeats: Vec<String>,
    pub excluded_by_reason: BTreeMap<String, u64>,
    pub routed_by_stage: BTreeMap<String, u64>,
    pub statuses_by_stage: BTreeMap<String, StatusCounts>,
    pub statuses: StatusCounts,
    pub stop: StopReason,
    pub contract: String,
    /// An interval contract's estimate, as the answer states it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimate: Option<fanfold_ops::interval::Estimate>,
    pub budget_limits: fanfold_core::spec::BudgetSpec,
    pub stats: RunStats,
    pub fold_root: ContentHash,
    pub verify: VerifyReport,
    pub backends: Vec<BackendInfo>,
    pub simulated: bool,
    /// The figures that come from a simulated backend, when any do.
    pub simulated_figures: Vec<String>,
    /// The spec file it ran (absolute), and the spec as it ran (after
    /// command-line overrides): `fanfold verify` rebuilds the plan from
    /// them, and refuses it unless its files still hash to `spec_hash`.
    #[serde(default)]
    pub spec_path: Option<String>,
    #[serde(default)]
    pub spec_as_run: Option<serde_json::Value>,
}

pub struct RunReport {
    pub run_id: String,
    pub answer: Answer,
    pub certificate: Certificate,
    pub facts: Vec<FactRecord>,
    pub fold: FoldOutcome,
    /// The stages' own sections of answer.md, in spec order.
    pub sections: Vec<String>,
    /// The stages' own lines under answer.md's Accounting.
    pub accounting: Vec<String>,
    /// Files the stages add beside the answer: (file name, JSON lines).
    pub files: Vec<(String, Vec<serde_json::Value>)>,
}

impl RunReport {
    /// The process exit code a run should end with: 0 for a complete,
    /// verified answer; 3 for an answer cut short (budget, errors, not_run);
    /// 130 for one stopped from outside (Ctrl-C); 4 when verification
    /// failed.
    pub fn exit_code(&self) -> u8 {
        if !self.certificate.verify.passed {
            EXIT_VERIFY_FAILED
        } else if self.answer.stop == StopReason::Interrupted {
            EXIT_INTERRUPTED
        } else if !self.answer.complete {
            EXIT_INCOMPLETE
        } else {
            0
        }
    }
}

pub use crate::error::{
    EXIT_CONFIGURATION, EXIT_FAILED, EXIT_INCOMPLETE, EXIT_INPUT, EXIT_INTERRUPTED,
    EXIT_VERIFY_FAILED,
};
