//! The audit stage: measure what the earlier rungs threw away.
//!
//! For each audited rung (the prefilter's exclusions, an embed stage's
//! drops, a map stage's negatives) the audit judges a seeded random sample
//! of its negatives with an independent judge: a map stage of its own
//! (rubric, schema, backend) whose positive values mean "this unit should
//! not have been thrown away". Each rung's miss rate is then bounded with
//! exact hypergeometric bounds, and the answer's recall against the judge
//! with them: the units found over those found plus the most every rung
//! can have missed. All bounds hold together with probability 1 - delta:
//! delta is split over the rungs, their strata and every look, so a sample
//! grown round by round (with `max_miss_rate` or `min_recall`, until they
//! are shown or the cap is reached) pays for looking again. A rung whose
//! units carry a score or a confidence gives half of each round to its
//! boundary, where misses gather. A unit the judge disagrees on may be
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
use fanfold_ops::audit::{MissRate, allocate, recall_at_least, rounds, sample};
use fanfold_ops::contract::Controller;
use fanfold_store::Store;
use serde::{Deserialize, Serialize};

use crate::error::PlanError;
use crate::error::RunError;
use crate::kit::ledger::FactLedger;
use crate::kit::{
    BuildContext, CachedCount, Calls, NegativeReads, Outputs, Reads, RunStats, Shape, Stage,
    StageContext, StageOutcome, Turn,
};
use crate::kit::{RungUnits, UnitTable};

