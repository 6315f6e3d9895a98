//! The ledger of facts: one fact per (unit, stage), built once, persisted
//! the moment it exists (so a killed run keeps everything decided before
//! the kill), and the one place the stopping controller learns of it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

use fanfold_core::{Cost, FactRecord, Status};
use fanfold_ops::contract::Controller;
use fanfold_store::{Store, StoreError};
use serde_json::Value;

/// Where a fact came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// Computed in this run: stored, and its calls and cost counted.
    Fresh,
    /// Read from the store.
    Cached,
    /// Another unit of this run with the same input paid for it.
    Shared,
    /// Made from what a stage already decided and counted (a select's
    /// exclusion): neither stored nor counted again.
    Derived,
}

#[derive(Default)]
struct State {
    /// (table position, fact), in the order decided.
    facts: Vec<(usize, FactRecord)>,
    /// The status of each table position with a fact, by stage.
    seen: HashMap<String, HashMap<usize, Status>>,
    calls: u64,
    cost: Cost,
    recomputed: Vec<String>,
    /// The first failed write; the run fails with it once the stage ends.
    store_error: Option<StoreError>,
}

pub struct FactLedger<'a> {
    store: &'a Store,
    controller: Mutex<Controller>,
    /// JSON pointer to the contract's score, for top-k.
    score_pointer: Option<String>,
    state: Mutex<State>,
    /// Set by the first failed write: stages stop opening units at once,
    /// so nothing more is paid for that could not be kept.
    failed: AtomicBool,
}

/// What the ledger counted.
pub struct LedgerTotals {
    pub calls: u64,
    pub cost: Cost,
    pub recomputed: Vec<String>,
    /// Top-k bounds the scores broke.
    pub violations: Vec<String>,
    /// An interval contract's estimate, as the last fact left it.
    pub estimate: Option<fanfold_ops::interval::Estimate>,
}

