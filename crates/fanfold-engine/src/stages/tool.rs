//! Running a tool stage: build each unit's request (the operator,
//! `fanfold_ops::tool`), merge identical requests, answer what the store
//! already holds, and send the rest through the stage's one capability
//! under its quota (requests in flight, requests a second), its attempt
//! timeout, its run budget and the answer's contract. Each observation is
//! stored under its request's key when it says something about the
//! resource (`ok`, `not_found`), and shown to later stages as the unit's
//! field `as`.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt::Write as _;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use fanfold_core::spec::Spec;
use fanfold_core::spec::tool::{Capability, EnterSpec, ToolStageSpec};
use fanfold_core::{
    Bucket, ContentHash, Cost, FACT_SCHEMA, FactRecord, ModelParams, StableHasher, Status,
};
use fanfold_ops::contract::StopReason;
use fanfold_ops::tool::{ObservationStatus, Request, Room, Target, ToolStage};
use fanfold_store::Store;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::error::{PlanError, RunError};
use crate::kit::UnitTable;
use crate::kit::born::{Born, BredPreview, Litter};
use crate::kit::ledger::Origin;
use crate::kit::{
    BuildContext, CachedCount, Outputs, RunStats, Shape, Stage, StageContext, StageOutcome,
};

/// The key of tool stages' reports in the run's stats.
pub const REPORT: &str = "tools";

/// The namespace of a stored observation: one per request key.
const OBSERVATION: Bucket = Bucket::Kind("tool-observation-v1");
/// The namespace of a unit's fact at a tool stage (never stored: it is
/// made again from the stored observation).
const UNIT_FACT: Bucket = Bucket::Kind("tool-unit-fact-v1");

/// What one tool stage did, for the certificate.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ToolReport {
    pub capability: String,
    /// Units the stage received.
    pub units: u64,
    /// Distinct requests among them.
    pub requests: u64,
    /// Units whose request another unit's call answered.
    pub deduplicated: u64,
    /// Units whose request expression yielded `null`: nothing to ask.
    pub no_request: u64,
    /// Units whose request broke its schema or its capability's rules.
    pub refused: u64,
    /// Requests answered from the store without a call.
    pub cached: u64,
    /// Stored observations confirmed unchanged by a conditional request.
    pub revalidated: u64,
    /// Requests sent (first attempts).
    pub sent: u64,
    /// Attempts after the first (429, 5xx, timeouts).
    pub retries: u64,
    /// Requests not sent because the run's budget or the stage's
    /// `max_requests` ended them: a shortfall of the answer.
    pub not_sent: u64,
    /// Requests not sent because the contract was already satisfied:
    /// their units are `cancelled`, which a satisfied contract allows.
    #[serde(default)]
    pub cancelled: u64,
    /// The most requests in flight at once, as counted here.
    pub max_in_flight: u64,
    /// Observations by status, per distinct request.
    pub statuses: BTreeMap<String, u64>,
    /// The first few refusals and failures, for a person to read.
    pub problems: Vec<String>,
    pub wall_ms: u64,
    /// Units the observations' records became (`enter`).
    #[serde(default)]
    pub bore: u64,
    /// Records not born, by reason (`max_depth`, `max_fanout`,
    /// `repeated_key`); the certificate's `tree` lists them.
    #[serde(default)]
    pub dropped: BTreeMap<String, u64>,
}

pub struct ToolRunner {
    pub stage: ToolStage,
    /// The capability's file or database, resolved against the spec.
    resource: Option<PathBuf>,
}

impl ToolRunner {
    pub fn build(s: &ToolStageSpec, ctx: &mut BuildContext<'_>) -> Result<ToolRunner, PlanError> {
        let stage = ToolStage::new(s.clone()).map_err(|e| ctx.invalid(e.to_string()))?;
        let resource = match &s.capability {
            Capability::File { root, .. } => Some(ctx.spec_dir.join(root)),
            Capability::Sqlite { database, .. } => Some(ctx.spec_dir.join(database)),
            _ => None,
        };
        if let Some(r) = &resource {
            ctx.files.insert(r.display().to_string());
        }
        Ok(ToolRunner { stage, resource })
    }

    /// The units unit `i`'s observation bears for `enter.stage`: none past
    /// `budget.max_depth`, at most `budget.max_fanout`, the rest dropped
    /// with the limit's name.
    fn bear(
        &self,
        spec: &Spec,
        table: &UnitTable,
        i: usize,
        enter: &EnterSpec,
        request: &ContentHash,
        shown: &Value,
    ) -> Result<Litter, RunError> {
        let budget = &spec.budget;
        let depth = table.depth(i) + 1;
        let room = match (budget.max_depth, budget.max_fanout) {
            (Some(max), _) if depth > max => Some(Room {
                most: 0,
                cut_by: "max_depth",
            }),
            (_, Some(most)) => Some(Room {
                most,
                cut_by: "max_fanout",
            }),
            _ => None,
        };
        let parent = table.unit(i)?;
        let offspring = fanfold_ops::tool::offspring(
            parent.unit_id.as_str(),
            shown,
            enter.key.as_deref(),
            room,
        );
        let observed = Self::observation_key(request);
        let born = offspring
            .born
            .into_iter()
            .map(|(id, record)| Born {
                unit: fanfold_core::Unit {
                    unit_id: fanfold_core::UnitId(id),
                    unit_kind: enter.kind.clone(),
                    ordinal: parent.ordinal,
                    source_hash: observed,
                    unit_hash: fanfold_ops::partition::content_hash(&spec.input.partition, &record),
                    bytes: fanfold_core::ByteRange { start: 0, end: 0 },
                },
                json: serde_json::to_vec(&record).unwrap_or_default(),
            })
            .collect();
        Ok(Litter {
            parent: i,
            to: enter.stage.clone(),
            born,
            dropped: offspring
                .dropped
                .into_iter()
                .map(|(id, why)| (id, why.to_owned()))
                .collect(),
        })
    }

