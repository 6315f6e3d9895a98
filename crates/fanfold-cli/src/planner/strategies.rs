//! The whole-run strategies `fanfold plan` measures beside a cascade's
//! proxies: one micro-context per unit, chunks, one long context, the
//! spec's own rungs without the cascade, and each scoring rung alone. They
//! are the bench ladder's strategies, rewritten by the same
//! [`fanfold_engine::strategy::apply`].
//!
//! A strategy decides every unit without the oracle, so it is measured on
//! a seeded uniform sample of the units the prefilter keeps, labelled by
//! the oracle, and run on that sample alone (a file of the sampled
//! records, keyed as the input is, so its facts are the ones a whole run
//! would reuse). Its quality is bounded exactly for sampling without
//! replacement from the population ([`fanfold_ops::audit`]); its cost is
//! the sample's, scaled to the population. It is held to the target on
//! both sides (recall and precision), since a recall target alone is met
//! by keeping everything and a precision target by keeping one sure unit.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, anyhow, bail};
use fanfold_core::spec::{
    CascadeOracle, CascadeSpec, PartitionSpec, QualityMetric, Spec, StageSpec,
};
use fanfold_core::{ContentHash, Status};
use fanfold_engine::plan::StrategyChoice;
use fanfold_engine::strategy::{self, CHUNK_RUBRIC, Roles, WINDOW_TOKENS};
use fanfold_engine::{NoProgress, Plan, RunOptions, RunReport, Source};
use fanfold_ops::audit::{misses_at_least, misses_at_most, sample_rank};

/// What the strategies are measured with.
pub(super) struct Setting<'a> {
    pub base: &'a Plan,
    pub stage: &'a str,
    pub declared: &'a CascadeSpec,
    pub source: Option<Source>,
    pub store: PathBuf,
    pub slots: usize,
    pub max_unit_bytes: u64,
    pub out: &'a Path,
}

/// The strategies a spec can be run as, each with the rung it keeps; and
/// why some are not.
pub(super) fn candidates(
    spec: &Spec,
    spec_dir: &Path,
    stage: &str,
    declared: &CascadeSpec,
) -> (Vec<StrategyChoice>, Vec<String>) {
    let choice = |strategy: &str, rung: Option<&str>| StrategyChoice {
        stage: stage.to_owned(),
        strategy: strategy.to_owned(),
        rung: rung.map(str::to_owned),
    };
    if declared.labels.is_none() && declared.oracle == CascadeOracle::Person {
        return (
            Vec::new(),
            vec!["the whole-run strategies: a person is the oracle and no labels file is declared, and they are measured on the labels of a uniform sample (declare `labels` to measure them)".to_owned()],
        );
    }
    let mut out = Vec::new();
    let mut skipped = Vec::new();
    for rung in super::rungs_before(spec, stage) {
        out.push(choice("embed", Some(rung)));
    }
    if oracle_is_backend(declared) {
        skipped.push(
            "micro: the oracle is the stage's own backend, so one micro-context per unit is the oracle deciding every unit".to_owned(),
        );
    } else {
        out.push(choice("micro", None));
    }
    if spec.stages.first().is_some_and(|s| s.name() != stage) {
        out.push(choice("adaptive", None));
    }
    if spec_dir.join(CHUNK_RUBRIC).is_file() {
        for s in ["chunk-10", "chunk-50", "chunk-200", "long"] {
            out.push(choice(s, None));
        }
    } else {
        skipped.push(format!(
            "chunk-10, chunk-50, chunk-200, long: no {CHUNK_RUBRIC} beside the spec (a context of many units is asked for the matching ids, by a rubric of its own)"
        ));
    }
    (out, skipped)
}

