//! One run of a plan: source -> partition -> prefilter -> map (cached) ->
//! fold -> verify -> outputs, with every step recorded in the store.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::Mutex;

use fanfold_core::spec::{ContractSpec, Execution, ReducerKind};
use fanfold_core::{
    ContentHash, Cost, FACT_SCHEMA, FactRecord, ModelParams, StableHash, Status, StatusCounts,
    UnitId,
};
use fanfold_model::{BackendInfo, ModelBackend, RecordingBackend};
use fanfold_ops::contract::{Controller, StopReason};
use fanfold_ops::fold::{Agg, FoldOutcome, FoldValue, Leaf, NodeCache, fold_tree};
use fanfold_ops::jq::{JqProgram, to_val};
use fanfold_ops::map::field_text;
use fanfold_ops::partition::{Coverage, PartUnit, PartitionError, PartitionOptions, partition_all};
use fanfold_ops::prefilter::{Outcome, Prefilter};
use fanfold_ops::verify::{VerifyReport, verify};
use fanfold_store::{RejectionRow, RunUnitRow, Store, StoreError};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::batches::StoreLedger;
use crate::embedding::{EmbedStats, Embedders};
use crate::plan::{Plan, Routing};
use crate::queue::{BudgetPool, Pending, StageJob, UnitResult};
use crate::source::{Source, SourceError};
use crate::{Progress, backends};

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error("{origin}: {source}")]
    Partition {
        origin: String,
        source: PartitionError,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{0}")]
    Prefilter(#[from] fanfold_ops::prefilter::PrefilterError),
    #[error("backend `{name}`: {source}")]
    Backend {
        name: String,
        source: fanfold_model::BackendError,
    },
    #[error(
        "the spec names no input: give --input FILE, --input - (stdin) or --input-command, or set input.path"
    )]
    NoInput,
    #[error("stage `{stage}` project on unit {unit}: {detail}")]
    Project {
        stage: String,
        unit: String,
        detail: String,
    },
    #[error("stage `{stage}`: {detail}")]
    Embed { stage: String, detail: String },
    #[error("contract bound on unit {unit}: {detail}")]
    Bound { unit: String, detail: String },
    #[error("writing {path}: {source}")]
    Output {
        path: String,
        source: std::io::Error,
    },
}

#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Overrides the spec's input.
    pub source: Option<Source>,
    pub store_path: PathBuf,
    /// Where answer.json, answer.md, facts.jsonl and certificate.json go.
    pub out_dir: Option<PathBuf>,
    /// Physical slots: most units in flight at once.
    pub slots: usize,
    pub max_unit_bytes: u64,
    /// Append every model call to this replay cassette.
    pub record: Option<PathBuf>,
    /// Overrides the spec's budget.
    pub budget: Option<fanfold_core::spec::BudgetSpec>,
}

impl RunOptions {
    pub fn new(store_path: PathBuf) -> RunOptions {
        RunOptions {
            source: None,
            store_path,
            out_dir: None,
            slots: 4,
            max_unit_bytes: fanfold_ops::partition::DEFAULT_MAX_UNIT_BYTES,
            record: None,
            budget: None,
        }
    }
}

