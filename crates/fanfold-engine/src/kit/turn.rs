//! A model turn as a service of the kit. A kind compiles its turn once
//! ([`Turn::build`] from a map declaration, [`Turn::from_parts`] from a
//! [`TurnSpec`] of its own) and asks the kit to run it over units
//! ([`Turn::run`]): cached facts are reused by key, units whose view
//! equals another's share its call, the rest go through a [`StageJob`] to
//! the backend. Map stages, audit and widen judges, a select's scorer and
//! a cascade's oracle all run through here.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::Path;

use fanfold_core::spec::{BreakerSpec, ContractSpec, Decode, Execution, MapStageSpec, Spec};
use fanfold_core::{ContentHash, Cost, FACT_SCHEMA, FactRecord, ModelParams, StableHash, UnitId};
use fanfold_model::BackendInfo;
use fanfold_ops::contract::StopReason;
use fanfold_ops::jq::{JqProgram, Site, to_val};
use fanfold_ops::map::{ModelTurn, TurnSpec};
use fanfold_ops::view::{INPUT_BUCKET, Projector};
use fanfold_store::Store;
use serde_json::Value;

use crate::batches::StoreLedger;
use crate::error::{PlanError, RunError, project_err};
use crate::kit::ledger::Origin;
use crate::kit::{BuildContext, CachedCount, EvidenceView, StageContext, UnitTable};
use crate::queue::{Pending, Prompt, StageJob, UnitResult};

/// What a model turn shows each unit, and what the unit's fact cites: the
/// stage's own projection of the unit by default; a widen stage's view of
/// the unit with its group members.
pub trait Views: Sync {
    /// The view of table position `i`; its hash keys the fact.
    fn view(&self, i: usize) -> Result<Value, RunError>;
    /// The ids and hashes `i`'s fact cites, the unit's own first.
    fn cites(&self, i: usize) -> (Vec<UnitId>, Vec<ContentHash>);
    /// What the model reads of `i` when it is not the view (a compressed
    /// view): evidence is still quoted from, and checked against, the view.
    fn shown(&self, _i: usize) -> Option<Value> {
        None
    }
}

/// A unit alone, through the stage's projection.
pub struct UnitViews<'a> {
    pub projector: Projector,
    pub table: &'a UnitTable,
}

impl Views for UnitViews<'_> {
    fn view(&self, i: usize) -> Result<Value, RunError> {
        self.projector
            .project(self.table.id(i)?.as_str(), &self.table.value(i))
            .map_err(project_err)
    }

    fn cites(&self, i: usize) -> (Vec<UnitId>, Vec<ContentHash>) {
        self.table
            .unit(i)
            .map(|u| (vec![u.unit_id.clone()], vec![u.unit_hash]))
            .unwrap_or_default()
    }
}

/// A compiled model turn and what running it needs beside its prompt: the
/// records with known answers mixed into its first paid units, and the
/// breaker that watches them.
pub struct Turn {
    pub model: ModelTurn,
    canaries: Vec<Canary>,
    breaker: Option<BreakerSpec>,
}

/// The decoding parameters a fact of `turn` is keyed by.
pub fn model_params(info: &BackendInfo, turn: &ModelTurn) -> ModelParams {
    ModelParams {
        backend: info.kind.clone(),
        model_id: info.model_id.clone(),
        temperature: turn.spec.temperature,
        max_output_tokens: turn.spec.max_output_tokens,
        seed: turn.spec.seed,
        simulated: info.simulated,
    }
}

