//! `fanfold bench select`: does a model-scored select pay for itself in
//! front of the judge? The example's select variant (`select.toml`) in
//! three routings over the same records, each in a store of its own, side
//! by side in one run:
//!
//! - no routing: every unit the prefilter keeps goes to the judge;
//! - rules only: the select's rules, and `otherwise` for the rest;
//! - model select: the rules, then the model scoring the catalog.
//!
//! Quality is scored against the fixture's independent oracle (which the
//! runs never read): the answer's precision and recall, the true blockers
//! the routing threw away, and the routing's choices by oracle label.
//! Figures come from the backend the spec names; a scripted or replayed
//! backend's are marked [SIMULATED].

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, anyhow};
use fanfold_core::spec::{Spec, StageSpec};
use fanfold_engine::{NoProgress, Plan, RunOptions, RunReport};

use crate::report::{machine_line, write_marked_section};

pub struct SelectArgs {
    pub example: PathBuf,
    pub report: PathBuf,
    pub slots: usize,
}

/// The stage the routing is measured at, and the judge it sends to.
const SELECT: &str = "route";
const JUDGE: &str = "auth_blocker";

struct Measured {
    label: &'static str,
    report: RunReport,
    wall_s: f64,
}

pub fn main(args: &SelectArgs) -> Result<()> {
    let spec_path = args.example.join("select.toml");
    let text = std::fs::read_to_string(&spec_path)
        .with_context(|| format!("reading {}", spec_path.display()))?;
    let base = Spec::from_toml(&text).map_err(|e| anyhow!("{}: {e}", spec_path.display()))?;
    let oracle = crate::selfcheck::read_oracle(&args.example.join("oracle.json"))?;
    let blockers: BTreeSet<String> = oracle.blocker_ids.iter().map(u64::to_string).collect();
    let tmp = tempfile::tempdir().context("creating a temporary folder")?;

    let mut runs = Vec::new();
    for label in ["no routing", "rules only", "model select"] {
        let mut spec = base.clone();
        // The audit measures other rungs and the cluster reduces the
        // answer; neither is what is compared here.
        spec.stages
            .retain(|s| !matches!(s, StageSpec::Audit(_) | StageSpec::Cluster(_)));
        match label {
            "no routing" => spec.stages.retain(|s| s.name() != SELECT),
            "rules only" => {
                for s in &mut spec.stages {
                    if let StageSpec::Select(sel) = s {
                        sel.model = None;
                        sel.otherwise = Some("judge".into());
                    }
                }
            }
            _ => {}
        }
        let plan = Plan::from_spec(spec, &spec_path, &args.example)?;
        let store = tmp
            .path()
            .join(format!("{}.sqlite", label.replace(' ', "-")));
        let mut opts = RunOptions::new(store);
        opts.slots = args.slots;
        opts.out_dir = Some(tmp.path().join(label.replace(' ', "-")));
        eprintln!("bench select: {label}");
        let started = Instant::now();
        let report = fanfold_engine::run(&plan, &opts, &NoProgress)?;
        runs.push(Measured {
            label,
            wall_s: started.elapsed().as_secs_f64(),
            report,
        });
    }
    let section = render(&runs, &blockers, args.slots);
    print!("{section}");
    write_marked_section(&args.report, "select", &section)
}

/// Units the judge received.
fn sent(m: &Measured) -> u64 {
    m.report
        .certificate
        .routed_by_stage
        .get(JUDGE)
        .copied()
        .unwrap_or(0)
}

/// Units the routing ended itself (excluded or abstained).
fn thrown_away(m: &Measured) -> Vec<&str> {
    m.report
        .facts
        .iter()
        .filter(|f| f.stage == SELECT)
        .map(|f| f.source_ids.first().map(|i| i.0.as_str()).unwrap_or(""))
        .collect()
}

/// A phase's wall time, or `-` for a run without that phase.
fn phase_s(r: &RunReport, name: &str) -> String {
    r.certificate
        .stats
        .phases_ms
        .iter()
        .find(|(p, _)| p == name)
        .map(|(_, ms)| format!("{:.1} s", *ms as f64 / 1000.0))
        .unwrap_or_else(|| "-".to_owned())
}

