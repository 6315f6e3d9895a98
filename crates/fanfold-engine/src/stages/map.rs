//! The map stage: one bounded micro-context per unit. Cached facts are
//! reused by key; units whose projected input equals another's in this run
//! share its call; the rest go through a [`StageJob`] to the backend.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::Path;

use fanfold_core::spec::{ContractSpec, Decode, Execution, MapStageSpec, Spec};
use fanfold_core::{
    ContentHash, Cost, FACT_SCHEMA, FactRecord, ModelParams, StableHash, Status, UnitId,
};
use fanfold_model::BackendInfo;
use fanfold_ops::jq::{JqProgram, Site, to_val};
use fanfold_ops::map::MapStage;
use fanfold_ops::view::{INPUT_BUCKET, Projector};
use fanfold_store::Store;

use super::map_cascade::Scorer;
use serde_json::Value;

use crate::batches::StoreLedger;
use crate::error::PlanError;
use crate::error::RunError;
use crate::error::project_err;
use crate::kit::UnitTable;
use crate::kit::ledger::Origin;
use crate::kit::{
    BuildContext, CachedCount, Calls, Outputs, Shape, Stage, StageContext, StageOutcome,
};
use crate::queue::{Pending, Prompt, StageJob, UnitResult};

/// What a map turn shows each unit, and what the unit's fact cites: the
/// stage's own projection of the unit by default; a widen stage's view of
/// the unit with its group members.
pub(crate) trait Views: Sync {
    /// The view of table position `i`; its hash keys the fact.
    fn view(&self, i: usize) -> Result<Value, RunError>;
    /// The ids and hashes `i`'s fact cites, the unit's own first.
    fn cites(&self, i: usize) -> (Vec<UnitId>, Vec<ContentHash>);
}

/// A unit alone, through the stage's projection.
pub(crate) struct UnitViews<'a> {
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

pub struct MapRunner {
    pub stage: MapStage,
    /// Records with known decisions, mixed into the stage's first paid
    /// units; never answers.
    canaries: Vec<Canary>,
    /// A declared quality target, met by a cascade in front of the model.
    cascade: Option<super::map_cascade::CascadeRun>,
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
    s: &MapStageSpec,
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

/// The key of map stages' canary reports in the run's stats.
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

impl MapRunner {
    pub fn build(s: &MapStageSpec, ctx: &mut BuildContext<'_>) -> Result<MapRunner, PlanError> {
        let rubric = ctx.read("rubric", &s.rubric)?;
        let schema_text = ctx.read("output schema", &s.output_schema)?;
        let schema = serde_json::from_str(&schema_text).map_err(|e| PlanError::Json {
            path: ctx.path(),
            file: s.output_schema.clone(),
            detail: e.to_string(),
        })?;
        fanfold_core::spec::check::map_turn(s, &schema, ctx.spec.backends.get(&s.backend))
            .map_err(|detail| ctx.invalid(detail))?;
        let mut runner = MapRunner::from_parts(s, rubric, schema, schema_text, ctx)?;
        runner.cascade = match &s.cascade {
            Some(c) => {
                // A map stage as the proxy scores the cascade's units
                // through its own model turn.
                let scorer: Option<Box<dyn Scorer>> =
                    match ctx.spec.stages.iter().find(|d| d.name() == c.proxy) {
                        Some(fanfold_core::spec::StageSpec::Map(m))
                            if m.name != s.name && m.cascade.is_none() && c.features.is_none() =>
                        {
                            let m = m.clone();
                            Some(Box::new(MapRunner::build(&m, ctx)?))
                        }
                        _ => None,
                    };
                Some(super::map_cascade::CascadeRun::build(s, c, ctx, scorer)?)
            }
            None => None,
        };
        Ok(runner)
    }

    /// A map stage from its rubric and schema as given, for stages that
    /// build their model turn themselves (a select's scorer); both go into
    /// the spec hash.
    pub fn from_parts(
        s: &MapStageSpec,
        rubric: String,
        schema: Value,
        schema_text: String,
        ctx: &mut BuildContext<'_>,
    ) -> Result<MapRunner, PlanError> {
        ctx.require_backend(&s.name, &s.backend)?;
        ctx.hashed
            .insert(format!("rubric:{}", s.name), rubric.clone());
        ctx.hashed.insert(format!("schema:{}", s.name), schema_text);
        let canaries = match &s.canaries {
            Some(file) => {
                let text = ctx.read("canaries", file)?;
                let canaries = read_canaries(s, file, &text, ctx)?;
                ctx.hashed.insert(format!("canaries:{}", s.name), text);
                canaries
            }
            None => Vec::new(),
        };
        if let Some(b) = &s.breaker
            && (b.window == 0 || !(0.0..=1.0).contains(&b.max_error_rate))
        {
            return Err(ctx.invalid(format!(
                "stage `{}` breaker: window must be at least 1 and max_error_rate within [0, 1]",
                s.name
            )));
        }
        if let Some(w) = &s.widen {
            // Any stage after this one that reads units may take them (a
            // widen stage, a tool stage that fetches more context).
            let at = |name: &str| ctx.spec.stages.iter().position(|d| d.name() == name);
            if !matches!((at(&s.name), at(&w.stage)), (Some(me), Some(to)) if to > me) {
                return Err(ctx.invalid(format!(
                    "stage `{}` widens to `{}`, which is not a stage declared after it",
                    s.name, w.stage
                )));
            }
            if let Some(p) = &w.needs
                && !p.starts_with('/')
            {
                return Err(ctx.invalid(format!(
                    "stage `{}` widen.needs `{p}` must be a JSON pointer such as \"/needs\"",
                    s.name
                )));
            }
        }
        let stage = MapStage::new(s.clone(), rubric, schema).map_err(|source| PlanError::Map {
            path: ctx.path(),
            source,
        })?;
        Ok(MapRunner {
            stage,
            canaries,
            cascade: None,
        })
    }

