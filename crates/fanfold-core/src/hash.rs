//! Stable content hashing.
//!
//! Cache keys are derived through [`StableHash`], never `derive(Hash)`:
//! `std::hash::Hash` is free to change between compiler versions and says
//! nothing about which fields carry meaning. Every implementation here writes
//! a type tag and length-prefixes variable data, so two different values can
//! never feed the hasher the same byte stream.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A BLAKE3 digest, shown as 64 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ContentHash(pub [u8; 32]);

impl ContentHash {
    /// The digest of raw bytes: what a source artifact is named by.
    pub fn of_bytes(bytes: &[u8]) -> Self {
        ContentHash(*blake3::hash(bytes).as_bytes())
    }

    pub fn to_hex(&self) -> String {
        let mut s = String::with_capacity(64);
        for b in self.0 {
            s.push(char::from_digit(u32::from(b >> 4), 16).unwrap_or('0'));
            s.push(char::from_digit(u32::from(b & 0xf), 16).unwrap_or('0'));
        }
        s
    }

    /// The first `n` hex digits, for ids and readable output.
    pub fn short(&self, n: usize) -> String {
        let mut hex = self.to_hex();
        hex.truncate(n.min(64));
        hex
    }
}

impl fmt::Display for ContentHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for ContentHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ContentHash({})", self.short(12))
    }
}

#[derive(Debug, thiserror::Error)]
#[error("not a 64-digit hex content hash: {0:?}")]
pub struct ParseHashError(String);

impl FromStr for ContentHash {
    type Err = ParseHashError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bytes = s.as_bytes();
        if bytes.len() != 64 {
            return Err(ParseHashError(s.to_owned()));
        }
        let mut out = [0u8; 32];
        let (pairs, _) = bytes.as_chunks::<2>();
        for (slot, &[hi, lo]) in out.iter_mut().zip(pairs) {
            match ((hi as char).to_digit(16), (lo as char).to_digit(16)) {
                (Some(h), Some(l)) => *slot = (h * 16 + l) as u8,
                _ => return Err(ParseHashError(s.to_owned())),
            }
        }
        Ok(ContentHash(out))
    }
}

impl Serialize for ContentHash {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

impl<'de> Deserialize<'de> for ContentHash {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl schemars::JsonSchema for ContentHash {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "ContentHash".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({"type": "string", "pattern": "^[0-9a-f]{64}$"})
    }
}

/// Every namespace a key or content id is hashed in. The bucket's name,
/// with its format version (`facts-v1`), is hashed first: keys of two
/// buckets can never collide, and bumping one version is the only blanket
/// invalidation of what that bucket covers. The names are stored in facts
/// and fold nodes and must never change for a version already released.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Bucket {
    /// A unit's identity: its canonical record.
    Unit,
    /// What one stage sees of a unit (its projection).
    Input,
    /// A map stage's rubric text.
    Rubric,
    /// A stage's definition (map or embed): what its facts mean.
    StageDef,
    /// A map fact: stage definition, input and model.
    Facts,
    /// An embed fact: stage definition, input and encoder.
    EmbedFacts,
    /// A stored embedding vector: encoder, token limit and text.
    Embedding,
    /// An audit stage's definition.
    AuditStage,
    /// A select stage's definition: catalog, rules, floor.
    SelectDef,
    /// A select's choice for one unit, made by a rule or from a scored fact.
    Selection,
    /// A chunk stage's definition: packing and what its facts mean.
    ChunkDef,
    /// One context of a chunk stage: its members' inputs, in order, and
    /// the model.
    Chunk,
    /// A cluster stage's definition: what it reads, its grouping, its turn.
    ClusterDef,
    /// One context of a cluster stage: its inputs, in order, and the model.
    ClusterNode,
    /// A BM25 stage's definition: its query, fields and parameters.
    Bm25Def,
    /// A fold's reducers.
    FoldDef,
    /// One unit's outcome as a fold leaf.
    FoldLeaf,
    /// A fold node: its children's keys.
    FoldNode,
    /// The partition settings a source is cut with.
    Partition,
    /// A prefilter's rules.
    Prefilter,
    /// A whole spec, after overrides.
    Spec,
    /// Verify's seeded choice of negatives to read back.
    NegativeSample,
    /// A scripted backend's jq program.
    Script,
    /// A replay cassette's request key.
    Cassette,
    /// A namespace a stage kind declares in its own file, named with its
    /// format version (`tool-request-v1`), so a new kind adds no line here.
    Kind(&'static str),
}

impl Bucket {
    /// The name hashed at the start of every key in the bucket.
    pub const fn name(self) -> &'static str {
        match self {
            Bucket::Unit => "unit-v1",
            Bucket::Input => "input-v1",
            Bucket::Rubric => "rubric-v1",
            Bucket::StageDef => "stage-def-v1",
            Bucket::Facts => "facts-v1",
            Bucket::EmbedFacts => "embed-facts-v1",
            Bucket::Embedding => "embedding-v1",
            Bucket::AuditStage => "audit-stage-v1",
            Bucket::SelectDef => "select-def-v1",
            Bucket::Selection => "selection-v1",
            Bucket::ChunkDef => "chunk-def-v1",
            Bucket::Chunk => "chunk-v1",
            Bucket::ClusterDef => "cluster-def-v1",
            Bucket::ClusterNode => "cluster-node-v1",
            Bucket::Bm25Def => "bm25-def-v1",
            Bucket::FoldDef => "fold-def-v1",
            Bucket::FoldLeaf => "fold-leaf-v1",
            Bucket::FoldNode => "fold-node-v1",
            Bucket::Partition => "partition-v1",
            Bucket::Prefilter => "prefilter-v1",
            Bucket::Spec => "spec-v1",
            Bucket::NegativeSample => "negative-sample-v1",
            Bucket::Script => "script-v1",
            Bucket::Cassette => "cassette-v1",
            Bucket::Kind(name) => name,
        }
    }
}

