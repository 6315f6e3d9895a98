//! Running an embed stage: key each unit's fact, embed only the texts no
//! cached vector covers, score, and split the units into those that end
//! here and those that go on.
//!
//! Two caches sit under one stage. The fact cache keys on the stage's
//! meaning (texts, threshold, model), so an unchanged rerun embeds nothing.
//! The vector cache keys on the model and the text alone, so a new
//! threshold or a new anchor text re-scores without re-embedding a unit.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use fanfold_core::spec::{EmbedStageSpec, Spec};
use fanfold_core::{ContentHash, Cost, FACT_SCHEMA, FactRecord, ModelParams, StableHash, Status};
use fanfold_embed::{Embedder, EmbedderFiles};
use fanfold_ops::contract::StopReason;
use fanfold_ops::embed::{EmbedStage, vector_key};
use fanfold_ops::view::{INPUT_BUCKET, Projector};
use fanfold_store::Store;
use serde::{Deserialize, Serialize};

use crate::error::PlanError;
use crate::error::RunError;
use crate::error::project_err;
use crate::kit::UnitTable;
use crate::kit::ledger::Origin;
use crate::kit::{BuildContext, CachedCount, Outputs, Shape, Stage, StageContext, StageOutcome};
use crate::models::{self, MINILM_L6_V2};
use crate::queue::BudgetPool;

pub struct EmbedRunner {
    pub stage: EmbedStage,
    spec_dir: PathBuf,
}

impl EmbedRunner {
    pub fn build(e: &EmbedStageSpec, ctx: &mut BuildContext<'_>) -> Result<EmbedRunner, PlanError> {
        let examples = match &e.examples {
            Some(file) => Some((file.as_str(), ctx.read("examples", file)?)),
            None => None,
        };
        if let Some((file, text)) = &examples {
            ctx.hashed
                .insert(format!("examples:{}", e.name), format!("{file}\n{text}"));
        }
        let stage = EmbedStage::new(e.clone(), examples.as_ref().map(|(f, t)| (*f, t.as_str())))
            .map_err(|source| PlanError::Embed {
                path: ctx.path(),
                source,
            })?;
        Ok(EmbedRunner {
            stage,
            spec_dir: ctx.spec_dir.to_owned(),
        })
    }
}

impl super::Kind for fanfold_core::spec::EmbedStageSpec {
    fn build(&self, ctx: &mut BuildContext<'_>) -> Result<Box<dyn Stage>, PlanError> {
        Ok(Box::new(EmbedRunner::build(self, ctx)?))
    }
}

impl Stage for EmbedRunner {
    fn name(&self) -> &str {
        self.stage.name()
    }

