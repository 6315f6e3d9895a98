//! The hierarchical witnessed fold.
//!
//! Leaves are per-unit outcomes in source order; nodes reduce at most
//! `fan_in` children. A node's key is the hash of the fold definition and its
//! children's keys, so a changed leaf changes exactly the keys on its path to
//! the root and only that path is recomputed. Every reducer (one file each
//! here, behind [`Reducer`]) is deterministic, associative and commutative
//! (sums are kept in fixed point, so adding is exact): reordering or
//! regrouping the leaves cannot change the root value (property-tested over
//! every reducer in `tests.rs`).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use fanfold_core::spec::{FoldSpec, ReducerSpec};
use fanfold_core::{Bucket, ContentHash, StableHash, StableHasher, Status, StatusCounts, UnitId};
use serde::{Deserialize, Serialize};
use serde_json::Value;

mod count;
mod count_by;
mod group_by;
mod histogram;
mod join;
mod min_max;
mod moments;
mod pairs;
mod ranked;
mod ratio;
mod reducer;
mod set;
#[cfg(test)]
mod tests;
mod top_k;
#[cfg(test)]
mod tree_tests;

pub use count::CountState;
pub use count_by::{CountByState, Group};
pub use group_by::{GroupByState, group_rows};
pub use histogram::HistogramState;
pub use join::JoinState;
pub use min_max::MinMaxState;
pub use moments::{FIXED, MomentsState, MomentsSummary, moments};
pub use pairs::{Members, Pair, PairsState, pairs};
pub use ranked::RankedState;
pub use ratio::{RatioState, wilson};
pub use reducer::{Agg, AggState, Reducer, Stated, cited, state};
pub use set::SetState;
pub use top_k::TopKState;

/// One unit's outcome at one stage, as the fold sees it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Leaf {
    pub unit_id: UnitId,
    pub stage: String,
    pub status: Status,
    /// The fact's output object, `null` when the unit has no decided fact.
    pub facts: Value,
    /// The unit's own fields the reducers read (`unit:/film`), keyed by
    /// that pointer; `null` when none is read.
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub unit: Value,
}

/// A reducer pointer with this prefix reads the unit's own record, not
/// the fact: `unit:/film` groups reviews by their film whatever the model
/// said.
pub const UNIT_POINTER: &str = "unit:";

/// The JSON pointer into the unit that `p` names, if it names one.
pub fn unit_pointer(p: &str) -> Option<&str> {
    p.strip_prefix(UNIT_POINTER)
}

impl Leaf {
    /// The value at a reducer's pointer: the fact's, or the unit's for a
    /// `unit:` pointer. Null counts as absent.
    pub fn at(&self, p: &str) -> Option<&Value> {
        let v = match unit_pointer(p) {
            Some(_) => self.unit.get(p),
            None => self.facts.pointer(p),
        };
        v.filter(|v| !v.is_null())
    }
}

impl StableHash for Leaf {
    fn stable_hash(&self, h: &mut StableHasher) {
        h.field("unit", &self.unit_id)
            .field("stage", &self.stage)
            .field("status", self.status.as_str())
            .field("facts", &self.facts);
        // Absent for most specs, so their fold keys stay as they were.
        if !self.unit.is_null() {
            h.field("unit_fields", &self.unit);
        }
    }
}

/// The value of a fold node: per-stage status counts (all six, always) and
/// one aggregate per reducer, plus how many leaves lacked a reducer's value.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FoldValue {
    pub leaves: u64,
    pub statuses: BTreeMap<String, StatusCounts>,
    pub reducers: BTreeMap<String, Agg>,
    pub missing: BTreeMap<String, u64>,
    /// For a reducer with a `dedupe`: each kept unit that near-duplicates
    /// were collapsed into, with their units. A collapsed leaf feeds the
    /// reducer nothing but its place here. Absent from the cached JSON of
    /// a fold without one.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub collapsed: BTreeMap<String, BTreeMap<UnitId, BTreeSet<UnitId>>>,
}

impl FoldValue {
    pub fn empty(spec: &FoldSpec) -> FoldValue {
        FoldValue {
            leaves: 0,
            statuses: BTreeMap::new(),
            reducers: spec
                .reducers
                .iter()
                .map(|r| (r.name.clone(), reducer::empty_agg(&r.kind)))
                .collect(),
            missing: BTreeMap::new(),
            collapsed: BTreeMap::new(),
        }
    }

