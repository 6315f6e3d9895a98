//! `join`: the units by their value at `key`, and under each key by the
//! stage whose fact gave it.

use std::collections::{BTreeMap, BTreeSet};

use fanfold_core::UnitId;
use serde::{Deserialize, Serialize};

use super::Leaf;
use super::reducer::{Reducer, Stated, as_key, listed};

pub struct Join<'a> {
    pub key: &'a str,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JoinState {
    pub keys: BTreeMap<String, BTreeMap<String, BTreeSet<UnitId>>>,
}

impl Reducer for Join<'_> {
    type State = JoinState;

    fn empty(&self) -> JoinState {
        JoinState {
            keys: BTreeMap::new(),
        }
    }

    fn update(&self, state: &mut JoinState, leaf: &Leaf) -> bool {
        let Some(k) = leaf.at(self.key) else {
            return false;
        };
        state
            .keys
            .entry(as_key(k))
            .or_default()
            .entry(leaf.stage.clone())
            .or_default()
            .insert(leaf.unit_id.clone());
        true
    }

    fn merge(state: &mut JoinState, other: &JoinState) {
        for (k, stages) in &other.keys {
            let e = state.keys.entry(k.clone()).or_default();
            for (s, ids) in stages {
                e.entry(s.clone()).or_default().extend(ids.iter().cloned());
            }
        }
    }

    fn evaluate(&self, state: &JoinState) -> Stated {
        Stated::table(
            format!("{} keys", state.keys.len()),
            &["key", "units by stage"],
            state
                .keys
                .iter()
                .map(|(k, stages)| {
                    let by: Vec<String> = stages
                        .iter()
                        .map(|(s, ids)| format!("{s}: {}", listed(ids)))
                        .collect();
                    vec![k.clone(), by.join("; ")]
                })
                .collect(),
        )
    }

    fn cited(&self, state: &JoinState) -> BTreeSet<UnitId> {
        state
            .keys
            .values()
            .flat_map(|stages| stages.values().flatten().cloned())
            .collect()
    }
}
