//! `fanfold bench cluster`: the model reducer of `select.toml` on the
//! example, and how stable its themes are (reorder stress: the same facts
//! in several orders and at two fan-ins). Its themes are scored against the
//! fixture's causes, which the run never reads: each theme's majority
//! cause and purity, and the agreement of the memberships with the
//! oracle's grouping (1 less the same drift measure the stress uses).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, anyhow};
use fanfold_core::spec::{Spec, StageSpec};
use fanfold_engine::stages::cluster::ClusterReport;
use fanfold_engine::{NoProgress, Plan, RunOptions};

use crate::report::{backends_label, machine_line, write_marked_section};

pub struct ClusterArgs {
    pub example: PathBuf,
    pub report: PathBuf,
    pub slots: usize,
}

const CLUSTER: &str = "cause_themes";

pub fn main(args: &ClusterArgs) -> Result<()> {
    let spec_path = args.example.join("select.toml");
    let text = std::fs::read_to_string(&spec_path)
        .with_context(|| format!("reading {}", spec_path.display()))?;
    let mut spec = Spec::from_toml(&text).map_err(|e| anyhow!("{}: {e}", spec_path.display()))?;
    // The audit measures the rungs, not the reducer.
    spec.stages.retain(|s| !matches!(s, StageSpec::Audit(_)));
    let oracle = crate::selfcheck::read_oracle(&args.example.join("oracle.json"))?;
    let mut label: BTreeMap<String, String> = oracle
        .blocker_ids
        .iter()
        .map(|id| (id.to_string(), "other cause".to_owned()))
        .collect();
    for c in &oracle.causes {
        for id in &c.ids {
            label.insert(id.to_string(), c.cause.clone());
        }
    }
    let tmp = tempfile::tempdir().context("creating a temporary folder")?;
    let plan = Plan::from_spec(spec, &spec_path, &args.example)?;
    let mut opts = RunOptions::new(tmp.path().join("cluster.sqlite"));
    opts.slots = args.slots;
    eprintln!("bench cluster: select.toml without its audit");
    let started = Instant::now();
    let report = fanfold_engine::run(&plan, &opts, &NoProgress)?;
    let wall_s = started.elapsed().as_secs_f64();
    let c = &report.certificate;
    let Some(k) = c
        .stats
        .reports
        .get::<fanfold_engine::stages::cluster::ClusterReport>(
            fanfold_engine::stages::cluster::REPORT,
            CLUSTER,
        )
    else {
        return Err(anyhow!("select.toml has no cluster stage `{CLUSTER}`"));
    };
    let phase = c
        .stats
        .phases_ms
        .iter()
        .find(|(p, _)| *p == format!("cluster:{CLUSTER}"))
        .map_or(0.0, |(_, ms)| *ms as f64 / 1000.0);
    let backend = backends_label(c);
    let section = render(
        &k,
        &label,
        &RunFigures {
            backend,
            simulated: c.simulated,
            slots: args.slots,
            wall_s,
            phase_s: phase,
            complete: c.complete,
        },
    );
    print!("{section}");
    write_marked_section(&args.report, "cluster", &section)
}

struct RunFigures {
    backend: String,
    simulated: bool,
    slots: usize,
    wall_s: f64,
    phase_s: f64,
    complete: bool,
}

/// What the oracle calls a fact the reducer read.
fn truth<'a>(label: &'a BTreeMap<String, String>, id: &str) -> &'a str {
    label.get(id).map_or("not a blocker", String::as_str)
}

