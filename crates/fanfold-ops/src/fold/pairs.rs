//! `pairs`: every unit (and the stage whose fact it is) with its value at
//! `value`, kept by its key at `key`; the pairs of one key whose values
//! stand in `relation` follow from them at the end ([`pairs`]).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use fanfold_core::UnitId;
use fanfold_core::spec::Relation;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::Leaf;
use super::reducer::{Reducer, Stated, as_key};

pub struct Pairs<'a> {
    pub key: &'a str,
    pub value: &'a str,
    pub relation: &'a Relation,
    pub limit: Option<usize>,
}

/// Each key's members: (unit, stage) with its value.
pub type Members = BTreeMap<String, BTreeMap<(UnitId, String), Value>>;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PairsState {
    #[serde(with = "members")]
    pub members: Members,
}

impl Reducer for Pairs<'_> {
    type State = PairsState;

    fn empty(&self) -> PairsState {
        PairsState {
            members: BTreeMap::new(),
        }
    }

    fn update(&self, state: &mut PairsState, leaf: &Leaf) -> bool {
        let (Some(k), Some(v)) = (leaf.at(self.key).map(as_key), leaf.at(self.value).cloned())
        else {
            return false;
        };
        state
            .members
            .entry(k)
            .or_default()
            .insert((leaf.unit_id.clone(), leaf.stage.clone()), v);
        true
    }

    fn merge(state: &mut PairsState, other: &PairsState) {
        for (k, units) in &other.members {
            state
                .members
                .entry(k.clone())
                .or_default()
                .extend(units.iter().map(|(u, v)| (u.clone(), v.clone())));
        }
    }

    fn evaluate(&self, state: &PairsState) -> Stated {
        let (found, failed) = pairs(&state.members, self.relation, self.limit);
        Stated::table(
            format!(
                "{} pairs{}{}",
                found.len(),
                match self.limit {
                    Some(n) if found.len() >= n => format!(" (the first {n})"),
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

    /// The units of the pairs it lists.
    fn cited(&self, state: &PairsState) -> BTreeSet<UnitId> {
        pairs(&state.members, self.relation, self.limit)
            .0
            .into_iter()
            .flat_map(|p| [p.a, p.b])
            .collect()
    }
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

/// Whether two members' values stand in a relation; a jq relation that
/// fails on a pair does not hold there, and the first failure is kept
/// with how many pairs failed.
struct Holds<'a> {
    relation: &'a Relation,
    predicate: Option<crate::jq::JqProgram>,
    failed: Option<(u64, String)>,
}

impl Holds<'_> {
    fn test(&mut self, key: &str, a: &UnitId, av: &Value, b: &UnitId, bv: &Value) -> bool {
        match (self.relation, &self.predicate) {
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
                        let f = self.failed.get_or_insert_with(|| (0, e.to_string()));
                        f.0 += 1;
                        false
                    }
                }
            }
            (Relation::Jq(_), None) => false,
        }
    }
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
    members: &Members,
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
    let mut holds = Holds {
        relation,
        predicate,
        failed: None,
    };
    // Each key's pairs, those with fresh units first; no key can give
    // more than `limit` to the turns.
    let cap = limit.unwrap_or(usize::MAX);
    let per_key: Vec<VecDeque<Pair>> = members
        .iter()
        .map(|(key, units)| key_pairs(key, units, &mut holds, cap).into())
        .collect();
    (take_turns(per_key, cap), holds.failed)
}

/// One key's pairs that hold, at most `cap`: those whose units no earlier
/// pair used first, then the rest.
fn key_pairs(
    key: &str,
    units: &BTreeMap<(UnitId, String), Value>,
    holds: &mut Holds<'_>,
    cap: usize,
) -> Vec<Pair> {
    let list: Vec<(&(UnitId, String), &Value)> = units.iter().collect();
    let mut fresh = Vec::new();
    let mut rest = Vec::new();
    let mut used: BTreeSet<&UnitId> = BTreeSet::new();
    'scan: for (i, ((a, a_stage), av)) in list.iter().enumerate() {
        for ((b, b_stage), bv) in list.iter().skip(i + 1) {
            // Two stages' facts of one unit are not a pair.
            if a == b || !holds.test(key, a, av, b, bv) {
                continue;
            }
            let pair = Pair {
                key: key.to_owned(),
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
    fresh
}

/// The keys' pairs taken in turns, one from each key a round, up to `cap`.
fn take_turns(mut per_key: Vec<VecDeque<Pair>>, cap: usize) -> Vec<Pair> {
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
    out
}

/// A pairs aggregate's members as JSON, whose object keys are strings
/// only: each key's members as a list of `[unit, stage, value]`.
mod members {
    use std::collections::BTreeMap;

    use fanfold_core::UnitId;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use serde_json::Value;

    use super::Members;

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