    pub(crate) fn projector(&self) -> Result<Projector, RunError> {
        let sp = &self.stage.spec;
        Projector::compile(sp.name.as_str(), sp.project.as_deref(), &sp.fields).map_err(project_err)
    }

    /// Whether `fact` asks for a wider context than one unit.
    fn asks_to_widen(&self, fact: &FactRecord) -> bool {
        let Some(w) = &self.stage.spec.widen else {
            return false;
        };
        (w.on_abstain && fact.status == Status::Abstain)
            || w.needs.as_deref().is_some_and(|p| {
                fact.status.is_cacheable()
                    && fact
                        .facts
                        .pointer(p)
                        .and_then(Value::as_array)
                        .is_some_and(|a| !a.is_empty())
            })
    }
}

/// The decoding parameters a fact of `stage` is keyed by.
pub fn model_params(info: &BackendInfo, stage: &MapStage) -> ModelParams {
    ModelParams {
        backend: info.kind.clone(),
        model_id: info.model_id.clone(),
        temperature: stage.spec.temperature,
        max_output_tokens: stage.spec.max_output_tokens,
        seed: stage.spec.seed,
        simulated: info.simulated,
    }
}

impl super::Kind for fanfold_core::spec::MapStageSpec {
    fn build(&self, ctx: &mut BuildContext<'_>) -> Result<Box<dyn Stage>, PlanError> {
        Ok(Box::new(MapRunner::build(self, ctx)?))
    }
}

impl Scorer for MapRunner {
    fn stage_name(&self) -> &str {
        self.stage.name()
    }

    fn positive(&self) -> &[String] {
        &self.stage.spec.decision.positive
    }

    fn score(
        &self,
        ctx: &mut StageContext<'_>,
        units: Vec<usize>,
    ) -> Result<StageOutcome, RunError> {
        let views = UnitViews {
            projector: self.projector()?,
            table: ctx.table,
        };
        self.run_views(ctx, units, &views)
    }
}

impl Stage for MapRunner {
    fn name(&self) -> &str {
        self.stage.name()
    }

    fn kind(&self) -> &'static str {
        "map"
    }

    fn definition_hash(&self) -> ContentHash {
        self.stage.definition_hash()
    }

