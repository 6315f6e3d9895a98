//! The rerank stage: the model scores each (question, unit) pair and only
//! the best-scored units go on to the judge.
//!
//! The scorer is a model turn of the stage's own whose answer is one word,
//! `yes` or `no`, read from the model's scores (`decode = "choice"`: on the
//! embedded model one forward pass a pair, nothing generated); a unit's
//! score is the probability of `yes`. Its facts are cached like every map
//! fact, so a rerun pays nothing for a unit whose view did not change, and
//! the cut is taken again over every unit's stored score (a rank depends
//! on all the units). The kept units go on to `then`; the rest end here as
//! negatives that say their score and rank.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use fanfold_core::spec::rerank::RerankStageSpec;
use fanfold_core::spec::{DecisionSpec, Decode, Spec};
use fanfold_core::{
    Bucket, ContentHash, Cost, FACT_SCHEMA, FactRecord, ModelParams, StableHasher, Status,
};
use fanfold_ops::contract::Controller;
use fanfold_ops::map::TurnSpec;
use fanfold_ops::rerank::{self, NO, RELEVANT_POINTER, YES};
use fanfold_store::Store;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::error::{PlanError, RunError};
use crate::kit::UnitTable;
use crate::kit::ledger::{FactLedger, Origin};
use crate::kit::{
    BuildContext, CachedCount, Calls, Outputs, Shape, Stage, StageContext, StageOutcome, Turn,
    TurnParts,
};

/// The namespace of the stage's definition and of its derived facts' keys.
const DEFINITION: Bucket = Bucket::Kind("rerank-def-v1");
const DERIVED: Bucket = Bucket::Kind("rerank-derived-v1");

/// The key of rerank reports in the run's stats.
pub const REPORT: &str = "rerank";

/// What a rerank stage did, for the certificate.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RerankReport {
    pub units: u64,
    pub scored: u64,
    /// Units kept (passed on, or positive without `then`).
    pub kept: u64,
    /// Units cut by rank or score.
    pub cut: u64,
    /// The scorer's model calls, and its facts found stored.
    pub calls: u64,
    pub cached: u64,
    /// The lowest score kept, if any unit was.
    pub lowest_kept: Option<f64>,
}

pub struct RerankRunner {
    pub spec: RerankStageSpec,
    scorer: Turn,
    definition: ContentHash,
}

impl RerankRunner {
    pub fn build(
        s: &RerankStageSpec,
        ctx: &mut BuildContext<'_>,
    ) -> Result<RerankRunner, PlanError> {
        rerank::check_cut(s.top_k, s.min_score)
            .map_err(|e| ctx.invalid(format!("stage `{}`: {e}", s.name)))?;
        let question = s.query.as_deref().unwrap_or(&ctx.spec.question);
        if question.trim().is_empty() {
            return Err(ctx.invalid(format!(
                "stage `{}` needs a question: the spec's `question` or its own `query`",
                s.name
            )));
        }
        let decision = DecisionSpec {
            pointer: RELEVANT_POINTER.into(),
            positive: vec![YES.into()],
            negative: vec![NO.into()],
            abstain: Vec::new(),
        };
        let turn = TurnSpec {
            rubric: format!("(rerank `{}`)", s.name),
            fields: s.fields.clone(),
            project: s.project.clone(),
            decode: Decode::Choice,
            ..TurnSpec::new(&s.name, s.version, s.call(), decision)
        };
        let schema = rerank::output_schema();
        let parts = TurnParts {
            rubric: rerank::rubric(question),
            schema_text: serde_json::to_string_pretty(&schema).unwrap_or_default(),
            schema,
            canaries: None,
            breaker: None,
        };
        let scorer = Turn::from_parts(turn, parts, ctx)?;
        let mut h = StableHasher::new(DEFINITION);
        h.field("scorer", &scorer.definition_hash())
            .field("top_k", &s.top_k.map(|k| k as u64))
            .field("min_score", &s.min_score);
        Ok(RerankRunner {
            spec: s.clone(),
            scorer,
            definition: h.finish(),
        })
    }

