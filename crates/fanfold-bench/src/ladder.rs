//! `fanfold bench ladder`: does one micro-context per unit earn its place?
//! Every strategy answers the example's question on the same records, the
//! same backend and the same engine (store, cache, fold, verify and
//! certificate), each a spec variant run in a store of its own, side by
//! side in one run:
//!
//! - `deterministic`: jq rules only; the last rule is chosen among a few
//!   candidates on the development split and scored once on the held-out
//!   split;
//! - `bm25`: lexical retrieval, the question's words and the rubric's key
//!   terms as the query, the cut-off chosen for recall on the development
//!   split;
//! - `embed`: the embedding rung alone (similarity against the stage's
//!   texts, no generation);
//! - `chunk-10`, `chunk-50`, `chunk-200`: coarse contexts of up to k
//!   units (and the window), the model listing the matching ids;
//! - `long`: one context as wide as the model's window; what it cannot
//!   hold is `not_run`, never negative;
//! - `micro`: one context per unit, shared prefix;
//! - `batch`: the same contexts sent as one provider batch (a loopback
//!   Batch API in front of the same model, where the backend has none);
//! - `compress-50`: `micro` with each text field compressed to half its
//!   words by the model's own per-token surprise (LLMLingua-style), the
//!   evidence still quoted from the uncompressed unit;
//! - `rerank`: the embedding rung, then the model as a reranker (its
//!   probability of `yes` to "is this relevant?", one forward pass a
//!   unit), then one micro-context for each unit it scores at least 0.5;
//! - `adaptive`: the example's ladder as declared (prefilter, embed,
//!   micro-context, and a `widen` stage where the spec has one); the other
//!   strategies judge each unit once, without widening.
//!
//! Every model strategy reads what the example's prefilter keeps: the
//! comparison is of what follows the free filter. Quality is scored
//! against the example's oracle, which no run reads, on two halves of the
//! records split by a seeded hash of the id. Figures from a scripted or
//! replayed backend are marked [SIMULATED] and make no quality claim.
//! What the ladder needs of an example beyond its spec is in the
//! example's `ladder.toml` ([`LadderConfig`]).

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime};

use anyhow::{Context, Result, anyhow, bail};
use fanfold_core::spec::{
    BackendSpec, Bm25StageSpec, Execution, PrefilterAction, PrefilterRule, Spec, StageSpec,
};
use fanfold_core::{ContentHash, Status};
use fanfold_engine::strategy::{self, OPEN_THRESHOLD, Roles, TopK, drop_themes};
use fanfold_engine::{NoProgress, Plan, RunOptions, RunReport, Source};
use serde::{Deserialize, Serialize};

use crate::provider::LoopbackBatches;
use crate::report::{cpu_model, load_average, utc_date, write_marked_section};

pub struct LadderArgs {
    pub example: PathBuf,
    pub report: PathBuf,
    /// Where the measured rows go as JSON, for `fanfold report ladder`;
    /// `docs/<name>[-<backend>].json` when absent.
    pub json: Option<PathBuf>,
    pub slots: usize,
    /// The strategies to run, by name; all when empty.
    pub only: Vec<String>,
    /// A backend of the spec to run every model strategy on, in place of
    /// its own.
    pub backend: Option<String>,
    pub split_seed: u64,
    /// The input file, in place of the spec's.
    pub input: Option<PathBuf>,
    /// Run on the first N records of the input only, the oracle cut to
    /// them: a data set sized so the `long` rung's one context holds all
    /// the prefilter keeps.
    pub first: Option<usize>,
}

/// What the ladder needs of an example beyond its spec, from the
/// `ladder.toml` beside it: the stages the variants are built from, the
/// BM25 query, the deterministic candidates and where the oracle is.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LadderConfig {
    /// The report's section in `docs/benchmarks.md` and the rows' file
    /// name in `docs/` (`-<backend>` appended for another backend).
    pub name: String,
    /// What one unit is called in the report, singular and plural.
    pub unit: String,
    pub units: String,
    /// The embedding rung, the model judge (a map stage) and the reducer
    /// whose set is the answer.
    pub embed: String,
    pub judge: String,
    pub answer: String,
    /// The BM25 rung's query: the question and the rubric's key terms.
    pub bm25_query: String,
    /// The last prefilter rule the deterministic strategy may add: a unit
    /// is kept only when `keep` holds. Chosen on the development split.
    pub candidates: Vec<Candidate>,
    pub oracle: OracleSource,
    /// A caveat the report states under the table, in the example's words.
    #[serde(default)]
    pub note: Option<String>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Candidate {
    pub label: String,
    pub keep: String,
}

/// Where the true answer is, read by the scorer alone.
#[derive(Clone, Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum OracleSource {
    /// A JSON file beside the example; `pointer` names the array of the
    /// answer's unit ids.
    Ids { file: PathBuf, pointer: String },
    /// A field of every input record (a CSV column): the units whose value
    /// is not `negative` are the answer. No strategy may read the field:
    /// the ladder refuses a spec, query or candidate that names it.
    Column { column: String, negative: String },
}

impl LadderConfig {
    pub fn read(example: &Path) -> Result<Self> {
        let path = example.join("ladder.toml");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        toml::from_str(&text).with_context(|| format!("{}", path.display()))
    }
}