pub struct AuditRunner {
    pub spec: AuditStageSpec,
    judge: Turn,
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
        if let Some(recall) = a.min_recall
            && !(recall > 0.0 && recall < 1.0)
        {
            return Err(ctx.invalid(format!(
                "audit `{}`: min_recall {recall} must be a fraction between 0 and 1 (0.9 is 90 %)",
                a.name
            )));
        }
        if !(a.delta > 0.0 && a.delta < 1.0) {
            return Err(ctx.invalid(format!(
                "audit `{}`: delta {} must be a probability between 0 and 1 (0.05 is 5 %)",
                a.name, a.delta
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
        let judge = Turn::build_judge(&judge, ctx)?;
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
    /// The rate each rung had to prove, if one was declared.
    pub max_miss_rate: Option<f64>,
    /// The recall the answer had to prove, if one was declared.
    #[serde(default)]
    pub min_recall: Option<f64>,
    /// The probability that any bound of this report is wrong.
    #[serde(default)]
    pub delta: f64,
    pub seed: u64,
    /// Per rung, in the order declared.
    pub rungs: BTreeMap<String, RungAudit>,
    /// The answer's recall against the judge.
    #[serde(default)]
    pub recall: Option<RecallBound>,
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
    /// With `max_miss_rate`: whether the rate's upper bound is under it.
    pub proven: Option<bool>,
    /// Looks the rung's sample was allowed (rounds of doubling); the
    /// level of each is divided by them.
    #[serde(default)]
    pub looks: u64,
}

/// The answer's recall against the audit's judge, at least.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RecallBound {
    /// Units the answer holds as positive when the audit ran.
    pub found: u64,
    /// The most units every audited rung can have missed, summed.
    pub missed_at_most: u64,
    /// Units thrown away by rungs the audit does not sample, or left
    /// undecided, all counted as missed: nothing bounds them.
    pub unaudited: u64,
    /// `found / (found + missed_at_most + unaudited)`.
    pub at_least: f64,
    /// With `min_recall`: whether `at_least` reaches it.
    pub proven: Option<bool>,
}

impl AuditReport {
    /// One line of what the audit proved of the answer's recall, for the
    /// top of answer.md.
    pub fn statement(&self, name: &str) -> Option<String> {
        let r = self.recall.as_ref()?;
        let verdict = match (self.min_recall, r.proven) {
            (Some(want), Some(true)) => format!("; the {:.1} % asked for holds", want * 100.0),
            (Some(want), _) => format!("; the {:.1} % asked for is UNMET", want * 100.0),
            (None, _) => String::new(),
        };
        Some(format!(
            "audit {name}: recall against its judge is at least {:.1} % with probability {:.0} % ({} found, at most {} missed{}){verdict}; it takes the answer's positives as right (their precision is not sampled) and is only as good as the judge",
            r.at_least * 100.0,
            (1.0 - self.delta) * 100.0,
            r.found,
            r.missed_at_most + r.unaudited,
            match r.unaudited {
                0 => String::new(),
                n => format!(", {n} of them where the audit does not look or nothing decided"),
            }
        ))
    }

    /// Why the audit leaves the answer incomplete, if it does.
    pub fn shortfalls(&self, name: &str) -> Vec<String> {
        let mut out = Vec::new();
        let level = (1.0 - self.delta) * 100.0;
        for (rung, r) in &self.rungs {
            if let (Some(limit), Some(false)) = (self.max_miss_rate, r.proven) {
                out.push(format!(
                    "audit `{name}` could not show that rung `{rung}` misses at most {:.1} % of what it threw away ({level:.0} % upper bound {:.1} % after judging {} of {})",
                    limit * 100.0,
                    r.miss.high * 100.0,
                    r.miss.judged,
                    r.miss.population
                ));
            }
        }
        if let (Some(want), Some(r)) = (self.min_recall, &self.recall)
            && r.proven == Some(false)
        {
            out.push(format!(
                "audit `{name}` could not show a recall of {:.1} % against its judge: at least {:.1} % with {level:.0} % confidence ({} found, up to {} missed by the audited rungs{})",
                want * 100.0,
                r.at_least * 100.0,
                r.found,
                r.missed_at_most,
                match r.unaudited {
                    0 => String::new(),
                    n => format!(", {n} thrown away where the audit does not look"),
                }
            ));
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
        h.field("min_recall", &self.spec.min_recall.map(|r| r.to_string()));
        h.field("delta", &self.spec.delta.to_string());
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
        let mut shown = Vec::new();
        if let Some(rate) = a.max_miss_rate {
            shown.push(format!("each rung misses at most {:.1} %", rate * 100.0));
        }
        if let Some(recall) = a.min_recall {
            shown.push(format!("recall is at least {:.1} %", recall * 100.0));
        }
        let growth = match shown.is_empty() {
            false => format!(
                "; grows to {} per rung until the bounds show that {}",
                a.max_sample.unwrap_or(a.sample),
                shown.join(" and ")
            ),
            true => String::new(),
        };
        let _ = writeln!(
            out,
            "  {} audit v{} samples {} negatives per rung of [{}] (seed {}){growth}; its bounds hold together with probability {:.0} % (delta {} over rungs, boundary strata and looks)",
            a.name,
            a.version,
            a.sample,
            a.rungs.join(", "),
            a.seed,
            (1.0 - a.delta) * 100.0,
            a.delta
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
            min_recall: a.min_recall,
            delta: a.delta,
            seed: a.seed,
            escalate: a.escalate.clone(),
            ..AuditReport::default()
        };
        let grows = a.max_miss_rate.is_some() || a.min_recall.is_some();
        let mut rungs = Vec::new();
        for rung in &a.rungs {
            let Some(negatives) = ctx.negatives.rungs.get(rung) else {
                continue;
            };
            rungs.push(RungSample::new(
                rung,
                negatives,
                ctx.table,
                a,
                self.reads.most,
                grows,
            )?);
        }
        // The level of every bound: delta split over the rungs, then over
        // each rung's looks (and, in `MissRate::measure`, its strata).
        let per_rung = a.delta / rungs.len().max(1) as f64;
        let mut stop = None;
        let (hits, misses) = (ctx.stats.cache_hits, ctx.stats.cache_misses);
        loop {
            // One judge turn per round, over every rung still growing.
            let mut round = Vec::new();
            for r in rungs.iter_mut().filter(|r| !r.done) {
                round.extend(r.grow());
            }
            round.sort_unstable();
            round.dedup();
            if !round.is_empty() {
                let mut inner = ctx.for_turn(&judge_spec, &verdicts);
                let views = self.judge.unit_views(inner.table)?;
                let stopped = self.judge.run(&mut inner, round, &views, &|_, _| {})?;
                if stopped.is_some() {
                    stop = stopped;
                }
            }
            for r in rungs.iter_mut().filter(|r| !r.done) {
                r.measure(&verdicts, name, ctx.table, per_rung, a.max_miss_rate)?;
            }
            let recall = recall_bound(&rungs, ctx.negatives, a.min_recall);
            let recall_shown = recall.proven != Some(false);
            for r in rungs.iter_mut().filter(|r| !r.done) {
                let rate_shown = r.audit.as_ref().is_none_or(|x| x.proven != Some(false));
                r.done = stop.is_some() || r.exhausted() || (rate_shown && recall_shown);
            }
            if rungs.iter().all(|r| r.done) {
                report.recall = Some(recall);
                break;
            }
        }
        let mut disagreeing: Vec<usize> = Vec::new();
        for r in rungs {
            disagreeing.extend(
                r.judged()
                    .filter(|&i| verdicts.status(i, name) == Some(Status::Positive)),
            );
            if let Some(audit) = r.audit {
                report.rungs.insert(r.name, audit);
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

    fn quality(&self, stats: &RunStats) -> Option<String> {
        stats
            .reports
            .get::<AuditReport>(REPORT, self.name())
            .and_then(|r| r.statement(self.name()))
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// Rungs smaller than this are sampled as one stratum: a boundary of one
/// or two units is not worth a share of the level.
const SMALLEST_STRATIFIED: usize = 8;

/// One rung's sample as it grows: its strata in sample order (the
/// boundary first), the round sizes it may reach, and what it has taken.
struct RungSample {
    name: String,
    /// Each stratum's population and its units in sample order.
    strata: Vec<(u64, Vec<usize>)>,
    sizes: Vec<usize>,
    /// The next round.
    look: usize,
    /// Units taken from each stratum so far.
    taken: Vec<usize>,
    audit: Option<RungAudit>,
    done: bool,
}

impl RungSample {
    fn new(
        name: &str,
        negatives: &RungUnits,
        table: &UnitTable,
        a: &AuditStageSpec,
        most: usize,
        grows: bool,
    ) -> Result<RungSample, RunError> {
        let ordered = |units: &[usize]| -> Result<Vec<usize>, RunError> {
            let hashed: Vec<(usize, ContentHash)> = units
                .iter()
                .map(|&i| Ok((i, table.unit(i)?.unit_hash)))
                .collect::<Result<_, RunError>>()?;
            Ok(sample(a.seed, &hashed, most))
        };
        let strata = match boundary(negatives) {
            Some((near, far)) => vec![
                (near.len() as u64, ordered(&near)?),
                (far.len() as u64, ordered(&far)?),
            ],
            None => vec![(negatives.population, ordered(&negatives.units)?)],
        };
        let available = strata.iter().map(|(_, order)| order.len()).sum();
        let sizes = match grows {
            true => rounds(a.sample, most, available),
            false => vec![a.sample.min(available)],
        };
        Ok(RungSample {
            name: name.to_owned(),
            taken: vec![0; strata.len()],
            strata,
            sizes,
            look: 0,
            audit: None,
            done: false,
        })
    }

    /// The units of the next round, not judged before.
    fn grow(&mut self) -> Vec<usize> {
        let Some(&size) = self.sizes.get(self.look) else {
            return Vec::new();
        };
        self.look += 1;
        let want = match self.strata.as_slice() {
            [(_, near), (_, far)] => {
                let (n, f) = allocate(size, near.len(), far.len());
                vec![n, f]
            }
            _ => self
                .strata
                .iter()
                .map(|(_, order)| size.min(order.len()))
                .collect(),
        };
        let mut out = Vec::new();
        for (((_, order), taken), want) in self.strata.iter().zip(&mut self.taken).zip(want) {
            out.extend(order.get(*taken..want).unwrap_or_default());
            *taken = want.max(*taken);
        }
        out
    }

    fn exhausted(&self) -> bool {
        self.look >= self.sizes.len()
    }

    /// Every unit taken so far, stratum by stratum, in sample order.
    fn judged(&self) -> impl Iterator<Item = usize> + '_ {
        self.strata
            .iter()
            .zip(&self.taken)
            .flat_map(|((_, order), &taken)| order.iter().take(taken).copied())
    }

    /// The rung's audit after what was judged so far; its bounds fail
    /// with probability `per_rung`, shared by its looks.
    fn measure(
        &mut self,
        verdicts: &FactLedger<'_>,
        stage: &str,
        table: &UnitTable,
        per_rung: f64,
        max_miss_rate: Option<f64>,
    ) -> Result<(), RunError> {
        let alpha = per_rung / self.sizes.len().max(1) as f64;
        let (mut counts, mut disagreeing) = (Vec::new(), Vec::new());
        let (mut sampled, mut decided) = (0u64, 0u64);
        for ((population, order), &taken) in self.strata.iter().zip(&self.taken) {
            let (mut judged, mut against, mut unsure) = (0u64, 0u64, 0u64);
            for &i in order.iter().take(taken) {
                match verdicts.status(i, stage) {
                    Some(Status::Positive) => {
                        judged += 1;
                        against += 1;
                        disagreeing.push(table.id(i)?.0.clone());
                    }
                    Some(Status::Negative) => judged += 1,
                    _ => unsure += 1,
                }
            }
            // A sampled unit the judge could not decide is counted as a
            // miss: hard units are where misses gather, so leaving it out
            // would make the sample look better than the rung.
            counts.push((*population, judged + unsure, against + unsure));
            sampled += taken as u64;
            decided += judged;
        }
        let miss = MissRate::measure(&counts, alpha);
        self.audit = Some(RungAudit {
            proven: max_miss_rate.map(|limit| miss.high <= limit),
            sampled,
            undecided: sampled - decided,
            disagreeing,
            miss,
            looks: self.sizes.len() as u64,
        });
        Ok(())
    }
}

/// A rung's boundary (the quarter of its negatives nearest being kept)
/// and the rest, when the rung is held whole and every unit says how near
/// it came; `None` when it cannot be told apart.
fn boundary(negatives: &RungUnits) -> Option<(Vec<usize>, Vec<usize>)> {
    let units = &negatives.units;
    if units.len() < SMALLEST_STRATIFIED || units.len() as u64 != negatives.population {
        return None;
    }
    let mut ranked: Vec<(f64, usize)> = units
        .iter()
        .map(|&i| Some((*negatives.nearness.get(&i)?, i)))
        .collect::<Option<_>>()?;
    ranked.sort_by(|x, y| y.0.total_cmp(&x.0).then(x.1.cmp(&y.1)));
    let (first, last) = (ranked.first()?.0, ranked.last()?.0);
    if first == last {
        return None;
    }
    let far = ranked.split_off(units.len().div_ceil(4));
    Some((
        ranked.into_iter().map(|(_, i)| i).collect(),
        far.into_iter().map(|(_, i)| i).collect(),
    ))
}

/// The answer's recall against the judge, from every rung's bound.
fn recall_bound(
    rungs: &[RungSample],
    negatives: &crate::kit::Negatives,
    min_recall: Option<f64>,
) -> RecallBound {
    let missed: u64 = rungs
        .iter()
        .filter_map(|r| r.audit.as_ref())
        .map(|a| a.miss.missed_at_most)
        .sum();
    let at_least = recall_at_least(negatives.found, missed + negatives.elsewhere);
    RecallBound {
        found: negatives.found,
        missed_at_most: missed,
        unaudited: negatives.elsewhere,
        at_least,
        proven: min_recall.map(|want| at_least >= want),
    }
}

/// An audit's section of answer.md: each rung's miss rate with its
/// interval, the disagreements, and where they were sent.
fn audit_section(name: &str, audit: &AuditReport, sim: &str) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let level = (1.0 - audit.delta) * 100.0;
    let _ = writeln!(
        out,
        "\n## What was thrown away: audit `{name}`{sim}\n\nA seeded sample of each rung's negatives, judged again independently. The miss rate is the share of what a rung threw away that the judge says should have been kept (a sampled unit the judge cannot decide counts as kept); its bounds are exact for sampling without replacement. Every upper bound here, and so the recall bound, holds together with probability {level:.0} % (split over rungs, boundary strata and each look of a growing sample); each lower end is a one-sided bound at the same level. The recall bound takes the answer's own positives as right: their precision is not sampled{}.\n",
        match audit.max_miss_rate {
            Some(r) => format!("; each rung must miss at most {:.1} %", r * 100.0),
            None => String::new(),
        }
    );
    let _ = writeln!(
        out,
        "| rung | thrown away | judged | disagreed | miss rate | bounds | missed at most | shown |\n|---|---:|---:|---:|---:|---|---:|---|"
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
            m.missed_at_most,
            match r.proven {
                Some(true) => "yes",
                Some(false) => "**no**",
                None => "-",
            }
        );
    }
    for (rung, r) in &audit.rungs {
        if let [near, rest] = r.miss.strata.as_slice() {
            let _ = writeln!(
                out,
                "\n- `{rung}` was sampled by stratum: its boundary (the {} negatives nearest being kept) {} of {} judged, {} disagreed; the rest {} of {} judged, {} disagreed",
                near.population,
                near.judged,
                near.population,
                near.disagreements,
                rest.judged,
                rest.population,
                rest.disagreements
            );
        }
    }
    if let Some(r) = &audit.recall {
        let _ = writeln!(
            out,
            "\n**Recall against the judge: at least {:.1} %**{} ({} found; at most {} missed by the audited rungs{}).",
            r.at_least * 100.0,
            match (audit.min_recall, r.proven) {
                (Some(want), Some(true)) =>
                    format!(", which shows the {:.1} % asked for", want * 100.0),
                (Some(want), _) => format!(", **short of the {:.1} % asked for**", want * 100.0),
                (None, _) => String::new(),
            },
            r.found,
            r.missed_at_most,
            match r.unaudited {
                0 => String::new(),
                n => format!(
                    "; {n} thrown away by rungs the audit does not sample or left undecided, all counted as missed"
                ),
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
                    .map(|i| crate::markdown::md_text(i))
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
