//! `fanfold bench embed`: the example's embed stage against the fixture's
//! oracle. Throughput of the local encoder, and where its threshold falls
//! among the scores of each kind of issue the prefilter keeps: how many true
//! blockers it would lose and how many decoys it drops, with the margin.
//!
//! Then the encoder's speed on 2,000 generated issues: the native forward
//! pass against the candle reference in one run, as texts/s, tokens/s and
//! GFLOP/s against a GEMM probe of the machine's peak, with the two
//! vectors' cosine agreement; the `max_tokens` knob's speed and its effect
//! on the stage's AUC; and, when `FANFOLD_EMBED_COMPARE_PYTHON` names a
//! Python with the packages, sentence-transformers and fastembed on the
//! same texts through `bench/embed/compare.py`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Result, anyhow};
use fanfold_embed::{Backend, Embedder, EmbedderFiles, Profile, cosine, gemm_probe_gflops};
use fanfold_engine::Plan;
use fanfold_engine::models::{MINILM_L6_V2, cache_dir, ensure_each};
use fanfold_ops::view::Projector;

pub struct EmbedArgs {
    pub example: PathBuf,
    pub report: PathBuf,
}

/// The oracle's kind of each issue: `blocker` or a decoy category. A
/// decoy that is also a true blocker (a near duplicate) counts as a blocker.
fn oracle_kinds(path: &Path) -> Result<BTreeMap<String, String>> {
    let oracle = crate::selfcheck::read_oracle(path)?;
    let mut kinds = BTreeMap::new();
    for (kind, ids) in &oracle.decoys {
        for id in ids {
            kinds.insert(id.to_string(), kind.clone());
        }
    }
    for id in &oracle.blocker_ids {
        kinds.insert(id.to_string(), "blocker".into());
    }
    Ok(kinds)
}