/// The answer's unit ids, from the oracle alone.
pub(crate) fn read_truth(
    cfg: &LadderConfig,
    example: &Path,
    spec: &Spec,
    spec_text: &str,
) -> Result<BTreeSet<String>> {
    match &cfg.oracle {
        OracleSource::Ids { file, pointer } => {
            let path = example.join(file);
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("reading {}", path.display()))?;
            let v: serde_json::Value = serde_json::from_str(&text)
                .with_context(|| format!("parsing {}", path.display()))?;
            let ids = v
                .pointer(pointer)
                .and_then(serde_json::Value::as_array)
                .ok_or_else(|| anyhow!("{}: no array at {pointer}", path.display()))?;
            ids.iter()
                .map(|id| match id {
                    serde_json::Value::String(s) => Ok(s.clone()),
                    serde_json::Value::Number(n) => Ok(n.to_string()),
                    other => Err(anyhow!("{}: {pointer} holds {other}", path.display())),
                })
                .collect()
        }
        OracleSource::Column { column, negative } => {
            let leaks = spec_text.contains(column.as_str())
                || cfg.bm25_query.contains(column.as_str())
                || cfg
                    .candidates
                    .iter()
                    .any(|c| c.keep.contains(column.as_str()));
            if leaks {
                bail!(
                    "the oracle's column `{column}` is named in the spec, the BM25 query or a candidate: a strategy could read the answer"
                );
            }
            let path = example.join(
                spec.input
                    .path
                    .as_deref()
                    .ok_or_else(|| anyhow!("no input file: pass --input"))?,
            );
            let bytes =
                std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
            // The engine's own partitioner, so the ids are the ones the
            // strategies' answers name.
            let mut truth = BTreeSet::new();
            let mut missing = None;
            fanfold_ops::partition::partition(
                &spec.input.partition,
                &bytes,
                fanfold_ops::partition::PartitionOptions::default(),
                |e| {
                    if let fanfold_ops::partition::Element::Unit(u) = e {
                        match u.value.get(column).and_then(serde_json::Value::as_str) {
                            Some(label) if label != negative => {
                                truth.insert(u.unit.unit_id.as_str().to_owned());
                            }
                            Some(_) => {}
                            None => {
                                missing.get_or_insert_with(|| u.unit.unit_id.as_str().to_owned());
                            }
                        }
                    }
                },
            )
            .map_err(|e| anyhow!("{}: {e}", path.display()))?;
            if let Some(id) = missing {
                bail!("{}: unit {id} has no `{column}`", path.display());
            }
            Ok(truth)
        }
    }
}

/// Every strategy, in the order the report lists them.
pub const STRATEGIES: [&str; 14] = [
    "deterministic",
    "bm25",
    "embed",
    "embed-top-k",
    "embed-top-k-judge",
    "chunk-10",
    "chunk-50",
    "chunk-200",
    "long",
    "micro",
    "compress-50",
    "batch",
    "rerank",
    "adaptive",
];

/// The BM25 rung's stage, and the development recall its cut-off must
/// keep.
const BM25: &str = "keyword_rank";
const BM25_RECALL: f64 = 0.95;
/// The share of the development split's positives the embedding top-k
/// keeps, which sets its k.
const TOP_K_RECALL: f64 = 0.95;

/// Precision, recall and the misses on one half of the records.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Score {
    pub answered: usize,
    pub true_positives: usize,
    pub positives: usize,
    pub precision: f64,
    pub recall: f64,
    pub f1: f64,
    /// Oracle positives the answer missed, by id.
    pub false_negatives: Vec<String>,
}

/// One strategy's measured row.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Row {
    pub strategy: String,
    /// What the strategy ran, in words.
    pub plan: String,
    pub dev: Score,
    pub held_out: Score,
    pub model_calls: u64,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub completion_tokens: u64,
    pub usd: f64,
    pub wall_s: f64,
    /// The longest single model call, in seconds: the floor of the
    /// strategy's latency however many slots it had.
    pub longest_call_s: f64,
    pub abstain: u64,
    pub error: u64,
    pub not_run: u64,
    /// Answer items whose citation verify checked verbatim, of all items.
    pub auditability: f64,
    pub complete: bool,
    pub simulated: bool,
}

/// Everything one ladder run measured, as `docs/ladder.json` holds it.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Ladder {
    pub example: String,
    /// What the records are called, how many the input holds, and how
    /// many of them the oracle's answer holds.
    #[serde(default)]
    pub units: String,
    #[serde(default)]
    pub records: usize,
    #[serde(default)]
    pub positives: usize,
    /// When the run read only the first N records of the input.
    #[serde(default)]
    pub first: Option<usize>,
    /// The example's caveat (`ladder.toml`'s `note`).
    #[serde(default)]
    pub note: Option<String>,
    pub date: String,
    pub cores: usize,
    pub cpu: String,
    pub backend: String,
    pub slots: usize,
    pub split_seed: u64,
    pub simulated: bool,
    pub rows: Vec<Row>,
    /// The deterministic candidates' development F1, in order; the chosen
    /// one is the best.
    pub candidates: Vec<(String, f64)>,
}

impl Ladder {
    /// The backend the model strategies ran on, or `-` when none did.
    pub fn backend_label(&self) -> &str {
        if self.backend.is_empty() {
            "-"
        } else {
            &self.backend
        }
    }
}

impl Row {
    /// Tokens the backend evaluated and generated.
    pub fn tokens(&self) -> f64 {
        (self.prompt_tokens + self.completion_tokens) as f64
    }
}

/// Which half of the records an id belongs to.
fn is_dev(seed: u64, id: &str) -> bool {
    fanfold_ops::audit::sample_rank(seed, &ContentHash::of_bytes(id.as_bytes())).is_multiple_of(2)
}