impl fmt::Display for Bucket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A hasher that only accepts explicitly tagged, length-prefixed input.
pub struct StableHasher(blake3::Hasher);

impl StableHasher {
    /// A hasher for one bucket: its name goes in first.
    pub fn new(bucket: Bucket) -> Self {
        let mut h = StableHasher(blake3::Hasher::new());
        h.write_str(bucket.name());
        h
    }

    pub fn write_tag(&mut self, tag: u8) {
        self.0.update(&[tag]);
    }

    pub fn write_u64(&mut self, v: u64) {
        self.0.update(&v.to_le_bytes());
    }

    pub fn write_bytes(&mut self, bytes: &[u8]) {
        self.write_u64(bytes.len() as u64);
        self.0.update(bytes);
    }

    pub fn write_str(&mut self, s: &str) {
        self.write_bytes(s.as_bytes());
    }

    /// A named field: the name is hashed too, so reordering or renaming the
    /// fields of a key changes it.
    pub fn field(&mut self, name: &str, value: &(impl StableHash + ?Sized)) -> &mut Self {
        self.write_str(name);
        value.stable_hash(self);
        self
    }

    pub fn finish(&self) -> ContentHash {
        ContentHash(*self.0.finalize().as_bytes())
    }
}

/// Feeds every meaning-bearing part of a value into a [`StableHasher`].
pub trait StableHash {
    fn stable_hash(&self, h: &mut StableHasher);

    /// The key of this value in `bucket`.
    fn key_in(&self, bucket: Bucket) -> ContentHash {
        let mut h = StableHasher::new(bucket);
        self.stable_hash(&mut h);
        h.finish()
    }
}

impl StableHash for str {
    fn stable_hash(&self, h: &mut StableHasher) {
        h.write_tag(b's');
        h.write_str(self);
    }
}

impl StableHash for String {
    fn stable_hash(&self, h: &mut StableHasher) {
        self.as_str().stable_hash(h)
    }
}

impl StableHash for [u8] {
    fn stable_hash(&self, h: &mut StableHasher) {
        h.write_tag(b'b');
        h.write_bytes(self);
    }
}

impl StableHash for u64 {
    fn stable_hash(&self, h: &mut StableHasher) {
        h.write_tag(b'u');
        h.write_u64(*self);
    }
}

impl StableHash for u32 {
    fn stable_hash(&self, h: &mut StableHasher) {
        u64::from(*self).stable_hash(h)
    }
}

impl StableHash for usize {
    fn stable_hash(&self, h: &mut StableHasher) {
        (*self as u64).stable_hash(h)
    }
}

