//! The populations the cascade benches measure on, shared by `fanfold
//! bench cascade` and `fanfold bench classifier`: the shape of the
//! synthetic one, and an example's units with their truth, the proxies'
//! scores and their embeddings.

use std::collections::BTreeSet;
use std::path::Path;

use anyhow::{Context, Result, anyhow};
use fanfold_core::spec::{Bm25StageSpec, Spec};
use fanfold_embed::{Embedder, EmbedderFiles};
use fanfold_engine::Plan;
use fanfold_engine::models::{MINILM_L6_V2, cache_dir, ensure_each};
use fanfold_ops::bm25::{Bm25Stage, text_of, tokens};
use fanfold_ops::proxy;
use fanfold_ops::view::Projector;

use crate::ladder::LadderConfig;

/// The synthetic population: big enough that the labels are a sample.
pub(crate) const UNITS: usize = 2000;
pub(crate) const PREVALENCE: f64 = 0.2;
/// The distance between the class means: of the scores' normals, and of
/// the vectors'.
pub(crate) const SEPARATION: f64 = 2.5;
/// Dimensions of the synthetic vectors a trained proxy reads.
pub(crate) const DIMS: usize = 16;

/// The synthetic population as vectors, for a trained proxy: each unit's
/// vector and its truth.
pub(crate) fn synthetic_vectors(seed: u64) -> (Vec<Vec<f32>>, Vec<bool>) {
    proxy::synthetic_vectors(seed, UNITS, PREVALENCE, DIMS, SEPARATION)
}

/// The example's units the prefilter keeps, their truth and the proxies'
/// scores.
pub(crate) struct Population {
    pub(crate) ids: Vec<String>,
    /// One label per distinct view: the judge's view of the line, hashed.
    pub(crate) keys: Vec<u64>,
    pub(crate) truth: Vec<bool>,
    /// Each proxy's name and its score of every unit.
    pub(crate) proxies: Vec<(&'static str, Vec<f64>)>,
    /// Each line's embedding, for the trained proxy.
    pub(crate) vectors: Vec<Vec<f32>>,
    /// Distinct views the judge would see: one micro-context call each
    /// (content-addressed facts are shared), before retries.
    pub(crate) micro_calls: usize,
    /// The example's own caveat, from its ladder configuration.
    pub(crate) note: Option<String>,
}

/// Reads `example` (its spec, ladder configuration and truth), routes its
/// input, and scores every unit the prefilter keeps by BM25 and by the
/// embedding margin, embedding each with the default embedder.
pub(crate) fn population(example: &Path) -> Result<Population> {
    let spec_path = example.join("spec.toml");
    let text = std::fs::read_to_string(&spec_path)
        .with_context(|| format!("reading {}", spec_path.display()))?;
    let spec = Spec::from_toml(&text).map_err(|e| anyhow!("{}: {e}", spec_path.display()))?;
    let cfg = LadderConfig::read(example)?;
    let positives: BTreeSet<String> = crate::ladder::read_truth(&cfg, example, &spec, &text)?;
    let plan = Plan::load(&spec_path)?;
    let routed = crate::fabric::example_units(&plan)?;
    let kept = routed
        .by_stage
        .get(plan.first_stage())
        .cloned()
        .unwrap_or_default();
    let judge = plan
        .map_stage(&cfg.judge)
        .ok_or_else(|| anyhow!("the example has no map stage `{}`", cfg.judge))?;
    let judge_view = Projector::compile(
        judge.name(),
        judge.spec.project.as_deref(),
        &judge.spec.fields,
    )?;
    let embed = plan
        .embed_stage(&cfg.embed)
        .ok_or_else(|| anyhow!("the example has no embed stage `{}`", cfg.embed))?;
    let embed_view = Projector::compile(
        embed.name(),
        embed.spec.project.as_deref(),
        &embed.spec.fields,
    )?;
    let bm25 = Bm25Stage::new(Bm25StageSpec {
        name: "bm25".into(),
        version: 1,
        fields: Vec::new(),
        project: judge.spec.project.clone(),
        query: cfg.bm25_query.clone(),
        threshold: 0.0,
        then: None,
        k1: 1.2,
        b: 0.75,
    })?;
    let mut ids = Vec::with_capacity(kept.len());
    let mut truth = Vec::with_capacity(kept.len());
    let mut docs = Vec::with_capacity(kept.len());
    let mut texts = Vec::with_capacity(kept.len());
    let mut views = BTreeSet::new();
    let mut keys = Vec::with_capacity(kept.len());
    for &i in &kept {
        let id = routed.table.id(i)?;
        let value = routed.table.value(i);
        let view = judge_view.project(id.as_str(), &value)?;
        docs.push(tokens(&text_of(&view)));
        let text = view.to_string();
        let hash = blake3::hash(text.as_bytes());
        keys.push(u64::from_le_bytes(
            *hash.as_bytes().first_chunk::<8>().unwrap_or(&[0; 8]),
        ));
        views.insert(text);
        texts.push(embed.text(&embed_view.project(id.as_str(), &value)?));
        truth.push(positives.contains(id.as_str()));
        ids.push(id.0.clone());
    }
    let bm25_scores = bm25.scores(&docs);
    let [weights, tokenizer, config] =
        ensure_each(&MINILM_L6_V2, &cache_dir(), &|l| eprintln!("{l}"))?;
    let embedder = Embedder::load(
        &EmbedderFiles {
            weights,
            tokenizer,
            config,
        },
        embed.spec.max_tokens,
    )?;
    let anchors: Vec<&str> = embed.anchors.iter().map(|a| a.text.as_str()).collect();
    let (anchor_vectors, _) = embedder.embed(&anchors)?;
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let (vectors, _) = embedder.embed(&refs)?;
    let embed_scores = vectors
        .iter()
        .map(|v| embed.score(v, &anchor_vectors).score)
        .collect();
    Ok(Population {
        ids,
        keys,
        truth,
        proxies: vec![("bm25", bm25_scores), ("embed margin", embed_scores)],
        vectors,
        micro_calls: views.len(),
        note: cfg.note,
    })
}