    /// The value of a single leaf.
    pub fn of_leaf(spec: &FoldSpec, leaf: &Leaf) -> FoldValue {
        FoldValue::of_marked_leaf(spec, leaf, &[])
    }

    /// The value of a single leaf that the reducers named in `collapsed`
    /// (each with the unit it was collapsed into) do not count.
    pub fn of_marked_leaf(
        spec: &FoldSpec,
        leaf: &Leaf,
        collapsed: &[(String, UnitId)],
    ) -> FoldValue {
        let mut v = FoldValue::empty(spec);
        v.leaves = 1;
        v.statuses
            .entry(leaf.stage.clone())
            .or_default()
            .add(leaf.status, 1);
        for r in &spec.reducers {
            if !feeds(r, leaf) {
                continue;
            }
            if let Some((_, kept)) = collapsed.iter().find(|(name, _)| *name == r.name) {
                v.collapsed
                    .entry(r.name.clone())
                    .or_default()
                    .entry(kept.clone())
                    .or_default()
                    .insert(leaf.unit_id.clone());
                continue;
            }
            if let Some(agg) = v.reducers.get_mut(&r.name)
                && !reducer::update(&r.kind, agg, leaf)
            {
                *v.missing.entry(r.name.clone()).or_insert(0) += 1;
            }
        }
        v
    }

    pub fn merge(&mut self, other: &FoldValue) {
        self.leaves += other.leaves;
        for (stage, c) in &other.statuses {
            self.statuses.entry(stage.clone()).or_default().merge(c);
        }
        for (name, agg) in &other.reducers {
            match self.reducers.get_mut(name) {
                Some(mine) => mine.merge(agg),
                None => {
                    self.reducers.insert(name.clone(), agg.clone());
                }
            }
        }
        for (name, n) in &other.missing {
            *self.missing.entry(name.clone()).or_insert(0) += n;
        }
        for (name, groups) in &other.collapsed {
            let mine = self.collapsed.entry(name.clone()).or_default();
            for (kept, ids) in groups {
                mine.entry(kept.clone())
                    .or_default()
                    .extend(ids.iter().cloned());
            }
        }
    }

    /// All stages' status counts summed.
    pub fn total_statuses(&self) -> StatusCounts {
        let mut t = StatusCounts::default();
        for c in self.statuses.values() {
            t.merge(c);
        }
        t
    }
}

pub(crate) fn feeds(r: &ReducerSpec, leaf: &Leaf) -> bool {
    let stage_ok = r.stage.as_ref().is_none_or(|s| *s == leaf.stage);
    let status_ok = match &r.statuses {
        Some(list) => list.contains(&leaf.status),
        None => leaf.status == Status::Positive,
    };
    stage_ok && status_ok
}

/// Where fold nodes are cached between runs.
pub trait NodeCache {
    fn get(&mut self, key: &ContentHash) -> Option<FoldValue>;
    fn put(&mut self, key: &ContentHash, level: u32, value: &FoldValue);
}

/// A cache that remembers nothing: every node is computed.
pub struct NoCache;