impl StableHash for bool {
    fn stable_hash(&self, h: &mut StableHasher) {
        h.write_tag(if *self { b'T' } else { b'F' });
    }
}

impl StableHash for f64 {
    /// Floats hash by bit pattern, with -0.0 folded into 0.0.
    fn stable_hash(&self, h: &mut StableHasher) {
        h.write_tag(b'f');
        let v = if *self == 0.0 { 0.0f64 } else { *self };
        h.write_u64(v.to_bits());
    }
}

impl StableHash for ContentHash {
    fn stable_hash(&self, h: &mut StableHasher) {
        h.write_tag(b'h');
        h.0.update(&self.0);
    }
}

impl<T: StableHash + ?Sized> StableHash for &T {
    fn stable_hash(&self, h: &mut StableHasher) {
        (**self).stable_hash(h)
    }
}

impl<T: StableHash> StableHash for Option<T> {
    fn stable_hash(&self, h: &mut StableHasher) {
        match self {
            None => h.write_tag(b'N'),
            Some(v) => {
                h.write_tag(b'S');
                v.stable_hash(h);
            }
        }
    }
}

impl<T: StableHash> StableHash for [T] {
    fn stable_hash(&self, h: &mut StableHasher) {
        h.write_tag(b'[');
        h.write_u64(self.len() as u64);
        for v in self {
            v.stable_hash(h);
        }
    }
}

impl<T: StableHash> StableHash for Vec<T> {
    fn stable_hash(&self, h: &mut StableHasher) {
        self.as_slice().stable_hash(h)
    }
}

impl<K: StableHash, V: StableHash> StableHash for BTreeMap<K, V> {
    fn stable_hash(&self, h: &mut StableHasher) {
        h.write_tag(b'{');
        h.write_u64(self.len() as u64);
        for (k, v) in self {
            k.stable_hash(h);
            v.stable_hash(h);
        }
    }
}

impl<T: StableHash> StableHash for BTreeSet<T> {
    fn stable_hash(&self, h: &mut StableHasher) {
        h.write_tag(b'<');
        h.write_u64(self.len() as u64);
        for v in self {
            v.stable_hash(h);
        }
    }
}

impl StableHash for serde_json::Value {
    /// JSON hashes canonically: object keys in sorted order, numbers by their
    /// shortest text, so `{"a":1,"b":2}` and `{"b":2,"a":1}` share a key.
    fn stable_hash(&self, h: &mut StableHasher) {
        use serde_json::Value;
        match self {
            Value::Null => h.write_tag(b'n'),
            Value::Bool(b) => b.stable_hash(h),
            Value::Number(n) => {
                h.write_tag(b'#');
                h.write_str(&n.to_string());
            }
            Value::String(s) => s.stable_hash(h),
            Value::Array(items) => items.stable_hash(h),
            Value::Object(map) => {
                let sorted: BTreeMap<&String, &Value> = map.iter().collect();
                h.write_tag(b'o');
                h.write_u64(sorted.len() as u64);
                for (k, v) in sorted {
                    k.stable_hash(h);
                    v.stable_hash(h);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn hex_round_trips() {
        let h = ContentHash::of_bytes(b"fanfold");
        let back: ContentHash = h.to_hex().parse().expect("parses");
        assert_eq!(h, back);
        assert!("zz".parse::<ContentHash>().is_err());
    }

    #[test]
    fn json_key_ignores_object_order_but_not_content() {
        let a = json!({"a": 1, "b": [1, 2]});
        let b = json!({"b": [1, 2], "a": 1});
        let c = json!({"b": [2, 1], "a": 1});
        assert_eq!(a.key_in(Bucket::Input), b.key_in(Bucket::Input));
        assert_ne!(a.key_in(Bucket::Input), c.key_in(Bucket::Input));
        assert_ne!(a.key_in(Bucket::Input), a.key_in(Bucket::Rubric));
    }

    #[test]
    fn length_prefix_prevents_concatenation_collisions() {
        let ab = vec!["ab".to_owned(), "c".to_owned()];
        let a_bc = vec!["a".to_owned(), "bc".to_owned()];
        assert_ne!(ab.key_in(Bucket::Input), a_bc.key_in(Bucket::Input));
        assert_ne!(
            Some(0u64).key_in(Bucket::Input),
            None::<u64>.key_in(Bucket::Input)
        );
    }
}
