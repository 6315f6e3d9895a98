//! The `group` kind's spec: units gathered into groups, each group judged
//! in one model context that emits one group-level fact.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::MapStageSpec;

/// Groups as units. The units the stage receives are gathered into groups
/// (`[stages.by]`: an equal key, a time window, or near-duplicate text),
/// each of at most `max_members`; a larger group is split in its own order
/// into even parts. Each group of two or more is judged in ONE context by
/// the stage's judge, which emits one fact about the group ("these issues
/// are duplicates of each other", "these reports contradict each other").
/// The fact must quote every member: a fact leaving a member uncited is an
/// error for its group. A unit alone in its group is not judged.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GroupStageSpec {
    pub name: String,
    /// How units are gathered.
    pub by: GroupBySpec,
    /// The most members one context shows; at least 3, so no part of a
    /// split group is left alone.
    #[serde(default = "default_max_members")]
    pub max_members: usize,
    /// The judge of a group's context: a map stage's declaration without a
    /// name, with `evidence` set. Its projection is applied to each member;
    /// the context shows one field per member and field, named
    /// `"<id>.<field>"` (a member whose projection is not an object is one
    /// field named by its id), members in the group's order. Evidence
    /// quotes those fields verbatim, at least one quote per member.
    pub judge: MapStageSpec,
}

fn default_max_members() -> usize {
    8
}

/// How a group stage gathers units: exactly one of `key`, `time` or
/// `min_jaccard`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GroupBySpec {
    /// A jq expression over the unit (`.milestone.title`): units with an
    /// equal, non-null value are one group, in source order.
    pub key: Option<String>,
    /// A jq expression yielding a time in seconds (`.createdAt |
    /// fromdate`): a group starts at the earliest unit not yet grouped and
    /// holds every unit at most `window_secs` after it, in time order.
    pub time: Option<String>,
    pub window_secs: Option<f64>,
    /// Near-duplicates: units whose projected text (the judge's view, its
    /// strings in order) shares word shingles with a Jaccard similarity of
    /// at least this are linked, and linked units are one group, in source
    /// order. Candidates are found by MinHash; each is confirmed by its
    /// exact Jaccard.
    pub min_jaccard: Option<f64>,
    /// Words per shingle for `min_jaccard`.
    #[serde(default = "default_shingle_words")]
    pub shingle_words: usize,
}

fn default_shingle_words() -> usize {
    3
}
