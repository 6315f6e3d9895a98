//! `fanfold bench embed`: the example's embed stage against the fixture's
//! oracle. Throughput of the local encoder, and where its threshold falls
//! among the scores of each kind of issue the prefilter keeps: how many true
//! blockers it would lose and how many decoys it drops, with the margin.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Result, anyhow};
use fanfold_embed::{Embedder, EmbedderFiles};
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
        "The example's `{}` stage over the {} issues its prefilter keeps, scored by all-MiniLM-L6-v2 (candle, CPU, {} threads available) against {} anchor texts, and compared with the fixture's oracle (read here, never by the pipeline). Measured on {}.\n",
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
    eprint!("{body}");
    crate::report::write_marked_section(&args.report, "embed", &body)?;
    eprintln!("wrote {}", args.report.display());
    Ok(())
}
