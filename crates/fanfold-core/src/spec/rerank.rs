//! The `rerank` kind's spec: the model scores each (question, unit) pair
//! and only the best-scored units go on.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{Execution, default_attempts, default_backend};

/// A reranker between a cheap rung and the judge. For each unit it
/// receives, the model reads the question and the unit and is asked
/// whether the unit is relevant; the unit's score is the probability the
/// model gives `yes` (read from its logits after the answer's forced
/// opening: one forward pass a pair, nothing generated, on the embedded
/// model; a backend without scores gives 1 for `yes` and 0 for `no`).
/// Units are ranked by score; those within `top_k` and at or above
/// `min_score` go on to `then` (or end as positive without it), the rest
/// end as negative facts that say their score and rank. At least one of
/// `top_k` and `min_score` is required.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RerankStageSpec {
    pub name: String,
    /// Bump when the stage's meaning changes without its settings changing.
    pub version: u32,
    /// The question each unit is scored against; the spec's `question`
    /// when absent.
    pub query: Option<String>,
    /// The unit's top-level fields the model reads; all when empty.
    #[serde(default)]
    pub fields: Vec<String>,
    /// A jq expression that builds what the model reads, instead of
    /// `fields`.
    pub project: Option<String>,
    #[serde(default = "default_backend")]
    pub backend: String,
    /// Keep at most this many units, the best-scored (ties to the unit
    /// earlier in source order).
    pub top_k: Option<usize>,
    /// Keep only units scored at least this, in [0, 1].
    pub min_score: Option<f64>,
    /// The stage the kept units go on to, declared after this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub then: Option<String>,
    /// Attempts per unit, counting the first.
    #[serde(default = "default_attempts")]
    pub max_attempts: u32,
    /// Tokens the answer may take where it is generated (a backend
    /// without scores, or a retry).
    #[serde(default = "default_rerank_tokens")]
    pub max_output_tokens: u32,
    #[serde(default)]
    pub temperature: f64,
    #[serde(default)]
    pub seed: u64,
    #[serde(default)]
    pub execution: Execution,
}

fn default_rerank_tokens() -> u32 {
    16
}
