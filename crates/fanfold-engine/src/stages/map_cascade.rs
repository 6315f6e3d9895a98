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
//!
//! With a person as the oracle, labels live in the store under a key of
//! the stage's question and what the unit shows ([`label_key`]). A run
//! that lacks some lists them in `labels-wanted.jsonl` for `fanfold
//! label OUT_DIR` and decides nothing it cannot prove: first the draws
//! that set the thresholds (the first round whole, then each round the
//! proof still asks for on the labels given), then, once the proof ends,
//! the units it leaves to the oracle. Each rerun asks only for what is
//! missing.
//!
//! A trained proxy (`proxy = "trained"`) is fitted on labels chosen where
//! it is unsure by default (`fit = "active"`, `fanfold_ops::proxy::
//! next_round`): a labels file answers every round at once, the backend
//! judges each round before the next is chosen, and a person gives one
//! round a run (the run waits for it, as for the thresholds' draws). The
//! proof's draws are its own, made on the fitted scores.

use std::collections::HashMap;
use std::sync::Mutex;

use fanfold_core::spec::{
    BackendSpec, CascadeOracle, CascadeSpec, Decode, MapStageSpec, ProxyFit, QualityMetric,
    StageSpec, TRAINED_PROXY,
};
use fanfold_core::{
    ContentHash, Cost, FACT_SCHEMA, FactRecord, ModelParams, StableHash, Status, UnitId,
};
use fanfold_ops::cascade::{self, Config, Decision, Metric, Plan, Target};
use fanfold_ops::cascade_accept;
use fanfold_ops::map::ModelTurn;
use fanfold_ops::proxy::{Rounds, TrainedReport};
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
    /// Labels a person oracle has yet to give, in the order asked.
    wanted: Mutex<Vec<WantedLabel>>,
    /// With a trained proxy: the embed stage whose vectors it reads.
    features: Option<Box<super::embed::EmbedRunner>>,
    /// With a map stage as the proxy: that stage, whose scored decisions
    /// give each unit its probability of being positive.
    scorer: Option<Box<crate::kit::Turn>>,
}

/// The file a run lists the labels it waits for in.
pub const WANTED_FILE: &str = "labels-wanted.jsonl";

/// A label a cascade waits for from a person: one line of
/// [`WANTED_FILE`], everything `fanfold label` shows and stores.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WantedLabel {
    pub stage: String,
    pub id: String,
    /// The store key the label goes under ([`label_key`]).
    pub key: ContentHash,
    /// The stage's rubric: the question the label answers.
    pub question: String,
    /// The decisions a label may take: the positive values, then the
    /// negative ones.
    pub decisions: Vec<String>,
    /// What the stage shows of the unit.
    pub view: serde_json::Value,
    /// Why a person is asked: to set the thresholds (within the label
    /// budget), or because the plan leaves the unit to the oracle (past
    /// it).
    #[serde(default)]
    pub asked_for: AskedFor,
    /// The stage's declared label budget.
    #[serde(default)]
    pub label_budget: usize,
    /// The cascade's seed, which says how a lower level is proven on new
    /// labels ([`lower_level_hint`]).
    #[serde(default)]
    pub seed: u64,
}

/// Why a person is asked for a label.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AskedFor {
    /// A draw that sets the thresholds (or trains the proxy): counted in
    /// the label budget.
    #[default]
    Thresholds,
    /// A unit the proven plan leaves to the oracle, since the proxy is not
    /// proven sure of it: past the label budget.
    Oracle,
}

/// What the user's accepted level did to a cascade's target.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AcceptedLevel {
    /// The declared target's level and the level the user accepted.
    pub declared_at_least: f64,
    pub accepted_at_least: f64,
    /// Where the accepted level was set: `accept_at_least` in the spec,
    /// or `--accept` on the command line.
    pub by: String,
    /// The level came from the command line (`--accept`), which is where
    /// a level read off a run's frontier is given: it is taken as chosen
    /// after the labels were seen, and the probability does not cover it.
    /// A spec's `accept_at_least` is taken as written before the labels.
    #[serde(default)]
    pub after_labels: bool,
    /// The cascade's seed: a new one draws new labels, on which a level
    /// chosen after seeing these is proven cleanly.
    #[serde(default)]
    pub seed: u64,
    /// What the labels proved at the declared level: its plan, the units
    /// it lets the proxy decide, and the level proven for it.
    pub declared_plan: Plan,
    pub declared_proxy_decided: usize,
    pub declared_lower_bound: f64,
    /// What they prove at the accepted level.
    pub accepted_plan: Plan,
    pub accepted_proxy_decided: usize,
    /// Labels the proof at the accepted level reached for that the
    /// declared proof had not asked: never asked, counted as the worst.
    pub not_asked: usize,
}

impl AcceptedLevel {
    /// What choosing the level costs, as the answer says it.
    pub fn cost(&self, delta: f64) -> String {
        let covered = if self.after_labels {
            format!(
                "This level was given with --accept after a run had shown the frontier of these labels, so it was chosen by them: the probability {} does not cover it, and the chance the answer falls below it is not bounded by δ. {}",
                1.0 - delta,
                self.clean_proof()
            )
        } else {
            format!(
                "So the probability {} covers {} as a level set before the labels were drawn (an accept_at_least written into the spec before its first run); a level read off the frontier of these same labels is chosen by them, and the chance the answer falls below it is not bounded by δ. {}",
                1.0 - delta,
                self.accepted_at_least,
                self.clean_proof()
            )
        };
        format!(
            "the answer uses the plan the accepted level's proof chose, whatever the declared proof chose, so it rests on that one test; the accepted level is proven by the same test as the declared one, on the same labels, at the same δ = {delta}; no label was added and no model was asked again. The levels of the frontier are not one confidence sequence: each is proven by its own plan's test, each at δ on its own. {covered}"
        )
    }

    /// How to prove a level chosen after seeing the labels at 1 − δ: fix
    /// it first, then draw new labels.
    pub fn clean_proof(&self) -> String {
        clean_proof(&self.accepted_at_least.to_string(), self.seed)
    }
}

/// How a lower level than the declared one is had, for a reader who has
/// seen this run's labels: answered on them, it is chosen by them; proven
/// cleanly, it is fixed first and proven on new labels.
pub fn lower_level_hint(seed: u64) -> String {
    format!(
        "one read off the run's frontier (answer.md) and given with --accept is answered on these labels, and the answer says it was chosen after the labels were seen, which the probability does not cover. {}",
        clean_proof("LEVEL", seed)
    )
}

