//! Running a BM25 stage: project each unit, score every one against the
//! query over the units the stage received, and split them at the
//! threshold. Nothing is stored: a score depends on the words of every
//! unit the stage sees, and computing them all costs less than reading
//! them back.

use std::fmt::Write as _;
use std::path::Path;

use fanfold_core::spec::{Bm25StageSpec, Spec};
use fanfold_core::{Cost, FACT_SCHEMA, FactRecord, ModelParams, Status};
use fanfold_ops::bm25::{Bm25Stage, text_of, tokens};
use fanfold_ops::view::Projector;
use fanfold_store::Store;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::error::PlanError;
use crate::error::RunError;
use crate::error::project_err;
use crate::kit::UnitTable;
use crate::kit::ledger::Origin;
use crate::kit::{BuildContext, CachedCount, Outputs, Shape, Stage, StageContext, StageOutcome};

pub struct Bm25Runner {
    pub stage: Bm25Stage,
}

/// What one BM25 stage did, for the certificate.
/// The key of BM25 stages' reports in the run's stats.
pub const REPORT: &str = "bm25";

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Bm25Report {
    pub units: u64,
    /// Units at or above the threshold.
    pub kept: u64,
    pub threshold: f64,
    /// The highest and the median score.
    pub max_score: f64,
    pub median_score: f64,
}

impl Bm25Runner {
    pub fn build(s: &Bm25StageSpec, ctx: &mut BuildContext<'_>) -> Result<Bm25Runner, PlanError> {
        let stage = Bm25Stage::new(s.clone()).map_err(|e| ctx.invalid(e.to_string()))?;
        Ok(Bm25Runner { stage })
    }

    /// Every unit's score, in the order given.
    fn scores(&self, table: &UnitTable, units: &[usize]) -> Result<Vec<f64>, RunError> {
        let sp = &self.stage.spec;
        let projector =
            Projector::compile(&sp.name, sp.project.as_deref(), &sp.fields).map_err(project_err)?;
        let mut docs = Vec::with_capacity(units.len());
        for &i in units {
            let view = projector
                .project(table.id(i)?.as_str(), &table.value(i))
                .map_err(project_err)?;
            docs.push(tokens(&text_of(&view)));
        }
        Ok(self.stage.scores(&docs))
    }
}

impl super::Kind for fanfold_core::spec::Bm25StageSpec {
    fn build(&self, ctx: &mut BuildContext<'_>) -> Result<Box<dyn Stage>, PlanError> {
        Ok(Box::new(Bm25Runner::build(self, ctx)?))
    }
}

impl Stage for Bm25Runner {
    fn name(&self) -> &str {
        self.stage.name()
    }

    fn kind(&self) -> &'static str {
        "bm25"
    }

    fn definition_hash(&self) -> fanfold_core::ContentHash {
        self.stage.definition_hash()
    }

    fn shape(&self) -> Shape<'_> {
        Shape {
            then: self.stage.spec.then.as_deref(),
            ..Shape::units(Outputs::Derived)
        }
    }

    fn explain(&self, _spec: &Spec, out: &mut String) {
        let sp = &self.stage.spec;
        let _ = writeln!(
            out,
            "  {} bm25 v{} k1={} b={}\n    sees {}\n    query terms [{}]; below {} ends as negative, else {}",
            sp.name,
            sp.version,
            sp.k1,
            sp.b,
            crate::kit::sees(sp.project.as_deref(), &sp.fields),
            self.stage.terms.join(", "),
            sp.threshold,
            sp.then
                .as_deref()
                .map(|t| format!("goes on to `{t}`"))
                .unwrap_or_else(|| "positive".into())
        );
    }

    fn count_cached(
        &self,
        _spec: &Spec,
        _spec_dir: &Path,
        _store: &Store,
        table: &UnitTable,
        units: &[usize],
    ) -> Result<CachedCount, RunError> {
        // Nothing is stored, and nothing needs a model: where each unit
        // goes is computed exactly.
        let scores = self.scores(table, units)?;
        Ok(CachedCount {
            passed: units
                .iter()
                .zip(&scores)
                .filter(|(_, s)| **s >= self.stage.spec.threshold)
                .map(|(i, _)| *i)
                .collect(),
            calls: Some(0),
            ..CachedCount::default()
        })
    }

    fn planned_calls(&self, _table: &UnitTable, _units: &[usize]) -> Result<Option<u64>, RunError> {
        Ok(Some(0))
    }

    fn run(&self, ctx: &mut StageContext<'_>, units: Vec<usize>) -> Result<StageOutcome, RunError> {
        let stage = &self.stage;
        let sp = &stage.spec;
        ctx.progress
            .stage_started(stage.name(), units.len() as u64, 0);
        let scores = self.scores(ctx.table, &units)?;
        let params = ModelParams {
            backend: "bm25".into(),
            model_id: "bm25".into(),
            temperature: 0.0,
            max_output_tokens: 0,
            seed: 0,
            simulated: false,
        };
        if let Some(published) = ctx.shared.get::<crate::kit::UnitScores>() {
            published.put(
                stage.name(),
                units.iter().copied().zip(scores.iter().copied()),
            );
        }
        let mut passed = Vec::new();
        for (&i, &score) in units.iter().zip(&scores) {
            let kept = score >= sp.threshold;
            if kept && sp.then.is_some() {
                passed.push(i);
                ctx.progress.unit_finished(stage.name(), Status::Positive);
                continue;
            }
            let u = ctx.table.unit(i)?;
            let status = if kept {
                Status::Positive
            } else {
                Status::Negative
            };
            let mut h = fanfold_core::StableHasher::new(fanfold_core::Bucket::Bm25Def);
            h.field("stage", &stage.definition_hash())
                .field("unit", &u.unit_hash);
            let fact = FactRecord {
                schema: FACT_SCHEMA.into(),
                key: h.finish(),
                source_ids: vec![u.unit_id.clone()],
                source_hashes: vec![u.unit_hash],
                stage: stage.name().to_owned(),
                stage_version: sp.version,
                // No rubric: what the fact means is the stage's definition,
                // its query included, as for an embed stage.
                rubric_hash: stage.definition_hash(),
                model: params.clone(),
                status,
                decision: Some(if kept { "relevant" } else { "irrelevant" }.into()),
                facts: json!({"score": score}),
                confidence: None,
                choice_scores: Vec::new(),
                reason: (!kept).then(|| {
                    format!(
                        "BM25 score {score:.3} is below the threshold {}",
                        sp.threshold
                    )
                }),
                evidence: Vec::new(),
                cost: Cost::default(),
                attempts: 0,
                reducer_path: Vec::new(),
                truncated_tokens: 0,
                digest: None,
            };
            ctx.progress.unit_finished(stage.name(), status);
            ctx.ledger.record(i, fact, Origin::Derived);
        }
        if let Some(e) = ctx.ledger.take_store_error() {
            return Err(e.into());
        }
        let mut sorted = scores.clone();
        sorted.sort_by(f64::total_cmp);
        ctx.stats.reports.put(
            REPORT,
            stage.name(),
            &Bm25Report {
                units: units.len() as u64,
                kept: scores.iter().filter(|s| **s >= sp.threshold).count() as u64,
                threshold: sp.threshold,
                max_score: sorted.last().copied().unwrap_or(0.0),
                median_score: sorted.get(sorted.len() / 2).copied().unwrap_or(0.0),
            },
        );
        ctx.progress.stage_finished(stage.name());
        Ok(StageOutcome {
            passed,
            ..StageOutcome::default()
        })
    }

    fn report_key(&self) -> Option<&'static str> {
        Some(REPORT)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}