/// Scores `answer` against `truth` on the ids `keep` selects.
pub fn score(
    answer: &BTreeSet<String>,
    truth: &BTreeSet<String>,
    keep: impl Fn(&str) -> bool,
) -> Score {
    let answer: BTreeSet<&String> = answer.iter().filter(|i| keep(i)).collect();
    let truth: BTreeSet<&String> = truth.iter().filter(|i| keep(i)).collect();
    let tp = answer.intersection(&truth).count();
    let precision = if answer.is_empty() {
        0.0
    } else {
        tp as f64 / answer.len() as f64
    };
    let recall = if truth.is_empty() {
        0.0
    } else {
        tp as f64 / truth.len() as f64
    };
    let f1 = if precision + recall > 0.0 {
        2.0 * precision * recall / (precision + recall)
    } else {
        0.0
    };
    let mut false_negatives: Vec<String> =
        truth.difference(&answer).map(|s| (*s).clone()).collect();
    false_negatives.sort_by_key(|s| (s.len(), s.clone()));
    Score {
        answered: answer.len(),
        true_positives: tp,
        positives: truth.len(),
        precision,
        recall,
        f1,
        false_negatives,
    }
}

pub fn main(args: &LadderArgs) -> Result<()> {
    // The rungs compare ways a model decides membership: an example whose
    // main spec decides it by labels keeps the spec where the model does
    // as `judged.toml`.
    let judged = args.example.join("judged.toml");
    let spec_path = if judged.is_file() {
        judged
    } else {
        args.example.join("spec.toml")
    };
    let text = std::fs::read_to_string(&spec_path)
        .with_context(|| format!("reading {}", spec_path.display()))?;
    let mut base = Spec::from_toml(&text).map_err(|e| anyhow!("{}: {e}", spec_path.display()))?;
    if let Some(input) = &args.input {
        // Data kept outside the project (its licence may forbid a copy).
        let input =
            std::path::absolute(input).with_context(|| format!("resolving {}", input.display()))?;
        base.input.path = Some(input.display().to_string());
    }
    let cfg = LadderConfig::read(&args.example)?;
    // Kept until every strategy has run: the cut input lives here.
    let cut_dir = tempfile::tempdir().context("creating a temporary folder")?;
    let kept_ids = match args.first {
        None => None,
        Some(n) => {
            let input =
                args.example.join(base.input.path.as_deref().ok_or_else(|| {
                    anyhow!("the example's spec names no input file: pass --input")
                })?);
            let (path, ids) = first_records(&base, &input, n, cut_dir.path())?;
            base.input.path = Some(path.display().to_string());
            Some(ids)
        }
    };
    let mut truth = read_truth(&cfg, &args.example, &base, &text)?;
    if let Some(ids) = &kept_ids {
        truth.retain(|id| ids.contains(id));
    }
    let ctx = Example {
        cfg: &cfg,
        base: &base,
        spec_path: &spec_path,
        dir: &args.example,
        truth: &truth,
        seed: args.split_seed,
    };
    let records = ctx.records()?;
    for name in &args.only {
        if !STRATEGIES.contains(&name.as_str()) {
            bail!("no strategy `{name}`; known: {}", STRATEGIES.join(", "));
        }
    }
    // A run on another backend keeps its own section beside the default's.
    let name = match &args.backend {
        None => cfg.name.clone(),
        Some(b) => format!("{}-{b}", cfg.name),
    };
    // Refused before the run, not after it: the section must say what
    // code it measures.
    crate::stamp::section(&name)?;
    let chosen = |s: &str| args.only.is_empty() || args.only.iter().any(|o| o == s);
    let tmp = tempfile::tempdir().context("creating a temporary folder")?;
    let seed = args.split_seed;
    let mut ladder = Ladder {
        example: args.example.display().to_string(),
        units: cfg.units.clone(),
        records,
        positives: truth.len(),
        first: args.first,
        note: cfg.note.clone(),
        date: utc_date(SystemTime::now()),
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        cpu: cpu_model(),
        slots: args.slots,
        split_seed: seed,
        ..Ladder::default()
    };
    // The embedding top-k's k, tuned on the development split once for
    // both strategies that use it.
    let mut top_k: Option<usize> = None;
    for strategy in STRATEGIES.into_iter().filter(|s| chosen(s)) {
        eprintln!("bench ladder: {strategy}");
        if strategy.starts_with("embed-top-k") && top_k.is_none() {
            top_k = Some(tune_top_k(&ctx, tmp.path())?);
        }
        let row = if strategy == "deterministic" {
            deterministic(&ctx, &mut ladder)?
        } else if strategy == "bm25" {
            bm25(&ctx, tmp.path())?
        } else {
            let (row, report) = if strategy == "batch" {
                batch(&ctx, args.backend.as_deref(), args.slots, tmp.path())?
            } else {
                run_model_strategy(
                    &ctx,
                    strategy,
                    args.backend.as_deref(),
                    args.slots,
                    tmp.path(),
                    top_k,
                )?
            };
            if ladder.backend.is_empty()
                && let Some(b) = report.certificate.backends.first()
            {
                // The model, without the slot window the strategies size
                // differently (a chunk's slot holds a whole context).
                let model = b.model_id.split("/slot").next().unwrap_or(&b.model_id);
                ladder.backend = format!("{} ({model})", b.kind);
            }
            row
        };
        ladder.simulated |= row.simulated;
        ladder.rows.push(row);
    }
    let json_path = args
        .json
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("docs/{name}.json")));
    let json = serde_json::to_string_pretty(&ladder).context("serialising the ladder")?;
    if let Some(dir) = json_path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(&json_path, json + "\n")
        .with_context(|| format!("writing {}", json_path.display()))?;
    let section = render(&ladder, &json_path, args.backend.as_deref());
    print!("{section}");
    write_marked_section(&args.report, &name, &section)
}

