//! One run of a plan, as a pipeline of named phases:
//!
//! ```text
//! source -> route (partition + prefilter, streamed) -> stages -> fold
//!        -> answer -> verify -> outputs
//! ```
//!
//! Each phase is a function in this module's files; this one only passes
//! their results along and times them. Every decided fact is persisted the
//! moment it exists, so a killed run resumes where it stopped.

pub mod answer;
pub mod ingest;
mod live;
pub mod route;
mod stages;
pub mod verify;

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;

use fanfold_core::spec::BudgetSpec;
use fanfold_core::{ContentHash, FactRecord, UnitId};
use fanfold_ops::contract::Controller;
use fanfold_ops::fold::{FoldValue, Leaf, NodeCache, fold_tree};
use fanfold_store::{RunUnitRow, Store};
use serde_json::{Value, json};

use crate::Progress;
use crate::error::RunError;
use crate::kit::FactLedger;
use crate::plan::{Plan, Routing};
use crate::queue::BudgetPool;
use crate::report::{Answer, Certificate, RunReport, RunSettingsReport};
use crate::source::Source;

/// How a run is carried out; none of these change what a fact means.
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
    /// Threads that parse and prefilter a JSONL source.
    pub partition_threads: usize,
    /// Append every model call to this replay cassette.
    pub record: Option<PathBuf>,
    /// Overrides the spec's budget.
    pub budget: Option<BudgetSpec>,
    /// Caps the store's size in bytes; a write past it stops the run.
    pub store_max_bytes: Option<u64>,
    /// How long a unit this run holds stays its own unless renewed: what
    /// another process sharing the store waits, at most, for the units of
    /// a run that died. `None`: [`fanfold_store::LIVE_MS`].
    pub lease_ms: Option<u64>,
    /// Effects show what they would do and do nothing.
    pub dry_run: bool,
    /// Effects may send a new version to units that carry an earlier one.
    pub allow_new_version: bool,
    /// Model calls are made by worker processes sharing the store
    /// (`fanfold worker`); this run queues them and folds what they answer.
    pub fleet: bool,
    /// Set from outside to stop the run (Ctrl-C where no signal reaches
    /// it, as in the Python package), seen at every chunk of the source,
    /// every read and element of the route pass, every embed batch and
    /// before every model call: the run ends as `interrupted` (its own stop
    /// reason and exit code, never the wall budget's), every fact it
    /// stored kept.
    pub interrupt: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
}

/// What a run's phases read of its options and spec, resolved once: a
/// phase never re-derives a default or a floor.
pub(crate) struct RunSettings {
    /// Physical slots, at least one.
    pub slots: usize,
    /// The options' budget, else the spec's.
    pub budget: BudgetSpec,
    pub max_unit_bytes: u64,
    /// Partition threads, at least one.
    pub partition_threads: usize,
}

impl RunSettings {
    fn resolve(plan: &Plan, opts: &RunOptions) -> RunSettings {
        RunSettings {
            slots: opts.slots.max(1),
            budget: opts
                .budget
                .clone()
                .unwrap_or_else(|| plan.spec.budget.clone()),
            max_unit_bytes: opts.max_unit_bytes,
            partition_threads: opts.partition_threads.max(1),
        }
    }
}

impl RunOptions {
    pub fn new(store_path: PathBuf) -> RunOptions {
        RunOptions {
            source: None,
            store_path,
            out_dir: None,
            slots: 4,
            max_unit_bytes: fanfold_ops::partition::DEFAULT_MAX_UNIT_BYTES,
            partition_threads: std::thread::available_parallelism().map_or(1, usize::from),
            record: None,
            budget: None,
            store_max_bytes: None,
            lease_ms: None,
            dry_run: false,
            allow_new_version: false,
            fleet: false,
            interrupt: None,
        }
    }
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
}

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