    fn shape(&self) -> Shape<'_> {
        Shape {
            calls: Calls::Model {
                backend: &self.stage.spec.backend,
            },
            sends: self
                .stage
                .spec
                .widen
                .iter()
                .map(|w| w.stage.as_str())
                .collect(),
            then: self.stage.spec.then.as_deref(),
            ..Shape::units(Outputs::Stored)
        }
    }

    fn evidence_view(&self) -> Option<crate::kit::EvidenceView> {
        let sp = &self.stage.spec;
        Some(crate::kit::EvidenceView {
            project: sp.project.clone(),
            fields: sp.fields.clone(),
            widened: false,
        })
    }

    fn output_schema(&self) -> Option<&serde_json::Value> {
        Some(&self.stage.schema)
    }

    fn explain(&self, spec: &Spec, out: &mut String) {
        let sp = &self.stage.spec;
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
            self.stage.prefix().len(),
            sp.rubric
        );
        if let Some(w) = &sp.widen {
            let mut when = Vec::new();
            if w.on_abstain {
                when.push("abstain".to_owned());
            }
            if let Some(p) = &w.needs {
                when.push(format!("{p} not empty"));
            }
            let _ = writeln!(out, "    widens to {} on {}", w.stage, when.join(" or "));
        }
        if let Some(c) = &self.cascade {
            let _ = writeln!(out, "    {}", c.explain(sp));
        }
        if let Some(then) = &sp.then {
            let _ = writeln!(
                out,
                "    positives go on to `{then}` too; their facts here still decide them"
            );
        }
    }

    fn count_cached(
        &self,
        spec: &Spec,
        spec_dir: &Path,
        store: &Store,
        table: &UnitTable,
        units: &[usize],
    ) -> Result<CachedCount, RunError> {
        let views = UnitViews {
            projector: self.projector()?,
            table,
        };
        self.count_cached_views(spec, spec_dir, store, units, &views)
    }

    fn run(&self, ctx: &mut StageContext<'_>, units: Vec<usize>) -> Result<StageOutcome, RunError> {
        let views = UnitViews {
            projector: self.projector()?,
            table: ctx.table,
        };
        let passing = self.stage.spec.then.is_some().then(|| units.clone());
        let mut outcome = match &self.cascade {
            Some(c) => c.run(
                &self.stage,
                ctx,
                units,
                &|i| views.view(i),
                &|i| views.cites(i),
                &mut |ctx, units| self.run_views(ctx, units, &views),
            )?,
            None => self.run_views(ctx, units, &views)?,
        };
        // Its positives go on to `then`, however they were decided (the
        // model, a cascade's proxy or its oracle); their facts here stay.
        if let Some(units) = passing {
            outcome.passed.extend(
                units
                    .into_iter()
                    .filter(|&i| ctx.ledger.status(i, self.name()) == Some(Status::Positive)),
            );
        }
        Ok(outcome)
    }

    fn report_key(&self) -> Option<&'static str> {
        Some(REPORT)
    }

    fn quality(&self, stats: &crate::kit::RunStats) -> Option<String> {
        super::map_cascade::quality(stats, self.name())
    }

    fn output_files(&self, _stats: &crate::kit::RunStats) -> Vec<(String, Vec<serde_json::Value>)> {
        // Written whenever a person is the oracle, empty when nothing is
        // wanted, so an earlier run's list never outlives its need.
        match &self.cascade {
            Some(c) if c.asks_a_person() => {
                vec![(super::map_cascade::WANTED_FILE.to_owned(), c.wanted_lines())]
            }
            _ => Vec::new(),
        }
    }

    fn shortfalls(&self, stats: &crate::kit::RunStats) -> Vec<String> {
        super::map_cascade::shortfalls(stats, self.name())
    }

    fn answer_section(&self, stats: &crate::kit::RunStats, _simulated: &str) -> Option<String> {
        super::map_cascade::answer_section(stats, self.name())
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl MapRunner {
    /// Counts the stored facts of `units`, each keyed by its view.
    pub(crate) fn count_cached_views(
        &self,
        spec: &Spec,
        spec_dir: &Path,
        store: &Store,
        units: &[usize],
        views: &dyn Views,
    ) -> Result<CachedCount, RunError> {
        let sp = &self.stage.spec;
        let info = match crate::kit::cached_identity(spec, spec_dir, &sp.backend, sp.execution) {
            Ok(info) => info,
            Err(count) => return Ok(count),
        };
        let model = model_params(&info, &self.stage);
        let mut count = CachedCount::default();
        for &i in units {
            let projected = views.view(i)?;
            let key = self.stage.cache_key(projected.key_in(INPUT_BUCKET), &model);
            if let Some(fact) = store.get_fact(&key)? {
                count.cached += 1;
                if let Some(w) = &sp.widen
                    && self.asks_to_widen(&fact)
                {
                    count.sent.entry(w.stage.clone()).or_default().push(i);
                }
            }
        }
        Ok(count)
    }

    /// Runs the stage's model turn over `units`, each shown as `views`
    /// shows it.
    pub(crate) fn run_views(
        &self,
        ctx: &mut StageContext<'_>,
        units: Vec<usize>,
        views: &dyn Views,
    ) -> Result<StageOutcome, RunError> {
        let stage = &self.stage;
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
        // Units whose fact asks for a wider context, for the widen stage.
        let to_widen: std::sync::Mutex<Vec<usize>> = std::sync::Mutex::new(Vec::new());
        let note = |i: usize, fact: &FactRecord| {
            if self.asks_to_widen(fact) {
                to_widen.lock().unwrap_or_else(|e| e.into_inner()).push(i);
            }
        };
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
            let window = stage
                .spec
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
            Prompt {
                suffix: stage.suffix(id, &projected),
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
        job.set_guard(stage.spec.breaker.clone(), canary_expect);
        let price = |u: &fanfold_model::Usage| backend.cost_usd(u);
        job.set_price(&price);
        if !nothing_to_ask && !job.settled_by_contract() {
            backend.run(&job).map_err(|source| RunError::Backend {
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
        let mut outcome = StageOutcome {
            stop,
            ..StageOutcome::default()
        };
        let mut to_widen = to_widen.into_inner().unwrap_or_else(|e| e.into_inner());
        if let Some(w) = &stage.spec.widen
            && !to_widen.is_empty()
        {
            to_widen.sort_unstable();
            to_widen.dedup();
            outcome.escalated.insert(w.stage.clone(), to_widen);
        }
        Ok(outcome)
    }
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
        let claim = match self
            .store
            .claim_or_fact(key, self.run_id, self.store.lease_ms())
        {
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
