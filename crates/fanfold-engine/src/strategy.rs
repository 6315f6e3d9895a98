//! Whole-run strategies: the same question answered another way than the
//! spec declares it (one micro-context per unit, coarse chunks, one long
//! context, a scoring rung alone). Each is a rewrite of the spec, so it
//! runs on the same engine, store, cache, fold, verify and certificate.
//! `fanfold bench ladder` measures them against an oracle offline;
//! `fanfold plan` measures them against a declared target on a labelled
//! sample, and `run --plan` runs the one it chose. Both rewrite through
//! [`apply`].

use std::collections::BTreeSet;

use fanfold_core::spec::compress::CompressSpec;
use fanfold_core::spec::rerank::RerankStageSpec;
use fanfold_core::spec::{
    BackendSpec, ChunkStageSpec, ContractSpec, MapStageSpec, ReducerKind, Spec, StageSpec,
};

/// What a strategy needs to know of a spec beyond the spec itself.
#[derive(Clone, Debug)]
pub struct Roles {
    /// The map stage that judges each unit.
    pub judge: String,
    /// The scoring rung (an embed or BM25 stage) the `embed` strategy and
    /// the top-k strategies keep.
    pub rung: Option<String>,
    /// The reducer whose set is the answer.
    pub answer: String,
    /// What one unit is called, singular and plural.
    pub unit: String,
    pub units: String,
}

impl Roles {
    /// The roles a spec declares for `judge`: the set of units over it
    /// (or over every stage) is the answer.
    pub fn of(spec: &Spec, judge: &str, rung: Option<&str>) -> Result<Roles, String> {
        let answer = spec
            .fold
            .reducers
            .iter()
            .find(|r| {
                r.stage.as_deref().is_none_or(|s| s == judge)
                    && matches!(r.kind, ReducerKind::Set { value: None, .. })
            })
            .map(|r| r.name.clone())
            .ok_or_else(|| {
                format!("no `set` reducer reads stage `{judge}`: a strategy needs its answer")
            })?;
        Ok(Roles {
            judge: judge.to_owned(),
            rung: rung.map(str::to_owned),
            answer,
            unit: "unit".into(),
            units: "units".into(),
        })
    }
}

/// The model's context window the long and chunk strategies fill:
/// SmolLM2's trained length.
pub const WINDOW_TOKENS: u64 = 8192;

/// A threshold below every score: the embed stage keeps everything, or
/// ranks everything.
pub const OPEN_THRESHOLD: f64 = -10.0;

/// The rubric a chunk or long context is judged by, beside the spec: it
/// asks for the matching ids, which a per-unit rubric does not.
pub const CHUNK_RUBRIC: &str = "chunk.md";

/// The top-k strategies, with the k and the development recall it keeps.
#[derive(Clone, Copy, Debug)]
pub struct TopK {
    pub k: usize,
    pub recall: f64,
}