/// The first `n` records of `input` (a JSON array, or one JSON value a
/// line) written under `dir`, and the ids the engine's partitioner gives
/// them.
fn first_records(
    spec: &Spec,
    input: &Path,
    n: usize,
    dir: &Path,
) -> Result<(PathBuf, BTreeSet<String>)> {
    let bytes = std::fs::read(input).with_context(|| format!("reading {}", input.display()))?;
    let name = input
        .file_name()
        .ok_or_else(|| anyhow!("{} names no file", input.display()))?;
    let cut = dir.join(name);
    let text = match serde_json::from_slice::<Vec<serde_json::Value>>(&bytes) {
        Ok(all) => {
            let head: Vec<_> = all.into_iter().take(n).collect();
            serde_json::to_string(&head).context("writing the cut input")?
        }
        Err(_) => {
            let text = std::str::from_utf8(&bytes)
                .with_context(|| format!("{} is not UTF-8", input.display()))?;
            let lines: Vec<&str> = text
                .lines()
                .filter(|l| !l.trim().is_empty())
                .take(n)
                .collect();
            if lines
                .iter()
                .any(|l| serde_json::from_str::<serde_json::Value>(l).is_err())
            {
                bail!(
                    "--first cuts a JSON array or JSON lines; {} is neither",
                    input.display()
                );
            }
            lines.join("\n") + "\n"
        }
    };
    std::fs::write(&cut, &text).with_context(|| format!("writing {}", cut.display()))?;
    let mut ids = BTreeSet::new();
    fanfold_ops::partition::partition(
        &spec.input.partition,
        text.as_bytes(),
        fanfold_ops::partition::PartitionOptions::default(),
        |e| {
            if let fanfold_ops::partition::Element::Unit(u) = e {
                ids.insert(u.unit.unit_id.as_str().to_owned());
            }
        },
    )
    .map_err(|e| anyhow!("{}: {e}", cut.display()))?;
    Ok((cut, ids))
}

/// One example as every strategy reads it: its spec, the ladder's config
/// and the oracle's answer.
pub struct Example<'a> {
    pub cfg: &'a LadderConfig,
    pub base: &'a Spec,
    pub spec_path: &'a Path,
    pub dir: &'a Path,
    pub truth: &'a BTreeSet<String>,
    pub seed: u64,
}

impl Example<'_> {
    fn plan(&self, spec: Spec) -> Result<Plan> {
        Ok(Plan::from_spec(spec, self.spec_path, self.dir)?)
    }

    /// Runs `spec` in a fresh store `<dir>/<name>.sqlite`: the report and
    /// the wall time.
    fn run(&self, spec: Spec, name: &str, slots: usize, dir: &Path) -> Result<(RunReport, f64)> {
        let plan = self.plan(spec)?;
        let mut opts = RunOptions::new(dir.join(format!("{name}.sqlite")));
        opts.slots = slots;
        opts.out_dir = Some(dir.join(name));
        let started = Instant::now();
        let report = fanfold_engine::run(&plan, &opts, &NoProgress)?;
        Ok((report, started.elapsed().as_secs_f64()))
    }

    fn input(&self) -> Result<PathBuf> {
        Ok(self.dir.join(
            self.base
                .input
                .path
                .as_deref()
                .ok_or_else(|| anyhow!("the example's spec names no input file: pass --input"))?,
        ))
    }

    /// How many records the input holds, as the engine partitions it.
    fn records(&self) -> Result<usize> {
        let plan = self.plan(self.base.clone())?;
        let routed = fanfold_engine::run::route_source(
            &plan,
            &Source::File(self.input()?),
            fanfold_ops::partition::DEFAULT_MAX_UNIT_BYTES,
        )?;
        Ok(routed.coverage.units as usize)
    }

    fn score(&self, answer: &BTreeSet<String>, dev: bool) -> Score {
        score(answer, self.truth, |id| is_dev(self.seed, id) == dev)
    }
}

/// Runs one model strategy of the example in a fresh store under `dir`:
/// its measured row, and the run's report.
pub fn run_model_strategy(
    ex: &Example<'_>,
    strategy: &str,
    backend: Option<&str>,
    slots: usize,
    dir: &Path,
    top_k: Option<usize>,
) -> Result<(Row, RunReport)> {
    let (spec, what) = variant(ex.cfg, ex.base, strategy, backend, top_k)?;
    let (report, wall_s) = ex.run(spec, strategy, slots, dir)?;
    let row = measured(ex, strategy, what, &report, wall_s);
    Ok((row, report))
}

/// The backend for the batch strategy: a loopback provider with OpenAI's
/// Batch API in front of the model the other strategies ran on.
const LOOPBACK: &str = "loopback_batches";

