//! A hand-written forward pass for the BERT shape of the sentence embedders
//! fanfold runs (all-MiniLM-L6-v2: 6 layers, hidden 384, 12 heads, FFN
//! 1536), in f32 on the CPU.
//!
//! Why not a tensor library: the texts of a batch are packed end to end
//! (no padding, no mask), so every dense layer is one large GEMM over all
//! the batch's tokens and attention runs per text at its own length. The
//! weights are transposed once at load, Q, K and V are one fused GEMM, the
//! bias is the GEMM's starting value, and GELU, the residual add and layer
//! norm run in place over the GEMM's output: no intermediate tensor is
//! allocated or copied per operation.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use candle_core::Tensor;
use gemm::Parallelism;
use rayon::prelude::*;

/// What went wrong building the encoder from a checkpoint.
#[derive(Debug, thiserror::Error)]
pub enum EncoderError {
    #[error("the checkpoint has no tensor {0}")]
    Missing(String),
    #[error("tensor {name} has shape {found:?}, expected {expected:?}")]
    Shape {
        name: String,
        found: Vec<usize>,
        expected: Vec<usize>,
    },
    #[error("token id {id} is outside the vocabulary of {vocab}")]
    TokenId { id: u32, vocab: usize },
    #[error("a text of {len} tokens exceeds the {max} positions the model has")]
    TooLong { len: usize, max: usize },
    #[error("reading tensor {name}: {detail}")]
    Read { name: String, detail: String },
}

/// The model's shape, from its `config.json`.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub hidden: usize,
    pub heads: usize,
    pub intermediate: usize,
    pub layers: usize,
    pub vocab: usize,
    pub positions: usize,
    pub layer_norm_eps: f32,
}

impl Shape {
    /// Multiply-adds of one text of `len` tokens, counted as two FLOPs
    /// each: the four projections and two FFN GEMMs per token, and
    /// attention's two `len x len` products per head. Element-wise work
    /// (softmax, GELU, layer norm, embeddings, pooling) is left out.
    pub fn flops(&self, len: usize) -> f64 {
        let (h, i, l) = (self.hidden as f64, self.intermediate as f64, len as f64);
        let dense = 2.0 * l * (4.0 * h * h + 2.0 * h * i);
        let attention = 2.0 * 2.0 * l * l * h;
        self.layers as f64 * (dense + attention)
    }
}

/// Wall time of each part of the forward pass, summed over calls.
#[derive(Clone, Copy, Debug, Default)]
pub struct Phases {
    pub embeddings: Duration,
    pub qkv: Duration,
    pub attention: Duration,
    pub attention_out: Duration,
    pub ffn_up_gelu: Duration,
    pub ffn_down: Duration,
    pub pooling: Duration,
}

impl Phases {
    pub fn add(&mut self, other: &Phases) {
        self.embeddings += other.embeddings;
        self.qkv += other.qkv;
        self.attention += other.attention;
        self.attention_out += other.attention_out;
        self.ffn_up_gelu += other.ffn_up_gelu;
        self.ffn_down += other.ffn_down;
        self.pooling += other.pooling;
    }

    /// Each phase by name, in the order the forward pass runs them.
    pub fn named(&self) -> [(&'static str, Duration); 7] {
        [
            ("embeddings + layer norm", self.embeddings),
            ("QKV projection (GEMM)", self.qkv),
            ("attention (QK^T, softmax, PV)", self.attention),
            (
                "attention output (GEMM) + residual + layer norm",
                self.attention_out,
            ),
            ("FFN up (GEMM) + GELU", self.ffn_up_gelu),
            ("FFN down (GEMM) + residual + layer norm", self.ffn_down),
            ("mean pooling + L2 norm", self.pooling),
        ]
    }
}

struct Norm {
    gamma: Vec<f32>,
    beta: Vec<f32>,
}

/// A dense layer with its weight stored `[inputs][outputs]`, row-major.
struct Linear {
    weight: Vec<f32>,
    bias: Vec<f32>,
    inputs: usize,
    outputs: usize,
}

struct Layer {
    qkv: Linear,
    attention_out: Linear,
    attention_norm: Norm,
    up: Linear,
    down: Linear,
    output_norm: Norm,
}

pub struct Encoder {
    shape: Shape,
    word: Vec<f32>,
    position: Vec<f32>,
    token_type: Vec<f32>,
    embedding_norm: Norm,
    layers: Vec<Layer>,
}

struct Checkpoint<'a> {
    tensors: &'a HashMap<String, Tensor>,
    prefix: &'a str,
}

