//! Running an effect stage: once the answer is folded and verified, each
//! unit it selected gets the stage's action (the operator,
//! `fanfold_ops::effect`), exactly once across runs and processes:
//!
//! 1. the intent is journaled under the effect's idempotency key;
//! 2. a lease on the key is taken in the store (the run's heartbeat renews
//!    it; a killed run's lapses);
//! 3. the target is read back before anything is sent: an effect the
//!    journal says may already have acted (dispatched, cancelled,
//!    unknown), or one this store never journaled (another store, a lost
//!    one), is not made twice; one the journal says was done (a receipt,
//!    confirmed) is only read back;
//! 4. `dispatched` is journaled before the request leaves, the receipt
//!    after it answers, and the read-back after that;
//! 5. an answer that is lost (timeout, 5xx, 429, reset) is followed by a
//!    read-back, and, when that does not see it, by the stage's settle
//!    time and a second read-back: the action is sent again only if that
//!    does not see it either (a target may finish a write after the
//!    client gave up).
//!
//! The key is visible at the target: sent as a header (`Idempotency-Key`
//! unless the spec names another or none), and, with `marker`, in the
//! body (`<!-- fanfold:effect NAME KEY -->`), which every read-back looks
//! for. So a run on another store, or one whose store was lost, finds the
//! effect and records `already`; two markers of one key are said
//! (`duplicated`); and a marker of the same effect under another key (the
//! template changed) holds the unit unless a new version is allowed. Each
//! run takes its effects in an order of its own, so runs started together
//! on different stores rarely reach one unit at once.
//!
//! What the report says of an effect is what its read-back saw in this
//! run, never a stored answer: nothing here is served from a cache.
//! Cancellation (the wall budget) after a send is journaled and left to
//! the next run's read-back, never undone.

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;
use std::io::Read as _;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fanfold_core::ContentHash;
use fanfold_core::spec::Spec;
use fanfold_core::spec::effect::{EffectAction, EffectStageSpec};
use fanfold_ops::effect::{Action, EffectStage};
use fanfold_store::{Claim, EffectState, Store};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::error::{PlanError, RunError};
use crate::kit::{
    BuildContext, CachedCount, Calls, Outputs, Reads, RunStats, Shape, Stage, StageContext,
    StageOutcome, UnitTable,
};

/// The key of effect stages' reports in the run's stats.
pub const REPORT: &str = "effects";

/// The most bytes of an answer kept as a receipt.
const RECEIPT_BYTES: u64 = 4 << 10;
/// The most bytes of a read-back read.
const READ_BACK_BYTES: u64 = 16 << 20;
/// How long a worker waits before asking again for a lease another run
/// holds.
const LEASE_POLL: Duration = Duration::from_millis(200);
/// The most rows answer.md lists; effects.jsonl has them all.
const SHOWN: usize = 50;

/// How one effect ended in this run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Sent by this run (or found sent by an earlier one that never heard
    /// back) and read back in place.
    Done,
    /// Done by an earlier run, and read back in place now; nothing sent.
    Already,
    /// Done earlier (a receipt or a read-back), but not seen now: undone
    /// since, or never shown. Not sent again: the effect was carried out
    /// once, and a person decides whether it should be again.
    Absent,
    /// The target refused it (a 4xx); nothing took place.
    Refused,
    /// Sent, and whether it took place could not be read back.
    Unknown,
    /// Sent, then the run's time ran out before an answer: journaled, not
    /// undone; the next run reads it back.
    Cancelled,
    /// Not sent: the answer was not whole or verified, the time or
    /// `max_actions` ran out, or another run held it.
    NotRun,
    /// The arguments broke their schema or their template: nothing sent.
    Invalid,
    /// The request yielded `null`: no action wanted.
    Skipped,
    /// A dry run: what would be sent.
    Planned,
    /// Not sent: the unit carries an earlier version of this effect (its
    /// marker under another key) and a new version was not allowed.
    Held,
    /// In place more than once: the read-back shows the effect's marker
    /// twice or more.
    Duplicated,
}

impl Outcome {
    fn as_str(self) -> &'static str {
        match self {
            Outcome::Done => "done",
            Outcome::Already => "already",
            Outcome::Absent => "absent",
            Outcome::Refused => "refused",
            Outcome::Unknown => "unknown",
            Outcome::Cancelled => "cancelled",
            Outcome::NotRun => "not_run",
            Outcome::Invalid => "invalid",
            Outcome::Skipped => "skipped",
            Outcome::Planned => "planned",
            Outcome::Held => "held",
            Outcome::Duplicated => "duplicated",
        }
    }

    /// Whether the effect stands, read back in this run.
    fn in_place(self) -> bool {
        matches!(self, Outcome::Done | Outcome::Already)
    }

    /// Whether the unit's effect was wanted and is not in place.
    fn falls_short(self) -> bool {
        !matches!(
            self,
            Outcome::Done | Outcome::Already | Outcome::Skipped | Outcome::Planned
        )
    }
}