/// Provider batching: the micro-context strategy with its requests sent as
/// one provider batch. An `openai` or `anthropic` backend takes it through
/// its own batch API; any other model is put behind [`LoopbackBatches`], so
/// the batch path runs for real on the same model and the row says so.
fn batch(
    ex: &Example<'_>,
    backend: Option<&str>,
    slots: usize,
    dir: &Path,
) -> Result<(Row, RunReport)> {
    let (mut spec, micro) = variant(ex.cfg, ex.base, "micro", backend, None)?;
    let name = spec
        .stages
        .iter()
        .find_map(|s| s.model_turn().map(|(b, _)| b.to_owned()))
        .ok_or_else(|| anyhow!("the micro strategy has no model stage"))?;
    let declared = spec
        .backends
        .get(&name)
        .cloned()
        .ok_or_else(|| anyhow!("the example declares no backend `{name}`"))?;
    let mut provider = None;
    let what = if fanfold_engine::backends::offers_batch_api(&declared)? {
        format!("{micro}, sent as provider batches through `{name}`'s batch API")
    } else {
        // No batch API of its own (the embedded model, a local server):
        // the loopback provider sends each request of a batch to it.
        let model = fanfold_engine::backends::build(&declared, ex.dir, Execution::Online)?;
        let loopback = LoopbackBatches::start(model, slots)?;
        let table = format!(
            "type = \"openai\"\nmodel = {model:?}\nbase_url = {url:?}\noutput = \"json_object\"\nper_unit_schema = true\nbatch_poll_ms = 100\nbatch_poll_max_ms = 1000\n",
            model = loopback.model().model_id,
            url = loopback.base_url(),
        );
        let spec_of: BackendSpec =
            toml::from_str(&table).context("the loopback provider's backend")?;
        spec.backends.insert(LOOPBACK.into(), spec_of);
        let what = format!(
            "{micro}, sent as one provider batch (OpenAI's Batch API on a loopback server whose model is `{name}`, {}: the same answers and tokens, none of a real provider's queueing or discount)",
            loopback.model().model_id
        );
        provider = Some(loopback);
        what
    };
    let mut floors = Vec::new();
    for s in &mut spec.stages {
        if let Some(turn) = s.model_turn_mut() {
            if provider.is_some() {
                *turn.backend = LOOPBACK.into();
            }
            *turn.execution = Execution::Batch;
        }
        // The loopback provider's answers carry no probabilities, so a
        // confidence floor with no `confidence` pointer has nothing to
        // compare with (a spec holding one is refused): it goes, and the
        // row says so.
        if let StageSpec::Map(m) = s
            && provider.is_some()
            && m.confidence.is_none()
            && let Some(floor) = m.min_confidence.take()
        {
            floors.push(format!("`{}`'s min_confidence {floor}", m.name));
        }
    }
    let what = if floors.is_empty() {
        what
    } else {
        format!(
            "{what}; without {}, which no probability reaches through a batch API",
            floors.join(", ")
        )
    };
    let (report, wall_s) = ex.run(spec, "batch", slots, dir)?;
    let mut row = measured(ex, "batch", what, &report, wall_s);
    row.simulated |= provider.as_ref().is_some_and(|p| p.model().simulated);
    Ok((row, report))
}

/// The spec a model strategy runs, and what it runs in words: the
/// engine's rewrite, with the ladder's roles.
fn variant(
    cfg: &LadderConfig,
    base: &Spec,
    strategy: &str,
    backend: Option<&str>,
    top_k: Option<usize>,
) -> Result<(Spec, String)> {
    let roles = Roles {
        judge: cfg.judge.clone(),
        rung: Some(cfg.embed.clone()),
        answer: cfg.answer.clone(),
        unit: cfg.unit.clone(),
        units: cfg.units.clone(),
    };
    let top_k = top_k.map(|k| TopK {
        k,
        recall: TOP_K_RECALL,
    });
    strategy::apply(base, &roles, strategy, backend, top_k).map_err(|e| anyhow!(e))
}

/// The BM25 strategy: the prefilter's survivors ranked by BM25 against
/// the query, through the engine. A first run scores every unit; the
/// cut-off is the highest score that keeps `BM25_RECALL` of the
/// development split's blockers, and a second run applies it.
fn bm25(ex: &Example<'_>, dir: &Path) -> Result<Row> {
    let cfg = ex.cfg;
    let project = ex.base.stages.iter().find_map(|s| match s {
        StageSpec::Map(m) if m.name == cfg.judge => Some(m.project.clone()),
        _ => None,
    });
    let with_threshold = |threshold: f64| {
        let mut spec = ex.base.clone();
        spec.stages = vec![StageSpec::Bm25(Bm25StageSpec {
            name: BM25.into(),
            version: 1,
            fields: Vec::new(),
            project: project.clone().flatten(),
            query: cfg.bm25_query.clone(),
            threshold,
            then: None,
            k1: 1.2,
            b: 0.75,
        })];
        for r in &mut spec.fold.reducers {
            if r.name == cfg.answer {
                r.stage = Some(BM25.into());
            }
        }
        drop_themes(&mut spec);
        let names: BTreeSet<String> = spec.stages.iter().map(|s| s.name().to_owned()).collect();
        spec.fold
            .reducers
            .retain(|r| r.stage.as_ref().is_none_or(|s| names.contains(s)));
        spec
    };
    // No model runs here: one slot is as good as any.
    let run = |spec: Spec, name: &str| ex.run(spec, name, 1, dir);
    // Scores are never negative: a cut-off below zero keeps everything.
    let (scan, _) = run(with_threshold(-1.0), "bm25-scan")?;
    let mut dev_blockers: Vec<f64> = scan
        .facts
        .iter()
        .filter(|f| f.stage == BM25)
        .filter_map(|f| {
            let id = f.source_ids.first()?.as_str();
            (ex.truth.contains(id) && is_dev(ex.seed, id))
                .then(|| f.facts.get("score").and_then(serde_json::Value::as_f64))
                .flatten()
        })
        .collect();
    dev_blockers.sort_by(|a, b| b.total_cmp(a));
    let keep = ((dev_blockers.len() as f64) * BM25_RECALL).ceil() as usize;
    let cutoff = dev_blockers
        .get(keep.saturating_sub(1))
        .copied()
        .unwrap_or(0.0);
    let (report, wall_s) = run(with_threshold(cutoff), "bm25")?;
    Ok(measured(
        ex,
        "bm25",
        format!(
            "prefilter, then BM25 against the question and the rubric's key terms; cut-off {cutoff:.2} keeps {:.0} % of the development split's positives",
            BM25_RECALL * 100.0
        ),
        &report,
        wall_s,
    ))
}

