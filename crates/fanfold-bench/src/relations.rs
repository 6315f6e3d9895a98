//! `fanfold bench relations`: does widening recover what one record cannot
//! tell, and at what granularity should a context read? The
//! `issue-relations` example four ways, in fresh stores, on one backend:
//! field-level (the judge sees the title alone), record-level (the judge's
//! `widen` removed, so what it cannot decide stays `abstain`), adaptive
//! (as declared: record-level, widened on demand) and widened (every open
//! bug judged beside its near-duplicates). Each is scored against the
//! fixture's oracle, which the runs never read: precision,
//! recall, abstains, confident mistakes (a regression called not one, or
//! the reverse), and the grouping's own recall: for how many regressions
//! the closed issue it regresses was among the members shown.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, anyhow};
use fanfold_core::spec::{Spec, StageSpec};
use fanfold_core::{FactRecord, Status};
use fanfold_engine::{NoProgress, Plan, RunOptions};
use fanfold_fixtures::relations::RelationsOracle;

use crate::report::{backends_label, machine_line, write_marked_section};

pub struct RelationsArgs {
    pub example: PathBuf,
    pub report: PathBuf,
    pub slots: usize,
    /// A backend of the spec to run every model turn on.
    pub backend: Option<String>,
}

/// The example's record-level judge and its widen stage.
const JUDGE: &str = "regression";
const WIDEN: &str = "with_related";

/// One run, scored.
struct Row {
    name: &'static str,
    positives: BTreeSet<u64>,
    abstains: u64,
    /// Units the judge ended negative that the oracle calls regressions.
    confident_misses: Vec<u64>,
    calls: u64,
    tokens: u64,
    wall_s: f64,
    widened: u64,
    /// Regressions widened, and of those the ones shown the issue they
    /// regress.
    grouped: (u64, u64),
    complete: bool,
}

pub fn main(args: &RelationsArgs) -> Result<()> {
    let spec_path = args.example.join("spec.toml");
    let text = std::fs::read_to_string(&spec_path)
        .with_context(|| format!("reading {}", spec_path.display()))?;
    let base = Spec::from_toml(&text).map_err(|e| anyhow!("{}: {e}", spec_path.display()))?;
    let oracle_path = args.example.join("oracle.json");
    let oracle: RelationsOracle = serde_json::from_str(
        &std::fs::read_to_string(&oracle_path)
            .with_context(|| format!("reading {}", oracle_path.display()))?,
    )
    .with_context(|| format!("parsing {}", oracle_path.display()))?;
    let truth: BTreeSet<u64> = oracle.regression_ids.iter().copied().collect();
    let tmp = tempfile::tempdir().context("creating a temporary folder")?;
    let mut rows = Vec::new();
    let mut backend_label = String::new();
    let mut simulated = false;
    for name in ["field-level", "record-level", "adaptive", "widened"] {
        let mut spec = base.clone();
        for s in &mut spec.stages {
            match s {
                StageSpec::Map(m) if name == "field-level" => {
                    m.widen = None;
                    m.project = Some("{number, title}".into());
                }
                StageSpec::Map(m) if name == "record-level" => m.widen = None,
                StageSpec::Select(sel) if name == "widened" => {
                    for c in &mut sel.choices {
                        if c.run.as_deref() == Some(JUDGE) {
                            c.run = Some(WIDEN.into());
                        }
                    }
                }
                _ => {}
            }
        }
        if let Some(b) = &args.backend {
            spec.use_backend(b)
                .map_err(|e| anyhow!("the example: {e}"))?;
        }
        let plan = Plan::from_spec(spec, &spec_path, &args.example)?;
        let mut opts = RunOptions::new(tmp.path().join(format!("{name}.sqlite")));
        opts.slots = args.slots;
        eprintln!("bench relations: {name}");
        let started = Instant::now();
        let report = fanfold_engine::run(&plan, &opts, &NoProgress)?;
        let wall_s = started.elapsed().as_secs_f64();
        let c = &report.certificate;
        simulated |= c.simulated;
        if backend_label.is_empty() {
            backend_label = backends_label(c);
        }
        rows.push(score(name, &report.facts, &oracle, &truth, c, wall_s));
    }
    let section = render(&rows, &truth, &backend_label, simulated, args.slots);
    print!("{section}");
    write_marked_section(&args.report, "relations", &section)
}

fn number(f: &FactRecord) -> Option<u64> {
    f.source_ids.first()?.as_str().parse().ok()
}