/// The fewest model calls `choice` could be proven at, known before it
/// runs, in the units of [`Measured::model_calls`]: a scoring rung alone
/// calls no model, and the spec's rungs may pass no unit on; one context
/// a unit makes a call for each distinct view of the population; contexts
/// of at most `k` units, a call for each `k` of the population's units;
/// one long context, one call.
pub(super) fn least_model_calls(choice: &StrategyChoice, sample: &Sample) -> f64 {
    let strategy = choice.strategy.as_str();
    if sample.ids.is_empty() || matches!(strategy, "embed" | "adaptive") {
        return 0.0;
    }
    if let Some(k) = chunk_size(strategy) {
        return sample.population as f64 / k.max(1) as f64;
    }
    match strategy {
        "micro" => sample.views.map_or(sample.population, |(all, _)| all) as f64,
        _ => 1.0,
    }
}

/// The most units one context of `strategy` holds: `k` for `chunk-k`.
fn chunk_size(strategy: &str) -> Option<usize> {
    strategy.strip_prefix("chunk-")?.parse().ok()
}

/// A measured chunk strategy whose contexts, smaller than `choice`'s,
/// listed no id at all though the oracle calls some of the units they
/// held positive. A larger context asks the same model the same
/// question over more units, so `choice` is not run after it (it stays
/// in the union bound, so the delta is unchanged): with the embedded
/// model, a context of 10 units that lists nothing has each time been
/// followed by contexts of 50 and 200 that list nothing either.
pub(super) fn after_silent_chunk<'r>(
    choice: &StrategyChoice,
    runs: &'r [Measured],
) -> Option<&'r Measured> {
    let larger_than = |k: usize| match chunk_size(&choice.strategy) {
        Some(own) => own > k,
        None => choice.strategy == "long",
    };
    runs.iter()
        .find(|r| chunk_size(&r.choice.strategy).is_some_and(larger_than) && r.listed_nothing())
}

/// A strategy as the table names it.
pub(super) fn describe(choice: &StrategyChoice) -> String {
    match &choice.rung {
        Some(r) => format!("`{r}` alone"),
        None if choice.strategy == "adaptive" => "the spec's rungs, no cascade".to_owned(),
        None => choice.strategy.clone(),
    }
}

/// Whether the cascade's oracle is a person, asked through `fanfold label`.
pub(super) fn oracle_is_person(declared: &CascadeSpec) -> bool {
    declared.labels.is_none() && declared.oracle == CascadeOracle::Person
}

/// Whether the cascade's oracle is the stage's own backend.
pub(super) fn oracle_is_backend(declared: &CascadeSpec) -> bool {
    declared.labels.is_none() && declared.oracle == CascadeOracle::Backend
}

/// One strategy's measured row.
pub(super) struct Measured {
    pub choice: StrategyChoice,
    pub what: String,
    pub counts: Counts,
    pub bounds: Bounds,
    /// The declared metric's value on the sample.
    pub estimate: f64,
    pub meets: bool,
    /// Why it does not meet the target, beyond its bounds.
    pub note: Option<String>,
    pub sample_calls: u64,
    pub sample_tokens: u64,
    pub wall_secs: f64,
    /// The population over the sample run's units.
    pub scale: f64,
    /// A chunk strategy needed a second context for no more units than
    /// its size: the records it ran on fill more than one window.
    pub overflows_window: bool,
}

impl Measured {
    pub fn model_calls(&self) -> f64 {
        if self.choice.strategy == "long" {
            // One context holds the population, when it fits at all.
            return self.sample_calls.min(1) as f64;
        }
        self.sample_calls as f64 * self.scale
    }

    pub fn tokens(&self) -> f64 {
        self.sample_tokens as f64 * self.scale
    }

    pub fn name(&self) -> String {
        describe(&self.choice)
    }

    /// Kept no unit of those it decided, though the oracle calls some of
    /// them positive.
    pub fn listed_nothing(&self) -> bool {
        self.counts.tp + self.counts.fp == 0 && self.counts.fn_ > 0
    }
}