impl Checkpoint<'_> {
    fn take(&self, name: &str, expected: &[usize]) -> Result<Vec<f32>, EncoderError> {
        let full = format!("{}{name}", self.prefix);
        let t = self
            .tensors
            .get(&full)
            .ok_or_else(|| EncoderError::Missing(full.clone()))?;
        if t.dims() != expected {
            return Err(EncoderError::Shape {
                name: full,
                found: t.dims().to_vec(),
                expected: expected.to_vec(),
            });
        }
        let read = |e: candle_core::Error| EncoderError::Read {
            name: full.clone(),
            detail: e.to_string(),
        };
        t.to_dtype(candle_core::DType::F32)
            .and_then(|t| t.flatten_all())
            .and_then(|t| t.to_vec1::<f32>())
            .map_err(read)
    }

    fn norm(&self, name: &str, width: usize) -> Result<Norm, EncoderError> {
        Ok(Norm {
            gamma: self.take(&format!("{name}.weight"), &[width])?,
            beta: self.take(&format!("{name}.bias"), &[width])?,
        })
    }

    /// PyTorch keeps a linear weight `[outputs][inputs]`; the GEMM reads it
    /// `[inputs][outputs]`, so several of them side by side become one.
    fn linear(
        &self,
        names: &[&str],
        inputs: usize,
        outputs: usize,
    ) -> Result<Linear, EncoderError> {
        let total = outputs * names.len();
        let mut weight = vec![0f32; inputs * total];
        let mut bias = Vec::with_capacity(total);
        for (part, name) in names.iter().enumerate() {
            let w = self.take(&format!("{name}.weight"), &[outputs, inputs])?;
            for (o, row) in w.chunks_exact(inputs).enumerate() {
                for (i, v) in row.iter().enumerate() {
                    if let Some(slot) = weight.get_mut(i * total + part * outputs + o) {
                        *slot = *v;
                    }
                }
            }
            bias.extend(self.take(&format!("{name}.bias"), &[outputs])?);
        }
        Ok(Linear {
            weight,
            bias,
            inputs,
            outputs: total,
        })
    }
}

impl Encoder {
    /// Builds the encoder from a BERT checkpoint's tensors, with or without
    /// the `bert.` prefix some checkpoints carry.
    pub fn from_tensors(
        tensors: &HashMap<String, Tensor>,
        shape: Shape,
    ) -> Result<Encoder, EncoderError> {
        let prefix = if tensors.contains_key("bert.embeddings.word_embeddings.weight") {
            "bert."
        } else {
            ""
        };
        let ck = Checkpoint { tensors, prefix };
        let h = shape.hidden;
        let word = ck.take("embeddings.word_embeddings.weight", &[shape.vocab, h])?;
        let position = ck.take(
            "embeddings.position_embeddings.weight",
            &[shape.positions, h],
        )?;
        let types = ck.take("embeddings.token_type_embeddings.weight", &[2, h])?;
        let token_type = types.get(..h).map(<[f32]>::to_vec).unwrap_or_default();
        let embedding_norm = ck.norm("embeddings.LayerNorm", h)?;
        let mut layers = Vec::with_capacity(shape.layers);
        for n in 0..shape.layers {
            let p = format!("encoder.layer.{n}");
            layers.push(Layer {
                qkv: ck.linear(
                    &[
                        &format!("{p}.attention.self.query"),
                        &format!("{p}.attention.self.key"),
                        &format!("{p}.attention.self.value"),
                    ],
                    h,
                    h,
                )?,
                attention_out: ck.linear(&[&format!("{p}.attention.output.dense")], h, h)?,
                attention_norm: ck.norm(&format!("{p}.attention.output.LayerNorm"), h)?,
                up: ck.linear(&[&format!("{p}.intermediate.dense")], h, shape.intermediate)?,
                down: ck.linear(&[&format!("{p}.output.dense")], shape.intermediate, h)?,
                output_norm: ck.norm(&format!("{p}.output.LayerNorm"), h)?,
            });
        }
        Ok(Encoder {
            shape,
            word,
            position,
            token_type,
            embedding_norm,
            layers,
        })
    }

