//! The cascade a map stage may declare (`cascade = { ... }`): an earlier
//! stage's score of each unit (the proxy) decides the units it is proven
//! sure of, the oracle decides the rest, and the declared target holds
//! with probability at least 1 − δ (`fanfold_ops::cascade`).
//!
//! The oracle is the stage's own backend, or a labels file. With the
//! backend, the labels are the stage's own facts: the units the cascade
//! may ask about are judged first, through the stage's slots and its
//! cache, so a rerun asks again only for a unit whose view changed. With
//! a labels file, a unit the cascade leaves to the oracle that has no
//! label is not decided, and the target is unmet.

use std::collections::HashMap;

use fanfold_core::spec::{CascadeSpec, MapStageSpec, QualityMetric, StageSpec};
use fanfold_core::{
    ContentHash, Cost, FACT_SCHEMA, FactRecord, ModelParams, StableHash, Status, UnitId,
};
use fanfold_ops::cascade::{self, Config, Decision, Metric, Plan, Target};
use fanfold_ops::map::MapStage;
use fanfold_ops::view::INPUT_BUCKET;
use serde::{Deserialize, Serialize};

use crate::error::{PlanError, RunError};
use crate::kit::ledger::Origin;
use crate::kit::{BuildContext, RunStats, StageContext, StageOutcome};

/// The stage's model turn over some of its units.
pub(crate) type Judge<'a> =
    dyn FnMut(&mut StageContext<'_>, Vec<usize>) -> Result<StageOutcome, RunError> + 'a;

/// The key of cascade reports in the run's stats.
pub const REPORT: &str = "cascades";

/// A declared cascade, checked, with its labels file read.
pub(crate) struct CascadeRun {
    spec: CascadeSpec,
    /// Unit id -> the label's decision: `Some(positive)`, or `None` for an
    /// abstaining label.
    labels: Option<HashMap<String, Option<bool>>>,
}

/// What a cascade did and proved, for the certificate and answer.md.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CascadeReport {
    /// `recall ≥ 0.9 with probability ≥ 0.9`, as the answer states it.
    pub target: String,
    pub proxy: String,
    pub oracle: String,
    pub plan: Option<Plan>,
    pub units: usize,
    /// Distinct labels the oracle gave to set the thresholds.
    pub labels: usize,
    pub proxy_decided: usize,
    /// Units left to the oracle beyond the labelled ones, and the calls
    /// that took (one per distinct view).
    pub left_to_oracle: usize,
    pub oracle_calls: usize,
    /// Distinct views of the stage's units: the calls without a cascade.
    pub calls_without: usize,
    pub estimate: f64,
    pub lower_bound: f64,
    /// Chosen on every label, not on a bound.
    pub exact: bool,
    /// Units left to a labels oracle that has no label for them.
    pub unlabelled: usize,
    /// The guarantee holds: every unit the proxy did not decide was
    /// decided by the oracle.
    pub met: bool,
}

impl CascadeReport {
    /// One line of what is known of the stage's quality.
    pub fn statement(&self, stage: &str) -> String {
        let how = match (&self.plan, self.exact) {
            (Some(Plan::OracleDecidesAll) | None, _) => {
                "nothing was proven of the proxy: the oracle decides every unit".to_owned()
            }
            (_, true) => format!(
                "exactly {:.3} on every label, the proxy deciding {} units",
                self.estimate, self.proxy_decided
            ),
            (_, false) => format!(
                "estimated {:.3}, at least {:.3} proven, the proxy deciding {} units",
                self.estimate, self.lower_bound, self.proxy_decided
            ),
        };
        let verdict = if self.met { "holds" } else { "is UNMET" };
        format!(
            "stage {stage}: {} {verdict}; {how}; {} labels and {} oracle calls against {} without the cascade",
            self.target, self.labels, self.oracle_calls, self.calls_without
        )
    }
}