/// A strategy's answer against the oracle's labels on the sample.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Counts {
    pub tp: u64,
    pub fp: u64,
    pub fn_: u64,
    pub tn: u64,
    /// Sampled units the oracle gave no label: counted against every
    /// metric.
    pub unlabelled: u64,
}

impl Counts {
    fn n(&self) -> u64 {
        self.tp + self.fp + self.fn_ + self.tn + self.unlabelled
    }

    fn of(&self, metric: QualityMetric) -> f64 {
        let ratio = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
        match metric {
            QualityMetric::Recall => ratio(self.tp, self.tp + self.fn_ + self.unlabelled),
            QualityMetric::Precision => ratio(self.tp, self.tp + self.fp + self.unlabelled),
            QualityMetric::Accuracy => ratio(self.tp + self.tn, self.n()),
            QualityMetric::RecallAndPrecision => self
                .of(QualityMetric::Recall)
                .min(self.of(QualityMetric::Precision)),
        }
    }
}

/// Lower bounds on the population's recall, precision and accuracy,
/// jointly at 1 − `delta`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct Bounds {
    pub recall: f64,
    pub precision: f64,
    pub accuracy: f64,
}

/// Exact bounds from a sample of `counts.n()` units drawn without
/// replacement from `population`: the true positives bounded below and
/// the misses and false positives above, each at δ/4, and the errors for
/// accuracy at the fourth δ/4 (a union bound over the four).
pub(super) fn bounds(counts: &Counts, population: u64, delta: f64) -> Bounds {
    let n = counts.n();
    let alpha = delta / 4.0;
    let tp = misses_at_least(population, n, counts.tp, alpha) as f64;
    let missed = misses_at_most(population, n, counts.fn_ + counts.unlabelled, alpha) as f64;
    let wrong_kept = misses_at_most(population, n, counts.fp + counts.unlabelled, alpha) as f64;
    let errors = misses_at_most(
        population,
        n,
        counts.fp + counts.fn_ + counts.unlabelled,
        alpha,
    ) as f64;
    let share = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
    Bounds {
        recall: share(tp, tp + missed),
        precision: share(tp, tp + wrong_kept),
        accuracy: 1.0 - share(errors, population as f64),
    }
}

/// Whether the bounds prove the declared target: recall and precision
/// targets on both sides, accuracy on its own.
pub(super) fn proves(b: &Bounds, target: QualityMetric, at_least: f64) -> bool {
    match target {
        QualityMetric::Recall | QualityMetric::Precision | QualityMetric::RecallAndPrecision => {
            b.recall >= at_least && b.precision >= at_least
        }
        QualityMetric::Accuracy => b.accuracy >= at_least,
    }
}

/// The seeded sample, its labels and the file of its records.
pub(super) struct Sample {
    /// Units the prefilter keeps: the population.
    pub population: u64,
    pub ids: Vec<String>,
    /// The oracle's label of each sampled id; `None` where it gave none.
    pub labels: HashMap<String, Option<bool>>,
    pub file: PathBuf,
    /// The sampled records' partition: JSONL, keyed as the input is.
    pub partition: PartitionSpec,
    /// Model calls the oracle's labels took (with the backend as oracle).
    pub oracle_calls: u64,
    /// Distinct views of the judge among the population and among the
    /// sample: units that share a view share one call, so a strategy of
    /// one context a unit scales by views, not units. `None` when the
    /// judge declares no view to count.
    pub views: Option<(u64, u64)>,
}

/// How many distinct views the judge `stage` has of `units`; `None` when
/// it declares none or a unit cannot be projected.
fn distinct_views(
    plan: &Plan,
    stage: &str,
    units: &[(u64, String, serde_json::Value)],
) -> Option<u64> {
    let view = plan
        .stages
        .iter()
        .find(|s| s.name() == stage)?
        .evidence_view()?;
    let projector =
        fanfold_ops::view::Projector::compile(stage, view.project.as_deref(), &view.fields).ok()?;
    let mut seen = std::collections::HashSet::new();
    for (_, id, value) in units {
        let v = projector.project(id, value).ok()?;
        seen.insert(ContentHash::of_bytes(
            serde_json::to_string(&v).ok()?.as_bytes(),
        ));
    }
    Some(seen.len() as u64)
}