/// Figures a run measured about itself.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunStats {
    pub model_calls: u64,
    pub cache_hits: u64,
    pub cache_misses: u64,
    pub slots: usize,
    pub max_in_flight: usize,
    pub fold_depth: u32,
    pub fold_nodes_computed: u64,
    pub fold_nodes_reused: u64,
    /// Units whose facts were computed (not reused) in this run.
    pub recomputed_units: Vec<String>,
    pub cost: Cost,
    pub wall_ms: u64,
    /// Wall time of each phase of the run, in order: source, partition,
    /// prefilter, one entry per stage (`embed:NAME`, `map:NAME`), fold,
    /// verify.
    pub phases_ms: Vec<(String, u64)>,
    /// What each embed stage did.
    #[serde(default)]
    pub embed: BTreeMap<String, EmbedStats>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AnswerItem {
    pub unit_id: UnitId,
    pub title: Option<String>,
    pub link: Option<String>,
    pub theme: Option<String>,
    pub score: Option<f64>,
    pub evidence: Vec<fanfold_core::Evidence>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Theme {
    pub key: String,
    pub count: u64,
    pub ids: Vec<UnitId>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Answer {
    pub schema: String,
    pub question: String,
    pub simulated: bool,
    pub contract: String,
    /// For a threshold contract: whether the threshold was reached.
    pub reached: Option<bool>,
    pub items: Vec<AnswerItem>,
    pub themes: Vec<Theme>,
    pub statuses: StatusCounts,
    pub excluded: u64,
    pub stop: StopReason,
    pub verified: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Certificate {
    pub schema: String,
    pub run_id: String,
    pub spec: String,
    pub spec_hash: ContentHash,
    pub question: String,
    pub source_hash: ContentHash,
    pub source_bytes: u64,
    pub source_origin: String,
    pub coverage: Coverage,
    pub coverage_complete: bool,
    pub rejected_by_reason: BTreeMap<String, u64>,
    /// The first rejections in full (where, why, what to do).
    pub rejections: Vec<String>,
    pub excluded_by_reason: BTreeMap<String, u64>,
    pub routed_by_stage: BTreeMap<String, u64>,
    pub statuses_by_stage: BTreeMap<String, StatusCounts>,
    pub statuses: StatusCounts,
    pub stop: StopReason,
    pub contract: String,
    pub budget_limits: fanfold_core::spec::BudgetSpec,
    pub stats: RunStats,
    pub fold_root: ContentHash,
    pub verify: VerifyReport,
    pub backends: Vec<BackendInfo>,
    pub simulated: bool,
    /// The figures that come from a simulated backend, when any do.
    pub simulated_figures: Vec<String>,
}

pub struct RunReport {
    pub run_id: String,
    pub answer: Answer,
    pub certificate: Certificate,
    pub facts: Vec<FactRecord>,
    pub fold: FoldOutcome,
}

/// Wall time per phase, measured between marks.
struct Phases {
    last: std::time::Instant,
    list: Vec<(String, u64)>,
}

impl Phases {
    fn start() -> Phases {
        Phases {
            last: std::time::Instant::now(),
            list: Vec::new(),
        }
    }

    fn mark(&mut self, name: &str) {
        let now = std::time::Instant::now();
        self.list
            .push((name.to_owned(), (now - self.last).as_millis() as u64));
        self.last = now;
    }

    fn into_list(self) -> Vec<(String, u64)> {
        self.list
    }
}

/// Rejections listed in full in a certificate; the counts cover the rest.
const MAX_LISTED_REJECTIONS: usize = 20;

/// Fold nodes cached in the store.
struct StoreNodes<'a>(&'a Store);

impl NodeCache for StoreNodes<'_> {
    fn get(&mut self, key: &ContentHash) -> Option<FoldValue> {
        // A node that fails to load is recomputed, never trusted.
        self.0
            .get_fold_node(key)
            .ok()
            .flatten()
            .and_then(|v| serde_json::from_value(v).ok())
    }
    fn put(&mut self, key: &ContentHash, level: u32, value: &FoldValue) {
        if let Ok(v) = serde_json::to_value(value)
            && let Err(e) = self.0.put_fold_node(key, level, &v)
        {
            tracing::warn!(error = %e, "fold node not cached");
        }
    }
}

/// Partition and prefilter without running anything: what `explain` shows.
pub fn route(
    plan: &Plan,
    source: &Source,
    store: Option<&Store>,
    max_unit_bytes: u64,
) -> Result<Routing, RunError> {
    let bytes = source.read()?;
    let (units, rejections, coverage) = partition_all(
        &plan.spec.input.partition,
        &bytes,
        PartitionOptions { max_unit_bytes },
    )
    .map_err(|source_err| RunError::Partition {
        origin: source.origin(),
        source: source_err,
    })?;
    let prefiltered = prefilter_units(plan, &units)?;
    let mut r = Routing {
        elements: coverage.elements,
        units: coverage.units,
        rejected: coverage.rejected,
        excluded_by_reason: prefiltered.excluded_by_reason,
        ..Routing::default()
    };
    for rej in &rejections {
        *r.rejected_by_reason.entry(rej.reason.clone()).or_insert(0) += 1;
    }
    let mut routed = prefiltered.routed;
    for stage_name in &plan.order {
        let Some(indices) = routed.get(stage_name).cloned() else {
            continue;
        };
        r.routed.insert(stage_name.clone(), indices.len() as u64);
        if let Some(stage) = plan.embed_stage(stage_name) {
            // Cached facts say where a unit goes; the rest are undecided
            // until embedded, and may still reach the next stage.
            let (_, model_id) = crate::embedding::embedder_identity(stage, &plan.spec_dir)?;
            let mut cached = 0;
            let mut passed = Vec::new();
            if let Some(store) = store {
                for (i, key, _) in crate::embedding::fact_keys(stage, &units, &indices, &model_id)?
                {
                    if let Some(f) = store.get_fact(&key)? {
                        cached += 1;
                        if f.status == Status::Positive {
                            passed.push(i);
                        }
                    }
                }
            }
            r.cached.insert(stage_name.clone(), cached);
            if let Some(then) = &stage.spec.then {
                *r.undecided_before.entry(then.clone()).or_insert(0) +=
                    indices.len() as u64 - cached;
                let next = routed.entry(then.clone()).or_default();
                next.extend(passed);
                next.sort_unstable();
            }
            continue;
        }
        let (Some(store), Some(stage)) = (store, plan.stage(stage_name)) else {
            continue;
        };
        // A backend that cannot be built here counts as nothing cached.
        let Some(info) = plan
            .spec
            .backends
            .get(&stage.spec.backend)
            .and_then(|spec| backends::build(spec, &plan.spec_dir, stage.spec.execution).ok())
            .map(|b| b.info())
        else {
            continue;
        };
        let model = model_params(&info, stage);
        let projector = Projector::compile(stage.name(), stage.spec.project.as_deref())?;
        let mut cached = 0;
        for &i in &indices {
            let projected = projector.project(stage.name(), &stage.spec.fields, &units[i])?;
            if store
                .get_fact(&stage.cache_key(projected.key_in("input-v1"), &model))?
                .is_some()
            {
                cached += 1;
            }
        }
        r.cached.insert(stage_name.clone(), cached);
    }
    Ok(r)
}

/// What the prefilter did with each unit.
pub struct Prefiltered {
    pub excluded_by_reason: BTreeMap<String, u64>,
    /// Stage name -> indices of the units routed to it, in source order.
    pub routed: BTreeMap<String, Vec<usize>>,
    /// (unit index, reason) of every excluded unit.
    pub excluded: Vec<(usize, String)>,
}

/// Runs the plan's prefilter over `units`.
pub fn prefilter_units(plan: &Plan, units: &[PartUnit]) -> Result<Prefiltered, RunError> {
    let prefilter = Prefilter::compile(&plan.spec.prefilter)?;
    let default_stage = plan.first_stage();
    let mut out = Prefiltered {
        excluded_by_reason: BTreeMap::new(),
        routed: BTreeMap::new(),
        excluded: Vec::new(),
    };
    for (i, u) in units.iter().enumerate() {
        match prefilter.decide(u.unit.unit_id.as_str(), to_val(&u.value))? {
            Outcome::Exclude { reason, .. } => {
                *out.excluded_by_reason.entry(reason.clone()).or_insert(0) += 1;
                out.excluded.push((i, reason));
            }
            o => {
                let stage = o.stage(default_stage).unwrap_or(default_stage).to_owned();
                out.routed.entry(stage).or_default().push(i);
            }
        }
    }
    Ok(out)
}

fn model_params(info: &BackendInfo, stage: &fanfold_ops::map::MapStage) -> ModelParams {
    ModelParams {
        backend: info.kind.clone(),
        model_id: info.model_id.clone(),
        temperature: stage.spec.temperature,
        max_output_tokens: stage.spec.max_output_tokens,
        seed: stage.spec.seed,
        simulated: info.simulated,
    }
}

pub fn run(plan: &Plan, opts: &RunOptions, progress: &dyn Progress) -> Result<RunReport, RunError> {
    let spec = &plan.spec;
    let source = opts
        .source
        .clone()
        .or_else(|| plan.default_source())
        .ok_or(RunError::NoInput)?;
    let store = Store::open(&opts.store_path)?;
    let mut phases = Phases::start();
    let bytes = source.read()?;
    let source_hash = ContentHash::of_bytes(&bytes);
    let origin = source.origin();
    store.put_artifact(&source_hash, &bytes, &origin)?;
    phases.mark("source");
    let (units, rejections, coverage) = partition_all(
        &spec.input.partition,
        &bytes,
        PartitionOptions {
            max_unit_bytes: opts.max_unit_bytes,
        },
    )
    .map_err(|e| RunError::Partition {
        origin: origin.clone(),
        source: e,
    })?;
    for r in &rejections {
        tracing::warn!(reason = %r.reason, "{}: {}", origin, r.detail);
    }
    let rejection_rows: Vec<RejectionRow> = rejections
        .iter()
        .map(|r| RejectionRow {
            ordinal: r.ordinal,
            reason: r.reason.clone(),
            detail: r.detail.clone(),
            byte_start: r.bytes.start,
            byte_end: r.bytes.end,
        })
        .collect();
    store.put_partition(
        &source_hash,
        &units.iter().map(|u| &u.unit).collect::<Vec<_>>(),
        &rejection_rows,
    )?;

    let run_id = format!("run-{}-{}", fanfold_store::now_ms(), source_hash.short(8));
    store.begin_run(&run_id, &spec.name, &plan.spec_hash, &source_hash)?;
    store.event(
        &run_id,
        "partitioned",
        &json!({"coverage": coverage, "origin": origin}),
    )?;

    phases.mark("partition");
    // Prefilter.
    let Prefiltered {
        excluded_by_reason,
        mut routed,
        excluded,
    } = prefilter_units(plan, &units)?;
    let unit_rows: Vec<RunUnitRow> = excluded
        .into_iter()
        .map(|(i, reason)| RunUnitRow {
            unit_id: units[i].unit.unit_id.0.clone(),
            stage: "prefilter".into(),
            status: "excluded".into(),
            reason: Some(reason),
            fact_key: None,
        })
        .collect();
    store.put_run_units(&run_id, &unit_rows)?;
    store.event(
        &run_id,
        "prefiltered",
        &json!({"excluded": excluded_by_reason}),
    )?;

    phases.mark("prefilter");
    let budget = BudgetPool::new(opts.budget.clone().unwrap_or_else(|| spec.budget.clone()));
    let controller = Mutex::new(Controller::new(spec.contract.clone()));
    let score_pointer = match &spec.contract {
        ContractSpec::TopK { score, .. } => Some(score.clone()),
        _ => None,
    };
    let bound_program = match &spec.contract {
        ContractSpec::TopK { bound, .. } => {
            Some(JqProgram::compile(bound).map_err(|e| RunError::Bound {
                unit: "-".into(),
                detail: e.to_string(),
            })?)
        }
        _ => None,
    };

    let mut stats = RunStats {
        slots: opts.slots.max(1),
        ..RunStats::default()
    };
    let mut stop = StopReason::Completed;
    let mut facts: Vec<FactRecord> = Vec::new();
    let mut leaves: Vec<(u64, Leaf)> = Vec::new();
    let mut backend_infos: Vec<BackendInfo> = Vec::new();
    let mut built: HashMap<(String, Execution), Box<dyn ModelBackend>> = HashMap::new();
    let mut embedders = Embedders::default();

    for stage_name in &plan.order {
        if let Some(stage) = plan.embed_stage(stage_name) {
            let Some(indices) = routed.get(stage_name) else {
                continue;
            };
            progress.stage_started(stage_name, indices.len() as u64, 0);
            let outcome = crate::embedding::run_stage(
                stage,
                &plan.spec_dir,
                &units,
                indices,
                &store,
                &mut embedders,
            )?;
            for (i, fact) in outcome.ended {
                progress.unit_finished(stage_name, fact.status);
                leaves.push((units[i].unit.ordinal, leaf_of(&fact)));
                controller
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .observe(fact.status, None);
                facts.push(fact);
            }
            for _ in &outcome.passed {
                progress.unit_finished(stage_name, Status::Positive);
            }
            if let Some(then) = &stage.spec.then {
                let next = routed.entry(then.clone()).or_default();
                next.extend(outcome.passed);
                next.sort_unstable();
            }
            store.event(
                &run_id,
                "embedded",
                &json!({"stage": stage_name, "stats": outcome.stats}),
            )?;
            stats.embed.insert(stage_name.clone(), outcome.stats);
            progress.stage_finished(stage_name);
            phases.mark(&format!("embed:{stage_name}"));
            continue;
        }
        let Some(stage) = plan.stage(stage_name) else {
            continue;
        };
        let Some(indices) = routed.get(stage.name()) else {
            continue;
        };
        let name = &stage.spec.backend;
        let execution = stage.spec.execution;
        let built_key = (name.clone(), execution);
        if !built.contains_key(&built_key) {
            let bspec = spec.backends.get(name).ok_or_else(|| RunError::Backend {
                name: name.clone(),
                source: fanfold_model::BackendError::Setup("not declared".into()),
            })?;
            let mut b = backends::build(bspec, &plan.spec_dir, execution).map_err(|source| {
                RunError::Backend {
                    name: name.clone(),
                    source,
                }
            })?;
            if let Some(path) = &opts.record {
                b = Box::new(RecordingBackend::create(b, path).map_err(|source| {
                    RunError::Backend {
                        name: name.clone(),
                        source,
                    }
                })?);
            }
            built.insert(built_key.clone(), b);
        }
        let Some(backend) = built.get(&built_key) else {
            continue;
        };
        let info = backend.info();
        if !backend_infos.contains(&info) {
            backend_infos.push(info.clone());
        }
        let model = model_params(&info, stage);

        // Cache lookups; misses become pending requests.
        let mut keys: HashMap<usize, (ContentHash, Value)> = HashMap::new();
        let mut pending = Vec::new();
        let mut cached = 0u64;
        let projector = Projector::compile(stage.name(), stage.spec.project.as_deref())?;
        for &i in indices {
            let u = &units[i];
            let projected = projector.project(stage.name(), &stage.spec.fields, u)?;
            let key = stage.cache_key(projected.key_in("input-v1"), &model);
            if let Some(mut fact) = store.get_fact(&key)? {
                cached += 1;
                stats.cache_hits += 1;
                fact.source_ids = vec![u.unit.unit_id.clone()];
                fact.source_hashes = vec![u.unit.unit_hash];
                leaves.push((u.unit.ordinal, leaf_of(&fact)));
                let score = score_pointer
                    .as_ref()
                    .and_then(|p| fact.facts.pointer(p))
                    .and_then(Value::as_f64);
                controller
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .observe(fact.status, score);
                facts.push(fact);
                continue;
            }
            stats.cache_misses += 1;
            let bound = match &bound_program {
                Some(p) => Some(
                    p.first_json(to_val(&u.value))
                        .ok()
                        .flatten()
                        .and_then(|v| v.as_f64())
                        .ok_or_else(|| RunError::Bound {
                            unit: u.unit.unit_id.0.clone(),
                            detail: "the bound expression must yield a number".into(),
                        })?,
                ),
                None => None,
            };
            pending.push(Pending {
                index: i,
                unit_id: u.unit.unit_id.0.clone(),
                suffix: stage.suffix(u.unit.unit_id.as_str(), &projected),
                schema: stage.schema_for_unit(&projected),
                input: projected.clone(),
                attempt: 1,
                bound,
            });
            keys.insert(i, (key, projected));
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
        progress.stage_started(stage.name(), indices.len() as u64, cached);

        let make_fact = |i: usize, r: &UnitResult| -> FactRecord {
            let u = &units[i];
            let key = keys.get(&i).map(|(k, _)| *k).unwrap_or(u.unit.unit_hash);
            let (decision, facts_v, confidence, evidence) = match &r.interpreted {
                Some(it) => (
                    it.decision.clone(),
                    it.facts.clone(),
                    it.confidence,
                    it.evidence.clone(),
                ),
                None => (None, Value::Null, None, Vec::new()),
            };
            FactRecord {
                schema: FACT_SCHEMA.into(),
                key,
                source_ids: vec![u.unit.unit_id.clone()],
                source_hashes: vec![u.unit.unit_hash],
                stage: stage.name().to_owned(),
                stage_version: stage.spec.version,
                rubric_hash: stage.rubric_hash,
                model: model.clone(),
                status: r.status,
                decision,
                facts: facts_v,
                confidence,
                reason: r.reason.clone(),
                evidence,
                cost: Cost {
                    prompt_tokens: r.usage.prompt_tokens,
                    cached_tokens: r.usage.cached_tokens,
                    completion_tokens: r.usage.completion_tokens,
                    usd: backend.cost_usd(&r.usage).unwrap_or(0.0),
                    latency_ms: r.usage.latency_ms,
                    calls: u64::from(r.attempts),
                },
                attempts: r.attempts,
                reducer_path: Vec::new(),
            }
        };
        // Persist each decided fact the moment it exists, so a killed run
        // keeps everything finished before the kill.
        let store_ref = &store;
        let on_finish = |i: usize, r: &UnitResult| {
            if r.status.is_cacheable() {
                let fact = make_fact(i, r);
                if let Err(e) = store_ref.put_fact(&fact) {
                    tracing::error!(error = %e, unit = %fact.source_ids[0], "fact not stored");
                }
            }
            progress.unit_finished(stage.name(), r.status);
        };
        // A batch holds every request of the stage at once; the provider,
        // not a slot count, decides how many run together.
        let slots = match execution {
            Execution::Online => opts.slots,
            Execution::Batch => pending.len(),
        };
        let ledger = StoreLedger(&store);
        let mut job = StageJob::new(
            stage,
            slots,
            pending,
            &budget,
            &controller,
            score_pointer.clone(),
            &on_finish,
        );
        job.set_batch_ledger(&ledger);
        backend.run(&job).map_err(|source| RunError::Backend {
            name: name.clone(),
            source,
        })?;
        let (results, max_in_flight, stage_stop) = job.finish();
        progress.stage_finished(stage.name());
        phases.mark(&format!("map:{}", stage.name()));
        stats.max_in_flight = stats.max_in_flight.max(max_in_flight);
        if let Some(s) = stage_stop
            && stop == StopReason::Completed
        {
            stop = s;
        }
        for (i, r) in results {
            let fact = make_fact(i, &r);
            stats.model_calls += u64::from(r.attempts);
            if r.attempts > 0 {
                stats.recomputed_units.push(units[i].unit.unit_id.0.clone());
            }
            stats.cost.add(&fact.cost);
            leaves.push((units[i].unit.ordinal, leaf_of(&fact)));
            facts.push(fact);
        }
    }
    // Later stages never opened after a stop: nothing to mark, their units
    // were queued and ended inside the job. Units routed to a stage that a
    // budget stop prevented from starting are not run.
    stats.recomputed_units.sort();

    // Fold, in source order.
    let fold_started = std::time::Instant::now();
    leaves.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.stage.cmp(&b.1.stage)));
    let leaf_list: Vec<Leaf> = leaves.into_iter().map(|(_, l)| l).collect();
    let fold = fold_tree(&spec.fold, &leaf_list, &mut StoreNodes(&store));
    stats.fold_depth = fold.depth;
    stats.fold_nodes_computed = fold.nodes_computed;
    stats.fold_nodes_reused = fold.nodes_reused;
    let path_of: HashMap<(String, String), Vec<String>> = leaf_list
        .iter()
        .zip(&fold.paths)
        .map(|(l, p)| {
            (
                (l.unit_id.0.clone(), l.stage.clone()),
                p.iter().map(|k| k.short(12)).collect(),
            )
        })
        .collect();
    for f in &mut facts {
        if let Some(p) = path_of.get(&(f.source_ids[0].0.clone(), f.stage.clone())) {
            f.reducer_path = p.clone();
        }
    }
    facts.sort_by(|a, b| {
        a.source_ids
            .cmp(&b.source_ids)
            .then_with(|| a.stage.cmp(&b.stage))
    });

    stats.phases_ms.extend(phases.into_list());
    stats
        .phases_ms
        .push(("fold".into(), fold_started.elapsed().as_millis() as u64));
    let verify_started = std::time::Instant::now();
    // Answer.
    let by_id: HashMap<&UnitId, &PartUnit> = units.iter().map(|u| (&u.unit.unit_id, u)).collect();
    let fact_of: HashMap<&UnitId, &FactRecord> = facts
        .iter()
        .filter_map(|f| f.source_ids.first().map(|id| (id, f)))
        .collect();
    let (ids, themes, reached) = answer_ids(spec, &fold.root, &facts);
    let theme_of: HashMap<&UnitId, &str> = themes
        .iter()
        .flat_map(|t| t.ids.iter().map(move |id| (id, t.key.as_str())))
        .collect();
    let items: Vec<AnswerItem> = ids
        .iter()
        .map(|(id, score)| {
            let value = by_id.get(id).map(|u| &u.value);
            AnswerItem {
                unit_id: id.clone(),
                title: value
                    .and_then(|v| spec.output.title.as_deref().and_then(|f| field_text(v, f))),
                link: value
                    .and_then(|v| spec.output.link.as_deref().and_then(|f| field_text(v, f))),
                theme: theme_of.get(id).map(|s| (*s).to_owned()),
                score: *score,
                evidence: fact_of
                    .get(id)
                    .map(|f| f.evidence.clone())
                    .unwrap_or_default(),
            }
        })
        .collect();

    // Verify against an independent re-partition of the stored artifact.
    let stored = store.get_artifact(&source_hash)?.unwrap_or_default();
    let reread = partition_all(
        &spec.input.partition,
        &stored,
        PartitionOptions {
            max_unit_bytes: opts.max_unit_bytes,
        },
    )
    .map(|(u, _, _)| u)
    .unwrap_or_default();
    let cited: BTreeSet<UnitId> = items
        .iter()
        .map(|i| i.unit_id.clone())
        .chain(themes.iter().flat_map(|t| t.ids.iter().cloned()))
        .collect();
    let decided: Vec<FactRecord> = facts
        .iter()
        .filter(|f| f.status.is_cacheable())
        .cloned()
        .collect();
    let report = verify(
        &reread,
        &decided,
        &cited,
        spec.verify.negative_sample,
        spec.verify.seed,
    );

    stats
        .phases_ms
        .push(("verify".into(), verify_started.elapsed().as_millis() as u64));
    let statuses = fold.root.total_statuses();
    let simulated = backend_infos.iter().any(|b| b.simulated);
    stats.wall_ms = stats.phases_ms.iter().map(|(_, ms)| ms).sum();
    let mut rejected_by_reason = BTreeMap::new();
    for r in &rejections {
        *rejected_by_reason.entry(r.reason.clone()).or_insert(0) += 1;
    }
    let certificate = Certificate {
        schema: "fanfold.certificate/v1".into(),
        run_id: run_id.clone(),
        spec: spec.name.clone(),
        spec_hash: plan.spec_hash,
        question: spec.question.clone(),
        source_hash,
        source_bytes: bytes.len() as u64,
        source_origin: origin,
        coverage,
        coverage_complete: coverage.is_complete(),
        rejected_by_reason,
        rejections: rejections
            .iter()
            .take(MAX_LISTED_REJECTIONS)
            .map(|r| format!("{}: {}", r.reason, r.detail))
            .collect(),
        excluded_by_reason: excluded_by_reason.clone(),
        routed_by_stage: routed
            .iter()
            .map(|(k, v)| (k.clone(), v.len() as u64))
            .collect(),
        statuses_by_stage: fold.root.statuses.clone(),
        statuses,
        stop: stop.clone(),
        contract: spec.contract.type_name().into(),
        budget_limits: opts.budget.clone().unwrap_or_else(|| spec.budget.clone()),
        stats: stats.clone(),
        fold_root: fold.root_key,
        verify: report.clone(),
        backends: backend_infos,
        simulated,
        simulated_figures: if simulated {
            vec![
                "answer quality (ids, themes, precision, recall)".into(),
                "token counts and latency".into(),
            ]
        } else {
            Vec::new()
        },
    };
    let answer = Answer {
        schema: "fanfold.answer/v1".into(),
        question: spec.question.clone(),
        simulated,
        contract: spec.contract.type_name().into(),
        reached,
        items,
        themes,
        statuses,
        excluded: excluded_by_reason.values().sum(),
        stop: stop.clone(),
        verified: report.passed,
    };

    let rows: Vec<RunUnitRow> = facts
        .iter()
        .map(|f| RunUnitRow {
            unit_id: f.source_ids[0].0.clone(),
            stage: f.stage.clone(),
            status: f.status.as_str().into(),
            reason: f.reason.clone(),
            fact_key: f.status.is_cacheable().then_some(f.key),
        })
        .collect();
    store.put_run_units(&run_id, &rows)?;
    let cert_value = serde_json::to_value(&certificate).unwrap_or(Value::Null);
    store.finish_run(&run_id, stop.code(), &cert_value)?;

    let report = RunReport {
        run_id,
        answer,
        certificate,
        facts,
        fold,
    };
    if let Some(dir) = &opts.out_dir {
        crate::output::write_all(dir, &report)?;
    }
    Ok(report)
}