/// The smallest k whose top-k by embedding score holds `TOP_K_RECALL` of
/// the development split's blockers, from one scan of every routed unit's
/// score (ties at the cut are all counted in).
fn tune_top_k(ex: &Example<'_>, dir: &Path) -> Result<usize> {
    let (mut spec, _) = variant(ex.cfg, ex.base, "embed", None, None)?;
    for s in &mut spec.stages {
        if let StageSpec::Embed(e) = s {
            e.threshold = OPEN_THRESHOLD;
        }
    }
    let plan = ex.plan(spec)?;
    let opts = RunOptions::new(dir.join("top-k-scan.sqlite"));
    let scan = fanfold_engine::run(&plan, &opts, &NoProgress)?;
    let scored: Vec<(f64, bool)> = scan
        .facts
        .iter()
        .filter(|f| f.stage == ex.cfg.embed)
        .filter_map(|f| {
            let id = f.source_ids.first()?.as_str();
            let score = f.facts.get("score")?.as_f64()?;
            Some((score, ex.truth.contains(id) && is_dev(ex.seed, id)))
        })
        .collect();
    let mut dev: Vec<f64> = scored.iter().filter(|(_, d)| *d).map(|(s, _)| *s).collect();
    dev.sort_by(|a, b| b.total_cmp(a));
    let keep = ((dev.len() as f64) * TOP_K_RECALL).ceil() as usize;
    let cut = dev
        .get(keep.saturating_sub(1))
        .copied()
        .unwrap_or(f64::NEG_INFINITY);
    Ok(scored.iter().filter(|(s, _)| *s >= cut).count().max(1))
}

/// The deterministic strategy: the example's prefilter and one more rule,
/// chosen on the development split. Its answer is what the rules keep; it
/// runs through the engine's own partition and prefilter.
fn deterministic(ex: &Example<'_>, ladder: &mut Ladder) -> Result<Row> {
    let input = ex.input()?;
    let mut best: Option<(f64, usize, BTreeSet<String>, f64)> = None;
    for (n, candidate) in ex.cfg.candidates.iter().enumerate() {
        let mut spec = ex.base.clone();
        spec.prefilter.push(PrefilterRule {
            name: "tuned".into(),
            when: format!("({}) | not", candidate.keep),
            action: PrefilterAction::Exclude,
            reason: None,
            stage: None,
        });
        let plan = ex.plan(spec)?;
        let started = Instant::now();
        let routed = fanfold_engine::run::route_source(
            &plan,
            &Source::File(input.clone()),
            fanfold_ops::partition::DEFAULT_MAX_UNIT_BYTES,
        )?;
        let wall = started.elapsed().as_secs_f64();
        let kept: BTreeSet<String> = routed
            .by_stage
            .values()
            .flatten()
            .map(|&i| Ok(routed.table.id(i)?.as_str().to_owned()))
            .collect::<Result<_, fanfold_engine::RunError>>()?;
        let dev = ex.score(&kept, true).f1;
        ladder.candidates.push((candidate.label.clone(), dev));
        if best.as_ref().is_none_or(|b| dev > b.0) {
            best = Some((dev, n, kept, wall));
        }
    }
    let (_, n, kept, wall_s) = best.ok_or_else(|| anyhow!("no deterministic candidate ran"))?;
    let label = ex.cfg.candidates.get(n).map_or("", |c| c.label.as_str());
    Ok(Row {
        strategy: "deterministic".into(),
        plan: format!("jq rules only: {label} (chosen on the development split)"),
        dev: ex.score(&kept, true),
        held_out: ex.score(&kept, false),
        wall_s,
        complete: true,
        ..Row::default()
    })
}

/// A model strategy's row, from its run's report.
fn measured(
    ex: &Example<'_>,
    strategy: &str,
    plan: String,
    report: &RunReport,
    wall_s: f64,
) -> Row {
    let c = &report.certificate;
    let answer: BTreeSet<String> = report
        .answer
        .items
        .iter()
        .map(|i| i.unit_id.0.clone())
        .collect();
    let failed: BTreeSet<&str> = c
        .verify
        .cited_missing
        .iter()
        .chain(&c.verify.hash_mismatches)
        .map(|i| i.0.as_str())
        .collect();
    let verified = report
        .answer
        .items
        .iter()
        .filter(|i| {
            !i.evidence.is_empty()
                && !failed.contains(i.unit_id.0.as_str())
                && !c.verify.evidence_failures.iter().any(|f| {
                    // verify names a failed quote `unit ID field ...`.
                    f.starts_with(&format!("unit {} field ", i.unit_id.0))
                })
        })
        .count();
    let longest_ms = report
        .facts
        .iter()
        .map(|f| f.cost.latency_ms)
        .max()
        .unwrap_or(0);
    let count = |s: Status| report.facts.iter().filter(|f| f.status == s).count() as u64;
    let plan = if c
        .stats
        .reports
        .all::<fanfold_engine::stages::widen::WidenReport>(fanfold_engine::stages::widen::REPORT)
        .is_empty()
    {
        plan
    } else {
        let widened = fanfold_engine::stages::widen::widened_units(&c.stats);
        format!("{plan}; {widened} {} widened", ex.cfg.units)
    };
    Row {
        strategy: strategy.to_owned(),
        plan,
        dev: ex.score(&answer, true),
        held_out: ex.score(&answer, false),
        model_calls: c.stats.model_calls,
        prompt_tokens: c.stats.cost.prompt_tokens,
        cached_tokens: c.stats.cost.cached_tokens,
        completion_tokens: c.stats.cost.completion_tokens,
        usd: c.stats.cost.usd,
        wall_s,
        longest_call_s: longest_ms as f64 / 1000.0,
        abstain: count(Status::Abstain),
        error: count(Status::Error),
        not_run: count(Status::NotRun),
        auditability: if answer.is_empty() {
            0.0
        } else {
            verified as f64 / answer.len() as f64
        },
        complete: c.complete,
        simulated: c.simulated,
    }
}