/// Draws the sample (the declared label budget, seeded by the cascade's
/// seed), writes its records and labels it.
pub(super) fn sample(set: &Setting<'_>) -> Result<Sample> {
    let plan = set.base;
    let source = match &set.source {
        Some(s) => s.clone(),
        None => plan
            .default_source()
            .ok_or_else(|| anyhow!("the spec names no input: pass --input"))?,
    };
    let routed = fanfold_engine::run::route_source(plan, &source, set.max_unit_bytes)?;
    let key = match &plan.spec.input.partition {
        PartitionSpec::JsonArray { key: Some(k), .. }
        | PartitionSpec::Jsonl { key: Some(k), .. }
        | PartitionSpec::Csv { key: Some(k), .. } => k.clone(),
        PartitionSpec::Lines { .. } => "line".to_owned(),
        _ => bail!(
            "the input has no `key`: a strategy is measured on a sample of its records, which must keep their ids"
        ),
    };
    let mut kept: Vec<(u64, String, serde_json::Value)> = Vec::new();
    for &i in routed.by_stage.values().flatten() {
        let id = routed.table.id(i)?.as_str().to_owned();
        let rank = sample_rank(set.declared.seed, &ContentHash::of_bytes(id.as_bytes()));
        kept.push((rank, id, routed.table.value(i)));
    }
    let population = kept.len() as u64;
    kept.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
    let budget = set.declared.label_budget.max(1);
    let views = distinct_views(plan, set.stage, &kept).zip(distinct_views(
        plan,
        set.stage,
        kept.get(..budget).unwrap_or(&kept),
    ));
    kept.truncate(budget);
    std::fs::create_dir_all(set.out).with_context(|| format!("creating {}", set.out.display()))?;
    let file = set.out.join("sample.jsonl");
    let mut text = String::new();
    for (_, _, value) in &kept {
        text.push_str(&serde_json::to_string(value)?);
        text.push('\n');
    }
    std::fs::write(&file, text).with_context(|| format!("writing {}", file.display()))?;
    let partition = PartitionSpec::Jsonl {
        key: Some(key),
        kind: plan.spec.input.partition.kind().to_owned(),
    };
    let ids: Vec<String> = kept.into_iter().map(|(_, id, _)| id).collect();
    let mut out = Sample {
        population,
        ids,
        labels: HashMap::new(),
        file,
        partition,
        oracle_calls: 0,
        views,
    };
    // The sample's records must come back under the ids they were drawn by.
    let mut spec = plan.spec.clone();
    spec.input.partition = out.partition.clone();
    spec.input.command = None;
    let probe = Plan::from_spec(spec, &plan.spec_path, &plan.spec_dir)?;
    let again = fanfold_engine::run::route_source(
        &probe,
        &Source::File(out.file.clone()),
        set.max_unit_bytes,
    )?;
    let back: BTreeSet<String> = (0..again.table.len())
        .map(|i| Ok(again.table.id(i)?.as_str().to_owned()))
        .collect::<Result<_, fanfold_engine::RunError>>()?;
    if back != out.ids.iter().cloned().collect::<BTreeSet<_>>() {
        bail!(
            "the sampled records do not keep their ids when read back as JSONL keyed by `{}`",
            match &out.partition {
                PartitionSpec::Jsonl { key: Some(k), .. } => k.as_str(),
                _ => "",
            }
        );
    }
    label(set, &mut out)?;
    Ok(out)
}