/// What a stage sees of a unit: its `project` expression, or its `fields`.
pub struct Projector(Option<JqProgram>);

impl Projector {
    pub fn compile(stage: &str, project: Option<&str>) -> Result<Projector, RunError> {
        let program = match project {
            Some(expr) => Some(JqProgram::compile(expr).map_err(|e| RunError::Project {
                stage: stage.to_owned(),
                unit: "-".into(),
                detail: e.to_string(),
            })?),
            None => None,
        };
        Ok(Projector(program))
    }

    pub fn project(&self, stage: &str, fields: &[String], u: &PartUnit) -> Result<Value, RunError> {
        let Some(p) = &self.0 else {
            return Ok(fanfold_ops::map::project_fields(fields, &u.value));
        };
        let err = |detail: String| RunError::Project {
            stage: stage.to_owned(),
            unit: u.unit.unit_id.0.clone(),
            detail,
        };
        match p.first_json(to_val(&u.value)) {
            Ok(Some(v)) => Ok(v),
            Ok(None) => Err(err("the project expression yielded nothing".into())),
            Err(e) => Err(err(e.to_string())),
        }
    }
}

fn leaf_of(f: &FactRecord) -> Leaf {
    Leaf {
        unit_id: f.source_ids[0].clone(),
        stage: f.stage.clone(),
        status: f.status,
        facts: if f.status.is_cacheable() {
            f.facts.clone()
        } else {
            Value::Null
        },
    }
}