fn metric(m: QualityMetric) -> Metric {
    match m {
        QualityMetric::Recall => Metric::Recall,
        QualityMetric::Precision => Metric::Precision,
        QualityMetric::Accuracy => Metric::Accuracy,
    }
}

impl CascadeRun {
    pub(crate) fn build(
        s: &MapStageSpec,
        c: &CascadeSpec,
        ctx: &mut BuildContext<'_>,
    ) -> Result<CascadeRun, PlanError> {
        let stage = &s.name;
        let invalid = |ctx: &BuildContext<'_>, what: String| {
            ctx.invalid(format!("stage `{stage}` cascade: {what}"))
        };
        let position = |name: &str| ctx.spec.stages.iter().position(|d| d.name() == name);
        let me = position(stage);
        if !matches!(
            me.and_then(|i| ctx.spec.stages.get(i)),
            Some(StageSpec::Map(_))
        ) {
            return Err(invalid(
                ctx,
                "a cascade belongs to a map stage of the spec, not to a judge inside another stage"
                    .into(),
            ));
        }
        if !matches!((me, position(&c.proxy)), (Some(me), Some(p)) if p < me) {
            return Err(invalid(
                ctx,
                format!(
                    "the proxy `{}` is not a stage declared before this one",
                    c.proxy
                ),
            ));
        }
        if !c.score.starts_with('/') {
            return Err(invalid(
                ctx,
                format!(
                    "score `{}` must be a JSON pointer such as \"/score\"",
                    c.score
                ),
            ));
        }
        if !(c.at_least > 0.0 && c.at_least <= 1.0) {
            return Err(invalid(
                ctx,
                format!("at_least must be in (0, 1], got {}", c.at_least),
            ));
        }
        if !(c.delta > 0.0 && c.delta < 1.0) {
            return Err(invalid(
                ctx,
                format!("delta must be in (0, 1), got {}", c.delta),
            ));
        }
        if c.label_budget == 0 {
            return Err(invalid(ctx, "label_budget must be at least 1".into()));
        }
        let labels = match &c.labels {
            None => None,
            Some(file) => {
                let text = ctx.read("labels", file)?;
                let labels = read_labels(s, file, &text).map_err(|e| invalid(ctx, e))?;
                ctx.hashed.insert(format!("labels:{stage}"), text);
                Some(labels)
            }
        };
        Ok(CascadeRun {
            spec: c.clone(),
            labels,
        })
    }

    fn target(&self) -> Target {
        Target {
            metric: metric(self.spec.target),
            at_least: self.spec.at_least,
            delta: self.spec.delta,
        }
    }

    fn target_text(&self) -> String {
        let t = self.target();
        format!(
            "{} ≥ {} with probability ≥ {}",
            t.metric.name(),
            t.at_least,
            1.0 - t.delta
        )
    }

    pub(crate) fn explain(&self, stage: &MapStageSpec) -> String {
        let oracle = match &self.spec.labels {
            Some(f) => format!("the labels in `{f}`"),
            None => format!("the stage's backend `{}`", stage.backend),
        };
        format!(
            "cascade: {}; the proxy is `{}`'s `{}`, the oracle {oracle}, at most {} labels",
            self.target_text(),
            self.spec.proxy,
            self.spec.score,
            self.spec.label_budget
        )
    }

    /// Runs the cascade over `units` for the map `stage`, recording a fact
    /// for each: `view` is what the stage shows a unit, `cites` what its
    /// fact cites, and `judge` runs the stage's model turn over units.
    pub(crate) fn run(
        &self,
        stage: &MapStage,
        ctx: &mut StageContext<'_>,
        units: Vec<usize>,
        view: &dyn Fn(usize) -> Result<serde_json::Value, RunError>,
        cites: &dyn Fn(usize) -> (Vec<UnitId>, Vec<ContentHash>),
        judge: &mut Judge<'_>,
    ) -> Result<StageOutcome, RunError> {
        let name = stage.name().to_owned();
        let c = &self.spec;
        // A scoring stage publishes every unit's score; any other stage's
        // facts are read at the pointer.
        let mut by_unit = ctx.ledger.numbers(&c.proxy, &c.score);
        if let Some(published) = ctx
            .shared
            .get::<crate::kit::UnitScores>()
            .and_then(|s| s.of(&c.proxy))
        {
            by_unit.extend(published.iter().map(|(&i, &s)| (i, s)));
        }
        let mut scores = Vec::with_capacity(units.len());
        let mut keys = Vec::with_capacity(units.len());
        let mut view_keys = Vec::with_capacity(units.len());
        for &i in &units {
            let Some(&score) = by_unit.get(&i) else {
                return Err(RunError::Cascade {
                    stage: name,
                    unit: ctx.table.unit(i)?.unit_id.0.clone(),
                    detail: format!("the proxy `{}` gave it no number at `{}`", c.proxy, c.score),
                });
            };
            scores.push(score);
            let key = view(i)?.key_in(INPUT_BUCKET);
            keys.push(u64::from_le_bytes(
                *key.0.first_chunk::<8>().unwrap_or(&[0; 8]),
            ));
            view_keys.push(key);
        }
        let cut = c.cut.unwrap_or_else(|| median(&scores));
        let config = Config {
            cut,
            ..Config::new(self.target(), c.label_budget, c.seed)
        };
        let mut outcome = StageOutcome::default();
        // The backend as oracle: every unit the cascade may ask about is
        // judged first, through the stage's slots and its cache.
        let asked: Vec<usize> = match &self.labels {
            Some(_) => Vec::new(),
            None => cascade::label_draws(&config, &scores, &keys)
                .into_iter()
                .filter_map(|p| units.get(p).copied())
                .collect(),
        };
        if !asked.is_empty() {
            merge(&mut outcome, judge(ctx, asked)?);
        }
        let ledger = ctx.ledger;
        let table = ctx.table;
        let file = self.labels.as_ref();
        let mut oracle = |p: usize| -> Option<bool> {
            let i = *units.get(p)?;
            match file {
                Some(labels) => {
                    let id = table.unit(i).ok()?.unit_id.0.clone();
                    labels.get(&id).copied().flatten()
                }
                None => match ledger.status(i, &name)? {
                    Status::Positive => Some(true),
                    Status::Negative => Some(false),
                    _ => None,
                },
            }
        };
        let result =
            cascade::run(&config, &scores, &keys, &mut oracle).map_err(|e| RunError::Cascade {
                stage: name.clone(),
                unit: "-".into(),
                detail: e.to_string(),
            })?;
        let threshold = match &result.plan {
            Plan::Threshold { threshold } => format!("score ≥ {threshold:.4}"),
            Plan::Band { low, high } => {
                format!("score < {low:.4} negative, ≥ {high:.4} positive")
            }
            Plan::OracleDecidesAll => "none".into(),
        };
        let mut left = Vec::new();
        let mut unlabelled = 0;
        for (p, d) in result.decisions.iter().enumerate() {
            let (Some(&i), Some(&score)) = (units.get(p), scores.get(p)) else {
                continue;
            };
            let made = |positive: bool, by: &str, reason: String| {
                let decision = if positive {
                    stage.spec.decision.positive.first()
                } else {
                    stage.spec.decision.negative.first()
                };
                let key = view_keys.get(p).copied().unwrap_or(ContentHash([0; 32]));
                let status = if positive {
                    Status::Positive
                } else {
                    Status::Negative
                };
                FactRecord {
                    decision: decision.cloned(),
                    facts: serde_json::json!({
                        "decided_by": by,
                        "proxy": c.proxy,
                        "score": score,
                        "plan": threshold,
                    }),
                    ..derived_fact(
                        stage,
                        c.seed,
                        &format!("cascade\0{name}\0{key}\0{by}"),
                        format!("{by}:{}", c.proxy),
                        cites(i),
                        status,
                        reason,
                    )
                }
            };
            match *d {
                Decision::Proxy { positive } => ctx.ledger.record(
                    i,
                    made(
                        positive,
                        "proxy",
                        format!(
                            "decided by the proxy `{}` (score {score:.4}; {threshold}) under {}",
                            c.proxy,
                            self.target_text()
                        ),
                    ),
                    Origin::Derived,
                ),
                Decision::Label { positive } => {
                    if let Some(f) = &c.labels {
                        ctx.ledger.record(
                            i,
                            made(positive, "label", format!("labelled in `{f}`")),
                            Origin::Derived,
                        );
                    }
                }
                Decision::Oracle => left.push(i),
            }
        }
        match &c.labels {
            None => {
                if !left.is_empty() {
                    merge(&mut outcome, judge(ctx, left)?);
                }
            }
            Some(f) => {
                for &i in &left {
                    unlabelled += 1;
                    ctx.ledger.record(
                        i,
                        derived_fact(
                            stage,
                            c.seed,
                            &format!("cascade\0{name}\0unlabelled\0{i}"),
                            format!("label:{f}"),
                            cites(i),
                            Status::NotRun,
                            format!(
                                "left to the oracle by the cascade, and `{f}` has no label for it"
                            ),
                        ),
                        Origin::Derived,
                    );
                }
            }
        }
        let distinct = keys.iter().collect::<std::collections::HashSet<_>>().len();
        let report = CascadeReport {
            target: self.target_text(),
            proxy: c.proxy.clone(),
            oracle: match &c.labels {
                Some(f) => format!("labels file `{f}`"),
                None => format!("backend `{}`", stage.spec.backend),
            },
            plan: Some(result.plan.clone()),
            units: units.len(),
            labels: result.labels,
            proxy_decided: result.proxy_decided,
            left_to_oracle: result.oracle_units,
            oracle_calls: result.oracle_calls(),
            calls_without: distinct,
            estimate: result.estimate,
            lower_bound: result.lower_bound,
            exact: result.exact,
            unlabelled,
            met: unlabelled == 0,
        };
        ctx.stats.reports.put(REPORT, &name, &report);
        Ok(outcome)
    }
}

