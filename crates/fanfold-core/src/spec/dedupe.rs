//! A counting reducer's `dedupe`: near-duplicate facts collapsed into one
//! before they are counted, so forty reports of one crash are one
//! incident.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{ReducerKind, ReducerSpec};

/// Near-duplicates collapsed before the reducer counts. Two facts are
/// near-duplicates when the MinHash estimate of the Jaccard similarity of
/// their texts' character shingles is at least `threshold`. Facts are
/// taken in ascending unit id (ids of digits alone by their number, so
/// `5` before `11`); each is collapsed into the most similar
/// unit kept before it (ties to the lower id), or kept itself, so the
/// unit kept for a group is its lowest id, every collapsed unit is a
/// near-duplicate of the unit it is collapsed into, and the result does
/// not depend on the order facts arrive in. A fact without text at
/// `field` is kept as it is.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DedupeSpec {
    pub method: DedupeMethod,
    /// The least estimated similarity, in (0, 1], at which two facts are
    /// one.
    pub threshold: f64,
    /// The text compared: a fact's JSON pointer (`/summary`) or a unit's
    /// own field (`unit:/title`). A string is compared as it is, any
    /// other value as its compact JSON.
    pub field: String,
    /// Characters a shingle: texts are lowercased, their whitespace runs
    /// made one space, and cut into every run of this many characters.
    #[serde(default = "default_shingle_chars")]
    pub shingle_chars: usize,
    /// Seeds the hash functions.
    #[serde(default)]
    pub seed: u64,
}

/// How near-duplicates are found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DedupeMethod {
    /// 128 seeded min-hashes of the text's shingles, candidates found by
    /// banding them (locality-sensitive hashing).
    Minhash,
}

impl DedupeMethod {
    pub fn as_str(self) -> &'static str {
        match self {
            DedupeMethod::Minhash => "minhash",
        }
    }
}

/// The most characters a shingle may be: longer shingles make every short
/// text one shingle, which only exact repeats share.
pub const MAX_SHINGLE_CHARS: usize = 64;

fn default_shingle_chars() -> usize {
    5
}

/// Why a reducer's `dedupe` cannot be run as written, if it cannot.
pub fn check(reducer: &ReducerSpec) -> Result<(), String> {
    let Some(d) = &reducer.dedupe else {
        return Ok(());
    };
    match reducer.kind {
        ReducerKind::Count | ReducerKind::CountBy { .. } | ReducerKind::GroupBy { .. } => {}
        ref other => {
            return Err(format!(
                "`dedupe` collapses near-duplicates before they are counted, which a `{}` does not do: it applies to `count`, `count_by` and `group_by`",
                other.type_name()
            ));
        }
    }
    if !(d.threshold > 0.0 && d.threshold <= 1.0) {
        return Err(format!(
            "dedupe.threshold {} must be within (0, 1]",
            d.threshold
        ));
    }
    if d.shingle_chars == 0 || d.shingle_chars > MAX_SHINGLE_CHARS {
        return Err(format!(
            "dedupe.shingle_chars {} must be within 1..={MAX_SHINGLE_CHARS}",
            d.shingle_chars
        ));
    }
    Ok(())
}
