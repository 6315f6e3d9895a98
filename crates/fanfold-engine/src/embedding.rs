//! Running an embed stage: key each unit's fact, embed only the texts no
//! cached vector covers, score, and split the units into those that end
//! here and those that go on.
//!
//! Two caches sit under one stage. The fact cache keys on the stage's
//! meaning (texts, threshold, model), so an unchanged rerun embeds nothing.
//! The vector cache keys on the model and the text alone, so a new
//! threshold or a new anchor text re-scores without re-embedding a unit.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use fanfold_core::{Cost, FACT_SCHEMA, FactRecord, ModelParams, StableHash, Status};
use fanfold_embed::{Embedder, EmbedderFiles};
use fanfold_ops::embed::{EmbedStage, vector_key};
use fanfold_ops::partition::PartUnit;
use fanfold_store::Store;
use serde::{Deserialize, Serialize};

use crate::models::{self, MINILM_L6_V2};
use crate::run::{Projector, RunError};

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

pub(crate) struct EmbedOutcome {
    /// Facts of units that end at this stage (index, fact).
    pub ended: Vec<(usize, FactRecord)>,
    /// Units that go on to the stage's `then`.
    pub passed: Vec<usize>,
    pub stats: EmbedStats,
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

fn embed_err(stage: &EmbedStage, e: impl std::fmt::Display) -> RunError {
    RunError::Embed {
        stage: stage.name().to_owned(),
        detail: e.to_string(),
    }
}

/// Loaded embedders by identity, so stages sharing a model load it once,
/// and only when some unit needs a vector.
#[derive(Default)]
pub(crate) struct Embedders(HashMap<String, Embedder>);

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
                    let paths = models::ensure_all(&MINILM_L6_V2, &models::cache_dir(), &|line| {
                        eprintln!("{line}")
                    })
                    .map_err(|e| embed_err(stage, e))?;
                    EmbedderFiles {
                        weights: paths[0].clone(),
                        tokenizer: paths[1].clone(),
                        config: paths[2].clone(),
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
pub(crate) fn fact_keys(
    stage: &EmbedStage,
    units: &[PartUnit],
    indices: &[usize],
    model_id: &str,
) -> Result<Vec<(usize, fanfold_core::ContentHash, String)>, RunError> {
    let projector = Projector::compile(stage.name(), stage.spec.project.as_deref())?;
    indices
        .iter()
        .map(|&i| {
            let projected = projector.project(stage.name(), &stage.spec.fields, &units[i])?;
            let key = stage.cache_key(projected.key_in("input-v1"), model_id);
            Ok((i, key, stage.text(&projected)))
        })
        .collect()
}

pub(crate) fn run_stage(
    stage: &EmbedStage,
    spec_dir: &Path,
    units: &[PartUnit],
    indices: &[usize],
    store: &Store,
    embedders: &mut Embedders,
) -> Result<EmbedOutcome, RunError> {
    let (dir, model_id) = embedder_identity(stage, spec_dir)?;
    let mut out = EmbedOutcome {
        ended: Vec::new(),
        passed: Vec::new(),
        stats: EmbedStats {
            model_id: model_id.clone(),
            units: indices.len() as u64,
            ..EmbedStats::default()
        },
    };
    let keyed = fact_keys(stage, units, indices, &model_id)?;
    let mut decided: Vec<(usize, FactRecord)> = Vec::new();
    let mut open = Vec::new();
    for (i, key, text) in keyed {
        match store.get_fact(&key)? {
            Some(mut fact) => {
                out.stats.cached += 1;
                fact.source_ids = vec![units[i].unit.unit_id.clone()];
                fact.source_hashes = vec![units[i].unit.unit_hash];
                decided.push((i, fact));
            }
            None => open.push((i, key, text)),
        }
    }
    if !open.is_empty() {
        let anchor_texts: Vec<&str> = stage.anchors.iter().map(|a| a.text.as_str()).collect();
        let texts: Vec<&str> = open.iter().map(|(_, _, t)| t.as_str()).collect();
        let all: Vec<&str> = anchor_texts.iter().chain(&texts).copied().collect();
        let vectors = vectors_for(
            stage,
            dir.as_deref(),
            &model_id,
            &all,
            store,
            embedders,
            &mut out.stats,
        )?;
        let (anchors, unit_vectors) = vectors.split_at(anchor_texts.len());
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
            let scored = stage.score(v, anchors);
            let status = stage.decide(&scored);
            let u = &units[i];
            let fact = FactRecord {
                schema: FACT_SCHEMA.into(),
                key,
                source_ids: vec![u.unit.unit_id.clone()],
                source_hashes: vec![u.unit.unit_hash],
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
            };
            store.put_fact(&fact)?;
            fresh.push((i, fact));
        }
        decided.extend(fresh);
    }
    decided.sort_by_key(|(i, _)| *i);
    for (i, fact) in decided {
        if fact.status == Status::Positive && stage.spec.then.is_some() {
            out.stats.passed += 1;
            out.passed.push(i);
        } else {
            if fact.status == Status::Negative {
                out.stats.dropped += 1;
            }
            out.ended.push((i, fact));
        }
    }
    Ok(out)
}

/// Vectors for `texts`, from the store where cached, else computed in one
/// batch and cached.
fn vectors_for(
    stage: &EmbedStage,
    dir: Option<&Path>,
    model_id: &str,
    texts: &[&str],
    store: &Store,
    embedders: &mut Embedders,
    stats: &mut EmbedStats,
) -> Result<Vec<Vec<f32>>, RunError> {
    let keys: Vec<_> = texts
        .iter()
        .map(|t| vector_key(model_id, stage.spec.max_tokens, t))
        .collect();
    let mut vectors: Vec<Option<Vec<f32>>> = Vec::with_capacity(texts.len());
    for k in &keys {
        vectors.push(store.get_embedding(k)?);
    }
    let missing: Vec<usize> = (0..texts.len()).filter(|&i| vectors[i].is_none()).collect();
    stats.vectors_reused += (texts.len() - missing.len()) as u64;
    if !missing.is_empty() {
        let embedder = embedders.get(stage, dir, model_id)?;
        let batch: Vec<&str> = missing.iter().map(|&i| texts[i]).collect();
        let (computed, usage) = embedder.embed(&batch).map_err(|e| embed_err(stage, e))?;
        stats.vectors_computed += computed.len() as u64;
        stats.tokens += usage.tokens;
        stats.truncated += usage.truncated;
        let rows: Vec<_> = missing
            .iter()
            .zip(&computed)
            .map(|(&i, v)| (keys[i], v.as_slice()))
            .collect();
        store.put_embeddings(model_id, &rows)?;
        for (i, v) in missing.into_iter().zip(computed) {
            vectors[i] = Some(v);
        }
    }
    Ok(vectors.into_iter().map(Option::unwrap_or_default).collect())
}
