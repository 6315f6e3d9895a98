//! The engine's side of a stage run: a queue of per-unit requests that a
//! backend drains through [`Job`], with slots, retries, budgets and the
//! answer contract enforced here, where the backend cannot get around them.

use std::collections::{HashMap, VecDeque};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Instant;

use fanfold_core::Status;
use fanfold_core::spec::{BudgetSpec, ContractSpec};
use fanfold_model::{BatchLedger, CallError, Completion, DecisionField, Job, Request, Usage};
use fanfold_ops::contract::{Controller, StopReason};
use fanfold_ops::map::{Interpreted, MapStage};
use serde_json::Value;

/// The budget whose exhaustion also abandons in-flight units.
const WALL_BUDGET: &str = "wall_secs";

/// What a usage costs in US dollars; `None` when the backend is unpriced.
pub type PriceFn<'a> = dyn Fn(&Usage) -> Option<f64> + Sync + 'a;

/// What a unit's request carries besides the shared prefix.
#[derive(Clone, Debug)]
pub struct Prompt {
    pub suffix: String,
    pub input: Value,
    /// The stage's schema narrowed to this unit.
    pub schema: Option<Value>,
}

/// A unit waiting for its turn. Its prompt is built when it is opened, so a
/// queue of many thousands of units holds ids, not prompts.
#[derive(Clone, Debug)]
pub struct Pending {
    /// The unit's index in the run.
    pub index: usize,
    pub unit_id: String,
    pub attempt: u32,
    /// Upper bound of the unit's score under a top-k contract.
    pub bound: Option<f64>,
    /// Kept for a retry; `None` until the unit is first opened.
    pub prompt: Option<Prompt>,
}

/// How one unit ended at this stage.
#[derive(Clone, Debug)]
pub struct UnitResult {
    /// Tokens the backend cut from the unit to fit its window.
    pub truncated_tokens: u64,
    pub status: Status,
    pub interpreted: Option<Interpreted>,
    pub reason: Option<String>,
    pub attempts: u32,
    pub usage: Usage,
}

/// Budgets as reservations from one pool shared by every stage of a run:
/// a call reserves its worst case before it is sent and settles to what it
/// used when it returns.
pub struct BudgetPool {
    limits: BudgetSpec,
    started: Instant,
    state: Mutex<BudgetState>,
}

#[derive(Default, Clone, Copy, Debug)]
pub struct BudgetState {
    pub calls: u64,
    pub tokens: u64,
    pub reserved_tokens: u64,
    pub usd: f64,
    pub reserved_usd: f64,
}

/// What one call reserves before it is sent.
#[derive(Clone, Copy, Debug, Default)]
struct Reservation {
    tokens: u64,
    usd: f64,
}