impl NodeCache for NoCache {
    fn get(&mut self, _: &ContentHash) -> Option<FoldValue> {
        None
    }
    fn put(&mut self, _: &ContentHash, _: u32, _: &FoldValue) {}
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FoldOutcome {
    pub root: FoldValue,
    pub root_key: ContentHash,
    /// Levels above the leaves.
    pub depth: u32,
    pub nodes_computed: u64,
    pub nodes_reused: u64,
    /// For each leaf, in input order, the keys of the nodes it was reduced
    /// through (parent first, root last).
    pub paths: Vec<Vec<ContentHash>>,
}

/// A node of one level of the fold: its key, the anchor its group
/// boundary is decided by (its last leaf's identity) and, above the
/// leaves, its value.
struct Node {
    key: ContentHash,
    anchor: u64,
    value: Option<FoldValue>,
}

/// A leaf's identity as 64 bits: its unit and stage, never its content.
fn anchor(l: &Leaf) -> u64 {
    let mut h = StableHasher::new(Bucket::FoldLeaf);
    h.field("unit", &l.unit_id).field("stage", &l.stage);
    let key = h.finish();
    u64::from_le_bytes(key.0.first_chunk::<8>().copied().unwrap_or_default())
}

/// The groups of consecutive nodes of `level` that become the nodes of the
/// level above: a group ends after a node whose anchor is a boundary at
/// `depth` (one in `fan_in`), once it has two members, or when it has
/// `fan_in`. Every group but the last has at least two members, so each
/// level is smaller than the one below.
fn groups(level: &[Node], fan_in: usize, depth: u32) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::with_capacity(level.len() / 2 + 1);
    let mut start = 0;
    for (i, n) in level.iter().enumerate() {
        let len = i + 1 - start;
        // Mixed with the level, so a node that closes a group below need
        // not close one above as well.
        let mixed = (n.anchor ^ u64::from(depth).wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .wrapping_mul(0xBF58_476D_1CE4_E5B9);
        let boundary = len >= 2 && (mixed >> 32) % fan_in as u64 == 0;
        if boundary || len == fan_in {
            out.push(start..i + 1);
            start = i + 1;
        }
    }
    if start < level.len() {
        out.push(start..level.len());
    }
    out
}

/// The definition hash a fold's node keys start from.
pub fn fold_definition(spec: &FoldSpec) -> ContentHash {
    let mut h = StableHasher::new(Bucket::FoldDef);
    h.field("fan_in", &spec.fan_in);
    let reducers = serde_json::to_value(&spec.reducers).unwrap_or(Value::Null);
    h.field("reducers", &reducers);
    h.finish()
}

/// The key of a node of `depth` over `children`.
fn node_key(def: &ContentHash, depth: u32, children: &[Node]) -> ContentHash {
    let mut h = StableHasher::new(Bucket::FoldNode);
    h.field("def", def).field("level", &depth);
    let keys: Vec<ContentHash> = children.iter().map(|n| n.key).collect();
    h.field("children", &keys);
    h.finish()
}

/// The value of a node over `children`: their values merged, or at the
/// first level (where children hold no value) their `leaves`' values,
/// the first of which is leaf `first` of the fold.
fn node_value(
    spec: &FoldSpec,
    children: &[Node],
    leaves: &[Leaf],
    first: usize,
    marks: &Marks,
) -> FoldValue {
    let mut acc = FoldValue::empty(spec);
    for (i, child) in children.iter().enumerate() {
        match &child.value {
            Some(c) => acc.merge(c),
            None => {
                if let Some(l) = leaves.get(i) {
                    acc.merge(&FoldValue::of_marked_leaf(spec, l, marks.of(first + i)));
                }
            }
        }
    }
    acc
}

/// Reduces leaves (in the given order) through a tree of fan-in at most
/// `spec.fan_in`, reusing any node the cache already holds.
///
/// Where a node's group ends is decided by the identity of the leaves, not
/// their positions: a group closes after a node whose last leaf's (unit,
/// stage) hashes to a boundary at that level (one in `fan_in`, once the
/// group has two members), or when it holds `fan_in`. An edited fact keeps
/// every boundary, so it recomputes exactly one node per level; an inserted
/// or removed unit moves only the groups beside it, where grouping by
/// position would shift every group after it.
pub fn fold_tree(spec: &FoldSpec, leaves: &[Leaf], cache: &mut dyn NodeCache) -> FoldOutcome {
    let fan_in = spec.fan_in.max(2);
    let def = fold_definition(spec);
    // Near-duplicates are found over every leaf at once, before any node:
    // whether a leaf counts depends on the others, so its key says what
    // it was collapsed into.
    let marks = mark(spec, leaves);
    // Level 0: leaf keys and anchors only; a leaf's value is made when its
    // parent is computed, so memory holds one level of nodes, not one value
    // a leaf.
    let mut level: Vec<Node> = leaves
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let mut h = StableHasher::new(Bucket::FoldLeaf);
            h.field("def", &def).field("leaf", l);
            // Absent for most leaves, so their keys stay as they were.
            let into = marks.of(i);
            if !into.is_empty() {
                let into: Vec<Vec<String>> = into
                    .iter()
                    .map(|(r, kept)| vec![r.clone(), kept.0.clone()])
                    .collect();
                h.field("collapsed_into", &into);
            }
            Node {
                key: h.finish(),
                anchor: anchor(l),
                value: None,
            }
        })
        .collect();
    // owner[i] = index of the current-level node that leaf i sits under.
    let mut owner: Vec<usize> = (0..leaves.len()).collect();
    let mut paths: Vec<Vec<ContentHash>> = vec![Vec::new(); leaves.len()];
    let mut depth = 0u32;
    let (mut computed, mut reused) = (0u64, 0u64);
    if level.is_empty() {
        let root = FoldValue::empty(spec);
        let mut h = StableHasher::new(Bucket::FoldNode);
        h.field("def", &def).field("level", &0u32);
        return FoldOutcome {
            root,
            root_key: h.finish(),
            depth: 0,
            nodes_computed: 0,
            nodes_reused: 0,
            paths,
        };
    }
    while level.len() > 1 || depth == 0 {
        depth += 1;
        let groups = groups(&level, fan_in, depth);
        let mut parent_of = vec![0usize; level.len()];
        let mut next = Vec::with_capacity(groups.len());
        for (g, range) in groups.into_iter().enumerate() {
            let chunk = level.get(range.clone()).unwrap_or_default();
            for p in parent_of.get_mut(range.clone()).into_iter().flatten() {
                *p = g;
            }
            let key = node_key(&def, depth, chunk);
            let value = match cache.get(&key) {
                Some(v) => {
                    reused += 1;
                    v
                }
                None => {
                    // Leaf values are made only here, at the first level.
                    let below = leaves.get(range.clone()).filter(|_| depth == 1);
                    let acc =
                        node_value(spec, chunk, below.unwrap_or_default(), range.start, &marks);
                    cache.put(&key, depth, &acc);
                    computed += 1;
                    acc
                }
            };
            next.push(Node {
                key,
                anchor: chunk.last().map_or(0, |n| n.anchor),
                value: Some(value),
            });
        }
        for (leaf, o) in owner.iter_mut().enumerate() {
            *o = parent_of.get(*o).copied().unwrap_or(0);
            if let (Some(path), Some(node)) = (paths.get_mut(leaf), next.get(*o)) {
                path.push(node.key);
            }
        }
        level = next;
    }
    let (root_key, root) = level.pop().map_or((def, None), |n| (n.key, n.value));
    FoldOutcome {
        root: root.unwrap_or_else(|| FoldValue::empty(spec)),
        root_key,
        depth,
        nodes_computed: computed,
        nodes_reused: reused,
        paths,
    }
}