/// The spec `strategy` runs, and what it runs in words. `backend` sends
/// every model stage to that backend in place of the judge's own.
pub fn apply(
    base: &Spec,
    roles: &Roles,
    strategy: &str,
    backend: Option<&str>,
    top_k: Option<TopK>,
) -> Result<(Spec, String), String> {
    let mut spec = base.clone();
    // The audit measures the rungs; it is not a strategy.
    spec.stages.retain(|s| !matches!(s, StageSpec::Audit(_)));
    // A strategy decides every unit its own way: no cascade in front.
    for s in &mut spec.stages {
        if let StageSpec::Map(m) = s {
            m.cascade = None;
        }
    }
    drop_proxy_only_stages(&mut spec, &roles.judge);
    let judge = spec
        .stages
        .iter()
        .find_map(|s| match s {
            StageSpec::Map(m) if m.name == roles.judge => Some(m.clone()),
            _ => None,
        })
        .ok_or_else(|| format!("the spec has no map stage `{}`", roles.judge))?;
    let model_backend = backend.unwrap_or(&judge.backend).to_owned();
    if !spec.backends.contains_key(&model_backend) {
        return Err(format!("the spec declares no backend `{model_backend}`"));
    }
    let rung = || {
        roles
            .rung
            .clone()
            .ok_or_else(|| format!("strategy `{strategy}` needs a scoring rung"))
    };
    let chunk = |size: Option<usize>, contexts: Option<usize>| {
        StageSpec::Chunk(ChunkStageSpec {
            name: roles.judge.clone(),
            version: 1,
            rubric: CHUNK_RUBRIC.into(),
            fields: judge.fields.clone(),
            project: judge.project.clone(),
            backend: model_backend.clone(),
            size,
            window_tokens: WINDOW_TOKENS,
            max_contexts: contexts,
            max_attempts: 2,
            max_output_tokens: 256,
            temperature: 0.0,
            seed: 0,
            execution: judge.execution,
        })
    };
    let plan = match strategy {
        "embed" => {
            let rung = rung()?;
            keep_rung_alone(&mut spec, roles, &rung)?;
            let what = match spec.stages.first() {
                Some(StageSpec::Bm25(_)) => format!("the BM25 rung `{rung}`"),
                _ => "the embedding rung".to_owned(),
            };
            format!("prefilter, then {what} alone: its positives are the answer")
        }
        "embed-top-k" | "embed-top-k-judge" => {
            let TopK { k, recall } = top_k.ok_or_else(|| format!("{strategy} needs its k"))?;
            let rung = rung()?;
            let judged = strategy == "embed-top-k-judge";
            if !judged {
                keep_rung_alone(&mut spec, roles, &rung)?;
            }
            for s in &mut spec.stages {
                if let StageSpec::Embed(e) = s
                    && e.name == rung
                {
                    e.threshold = OPEN_THRESHOLD;
                    e.top_k = Some(k);
                }
            }
            format!(
                "prefilter, then the {k} {} most like the question by embedding (k keeps {:.0} % of the development split's positives){}",
                roles.units,
                recall * 100.0,
                if judged {
                    ", each judged in its own micro-context"
                } else {
                    ": they are the answer"
                }
            )
        }
        "chunk-10" | "chunk-50" | "chunk-200" => {
            let k: usize = strategy["chunk-".len()..]
                .parse()
                .map_err(|e| format!("{strategy}: {e}"))?;
            spec.stages = vec![chunk(Some(k), None)];
            drop_themes(&mut spec);
            format!(
                "prefilter, then contexts of up to {k} {} (and {WINDOW_TOKENS} tokens); the model lists the matching ids",
                roles.units
            )
        }
        "long" => {
            spec.stages = vec![chunk(None, Some(1))];
            drop_themes(&mut spec);
            format!(
                "prefilter, then one context of {WINDOW_TOKENS} tokens; what it cannot hold is not_run"
            )
        }
        "micro" => {
            spec.stages.retain(|s| s.name() == roles.judge);
            format!(
                "prefilter, then one micro-context per {} (shared prefix)",
                roles.unit
            )
        }
        "rerank" => {
            let rung = rung()?;
            rerank_between(&mut spec, roles, &rung, &judge)?;
            format!(
                "prefilter, embedding rung, then the model's reranker: the {} it scores at least {RERANK_MIN_SCORE} for relevance to the question (its probability of `yes`, one forward pass for each), each judged in its own micro-context",
                roles.units
            )
        }
        "compress-50" => {
            spec.stages.retain(|s| s.name() == roles.judge);
            for s in &mut spec.stages {
                if let StageSpec::Map(m) = s {
                    m.compress = Some(CompressSpec {
                        keep: COMPRESS_KEEP,
                        min_words: COMPRESS_MIN_WORDS,
                    });
                }
            }
            format!(
                "prefilter, then one micro-context per {} whose text fields keep {:.0} % of their words, the least surprising to the model dropped (LLMLingua-style); evidence still quoted from the uncompressed {}",
                roles.unit,
                COMPRESS_KEEP * 100.0,
                roles.unit
            )
        }
        "adaptive" => {
            let widened = spec.stages.iter().any(|s| matches!(s, StageSpec::Widen(_)));
            format!(
                "prefilter, embedding rung, then one micro-context per {}{}",
                roles.unit,
                if widened {
                    " (what it cannot decide alone judged again beside its related units)"
                } else {
                    ""
                }
            )
        }
        other => return Err(format!("no strategy `{other}`")),
    };
    // Widening is the adaptive rung's: every other strategy judges each
    // unit once, in the context its plan names.
    if strategy != "adaptive" {
        spec.stages.retain(|s| !matches!(s, StageSpec::Widen(_)));
        for s in &mut spec.stages {
            if let StageSpec::Map(m) = s {
                m.widen = None;
            }
        }
    }
    // Reducers of a stage the strategy does not run have nothing to read.
    let names: BTreeSet<String> = spec.stages.iter().map(|s| s.name().to_owned()).collect();
    spec.fold
        .reducers
        .retain(|r| r.stage.as_ref().is_none_or(|s| names.contains(s)));
    for s in &mut spec.stages {
        if let Some(turn) = s.model_turn_mut() {
            *turn.backend = model_backend.clone();
        }
    }
    // A scripted judge answers one unit at a time; a chunk stage on the
    // scripted backend gets the spec's [SIMULATED] lister instead.
    if let Some(BackendSpec::Scripted { .. }) = spec.backends.get(&model_backend)
        && spec.stages.iter().any(|s| matches!(s, StageSpec::Chunk(_)))
    {
        let lister = BackendSpec::Scripted {
            script: "scripted-chunk.jq".into(),
            faults: Vec::new(),
            delay_ms: 0,
        };
        spec.backends.insert("scripted_chunk".into(), lister);
        for s in &mut spec.stages {
            if let StageSpec::Chunk(c) = s {
                c.backend = "scripted_chunk".into();
            }
        }
    }
    // The scripted judge's script answers a judge's schema; a reranker on
    // the scripted backend gets the spec's [SIMULATED] reranker script.
    if let Some(BackendSpec::Scripted { .. }) = spec.backends.get(&model_backend)
        && spec
            .stages
            .iter()
            .any(|s| matches!(s, StageSpec::Rerank(_)))
    {
        let scorer = BackendSpec::Scripted {
            script: SCRIPTED_RERANK.into(),
            faults: Vec::new(),
            delay_ms: 0,
        };
        spec.backends.insert("scripted_rerank".into(), scorer);
        for s in &mut spec.stages {
            if let StageSpec::Rerank(r) = s {
                r.backend = "scripted_rerank".into();
            }
        }
    }
    // The embedded model's slots must hold a whole context.
    if strategy.starts_with("chunk-") || strategy == "long" {
        for b in spec.backends.values_mut() {
            if let BackendSpec::Llama { slot_tokens, .. } = b {
                *slot_tokens = (*slot_tokens).max(WINDOW_TOKENS as u32);
            }
        }
    }
    Ok((spec, plan))
}