/// The embedded model's slot limit, checked before the store is touched:
/// a run that cannot start writes nothing.
fn check_slots(plan: &Plan, slots: usize) -> Result<(), RunError> {
    if slots <= fanfold_llama::MAX_SLOTS {
        return Ok(());
    }
    for stage in &plan.spec.stages {
        let Some((backend, _)) = stage.model_turn() else {
            continue;
        };
        if let Some(fanfold_core::spec::BackendSpec::Llama { .. }) = plan.spec.backends.get(backend)
        {
            return Err(RunError::Backend {
                name: backend.to_owned(),
                source: fanfold_model::BackendError::Setup(format!(
                    "--slots {slots}: the embedded model holds at most {} (llama.cpp keeps one sequence for the shared prefix and at most 256 in all)",
                    fanfold_llama::MAX_SLOTS
                )),
            });
        }
    }
    Ok(())
}

pub fn run(plan: &Plan, opts: &RunOptions, progress: &dyn Progress) -> Result<RunReport, RunError> {
    let spec = &plan.spec;
    let source = opts
        .source
        .clone()
        .or_else(|| plan.default_source())
        .ok_or(RunError::NoInput)?;
    let source = plan.resolve(source)?;
    if let Some(dir) = &opts.out_dir {
        crate::output::check_writable(dir)?;
    }
    check_slots(plan, opts.slots)?;
    let store = Store::open(&opts.store_path).map_err(|e| e.name_holders(None))?;
    if let Some(bytes) = opts.store_max_bytes {
        store.set_max_bytes(bytes)?;
    }
    if let Some(ms) = opts.lease_ms {
        store.set_lease_ms(ms);
    }
    // Runs killed earlier never said so: they end `abandoned`, and their
    // leases lapse with them.
    store
        .close_abandoned_runs(fanfold_store::LIVE_MS)
        .map_err(|e| e.name_holders(None))?;
    let mut phases = Phases::start();

    // Source.
    let artifact =
        ingest::ingest(&source, &store, opts.interrupt.as_deref()).map_err(|e| match e {
            RunError::Store(s) => RunError::Store(s.name_holders(None)),
            e => e,
        })?;
    phases.mark("source");

    let run_id = new_run_id(&artifact.hash);
    store
        .begin_run(&run_id, &spec.name, &plan.spec_hash, &artifact.hash)
        .map_err(|e| e.name_holders(None))?;
    // While the run lives it renews its leases, so other runs on the store
    // wait for the units it holds instead of paying for them again.
    let (stop_beat, beat) = std::sync::mpsc::channel::<()>();
    let tally = live::Tally::new(progress);
    let result = std::thread::scope(|scope| {
        let (store, run_id, tally) = (&store, run_id.as_str(), &tally);
        scope.spawn(move || heartbeat(store, run_id, &beat, tally));
        let result = run_begun(plan, opts, tally, store, run_id, &artifact, phases);
        drop(stop_beat);
        result
    });
    result.map_err(|e| {
        // A failed run holds nothing any more, and an input that did not
        // parse is not kept.
        let unparsed = matches!(e, RunError::Partition { .. });
        if let Err(f) = store.fail_run(&run_id, unparsed) {
            tracing::warn!(error = %f, "the failed run not recorded");
        }
        match e {
            RunError::Store(s) => RunError::Store(s.name_holders(Some(&run_id))),
            e => e,
        }
    })
}

/// Renews the run's leases every [`Store::renew_every`] until `stop`
/// closes, recording how far the run has got.
fn heartbeat(
    store: &Store,
    run_id: &str,
    stop: &std::sync::mpsc::Receiver<()>,
    tally: &live::Tally<'_>,
) {
    let every = store.renew_every();
    while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = stop.recv_timeout(every) {
        let progress = tally.snapshot();
        if let Err(e) = store.heartbeat(run_id, store.lease_ms(), Some(&progress)) {
            tracing::warn!(error = %e, "leases not renewed");
        }
    }
}

