//! Fact records: the typed, schema-versioned output of one stage on one unit.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::hash::ContentHash;
use crate::status::Status;
use crate::unit::UnitId;

/// The version tag every fact record carries. Bump with the record's shape.
pub const FACT_SCHEMA: &str = "fanfold.fact/v1";

/// Which model produced a fact and how it was asked. Part of the cache key.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ModelParams {
    /// The backend kind (`scripted`, `replay`, `llama`, ...).
    pub backend: String,
    /// The model's identity: a file hash, a provider model name, a script hash.
    pub model_id: String,
    pub temperature: f64,
    pub max_output_tokens: u32,
    pub seed: u64,
    /// True when the backend answers from a script or cassette, not a model.
    pub simulated: bool,
}

impl ModelParams {
    /// Hashes what bears on a model's answer into a cache key, under the
    /// field names every model-made key uses.
    pub fn key_into(&self, h: &mut crate::StableHasher) {
        h.field("backend", &self.backend)
            .field("model", &self.model_id)
            .field("temperature", &self.temperature)
            .field("max_output_tokens", &self.max_output_tokens)
            .field("seed", &self.seed);
    }
}

/// One quoted span of the unit that supports a fact. `start..end` are byte
/// offsets into the named field's decoded string value.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Evidence {
    pub field: String,
    pub start: u64,
    pub end: u64,
    pub quote: String,
}

/// What producing a fact cost, as the backend measured it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Cost {
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub completion_tokens: u64,
    pub usd: f64,
    pub latency_ms: u64,
    pub calls: u64,
}

impl Cost {
    pub fn add(&mut self, other: &Cost) {
        self.prompt_tokens += other.prompt_tokens;
        self.cached_tokens += other.cached_tokens;
        self.completion_tokens += other.completion_tokens;
        self.usd += other.usd;
        self.latency_ms += other.latency_ms;
        self.calls += other.calls;
    }
}

/// One allowed decision value and the probability the model gave it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ChoiceScore {
    pub choice: String,
    pub p: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct FactRecord {
    /// Always [`FACT_SCHEMA`].
    pub schema: String,
    /// The content key this record is cached under.
    pub key: ContentHash,
    pub source_ids: Vec<UnitId>,
    pub source_hashes: Vec<ContentHash>,
    pub stage: String,
    pub stage_version: u32,
    pub rubric_hash: ContentHash,
    pub model: ModelParams,
    pub status: Status,
    /// The decision value the stage's output named (`blocker`, ...), if any.
    pub decision: Option<String>,
    /// The whole schema-checked output object.
    pub facts: serde_json::Value,
    pub confidence: Option<f64>,
    /// The probability of every allowed decision value, where the backend
    /// read them from the model (choice scoring); empty otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub choice_scores: Vec<ChoiceScore>,
    /// Why the status is what it is, for everything but a clean decision.
    pub reason: Option<String>,
    pub evidence: Vec<Evidence>,
    pub cost: Cost,
    pub attempts: u32,
    /// The fold nodes this fact was reduced through, leaf first.
    #[serde(default)]
    pub reducer_path: Vec<String>,
    /// Tokens of the unit's input the backend cut to fit its window: the
    /// context did not see the whole unit. 0 when it did.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub truncated_tokens: u64,
    /// The hash of what the fact says ([`FactRecord::content_digest`]),
    /// set when it is recorded: a fact changed afterwards (a flipped
    /// decision in the store or in facts.jsonl) no longer matches it, and
    /// every reader refuses it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<ContentHash>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl FactRecord {
    /// The hash of what the fact says: its key, units, stage, status,
    /// decision, output, confidence, evidence and reason. Not its cost or
    /// its path through the fold, which say how it was made and used.
    pub fn content_digest(&self) -> ContentHash {
        let said = serde_json::json!({
            "schema": self.schema,
            "key": self.key,
            "source_ids": self.source_ids,
            "source_hashes": self.source_hashes,
            "stage": self.stage,
            "stage_version": self.stage_version,
            "rubric_hash": self.rubric_hash,
            "model": self.model,
            "status": self.status,
            "decision": self.decision,
            "facts": self.facts,
            "confidence": self.confidence,
            "choice_scores": self.choice_scores,
            "reason": self.reason,
            "evidence": self.evidence,
            "truncated_tokens": self.truncated_tokens,
        });
        let mut h = crate::StableHasher::new(crate::Bucket::Kind("fact-seal-v1"));
        h.field("fact", &said);
        h.finish()
    }

    /// Sets `digest` to what the fact says now.
    pub fn seal(&mut self) {
        self.digest = Some(self.content_digest());
    }

    /// Whether the fact still says what it was sealed saying.
    pub fn is_intact(&self) -> bool {
        self.digest == Some(self.content_digest())
    }
}
