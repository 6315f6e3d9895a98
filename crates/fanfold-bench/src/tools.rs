//! `fanfold bench tools`: read-only enrichment under quotas, against the
//! local tracker (`fanfold fixture serve`'s, in this process) with
//! injected latency, 429s and hangs. The example's `comments.toml` in
//! five shapes, each in a fresh store and against a fresh tracker, side by
//! side in one run:
//!
//! - on demand: comments are fetched only for the issues the first read
//!   is unsure of;
//! - everything first: comments are fetched for every issue the prefilter
//!   keeps, then each is read once with them;
//! - on demand under a threshold contract: the first read stops at
//!   `count` positives, and the fetches it no longer needs are cancelled;
//! - milestones: each issue's milestone, fetched once per milestone
//!   however many issues share it (what deduplication saves);
//! - on demand again, on the first run's store (what the observation
//!   cache saves).
//!
//! Calls, retries and the most requests in flight are counted at the
//! tracker as well as by fanfold, so the quota is checked where it
//! matters. Quality against the fixture's oracle is the judge's: with the
//! scripted judge it is [SIMULATED] and measures mechanics only.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, anyhow};
use fanfold_core::spec::tool::{Capability, QuotaSpec, ToolStageSpec};
use fanfold_core::spec::{ContractSpec, Spec, StageSpec};
use fanfold_engine::{NoProgress, Plan, RunOptions, RunReport};
use fanfold_testkit::tracker::{Faults, TrackerData, TrackerStats, app};
use serde_json::Value;

use crate::report::{machine_line, write_marked_section};

pub struct ToolsArgs {
    pub example: PathBuf,
    pub report: PathBuf,
    pub backend: String,
    pub slots: usize,
    pub faults: Faults,
    /// The contract's count in the threshold run.
    pub threshold: u64,
}

const FIRST: &str = "first_read";
const FETCH: &str = "fetch_comments";

struct Measured {
    label: String,
    report: RunReport,
    wall_s: f64,
    /// What the tracker saw: requests, the most in flight, 429s, hangs.
    tracker: Value,
    /// The tool stages' reports, by stage.
    tools: Vec<(String, Value)>,
    quota: usize,
}

pub fn main(args: &ToolsArgs) -> Result<()> {
    let spec_path = args.example.join("comments.toml");
    let text = std::fs::read_to_string(&spec_path)
        .with_context(|| format!("reading {}", spec_path.display()))?;
    let base = Spec::from_toml(&text).map_err(|e| anyhow!("{}: {e}", spec_path.display()))?;
    let oracle = crate::selfcheck::read_oracle(&args.example.join("oracle.json"))?;
    let blockers: BTreeSet<String> = oracle.blocker_ids.iter().map(u64::to_string).collect();
    let data = Arc::new(tracker_data(&args.example)?);
    let tmp = tempfile::tempdir().context("creating a temporary folder")?;

    let shapes = [
        "on demand",
        "everything first",
        "on demand, threshold",
        "milestones",
        "on demand, rerun",
    ];
    let mut runs = Vec::new();
    // The rerun asks the same tracker as the first run: a request's key
    // holds the host it goes to.
    let mut first: Option<(fanfold_testkit::Server, Arc<TrackerStats>)> = None;
    for label in shapes {
        let (server, stats) = match first.take() {
            Some(kept) if label == "on demand, rerun" => kept,
            other => {
                first = other;
                let stats = Arc::new(TrackerStats::default());
                let app = app(data.clone(), args.faults, stats.clone());
                let server = fanfold_testkit::Server::start(app).context("starting the tracker")?;
                (server, stats)
            }
        };
        let before = stats.json();
        let mut spec = base.clone();
        spec.use_backend(&args.backend).map_err(|e| anyhow!(e))?;
        point_at(&mut spec, &server.addr.to_string());
        let quota = match label {
            "everything first" => {
                // The tool reads every kept issue, then one read each.
                spec.stages.retain(|s| s.name() != FIRST);
                quota_of(&spec, FETCH)
            }
            "on demand, threshold" => {
                spec.contract = ContractSpec::Threshold {
                    count: args.threshold,
                };
                quota_of(&spec, FETCH)
            }
            "milestones" => {
                let fetch = tool_of(&spec, FETCH).ok_or_else(|| anyhow!("no {FETCH} stage"))?;
                let milestone = milestone_stage(&fetch);
                spec.stages.retain(|s| s.name() == FIRST);
                for s in &mut spec.stages {
                    if let StageSpec::Map(m) = s {
                        m.widen = None;
                        m.project = m.project.as_ref().map(|p| {
                            p.replace(
                                ", comments_pending: true}",
                                ", due: .milestone_info.due_on}",
                            )
                        });
                    }
                }
                let q = milestone.quota.concurrency;
                spec.stages.insert(0, StageSpec::Tool(milestone));
                q
            }
            _ => quota_of(&spec, FETCH),
        };
        let store_name = if label == "on demand, rerun" {
            "on-demand"
        } else {
            &label.replace([' ', ','], "-")
        };
        let plan = Plan::from_spec(spec, &spec_path, &args.example)?;
        let mut opts = RunOptions::new(tmp.path().join(format!("{store_name}.sqlite")));
        opts.slots = args.slots;
        opts.out_dir = Some(tmp.path().join(label.replace([' ', ','], "-")));
        eprintln!("bench tools: {label}");
        let started = Instant::now();
        let report = fanfold_engine::run(&plan, &opts, &NoProgress)?;
        let wall_s = started.elapsed().as_secs_f64();
        let tools = report
            .certificate
            .stats
            .reports
            .all::<Value>(fanfold_engine::stages::tool::REPORT)
            .into_iter()
            .collect();
        let mut tracker = stats.json();
        let asked = n(&tracker, "requests").saturating_sub(n(&before, "requests"));
        if let Some(r) = tracker.get_mut("requests") {
            *r = asked.into();
        }
        runs.push(Measured {
            label: label.to_owned(),
            report,
            wall_s,
            tracker,
            tools,
            quota,
        });
        if label == "on demand" {
            first = Some((server, stats));
        }
    }
    let section = render(&runs, &blockers, args);
    print!("{section}");
    write_marked_section(&args.report, "tools", &section)
}