type Ranked = Vec<(UnitId, Option<f64>)>;

/// The answer's ids and themes, as the contract defines them.
fn answer_ids(
    spec: &fanfold_core::spec::Spec,
    root: &FoldValue,
    facts: &[FactRecord],
) -> (Ranked, Vec<Theme>, Option<bool>) {
    match &spec.contract {
        ContractSpec::Exhaustive {
            answer,
            themes,
            top_themes,
        } => {
            let set_by_value = spec
                .fold
                .reducers
                .iter()
                .find(|r| &r.name == answer)
                .map(|r| &r.kind);
            let ids: BTreeSet<UnitId> = match root.reducers.get(answer) {
                Some(Agg::Set { items }) => match set_by_value {
                    Some(ReducerKind::Set { value: None }) => {
                        items.keys().map(|k| UnitId(k.clone())).collect()
                    }
                    _ => items.values().flatten().cloned().collect(),
                },
                _ => BTreeSet::new(),
            };
            let mut ranked: Ranked = ids.into_iter().map(|i| (i, None)).collect();
            ranked.sort_by(|a, b| natural(&a.0.0).cmp(&natural(&b.0.0)));
            let themes = match themes.as_ref().and_then(|t| root.reducers.get(t)) {
                Some(Agg::CountBy { groups }) => {
                    let mut list: Vec<Theme> = groups
                        .iter()
                        .map(|(k, g)| Theme {
                            key: k.clone(),
                            count: g.count,
                            ids: g.ids.iter().cloned().collect(),
                        })
                        .collect();
                    list.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.key.cmp(&b.key)));
                    list.truncate(*top_themes);
                    list
                }
                _ => Vec::new(),
            };
            (ranked, themes, None)
        }
        ContractSpec::TopK { k, score, .. } => {
            let mut scored: Ranked = facts
                .iter()
                .filter(|f| f.status == Status::Positive)
                .filter_map(|f| {
                    Some((
                        f.source_ids[0].clone(),
                        Some(f.facts.pointer(score)?.as_f64()?),
                    ))
                })
                .collect();
            scored.sort_by(|a, b| {
                b.1.unwrap_or(0.0)
                    .total_cmp(&a.1.unwrap_or(0.0))
                    .then_with(|| a.0.cmp(&b.0))
            });
            scored.truncate(*k);
            (scored, Vec::new(), None)
        }
        ContractSpec::Threshold { count } => {
            let pos: Ranked = facts
                .iter()
                .filter(|f| f.status == Status::Positive)
                .map(|f| (f.source_ids[0].clone(), None))
                .collect();
            let reached = pos.len() as u64 >= *count;
            (pos, Vec::new(), Some(reached))
        }
    }
}

/// Sort key that puts "9" before "10".
fn natural(s: &str) -> (usize, &str) {
    if s.bytes().all(|b| b.is_ascii_digit()) {
        (s.len(), s)
    } else {
        (usize::MAX, s)
    }
}