impl Turn {
    /// The turn a map declaration describes (a map stage, an audit's or a
    /// widen's judge): its rubric, schema and canaries read from the
    /// spec's folder, all of them hashed into the spec.
    pub fn build(s: &MapStageSpec, ctx: &mut BuildContext<'_>) -> Result<Turn, PlanError> {
        let rubric = ctx.read("rubric", &s.rubric)?;
        let schema_text = ctx.read("output schema", &s.output_schema)?;
        let schema = serde_json::from_str(&schema_text).map_err(|e| PlanError::Json {
            path: ctx.path(),
            file: s.output_schema.clone(),
            detail: e.to_string(),
        })?;
        fanfold_core::spec::check::map_turn(s, &schema, ctx.spec.backends.get(&s.backend))
            .map_err(|detail| ctx.invalid(detail))?;
        let parts = TurnParts {
            rubric,
            schema,
            schema_text,
            canaries: s.canaries.as_deref(),
            breaker: s.breaker.clone(),
        };
        Turn::from_parts(TurnSpec::of_map(s), parts, ctx)
    }

    /// The turn of a judge inside another stage (an audit's, a widen's):
    /// a map declaration, without what only a map stage of the spec does.
    pub fn build_judge(s: &MapStageSpec, ctx: &mut BuildContext<'_>) -> Result<Turn, PlanError> {
        let turn = Turn::build(s, ctx)?;
        if s.cascade.is_some() {
            return Err(ctx.invalid(format!(
                "stage `{}` cascade: a cascade belongs to a map stage of the spec, not to a judge inside another stage",
                s.name
            )));
        }
        Ok(turn)
    }

    /// A turn from its spec and its rubric and schema as given, for kinds
    /// that state their own turn (a select's scorer); both go into the
    /// spec hash.
    pub fn from_parts(
        spec: TurnSpec,
        parts: TurnParts<'_>,
        ctx: &mut BuildContext<'_>,
    ) -> Result<Turn, PlanError> {
        ctx.require_backend(&spec.name, &spec.backend)?;
        ctx.hashed
            .insert(format!("rubric:{}", spec.name), parts.rubric.clone());
        ctx.hashed
            .insert(format!("schema:{}", spec.name), parts.schema_text);
        let canaries = match parts.canaries {
            Some(file) => {
                let text = ctx.read("canaries", file)?;
                let canaries = read_canaries(&spec, file, &text, ctx)?;
                ctx.hashed.insert(format!("canaries:{}", spec.name), text);
                canaries
            }
            None => Vec::new(),
        };
        if let Some(b) = &parts.breaker
            && (b.window == 0 || !(0.0..=1.0).contains(&b.max_error_rate))
        {
            return Err(ctx.invalid(format!(
                "stage `{}` breaker: window must be at least 1 and max_error_rate within [0, 1]",
                spec.name
            )));
        }
        let model =
            ModelTurn::new(spec, parts.rubric, parts.schema).map_err(|source| PlanError::Map {
                path: ctx.path(),
                source,
            })?;
        Ok(Turn {
            model,
            canaries,
            breaker: parts.breaker,
        })
    }

    pub fn name(&self) -> &str {
        self.model.name()
    }

    pub fn definition_hash(&self) -> ContentHash {
        self.model.definition_hash()
    }

    pub fn projector(&self) -> Result<Projector, RunError> {
        let sp = &self.model.spec;
        Projector::compile(sp.name.as_str(), sp.project.as_deref(), &sp.fields).map_err(project_err)
    }