/// The run after its row exists: route, stages, fold, answer, verify,
/// outputs.
fn run_begun(
    plan: &Plan,
    opts: &RunOptions,
    progress: &live::Tally<'_>,
    store: &Store,
    run_id: &str,
    artifact: &ingest::Artifact,
    mut phases: Phases,
) -> Result<RunReport, RunError> {
    let spec = &plan.spec;
    let settings = RunSettings::resolve(plan, opts);
    // Route: partition and prefilter, streamed from the stored artifact.
    let options = route::stream_options(settings.max_unit_bytes, settings.partition_threads);
    let mut routed = route::route(
        plan,
        artifact.hash,
        &artifact.origin,
        ingest::ArtifactReader::new(store, artifact),
        Some(store),
        options,
        opts.interrupt.as_deref(),
    )?;
    // The stages may add units observations bore: the table is theirs.
    let mut table = std::mem::take(&mut routed.table);
    crate::plan::output_fields_in(spec, &table).map_err(|detail| RunError::Spec {
        path: plan.spec_path.display().to_string(),
        detail,
    })?;
    let partition_id = routed.partition_id.unwrap_or_default();
    store.set_run_routing(
        run_id,
        partition_id,
        routed.prefilter_id.unwrap_or_default(),
    )?;
    store.event(
        run_id,
        "routed",
        &json!({
            "coverage": routed.coverage,
            "origin": artifact.origin,
            "excluded": routed.excluded_by_reason,
        }),
    )?;
    phases.mark("route");

    // Stages, in spec order; a stage's passed units join its `then`.
    let mut pool = BudgetPool::new(settings.budget.clone());
    if let Some(flag) = &opts.interrupt {
        pool = pool.interrupted_by(std::sync::Arc::clone(flag));
    }
    let budget = std::sync::Arc::new(pool);
    progress.watch_budget(std::sync::Arc::clone(&budget), settings.budget.clone());
    let scope = stages::Scope {
        plan,
        settings: &settings,
        progress,
        store,
        run_id,
        routed: &routed,
        budget: &budget,
    };
    let mut state = stages::State::new(plan, opts, &settings);
    if opts.fleet {
        state.backends.fleet = Some(crate::fleet::FleetLink {
            store_path: opts.store_path.clone(),
            run_id: run_id.to_owned(),
        });
    }
    let controller = match &plan.interval {
        Some(target) => Controller::with_interval(spec.contract.clone(), target.clone()),
        None => Controller::new(spec.contract.clone()),
    };
    let ledger = FactLedger::new(store, controller, stages::score_pointer(&spec.contract));
    let mut staged = scope.unit_stages(&mut table, &mut state, &ledger, &mut phases)?;
    // An interval contract's stage that received no unit never declared
    // its order: the share it estimates is exactly none of the routed.
    if let Some(target) = &plan.interval
        && !staged.received.contains_key(&target.stage)
    {
        ledger
            .controller()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .set_draw_order(Vec::new(), table.len() as u64);
    }
    let (mut facts, mut totals) = ledger.into_parts();
    let depths: Vec<u32> = (0..table.len()).map(|i| table.depth(i)).collect();
    state.stats.tree = std::mem::take(&mut staged.nursery).shape(
        &settings.budget,
        &depths,
        &facts,
        &budget.level_calls(),
    );
    for stage in &plan.stages {
        stage.review(&facts, &mut state.stats);
    }
    stages::keep_escalated_answers(&mut facts, &staged.escalated);
    let mut stop = staged.stop;
    let received = staged.received;
    scope.reducers(&table, &mut state, &facts, &mut stop, &mut phases)?;
    let stages::State {
        mut stats,
        backends,
        shared,
    } = state;
    stats.model_calls += totals.calls;
    stats.cost.add(&totals.cost);
    stats.recomputed_units = std::mem::take(&mut totals.recomputed);
    stats.corrupt_facts = store.corrupt_facts();
    stats.truncated_units = facts.iter().filter(|(_, f)| f.truncated_tokens > 0).count() as u64;

    // Fold, in source order.
    let fold = fold_facts(spec, store, &table, &mut facts, &mut stats);
    phases.mark("fold");

    // Answer.
    let answered = answer::answer(spec, &fold.root, &facts, &table);
    let statuses = fold.root.total_statuses();
    let estimate = totals.estimate.take();
    let mut incomplete = answer::incomplete(
        spec,
        &statuses,
        &stop,
        &routed.coverage,
        &routed.rejected_by_reason,
        // A reached interval excuses only its own cancellations (the
        // contract's, below); a budget, a breaker, errors or units not run
        // anywhere in the run still make the answer incomplete.
        answered.reached,
    );
    if let Some(why) = crate::interval::shortfall(plan.interval.as_ref(), estimate.as_ref()) {
        incomplete.push(why);
    }
    for stage in plan.stages.iter().filter(|s| !s.shape().reads_answer()) {
        incomplete.extend(stage.shortfalls(&stats));
    }
    // Units pruned before a bound was broken were pruned on a false proof.
    if !totals.violations.is_empty() && statuses.cancelled > 0 {
        incomplete.push(format!(
            "{} units were pruned before a score broke its bound ({})",
            statuses.cancelled,
            totals.violations.join("; ")
        ));
    }
    phases.mark("answer");

    // Verify against the stored artifact, read back by byte range.
    let cited = cited_units(plan, &answered, &facts, &stats);
    // The fold's order, which the flat re-check of its numbers keeps.
    let folded: Vec<&FactRecord> = facts.iter().map(|(_, f)| f).collect();
    let report = verify::verify_stored(
        plan,
        store,
        verify::Checked {
            artifact,
            partition: partition_id,
            facts: &folded,
            cited: &cited,
            added: table.added_fields(),
            born: verify::born_of(&table),
            root: &fold.root,
        },
    );
    drop(folded);
    phases.mark("verify");

    // Effects, on the units the answer selected, once it verified.
    let act = crate::kit::ActGate {
        dry_run: opts.dry_run,
        allow_new_version: opts.allow_new_version,
        held: if !report.passed {
            Some("the answer did not verify".into())
        } else if !incomplete.is_empty() {
            Some(format!(
                "the answer is incomplete: {}",
                incomplete.join("; ")
            ))
        } else {
            None
        },
    };
    let mut state = stages::State {
        backends,
        shared,
        stats,
    };
    let targets = answer_targets(&answered, &facts);
    scope.effects(&table, &mut state, &targets, &facts, &act, &mut phases)?;
    let stages::State {
        mut stats,
        backends,
        ..
    } = state;
    for stage in plan.stages.iter().filter(|s| s.shape().reads_answer()) {
        incomplete.extend(stage.shortfalls(&stats));
    }
    let mut facts: Vec<FactRecord> = facts.into_iter().map(|(_, f)| f).collect();
    facts.sort_by(|a, b| {
        a.source_ids
            .cmp(&b.source_ids)
            .then_with(|| a.stage.cmp(&b.stage))
    });

    stats.phases_ms = phases.list;
    stats.peak_rss_kib = crate::report::peak_rss_kib();
    stats.wall_ms = stats.phases_ms.iter().map(|(_, ms)| ms).sum();
    let simulated = backends.infos.iter().any(|b| b.simulated);
    let complete = incomplete.is_empty();
    let quality: Vec<String> = plan
        .stages
        .iter()
        .filter_map(|s| s.quality(&stats))
        .collect();
    let excluded = routed.excluded_by_reason.values().sum();
    let certificate = Certificate {
        schema: "fanfold.certificate/v2".into(),
        run_id: run_id.to_owned(),
        spec: spec.name.clone(),
        spec_hash: plan.spec_hash,
        question: spec.question.clone(),
        source_hash: artifact.hash,
        source_bytes: artifact.len,
        source_origin: artifact.origin.clone(),
        settings: RunSettingsReport {
            slots: settings.slots,
            max_unit_bytes: settings.max_unit_bytes,
            partition_threads: settings.partition_threads,
        },
        coverage: routed.coverage,
        coverage_complete: routed.coverage.is_complete(),
        complete,
        incomplete: incomplete.clone(),
        notes: totals
            .violations
            .iter()
            .cloned()
            .chain(unmatched_reducer_paths(spec, &facts))
            .chain(unmatched_fields(plan, &table))
            .chain(unmatched_unit_paths(spec, &table))
            .collect(),
        rejected_by_reason: routed.rejected_by_reason.clone(),
        rejections: routed.rejections.clone(),
        repeats: routed.repeats.clone(),
        excluded_by_reason: routed.excluded_by_reason.clone(),
        routed_by_stage: received,
        statuses_by_stage: fold.root.statuses.clone(),
        statuses,
        stop: stop.clone(),
        contract: spec.contract.type_name().into(),
        estimate: estimate.clone(),
        budget_limits: settings.budget.clone(),
        stats,
        fold_root: fold.root_key,
        verify: report.clone(),
        backends: backends.infos.clone(),
        simulated,
        spec_path: std::path::absolute(&plan.spec_path)
            .ok()
            .map(|p| p.display().to_string()),
        spec_as_run: serde_json::to_value(&plan.spec).ok(),
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
        schema: "fanfold.answer/v2".into(),
        question: spec.question.clone(),
        simulated,
        contract: spec.contract.type_name().into(),
        complete,
        incomplete,
        reached: answered.reached,
        estimate,
        quality,
        items: answered.items,
        themes: answered.themes,
        stated: answered.stated,
        aggregates: answered.aggregates,
        collapsed: answered.collapsed,
        statuses,
        excluded,
        repeated_identical: routed.coverage.repeated_identical,
        stop: stop.clone(),
        verified: report.passed,
    };

    for chunk in facts.chunks(10_000) {
        let rows: Vec<RunUnitRow> = chunk
            .iter()
            .filter_map(|f| {
                Some(RunUnitRow {
                    unit_id: f.source_ids.first()?.0.clone(),
                    stage: f.stage.clone(),
                    status: f.status.as_str().into(),
                    reason: f.reason.clone(),
                    fact_key: f.status.is_cacheable().then_some(f.key),
                })
            })
            .collect();
        store.put_run_units(run_id, &rows)?;
    }
    let cert_json = serde_json::to_string(&certificate).unwrap_or_default();
    store.finish_run(run_id, stop.code(), &cert_json)?;
    drop(cert_json);

    let (sections, mut accounting, mut files) = stage_outputs(plan, &certificate);
    if let Some(tree) = &certificate.stats.tree {
        accounting.push(format!("bred units: {}", tree.line()));
    }
    let bred = crate::kit::born::bred_lines(&table);
    if !bred.is_empty() {
        files.push((
            "bred.jsonl".into(),
            bred.iter()
                .filter_map(|b| serde_json::to_value(b).ok())
                .collect(),
        ));
    }
    let report = RunReport {
        run_id: run_id.to_owned(),
        answer,
        certificate,
        facts,
        fold,
        sections,
        accounting,
        files,
    };
    if let Some(dir) = &opts.out_dir {
        crate::output::write_all(dir, &report)?;
    }
    Ok(report)
}

