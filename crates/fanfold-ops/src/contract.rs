//! The stopping controller: decides, from the declared answer contract and
//! the results so far, whether unopened units may be cancelled.
//!
//! Architecture Invariant: only the contract can cancel work. An exhaustive
//! contract never stops early; budgets stop a run as `budget_exhausted`, and
//! the units they leave are `not_run`, never negative.

use fanfold_core::Status;
use fanfold_core::spec::ContractSpec;
use serde::{Deserialize, Serialize};

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
}

impl Budget {
    pub const fn name(self) -> &'static str {
        match self {
            Budget::ModelCalls => "model_calls",
            Budget::Tokens => "tokens",
            Budget::WallSecs => "wall_secs",
            Budget::UsdMicros => "usd_micros",
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
}

impl Controller {
    pub fn new(contract: ContractSpec) -> Controller {
        Controller {
            contract,
            positives: 0,
            top: Vec::new(),
            violations: Vec::new(),
        }
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
