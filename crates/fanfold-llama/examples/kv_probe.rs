//! The cost of attention at depth on this CPU, outside the fabric: the
//! time of one generation step (SEQS sequences, one token each; default 4)
//! and of one 512-token prompt batch split over the sequences, after every
//! sequence already holds DEPTH tokens (512, 1024, 1536), under the
//! attention settings given by the environment: FA=on|off|auto (flash
//! attention; auto is llama.cpp's default), KVU=1 (one unified KV cache
//! instead of one stream per sequence), KVT=q8 (q8_0 keys and values).
//!
//! ```sh
//! cargo run --release -p fanfold-llama --example kv_probe -- MODEL.gguf
//! FA=off KVU=1 target/release/examples/kv_probe MODEL.gguf
//! ```
//!
//! `throughput_limit` measures at one depth and layout its caller names
//! (`bench fabric` takes an empty cache and the shared prefix's depth);
//! this probe sweeps the depth under more settings. Each figure is one
//! timed batch or 24 steps: run it several times, alternating settings, on
//! a quiet machine.
use llama_cpp_2::context::params::{KvCacheType, LlamaContextParams};
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::token::LlamaToken;
use std::num::NonZeroU32;
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args().nth(1).ok_or("model path")?;
    let env = |k: &str| std::env::var(k).unwrap_or_default();
    let seqs: usize = env("SEQS").parse().unwrap_or(4);
    let backend = LlamaBackend::init()?;
    let model = LlamaModel::load_from_file(&backend, &path, &LlamaModelParams::default())?;
    let unified = env("KVU") == "1";
    let fa = match env("FA").as_str() {
        "on" => 1,
        "off" => 0,
        _ => -1,
    };
    for depth in [512usize, 1024, 1536] {
        let per_seq = (depth + 512 + 64) as u32;
        let mut params = LlamaContextParams::default()
            .with_n_ctx(NonZeroU32::new(per_seq * (seqs as u32 + 1)))
            .with_n_batch(512)
            .with_n_ubatch(512)
            .with_n_seq_max(seqs as u32 + 1)
            .with_kv_unified(unified)
            .with_n_threads(2)
            .with_n_threads_batch(2)
            .with_flash_attention_policy(fa);
        if env("KVT") == "q8" {
            params = params
                .with_type_k(KvCacheType::Q8_0)
                .with_type_v(KvCacheType::Q8_0);
        }
        let mut ctx = model.new_context(&backend, params)?;
        let mut batch = LlamaBatch::new(512, seqs as i32 + 1);
        // Fill seq 0 to `depth`, then fork it into every sequence.
        let mut pos = 0usize;
        while pos < depth {
            batch.clear();
            let n = (depth - pos).min(512);
            for i in 0..n {
                let t = LlamaToken::new(100 + ((pos + i) as i32 * 37) % 40000);
                batch.add(t, (pos + i) as i32, &[0], i + 1 == n)?;
            }
            ctx.decode(&mut batch)?;
            pos += n;
        }
        for s in 1..=seqs as i32 {
            ctx.copy_kv_cache_seq(0, s, None, None)?;
        }
        // A 512-token prompt batch split over the sequences at this depth.
        batch.clear();
        let each = 512 / seqs;
        for s in 1..=seqs {
            for i in 0..each {
                let t = LlamaToken::new(300 + i as i32);
                batch.add(t, (depth + i) as i32, &[s as i32], i + 1 == each)?;
            }
        }
        let t0 = Instant::now();
        ctx.decode(&mut batch)?;
        let prompt_ms = t0.elapsed().as_secs_f64() * 1e3;
        let steps = 24;
        let t0 = Instant::now();
        for step in 0..steps {
            batch.clear();
            for s in 1..=seqs {
                let t = LlamaToken::new(200 + step as i32);
                batch.add(t, (depth + each + step) as i32, &[s as i32], true)?;
            }
            ctx.decode(&mut batch)?;
        }
        let step_ms = t0.elapsed().as_secs_f64() * 1e3 / steps as f64;
        println!(
            "FA={} KVU={} KVT={} seqs={seqs} depth={depth}: prompt {:.2} ms/token, step {:.1} ms ({:.1} ms/token)",
            env("FA"),
            unified as u8,
            env("KVT"),
            prompt_ms / (each * seqs) as f64,
            step_ms,
            step_ms / seqs as f64
        );
    }
    Ok(())
}