pub fn main(args: EmbedArgs) -> Result<()> {
    let plan = Plan::load(&args.example.join("spec.toml"))?;
    let stage = plan
        .stages
        .iter()
        .find_map(|s| plan.embed_stage(s.name()))
        .ok_or_else(|| anyhow!("the example has no embed stage"))?;
    let routed = crate::fabric::example_units(&plan)?;
    let kept = routed
        .by_stage
        .get(stage.name())
        .cloned()
        .unwrap_or_default();
    let projector = Projector::compile(
        stage.name(),
        stage.spec.project.as_deref(),
        &stage.spec.fields,
    )?;
    let mut texts = Vec::with_capacity(kept.len());
    for &i in &kept {
        let projected = projector.project(routed.table.id(i)?.as_str(), &routed.table.value(i))?;
        texts.push(stage.text(&projected));
    }

    let [weights, tokenizer, config] =
        ensure_each(&MINILM_L6_V2, &cache_dir(), &|l| eprintln!("{l}"))?;
    let files = EmbedderFiles {
        weights,
        tokenizer,
        config,
    };
    let load_started = Instant::now();
    let embedder = Embedder::load(&files, stage.spec.max_tokens)?;
    let load_s = load_started.elapsed().as_secs_f64();
    let anchors: Vec<&str> = stage.anchors.iter().map(|a| a.text.as_str()).collect();
    let (anchor_vectors, _) = embedder.embed(&anchors)?;
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let started = Instant::now();
    let (vectors, usage) = embedder.embed(&refs)?;
    let embed_s = started.elapsed().as_secs_f64();

    let kinds = oracle_kinds(&args.example.join("oracle.json"))?;
    let threshold = stage.spec.threshold;
    let mut by_kind: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for (&i, v) in kept.iter().zip(&vectors) {
        let score = stage.score(v, &anchor_vectors).score;
        let kind = kinds
            .get(routed.table.id(i)?.as_str())
            .cloned()
            .unwrap_or_else(|| "unlabelled".into());
        by_kind.entry(kind).or_default().push(score);
    }
    for scores in by_kind.values_mut() {
        scores.sort_by(f64::total_cmp);
    }
    let blockers = by_kind.get("blocker").cloned().unwrap_or_default();
    let lost = blockers.iter().filter(|s| **s < threshold).count();
    let lowest_blocker = blockers.first().copied();
    let dropped: usize = by_kind
        .iter()
        .filter(|(k, _)| k.as_str() != "blocker")
        .map(|(_, s)| s.iter().filter(|x| **x < threshold).count())
        .sum();
    let decoys: usize = by_kind
        .iter()
        .filter(|(k, _)| k.as_str() != "blocker")
        .map(|(_, s)| s.len())
        .sum();
    let highest_dropped = by_kind
        .values()
        .flatten()
        .copied()
        .filter(|s| *s < threshold)
        .reduce(f64::max);

    let mut body = String::new();
    let _ = writeln!(body, "## Embed stage (`fanfold bench embed`)\n");
    let _ = writeln!(
        body,
        "The example's `{}` stage over the {} issues its prefilter keeps, scored by all-MiniLM-L6-v2 (fanfold's native encoder, CPU, {} threads available) against {} anchor texts, and compared with the fixture's oracle (read here, never by the pipeline). Measured on {}.\n",
        stage.name(),
        kept.len(),
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        anchors.len(),
        crate::report::utc_date(std::time::SystemTime::now())
    );
    let _ = writeln!(
        body,
        "- Encoder: loaded in {load_s:.2} s; {} texts, {} tokens ({} cut at {} tokens) in {embed_s:.2} s: {:.1} texts/s, {:.0} tokens/s.",
        usage.texts,
        usage.tokens,
        usage.truncated,
        stage.spec.max_tokens,
        usage.texts as f64 / embed_s.max(1e-9),
        usage.tokens as f64 / embed_s.max(1e-9)
    );
    let _ = writeln!(
        body,
        "- Threshold {threshold}: drops {dropped} of {decoys} decoys and loses {lost} of {} true blockers.",
        blockers.len()
    );
    if let (Some(low), Some(high)) = (lowest_blocker, highest_dropped) {
        let _ = writeln!(
            body,
            "- Margin: the lowest-scoring blocker scores {low:.3}, the highest-scoring dropped issue {high:.3}; the threshold sits {:.3} below the one and {:.3} above the other. A margin this thin is a calibration on this fixture, not a property of the method: on other data, set the threshold from a labelled sample the same way.",
            low - threshold,
            threshold - high
        );
    }
    let _ = writeln!(
        body,
        "\n| kind | issues | min | median | max | below threshold |\n|---|---:|---:|---:|---:|---:|"
    );
    for (kind, scores) in &by_kind {
        let below = scores.iter().filter(|s| **s < threshold).count();
        let _ = writeln!(
            body,
            "| {kind} | {} | {:.3} | {:.3} | {:.3} | {below} |",
            scores.len(),
            scores.first().copied().unwrap_or(f64::NAN),
            scores.get(scores.len() / 2).copied().unwrap_or(f64::NAN),
            scores.last().copied().unwrap_or(f64::NAN),
        );
    }
    let _ = writeln!(body);
    speed(
        &mut body,
        &stage_texts(stage, &projector)?,
        &files,
        &args.example,
        &kept,
        &routed,
        &anchors,
        stage,
    )?;
    eprint!("{body}");
    crate::report::write_marked_section(&args.report, "embed", &body)?;
    eprintln!("wrote {}", args.report.display());
    Ok(())
}

/// Issues the speed part embeds, from the fixture generator that wrote the
/// example (seed 7, as `fanfold fixture issue-triage` does), twice the
/// example's 1,000 so no text is the example's own.
const SPEED_TEXTS: usize = 2000;
const SPEED_SEED: u64 = 7;
/// The knob's settings compared; the stage's own is 256.
const MAX_TOKENS_SWEEP: [usize; 3] = [64, 128, 256];

/// The generated issues as the stage embeds them: its projection, then its
/// text template.
fn stage_texts(
    stage: &fanfold_ops::embed::EmbedStage,
    projector: &Projector,
) -> Result<Vec<String>> {
    let generated = fanfold_fixtures::issues::generate(SPEED_SEED, SPEED_TEXTS);
    let mut texts = Vec::with_capacity(generated.issues.len());
    for (i, issue) in generated.issues.iter().enumerate() {
        let id = issue
            .get("number")
            .map_or_else(|| i.to_string(), ToString::to_string);
        texts.push(stage.text(&projector.project(&id, issue)?));
    }
    Ok(texts)
}

