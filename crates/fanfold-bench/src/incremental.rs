//! `fanfold bench incremental`: what a rerun pays after the input changes.
//! The example is run once on a fresh store; then, each against that same
//! base, 1 %, 10 % and 100 % of its issues edited (words added to the
//! title, which every stage sees, different for each change), 1 % inserted (copies under new numbers,
//! each beside its original) and 1 % deleted. After each, the base is run
//! again, which costs nothing, so every change is measured from the same
//! store. The ideal is what changed: a model call for each changed unit the
//! judge receives, and no more fold nodes than changed leaves times the
//! tree's depth.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, anyhow};
use fanfold_core::FactRecord;
use fanfold_core::spec::{Spec, StageSpec};
use fanfold_engine::{NoProgress, Plan, RunOptions, RunReport, Source};
use serde_json::Value;

use crate::report::{backends_label, machine_line, write_marked_section};

pub struct IncrementalArgs {
    pub example: PathBuf,
    pub report: PathBuf,
    pub backend: String,
    pub slots: usize,
    pub seed: u64,
}

/// The example's judge: the stage that calls a model for each unit.
const JUDGE: &str = "auth_blocker";

struct Change {
    name: String,
    /// Issue numbers edited, inserted or deleted.
    touched: BTreeSet<String>,
    issues: Vec<Value>,
    deleted: bool,
}

struct Measured {
    name: String,
    touched: usize,
    /// Touched units with a fact in the run (for a delete: in the base).
    leaves: u64,
    ideal_calls: u64,
    calls: u64,
    vectors: u64,
    nodes: u64,
    depth: u32,
    wall_s: f64,
}

pub fn main(args: &IncrementalArgs) -> Result<()> {
    let spec_path = args.example.join("spec.toml");
    let text = std::fs::read_to_string(&spec_path)
        .with_context(|| format!("reading {}", spec_path.display()))?;
    let mut spec = Spec::from_toml(&text).map_err(|e| anyhow!("{}: {e}", spec_path.display()))?;
    // The audit re-judges a sample of what changed among the negatives:
    // that is its job, but not the rerun's cost this measures.
    spec.stages.retain(|s| !matches!(s, StageSpec::Audit(_)));
    spec.use_backend(&args.backend)
        .map_err(|e| anyhow!("the example: {e}"))?;
    let plan = Plan::from_spec(spec, &spec_path, &args.example)?;
    let issues_path = args.example.join("issues.json");
    let issues: Vec<Value> = serde_json::from_str(
        &std::fs::read_to_string(&issues_path)
            .with_context(|| format!("reading {}", issues_path.display()))?,
    )
    .with_context(|| format!("parsing {}", issues_path.display()))?;
    let tmp = tempfile::tempdir().context("creating a temporary folder")?;
    let store = tmp.path().join("incremental.sqlite");
    let run = |issues: &[Value], tag: &str| -> Result<(RunReport, f64)> {
        let path = tmp.path().join(format!("{tag}.json"));
        std::fs::write(&path, serde_json::to_vec_pretty(issues)?)?;
        let mut opts = RunOptions::new(store.clone());
        opts.slots = args.slots;
        opts.source = Some(Source::File(path));
        let started = Instant::now();
        let report = fanfold_engine::run(&plan, &opts, &NoProgress)?;
        Ok((report, started.elapsed().as_secs_f64()))
    };
    eprintln!("bench incremental: base");
    let (base, base_wall) = run(&issues, "base")?;
    let mut rows = Vec::new();
    for change in changes(&issues, args.seed) {
        eprintln!("bench incremental: {}", change.name);
        let (report, wall_s) = run(&change.issues, "changed")?;
        rows.push(measure(&change, &report, &base, wall_s));
        // Back to the base, so the next change is measured from it too.
        let (restored, _) = run(&issues, "base")?;
        if restored.certificate.stats.model_calls != 0 {
            return Err(anyhow!(
                "rerunning the base after `{}` made {} model calls; the store lost facts",
                change.name,
                restored.certificate.stats.model_calls
            ));
        }
    }
    let c = &base.certificate;
    let backend = backends_label(c);
    let section = render(
        &rows,
        &backend,
        c.simulated,
        base_wall,
        c.stats.model_calls,
        issues.len(),
    );
    print!("{section}");
    write_marked_section(&args.report, "incremental", &section)
}

fn number(issue: &Value) -> Option<String> {
    issue.get("number").map(Value::to_string)
}

/// The issues in seeded order: the first n of it are the ones touched.
fn seeded_order(issues: &[Value], seed: u64) -> Vec<String> {
    let mut order: Vec<(u64, String)> = issues
        .iter()
        .filter_map(number)
        .map(|n| {
            let h = fanfold_core::ContentHash::of_bytes(format!("{seed}:{n}").as_bytes());
            let rank = u64::from_le_bytes(h.0.first_chunk::<8>().copied().unwrap_or_default());
            (rank, n)
        })
        .collect();
    order.sort();
    order.into_iter().map(|(_, n)| n).collect()
}