    /// Each unit alone, through the turn's projection.
    pub fn unit_views<'a>(&self, table: &'a UnitTable) -> Result<UnitViews<'a>, RunError> {
        Ok(UnitViews {
            projector: self.projector()?,
            table,
        })
    }

    /// How verify finds the evidence of the turn's facts again.
    pub fn evidence_view(&self) -> EvidenceView {
        let sp = &self.model.spec;
        EvidenceView {
            project: sp.project.clone(),
            fields: sp.fields.clone(),
            widened: false,
            grouped: false,
        }
    }

    /// The turn's lines in `fanfold explain`.
    pub fn explain(&self, spec: &Spec, out: &mut String) {
        let sp = &self.model.spec;
        let (backend, simulated) = crate::kit::backend_label(spec, &sp.backend);
        let sees = crate::kit::sees(sp.project.as_deref(), &sp.fields);
        let execution = match sp.execution {
            Execution::Online => "",
            Execution::Batch => " execution=batch",
        };
        let _ = writeln!(
            out,
            "  {} map v{} backend={}({}){simulated}{execution} attempts={} max_output_tokens={}\n    sees {sees}",
            sp.name, sp.version, sp.backend, backend, sp.max_attempts, sp.max_output_tokens
        );
        let scored = match sp.decode {
            Decode::Generate => "",
            Decode::Choice => {
                " decode=choice (read from the scores of the values, nothing generated)"
            }
        };
        let _ = writeln!(
            out,
            "    decision {} positive=[{}] negative=[{}] abstain=[{}]{scored}",
            sp.decision.pointer,
            sp.decision.positive.join(", "),
            sp.decision.negative.join(", "),
            sp.decision.abstain.join(", ")
        );
        let _ = writeln!(
            out,
            "    shared prefix {} bytes (rubric {})",
            self.model.prefix().len(),
            sp.rubric
        );
    }

    /// Counts the stored facts of `units`, each keyed by its view.
    /// Calls `note` with each stored fact found.
    pub fn count_cached(
        &self,
        spec: &Spec,
        spec_dir: &Path,
        store: &Store,
        units: &[usize],
        views: &dyn Views,
        note: &mut dyn FnMut(usize, &FactRecord),
    ) -> Result<CachedCount, RunError> {
        let sp = &self.model.spec;
        let info = match crate::kit::cached_identity(spec, spec_dir, &sp.backend, sp.execution) {
            Ok(info) => info,
            Err(count) => return Ok(count),
        };
        let model = model_params(&info, &self.model);
        let mut count = CachedCount::default();
        for &i in units {
            let projected = views.view(i)?;
            let key = self.model.cache_key(projected.key_in(INPUT_BUCKET), &model);
            if let Some(fact) = store.get_fact(&key)? {
                count.cached += 1;
                note(i, &fact);
            }
        }
        Ok(count)
    }

    /// Runs the turn over `units` through the queue, each shown as `views`
    /// shows it: stored facts are reused, units alike share one call, the
    /// rest are claimed and asked, canaries mixed in; every fact is
    /// recorded in `ctx.ledger` and handed to `note`. Returns why the turn
    /// stopped early, if it did.
    pub fn run(
        &self,
        ctx: &mut StageContext<'_>,
        units: Vec<usize>,
        views: &dyn Views,
        note: &(dyn Fn(usize, &FactRecord) + Sync),
    ) -> Result<Option<StopReason>, RunError> {
        let stage = &self.model;
        // An interval contract's stage judges its units in the contract's
        // seeded random order, and tells the contract that order, so the
        // facts it reads are a sample without replacement of them.
        let interval_seed = ctx
            .ledger
            .controller()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .interval_stage()
            .and_then(|(name, seed)| (name == stage.name()).then_some(seed));
        let units = match interval_seed {
            Some(seed) => {
                let ordered = crate::interval::draw_order(&units, ctx.table, seed);
                ctx.ledger
                    .controller()
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .set_draw_order(ordered.clone(), ctx.table.len() as u64);
                ordered
            }
            None => units,
        };
        let execution = stage.spec.execution;
        let backend = ctx
            .backends
            .get(ctx.spec, ctx.spec_dir, &stage.spec.backend, execution)?;
        let info = backend.info();
        let model = model_params(&info, stage);
        let projector = self.projector()?;
        let bound_program = match &ctx.spec.contract {
            ContractSpec::TopK { bound, .. } => {
                Some(JqProgram::compile(bound).map_err(|e| RunError::Bound {
                    unit: "-".into(),
                    detail: e.to_string(),
                })?)
            }
            _ => None,
        };
        let bound_site = "the contract's `bound`";
        let table = ctx.table;

        // Cache lookups; misses become pending requests, and a miss whose
        // key another unit of this run already asks for follows that unit.
        let mut keys: HashMap<usize, ContentHash> = HashMap::new();
        let mut bounds: HashMap<usize, f64> = HashMap::new();
        let mut leader_of_key: HashMap<ContentHash, usize> = HashMap::new();
        let mut followers: HashMap<usize, Vec<usize>> = HashMap::new();
        let mut pending = Vec::new();
        let mut cached = 0u64;
        let unit_keys = units
            .iter()
            .map(|&i| Ok(stage.cache_key(views.view(i)?.key_in(INPUT_BUCKET), &model)))
            .collect::<Result<Vec<ContentHash>, RunError>>()?;
        // Read in a few statements, not one a unit: on a shared store each
        // statement is a round trip.
        let stored = ctx.store.get_facts(&unit_keys)?;
        for (&i, &key) in units.iter().zip(&unit_keys) {
            let unit = table.unit(i)?;
            let value = table.value(i);
            if let Some(mut fact) = stored.get(&key).cloned() {
                cached += 1;
                ctx.stats.cache_hits += 1;
                (fact.source_ids, fact.source_hashes) = views.cites(i);
                note(i, &fact);
                ctx.ledger.record(i, fact, Origin::Cached);
                continue;
            }
            ctx.stats.cache_misses += 1;
            if let Some(&leader) = leader_of_key.get(&key) {
                ctx.stats.deduplicated += 1;
                followers.entry(leader).or_default().push(i);
                continue;
            }
            leader_of_key.insert(key, i);
            let bound = match &bound_program {
                Some(p) => Some(
                    p.first_json(to_val(&value), Site::new(bound_site, &unit.unit_id.0))
                        .ok()
                        .flatten()
                        .and_then(|v| v.as_f64())
                        .ok_or_else(|| RunError::Bound {
                            unit: unit.unit_id.0.clone(),
                            detail: "the bound expression must yield a number".into(),
                        })?,
                ),
                None => None,
            };
            if let Some(b) = bound {
                bounds.insert(i, b);
            }
            pending.push(Pending {
                index: i,
                unit_id: unit.unit_id.0.clone(),
                attempt: 1,
                bound,
                prompt: None,
                not_before: None,
            });
            keys.insert(i, key);
        }
        if bound_program.is_some() {
            // Highest bound first, so the contract can cancel the tail.
            pending.sort_by(|a, b| {
                b.bound
                    .unwrap_or(f64::INFINITY)
                    .total_cmp(&a.bound.unwrap_or(f64::INFINITY))
                    .then_with(|| a.unit_id.cmp(&b.unit_id))
            });
        }
        // Canaries go among the first units the stage pays for, at seeded
        // places, whenever it has any to pay for.
        let first_canary = table.len();
        let mut canary_expect: HashMap<usize, String> = HashMap::new();
        if !pending.is_empty() {
            let window = self
                .breaker
                .as_ref()
                .map_or(20, |b| b.window as usize)
                .min(pending.len());
            for (k, c) in self.canaries.iter().enumerate() {
                let rank = fanfold_ops::audit::sample_rank(
                    stage.spec.seed,
                    &ContentHash::of_bytes(c.id.as_bytes()),
                );
                let at = (rank % (window as u64 + 1)) as usize;
                pending.insert(
                    at.min(pending.len()),
                    Pending {
                        index: first_canary + k,
                        unit_id: c.id.clone(),
                        attempt: 1,
                        bound: None,
                        prompt: None,
                        not_before: None,
                    },
                );
                canary_expect.insert(first_canary + k, c.expect.clone());
            }
        }
        // What the canaries cost, and how many reached the model.
        let canary_spend: std::sync::Mutex<(Cost, u64)> =
            std::sync::Mutex::new((Cost::default(), 0));
        ctx.progress
            .stage_started(stage.name(), units.len() as u64, cached);

        // What a unit's calls cost, priced by the backend.
        let cost_of = |r: &UnitResult| Cost {
            prompt_tokens: r.usage.prompt_tokens,
            cached_tokens: r.usage.cached_tokens,
            completion_tokens: r.usage.completion_tokens,
            usd: backend.cost_usd(&r.usage).unwrap_or(0.0),
            latency_ms: r.usage.latency_ms,
            calls: u64::from(r.attempts),
        };
        // `None` only for a position the table does not hold.
        let make_fact = |i: usize, r: &UnitResult| -> Option<FactRecord> {
            let (source_ids, source_hashes) = views.cites(i);
            let key = match keys.get(&i) {
                Some(key) => *key,
                None => table.unit(i).ok()?.unit_hash,
            };
            let (decision, facts_v, confidence, evidence, choice_scores) = match &r.interpreted {
                Some(it) => (
                    it.decision.clone(),
                    it.facts.clone(),
                    it.confidence,
                    it.evidence.clone(),
                    it.choice_scores.clone(),
                ),
                None => (None, Value::Null, None, Vec::new(), Vec::new()),
            };
            Some(FactRecord {
                schema: FACT_SCHEMA.into(),
                key,
                source_ids,
                source_hashes,
                stage: stage.name().to_owned(),
                stage_version: stage.spec.version,
                rubric_hash: stage.rubric_hash,
                model: model.clone(),
                status: r.status,
                decision,
                facts: facts_v,
                confidence,
                choice_scores,
                reason: r.reason.clone(),
                evidence,
                cost: cost_of(r),
                attempts: r.attempts,
                reducer_path: Vec::new(),
                truncated_tokens: r.truncated_tokens,
                digest: None,
            })
        };
        let ledger = ctx.ledger;
        let progress = ctx.progress;
        let (store, run_id) = (ctx.store, ctx.run_id);
        let score_pointer = match &ctx.spec.contract {
            ContractSpec::TopK { score, .. } => Some(score.as_str()),
            _ => None,
        };
        let finish = |i: usize, r: &UnitResult| {
            if i >= first_canary {
                // A canary's verdict is checked by the job; only its cost
                // is kept.
                let mut spend = canary_spend.lock().unwrap_or_else(|e| e.into_inner());
                spend.1 += u64::from(r.attempts > 0);
                spend.0.add(&cost_of(r));
                return;
            }
            if ledger.has(i, stage.name()) {
                return;
            }
            let Some(fact) = make_fact(i, r) else {
                return;
            };
            // A score above the unit's declared bound voids the pruning
            // proof; the controller stops pruning and the run says so.
            if let (Some(p), Some(&bound)) = (score_pointer, bounds.get(&i))
                && let Some(score) = fact.facts.pointer(p).and_then(Value::as_f64)
                && score > bound
                && let Ok(id) = table.id(i)
            {
                ledger
                    .controller()
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .bound_violated(id.as_str(), score, bound);
            }
            for &f in followers.get(&i).map(Vec::as_slice).unwrap_or_default() {
                let mut shared = fact.clone();
                (shared.source_ids, shared.source_hashes) = views.cites(f);
                shared.cost = Cost::default();
                shared.attempts = 0;
                note(f, &shared);
                ledger.record(f, shared, Origin::Shared);
                progress.unit_finished(stage.name(), r.status);
            }
            let status = fact.status;
            note(i, &fact);
            ledger.record(i, fact, Origin::Fresh);
            progress.unit_finished(stage.name(), status);
            // A unit that ended without a fact to share is left to whichever
            // run on the store tries it next.
            if !status.is_cacheable()
                && let Some(key) = keys.get(&i)
                && let Err(e) = store.release_claim(key, run_id)
            {
                tracing::warn!(error = %e, "lease not released");
            }
        };
        // A batch holds every request of the stage at once; the provider,
        // not a slot count, decides how many run together.
        let slots = match execution {
            Execution::Online => ctx.slots,
            Execution::Batch => pending.len(),
        };
        // Prompts are built as units open, from the table: the queue holds
        // ids. The projection succeeded above, so it succeeds again.
        let prepare = |i: usize| -> Prompt {
            let (id, projected) = match i.checked_sub(first_canary) {
                Some(k) => match self.canaries.get(k) {
                    Some(c) => (
                        c.id.as_str(),
                        projector.project(&c.id, &c.record).unwrap_or(Value::Null),
                    ),
                    None => ("", Value::Null),
                },
                None => (
                    table.id(i).map_or("", |id| id.as_str()),
                    views.view(i).unwrap_or(Value::Null),
                ),
            };
            let shown = match i.checked_sub(first_canary) {
                Some(_) => None,
                None => views.shown(i),
            };
            Prompt {
                suffix: stage.suffix(id, shown.as_ref().unwrap_or(&projected)),
                schema: stage.schema_for_unit(&projected),
                input: projected,
            }
        };
        // A unit's fact written meanwhile by another run on this store is
        // taken as it is: the units that run paid for are not paid again.
        let adopted = std::sync::atomic::AtomicU64::new(0);
        let adopt = |i: usize, fact: FactRecord| {
            let record = |at: usize, fact: FactRecord| {
                let mut fact = fact;
                (fact.source_ids, fact.source_hashes) = views.cites(at);
                note(at, &fact);
                let status = fact.status;
                ledger.record(at, fact, Origin::Cached);
                progress.unit_finished(stage.name(), status);
                adopted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            };
            for &f in followers.get(&i).map(Vec::as_slice).unwrap_or_default() {
                record(f, fact.clone());
            }
            record(i, fact);
        };
        let claims = KeyClaims {
            store: ctx.store,
            run_id: ctx.run_id,
            keys: &keys,
            adopt: &adopt,
            waited: std::sync::Mutex::new(std::collections::HashSet::new()),
            ahead: std::sync::Mutex::new(ClaimsAhead {
                order: pending.iter().map(|p| p.index).collect(),
                next: 0,
                found: HashMap::new(),
                fresh_for: std::time::Duration::from_millis(ctx.store.lease_ms() / 2),
            }),
            batch: slots.clamp(1, fanfold_store::CLAIMS_A_STATEMENT),
        };
        // With every unit cached there is nothing to ask: the backend is
        // not started (the embedded model would still decode the prompt's
        // shared prefix, seconds a run on a loaded machine).
        let nothing_to_ask = pending.is_empty();
        let batch_ledger = StoreLedger(ctx.store);
        let mut job = StageJob::new(
            stage,
            slots,
            pending,
            ctx.budget,
            ledger.controller(),
            &finish,
            &prepare,
        );
        job.set_batch_ledger(&batch_ledger);
        job.set_halt(ledger.failed_flag());
        job.set_claims(&claims);
        let canaries_queued = !canary_expect.is_empty();
        job.set_guard(self.breaker.clone(), canary_expect);
        let price = |u: &fanfold_model::Usage| backend.cost_usd(u);
        job.set_price(&price);
        if !nothing_to_ask && !job.settled_by_contract() {
            // On a shared store the facts are written together, within a
            // few milliseconds, by a thread of their own.
            ledger
                .writing_during(|| backend.run(&job))
                .map_err(|source| RunError::Backend {
                    name: stage.spec.backend.clone(),
                    source,
                })?;
        }
        let canary_failures = job.canary_failures();
        let (results, max_in_flight, stop) = job.finish();
        // Units a backend handed back without finishing never reached the
        // callback.
        for (i, r) in &results {
            finish(*i, r);
        }
        if let Some(e) = ledger.take_store_error() {
            return Err(e.into());
        }
        ctx.progress.stage_finished(stage.name());
        let adopted = adopted.into_inner();
        ctx.stats.cache_hits += adopted;
        ctx.stats.cache_misses = ctx.stats.cache_misses.saturating_sub(adopted);
        ctx.stats.max_in_flight = ctx.stats.max_in_flight.max(max_in_flight);
        if canaries_queued {
            let (spend, sent) = canary_spend.into_inner().unwrap_or_else(|e| e.into_inner());
            ctx.stats.model_calls += spend.calls;
            ctx.stats.cost.add(&spend);
            ctx.stats
                .reports
                .update(REPORT, stage.name(), |report: &mut CanaryReport| {
                    report.sent += sent;
                    report.failed.extend(canary_failures);
                });
        }
        Ok(stop)
    }
}