/// The oracle's labels of the sample: the labels file's, or the stage's
/// own backend judging each sampled unit.
fn label(set: &Setting<'_>, sample: &mut Sample) -> Result<()> {
    let judge = set
        .base
        .spec
        .stages
        .iter()
        .find_map(|s| match s {
            StageSpec::Map(m) if m.name == set.stage => Some(m),
            _ => None,
        })
        .ok_or_else(|| anyhow!("no map stage `{}`", set.stage))?;
    if let Some(file) = &set.declared.labels {
        let path = set.base.spec_dir.join(file);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let all = fanfold_engine::stages::map_cascade::read_labels(judge, file, &text)
            .map_err(|e| anyhow!(e))?;
        for id in &sample.ids {
            sample
                .labels
                .insert(id.clone(), all.get(id).copied().flatten());
        }
        return Ok(());
    }
    let (report, _) = run_on_sample(set, sample, &sample.file, "micro", None, "oracle")?;
    sample.oracle_calls = report.certificate.stats.model_calls;
    let decided = decisions(&report, set.stage);
    for id in &sample.ids {
        sample
            .labels
            .insert(id.clone(), decided.get(id.as_str()).copied());
    }
    Ok(())
}

/// Each unit's decision by `stage` in a run: positive or negative.
fn decisions<'r>(report: &'r RunReport, stage: &str) -> HashMap<&'r str, bool> {
    report
        .facts
        .iter()
        .filter(|f| f.stage == stage)
        .filter_map(|f| {
            let positive = match f.status {
                Status::Positive => true,
                Status::Negative => false,
                _ => return None,
            };
            Some((f.source_ids.first()?.as_str(), positive))
        })
        .collect()
}

/// Runs `strategy` on the records of `file` (the sample, or its first
/// units) alone: the report and the wall time.
fn run_on_sample(
    set: &Setting<'_>,
    sample: &Sample,
    file: &Path,
    strategy: &str,
    rung: Option<&str>,
    dir: &str,
) -> Result<(RunReport, f64)> {
    let roles = Roles::of(&set.base.spec, set.stage, rung).map_err(|e| anyhow!(e))?;
    let (mut spec, _) =
        strategy::apply(&set.base.spec, &roles, strategy, None, None).map_err(|e| anyhow!(e))?;
    spec.input.partition = sample.partition.clone();
    spec.input.command = None;
    let plan = Plan::from_spec(spec, &set.base.spec_path, &set.base.spec_dir)?;
    let mut opts = RunOptions::new(set.store.clone());
    opts.source = Some(Source::File(file.to_path_buf()));
    opts.slots = set.slots;
    opts.max_unit_bytes = set.max_unit_bytes;
    opts.out_dir = Some(set.out.join(dir));
    let _span =
        tracing::info_span!("strategy run", strategy, rung, units = %file.display()).entered();
    let started = Instant::now();
    let report = fanfold_engine::run(&plan, &opts, &NoProgress)
        .with_context(|| format!("the run of strategy {strategy} on the sample"))?;
    let wall = started.elapsed().as_secs_f64();
    tracing::info!(
        wall_secs = wall,
        model_calls = report.certificate.stats.model_calls,
        "strategy run finished"
    );
    Ok((report, wall))
}