/// Folds the answer's facts in source order (then by stage), and marks
/// each with its path up the tree.
fn fold_facts(
    spec: &fanfold_core::spec::Spec,
    store: &Store,
    table: &crate::kit::UnitTable,
    facts: &mut [(usize, FactRecord)],
    stats: &mut crate::report::RunStats,
) -> fanfold_ops::fold::FoldOutcome {
    let ordinal = |i: usize| table.unit(i).ok().map(|u| u.ordinal);
    facts.sort_by(|(a, fa), (b, fb)| {
        ordinal(*a)
            .cmp(&ordinal(*b))
            .then_with(|| fa.stage.cmp(&fb.stage))
    });
    let read = unit_pointers(&spec.fold);
    let leaves: Vec<Leaf> = facts
        .iter()
        .map(|(i, f)| {
            let unit = if read.is_empty() {
                Value::Null
            } else {
                unit_fields(&read, &table.value(*i))
            };
            leaf_of(f, unit)
        })
        .collect();
    let fold = fold_tree(&spec.fold, &leaves, &mut StoreNodes(store));
    stats.fold_depth = fold.depth;
    stats.fold_nodes_computed = fold.nodes_computed;
    stats.fold_nodes_reused = fold.nodes_reused;
    for ((_, f), path) in facts.iter_mut().zip(&fold.paths) {
        f.reducer_path = path.iter().map(|k| k.short(12)).collect();
    }
    fold
}