/// One effect, as the certificate and effects.jsonl list it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EffectLine {
    pub unit_id: String,
    /// The idempotency key (hex), empty when no action was built.
    pub key: String,
    pub outcome: Outcome,
    /// The action: method, URL, body and read-back URL.
    pub action: Value,
    /// Sends by this run.
    pub sent: u64,
    /// Sends by every run, as journaled.
    pub sends: u64,
    /// The target's answer to the last send, if one was heard.
    pub receipt: Option<Value>,
    /// What this run's read-back saw, if it read back.
    pub read_back: Option<Value>,
    /// The journal's steps, in order (`intent`, `dispatched`, ...).
    pub journal: Vec<String>,
    pub detail: Option<String>,
}

/// What one effect stage did, for the certificate.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EffectReport {
    /// `METHOD url-template`.
    pub action: String,
    /// Units the answer selected.
    pub targets: u64,
    pub dry_run: bool,
    /// Why nothing was done, when nothing could be.
    pub held: Option<String>,
    /// Requests sent by this run (actions; read-backs apart).
    pub sent: u64,
    pub read_backs: u64,
    /// Effects by outcome.
    pub outcomes: BTreeMap<String, u64>,
    pub effects: Vec<EffectLine>,
    pub wall_ms: u64,
}

pub struct EffectRunner {
    pub stage: EffectStage,
}

impl super::Kind for EffectStageSpec {
    fn build(&self, ctx: &mut BuildContext<'_>) -> Result<Box<dyn Stage>, PlanError> {
        let stage = EffectStage::new(self.clone()).map_err(|e| ctx.invalid(e.to_string()))?;
        Ok(Box::new(EffectRunner { stage }))
    }
}

/// How a request went.
enum Heard {
    /// The target answered with this status and body; `replayed` when it
    /// said the answer is an earlier request's, found by the idempotency
    /// key (`Idempotent-Replayed: true`).
    Answer {
        status: u16,
        body: Value,
        replayed: bool,
    },
    /// No answer: timed out, reset, refused to connect.
    Lost(String),
}

/// Sends actions and read-backs.
struct Sender<'a> {
    runner: &'a EffectRunner,
    client: Option<reqwest::blocking::Client>,
    token: Option<String>,
    budget: &'a crate::queue::BudgetPool,
}

impl Sender<'_> {
    /// The attempt's time limit: the stage's, or what is left of the
    /// run's wall budget if that is less. `None` when nothing is left.
    fn limit(&self) -> Option<Duration> {
        let own = Duration::from_millis(self.runner.stage.spec.timeout_ms);
        match self.budget.wall_left() {
            Some(left) if left.is_zero() => None,
            Some(left) => Some(own.min(left)),
            None => Some(own),
        }
    }

    fn send(&self, method: &str, url: &str, body: Option<&Value>, key: &str, keep: u64) -> Heard {
        let EffectAction::Http {
            url: template,
            idempotency_header,
            ..
        } = &self.runner.stage.spec.action;
        let template = if method == "GET" {
            &self.runner.stage.spec.read_back.url
        } else {
            template
        };
        if let Err(why) = super::tool::same_origin(template, url) {
            return Heard::Lost(format!("refused to send: {why}"));
        }
        let Some(client) = &self.client else {
            return Heard::Lost("the HTTP client could not be built".into());
        };
        let Some(limit) = self.limit() else {
            return Heard::Lost("the run's wall budget is spent".into());
        };
        let m = reqwest::Method::from_bytes(method.as_bytes()).unwrap_or(reqwest::Method::GET);
        let mut req = client
            .request(m, url)
            .header("Accept", "application/json")
            .timeout(limit);
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        let header = idempotency_header.as_deref().unwrap_or(IDEMPOTENCY_HEADER);
        if method != "GET" && !header.is_empty() {
            req = req.header(header, key);
        }
        if let Some(b) = body {
            req = req
                .header("Content-Type", "application/json")
                .body(b.to_string());
        }
        match req.send() {
            Ok(r) => {
                let status = r.status().as_u16();
                let replayed = r
                    .headers()
                    .get("idempotent-replayed")
                    .and_then(|v| v.to_str().ok())
                    .is_some_and(|v| v.eq_ignore_ascii_case("true"));
                let mut bytes = Vec::new();
                match r.take(keep).read_to_end(&mut bytes) {
                    Ok(_) => Heard::Answer {
                        status,
                        body: super::tool::body_of(&bytes),
                        replayed,
                    },
                    Err(e) => Heard::Lost(format!("{method} {url}: the answer broke off: {e}")),
                }
            }
            Err(e) if e.is_timeout() => Heard::Lost(format!("{method} {url}: timed out")),
            Err(e) => Heard::Lost(format!("{method} {url}: {e}")),
        }
    }

    /// Reads the target back: whether the action is in place (its
    /// predicate holds, or its marker is seen), with what was seen; `Err`
    /// when it could not be read.
    fn read_back(&self, action: &Action) -> Result<Seen, String> {
        match self.send("GET", &action.read_url, None, "", READ_BACK_BYTES) {
            Heard::Answer { status, body, .. } if (200..300).contains(&status) || status == 404 => {
                let marks = self.runner.stage.markers(action, &body);
                let holds = marks.own > 0
                    || self
                        .runner
                        .stage
                        .holds(action, status, &body)
                        .map_err(|e| e.to_string())?;
                let mut record =
                    json!({"holds": holds, "status": status, "at_ms": fanfold_store::now_ms()});
                if let Some(o) = record.as_object_mut() {
                    if marks.own > 0 {
                        o.insert("markers".into(), json!(marks.own));
                    }
                    if !marks.earlier.is_empty() {
                        o.insert("earlier_keys".into(), json!(marks.earlier));
                    }
                }
                Ok(Seen {
                    holds,
                    copies: marks.own,
                    earlier: marks.earlier,
                    record,
                })
            }
            Heard::Answer { status, .. } => Err(format!(
                "read-back GET {} answered {status}",
                action.read_url
            )),
            Heard::Lost(why) => Err(format!("read-back: {why}")),
        }
    }
}