    fn kind(&self) -> &'static str {
        "embed"
    }

    fn definition_hash(&self) -> ContentHash {
        self.stage.definition_hash()
    }

    fn shape(&self) -> Shape<'_> {
        Shape {
            then: self.stage.spec.then.as_deref(),
            ..Shape::units(Outputs::Stored)
        }
    }

    fn explain(&self, _spec: &Spec, out: &mut String) {
        let e = &self.stage;
        let sp = &e.spec;
        let sees = crate::kit::sees(sp.project.as_deref(), &sp.fields);
        let positives = e
            .anchors
            .iter()
            .filter(|a| a.polarity == fanfold_ops::embed::Polarity::Positive)
            .count();
        let _ = writeln!(
            out,
            "  {} embed v{} model={} max_tokens={}\n    sees {sees}",
            sp.name,
            sp.version,
            sp.model.as_deref().unwrap_or("all-MiniLM-L6-v2"),
            sp.max_tokens
        );
        let _ = writeln!(
            out,
            "    score = best similarity to {positives} positive texts{}; below {} ends as negative, else {}",
            if positives < e.anchors.len() {
                format!(
                    " minus best to {} negative texts",
                    e.anchors.len() - positives
                )
            } else {
                String::new()
            },
            sp.threshold,
            sp.then
                .as_deref()
                .map(|t| format!("goes on to `{t}`"))
                .unwrap_or_else(|| "positive".into())
        );
        if let Some(k) = sp.top_k {
            let _ = writeln!(
                out,
                "    keeps the {k} highest scores; the rest end as negatives"
            );
        }
    }

    fn count_cached(
        &self,
        _spec: &Spec,
        spec_dir: &Path,
        store: &Store,
        table: &UnitTable,
        units: &[usize],
    ) -> Result<CachedCount, RunError> {
        // Cached facts say where a unit goes; the rest are undecided until
        // embedded, and may still reach the next stage.
        let (_, model_id) = embedder_identity(&self.stage, spec_dir)?;
        let mut count = CachedCount::default();
        let mut stored = Vec::new();
        for (i, key, _) in fact_keys(&self.stage, table, units, &model_id)? {
            if let Some(f) = store.get_fact(&key)? {
                count.cached += 1;
                stored.push((i, f, Origin::Cached));
            }
        }
        // By rank, what passes depends on every unit: known only when every
        // unit's score is stored.
        if let Some(k) = self.stage.spec.top_k {
            if stored.len() < units.len() {
                return Ok(count);
            }
            keep_top(&self.stage, k, &mut stored);
        }
        count.passed = stored
            .into_iter()
            .filter(|(_, f, _)| f.status == Status::Positive)
            .map(|(i, _, _)| i)
            .collect();
        Ok(count)
    }

    fn run(&self, ctx: &mut StageContext<'_>, units: Vec<usize>) -> Result<StageOutcome, RunError> {
        let name = self.stage.name();
        ctx.progress.stage_started(name, units.len() as u64, 0);
        let budget = ctx.budget;
        let outcome = run_stage(
            &self.stage,
            &self.spec_dir,
            ctx.table,
            &units,
            ctx.store,
            embedders(ctx, &self.stage)?,
            Some(budget),
        )?;
        if let Some(published) = ctx.shared.get::<crate::kit::UnitScores>() {
            published.put(name, outcome.scores.iter().copied());
        }
        for (i, fact, origin) in outcome.ended {
            ctx.progress.unit_finished(name, fact.status);
            ctx.ledger.record(i, fact, origin);
        }
        if let Some(e) = ctx.ledger.take_store_error() {
            return Err(e.into());
        }
        for _ in &outcome.passed {
            ctx.progress.unit_finished(name, Status::Positive);
        }
        ctx.store.event(
            ctx.run_id,
            "embedded",
            &serde_json::json!({"stage": name, "stats": outcome.stats}),
        )?;
        ctx.stats.reports.put(REPORT, name, &outcome.stats);
        ctx.progress.stage_finished(name);
        Ok(StageOutcome {
            passed: outcome.passed,
            stop: outcome.stop,
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

/// What one embed stage did, for the certificate.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EmbedStats {
    pub model_id: String,
    pub units: u64,
    /// Units whose fact came from the cache.
    pub cached: u64,
    pub vectors_computed: u64,
    pub vectors_reused: u64,
    /// Tokens run through the encoder, padding excluded.
    pub tokens: u64,
    /// Texts cut at the stage's token limit.
    pub truncated: u64,
    /// Units that ended here as negatives.
    pub dropped: u64,
    /// Units sent on to the next stage.
    pub passed: u64,
}

struct EmbedOutcome {
    /// Facts of units that end at this stage (table position, fact).
    ended: Vec<(usize, FactRecord, Origin)>,
    /// Units that go on to the stage's `then`.
    passed: Vec<usize>,
    /// Every unit's similarity score, for the stages that use it as a
    /// proxy.
    scores: Vec<(usize, f64)>,
    stats: EmbedStats,
    /// Why the stage stopped before embedding every unit (an interrupt, the
    /// wall budget); the units it left ended `not_run`.
    stop: Option<StopReason>,
}

/// Where a stage's embedder lives and its identity, without loading it.
/// The default's identity is its pinned weights hash, so `explain` can key
/// cached facts without fetching anything.
pub fn embedder_identity(
    stage: &EmbedStage,
    spec_dir: &Path,
) -> Result<(Option<PathBuf>, String), RunError> {
    match &stage.spec.model {
        None => Ok((
            None,
            format!("all-MiniLM-L6-v2@{}", &MINILM_L6_V2[0].sha256[..16]),
        )),
        Some(dir) => {
            let dir = spec_dir.join(dir);
            let weights = EmbedderFiles::in_dir(&dir).weights;
            let hash = models::sha256_file(&weights).map_err(|e| embed_err(stage, e))?;
            let name = dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            Ok((Some(dir), format!("{name}@{}", &hash[..16])))
        }
    }
}

/// The key of embed stages' reports in the run's stats.
pub const REPORT: &str = "embed";

/// The run's loaded embedders, shared by every stage that embeds.
pub(crate) fn embedders<'c>(
    ctx: &'c mut StageContext<'_>,
    stage: &EmbedStage,
) -> Result<&'c mut Embedders, RunError> {
    ctx.shared
        .get::<Embedders>()
        .ok_or_else(|| embed_err(stage, "the run's embedders are not reachable"))
}