/// How many of the sample's first units a strategy is run on, in turn,
/// until its verdict is known: a strategy that cannot prove the target on
/// them, even were every other sampled unit decided right, cannot prove it
/// on the whole sample, so it is not run on the rest. A prefix of the
/// seeded order is itself a uniform sample, and a unit judged alone is
/// judged the same whatever follows it, so its facts serve the next
/// prefix. A context of many units is the whole run's only once the stage
/// closed it by its own rule: a prefix one unit past `k` closes the first
/// context of `chunk-k`, and one whose records fill more than a window
/// closes it by the window. One context a unit starts at a sixteenth and
/// doubles: a longer prefix judges only its new units (the rest are
/// cached, and a stage with nothing to ask starts no model job), so a
/// strategy that proves the target pays little for the extra steps, and
/// one that cannot is stopped after few calls. The scoring rungs alone
/// call no model and `long` is one context: both are run on the whole
/// sample at once.
fn prefixes(choice: &StrategyChoice, n: usize) -> Vec<usize> {
    let strategy = choice.strategy.as_str();
    let mut sizes = match strategy.strip_prefix("chunk-").map(str::parse::<usize>) {
        Some(Ok(k)) => vec![k + 1, 4 * k + 1, n.div_ceil(2)],
        Some(Err(_)) => Vec::new(),
        None if matches!(strategy, "micro" | "adaptive") => {
            vec![n.div_ceil(16), n.div_ceil(8), n.div_ceil(4), n.div_ceil(2)]
        }
        None => Vec::new(),
    };
    sizes.retain(|&m| m >= 1 && m < n);
    sizes.sort_unstable();
    sizes.dedup();
    sizes.push(n);
    sizes
}

/// The sampled ids a run on the first `m` of them decided as the whole
/// sample's run would: every one for a strategy of one context a unit;
/// for contexts of many units, all but those of the prefix's last
/// context, unless that context is full (`k` units: the stage's own rule
/// closed it) or the prefix is the whole sample.
fn settled<'s>(
    report: &RunReport,
    judge: &str,
    choice: &StrategyChoice,
    ids: &'s [String],
    whole: bool,
) -> Vec<&'s str> {
    let size = choice
        .strategy
        .strip_prefix("chunk-")
        .and_then(|k| k.parse::<usize>().ok());
    let all = ids.iter().map(String::as_str);
    let Some(k) = size.filter(|_| !whole) else {
        return all.collect();
    };
    let context: HashMap<&str, &str> = report
        .facts
        .iter()
        .filter(|f| f.stage == judge)
        .filter_map(|f| {
            Some((
                f.source_ids.first()?.as_str(),
                f.facts.get("context")?.as_str()?,
            ))
        })
        .collect();
    let last = ids
        .iter()
        .rev()
        .find_map(|id| context.get(id.as_str()).copied());
    let open = last.filter(|c| context.values().filter(|v| *v == c).count() < k);
    all.filter(|id| open.is_none() || context.get(id) != open.as_ref())
        .collect()
}

/// A strategy's counts over the units it decided, and over the whole
/// sample were every other sampled unit decided as its label says.
fn counts_of(sample: &Sample, answer: &BTreeSet<&str>, decided: &[&str]) -> (Counts, Counts) {
    let decided: BTreeSet<&str> = decided.iter().copied().collect();
    let mut measured = Counts::default();
    let mut best = Counts::default();
    for id in &sample.ids {
        let label = sample.labels.get(id).copied().flatten();
        if !decided.contains(id.as_str()) {
            match label {
                None => best.unlabelled += 1,
                Some(true) => best.tp += 1,
                Some(false) => best.tn += 1,
            }
            continue;
        }
        let kept = answer.contains(id.as_str());
        for c in [&mut measured, &mut best] {
            match (label, kept) {
                (None, _) => c.unlabelled += 1,
                (Some(true), true) => c.tp += 1,
                (Some(true), false) => c.fn_ += 1,
                (Some(false), true) => c.fp += 1,
                (Some(false), false) => c.tn += 1,
            }
        }
    }
    (measured, best)
}