    fn unit_key(&self, unit: &fanfold_core::Unit) -> ContentHash {
        let mut h = StableHasher::new(UNIT_FACT);
        h.field("stage", &self.stage.definition_hash())
            .field("unit", &unit.unit_hash);
        h.finish()
    }

    fn observation_key(request: &ContentHash) -> ContentHash {
        let mut h = StableHasher::new(OBSERVATION);
        h.field("request", request);
        h.finish()
    }
}

impl super::Kind for ToolStageSpec {
    fn build(&self, ctx: &mut BuildContext<'_>) -> Result<Box<dyn Stage>, PlanError> {
        Ok(Box::new(ToolRunner::build(self, ctx)?))
    }
}

/// One observation: how it ended, what came back, and what identifies
/// the resource's version for a later conditional request.
#[derive(Clone, Debug)]
struct Observation {
    status: ObservationStatus,
    body: Value,
    version: Option<Version>,
    fetched_ms: u64,
    detail: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Version {
    etag: Option<String>,
    last_modified: Option<String>,
}

impl Observation {
    fn failed(status: ObservationStatus, detail: String) -> Observation {
        Observation {
            status,
            body: Value::Null,
            version: None,
            fetched_ms: fanfold_store::now_ms(),
            detail: Some(detail),
        }
    }

    fn fact(&self, stage: &ToolRunner, key: ContentHash, unit: &fanfold_core::Unit) -> FactRecord {
        let status = match self.status {
            ObservationStatus::Ok => Status::Positive,
            ObservationStatus::NotFound => Status::Negative,
            _ => Status::Error,
        };
        FactRecord {
            schema: FACT_SCHEMA.into(),
            key,
            source_ids: vec![unit.unit_id.clone()],
            source_hashes: vec![unit.unit_hash],
            stage: stage.stage.name().to_owned(),
            stage_version: stage.stage.spec.version,
            rubric_hash: stage.stage.definition_hash(),
            model: params(&stage.stage.spec.capability),
            status,
            decision: Some(self.status.as_str().into()),
            facts: json!({
                "body": self.body,
                "version": self.version,
                "fetched_ms": self.fetched_ms,
            }),
            confidence: None,
            choice_scores: Vec::new(),
            reason: self.detail.clone(),
            evidence: Vec::new(),
            cost: Cost::default(),
            attempts: 0,
            reducer_path: Vec::new(),
            truncated_tokens: 0,
            digest: None,
        }
    }

    fn from_fact(fact: &FactRecord) -> Option<Observation> {
        let status = ObservationStatus::parse(fact.decision.as_deref()?)?;
        Some(Observation {
            status,
            body: fact.facts.get("body").cloned().unwrap_or(Value::Null),
            version: fact
                .facts
                .get("version")
                .and_then(|v| serde_json::from_value(v.clone()).ok()),
            fetched_ms: fact.facts.get("fetched_ms")?.as_u64()?,
            detail: fact.reason.clone(),
        })
    }
}

/// What the facts of a tool name as their "model": the capability.
fn params(cap: &Capability) -> ModelParams {
    ModelParams {
        backend: "tool".into(),
        model_id: cap.type_name().into(),
        temperature: 0.0,
        max_output_tokens: 0,
        seed: 0,
        simulated: false,
    }
}

/// One distinct request to answer, and the stored observation it may
/// revalidate.
struct Job {
    request: Request,
    stale: Option<Observation>,
}

/// What answering one job did.
struct Answered {
    key: ContentHash,
    observation: Observation,
    /// The stored observation still holds (a 304).
    revalidated: bool,
    attempts: u32,
}

/// The run-wide limits a worker checks before it starts a request.
struct Gate<'a> {
    ctx_budget: &'a crate::queue::BudgetPool,
    ledger: &'a crate::kit::FactLedger<'a>,
    max_requests: Option<u64>,
    sent: AtomicU64,
    pace: crate::kit::Pace,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    stop: Mutex<Option<StopReason>>,
}

/// Whether a request may go out.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Admission {
    Send,
    /// The contract no longer needs it.
    Cancelled,
    /// The run's wall budget or the stage's `max_requests` withheld it.
    Withheld,
}

impl Admission {
    fn after(stop: &StopReason) -> Admission {
        match stop {
            StopReason::ContractSatisfied { .. } => Admission::Cancelled,
            _ => Admission::Withheld,
        }
    }
}