/// The table positions of the units the answer selected, in the answer's
/// order.
fn answer_targets(answered: &answer::Answered, facts: &[(usize, FactRecord)]) -> Vec<usize> {
    let at: HashMap<&UnitId, usize> = facts
        .iter()
        .filter_map(|(i, f)| Some((f.source_ids.first()?, *i)))
        .collect();
    let mut seen = BTreeSet::new();
    answered
        .items
        .iter()
        .filter_map(|item| at.get(&item.unit_id).copied())
        .filter(|i| seen.insert(*i))
        .collect()
}

/// Every unit verify reads back: the answer's items and themes, what the
/// stages' reports cite, and the members a widened answer was shown.
fn cited_units(
    plan: &Plan,
    answered: &answer::Answered,
    facts: &[(usize, FactRecord)],
    stats: &crate::report::RunStats,
) -> BTreeSet<UnitId> {
    let mut cited: BTreeSet<UnitId> = answered
        .items
        .iter()
        .map(|i| i.unit_id.clone())
        .chain(answered.themes.iter().flat_map(|t| t.ids.iter().cloned()))
        .chain(plan.stages.iter().flat_map(|s| s.cited(stats)))
        .collect();
    let shown: Vec<UnitId> = facts
        .iter()
        .filter(|(_, f)| f.source_ids.first().is_some_and(|id| cited.contains(id)))
        .flat_map(|(_, f)| f.source_ids.iter().skip(1).cloned())
        .collect();
    cited.extend(shown);
    cited
}