/// Drops the map stages other than `judge` that only a cascade reached
/// (a scored stage declared as a proxy `fanfold plan` may choose): with
/// the cascades gone no unit reaches them, and a plan refuses a stage no
/// unit reaches. A stage the first one, a prefilter rule or another stage
/// names is kept.
fn drop_proxy_only_stages(spec: &mut Spec, judge: &str) {
    fn names(value: &serde_json::Value, name: &str) -> bool {
        match value {
            serde_json::Value::String(s) => s == name,
            serde_json::Value::Array(a) => a.iter().any(|v| names(v, name)),
            serde_json::Value::Object(o) => o.values().any(|v| names(v, name)),
            _ => false,
        }
    }
    let first = spec.stages.first().map(|s| s.name().to_owned());
    let routed = |name: &str| {
        spec.prefilter
            .iter()
            .any(|r| r.stage.as_deref() == Some(name))
    };
    let named_by_another = |name: &str| {
        spec.stages.iter().filter(|s| s.name() != name).any(|s| {
            serde_json::to_value(s)
                .map(|v| names(&v, name))
                .unwrap_or(true)
        })
    };
    let unreached: Vec<String> = spec
        .stages
        .iter()
        .filter_map(|s| match s {
            StageSpec::Map(m)
                if m.name != judge
                    && first.as_deref() != Some(m.name.as_str())
                    && !routed(&m.name)
                    && !named_by_another(&m.name) =>
            {
                Some(m.name.clone())
            }
            _ => None,
        })
        .collect();
    spec.stages
        .retain(|s| !unreached.iter().any(|n| n == s.name()));
}

