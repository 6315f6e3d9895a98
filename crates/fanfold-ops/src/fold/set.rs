//! `set` without a `limit`: the distinct values at `value` (each unit's
//! own id without one), each with the units that have it.

use std::collections::{BTreeMap, BTreeSet};

use fanfold_core::UnitId;
use serde::{Deserialize, Serialize};

use super::Leaf;
use super::reducer::{Reducer, Stated, as_key, listed};

pub struct Set<'a> {
    pub value: Option<&'a str>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SetState {
    pub items: BTreeMap<String, BTreeSet<UnitId>>,
}

impl Reducer for Set<'_> {
    type State = SetState;

    fn empty(&self) -> SetState {
        SetState {
            items: BTreeMap::new(),
        }
    }

    fn update(&self, state: &mut SetState, leaf: &Leaf) -> bool {
        let k = match self.value {
            None => leaf.unit_id.0.clone(),
            Some(p) => match leaf.at(p) {
                Some(v) => as_key(v),
                None => return false,
            },
        };
        state
            .items
            .entry(k)
            .or_default()
            .insert(leaf.unit_id.clone());
        true
    }

    fn merge(state: &mut SetState, other: &SetState) {
        for (k, ids) in &other.items {
            state
                .items
                .entry(k.clone())
                .or_default()
                .extend(ids.iter().cloned());
        }
    }

    fn number(&self, state: &SetState) -> Option<f64> {
        Some(state.items.len() as f64)
    }

    fn evaluate(&self, state: &SetState) -> Stated {
        Stated::table(
            format!("{} distinct values", state.items.len()),
            &["value", "units"],
            state
                .items
                .iter()
                .map(|(v, ids)| vec![v.clone(), listed(ids)])
                .collect(),
        )
    }

    fn cited(&self, state: &SetState) -> BTreeSet<UnitId> {
        state.items.values().flatten().cloned().collect()
    }
}
