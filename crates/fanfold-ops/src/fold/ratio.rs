//! `ratio`: the units whose value at `pointer` is one of the `numerator`
//! values against those whose value is one of the `denominator` values,
//! stated with a 95 % Wilson interval.

use std::collections::BTreeSet;

use fanfold_core::UnitId;
use serde::{Deserialize, Serialize};

use super::Leaf;
use super::reducer::{Reducer, Stated, as_key, figure};

pub struct Ratio<'a> {
    pub pointer: &'a str,
    pub numerator: &'a [String],
    pub denominator: &'a [String],
}

/// The units on each side.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RatioState {
    pub numerator: BTreeSet<UnitId>,
    pub denominator: BTreeSet<UnitId>,
}

impl Reducer for Ratio<'_> {
    type State = RatioState;

    fn empty(&self) -> RatioState {
        RatioState {
            numerator: BTreeSet::new(),
            denominator: BTreeSet::new(),
        }
    }

    /// A value on neither side counts as missing.
    fn update(&self, state: &mut RatioState, leaf: &Leaf) -> bool {
        let Some(v) = leaf.at(self.pointer).map(as_key) else {
            return false;
        };
        if self.numerator.contains(&v) {
            state.numerator.insert(leaf.unit_id.clone());
        } else if self.denominator.contains(&v) {
            state.denominator.insert(leaf.unit_id.clone());
        } else {
            return false;
        }
        true
    }

    fn merge(state: &mut RatioState, other: &RatioState) {
        state.numerator.extend(other.numerator.iter().cloned());
        state.denominator.extend(other.denominator.iter().cloned());
    }

    fn number(&self, state: &RatioState) -> Option<f64> {
        let all = state.numerator.len() + state.denominator.len();
        (all > 0).then(|| state.numerator.len() as f64 / all as f64)
    }

    fn evaluate(&self, state: &RatioState) -> Stated {
        let k = state.numerator.len() as u64;
        let all = k + state.denominator.len() as u64;
        let (lo, hi) = wilson(k, all);
        Stated::sentence(if all == 0 {
            "no values on either side".to_owned()
        } else {
            format!(
                "{} ({k} of {all}; 95 % Wilson interval {} to {})",
                figure(k as f64 / all as f64),
                figure(lo),
                figure(hi)
            )
        })
    }

    fn cited(&self, state: &RatioState) -> BTreeSet<UnitId> {
        state.numerator.union(&state.denominator).cloned().collect()
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