struct Timed {
    vectors: Vec<Vec<f32>>,
    seconds: f64,
    texts: u64,
    tokens: u64,
    truncated: u64,
    flops: f64,
    profile: Profile,
}

fn timed(
    files: &EmbedderFiles,
    max_tokens: usize,
    backend: Backend,
    texts: &[&str],
) -> Result<Timed> {
    let embedder = Embedder::load_with(files, max_tokens, backend)?;
    // One warm-up text, so the first batch pays no page faults of its own.
    embedder.embed(texts.get(..texts.len().min(1)).unwrap_or_default())?;
    let before = embedder.profile();
    let started = Instant::now();
    let (vectors, usage) = embedder.embed(texts)?;
    let seconds = started.elapsed().as_secs_f64();
    let after = embedder.profile();
    let shape = embedder.shape();
    let flops = embedder
        .token_ids(texts)?
        .iter()
        .map(|ids| shape.flops(ids.len()))
        .sum();
    let mut profile = after;
    profile.tokenize -= before.tokenize;
    profile.forward -= before.forward;
    let mut phases = after.phases;
    phases.embeddings -= before.phases.embeddings;
    phases.qkv -= before.phases.qkv;
    phases.attention -= before.phases.attention;
    phases.attention_out -= before.phases.attention_out;
    phases.ffn_up_gelu -= before.phases.ffn_up_gelu;
    phases.ffn_down -= before.phases.ffn_down;
    phases.pooling -= before.phases.pooling;
    profile.phases = phases;
    Ok(Timed {
        vectors,
        seconds,
        texts: usage.texts,
        tokens: usage.tokens,
        truncated: usage.truncated,
        flops,
        profile,
    })
}

/// Minimum and mean cosine of each text's two vectors.
fn agreement(a: &[Vec<f32>], b: &[Vec<f32>]) -> (f32, f32) {
    let c: Vec<f32> = a.iter().zip(b).map(|(x, y)| cosine(x, y)).collect();
    let min = c.iter().copied().fold(f32::INFINITY, f32::min);
    (min, c.iter().sum::<f32>() / c.len().max(1) as f32)
}