/// What one read-back saw.
struct Seen {
    /// The action is in place.
    holds: bool,
    /// How many of its markers (with its own key) the target shows.
    copies: usize,
    /// Keys of earlier versions of the effect the unit carries.
    earlier: Vec<String>,
    /// As journaled and reported.
    record: Value,
}

/// The header that carries the idempotency key when the spec names none.
const IDEMPOTENCY_HEADER: &str = "Idempotency-Key";

/// The run-wide limits an action checks before it is sent.
struct Gate<'a> {
    budget: &'a crate::queue::BudgetPool,
    max_actions: Option<u64>,
    sent: AtomicU64,
    pace: crate::kit::Pace,
}

impl Gate<'_> {
    /// Waits for the rate quota and takes one send's place; the reason
    /// when it may not be sent.
    fn admit(&self) -> Result<(), String> {
        if self.budget.wall_spent().is_some() {
            return Err("the run's wall budget is spent".into());
        }
        let n = self.sent.fetch_add(1, Ordering::SeqCst);
        if self.max_actions.is_some_and(|max| n >= max) {
            self.sent.fetch_sub(1, Ordering::SeqCst);
            return Err("the stage's max_actions are used".into());
        }
        self.pace.wait();
        Ok(())
    }
}

/// One effect being carried out, and what this run saw of it.
struct Work<'a> {
    store: &'a Store,
    run_id: &'a str,
    sender: &'a Sender<'a>,
    line: EffectLine,
    read_backs: u64,
}

