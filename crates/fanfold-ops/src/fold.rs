//! The hierarchical witnessed fold.
//!
//! Leaves are per-unit outcomes in source order; nodes reduce at most
//! `fan_in` children. A node's key is the hash of the fold definition and its
//! children's keys, so a changed leaf changes exactly the keys on its path to
//! the root and only that path is recomputed. Every reducer here is
//! deterministic, associative and commutative (sums are kept in fixed
//! point, so adding is exact): reordering or regrouping the leaves cannot
//! change the root value (property-tested below).

use std::collections::{BTreeMap, BTreeSet};

use fanfold_core::spec::{FoldSpec, Order, ReducerKind, ReducerSpec, Relation};
use fanfold_core::{Bucket, ContentHash, StableHash, StableHasher, Status, StatusCounts, UnitId};
use serde::{Deserialize, Serialize};
use serde_json::Value;

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

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Group {
    pub count: u64,
    pub ids: BTreeSet<UnitId>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Agg {
    Count {
        n: u64,
    },
    CountBy {
        groups: BTreeMap<String, Group>,
    },
    Set {
        items: BTreeMap<String, BTreeSet<UnitId>>,
    },
    Histogram {
        edges: Vec<f64>,
        counts: Vec<u64>,
    },
    MinMax {
        min: Option<(f64, UnitId)>,
        max: Option<(f64, UnitId)>,
    },
    Join {
        keys: BTreeMap<String, BTreeMap<String, BTreeSet<UnitId>>>,
    },
    TopK {
        k: usize,
        items: Vec<(f64, UnitId, String)>,
    },
    /// A `set` with a `limit`: its first units, each with its number at
    /// `order_by` (0 without one) and its value, in [`rank`] order.
    Ranked {
        limit: usize,
        items: Vec<(f64, UnitId, String)>,
    },
    /// A sum and a mean: the count, the sum and the sum of squares, each
    /// in fixed point (`FIXED` units to one) so that adding them is exact
    /// and so associative; the units that fed them.
    Moments {
        n: u64,
        #[serde(with = "wide")]
        sum: i128,
        /// `None` once it no longer fits: the standard error is then
        /// not given.
        #[serde(with = "wide_option")]
        sum_sq: Option<i128>,
        ids: BTreeSet<UnitId>,
    },
    /// A ratio: the units on each side.
    Ratio {
        numerator: BTreeSet<UnitId>,
        denominator: BTreeSet<UnitId>,
    },
    /// One aggregate per group key.
    GroupBy {
        groups: BTreeMap<String, Agg>,
    },
    /// Every unit (and the stage whose fact it is) with its value at
    /// `value`, by key: the pairs follow from them at the end
    /// ([`pairs`]).
    Pairs {
        #[serde(with = "members")]
        members: BTreeMap<String, BTreeMap<(UnitId, String), Value>>,
    },
}

/// Fixed-point sums as decimal text: JSON numbers (and `serde_json`'s
/// `Value`) hold no more than 64 bits, and a sum of squares of 5 in fixed
/// point is already 2.5e19.
mod wide {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(x: &i128, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&x.to_string())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<i128, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// A pairs aggregate's members as JSON, whose object keys are strings
/// only: each key's members as a list of `[unit, stage, value]`.
mod members {
    use std::collections::BTreeMap;

    use fanfold_core::UnitId;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use serde_json::Value;

    type Members = BTreeMap<String, BTreeMap<(UnitId, String), Value>>;

    pub fn serialize<S: Serializer>(m: &Members, s: S) -> Result<S::Ok, S::Error> {
        let listed: BTreeMap<&String, Vec<(&UnitId, &String, &Value)>> = m
            .iter()
            .map(|(k, units)| (k, units.iter().map(|((u, st), v)| (u, st, v)).collect()))
            .collect();
        listed.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Members, D::Error> {
        let listed = BTreeMap::<String, Vec<(UnitId, String, Value)>>::deserialize(d)?;
        Ok(listed
            .into_iter()
            .map(|(k, units)| {
                (
                    k,
                    units.into_iter().map(|(u, st, v)| ((u, st), v)).collect(),
                )
            })
            .collect())
    }
}

mod wide_option {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(x: &Option<i128>, s: S) -> Result<S::Ok, S::Error> {
        match x {
            Some(x) => s.serialize_some(&x.to_string()),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i128>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|t| t.parse().map_err(serde::de::Error::custom))
            .transpose()
    }
}

/// Fixed-point units per one: sums are exact to 1e-9.
pub const FIXED: f64 = 1e9;

/// The largest magnitude a summed number may have: beyond it the fixed
/// point could not hold the sum of its square.
const MAX_SUMMED: f64 = 1e9;

/// The value of a fold node: per-stage status counts (all six, always) and
/// one aggregate per reducer, plus how many leaves lacked a reducer's value.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FoldValue {
    pub leaves: u64,
    pub statuses: BTreeMap<String, StatusCounts>,
    pub reducers: BTreeMap<String, Agg>,
    pub missing: BTreeMap<String, u64>,
}

fn empty_agg(kind: &ReducerKind) -> Agg {
    match kind {
        ReducerKind::Count => Agg::Count { n: 0 },
        ReducerKind::CountBy { .. } => Agg::CountBy {
            groups: BTreeMap::new(),
        },
        ReducerKind::Set {
            limit: Some(limit), ..
        } => Agg::Ranked {
            limit: *limit,
            items: Vec::new(),
        },
        ReducerKind::Set { .. } => Agg::Set {
            items: BTreeMap::new(),
        },
        ReducerKind::Histogram { edges, .. } => Agg::Histogram {
            edges: edges.clone(),
            counts: vec![0; edges.len() + 1],
        },
        ReducerKind::MinMax { .. } => Agg::MinMax {
            min: None,
            max: None,
        },
        ReducerKind::Join { .. } => Agg::Join {
            keys: BTreeMap::new(),
        },
        ReducerKind::TopK { k, .. } => Agg::TopK {
            k: *k,
            items: Vec::new(),
        },
        ReducerKind::Sum { .. } | ReducerKind::Mean { .. } => Agg::Moments {
            n: 0,
            sum: 0,
            sum_sq: Some(0),
            ids: BTreeSet::new(),
        },
        ReducerKind::Ratio { .. } => Agg::Ratio {
            numerator: BTreeSet::new(),
            denominator: BTreeSet::new(),
        },
        ReducerKind::GroupBy { .. } => Agg::GroupBy {
            groups: BTreeMap::new(),
        },
        ReducerKind::Pairs { .. } => Agg::Pairs {
            members: BTreeMap::new(),
        },
    }
}

fn as_key(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Orders top-k entries: higher score first, then smaller unit id, then
/// stage name. A total order, so the k best of any grouping agree.
fn rank(a: &(f64, UnitId, String), b: &(f64, UnitId, String)) -> std::cmp::Ordering {
    b.0.total_cmp(&a.0)
        .then_with(|| a.1.cmp(&b.1))
        .then_with(|| a.2.cmp(&b.2))
}

fn better_min(new: &(f64, UnitId), old: &(f64, UnitId)) -> bool {
    new.0
        .total_cmp(&old.0)
        .then_with(|| new.1.cmp(&old.1))
        .is_lt()
}

fn better_max(new: &(f64, UnitId), old: &(f64, UnitId)) -> bool {
    new.0
        .total_cmp(&old.0)
        .then_with(|| old.1.cmp(&new.1))
        .is_gt()
}

impl Agg {
    /// Folds `other` into `self`. Both come from the same reducer spec.
    pub fn merge(&mut self, other: &Agg) {
        match (self, other) {
            (Agg::Count { n }, Agg::Count { n: m }) => *n += m,
            (Agg::CountBy { groups }, Agg::CountBy { groups: g2 }) => {
                for (k, g) in g2 {
                    let e = groups.entry(k.clone()).or_insert_with(|| Group {
                        count: 0,
                        ids: BTreeSet::new(),
                    });
                    e.count += g.count;
                    e.ids.extend(g.ids.iter().cloned());
                }
            }
            (Agg::Set { items }, Agg::Set { items: i2 }) => {
                for (k, ids) in i2 {
                    items
                        .entry(k.clone())
                        .or_default()
                        .extend(ids.iter().cloned());
                }
            }
            (Agg::Histogram { counts, .. }, Agg::Histogram { counts: c2, .. }) => {
                for (a, b) in counts.iter_mut().zip(c2) {
                    *a += b;
                }
            }
            (Agg::MinMax { min, max }, Agg::MinMax { min: m2, max: x2 }) => {
                if let Some(n) = m2
                    && min.as_ref().is_none_or(|o| better_min(n, o))
                {
                    *min = Some(n.clone());
                }
                if let Some(n) = x2
                    && max.as_ref().is_none_or(|o| better_max(n, o))
                {
                    *max = Some(n.clone());
                }
            }
            (Agg::Join { keys }, Agg::Join { keys: k2 }) => {
                for (k, stages) in k2 {
                    let e = keys.entry(k.clone()).or_default();
                    for (s, ids) in stages {
                        e.entry(s.clone()).or_default().extend(ids.iter().cloned());
                    }
                }
            }
            (Agg::TopK { k: limit, items }, Agg::TopK { items: i2, .. })
            | (Agg::Ranked { limit, items }, Agg::Ranked { items: i2, .. }) => {
                items.extend(i2.iter().cloned());
                items.sort_by(rank);
                items.truncate(*limit);
            }
            (
                Agg::Moments {
                    n,
                    sum,
                    sum_sq,
                    ids,
                },
                Agg::Moments {
                    n: n2,
                    sum: s2,
                    sum_sq: q2,
                    ids: i2,
                },
            ) => {
                *n += n2;
                *sum = sum.saturating_add(*s2);
                // Squares are never negative: the total overflows in any
                // order exactly when it overflows in one.
                *sum_sq = sum_sq.zip(*q2).and_then(|(a, b)| a.checked_add(b));
                ids.extend(i2.iter().cloned());
            }
            (
                Agg::Ratio {
                    numerator,
                    denominator,
                },
                Agg::Ratio {
                    numerator: n2,
                    denominator: d2,
                },
            ) => {
                numerator.extend(n2.iter().cloned());
                denominator.extend(d2.iter().cloned());
            }
            (Agg::GroupBy { groups }, Agg::GroupBy { groups: g2 }) => {
                for (k, agg) in g2 {
                    match groups.get_mut(k) {
                        Some(mine) => mine.merge(agg),
                        None => {
                            groups.insert(k.clone(), agg.clone());
                        }
                    }
                }
            }
            (Agg::Pairs { members }, Agg::Pairs { members: m2 }) => {
                for (k, units) in m2 {
                    members
                        .entry(k.clone())
                        .or_default()
                        .extend(units.iter().map(|(u, v)| (u.clone(), v.clone())));
                }
            }
            // Reducers are built from one spec, so kinds always line up.
            _ => {}
        }
    }
}

impl FoldValue {
    pub fn empty(spec: &FoldSpec) -> FoldValue {
        FoldValue {
            leaves: 0,
            statuses: BTreeMap::new(),
            reducers: spec
                .reducers
                .iter()
                .map(|r| (r.name.clone(), empty_agg(&r.kind)))
                .collect(),
            missing: BTreeMap::new(),
        }
    }

    /// The value of a single leaf.
    pub fn of_leaf(spec: &FoldSpec, leaf: &Leaf) -> FoldValue {
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
            if let Some(agg) = v.reducers.get_mut(&r.name)
                && !apply(&r.kind, agg, leaf)
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

fn feeds(r: &ReducerSpec, leaf: &Leaf) -> bool {
    let stage_ok = r.stage.as_ref().is_none_or(|s| *s == leaf.stage);
    let status_ok = match &r.statuses {
        Some(list) => list.contains(&leaf.status),
        None => leaf.status == Status::Positive,
    };
    stage_ok && status_ok
}

/// Adds one leaf to an aggregate; false when the leaf lacks the value.
fn apply(kind: &ReducerKind, agg: &mut Agg, leaf: &Leaf) -> bool {
    let id = leaf.unit_id.clone();
    let at = |p: &str| leaf.at(p);
    match (kind, agg) {
        (ReducerKind::Count, Agg::Count { n }) => *n += 1,
        (ReducerKind::CountBy { key }, Agg::CountBy { groups }) => {
            let Some(k) = at(key) else { return false };
            let g = groups.entry(as_key(k)).or_insert_with(|| Group {
                count: 0,
                ids: BTreeSet::new(),
            });
            g.count += 1;
            g.ids.insert(id);
        }
        (
            ReducerKind::Set {
                value, order_by, ..
            },
            Agg::Ranked { limit, items },
        ) => {
            let shown = match value {
                None => id.0.clone(),
                Some(p) => match at(p) {
                    Some(v) => as_key(v),
                    None => return false,
                },
            };
            let score = match order_by {
                None => 0.0,
                Some(p) => match at(p).and_then(Value::as_f64) {
                    Some(x) => x,
                    None => return false,
                },
            };
            if *limit > 0 {
                items.push((score, id, shown));
            }
        }
        (ReducerKind::Set { value, .. }, Agg::Set { items }) => {
            let k = match value {
                None => id.0.clone(),
                Some(p) => match at(p) {
                    Some(v) => as_key(v),
                    None => return false,
                },
            };
            items.entry(k).or_default().insert(id);
        }
        (ReducerKind::Histogram { value, edges }, Agg::Histogram { counts, .. }) => {
            let Some(x) = at(value).and_then(Value::as_f64) else {
                return false;
            };
            let bucket = edges.partition_point(|e| *e <= x);
            if let Some(c) = counts.get_mut(bucket) {
                *c += 1;
            }
        }
        (ReducerKind::MinMax { value }, Agg::MinMax { min, max }) => {
            let Some(x) = at(value).and_then(Value::as_f64) else {
                return false;
            };
            *min = Some((x, id.clone()));
            *max = Some((x, id));
        }
        (ReducerKind::Join { key }, Agg::Join { keys }) => {
            let Some(k) = at(key) else { return false };
            keys.entry(as_key(k))
                .or_default()
                .entry(leaf.stage.clone())
                .or_default()
                .insert(id);
        }
        (ReducerKind::TopK { score, .. }, Agg::TopK { k, items }) => {
            let Some(x) = at(score).and_then(Value::as_f64) else {
                return false;
            };
            if *k > 0 {
                items.push((x, id, leaf.stage.clone()));
            }
        }
        (
            ReducerKind::Sum { value } | ReducerKind::Mean { value },
            Agg::Moments {
                n,
                sum,
                sum_sq,
                ids,
            },
        ) => {
            let Some(x) = at(value)
                .and_then(Value::as_f64)
                .filter(|x| x.is_finite() && x.abs() <= MAX_SUMMED)
            else {
                return false;
            };
            let fixed = (x * FIXED).round() as i128;
            *n += 1;
            *sum = sum.saturating_add(fixed);
            *sum_sq = sum_sq.and_then(|q| q.checked_add(fixed.saturating_mul(fixed)));
            ids.insert(id);
        }
        (
            ReducerKind::Ratio {
                pointer,
                numerator: num,
                denominator: den,
            },
            Agg::Ratio {
                numerator,
                denominator,
            },
        ) => {
            let Some(v) = at(pointer).map(as_key) else {
                return false;
            };
            if num.contains(&v) {
                numerator.insert(id);
            } else if den.contains(&v) {
                denominator.insert(id);
            } else {
                return false;
            }
        }
        (ReducerKind::GroupBy { key, reduce, .. }, Agg::GroupBy { groups }) => {
            let Some(k) = at(key).map(as_key) else {
                return false;
            };
            // A group holds only what fed it: a leaf without the inner
            // value opens no group.
            if let Some(inner) = groups.get_mut(&k) {
                return apply(reduce, inner, leaf);
            }
            let mut inner = empty_agg(reduce);
            if !apply(reduce, &mut inner, leaf) {
                return false;
            }
            groups.insert(k, inner);
        }
        (ReducerKind::Pairs { key, value, .. }, Agg::Pairs { members }) => {
            let (Some(k), Some(v)) = (at(key).map(as_key), at(value).cloned()) else {
                return false;
            };
            members
                .entry(k)
                .or_default()
                .insert((id, leaf.stage.clone()), v);
        }
        _ => return false,
    }
    true
}

/// A sum or mean as the answer states it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct MomentsSummary {
    pub n: u64,
    pub sum: f64,
    /// `None` over no facts.
    pub mean: Option<f64>,
    /// The standard error of the mean; `None` under two facts or when the
    /// squares no longer fit.
    pub standard_error: Option<f64>,
}

/// Summarizes the fixed-point moments.
pub fn moments(n: u64, sum: i128, sum_sq: Option<i128>) -> MomentsSummary {
    let total = sum as f64 / FIXED;
    // One division of the exact sum: 0.1, 0.2 and 0.3 average to 0.2.
    let mean = (n > 0).then(|| sum as f64 / (n as f64 * FIXED));
    let standard_error = match (mean, sum_sq) {
        (Some(m), Some(q)) if n >= 2 => {
            let squares = q as f64 / (FIXED * FIXED);
            let var = ((squares - n as f64 * m * m) / (n - 1) as f64).max(0.0);
            Some((var / n as f64).sqrt())
        }
        _ => None,
    };
    MomentsSummary {
        n,
        sum: total,
        mean,
        standard_error,
    }
}

/// The 95 % Wilson score interval of `k` successes in `n` trials.
pub fn wilson(k: u64, n: u64) -> (f64, f64) {
    if n == 0 {
        return (0.0, 1.0);
    }
    let z = 1.959_963_984_540_054_f64;
    let (k, n) = (k as f64, n as f64);
    let p = k / n;
    let z2 = z * z;
    let centre = (p + z2 / (2.0 * n)) / (1.0 + z2 / n);
    let half = z * ((p * (1.0 - p) + z2 / (4.0 * n)) / n).sqrt() / (1.0 + z2 / n);
    ((centre - half).max(0.0), (centre + half).min(1.0))
}

impl Agg {
    /// The one number an aggregate of `kind` states: what a `group_by`
    /// orders its rows by. `None` for the kinds that state no one number.
    pub fn number(&self, kind: &ReducerKind) -> Option<f64> {
        match (kind, self) {
            (_, Agg::Count { n }) => Some(*n as f64),
            (ReducerKind::Sum { .. }, Agg::Moments { n, sum, sum_sq, .. }) => {
                Some(moments(*n, *sum, *sum_sq).sum)
            }
            (ReducerKind::Mean { .. }, Agg::Moments { n, sum, sum_sq, .. }) => {
                moments(*n, *sum, *sum_sq).mean
            }
            (
                _,
                Agg::Ratio {
                    numerator,
                    denominator,
                },
            ) => {
                let all = numerator.len() + denominator.len();
                (all > 0).then(|| numerator.len() as f64 / all as f64)
            }
            (_, Agg::CountBy { groups }) => {
                Some(groups.values().map(|g| g.count).sum::<u64>() as f64)
            }
            (_, Agg::Set { items }) => Some(items.len() as f64),
            (_, Agg::Ranked { items, .. }) => Some(items.len() as f64),
            _ => None,
        }
    }
}

/// The rows of a `group_by`, in its order and cut to its limit: each key
/// with its aggregate and number.
pub fn group_rows<'a>(
    groups: &'a BTreeMap<String, Agg>,
    reduce: &ReducerKind,
    order: Order,
    limit: Option<usize>,
) -> Vec<(&'a str, &'a Agg, Option<f64>)> {
    let mut rows: Vec<(&str, &Agg, Option<f64>)> = groups
        .iter()
        .map(|(k, a)| (k.as_str(), a, a.number(reduce)))
        .collect();
    if order != Order::Key {
        // A row without a number goes last either way; ties by key.
        rows.sort_by(|a, b| {
            a.2.is_none()
                .cmp(&b.2.is_none())
                .then_with(|| match (a.2, b.2) {
                    (Some(x), Some(y)) if order == Order::Asc => x.total_cmp(&y),
                    (Some(x), Some(y)) => y.total_cmp(&x),
                    _ => std::cmp::Ordering::Equal,
                })
                .then_with(|| a.0.cmp(b.0))
        });
    }
    if let Some(n) = limit {
        rows.truncate(n);
    }
    rows
}

/// One pair of units that share a key, each with the stage whose fact
/// gave its value.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Pair {
    pub key: String,
    pub a: UnitId,
    pub a_stage: String,
    pub a_value: String,
    pub b: UnitId,
    pub b_stage: String,
    pub b_value: String,
}

/// The pairs `members` hold under `relation`, the first `limit` or all,
/// in a stable order that spreads them: the keys take turns, and within a
/// key the pairs whose units no earlier pair of that key used come first
/// (each key's pairs otherwise by the first unit's id, then the
/// second's). So ten pairs from six films name twenty reviews where they
/// can, not one review ten times. A jq relation that fails on a pair does
/// not hold there; the first such error comes back beside the pairs, with
/// how many pairs it struck.
pub fn pairs(
    members: &BTreeMap<String, BTreeMap<(UnitId, String), Value>>,
    relation: &Relation,
    limit: Option<usize>,
) -> (Vec<Pair>, Option<(u64, String)>) {
    let predicate = match relation {
        Relation::Jq(source) => match crate::jq::JqProgram::compile(source) {
            Ok(p) => Some(p),
            // Refused at plan time; a fold read back from an older spec
            // still says why it has no pairs.
            Err(e) => return (Vec::new(), Some((0, e.to_string()))),
        },
        _ => None,
    };
    let mut failed: Option<(u64, String)> = None;
    let mut holds =
        |key: &str, a: &UnitId, av: &Value, b: &UnitId, bv: &Value| match (relation, &predicate) {
            (Relation::Equal, _) => as_key(av) == as_key(bv),
            (Relation::Different, _) => as_key(av) != as_key(bv),
            (Relation::Jq(_), Some(p)) => {
                let input = serde_json::json!({"key": key, "a": av, "b": bv});
                let unit = format!("{} and {}", a.0, b.0);
                match p.test_bool(
                    crate::jq::to_val(&input),
                    crate::jq::Site::new("pairs relation", &unit),
                ) {
                    Ok(holds) => holds,
                    Err(e) => {
                        let f = failed.get_or_insert_with(|| (0, e.to_string()));
                        f.0 += 1;
                        false
                    }
                }
            }
            (Relation::Jq(_), None) => false,
        };
    // Each key's pairs, those with fresh units first; no key can give
    // more than `limit` to the turns.
    let cap = limit.unwrap_or(usize::MAX);
    let mut per_key: Vec<std::collections::VecDeque<Pair>> = Vec::new();
    for (key, units) in members {
        let list: Vec<(&(UnitId, String), &Value)> = units.iter().collect();
        let mut fresh = Vec::new();
        let mut rest = Vec::new();
        let mut used: BTreeSet<&UnitId> = BTreeSet::new();
        'scan: for (i, ((a, a_stage), av)) in list.iter().enumerate() {
            for ((b, b_stage), bv) in list.iter().skip(i + 1) {
                // Two stages' facts of one unit are not a pair.
                if a == b || !holds(key, a, av, b, bv) {
                    continue;
                }
                let pair = Pair {
                    key: key.clone(),
                    a: a.clone(),
                    a_stage: a_stage.clone(),
                    a_value: as_key(av),
                    b: b.clone(),
                    b_stage: b_stage.clone(),
                    b_value: as_key(bv),
                };
                if !used.contains(a) && !used.contains(b) {
                    used.insert(a);
                    used.insert(b);
                    fresh.push(pair);
                    if fresh.len() >= cap {
                        break 'scan;
                    }
                } else {
                    rest.push(pair);
                }
            }
        }
        fresh.extend(rest);
        fresh.truncate(cap);
        per_key.push(fresh.into());
    }
    let mut out = Vec::new();
    while out.len() < cap && per_key.iter().any(|q| !q.is_empty()) {
        for q in &mut per_key {
            if out.len() >= cap {
                break;
            }
            if let Some(p) = q.pop_front() {
                out.push(p);
            }
        }
    }
    (out, failed)
}

/// What one reducer's aggregate says, as the answer shows it: a sentence
/// and, where it has rows, a table of text cells.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Stated {
    pub statement: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub columns: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rows: Vec<Vec<String>>,
}