/// What a turn is compiled from besides its [`TurnSpec`].
pub struct TurnParts<'a> {
    pub rubric: String,
    pub schema: Value,
    /// The schema as the spec's file holds it, for the spec hash.
    pub schema_text: String,
    /// The turn's canary file, relative to the spec.
    pub canaries: Option<&'a str>,
    pub breaker: Option<BreakerSpec>,
}

/// A record whose decision is known, from the stage's canary file.
#[derive(Clone, Debug)]
struct Canary {
    id: String,
    record: Value,
    expect: String,
}

/// Reads a canary file: one `{"record": {...}, "expect": "..."}` a line,
/// with an optional `"id"`; `expect` must be a declared decision value.
fn read_canaries(
    s: &TurnSpec,
    file: &str,
    text: &str,
    ctx: &BuildContext<'_>,
) -> Result<Vec<Canary>, PlanError> {
    let d = &s.decision;
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let at = |detail: String| {
            ctx.invalid(format!(
                "stage `{}` canaries {file} line {}: {detail}",
                s.name,
                n + 1
            ))
        };
        let v: Value = serde_json::from_str(line).map_err(|e| at(e.to_string()))?;
        let expect = v
            .get("expect")
            .and_then(Value::as_str)
            .ok_or_else(|| at("needs a string `expect`".into()))?;
        if !d
            .positive
            .iter()
            .chain(&d.negative)
            .chain(&d.abstain)
            .any(|x| x == expect)
        {
            return Err(at(format!(
                "`expect` {expect:?} is not one of the stage's decision values"
            )));
        }
        let record = v
            .get("record")
            .filter(|r| r.is_object())
            .cloned()
            .ok_or_else(|| at("needs an object `record`".into()))?;
        let id = v
            .get("id")
            .and_then(|i| {
                i.as_str()
                    .map(str::to_owned)
                    .or_else(|| i.as_u64().map(|n| n.to_string()))
            })
            .unwrap_or_else(|| format!("canary-{}", out.len() + 1));
        out.push(Canary {
            id,
            record,
            expect: expect.to_owned(),
        });
    }
    Ok(out)
}