fn score(
    name: &'static str,
    facts: &[FactRecord],
    oracle: &RelationsOracle,
    truth: &BTreeSet<u64>,
    c: &fanfold_engine::report::Certificate,
    wall_s: f64,
) -> Row {
    let model = |f: &&FactRecord| f.stage == JUDGE || f.stage == WIDEN;
    let positives = facts
        .iter()
        .filter(model)
        .filter(|f| f.status == Status::Positive)
        .filter_map(number)
        .collect();
    let abstains = facts
        .iter()
        .filter(model)
        .filter(|f| f.status == Status::Abstain)
        .count() as u64;
    let confident_misses = facts
        .iter()
        .filter(model)
        .filter(|f| f.status == Status::Negative)
        .filter_map(number)
        .filter(|n| truth.contains(n))
        .collect();
    let mut grouped = (0, 0);
    for f in facts.iter().filter(|f| f.stage == WIDEN) {
        let Some(n) = number(f) else { continue };
        let Some(regressed) = oracle.regresses.get(&n) else {
            continue;
        };
        grouped.0 += 1;
        if f.source_ids
            .iter()
            .any(|id| id.as_str() == regressed.to_string())
        {
            grouped.1 += 1;
        }
    }
    Row {
        name,
        positives,
        abstains,
        confident_misses,
        calls: c.stats.model_calls,
        tokens: c.stats.cost.prompt_tokens + c.stats.cost.completion_tokens,
        wall_s,
        widened: fanfold_engine::stages::widen::widened_units(&c.stats),
        grouped,
        complete: c.complete,
    }
}

fn ids(v: impl IntoIterator<Item = u64>) -> String {
    let v: Vec<String> = v.into_iter().map(|n| n.to_string()).collect();
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

fn render(
    rows: &[Row],
    truth: &BTreeSet<u64>,
    backend: &str,
    simulated: bool,
    slots: usize,
) -> String {
    let mut s = String::new();
    let mut line = |t: String| {
        s.push_str(&t);
        s.push('\n');
    };
    let tag = if simulated { " [SIMULATED]" } else { "" };
    line(format!("## Relations: when one record is not enough{tag}"));
    line(String::new());
    line(format!(
        "`fanfold bench relations` on `examples/issue-relations` ({} true regressions among its open bugs; the oracle is read only by this scorer), {}; backends {backend}, {slots} slots. Field-level: the judge sees `{{number, title}}`; record-level: the spec with the judge's `widen` removed; adaptive: the spec as committed (record-level, an `unsure` widened); widened: every open bug judged beside its near-duplicates.",
        truth.len(),
        machine_line(),
    ));
    if simulated {
        line(String::new());
        line("[SIMULATED] The judge is a script that follows the rubrics by rule: this tests the mechanics and makes no quality claim. The grouping's recall is real (the embedder ran).".into());
    }
    line(String::new());
    line("| run | precision | recall | abstains | confident misses | widened | regressions shown their fixed issue | calls | tokens | wall | complete |".into());
    line("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|".into());
    for r in rows {
        let tp = r.positives.intersection(truth).count() as f64;
        let precision = if r.positives.is_empty() {
            "-".to_owned()
        } else {
            format!("{:.2}", tp / r.positives.len() as f64)
        };
        let recall = tp / truth.len().max(1) as f64;
        let grouped = if r.grouped.0 == 0 {
            "-".to_owned()
        } else {
            format!("{} of {}", r.grouped.1, r.grouped.0)
        };
        line(format!(
            "| {} | {precision} | {recall:.2} | {} | {} | {} | {grouped} | {} | {} | {:.1} s | {} |",
            r.name,
            r.abstains,
            r.confident_misses.len(),
            r.widened,
            r.calls,
            r.tokens,
            r.wall_s,
            if r.complete { "yes" } else { "no" }
        ));
    }
    line(String::new());
    for r in rows {
        let missed: Vec<u64> = truth
            .iter()
            .filter(|n| !r.positives.contains(n))
            .copied()
            .collect();
        let wrong: Vec<u64> = r.positives.difference(truth).copied().collect();
        let by: BTreeMap<&str, String> = [
            ("missed", ids(missed)),
            ("called regressions wrongly", ids(wrong)),
            ("confidently missed", ids(r.confident_misses.clone())),
        ]
        .into_iter()
        .collect();
        line(format!(
            "- {}: {}",
            r.name,
            by.iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect::<Vec<_>>()
                .join("; ")
        ));
    }
    s
}