/// Runs and scores one strategy on the sample, its bounds at `delta`:
/// on the sample's first units, then on more, until its verdict is known
/// ([`prefixes`]).
pub(super) fn measure(
    set: &Setting<'_>,
    sample: &Sample,
    choice: StrategyChoice,
    delta: f64,
) -> Result<Measured> {
    let dir = format!(
        "strategy-{}{}",
        choice.strategy,
        choice
            .rung
            .as_deref()
            .map(|r| format!("-{r}"))
            .unwrap_or_default()
    );
    let n = sample.ids.len();
    let records = std::fs::read_to_string(&sample.file)
        .with_context(|| format!("reading {}", sample.file.display()))?;
    let mut wall_secs = 0.0;
    let mut run = None;
    for m in prefixes(&choice, n) {
        let whole = m >= n;
        let file = if whole {
            sample.file.clone()
        } else {
            let file = set.out.join(format!("sample-first-{m}.jsonl"));
            let text: String = records.lines().take(m).map(|l| format!("{l}\n")).collect();
            std::fs::write(&file, text).with_context(|| format!("writing {}", file.display()))?;
            file
        };
        let (report, wall) = run_on_sample(
            set,
            sample,
            &file,
            &choice.strategy,
            choice.rung.as_deref(),
            &dir,
        )?;
        wall_secs += wall;
        let ids = sample.ids.get(..m).unwrap_or(&sample.ids);
        let answer: BTreeSet<&str> = report
            .answer
            .items
            .iter()
            .map(|i| i.unit_id.0.as_str())
            .collect();
        let decided = settled(&report, set.stage, &choice, ids, whole);
        let (measured, best) = counts_of(sample, &answer, &decided);
        let best_bounds = bounds(&best, sample.population, delta);
        let hopeless = !proves(&best_bounds, set.declared.target, set.declared.at_least);
        let decided_n = decided.len();
        drop(answer);
        drop(decided);
        if whole || hopeless {
            let stopped = (!whole).then_some((m, decided_n, best_bounds));
            run = Some((report, measured, stopped, m));
            break;
        }
    }
    let (report, counts, stopped, covered) =
        run.ok_or_else(|| anyhow!("strategy {} ran on no unit", choice.strategy))?;
    let roles =
        Roles::of(&set.base.spec, set.stage, choice.rung.as_deref()).map_err(|e| anyhow!(e))?;
    let (_, what) = strategy::apply(&set.base.spec, &roles, &choice.strategy, None, None)
        .map_err(|e| anyhow!(e))?;
    let size = choice
        .strategy
        .strip_prefix("chunk-")
        .and_then(|k| k.parse::<usize>().ok());
    let contexts: BTreeSet<&str> = report
        .facts
        .iter()
        .filter(|f| f.stage == set.stage)
        .filter_map(|f| f.facts.get("context")?.as_str())
        .collect();
    let overflows_window = size.is_some_and(|k| covered <= k) && contexts.len() >= 2;
    let c = &report.certificate;
    // Stopped early, the bounds shown are the most the whole sample could
    // prove: every unit not yet decided counted as decided right.
    let bounds = match stopped {
        Some((_, _, best)) => best,
        None => bounds(&counts, sample.population, delta),
    };
    // One context a unit costs one call a distinct view; contexts of
    // many units, one a share of the units. Stopped early, the run's cost
    // is scaled by the units it covered.
    let scale = match (choice.strategy.as_str(), sample.views, stopped) {
        (_, _, Some((m, _, _))) => sample.population as f64 / m.max(1) as f64,
        ("micro" | "adaptive", Some((all, drawn)), None) => all as f64 / drawn.max(1) as f64,
        _ => sample.population as f64 / sample.ids.len().max(1) as f64,
    };
    // What the strategy costs from an empty store: every fact keeps the
    // cost of the call that made it (a context's call on its first
    // member), so facts another strategy paid for still count here. Units
    // that share a view share its fact: it is counted once.
    let mut paid: HashMap<ContentHash, &fanfold_core::Cost> = HashMap::new();
    for f in &report.facts {
        let e = paid.entry(f.key).or_insert(&f.cost);
        if f.cost.calls > e.calls {
            *e = &f.cost;
        }
    }
    let mut cost = fanfold_core::Cost::default();
    for c in paid.values() {
        cost.add(c);
    }
    let sample_tokens = cost.prompt_tokens + cost.completion_tokens;
    let mut m = Measured {
        choice,
        what,
        counts,
        estimate: counts.of(set.declared.target),
        meets: stopped.is_none() && proves(&bounds, set.declared.target, set.declared.at_least),
        bounds,
        note: stopped.map(|(m, decided, _)| {
            format!(
                "stopped after the sample's first {m} units ({decided} of them decided as on the whole sample): even with every other sampled unit decided right, its bounds stay below {} ≥ {}",
                metric_name(set.declared.target),
                set.declared.at_least
            )
        }),
        sample_calls: cost.calls,
        sample_tokens,
        wall_secs,
        scale,
        overflows_window,
    };
    if m.choice.strategy == "long" {
        let payload = cost.prompt_tokens as f64 * scale;
        if payload > WINDOW_TOKENS as f64 {
            m.meets = false;
            m.note = Some(format!(
                "the population's payload, about {payload:.0} tokens, does not fit one window of {WINDOW_TOKENS}"
            ));
        }
    }
    if c.simulated {
        m.what.push_str(" [SIMULATED]");
    }
    Ok(m)
}