/// At most this many ids are listed in one cell.
const LISTED: usize = 5;

fn listed<'a>(ids: impl IntoIterator<Item = &'a UnitId>) -> String {
    let all: Vec<&str> = ids.into_iter().map(|i| i.0.as_str()).collect();
    let mut out = all
        .iter()
        .take(LISTED)
        .map(|i| format!("#{i}"))
        .collect::<Vec<_>>()
        .join(", ");
    if all.len() > LISTED {
        out.push_str(&format!(" and {} more", all.len() - LISTED));
    }
    out
}

fn number(x: f64) -> String {
    let r = (x * 1e4).round() / 1e4;
    format!("{r}")
}

/// States the aggregate of a reducer of `kind`.
pub fn state(kind: &ReducerKind, agg: &Agg) -> Stated {
    let table = |statement: String, columns: &[&str], rows: Vec<Vec<String>>| Stated {
        statement,
        columns: columns.iter().map(|c| (*c).to_owned()).collect(),
        rows,
    };
    match (kind, agg) {
        (_, Agg::Count { n }) => table(format!("{n} facts"), &[], Vec::new()),
        (_, Agg::CountBy { groups }) => {
            let mut g: Vec<(&String, &Group)> = groups.iter().collect();
            g.sort_by(|a, b| b.1.count.cmp(&a.1.count).then_with(|| a.0.cmp(b.0)));
            // The counts themselves, so a grouped `count_by` row reads
            // "positive 11, negative 9".
            let counts: Vec<String> = g.iter().map(|(k, g)| format!("{k} {}", g.count)).collect();
            table(
                counts.join(", "),
                &["key", "facts", "units"],
                g.into_iter()
                    .map(|(k, g)| vec![k.clone(), g.count.to_string(), listed(&g.ids)])
                    .collect(),
            )
        }
        (_, Agg::Set { items }) => table(
            format!("{} distinct values", items.len()),
            &["value", "units"],
            items
                .iter()
                .map(|(v, ids)| vec![v.clone(), listed(ids)])
                .collect(),
        ),
        (_, Agg::Histogram { edges, counts }) => {
            let bucket =
                |i: usize| match (i.checked_sub(1).and_then(|j| edges.get(j)), edges.get(i)) {
                    (None, Some(hi)) => format!("< {hi}"),
                    (Some(lo), Some(hi)) => format!("{lo} to < {hi}"),
                    (Some(lo), None) => format!("≥ {lo}"),
                    (None, None) => "all".to_owned(),
                };
            table(
                format!("{} values", counts.iter().sum::<u64>()),
                &["bucket", "count"],
                counts
                    .iter()
                    .enumerate()
                    .map(|(i, c)| vec![bucket(i), c.to_string()])
                    .collect(),
            )
        }
        (_, Agg::MinMax { min, max }) => match (min, max) {
            (Some((lo, a)), Some((hi, b))) => table(
                format!(
                    "from {} (#{}) to {} (#{})",
                    number(*lo),
                    a.0,
                    number(*hi),
                    b.0
                ),
                &[],
                Vec::new(),
            ),
            _ => table("no values".into(), &[], Vec::new()),
        },
        (_, Agg::Join { keys }) => table(
            format!("{} keys", keys.len()),
            &["key", "units by stage"],
            keys.iter()
                .map(|(k, stages)| {
                    let by: Vec<String> = stages
                        .iter()
                        .map(|(s, ids)| format!("{s}: {}", listed(ids)))
                        .collect();
                    vec![k.clone(), by.join("; ")]
                })
                .collect(),
        ),
        (_, Agg::Ranked { items, limit }) => table(
            format!(
                "{} units{}",
                items.len(),
                if items.len() >= *limit {
                    format!(" (the first {limit})")
                } else {
                    String::new()
                }
            ),
            &["rank", "unit", "value", "order"],
            items
                .iter()
                .enumerate()
                .map(|(n, (x, id, v))| {
                    vec![
                        (n + 1).to_string(),
                        format!("#{}", id.0),
                        v.clone(),
                        number(*x),
                    ]
                })
                .collect(),
        ),
        (_, Agg::TopK { items, .. }) => table(
            format!("the {} highest", items.len()),
            &["rank", "unit", "score"],
            items
                .iter()
                .enumerate()
                .map(|(n, (x, id, _))| vec![(n + 1).to_string(), format!("#{}", id.0), number(*x)])
                .collect(),
        ),
        (
            ReducerKind::Mean { .. },
            Agg::Moments {
                n,
                sum,
                sum_sq,
                ids,
            },
        ) => {
            let m = moments(*n, *sum, *sum_sq);
            let statement = match (m.mean, m.standard_error) {
                (Some(mean), Some(se)) => format!(
                    "mean {} ± {} (standard error) over {n} facts: {}",
                    number(mean),
                    number(se),
                    listed(ids)
                ),
                (Some(mean), None) => {
                    format!("mean {} over {n} facts: {}", number(mean), listed(ids))
                }
                (None, _) => "no values".to_owned(),
            };
            table(statement, &[], Vec::new())
        }
        (
            _,
            Agg::Moments {
                n,
                sum,
                sum_sq,
                ids,
            },
        ) => table(
            format!(
                "sum {} over {n} facts: {}",
                number(moments(*n, *sum, *sum_sq).sum),
                listed(ids)
            ),
            &[],
            Vec::new(),
        ),
        (
            _,
            Agg::Ratio {
                numerator,
                denominator,
            },
        ) => {
            let k = numerator.len() as u64;
            let all = k + denominator.len() as u64;
            let (lo, hi) = wilson(k, all);
            let statement = if all == 0 {
                "no values on either side".to_owned()
            } else {
                format!(
                    "{} ({k} of {all}; 95 % Wilson interval {} to {})",
                    number(k as f64 / all as f64),
                    number(lo),
                    number(hi)
                )
            };
            table(statement, &[], Vec::new())
        }
        (
            ReducerKind::GroupBy {
                reduce,
                order,
                limit,
                ..
            },
            Agg::GroupBy { groups },
        ) => {
            let rows = group_rows(groups, reduce, *order, *limit);
            table(
                format!(
                    "{} of {} groups, by {} ({})",
                    rows.len(),
                    groups.len(),
                    reduce.type_name(),
                    match order {
                        Order::Desc => "largest first",
                        Order::Asc => "smallest first",
                        Order::Key => "by key",
                    }
                ),
                &["key", reduce.type_name(), "stated"],
                rows.into_iter()
                    .map(|(k, a, x)| {
                        vec![
                            k.to_owned(),
                            x.map(number).unwrap_or_else(|| "-".into()),
                            state(reduce, a).statement,
                        ]
                    })
                    .collect(),
            )
        }
        (
            ReducerKind::Pairs {
                relation, limit, ..
            },
            Agg::Pairs { members },
        ) => {
            let (found, failed) = pairs(members, relation, *limit);
            table(
                format!(
                    "{} pairs{}{}",
                    found.len(),
                    match limit {
                        Some(n) if found.len() >= *n => format!(" (the first {n})"),
                        _ => String::new(),
                    },
                    match failed {
                        Some((n, e)) => format!("; the relation failed on {n} pairs: {e}"),
                        None => String::new(),
                    }
                ),
                &["key", "unit", "value", "unit", "value"],
                found
                    .into_iter()
                    .map(|p| {
                        vec![
                            p.key,
                            format!("#{}", p.a.0),
                            p.a_value,
                            format!("#{}", p.b.0),
                            p.b_value,
                        ]
                    })
                    .collect(),
            )
        }
        _ => Stated::default(),
    }
}