/// The reranker's name in the `rerank` strategy's spec.
pub const RERANK_STAGE: &str = "rerank";

/// The `rerank` strategy's cut: the reranker's `yes` must outweigh its
/// `no`.
pub const RERANK_MIN_SCORE: f64 = 0.5;

/// The `compress-50` strategy's share of words kept, and the shortest
/// field it compresses.
pub const COMPRESS_KEEP: f64 = 0.5;
pub const COMPRESS_MIN_WORDS: usize = 8;

/// The [SIMULATED] reranker's script beside a spec, for the scripted
/// backend.
pub const SCRIPTED_RERANK: &str = "scripted-rerank.jq";

/// The spec's scoring rung, then a reranker over what it keeps, then the
/// judge over what the reranker keeps; nothing else.
fn rerank_between(
    spec: &mut Spec,
    roles: &Roles,
    rung: &str,
    judge: &MapStageSpec,
) -> Result<(), String> {
    spec.stages
        .retain(|s| s.name() == rung || s.name() == roles.judge);
    match spec.stages.first_mut() {
        Some(StageSpec::Embed(e)) if e.name == rung => e.then = Some(RERANK_STAGE.into()),
        Some(StageSpec::Bm25(b)) if b.name == rung => b.then = Some(RERANK_STAGE.into()),
        _ => {
            return Err(format!(
                "`{rung}` is not an embed or BM25 stage before the judge"
            ));
        }
    }
    let reranker = StageSpec::Rerank(RerankStageSpec {
        name: RERANK_STAGE.into(),
        version: 1,
        query: None,
        fields: judge.fields.clone(),
        project: judge.project.clone(),
        backend: judge.backend.clone(),
        top_k: None,
        min_score: Some(RERANK_MIN_SCORE),
        then: Some(roles.judge.clone()),
        max_attempts: 2,
        max_output_tokens: 16,
        temperature: 0.0,
        seed: 0,
        execution: judge.execution,
    });
    spec.stages.insert(1, reranker);
    // The reranker's kept units have no fact of its own; its cut ones are
    // negatives. The answer is the judge's.
    for r in &mut spec.fold.reducers {
        if r.name == roles.answer {
            r.stage = Some(roles.judge.clone());
        }
    }
    Ok(())
}

/// Keeps only the scoring rung `rung` (passing nothing on), whose
/// positives become the answer.
fn keep_rung_alone(spec: &mut Spec, roles: &Roles, rung: &str) -> Result<(), String> {
    spec.stages.retain(|s| s.name() == rung);
    match spec.stages.first_mut() {
        Some(StageSpec::Embed(e)) => e.then = None,
        Some(StageSpec::Bm25(b)) => b.then = None,
        _ => return Err(format!("`{rung}` is not an embed or BM25 stage")),
    }
    for r in &mut spec.fold.reducers {
        if r.name == roles.answer {
            r.stage = Some(rung.to_owned());
        }
    }
    drop_themes(spec);
    Ok(())
}

/// A strategy whose facts name no cause has no themes to report.
pub fn drop_themes(spec: &mut Spec) {
    if let ContractSpec::Exhaustive { themes, .. } = &mut spec.contract
        && let Some(name) = themes.take()
    {
        spec.fold.reducers.retain(|r| r.name != name);
    }
}