/// The strategies no other is at least as good as on both quality
/// (held-out F1) and cost (`cost`), by index: the Pareto frontier.
pub fn frontier(rows: &[Row], cost: impl Fn(&Row) -> f64) -> Vec<usize> {
    (0..rows.len())
        .filter(|&i| {
            let Some(r) = rows.get(i) else { return false };
            !rows.iter().enumerate().any(|(j, o)| {
                j != i
                    && o.held_out.f1 >= r.held_out.f1
                    && cost(o) <= cost(r)
                    && (o.held_out.f1 > r.held_out.f1 || cost(o) < cost(r))
            })
        })
        .collect()
}

fn render(l: &Ladder, json: &Path, backend: Option<&str>) -> String {
    let mut s = String::new();
    let tag = if l.simulated { " [SIMULATED]" } else { "" };
    let on = backend
        .map(|b| format!(", on the `{b}` backend"))
        .unwrap_or_default();
    let _ = writeln!(
        s,
        "## The ladder on `{}`: every strategy on the same question{on}{tag}\n",
        l.example
    );
    let _ = writeln!(
        s,
        "`fanfold bench ladder` on `{}`, {} cores ({}), load {}, {}; backend {}, {} slots; every strategy in a fresh store, one after the other in one run (raw rows in `{}`, plotted by `fanfold report ladder`). Quality is scored against the example's oracle, which no run reads ({} positives), on two halves of the {} {}{} split by a seeded hash of the id (seed {}): the deterministic strategy's last rule and the cut-offs of BM25 and the embedding top-k are chosen on the development half; the held-out half is scored once.\n",
        l.example,
        l.cores,
        l.cpu,
        load_average(),
        l.date,
        l.backend_label(),
        l.slots,
        json.display(),
        l.positives,
        l.records,
        l.units,
        match l.first {
            Some(n) => format!(
                " (the first {n} of the input, so that the `long` rung's one context can hold every {} the prefilter keeps)",
                l.units.strip_suffix('s').unwrap_or(&l.units)
            ),
            None => String::new(),
        },
        l.split_seed,
    );
    if l.simulated {
        let _ = writeln!(
            s,
            "**[SIMULATED]**: the model strategies ran on a scripted backend. These rows test the harness; they make no quality claim.\n"
        );
    }
    let _ = writeln!(
        s,
        "| strategy | dev P / R / F1 | held-out P / R / F1 | held-out misses | model calls | prompt tokens | completion tokens | wall | longest call | abstain / error / not_run | verified citations |"
    );
    let _ = writeln!(s, "|---|---|---|---|---:|---:|---:|---:|---:|---|---:|");
    let on_tokens = frontier(&l.rows, Row::tokens);
    let on_wall = frontier(&l.rows, |r| r.wall_s);
    for (i, r) in l.rows.iter().enumerate() {
        let mark = match (on_tokens.contains(&i), on_wall.contains(&i)) {
            (true, true) => " ◆",
            (true, false) => " ◇t",
            (false, true) => " ◇w",
            _ => "",
        };
        let misses = if r.held_out.false_negatives.is_empty() {
            "none".to_owned()
        } else {
            r.held_out.false_negatives.join(", ")
        };
        let _ = writeln!(
            s,
            "| {}{mark} | {:.2} / {:.2} / {:.2} | {:.2} / {:.2} / {:.2} | {} of {}: {misses} | {} | {} | {} | {:.1} s | {:.1} s | {} / {} / {} | {:.0} % |",
            r.strategy,
            r.dev.precision,
            r.dev.recall,
            r.dev.f1,
            r.held_out.precision,
            r.held_out.recall,
            r.held_out.f1,
            r.held_out.false_negatives.len(),
            r.held_out.positives,
            r.model_calls,
            r.prompt_tokens,
            r.completion_tokens,
            r.wall_s,
            r.longest_call_s,
            r.abstain,
            r.error,
            r.not_run,
            r.auditability * 100.0,
        );
    }
    let _ = writeln!(
        s,
        "\n◆ on the Pareto frontier of held-out F1 against both tokens and wall time; ◇t against tokens only; ◇w against wall time only. Tokens are what the backend evaluated and generated (the shared prefix counted once); a verified citation is an answer item whose evidence quote verify found verbatim in the stored unit.\n"
    );
    let _ = writeln!(s, "{}\n", verdict(l));
    let _ = writeln!(s, "What each strategy ran:\n");
    for r in &l.rows {
        let _ = writeln!(s, "- `{}`: {}", r.strategy, r.plan);
    }
    if !l.candidates.is_empty() {
        let _ = writeln!(s, "\nThe deterministic candidates, by development F1:\n");
        for (label, f1) in &l.candidates {
            let _ = writeln!(s, "- {label}: {f1:.2}");
        }
    }
    if let Some(note) = &l.note {
        let _ = writeln!(s, "\n{note}");
    }
    s
}