impl Gate<'_> {
    /// Waits for the rate quota and takes one request's place, unless the
    /// request may not be sent at all: the contract no longer needs it
    /// (cancelled), or the run's wall budget is spent or the stage's
    /// `max_requests` are used up (withheld).
    fn admit(&self) -> Admission {
        if let Some(stop) = &*self.lock_stop() {
            return Admission::after(stop);
        }
        if let Some(s) = self.ctx_budget.wall_spent() {
            self.stopped(s);
            return Admission::Withheld;
        }
        if let Some(detail) = self
            .ledger
            .controller()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .may_cancel_rest(None)
        {
            self.stopped(StopReason::ContractSatisfied { detail });
            return Admission::Cancelled;
        }
        let n = self.sent.fetch_add(1, Ordering::SeqCst);
        if self.max_requests.is_some_and(|max| n >= max) {
            return Admission::Withheld;
        }
        self.pace.wait();
        Admission::Send
    }

    fn lock_stop(&self) -> std::sync::MutexGuard<'_, Option<StopReason>> {
        self.stop.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn stopped(&self, s: StopReason) {
        self.lock_stop().get_or_insert(s);
    }

    fn enter(&self) {
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_in_flight.fetch_max(now, Ordering::SeqCst);
    }

    fn leave(&self) {
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Stage for ToolRunner {
    fn name(&self) -> &str {
        self.stage.name()
    }

    fn kind(&self) -> &'static str {
        "tool"
    }

    fn definition_hash(&self) -> ContentHash {
        self.stage.definition_hash()
    }

    fn shape(&self) -> Shape<'_> {
        let sends_to = match &self.stage.spec.capability {
            Capability::HttpGet { url, .. } => Some(url.as_str()),
            Capability::Argv { argv } => argv.first().map(String::as_str),
            Capability::File { .. } | Capability::Sqlite { .. } => None,
        };
        Shape {
            then: self.stage.spec.then.as_deref(),
            calls: crate::kit::Calls::Tool { sends_to },
            sends: self
                .stage
                .spec
                .enter
                .as_ref()
                .map(|e| e.stage.as_str())
                .into_iter()
                .collect(),
            ..Shape::units(Outputs::Stored)
        }
    }

    fn explain(&self, spec: &Spec, out: &mut String) {
        let sp = &self.stage.spec;
        let reach = match &sp.capability {
            Capability::HttpGet { url, .. } => format!("GET {url}"),
            Capability::Argv { argv } => format!("runs {}", argv.join(" ")),
            Capability::File { root, path } => format!("reads {root}/{path}"),
            Capability::Sqlite { database, query } => format!("queries {database}: {query}"),
        };
        let _ = writeln!(
            out,
            "  {} tool v{} ({})\n    request `{}`; {reach}\n    quota {} in flight{}, {} ms an attempt, {} attempts; kept {} s\n    adds `{}` to each unit, then {}",
            sp.name,
            sp.version,
            sp.capability.type_name(),
            sp.request,
            sp.quota.concurrency,
            sp.quota
                .per_second
                .map(|r| format!(", {r}/s"))
                .unwrap_or_default(),
            sp.timeout_ms,
            sp.attempts,
            sp.ttl_s,
            sp.field,
            sp.then
                .as_deref()
                .map(|t| format!("goes on to `{t}`"))
                .unwrap_or_else(|| "the observation is the answer".into())
        );
        if let Some(e) = &sp.enter {
            let b = &spec.budget;
            let _ = writeln!(
                out,
                "    re-enters: each record of `{}` becomes a {} unit `<parent>>{}` at its parent's depth + 1, for `{}`; max_depth={} max_fanout={}",
                sp.field,
                e.kind,
                e.key
                    .as_deref()
                    .map_or("c<hash>".to_owned(), |k| format!("<{k}>")),
                e.stage,
                b.max_depth.map_or("unlimited".into(), |d| d.to_string()),
                b.max_fanout.map_or("unlimited".into(), |f| f.to_string()),
            );
        }
    }

    fn count_cached(
        &self,
        spec: &Spec,
        _spec_dir: &Path,
        store: &Store,
        table: &UnitTable,
        units: &[usize],
    ) -> Result<CachedCount, RunError> {
        let mut cached = 0;
        let mut bred = self.stage.spec.enter.as_ref().map(|e| BredPreview {
            to: e.stage.clone(),
            ..BredPreview::default()
        });
        for &i in units {
            let u = table.unit(i)?;
            let Ok(Some(r)) = self.stage.request(u.unit_id.as_str(), &table.value(i)) else {
                continue;
            };
            let Some(fact) = store.get_fact(&Self::observation_key(&r.key))? else {
                continue;
            };
            cached += 1;
            if let (Some(preview), Some(enter), Some(o)) = (
                bred.as_mut(),
                self.stage.spec.enter.as_ref(),
                Observation::from_fact(&fact),
            ) && o.status == ObservationStatus::Ok
                && let Ok(shown) = self.stage.extract(u.unit_id.as_str(), &o.body)
            {
                let litter = self.bear(spec, table, i, enter, &r.key, &shown)?;
                preview.note(&litter);
            }
        }
        Ok(CachedCount {
            cached,
            passed: if self.stage.spec.then.is_some() {
                units.to_vec()
            } else {
                Vec::new()
            },
            calls: Some(0),
            bred: bred.map(Box::new),
            ..CachedCount::default()
        })
    }

    fn planned_calls(&self, _table: &UnitTable, _units: &[usize]) -> Result<Option<u64>, RunError> {
        Ok(Some(0))
    }

    fn run(&self, ctx: &mut StageContext<'_>, units: Vec<usize>) -> Result<StageOutcome, RunError> {
        let started = Instant::now();
        let sp = &self.stage.spec;
        ctx.progress
            .stage_started(self.stage.name(), units.len() as u64, 0);
        let mut report = ToolReport {
            capability: sp.capability.type_name().into(),
            units: units.len() as u64,
            ..ToolReport::default()
        };
        let now = fanfold_store::now_ms();
        let fresh_ms = sp.ttl_s.saturating_mul(1000);

        // Each unit's request; identical requests become one job.
        let mut of_unit: Vec<(usize, Result<Option<ContentHash>, String>)> = Vec::new();
        let mut jobs: VecDeque<Job> = VecDeque::new();
        let mut answers: HashMap<ContentHash, Observation> = HashMap::new();
        // Each distinct request, with the first unit that asked it.
        let mut first_asked: HashMap<ContentHash, usize> = HashMap::new();
        for &i in &units {
            let id = ctx.table.id(i)?.clone();
            let request = match self.stage.request(id.as_str(), &ctx.table.value(i)) {
                Ok(Some(r)) => r,
                Ok(None) => {
                    report.no_request += 1;
                    of_unit.push((i, Ok(None)));
                    continue;
                }
                Err(e) => {
                    report.refused += 1;
                    note(&mut report.problems, format!("{id}: {e}"));
                    of_unit.push((i, Err(e.to_string())));
                    continue;
                }
            };
            let key = request.key;
            of_unit.push((i, Ok(Some(key))));
            if first_asked.contains_key(&key) {
                report.deduplicated += 1;
                continue;
            }
            first_asked.insert(key, i);
            report.requests += 1;
            let stored = ctx
                .store
                .get_fact(&Self::observation_key(&key))?
                .as_ref()
                .and_then(Observation::from_fact);
            match stored {
                Some(o) if now.saturating_sub(o.fetched_ms) < fresh_ms => {
                    report.cached += 1;
                    answers.insert(key, o);
                }
                stale => jobs.push_back(Job {
                    request,
                    stale: stale.filter(|o| o.version.is_some()),
                }),
            }
        }

        // The rest go out under the quota.
        let gate = Gate {
            ctx_budget: ctx.budget,
            ledger: ctx.ledger,
            max_requests: sp.max_requests,
            sent: AtomicU64::new(0),
            pace: crate::kit::Pace::new(sp.quota.per_second),
            in_flight: AtomicUsize::new(0),
            max_in_flight: AtomicUsize::new(0),
            stop: Mutex::new(None),
        };
        let executor = Executor::new(self, ctx.spec_dir);
        let queue = Mutex::new(jobs);
        let done: Mutex<Vec<Answered>> = Mutex::new(Vec::new());
        let not_sent = AtomicU64::new(0);
        let cancelled = AtomicU64::new(0);
        let workers = sp.quota.concurrency.min(queue_len(&queue)).max(1);
        std::thread::scope(|s| {
            for _ in 0..workers {
                s.spawn(|| {
                    loop {
                        let Some(job) = lock(&queue).pop_front() else {
                            break;
                        };
                        match gate.admit() {
                            Admission::Send => {}
                            Admission::Cancelled => {
                                cancelled.fetch_add(1, Ordering::SeqCst);
                                continue;
                            }
                            Admission::Withheld => {
                                not_sent.fetch_add(1, Ordering::SeqCst);
                                continue;
                            }
                        }
                        gate.enter();
                        let answered = executor.answer(job);
                        gate.leave();
                        lock(&done).push(answered);
                    }
                });
            }
        });
        report.not_sent = not_sent.into_inner();
        report.cancelled = cancelled.into_inner();
        report.max_in_flight = gate.max_in_flight.load(Ordering::SeqCst) as u64;
        for a in done.into_inner().unwrap_or_else(|e| e.into_inner()) {
            report.sent += 1;
            report.retries += u64::from(a.attempts.saturating_sub(1));
            if a.revalidated {
                report.revalidated += 1;
            }
            if a.observation.status.is_stable() {
                // Stored under the request's key; the fact names the
                // first unit that asked.
                if let Some(&i) = first_asked.get(&a.key) {
                    let fact =
                        a.observation
                            .fact(self, Self::observation_key(&a.key), ctx.table.unit(i)?);
                    ctx.store.put_fact(&fact)?;
                }
            } else if let Some(d) = &a.observation.detail {
                note(&mut report.problems, d.clone());
            }
            answers.insert(a.key, a.observation);
        }
        for o in answers.values() {
            *report
                .statuses
                .entry(o.status.as_str().to_owned())
                .or_insert(0) += 1;
        }

        // Every unit: its observation added, then passed on or ended here.
        let stop = gate.stop.into_inner().unwrap_or_else(|e| e.into_inner());
        let mut passed = Vec::new();
        let mut born = Vec::new();
        for (i, request) in of_unit {
            let unit = ctx.table.unit(i)?;
            let observation = match &request {
                Ok(Some(key)) => match answers.get(key) {
                    Some(o) => Some(o.clone()),
                    None => {
                        // Never sent: the budget, `max_requests` or the
                        // contract ended it.
                        let status = match &stop {
                            Some(StopReason::ContractSatisfied { .. }) => Status::Cancelled,
                            _ => Status::NotRun,
                        };
                        let mut fact = Observation::failed(
                            ObservationStatus::Error,
                            "not sent: the run's budget, the stage's max_requests or the contract ended it".into(),
                        )
                        .fact(self, self.unit_key(unit), unit);
                        fact.status = status;
                        fact.decision = None;
                        ctx.progress.unit_finished(self.stage.name(), status);
                        ctx.ledger.record(i, fact, Origin::Derived);
                        continue;
                    }
                },
                Ok(None) => None,
                Err(e) => Some(Observation::failed(
                    ObservationStatus::Denied,
                    format!("refused: {e}"),
                )),
            };
            let shown = match &observation {
                Some(o) if o.status == ObservationStatus::Ok => self
                    .stage
                    .extract(unit.unit_id.as_str(), &o.body)
                    .unwrap_or_else(|e| {
                        note(&mut report.problems, format!("{}: {e}", unit.unit_id));
                        Value::Null
                    }),
                _ => Value::Null,
            };
            if let Some(enter) = &sp.enter
                && let (Some(o), Ok(Some(key))) = (&observation, &request)
                && o.status == ObservationStatus::Ok
            {
                let litter = self.bear(ctx.spec, ctx.table, i, enter, key, &shown)?;
                report.bore += litter.born.len() as u64;
                for (_, why) in &litter.dropped {
                    *report.dropped.entry(why.clone()).or_insert(0) += 1;
                }
                born.push(litter);
            }
            if sp.then.is_some() {
                ctx.table.add_field(i, &sp.field, shown);
                passed.push(i);
                ctx.progress
                    .unit_finished(self.stage.name(), Status::Positive);
                continue;
            }
            let o = observation.unwrap_or_else(|| {
                Observation::failed(ObservationStatus::NotFound, "nothing to ask".into())
            });
            let mut fact = o.fact(self, self.unit_key(unit), unit);
            fact.facts = json!({ sp.field.as_str(): shown });
            ctx.progress.unit_finished(self.stage.name(), fact.status);
            ctx.ledger.record(i, fact, Origin::Derived);
        }
        report.wall_ms = started.elapsed().as_millis() as u64;
        ctx.stats.reports.put(REPORT, self.stage.name(), &report);
        ctx.progress.stage_finished(self.stage.name());
        Ok(StageOutcome {
            passed,
            stop,
            born,
            ..StageOutcome::default()
        })
    }

    fn reread_born(
        &self,
        store: &Store,
        parent_id: &fanfold_core::UnitId,
        parent: &Value,
        id: &fanfold_core::UnitId,
    ) -> Option<Value> {
        let enter = self.stage.spec.enter.as_ref()?;
        let request = self.stage.request(parent_id.as_str(), parent).ok()??;
        let fact = store
            .get_fact(&Self::observation_key(&request.key))
            .ok()??;
        let o = Observation::from_fact(&fact)?;
        if o.status != ObservationStatus::Ok {
            return None;
        }
        let shown = self.stage.extract(parent_id.as_str(), &o.body).ok()?;
        fanfold_ops::tool::offspring(parent_id.as_str(), &shown, enter.key.as_deref(), None)
            .born
            .into_iter()
            .find(|(bred, _)| bred == id.as_str())
            .map(|(_, record)| record)
    }

    fn bred_id(
        &self,
        parent: &fanfold_core::UnitId,
        record: &Value,
    ) -> Option<fanfold_core::UnitId> {
        let enter = self.stage.spec.enter.as_ref()?;
        Some(fanfold_core::UnitId(fanfold_ops::tool::offspring_id(
            parent.as_str(),
            record,
            enter.key.as_deref(),
        )))
    }

    fn report_key(&self) -> Option<&'static str> {
        Some(REPORT)
    }

    fn shortfalls(&self, stats: &RunStats) -> Vec<String> {
        let Some(r) = stats.reports.get::<ToolReport>(REPORT, self.stage.name()) else {
            return Vec::new();
        };
        let failed: u64 = ["timeout", "error"]
            .iter()
            .filter_map(|s| r.statuses.get(*s))
            .sum();
        let mut out = Vec::new();
        if failed > 0 {
            out.push(format!(
                "tool stage `{}`: {failed} of {} requests failed (timeout or error); their units went on without the observation",
                self.stage.name(),
                r.requests
            ));
        }
        if r.not_sent > 0 {
            out.push(format!(
                "tool stage `{}`: {} requests were never sent",
                self.stage.name(),
                r.not_sent
            ));
        }
        out
    }

    fn accounting(&self, stats: &RunStats) -> Option<String> {
        let r = stats.reports.get::<ToolReport>(REPORT, self.stage.name())?;
        Some(
            format!(
                "Tool `{}` ({}): {} units, {} distinct requests ({} shared), {} from the store, {} sent ({} retries, at most {} in flight), {} refused",
                self.stage.name(),
                r.capability,
                r.units,
                r.requests,
                r.deduplicated,
                r.cached,
                r.sent,
                r.retries,
                r.max_in_flight,
                r.refused
            ) + &if r.cancelled > 0 {
                format!(
                    ", {} not sent because the contract was already met",
                    r.cancelled
                )
            } else {
                String::new()
            },
        )
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// Ends every process in the child's group (the child leads it). Called
/// before the child is reaped, or just after it exits, so the group id is
/// still the child's.
fn kill_group(child: &std::process::Child) {
    #[cfg(unix)]
    if let Ok(pid) = libc::pid_t::try_from(child.id()) {
        // SAFETY: `kill` has no memory effects; a group that is gone
        // makes it fail with ESRCH, which is ignored.
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
        }
    }
    #[cfg(not(unix))]
    let _ = child;
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn queue_len(q: &Mutex<VecDeque<Job>>) -> usize {
    lock(q).len()
}

/// Keeps the first few problems, for a person to read.
fn note(problems: &mut Vec<String>, p: String) {
    if problems.len() < 10 {
        problems.push(p);
    }
}

/// Sends requests through the stage's capability.
struct Executor<'a> {
    runner: &'a ToolRunner,
    http: Option<reqwest::blocking::Client>,
    token: Option<String>,
    timeout: Duration,
    spec_dir: &'a Path,
}