fn render(runs: &[Measured], blockers: &BTreeSet<String>, slots: usize) -> String {
    let mut s = String::new();
    let mut line = |t: String| {
        s.push_str(&t);
        s.push('\n');
    };
    let first = runs.first().map(|m| &m.report.certificate);
    let backend = first
        .and_then(|c| c.backends.first())
        .map(|b| format!("{} ({})", b.kind, b.model_id))
        .unwrap_or_default();
    let simulated = runs.iter().any(|m| m.report.certificate.simulated);
    let tag = if simulated { " [SIMULATED]" } else { "" };
    line(format!("## Select: routing in front of the judge{tag}"));
    line(String::new());
    line(format!(
        "`fanfold bench select` on `examples/issue-triage/select.toml`, {}; backend {backend}, {slots} slots; each routing in a fresh store, one after the other in one run. Quality is scored against the fixture's oracle, which no run reads.",
        machine_line(),
    ));
    line(String::new());
    line("| routing | sent to the judge | thrown away by routing (true blockers among them) | answer | precision | recall | model calls | prompt tokens evaluated | routing wall | judge wall | total wall |".into());
    line("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|".into());
    for m in runs {
        let c = &m.report.certificate;
        let answer: BTreeSet<String> = m
            .report
            .answer
            .items
            .iter()
            .map(|i| i.unit_id.0.clone())
            .collect();
        let tp = answer.intersection(blockers).count();
        let precision = if answer.is_empty() {
            0.0
        } else {
            tp as f64 / answer.len() as f64
        };
        let recall = tp as f64 / blockers.len().max(1) as f64;
        let sent = sent(m);
        let thrown = thrown_away(m);
        let lost = thrown.iter().filter(|i| blockers.contains(**i)).count();
        line(format!(
            "| {} | {sent} | {} ({lost}) | {} | {precision:.2} | {recall:.2} | {} | {} | {} | {} | {:.1} s |",
            m.label,
            thrown.len(),
            answer.len(),
            c.stats.model_calls,
            c.stats.cost.prompt_tokens,
            phase_s(&m.report, &format!("select:{SELECT}")),
            phase_s(&m.report, &format!("map:{JUDGE}")),
            m.wall_s,
        ));
    }
    line(String::new());
    // The routing's choices by what the oracle says the unit is.
    for m in runs {
        let Some(sel) = m
            .report
            .certificate
            .stats
            .reports
            .get::<fanfold_engine::stages::select::SelectReport>(
            fanfold_engine::stages::select::REPORT,
            SELECT,
        ) else {
            continue;
        };
        let mut by: BTreeMap<(String, String), (u64, u64)> = BTreeMap::new();
        for s in fanfold_engine::stages::select::selections(&m.report.files)
            .iter()
            .filter(|s| s.stage == SELECT)
        {
            let e = by
                .entry((s.choice.clone(), s.decided_by.clone()))
                .or_default();
            if blockers.contains(&s.unit_id) {
                e.0 += 1;
            } else {
                e.1 += 1;
            }
        }
        line(format!(
            "{}: choices by oracle label ({} moved under the confidence floor)",
            m.label, sel.below_floor
        ));
        line(String::new());
        line("| choice | decided by | true blockers | others |".into());
        line("|---|---|---:|---:|".into());
        for ((choice, by_whom), (yes, no)) in &by {
            line(format!("| {choice} | {by_whom} | {yes} | {no} |"));
        }
        line(String::new());
    }
    let verdict = match (
        runs.iter().find(|m| m.label == "rules only"),
        runs.iter().find(|m| m.label == "model select"),
    ) {
        (Some(rules), Some(model)) => {
            let saved = rules.wall_s - model.wall_s;
            format!(
                "The model select sent {} fewer units to the judge than the rules alone, lost {} true blockers to the rules' {}, and its total wall time was {:.1} s {} theirs.",
                sent(rules).saturating_sub(sent(model)),
                thrown_away(model)
                    .iter()
                    .filter(|i| blockers.contains(**i))
                    .count(),
                thrown_away(rules)
                    .iter()
                    .filter(|i| blockers.contains(**i))
                    .count(),
                saved.abs(),
                if saved >= 0.0 { "under" } else { "over" },
            )
        }
        _ => String::new(),
    };
    line(verdict);
    s
}
