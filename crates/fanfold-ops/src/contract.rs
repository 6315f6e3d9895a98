//! The stopping controller: decides, from the declared answer contract and
//! the results so far, whether unopened units may be cancelled.
//!
//! Architecture Invariant: only the contract can cancel work. An exhaustive
//! contract never stops early; budgets stop a run as `budget_exhausted`, and
//! the units they leave are `not_run`, never negative.

use fanfold_core::spec::ContractSpec;
use fanfold_core::{FactRecord, Status};
use serde::{Deserialize, Serialize};

use crate::interval::{Draw, Estimate, Estimator, IntervalTarget};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum StopReason {
    /// Every routed unit was judged.
    Completed,
    /// The contract proved the remaining units cannot change the answer.
    ContractSatisfied { detail: String },
    /// A declared budget ran out.
    BudgetExhausted {
        budget: Budget,
        limit: u64,
        used: u64,
    },
    /// A stage's breaker stopped it: its first units failed, or judged
    /// canaries wrongly, past what the stage allows.
    BreakerTripped { stage: String, detail: String },
    /// Stopped from outside (Ctrl-C): a person's choice, not a spent
    /// budget; the units it left are `not_run`.
    Interrupted,
}

/// The budgets a spec may declare, named as the certificate names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Budget {
    ModelCalls,
    Tokens,
    WallSecs,
    /// Money, counted in whole micro-dollars like every other limit.
    UsdMicros,
    /// The model calls of one level of bred units (`budget.per_level`).
    LevelModelCalls,
}

impl Budget {
    pub const fn name(self) -> &'static str {
        match self {
            Budget::ModelCalls => "model_calls",
            Budget::Tokens => "tokens",
            Budget::WallSecs => "wall_secs",
            Budget::UsdMicros => "usd_micros",
            Budget::LevelModelCalls => "level_model_calls",
        }
    }
}

impl std::fmt::Display for Budget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl StopReason {
    pub fn code(&self) -> &'static str {
        match self {
            StopReason::Completed => "completed",
            StopReason::ContractSatisfied { .. } => "contract_satisfied",
            StopReason::BudgetExhausted { .. } => "budget_exhausted",
            StopReason::BreakerTripped { .. } => "breaker_tripped",
            StopReason::Interrupted => "interrupted",
        }
    }
}

/// Tracks decided units against the contract.
pub struct Controller {
    contract: ContractSpec,
    positives: u64,
    /// Scores of positives, best first, at most k.
    top: Vec<f64>,
    /// Units whose score broke their declared bound. One is enough to void
    /// the top-k pruning proof: the controller cancels nothing after it.
    violations: Vec<String>,
    /// An interval contract's running estimate; without a target (a
    /// controller built from the contract alone) it never cancels.
    interval: Option<Estimator>,
}

impl Controller {
    pub fn new(contract: ContractSpec) -> Controller {
        Controller {
            contract,
            positives: 0,
            top: Vec::new(),
            violations: Vec::new(),
            interval: None,
        }
    }

    /// A controller for an interval contract whose target the plan
    /// resolved (the reducer's stage, statuses and groups).
    pub fn with_interval(contract: ContractSpec, target: IntervalTarget) -> Controller {
        Controller {
            interval: Some(Estimator::new(target)),
            ..Controller::new(contract)
        }
    }

    /// The interval contract's stage and seed, for the stage to order its
    /// units by.
    pub fn interval_stage(&self) -> Option<(&str, u64)> {
        self.interval
            .as_ref()
            .map(|e| (e.target().stage.as_str(), e.target().seed))
    }

    /// Declares the units the interval contract's stage received, in the
    /// order it judges them, out of `routed` routed units.
    pub fn set_draw_order(&mut self, order: Vec<usize>, routed: u64) {
        if let Some(e) = &mut self.interval {
            e.set_order(order, routed);
        }
    }

    /// Records unit `index`'s fact for an interval contract: a decided
    /// fact at its stage is a draw, counted in the group its reducer
    /// would count it in (or none); a failed one is a draw of unknown
    /// value; one never judged (cancelled, not run) ends the order.
    pub fn observe_fact(&mut self, index: usize, fact: &FactRecord) {
        let Some(e) = &mut self.interval else {
            return;
        };
        let target = e.target();
        if fact.stage != target.stage {
            return;
        }
        let draw = match fact.status {
            Status::Positive | Status::Negative | Status::Abstain => {
                if !target.statuses.contains(&fact.status) {
                    Draw::Known(None)
                } else {
                    match &target.key {
                        None => Draw::Known(Some(0)),
                        // The fold's own reading of a group's key: a string
                        // as it is, any other value as JSON.
                        Some(pointer) => Draw::Known(
                            fact.facts
                                .pointer(pointer)
                                .filter(|v| !v.is_null())
                                .map(|v| match v {
                                    serde_json::Value::String(s) => s.clone(),
                                    other => other.to_string(),
                                })
                                .and_then(|k| target.groups.iter().position(|g| *g == k)),
                        ),
                    }
                }
            }
            Status::Error => Draw::Unknown,
            Status::Cancelled | Status::NotRun => Draw::Gap,
        };
        e.observe(index, draw);
    }