impl<'a> FactLedger<'a> {
    pub fn new(
        store: &'a Store,
        controller: Controller,
        score_pointer: Option<String>,
    ) -> FactLedger<'a> {
        FactLedger {
            store,
            controller: Mutex::new(controller),
            score_pointer,
            state: Mutex::new(State::default()),
            failed: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The stopping controller, for a stage's queue to ask before it opens
    /// a unit. Only the ledger tells it about decided units.
    pub fn controller(&self) -> &Mutex<Controller> {
        &self.controller
    }

    pub fn has(&self, index: usize, stage: &str) -> bool {
        self.status(index, stage).is_some()
    }

    /// The status of unit `index`'s fact at `stage`, if it has one.
    pub fn status(&self, index: usize, stage: &str) -> Option<Status> {
        self.lock()
            .seen
            .get(stage)
            .and_then(|s| s.get(&index))
            .copied()
    }

    /// The number at `pointer` in each unit's fact at `stage` (a score a
    /// later stage reads), by table position; units without one are absent.
    pub fn numbers(&self, stage: &str, pointer: &str) -> HashMap<usize, f64> {
        self.lock()
            .facts
            .iter()
            .filter(|(_, f)| f.stage == stage)
            .filter_map(|(i, f)| Some((*i, f.facts.pointer(pointer)?.as_f64()?)))
            .collect()
    }

    /// The confidence of each unit's fact at `stage`, where the fact
    /// carries one.
    pub fn confidences(&self, stage: &str) -> HashMap<usize, f64> {
        self.lock()
            .facts
            .iter()
            .filter(|(_, f)| f.stage == stage)
            .filter_map(|(i, f)| Some((*i, f.confidence?)))
            .collect()
    }

    /// Each unit's probability of a positive decision at `stage`: the sum
    /// of its fact's scored choices among `positive`, where the fact
    /// carries scored choices.
    pub fn positive_probabilities(&self, stage: &str, positive: &[String]) -> HashMap<usize, f64> {
        self.lock()
            .facts
            .iter()
            .filter(|(_, f)| f.stage == stage && !f.choice_scores.is_empty())
            .map(|(i, f)| {
                let p = f
                    .choice_scores
                    .iter()
                    .filter(|c| positive.contains(&c.choice))
                    .map(|c| c.p)
                    .sum::<f64>();
                (*i, p)
            })
            .collect()
    }

    /// Calls `each(index, stage, status)` with every unit's latest fact:
    /// the one that answers for it so far.
    pub fn for_each_latest(&self, mut each: impl FnMut(usize, &str, Status)) {
        let state = self.lock();
        let mut latest: HashMap<usize, &FactRecord> = HashMap::new();
        for (i, f) in &state.facts {
            latest.insert(*i, f);
        }
        for (i, f) in latest {
            each(i, &f.stage, f.status);
        }
    }

    /// Table positions of the units `stage` ended as negative, in table
    /// order.
    pub fn negatives_of(&self, stage: &str) -> Vec<usize> {
        let mut out: Vec<usize> = self
            .lock()
            .seen
            .get(stage)
            .map(|s| {
                s.iter()
                    .filter(|&(_, &st)| st == Status::Negative)
                    .map(|(&i, _)| i)
                    .collect()
            })
            .unwrap_or_default();
        out.sort_unstable();
        out
    }

    /// Records the fact of unit `index`; a second fact for the same unit
    /// and stage is ignored.
    pub fn record(&self, index: usize, mut fact: FactRecord, origin: Origin) {
        // Sealed here, where every fact of the answer passes: facts.jsonl
        // carries the digest, and an edit to a line is caught by verify.
        fact.seal();
        let mut state = self.lock();
        // The first fact's status stands, as the first fact does.
        let first = match state.seen.get_mut(&fact.stage) {
            Some(s) => match s.entry(index) {
                std::collections::hash_map::Entry::Occupied(_) => false,
                std::collections::hash_map::Entry::Vacant(v) => {
                    v.insert(fact.status);
                    true
                }
            },
            None => {
                state
                    .seen
                    .insert(fact.stage.clone(), HashMap::from([(index, fact.status)]));
                true
            }
        };
        if !first {
            return;
        }
        if origin == Origin::Fresh {
            if fact.status.is_cacheable()
                && let Err(e) = self.store.put_fact(&fact)
            {
                tracing::error!(error = %e, unit = ?fact.source_ids.first(), "fact not stored");
                state.store_error.get_or_insert(e);
                self.failed.store(true, Ordering::Relaxed);
            }
            state.calls += fact.cost.calls;
            state.cost.add(&fact.cost);
            if fact.attempts > 0
                && let Some(id) = fact.source_ids.first()
            {
                state.recomputed.push(id.0.clone());
            }
        }
        let score = self
            .score_pointer
            .as_ref()
            .and_then(|p| fact.facts.pointer(p))
            .and_then(Value::as_f64);
        {
            let mut controller = self.controller.lock().unwrap_or_else(|e| e.into_inner());
            controller.observe(fact.status, score);
            controller.observe_fact(index, &fact);
        }
        state.facts.push((index, fact));
    }

    /// Set once a fact could not be stored; a stage's queue stops at it.
    pub fn failed_flag(&self) -> &AtomicBool {
        &self.failed
    }

    /// The first fact write that failed, if any.
    pub fn take_store_error(&self) -> Option<StoreError> {
        self.lock().store_error.take()
    }

    pub fn into_parts(self) -> (Vec<(usize, FactRecord)>, LedgerTotals) {
        let controller = self
            .controller
            .into_inner()
            .unwrap_or_else(|e| e.into_inner());
        let violations = controller.violations().to_vec();
        let estimate = controller.estimate();
        let state = self.state.into_inner().unwrap_or_else(|e| e.into_inner());
        let mut recomputed = state.recomputed;
        recomputed.sort();
        (
            state.facts,
            LedgerTotals {
                calls: state.calls,
                cost: state.cost,
                recomputed,
                violations,
                estimate,
            },
        )
    }
}