/// The key of canary reports in the run's stats.
pub const REPORT: &str = "canaries";

/// What a stage's canaries showed, for the certificate.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CanaryReport {
    /// Canaries the model judged in this run (a stopped stage may leave
    /// some unsent).
    pub sent: u64,
    /// Those judged wrongly: unit id, expected decision, what it got.
    pub failed: Vec<(String, String, String)>,
}

/// Leases on fact keys in the store, so runs sharing it pay for each unit
/// once: a unit is called only by the run that claimed its key; a unit
/// another live run holds waits, and is taken from the store once that run
/// wrote its fact (or claimed again once its lease lapsed).
struct KeyClaims<'a> {
    store: &'a fanfold_store::Store,
    run_id: &'a str,
    keys: &'a HashMap<usize, ContentHash>,
    adopt: &'a (dyn Fn(usize, FactRecord) + Sync),
    /// Units found held by another run: when one comes round again, its
    /// fact is looked for before anything is claimed, since by then the
    /// other run has most often written it (one statement, not three).
    waited: std::sync::Mutex<std::collections::HashSet<usize>>,
    /// Units claimed ahead of their turn, in one statement with the unit
    /// asked for: on a shared store each statement is a round trip.
    ahead: std::sync::Mutex<ClaimsAhead>,
    /// How many units one statement claims: about what the stage opens
    /// at once (its slots), so few leases are held ahead of their calls.
    batch: usize,
}

