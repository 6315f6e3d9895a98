//! What a run reports: the answer, the certificate that says how it was
//! reached, and the figures the run measured about itself.

use std::collections::BTreeMap;

use fanfold_core::{ContentHash, Cost, FactRecord, StatusCounts, UnitId};
use fanfold_model::BackendInfo;
use fanfold_ops::contract::StopReason;
use fanfold_ops::fold::FoldOutcome;
use fanfold_ops::partition::Coverage;
use fanfold_ops::verify::VerifyReport;
use serde::{Deserialize, Serialize};

use crate::stages::embed::EmbedStats;

/// Figures a run measured about itself.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunStats {
    pub model_calls: u64,
    pub cache_hits: u64,
    pub cache_misses: u64,
    /// Units a backend cut to fit its window; each such fact says by how
    /// many tokens (`truncated_tokens`).
    #[serde(default)]
    pub truncated_units: u64,
    /// Units whose projected input equalled another unit's in the same
    /// stage of this run: they share that unit's call instead of their own.
    #[serde(default)]
    pub deduplicated: u64,
    pub slots: usize,
    pub max_in_flight: usize,
    pub fold_depth: u32,
    pub fold_nodes_computed: u64,
    pub fold_nodes_reused: u64,
    /// Units whose facts were computed (not reused) in this run.
    pub recomputed_units: Vec<String>,
    pub cost: Cost,
    pub wall_ms: u64,
    /// Wall time of each phase of the run, in order: source, route
    /// (partition, prefilter and their store writes, streamed together),
    /// one entry per stage (`embed:NAME`, `map:NAME`), fold, answer, verify.
    pub phases_ms: Vec<(String, u64)>,
    /// What each embed stage did.
    #[serde(default)]
    pub embed: BTreeMap<String, EmbedStats>,
    /// What each audit stage measured of the rungs it checked.
    #[serde(default)]
    pub audits: BTreeMap<String, crate::stages::audit::AuditReport>,
    /// What each select stage chose, by whom, and what the stages it chose
    /// said of those units.
    #[serde(default)]
    pub selects: BTreeMap<String, crate::stages::select::SelectReport>,
    /// What each map stage's canaries showed, when it sent any.
    #[serde(default)]
    pub canaries: BTreeMap<String, crate::stages::map::CanaryReport>,
    /// How each chunk stage packed its units into contexts.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub chunks: BTreeMap<String, crate::stages::chunk::ChunkReport>,
    /// Per BM25 stage: units scored and kept.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub bm25: BTreeMap<String, crate::stages::bm25::Bm25Report>,
    /// Per cluster stage: its themes, checks and reorder stress.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub clusters: BTreeMap<String, crate::stages::cluster::ClusterReport>,
    /// Per widen stage: units widened and the members their contexts showed.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub widens: BTreeMap<String, crate::stages::widen::WidenReport>,
    /// The process's peak resident memory when the certificate was
    /// written (Linux `VmHWM`), in KiB; absent where the OS does not say.
    #[serde(default)]
    pub peak_rss_kib: Option<u64>,
}

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
    pub items: Vec<AnswerItem>,
    pub themes: Vec<Theme>,
    pub statuses: StatusCounts,
    pub excluded: u64,
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
    pub excluded_by_reason: BTreeMap<String, u64>,
    pub routed_by_stage: BTreeMap<String, u64>,
    pub statuses_by_stage: BTreeMap<String, StatusCounts>,
    pub statuses: StatusCounts,
    pub stop: StopReason,
    pub contract: String,
    pub budget_limits: fanfold_core::spec::BudgetSpec,
    pub stats: RunStats,
    pub fold_root: ContentHash,
    pub verify: VerifyReport,
    pub backends: Vec<BackendInfo>,
    pub simulated: bool,
    /// The figures that come from a simulated backend, when any do.
    pub simulated_figures: Vec<String>,
}

pub struct RunReport {
    pub run_id: String,
    pub answer: Answer,
    pub certificate: Certificate,
    pub facts: Vec<FactRecord>,
    pub fold: FoldOutcome,
}

impl RunReport {
    /// The process exit code a run should end with: 0 for a complete,
    /// verified answer; 3 for an answer cut short (budget, errors, not_run);
    /// 4 when verification failed.
    pub fn exit_code(&self) -> u8 {
        if !self.certificate.verify.passed {
            EXIT_VERIFY_FAILED
        } else if !self.answer.complete {
            EXIT_INCOMPLETE
        } else {
            0
        }
    }
}

/// `fanfold run` exits with this when the input or a jq expression is at
/// fault.
pub const EXIT_INPUT: u8 = 5;
/// `fanfold run` exits with this when a backend or model could not be set
/// up.
pub const EXIT_CONFIGURATION: u8 = 6;
/// `fanfold run` exits with this for any other failure (store, outputs).
pub const EXIT_FAILED: u8 = 2;
/// `fanfold run` exits with this when the answer is incomplete.
pub const EXIT_INCOMPLETE: u8 = 3;
/// `fanfold run` exits with this when verification failed.
pub const EXIT_VERIFY_FAILED: u8 = 4;
