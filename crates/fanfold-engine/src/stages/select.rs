//! The select stage: a typed choice per unit from the spec's catalog.
//!
//! Rules decide first, in order, on what the stage sees of a unit. The
//! units no rule decides go to the scorer, a map turn of the select's own
//! whose output is one catalog name (constrained decoding on the embedded
//! model and a JSON Schema enum over HTTP) and whose confidence is that
//! name's probability where the backend scores choices. Below the declared
//! floor a unit takes `below_floor` (an escalation or an abstain). Then
//! each unit's choice is carried out: `run` and `escalate` send it to the
//! named stage, `exclude` ends it as a negative with the choice's reason,
//! `abstain` ends it as an abstain.
//!
//! The scorer's facts are cached like every map fact, so a rerun pays
//! nothing for units whose view did not change. They are not answer facts:
//! the answer holds what the chosen stage said, or the select's own
//! exclusion or abstain. After the run the select compares its choices
//! with what the chosen stages said of those units (`review`): a unit sent
//! to `run(judge)` that the judge called negative is a confusion pair.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use fanfold_core::spec::{BackendSpec, DecisionSpec, Decode, SelectStageSpec, Spec};
use fanfold_core::{
    Bucket, ChoiceScore, ContentHash, Cost, FACT_SCHEMA, FactRecord, ModelParams, StableHasher,
    Status,
};
use fanfold_ops::contract::Controller;
use fanfold_ops::map::TurnSpec;
use fanfold_ops::select::{Action, CHOICE_POINTER, Catalog};
use fanfold_ops::view::Projector;
use fanfold_store::Store;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::error::PlanError;
use crate::error::RunError;
use crate::error::project_err;
use crate::kit::RunStats;
use crate::kit::UnitTable;
use crate::kit::ledger::{FactLedger, Origin};
use crate::kit::{
    BuildContext, CachedCount, Calls, Outputs, Shape, Stage, StageContext, StageOutcome, Turn,
    TurnParts,
};

/// The most unit ids listed per confusion pair in the certificate; every
/// selection is in `selections.jsonl`.
const LISTED: usize = 50;

pub struct SelectRunner {
    pub spec: SelectStageSpec,
    catalog: Catalog,
    scorer: Option<Turn>,
    definition: ContentHash,
    /// This run's selections by table position, in table order: made by
    /// `run`, given what the chosen stages said by `review`, and written
    /// to `selections.jsonl`.
    selections: std::sync::Mutex<Vec<(usize, Selection)>>,
}

impl SelectRunner {
    pub fn build(
        s: &SelectStageSpec,
        ctx: &mut BuildContext<'_>,
    ) -> Result<SelectRunner, PlanError> {
        let catalog = Catalog::new(s).map_err(|e| ctx.invalid(e.to_string()))?;
        let scorer = match &s.model {
            Some(m) => {
                let rubric = ctx.read("rubric", &m.rubric)?;
                let decision = DecisionSpec {
                    pointer: CHOICE_POINTER.into(),
                    // Every name is a decided answer here; what it
                    // means is the select's business.
                    positive: catalog.names().to_vec(),
                    negative: Vec::new(),
                    abstain: Vec::new(),
                };
                let turn = TurnSpec {
                    rubric: m.rubric.clone(),
                    fields: s.fields.clone(),
                    project: s.project.clone(),
                    // The answer is a name of the catalog and nothing else:
                    // read from the scores where the backend has them.
                    decode: Decode::Choice,
                    ..TurnSpec::new(&s.name, s.version, m.call(), decision)
                };
                let schema = catalog.output_schema();
                let parts = TurnParts {
                    rubric: catalog.rubric(&rubric),
                    schema_text: serde_json::to_string_pretty(&schema).unwrap_or_default(),
                    schema,
                    canaries: None,
                    breaker: None,
                };
                Some(Turn::from_parts(turn, parts, ctx)?)
            }
            None => None,
        };
        let mut h = StableHasher::new(Bucket::SelectDef);
        h.field("catalog", &catalog.definition_hash(s));
        h.field(
            "scorer",
            &scorer.as_ref().map(|m| m.definition_hash().to_hex()),
        );
        Ok(SelectRunner {
            definition: h.finish(),
            spec: s.clone(),
            catalog,
            scorer,
            selections: std::sync::Mutex::default(),
        })
    }

