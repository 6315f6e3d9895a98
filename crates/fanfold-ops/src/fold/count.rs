//! `count`: how many leaves fed the reducer.

use std::collections::BTreeSet;

use fanfold_core::UnitId;
use serde::{Deserialize, Serialize};

use super::Leaf;
use super::reducer::{Reducer, Stated, facts};

pub struct Count;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CountState {
    pub n: u64,
}

impl Reducer for Count {
    type State = CountState;

    fn empty(&self) -> CountState {
        CountState { n: 0 }
    }

    fn update(&self, state: &mut CountState, _leaf: &Leaf) -> bool {
        state.n += 1;
        true
    }

    fn merge(state: &mut CountState, other: &CountState) {
        state.n += other.n;
    }

    fn number(&self, state: &CountState) -> Option<f64> {
        Some(state.n as f64)
    }

    fn evaluate(&self, state: &CountState) -> Stated {
        Stated::sentence(facts(state.n))
    }

    /// A count keeps no ids.
    fn cited(&self, _state: &CountState) -> BTreeSet<UnitId> {
        BTreeSet::new()
    }
}
