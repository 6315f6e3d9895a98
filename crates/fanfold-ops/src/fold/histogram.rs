//! `histogram`: how many numbers at `value` fall in each bucket between
//! the `edges`.

use std::collections::BTreeSet;

use fanfold_core::UnitId;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::Leaf;
use super::reducer::{Reducer, Stated};

pub struct Histogram<'a> {
    pub value: &'a str,
    pub edges: &'a [f64],
}

/// `counts` has one bucket more than `edges`: below the first edge, and
/// from the last on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HistogramState {
    pub edges: Vec<f64>,
    pub counts: Vec<u64>,
}

impl Reducer for Histogram<'_> {
    type State = HistogramState;

    fn empty(&self) -> HistogramState {
        HistogramState {
            edges: self.edges.to_vec(),
            counts: vec![0; self.edges.len() + 1],
        }
    }

    fn update(&self, state: &mut HistogramState, leaf: &Leaf) -> bool {
        let Some(x) = leaf.at(self.value).and_then(Value::as_f64) else {
            return false;
        };
        let bucket = self.edges.partition_point(|e| *e <= x);
        if let Some(c) = state.counts.get_mut(bucket) {
            *c += 1;
        }
        true
    }

    fn merge(state: &mut HistogramState, other: &HistogramState) {
        for (a, b) in state.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
    }

    fn evaluate(&self, state: &HistogramState) -> Stated {
        let HistogramState { edges, counts } = state;
        let bucket = |i: usize| match (i.checked_sub(1).and_then(|j| edges.get(j)), edges.get(i)) {
            (None, Some(hi)) => format!("< {hi}"),
            (Some(lo), Some(hi)) => format!("{lo} to < {hi}"),
            (Some(lo), None) => format!("≥ {lo}"),
            (None, None) => "all".to_owned(),
        };
        Stated::table(
            format!("{} values", counts.iter().sum::<u64>()),
            &["bucket", "count"],
            counts
                .iter()
                .enumerate()
                .map(|(i, c)| vec![bucket(i), c.to_string()])
                .collect(),
        )
    }

    /// A histogram keeps no ids.
    fn cited(&self, _state: &HistogramState) -> BTreeSet<UnitId> {
        BTreeSet::new()
    }
}