impl<'a> Executor<'a> {
    fn new(runner: &'a ToolRunner, spec_dir: &'a Path) -> Executor<'a> {
        let sp = &runner.stage.spec;
        let timeout = Duration::from_millis(sp.timeout_ms);
        let (http, token) = match &sp.capability {
            Capability::HttpGet { token_env, .. } => (
                reqwest::blocking::Client::builder()
                    .redirect(reqwest::redirect::Policy::none())
                    .timeout(timeout)
                    .user_agent(concat!("fanfold/", env!("CARGO_PKG_VERSION")))
                    .build()
                    .ok(),
                token_env.as_ref().and_then(|v| std::env::var(v).ok()),
            ),
            _ => (None, None),
        };
        Executor {
            runner,
            http,
            token,
            timeout,
            spec_dir,
        }
    }

    /// Answers one job, trying again after a 429, a 5xx or a timeout.
    fn answer(&self, job: Job) -> Answered {
        let attempts = self.runner.stage.spec.attempts.max(1);
        let mut tried = 0;
        loop {
            tried += 1;
            let (observation, again, revalidated) = self.attempt(&job);
            match again {
                Some(wait) if tried < attempts => std::thread::sleep(wait),
                _ => {
                    return Answered {
                        key: job.request.key,
                        observation,
                        revalidated,
                        attempts: tried,
                    };
                }
            }
        }
    }

    /// One attempt: the observation, when to try again if it may be, and
    /// whether a stored observation was confirmed.
    fn attempt(&self, job: &Job) -> (Observation, Option<Duration>, bool) {
        let max = self.runner.stage.spec.max_bytes;
        match &job.request.target {
            Target::Http { url } => self.http(url, job.stale.as_ref()),
            Target::Argv(argv) => (self.argv(argv, max), None, false),
            Target::File { path } => (self.file(path, max), None, false),
            Target::Sqlite { params } => (self.sqlite(params, max), None, false),
        }
    }

    fn http(
        &self,
        url: &str,
        stale: Option<&Observation>,
    ) -> (Observation, Option<Duration>, bool) {
        use ObservationStatus as S;
        let fail = |s, d: String| (Observation::failed(s, d), None, false);
        let Capability::HttpGet { url: template, .. } = &self.runner.stage.spec.capability else {
            return fail(S::Error, "not an HTTP capability".into());
        };
        if let Err(why) = same_origin(template, url) {
            return fail(S::Denied, why);
        }
        let Some(client) = &self.http else {
            return fail(S::Error, "the HTTP client could not be built".into());
        };
        let mut req = client
            .get(url)
            .header("Accept", "application/json")
            .timeout(self.timeout);
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        if let Some(v) = stale.and_then(|o| o.version.as_ref()) {
            if let Some(e) = &v.etag {
                req = req.header("If-None-Match", e);
            }
            if let Some(m) = &v.last_modified {
                req = req.header("If-Modified-Since", m);
            }
        }
        let response = match req.send() {
            Ok(r) => r,
            Err(e) if e.is_timeout() => {
                return (
                    Observation::failed(S::Timeout, format!("GET {url}: timed out")),
                    Some(Duration::from_millis(200)),
                    false,
                );
            }
            Err(e) => {
                let again = e.is_connect().then_some(Duration::from_millis(200));
                return (
                    Observation::failed(S::Error, format!("GET {url}: {e}")),
                    again,
                    false,
                );
            }
        };
        let code = response.status().as_u16();
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let retry_after = header("retry-after")
            .and_then(|s| s.trim().parse::<u64>().ok())
            .map(|s| Duration::from_secs(s.min(60)))
            .unwrap_or(Duration::from_millis(500));
        let rate_limited =
            code == 429 || (code == 403 && header("x-ratelimit-remaining").as_deref() == Some("0"));
        if code == 304
            && let Some(o) = stale
        {
            let mut o = o.clone();
            o.fetched_ms = fanfold_store::now_ms();
            return (o, None, true);
        }
        if rate_limited || code >= 500 {
            return (
                Observation::failed(S::Error, format!("GET {url}: HTTP {code}")),
                Some(retry_after),
                false,
            );
        }
        let version = Version {
            etag: header("etag"),
            last_modified: header("last-modified"),
        };
        let status = match code {
            200..=299 => S::Ok,
            404 | 410 => S::NotFound,
            401 | 403 => S::Denied,
            _ => return fail(S::Error, format!("GET {url}: HTTP {code}")),
        };
        let mut bytes = Vec::new();
        let max = self.runner.stage.spec.max_bytes;
        if let Err(e) = response.take(max + 1).read_to_end(&mut bytes) {
            let s = if e.kind() == std::io::ErrorKind::TimedOut {
                S::Timeout
            } else {
                S::Error
            };
            return fail(s, format!("GET {url}: reading the body: {e}"));
        }
        if bytes.len() as u64 > max {
            return fail(S::Error, format!("GET {url}: the body is over {max} bytes"));
        }
        let mut o = Observation {
            status,
            body: if status == S::Ok {
                body_of(&bytes)
            } else {
                Value::Null
            },
            version: (version.etag.is_some() || version.last_modified.is_some()).then_some(version),
            fetched_ms: fanfold_store::now_ms(),
            detail: None,
        };
        if status != S::Ok {
            o.detail = Some(format!("GET {url}: HTTP {code}"));
        }
        (o, None, false)
    }

    fn argv(&self, argv: &[String], max: u64) -> Observation {
        use ObservationStatus as S;
        let Some((program, args)) = argv.split_first() else {
            return Observation::failed(S::Error, "argv is empty".into());
        };
        // A spec named without a folder (`fanfold run argv.toml`) has an
        // empty one: the program runs here, not in "".
        let dir = if self.spec_dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            self.spec_dir
        };
        let mut command = std::process::Command::new(program);
        command
            .args(args)
            .current_dir(dir)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        // Its own process group, so that the program and whatever it
        // started end together: a grandchild holding the pipe would keep
        // the read open past the timeout.
        #[cfg(unix)]
        {
            use std::os::unix::process::CommandExt as _;
            command.process_group(0);
        }
        let child = command.spawn();
        let mut child = match child {
            Ok(c) => c,
            Err(e) => return Observation::failed(S::Error, format!("cannot run `{program}`: {e}")),
        };
        let out = child.stdout.take();
        let err = child.stderr.take();
        let reader = std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(o) = out {
                let _ = o.take(max + 1).read_to_end(&mut bytes);
            }
            bytes
        });
        let err_reader = std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(e) = err {
                let _ = e.take(4096).read_to_end(&mut bytes);
            }
            bytes
        });
        let deadline = Instant::now() + self.timeout;
        let status = loop {
            match child.try_wait() {
                Ok(Some(s)) => break Some(s),
                Ok(None) if Instant::now() >= deadline => {
                    kill_group(&child);
                    let _ = child.kill();
                    let _ = child.wait();
                    break None;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(5)),
                Err(_) => {
                    kill_group(&child);
                    break None;
                }
            }
        };
        // What the program left running in its group ends with it: the
        // answer is what it wrote before it exited.
        kill_group(&child);
        let bytes = reader.join().unwrap_or_default();
        let stderr = String::from_utf8_lossy(&err_reader.join().unwrap_or_default()).into_owned();
        let shown = argv.join(" ");
        match status {
            None => Observation::failed(S::Timeout, format!("`{shown}` timed out")),
            Some(_) if bytes.len() as u64 > max => {
                Observation::failed(S::Error, format!("`{shown}` wrote over {max} bytes"))
            }
            Some(s) if s.success() => Observation {
                status: S::Ok,
                body: body_of(&bytes),
                version: None,
                fetched_ms: fanfold_store::now_ms(),
                detail: None,
            },
            Some(s) => {
                let status = if stderr.contains("HTTP 404") || stderr.contains("Not Found") {
                    S::NotFound
                } else {
                    S::Error
                };
                Observation::failed(
                    status,
                    format!("`{shown}` exited with {s}: {}", stderr.trim()),
                )
            }
        }
    }

    fn file(&self, path: &str, max: u64) -> Observation {
        use ObservationStatus as S;
        let Some(root) = &self.runner.resource else {
            return Observation::failed(S::Error, "no root".into());
        };
        let root = match root.canonicalize() {
            Ok(r) => r,
            Err(e) => {
                return Observation::failed(S::Error, format!("root {}: {e}", root.display()));
            }
        };
        let full = match root.join(path).canonicalize() {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Observation::failed(S::NotFound, format!("{path}: no such file"));
            }
            Err(e) => return Observation::failed(S::Error, format!("{path}: {e}")),
        };
        // A link may point anywhere: what is opened is where it leads.
        if !full.starts_with(&root) {
            return Observation::failed(
                S::Denied,
                format!("{path} resolves outside the root {}", root.display()),
            );
        }
        // A FIFO or a device would hold the read past every limit: only a
        // regular file is opened, without waiting on it.
        let read = crate::folder::read_bounded(&full, max);
        match read {
            Err(e) if crate::folder::is_not_regular(&e) => {
                Observation::failed(S::Denied, format!("{path}: {e}"))
            }
            Err(e) => Observation::failed(S::Error, format!("{path}: {e}")),
            Ok(bytes) if bytes.len() as u64 > max => {
                Observation::failed(S::Error, format!("{path} is over {max} bytes"))
            }
            Ok(bytes) => Observation {
                status: S::Ok,
                body: body_of(&bytes),
                version: None,
                fetched_ms: fanfold_store::now_ms(),
                detail: None,
            },
        }
    }

    fn sqlite(&self, params: &[(String, Value)], max: u64) -> Observation {
        use ObservationStatus as S;
        let (Some(db), Capability::Sqlite { query, .. }) =
            (&self.runner.resource, &self.runner.stage.spec.capability)
        else {
            return Observation::failed(S::Error, "not a SQLite capability".into());
        };
        match query_rows(db, query, params, self.timeout, max) {
            Ok(rows) => Observation {
                status: S::Ok,
                body: rows,
                version: None,
                fetched_ms: fanfold_store::now_ms(),
                detail: None,
            },
            Err((status, detail)) => Observation::failed(status, detail),
        }
    }
}

