//! Local sentence embeddings: a BERT sentence embedder (all-MiniLM-L6-v2 by
//! default) run in-process on the CPU through candle.
//!
//! Embeddings are the cheap rung of the ladder between exact predicates and
//! a model's judgment: one forward pass of a 22M-parameter encoder per unit,
//! no generation. Vectors are mean-pooled over the real tokens (padding
//! masked out) and L2-normalised, as sentence-transformers does for this
//! model, so a dot product is the cosine similarity.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config, DTYPE};
use tokenizers::{Tokenizer, TruncationParams};

#[derive(Debug, thiserror::Error)]
pub enum EmbedError {
    #[error("{path}: {detail}")]
    Load { path: String, detail: String },
    #[error("tokenizing: {0}")]
    Tokenize(String),
    #[error("embedding: {0}")]
    Forward(#[from] candle_core::Error),
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

pub struct Embedder {
    model: BertModel,
    tokenizer: Tokenizer,
    device: Device,
    max_tokens: usize,
    dim: usize,
}

/// Texts embedded in one forward pass. Texts are sorted by length first,
/// so a batch pads little.
const BATCH: usize = 16;

impl Embedder {
    /// Loads the model; `max_tokens` caps each text, special tokens included
    /// (all-MiniLM-L6-v2 was trained on at most 256).
    pub fn load(files: &EmbedderFiles, max_tokens: usize) -> Result<Embedder, EmbedError> {
        let load_err = |path: &Path, detail: String| EmbedError::Load {
            path: path.display().to_string(),
            detail,
        };
        let config_text = std::fs::read_to_string(&files.config)
            .map_err(|e| load_err(&files.config, e.to_string()))?;
        let config: Config = serde_json::from_str(&config_text)
            .map_err(|e| load_err(&files.config, e.to_string()))?;
        let mut tokenizer = Tokenizer::from_file(&files.tokenizer)
            .map_err(|e| load_err(&files.tokenizer, e.to_string()))?;
        let max_tokens = max_tokens.clamp(8, config.max_position_embeddings);
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
        let vb = VarBuilder::from_buffered_safetensors(bytes, DTYPE, &device)
            .map_err(|e| load_err(&files.weights, e.to_string()))?;
        let model =
            BertModel::load(vb, &config).map_err(|e| load_err(&files.weights, e.to_string()))?;
        Ok(Embedder {
            model,
            tokenizer,
            device,
            max_tokens,
            dim: config.hidden_size,
        })
    }

    pub fn dim(&self) -> usize {
        self.dim
    }

    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    /// One unit-length vector per text, in the order given.
    pub fn embed(&self, texts: &[&str]) -> Result<(Vec<Vec<f32>>, EmbedUsage), EmbedError> {
        let mut usage = EmbedUsage {
            texts: texts.len() as u64,
            ..EmbedUsage::default()
        };
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
        let mut order: Vec<(usize, Vec<u32>)> = encoded.into_iter().enumerate().collect();
        order.sort_by_key(|(_, ids)| ids.len());
        let mut out = vec![Vec::new(); texts.len()];
        for chunk in order.chunks(BATCH) {
            let rows: Vec<&[u32]> = chunk.iter().map(|(_, ids)| ids.as_slice()).collect();
            for ((i, _), v) in chunk.iter().zip(self.forward(&rows)?) {
                if let Some(slot) = out.get_mut(*i) {
                    *slot = v;
                }
            }
        }
        Ok((out, usage))
    }

    /// Mean pooling over real tokens, then L2 normalisation.
    fn forward(&self, rows: &[&[u32]]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let width = rows.iter().map(|r| r.len()).max().unwrap_or(0).max(1);
        let mut ids = Vec::with_capacity(rows.len() * width);
        let mut mask = Vec::with_capacity(rows.len() * width);
        for r in rows {
            ids.extend_from_slice(r);
            ids.extend(std::iter::repeat_n(0u32, width - r.len()));
            mask.extend(std::iter::repeat_n(1u32, r.len()));
            mask.extend(std::iter::repeat_n(0u32, width - r.len()));
        }
        let shape = (rows.len(), width);
        let ids = Tensor::from_vec(ids, shape, &self.device)?;
        let mask = Tensor::from_vec(mask, shape, &self.device)?;
        let types = ids.zeros_like()?;
        let hidden = self.model.forward(&ids, &types, Some(&mask))?;
        let mask_f = mask.to_dtype(DType::F32)?.unsqueeze(2)?;
        let summed = hidden.broadcast_mul(&mask_f)?.sum(1)?;
        let counts = mask_f.sum(1)?.clamp(1e-9, f64::MAX)?;
        let mean = summed.broadcast_div(&counts)?;
        let norm = mean.sqr()?.sum_keepdim(1)?.sqrt()?.clamp(1e-12, f64::MAX)?;
        Ok(mean.broadcast_div(&norm)?.to_vec2::<f32>()?)
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