/// Reduces leaves in one flat pass, without a tree: the reference the tree
/// must agree with.
pub fn fold_flat(spec: &FoldSpec, leaves: &[Leaf]) -> FoldValue {
    let marks = mark(spec, leaves);
    let mut acc = FoldValue::empty(spec);
    for (i, l) in leaves.iter().enumerate() {
        acc.merge(&FoldValue::of_marked_leaf(spec, l, marks.of(i)));
    }
    acc
}

/// A value as the text a dedupe compares: a string as it is, anything
/// else as its compact JSON.
fn text_of(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Which leaves each reducer's `dedupe` collapsed, and into which unit.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Marks {
    /// Leaf index -> (reducer, the unit it is collapsed into).
    by_leaf: HashMap<usize, Vec<(String, UnitId)>>,
}

impl Marks {
    /// The reducers that leaf `i` is collapsed for, each with its kept
    /// unit; empty for most leaves.
    pub fn of(&self, i: usize) -> &[(String, UnitId)] {
        self.by_leaf.get(&i).map_or(&[], Vec::as_slice)
    }

    pub fn is_empty(&self) -> bool {
        self.by_leaf.is_empty()
    }
}

/// Runs every reducer's `dedupe` over the leaves that feed it.
pub fn mark(spec: &FoldSpec, leaves: &[Leaf]) -> Marks {
    let mut marks = Marks::default();
    for r in &spec.reducers {
        let Some(d) = &r.dedupe else {
            continue;
        };
        let fed: Vec<usize> = (0..leaves.len())
            .filter(|&i| leaves.get(i).is_some_and(|l| feeds(r, l)))
            .collect();
        let entries: Vec<crate::dedupe::Entry<'_>> = fed
            .iter()
            .filter_map(|&i| leaves.get(i))
            .map(|l| crate::dedupe::Entry {
                unit: &l.unit_id,
                stage: &l.stage,
                text: l.at(&d.field).map(text_of),
            })
            .collect();
        for (e, into) in crate::dedupe::collapse(d, &entries).into_iter().enumerate() {
            let (Some(&leaf), Some(kept)) = (fed.get(e), into.and_then(|k| entries.get(k))) else {
                continue;
            };
            marks
                .by_leaf
                .entry(leaf)
                .or_default()
                .push((r.name.clone(), kept.unit.clone()));
        }
    }
    marks
}