impl BudgetPool {
    pub fn new(limits: BudgetSpec) -> BudgetPool {
        BudgetPool {
            limits,
            started: Instant::now(),
            state: Mutex::new(BudgetState::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, BudgetState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn used(&self) -> BudgetState {
        *self.lock()
    }

    pub fn wall_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    fn try_reserve(&self, r: Reservation) -> Result<(), StopReason> {
        let tokens = r.tokens;
        let mut s = self.lock();
        if let Some(limit) = self.limits.max_model_calls
            && s.calls >= limit
        {
            return Err(StopReason::BudgetExhausted {
                budget: "model_calls".into(),
                limit,
                used: s.calls,
            });
        }
        if let Some(limit) = self.limits.max_tokens
            && s.tokens + s.reserved_tokens + tokens > limit
        {
            return Err(StopReason::BudgetExhausted {
                budget: "tokens".into(),
                limit,
                used: s.tokens,
            });
        }
        if let Some(limit) = self.limits.max_wall_secs {
            let secs = self.started.elapsed().as_secs();
            if secs >= limit {
                return Err(StopReason::BudgetExhausted {
                    budget: WALL_BUDGET.into(),
                    limit,
                    used: secs,
                });
            }
        }
        if let Some(limit) = self.limits.max_usd
            && s.usd + s.reserved_usd + r.usd > limit
        {
            // Stop reasons count in whole units: money in micro-dollars.
            return Err(StopReason::BudgetExhausted {
                budget: "usd_micros".into(),
                limit: (limit * 1e6) as u64,
                used: (s.usd * 1e6) as u64,
            });
        }
        s.calls += 1;
        s.reserved_tokens += tokens;
        s.reserved_usd += r.usd;
        Ok(())
    }

    fn settle(&self, reserved: Reservation, used_tokens: u64, used_usd: f64) {
        let mut s = self.lock();
        s.reserved_tokens = s.reserved_tokens.saturating_sub(reserved.tokens);
        s.reserved_usd = (s.reserved_usd - reserved.usd).max(0.0);
        s.tokens += used_tokens;
        s.usd += used_usd;
    }
}

struct State {
    queue: VecDeque<Pending>,
    in_flight: usize,
    max_in_flight: usize,
    /// Usage of units still open, summed over their attempts.
    usage: HashMap<usize, Usage>,
    /// Units the backend never finished (it returned early).
    leftovers: Vec<(usize, UnitResult)>,
    stop: Option<StopReason>,
}

pub struct StageJob<'a> {
    stage: &'a MapStage,
    decision: DecisionField,
    slots: usize,
    budget: &'a BudgetPool,
    controller: &'a Mutex<Controller>,
    /// Called once per finished unit, outside the queue's lock.
    on_finish: &'a (dyn Fn(usize, &UnitResult) + Sync),
    /// Builds a unit's prompt when it is opened.
    prepare: &'a (dyn Fn(usize) -> Prompt + Sync),
    /// What a usage costs, for the money budget; `None` when unpriced.
    price: Option<&'a PriceFn<'a>>,
    /// Where provider batches are recorded, for batch stages.
    ledger: Option<&'a dyn BatchLedger>,
    state: Mutex<State>,
    slot_free: Condvar,
}

impl<'a> StageJob<'a> {
    pub fn new(
        stage: &'a MapStage,
        slots: usize,
        pending: Vec<Pending>,
        budget: &'a BudgetPool,
        controller: &'a Mutex<Controller>,
        on_finish: &'a (dyn Fn(usize, &UnitResult) + Sync),
        prepare: &'a (dyn Fn(usize) -> Prompt + Sync),
    ) -> StageJob<'a> {
        let d = &stage.spec.decision;
        let decision = DecisionField {
            key: d.pointer.rsplit('/').next().unwrap_or_default().to_owned(),
            choices: d
                .positive
                .iter()
                .chain(&d.negative)
                .chain(&d.abstain)
                .cloned()
                .collect(),
        };
        StageJob {
            stage,
            decision,
            slots: slots.max(1),
            budget,
            controller,
            on_finish,
            prepare,
            price: None,
            ledger: None,
            state: Mutex::new(State {
                queue: pending.into(),
                in_flight: 0,
                max_in_flight: 0,
                usage: HashMap::new(),
                leftovers: Vec::new(),
                stop: None,
            }),
            slot_free: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Prices calls for the money budget.
    pub fn set_price(&mut self, price: &'a PriceFn<'a>) {
        self.price = Some(price);
    }

    fn cost(&self, usage: &Usage) -> f64 {
        self.price.and_then(|p| p(usage)).unwrap_or(0.0)
    }

    pub fn set_batch_ledger(&mut self, ledger: &'a dyn BatchLedger) {
        self.ledger = Some(ledger);
    }

    /// The units the backend never finished (every other result went
    /// through `on_finish`), the most requests ever in flight at once, and
    /// why the stage stopped early (if it did).
    pub fn finish(self) -> (Vec<(usize, UnitResult)>, usize, Option<StopReason>) {
        let mut state = self.state.into_inner().unwrap_or_else(|e| e.into_inner());
        // Anything still queued (a backend that returned early) never ran.
        let leftovers: Vec<Pending> = state.queue.drain(..).collect();
        for p in leftovers {
            let usage = state.usage.remove(&p.index).unwrap_or_default();
            state.leftovers.push((
                p.index,
                UnitResult {
                    status: Status::NotRun,
                    interpreted: None,
                    reason: Some("backend_stopped".into()),
                    attempts: p.attempt.saturating_sub(1),
                    usage,
                    truncated_tokens: 0,
                },
            ));
        }
        (state.leftovers, state.max_in_flight, state.stop)
    }

    /// What a call for `suffix` reserves from the budget before it is
    /// sent: its prompt and the most it may generate, and their price.
    fn reservation(&self, suffix: &str) -> Reservation {
        let prompt = fanfold_model::approx_tokens(self.stage.prefix())
            + fanfold_model::approx_tokens(suffix);
        let completion = u64::from(self.stage.spec.max_output_tokens);
        let worst = Usage {
            prompt_tokens: prompt,
            completion_tokens: completion,
            ..Usage::default()
        };
        Reservation {
            tokens: prompt + completion,
            usd: self.cost(&worst),
        }
    }

    /// Ends every queued first attempt with `status`; retries of units
    /// already opened stay queued.
    fn drain_unopened(
        &self,
        state: &mut State,
        status: Status,
        reason: &str,
    ) -> Vec<(usize, UnitResult)> {
        let mut kept = VecDeque::new();
        let mut ended = Vec::new();
        while let Some(p) = state.queue.pop_front() {
            if p.attempt > 1 && status == Status::Cancelled {
                kept.push_back(p);
                continue;
            }
            let r = UnitResult {
                status,
                interpreted: None,
                reason: Some(reason.to_owned()),
                attempts: p.attempt - 1,
                usage: state.usage.remove(&p.index).unwrap_or_default(),
                truncated_tokens: 0,
            };
            ended.push((p.index, r));
        }
        state.queue = kept;
        ended
    }

    fn finish_unit(
        &self,
        state: &mut State,
        index: usize,
        mut r: UnitResult,
    ) -> (usize, UnitResult) {
        // The controller learns of the result from the fact ledger, through
        // `on_finish`: one place, for cached and computed facts alike.
        r.usage = state.usage.remove(&index).unwrap_or_default();
        (index, r)
    }
}

impl Job for StageJob<'_> {
    fn prefix(&self) -> &str {
        self.stage.prefix()
    }

    fn slots(&self) -> usize {
        self.slots
    }

    /// In-flight units are abandoned only when none of their results can
    /// change the answer or the declared limit is time: a threshold proven,
    /// or the wall budget spent. Under top_k an opened unit's bound is at
    /// least every unopened one's, so it must finish; calls and tokens of a
    /// spent budget were reserved before sending, so those finish too.
    fn is_cancelled(&self) -> bool {
        match &self.lock().stop {
            Some(StopReason::ContractSatisfied { .. }) => !matches!(
                self.controller
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .contract(),
                ContractSpec::TopK { .. }
            ),
            Some(StopReason::BudgetExhausted { budget, .. }) => budget == WALL_BUDGET,
            _ => false,
        }
    }

    fn output_schema(&self) -> Option<&Value> {
        Some(&self.stage.schema)
    }

    fn batch_ledger(&self) -> Option<&dyn BatchLedger> {
        self.ledger
    }

    fn decision(&self) -> Option<&DecisionField> {
        // Only a top-level decision key can be found in the generated text.
        (self.stage.spec.decision.pointer.matches('/').count() == 1).then_some(&self.decision)
    }

    fn next(&self) -> Option<Request> {
        let mut ended = Vec::new();
        let request = {
            let mut state = self.lock();
            // Slots are enforced here: a backend asking for more than it may
            // hold waits for a completion.
            while state.in_flight >= self.slots {
                state = self
                    .slot_free
                    .wait(state)
                    .unwrap_or_else(|e| e.into_inner());
            }
            loop {
                if state.stop.is_some() && state.queue.iter().all(|p| p.attempt == 1) {
                    break None;
                }
                let best_unopened = state
                    .queue
                    .iter()
                    .filter(|p| p.attempt == 1)
                    .filter_map(|p| p.bound)
                    .reduce(f64::max);
                let has_unopened = state.queue.iter().any(|p| p.attempt == 1);
                if has_unopened
                    && state.stop.is_none()
                    && let Some(detail) = self
                        .controller
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .may_cancel_rest(best_unopened)
                {
                    ended.extend(self.drain_unopened(
                        &mut state,
                        Status::Cancelled,
                        "contract_satisfied",
                    ));
                    state.stop = Some(StopReason::ContractSatisfied { detail });
                    continue;
                }
                let Some(mut p) = state.queue.pop_front() else {
                    break None;
                };
                if state.stop.is_some() && p.attempt == 1 {
                    continue;
                }
                let prompt = match p.prompt.take() {
                    Some(prompt) => prompt,
                    None => (self.prepare)(p.index),
                };
                let estimate = self.reservation(&prompt.suffix);
                if let Err(stop) = self.budget.try_reserve(estimate) {
                    p.prompt = Some(prompt);
                    state.queue.push_front(p);
                    let reason = format!("budget_exhausted:{}", stop_budget(&stop));
                    // Retries that cannot be paid for end as errors, not negatives.
                    let retries: Vec<Pending> = state
                        .queue
                        .iter()
                        .filter(|p| p.attempt > 1)
                        .cloned()
                        .collect();
                    state.queue.retain(|p| p.attempt == 1);
                    for r in retries {
                        let res = UnitResult {
                            status: Status::Error,
                            interpreted: None,
                            reason: Some(format!("retry not run: {reason}")),
                            attempts: r.attempt - 1,
                            usage: Usage::default(),
                            truncated_tokens: 0,
                        };
                        ended.push(self.finish_unit(&mut state, r.index, res));
                    }
                    ended.extend(self.drain_unopened(&mut state, Status::NotRun, &reason));
                    state.stop.get_or_insert(stop);
                    break None;
                }
                state.in_flight += 1;
                state.max_in_flight = state.max_in_flight.max(state.in_flight);
                break Some(Request {
                    index: p.index,
                    unit_id: p.unit_id,
                    suffix: prompt.suffix,
                    input: prompt.input,
                    attempt: p.attempt,
                    max_output_tokens: self.stage.spec.max_output_tokens,
                    schema: prompt.schema,
                });
            }
        };
        for (i, r) in &ended {
            (self.on_finish)(*i, r);
        }
        request
    }

    fn complete(&self, req: Request, result: Result<Completion, CallError>) {
        let reserved = self.reservation(&req.suffix);
        let used = result
            .as_ref()
            .map(|c| c.usage.prompt_tokens + c.usage.completion_tokens)
            .unwrap_or(0);
        let spent = result.as_ref().map(|c| self.cost(&c.usage)).unwrap_or(0.0);
        self.budget.settle(reserved, used, spent);
        let finished = {
            let mut state = self.lock();
            state.in_flight = state.in_flight.saturating_sub(1);
            self.slot_free.notify_all();
            if let Ok(c) = &result {
                let u = state.usage.entry(req.index).or_default();
                u.prompt_tokens += c.usage.prompt_tokens;
                u.cached_tokens += c.usage.cached_tokens;
                u.completion_tokens += c.usage.completion_tokens;
                u.latency_ms += c.usage.latency_ms;
            }
            // Neither ends in a retry: a cancelled unit's answer cannot
            // matter, and a batch-pending one is on its way (the next run
            // collects it from the batch instead of asking again).
            let unanswered = match &result {
                Err(CallError::BatchPending {
                    batch_id,
                    state: at,
                }) => Some((Status::NotRun, format!("batch_pending: {batch_id} ({at})"))),
                Err(CallError::Cancelled) => Some((
                    Status::Cancelled,
                    format!(
                        "cancelled in flight: {}",
                        state.stop.as_ref().map_or("stopped", StopReason::code)
                    ),
                )),
                _ => None,
            };
            if let Some((status, reason)) = unanswered {
                let r = UnitResult {
                    status,
                    interpreted: None,
                    reason: Some(reason),
                    attempts: req.attempt,
                    usage: Usage::default(),
                    truncated_tokens: 0,
                };
                let finished = self.finish_unit(&mut state, req.index, r);
                drop(state);
                (self.on_finish)(finished.0, &finished.1);
                return;
            }
            let truncated_tokens = result.as_ref().map_or(0, |c| c.truncated_tokens);
            let failure = match result {
                Ok(c) => match self
                    .stage
                    .interpret(&c.text, &req.input, c.choices.as_deref())
                {
                    Ok(i) => Ok(i),
                    Err(invalid) => Err(format!("{}: {invalid}", invalid.code())),
                },
                Err(e) => Err(format!("{}: {e}", e.code())),
            };
            match failure {
                Ok(i) => Some(self.finish_unit(
                    &mut state,
                    req.index,
                    UnitResult {
                        status: i.status,
                        reason: i.reason.clone(),
                        interpreted: Some(i),
                        attempts: req.attempt,
                        usage: Usage::default(),
                        truncated_tokens,
                    },
                )),
                Err(reason) if req.attempt < self.stage.spec.max_attempts => {
                    tracing::debug!(unit = %req.unit_id, attempt = req.attempt, %reason, "retrying");
                    state.queue.push_front(Pending {
                        index: req.index,
                        unit_id: req.unit_id,
                        attempt: req.attempt + 1,
                        bound: None,
                        prompt: Some(Prompt {
                            suffix: req.suffix,
                            input: req.input,
                            schema: req.schema,
                        }),
                    });
                    None
                }
                Err(reason) => Some(self.finish_unit(
                    &mut state,
                    req.index,
                    UnitResult {
                        status: Status::Error,
                        interpreted: None,
                        reason: Some(format!("{reason} (after {} attempts)", req.attempt)),
                        attempts: req.attempt,
                        usage: Usage::default(),
                        truncated_tokens: 0,
                    },
                )),
            }
        };
        if let Some((i, r)) = finished {
            (self.on_finish)(i, &r);
        }
    }
}

fn stop_budget(stop: &StopReason) -> String {
    match stop {
        StopReason::BudgetExhausted { budget, .. } => budget.clone(),
        other => other.code().to_owned(),
    }
}