/// What the ladder says, in one paragraph: the best held-out F1, and
/// where micro-contexts stand against it and against cheaper strategies.
pub fn verdict(l: &Ladder) -> String {
    let best = l
        .rows
        .iter()
        .max_by(|a, b| a.held_out.f1.total_cmp(&b.held_out.f1));
    let Some(best) = best else {
        return "No strategy ran.".to_owned();
    };
    let mut v = format!(
        "The best held-out F1 is {:.2}, by `{}`.",
        best.held_out.f1, best.strategy
    );
    let tokens = frontier(&l.rows, Row::tokens);
    let wall = frontier(&l.rows, |r| r.wall_s);
    for name in ["micro", "adaptive"] {
        let Some(i) = l.rows.iter().position(|r| r.strategy == name) else {
            continue;
        };
        let on = match (tokens.contains(&i), wall.contains(&i)) {
            (true, true) => "is on both frontiers",
            (true, false) => "is on the tokens frontier only",
            (false, true) => "is on the wall-time frontier only",
            (false, false) => {
                "is on neither frontier: another strategy is at least as good for less"
            }
        };
        let _ = write!(v, " `{name}` {on}.");
    }
    // The two baselines of the design beside the plain micro-context.
    if let Some(micro) = l.rows.iter().find(|r| r.strategy == "micro") {
        for name in ["compress-50", "rerank"] {
            if let Some(r) = l.rows.iter().find(|r| r.strategy == name) {
                let _ = write!(
                    v,
                    " `{name}` against `micro`: held-out F1 {:.2} against {:.2}, {} tokens against {}, {:.1} s against {:.1} s.",
                    r.held_out.f1,
                    micro.held_out.f1,
                    r.prompt_tokens + r.completion_tokens,
                    micro.prompt_tokens + micro.completion_tokens,
                    r.wall_s,
                    micro.wall_s
                );
            }
        }
    }
    // Recall and citations are what the frontiers above do not weigh.
    let top_recall = l
        .rows
        .iter()
        .map(|r| r.held_out.recall)
        .fold(0.0f64, f64::max);
    let recall: Vec<&str> = l
        .rows
        .iter()
        .filter(|r| r.held_out.recall == top_recall)
        .map(|r| r.strategy.as_str())
        .collect();
    let _ = write!(
        v,
        " The best held-out recall, {top_recall:.2}, belongs to {}.",
        words(&recall)
    );
    let cited: Vec<String> = l
        .rows
        .iter()
        .filter(|r| r.auditability > 0.0)
        .map(|r| format!("{} ({:.0} %)", r.strategy, r.auditability * 100.0))
        .collect();
    if cited.is_empty() {
        v.push_str(" No strategy's answer cites verified evidence.");
    } else {
        let _ = write!(
            v,
            " Only {} back their answers with citations verify found verbatim.",
            words(&cited)
        );
    }
    // A model stage that changed nothing of the rung in front of it is the
    // model's limit, not the strategy's.
    let same = |a: &Row, b: &Row| {
        [(&a.dev, &b.dev), (&a.held_out, &b.held_out)]
            .iter()
            .all(|(x, y)| x.answered == y.answered && x.true_positives == y.true_positives)
    };
    for (rung, judged) in [("embed", "adaptive"), ("embed-top-k", "embed-top-k-judge")] {
        if let (Some(rung), Some(judged)) = (
            l.rows.iter().find(|r| r.strategy == rung),
            l.rows.iter().find(|r| r.strategy == judged),
        ) && same(rung, judged)
        {
            let _ = write!(
                v,
                " `{}` answers as `{}` alone does: on this backend the judge after the embedding rung changed no answer, for {} model calls.",
                judged.strategy, rung.strategy, judged.model_calls
            );
        }
    }
    if l.simulated {
        v.push_str(" [SIMULATED]: these rows test the harness and make no quality claim.");
    }
    v
}

/// `a`, `a and b`, `a, b and c`.
fn words<S: AsRef<str>>(items: &[S]) -> String {
    match items {
        [] => String::new(),
        [one] => one.as_ref().to_owned(),
        [rest @ .., last] => format!(
            "{} and {}",
            rest.iter()
                .map(AsRef::as_ref)
                .collect::<Vec<_>>()
                .join(", "),
            last.as_ref()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(v: &[u32]) -> BTreeSet<String> {
        v.iter().map(u32::to_string).collect()
    }

    #[test]
    fn scores_count_misses_by_id_on_each_half() {
        let truth = ids(&[1, 2, 3, 4]);
        let answer = ids(&[1, 2, 9]);
        let all = score(&answer, &truth, |_| true);
        assert_eq!(all.true_positives, 2);
        assert!((all.precision - 2.0 / 3.0).abs() < 1e-9);
        assert!((all.recall - 0.5).abs() < 1e-9);
        assert_eq!(all.false_negatives, vec!["3", "4"]);
        let odd = score(&answer, &truth, |id| id.parse::<u32>().unwrap() % 2 == 1);
        assert_eq!(odd.false_negatives, vec!["3"]);
        assert_eq!(odd.answered, 2);
    }

    #[test]
    fn the_split_is_seeded_and_about_even() {
        let dev = (0..1000).filter(|i| is_dev(7, &i.to_string())).count();
        assert!((400..600).contains(&dev), "{dev}");
        let again = (0..1000).filter(|i| is_dev(7, &i.to_string())).count();
        assert_eq!(dev, again);
        let other = (0..1000)
            .filter(|i| is_dev(7, &i.to_string()) != is_dev(8, &i.to_string()))
            .count();
        assert!(other > 100, "another seed is another split");
    }

    #[test]
    fn the_frontier_keeps_what_nothing_beats_on_both() {
        let row = |name: &str, f1: f64, cost: u64| Row {
            strategy: name.into(),
            held_out: Score {
                f1,
                ..Score::default()
            },
            prompt_tokens: cost,
            ..Row::default()
        };
        let rows = vec![
            row("cheap", 0.5, 10),
            row("dominated", 0.4, 20),
            row("best", 0.9, 100),
            row("tie", 0.9, 100),
        ];
        let f = frontier(&rows, |r| r.prompt_tokens as f64);
        assert_eq!(f, vec![0, 2, 3]);
    }
}