    /// One mean-pooled, L2-normalised vector per text (token ids, special
    /// tokens included), with the time each phase took added to `phases`.
    pub fn embed(
        &self,
        texts: &[&[u32]],
        phases: &mut Phases,
    ) -> Result<Vec<Vec<f32>>, EncoderError> {
        let h = self.shape.hidden;
        let mut starts = Vec::with_capacity(texts.len());
        let mut total = 0;
        for t in texts {
            if t.len() > self.shape.positions {
                return Err(EncoderError::TooLong {
                    len: t.len(),
                    max: self.shape.positions,
                });
            }
            starts.push(total);
            total += t.len();
        }
        let spans: Vec<(usize, usize)> = starts
            .iter()
            .zip(texts)
            .map(|(&start, t)| (start, t.len()))
            .collect();

        let clock = Instant::now();
        let mut x = vec![0f32; total * h];
        for (text, (start, len)) in texts.iter().zip(&spans) {
            let rows = x.get_mut(start * h..(start + len) * h).unwrap_or_default();
            for (p, (row, &id)) in rows.chunks_exact_mut(h).zip(text.iter()).enumerate() {
                let word = self
                    .word
                    .get(id as usize * h..(id as usize + 1) * h)
                    .ok_or(EncoderError::TokenId {
                        id,
                        vocab: self.shape.vocab,
                    })?;
                let pos = self.position.get(p * h..(p + 1) * h).unwrap_or_default();
                for (((o, w), q), t) in row.iter_mut().zip(word).zip(pos).zip(&self.token_type) {
                    *o = w + q + t;
                }
            }
        }
        layer_norm_rows(&mut x, &self.embedding_norm, self.shape.layer_norm_eps);
        phases.embeddings += clock.elapsed();

        let mut qkv = vec![0f32; total * 3 * h];
        let mut context = vec![0f32; total * h];
        let mut scratch = vec![0f32; total * h];
        let mut inner = vec![0f32; total * self.shape.intermediate];
        let eps = self.shape.layer_norm_eps;
        for layer in &self.layers {
            let clock = Instant::now();
            layer.qkv.apply(&x, total, &mut qkv, |_, _| {});
            phases.qkv += clock.elapsed();

            let clock = Instant::now();
            self.attention(&qkv, &spans, &mut context);
            phases.attention += clock.elapsed();

            let clock = Instant::now();
            layer.attention_out.apply_residual_norm(
                &context,
                total,
                &mut scratch,
                &mut x,
                &layer.attention_norm,
                eps,
            );
            phases.attention_out += clock.elapsed();

            let clock = Instant::now();
            layer.up.apply(&x, total, &mut inner, |_, block| {
                block.iter_mut().for_each(|v| *v = gelu(*v));
            });
            phases.ffn_up_gelu += clock.elapsed();

            let clock = Instant::now();
            layer.down.apply_residual_norm(
                &inner,
                total,
                &mut scratch,
                &mut x,
                &layer.output_norm,
                eps,
            );
            phases.ffn_down += clock.elapsed();
        }

        let clock = Instant::now();
        let out = spans
            .iter()
            .map(|&(start, len)| {
                let mut mean = vec![0f32; h];
                for row in x
                    .get(start * h..(start + len) * h)
                    .unwrap_or_default()
                    .chunks_exact(h)
                {
                    mean.iter_mut().zip(row).for_each(|(m, v)| *m += v);
                }
                let count = len.max(1) as f32;
                mean.iter_mut().for_each(|m| *m /= count);
                let norm = mean.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-12);
                mean.iter_mut().for_each(|m| *m /= norm);
                mean
            })
            .collect();
        phases.pooling += clock.elapsed();
        Ok(out)
    }

    /// Self-attention of every text over its own tokens, heads one after
    /// another, texts in parallel; writes each head's output into its
    /// columns of `context`.
    fn attention(&self, qkv: &[f32], spans: &[(usize, usize)], context: &mut [f32]) {
        let h = self.shape.hidden;
        let heads = self.shape.heads;
        let dh = h / heads;
        let scale = 1.0 / (dh as f32).sqrt();
        let mut pieces: Vec<(&mut [f32], usize, usize)> = Vec::with_capacity(spans.len());
        let mut rest = context;
        for &(start, len) in spans {
            let (mine, tail) = rest.split_at_mut(len * h);
            pieces.push((mine, start, len));
            rest = tail;
        }
        pieces.into_par_iter().for_each(|(out, start, len)| {
            if len == 0 {
                return;
            }
            let rows = qkv
                .get(start * 3 * h..(start + len) * 3 * h)
                .unwrap_or_default();
            let mut scores = vec![0f32; len * len];
            for head in 0..heads {
                let q = rows.get(head * dh..).unwrap_or_default();
                let k = rows.get(h + head * dh..).unwrap_or_default();
                let v = rows.get(2 * h + head * dh..).unwrap_or_default();
                // scores = scale * Q K^T: K read through its strides as K^T.
                matmul(
                    Operand::new(q, len, dh, 3 * h, 1),
                    Operand::new(k, dh, len, 1, 3 * h),
                    &mut scores,
                    (len, 1),
                    scale,
                    Parallelism::None,
                );
                for row in scores.chunks_exact_mut(len) {
                    softmax(row);
                }
                let o = out.get_mut(head * dh..).unwrap_or_default();
                matmul(
                    Operand::new(&scores, len, len, len, 1),
                    Operand::new(v, len, dh, 3 * h, 1),
                    o,
                    (h, 1),
                    1.0,
                    Parallelism::None,
                );
            }
        });
    }
}

