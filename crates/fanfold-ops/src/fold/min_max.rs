//! `min_max`: the smallest and the largest number at `value`, each with
//! its unit (ties go to the smaller unit id).

use std::collections::BTreeSet;

use fanfold_core::UnitId;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::Leaf;
use super::reducer::{Reducer, Stated, figure};

pub struct MinMax<'a> {
    pub value: &'a str,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MinMaxState {
    pub min: Option<(f64, UnitId)>,
    pub max: Option<(f64, UnitId)>,
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

impl Reducer for MinMax<'_> {
    type State = MinMaxState;

    fn empty(&self) -> MinMaxState {
        MinMaxState {
            min: None,
            max: None,
        }
    }

    /// A state of one leaf; the fold only ever updates an empty one, and
    /// merges the rest.
    fn update(&self, state: &mut MinMaxState, leaf: &Leaf) -> bool {
        let Some(x) = leaf.at(self.value).and_then(Value::as_f64) else {
            return false;
        };
        let one = MinMaxState {
            min: Some((x, leaf.unit_id.clone())),
            max: Some((x, leaf.unit_id.clone())),
        };
        Self::merge(state, &one);
        true
    }

    fn merge(state: &mut MinMaxState, other: &MinMaxState) {
        if let Some(n) = &other.min
            && state.min.as_ref().is_none_or(|o| better_min(n, o))
        {
            state.min = Some(n.clone());
        }
        if let Some(n) = &other.max
            && state.max.as_ref().is_none_or(|o| better_max(n, o))
        {
            state.max = Some(n.clone());
        }
    }

    fn evaluate(&self, state: &MinMaxState) -> Stated {
        match (&state.min, &state.max) {
            (Some((lo, a)), Some((hi, b))) => Stated::sentence(format!(
                "from {} (#{}) to {} (#{})",
                figure(*lo),
                a.0,
                figure(*hi),
                b.0
            )),
            _ => Stated::sentence("no values".into()),
        }
    }

    fn cited(&self, state: &MinMaxState) -> BTreeSet<UnitId> {
        state
            .min
            .iter()
            .chain(&state.max)
            .map(|(_, id)| id.clone())
            .collect()
    }
}