/// How to prove `level` at the target's probability once it was chosen
/// from a run's labels: fixed in the spec, then proven on labels a new
/// seed draws.
pub fn clean_proof(level: &str, seed: u64) -> String {
    format!(
        "For a proof at that probability, write `accept_at_least = {level}` into the cascade with a new `seed` (it is {seed} now) and run again: the new seed asks for new labels, drawn after the level was fixed"
    )
}

/// The store key of a label: the stage's question and what the unit shows.
pub fn label_key(stage: &ModelTurn, view_key: &ContentHash) -> ContentHash {
    let mut h = fanfold_core::StableHasher::new(fanfold_core::Bucket::Kind("cascade-label-v1"));
    h.field("rubric", &stage.rubric_hash)
        .field("view", view_key);
    h.finish()
}

/// What a cascade did and proved, for the certificate and answer.md.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CascadeReport {
    /// `recall ≥ 0.9 with probability ≥ 0.9`, as the answer states it.
    pub target: String,
    /// The level of the target in force: the declared one, or the level
    /// the user accepted in its place.
    #[serde(default)]
    pub at_least: f64,
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
    /// Labels a person is asked for in `labels-wanted.jsonl`.
    #[serde(default)]
    pub wanted: usize,
    /// With a trained proxy: what its fit did, how its labels were
    /// chosen and how many each round asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trained: Option<TrainedReport>,
    /// With a trained proxy: the ids of the units whose labels it was
    /// fitted on, in the order they were asked.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fitted_on: Vec<String>,
    /// The guarantee holds: every unit the proxy did not decide was
    /// decided by the oracle.
    pub met: bool,
    /// What the labels proved of plans from the chosen one on: the share
    /// of units each lets the proxy decide and the level proven for it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub frontier: Vec<cascade::FrontierPoint>,
    /// About how many more labels the next plan would need for the
    /// target; `None` when the labels point away from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub more_labels: Option<usize>,
    /// The declared label budget.
    #[serde(default)]
    pub label_budget: usize,
    /// Of `wanted`, the labels a person is asked for past the budget: the
    /// units the plan leaves to the oracle.
    #[serde(default)]
    pub wanted_past_budget: usize,
    /// The δ of the target.
    #[serde(default)]
    pub delta: f64,
    /// The cascade's seed, which draws its labels.
    #[serde(default)]
    pub seed: u64,
    /// A lower level the user accepted (`accept_at_least`, `--accept`),
    /// and what it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accepted: Option<AcceptedLevel>,
}

impl CascadeReport {
    /// One line of what is known of the stage's quality.
    pub fn statement(&self, stage: &str) -> String {
        let how = match (&self.plan, self.exact) {
            (None, _) if self.wanted > 0 => format!(
                "it waits for {} labels from a person: give them with fanfold label and run again",
                self.wanted
            ),
            (Some(Plan::OracleDecidesAll) | None, _) => {
                "nothing was proven of the proxy: the oracle decides every unit".to_owned()
            }
            (_, true) => format!(
                "exactly {:.3} on every label, the proxy deciding {} units",
                self.estimate, self.proxy_decided
            ),
            (_, false) if self.accepted.as_ref().is_some_and(|a| a.after_labels) => format!(
                "estimated {:.3}, at least {:.3} on the labels that chose the level, the proxy deciding {} units",
                self.estimate, self.lower_bound, self.proxy_decided
            ),
            (_, false) => format!(
                "estimated {:.3}, at least {:.3} proven, the proxy deciding {} units",
                self.estimate, self.lower_bound, self.proxy_decided
            ),
        };
        let verdict = match (&self.accepted, self.met) {
            (Some(a), true) if a.after_labels => "passes its test on the labels that chose it",
            (_, true) => "holds",
            (_, false) => "is UNMET",
        };
        let lowered = match &self.accepted {
            Some(a) if a.after_labels => format!(
                "; the declared target {} ≥ {} was LOWERED by the user to {} ({}), a level CHOSEN AFTER THE LABELS WERE SEEN, which the probability does not cover. {}",
                self.metric(),
                a.declared_at_least,
                a.accepted_at_least,
                a.by,
                a.clean_proof()
            ),
            Some(a) => format!(
                "; the declared target {} ≥ {} was LOWERED by the user to {} ({}), which the probability covers only as a level set before the labels were drawn",
                self.metric(),
                a.declared_at_least,
                a.accepted_at_least,
                a.by
            ),
            None => String::new(),
        };
        let past = if self.wanted_past_budget > 0 {
            format!(
                "; a person is asked for {} labels past the label budget of {}: the units the plan leaves to the oracle, which the labels did not prove the proxy sure of",
                self.wanted_past_budget, self.label_budget
            )
        } else {
            String::new()
        };
        format!(
            "stage {stage}: {} {verdict}{lowered}; {how}; {} labels and {} oracle calls against {} without the cascade{past}",
            self.target, self.labels, self.oracle_calls, self.calls_without
        )
    }

    /// The target holds at a level declared before the labels were drawn:
    /// met, and not a level given on the command line after a run showed
    /// the labels' frontier. Only such a level is called proven.
    pub fn proven(&self) -> bool {
        self.met && !self.accepted.as_ref().is_some_and(|a| a.after_labels)
    }

    /// The target's metric, as its text names it.
    pub fn metric(&self) -> &str {
        const JOINT: &str = "recall and precision";
        if self.target.starts_with(JOINT) {
            return JOINT;
        }
        self.target.split_whitespace().next().unwrap_or("quality")
    }
}

fn metric(m: QualityMetric) -> Metric {
    match m {
        QualityMetric::Recall => Metric::Recall,
        QualityMetric::Precision => Metric::Precision,
        QualityMetric::Accuracy => Metric::Accuracy,
        QualityMetric::RecallAndPrecision => Metric::RecallAndPrecision,
    }
}