/// Rows of output one task computes, bias to epilogue, while they are in
/// cache: the GEMM for a block and what follows it (GELU, or the residual
/// add and layer norm) run on one core back to back. 64 rows of the FFN's
/// 1536 columns are 384 KiB, about one core's L2.
const ROW_BLOCK: usize = 64;

impl Linear {
    /// `out = input x weight + bias` over `rows` rows, blocks of rows in
    /// parallel, then `epilogue(first_row, block)` on each block.
    fn apply(
        &self,
        input: &[f32],
        rows: usize,
        out: &mut [f32],
        epilogue: impl Fn(usize, &mut [f32]) + Sync,
    ) {
        let block = ROW_BLOCK;
        let out = out.get_mut(..rows * self.outputs).unwrap_or_default();
        out.par_chunks_mut(block * self.outputs)
            .enumerate()
            .for_each(|(b, chunk)| {
                let first = b * block;
                let n = chunk.len() / self.outputs;
                for row in chunk.chunks_exact_mut(self.outputs) {
                    row.copy_from_slice(&self.bias);
                }
                let lhs = input
                    .get(first * self.inputs..(first + n) * self.inputs)
                    .unwrap_or_default();
                matmul_accumulate(
                    Operand::new(lhs, n, self.inputs, self.inputs, 1),
                    Operand::new(&self.weight, self.inputs, self.outputs, self.outputs, 1),
                    chunk,
                    (self.outputs, 1),
                    Parallelism::None,
                );
                epilogue(first, chunk);
            });
    }