    /// The interval contract's estimate so far.
    pub fn estimate(&self) -> Option<Estimate> {
        self.interval.as_ref()?.estimate()
    }

    pub fn contract(&self) -> &ContractSpec {
        &self.contract
    }

    /// Records that `unit` scored above the bound its `bound` expression
    /// promised: the pruning proof no longer holds, so nothing more is
    /// cancelled.
    pub fn bound_violated(&mut self, unit: &str, score: f64, bound: f64) {
        self.violations.push(format!(
            "unit {unit} scored {score}, above its declared bound {bound}: the top_k bound is not an upper bound, so pruning stopped"
        ));
    }

    /// The bound violations seen so far.
    pub fn violations(&self) -> &[String] {
        &self.violations
    }

    /// Records one finished unit.
    pub fn observe(&mut self, status: Status, score: Option<f64>) {
        if status != Status::Positive {
            return;
        }
        self.positives += 1;
        if let (ContractSpec::TopK { k, .. }, Some(s)) = (&self.contract, score) {
            self.top.push(s);
            self.top.sort_by(|a, b| b.total_cmp(a));
            self.top.truncate(*k);
        }
    }

    /// Whether every unit not yet opened may be cancelled. `best_unopened`
    /// is the highest score bound among them (units are opened in
    /// descending bound order under a top-k contract).
    pub fn may_cancel_rest(&self, best_unopened: Option<f64>) -> Option<String> {
        match &self.contract {
            ContractSpec::Exhaustive { .. } => None,
            ContractSpec::Interval { half_width, .. } => {
                let e = self.interval.as_ref()?;
                e.reached().then(|| {
                    format!(
                        "the estimate of `{}` is within ±{half_width} at its confidence",
                        e.target().reducer
                    )
                })
            }
            ContractSpec::Threshold { count } => (self.positives >= *count).then(|| {
                format!(
                    "{} positives reached the threshold of {count}",
                    self.positives
                )
            }),
            ContractSpec::TopK { k, .. } => {
                if !self.violations.is_empty() {
                    return None;
                }
                let bound = best_unopened?;
                if self.top.len() < *k {
                    return None;
                }
                let kth = self.top.last().copied()?;
                // Strictly greater: an unopened unit whose bound ties the kth
                // score could still enter through the id tie-break.
                (kth > bound).then(|| {
                    format!("the k-th score {kth} beats every unopened bound (best {bound})")
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exhaustive_never_cancels() {
        let mut c = Controller::new(ContractSpec::Exhaustive {
            answer: "a".into(),
            themes: None,
            top_themes: 3,
        });
        for _ in 0..100 {
            c.observe(Status::Positive, Some(1.0));
        }
        assert_eq!(c.may_cancel_rest(Some(0.0)), None);
    }

    #[test]
    fn top_k_cancels_only_when_bounds_are_beaten() {
        let mut c = Controller::new(ContractSpec::TopK {
            k: 2,
            score: "/s".into(),
            bound: ".b".into(),
        });
        c.observe(Status::Positive, Some(0.9));
        assert_eq!(c.may_cancel_rest(Some(0.1)), None, "fewer than k");
        c.observe(Status::Negative, Some(1.0));
        c.observe(Status::Positive, Some(0.5));
        assert!(
            c.may_cancel_rest(Some(0.5)).is_none(),
            "a tie may still enter"
        );
        assert!(c.may_cancel_rest(Some(0.4)).is_some());
        assert!(c.may_cancel_rest(None).is_none(), "nothing left to cancel");
    }

    #[test]
    fn a_broken_bound_stops_pruning() {
        let mut c = Controller::new(ContractSpec::TopK {
            k: 1,
            score: "/s".into(),
            bound: ".b".into(),
        });
        c.observe(Status::Positive, Some(0.9));
        assert!(c.may_cancel_rest(Some(0.1)).is_some());
        c.bound_violated("7", 0.95, 0.5);
        assert_eq!(c.may_cancel_rest(Some(0.1)), None);
        assert_eq!(c.violations().len(), 1);
    }

    #[test]
    fn threshold_stops_once_proven() {
        let mut c = Controller::new(ContractSpec::Threshold { count: 2 });
        c.observe(Status::Positive, None);
        c.observe(Status::Abstain, None);
        assert!(c.may_cancel_rest(None).is_none());
        c.observe(Status::Positive, None);
        assert!(c.may_cancel_rest(None).is_some());
    }
}