fn tracker_data(example: &Path) -> Result<TrackerData> {
    let read = |name: &str| -> Result<Value> {
        let path = example.join(name);
        let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        serde_json::from_slice(&bytes).with_context(|| format!("parsing {}", path.display()))
    };
    TrackerData::from_export(&read("issues.json")?, &read("comments.json")?).map_err(|e| anyhow!(e))
}

/// Points every HTTP tool of `spec` at the tracker at `addr`.
fn point_at(spec: &mut Spec, addr: &str) {
    for s in &mut spec.stages {
        if let StageSpec::Tool(t) = s
            && let Capability::HttpGet { url, .. } = &mut t.capability
        {
            *url = url.replace("127.0.0.1:8787", addr);
        }
    }
}

fn tool_of(spec: &Spec, name: &str) -> Option<ToolStageSpec> {
    spec.stages.iter().find_map(|s| match s {
        StageSpec::Tool(t) if t.name == name => Some(t.clone()),
        _ => None,
    })
}

fn quota_of(spec: &Spec, name: &str) -> usize {
    tool_of(spec, name).map_or(0, |t| t.quota.concurrency)
}

/// The example's comment fetch turned into a milestone fetch: the same
/// host, quota and limits, one request per milestone.
fn milestone_stage(fetch: &ToolStageSpec) -> ToolStageSpec {
    let url = match &fetch.capability {
        Capability::HttpGet { url, .. } => {
            url.replace("issues/{number}/comments", "milestones/{number}")
        }
        _ => String::new(),
    };
    ToolStageSpec {
        name: "fetch_milestone".into(),
        request: "if .milestone.number then {owner: \"acme-corp\", repo: \"widget\", number: .milestone.number} else null end".into(),
        capability: Capability::HttpGet {
            url,
            token_env: None,
        },
        field: "milestone_info".into(),
        extract: None,
        then: Some(FIRST.into()),
        quota: QuotaSpec {
            concurrency: fetch.quota.concurrency,
            per_second: fetch.quota.per_second,
        },
        ..fetch.clone()
    }
}

fn n(v: &Value, key: &str) -> u64 {
    v.get(key).and_then(Value::as_u64).unwrap_or(0)
}