/// What each stage adds to the outputs, in spec order: its sections of
/// answer.md, its accounting lines, and its files (stages of one kind
/// that write the same file share it).
#[allow(clippy::type_complexity)]
fn stage_outputs(
    plan: &Plan,
    certificate: &Certificate,
) -> (Vec<String>, Vec<String>, Vec<(String, Vec<Value>)>) {
    let label = if certificate.simulated {
        format!(" {}", crate::output::SIMULATED)
    } else {
        String::new()
    };
    let sections = plan
        .stages
        .iter()
        .filter_map(|s| s.answer_section(&certificate.stats, &label))
        .collect();
    let accounting = plan
        .stages
        .iter()
        .filter_map(|s| s.accounting(&certificate.stats))
        .collect();
    let mut files: Vec<(String, Vec<Value>)> = Vec::new();
    for stage in &plan.stages {
        for (name, lines) in stage.output_files(&certificate.stats) {
            match files.iter_mut().find(|(n, _)| *n == name) {
                Some((_, all)) => all.extend(lines),
                None => files.push((name, lines)),
            }
        }
    }
    (sections, accounting, files)
}

/// Fields a stage's contexts show (`fields`, without `project`) that no
/// unit it could see has: its contexts are emptier than the spec reads.
/// The scan stops at the first unit holding each field, so a field that is
/// there costs a unit or two.
fn unmatched_fields(plan: &Plan, table: &crate::kit::UnitTable) -> Vec<String> {
    let mut notes = Vec::new();
    for stage in &plan.stages {
        let Some(view) = stage.evidence_view() else {
            continue;
        };
        if view.project.is_some() || view.fields.is_empty() || table.is_empty() {
            continue;
        }
        let mut missing: Vec<&String> = view.fields.iter().collect();
        for i in 0..table.len() {
            let value = table.value(i);
            missing.retain(|f| value.get(f.as_str()).is_none());
            if missing.is_empty() {
                break;
            }
        }
        for f in missing {
            let note = format!(
                "stage `{}` shows field `{f}`, which none of the {} units read has: check `fields` against the input",
                stage.name(),
                table.len()
            );
            tracing::warn!("{note}");
            notes.push(note);
        }
    }
    notes
}

/// `unit:` paths no unit holds: the groups they key would be empty
/// without a word. The scan stops at the first unit holding each.
fn unmatched_unit_paths(
    spec: &fanfold_core::spec::Spec,
    table: &crate::kit::UnitTable,
) -> Vec<String> {
    let mut missing = unit_pointers(&spec.fold);
    for i in 0..table.len() {
        if missing.is_empty() {
            break;
        }
        let value = table.value(i);
        missing.retain(|p| {
            fanfold_ops::fold::unit_pointer(p).is_none_or(|f| value.pointer(f).is_none())
        });
    }
    if table.is_empty() {
        return Vec::new();
    }
    missing
        .into_iter()
        .map(|p| {
            let note = format!(
                "the reducers read `{p}`, which none of the {} units holds: check the path against the input",
                table.len()
            );
            tracing::warn!("{note}");
            note
        })
        .collect()
}