/// Runs a read-only query: the database is opened read-only with
/// `query_only` on, and a statement that would write is refused before it
/// runs.
fn query_rows(
    db: &Path,
    query: &str,
    params: &[(String, Value)],
    timeout: Duration,
    max: u64,
) -> Result<Value, (ObservationStatus, String)> {
    use ObservationStatus as S;
    use rusqlite::OpenFlags;
    let err = |e: rusqlite::Error| (S::Error, format!("{}: {e}", db.display()));
    let conn = rusqlite::Connection::open_with_flags(
        db,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(err)?;
    conn.busy_timeout(timeout).map_err(err)?;
    conn.pragma_update(None, "query_only", true).map_err(err)?;
    let mut stmt = conn.prepare(query).map_err(err)?;
    if !stmt.readonly() {
        return Err((S::Denied, format!("`{query}` would write")));
    }
    for (name, value) in params {
        let Some(at) = stmt.parameter_index(name).map_err(err)? else {
            continue;
        };
        let bound = match value {
            Value::String(s) => stmt.raw_bind_parameter(at, s),
            Value::Bool(b) => stmt.raw_bind_parameter(at, b),
            Value::Number(n) => match (n.as_i64(), n.as_f64()) {
                (Some(i), _) => stmt.raw_bind_parameter(at, i),
                (None, Some(f)) => stmt.raw_bind_parameter(at, f),
                _ => stmt.raw_bind_parameter(at, n.to_string()),
            },
            other => stmt.raw_bind_parameter(at, other.to_string()),
        };
        bound.map_err(err)?;
    }
    let names: Vec<String> = stmt.column_names().iter().map(|s| s.to_string()).collect();
    let mut rows = stmt.raw_query();
    let mut out = Vec::new();
    let mut size = 0u64;
    while let Some(row) = rows.next().map_err(err)? {
        let mut obj = serde_json::Map::new();
        for (k, name) in names.iter().enumerate() {
            use rusqlite::types::ValueRef;
            let v = match row.get_ref(k).map_err(err)? {
                ValueRef::Null => Value::Null,
                ValueRef::Integer(i) => json!(i),
                ValueRef::Real(f) => json!(f),
                ValueRef::Text(t) => Value::String(String::from_utf8_lossy(t).into_owned()),
                ValueRef::Blob(b) => json!(format!("<{} bytes>", b.len())),
            };
            size += v.to_string().len() as u64;
            obj.insert(name.clone(), v);
        }
        if size > max {
            return Err((S::Error, format!("the rows are over {max} bytes")));
        }
        out.push(Value::Object(obj));
    }
    Ok(Value::Array(out))
}

/// A body as JSON when it parses, else as text.
pub(crate) fn body_of(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(bytes).into_owned()))
}