fn changes(issues: &[Value], seed: u64) -> Vec<Change> {
    let order = seeded_order(issues, seed);
    let share = |pct: usize| -> BTreeSet<String> {
        let n = (issues.len() * pct).div_ceil(100);
        order.iter().take(n).cloned().collect()
    };
    let mut out = Vec::new();
    for pct in [1, 10, 100] {
        let touched = share(pct);
        let edited = issues
            .iter()
            .map(|i| {
                let mut i = i.clone();
                if number(&i).is_some_and(|n| touched.contains(&n))
                    && let Some(Value::String(title)) = i.get_mut("title")
                {
                    // Each change its own words, so none finds another's
                    // facts in the store.
                    title.push_str(&format!(" (edited, {pct} %)"));
                }
                i
            })
            .collect();
        out.push(Change {
            name: format!("edit {pct} %"),
            touched,
            issues: edited,
            deleted: false,
        });
    }
    let copied = share(1);
    let top = issues
        .iter()
        .filter_map(|i| i.get("number").and_then(Value::as_u64))
        .max()
        .unwrap_or(0);
    let mut inserted = Vec::with_capacity(issues.len() + copied.len());
    let mut new_numbers = BTreeSet::new();
    for i in issues {
        inserted.push(i.clone());
        if number(i).is_some_and(|n| copied.contains(&n)) {
            let mut copy = i.clone();
            let n = top + 1 + new_numbers.len() as u64;
            if let Some(slot) = copy.get_mut("number") {
                *slot = Value::from(n);
            }
            new_numbers.insert(n.to_string());
            inserted.push(copy);
        }
    }
    out.push(Change {
        name: "insert 1 %".into(),
        touched: new_numbers,
        issues: inserted,
        deleted: false,
    });
    let gone = share(1);
    out.push(Change {
        name: "delete 1 %".into(),
        issues: issues
            .iter()
            .filter(|i| number(i).is_none_or(|n| !gone.contains(&n)))
            .cloned()
            .collect(),
        touched: gone,
        deleted: true,
    });
    out
}

fn touched_in<'a>(
    facts: &'a [FactRecord],
    touched: &'a BTreeSet<String>,
) -> impl Iterator<Item = &'a FactRecord> {
    facts.iter().filter(|f| {
        f.source_ids
            .first()
            .is_some_and(|id| touched.contains(id.as_str()))
    })
}

fn measure(change: &Change, report: &RunReport, base: &RunReport, wall_s: f64) -> Measured {
    let leaves_of = if change.deleted { base } else { report };
    let leaves = touched_in(&leaves_of.facts, &change.touched).count() as u64;
    // A changed unit the judge receives must be judged again; a deleted one
    // costs nothing.
    let ideal_calls = if change.deleted {
        0
    } else {
        touched_in(&report.facts, &change.touched)
            .filter(|f| f.stage == JUDGE)
            .count() as u64
    };
    let s = &report.certificate.stats;
    Measured {
        name: change.name.clone(),
        touched: change.touched.len(),
        leaves,
        ideal_calls,
        calls: s.model_calls,
        vectors: s
            .reports
            .all::<fanfold_engine::stages::embed::EmbedStats>(fanfold_engine::stages::embed::REPORT)
            .values()
            .map(|e| e.vectors_computed)
            .sum(),
        nodes: s.fold_nodes_computed,
        depth: s.fold_depth,
        wall_s,
    }
}

fn render(
    rows: &[Measured],
    backend: &str,
    simulated: bool,
    base_wall: f64,
    base_calls: u64,
    records: usize,
) -> String {
    let mut s = String::new();
    let mut line = |t: String| {
        s.push_str(&t);
        s.push('\n');
    };
    let tag = if simulated { " [SIMULATED]" } else { "" };
    line(format!("## Incremental reruns{tag}"));
    line(String::new());
    line(format!(
        "`fanfold bench incremental` on `examples/issue-triage` ({records} issues; its audit left out), {}; backends {backend}. The base run took {base_wall:.1} s and {base_calls} model calls on a fresh store; each change below is run against that store, and the base is run again after it (0 calls each time). Ideal calls: the changed units the judge received. Fold bound: the changed leaves times the tree's depth.",
        machine_line(),
    ));
    if simulated {
        line(String::new());
        line("The judge is scripted [SIMULATED], which changes no figure here: calls, vectors and fold nodes are the engine's own accounting.".into());
    }
    line(String::new());
    line("| change | issues touched | leaves touched | model calls (ideal) | vectors computed | fold nodes recomputed (bound) | depth | wall |".into());
    line("|---|---:|---:|---:|---:|---:|---:|---:|".into());
    for r in rows {
        let bound = r.leaves * u64::from(r.depth);
        line(format!(
            "| {} | {} | {} | {} ({}){} | {} | {} ({bound}){} | {} | {:.1} s |",
            r.name,
            r.touched,
            r.leaves,
            r.calls,
            r.ideal_calls,
            if r.calls == r.ideal_calls { "" } else { " ✗" },
            r.vectors,
            r.nodes,
            if r.nodes <= bound { "" } else { " ✗" },
            r.depth,
            r.wall_s
        ));
    }
    line(String::new());
    line("✗ marks a figure above its ideal. Fold groups end where a leaf's identity (unit and stage) hashes to a boundary, not at fixed positions, so an insert or a delete moves only the groups beside it.".into());
    s
}
