//! The engine's side of a stage run: a queue of per-unit requests that a
//! backend drains through [`Job`], with slots, retries, budgets and the
//! answer contract enforced here, where the backend cannot get around them.

use std::collections::{HashMap, VecDeque};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use fanfold_core::Status;
use fanfold_core::spec::{BreakerSpec, BudgetSpec, ContractSpec};
use fanfold_model::{
    BatchLedger, CallError, Completion, DecisionField, Job, JobOptions, Next, Request, Usage,
};
use fanfold_ops::contract::{Budget, Controller, StopReason};
use fanfold_ops::map::{Interpreted, ModelTurn};
use serde_json::Value;

/// How soon a backend that found every slot taken asks again, when it
/// asks without blocking (a completion usually frees one sooner).
const SLOT_POLL: std::time::Duration = std::time::Duration::from_millis(5);

/// What a usage costs in US dollars; `None` when the backend is unpriced.
pub type PriceFn<'a> = dyn Fn(&Usage) -> Option<f64> + Sync + 'a;

/// Reads a call's raw output against its request's input, in place of the
/// map stage's own reading (a chunk stage reads a list of ids).
pub type InterpretFn<'a> =
    dyn Fn(&str, &Value) -> Result<Interpreted, fanfold_ops::map::Invalid> + Sync + 'a;

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
    /// Another run holds the unit's key: not opened before this.
    pub not_before: Option<std::time::Instant>,
}

/// Whose turn it is to pay for a unit, when several runs share a store.
pub enum Turn {
    /// This run claimed it: call the model.
    Mine,
    /// Its fact is in the store already (another run paid for it), and
    /// has been recorded: nothing to call.
    Done,
    /// Another live run holds it: ask again after this long.
    Wait(std::time::Duration),
}

/// Claims a unit before its first call is paid for.
pub trait Claims: Sync {
    fn claim(&self, index: usize) -> Turn;
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
    /// Set from outside the run (Ctrl-C in the Python package): the run
    /// then stops as a spent wall budget stops it.
    interrupt: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
    /// The depth of each bred unit, by table position (the input's own
    /// units, absent, are at depth 0), and the model calls each level made.
    levels: Mutex<Levels>,
}

#[derive(Default)]
struct Levels {
    depth: HashMap<usize, u32>,
    calls: Vec<u64>,
}