/// A fact the cascade makes of a unit (never stored, never paid for):
/// the stage's identity, what it cites, a status and why.
fn derived_fact(
    stage: &MapStage,
    seed: u64,
    key: &str,
    model_id: String,
    (source_ids, source_hashes): (Vec<UnitId>, Vec<ContentHash>),
    status: Status,
    reason: String,
) -> FactRecord {
    FactRecord {
        schema: FACT_SCHEMA.into(),
        key: ContentHash::of_bytes(key.as_bytes()),
        source_ids,
        source_hashes,
        stage: stage.name().to_owned(),
        stage_version: stage.spec.version,
        rubric_hash: stage.definition_hash(),
        model: ModelParams {
            backend: "cascade".into(),
            model_id,
            temperature: 0.0,
            max_output_tokens: 0,
            seed,
            simulated: false,
        },
        status,
        decision: None,
        facts: serde_json::Value::Null,
        confidence: None,
        choice_scores: Vec::new(),
        reason: Some(reason),
        evidence: Vec::new(),
        cost: Cost::default(),
        attempts: 0,
        reducer_path: Vec::new(),
        truncated_tokens: 0,
    }
}

fn merge(into: &mut StageOutcome, from: StageOutcome) {
    for (k, v) in from.escalated {
        into.escalated.entry(k).or_default().extend(v);
    }
    for (k, v) in from.sent {
        into.sent.entry(k).or_default().extend(v);
    }
    into.passed.extend(from.passed);
    if into.stop.is_none() {
        into.stop = from.stop;
    }
}