#[allow(clippy::too_many_arguments)]
fn speed(
    body: &mut String,
    texts: &[String],
    files: &EmbedderFiles,
    example: &Path,
    kept: &[usize],
    routed: &fanfold_engine::run::route::Routed,
    anchors: &[&str],
    stage: &fanfold_ops::embed::EmbedStage,
) -> Result<()> {
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let probe_before = gemm_probe_gflops(1024, 5);
    eprintln!("embed speed: native at 256 tokens");
    let native = timed(files, 256, Backend::Native, &refs)?;
    eprintln!("embed speed: candle at 256 tokens");
    let candle = timed(files, 256, Backend::Candle, &refs)?;
    let probe_after = gemm_probe_gflops(1024, 5);
    let peak = probe_before.max(probe_after);
    let (min_cos, mean_cos) = agreement(&native.vectors, &candle.vectors);

    let _ = writeln!(
        body,
        "### Encoder speed\n\n{} issues generated by the fixture generator (`fanfold_fixtures::issues::generate`, seed {SPEED_SEED}; the example's 1,000 are the first half of the same seed's plan only in kind, not in text), each projected and templated as the `{}` stage embeds it, at 256 tokens: {} tokens, {} texts cut. Both paths in this one run, f32, all {} cores. Load average at the start: {}.\n",
        native.texts,
        stage.name(),
        native.tokens,
        native.truncated,
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        crate::report::load_average(),
    );
    let _ = writeln!(
        body,
        "FLOPs are counted for the real tokens only: per layer, Q, K, V and output projections and the two FFN GEMMs (2 x tokens x (4 x 384² + 2 x 384 x 1536)) plus attention's QK^T and PV per text (2 x 2 x len² x 384); softmax, GELU, layer norm and pooling are not counted, and neither is the candle path's work on padding. Peak: a 1024³ fp32 GEMM through the same `gemm` crate on all cores, best of 5, before and after the two paths: {probe_before:.1} and {probe_after:.1} GFLOP/s.\n"
    );
    let _ = writeln!(
        body,
        "| path | texts/s | tokens/s | GFLOP/s | of peak | seconds | tokenizing (s) |\n|---|---:|---:|---:|---:|---:|---:|"
    );
    for (name, t) in [
        ("native (packed batches, `gemm`, fused epilogues)", &native),
        (
            "candle 0.11.1 BERT (reference, batches of 16 padded)",
            &candle,
        ),
    ] {
        let gflops = t.flops / t.seconds.max(1e-9) / 1e9;
        let _ = writeln!(
            body,
            "| {name} | {:.1} | {:.0} | {gflops:.1} | {:.0} % | {:.1} | {:.2} |",
            t.texts as f64 / t.seconds.max(1e-9),
            t.tokens as f64 / t.seconds.max(1e-9),
            100.0 * gflops / peak.max(1e-9),
            t.seconds,
            t.profile.tokenize.as_secs_f64(),
        );
    }
    let _ = writeln!(
        body,
        "\nSpeed-up, native over candle: {:.2}x texts/s. Cosine of each text's native vector with its candle vector: min {min_cos:.6}, mean {mean_cos:.6}.\n",
        candle.seconds / native.seconds.max(1e-9)
    );
    let _ = writeln!(
        body,
        "Where the native path's time goes (wall, both cores):\n\n| phase | seconds | share |\n|---|---:|---:|"
    );
    let forward = native.profile.forward.as_secs_f64().max(1e-9);
    let _ = writeln!(
        body,
        "| tokenizing | {:.2} | {:.0} % |",
        native.profile.tokenize.as_secs_f64(),
        100.0 * native.profile.tokenize.as_secs_f64() / native.seconds.max(1e-9)
    );
    for (phase, d) in native.profile.phases.named() {
        let _ = writeln!(
            body,
            "| {phase} | {:.2} | {:.0} % |",
            d.as_secs_f64(),
            100.0 * d.as_secs_f64() / forward
        );
    }

    // The knob: speed on the same texts, and the stage's AUC on the
    // example's kept issues with the oracle's blockers as positives.
    let kinds = oracle_kinds(&example.join("oracle.json"))?;
    let mut example_texts = Vec::with_capacity(kept.len());
    let mut truth = Vec::with_capacity(kept.len());
    let projector = Projector::compile(
        stage.name(),
        stage.spec.project.as_deref(),
        &stage.spec.fields,
    )?;
    for &i in kept {
        let id = routed.table.id(i)?;
        example_texts.push(stage.text(&projector.project(id.as_str(), &routed.table.value(i))?));
        truth.push(kinds.get(id.as_str()).is_some_and(|k| k == "blocker"));
    }
    let example_refs: Vec<&str> = example_texts.iter().map(String::as_str).collect();
    let _ = writeln!(
        body,
        "\n`max_tokens` (native path; the stage's AUC separates the oracle's {} blockers from the other {} issues the prefilter keeps, by the stage's anchor score):\n\n| max_tokens | texts/s | tokens/s | texts cut | stage AUC |\n|---:|---:|---:|---:|---:|",
        truth.iter().filter(|t| **t).count(),
        truth.iter().filter(|t| !**t).count()
    );
    for max_tokens in MAX_TOKENS_SWEEP {
        eprintln!("embed speed: native at {max_tokens} tokens");
        let t = if max_tokens == 256 {
            None
        } else {
            Some(timed(files, max_tokens, Backend::Native, &refs)?)
        };
        let t = t.as_ref().unwrap_or(&native);
        let embedder = Embedder::load(files, max_tokens)?;
        let (anchor_vectors, _) = embedder.embed(anchors)?;
        let (vectors, _) = embedder.embed(&example_refs)?;
        let scores: Vec<f64> = vectors
            .iter()
            .map(|v| stage.score(v, &anchor_vectors).score)
            .collect();
        let auc = fanfold_ops::cascade::auc(&scores, &truth);
        let _ = writeln!(
            body,
            "| {max_tokens} | {:.1} | {:.0} | {} | {} |",
            t.texts as f64 / t.seconds.max(1e-9),
            t.tokens as f64 / t.seconds.max(1e-9),
            t.truncated,
            auc.map_or_else(|| "n/a".into(), |a| format!("{a:.3}"))
        );
    }

    python_comparison(body, texts, &native, files)?;
    Ok(())
}