/// Why a call may not be reserved: the run's budget is spent (every
/// stage stops), or only its unit's level's (that level's units stop).
#[derive(Debug)]
enum Refusal {
    Run(StopReason),
    Level { depth: u32, stop: StopReason },
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
            interrupt: None,
            levels: Mutex::new(Levels::default()),
        }
    }

    fn lock_levels(&self) -> MutexGuard<'_, Levels> {
        self.levels.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Places a bred unit at its depth: its calls count against its
    /// level's `budget.per_level` limit.
    pub fn place(&self, index: usize, depth: u32) {
        self.lock_levels().depth.insert(index, depth);
    }

    /// The depth unit `index` was placed at; 0 for the input's own.
    pub fn depth_of(&self, index: usize) -> u32 {
        self.lock_levels().depth.get(&index).copied().unwrap_or(0)
    }

    /// The model calls each level reserved, the input's own units first.
    pub fn level_calls(&self) -> Vec<u64> {
        self.lock_levels().calls.clone()
    }

    /// Stops the run once `flag` is set: no call is sent after it, and
    /// calls in flight are cancelled, as when the wall budget is spent.
    pub fn interrupted_by(mut self, flag: std::sync::Arc<std::sync::atomic::AtomicBool>) -> Self {
        self.interrupt = Some(flag);
        self
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

    /// Whether the run was stopped from outside (Ctrl-C).
    pub fn interrupted(&self) -> bool {
        self.interrupt
            .as_ref()
            .is_some_and(|flag| flag.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// What is left of the wall budget, if there is one: none once the run
    /// was interrupted, whatever the budget, since an interrupt means time
    /// is up.
    pub fn wall_left(&self) -> Option<Duration> {
        if self.interrupted() {
            return Some(Duration::ZERO);
        }
        let limit = Duration::from_secs(self.limits.max_wall_secs?);
        Some(limit.saturating_sub(self.started.elapsed()))
    }

    /// Why time is up, once it is: an interrupt (its own reason, never
    /// counted as the wall budget) or the spent wall budget.
    pub fn wall_spent(&self) -> Option<StopReason> {
        if self.interrupted() {
            return Some(StopReason::Interrupted);
        }
        let secs = self.started.elapsed().as_secs();
        let limit = self.limits.max_wall_secs?;
        (secs >= limit).then_some(StopReason::BudgetExhausted {
            budget: Budget::WallSecs,
            limit,
            used: secs,
        })
    }

    /// Reserves one call of unit `index`: against the run's budget, then
    /// against its level's.
    fn try_reserve(&self, r: Reservation, index: usize) -> Result<(), Refusal> {
        let tokens = r.tokens;
        let mut s = self.lock();
        let mut levels = self.lock_levels();
        let depth = levels.depth.get(&index).copied().unwrap_or(0);
        let at = depth as usize;
        if levels.calls.len() <= at {
            levels.calls.resize(at + 1, 0);
        }
        let level_used = levels.calls.get(at).copied().unwrap_or(0);
        if let Some(limit) = self.limits.max_model_calls
            && s.calls >= limit
        {
            return Err(Refusal::Run(StopReason::BudgetExhausted {
                budget: Budget::ModelCalls,
                limit,
                used: s.calls,
            }));
        }
        if let Some(limit) = self.limits.max_tokens
            && s.tokens + s.reserved_tokens + tokens > limit
        {
            return Err(Refusal::Run(StopReason::BudgetExhausted {
                budget: Budget::Tokens,
                limit,
                used: s.tokens,
            }));
        }
        if let Some(stop) = self.wall_spent() {
            return Err(Refusal::Run(stop));
        }
        if let Some(limit) = self.limits.max_usd
            && s.usd + s.reserved_usd + r.usd > limit
        {
            // Stop reasons count in whole units: money in micro-dollars.
            return Err(Refusal::Run(StopReason::BudgetExhausted {
                budget: Budget::UsdMicros,
                limit: (limit * 1e6) as u64,
                used: (s.usd * 1e6) as u64,
            }));
        }
        if let Some(limit) = self
            .limits
            .per_level
            .get(at)
            .and_then(|l| l.max_model_calls)
            && level_used >= limit
        {
            return Err(Refusal::Level {
                depth,
                stop: StopReason::BudgetExhausted {
                    budget: Budget::LevelModelCalls,
                    limit,
                    used: level_used,
                },
            });
        }
        if let Some(n) = levels.calls.get_mut(at) {
            *n += 1;
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
    /// The first level whose spend ran out: its units stopped, the rest
    /// of the stage went on.
    level_stop: Option<StopReason>,
    guard: Guard,
}

/// Calls that must fail the same way, before any succeeds, to stop a
/// stage whatever its breaker says: enough to tell a revoked key or a dead
/// endpoint from bad luck, few enough that little is paid for it.
pub const FAIL_FAST_CALLS: usize = 3;

/// What the breaker has seen of a stage's first units.
#[derive(Default)]
struct Guard {
    spec: Option<BreakerSpec>,
    /// Table index -> the decision a canary must get.
    canaries: HashMap<usize, String>,
    /// Units finished inside the window, and how many of them failed.
    watched: u32,
    errors: u32,
    /// Canaries judged wrongly: (unit id, expected, got).
    canary_failures: Vec<(String, String, String)>,
    /// The kinds of the first calls, while none has succeeded.
    first_failures: Vec<String>,
    /// What the first of them said (the URL and cause, for a backend).
    first_message: Option<String>,
    succeeded: bool,
}

/// How a call failed, as the fail-fast rule compares failures: the error's
/// code, and the status of an HTTP error.
fn failure_kind(e: &CallError) -> String {
    match e {
        CallError::Http { status, .. } => format!("http_status {status}"),
        e => e.code().to_owned(),
    }
}

pub struct StageJob<'a> {
    stage: &'a ModelTurn,
    /// What the backend is asked for besides the prompt.
    options: JobOptions,
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
    /// Set when the store failed: no unit is opened after it.
    halt: Option<&'a std::sync::atomic::AtomicBool>,
    /// Leases on units shared with other runs of the same store.
    claims: Option<&'a dyn Claims>,
    /// Reads outputs in place of the stage's decision and evidence.
    interpreter: Option<&'a InterpretFn<'a>>,
    state: Mutex<State>,
    slot_free: Condvar,
}

impl<'a> StageJob<'a> {
    pub fn new(
        stage: &'a ModelTurn,
        slots: usize,
        pending: Vec<Pending>,
        budget: &'a BudgetPool,
        controller: &'a Mutex<Controller>,
        on_finish: &'a (dyn Fn(usize, &UnitResult) + Sync),
        prepare: &'a (dyn Fn(usize) -> Prompt + Sync),
    ) -> StageJob<'a> {
        StageJob {
            stage,
            options: job_options(stage, false),
            slots: slots.max(1),
            budget,
            controller,
            on_finish,
            prepare,
            price: None,
            ledger: None,
            halt: None,
            claims: None,
            interpreter: None,
            state: Mutex::new(State {
                queue: pending.into(),
                in_flight: 0,
                max_in_flight: 0,
                usage: HashMap::new(),
                leftovers: Vec::new(),
                stop: None,
                level_stop: None,
                guard: Guard::default(),
            }),
            slot_free: Condvar::new(),
        }
    }

    /// Watches the stage's first units with `breaker`, and checks the
    /// canaries among them (table index -> expected decision).
    pub fn set_guard(&mut self, breaker: Option<BreakerSpec>, canaries: HashMap<usize, String>) {
        let state = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        state.guard.spec = breaker;
        state.guard.canaries = canaries;
    }

    /// Canaries judged wrongly: (unit id, expected, got).
    pub fn canary_failures(&self) -> Vec<(String, String, String)> {
        self.lock().guard.canary_failures.clone()
    }

    /// Records one call's outcome for the fail-fast rule; the reason to
    /// stop, if this call is the last of the first calls that all failed
    /// the same way.
    fn watch_call(&self, state: &mut State, failure: Option<(String, String)>) -> Option<String> {
        let g = &mut state.guard;
        match failure {
            None => {
                g.succeeded = true;
                None
            }
            Some(_) if g.succeeded => None,
            Some((kind, message)) => {
                g.first_failures.push(kind);
                g.first_message.get_or_insert(message);
                let first = g.first_failures.first()?;
                let same = g.first_failures.len() == FAIL_FAST_CALLS
                    && g.first_failures.iter().all(|k| k == first);
                same.then(|| {
                    format!(
                        "its first {FAIL_FAST_CALLS} calls all failed with {first} ({})",
                        g.first_message.as_deref().unwrap_or_default()
                    )
                })
            }
        }
    }

    /// Records one finished unit against the declared breaker; the reason
    /// to stop, if the window has seen more failures than it allows.
    fn watch_unit(
        &self,
        state: &mut State,
        index: usize,
        unit_id: &str,
        r: &UnitResult,
    ) -> Option<String> {
        let g = &mut state.guard;
        if let Some(expect) = g.canaries.get(&index) {
            let got = match (&r.interpreted, r.status) {
                (Some(i), _) if r.status != Status::Error => i.decision.clone().unwrap_or_default(),
                _ => r.status.as_str().to_owned(),
            };
            if &got != expect {
                g.canary_failures
                    .push((unit_id.to_owned(), expect.clone(), got));
            }
        }
        let spec = g.spec.as_ref()?;
        if g.watched >= spec.window {
            return None;
        }
        g.watched += 1;
        if r.status == Status::Error {
            g.errors += 1;
        }
        if g.canary_failures.len() as u32 > spec.max_canary_failures {
            let list: Vec<String> = g
                .canary_failures
                .iter()
                .map(|(id, want, got)| format!("{id} expected {want}, got {got}"))
                .collect();
            return Some(format!(
                "{} canaries judged wrongly ({}; at most {} allowed)",
                g.canary_failures.len(),
                list.join("; "),
                spec.max_canary_failures
            ));
        }
        let allowed = (spec.max_error_rate * f64::from(spec.window)).floor() as u32;
        (g.errors > allowed).then(|| {
            format!(
                "{} of its first {} units failed (at most {allowed} of {} allowed)",
                g.errors, g.watched, spec.window
            )
        })
    }

    /// Stops the stage: every queued unit, retries included, ends not_run.
    fn trip(&self, state: &mut State, detail: String) -> Vec<(usize, UnitResult)> {
        if state.stop.is_some() {
            return Vec::new();
        }
        tracing::warn!(stage = %self.stage.name(), %detail, "breaker tripped");
        let ended = self.drain_unopened(state, Status::NotRun, &format!("breaker: {detail}"));
        state.stop = Some(StopReason::BreakerTripped {
            stage: self.stage.name().to_owned(),
            detail,
        });
        ended
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

    /// Stops opening units once `flag` is set (the store failed).
    pub fn set_halt(&mut self, flag: &'a std::sync::atomic::AtomicBool) {
        self.halt = Some(flag);
    }

    /// Claims each unit before its first call, so runs sharing a store
    /// pay for it once.
    /// Reads every output with `f` instead of the stage's decision and
    /// evidence; the backend is then asked for no decision scores.
    pub fn set_interpreter(&mut self, f: &'a InterpretFn<'a>) {
        self.interpreter = Some(f);
        self.options = job_options(self.stage, true);
    }

    /// Reads one output: through the interpreter when one is set, else
    /// as the map stage's decision and evidence.
    fn interpret(
        &self,
        c: &Completion,
        input: &Value,
    ) -> Result<Interpreted, fanfold_ops::map::Invalid> {
        match self.interpreter {
            Some(f) => f(&c.text, input),
            None => self.stage.interpret(&c.text, input, c.choices.as_deref()),
        }
    }

    pub fn set_claims(&mut self, claims: &'a dyn Claims) {
        self.claims = Some(claims);
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
        let stop = state.stop.or(state.level_stop);
        (state.leftovers, state.max_in_flight, stop)
    }

    /// Asks the contract before any unit opens. When it is already
    /// satisfied (a rerun whose cached facts reach it), every queued unit
    /// ends cancelled and the backend need not start. True when nothing is
    /// left to ask.
    pub fn settled_by_contract(&self) -> bool {
        let ended = {
            let mut state = self.lock();
            if state.queue.is_empty() {
                return true;
            }
            if state.stop.is_some() {
                return false;
            }
            let best_unopened = state.queue.iter().filter_map(|p| p.bound).reduce(f64::max);
            let Some(detail) = self
                .controller
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .may_cancel_rest(best_unopened)
            else {
                return false;
            };
            let ended = self.drain_unopened(&mut state, Status::Cancelled, "contract_satisfied");
            state.stop = Some(StopReason::ContractSatisfied { detail });
            ended
        };
        for (i, r) in &ended {
            (self.on_finish)(*i, r);
        }
        true
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

    /// The next unit to open. With `block`, waits for a free slot and for
    /// units other runs hold; without, says how long to wait instead, so a
    /// backend whose own completions run on the asking thread keeps them
    /// going.
    fn take(&self, block: bool) -> Next {
        let mut ended = Vec::new();
        let request = {
            let mut state = self.lock();
            // Slots are enforced here: a backend asking for more than it may
            // hold waits for a completion.
            loop {
                if state.in_flight >= self.slots {
                    if !block {
                        break Next::Later(SLOT_POLL);
                    }
                    state = self
                        .slot_free
                        .wait(state)
                        .unwrap_or_else(|e| e.into_inner());
                    continue;
                }
                if state.stop.is_none()
                    && self
                        .halt
                        .is_some_and(|h| h.load(std::sync::atomic::Ordering::Relaxed))
                {
                    let detail = "a fact could not be stored".to_owned();
                    ended.extend(self.drain_unopened(
                        &mut state,
                        Status::NotRun,
                        &format!("store_failed: {detail}"),
                    ));
                    state.stop = Some(StopReason::BreakerTripped {
                        stage: self.stage.name().to_owned(),
                        detail,
                    });
                }
                if state.stop.is_some() && state.queue.iter().all(|p| p.attempt == 1) {
                    break Next::Done;
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
                // The first unit no other run holds; when every queued unit
                // is held, wait for the earliest to come free.
                let now = std::time::Instant::now();
                let ready = state
                    .queue
                    .iter()
                    .position(|p| p.not_before.is_none_or(|t| t <= now));
                let Some(mut p) = ready.and_then(|at| state.queue.remove(at)) else {
                    let Some(wake) = state.queue.iter().filter_map(|p| p.not_before).min() else {
                        break Next::Done;
                    };
                    let after = wake.saturating_duration_since(now);
                    if !block {
                        break Next::Later(after);
                    }
                    state = self
                        .slot_free
                        .wait_timeout(state, after)
                        .map(|(s, _)| s)
                        .unwrap_or_else(|e| e.into_inner().0);
                    continue;
                };
                if state.stop.is_some() && p.attempt == 1 {
                    continue;
                }
                if p.attempt == 1
                    && let Some(claims) = self.claims
                {
                    match claims.claim(p.index) {
                        Turn::Mine => {}
                        Turn::Done => continue,
                        Turn::Wait(after) => {
                            p.not_before = Some(now + after);
                            state.queue.push_back(p);
                            continue;
                        }
                    }
                }
                let prompt = match p.prompt.take() {
                    Some(prompt) => prompt,
                    None => (self.prepare)(p.index),
                };
                let estimate = self.reservation(&prompt.suffix);
                match self.budget.try_reserve(estimate, p.index) {
                    Ok(()) => {}
                    Err(Refusal::Run(stop)) => {
                        p.prompt = Some(prompt);
                        state.queue.push_front(p);
                        ended.extend(self.stop_for_budget(&mut state, stop));
                        break Next::Done;
                    }
                    Err(Refusal::Level { depth, stop }) => {
                        p.prompt = Some(prompt);
                        state.queue.push_front(p);
                        ended.extend(self.stop_level(&mut state, depth, stop));
                        continue;
                    }
                }
                state.in_flight += 1;
                state.max_in_flight = state.max_in_flight.max(state.in_flight);
                break Next::Request(Request {
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

    /// Stops the stage on a spent budget: queued retries end as errors
    /// (never negatives), unopened units `not_run`.
    fn stop_for_budget(&self, state: &mut State, stop: StopReason) -> Vec<(usize, UnitResult)> {
        let reason = match stop {
            StopReason::Interrupted => stop.code().to_owned(),
            _ => format!("budget_exhausted:{}", stop_budget(&stop)),
        };
        let retries: Vec<Pending> = state
            .queue
            .iter()
            .filter(|p| p.attempt > 1)
            .cloned()
            .collect();
        state.queue.retain(|p| p.attempt == 1);
        let mut ended = Vec::new();
        for r in retries {
            let res = UnitResult {
                status: Status::Error,
                interpreted: None,
                reason: Some(format!("retry not run: {reason}")),
                attempts: r.attempt - 1,
                usage: Usage::default(),
                truncated_tokens: 0,
            };
            ended.push(self.finish_unit(state, r.index, res));
        }
        ended.extend(self.drain_unopened(state, Status::NotRun, &reason));
        state.stop.get_or_insert(stop);
        ended
    }

    /// Stops one level's units on its spent `per_level` budget: queued
    /// retries of that level end as errors, its unopened units `not_run`;
    /// units of other levels go on.
    fn stop_level(
        &self,
        state: &mut State,
        depth: u32,
        stop: StopReason,
    ) -> Vec<(usize, UnitResult)> {
        let reason = format!("{}:{depth}", crate::kit::born::LEVEL_SPENT);
        let (level, rest): (VecDeque<Pending>, VecDeque<Pending>) =
            std::mem::take(&mut state.queue)
                .into_iter()
                .partition(|p| self.budget.depth_of(p.index) == depth);
        state.queue = rest;
        let mut ended = Vec::new();
        for p in level {
            let (status, reason) = if p.attempt > 1 {
                (Status::Error, format!("retry not run: {reason}"))
            } else {
                (Status::NotRun, reason.clone())
            };
            let res = UnitResult {
                status,
                interpreted: None,
                reason: Some(reason),
                attempts: p.attempt - 1,
                usage: Usage::default(),
                truncated_tokens: 0,
            };
            ended.push(self.finish_unit(state, p.index, res));
        }
        state.level_stop.get_or_insert(stop);
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
    /// change the answer, the declared limit is time, or the stage gave up:
    /// a threshold proven, the wall budget spent (checked here, so calls
    /// stuck on a sick endpoint see it without a new unit being asked
    /// for), or the breaker tripped (nothing waits on a dead endpoint's
    /// retries). Under top_k an opened unit's bound is at least every
    /// unopened one's, so it must finish; calls and tokens of a spent
    /// budget were reserved before sending, so those finish too.
    fn is_cancelled(&self) -> bool {
        let (cancelled, ended) = {
            let mut state = self.lock();
            let mut ended = Vec::new();
            if state.stop.is_none()
                && let Some(stop) = self.budget.wall_spent()
            {
                ended = self.stop_for_budget(&mut state, stop);
            }
            let cancelled = match &state.stop {
                Some(StopReason::ContractSatisfied { .. }) => !matches!(
                    self.controller
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .contract(),
                    ContractSpec::TopK { .. }
                ),
                Some(StopReason::BudgetExhausted { budget, .. }) => *budget == Budget::WallSecs,
                Some(StopReason::BreakerTripped { .. } | StopReason::Interrupted) => true,
                _ => false,
            };
            (cancelled, ended)
        };
        for (i, r) in &ended {
            (self.on_finish)(*i, r);
        }
        cancelled
    }

    fn options(&self) -> &JobOptions {
        &self.options
    }

    fn batch_ledger(&self) -> Option<&dyn BatchLedger> {
        self.ledger
    }

    fn next(&self) -> Option<Request> {
        match self.take(true) {
            Next::Request(r) => Some(r),
            Next::Later(_) | Next::Done => None,
        }
    }

    fn poll_next(&self) -> Next {
        self.take(false)
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
            let call_failure = result
                .as_ref()
                .err()
                .map(|e| (failure_kind(e), e.to_string()));
            let unit_id = req.unit_id.clone();
            let mut tripped = self
                .watch_call(&mut state, call_failure)
                .map(|detail| (detail, Vec::new()));
            let failure = match result {
                Ok(c) => match self.interpret(&c, &req.input) {
                    Ok(i) => Ok(i),
                    Err(invalid) => Err(format!("{}: {invalid}", invalid.code())),
                },
                Err(e) => Err(format!("{}: {e}", e.code())),
            };
            let finished = match failure {
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
                        not_before: None,
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
            };
            if tripped.is_none()
                && let Some((i, r)) = &finished
                && let Some(detail) = self.watch_unit(&mut state, *i, &unit_id, r)
            {
                tripped = Some((detail, Vec::new()));
            }
            if let Some((detail, ended)) = &mut tripped {
                *ended = self.trip(&mut state, detail.clone());
            }
            (
                finished,
                tripped.map(|(_, ended)| ended).unwrap_or_default(),
            )
        };
        let (finished, ended) = finished;
        if let Some((i, r)) = finished {
            (self.on_finish)(i, &r);
        }
        for (i, r) in &ended {
            (self.on_finish)(*i, r);
        }
    }
}

/// What a job of `turn` asks of the backend: its schema, and its decision
/// to score unless the outputs are read by an interpreter of the kind's
/// own (`interpreted`) or the decision is not a top-level key (only such a
/// key can be found in the generated text).
fn job_options(turn: &ModelTurn, interpreted: bool) -> JobOptions {
    let decision = (!interpreted && turn.spec.decision.pointer.matches('/').count() == 1)
        .then(|| DecisionField::from(&turn.spec.decision));
    JobOptions {
        schema: Some(turn.schema.clone()),
        choice_only: turn.choice_only() && decision.is_some(),
        decision,
    }
}

fn stop_budget(stop: &StopReason) -> &'static str {
    match stop {
        StopReason::BudgetExhausted { budget, .. } => budget.name(),
        other => other.code(),
    }
}