    fn projector(&self) -> Result<Projector, RunError> {
        Projector::compile(
            &self.spec.name,
            self.spec.project.as_deref(),
            &self.spec.fields,
        )
        .map_err(project_err)
    }

    /// The (rule, choice) each unit's view matches, in `units` order;
    /// `None` for the units no rule decides.
    fn rule_picks(&self, table: &UnitTable, units: &[usize]) -> Result<Vec<RulePick>, RunError> {
        let projector = self.projector()?;
        let mut out = Vec::with_capacity(units.len());
        for &i in units {
            let id = table.id(i)?.as_str();
            let view = projector
                .project(id, &table.value(i))
                .map_err(project_err)?;
            let picked = self
                .catalog
                .decide(id, &view)
                .map_err(|source| RunError::SelectRule {
                    stage: self.spec.name.clone(),
                    unit: id.to_owned(),
                    source,
                })?;
            out.push((i, picked));
        }
        Ok(out)
    }
}

/// A unit and the (rule, choice) that decided it, if one did.
type RulePick = (usize, Option<(usize, usize)>);

/// Where every select stage's selections are written, one a line.
pub const SELECTIONS_FILE: &str = "selections.jsonl";

/// The key of select stages' reports in the run's stats.
pub const REPORT: &str = "selects";

/// The selections a run wrote (its `RunReport::files`), every select
/// stage's, in the order written.
pub fn selections(files: &[(String, Vec<serde_json::Value>)]) -> Vec<Selection> {
    files
        .iter()
        .filter(|(name, _)| name == SELECTIONS_FILE)
        .flat_map(|(_, lines)| lines)
        .filter_map(|v| Selection::deserialize(v).ok())
        .collect()
}

/// One unit's choice, as `selections.jsonl` lists it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Selection {
    pub stage: String,
    pub unit_id: String,
    pub choice: String,
    /// What the choice does: `run(judge)`, `exclude(docs)`, `abstain`.
    pub action: String,
    /// `rule:NAME`, `model` or `otherwise`.
    pub decided_by: String,
    /// Rules tried that did not decide the unit.
    pub rules_failed: u32,
    /// The model's own pick, when the confidence floor moved the unit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub below_floor_of: Option<String>,
    /// The probability of the model's pick, where the backend scored it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confidence: Option<f64>,
    /// Every choice's probability, where the backend scored them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub alternatives: Vec<ChoiceScore>,
    /// What the chosen stage said of the unit, for `run` and `escalate`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub downstream: Option<Status>,
    /// The stage whose fact answers the unit: the chosen one, or the one
    /// it passed the unit on to (a tool's `then`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answered_by: Option<String>,
    /// Whether a simulated backend made the choice.
    #[serde(skip)]
    pub simulated: bool,
}

/// What a select did, for the certificate and answer.md.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SelectReport {
    pub units: u64,
    /// Per choice, per decider (`rule:NAME`, `model`, `otherwise`): units.
    pub chosen: BTreeMap<String, BTreeMap<String, u64>>,
    /// Units the confidence floor moved to `below_floor`.
    pub below_floor: u64,
    /// Model picks kept though a floor is declared: the backend returned
    /// no probability to test against it.
    #[serde(default)]
    pub floor_unapplied: u64,
    /// Units the scorer could not place (error, budget) and no
    /// `otherwise` took: they end with the scorer's status.
    pub undecided: u64,
    /// The scorer's model calls; cached choices cost none.
    pub calls: u64,
    pub cached: u64,
    /// Per choice that sends units on: what the chosen stage said, by
    /// status. A `run` choice whose stage says negative is a confusion.
    pub confusion: BTreeMap<String, BTreeMap<Status, u64>>,
    /// Per choice: the units its stage called negative (the first
    /// [`LISTED`] in table order).
    pub disagreements: BTreeMap<String, Vec<String>>,
}

impl super::Kind for fanfold_core::spec::SelectStageSpec {
    fn build(&self, ctx: &mut BuildContext<'_>) -> Result<Box<dyn Stage>, PlanError> {
        Ok(Box::new(SelectRunner::build(self, ctx)?))
    }
}

