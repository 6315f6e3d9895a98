//! `fanfold bench pairs`: "pairs of reviews of one film with opposite
//! sentiment", answered two ways on the same model and the same reviews,
//! side by side in one run.
//!
//! - **Per-unit facts and `pairs`**: `examples/film-reviews/opposite-pairs.toml`
//!   with its limit lifted, so every pair is listed. One micro-context a
//!   review; the pairs follow from the facts by the deterministic reducer.
//! - **A pairwise judge**, as a semantic join runs it: one context for each
//!   candidate pair (two reviews of one film), asked whether they disagree.
//!
//! Both are scored against the fixture's oracle (each review's sentiment),
//! which no run reads: precision and recall over the opposite pairs.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, anyhow};
use fanfold_core::Status;
use fanfold_core::spec::{ReducerKind, Spec};
use fanfold_engine::{NoProgress, Plan, RunOptions};
use fanfold_fixtures::reviews::ReviewsOracle;
use serde_json::{Value, json};

use crate::report::{backends_label, machine_line, write_marked_section};

pub struct PairsArgs {
    pub example: PathBuf,
    pub report: PathBuf,
    /// Reviews of each film taken, the first by id.
    pub per_film: usize,
    pub slots: usize,
    pub backend: Option<String>,
}

type PairKey = (String, String);

struct Row {
    name: &'static str,
    found: BTreeSet<PairKey>,
    calls: u64,
    tokens: u64,
    wall_s: f64,
    errors: u64,
    complete: bool,
}

pub fn main(args: &PairsArgs) -> Result<()> {
    let oracle_path = args.example.join("oracle.json");
    let oracle: ReviewsOracle = serde_json::from_str(
        &std::fs::read_to_string(&oracle_path)
            .with_context(|| format!("reading {}", oracle_path.display()))?,
    )
    .with_context(|| format!("parsing {}", oracle_path.display()))?;
    let reviews_path = args.example.join("reviews.jsonl");
    let text = std::fs::read_to_string(&reviews_path)
        .with_context(|| format!("reading {}", reviews_path.display()))?;
    // The first `per_film` reviews of each film.
    let mut taken: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for (n, line) in text.lines().enumerate() {
        let v: Value = serde_json::from_str(line)
            .with_context(|| format!("{} line {}", reviews_path.display(), n + 1))?;
        let film = field(&v, "film").to_owned();
        let list = taken.entry(film).or_default();
        if list.len() < args.per_film {
            list.push(v);
        }
    }
    let tmp = tempfile::tempdir().context("creating a temporary folder")?;
    let subset = tmp.path().join("reviews.jsonl");
    let pairs_input = tmp.path().join("pairs.jsonl");
    let (mut reviews, mut candidates) = (String::new(), String::new());
    let mut truth: BTreeSet<PairKey> = BTreeSet::new();
    let mut candidate_count = 0u64;
    for list in taken.values() {
        for (i, a) in list.iter().enumerate() {
            reviews.push_str(&format!("{a}\n"));
            for b in list.iter().skip(i + 1) {
                let (ia, ib) = (id(a), id(b));
                candidate_count += 1;
                candidates.push_str(&format!(
                    "{}\n",
                    json!({"id": format!("{ia}+{ib}"), "film": field(a, "film"), "first": field(a, "text"), "second": field(b, "text")})
                ));
                let sentiment = |r: &str| oracle.reviews.get(r).map(|t| t.sentiment.clone());
                if sentiment(&ia) != sentiment(&ib) {
                    truth.insert((ia, ib));
                }
            }
        }
    }
    std::fs::write(&subset, reviews).context("writing the reviews")?;
    std::fs::write(&pairs_input, candidates).context("writing the candidate pairs")?;

    // Per-unit facts, every pair listed.
    let spec_path = args.example.join("opposite-pairs.toml");
    let mut spec = read_spec(&spec_path)?;
    for r in &mut spec.fold.reducers {
        if let ReducerKind::Pairs { limit, .. } = &mut r.kind {
            *limit = None;
        }
    }
    let per_unit = run_one(
        "per-unit facts + `pairs`",
        spec,
        &spec_path,
        args,
        &subset,
        &tmp.path().join("per-unit.sqlite"),
        |report| {
            report
                .answer
                .stated
                .iter()
                .flat_map(|g| g.stated.rows.iter())
                .filter_map(|r| {
                    let strip =
                        |c: Option<&String>| c.map(|c| c.trim_start_matches('#').to_owned());
                    Some(ordered(strip(r.get(1))?, strip(r.get(3))?))
                })
                .collect()
        },
    )?;

    // The pairwise judge: the review spec's model, one context a pair.
    let mut spec = read_spec(&spec_path)?;
    spec.name = "film-review-pairs".into();
    spec.input.partition = fanfold_core::spec::PartitionSpec::Jsonl {
        key: Some("id".into()),
        kind: "pair".into(),
    };
    for s in &mut spec.stages {
        if let fanfold_core::spec::StageSpec::Map(m) = s {
            m.name = "pair".into();
            m.rubric = "pair.md".into();
            m.output_schema = "pair.schema.json".into();
            // The projection alone says what a context sees.
            m.fields = Vec::new();
            m.project = Some("{film, first, second}".into());
            m.decision.positive = vec!["opposite".into()];
            m.decision.negative = vec!["same".into()];
            m.evidence = None;
            m.max_output_tokens = 24;
        }
    }
    for b in spec.backends.values_mut() {
        if let fanfold_core::spec::BackendSpec::Scripted { script, .. } = b {
            *script = "scripted-pair.jq".into();
        }
    }
    spec.fold.reducers = vec![fanfold_core::spec::ReducerSpec {
        name: "opposite".into(),
        stage: None,
        statuses: None,
        dedupe: None,
        kind: ReducerKind::Set {
            value: None,
            order_by: None,
            limit: None,
        },
    }];
    spec.contract = fanfold_core::spec::ContractSpec::Exhaustive {
        answer: "opposite".into(),
        themes: None,
        top_themes: 0,
    };
    let pairwise = run_one(
        "pairwise judge (one context a pair)",
        spec,
        &spec_path,
        args,
        &pairs_input,
        &tmp.path().join("pairwise.sqlite"),
        |report| {
            report
                .facts
                .iter()
                .filter(|f| f.status == Status::Positive)
                .filter_map(|f| {
                    let (a, b) = f.source_ids.first()?.as_str().split_once('+')?;
                    Some(ordered(a.to_owned(), b.to_owned()))
                })
                .collect()
        },
    )?;
    let (rows, backend, simulated) = (
        [per_unit.0, pairwise.0],
        per_unit.1,
        per_unit.2 || pairwise.2,
    );
    let section = render(
        &rows,
        &truth,
        candidate_count,
        args,
        &taken,
        &backend,
        simulated,
    );
    print!("{section}");
    write_marked_section(&args.report, "pairs", &section)
}