/// Claims made ahead of the queue, which opens units mostly in the order
/// they were queued.
struct ClaimsAhead {
    /// The units in the order they were queued.
    order: Vec<usize>,
    /// The first place in `order` not claimed ahead yet.
    next: usize,
    /// What claiming found for units not yet asked for, and when.
    found: HashMap<usize, (std::time::Instant, fanfold_store::ClaimOrFact)>,
    /// How long what claiming found is taken as it stands: half a lease.
    /// A process paused past its leases finds its claims ahead stale when
    /// it resumes, and claims again, so it never calls a unit another
    /// process took meanwhile.
    fresh_for: std::time::Duration,
}

impl KeyClaims<'_> {
    /// What claiming `index`'s key finds: claimed ahead, or claimed now
    /// with the next units in the queue's order.
    fn claim_or_fact(
        &self,
        index: usize,
        key: &ContentHash,
    ) -> Result<fanfold_store::ClaimOrFact, fanfold_store::StoreError> {
        let mut ahead = self.ahead.lock().unwrap_or_else(|e| e.into_inner());
        let fresh_for = ahead.fresh_for;
        if let Some((at, found)) = ahead.found.remove(&index)
            && at.elapsed() < fresh_for
        {
            return Ok(found);
        }
        let mut units = vec![index];
        let mut asked = vec![*key];
        while units.len() < self.batch
            && let Some(&i) = ahead.order.get(ahead.next)
        {
            ahead.next += 1;
            if i == index || ahead.found.contains_key(&i) {
                continue;
            }
            if let Some(k) = self.keys.get(&i) {
                units.push(i);
                asked.push(*k);
            }
        }
        let at = std::time::Instant::now();
        let mut found = self
            .store
            .claim_or_fact_many(&asked, self.run_id, self.store.lease_ms())?
            .into_iter();
        let mine = found.next();
        for (i, outcome) in units.into_iter().skip(1).zip(found) {
            ahead.found.insert(i, (at, outcome));
        }
        mine.ok_or_else(|| fanfold_store::StoreError::Decode {
            path: self.store.location().to_owned(),
            detail: "a claim came back empty".to_owned(),
        })
    }
}