fn render(k: &ClusterReport, label: &BTreeMap<String, String>, m: &RunFigures) -> String {
    let mut s = String::new();
    let mut line = |t: String| {
        s.push_str(&t);
        s.push('\n');
    };
    let tag = if m.simulated { " [SIMULATED]" } else { "" };
    line(format!("## Cluster: themes nobody enumerated{tag}"));
    line(String::new());
    line(format!(
        "`fanfold bench cluster` on `examples/issue-triage/select.toml` (its audit left out), {}; backends {}, {} slots. The reducer read the {} facts of `{}` (each only as the quote it cites), {} a context, at most the spec's `max_themes` themes each. The fixture's causes score it; the run never reads them.",
        machine_line(),
        m.backend,
        m.slots,
        k.facts,
        k.reads,
        k.fan_in,
    ));
    line(String::new());
    line(format!(
        "- contexts: {} over {} level{} for the answer; {} model calls in all (stress reductions included when they ran); cluster phase {:.1} s of {:.1} s",
        k.nodes,
        k.levels,
        if k.levels == 1 { "" } else { "s" },
        k.calls,
        m.phase_s,
        m.wall_s
    ));
    line(format!(
        "- contexts refused after every attempt: {}; facts left in no theme by them: {}",
        k.errors.len(),
        k.failed.len()
    ));
    for e in &k.errors {
        line(format!(
            "  - level {}, {}..{}: {}",
            e.level, e.first, e.last, e.reason
        ));
    }
    line(format!(
        "- outliers: {}; placed in no theme: {}; answer complete: {}",
        k.outliers.len(),
        k.unthemed.len(),
        m.complete
    ));
    line(String::new());
    if k.themes.is_empty() {
        line("No theme survived the checks.".into());
    } else {
        line("| theme (model's label) | facts | majority cause (oracle) | purity |".into());
        line("|---|---:|---|---:|".into());
    }
    let mut groups: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    let read: BTreeSet<&str> = k
        .themes
        .iter()
        .flat_map(|t| t.members.iter().map(|i| i.as_str()))
        .chain(k.outliers.iter().map(|i| i.as_str()))
        .chain(k.unthemed.iter().map(|i| i.as_str()))
        .chain(k.failed.iter().map(|i| i.as_str()))
        .collect();
    for id in &read {
        groups
            .entry(truth(label, id))
            .or_default()
            .push((*id).to_owned());
    }
    for t in &k.themes {
        let mut by: BTreeMap<&str, u64> = BTreeMap::new();
        for id in &t.members {
            *by.entry(truth(label, id.as_str())).or_default() += 1;
        }
        let (major, n) = by
            .iter()
            .max_by_key(|(_, n)| **n)
            .map_or(("-", 0), |(c, n)| (*c, *n));
        line(format!(
            "| {} | {} | {major} | {:.2} |",
            t.label.replace('|', "/"),
            t.count,
            n as f64 / t.count.max(1) as f64
        ));
    }
    line(String::new());
    let themes: Vec<Vec<String>> = k
        .themes
        .iter()
        .map(|t| t.members.iter().map(|i| i.0.clone()).collect())
        .collect();
    let oracle: Vec<Vec<String>> = groups.values().cloned().collect();
    let agreement = 1.0 - fanfold_ops::cluster::drift(&themes, &oracle);
    line(format!(
        "Agreement of the themes with the oracle's grouping of the same facts ({} groups: {}): {agreement:.2} (1 is the same partition).",
        groups.len(),
        groups
            .iter()
            .map(|(c, ids)| format!("{c} {}", ids.len()))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    line(String::new());
    if let Some(why) = &k.stress_skipped {
        line(format!("Reorder stress (experiment 3) not run: {why}."));
        line(String::new());
    }
    if let Some(st) = &k.stress {
        line(format!(
            "Reorder stress (experiment 3): {} more reductions of the same facts; the largest drift is {:.2} against the declared bound {:.2}.",
            st.runs.len(),
            st.drift,
            st.max_drift
        ));
        line(String::new());
        line("| order | fan-in | themes | drift | refused contexts |".into());
        line("|---:|---:|---:|---:|---:|".into());
        for r in &st.runs {
            line(format!(
                "| {} | {} | {} | {:.2} | {} |",
                r.order, r.fan_in, r.themes, r.drift, r.errors
            ));
        }
        line(String::new());
    }
    s
}