fn median(scores: &[f64]) -> f64 {
    let mut s = scores.to_vec();
    s.sort_by(f64::total_cmp);
    s.get(s.len() / 2).copied().unwrap_or(0.0)
}

/// The labels file: one `{"id": ..., "decision": ...}` a line, the
/// decision one of the stage's values.
fn read_labels(
    s: &MapStageSpec,
    file: &str,
    text: &str,
) -> Result<HashMap<String, Option<bool>>, String> {
    let d = &s.decision;
    let mut out = HashMap::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let at = |what: &str| format!("`{file}` line {}: {what}", n + 1);
        let v: serde_json::Value =
            serde_json::from_str(line).map_err(|e| at(&format!("not JSON ({e})")))?;
        let id = match v.get("id") {
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(serde_json::Value::Number(n)) => n.to_string(),
            _ => return Err(at("needs an `id`, a string or a number")),
        };
        let decision = v
            .get("decision")
            .and_then(serde_json::Value::as_str)
            .ok_or_else(|| at("needs a string `decision`"))?;
        let label = if d.positive.iter().any(|x| x == decision) {
            Some(true)
        } else if d.negative.iter().any(|x| x == decision) {
            Some(false)
        } else if d.abstain.iter().any(|x| x == decision) {
            None
        } else {
            return Err(at(&format!(
                "decision {decision:?} is not one of the stage's decision values"
            )));
        };
        if out.insert(id.clone(), label).is_some() {
            return Err(at(&format!("unit {id} is labelled twice")));
        }
    }
    Ok(out)
}

