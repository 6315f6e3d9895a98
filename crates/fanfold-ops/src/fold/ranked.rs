//! `set` with a `limit`: its first units in [`rank`] order, each with its
//! number at `order_by` (0 without one) and its value.

use std::collections::BTreeSet;

use fanfold_core::UnitId;
use serde::{Deserialize, Serialize};

use super::Leaf;
use super::reducer::{Reducer, Stated, as_key, figure, rank};

pub struct Ranked<'a> {
    pub value: Option<&'a str>,
    pub order_by: Option<&'a str>,
    pub limit: usize,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankedState {
    pub limit: usize,
    pub items: Vec<(f64, UnitId, String)>,
}

impl Reducer for Ranked<'_> {
    type State = RankedState;

    fn empty(&self) -> RankedState {
        RankedState {
            limit: self.limit,
            items: Vec::new(),
        }
    }

    fn update(&self, state: &mut RankedState, leaf: &Leaf) -> bool {
        let shown = match self.value {
            None => leaf.unit_id.0.clone(),
            Some(p) => match leaf.at(p) {
                Some(v) => as_key(v),
                None => return false,
            },
        };
        let score = match self.order_by {
            None => 0.0,
            Some(p) => match leaf.at(p).and_then(serde_json::Value::as_f64) {
                Some(x) => x,
                None => return false,
            },
        };
        if state.limit > 0 {
            state.items.push((score, leaf.unit_id.clone(), shown));
            state.items.sort_by(rank);
            state.items.truncate(state.limit);
        }
        true
    }

    fn merge(state: &mut RankedState, other: &RankedState) {
        state.items.extend(other.items.iter().cloned());
        state.items.sort_by(rank);
        state.items.truncate(state.limit);
    }

    fn number(&self, state: &RankedState) -> Option<f64> {
        Some(state.items.len() as f64)
    }

    fn evaluate(&self, state: &RankedState) -> Stated {
        let RankedState { limit, items } = state;
        Stated::table(
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
                        figure(*x),
                    ]
                })
                .collect(),
        )
    }

    fn cited(&self, state: &RankedState) -> BTreeSet<UnitId> {
        state.items.iter().map(|(_, id, _)| id.clone()).collect()
    }
}