fn embed_err(
    stage: &EmbedStage,
    e: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
) -> RunError {
    RunError::Embed {
        stage: stage.name().to_owned(),
        source: e.into(),
    }
}

/// Loaded embedders by identity, so stages sharing a model load it once,
/// and only when some unit needs a vector.
#[derive(Default)]
pub struct Embedders(HashMap<String, Embedder>);

impl Embedders {
    fn get(
        &mut self,
        stage: &EmbedStage,
        dir: Option<&Path>,
        id: &str,
    ) -> Result<&Embedder, RunError> {
        if !self.0.contains_key(id) {
            let files = match dir {
                Some(d) => EmbedderFiles::in_dir(d),
                None => {
                    let [weights, tokenizer, config] =
                        models::ensure_each(&MINILM_L6_V2, &models::cache_dir(), &|line| {
                            eprintln!("{line}")
                        })
                        .map_err(|e| embed_err(stage, e))?;
                    EmbedderFiles {
                        weights,
                        tokenizer,
                        config,
                    }
                }
            };
            let e =
                Embedder::load(&files, stage.spec.max_tokens).map_err(|e| embed_err(stage, e))?;
            self.0.insert(id.to_owned(), e);
        }
        self.0
            .get(id)
            .ok_or_else(|| embed_err(stage, "embedder vanished"))
    }
}

/// The fact key of each unit, by the stage's projection.
fn fact_keys(
    stage: &EmbedStage,
    table: &UnitTable,
    indices: &[usize],
    model_id: &str,
) -> Result<Vec<(usize, ContentHash, String)>, RunError> {
    let projector = Projector::compile(
        stage.name(),
        stage.spec.project.as_deref(),
        &stage.spec.fields,
    )
    .map_err(project_err)?;
    indices
        .iter()
        .map(|&i| {
            let projected = projector
                .project(table.id(i)?.as_str(), &table.value(i))
                .map_err(project_err)?;
            let key = stage.cache_key(projected.key_in(INPUT_BUCKET), model_id);
            Ok((i, key, stage.text(&projected)))
        })
        .collect()
}