    /// The fact a unit the cut drops ends with (or a kept unit, where the
    /// stage has no `then`).
    fn derived_fact(
        &self,
        table: &UnitTable,
        i: usize,
        placed: &rerank::Placed,
        scored: &FactRecord,
        status: Status,
    ) -> Result<FactRecord, RunError> {
        let u = table.unit(i)?;
        let mut h = StableHasher::new(DERIVED);
        h.field("rerank", &self.definition)
            .field("unit", &u.unit_hash)
            .field("score", &placed.score)
            .field("rank", &(placed.rank as u64));
        let sp = &self.spec;
        let reason = if placed.kept {
            format!("rerank `{}` kept it: rank {}", sp.name, placed.rank + 1)
        } else {
            format!(
                "rerank `{}` cut it: score {:.3}, rank {}{}{}",
                sp.name,
                placed.score,
                placed.rank + 1,
                sp.top_k
                    .map(|k| format!(", top {k} kept"))
                    .unwrap_or_default(),
                sp.min_score
                    .map(|m| format!(", at least {m} kept"))
                    .unwrap_or_default()
            )
        };
        Ok(FactRecord {
            schema: FACT_SCHEMA.into(),
            key: h.finish(),
            source_ids: vec![u.unit_id.clone()],
            source_hashes: vec![u.unit_hash],
            stage: sp.name.clone(),
            stage_version: sp.version,
            rubric_hash: self.definition,
            model: ModelParams {
                backend: "rerank".into(),
                model_id: scored.model.model_id.clone(),
                temperature: 0.0,
                max_output_tokens: 0,
                seed: 0,
                simulated: scored.model.simulated,
            },
            status,
            decision: scored.decision.clone(),
            facts: json!({"score": placed.score, "rank": placed.rank + 1}),
            confidence: Some(placed.score),
            choice_scores: scored.choice_scores.clone(),
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

impl super::Kind for RerankStageSpec {
    fn build(&self, ctx: &mut BuildContext<'_>) -> Result<Box<dyn Stage>, PlanError> {
        Ok(Box::new(RerankRunner::build(self, ctx)?))
    }
}

impl Stage for RerankRunner {
    fn name(&self) -> &str {
        &self.spec.name
    }

    fn kind(&self) -> &'static str {
        "rerank"
    }

    fn definition_hash(&self) -> ContentHash {
        self.definition
    }

    fn shape(&self) -> Shape<'_> {
        Shape {
            calls: Calls::Model {
                backend: &self.spec.backend,
            },
            then: self.spec.then.as_deref(),
            ..Shape::units(Outputs::Stored)
        }
    }

    fn explain(&self, spec: &Spec, out: &mut String) {
        let sp = &self.spec;
        let (backend, simulated) = crate::kit::backend_label(spec, &sp.backend);
        let sees = crate::kit::sees(sp.project.as_deref(), &sp.fields);
        let _ = writeln!(
            out,
            "  {} rerank v{} backend={}({}){simulated}\n    sees {sees}",
            sp.name, sp.version, sp.backend, backend
        );
        let mut cut = Vec::new();
        if let Some(k) = sp.top_k {
            cut.push(format!("the top {k}"));
        }
        if let Some(m) = sp.min_score {
            cut.push(format!("those scored at least {m}"));
        }
        let _ = writeln!(
            out,
            "    score = the model's probability of `yes` to \"is this relevant to the question?\" ({}), read from its scores, nothing generated; {} {}, the rest end as negative",
            if sp.query.is_some() {
                "its own query"
            } else {
                "the spec's question"
            },
            cut.join(" and "),
            sp.then
                .as_deref()
                .map(|t| format!("go on to `{t}`"))
                .unwrap_or_else(|| "are positive".into())
        );
    }

    fn count_cached(
        &self,
        spec: &Spec,
        spec_dir: &Path,
        store: &Store,
        table: &UnitTable,
        units: &[usize],
    ) -> Result<CachedCount, RunError> {
        // The cut needs every unit's score, so only the scorer's stored
        // facts are counted; where they go is decided when the stage runs.
        let views = self.scorer.unit_views(table)?;
        self.scorer
            .count_cached(spec, spec_dir, store, units, &views, &mut |_, _| {})
    }

    fn run(&self, ctx: &mut StageContext<'_>, units: Vec<usize>) -> Result<StageOutcome, RunError> {
        let mut report = RerankReport {
            units: units.len() as u64,
            ..RerankReport::default()
        };
        // The scorer's verdicts are not answer facts: they go to a ledger
        // of their own, and the stage records what the cut decides.
        let inner_spec = crate::kit::uncontracted(ctx.spec);
        let verdicts = FactLedger::new(
            ctx.store,
            Controller::new(inner_spec.contract.clone()),
            None,
        );
        let hits = ctx.stats.cache_hits;
        let stop = {
            let mut inner = ctx.for_turn(&inner_spec, &verdicts);
            let views = self.scorer.unit_views(inner.table)?;
            self.scorer.run(&mut inner, units, &views, &|_, _| {})?
        };
        report.cached = ctx.stats.cache_hits - hits;
        if let Some(e) = verdicts.take_store_error() {
            return Err(e.into());
        }
        let (facts, totals) = verdicts.into_parts();
        report.calls = totals.calls;
        ctx.stats.model_calls += totals.calls;
        ctx.stats.cost.add(&totals.cost);

        let facts: BTreeMap<usize, FactRecord> = facts.into_iter().collect();
        let mut scored = Vec::new();
        let mut ended: Vec<(usize, FactRecord)> = Vec::new();
        for (&i, f) in &facts {
            let score = (f.status.is_cacheable())
                .then(|| rerank::score(f.decision.as_deref(), &f.choice_scores, f.confidence))
                .flatten();
            match score {
                Some(s) => scored.push((i, s)),
                // No verdict (an error, the budget): the unit ends with
                // what stopped the scorer.
                None => ended.push((i, f.clone())),
            }
        }
        report.scored = scored.len() as u64;
        let mut outcome = StageOutcome {
            stop,
            ..StageOutcome::default()
        };
        for placed in rerank::cut(&scored, self.spec.top_k, self.spec.min_score) {
            let Some(f) = facts.get(&placed.unit) else {
                continue;
            };
            if placed.kept {
                report.kept += 1;
                report.lowest_kept = Some(
                    report
                        .lowest_kept
                        .map_or(placed.score, |l: f64| l.min(placed.score)),
                );
                if self.spec.then.is_some() {
                    outcome.passed.push(placed.unit);
                } else {
                    let fact =
                        self.derived_fact(ctx.table, placed.unit, &placed, f, Status::Positive)?;
                    ended.push((placed.unit, fact));
                }
            } else {
                report.cut += 1;
                let fact =
                    self.derived_fact(ctx.table, placed.unit, &placed, f, Status::Negative)?;
                ended.push((placed.unit, fact));
            }
        }
        outcome.passed.sort_unstable();
        ended.sort_by_key(|(i, _)| *i);
        for (i, fact) in ended {
            ctx.ledger.record(i, fact, Origin::Derived);
        }
        ctx.stats.reports.put(REPORT, &self.spec.name, &report);
        Ok(outcome)
    }

    fn report_key(&self) -> Option<&'static str> {
        Some(REPORT)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}