/// The units whose facts an aggregate's statement rests on: what verify
/// reads back and an answer naming the reducer cites. A `count` and a
/// `histogram` keep no ids; a `group_by` cites the rows it shows, a
/// `pairs` the pairs it lists.
pub fn cited(kind: &ReducerKind, agg: &Agg) -> BTreeSet<UnitId> {
    match (kind, agg) {
        (_, Agg::Count { .. } | Agg::Histogram { .. }) => BTreeSet::new(),
        (_, Agg::CountBy { groups }) => groups.values().flat_map(|g| g.ids.clone()).collect(),
        (_, Agg::Set { items }) => items.values().flatten().cloned().collect(),
        (_, Agg::Ranked { items, .. } | Agg::TopK { items, .. }) => {
            items.iter().map(|(_, id, _)| id.clone()).collect()
        }
        (_, Agg::MinMax { min, max }) => min.iter().chain(max).map(|(_, id)| id.clone()).collect(),
        (_, Agg::Join { keys }) => keys
            .values()
            .flat_map(|stages| stages.values().flatten().cloned())
            .collect(),
        (_, Agg::Moments { ids, .. }) => ids.clone(),
        (
            _,
            Agg::Ratio {
                numerator,
                denominator,
            },
        ) => numerator.union(denominator).cloned().collect(),
        (
            ReducerKind::GroupBy {
                reduce,
                order,
                limit,
                ..
            },
            Agg::GroupBy { groups },
        ) => group_rows(groups, reduce, *order, *limit)
            .into_iter()
            .flat_map(|(_, a, _)| cited(reduce, a))
            .collect(),
        (
            ReducerKind::Pairs {
                relation, limit, ..
            },
            Agg::Pairs { members },
        ) => pairs(members, relation, *limit)
            .0
            .into_iter()
            .flat_map(|p| [p.a, p.b])
            .collect(),
        _ => BTreeSet::new(),
    }
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
    // Level 0: leaf keys and anchors only; a leaf's value is made when its
    // parent is computed, so memory holds one level of nodes, not one value
    // a leaf.
    let mut level: Vec<Node> = leaves
        .iter()
        .map(|l| {
            let mut h = StableHasher::new(Bucket::FoldLeaf);
            h.field("def", &def).field("leaf", l);
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
            let mut h = StableHasher::new(Bucket::FoldNode);
            h.field("def", &def).field("level", &depth);
            let keys: Vec<ContentHash> = chunk.iter().map(|n| n.key).collect();
            h.field("children", &keys);
            let key = h.finish();
            let value = match cache.get(&key) {
                Some(v) => {
                    reused += 1;
                    v
                }
                None => {
                    let mut acc = FoldValue::empty(spec);
                    for (i, child) in chunk.iter().enumerate() {
                        match &child.value {
                            Some(c) => acc.merge(c),
                            None => {
                                if let Some(l) = leaves.get(range.start + i).filter(|_| depth == 1)
                                {
                                    acc.merge(&FoldValue::of_leaf(spec, l));
                                }
                            }
                        }
                    }
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
    let mut acc = FoldValue::empty(spec);
    for l in leaves {
        acc.merge(&FoldValue::of_leaf(spec, l));
    }
    acc
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;
    use std::collections::HashMap;

    fn spec(fan_in: usize) -> FoldSpec {
        let r = |name: &str, kind: ReducerKind| ReducerSpec {
            name: name.into(),
            stage: None,
            statuses: None,
            kind,
        };
        FoldSpec {
            fan_in,
            reducers: vec![
                r("n", ReducerKind::Count),
                r(
                    "by_cause",
                    ReducerKind::CountBy {
                        key: "/cause".into(),
                    },
                ),
                r(
                    "ids",
                    ReducerKind::Set {
                        value: None,
                        order_by: None,
                        limit: None,
                    },
                ),
                r(
                    "hist",
                    ReducerKind::Histogram {
                        value: "/score".into(),
                        edges: vec![0.25, 0.5, 0.75],
                    },
                ),
                r(
                    "range",
                    ReducerKind::MinMax {
                        value: "/score".into(),
                    },
                ),
                r(
                    "join",
                    ReducerKind::Join {
                        key: "/cause".into(),
                    },
                ),
                r(
                    "top",
                    ReducerKind::TopK {
                        score: "/score".into(),
                        k: 3,
                    },
                ),
                ReducerSpec {
                    name: "all".into(),
                    stage: None,
                    statuses: Some(Status::ALL.to_vec()),
                    kind: ReducerKind::Count,
                },
                r(
                    "total",
                    ReducerKind::Sum {
                        value: "/score".into(),
                    },
                ),
                r(
                    "mean",
                    ReducerKind::Mean {
                        value: "/score".into(),
                    },
                ),
                r(
                    "share_x",
                    ReducerKind::Ratio {
                        pointer: "/cause".into(),
                        numerator: vec!["x".into()],
                        denominator: vec!["y".into(), "z".into()],
                    },
                ),
                r(
                    "mean_by_cause",
                    ReducerKind::GroupBy {
                        key: "/cause".into(),
                        reduce: Box::new(ReducerKind::Mean {
                            value: "/score".into(),
                        }),
                        order: Order::Desc,
                        limit: Some(2),
                    },
                ),
                r(
                    "opposite",
                    ReducerKind::Pairs {
                        key: "/cause".into(),
                        value: "/score".into(),
                        relation: Relation::Different,
                        limit: Some(5),
                    },
                ),
                r(
                    "far_apart_by_film",
                    ReducerKind::Pairs {
                        key: "unit:/film".into(),
                        value: "/score".into(),
                        relation: Relation::Jq("(.a - .b) | fabs >= 0.5".into()),
                        limit: Some(7),
                    },
                ),
                r(
                    "mean_by_film",
                    ReducerKind::GroupBy {
                        key: "unit:/film".into(),
                        reduce: Box::new(ReducerKind::Mean {
                            value: "/score".into(),
                        }),
                        order: Order::Asc,
                        limit: None,
                    },
                ),
                r(
                    "best_three",
                    ReducerKind::Set {
                        value: Some("/cause".into()),
                        order_by: Some("/score".into()),
                        limit: Some(3),
                    },
                ),
                r(
                    "first_four",
                    ReducerKind::Set {
                        value: None,
                        order_by: None,
                        limit: Some(4),
                    },
                ),
            ],
        }
    }

    fn leaf_strategy() -> impl Strategy<Value = Leaf> {
        (0u32..40, 0usize..6, 0usize..4, 0u32..5, 0usize..2).prop_map(
            |(id, st, cause, score, stage)| Leaf {
                unit_id: UnitId(format!("{id}")),
                stage: ["a", "b"][stage].into(),
                status: Status::ALL[st],
                facts: {
                    let causes = [json!("x"), json!("y"), json!("z"), Value::Null];
                    json!({"cause": causes[cause].clone(), "score": f64::from(score) * 2.5})
                },
                unit: json!({"unit:/film": format!("f{}", id % 3)}),
            },
        )
    }

    fn dedup(mut leaves: Vec<Leaf>) -> Vec<Leaf> {
        // A unit has one outcome per stage.
        let mut seen = std::collections::HashSet::new();
        leaves.retain(|l| seen.insert((l.unit_id.clone(), l.stage.clone())));
        leaves
    }

    proptest! {
        #[test]
        fn reorder_and_regroup_never_change_the_fold(
            leaves in prop::collection::vec(leaf_strategy(), 0..60).prop_map(dedup),
            seed in any::<u64>(),
            fan_a in 2usize..9,
            fan_b in 2usize..9,
        ) {
            let flat = fold_flat(&spec(fan_a), &leaves);
            let tree = fold_tree(&spec(fan_a), &leaves, &mut NoCache).root;
            prop_assert_eq!(&tree, &flat);
            // Nodes are cached as JSON: every aggregate survives it.
            let json = serde_json::to_value(&flat).expect("a fold value is JSON");
            let back: FoldValue = serde_json::from_value(json).expect("and back");
            prop_assert_eq!(&back, &flat);
            let mut shuffled = leaves.clone();
            // A seeded Fisher-Yates shuffle.
            let mut s = seed;
            for i in (1..shuffled.len()).rev() {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let j = (s >> 33) as usize % (i + 1);
                shuffled.swap(i, j);
            }
            let regrouped = fold_tree(&spec(fan_b), &shuffled, &mut NoCache).root;
            prop_assert_eq!(&regrouped, &flat);
        }
    }

    fn scored(id: &str, film: &str, score: f64, sentiment: &str) -> Leaf {
        Leaf {
            unit_id: UnitId(id.into()),
            stage: "a".into(),
            status: Status::Positive,
            facts: json!({"film": film, "score": score, "sentiment": sentiment}),
            unit: Value::Null,
        }
    }

    #[test]
    fn a_mean_is_exact_and_states_its_count_and_standard_error() {
        let spec = FoldSpec {
            fan_in: 2,
            reducers: vec![ReducerSpec {
                name: "m".into(),
                stage: None,
                statuses: None,
                kind: ReducerKind::Mean {
                    value: "/score".into(),
                },
            }],
        };
        // 0.1 + 0.2 is not 0.3 in floating point; in fixed point it is.
        let leaves = [
            scored("1", "a", 0.1, "pos"),
            scored("2", "a", 0.2, "pos"),
            scored("3", "a", 0.3, "neg"),
        ];
        let root = fold_flat(&spec, &leaves);
        let Some(Agg::Moments {
            n,
            sum,
            sum_sq,
            ids,
        }) = root.reducers.get("m")
        else {
            panic!("{root:?}");
        };
        assert_eq!(*n, 3);
        assert_eq!(*sum, 600_000_000);
        assert_eq!(ids.len(), 3);
        let m = moments(*n, *sum, *sum_sq);
        assert_eq!(m.mean, Some(0.2));
        // The sample standard deviation of 0.1, 0.2, 0.3 is 0.1.
        let se = m.standard_error.expect("three facts");
        assert!((se - 0.1 / 3f64.sqrt()).abs() < 1e-12, "{se}");
    }

    #[test]
    fn groups_rank_by_their_number_and_pairs_come_in_a_stable_order() {
        let mean = ReducerKind::Mean {
            value: "/score".into(),
        };
        let spec = FoldSpec {
            fan_in: 3,
            reducers: vec![
                ReducerSpec {
                    name: "by_film".into(),
                    stage: None,
                    statuses: None,
                    kind: ReducerKind::GroupBy {
                        key: "/film".into(),
                        reduce: Box::new(mean.clone()),
                        order: Order::Desc,
                        limit: Some(2),
                    },
                },
                ReducerSpec {
                    name: "opposite".into(),
                    stage: None,
                    statuses: None,
                    kind: ReducerKind::Pairs {
                        key: "/film".into(),
                        value: "/sentiment".into(),
                        relation: Relation::Different,
                        limit: None,
                    },
                },
                ReducerSpec {
                    name: "share".into(),
                    stage: None,
                    statuses: None,
                    kind: ReducerKind::Ratio {
                        pointer: "/sentiment".into(),
                        numerator: vec!["pos".into()],
                        denominator: vec!["neg".into()],
                    },
                },
            ],
        };
        let leaves = [
            scored("1", "alien", 5.0, "pos"),
            scored("2", "alien", 1.0, "neg"),
            scored("3", "brazil", 4.0, "pos"),
            scored("4", "brazil", 4.0, "pos"),
            scored("5", "cube", 2.0, "neg"),
            scored("6", "alien", 4.0, "pos"),
        ];
        let root = fold_tree(&spec, &leaves, &mut NoCache).root;
        let Some(Agg::GroupBy { groups }) = root.reducers.get("by_film") else {
            panic!("{root:?}");
        };
        let rows = group_rows(groups, &mean, Order::Desc, Some(2));
        let ranked: Vec<(&str, Option<f64>)> = rows.iter().map(|r| (r.0, r.2)).collect();
        assert_eq!(ranked, [("brazil", Some(4.0)), ("alien", Some(10.0 / 3.0))]);
        let asc = group_rows(groups, &mean, Order::Asc, None);
        assert_eq!(asc.first().map(|r| r.0), Some("cube"));
        let Some(Agg::Pairs { members }) = root.reducers.get("opposite") else {
            panic!("{root:?}");
        };
        let ids = |found: Vec<Pair>| -> Vec<(String, String)> {
            found.into_iter().map(|p| (p.a.0, p.b.0)).collect()
        };
        // Alien's negative review against each positive one; brazil agrees.
        let found = ids(pairs(members, &Relation::Different, None).0);
        assert_eq!(found, [("1".into(), "2".into()), ("2".into(), "6".into())]);
        assert_eq!(pairs(members, &Relation::Equal, Some(1)).0.len(), 1);
        // A declared predicate sees both values and the key.
        let jq = Relation::Jq(r#".key == "alien" and .a == "pos" and .b == "pos""#.into());
        let (found, failed) = pairs(members, &jq, None);
        assert_eq!(ids(found), [("1".into(), "6".into())]);
        assert_eq!(failed, None);
        // One that fails says so, and holds nowhere.
        let (found, failed) = pairs(members, &Relation::Jq(".a - .b > 0".into()), None);
        assert!(found.is_empty());
        let (struck, error) = failed.expect("strings cannot be subtracted");
        assert_eq!(struck, 4, "{error}");
        let Some(
            share @ Agg::Ratio {
                numerator,
                denominator,
            },
        ) = root.reducers.get("share")
        else {
            panic!("{root:?}");
        };
        assert_eq!((numerator.len(), denominator.len()), (4, 2));
        let kind = &spec.reducers[2].kind;
        assert_eq!(share.number(kind), Some(4.0 / 6.0));
        let (lo, hi) = wilson(4, 6);
        assert!(
            lo < 4.0 / 6.0 && 4.0 / 6.0 < hi && lo > 0.2 && hi < 0.95,
            "{lo} {hi}"
        );
    }

    #[test]
    fn a_limited_set_keeps_its_best_units_and_unit_fields_key_groups() {
        let r = |name: &str, kind| ReducerSpec {
            name: name.into(),
            stage: None,
            statuses: None,
            kind,
        };
        let spec = FoldSpec {
            fan_in: 2,
            reducers: vec![
                r(
                    "best",
                    ReducerKind::Set {
                        value: None,
                        order_by: Some("/score".into()),
                        limit: Some(2),
                    },
                ),
                r(
                    "by_release",
                    ReducerKind::GroupBy {
                        key: "unit:/release".into(),
                        reduce: Box::new(ReducerKind::Count),
                        order: Order::Key,
                        limit: None,
                    },
                ),
            ],
        };
        let with_release = |id: &str, score: f64, release: &str| Leaf {
            unit: json!({ "unit:/release": release }),
            ..scored(id, "alien", score, "pos")
        };
        let leaves = [
            with_release("1", 3.0, "1979"),
            with_release("2", 5.0, "1986"),
            with_release("3", 5.0, "1979"),
            with_release("4", 1.0, "1986"),
            // No unit field: it opens no group, and is counted missing.
            scored("5", "alien", 4.0, "pos"),
        ];
        let root = fold_tree(&spec, &leaves, &mut NoCache).root;
        let Some(best @ Agg::Ranked { items, .. }) = root.reducers.get("best") else {
            panic!("{root:?}");
        };
        // The two highest, the tie broken by unit id.
        let kept: Vec<(f64, &str)> = items.iter().map(|(x, id, _)| (*x, id.as_str())).collect();
        assert_eq!(kept, [(5.0, "2"), (5.0, "3")]);
        let statement = state(&spec.reducers[0].kind, best).statement;
        assert_eq!(statement, "2 units (the first 2)");
        let Some(Agg::GroupBy { groups }) = root.reducers.get("by_release") else {
            panic!("{root:?}");
        };
        let counts: Vec<(&str, Option<f64>)> =
            group_rows(groups, &ReducerKind::Count, Order::Key, None)
                .into_iter()
                .map(|(k, _, x)| (k, x))
                .collect();
        assert_eq!(counts, [("1979", Some(2.0)), ("1986", Some(2.0))]);
        assert_eq!(root.missing.get("by_release"), Some(&1));
        let best_cites = cited(&spec.reducers[0].kind, best);
        let ids: Vec<&str> = best_cites.iter().map(UnitId::as_str).collect();
        assert_eq!(ids, ["2", "3"]);
        // A count keeps no ids, so a grouped count cites none.
        assert!(cited(&spec.reducers[1].kind, &root.reducers["by_release"]).is_empty());
    }

    #[derive(Default)]
    struct MapCache(HashMap<ContentHash, FoldValue>);
    impl NodeCache for MapCache {
        fn get(&mut self, key: &ContentHash) -> Option<FoldValue> {
            self.0.get(key).cloned()
        }
        fn put(&mut self, key: &ContentHash, _: u32, value: &FoldValue) {
            self.0.insert(*key, value.clone());
        }
    }

    #[test]
    fn one_changed_leaf_recomputes_one_path() {
        let leaves: Vec<Leaf> = (0..1000)
            .map(|i| Leaf {
                unit_id: UnitId(format!("{i}")),
                stage: "a".into(),
                status: if i % 7 == 0 {
                    Status::Positive
                } else {
                    Status::Negative
                },
                facts: json!({"cause": "x", "score": 0.5}),
                unit: Value::Null,
            })
            .collect();
        let spec = spec(16);
        let mut cache = MapCache::default();
        let first = fold_tree(&spec, &leaves, &mut cache);
        assert_eq!(first.depth, 3);
        assert_eq!(first.root, fold_flat(&spec, &leaves));
        // At most 16 children a node: more nodes than 1000 / 16 a level.
        assert!(
            first.nodes_computed > 63 + 4 + 1,
            "{}",
            first.nodes_computed
        );
        let again = fold_tree(&spec, &leaves, &mut cache);
        assert_eq!((again.nodes_computed, again.root_key), (0, first.root_key));
        let mut changed = leaves.clone();
        changed[500].status = Status::Positive;
        let after = fold_tree(&spec, &changed, &mut cache);
        assert_eq!(after.nodes_computed, u64::from(after.depth));
        assert_ne!(after.root_key, first.root_key);
        assert_eq!(after.paths[500].len(), 3);
        assert_eq!(after.root, fold_flat(&spec, &changed));

        // Inserted and removed units move the groups beside them only.
        let mut inserted = leaves.clone();
        inserted.insert(
            250,
            Leaf {
                unit_id: UnitId("new".into()),
                ..leaves[0].clone()
            },
        );
        let after = fold_tree(&spec, &inserted, &mut cache);
        assert!(
            after.nodes_computed <= 2 * u64::from(after.depth),
            "{after:?}"
        );
        assert_eq!(after.root, fold_flat(&spec, &inserted));
        let mut removed = leaves.clone();
        removed.remove(750);
        let after = fold_tree(&spec, &removed, &mut cache);
        assert!(after.nodes_computed <= 2 * u64::from(after.depth));
        assert_eq!(after.root, fold_flat(&spec, &removed));
    }

    #[test]
    fn groups_hold_two_to_fan_in_nodes_but_the_last() {
        let level: Vec<Node> = (0..500u64)
            .map(|i| Node {
                key: ContentHash::of_bytes(&i.to_le_bytes()),
                anchor: i.wrapping_mul(0x2545_F491_4F6C_DD1D),
                value: None,
            })
            .collect();
        let gs = groups(&level, 8, 1);
        assert_eq!(gs.first().map(|g| g.start), Some(0));
        assert_eq!(gs.last().map(|g| g.end), Some(500));
        for w in gs.windows(2) {
            assert_eq!(w[0].end, w[1].start);
        }
        let (last, rest) = gs.split_last().expect("groups");
        assert!(rest.iter().all(|g| (2..=8).contains(&g.len())), "{gs:?}");
        assert!((1..=8).contains(&last.len()));
    }

    #[test]
    fn top_k_breaks_ties_by_unit_id() {
        let spec = spec(2);
        let leaves: Vec<Leaf> = ["d", "b", "c", "a"]
            .iter()
            .map(|id| Leaf {
                unit_id: UnitId((*id).into()),
                stage: "a".into(),
                status: Status::Positive,
                facts: json!({"score": 1.0}),
                unit: Value::Null,
            })
            .collect();
        let root = fold_tree(&spec, &leaves, &mut NoCache).root;
        match root.reducers.get("top") {
            Some(Agg::TopK { items, .. }) => {
                let ids: Vec<&str> = items.iter().map(|(_, id, _)| id.as_str()).collect();
                assert_eq!(ids, ["a", "b", "c"]);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}