fn run_stage(
    stage: &EmbedStage,
    spec_dir: &Path,
    table: &UnitTable,
    indices: &[usize],
    store: &Store,
    embedders: &mut Embedders,
    budget: Option<&BudgetPool>,
) -> Result<EmbedOutcome, RunError> {
    let (dir, model_id) = embedder_identity(stage, spec_dir)?;
    let mut out = EmbedOutcome {
        stop: None,
        ended: Vec::new(),
        passed: Vec::new(),
        scores: Vec::new(),
        stats: EmbedStats {
            model_id: model_id.clone(),
            units: indices.len() as u64,
            ..EmbedStats::default()
        },
    };
    let keyed = fact_keys(stage, table, indices, &model_id)?;
    let mut decided: Vec<(usize, FactRecord, Origin)> = Vec::new();
    let mut open = Vec::new();
    for (i, key, text) in keyed {
        match store.get_fact(&key)? {
            Some(mut fact) => {
                out.stats.cached += 1;
                let u = table.unit(i)?;
                fact.source_ids = vec![u.unit_id.clone()];
                fact.source_hashes = vec![u.unit_hash];
                decided.push((i, fact, Origin::Cached));
            }
            None => open.push((i, key, text)),
        }
    }
    if !open.is_empty() {
        let anchor_texts: Vec<&str> = stage.anchors.iter().map(|a| a.text.as_str()).collect();
        let texts: Vec<&str> = open.iter().map(|(_, _, t)| t.as_str()).collect();
        let all: Vec<&str> = anchor_texts.iter().chain(&texts).copied().collect();
        let (vectors, stop) = vectors_for(
            stage,
            dir.as_deref(),
            &model_id,
            &all,
            store,
            embedders,
            &mut out.stats,
            budget,
        )?;
        let (anchors, unit_vectors) = vectors.split_at(anchor_texts.len());
        // Anchors come first in the batches: without every one of them no
        // unit can be scored.
        let anchors: Option<Vec<Vec<f32>>> = anchors.iter().cloned().collect();
        let params = ModelParams {
            backend: "embed".into(),
            model_id: model_id.clone(),
            temperature: 0.0,
            max_output_tokens: 0,
            seed: 0,
            simulated: false,
        };
        let mut fresh = Vec::with_capacity(open.len());
        for ((i, key, _), v) in open.into_iter().zip(unit_vectors) {
            let (Some(anchors), Some(v)) = (&anchors, v) else {
                // Stopped before this unit's batch: it never ran here.
                let why = stop.as_ref().map_or("stopped", StopReason::code);
                out.ended.push((
                    i,
                    not_run_fact(stage, &model_id, key, table, i, why)?,
                    Origin::Fresh,
                ));
                continue;
            };
            let scored = stage.score(v, anchors);
            let status = stage.decide(&scored);
            let u = table.unit(i)?;
            let fact = FactRecord {
                schema: FACT_SCHEMA.into(),
                key,
                source_ids: vec![u.unit_id.clone()],
                source_hashes: vec![u.unit_hash],
                stage: stage.name().to_owned(),
                stage_version: stage.spec.version,
                rubric_hash: stage.definition_hash(),
                model: params.clone(),
                status,
                decision: Some(
                    if status == Status::Positive {
                        "similar"
                    } else {
                        "dissimilar"
                    }
                    .into(),
                ),
                facts: stage.facts(&scored),
                confidence: None,
                choice_scores: Vec::new(),
                reason: (status == Status::Negative).then(|| {
                    format!(
                        "similarity score {:.4} is below the threshold {}",
                        scored.score, stage.spec.threshold
                    )
                }),
                evidence: Vec::new(),
                cost: Cost::default(),
                attempts: 0,
                reducer_path: Vec::new(),
                // The encoder's own cut is counted in the stage's stats.
                truncated_tokens: 0,
                digest: None,
            };
            fresh.push((i, fact, Origin::Fresh));
        }
        decided.extend(fresh);
        out.stop = stop;
    }
    decided.sort_by_key(|(i, _, _)| *i);
    if let Some(k) = stage.spec.top_k {
        keep_top(stage, k, &mut decided);
    }
    for (i, fact, origin) in decided {
        if let Some(score) = fact.facts.get("score").and_then(serde_json::Value::as_f64) {
            out.scores.push((i, score));
        }
        if fact.status == Status::Positive && stage.spec.then.is_some() {
            // A passed unit's fact is stored, so a rerun knows where it went.
            if origin == Origin::Fresh {
                store.put_fact(&fact)?;
            }
            out.stats.passed += 1;
            out.passed.push(i);
        } else {
            if fact.status == Status::Negative {
                out.stats.dropped += 1;
            }
            out.ended.push((i, fact, origin));
        }
    }
    Ok(out)
}

