//! Units: the independently addressable records a source is partitioned into.

use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::hash::ContentHash;

/// A unit's stable id: a declared key's value (an issue `number`), or derived
/// from the unit's content. Never a position in the source.
#[derive(
    Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(transparent)]
pub struct UnitId(pub String);

impl UnitId {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for UnitId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl crate::StableHash for UnitId {
    fn stable_hash(&self, h: &mut crate::StableHasher) {
        self.0.stable_hash(h)
    }
}

/// Half-open byte range `[start, end)` in the source artifact.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ByteRange {
    pub start: u64,
    pub end: u64,
}

impl ByteRange {
    pub fn len(&self) -> u64 {
        self.end.saturating_sub(self.start)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The descriptor of one unit. The unit's value is not part of it: it lives
/// in the source artifact at `bytes`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Unit {
    pub unit_id: UnitId,
    pub unit_kind: String,
    /// Position among the source's elements; for ordering and reports only,
    /// never part of an id or a cache key.
    pub ordinal: u64,
    pub source_hash: ContentHash,
    /// Hash of the unit's canonical content (sorted-key JSON for JSON inputs,
    /// the raw bytes otherwise), so a reformatted export keeps its keys.
    pub unit_hash: ContentHash,
    pub bytes: ByteRange,
}