impl crate::queue::Claims for KeyClaims<'_> {
    fn claim(&self, index: usize) -> crate::queue::Turn {
        use crate::queue::Turn;
        // Canaries have no key: they are this run's own.
        let Some(key) = self.keys.get(&index) else {
            return Turn::Mine;
        };
        let waited = self
            .waited
            .lock()
            .map(|w| w.contains(&index))
            .unwrap_or(false);
        if waited && let Ok(Some(fact)) = self.store.get_fact(key) {
            (self.adopt)(index, fact);
            return Turn::Done;
        }
        // Whoever holds the key, its fact may be written already (a run
        // keeps its leases until it ends): then it is taken as it is.
        let claim = match self.claim_or_fact(index, key) {
            Ok(fanfold_store::ClaimOrFact::Fact(fact)) => {
                (self.adopt)(index, *fact);
                return Turn::Done;
            }
            Ok(fanfold_store::ClaimOrFact::Claim(claim)) => Ok(claim),
            Err(e) => Err(e),
        };
        match claim {
            Ok(fanfold_store::Claim::Mine) => Turn::Mine,
            Ok(fanfold_store::Claim::Held { run_id, expires_ms }) => {
                tracing::debug!(%run_id, "unit held by another run");
                if let Ok(mut w) = self.waited.lock() {
                    w.insert(index);
                }
                let lapse = expires_ms.saturating_sub(fanfold_store::now_ms());
                Turn::Wait(std::time::Duration::from_millis(lapse.clamp(100, 1000)))
            }
            // The call is made: paying twice beats not answering, and a
            // store that fails for good stops the run at the fact write.
            Err(e) => {
                tracing::warn!(error = %e, "unit not claimed");
                Turn::Mine
            }
        }
    }
}