/// The strategies' table, as `fanfold plan` prints it.
pub(super) fn table(
    declared: &CascadeSpec,
    sample: &Sample,
    runs: &[Measured],
    chosen: Option<usize>,
    delta: f64,
    skipped: &[String],
) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let labelled = sample.labels.values().filter(|l| l.is_some()).count();
    let positives = sample.labels.values().filter(|l| **l == Some(true)).count();
    let _ = writeln!(
        out,
        "\nWhole-run strategies, each run on a seeded sample of {} of the {} units the prefilter keeps ({labelled} labelled by the oracle, {positives} positive{}). Each is bounded at delta {delta:.4}, exactly for sampling without replacement, and held to {} ≥ {} on both recall and precision (accuracy alone for an accuracy target). Its cost is the sample's from an empty store, scaled to the population: by the judge's distinct views for one context a unit (units that share a view share a call), by units for contexts of many.\n",
        sample.ids.len(),
        sample.population,
        if sample.oracle_calls > 0 {
            format!("; labelling took {} model calls", sample.oracle_calls)
        } else {
            String::new()
        },
        metric_name(declared.target),
        declared.at_least,
    );
    let _ = writeln!(
        out,
        "| strategy | meets | {} on the sample | positives found | kept | recall ≥ | precision ≥ | accuracy ≥ | model calls on the sample | model calls for all (est.) | tokens for all (est.) | wall s |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        metric_name(declared.target)
    );
    for (i, m) in runs.iter().enumerate() {
        let _ = writeln!(
            out,
            "| {}{} | {} | {:.3} | {} of {} | {} | {:.3} | {:.3} | {:.3} | {} | {:.0} | {:.0} | {:.1} |",
            m.name(),
            if Some(i) == chosen { " (chosen)" } else { "" },
            if m.meets { "yes" } else { "no" },
            m.estimate,
            m.counts.tp,
            m.counts.tp + m.counts.fn_ + m.counts.unlabelled,
            m.counts.tp + m.counts.fp,
            m.bounds.recall,
            m.bounds.precision,
            m.bounds.accuracy,
            m.sample_calls,
            m.model_calls(),
            m.tokens(),
            m.wall_secs
        );
    }
    for m in runs {
        let _ = writeln!(out, "\n- {}: {}", m.name(), m.what);
        if let Some(note) = &m.note {
            let _ = writeln!(out, "  Not a candidate: {note}.");
        }
    }
    if !skipped.is_empty() {
        let _ = writeln!(out, "\nNot measured: {}.", skipped.join("; "));
    }
    out
}

pub(super) fn metric_name(m: QualityMetric) -> &'static str {
    match m {
        QualityMetric::Recall => "recall",
        QualityMetric::Precision => "precision",
        QualityMetric::Accuracy => "accuracy",
        QualityMetric::RecallAndPrecision => "recall and precision",
    }
}