/// Checks a filled URL reaches the template's scheme, host and port, with
/// its path exactly as filled (nothing a resolver would rewrite).
pub(crate) fn same_origin(template: &str, filled: &str) -> Result<(), String> {
    let placeholder = |s: &str| {
        let mut out = String::new();
        let mut in_hole = false;
        for c in s.chars() {
            match c {
                '{' => in_hole = true,
                '}' => {
                    in_hole = false;
                    out.push('x');
                }
                c if !in_hole => out.push(c),
                _ => {}
            }
        }
        out
    };
    let want = reqwest::Url::parse(&placeholder(template))
        .map_err(|e| format!("the template `{template}` is not a URL: {e}"))?;
    let got = reqwest::Url::parse(filled).map_err(|e| format!("`{filled}` is not a URL: {e}"))?;
    if got.origin() != want.origin() {
        return Err(format!(
            "`{filled}` leaves {}, the only origin granted",
            want.origin().ascii_serialization()
        ));
    }
    let raw_path = filled
        .split_once("://")
        .and_then(|(_, rest)| rest.find('/').map(|at| &rest[at..]))
        .unwrap_or("/");
    let raw_path = raw_path.split(['?', '#']).next().unwrap_or("/");
    if got.path() != raw_path {
        return Err(format!(
            "`{filled}` resolves to another path, {}",
            got.path()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_filled_url_keeps_its_origin_and_path() {
        let t = "http://127.0.0.1:8080/repos/{owner}/{number}/comments";
        assert!(same_origin(t, "http://127.0.0.1:8080/repos/a/1/comments").is_ok());
        assert!(same_origin(t, "http://127.0.0.1:9090/repos/a/1/comments").is_err());
        assert!(same_origin(t, "http://127.0.0.1:8080/repos/a/../../admin").is_err());
        assert!(same_origin(t, "http://evil.example/repos/a/1/comments").is_err());
    }

    #[test]
    fn a_writing_query_is_refused_and_params_are_bound() {
        let dir = tempfile::tempdir().expect("dir");
        let db = dir.path().join("t.db");
        let c = rusqlite::Connection::open(&db).expect("open");
        c.execute_batch(
            "create table t(n integer, s text); insert into t values (1, 'one'), (2, 'two');",
        )
        .expect("setup");
        drop(c);
        let t = Duration::from_secs(1);
        let rows = query_rows(
            &db,
            "select s from t where n = :n",
            &[(":n".into(), json!(2))],
            t,
            1000,
        )
        .expect("rows");
        assert_eq!(rows, json!([{"s": "two"}]));
        // A value is a value, never SQL.
        let rows = query_rows(
            &db,
            "select s from t where s = :s",
            &[(":s".into(), json!("x' or '1'='1"))],
            t,
            1000,
        )
        .expect("rows");
        assert_eq!(rows, json!([]));
        for write in [
            "delete from t",
            "insert into t values (3, 'x')",
            "drop table t",
        ] {
            let e = query_rows(&db, write, &[], t, 1000).expect_err("refused");
            assert!(
                matches!(e.0, ObservationStatus::Denied | ObservationStatus::Error),
                "{e:?}"
            );
        }
        let rows = query_rows(&db, "select count(*) as n from t", &[], t, 1000).expect("rows");
        assert_eq!(rows, json!([{"n": 2}]));
    }
}