fn field<'a>(v: &'a Value, name: &str) -> &'a str {
    v.get(name).and_then(Value::as_str).unwrap_or_default()
}

fn id(v: &Value) -> String {
    field(v, "id").to_owned()
}

fn ordered(a: String, b: String) -> PairKey {
    if a <= b { (a, b) } else { (b, a) }
}

fn read_spec(path: &std::path::Path) -> Result<Spec> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Spec::from_toml(&text).map_err(|e| anyhow!("{}: {e}", path.display()))
}

/// Runs one way from an empty store; the row, its backends, and whether
/// any was simulated.
fn run_one(
    name: &'static str,
    mut spec: Spec,
    spec_path: &std::path::Path,
    args: &PairsArgs,
    input: &std::path::Path,
    store: &std::path::Path,
    found: impl Fn(&fanfold_engine::report::RunReport) -> BTreeSet<PairKey>,
) -> Result<(Row, String, bool)> {
    if let Some(b) = &args.backend {
        spec.use_backend(b)
            .map_err(|e| anyhow!("the example: {e}"))?;
    }
    let plan = Plan::from_spec(spec, spec_path, &args.example)?;
    let mut opts = RunOptions::new(store.to_path_buf());
    opts.slots = args.slots;
    opts.source = Some(fanfold_engine::Source::File(input.to_path_buf()));
    eprintln!("bench pairs: {name}");
    let started = Instant::now();
    let report = fanfold_engine::run(&plan, &opts, &NoProgress)?;
    let wall_s = started.elapsed().as_secs_f64();
    let c = &report.certificate;
    Ok((
        Row {
            name,
            found: found(&report),
            calls: c.stats.model_calls,
            tokens: c.stats.cost.prompt_tokens + c.stats.cost.completion_tokens,
            wall_s,
            errors: c.statuses.error,
            complete: c.complete,
        },
        backends_label(c),
        c.simulated,
    ))
}

fn render(
    rows: &[Row],
    truth: &BTreeSet<PairKey>,
    candidates: u64,
    args: &PairsArgs,
    taken: &BTreeMap<String, Vec<Value>>,
    backend: &str,
    simulated: bool,
) -> String {
    let reviews: usize = taken.values().map(Vec::len).sum();
    let tag = if simulated { " [SIMULATED]" } else { "" };
    let mut s = String::new();
    let mut line = |t: String| {
        s.push_str(&t);
        s.push('\n');
    };
    line(format!(
        "## Pairs from per-unit facts against a pairwise judge{tag}"
    ));
    line(String::new());
    line(format!(
        "`fanfold bench pairs --per-film {}` on `examples/film-reviews`: the first {} reviews of each of {} films ({reviews} reviews, {candidates} candidate pairs of one film, {} of them opposite by the fixture's oracle, which no run reads), {}; backends {backend}, {} slots. Each way runs from an empty store, one after the other. **Per-unit facts**: `opposite-pairs.toml` with its limit lifted, one context a review, the pairs folded from the facts. **Pairwise**: one context for each candidate pair, asked whether the two disagree, as a semantic join asks.",
        args.per_film,
        args.per_film,
        taken.len(),
        truth.len(),
        machine_line(),
        args.slots
    ));
    line(String::new());
    line("| way | model calls | tokens | wall s | pairs found | correct | precision | recall | errors | complete |".into());
    line("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|".into());
    for r in rows {
        let hit = r.found.intersection(truth).count();
        let share = |a: usize, b: usize| {
            if b == 0 {
                "-".to_owned()
            } else {
                format!("{:.3}", a as f64 / b as f64)
            }
        };
        line(format!(
            "| {} | {} | {} | {:.1} | {} | {hit} | {} | {} | {} | {} |",
            r.name,
            r.calls,
            r.tokens,
            r.wall_s,
            r.found.len(),
            share(hit, r.found.len()),
            share(hit, truth.len()),
            r.errors,
            if r.complete { "yes" } else { "no" }
        ));
    }
    if let [a, b] = rows {
        line(String::new());
        line(format!(
            "The pairwise judge made {:.1}× the calls and {:.1}× the tokens of the per-unit facts; the pairs it found agree with theirs on {} of {} pairs either found.",
            b.calls as f64 / a.calls.max(1) as f64,
            b.tokens as f64 / a.tokens.max(1) as f64,
            a.found.intersection(&b.found).count(),
            a.found.union(&b.found).count()
        ));
    }
    s
}