/// sentence-transformers and fastembed on the same texts, by
/// `bench/embed/compare.py` under the Python `FANFOLD_EMBED_COMPARE_PYTHON`
/// names; the section says how to get it when the variable is unset.
fn python_comparison(
    body: &mut String,
    texts: &[String],
    native: &Timed,
    files: &EmbedderFiles,
) -> Result<()> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/embed/compare.py");
    let _ = writeln!(body, "\n### Against sentence-transformers and fastembed\n");
    let Some(python) = std::env::var_os("FANFOLD_EMBED_COMPARE_PYTHON") else {
        let _ = writeln!(
            body,
            "Not measured in this run: set `FANFOLD_EMBED_COMPARE_PYTHON` to a Python with the packages of `bench/embed/README.md` and `bench/embed/compare.py` runs on the same texts."
        );
        return Ok(());
    };
    let dir = tempfile::tempdir()?;
    let texts_path = dir.path().join("texts.jsonl");
    let vectors_path = dir.path().join("vectors.f32");
    let out_path = dir.path().join("result.json");
    let mut lines = String::new();
    for t in texts {
        lines.push_str(&serde_json::to_string(t)?);
        lines.push('\n');
    }
    std::fs::write(&texts_path, lines)?;
    let bytes: Vec<u8> = native
        .vectors
        .iter()
        .flatten()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    std::fs::write(&vectors_path, bytes)?;
    let model_dir = files
        .weights
        .parent()
        .ok_or_else(|| anyhow!("the weights have no folder"))?;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    eprintln!(
        "embed speed: {} {}",
        python.to_string_lossy(),
        script.display()
    );
    let status = std::process::Command::new(&python)
        .arg(&script)
        .arg("--texts")
        .arg(&texts_path)
        .arg("--vectors")
        .arg(&vectors_path)
        .arg("--model-dir")
        .arg(model_dir)
        .args([
            "--max-tokens",
            "256",
            "--threads",
            &threads.to_string(),
            "--batch",
            "16",
        ])
        .arg("--out")
        .arg(&out_path)
        .status()?;
    if !status.success() {
        let _ = writeln!(
            body,
            "`bench/embed/compare.py` failed in this run ({status})."
        );
        return Ok(());
    }
    let result: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&out_path)?)?;
    let _ = writeln!(
        body,
        "The same {} texts at 256 tokens, batches of 16, {threads} threads, from the same local files (no model hub), by `bench/embed/compare.py` (a venv with `sentence-transformers` and `fastembed`; fastembed runs an ONNX export of the same safetensors weights). Cosine against fanfold's native vectors.\n\n| implementation | version | texts/s | cosine min | cosine mean |\n|---|---|---:|---:|---:|",
        texts.len()
    );
    let _ = writeln!(
        body,
        "| fanfold native (this run) | fanfold-embed | {:.1} | 1 | 1 |",
        native.texts as f64 / native.seconds.max(1e-9)
    );
    for name in ["sentence-transformers", "fastembed"] {
        let r = result.get(name);
        match r
            .and_then(|r| r.get("error"))
            .and_then(serde_json::Value::as_str)
        {
            Some(error) => {
                let _ = writeln!(body, "| {name} | did not run: {error} | | | |");
            }
            None => {
                let num = |path: &str| {
                    r.and_then(|r| r.pointer(path))
                        .and_then(serde_json::Value::as_f64)
                        .unwrap_or(f64::NAN)
                };
                let _ = writeln!(
                    body,
                    "| {name} | {} | {:.1} | {:.6} | {:.6} |",
                    r.and_then(|r| r.get("version"))
                        .and_then(serde_json::Value::as_str)
                        .unwrap_or("?"),
                    num("/texts_per_s"),
                    num("/cosine/min"),
                    num("/cosine/mean")
                );
            }
        }
    }
    Ok(())
}