fn render(runs: &[Measured], blockers: &BTreeSet<String>, args: &ToolsArgs) -> String {
    let mut s = String::new();
    let mut line = |t: String| {
        s.push_str(&t);
        s.push('\n');
    };
    let simulated = runs.iter().any(|m| m.report.certificate.simulated);
    let tag = if simulated { " [SIMULATED]" } else { "" };
    let f = &args.faults;
    line(format!("## Tools: read-only enrichment under quotas{tag}"));
    line(String::new());
    line(format!(
        "`fanfold bench tools` on `examples/issue-triage/comments.toml`, {}; judge backend `{}`, {} slots. The local tracker answers after {} ms, answers one request in {} with a 429 and holds one in {} for {} ms (past the stage's timeout); each shape runs in a fresh store against a fresh tracker, one after the other in one run, except the rerun, which reuses the first run's store and tracker. Requests and the most in flight are counted at the tracker.",
        machine_line(),
        args.backend,
        args.slots,
        f.latency_ms,
        f.every_429,
        f.every_hang,
        f.hang_ms,
    ));
    line(String::new());
    line("| shape | units at the tool | distinct requests | shared (deduplicated) | from the store | sent | retries | not sent (a shortfall) | cancelled by the contract | tracker requests | most in flight at the tracker (quota) | observations | tool wall | total wall | answer | complete | precision | recall |".into());
    line(
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---|---:|---:|"
            .into(),
    );
    for m in runs {
        let sum = |key: &str| m.tools.iter().map(|(_, r)| n(r, key)).sum::<u64>();
        let statuses: Vec<String> = m
            .tools
            .iter()
            .flat_map(|(_, r)| {
                r.get("statuses")
                    .and_then(Value::as_object)
                    .map(|o| {
                        o.iter()
                            .map(|(k, v)| format!("{k} {}", v.as_u64().unwrap_or(0)))
                            .collect::<Vec<_>>()
                    })
                    .unwrap_or_default()
            })
            .collect();
        let tool_ms: u64 = sum("wall_ms");
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
        line(format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} ({}) | {} | {:.2} s | {:.2} s | {} | {} | {precision:.2} | {recall:.2} |",
            m.label,
            sum("units"),
            sum("requests"),
            sum("deduplicated"),
            sum("cached"),
            sum("sent"),
            sum("retries"),
            sum("not_sent"),
            sum("cancelled"),
            n(&m.tracker, "requests"),
            n(&m.tracker, "max_in_flight"),
            m.quota,
            if statuses.is_empty() {
                "-".to_owned()
            } else {
                statuses.join(", ")
            },
            tool_ms as f64 / 1000.0,
            m.wall_s,
            answer.len(),
            if m.report.answer.complete {
                "yes".to_owned()
            } else {
                format!("**no**: {}", m.report.answer.incomplete.join("; "))
            },
        ));
    }
    line(String::new());
    let by = |label: &str| runs.iter().find(|m| m.label == label);
    if let (Some(demand), Some(all)) = (by("on demand"), by("everything first")) {
        let calls = |m: &Measured| n(&m.tracker, "requests");
        line(format!(
            "On demand asked the tracker {} times where fetching everything first asked {} ({:.0} % fewer), in {:.2} s of wall against {:.2} s.",
            calls(demand),
            calls(all),
            100.0 * (1.0 - calls(demand) as f64 / calls(all).max(1) as f64),
            demand.wall_s,
            all.wall_s,
        ));
    }
    if let (Some(demand), Some(th)) = (by("on demand"), by("on demand, threshold")) {
        let sent = |m: &Measured| m.tools.iter().map(|(_, r)| n(r, "sent")).sum::<u64>();
        line(format!(
            "Under a contract satisfied by {} positives, the tool sent {} requests where the exhaustive run sent {}: the rest were cancelled before they were sent ({}).",
            args.threshold,
            sent(th),
            sent(demand),
            match &th.report.certificate.stop {
                fanfold_ops::contract::StopReason::ContractSatisfied { detail } => detail.clone(),
                other => other.code().to_owned(),
            },
        ));
    }
    let over: Vec<&str> = runs
        .iter()
        .filter(|m| n(&m.tracker, "max_in_flight") > m.quota as u64)
        .map(|m| m.label.as_str())
        .collect();
    line(if over.is_empty() {
        "The quota held in every shape: the tracker never saw more requests in flight than the stage allows.".to_owned()
    } else {
        format!("The quota was exceeded in: {}.", over.join(", "))
    });
    s
}