impl Work<'_> {
    /// Journals a step; `false` when the lease was lost (another run may
    /// have taken the effect over), and the effect is left to it.
    fn step(&mut self, state: EffectState, detail: Value) -> Result<bool, RunError> {
        let ok = self
            .store
            .effect_step(&self.line.key, self.run_id, state, &detail)?;
        if !ok {
            self.line.outcome = Outcome::Unknown;
            self.line.detail = Some("the lease lapsed before the step was journaled".into());
        }
        Ok(ok)
    }

    fn read_back(&mut self, action: &Action) -> Result<Seen, String> {
        self.read_backs += 1;
        let r = self.sender.read_back(action);
        if let Ok(seen) = &r {
            self.line.read_back = Some(seen.record.clone());
        }
        r
    }

    /// Reads back after a receipt, a few times: a target may show a change
    /// a moment after it answers.
    fn read_back_settled(&mut self, action: &Action, tries: u32) -> Result<Seen, String> {
        let mut last = self.read_back(action);
        for _ in 1..tries {
            if !matches!(&last, Ok(seen) if !seen.holds) {
                break;
            }
            std::thread::sleep(LEASE_POLL);
            last = self.read_back(action);
        }
        last
    }

    /// Records a read-back's verdict: `in_place` is the outcome when the
    /// action is seen, `missing` when it is not.
    fn settle(
        &mut self,
        seen: Result<Seen, String>,
        in_place: Outcome,
        missing: Outcome,
    ) -> Result<(), RunError> {
        match seen {
            Ok(seen) if seen.holds => {
                let copies = seen.copies;
                if self.step(EffectState::Confirmed, seen.record)? {
                    self.line.outcome = in_place;
                    self.duplicated(copies);
                }
            }
            Ok(seen) => {
                if self.step(EffectState::Absent, seen.record)? {
                    self.line.outcome = missing;
                    if missing == Outcome::Absent {
                        self.line.detail = Some(
                            "carried out before, not seen by this read-back: not sent again".into(),
                        );
                    }
                }
            }
            Err(why) => {
                if self.step(EffectState::Unknown, json!({"error": why}))? {
                    self.line.outcome = Outcome::Unknown;
                    self.line.detail = Some(why);
                }
            }
        }
        Ok(())
    }

    /// Says so when the target shows the effect more than once.
    fn duplicated(&mut self, copies: usize) {
        if copies > 1 {
            self.line.outcome = Outcome::Duplicated;
            self.line.detail = Some(format!(
                "the target shows this effect's marker {copies} times: sent more than once"
            ));
        }
    }

    /// Waits the settle time after a lost answer (never past the run's
    /// wall budget), then reads back; `None` when the budget ran out.
    fn settle_then_read(
        &mut self,
        action: &Action,
        settle: Duration,
    ) -> Option<Result<Seen, String>> {
        let wait = match self.sender.budget.wall_left() {
            Some(left) => settle.min(left),
            None => settle,
        };
        std::thread::sleep(wait);
        if self.sender.budget.wall_spent().is_some() {
            return None;
        }
        Some(self.read_back(action))
    }

    /// Carries out one effect whose lease this run holds.
    fn carry_out(
        &mut self,
        action: &Action,
        prior: EffectState,
        gate: &Gate<'_>,
        attempts: u32,
        allow_new_version: bool,
    ) -> Result<(), RunError> {
        use EffectState as S;
        let settle = Duration::from_millis(
            self.sender
                .runner
                .stage
                .spec
                .settle_ms
                .unwrap_or(self.sender.runner.stage.spec.timeout_ms),
        );
        if gate.budget.wall_spent().is_some() {
            // Nothing more is sent or read: what may have acted stays for
            // the next run's read-back.
            self.line.outcome = if prior.may_have_acted() {
                Outcome::Unknown
            } else {
                Outcome::NotRun
            };
            self.line.detail = Some("the run's wall budget is spent".into());
            return Ok(());
        }
        match prior {
            // Done before: never sent again, only read back.
            S::Confirmed | S::Receipt | S::Absent => {
                let seen = self.read_back_settled(action, 1);
                return self.settle(seen, Outcome::Already, Outcome::Absent);
            }
            // Read back before anything is sent: a send that may have
            // acted (dispatched with no receipt, cancelled, unknown), or
            // one this store never journaled (another store, a lost one)
            // is not made twice.
            S::Dispatched | S::Unknown | S::Cancelled | S::Intent | S::Refused => {
                match self.read_back(action) {
                    Ok(seen) if seen.holds => {
                        if self.step(S::Confirmed, seen.record)? {
                            let sent_before = prior.may_have_acted();
                            self.line.outcome = if sent_before {
                                Outcome::Done
                            } else {
                                Outcome::Already
                            };
                            self.line.detail = Some(if sent_before {
                                "an earlier send took place: resolved by read-back".into()
                            } else {
                                "in place before any send of this store: not sent".into()
                            });
                            self.duplicated(seen.copies);
                        }
                        return Ok(());
                    }
                    // An earlier version of this effect is on the unit
                    // (the template or arguments changed since): a new
                    // one is sent only when allowed.
                    Ok(seen) if !seen.earlier.is_empty() && !prior.may_have_acted() => {
                        let earlier = seen.earlier.join(", ");
                        if !allow_new_version {
                            tracing::warn!(
                                stage = %self.sender.runner.stage.name(),
                                unit = %action.unit_id,
                                %earlier,
                                "the unit carries an earlier version of this effect: held, not sent (--allow-new-version sends it)"
                            );
                            self.line.outcome = Outcome::Held;
                            self.line.detail = Some(format!(
                                "carries an earlier version of this effect (key {earlier}): held, not sent; --allow-new-version or allow_new_version = true sends the new one"
                            ));
                            return Ok(());
                        }
                        tracing::warn!(
                            stage = %self.sender.runner.stage.name(),
                            unit = %action.unit_id,
                            %earlier,
                            "the unit carries an earlier version of this effect: sending the new one, as allowed"
                        );
                        self.line.detail =
                            Some(format!("a new version over the earlier key {earlier}"));
                    }
                    Ok(_) => {}
                    Err(why) => {
                        // Nothing is sent unseen: what may have acted
                        // stays unknown, what never was stays not run.
                        self.line.outcome = if prior.may_have_acted() {
                            Outcome::Unknown
                        } else {
                            Outcome::NotRun
                        };
                        self.line.detail = Some(format!("not sent: {why}"));
                        return Ok(());
                    }
                }
            }
        }
        for attempt in 1..=attempts {
            if let Err(why) = gate.admit() {
                self.line.outcome = if self.line.sent == 0 {
                    Outcome::NotRun
                } else {
                    Outcome::Unknown
                };
                self.line.detail = Some(why);
                return Ok(());
            }
            if !self.step(
                S::Dispatched,
                json!({"attempt": attempt, "method": action.method, "url": action.url}),
            )? {
                return Ok(());
            }
            self.line.sent += 1;
            let heard = self.sender.send(
                action.method,
                &action.url,
                action.body.as_ref(),
                &action.key.to_hex(),
                RECEIPT_BYTES,
            );
            match heard {
                Heard::Answer {
                    status,
                    body,
                    replayed,
                } if (200..300).contains(&status) => {
                    let receipt = json!({"status": status, "body": body, "replayed": replayed});
                    self.line.receipt = Some(receipt.clone());
                    if !self.step(S::Receipt, receipt)? {
                        return Ok(());
                    }
                    let seen = self.read_back_settled(action, attempts.max(2));
                    if replayed {
                        // The target knew the key: an earlier send (another
                        // run's, another store's) made it, not this one.
                        self.line.detail = Some(
                            "the target answered from the idempotency key: made by an earlier send"
                                .into(),
                        );
                        let outcome = if self.line.sent > 1 {
                            Outcome::Done
                        } else {
                            Outcome::Already
                        };
                        return self.settle(seen, outcome, Outcome::Absent);
                    }
                    return self.settle(seen, Outcome::Done, Outcome::Absent);
                }
                Heard::Answer { status, body, .. }
                    if (400..500).contains(&status) && !matches!(status, 408 | 409 | 425 | 429) =>
                {
                    let receipt = json!({"status": status, "body": body});
                    self.line.receipt = Some(receipt.clone());
                    if self.step(S::Refused, receipt)? {
                        self.line.outcome = Outcome::Refused;
                        self.line.detail = Some(format!("{} answered {status}", action.url));
                    }
                    return Ok(());
                }
                heard => {
                    // A 429 says the request was not taken: no settle.
                    let refused_for_now = matches!(heard, Heard::Answer { status: 429, .. });
                    let why = match heard {
                        Heard::Answer { status, .. } => format!("{} answered {status}", action.url),
                        Heard::Lost(why) => why,
                    };
                    if gate.budget.wall_spent().is_some() {
                        // Cancelled after the send: journaled, not undone.
                        if self.step(S::Cancelled, json!({"why": why}))? {
                            self.line.outcome = Outcome::Cancelled;
                            self.line.detail = Some(why);
                        }
                        return Ok(());
                    }
                    // No receipt: the read-back says whether it acted; if
                    // it does not see it, the settle time passes and it is
                    // read back again before anything is sent again.
                    let mut seen = self.read_back(action);
                    let mut settled = false;
                    if refused_for_now && matches!(&seen, Ok(s) if !s.holds) {
                        std::thread::sleep(Duration::from_millis(100 << attempt.min(5)));
                    } else if matches!(&seen, Ok(s) if !s.holds) {
                        match self.settle_then_read(action, settle) {
                            Some(again) => {
                                seen = again;
                                settled = true;
                            }
                            None => {
                                if self.step(S::Cancelled, json!({"why": why}))? {
                                    self.line.outcome = Outcome::Cancelled;
                                    self.line.detail = Some(why);
                                }
                                return Ok(());
                            }
                        }
                    }
                    match seen {
                        Ok(seen) if seen.holds => {
                            let copies = seen.copies;
                            if self.step(S::Confirmed, seen.record)? {
                                self.line.outcome = Outcome::Done;
                                self.line.detail = Some(format!(
                                    "{why}; resolved by read-back{}: in place",
                                    if settled {
                                        format!(" after a {} ms settle", settle.as_millis())
                                    } else {
                                        String::new()
                                    }
                                ));
                                self.duplicated(copies);
                            }
                            return Ok(());
                        }
                        Ok(_) => {
                            self.line.detail = Some(if settled {
                                format!("{why}; not seen after a {} ms settle", settle.as_millis())
                            } else {
                                why
                            });
                        }
                        Err(e) => {
                            if self.step(S::Unknown, json!({"error": e}))? {
                                self.line.outcome = Outcome::Unknown;
                                self.line.detail = Some(format!("{why}; {e}"));
                            }
                            return Ok(());
                        }
                    }
                }
            }
        }
        if self.step(
            S::Unknown,
            json!({"error": format!("no answer after {attempts} sends, and not seen")}),
        )? {
            self.line.outcome = Outcome::Unknown;
        }
        Ok(())
    }
}