impl CascadeRun {
    /// `scorer` is the proxy's model turn when the proxy is a map stage.
    pub(crate) fn build(
        s: &MapStageSpec,
        c: &CascadeSpec,
        ctx: &mut BuildContext<'_>,
        scorer: Option<Box<crate::kit::Turn>>,
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
        let features = match (c.proxy == TRAINED_PROXY, &c.features) {
            (true, Some(f)) => {
                let embed = ctx.spec.stages.iter().find_map(|d| match d {
                    StageSpec::Embed(e) if &e.name == f => Some(e.clone()),
                    _ => None,
                });
                let Some(embed) = embed else {
                    return Err(invalid(
                        ctx,
                        format!("features `{f}` is not an embed stage of this spec"),
                    ));
                };
                Some(Box::new(super::embed::EmbedRunner::build(&embed, ctx)?))
            }
            (true, None) => {
                return Err(invalid(
                    ctx,
                    "a trained proxy needs `features`: the embed stage whose vectors it reads"
                        .into(),
                ));
            }
            (false, Some(_)) => {
                return Err(invalid(
                    ctx,
                    format!(
                        "`features` is for proxy = \"{TRAINED_PROXY}\"; the proxy `{}` scores on its own",
                        c.proxy
                    ),
                ));
            }
            (false, None) => None,
        };
        if features.is_none()
            && let Some(fit) = c.fit
        {
            return Err(invalid(
                ctx,
                format!(
                    "fit = \"{}\" chooses a trained proxy's labels; the proxy `{}` is not trained",
                    fit.name(),
                    c.proxy
                ),
            ));
        }
        if features.is_some() && c.label_budget < 2 {
            return Err(invalid(
                ctx,
                "a trained proxy needs label_budget ≥ 2: half trains it, the rest sets its thresholds"
                    .into(),
            ));
        }
        let scorer = match ctx.spec.stages.iter().find(|d| d.name() == c.proxy) {
            Some(StageSpec::Map(m)) if features.is_none() => {
                if &m.name == stage {
                    return Err(invalid(ctx, "the proxy cannot be the stage itself".into()));
                }
                if m.cascade.is_some() {
                    return Err(invalid(
                        ctx,
                        format!("the proxy `{}` declares a cascade of its own", m.name),
                    ));
                }
                let logprobs = matches!(
                    ctx.spec.backends.get(&m.backend),
                    Some(BackendSpec::Openai(h)) if h.logprobs
                );
                if m.decode != Decode::Choice && !logprobs {
                    return Err(invalid(
                        ctx,
                        format!(
                            "the proxy `{}` is a map stage whose decisions are not scored: give it decode = \"choice\", or an OpenAI-compatible backend with logprobs = true",
                            m.name
                        ),
                    ));
                }
                scorer
            }
            _ => None,
        };
        if features.is_none()
            && scorer.is_none()
            && !matches!((me, position(&c.proxy)), (Some(me), Some(p)) if p < me)
        {
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
        if let Some(level) = c.accept_at_least
            && !(level > 0.0 && level < c.at_least)
        {
            return Err(invalid(
                ctx,
                format!(
                    "accept_at_least must be above 0 and below at_least ({}), got {level}",
                    c.at_least
                ),
            ));
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
        if c.oracle == CascadeOracle::Person && c.labels.is_some() {
            return Err(invalid(
                ctx,
                "oracle = \"person\" and a labels file are two oracles: keep one".into(),
            ));
        }
        Ok(CascadeRun {
            spec: c.clone(),
            labels,
            wanted: Mutex::new(Vec::new()),
            features,
            scorer,
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
        self.target_text_at(self.spec.at_least)
    }

    /// The target's text at level `at_least`.
    fn target_text_at(&self, at_least: f64) -> String {
        let t = self.target();
        format!(
            "{} ≥ {} with probability ≥ {}",
            t.metric.name(),
            at_least,
            1.0 - t.delta
        )
    }

    /// The text of a level chosen after the labels were seen: no
    /// probability is claimed for it.
    fn chosen_level_text(&self, at_least: f64) -> String {
        format!(
            "{} ≥ {} (chosen after the labels were seen)",
            self.target().metric.name(),
            at_least
        )
    }

    /// Where the accepted level was set.
    fn accepted_by(&self) -> &'static str {
        if self.spec.accept_from_command_line {
            "--accept on the command line"
        } else {
            "accept_at_least in the spec"
        }
    }

    pub(crate) fn explain(&self, stage: &MapStageSpec) -> String {
        let oracle = match (&self.spec.labels, self.spec.oracle) {
            (Some(f), _) => format!("the labels in `{f}`"),
            (None, CascadeOracle::Person) => {
                "a person (`fanfold label OUT_DIR` stores the labels a run asks for)".to_owned()
            }
            (None, CascadeOracle::Backend) => format!("the stage's backend `{}`", stage.backend),
        };
        let proxy = match &self.spec.features {
            Some(f) => format!(
                "a logistic regression over `{f}`'s embeddings, cross-fitted over {} folds on the first {} labels, {}",
                fanfold_ops::proxy::FOLDS,
                self.training_labels(),
                self.fit_text()
            ),
            None if self.scorer.is_some() => format!(
                "`{}`'s scored probability of a positive decision (run over the stage's units)",
                self.spec.proxy
            ),
            None => format!("`{}`'s `{}`", self.spec.proxy, self.spec.score),
        };
        let accepted = match self.spec.accept_at_least {
            Some(level) => format!(
                "; the user accepts {level} ({}): the answer uses the plan the same test proves at that level on the same labels, and says the target was lowered from {}{}",
                self.accepted_by(),
                self.spec.at_least,
                if self.spec.accept_from_command_line {
                    "; a level given on the command line is taken as chosen after the labels were seen, which the probability does not cover"
                } else {
                    ""
                }
            ),
            None => String::new(),
        };
        format!(
            "cascade: {}; the proxy is {proxy}, the oracle {oracle}, at most {} labels{accepted}",
            self.target_text(),
            self.spec.label_budget
        )
    }

    /// Runs the cascade over `units` for the map `stage`, recording a fact
    /// for each: `view` is what the stage shows a unit, `cites` what its
    /// fact cites, and `judge` runs the stage's model turn over units.
    pub(crate) fn run(
        &self,
        stage: &ModelTurn,
        ctx: &mut StageContext<'_>,
        units: Vec<usize>,
        view: &dyn Fn(usize) -> Result<serde_json::Value, RunError>,
        cites: &dyn Fn(usize) -> (Vec<UnitId>, Vec<ContentHash>),
        judge: &mut Judge<'_>,
    ) -> Result<StageOutcome, RunError> {
        let name = stage.name().to_owned();
        let c = &self.spec;
        let mut keys = Vec::with_capacity(units.len());
        let mut view_keys = Vec::with_capacity(units.len());
        for &i in &units {
            let key = view(i)?.key_in(INPUT_BUCKET);
            keys.push(u64::from_le_bytes(
                *key.0.first_chunk::<8>().unwrap_or(&[0; 8]),
            ));
            view_keys.push(key);
        }
        let mut outcome = StageOutcome::default();
        // The backend as oracle: every unit the cascade may ask about is
        // judged first, through the stage's slots and its cache.
        let person = self.labels.is_none() && c.oracle == CascadeOracle::Person;
        let ledger = ctx.ledger;
        // A unit the cascade leaves undecided: `not_run`, saying why.
        let undecided = |i: usize, tag: &str, oracle: String, reason: String| {
            ledger.record(
                i,
                derived_fact(
                    stage,
                    c.seed,
                    &format!("cascade\0{name}\0{tag}\0{i}"),
                    oracle,
                    cites(i),
                    Status::NotRun,
                    reason,
                ),
                Origin::Derived,
            );
        };
        if let Ok(mut w) = self.wanted.lock() {
            w.clear();
        }
        // A person's labels, by position: none, or the decision given
        // (`None` inside for one that is neither positive nor negative).
        let mut stored: Vec<Option<Option<bool>>> = Vec::new();
        if person {
            for key in &view_keys {
                let label = ctx.store.get_label(&label_key(stage, key))?;
                stored.push(label.map(|l| {
                    let d = &stage.spec.decision;
                    if d.positive.contains(&l.decision) {
                        Some(true)
                    } else if d.negative.contains(&l.decision) {
                        Some(false)
                    } else {
                        None
                    }
                }));
            }
        }
        // A person who has yet to give labels the run needs first: each
        // unit waits, and the report says for how many.
        let waiting = |ctx: &mut StageContext<'_>,
                       missing: &[usize],
                       labels: usize,
                       trained: Option<TrainedReport>| {
            let wanted = self.want(
                stage,
                ctx,
                (&units, &view_keys),
                missing,
                view,
                AskedFor::Thresholds,
            )?;
            for &i in &units {
                undecided(
                    i,
                    "waiting",
                    "label:person".into(),
                    format!(
                        "the cascade waits for {wanted} labels from a person before it decides ({WANTED_FILE}; `fanfold label OUT_DIR`)"
                    ),
                );
            }
            let report = CascadeReport {
                target: self.target_text(),
                proxy: c.proxy.clone(),
                oracle: "a person".into(),
                plan: None,
                units: units.len(),
                labels,
                calls_without: keys.iter().collect::<std::collections::HashSet<_>>().len(),
                unlabelled: units.len(),
                wanted,
                label_budget: c.label_budget,
                delta: c.delta,
                seed: c.seed,
                at_least: c.at_least,
                met: false,
                trained,
                ..CascadeReport::default()
            };
            ctx.stats.reports.put(REPORT, &name, &report);
            Ok::<_, RunError>(StageOutcome::default())
        };
        let (scores, trained) = match &self.features {
            None if self.scorer.is_some() => {
                let (scores, turn) = self.scored_choices(ctx, &units)?;
                merge(&mut outcome, turn);
                (scores, None)
            }
            None => (self.proxy_scores(ctx, stage, &units)?, None),
            Some(embed) => {
                let vectors = super::embed::unit_vectors(
                    embed,
                    ctx.table,
                    &units,
                    ctx.store,
                    Some(super::embed::embedders(ctx, &embed.stage)?),
                )?;
                let vectors: Vec<Vec<f32>> = vectors.into_iter().flatten().collect();
                let proxy_failed = |e: fanfold_ops::proxy::ProxyError| RunError::Cascade {
                    stage: name.clone(),
                    unit: "-".into(),
                    detail: format!("the trained proxy: {e}"),
                };
                let fit = c.fit.unwrap_or_default();
                let budget = self.training_labels();
                let rounds = Rounds::of(budget);
                // The fit's labels, round by round: a labels file answers
                // every round at once; the backend judges each round before
                // the next is chosen; a person gives one round a run, and
                // the run waits for it.
                let mut training: Vec<usize> = Vec::new();
                let mut asked: Vec<usize> = Vec::new();
                // A random sample, and every round of an active fit when a
                // labels file answers them, are known before any is asked.
                let up_front = fit == ProxyFit::Random || self.labels.is_some();
                let mut known_rounds = match fit {
                    ProxyFit::Random => {
                        vec![fanfold_ops::proxy::training_draws(&keys, budget, c.seed)]
                    }
                    ProxyFit::Active if up_front => {
                        fanfold_ops::proxy::active_rounds(&vectors, &keys, rounds, c.seed, |p| {
                            self.label(ctx, &name, &units, &stored, p)
                        })
                        .map_err(&proxy_failed)?
                    }
                    ProxyFit::Active => Vec::new(),
                }
                .into_iter();
                loop {
                    let round = if up_front {
                        known_rounds.next().unwrap_or_default()
                    } else {
                        fanfold_ops::proxy::next_round(
                            &vectors,
                            &keys,
                            rounds,
                            c.seed,
                            &training,
                            |p| self.label(ctx, &name, &units, &stored, p),
                        )
                        .map_err(&proxy_failed)?
                    };
                    if round.is_empty() {
                        break;
                    }
                    if person {
                        let missing: Vec<usize> = round
                            .iter()
                            .copied()
                            .filter(|&p| stored.get(p).is_some_and(Option::is_none))
                            .collect();
                        if !missing.is_empty() {
                            // The classifier's next round is chosen on
                            // these: nothing is decided until they are
                            // given.
                            asked.push(round.len());
                            let so_far = TrainedReport {
                                fit: Some(fit),
                                rounds: asked,
                                ..TrainedReport::default()
                            };
                            let given = training.len() + round.len() - missing.len();
                            return waiting(ctx, &missing, given, Some(so_far));
                        }
                    } else if self.labels.is_none() {
                        let judged: Vec<usize> = round
                            .iter()
                            .filter_map(|&p| units.get(p).copied())
                            .collect();
                        merge(&mut outcome, judge(ctx, judged)?);
                    }
                    asked.push(round.len());
                    training.extend(round);
                }
                let (scores, mut report) =
                    fanfold_ops::proxy::fit_on(&vectors, &keys, &training, |p| {
                        self.label(ctx, &name, &units, &stored, p)
                    })
                    .map_err(&proxy_failed)?;
                report.fit = Some(fit);
                report.rounds = asked;
                (scores, Some((report, training)))
            }
        };
        let cut = c.cut.unwrap_or_else(|| median(&scores));
        // A trained proxy's own labels count against the budget; what is
        // left may be none, and then the proof asks for none (the oracle
        // decides every unit).
        let spent = trained.as_ref().map_or(0, |(_, t)| t.len());
        let config = Config {
            cut,
            ..Config::new(self.target(), c.label_budget.saturating_sub(spent), c.seed)
        };
        if person {
            let known = |p: usize| stored.get(p).copied().flatten();
            let asked =
                person_sitting(&config, &scores, &keys, &known).map_err(|e| RunError::Cascade {
                    stage: name.clone(),
                    unit: "-".into(),
                    detail: e.to_string(),
                })?;
            let missing: Vec<usize> = asked
                .iter()
                .copied()
                .filter(|&p| stored.get(p).is_some_and(Option::is_none))
                .collect();
            if !missing.is_empty() {
                // The thresholds need these first: nothing is decided
                // until they are given.
                let given: std::collections::HashSet<u64> = keys
                    .iter()
                    .zip(&stored)
                    .filter(|(_, label)| label.is_some())
                    .map(|(&key, _)| key)
                    .collect();
                return waiting(
                    ctx,
                    &missing,
                    given.len(),
                    trained.as_ref().map(|(report, _)| report.clone()),
                );
            }
        }
        if self.labels.is_none() && !person {
            // The backend as oracle: the units each round of the cascade
            // asks about are judged first, in bulk through the slots, and
            // the cascade asked again, until it can finish: the model
            // labels exactly what the proof asks.
            let mut judged: std::collections::HashSet<usize> = std::collections::HashSet::new();
            loop {
                let known = |p: usize| {
                    judged
                        .contains(&p)
                        .then(|| self.label(ctx, &name, &units, &stored, p))
                };
                let fresh: Vec<usize> = cascade::next_labels(&config, &scores, &keys, &known)
                    .map_err(|e| RunError::Cascade {
                        stage: name.clone(),
                        unit: "-".into(),
                        detail: e.to_string(),
                    })?
                    .into_iter()
                    .filter(|p| !judged.contains(p))
                    .collect();
                if fresh.is_empty() {
                    break;
                }
                judged.extend(fresh.iter().copied());
                let asked = fresh
                    .iter()
                    .filter_map(|&p| units.get(p).copied())
                    .collect();
                merge(&mut outcome, judge(ctx, asked)?);
            }
        }
        let mut oracle = |p: usize| self.label(ctx, &name, &units, &stored, p);
        let failed = |detail: String| RunError::Cascade {
            stage: name.clone(),
            unit: "-".into(),
            detail,
        };
        // A level the user accepts is proven on the labels the declared
        // target's proof was given, and the answer is its plan, so it
        // rests on that one test. The frontier shown is the declared
        // proof's: what the labels proved from its plan on, which is what
        // a level is accepted from.
        let (result, accepted, frontier) = match c.accept_at_least {
            None => {
                let result = cascade::run(&config, &scores, &keys, &mut oracle)
                    .map_err(|e| failed(e.to_string()))?;
                let frontier = result.frontier.clone();
                (result, None, frontier)
            }
            Some(level) => {
                let a = cascade_accept::accept(&config, level, &scores, &keys, &mut oracle)
                    .map_err(|e| failed(e.to_string()))?;
                let accepted = AcceptedLevel {
                    declared_at_least: c.at_least,
                    accepted_at_least: level,
                    by: self.accepted_by().into(),
                    after_labels: c.accept_from_command_line,
                    seed: c.seed,
                    declared_plan: a.declared.plan.clone(),
                    declared_proxy_decided: a.declared.proxy_decided,
                    declared_lower_bound: a.declared.lower_bound,
                    accepted_plan: a.accepted.plan.clone(),
                    accepted_proxy_decided: a.accepted.proxy_decided,
                    not_asked: a.not_asked,
                };
                let frontier = a.declared.frontier.clone();
                (a.accepted, Some(accepted), frontier)
            }
        };
        // The target the answer holds to: the declared one, or the level
        // the user accepted in its place.
        let (at_least, in_force) = match &accepted {
            Some(a) if a.after_labels => (
                a.accepted_at_least,
                self.chosen_level_text(a.accepted_at_least),
            ),
            Some(a) => (
                a.accepted_at_least,
                self.target_text_at(a.accepted_at_least),
            ),
            None => (c.at_least, self.target_text()),
        };
        let threshold = match &result.plan {
            Plan::Threshold { threshold } => format!("score ≥ {threshold:.4}"),
            Plan::Band { low, high } => {
                format!("score < {low:.4} negative, ≥ {high:.4} positive")
            }
            Plan::DropBelow { threshold } => format!("score < {threshold:.4} negative"),
            Plan::KeepFrom { threshold } => format!("score ≥ {threshold:.4} positive"),
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
            // A unit the trained proxy was fitted on keeps its label: the
            // oracle answered for it (a labels file's or a person's; the
            // backend's fact is recorded already and stands).
            let known = match (&trained, d) {
                (Some((_, training)), Decision::Proxy { .. }) if training.contains(&p) => {
                    self.label(ctx, &name, &units, &stored, p)
                }
                _ => None,
            };
            if let Some(positive) = known {
                let how = match &c.labels {
                    Some(f) => format!("labelled in `{f}`"),
                    None if person => "labelled by a person".into(),
                    None => format!("judged by `{}`", stage.spec.backend),
                };
                ctx.ledger
                    .record(i, made(positive, "label", how), Origin::Derived);
                continue;
            }
            match *d {
                Decision::Proxy { positive } => ctx.ledger.record(
                    i,
                    made(
                        positive,
                        "proxy",
                        format!(
                            "decided by the proxy `{}` (score {score:.4}; {threshold}) under {in_force}",
                            c.proxy,
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
                    } else if person {
                        ctx.ledger.record(
                            i,
                            made(positive, "label", "labelled by a person".into()),
                            Origin::Derived,
                        );
                    }
                }
                Decision::Oracle if person => match stored.get(p).copied().flatten().flatten() {
                    Some(positive) => ctx.ledger.record(
                        i,
                        made(positive, "label", "labelled by a person".into()),
                        Origin::Derived,
                    ),
                    None => left.push(i),
                },
                // A labels file answers every unit left to the oracle that
                // it holds a label for, drawn or not.
                Decision::Oracle => match (&c.labels, self.label(ctx, &name, &units, &stored, p)) {
                    (Some(f), Some(positive)) => ctx.ledger.record(
                        i,
                        made(positive, "label", format!("labelled in `{f}`")),
                        Origin::Derived,
                    ),
                    _ => left.push(i),
                },
            }
        }
        let mut wanted = 0;
        let mut wanted_past_budget = 0;
        match &c.labels {
            // Measuring asks the oracle nothing past the labels: a person
            // is never asked for the units a candidate's plan leaves.
            None if c.measure_only => {
                for &i in &left {
                    undecided(
                        i,
                        "measured",
                        if person {
                            "label:person".into()
                        } else {
                            format!("backend:{}", stage.spec.backend)
                        },
                        "left to the oracle; not judged, since `fanfold plan` measures what a proxy proves".into(),
                    );
                }
            }
            None if person => {
                // What the proof leaves to the oracle and a person has not
                // labelled yet: asked for now, undecided until then.
                let at: HashMap<usize, usize> =
                    units.iter().enumerate().map(|(p, &i)| (i, p)).collect();
                let positions: Vec<usize> =
                    left.iter().filter_map(|i| at.get(i).copied()).collect();
                wanted = self.want(
                    stage,
                    ctx,
                    (&units, &view_keys),
                    &positions,
                    view,
                    AskedFor::Oracle,
                )?;
                wanted_past_budget = wanted;
                for &i in &left {
                    unlabelled += 1;
                    undecided(
                        i,
                        "unlabelled",
                        "label:person".into(),
                        format!(
                            "left to the oracle by the cascade, and no person has labelled it yet ({WANTED_FILE}; `fanfold label OUT_DIR`)"
                        ),
                    );
                }
            }
            None => {
                if !left.is_empty() {
                    merge(&mut outcome, judge(ctx, left)?);
                }
                // A unit the backend was asked about and could not decide
                // (an error, an abstention) is not a label the proof or
                // the answer may count on: the target is then unmet.
                unlabelled += (0..units.len())
                    .filter(|&p| self.label(ctx, &name, &units, &stored, p).is_none())
                    .count();
            }
            Some(f) => {
                for &i in &left {
                    unlabelled += 1;
                    undecided(
                        i,
                        "unlabelled",
                        format!("label:{f}"),
                        format!("left to the oracle by the cascade, and `{f}` has no label for it"),
                    );
                }
            }
        }
        // What the oracle was asked, once per view: a trained proxy's own
        // labels, and every draw when the backend or a person is asked
        // for them all up front (the thresholds may be proven before the
        // last is read). A labels file is read only where the cascade
        // looks.
        let spent = match &trained {
            Some((_, training)) => Some(training.as_slice()),
            None if self.labels.is_none() => Some(&[][..]),
            None => None,
        }
        .map(|training| fanfold_ops::proxy::spent(&keys, training, &result));
        let distinct = keys.iter().collect::<std::collections::HashSet<_>>().len();
        let report = CascadeReport {
            target: in_force,
            proxy: c.proxy.clone(),
            oracle: match &c.labels {
                Some(f) => format!("labels file `{f}`"),
                None if person => "a person".into(),
                None => format!("backend `{}`", stage.spec.backend),
            },
            plan: Some(result.plan.clone()),
            units: units.len(),
            labels: spent.map_or(result.labels, |(labels, _)| labels),
            proxy_decided: result.proxy_decided,
            left_to_oracle: result.oracle_units,
            oracle_calls: spent.map_or(result.oracle_calls(), |(_, calls)| calls),
            calls_without: distinct,
            estimate: result.estimate,
            lower_bound: result.lower_bound,
            exact: result.exact,
            unlabelled,
            wanted,
            met: unlabelled == 0,
            fitted_on: match &trained {
                Some((_, training)) => training
                    .iter()
                    .filter_map(|&p| units.get(p))
                    .map(|&i| Ok(ctx.table.unit(i)?.unit_id.0.clone()))
                    .collect::<Result<Vec<_>, RunError>>()?,
                None => Vec::new(),
            },
            trained: trained.map(|(report, _)| report),
            frontier,
            more_labels: result.more_labels,
            label_budget: c.label_budget,
            wanted_past_budget,
            delta: c.delta,
            seed: c.seed,
            at_least,
            accepted,
        };
        ctx.stats.reports.put(REPORT, &name, &report);
        Ok(outcome)
    }
}

impl CascadeRun {
    /// Lists the units at `positions` (of `units`, whose views have
    /// `view_keys`) for a person to label, once per label key, in order;
    /// returns how many were listed.
    fn want(
        &self,
        stage: &ModelTurn,
        ctx: &StageContext<'_>,
        (units, view_keys): (&[usize], &[ContentHash]),
        positions: &[usize],
        view: &dyn Fn(usize) -> Result<serde_json::Value, RunError>,
        asked_for: AskedFor,
    ) -> Result<usize, RunError> {
        let decisions: Vec<String> = stage
            .spec
            .decision
            .positive
            .iter()
            .chain(&stage.spec.decision.negative)
            .cloned()
            .collect();
        let mut seen = std::collections::HashSet::new();
        let mut lines = Vec::new();
        for &p in positions {
            let (Some(&i), Some(vk)) = (units.get(p), view_keys.get(p)) else {
                continue;
            };
            let key = label_key(stage, vk);
            if !seen.insert(key) {
                continue;
            }
            lines.push(WantedLabel {
                stage: stage.name().to_owned(),
                id: ctx.table.unit(i)?.unit_id.0.clone(),
                key,
                question: stage.rubric.clone(),
                decisions: decisions.clone(),
                view: view(i)?,
                asked_for,
                label_budget: self.spec.label_budget,
                seed: self.spec.seed,
            });
        }
        let n = lines.len();
        if let Ok(mut w) = self.wanted.lock() {
            w.extend(lines);
        }
        Ok(n)
    }

    /// How a trained proxy's labels are chosen, as explain says it.
    fn fit_text(&self) -> String {
        match self.spec.fit.unwrap_or_default() {
            ProxyFit::Random => "a seeded random sample (fit = \"random\")".to_owned(),
            ProxyFit::Active => {
                let r = Rounds::of(self.training_labels());
                let later = (r.labels - r.first).div_ceil(r.each.max(1));
                format!(
                    "chosen where it is unsure (fit = \"active\"): {} at random, then {later} rounds of up to {} the model of the labels so far scores nearest its cut, each labelled before the next is chosen{}",
                    r.first,
                    r.each,
                    if self.asks_a_person() {
                        " (a person gives one round a run)"
                    } else {
                        ""
                    }
                )
            }
        }
    }

    /// Labels a trained proxy is fitted on.
    fn training_labels(&self) -> usize {
        fanfold_ops::proxy::training_budget(self.spec.label_budget)
    }

    /// Each unit's score from the proxy stage: published by a scoring
    /// stage, or read from its facts at the pointer.
    fn proxy_scores(
        &self,
        ctx: &mut StageContext<'_>,
        stage: &ModelTurn,
        units: &[usize],
    ) -> Result<Vec<f64>, RunError> {
        let c = &self.spec;
        let mut by_unit = ctx.ledger.numbers(&c.proxy, &c.score);
        if let Some(published) = ctx
            .shared
            .get::<crate::kit::UnitScores>()
            .and_then(|s| s.of(&c.proxy))
        {
            by_unit.extend(published.iter().map(|(&i, &s)| (i, s)));
        }
        units
            .iter()
            .map(|&i| match by_unit.get(&i) {
                Some(&score) => Ok(score),
                None => Err(RunError::Cascade {
                    stage: stage.name().to_owned(),
                    unit: ctx.table.unit(i)?.unit_id.0.clone(),
                    detail: format!("the proxy `{}` gave it no number at `{}`", c.proxy, c.score),
                }),
            })
            .collect()
    }

    /// Each unit's probability of a positive decision by the map stage
    /// that is the proxy, from its scored choices. Its model turn runs over
    /// `units` first, through its own slots and cache. A unit it could not
    /// score (an error, a budget that ran out) is given 0.5: any score
    /// fixed before the labels keeps the guarantee, which only ranks by it.
    fn scored_choices(
        &self,
        ctx: &mut StageContext<'_>,
        units: &[usize],
    ) -> Result<(Vec<f64>, StageOutcome), RunError> {
        let Some(scorer) = &self.scorer else {
            return Ok((vec![0.5; units.len()], StageOutcome::default()));
        };
        let views = scorer.unit_views(ctx.table)?;
        let turn = StageOutcome {
            stop: scorer.run(ctx, units.to_vec(), &views, &|_, _| {})?,
            ..StageOutcome::default()
        };
        let by_unit = ctx
            .ledger
            .positive_probabilities(scorer.name(), &scorer.model.spec.decision.positive);
        let unscored = units.iter().filter(|i| !by_unit.contains_key(i)).count();
        if unscored > 0 {
            tracing::warn!(
                proxy = scorer.name(),
                unscored,
                "units the proxy could not score are given 0.5"
            );
        }
        let scores = units
            .iter()
            .map(|i| by_unit.get(i).copied().unwrap_or(0.5))
            .collect();
        Ok((scores, turn))
    }

    /// The oracle's label of the unit at position `p`, where it has one:
    /// a person's stored label, the labels file's, or the stage's own fact.
    fn label(
        &self,
        ctx: &StageContext<'_>,
        name: &str,
        units: &[usize],
        stored: &[Option<Option<bool>>],
        p: usize,
    ) -> Option<bool> {
        let i = *units.get(p)?;
        if self.asks_a_person() {
            return stored.get(p).copied().flatten().flatten();
        }
        match &self.labels {
            Some(labels) => {
                let id = ctx.table.unit(i).ok()?.unit_id.0.clone();
                labels.get(&id).copied().flatten()
            }
            None => match ctx.ledger.status(i, name)? {
                Status::Positive => Some(true),
                Status::Negative => Some(false),
                _ => None,
            },
        }
    }

    /// Whether a person is the oracle.
    pub(crate) fn asks_a_person(&self) -> bool {
        self.labels.is_none() && self.spec.oracle == CascadeOracle::Person
    }

    /// The lines of [`WANTED_FILE`], when a person is asked for labels.
    pub(crate) fn wanted_lines(&self) -> Vec<serde_json::Value> {
        self.wanted
            .lock()
            .map(|w| {
                w.iter()
                    .filter_map(|l| serde_json::to_value(l).ok())
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// A fact the cascade makes of a unit (never stored, never paid for):
/// the stage's identity, what it cites, a status and why.
fn derived_fact(
    stage: &ModelTurn,
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
        digest: None,
    }
}

/// The labels a person is asked for in one sitting, of those that set the
/// thresholds (`known(p)`: `None` while unit `p` has no stored label):
/// what the proof still asks on the labels given, a round at a time
/// ([`cascade::next_labels`]), so a proof that ends early asks nothing
/// more. Before any is given that is the first round whole, the list
/// [`cascade::label_draws`] gives: a batch to sit down to. Listing every
/// draw the budget allows once the first round is in would ask for
/// labels the proof never reads.
fn person_sitting(
    config: &Config,
    scores: &[f64],
    keys: &[u64],
    known: &dyn Fn(usize) -> Option<Option<bool>>,
) -> Result<Vec<usize>, cascade::CascadeError> {
    cascade::next_labels(config, scores, keys, known)
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
pub fn read_labels(
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
        Some(r) if !r.met && r.wanted > 0 => vec![format!(
            "stage `{stage}`'s quality target ({}) waits for a person: {} units are undecided until the {} labels in {WANTED_FILE} are given (fanfold label, then run again){}",
            r.target,
            r.unlabelled,
            r.wanted,
            past_budget(&r)
        )],
        Some(r) if !r.met => vec![format!(
            "stage `{stage}`'s quality target ({}) is unmet: {} units the cascade needed the oracle for have no label (none given, or the oracle could not decide them)",
            r.target, r.unlabelled
        )],
        _ => Vec::new(),
    }
}

/// What a person is asked past the label budget, and why, as a clause;
/// empty when nothing is.
fn past_budget(r: &CascadeReport) -> String {
    if r.wanted_past_budget == 0 {
        return String::new();
    }
    format!(
        "; {} of these labels are PAST the label budget of {}: the proof spent the budget, and the plan it proved leaves these units to the oracle because the labels did not prove the proxy sure of them{}",
        r.wanted_past_budget,
        r.label_budget,
        if r.accepted.is_some() {
            String::new()
        } else {
            format!(
                " (a lower level leaves fewer: {})",
                lower_level_hint(r.seed)
            )
        }
    )
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
        Some(Plan::DropBelow { threshold }) => {
            format!("the proxy decides scores below {threshold:.4} (negative); the oracle the rest")
        }
        Some(Plan::KeepFrom { threshold }) => {
            format!("the proxy decides scores from {threshold:.4} (positive); the oracle the rest")
        }
        Some(Plan::OracleDecidesAll) | None => {
            "the oracle decides every unit (nothing was proven of the proxy)".into()
        }
    };
    let after_labels = r.accepted.as_ref().is_some_and(|a| a.after_labels);
    let bound = if r.exact {
        format!("{:.3}, exact: every label was known", r.estimate)
    } else if after_labels {
        format!(
            "{:.3}, at least {:.3} on the labels that chose the level",
            r.estimate, r.lower_bound
        )
    } else {
        format!("{:.3}, proven at least {:.3}", r.estimate, r.lower_bound)
    };
    let metric = r.metric();
    let mut frontier = String::new();
    if !r.frontier.is_empty() {
        frontier.push_str(&format!(
            "\nWhat the labels proved, from the plan chosen at the declared target to bolder ones (each level at the target's δ on its own):\n\n| units the proxy decides | {metric} proven at least |\n|---:|---:|\n"
        ));
        for p in &r.frontier {
            frontier.push_str(&format!(
                "| {:.1} % | {:.3} |\n",
                100.0 * p.saving,
                p.proven
            ));
        }
        if r.accepted.is_none() && !r.frontier.iter().all(|p| p.saving <= 0.0) {
            frontier.push_str(&format!(
                "\nTo let the proxy decide the units a lower level is proven for: `fanfold run SPEC --accept {stage}=LEVEL` answers at a level read off this table on these same labels, asking no new one, and the answer then says the level was chosen after the labels were seen, which the probability does not cover. {}.\n",
                clean_proof("LEVEL", r.seed)
            ));
        }
        frontier.push_str(&match r.more_labels {
            Some(n) => format!(
                "\nThe next bolder plan would need about {n} more labels to prove {}; the proof itself asked for no label past the declared budget.\n",
                r.target
            ),
            None => format!(
                "\nThe labels point away from a bolder plan meeting {}: more labels would likely not prove one; the oracle decides the rest.\n",
                r.target
            ),
        });
    }
    let plan_name = |p: &Plan, decided: usize| match p {
        Plan::OracleDecidesAll => "the oracle deciding every unit".to_owned(),
        _ => format!("a plan letting the proxy decide {decided} units"),
    };
    let accepted = match &r.accepted {
        Some(a) => format!(
            "- **Target LOWERED by the user**: the declared target {metric} ≥ {} was lowered to {metric} ≥ {} ({}){}. Within the label budget the labels proved {} at the declared level and {} at the accepted one, which the answer uses.\n- What the choice costs: {}.\n",
            a.declared_at_least,
            a.accepted_at_least,
            a.by,
            if a.after_labels {
                ", a level CHOSEN AFTER THE LABELS WERE SEEN"
            } else {
                ""
            },
            match a.declared_plan {
                Plan::OracleDecidesAll => plan_name(&a.declared_plan, 0),
                _ => format!(
                    "{} (proven {:.3})",
                    plan_name(&a.declared_plan, a.declared_proxy_decided),
                    a.declared_lower_bound
                ),
            },
            plan_name(&a.accepted_plan, a.accepted_proxy_decided),
            a.cost(r.delta),
        ),
        None => String::new(),
    };
    let person = if r.wanted > 0 {
        format!(
            "- A person is asked for {} labels in {WANTED_FILE} (`fanfold label OUT_DIR`){}.\n",
            r.wanted,
            if r.wanted_past_budget > 0 {
                past_budget(&r)
            } else {
                format!(
                    ", within the label budget of {}: the labels that set the thresholds",
                    r.label_budget
                )
            }
        )
    } else {
        String::new()
    };
    Some(format!(
        "## Quality of `{stage}`: {}\n\n- Target: {}; the guarantee {}.\n{accepted}- Plan: {plan}.\n- Estimate: {bound}.\n- Proxy: `{}`; oracle: {}.\n- Labels spent: {}; units the proxy decided: {} of {}; left to the oracle: {}.\n{person}- Oracle calls: {} against {} without the cascade ({} saved).\n{frontier}",
        r.target,
        r.target,
        if r.proven() {
            "holds"
        } else if r.met {
            "is not claimed: the level passes its test on the labels that chose it"
        } else {
            "is UNMET"
        },
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

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use fanfold_ops::cascade::{separation_for_auc, synthetic_population};

    use super::*;

    /// A person's first sitting is the first round whole, as
    /// `label_draws` lists it; a later one asks what the proof still
    /// reads, no more than `next_labels`, and fewer than every draw the
    /// budget allows. Sitting until nothing is asked, the person has given
    /// exactly the labels the proof spent.
    #[test]
    fn a_later_sitting_asks_only_what_the_proof_still_reads() {
        let (scores, truth) = synthetic_population(5, 2000, 0.2, separation_for_auc(0.9));
        let keys: Vec<u64> = (0..scores.len() as u64).collect();
        let target = Target {
            metric: Metric::Recall,
            at_least: 0.8,
            delta: 0.1,
        };
        let config = Config::new(target, 400, 5);
        let nothing = |_: usize| None;
        let first = person_sitting(&config, &scores, &keys, &nothing).expect("runs");
        assert!(!first.is_empty());
        assert_eq!(
            first,
            cascade::label_draws(&config, &scores, &keys, &nothing),
            "the first sitting is the first round whole"
        );
        let mut given: HashSet<usize> = first.iter().copied().collect();
        let mut sittings = 1;
        let mut second_sitting = None;
        loop {
            let known = |p: usize| given.contains(&p).then(|| truth.get(p).copied());
            let asked = person_sitting(&config, &scores, &keys, &known).expect("runs");
            if asked.is_empty() {
                break;
            }
            let next = cascade::next_labels(&config, &scores, &keys, &known).expect("runs");
            assert!(
                asked.len() <= next.len(),
                "{} > {}",
                asked.len(),
                next.len()
            );
            if sittings == 1 {
                let every_draw = cascade::label_draws(&config, &scores, &keys, &known)
                    .into_iter()
                    .filter(|p| !given.contains(p))
                    .count();
                assert!(
                    asked.len() < every_draw,
                    "the second sitting asks {} of the {every_draw} draws the budget allows",
                    asked.len()
                );
                second_sitting = Some((asked.len(), every_draw));
            }
            given.extend(asked);
            sittings += 1;
            assert!(sittings < 20, "still asking after {sittings} sittings");
        }
        let outcome = cascade::run(&config, &scores, &keys, &mut |p| {
            given.contains(&p).then(|| truth.get(p).copied()).flatten()
        })
        .expect("every label the proof reads was given");
        assert!(
            outcome.proxy_decided > 0,
            "the labels prove no plan: {:?}",
            outcome.plan
        );
        assert_eq!(
            outcome.labels,
            given.len(),
            "given over {sittings} sittings"
        );
        eprintln!(
            "first sitting {} labels; second {:?} (asked, every draw the budget allows); {} labels over {sittings} sittings, all read by the proof",
            first.len(),
            second_sitting,
            given.len()
        );
    }
}
