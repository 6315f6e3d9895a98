//! `top_k`: the `k` units with the highest number at `score`, in
//! [`rank`] order, each with the stage whose fact gave it.

use std::collections::BTreeSet;

use fanfold_core::UnitId;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::Leaf;
use super::reducer::{Reducer, Stated, figure, rank};

pub struct TopK<'a> {
    pub score: &'a str,
    pub k: usize,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TopKState {
    pub k: usize,
    pub items: Vec<(f64, UnitId, String)>,
}

impl Reducer for TopK<'_> {
    type State = TopKState;

    fn empty(&self) -> TopKState {
        TopKState {
            k: self.k,
            items: Vec::new(),
        }
    }

    fn update(&self, state: &mut TopKState, leaf: &Leaf) -> bool {
        let Some(x) = leaf.at(self.score).and_then(Value::as_f64) else {
            return false;
        };
        if state.k > 0 {
            state
                .items
                .push((x, leaf.unit_id.clone(), leaf.stage.clone()));
            state.items.sort_by(rank);
            state.items.truncate(state.k);
        }
        true
    }

    fn merge(state: &mut TopKState, other: &TopKState) {
        state.items.extend(other.items.iter().cloned());
        state.items.sort_by(rank);
        state.items.truncate(state.k);
    }

    fn evaluate(&self, state: &TopKState) -> Stated {
        Stated::table(
            format!("the {} highest", state.items.len()),
            &["rank", "unit", "score"],
            state
                .items
                .iter()
                .enumerate()
                .map(|(n, (x, id, _))| vec![(n + 1).to_string(), format!("#{}", id.0), figure(*x)])
                .collect(),
        )
    }

    fn cited(&self, state: &TopKState) -> BTreeSet<UnitId> {
        state.items.iter().map(|(_, id, _)| id.clone()).collect()
    }
}
