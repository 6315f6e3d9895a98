//! The ledger of facts: one fact per (unit, stage), built once, persisted
//! as soon as it exists (so a killed run keeps everything decided before
//! the kill), and the one place the stopping controller learns of it.
//!
//! On SQLite each fact is written the moment it is recorded. On a shared
//! (PostgreSQL) store, where every statement is a round trip, facts are
//! written together: at most [`FACTS_A_WRITE`] at a time and none later
//! than [`WRITE_WITHIN`] after it was recorded, by a thread of their own
//! while a turn's backend runs ([`FactLedger::writing_during`]). A process
//! killed meanwhile loses only the facts of those last milliseconds, which
//! a rerun asks for again.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

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

/// The most facts a shared store's ledger holds before it writes them.
pub const FACTS_A_WRITE: usize = 64;

/// How long a fact recorded on a shared store waits, at most, to be written.
pub const WRITE_WITHIN: Duration = Duration::from_millis(5);

/// Facts recorded and not yet written, and since when the oldest waits.
#[derive(Default)]
struct Unwritten {
    facts: Vec<FactRecord>,
    since: Option<Instant>,
}

pub struct FactLedger<'a> {
    store: &'a Store,
    /// Whether facts are written together ([`Unwritten`]): a shared store.
    batched: bool,
    unwritten: Mutex<Unwritten>,
    /// A thread writes the unwritten facts as they come due, so recording
    /// one never waits on the store.
    writer_running: AtomicBool,
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
            batched: store.is_shared(),
            unwritten: Mutex::new(Unwritten::default()),
            writer_running: AtomicBool::new(false),
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
        let mut due = false;
        if origin == Origin::Fresh {
            if fact.status.is_cacheable() {
                if self.batched {
                    let mut unwritten = self.unwritten();
                    unwritten.facts.push(fact.clone());
                    unwritten.since.get_or_insert_with(Instant::now);
                    due = !self.writer_running.load(Ordering::Relaxed) && is_due(&unwritten);
                } else if let Err(e) = self.store.put_fact(&fact) {
                    tracing::error!(error = %e, unit = ?fact.source_ids.first(), "fact not stored");
                    state.store_error.get_or_insert(e);
                    self.failed.store(true, Ordering::Relaxed);
                }
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
        drop(state);
        if due {
            self.write_unwritten();
        }
    }

    fn unwritten(&self) -> MutexGuard<'_, Unwritten> {
        self.unwritten.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Writes the facts recorded and not yet written, in one transaction.
    /// A write that fails is the run's store failure, as a single fact's is.
    pub fn write_unwritten(&self) {
        let facts = {
            let mut unwritten = self.unwritten();
            unwritten.since = None;
            std::mem::take(&mut unwritten.facts)
        };
        if facts.is_empty() {
            return;
        }
        if let Err(e) = self.store.put_facts(&facts) {
            tracing::error!(error = %e, facts = facts.len(), "facts not stored");
            self.lock().store_error.get_or_insert(e);
            self.failed.store(true, Ordering::Relaxed);
        }
    }

    /// Runs `f` (a turn's backend) while a thread of its own writes the
    /// facts recorded meanwhile, each within [`WRITE_WITHIN`] (or once
    /// [`FACTS_A_WRITE`] wait); what is left is written when `f` returns,
    /// whatever it returns.
    pub fn writing_during<T>(&self, f: impl FnOnce() -> T) -> T {
        if !self.batched || self.writer_running.swap(true, Ordering::Relaxed) {
            return f();
        }
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let out = std::thread::scope(|scope| {
            scope.spawn(move || {
                while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                    stopped.recv_timeout(WRITE_WITHIN / 2)
                {
                    if is_due(&self.unwritten()) {
                        self.write_unwritten();
                    }
                }
            });
            let out = f();
            drop(stop);
            out
        });
        self.writer_running.store(false, Ordering::Relaxed);
        self.write_unwritten();
        out
    }

    /// Set once a fact could not be stored; a stage's queue stops at it.
    pub fn failed_flag(&self) -> &AtomicBool {
        &self.failed
    }

    /// The first fact write that failed, if any, once every fact recorded
    /// was written.
    pub fn take_store_error(&self) -> Option<StoreError> {
        self.write_unwritten();
        self.lock().store_error.take()
    }

    pub fn into_parts(self) -> (Vec<(usize, FactRecord)>, LedgerTotals) {
        self.write_unwritten();
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

/// Whether unwritten facts are due: enough of them, or the oldest waited
/// [`WRITE_WITHIN`].
fn is_due(unwritten: &Unwritten) -> bool {
    unwritten.facts.len() >= FACTS_A_WRITE
        || unwritten.since.is_some_and(|t| t.elapsed() >= WRITE_WITHIN)
}

#[cfg(test)]
mod tests {
    use super::*;
    use fanfold_core::{ContentHash, FACT_SCHEMA, ModelParams, UnitId};

    fn fact(i: usize) -> FactRecord {
        let name = format!("unit-{i}");
        FactRecord {
            schema: FACT_SCHEMA.into(),
            key: ContentHash::of_bytes(name.as_bytes()),
            source_ids: vec![UnitId(name.clone())],
            source_hashes: vec![ContentHash::of_bytes(name.as_bytes())],
            stage: "judge".into(),
            stage_version: 1,
            rubric_hash: ContentHash::of_bytes(b"rubric"),
            model: ModelParams {
                backend: "scripted".into(),
                model_id: "m".into(),
                temperature: 0.0,
                max_output_tokens: 8,
                seed: 0,
                simulated: true,
            },
            status: if i.is_multiple_of(3) {
                Status::Positive
            } else {
                Status::Negative
            },
            decision: None,
            facts: Value::Null,
            confidence: None,
            choice_scores: Vec::new(),
            reason: None,
            evidence: Vec::new(),
            cost: Cost::default(),
            attempts: 1,
            reducer_path: Vec::new(),
            truncated_tokens: 0,
            digest: None,
        }
    }

    /// On a shared store, facts recorded while a backend runs are written
    /// by the ledger's own thread within milliseconds, before the backend
    /// returns; those recorded outside it by the stage's end.
    #[test]
    fn on_a_shared_store_facts_are_written_together_while_the_backend_runs() {
        let pg = fanfold_testkit::Postgres::start()
            .unwrap_or_else(|e| panic!("a PostgreSQL server for this test: {e}"));
        let url = pg
            .create_database()
            .unwrap_or_else(|e| panic!("createdb: {e}"));
        let store = Store::open(std::path::Path::new(&url)).unwrap_or_else(|e| panic!("{e}"));
        let ledger = FactLedger::new(&store, Controller::new(crate::kit::no_contract()), None);
        let count = || store.count_facts().unwrap_or_else(|e| panic!("count: {e}"));
        let waited = ledger.writing_during(|| {
            for i in 0..150 {
                ledger.record(i, fact(i), Origin::Fresh);
            }
            let started = Instant::now();
            while count() < 150 && started.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(1));
            }
            assert_eq!(count(), 150, "written while the backend still runs");
            started.elapsed()
        });
        assert!(waited < Duration::from_secs(1), "written after {waited:?}");
        // Outside a backend's run: written by the time the stage asks
        // whether a write failed.
        for i in 150..160 {
            ledger.record(i, fact(i), Origin::Fresh);
        }
        assert!(ledger.take_store_error().is_none());
        assert_eq!(count(), 160);
        let (facts, totals) = ledger.into_parts();
        assert_eq!((facts.len(), totals.calls), (160, 0));
    }
}
