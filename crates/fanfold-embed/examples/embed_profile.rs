//! Where the embedder's time goes: `cargo run --release -p fanfold-embed
//! --example embed_profile -- MODEL_DIR [TEXTS] [MAX_TOKENS]`. Embeds the
//! same synthetic issue-like texts through the native encoder and the
//! candle reference and prints each one's rate, the native encoder's
//! phases, and how far apart the two vectors of each text are.

use std::time::Instant;

use fanfold_embed::{Backend, Embedder, EmbedderFiles, cosine, gemm_probe_gflops};

const WORDS: &[&str] = &[
    "the",
    "build",
    "fails",
    "when",
    "cache",
    "is",
    "stale",
    "after",
    "upgrade",
    "panic",
    "in",
    "scheduler",
    "thread",
    "timeout",
    "connection",
    "reset",
    "by",
    "peer",
    "memory",
    "leak",
    "regression",
    "since",
    "v2.3",
    "null",
    "pointer",
    "dereference",
    "config",
    "parser",
    "rejects",
    "valid",
    "yaml",
    "error:",
    "stack",
    "overflow",
    "deadlock",
    "between",
    "writer",
    "and",
    "reader",
    "flaky",
    "test",
    "on",
    "windows",
    "macOS",
    "linux",
    "arm64",
    "disk",
    "full",
];

fn text(i: usize, words: usize) -> String {
    let mut state = (i as u64 + 1).wrapping_mul(6364136223846793005);
    (0..words)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            WORDS
                .get((state >> 33) as usize % WORDS.len())
                .copied()
                .unwrap_or("the")
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let dir = args
        .get(1)
        .ok_or("usage: embed_profile MODEL_DIR [TEXTS] [MAX_TOKENS]")?;
    let n: usize = args.get(2).map_or(Ok(64), |s| s.parse())?;
    let max_tokens: usize = args.get(3).map_or(Ok(256), |s| s.parse())?;
    let backends: String = args
        .get(4)
        .cloned()
        .unwrap_or_else(|| "native,candle".into());
    let texts: Vec<String> = (0..n).map(|i| text(i, 150 + i % 200)).collect();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let files = EmbedderFiles::in_dir(std::path::Path::new(dir));
    println!("gemm probe: {:.1} GFLOP/s", gemm_probe_gflops(1024, 5));
    let mut results = Vec::new();
    for backend in [Backend::Native, Backend::Candle] {
        let name = format!("{backend:?}").to_lowercase();
        if !backends.contains(&name) {
            continue;
        }
        let e = Embedder::load_with(&files, max_tokens, backend)?;
        let clock = Instant::now();
        let (vectors, usage) = e.embed(&refs)?;
        let s = clock.elapsed().as_secs_f64();
        let lens: Vec<usize> = e.token_ids(&refs)?.iter().map(Vec::len).collect();
        let flops: f64 = lens.iter().map(|&l| e.shape().flops(l)).sum();
        let p = e.profile();
        println!(
            "{name}: {} texts, {} tokens in {s:.2} s: {:.1} texts/s, {:.0} tokens/s, {:.1} GFLOP/s; tokenize {:.3} s, forward {:.3} s",
            usage.texts,
            usage.tokens,
            usage.texts as f64 / s,
            usage.tokens as f64 / s,
            flops / s / 1e9,
            p.tokenize.as_secs_f64(),
            p.forward.as_secs_f64()
        );
        if backend == Backend::Native {
            for (phase, d) in p.phases.named() {
                println!("  {phase:<50} {:>7.3} s", d.as_secs_f64());
            }
        }
        results.push(vectors);
    }
    if let [a, b] = results.as_slice() {
        let cos: Vec<f32> = a.iter().zip(b).map(|(x, y)| cosine(x, y)).collect();
        let min = cos.iter().copied().fold(f32::INFINITY, f32::min);
        let mean = cos.iter().sum::<f32>() / cos.len().max(1) as f32;
        println!("cosine native vs candle: min {min:.6}, mean {mean:.6}");
    }
    Ok(())
}