    /// `x = layer_norm(x + input x weight + bias)`, block by block.
    fn apply_residual_norm(
        &self,
        input: &[f32],
        rows: usize,
        scratch: &mut [f32],
        x: &mut [f32],
        norm: &Norm,
        eps: f32,
    ) {
        let block = ROW_BLOCK;
        let width = self.outputs;
        let scratch = scratch.get_mut(..rows * width).unwrap_or_default();
        let x = x.get_mut(..rows * width).unwrap_or_default();
        scratch
            .par_chunks_mut(block * width)
            .zip(x.par_chunks_mut(block * width))
            .enumerate()
            .for_each(|(b, (chunk, residual))| {
                let first = b * block;
                let n = chunk.len() / width;
                for row in chunk.chunks_exact_mut(width) {
                    row.copy_from_slice(&self.bias);
                }
                let lhs = input
                    .get(first * self.inputs..(first + n) * self.inputs)
                    .unwrap_or_default();
                matmul_accumulate(
                    Operand::new(lhs, n, self.inputs, self.inputs, 1),
                    Operand::new(&self.weight, self.inputs, width, width, 1),
                    chunk,
                    (width, 1),
                    Parallelism::None,
                );
                norm_rows(residual, Some(chunk), norm, eps);
            });
    }
}

/// A read-only matrix view: `rows x cols`, element `(r, c)` at
/// `r * row_stride + c * col_stride`.
struct Operand<'a> {
    data: &'a [f32],
    rows: usize,
    cols: usize,
    row_stride: usize,
    col_stride: usize,
}

impl<'a> Operand<'a> {
    fn new(
        data: &'a [f32],
        rows: usize,
        cols: usize,
        row_stride: usize,
        col_stride: usize,
    ) -> Operand<'a> {
        Operand {
            data,
            rows,
            cols,
            row_stride,
            col_stride,
        }
    }

    /// One past the last element the view reaches.
    fn extent(&self) -> usize {
        if self.rows == 0 || self.cols == 0 {
            0
        } else {
            (self.rows - 1) * self.row_stride + (self.cols - 1) * self.col_stride + 1
        }
    }
}

/// `dst = alpha * lhs x rhs` (`dst` row stride, column stride given).
fn matmul(
    lhs: Operand,
    rhs: Operand,
    dst: &mut [f32],
    dst_strides: (usize, usize),
    alpha: f32,
    parallelism: Parallelism,
) {
    gemm_checked(lhs, rhs, dst, dst_strides, false, alpha, parallelism);
}

/// `dst += lhs x rhs`.
fn matmul_accumulate(
    lhs: Operand,
    rhs: Operand,
    dst: &mut [f32],
    dst_strides: (usize, usize),
    parallelism: Parallelism,
) {
    gemm_checked(lhs, rhs, dst, dst_strides, true, 1.0, parallelism);
}

/// The one call into `gemm`, after checking that every view stays inside
/// its slice: a shape mismatch is a bug in this file, so it panics rather
/// than reading out of bounds.
fn gemm_checked(
    lhs: Operand,
    rhs: Operand,
    dst: &mut [f32],
    (dst_rs, dst_cs): (usize, usize),
    accumulate: bool,
    alpha: f32,
    parallelism: Parallelism,
) {
    let (m, k, n) = (lhs.rows, lhs.cols, rhs.cols);
    assert_eq!(rhs.rows, k, "inner dimensions differ");
    assert!(lhs.extent() <= lhs.data.len(), "lhs view out of bounds");
    assert!(rhs.extent() <= rhs.data.len(), "rhs view out of bounds");
    let dst_view = Operand::new(&[], m, n, dst_rs, dst_cs);
    assert!(dst_view.extent() <= dst.len(), "dst view out of bounds");
    if m == 0 || n == 0 {
        return;
    }
    // SAFETY: the three views were checked above to lie inside their
    // slices, `dst` is borrowed mutably and overlaps neither input, and
    // every stride fits an isize because the slices' lengths do.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            dst_cs as isize,
            dst_rs as isize,
            accumulate,
            lhs.data.as_ptr(),
            lhs.col_stride as isize,
            lhs.row_stride as isize,
            rhs.data.as_ptr(),
            rhs.col_stride as isize,
            rhs.row_stride as isize,
            if accumulate { 1.0 } else { 0.0 },
            alpha,
            false,
            false,
            false,
            parallelism,
        );
    }
}