/// The statement of the stage's quality in the run's stats, if it ran a
/// cascade.
pub(crate) fn quality(stats: &RunStats, stage: &str) -> Option<String> {
    stats
        .reports
        .get::<CascadeReport>(REPORT, stage)
        .map(|r| r.statement(stage))
}

/// Why the answer is not whole, by the stage's cascade.
pub(crate) fn shortfalls(stats: &RunStats, stage: &str) -> Vec<String> {
    match stats.reports.get::<CascadeReport>(REPORT, stage) {
        Some(r) if !r.met => vec![format!(
            "stage `{stage}`'s quality target ({}) is unmet: {} units the cascade left to the oracle have no label",
            r.target, r.unlabelled
        )],
        _ => Vec::new(),
    }
}

/// The stage's cascade as a section of answer.md.
pub(crate) fn answer_section(stats: &RunStats, stage: &str) -> Option<String> {
    let r = stats.reports.get::<CascadeReport>(REPORT, stage)?;
    let plan = match &r.plan {
        Some(Plan::Threshold { threshold }) => {
            format!("the proxy decides every unit: positive at score ≥ {threshold:.4}")
        }
        Some(Plan::Band { low, high }) => format!(
            "the proxy decides scores below {low:.4} (negative) and from {high:.4} (positive); the oracle the band between"
        ),
        Some(Plan::OracleDecidesAll) | None => {
            "the oracle decides every unit (nothing was proven of the proxy)".into()
        }
    };
    let bound = if r.exact {
        format!("{:.3}, exact: every label was known", r.estimate)
    } else {
        format!("{:.3}, proven at least {:.3}", r.estimate, r.lower_bound)
    };
    Some(format!(
        "## Quality of `{stage}`: {}\n\n- Target: {}; the guarantee {}.\n- Plan: {plan}.\n- Estimate: {bound}.\n- Proxy: `{}`; oracle: {}.\n- Labels spent: {}; units the proxy decided: {} of {}; left to the oracle: {}.\n- Oracle calls: {} against {} without the cascade ({} saved).\n",
        r.target,
        r.target,
        if r.met { "holds" } else { "is UNMET" },
        r.proxy,
        r.oracle,
        r.labels,
        r.proxy_decided,
        r.units,
        r.left_to_oracle,
        r.oracle_calls,
        r.calls_without,
        r.calls_without.saturating_sub(r.oracle_calls),
    ))
}
