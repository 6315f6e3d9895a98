//! Local sentence embeddings: a BERT sentence embedder (all-MiniLM-L6-v2 by
//! default) run in-process on the CPU through candle.
//!
//! Embeddings are the cheap rung of the ladder between exact predicates and
//! a model's judgment: one forward pass of a 22M-parameter encoder per unit,
//! no generation. Vectors are mean-pooled over the real tokens (padding
//! masked out) and L2-normalised, as sentence-transformers does for this
//! model, so a dot product is the cosine similarity.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use candle_core::Device;
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config, DTYPE};
use tokenizers::{Tokenizer, TruncationParams};

mod encoder;
mod reference;

use encoder::{Encoder, EncoderError};
pub use encoder::{Phases, Shape, gemm_probe_gflops};

#[derive(Debug, thiserror::Error)]
pub enum EmbedError {
    #[error("{path}: {detail}")]
    Load { path: String, detail: String },
    #[error("tokenizing: {0}")]
    Tokenize(String),
    #[error("embedding: {0}")]
    Forward(#[from] candle_core::Error),
    #[error("embedding: {0}")]
    Encoder(#[from] EncoderError),
}

/// The files of a BERT sentence embedder, all in one folder.
#[derive(Clone, Debug)]
pub struct EmbedderFiles {
    pub weights: PathBuf,
    pub tokenizer: PathBuf,
    pub config: PathBuf,
}

impl EmbedderFiles {
    /// `model.safetensors`, `tokenizer.json` and `config.json` in `dir`.
    pub fn in_dir(dir: &Path) -> EmbedderFiles {
        EmbedderFiles {
            weights: dir.join("model.safetensors"),
            tokenizer: dir.join("tokenizer.json"),
            config: dir.join("config.json"),
        }
    }
}

/// What one call to [`Embedder::embed`] cost.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EmbedUsage {
    pub texts: u64,
    /// Tokens run through the encoder, padding excluded.
    pub tokens: u64,
    /// Texts cut at the token limit.
    pub truncated: u64,
}

/// Which forward pass an [`Embedder`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// The hand-written encoder (`encoder.rs`): what runs use.
    Native,
    /// candle-transformers' BERT over padded batches: the f32 reference.
    Candle,
}

/// Where an embedder's time went, summed over its calls.
#[derive(Clone, Copy, Debug, Default)]
pub struct Profile {
    pub tokenize: Duration,
    pub forward: Duration,
    /// The native encoder's phases (all zero for the candle reference).
    pub phases: Phases,
}

enum Forward {
    Native(Encoder),
    Candle { model: BertModel, device: Device },
}

pub struct Embedder {
    forward: Forward,
    tokenizer: Tokenizer,
    shape: Shape,
    max_tokens: usize,
    profile: Mutex<Profile>,
}

/// Texts in one candle forward pass (padded to the longest).
const CANDLE_BATCH: usize = 16;

/// Tokens in one native forward pass. Texts are packed without padding,
/// so a batch is a token budget: large enough that each dense layer is a
/// GEMM the cores stay busy on and attention has texts to spread over
/// threads, small enough that the FFN's activations stay near cache.
const NATIVE_BATCH_TOKENS: usize = 4096;

fn config_shape(config: &serde_json::Value) -> Result<Shape, String> {
    let int = |key: &str| {
        config
            .get(key)
            .and_then(serde_json::Value::as_u64)
            .map(|v| v as usize)
            .ok_or_else(|| format!("config has no integer {key}"))
    };
    let act = config
        .get("hidden_act")
        .and_then(serde_json::Value::as_str)
        .unwrap_or("gelu");
    if act != "gelu" {
        return Err(format!(
            "hidden_act {act:?}: the native encoder implements BERT's erf `gelu` only"
        ));
    }
    let shape = Shape {
        hidden: int("hidden_size")?,
        heads: int("num_attention_heads")?,
        intermediate: int("intermediate_size")?,
        layers: int("num_hidden_layers")?,
        vocab: int("vocab_size")?,
        positions: int("max_position_embeddings")?,
        layer_norm_eps: config
            .get("layer_norm_eps")
            .and_then(serde_json::Value::as_f64)
            .unwrap_or(1e-12) as f32,
    };
    if shape.heads == 0 || !shape.hidden.is_multiple_of(shape.heads) {
        return Err(format!(
            "hidden_size {} does not split into {} heads",
            shape.hidden, shape.heads
        ));
    }
    Ok(shape)
}

impl Embedder {
    /// Loads the model for the native encoder; `max_tokens` caps each
    /// text, special tokens included (all-MiniLM-L6-v2 was trained on at
    /// most 256).
    pub fn load(files: &EmbedderFiles, max_tokens: usize) -> Result<Embedder, EmbedError> {
        Embedder::load_with(files, max_tokens, Backend::Native)
    }