/// `x = layer_norm(x + residual)` row by row, rows in parallel.
fn layer_norm_rows(x: &mut [f32], norm: &Norm, eps: f32) {
    let width = norm.gamma.len();
    x.par_chunks_mut(width * 64)
        .for_each(|c| norm_rows(c, None, norm, eps));
}

/// `x = layer_norm(x + residual)` for the rows of `x`.
fn norm_rows(x: &mut [f32], residual: Option<&[f32]>, norm: &Norm, eps: f32) {
    let width = norm.gamma.len();
    for (r, row) in x.chunks_exact_mut(width).enumerate() {
        if let Some(extra) = residual {
            let add = extra.get(r * width..(r + 1) * width).unwrap_or_default();
            row.iter_mut().zip(add).for_each(|(v, a)| *v += a);
        }
        let mean = row.iter().sum::<f32>() / width as f32;
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / width as f32;
        let inv = 1.0 / (var + eps).sqrt();
        for ((v, g), b) in row.iter_mut().zip(&norm.gamma).zip(&norm.beta) {
            *v = (*v - mean) * inv * g + b;
        }
    }
}

/// Softmax in place. Max and sum run over eight lanes so they vectorise
/// (a plain fold is a serial chain: f32 addition is not reassociated).
fn softmax(row: &mut [f32]) {
    const LANES: usize = 8;
    let mut top = [f32::NEG_INFINITY; LANES];
    let chunks = row.chunks_exact(LANES);
    let tail_max = chunks
        .remainder()
        .iter()
        .copied()
        .fold(f32::NEG_INFINITY, f32::max);
    for c in chunks {
        for (t, v) in top.iter_mut().zip(c) {
            *t = if *v > *t { *v } else { *t };
        }
    }
    let max = top.iter().copied().fold(tail_max, f32::max);
    for v in row.iter_mut() {
        *v = fast_exp(*v - max);
    }
    let mut sums = [0f32; LANES];
    let chunks = row.chunks_exact(LANES);
    let tail_sum: f32 = chunks.remainder().iter().sum();
    for c in chunks {
        for (s, v) in sums.iter_mut().zip(c) {
            *s += v;
        }
    }
    let inv = 1.0 / (sums.iter().sum::<f32>() + tail_sum);
    row.iter_mut().for_each(|v| *v *= inv);
}

/// `e^x` to about 2 ulp for the range softmax and erf use, written so the
/// compiler vectorises it (libm's `expf` is a call per element).
#[inline(always)]
fn fast_exp(x: f32) -> f32 {
    let x = x.clamp(-87.0, 88.0);
    let n = (x * std::f32::consts::LOG2_E + 0.5).floor();
    // x - n ln 2 in two parts, so the reduction loses no precision.
    let r = x - n * 0.693_359_4 + n * 2.121_944_4e-4;
    let p = 1.987_569_1e-4;
    let p = p * r + 1.398_199_9e-3;
    let p = p * r + 8.333_452e-3;
    let p = p * r + 4.166_579_6e-2;
    let p = p * r + 1.666_666_5e-1;
    let p = p * r + 5.0e-1;
    let e = p * r * r + r + 1.0;
    let scale = f32::from_bits(((n as i32 + 127) as u32) << 23);
    e * scale
}

