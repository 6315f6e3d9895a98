//! The audit stage: measure what the earlier rungs threw away.
//!
//! For each audited rung (the prefilter's exclusions, an embed stage's
//! drops, a map stage's negatives) the audit judges a seeded random sample
//! of its negatives with an independent judge: a map stage of its own
//! (rubric, schema, backend) whose positive values mean "this unit should
//! not have been thrown away". Each rung's miss rate is then estimated with
//! a 95 % interval; with `max_miss_rate` the sample grows until the
//! interval proves the rate or the sample cap is reached, and the answer is
//! incomplete if it is not proven. A unit the judge disagrees on may be
//! escalated to a declared map stage, which judges it like any other unit.
//!
//! The judge's facts are cached like every fact (the sample is the same on
//! a rerun, so a rerun pays nothing), but they are not answer facts: they
//! live in the store and in the certificate's audit report, never in the
//! fold.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;
use std::path::Path;

use fanfold_core::spec::{AuditStageSpec, PREFILTER_RUNG, Spec};
use fanfold_core::{ContentHash, Status};
use fanfold_ops::audit::{MissRate, rounds, sample};
use fanfold_ops::contract::Controller;
use fanfold_store::Store;
use serde::{Deserialize, Serialize};

use super::map::MapRunner;
use crate::error::PlanError;
use crate::error::RunError;
use crate::kit::UnitTable;
use crate::kit::ledger::FactLedger;
use crate::kit::{
    BuildContext, CachedCount, Calls, NegativeReads, Outputs, Reads, RunStats, Shape, Stage,
    StageContext, StageOutcome,
};

pub struct AuditRunner {
    pub spec: AuditStageSpec,
    judge: MapRunner,
    reads: NegativeReads,
}

impl AuditRunner {
    pub fn build(a: &AuditStageSpec, ctx: &mut BuildContext<'_>) -> Result<AuditRunner, PlanError> {
        if a.rungs.is_empty() {
            return Err(ctx.invalid(format!(
                "audit `{}` names no rungs; list \"{PREFILTER_RUNG}\" or earlier stages",
                a.name
            )));
        }
        if a.sample == 0 {
            return Err(ctx.invalid(format!("audit `{}`: sample must be at least 1", a.name)));
        }
        if let Some(rate) = a.max_miss_rate
            && !(rate > 0.0 && rate < 1.0)
        {
            return Err(ctx.invalid(format!(
                "audit `{}`: max_miss_rate {rate} must be a fraction between 0 and 1 (0.02 is 2 %)",
                a.name
            )));
        }
        if let Some(max) = a.max_sample
            && max < a.sample
        {
            return Err(ctx.invalid(format!(
                "audit `{}`: max_sample {max} is below sample {}",
                a.name, a.sample
            )));
        }
        if a.judge.widen.is_some() {
            return Err(ctx.invalid(format!(
                "audit `{}`: its judge widens nothing; send disagreements to a stage with `escalate`",
                a.name
            )));
        }
        let mut judge = a.judge.clone();
        judge.name = a.name.clone();
        let judge = MapRunner::build(&judge, ctx)?;
        Ok(AuditRunner {
            reads: NegativeReads {
                rungs: a.rungs.clone(),
                seed: a.seed,
                most: a.max_sample.unwrap_or(a.sample).max(a.sample),
            },
            spec: a.clone(),
            judge,
        })
    }
}