/// Decides every unit by rank: of those at or above the threshold, the `k`
/// highest scores pass, the rest end as negatives saying so. A cached
/// fact's status came from another set of units, so every status is
/// decided again from the stored score.
fn keep_top(stage: &EmbedStage, k: usize, decided: &mut [(usize, FactRecord, Origin)]) {
    let scores: Vec<f64> = decided
        .iter()
        .map(|(_, f, _)| {
            f.facts
                .get("score")
                .and_then(serde_json::Value::as_f64)
                .unwrap_or(f64::NEG_INFINITY)
        })
        .collect();
    let ranked = fanfold_ops::embed::ranks(&scores, stage.spec.threshold);
    let candidates = ranked.iter().flatten().count();
    for (((_, fact, _), rank), score) in decided.iter_mut().zip(ranked).zip(scores) {
        let kept = rank.is_some_and(|r| r < k);
        fact.status = if kept {
            Status::Positive
        } else {
            Status::Negative
        };
        fact.decision = Some(if kept { "similar" } else { "dissimilar" }.into());
        if let Some(obj) = fact.facts.as_object_mut() {
            obj.insert(
                "rank".into(),
                rank.map_or(serde_json::Value::Null, |r| (r + 1).into()),
            );
        }
        fact.reason = match rank {
            _ if kept => None,
            Some(r) => Some(format!(
                "similarity score {score:.4} ranks {} of {candidates}; only the {k} highest are kept",
                r + 1
            )),
            None => Some(format!(
                "similarity score {score:.4} is below the threshold {}",
                stage.spec.threshold
            )),
        };
    }
}

/// One vector a text, in order; `None` for a text the stage stopped
/// before embedding.
type Vectors = Vec<Option<Vec<f32>>>;

/// Texts embedded, and their vectors stored, at a time.
const EMBED_BATCH: usize = 32;

/// Vectors for `texts`, from the store where cached, else computed in
/// batches and cached as each batch is done. With `budget`, its time is
/// asked about before each batch: once the run is interrupted (or its wall
/// budget spent) no batch is started, the texts left have no vector, and
/// the reason is returned beside them.
#[allow(clippy::too_many_arguments)]
fn vectors_for(
    stage: &EmbedStage,
    dir: Option<&Path>,
    model_id: &str,
    texts: &[&str],
    store: &Store,
    embedders: &mut Embedders,
    stats: &mut EmbedStats,
    budget: Option<&BudgetPool>,
) -> Result<(Vectors, Option<StopReason>), RunError> {
    let keys: Vec<_> = texts
        .iter()
        .map(|t| vector_key(model_id, stage.spec.max_tokens, t))
        .collect();
    let mut vectors: Vec<Option<Vec<f32>>> = Vec::with_capacity(texts.len());
    for k in &keys {
        vectors.push(store.get_embedding(k)?);
    }
    // (position, text, key) of each text with no stored vector.
    let missing: Vec<(usize, &str, ContentHash)> = vectors
        .iter()
        .zip(texts.iter().zip(&keys))
        .enumerate()
        .filter(|(_, (v, _))| v.is_none())
        .map(|(i, (_, (&t, &k)))| (i, t, k))
        .collect();
    stats.vectors_reused += (texts.len() - missing.len()) as u64;
    let mut stop = None;
    if !missing.is_empty() {
        let embedder = embedders.get(stage, dir, model_id)?;
        // Stored batch by batch, so a killed or interrupted run keeps every
        // vector it computed but the last batch's.
        for part in missing.chunks(EMBED_BATCH) {
            if let Some(spent) = budget.and_then(BudgetPool::wall_spent) {
                stop = Some(spent);
                break;
            }
            let batch: Vec<&str> = part.iter().map(|&(_, t, _)| t).collect();
            let (computed, usage) = embedder.embed(&batch).map_err(|e| embed_err(stage, e))?;
            stats.vectors_computed += computed.len() as u64;
            stats.tokens += usage.tokens;
            stats.truncated += usage.truncated;
            let rows: Vec<_> = part
                .iter()
                .zip(&computed)
                .map(|(&(_, _, k), v)| (k, v.as_slice()))
                .collect();
            store.put_embeddings(model_id, &rows)?;
            for (&(i, _, _), v) in part.iter().zip(computed) {
                if let Some(slot) = vectors.get_mut(i) {
                    *slot = Some(v);
                }
            }
        }
    }
    Ok((vectors, stop))
}