/// GELU with the exact erf, as BERT's `gelu` is defined; erf from
/// Abramowitz and Stegun 7.1.26 (absolute error under 1.5e-7).
#[inline(always)]
fn gelu(x: f32) -> f32 {
    let z = x * std::f32::consts::FRAC_1_SQRT_2;
    let a = z.abs();
    let t = 1.0 / (1.0 + 0.327_591_1 * a);
    let poly = t
        * (0.254_829_6
            + t * (-0.284_496_74 + t * (1.421_413_7 + t * (-1.453_152_1 + t * 1.061_405_4))));
    let erf_abs = 1.0 - poly * fast_exp(-a * a);
    let erf = if z < 0.0 { -erf_abs } else { erf_abs };
    0.5 * x * (1.0 + erf)
}

/// The fp32 GEMM rate of this machine, in GFLOP/s: the best of `repeats`
/// `size x size x size` products on every core, through the same GEMM the
/// encoder uses. The ceiling the encoder's rate is measured against.
pub fn gemm_probe_gflops(size: usize, repeats: usize) -> f64 {
    let a: Vec<f32> = (0..size * size).map(|i| (i % 7) as f32 * 0.1).collect();
    let b: Vec<f32> = (0..size * size).map(|i| (i % 5) as f32 * 0.1).collect();
    let mut c = vec![0f32; size * size];
    let mut best = f64::INFINITY;
    for _ in 0..repeats.max(1) {
        let clock = Instant::now();
        matmul(
            Operand::new(&a, size, size, size, 1),
            Operand::new(&b, size, size, size, 1),
            &mut c,
            (size, 1),
            1.0,
            Parallelism::Rayon(0),
        );
        best = best.min(clock.elapsed().as_secs_f64());
    }
    2.0 * (size as f64).powi(3) / best.max(1e-12) / 1e9
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_exp_matches_std() {
        for i in -2000..=200 {
            let x = i as f32 * 0.05;
            let (got, want) = (fast_exp(x), x.exp());
            assert!(
                (got - want).abs() <= want * 3e-7 + 1e-37,
                "exp({x}) = {got}, expected {want}"
            );
        }
    }

    #[test]
    fn gelu_matches_its_definition() {
        // erf through its series, in f64, as the reference.
        let erf = |z: f64| {
            let mut term = z;
            let mut sum = z;
            for n in 1..200 {
                term *= -z * z / n as f64;
                sum += term / (2 * n + 1) as f64;
            }
            sum * 2.0 / std::f64::consts::PI.sqrt()
        };
        for i in -60..=60 {
            let x = i as f64 * 0.1;
            let want = 0.5 * x * (1.0 + erf(x / std::f64::consts::SQRT_2));
            let got = gelu(x as f32) as f64;
            assert!(
                (got - want).abs() < 1e-6,
                "gelu({x}) = {got}, expected {want}"
            );
        }
    }

    #[test]
    fn matmul_agrees_with_naive_product_through_strides() {
        let (m, k, n) = (5, 3, 4);
        let a: Vec<f32> = (0..m * k).map(|i| i as f32 - 4.0).collect();
        let b: Vec<f32> = (0..n * k).map(|i| (i as f32) * 0.5).collect();
        // b is stored n x k; read it as its transpose (k x n).
        let mut c = vec![0f32; m * n];
        matmul(
            Operand::new(&a, m, k, k, 1),
            Operand::new(&b, k, n, 1, k),
            &mut c,
            (n, 1),
            2.0,
            Parallelism::None,
        );
        for r in 0..m {
            for col in 0..n {
                let want: f32 = (0..k).map(|d| a[r * k + d] * b[col * k + d]).sum::<f32>() * 2.0;
                assert!((c[r * n + col] - want).abs() < 1e-4);
            }
        }
    }
}