/// What an audit found, for the certificate and answer.md.
/// The key of audit stages' reports in the run's stats.
pub const REPORT: &str = "audits";

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AuditReport {
    /// The rate the run had to prove, if one was declared.
    pub max_miss_rate: Option<f64>,
    pub seed: u64,
    /// Per rung, in the order declared.
    pub rungs: BTreeMap<String, RungAudit>,
    /// The stage disagreements were sent to, and how many went.
    pub escalate: Option<String>,
    pub escalated: u64,
    /// The judge's model calls (cached judgements cost none).
    pub calls: u64,
    /// Judgements reused from the store; kept apart from the run's
    /// `cache_hits`, which count the answer's facts.
    pub cached: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RungAudit {
    pub miss: MissRate,
    /// Units sampled (judged or not).
    pub sampled: u64,
    /// Sampled units the judge left undecided: errors, abstains, budget.
    pub undecided: u64,
    /// The units the judge says should not have been thrown away.
    pub disagreeing: Vec<String>,
    /// With `max_miss_rate`: whether the interval's upper end is under it.
    pub proven: Option<bool>,
}

impl AuditReport {
    /// Why the audit leaves the answer incomplete, if it does.
    pub fn shortfalls(&self, name: &str) -> Vec<String> {
        let mut out = Vec::new();
        for (rung, r) in &self.rungs {
            if let (Some(limit), Some(false)) = (self.max_miss_rate, r.proven) {
                out.push(format!(
                    "audit `{name}` could not show that rung `{rung}` misses at most {:.1} % (95 % upper bound {:.1} % after judging {} of {})",
                    limit * 100.0,
                    r.miss.high * 100.0,
                    r.miss.judged,
                    r.miss.population
                ));
            }
        }
        out
    }
}

impl super::Kind for fanfold_core::spec::AuditStageSpec {
    fn build(&self, ctx: &mut BuildContext<'_>) -> Result<Box<dyn Stage>, PlanError> {
        Ok(Box::new(AuditRunner::build(self, ctx)?))
    }
}

impl Stage for AuditRunner {
    fn name(&self) -> &str {
        &self.spec.name
    }

    fn kind(&self) -> &'static str {
        "audit"
    }

    fn definition_hash(&self) -> ContentHash {
        let mut h = fanfold_core::StableHasher::new(fanfold_core::Bucket::AuditStage);
        h.field("judge", &self.judge.definition_hash());
        h.field("version", &self.spec.version);
        h.field("rungs", &self.spec.rungs);
        h.field("sample", &self.spec.sample);
        h.field("max_sample", &self.spec.max_sample);
        h.field(
            "max_miss_rate",
            &self.spec.max_miss_rate.map(|r| r.to_string()),
        );
        h.field("seed", &self.spec.seed);
        h.field("escalate", &self.spec.escalate);
        h.finish()
    }

    fn shape(&self) -> Shape<'_> {
        Shape {
            reads: Reads::Negatives(&self.reads),
            calls: Calls::Model {
                backend: &self.spec.judge.backend,
            },
            outputs: Outputs::Stored,
            then: self.spec.escalate.as_deref(),
            sends: Vec::new(),
        }
    }

    fn explain(&self, spec: &Spec, out: &mut String) {
        let a = &self.spec;
        let growth = match (a.max_miss_rate, a.max_sample) {
            (Some(rate), max) => format!(
                "; grows to {} per rung until the 95 % upper bound of the miss rate is at most {:.1} %",
                max.unwrap_or(a.sample),
                rate * 100.0
            ),
            (None, _) => String::new(),
        };
        let _ = writeln!(
            out,
            "  {} audit v{} samples {} negatives per rung of [{}] (seed {}){growth}",
            a.name,
            a.version,
            a.sample,
            a.rungs.join(", "),
            a.seed
        );
        if let Some(to) = &a.escalate {
            let _ = writeln!(out, "    a unit the judge disagrees on goes to `{to}`");
        }
        // The judge's own lines, under the audit's, without its name.
        let mut judge = String::new();
        self.judge.explain(spec, &mut judge);
        for (n, line) in judge.lines().enumerate() {
            let line = line.trim_start();
            let line = match n {
                0 => line
                    .strip_prefix(a.name.as_str())
                    .unwrap_or(line)
                    .trim_start(),
                _ => line,
            };
            let lead = if n == 0 { "judge: " } else { "  " };
            let _ = writeln!(out, "    {lead}{line}");
        }
    }

    fn count_cached(
        &self,
        _spec: &Spec,
        _spec_dir: &Path,
        _store: &Store,
        _table: &UnitTable,
        _units: &[usize],
    ) -> Result<CachedCount, RunError> {
        // The sample is drawn from what the earlier rungs end as negative,
        // which only a run knows.
        Ok(CachedCount {
            unknown: Some("the audit samples what the earlier rungs throw away".into()),
            ..CachedCount::default()
        })
    }

    fn run(
        &self,
        ctx: &mut StageContext<'_>,
        _units: Vec<usize>,
    ) -> Result<StageOutcome, RunError> {
        let a = &self.spec;
        let name = a.name.as_str();
        // Every sampled unit is judged: the judge runs under no contract.
        let judge_spec = crate::kit::uncontracted(ctx.spec);
        let verdicts = FactLedger::new(
            ctx.store,
            Controller::new(judge_spec.contract.clone()),
            None,
        );
        let mut report = AuditReport {
            max_miss_rate: a.max_miss_rate,
            seed: a.seed,
            escalate: a.escalate.clone(),
            ..AuditReport::default()
        };
        let mut disagreeing: Vec<usize> = Vec::new();
        let mut stop = None;
        let (hits, misses) = (ctx.stats.cache_hits, ctx.stats.cache_misses);
        for rung in &a.rungs {
            let Some(negatives) = ctx.negatives.get(rung) else {
                continue;
            };
            let hashed: Vec<(usize, ContentHash)> = negatives
                .units
                .iter()
                .map(|&i| Ok((i, ctx.table.unit(i)?.unit_hash)))
                .collect::<Result<_, RunError>>()?;
            let order = sample(a.seed, &hashed, self.reads.most);
            let sizes = match a.max_miss_rate {
                Some(_) => rounds(a.sample, self.reads.most, order.len()),
                None => vec![a.sample.min(order.len())],
            };
            let mut judged_to = 0usize;
            let mut audit = None;
            for size in sizes {
                // Round sizes never pass the rung's population.
                let Some(upto) = order.get(..size) else {
                    break;
                };
                let round: Vec<usize> = upto.get(judged_to..).unwrap_or_default().to_vec();
                judged_to = size;
                // An empty round (the rung is empty or already whole) loads
                // no judge.
                let ran = !round.is_empty();
                if ran {
                    let mut inner = ctx.for_turn(&judge_spec, &verdicts);
                    let outcome = self.judge.run(&mut inner, round)?;
                    if outcome.stop.is_some() {
                        stop = outcome.stop;
                    }
                }
                let r = rung_audit(
                    &verdicts,
                    name,
                    upto,
                    negatives.population,
                    ctx.table,
                    a.max_miss_rate,
                )?;
                let done = !ran || r.proven != Some(false) || stop.is_some();
                audit = Some(r);
                if done {
                    break;
                }
            }
            if let Some(r) = audit {
                disagreeing.extend(
                    order
                        .iter()
                        .take(r.sampled as usize)
                        .copied()
                        .filter(|&i| verdicts.status(i, name) == Some(Status::Positive)),
                );
                report.rungs.insert(rung.clone(), r);
            }
        }
        report.cached = ctx.stats.cache_hits - hits;
        (ctx.stats.cache_hits, ctx.stats.cache_misses) = (hits, misses);
        let (_, totals) = verdicts.into_parts();
        report.calls = totals.calls;
        ctx.stats.model_calls += totals.calls;
        ctx.stats.cost.add(&totals.cost);
        // A disagreement goes on to be judged, unless the stage it would go
        // to has judged it already (a map negative escalated to itself).
        let passed: Vec<usize> = match &a.escalate {
            Some(to) => {
                let mut seen = HashSet::new();
                let mut out: Vec<usize> = disagreeing
                    .into_iter()
                    .filter(|&i| seen.insert(i) && !ctx.ledger.has(i, to))
                    .collect();
                out.sort_unstable();
                out
            }
            None => Vec::new(),
        };
        report.escalated = passed.len() as u64;
        ctx.store.event(
            ctx.run_id,
            "audited",
            &serde_json::to_value(&report).unwrap_or_default(),
        )?;
        ctx.stats.reports.put(REPORT, name, &report);
        Ok(StageOutcome {
            passed,
            stop,
            ..StageOutcome::default()
        })
    }

    fn report_key(&self) -> Option<&'static str> {
        Some(REPORT)
    }

    fn shortfalls(&self, stats: &RunStats) -> Vec<String> {
        stats
            .reports
            .get::<AuditReport>(REPORT, self.name())
            .map(|r| r.shortfalls(self.name()))
            .unwrap_or_default()
    }

    fn answer_section(&self, stats: &RunStats, simulated: &str) -> Option<String> {
        let r = stats.reports.get::<AuditReport>(REPORT, self.name())?;
        Some(audit_section(self.name(), &r, simulated))
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// The audit of one rung after judging `sampled` (in sample order).
fn rung_audit(
    verdicts: &FactLedger<'_>,
    stage: &str,
    sampled: &[usize],
    population: u64,
    table: &UnitTable,
    max_miss_rate: Option<f64>,
) -> Result<RungAudit, RunError> {
    let mut judged = 0u64;
    let mut disagreeing = Vec::new();
    for &i in sampled {
        match verdicts.status(i, stage) {
            Some(Status::Positive) => {
                judged += 1;
                disagreeing.push(table.id(i)?.0.clone());
            }
            Some(Status::Negative) => judged += 1,
            _ => {}
        }
    }
    let miss = MissRate::measure(population, judged, disagreeing.len() as u64);
    Ok(RungAudit {
        proven: max_miss_rate.map(|limit| miss.high <= limit),
        sampled: sampled.len() as u64,
        undecided: sampled.len() as u64 - judged,
        disagreeing,
        miss,
    })
}

/// An audit's section of answer.md: each rung's miss rate with its
/// interval, the disagreements, and where they were sent.
fn audit_section(name: &str, audit: &AuditReport, sim: &str) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n## What was thrown away: audit `{name}`{sim}\n\nA seeded sample of each rung's negatives, judged again independently. The miss rate is the share the judge says should have been kept, with its 95 % interval{}.\n",
        match audit.max_miss_rate {
            Some(r) => format!("; the answer needs at most {:.1} %", r * 100.0),
            None => String::new(),
        }
    );
    let _ = writeln!(
        out,
        "| rung | thrown away | judged | disagreed | miss rate | 95 % interval | missed at most | shown |\n|---|---:|---:|---:|---:|---|---:|---|"
    );
    for (rung, r) in &audit.rungs {
        let m = &r.miss;
        let _ = writeln!(
            out,
            "| {rung} | {} | {} | {} | {:.1} % | {:.1}–{:.1} % | {} | {} |",
            m.population,
            m.judged,
            m.disagreements,
            m.rate * 100.0,
            m.low * 100.0,
            m.high * 100.0,
            m.missed_at_most(),
            match r.proven {
                Some(true) => "yes",
                Some(false) => "**no**",
                None => "-",
            }
        );
    }
    for (rung, r) in &audit.rungs {
        if !r.disagreeing.is_empty() {
            let _ = writeln!(
                out,
                "\n- `{rung}` disagreements: {}",
                r.disagreeing
                    .iter()
                    .map(|i| crate::output::md_text(i))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    if let Some(to) = &audit.escalate {
        let _ = writeln!(
            out,
            "- {} disagreements were sent to `{to}` and judged there; {} judge calls",
            audit.escalated, audit.calls
        );
    }
    out
}