    /// Loads the model for the given forward pass.
    pub fn load_with(
        files: &EmbedderFiles,
        max_tokens: usize,
        backend: Backend,
    ) -> Result<Embedder, EmbedError> {
        let load_err = |path: &Path, detail: String| EmbedError::Load {
            path: path.display().to_string(),
            detail,
        };
        let config_text = std::fs::read_to_string(&files.config)
            .map_err(|e| load_err(&files.config, e.to_string()))?;
        let config_json: serde_json::Value = serde_json::from_str(&config_text)
            .map_err(|e| load_err(&files.config, e.to_string()))?;
        let shape = config_shape(&config_json).map_err(|e| load_err(&files.config, e))?;
        let mut tokenizer = Tokenizer::from_file(&files.tokenizer)
            .map_err(|e| load_err(&files.tokenizer, e.to_string()))?;
        let max_tokens = max_tokens.clamp(8, shape.positions);
        tokenizer
            .with_truncation(Some(TruncationParams {
                max_length: max_tokens,
                ..TruncationParams::default()
            }))
            .map_err(|e| load_err(&files.tokenizer, e.to_string()))?;
        tokenizer.with_padding(None);
        let device = Device::Cpu;
        let bytes =
            std::fs::read(&files.weights).map_err(|e| load_err(&files.weights, e.to_string()))?;
        let forward = match backend {
            Backend::Native => {
                let tensors = candle_core::safetensors::load_buffer(&bytes, &device)
                    .map_err(|e| load_err(&files.weights, e.to_string()))?;
                let encoder = Encoder::from_tensors(&tensors, shape)
                    .map_err(|e| load_err(&files.weights, e.to_string()))?;
                Forward::Native(encoder)
            }
            Backend::Candle => {
                let config: Config = serde_json::from_str(&config_text)
                    .map_err(|e| load_err(&files.config, e.to_string()))?;
                let vb = VarBuilder::from_buffered_safetensors(bytes, DTYPE, &device)
                    .map_err(|e| load_err(&files.weights, e.to_string()))?;
                let model = BertModel::load(vb, &config)
                    .map_err(|e| load_err(&files.weights, e.to_string()))?;
                Forward::Candle { model, device }
            }
        };
        Ok(Embedder {
            forward,
            tokenizer,
            shape,
            max_tokens,
            profile: Mutex::new(Profile::default()),
        })
    }

    pub fn dim(&self) -> usize {
        self.shape.hidden
    }

    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    pub fn shape(&self) -> Shape {
        self.shape
    }

    pub fn backend(&self) -> Backend {
        match self.forward {
            Forward::Native(_) => Backend::Native,
            Forward::Candle { .. } => Backend::Candle,
        }
    }

    /// The time spent so far, by part, over every call to [`Embedder::embed`].
    pub fn profile(&self) -> Profile {
        self.profile.lock().map(|p| *p).unwrap_or_default()
    }

    /// The token ids of each text as the encoder sees them: special tokens
    /// included, cut at `max_tokens`.
    pub fn token_ids(&self, texts: &[&str]) -> Result<Vec<Vec<u32>>, EmbedError> {
        texts
            .iter()
            .map(|t| {
                self.tokenizer
                    .encode(*t, true)
                    .map(|e| e.get_ids().to_vec())
                    .map_err(|e| EmbedError::Tokenize(e.to_string()))
            })
            .collect()
    }

    /// One unit-length vector per text, in the order given.
    pub fn embed(&self, texts: &[&str]) -> Result<(Vec<Vec<f32>>, EmbedUsage), EmbedError> {
        let mut usage = EmbedUsage {
            texts: texts.len() as u64,
            ..EmbedUsage::default()
        };
        let clock = Instant::now();
        let mut encoded = Vec::with_capacity(texts.len());
        for text in texts {
            let enc = self
                .tokenizer
                .encode(*text, true)
                .map_err(|e| EmbedError::Tokenize(e.to_string()))?;
            if !enc.get_overflowing().is_empty() {
                usage.truncated += 1;
            }
            usage.tokens += enc.get_ids().len() as u64;
            encoded.push(enc.get_ids().to_vec());
        }
        let tokenize = clock.elapsed();

        let clock = Instant::now();
        let mut phases = Phases::default();
        let mut order: Vec<(usize, Vec<u32>)> = encoded.into_iter().enumerate().collect();
        order.sort_by_key(|(_, ids)| ids.len());
        let mut out = vec![Vec::new(); texts.len()];
        let mut rest = order.as_slice();
        while !rest.is_empty() {
            let take = match &self.forward {
                Forward::Candle { .. } => CANDLE_BATCH.min(rest.len()),
                Forward::Native(_) => {
                    let mut tokens = 0;
                    let mut n = 0;
                    for (_, ids) in rest {
                        if n > 0 && tokens + ids.len() > NATIVE_BATCH_TOKENS {
                            break;
                        }
                        tokens += ids.len();
                        n += 1;
                    }
                    n
                }
            };
            let (chunk, tail) = rest.split_at(take);
            rest = tail;
            let rows: Vec<&[u32]> = chunk.iter().map(|(_, ids)| ids.as_slice()).collect();
            let vectors = match &self.forward {
                Forward::Native(encoder) => encoder.embed(&rows, &mut phases)?,
                Forward::Candle { model, device } => reference::forward(model, device, &rows)?,
            };
            for ((i, _), v) in chunk.iter().zip(vectors) {
                if let Some(slot) = out.get_mut(*i) {
                    *slot = v;
                }
            }
        }
        if let Ok(mut p) = self.profile.lock() {
            p.tokenize += tokenize;
            p.forward += clock.elapsed();
            p.phases.add(&phases);
        }
        Ok((out, usage))
    }
}

/// The cosine similarity of two unit vectors.
pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cosine_of_unit_vectors() {
        assert!((cosine(&[1.0, 0.0], &[1.0, 0.0]) - 1.0).abs() < 1e-6);
        assert!(cosine(&[1.0, 0.0], &[0.0, 1.0]).abs() < 1e-6);
    }
}