/// The fact of a unit the stage stopped before embedding (`why`: the
/// stop's code): `not_run`, never stored, so a rerun embeds it.
fn not_run_fact(
    stage: &EmbedStage,
    model_id: &str,
    key: ContentHash,
    table: &UnitTable,
    i: usize,
    why: &str,
) -> Result<FactRecord, RunError> {
    let u = table.unit(i)?;
    Ok(FactRecord {
        schema: FACT_SCHEMA.into(),
        key,
        source_ids: vec![u.unit_id.clone()],
        source_hashes: vec![u.unit_hash],
        stage: stage.name().to_owned(),
        stage_version: stage.spec.version,
        rubric_hash: stage.definition_hash(),
        model: ModelParams {
            backend: "embed".into(),
            model_id: model_id.to_owned(),
            temperature: 0.0,
            max_output_tokens: 0,
            seed: 0,
            simulated: false,
        },
        status: Status::NotRun,
        decision: None,
        facts: serde_json::Value::Object(serde_json::Map::new()),
        confidence: None,
        choice_scores: Vec::new(),
        reason: Some(format!("not embedded: {why}")),
        evidence: Vec::new(),
        cost: Cost::default(),
        attempts: 0,
        reducer_path: Vec::new(),
        truncated_tokens: 0,
        digest: None,
    })
}

/// The vectors of `indices` as `runner` embeds them (its projection, its
/// model): from the store where stored; the rest computed and stored when
/// `embedders` is given, else `None` (for `explain`, which loads no model).
pub(crate) fn unit_vectors(
    runner: &EmbedRunner,
    table: &UnitTable,
    indices: &[usize],
    store: &Store,
    embedders: Option<&mut Embedders>,
) -> Result<Vec<Option<Vec<f32>>>, RunError> {
    let stage = &runner.stage;
    let (dir, model_id) = embedder_identity(stage, &runner.spec_dir)?;
    let texts: Vec<String> = fact_keys(stage, table, indices, &model_id)?
        .into_iter()
        .map(|(_, _, text)| text)
        .collect();
    let Some(embedders) = embedders else {
        return texts
            .iter()
            .map(|t| Ok(store.get_embedding(&vector_key(&model_id, stage.spec.max_tokens, t))?))
            .collect();
    };
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let mut stats = EmbedStats::default();
    let (vectors, _) = vectors_for(
        stage,
        dir.as_deref(),
        &model_id,
        &refs,
        store,
        embedders,
        &mut stats,
        None,
    )?;
    Ok(vectors)
}

/// What an embed stage kept of the units a spec routes to it, tried
/// before any run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Preview {
    /// Units the prefilter routes to the stage.
    pub units: u64,
    /// Of those, the ones embedded: all, or an even spread of them.
    pub tried: u64,
    /// Of those, the ones the stage keeps.
    pub kept: u64,
}

/// Tries an embed stage on `all`, the units the prefilter routes to it (at
/// most `most` of them, spread evenly), before any run. Their vectors and
/// facts go into `store` as a run's would, so a run or an `explain` on that
/// store finds them and embeds nothing again.
pub fn preview(
    runner: &EmbedRunner,
    spec_dir: &Path,
    table: &UnitTable,
    all: &[usize],
    store: &Store,
    most: usize,
) -> Result<Preview, RunError> {
    let tried: Vec<usize> = if all.len() <= most {
        all.to_vec()
    } else {
        (0..most)
            .filter_map(|k| all.get(k * all.len() / most).copied())
            .collect()
    };
    let outcome = run_stage(
        &runner.stage,
        spec_dir,
        table,
        &tried,
        store,
        &mut Embedders::default(),
        None,
    )?;
    for (_, fact, origin) in &outcome.ended {
        if *origin == Origin::Fresh {
            store.put_fact(fact)?;
        }
    }
    let kept = outcome.passed.len()
        + outcome
            .ended
            .iter()
            .filter(|(_, f, _)| f.status == Status::Positive)
            .count();
    Ok(Preview {
        units: all.len() as u64,
        tried: tried.len() as u64,
        kept: kept as u64,
    })
}
