//! `sum` and `mean`: one state, the count, the sum and the sum of squares
//! of the numbers at `value`, each in fixed point (`FIXED` units to one)
//! so that adding them is exact and so associative; the units that fed
//! them. The two differ only in what they state.

use std::collections::BTreeSet;

use fanfold_core::UnitId;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::Leaf;
use super::reducer::{Reducer, Stated, facts, figure, listed};

/// Fixed-point units per one: sums are exact to 1e-9.
pub const FIXED: f64 = 1e9;

/// The largest magnitude a summed number may have: beyond it the fixed
/// point could not hold the sum of its square.
const MAX_SUMMED: f64 = 1e9;

/// What a moments reducer states.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Statistic {
    Sum,
    Mean,
}

pub struct Moments<'a> {
    pub value: &'a str,
    pub statistic: Statistic,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MomentsState {
    pub n: u64,
    #[serde(with = "wide")]
    pub sum: i128,
    /// `None` once it no longer fits: the standard error is then not
    /// given.
    #[serde(with = "wide_option")]
    pub sum_sq: Option<i128>,
    pub ids: BTreeSet<UnitId>,
}

impl MomentsState {
    pub fn summary(&self) -> MomentsSummary {
        moments(self.n, self.sum, self.sum_sq)
    }
}

impl Reducer for Moments<'_> {
    type State = MomentsState;

    fn empty(&self) -> MomentsState {
        MomentsState {
            n: 0,
            sum: 0,
            sum_sq: Some(0),
            ids: BTreeSet::new(),
        }
    }

    fn update(&self, state: &mut MomentsState, leaf: &Leaf) -> bool {
        let Some(x) = leaf
            .at(self.value)
            .and_then(Value::as_f64)
            .filter(|x| x.is_finite() && x.abs() <= MAX_SUMMED)
        else {
            return false;
        };
        let fixed = (x * FIXED).round() as i128;
        state.n += 1;
        state.sum = state.sum.saturating_add(fixed);
        state.sum_sq = state
            .sum_sq
            .and_then(|q| q.checked_add(fixed.saturating_mul(fixed)));
        state.ids.insert(leaf.unit_id.clone());
        true
    }

    fn merge(state: &mut MomentsState, other: &MomentsState) {
        state.n += other.n;
        state.sum = state.sum.saturating_add(other.sum);
        // Squares are never negative: the total overflows in any order
        // exactly when it overflows in one.
        state.sum_sq = state
            .sum_sq
            .zip(other.sum_sq)
            .and_then(|(a, b)| a.checked_add(b));
        state.ids.extend(other.ids.iter().cloned());
    }

    fn number(&self, state: &MomentsState) -> Option<f64> {
        let m = state.summary();
        match self.statistic {
            Statistic::Sum => Some(m.sum),
            Statistic::Mean => m.mean,
        }
    }

    fn evaluate(&self, state: &MomentsState) -> Stated {
        let m = state.summary();
        let (n, ids) = (state.n, &state.ids);
        if self.statistic == Statistic::Sum {
            return Stated::sentence(format!(
                "sum {} over {}: {}",
                figure(m.sum),
                facts(n),
                listed(ids)
            ));
        }
        Stated::sentence(match (m.mean, m.standard_error) {
            (Some(mean), Some(se)) => format!(
                "mean {} ± {} (standard error) over {}: {}",
                figure(mean),
                figure(se),
                facts(n),
                listed(ids)
            ),
            (Some(mean), None) => {
                format!("mean {} over {}: {}", figure(mean), facts(n), listed(ids))
            }
            (None, _) => "no values".to_owned(),
        })
    }

    fn cited(&self, state: &MomentsState) -> BTreeSet<UnitId> {
        state.ids.clone()
    }
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
