//! A map stage's prompt compression (after LLMLingua).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Prompt compression in the manner of LLMLingua: before a unit is
/// judged, the stage's model reads each string field of its view once,
/// and each word is scored by its surprise (the mean negative
/// log-probability of its tokens under the model, given the text before
/// it). The least surprising words are dropped until `keep` of them
/// remain, in their order; the judge reads the compressed text. Evidence
/// is still quoted from the uncompressed view: the quotes a unit's schema
/// offers are spans of its original fields, and the fact's quotes are
/// checked against them, and by verify against the stored unit. Needs a
/// backend that scores tokens (the embedded model).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CompressSpec {
    /// The share of each field's words kept, in (0, 1].
    pub keep: f64,
    /// A field of fewer words than this is shown whole.
    #[serde(default = "default_min_words")]
    pub min_words: usize,
}

fn default_min_words() -> usize {
    8
}