impl Stage for SelectRunner {
    fn name(&self) -> &str {
        &self.spec.name
    }

    fn kind(&self) -> &'static str {
        "select"
    }

    fn definition_hash(&self) -> ContentHash {
        self.definition
    }

    fn shape(&self) -> Shape<'_> {
        // Its rules' choices are made again by every run; the scorer's
        // answers are stored.
        Shape {
            calls: match &self.spec.model {
                Some(m) => Calls::Model {
                    backend: m.backend.as_str(),
                },
                None => Calls::Nothing,
            },
            sends: self.catalog.targets(),
            ..Shape::units(Outputs::Stored)
        }
    }

    fn explain(&self, spec: &Spec, out: &mut String) {
        let s = &self.spec;
        let _ = writeln!(
            out,
            "  {} select v{}\n    sees {}",
            s.name,
            s.version,
            crate::kit::sees(s.project.as_deref(), &s.fields)
        );
        let choices: Vec<String> = s
            .choices
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let action = self
                    .catalog
                    .action(i)
                    .map(Action::label)
                    .unwrap_or_default();
                format!("{} -> {action}", c.name)
            })
            .collect();
        let _ = writeln!(out, "    choices: {}", choices.join(", "));
        // Each stage a choice hands units to, by kind: the rungs this
        // select routes among.
        let rungs: Vec<String> = self
            .catalog
            .targets()
            .into_iter()
            .map(|to| {
                let kind = spec
                    .stages
                    .iter()
                    .find(|st| st.name() == to)
                    .map_or("?", |st| st.type_name());
                format!("{kind} `{to}`")
            })
            .collect();
        if !rungs.is_empty() {
            let _ = writeln!(out, "    routes to: {}", rungs.join(", "));
        }
        for r in &s.rules {
            let _ = writeln!(out, "    rule {}: `{}` -> {}", r.name, r.when, r.choose);
        }
        if let (Some(m), Some(scorer)) = (&s.model, &self.scorer) {
            let (backend, simulated) = crate::kit::backend_label(spec, &m.backend);
            let floor = match (m.min_confidence, &m.below_floor) {
                (Some(c), Some(to)) => match spec.backends.get(&m.backend) {
                    // Without log probabilities these APIs return the text
                    // alone: no probability comes back to hold against it.
                    Some(BackendSpec::Openai(h) | BackendSpec::Anthropic(h)) if !h.logprobs => {
                        let kind = spec.backends.get(&m.backend).map_or("", |b| b.type_name());
                        format!(
                            "; below {c} -> {to}, a floor that cannot apply: the {kind} backend returns no probabilities (an OpenAI-compatible one does with `logprobs = true`), so the model's pick is kept"
                        )
                    }
                    _ => format!("; below {c} -> {to}"),
                },
                _ => String::new(),
            };
            let _ = writeln!(
                out,
                "    the rest: a model scores the choices, backend={}({backend}){simulated}{floor}; shared prefix {} bytes (rubric {})",
                m.backend,
                scorer.model.prefix().len(),
                m.rubric
            );
        }
        if let Some(o) = &s.otherwise {
            let _ = writeln!(out, "    otherwise -> {o}");
        }
    }

    fn planned_calls(&self, table: &UnitTable, units: &[usize]) -> Result<Option<u64>, RunError> {
        // Rules decide without a model; only what they leave is scored.
        if self.scorer.is_none() {
            return Ok(Some(0));
        }
        let picks = self.rule_picks(table, units)?;
        Ok(Some(
            picks.iter().filter(|(_, p)| p.is_none()).count() as u64
        ))
    }

    fn count_cached(
        &self,
        spec: &Spec,
        spec_dir: &Path,
        store: &Store,
        table: &UnitTable,
        units: &[usize],
    ) -> Result<CachedCount, RunError> {
        // Rules decide without a model; what the scorer's stored choices
        // were is only read when the select runs.
        let picks = self.rule_picks(table, units)?;
        let mut count = CachedCount::default();
        let mut residual = Vec::new();
        for (i, picked) in picks {
            match picked {
                Some((_, choice)) => {
                    count.cached += 1;
                    if let Some(to) = self.catalog.action(choice).and_then(Action::target) {
                        count.sent.entry(to.to_owned()).or_default().push(i);
                    }
                }
                None => residual.push(i),
            }
        }
        if let Some(scorer) = &self.scorer {
            let views = scorer.unit_views(table)?;
            let c =
                scorer.count_cached(spec, spec_dir, store, &residual, &views, &mut |_, _| {})?;
            count.cached += c.cached;
            count.unknown = c.unknown;
        }
        Ok(count)
    }

    fn run(&self, ctx: &mut StageContext<'_>, units: Vec<usize>) -> Result<StageOutcome, RunError> {
        let name = self.spec.name.as_str();
        let rules = self.spec.rules.len() as u32;
        let mut report = SelectReport {
            units: units.len() as u64,
            ..SelectReport::default()
        };
        let mut selections = Vec::with_capacity(units.len());
        // (table position, choice, selection without its choice's words)
        let mut picked: Vec<(usize, usize, Selection)> = Vec::with_capacity(units.len());
        let mut residual = Vec::new();
        for (i, pick) in self.rule_picks(ctx.table, &units)? {
            let blank = Selection {
                stage: name.to_owned(),
                unit_id: ctx.table.id(i)?.0.clone(),
                choice: String::new(),
                action: String::new(),
                decided_by: String::new(),
                rules_failed: rules,
                below_floor_of: None,
                confidence: None,
                alternatives: Vec::new(),
                downstream: None,
                answered_by: None,
                simulated: false,
            };
            match pick {
                Some((rule, choice)) => {
                    let rule_name = self.spec.rules.get(rule).map(|r| r.name.as_str());
                    picked.push((
                        i,
                        choice,
                        Selection {
                            decided_by: format!("rule:{}", rule_name.unwrap_or("?")),
                            rules_failed: rule as u32,
                            ..blank
                        },
                    ));
                }
                None => residual.push((i, blank)),
            }
        }

        // The residual: scored by the model, or `otherwise`.
        let mut stop = None;
        let mut scored: BTreeMap<usize, FactRecord> = BTreeMap::new();
        if let (Some(scorer), false) = (&self.scorer, residual.is_empty()) {
            let inner_spec = crate::kit::uncontracted(ctx.spec);
            let verdicts = FactLedger::new(
                ctx.store,
                Controller::new(inner_spec.contract.clone()),
                None,
            );
            let hits = ctx.stats.cache_hits;
            let mut inner = ctx.for_turn(&inner_spec, &verdicts);
            let views = scorer.unit_views(inner.table)?;
            let asked = residual.iter().map(|(i, _)| *i).collect();
            stop = scorer.run(&mut inner, asked, &views, &|_, _| {})?;
            report.cached = ctx.stats.cache_hits - hits;
            if let Some(e) = verdicts.take_store_error() {
                return Err(e.into());
            }
            let (facts, totals) = verdicts.into_parts();
            report.calls = totals.calls;
            ctx.stats.model_calls += totals.calls;
            ctx.stats.cost.add(&totals.cost);
            scored.extend(facts);
        }

        let mut ended: Vec<(usize, FactRecord)> = Vec::new();
        for (i, mut sel) in residual {
            let fact = scored.remove(&i);
            let choice_of_model = fact
                .as_ref()
                .filter(|f| f.status == Status::Positive)
                .and_then(|f| f.decision.as_deref())
                .and_then(|d| self.catalog.index_of(d));
            match (choice_of_model, fact) {
                (Some(pick), Some(f)) => {
                    let (choice, moved) = self.catalog.settle(pick, f.confidence);
                    if self.catalog.has_floor() && f.confidence.is_none() {
                        report.floor_unapplied += 1;
                    }
                    sel.decided_by = "model".into();
                    sel.confidence = f.confidence;
                    sel.alternatives = f.choice_scores.clone();
                    sel.simulated = f.model.simulated;
                    if moved {
                        report.below_floor += 1;
                        sel.below_floor_of = self.catalog.names().get(pick).cloned();
                    }
                    picked.push((i, choice, sel));
                }
                (_, fact) => match self.catalog.otherwise() {
                    Some(choice) => {
                        sel.decided_by = "otherwise".into();
                        picked.push((i, choice, sel));
                    }
                    None => {
                        // No choice could be made: the unit ends with what
                        // stopped the scorer (an error, the budget).
                        report.undecided += 1;
                        if let Some(f) = fact {
                            ended.push((i, f));
                        }
                    }
                },
            }
        }

        // Carry the choices out.
        let mut outcome = StageOutcome {
            stop,
            ..StageOutcome::default()
        };
        picked.sort_by_key(|(i, _, _)| *i);
        for (i, choice, mut sel) in picked {
            let Some(action) = self.catalog.action(choice) else {
                continue;
            };
            let choice_name = self
                .catalog
                .names()
                .get(choice)
                .cloned()
                .unwrap_or_default();
            *report
                .chosen
                .entry(choice_name.clone())
                .or_default()
                .entry(sel.decided_by.clone())
                .or_insert(0) += 1;
            sel.choice = choice_name.clone();
            sel.action = action.label();
            let status = match action {
                Action::Run(to) | Action::Escalate(to) => {
                    outcome.sent.entry(to.clone()).or_default().push(i);
                    None
                }
                Action::Exclude(_) => Some(Status::Negative),
                Action::Abstain => Some(Status::Abstain),
            };
            if let Some(status) = status {
                ended.push((i, self.derived_fact(ctx.table, i, &sel, status, action)?));
            }
            selections.push((i, sel));
        }
        for (i, fact) in ended {
            ctx.ledger.record(i, fact, Origin::Derived);
        }
        ctx.stats.reports.put(REPORT, name, &report);
        *self.selections.lock().unwrap_or_else(|e| e.into_inner()) = selections;
        Ok(outcome)
    }

    fn review(&self, facts: &[(usize, FactRecord)], stats: &mut RunStats) {
        let Some(mut report) = stats.reports.get::<SelectReport>(REPORT, &self.spec.name) else {
            return;
        };
        let mut selections = self.selections.lock().unwrap_or_else(|e| e.into_inner());
        let targets = self.catalog.targets();
        let said: BTreeMap<(usize, &str), Status> = facts
            .iter()
            .filter(|(_, f)| targets.contains(&f.stage.as_str()))
            .map(|(i, f)| ((*i, f.stage.as_str()), f.status))
            .collect();
        // A chosen stage that passes its units on (a tool with `then`)
        // leaves the answer to a later stage: the unit's last fact of any
        // stage but this one says what came of the choice.
        let answered: BTreeMap<usize, (&str, Status)> = facts
            .iter()
            .filter(|(_, f)| f.stage != self.spec.name)
            .map(|(i, f)| (*i, (f.stage.as_str(), f.status)))
            .collect();
        let mut confusion: BTreeMap<String, BTreeMap<Status, u64>> = BTreeMap::new();
        let mut disagreements: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (i, sel) in selections.iter_mut() {
            let Some(to) = self
                .catalog
                .index_of(&sel.choice)
                .and_then(|c| self.catalog.action(c))
                .and_then(Action::target)
            else {
                continue;
            };
            let (by, status) = match said.get(&(*i, to)) {
                Some(&status) => (Some(to), status),
                None => match answered.get(i) {
                    Some(&(by, status)) => (Some(by), status),
                    None => (None, Status::NotRun),
                },
            };
            sel.downstream = Some(status);
            sel.answered_by = by.map(str::to_owned);
            *confusion
                .entry(sel.choice.clone())
                .or_default()
                .entry(status)
                .or_insert(0) += 1;
            if status == Status::Negative {
                let listed = disagreements.entry(sel.choice.clone()).or_default();
                if listed.len() < LISTED {
                    listed.push(sel.unit_id.clone());
                }
            }
        }
        report.confusion = confusion;
        report.disagreements = disagreements;
        stats.reports.put(REPORT, &self.spec.name, &report);
    }

    fn report_key(&self) -> Option<&'static str> {
        Some(REPORT)
    }

    fn answer_section(&self, stats: &RunStats, simulated: &str) -> Option<String> {
        let r = stats.reports.get::<SelectReport>(REPORT, self.name())?;
        let name = self.name();
        Some(format!(
            "\n## Routing: select `{name}`{simulated}\n\nEach unit took one choice of the spec's catalog, by a rule or by the model scoring the choices. The right-hand columns are what the chosen stage then said (every selection is in `selections.jsonl`).\n\n{}",
            confusion_table(name, &r)
        ))
    }

    fn output_files(&self, _stats: &RunStats) -> Vec<(String, Vec<serde_json::Value>)> {
        let selections = self.selections.lock().unwrap_or_else(|e| e.into_inner());
        if selections.is_empty() {
            return Vec::new();
        }
        let lines = selections
            .iter()
            .filter_map(|(_, s)| serde_json::to_value(s).ok())
            .collect();
        vec![(SELECTIONS_FILE.to_owned(), lines)]
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl SelectRunner {
    /// The answer fact of a unit the select ends itself (excluded or
    /// abstained): made from the choice, never stored (a rerun makes it
    /// again from the rules or the scorer's cached fact), so its key is
    /// only its identity in this run's facts.
    fn derived_fact(
        &self,
        table: &UnitTable,
        i: usize,
        sel: &Selection,
        status: Status,
        action: &Action,
    ) -> Result<FactRecord, RunError> {
        let u = table.unit(i)?;
        let mut h = StableHasher::new(Bucket::Selection);
        h.field("select", &self.definition);
        h.field("unit", &u.unit_hash);
        h.field("choice", &sel.choice);
        h.field("decided_by", &sel.decided_by);
        let reason = match action {
            Action::Exclude(r) => {
                format!("{r} (select `{}` chose `{}`)", self.spec.name, sel.choice)
            }
            _ => format!("select `{}` chose `{}`", self.spec.name, sel.choice),
        };
        Ok(FactRecord {
            schema: FACT_SCHEMA.into(),
            key: h.finish(),
            source_ids: vec![u.unit_id.clone()],
            source_hashes: vec![u.unit_hash],
            stage: self.spec.name.clone(),
            stage_version: self.spec.version,
            rubric_hash: self.definition,
            model: ModelParams {
                backend: "select".into(),
                model_id: sel.decided_by.clone(),
                temperature: 0.0,
                max_output_tokens: 0,
                seed: 0,
                simulated: sel.simulated,
            },
            status,
            decision: Some(sel.choice.clone()),
            facts: json!({"choice": sel.choice, "decided_by": sel.decided_by}),
            confidence: sel.confidence,
            choice_scores: sel.alternatives.clone(),
            reason: Some(reason),
            evidence: Vec::new(),
            cost: Cost::default(),
            attempts: 0,
            reducer_path: Vec::new(),
            truncated_tokens: 0,
            digest: None,
        })
    }
}

/// A select stage's choices against what the chosen stages then said,
/// as answer.md and `fanfold report` show them.
pub fn confusion_table(name: &str, r: &SelectReport) -> String {
    use fanfold_core::Status;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "select `{name}`: {} units, {} scorer calls, {} cached, {} moved by the confidence floor, {} undecided\n",
        r.units, r.calls, r.cached, r.below_floor, r.undecided
    );
    if r.floor_unapplied > 0 {
        let _ = writeln!(
            out,
            "**{} model picks were kept without a probability**: the backend returned none, so the confidence floor could not apply to them.\n",
            r.floor_unapplied
        );
    }
    let _ = writeln!(
        out,
        "| choice | by rule | by model | otherwise | then positive | negative | abstain | error | not run |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for (choice, by) in &r.chosen {
        let rule: u64 = by
            .iter()
            .filter(|(k, _)| k.starts_with("rule:"))
            .map(|(_, n)| n)
            .sum();
        let get = |k: &str| by.get(k).copied().unwrap_or(0);
        let c = r.confusion.get(choice);
        let cell = |st: Status| match c {
            Some(m) => m.get(&st).copied().unwrap_or(0).to_string(),
            None => "-".to_owned(),
        };
        let _ = writeln!(
            out,
            "| {} | {rule} | {} | {} | {} | {} | {} | {} | {} |",
            crate::markdown::md_text(choice),
            get("model"),
            get("otherwise"),
            cell(Status::Positive),
            cell(Status::Negative),
            cell(Status::Abstain),
            cell(Status::Error),
            cell(Status::NotRun),
        );
    }
    for (choice, ids) in &r.disagreements {
        let _ = writeln!(
            out,
            "\n- sent as `{}`, then judged negative: {}",
            crate::markdown::md_text(choice),
            ids.iter()
                .map(|i| crate::markdown::md_text(i))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    out
}