/// Reducers whose path matched none of the facts they read: a typo in
/// `key` or `value` gives an empty answer without any error, so it is said.
fn unmatched_reducer_paths(spec: &fanfold_core::spec::Spec, facts: &[FactRecord]) -> Vec<String> {
    let mut notes = Vec::new();
    for r in &spec.fold.reducers {
        let statuses = r
            .statuses
            .clone()
            .unwrap_or_else(|| vec![fanfold_core::Status::Positive]);
        let read: Vec<&FactRecord> = facts
            .iter()
            .filter(|f| r.stage.as_ref().is_none_or(|s| *s == f.stage))
            .filter(|f| statuses.contains(&f.status))
            .collect();
        if read.is_empty() {
            continue;
        }
        for p in r.pointers() {
            if fanfold_ops::fold::unit_pointer(p).is_some() {
                continue;
            }
            if !read.iter().any(|f| f.facts.pointer(p).is_some()) {
                let note = format!(
                    "reducer `{}` read {} facts and its path `{p}` matched none of them: check the path against the stage's output schema",
                    r.name,
                    read.len()
                );
                tracing::warn!("{note}");
                notes.push(note);
            }
        }
    }
    notes
}

/// A run id unique across processes sharing a store: the time, the
/// source, this process and a count within it.
fn new_run_id(source: &ContentHash) -> String {
    static RUNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!(
        "run-{}-{}-{}-{n}",
        fanfold_store::now_ms(),
        source.short(8),
        std::process::id()
    )
}

/// The `unit:` pointers the fold's reducers read.
pub(crate) fn unit_pointers(fold: &fanfold_core::spec::FoldSpec) -> Vec<&str> {
    let mut read: Vec<&str> = fold
        .reducers
        .iter()
        .flat_map(|r| r.pointers())
        .filter(|p| fanfold_ops::fold::unit_pointer(p).is_some())
        .collect();
    read.sort_unstable();
    read.dedup();
    read
}

/// The unit's values at `read`, keyed by pointer, as a leaf carries them.
pub(crate) fn unit_fields(read: &[&str], unit: &Value) -> Value {
    let fields: serde_json::Map<String, Value> = read
        .iter()
        .filter_map(|p| {
            let field = fanfold_ops::fold::unit_pointer(p)?;
            Some(((*p).to_owned(), unit.pointer(field)?.clone()))
        })
        .collect();
    Value::Object(fields)
}

pub(crate) fn leaf_of(f: &FactRecord, unit: Value) -> Leaf {
    Leaf {
        unit_id: f
            .source_ids
            .first()
            .cloned()
            .unwrap_or(UnitId(String::new())),
        stage: f.stage.clone(),
        status: f.status,
        facts: if f.status.is_cacheable() {
            f.facts.clone()
        } else {
            Value::Null
        },
        unit,
    }
}

/// Tries the embed stage `name` on the units the prefilter routes to it
/// (at most `most`, spread evenly over them) before any run, for `fanfold
/// new`, which states what its first rung keeps in the spec it writes.
pub fn preview_embed(
    plan: &Plan,
    name: &str,
    source: &Source,
    store: &Store,
    max_unit_bytes: u64,
    most: usize,
) -> Result<crate::stages::embed::Preview, RunError> {
    use crate::stages::embed::{EmbedRunner, preview};
    let runner = plan
        .stage(name)
        .and_then(|s| s.as_any().downcast_ref::<EmbedRunner>())
        .ok_or_else(|| RunError::Embed {
            stage: name.to_owned(),
            source: "the spec has no embed stage of that name".into(),
        })?;
    let routed = route_source(plan, source, max_unit_bytes)?;
    let all = routed.by_stage.get(name).cloned().unwrap_or_default();
    preview(runner, &plan.spec_dir, &routed.table, &all, store, most)
}

/// Partitions and prefilters `source` without storing anything: the units
/// a run would route, for `explain` and for tools that drive one stage.
pub fn route_source(
    plan: &Plan,
    source: &Source,
    max_unit_bytes: u64,
) -> Result<route::Routed, RunError> {
    route_source_keeping(plan, source, max_unit_bytes, None)
}