impl Stage for EffectRunner {
    fn name(&self) -> &str {
        self.stage.name()
    }

    fn kind(&self) -> &'static str {
        "effect"
    }

    fn definition_hash(&self) -> ContentHash {
        self.stage.definition_hash()
    }

    fn shape(&self) -> Shape<'_> {
        let EffectAction::Http { url, .. } = &self.stage.spec.action;
        Shape {
            reads: Reads::Answer,
            calls: Calls::Effect { acts_on: url },
            outputs: Outputs::Derived,
            then: None,
            sends: Vec::new(),
        }
    }

    fn explain(&self, _spec: &Spec, out: &mut String) {
        let sp = &self.stage.spec;
        let EffectAction::Http {
            method,
            url,
            body,
            idempotency_header,
            ..
        } = &sp.action;
        let header = idempotency_header.as_deref().unwrap_or(IDEMPOTENCY_HEADER);
        let _ = writeln!(
            out,
            "  {} effect v{} (on the units the answer selects, once it is whole and verified)\n    request `{}`; {} {url}{}\n    read back by GET {}, in place when `{}`{}\n    quota {} in flight{}, {} ms an attempt, {} sends at most, {} ms settle before a resend; key sent {}; leased and journaled in the store; a unit with an earlier version {}",
            sp.name,
            sp.version,
            sp.request,
            method.as_str(),
            body.as_ref()
                .map(|b| format!(" with {b}"))
                .unwrap_or_default(),
            sp.read_back.url,
            sp.read_back.holds,
            sp.marker
                .as_ref()
                .map(|p| format!(" or its marker is seen (appended at `{p}`)"))
                .unwrap_or_default(),
            sp.quota.concurrency,
            sp.quota
                .per_second
                .map(|r| format!(", {r}/s"))
                .unwrap_or_default(),
            sp.timeout_ms,
            sp.attempts,
            sp.settle_ms.unwrap_or(sp.timeout_ms),
            if header.is_empty() {
                "in no header".to_owned()
            } else {
                format!("as {header}")
            },
            if sp.allow_new_version {
                "gets the new one (allow_new_version)"
            } else {
                "is held unless --allow-new-version"
            },
        );
    }

    fn count_cached(
        &self,
        _spec: &Spec,
        _spec_dir: &Path,
        _store: &Store,
        _table: &UnitTable,
        _units: &[usize],
    ) -> Result<CachedCount, RunError> {
        // An effect is never served from a cache.
        Ok(CachedCount {
            calls: Some(0),
            ..CachedCount::default()
        })
    }

    fn planned_calls(&self, _table: &UnitTable, _units: &[usize]) -> Result<Option<u64>, RunError> {
        Ok(Some(0))
    }

    fn run(&self, ctx: &mut StageContext<'_>, units: Vec<usize>) -> Result<StageOutcome, RunError> {
        let started = Instant::now();
        let sp = &self.stage.spec;
        let name = self.stage.name();
        let EffectAction::Http {
            method,
            url,
            token_env,
            ..
        } = &sp.action;
        ctx.progress.stage_started(name, units.len() as u64, 0);
        let mut report = EffectReport {
            action: format!("{} {url}", method.as_str()),
            targets: units.len() as u64,
            dry_run: ctx.act.dry_run,
            held: ctx.act.held.clone(),
            ..EffectReport::default()
        };
        let fact_of: BTreeMap<usize, &Value> =
            ctx.facts.iter().map(|(i, f)| (*i, &f.facts)).collect();

        // Each target's action; the ones that cannot be built end here.
        let mut queue: VecDeque<(usize, Action)> = VecDeque::new();
        let mut lines: Vec<(usize, EffectLine)> = Vec::new();
        let blank = |unit_id: &str, outcome: Outcome, detail: Option<String>| EffectLine {
            unit_id: unit_id.to_owned(),
            key: String::new(),
            outcome,
            action: Value::Null,
            sent: 0,
            sends: 0,
            receipt: None,
            read_back: None,
            journal: Vec::new(),
            detail,
        };
        for (order, &i) in units.iter().enumerate() {
            let id = ctx.table.id(i)?.clone();
            let fact = fact_of.get(&i).copied().unwrap_or(&Value::Null);
            match self.stage.action(id.as_str(), &ctx.table.value(i), fact) {
                Ok(Some(a)) => queue.push_back((order, a)),
                Ok(None) => lines.push((order, blank(id.as_str(), Outcome::Skipped, None))),
                Err(e) => lines.push((
                    order,
                    blank(id.as_str(), Outcome::Invalid, Some(e.to_string())),
                )),
            }
        }

        if ctx.act.dry_run || ctx.act.held.is_some() {
            // Nothing is sent, leased or journaled; what the journal
            // already holds is shown.
            for (order, a) in queue {
                let prior = ctx.store.effect(&a.key.to_hex())?;
                let mut line = blank(
                    &a.unit_id,
                    Outcome::Planned,
                    Some(format!("would send {} {}", a.method, a.url)),
                );
                line.key = a.key.to_hex();
                line.action = a.describe();
                line.sends = prior.as_ref().map_or(0, |r| r.sends);
                line.journal = prior.iter().map(|r| r.state.as_str().to_owned()).collect();
                if let Some(why) = &ctx.act.held {
                    line.outcome = Outcome::NotRun;
                    line.detail = Some(format!("not performed: {why}"));
                }
                lines.push((order, line));
            }
        } else {
            let sender = Sender {
                runner: self,
                client: reqwest::blocking::Client::builder()
                    .redirect(reqwest::redirect::Policy::none())
                    .user_agent(concat!("fanfold/", env!("CARGO_PKG_VERSION")))
                    .build()
                    .ok(),
                token: token_env.as_ref().and_then(|v| std::env::var(v).ok()),
                budget: ctx.budget,
            };
            let gate = Gate {
                budget: ctx.budget,
                max_actions: sp.max_actions,
                sent: AtomicU64::new(0),
                pace: crate::kit::Pace::new(sp.quota.per_second),
            };
            // An order of this run's own: runs started together on
            // different stores seldom reach one unit at the same moment.
            let mut queue: Vec<(usize, Action)> = queue.into();
            queue.sort_by_cached_key(|(_, a)| run_order(ctx.run_id, &a.key));
            let queue = Mutex::new(VecDeque::from(queue));
            let done: Mutex<Vec<(usize, EffectLine, u64)>> = Mutex::new(Vec::new());
            let failure: Mutex<Option<RunError>> = Mutex::new(None);
            let workers = sp.quota.concurrency.min(lock(&queue).len()).max(1);
            let allow_new_version = sp.allow_new_version || ctx.act.allow_new_version;
            let (store, run_id, progress) = (ctx.store, ctx.run_id, ctx.progress);
            std::thread::scope(|s| {
                for _ in 0..workers {
                    s.spawn(|| {
                        loop {
                            // The queue's lock is let go before the body,
                            // which may put the effect back.
                            let next = lock(&queue).pop_front();
                            let Some((order, action)) = next else {
                                break;
                            };
                            if lock(&failure).is_some() {
                                break;
                            }
                            match self.one(
                                store,
                                run_id,
                                &sender,
                                &gate,
                                &action,
                                allow_new_version,
                            ) {
                                Ok(Some((line, read_backs))) => {
                                    progress.unit_finished(
                                        name,
                                        if line.outcome.in_place() {
                                            fanfold_core::Status::Positive
                                        } else {
                                            fanfold_core::Status::Error
                                        },
                                    );
                                    lock(&done).push((order, line, read_backs));
                                }
                                // Another run holds it: asked again later.
                                Ok(None) => {
                                    lock(&queue).push_back((order, action));
                                    std::thread::sleep(LEASE_POLL);
                                }
                                Err(e) => {
                                    lock(&failure).get_or_insert(e);
                                }
                            }
                        }
                    });
                }
            });
            if let Some(e) = failure.into_inner().unwrap_or_else(|e| e.into_inner()) {
                return Err(e);
            }
            for (order, line, read_backs) in done.into_inner().unwrap_or_else(|e| e.into_inner()) {
                report.sent += line.sent;
                report.read_backs += read_backs;
                lines.push((order, line));
            }
        }
        lines.sort_by_key(|(order, _)| *order);
        for (_, line) in lines {
            *report
                .outcomes
                .entry(line.outcome.as_str().to_owned())
                .or_insert(0) += 1;
            report.effects.push(line);
        }
        report.wall_ms = started.elapsed().as_millis() as u64;
        ctx.stats.reports.put(REPORT, name, &report);
        ctx.progress.stage_finished(name);
        Ok(StageOutcome::default())
    }

    fn report_key(&self) -> Option<&'static str> {
        Some(REPORT)
    }

    fn shortfalls(&self, stats: &RunStats) -> Vec<String> {
        let Some(r) = stats.reports.get::<EffectReport>(REPORT, self.stage.name()) else {
            return Vec::new();
        };
        let short: Vec<&EffectLine> = r
            .effects
            .iter()
            .filter(|l| l.outcome.falls_short())
            .collect();
        if short.is_empty() {
            return Vec::new();
        }
        let mut by: BTreeMap<&str, u64> = BTreeMap::new();
        for l in &short {
            *by.entry(l.outcome.as_str()).or_insert(0) += 1;
        }
        let kinds: Vec<String> = by.iter().map(|(k, n)| format!("{n} {k}")).collect();
        let held: Vec<&str> = short
            .iter()
            .filter(|l| l.outcome == Outcome::Held)
            .map(|l| l.unit_id.as_str())
            .collect();
        let held = if held.is_empty() {
            String::new()
        } else {
            format!(
                "; held, carrying an earlier version of this effect (sent only with --allow-new-version or allow_new_version = true): {}{}",
                held.iter()
                    .take(SHOWN)
                    .copied()
                    .collect::<Vec<_>>()
                    .join(", "),
                if held.len() > SHOWN {
                    format!(" and {} more", held.len() - SHOWN)
                } else {
                    String::new()
                }
            )
        };
        vec![format!(
            "effect `{}`: {} of {} effects are not in place by read-back ({}){held}{}",
            self.stage.name(),
            short.len(),
            r.effects.len(),
            kinds.join(", "),
            r.held
                .as_ref()
                .map(|h| format!("; not performed: {h}"))
                .unwrap_or_default()
        )]
    }

    fn answer_section(&self, stats: &RunStats, simulated: &str) -> Option<String> {
        let r = stats
            .reports
            .get::<EffectReport>(REPORT, self.stage.name())?;
        let mut out = String::new();
        let _ = writeln!(out, "\n## Effects: `{}`{simulated}\n", self.stage.name());
        let counts: Vec<String> = r.outcomes.iter().map(|(k, n)| format!("{n} {k}")).collect();
        let _ = writeln!(
            out,
            "{} on {} units the answer selected{}: {}. {} sent by this run, {} read-backs.\n",
            r.action,
            r.targets,
            if r.dry_run {
                " (dry run: nothing was sent)"
            } else {
                ""
            },
            if counts.is_empty() {
                "none".to_owned()
            } else {
                counts.join(", ")
            },
            r.sent,
            r.read_backs
        );
        if r.effects.is_empty() {
            return Some(out);
        }
        let _ = writeln!(out, "| unit | outcome | sends | read back | detail |");
        let _ = writeln!(out, "|---|---|---|---|---|");
        for l in r.effects.iter().take(SHOWN) {
            let seen = match &l.read_back {
                Some(v) if v.get("holds") == Some(&Value::Bool(true)) => "in place",
                Some(_) => "not seen",
                None => "",
            };
            let _ = writeln!(
                out,
                "| `{}` | {} | {} | {seen} | {} |",
                l.unit_id.replace('|', "\\|"),
                l.outcome.as_str(),
                l.sends.max(l.sent),
                l.detail
                    .as_deref()
                    .unwrap_or("")
                    .replace('|', "\\|")
                    .replace('\n', " ")
            );
        }
        if r.effects.len() > SHOWN {
            let _ = writeln!(out, "\n{} more in effects.jsonl.", r.effects.len() - SHOWN);
        }
        Some(out)
    }

    fn accounting(&self, stats: &RunStats) -> Option<String> {
        let r = stats
            .reports
            .get::<EffectReport>(REPORT, self.stage.name())?;
        Some(format!(
            "Effect `{}`: {} targets, {} sent, {} read-backs",
            self.stage.name(),
            r.targets,
            r.sent,
            r.read_backs
        ))
    }

    fn output_files(&self, stats: &RunStats) -> Vec<(String, Vec<Value>)> {
        let Some(r) = stats.reports.get::<EffectReport>(REPORT, self.stage.name()) else {
            return Vec::new();
        };
        let lines = r
            .effects
            .iter()
            .map(|l| {
                let mut v = serde_json::to_value(l).unwrap_or(Value::Null);
                if let Some(o) = v.as_object_mut() {
                    o.insert("stage".into(), json!(self.stage.name()));
                }
                v
            })
            .collect();
        vec![("effects.jsonl".into(), lines)]
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl EffectRunner {
    /// One effect: its intent journaled, its lease taken, then carried out.
    /// `None` when another live run holds its lease.
    fn one(
        &self,
        store: &Store,
        run_id: &str,
        sender: &Sender<'_>,
        gate: &Gate<'_>,
        action: &Action,
        allow_new_version: bool,
    ) -> Result<Option<(EffectLine, u64)>, RunError> {
        let key = action.key.to_hex();
        store.effect_intent(
            &key,
            self.stage.name(),
            &action.unit_id,
            &action.describe(),
            run_id,
        )?;
        if let Claim::Held { .. } = store.claim(&action.key, run_id, store.lease_ms())? {
            if gate.budget.wall_spent().is_none() {
                return Ok(None);
            }
            let row = store.effect(&key)?;
            return Ok(Some((
                EffectLine {
                    unit_id: action.unit_id.clone(),
                    key,
                    outcome: Outcome::NotRun,
                    action: action.describe(),
                    sent: 0,
                    sends: row.as_ref().map_or(0, |r| r.sends),
                    receipt: None,
                    read_back: None,
                    journal: Vec::new(),
                    detail: Some("another run held it until the time ran out".into()),
                },
                0,
            )));
        }
        // Read under the lease: another run may have moved it on.
        let prior = store.effect(&key)?.map_or(EffectState::Intent, |r| r.state);
        let mut work = Work {
            store,
            run_id,
            sender,
            line: EffectLine {
                unit_id: action.unit_id.clone(),
                key: key.clone(),
                outcome: Outcome::Unknown,
                action: action.describe(),
                sent: 0,
                sends: 0,
                receipt: None,
                read_back: None,
                journal: Vec::new(),
                detail: None,
            },
            read_backs: 0,
        };
        let result = work.carry_out(
            action,
            prior,
            gate,
            self.stage.spec.attempts.max(1),
            allow_new_version,
        );
        store.release_claim(&action.key, run_id)?;
        result?;
        let row = store.effect(&key)?;
        work.line.sends = row.as_ref().map_or(work.line.sent, |r| r.sends);
        if work.line.receipt.is_none() {
            work.line.receipt = row.and_then(|r| r.receipt);
        }
        work.line.journal = store
            .effect_journal(&key)?
            .into_iter()
            .map(|e| e.state.as_str().to_owned())
            .collect();
        Ok(Some((work.line, work.read_backs)))
    }
}

/// Where effect `key` falls in run `run_id`'s order.
fn run_order(run_id: &str, key: &ContentHash) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    run_id.hash(&mut h);
    key.to_hex().hash(&mut h);
    h.finish()
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