/// [`route_source`], holding only the units whose ids `keep` lists.
pub fn route_source_keeping(
    plan: &Plan,
    source: &Source,
    max_unit_bytes: u64,
    keep: Option<&std::collections::HashSet<String>>,
) -> Result<route::Routed, RunError> {
    // Units carry their source's hash, so the source is hashed first; a
    // stream that cannot be read twice is read into memory.
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    let options = route::stream_options(max_unit_bytes, threads);
    let source = &plan.resolve(source.clone())?;
    let origin = source.origin();
    match source {
        Source::File(_) | Source::Documents { .. } => {
            let mut hasher = blake3::Hasher::new();
            let mut reader = source.open()?;
            std::io::copy(&mut reader, &mut hasher).map_err(|e| reader.read_error(&origin, e))?;
            reader.finish()?;
            let hash = ContentHash(*hasher.finalize().as_bytes());
            let mut reader = source.open()?;
            let routed =
                route::route_keeping(plan, hash, &origin, &mut reader, None, options, keep, None)?;
            reader.finish()?;
            Ok(routed)
        }
        _ => {
            let bytes = source.read()?;
            let hash = ContentHash::of_bytes(&bytes);
            route::route_keeping(
                plan,
                hash,
                &origin,
                bytes.as_slice(),
                None,
                options,
                keep,
                None,
            )
        }
    }
}

/// Partition and prefilter without running anything: what `explain` shows.
/// Reads the input directly (nothing is stored) and counts, from the store
/// when there is one, the facts each stage would reuse, without loading a
/// model.
pub fn explain_routing(
    plan: &Plan,
    source: &Source,
    store: Option<&Store>,
    max_unit_bytes: u64,
) -> Result<Routing, RunError> {
    let routed = route_source(plan, source, max_unit_bytes)?;
    crate::plan::output_fields_in(&plan.spec, &routed.table).map_err(|detail| RunError::Spec {
        path: plan.spec_path.display().to_string(),
        detail,
    })?;
    let mut r = Routing {
        elements: routed.coverage.elements,
        units: routed.coverage.units,
        rejected: routed.coverage.rejected,
        repeated_identical: routed.coverage.repeated_identical,
        rejected_by_reason: routed.rejected_by_reason.clone(),
        excluded_by_reason: routed.excluded_by_reason.clone(),
        ..Routing::default()
    };
    let mut queued: HashMap<String, Vec<usize>> = routed.by_stage.clone().into_iter().collect();
    for stage in &plan.stages {
        let name = stage.name();
        let Some(units) = queued.remove(name) else {
            continue;
        };
        r.routed.insert(name.to_owned(), units.len() as u64);
        let Some(store) = store else {
            // Without a store nothing is cached: the calls are the plan's.
            if let Some(calls) = stage.planned_calls(&routed.table, &units)? {
                r.calls.insert(name.to_owned(), calls);
            }
            if let Some(then) = stage.shape().then {
                r.undecided_before
                    .entry(then.to_owned())
                    .or_default()
                    .add(name, units.len() as u64);
            }
            continue;
        };
        let count = stage.count_cached(&plan.spec, &plan.spec_dir, store, &routed.table, &units)?;
        if let Some(why) = count.unknown {
            r.unknown.insert(name.to_owned(), why);
        }
        r.cached.insert(name.to_owned(), count.cached);
        if let Some(bred) = count.bred {
            r.bred.insert(name.to_owned(), *bred);
        }
        if let Some(calls) = count.calls {
            r.calls.insert(name.to_owned(), calls);
        }
        if let Some(then) = stage.shape().then {
            r.undecided_before
                .entry(then.to_owned())
                .or_default()
                .add(name, units.len() as u64 - count.cached);
            let next = queued.entry(then.to_owned()).or_default();
            next.extend(count.passed);
            next.sort_unstable();
        }
        for (to, sent) in count.sent {
            let next = queued.entry(to).or_default();
            next.extend(sent);
            next.sort_unstable();
        }
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    #[test]
    fn run_ids_are_unique_within_a_millisecond() {
        let h = fanfold_core::ContentHash::of_bytes(b"s");
        let ids: std::collections::HashSet<String> =
            (0..1000).map(|_| super::new_run_id(&h)).collect();
        assert_eq!(ids.len(), 1000);
        assert!(
            ids.iter()
                .all(|i| i.contains(&std::process::id().to_string()))
        );
    }
}
