//! The embedded model backend: llama.cpp in-process.
//!
//! One stage is one job. Its shared prefix (chat template, rubric, schema)
//! is evaluated once into KV sequence 0 and forked into N slots by KV copy;
//! each slot then evaluates only its unit's suffix and decodes under a
//! grammar derived from the stage's JSON Schema, so every answer parses. A
//! slot is refilled the moment it frees (continuous batching), and no batch
//! ever exceeds `n_batch` tokens, by construction. Token counts are measured
//! here, on the Rust side: llama.cpp's own perf counters miss batched and
//! copied tokens.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Instant;

use fanfold_model::{
    BackendError, BackendInfo, CallError, Completion, Job, ModelBackend, Next, Request, Usage,
};
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::{LlamaChatMessage, LlamaModel};
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::LlamaToken;
use llama_cpp_2::token::data::LlamaTokenData;
use llama_cpp_2::token::data_array::LlamaTokenDataArray;

mod draft;
mod forced;
mod grammar;

/// Temperature of retries; first attempts are greedy.
const RETRY_TEMPERATURE: f32 = 0.7;

/// Marks where the unit goes in the templated prompt.
const UNIT_SENTINEL: &str = "\u{1}FANFOLD_UNIT\u{1}";

/// Most slots one job may use: llama.cpp holds at most 256 sequences, and
/// one of them is the shared prefix.
pub const MAX_SLOTS: usize = 255;

#[derive(Clone, Debug)]
pub struct LlamaConfig {
    pub model_path: PathBuf,
    /// Threads for llama.cpp; all cores when absent.
    pub threads: Option<i32>,
    /// Most tokens in one decode call.
    pub n_batch: u32,
    /// KV budget of one slot: the unit's suffix plus its answer. Longer
    /// units are truncated to fit, and the truncation is counted.
    pub slot_tokens: u32,
    /// Evaluate the shared prefix once and fork it into the slots. Off, every
    /// unit evaluates its whole prompt: the naive baseline benchmarks compare
    /// against.
    pub share_prefix: bool,
    /// The model's identity, when the caller knows it already (a pinned
    /// hash); otherwise the weights file is hashed on load.
    pub model_id: Option<String>,
    /// Most tokens drafted ahead of a slot per decode step (0: off). Drafts
    /// come from the unit and the job's last answer and are kept only where
    /// greedy decoding agrees; like the slot count, they change answers
    /// only through the batch shape's rounding. Off by default: on a CPU a
    /// drafted token costs about half a decode step to check, about what
    /// the drafts save at the acceptance seen here.
    pub draft_tokens: usize,
    /// Jump forward over the text the grammar forces (the JSON between an
    /// answer's values, its end): it is drafted whole into the slot's next
    /// batch and checked there by greedy decoding, so answers do not change
    /// beyond the batch shape's rounding.
    pub jump_forward: bool,
    /// How the slots' keys and values are held and attended.
    pub attention: Attention,
}

/// The KV layout and attention kernel of a job's context.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Attention {
    /// One KV stream per sequence, so a token attends only to its own
    /// sequence's cells; flash attention as llama.cpp chooses.
    #[default]
    PerSequence,
    /// One KV cache for every sequence, flash attention off: a token's
    /// attention spans every slot's cells, masked, as one matrix product.
    UnifiedWithoutFlash,
}

impl Attention {
    fn apply(self, params: LlamaContextParams) -> LlamaContextParams {
        match self {
            Attention::PerSequence => params.with_kv_unified(false),
            Attention::UnifiedWithoutFlash => params
                .with_kv_unified(true)
                .with_flash_attention_policy(FLASH_ATTENTION_OFF),
        }
    }
}

/// llama.cpp's `LLAMA_FLASH_ATTN_TYPE_DISABLED`.
const FLASH_ATTENTION_OFF: i32 = 0;

impl LlamaConfig {
    pub fn new(model_path: PathBuf) -> LlamaConfig {
        LlamaConfig {
            model_path,
            threads: None,
            n_batch: 512,
            slot_tokens: 2048,
            share_prefix: true,
            model_id: None,
            draft_tokens: 0,
            jump_forward: true,
            attention: Attention::default(),
        }
    }
}

/// A GGUF file's tokenizer alone (its vocabulary, no weights): counts
/// tokens as the embedded model will, for packing many units into one
/// window without loading the model.
pub struct Vocabulary {
    model: LlamaModel,
}

impl Vocabulary {
    pub fn open(path: &Path) -> Result<Vocabulary, LlamaError> {
        let backend = backend()?;
        let params = LlamaModelParams::default().with_vocab_only(true);
        let model =
            LlamaModel::load_from_file(backend, path, &params).map_err(|e| LlamaError::Load {
                path: path.display().to_string(),
                detail: e.to_string(),
            })?;
        Ok(Vocabulary { model })
    }

    /// Tokens of `text` as the model reads a unit's part of a prompt:
    /// special tokens spelled out in a record are plain text there, and
    /// cost what their characters cost.
    pub fn count(&self, text: &str) -> u64 {
        self.model
            .vocab()
            .tokenize(text.as_bytes(), false, false)
            .len() as u64
    }
}

/// The identity of a GGUF file: its name and the start of its BLAKE3 hash.
pub fn model_identity(path: &Path) -> Result<String, LlamaError> {
    let load = |detail: String| LlamaError::Load {
        path: path.display().to_string(),
        detail,
    };
    // Streamed through the hasher rather than read whole.
    let file = std::fs::File::open(path).map_err(|e| load(e.to_string()))?;
    let mut hasher = blake3::Hasher::new();
    std::io::copy(&mut std::io::BufReader::new(file), &mut hasher)
        .map_err(|e| load(e.to_string()))?;
    let digest = hasher.finalize().to_hex();
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    Ok(format!("gguf:{name}:{}", &digest.as_str()[..16]))
}

#[derive(Debug, thiserror::Error)]
pub enum LlamaError {
    #[error("llama.cpp could not start: {0}")]
    Backend(String),
    #[error("loading model {path}: {detail}")]
    Load { path: String, detail: String },
}

fn backend() -> Result<&'static LlamaBackend, LlamaError> {
    static BACKEND: OnceLock<Result<LlamaBackend, String>> = OnceLock::new();
    BACKEND
        .get_or_init(|| {
            let mut b = LlamaBackend::init().map_err(|e| e.to_string())?;
            b.void_logs();
            Ok(b)
        })
        .as_ref()
        .map_err(|e| LlamaError::Backend(e.clone()))
}

/// A loaded GGUF model, ready to run jobs.
pub struct EmbeddedModel {
    model: LlamaModel,
    model_id: String,
    cfg: LlamaConfig,
    /// The grammar probe for jump-forward, made on the first job that
    /// needs it.
    forced: OnceLock<forced::Forced>,
}

/// What one job measured, beyond per-unit usage.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JobStats {
    pub prefix_tokens: u64,
    pub decode_ms: u64,
    /// Time spent choosing tokens under the grammar: the argmax, the
    /// grammar's check of it, the full vocabulary where the check refused,
    /// and advancing the grammar past the token chosen. Microseconds: one
    /// sample takes far less than a millisecond.
    pub sample_us: u64,
    pub full_vocab_samples: u64,
    pub samples: u64,
    pub decode_calls: u64,
    pub largest_batch: u64,
    pub truncated_units: u64,
    /// Units abandoned mid-decode because the job was cancelled.
    pub cancelled_in_flight: u64,
    /// Tokens drafted ahead of the model, and of them the ones greedy
    /// decoding chose too (each saved one decode step of its slot).
    pub drafted: u64,
    pub accepted: u64,
    /// Tokens of forced text drafted ahead (jump-forward), and of them the
    /// ones greedy decoding chose too.
    pub forced: u64,
    pub forced_accepted: u64,
    /// Answers finished where the grammar forced the rest of them, and the
    /// tokens of that rest (as the tokenizer splits it), never decoded.
    pub ended_early: u64,
    pub jumped: u64,
    /// Units answered from the scores of their decision's values alone.
    pub scored: u64,
    /// Decode time by batch size: where the model's time goes.
    pub by_batch: [BatchCost; BATCH_BUCKETS.len()],
}

/// Upper bounds of the batch-size buckets of [`JobStats::by_batch`].
pub const BATCH_BUCKETS: [usize; 6] = [1, 4, 16, 64, 256, usize::MAX];

/// Decode calls of one batch-size bucket.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BatchCost {
    pub calls: u64,
    pub tokens: u64,
    pub micros: u64,
}

impl BatchCost {
    /// Milliseconds per token evaluated.
    pub fn ms_per_token(&self) -> f64 {
        self.micros as f64 / 1000.0 / self.tokens.max(1) as f64
    }
}

impl EmbeddedModel {
    pub fn load(cfg: LlamaConfig) -> Result<EmbeddedModel, LlamaError> {
        let backend = backend()?;
        let load = |detail: String| LlamaError::Load {
            path: cfg.model_path.display().to_string(),
            detail,
        };
        let model_id = match &cfg.model_id {
            Some(id) => id.clone(),
            None => model_identity(&cfg.model_path)?,
        };
        let model = LlamaModel::load_from_file(backend, &cfg.model_path, &model_params())
            .map_err(|e| load(e.to_string()))?;
        Ok(EmbeddedModel {
            model,
            model_id,
            cfg,
            forced: OnceLock::new(),
        })
    }

    /// Sets how far slots draft ahead (0: off).
    pub fn set_draft_tokens(&mut self, n: usize) {
        self.cfg.draft_tokens = n;
    }

    /// Turns jump-forward over forced text on or off.
    pub fn set_jump_forward(&mut self, on: bool) {
        self.cfg.jump_forward = on;
    }

    pub fn path(&self) -> &Path {
        &self.cfg.model_path
    }

    /// Splits the chat-templated prompt around the unit: the part before is
    /// the shared prefix, the part after closes the user turn and opens the
    /// assistant's.
    fn template(&self, system: &str) -> (String, String) {
        let tmpl = self.model.chat_template(None).ok();
        let messages = (
            LlamaChatMessage::new("system".into(), system.into()),
            LlamaChatMessage::new("user".into(), UNIT_SENTINEL.into()),
        );
        if let (Some(tmpl), (Ok(system), Ok(user))) = (tmpl, messages)
            && let Ok(text) = self.model.apply_chat_template(&tmpl, &[system, user], true)
            && let Some(at) = text.find(UNIT_SENTINEL)
        {
            return (
                text[..at].to_owned(),
                text[at + UNIT_SENTINEL.len()..].to_owned(),
            );
        }
        // No usable template in the file: plain text turns.
        (format!("{system}\n\n"), "\n\nAnswer:\n".to_owned())
    }

    fn grammar(&self, job: &dyn Job) -> Result<Option<String>, BackendError> {
        match job.output_schema() {
            None => Ok(None),
            Some(schema) => schema_grammar(schema)
                .map(Some)
                .map_err(|e| BackendError::Setup(format!("output schema to grammar: {e}"))),
        }
    }

    /// Runs a job and returns what it measured.
    ///
    /// Fails before loading anything into a context when the job asks for
    /// more slots than llama.cpp can hold as sequences.
    pub fn run_job(&self, job: &dyn Job) -> Result<JobStats, BackendError> {
        let setup = |e: String| BackendError::Setup(e);
        let backend = backend().map_err(|e| setup(e.to_string()))?;
        let slots = job.slots().max(1);
        if slots > MAX_SLOTS {
            return Err(setup(format!(
                "{slots} slots: the embedded model holds at most {MAX_SLOTS} (llama.cpp keeps one sequence for the shared prefix and at most 256 in all)"
            )));
        }
        let vocab = self.model.vocab();
        let (prefix_text, tail_text) = self.template(job.prefix());
        let prefix = vocab.tokenize(prefix_text.as_bytes(), vocab.should_add_bos(), true);
        let tail = vocab.tokenize(tail_text.as_bytes(), false, true);
        let grammar = self.grammar(job)?;
        let forced = (self.cfg.jump_forward && grammar.is_some())
            .then(|| self.forced.get_or_init(|| forced::Forced::new(&self.model)));
        let scorer = job
            .decision()
            .and_then(|d| ChoiceScorer::new(&self.model, d));
        // A choice-only job's prompt ends with the answer's forced opening,
        // `{"key":"`; the decision is read from the logits after it.
        let choosing = match (job.choice_only(), &scorer, job.decision()) {
            (true, Some(_), Some(d)) => {
                let opening = format!("{{{}:\"", serde_json::Value::from(d.key.as_str()));
                Some((
                    d.key.clone(),
                    vocab.tokenize(opening.as_bytes(), false, false),
                ))
            }
            (true, None, _) => {
                tracing::warn!(
                    "the decision's values share a first token, so they cannot be scored apart: generating instead"
                );
                None
            }
            _ => None,
        };
        let n_batch = self.cfg.n_batch.max(16);
        let share = self.cfg.share_prefix;
        // Sequence 0 holds the prefix; forking copies it into a slot's
        // cells (its own KV stream, by default).
        let per_seq = prefix.len() as u32 + self.cfg.slot_tokens;
        let n_ctx = (slots as u32 + 1) * per_seq;
        let threads = self.cfg.threads.unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get() as i32)
                .unwrap_or(2)
        });
        let params = LlamaContextParams::default()
            .with_n_ctx(NonZeroU32::new(n_ctx))
            .with_n_batch(n_batch)
            .with_n_ubatch(n_batch)
            .with_n_seq_max(slots as u32 + 1)
            .with_n_threads(threads)
            .with_n_threads_batch(threads);
        let params = self.cfg.attention.apply(params);
        let mut ctx = self
            .model
            .new_context(backend, params)
            .map_err(|e| setup(format!("creating a context of {n_ctx} tokens: {e}")))?;
        let mut stats = JobStats {
            prefix_tokens: prefix.len() as u64,
            ..JobStats::default()
        };

        // The shared prefix, once, in sequence 0.
        let mut batch = LlamaBatch::new(n_batch as usize, 1);
        let shared: &[LlamaToken] = if share { &prefix } else { &[] };
        for (chunk_no, chunk) in shared.chunks(n_batch as usize).enumerate() {
            batch.clear();
            for (i, t) in chunk.iter().enumerate() {
                let pos = (chunk_no * n_batch as usize + i) as i32;
                batch
                    .add(*t, pos, &[0], false)
                    .map_err(|e| setup(e.to_string()))?;
            }
            ctx.decode(&mut batch)
                .map_err(|e| setup(format!("evaluating the shared prefix: {e}")))?;
            stats.decode_calls += 1;
        }

        let mut state: Vec<Slot> = (0..slots).map(|_| Slot::default()).collect();
        let mut prefix_billed = false;
        // The job's last finished answer: where the JSON between values is
        // drafted from.
        let mut last_answer: Vec<LlamaToken> = Vec::new();
        // Forced text, and the tokens the model split it into when it
        // last wrote it: drafted again in its own split.
        let mut learned: HashMap<Vec<u8>, Vec<LlamaToken>> = HashMap::new();
        let mut batch = LlamaBatch::new(n_batch as usize, slots as i32 + 1);
        loop {
            // A cancelled job abandons its in-flight units between decode
            // calls and pulls nothing more; the slots' KV is overwritten by
            // the next job's fork.
            if job.is_cancelled() {
                for slot in state.iter_mut() {
                    if let Some(req) = slot.req.take() {
                        stats.cancelled_in_flight += 1;
                        job.complete(req, Err(CallError::Cancelled));
                    }
                }
                break;
            }
            // Refill free slots the moment they free. The queue is asked
            // again every round: a failed answer comes back as a retry.
            // While any slot is busy the queue is asked without blocking:
            // this loop is what completes those slots, and a unit another
            // run holds must not stall them (that run may wait on ours).
            let mut busy = state.iter().any(|s| s.req.is_some());
            for (s, slot) in state.iter_mut().enumerate() {
                if slot.req.is_some() {
                    continue;
                }
                let next = if busy {
                    match job.poll_next() {
                        Next::Request(r) => Some(r),
                        Next::Later(_) | Next::Done => None,
                    }
                } else {
                    job.next()
                };
                match next {
                    None => break,
                    Some(req) => {
                        let seq = s as i32 + 1;
                        let ready = if share {
                            fork(&mut ctx, seq)
                        } else {
                            ctx.clear_kv_cache_seq(Some(seq as u32), None, None)
                                .map(|_| ())
                                .map_err(|e| e.to_string())
                        };
                        if let Err(e) = ready {
                            job.complete(req, Err(CallError::Backend(e)));
                            continue;
                        }
                        // A retry generates: the scored answer would repeat.
                        let opening = choosing
                            .as_ref()
                            .filter(|_| req.attempt <= 1)
                            .map(|(_, o)| o.as_slice());
                        let budget = self.cfg.slot_tokens as usize;
                        let answer = match opening {
                            Some(o) => o.len(),
                            None => req.max_output_tokens as usize,
                        };
                        let mut unit = vocab.tokenize(req.suffix.as_bytes(), false, false);
                        let room = budget.saturating_sub(answer + tail.len());
                        let mut truncated_tokens = 0;
                        if unit.len() > room {
                            truncated_tokens = (unit.len() - room) as u64;
                            unit.truncate(room);
                            stats.truncated_units += 1;
                        }
                        let unit_tokens = unit.clone();
                        unit.extend_from_slice(&tail);
                        unit.extend_from_slice(opening.unwrap_or_default());
                        let (pending, pos, prefix_pending) = if share {
                            (unit, prefix.len() as i32, 0)
                        } else {
                            let mut whole = prefix.clone();
                            whole.extend_from_slice(&unit);
                            (whole, 0, prefix.len())
                        };
                        // A per-unit schema (quotes restricted to the unit's
                        // sentences) wins over the job's.
                        let unit_grammar = req
                            .schema
                            .as_ref()
                            .filter(|_| opening.is_none())
                            .and_then(|s| schema_grammar(s).ok());
                        let decoding_grammar = match opening {
                            Some(_) => None,
                            None => unit_grammar.as_ref().or(grammar.as_ref()),
                        };
                        let sampler = match decoding_grammar {
                            Some(g) => match LlamaSampler::grammar(&self.model, g, "root") {
                                Ok(s) => Some(s),
                                Err(e) => {
                                    job.complete(
                                        req,
                                        Err(CallError::Backend(format!("grammar: {e}"))),
                                    );
                                    continue;
                                }
                            },
                            None => None,
                        };
                        let ahead = match (forced, &sampler) {
                            (Some(f), Some(g)) => f.ahead(g),
                            _ => forced::Ahead::default(),
                        };
                        *slot = Slot {
                            pending,
                            prefix_pending,
                            pos,
                            ahead,
                            sampler,
                            started: Some(Instant::now()),
                            req: Some(req),
                            truncated_tokens,
                            unit: unit_tokens,
                            choice_only: opening.is_some(),
                            ..Slot::default()
                        };
                        busy = true;
                    }
                }
            }
            if state.iter().all(|s| s.req.is_none()) {
                break;
            }

            // One batch of at most n_batch tokens: every generating slot's
            // next input with its drafts, and prompt chunks sharing the rest
            // fairly. It is laid out in sequence order: llama.cpp cuts a
            // batch over per-sequence KV streams into ubatches of consecutive
            // sequence ids, so tokens out of order cost extra ubatches, each
            // one more pass over the weights.
            batch.clear();
            let generating: Vec<bool> = state
                .iter()
                .map(|s| s.req.is_some() && s.pending.is_empty() && s.next_input.is_some())
                .collect();
            let mut room =
                (n_batch as usize).saturating_sub(generating.iter().filter(|g| **g).count());
            let prompting = |s: &Slot| s.req.is_some() && !s.pending.is_empty();
            let n_prompting = state.iter().filter(|s| prompting(s)).count();
            let mut takes = vec![0usize; slots];
            if let Some(share) = room.checked_div(n_prompting) {
                let fair = share.max(1);
                for (slot, slot_take) in state.iter().zip(takes.iter_mut()) {
                    if !prompting(slot) {
                        continue;
                    }
                    let mut take = fair.min(room).min(slot.pending.len());
                    if slot.prefix_pending > 0 {
                        take = take.min(slot.prefix_pending);
                    }
                    *slot_take = take;
                    room -= take;
                }
            }
            let per_slot = generating.iter().zip(&takes);
            for ((s, slot), (&generates, &take)) in state.iter_mut().enumerate().zip(per_slot) {
                slot.logits_at = None;
                slot.draft.clear();
                let seq = s as i32 + 1;
                if generates && let Some(t) = slot.next_input {
                    let _ = batch.add(t, slot.pos, &[seq], true);
                    slot.logits_at = Some(batch.n_tokens() - 1);
                    slot.pos += 1;
                    let max = self.draft_room(slot).min(room);
                    room -= self.add_draft(slot, &mut batch, seq, max, &learned, &last_answer);
                    continue;
                }
                if take == 0 {
                    continue;
                }
                slot.prefix_pending = slot.prefix_pending.saturating_sub(take);
                let chunk: Vec<LlamaToken> = slot.pending.drain(..take).collect();
                for (i, t) in chunk.iter().enumerate() {
                    let last = slot.pending.is_empty() && i + 1 == chunk.len();
                    let _ = batch.add(*t, slot.pos, &[seq], last);
                    slot.pos += 1;
                    if last {
                        slot.logits_at = Some(batch.n_tokens() - 1);
                    }
                }
                slot.evaluated += take as u64;
                if slot.pending.is_empty() {
                    // The prompt ends here: draft the answer's opening.
                    let max = self.draft_room(slot).min(room);
                    room -= self.add_draft(slot, &mut batch, seq, max, &learned, &last_answer);
                }
            }
            stats.largest_batch = stats.largest_batch.max(batch.n_tokens() as u64);
            let t0 = Instant::now();
            let decoded = ctx.decode(&mut batch);
            let elapsed = t0.elapsed();
            stats.decode_ms += elapsed.as_millis() as u64;
            let size = batch.n_tokens().max(0) as usize;
            if let Some(bucket) = BATCH_BUCKETS
                .iter()
                .position(|b| size <= *b)
                .and_then(|i| stats.by_batch.get_mut(i))
            {
                bucket.calls += 1;
                bucket.tokens += size as u64;
                bucket.micros += elapsed.as_micros() as u64;
            }
            tracing::trace!(
                tokens = batch.n_tokens(),
                generating = generating.iter().filter(|g| **g).count(),
                drafted = state.iter().map(|s| s.draft.len()).sum::<usize>(),
                prompt = takes.iter().sum::<usize>(),
                us = elapsed.as_micros() as u64,
                "decode"
            );
            if let Err(e) = decoded {
                // The batch is lost for every slot in it: fail them all, so
                // the engine retries, and keep serving the queue.
                for slot in state.iter_mut() {
                    if let Some(req) = slot.req.take() {
                        job.complete(req, Err(CallError::Backend(format!("decode failed: {e}"))));
                    }
                    *slot = Slot::default();
                }
                continue;
            }
            stats.decode_calls += 1;

            // Sample for every slot whose logits were computed: its last
            // input, then each draft greedy decoding agrees with.
            for (s, slot) in state.iter_mut().enumerate() {
                let Some(at) = slot.logits_at else { continue };
                if slot.choice_only {
                    if let (Some(scorer), Some((key, _)), Some(req)) =
                        (&scorer, &choosing, slot.req.take())
                    {
                        let scores = scorer.score(ctx.get_logits_ith(at));
                        // The one value read counts as one completion token.
                        let usage = bill(slot, share, prefix.len() as u64, &mut prefix_billed, 1);
                        let result = match best_choice(&scores) {
                            Some(value) => Ok(Completion {
                                text: serde_json::json!({ key.as_str(): value }).to_string(),
                                usage,
                                choices: Some(scores),
                                truncated_tokens: slot.truncated_tokens,
                            }),
                            None => Err(CallError::Backend("no choice could be scored".into())),
                        };
                        stats.scored += 1;
                        job.complete(req, result);
                    }
                    *slot = Slot::default();
                    continue;
                }
                let drafted = std::mem::take(&mut slot.draft);
                let forced_drafts = std::mem::take(&mut slot.forced_drafts);
                let mut accepted = 0;
                let mut finished = None;
                for j in 0..=drafted.len() {
                    let at = at + j as i32;
                    if let Some(scorer) = &scorer
                        && slot.choices.is_none()
                        && scorer.at_value_start(&slot.out)
                    {
                        slot.choices = Some(scorer.score(ctx.get_logits_ith(at)));
                    }
                    let t0 = Instant::now();
                    let retry_seed = slot
                        .req
                        .as_ref()
                        .filter(|r| r.attempt > 1)
                        .map(|r| r.attempt * 7919 + slot.generated);
                    let (token, full) = sample(&ctx, at, slot.sampler.as_mut(), retry_seed);
                    if let (Some(t), Some(s)) = (token, slot.sampler.as_mut())
                        && !vocab.is_eog(t)
                    {
                        s.accept(t);
                        if let Some(f) = forced {
                            slot.ahead = f.ahead(s);
                        }
                    }
                    stats.sample_us += t0.elapsed().as_micros() as u64;
                    stats.samples += 1;
                    stats.full_vocab_samples += u64::from(full);
                    let max_output = slot.req.as_ref().map_or(0, |r| r.max_output_tokens);
                    match token {
                        None => {
                            finished = Some(Err(CallError::Backend(
                                "the grammar allows no token here".into(),
                            )));
                            break;
                        }
                        Some(t) if vocab.is_eog(t) => {
                            finished = Some(Ok(()));
                            break;
                        }
                        Some(t) => {
                            slot.out.extend(vocab.token_to_piece(t, false, None));
                            slot.tokens.push(t);
                            slot.piece_ends.push(slot.out.len());
                            slot.generated += 1;
                            learn(slot, &mut learned);
                            if slot.generated >= max_output {
                                finished = Some(Ok(()));
                                break;
                            }
                            // The rest of the answer is forced: greedy
                            // decoding could write no other bytes, even one
                            // byte a token within the answer's budget.
                            if slot.ahead.ends
                                && slot.generated as usize + slot.ahead.text.len()
                                    <= max_output as usize
                            {
                                let rest = std::mem::take(&mut slot.ahead.text);
                                let tokens = vocab.tokenize(&rest, false, false).len() as u32;
                                slot.out.extend_from_slice(&rest);
                                slot.generated += tokens;
                                stats.jumped += u64::from(tokens);
                                stats.ended_early += 1;
                                finished = Some(Ok(()));
                                break;
                            }
                            if drafted.get(j) == Some(&t) {
                                // Already evaluated in this batch: its logits
                                // are the next position's.
                                accepted += 1;
                                continue;
                            }
                            slot.next_input = Some(t);
                            break;
                        }
                    }
                }
                let forced_accepted = accepted.min(forced_drafts);
                stats.forced += forced_drafts as u64;
                stats.forced_accepted += forced_accepted as u64;
                stats.drafted += (drafted.len() - forced_drafts) as u64;
                stats.accepted += (accepted - forced_accepted) as u64;
                let Some(result) = finished else {
                    // Drafts past the first disagreement were evaluated into
                    // the slot's KV; drop them so the next input follows the
                    // last accepted token.
                    let rejected = (drafted.len() - accepted) as i32;
                    if rejected > 0 {
                        slot.pos -= rejected;
                        let seq = s as u32 + 1;
                        if let Err(e) =
                            ctx.clear_kv_cache_seq(Some(seq), Some(slot.pos as u32), None)
                            && let Some(req) = slot.req.take()
                        {
                            job.complete(
                                req,
                                Err(CallError::Backend(format!("dropping rejected drafts: {e}"))),
                            );
                            *slot = Slot::default();
                        }
                    }
                    continue;
                };
                let Some(req) = slot.req.take() else { continue };
                let usage = bill(
                    slot,
                    share,
                    prefix.len() as u64,
                    &mut prefix_billed,
                    u64::from(slot.generated),
                );
                if result.is_ok() {
                    last_answer = std::mem::take(&mut slot.tokens);
                }
                let text = String::from_utf8_lossy(&slot.out).into_owned();
                let choices = slot.choices.take();
                job.complete(
                    req,
                    result.map(|()| Completion {
                        text,
                        usage,
                        choices,
                        truncated_tokens: slot.truncated_tokens,
                    }),
                );
                *slot = Slot::default();
            }
        }
        Ok(stats)
    }

    /// Most tokens a slot may draft now: none on a retry (it samples, and a
    /// sample is not checked against a draft), and never past the answer's
    /// token budget.
    fn draft_room(&self, slot: &Slot) -> usize {
        if slot.choice_only {
            return 0;
        }
        match &slot.req {
            Some(req) if req.attempt <= 1 => {
                req.max_output_tokens.saturating_sub(slot.generated + 1) as usize
            }
            _ => 0,
        }
    }

    /// Drafts up to `max` tokens for `slot` and appends them to the batch
    /// right after its last input, each with logits: first the text its
    /// grammar forces (jump-forward), then up to `draft_tokens` looked up
    /// in the unit and the job's last answer. Returns how many.
    fn add_draft(
        &self,
        slot: &mut Slot,
        batch: &mut LlamaBatch,
        seq: i32,
        max: usize,
        learned: &HashMap<Vec<u8>, Vec<LlamaToken>>,
        last_answer: &[LlamaToken],
    ) -> usize {
        let mut draft = Vec::new();
        if max > 0 && !slot.ahead.text.is_empty() {
            let text = &slot.ahead.text;
            draft = match learned.get(text) {
                Some(tokens) => tokens.clone(),
                None => {
                    // Until the model has written this text once, its split
                    // is a guess: the tokenizer's, a few tokens of it.
                    if slot.watch.is_none() {
                        slot.watch = Some(Watch {
                            text: text.clone(),
                            from_byte: slot.out.len(),
                            from_token: slot.tokens.len(),
                        });
                    }
                    let mut guess = self.model.vocab().tokenize(text, false, false);
                    guess.truncate(UNLEARNED_FORCED_TOKENS);
                    guess
                }
            };
            draft.truncate(max);
        }
        let forced_drafts = draft.len();
        let lookup = self.cfg.draft_tokens.min(max - forced_drafts);
        if lookup > 0 {
            let mut seen = slot.tokens.clone();
            seen.extend_from_slice(&draft);
            draft.extend(draft::draft(
                &seen,
                &[&slot.unit, last_answer],
                last_answer,
                lookup,
            ));
        }
        let mut added = 0;
        for t in &draft {
            if batch.add(*t, slot.pos, &[seq], true).is_err() {
                break;
            }
            slot.pos += 1;
            added += 1;
        }
        draft.truncate(added);
        slot.forced_drafts = forced_drafts.min(added);
        slot.draft = draft;
        added
    }
}

/// Most tokens of forced text drafted in the tokenizer's split, before the
/// model has shown its own: a wrong split wastes every token after it.
const UNLEARNED_FORCED_TOKENS: usize = 4;

/// Forced text a slot is writing, watched until the model has split it.
struct Watch {
    text: Vec<u8>,
    from_byte: usize,
    from_token: usize,
}

/// Once the slot's output covers the forced text it watches, remembers
/// the tokens that spell it (or the longest run of them that ends inside
/// it) as the model's split of that text.
fn learn(slot: &mut Slot, learned: &mut HashMap<Vec<u8>, Vec<LlamaToken>>) {
    let Some(w) = &slot.watch else { return };
    let end = w.from_byte + w.text.len();
    if slot.out.len() < end {
        return;
    }
    let within = slot
        .piece_ends
        .iter()
        .skip(w.from_token)
        .take_while(|e| **e <= end)
        .count();
    if let Some(tokens) = slot.tokens.get(w.from_token..w.from_token + within)
        && !tokens.is_empty()
    {
        learned.insert(w.text.clone(), tokens.to_vec());
    }
    slot.watch = None;
}

/// What one finished unit cost. The shared prefix was evaluated once; it is
/// billed to the first unit that finishes, so sums over units are exact.
fn bill(
    slot: &Slot,
    share: bool,
    prefix_tokens: u64,
    prefix_billed: &mut bool,
    completion_tokens: u64,
) -> Usage {
    let mut usage = Usage {
        prompt_tokens: slot.evaluated,
        cached_tokens: if share { prefix_tokens } else { 0 },
        completion_tokens,
        latency_ms: slot
            .started
            .map(|t| t.elapsed().as_millis() as u64)
            .unwrap_or(0),
    };
    if share && !*prefix_billed {
        usage.prompt_tokens += prefix_tokens;
        usage.cached_tokens = 0;
        *prefix_billed = true;
    }
    usage
}

/// The most probable value; the first on a tie, as greedy decoding would.
fn best_choice(scores: &[(String, f64)]) -> Option<&str> {
    let mut best: Option<&(String, f64)> = None;
    for c in scores {
        if best.is_none_or(|b| c.1 > b.1) {
            best = Some(c);
        }
    }
    best.map(|(v, _)| v.as_str())
}

#[derive(Default)]
struct Slot {
    req: Option<Request>,
    /// Suffix tokens not yet evaluated.
    pending: Vec<LlamaToken>,
    /// Of `pending`, how many leading tokens are the prefix (naive mode).
    /// A batch chunk never crosses that boundary, so both modes evaluate the
    /// same tokens in the same chunk shapes and their logits can be compared.
    prefix_pending: usize,
    pos: i32,
    sampler: Option<LlamaSampler>,
    next_input: Option<LlamaToken>,
    logits_at: Option<i32>,
    out: Vec<u8>,
    generated: u32,
    evaluated: u64,
    started: Option<Instant>,
    choices: Option<Vec<(String, f64)>>,
    /// Tokens of the unit cut to fit the slot's window.
    truncated_tokens: u64,
    /// The unit's tokens: quotes are drafted from them.
    unit: Vec<LlamaToken>,
    /// Tokens generated so far.
    tokens: Vec<LlamaToken>,
    /// Tokens drafted after the slot's last input in the current batch.
    draft: Vec<LlamaToken>,
    /// Of `draft`, how many lead it as the grammar's forced text.
    forced_drafts: usize,
    /// The text the grammar forces after the last token accepted.
    ahead: forced::Ahead,
    /// Forced text whose split by the model is not known yet.
    watch: Option<Watch>,
    /// `out`'s length after each of `tokens`.
    piece_ends: Vec<usize>,
    /// The answer is read from the scores after the prompt, not generated.
    choice_only: bool,
}

/// Reads the probability of each allowed decision from the logits at the
/// step where the decision's value begins: a softmax over the first token of
/// each choice. Only used when those first tokens are distinct, so the
/// probabilities describe the choices and nothing else.
struct ChoiceScorer {
    key_pattern: Vec<u8>,
    first_tokens: Vec<(String, LlamaToken)>,
}

impl ChoiceScorer {
    fn new(model: &LlamaModel, decision: &fanfold_model::DecisionField) -> Option<ChoiceScorer> {
        let vocab = model.vocab();
        let mut first_tokens = Vec::new();
        for c in &decision.choices {
            let t = *vocab.tokenize(c.as_bytes(), false, false).first()?;
            if first_tokens.iter().any(|(_, u)| *u == t) {
                return None;
            }
            first_tokens.push((c.clone(), t));
        }
        Some(ChoiceScorer {
            key_pattern: format!("\"{}\"", decision.key).into_bytes(),
            first_tokens,
        })
    }

    /// True when the text so far ends with `"key": "` (any spacing).
    fn at_value_start(&self, out: &[u8]) -> bool {
        let Some(rest) = out.strip_suffix(b"\"") else {
            return false;
        };
        let rest = rest.trim_ascii_end();
        let Some(rest) = rest.strip_suffix(b":") else {
            return false;
        };
        rest.trim_ascii_end().ends_with(&self.key_pattern)
    }

    fn score(&self, logits: &[f32]) -> Vec<(String, f64)> {
        let picked: Vec<f64> = self
            .first_tokens
            .iter()
            .map(|(_, t)| {
                logits
                    .get(t.0 as usize)
                    .copied()
                    .unwrap_or(f32::NEG_INFINITY) as f64
            })
            .collect();
        let max = picked.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let exps: Vec<f64> = picked.iter().map(|l| (l - max).exp()).collect();
        let sum: f64 = exps.iter().sum();
        self.first_tokens
            .iter()
            .zip(exps)
            .map(|((c, _), e)| (c.clone(), if sum > 0.0 { e / sum } else { 0.0 }))
            .collect()
    }
}

/// How every model is loaded: its weights stay in plain CPU buffers.
///
/// A build for a CPU with AMX (`target-cpu=native` on Sapphire Rapids and
/// later) compiles llama.cpp's AMX matrix kernels, and by default moves
/// the weights into AMX tile buffers. On a virtual machine that reports
/// AMX, the first matrix product in those kernels died of an illegal
/// instruction (SIGILL, every run); the same build with the weights in
/// plain buffers runs its AVX-512 kernels without fault.
fn model_params() -> LlamaModelParams {
    LlamaModelParams::default().with_use_extra_bufts(false)
}

/// Points `seq` at a fresh copy of the shared prefix.
fn fork(ctx: &mut LlamaContext<'_>, seq: i32) -> Result<(), String> {
    ctx.clear_kv_cache_seq(Some(seq as u32), None, None)
        .map_err(|e| e.to_string())?;
    ctx.copy_kv_cache_seq(0, seq, None, None)
        .map_err(|e| e.to_string())
}

/// The grammar of answers valid under `schema`, in compact JSON.
///
/// llama.cpp's converter lets whitespace follow every JSON token (its
/// `space` rule: nothing, a blank, or newlines and an indent), and a small
/// chat model takes it: it pretty-prints, spending one decode step on each
/// newline and indent, and every structural token after a value is a
/// choice between the token and whitespace instead of the only
/// continuation. Whitespace between JSON tokens carries nothing, so the
/// grammar allows none; whitespace inside strings is untouched.
pub fn schema_grammar(schema: &serde_json::Value) -> Result<String, String> {
    let grammar = grammar::schema_to_grammar(schema)?;
    Ok(compact_json_grammar(&grammar))
}

/// `grammar` with its `space` rule allowing only the empty string.
fn compact_json_grammar(grammar: &str) -> String {
    let mut out = String::with_capacity(grammar.len());
    for line in grammar.lines() {
        if line.starts_with("space ::=") {
            out.push_str("space ::= \"\"");
        } else {
            out.push_str(line);
        }
        out.push('\n');
    }
    out
}

/// Greedy decoding under the grammar. The argmax token is tried alone
/// first; only when the grammar rejects it is the grammar applied to the
/// whole vocabulary, which is the slow path. A retry (`retry_seed`) samples
/// at a moderate temperature instead: repeating a greedy answer that failed
/// validation would fail the same way.
/// Returns the token and whether the full vocabulary had to be searched.
fn sample(
    ctx: &LlamaContext<'_>,
    at: i32,
    sampler: Option<&mut LlamaSampler>,
    retry_seed: Option<u32>,
) -> (Option<LlamaToken>, bool) {
    if let Some(seed) = retry_seed {
        let mut all = ctx.token_data_array_ith(at);
        if let Some(g) = sampler {
            all.apply_sampler(g);
        }
        if !all.data.iter().any(|d| d.logit().is_finite()) {
            return (None, true);
        }
        all.apply_sampler(&mut LlamaSampler::temp(RETRY_TEMPERATURE));
        return (Some(all.sample_token(seed)), true);
    }
    let logits = ctx.get_logits_ith(at);
    let (best, best_logit) =
        logits
            .iter()
            .enumerate()
            .fold((0usize, f32::NEG_INFINITY), |acc, (i, l)| {
                if *l > acc.1 { (i, *l) } else { acc }
            });
    let best = LlamaToken::new(best as i32);
    let Some(sampler) = sampler else {
        return (Some(best), false);
    };
    let mut one = LlamaTokenDataArray::new(vec![LlamaTokenData::new(best, best_logit, 0.0)], false);
    one.apply_sampler(sampler);
    if one.data.first().is_some_and(|d| d.logit().is_finite()) {
        return (Some(best), false);
    }
    let mut all = ctx.token_data_array_ith(at);
    all.apply_sampler(sampler);
    let token = all
        .data
        .iter()
        .filter(|d| d.logit().is_finite())
        .max_by(|a, b| a.logit().total_cmp(&b.logit()))
        .map(|d| d.id());
    (token, true)
}

/// Most tokens of one text the surprise pass reads; words past them get
/// no score, and compression keeps them.
const SURPRISE_TOKENS: usize = 2048;

impl EmbeddedModel {
    /// The model's surprise at each token of each text: the text alone
    /// after the beginning-of-text token, one forward pass with logits at
    /// every position, each token's negative log-probability read from
    /// the logits before it. A text whose tokens do not spell it byte for
    /// byte (a tokenizer that normalises) gets no tokens.
    pub fn read_surprise(
        &self,
        texts: &[String],
    ) -> Result<fanfold_model::Surprises, BackendError> {
        let setup = |e: String| BackendError::Setup(e);
        let backend = backend().map_err(|e| setup(e.to_string()))?;
        let vocab = self.model.vocab();
        let n_batch = self.cfg.n_batch.max(16);
        let threads = self.cfg.threads.unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get() as i32)
                .unwrap_or(2)
        });
        let params = LlamaContextParams::default()
            .with_n_ctx(NonZeroU32::new(SURPRISE_TOKENS as u32 + 1))
            .with_n_batch(n_batch)
            .with_n_ubatch(n_batch)
            .with_n_seq_max(1)
            .with_n_threads(threads)
            .with_n_threads_batch(threads);
        let mut ctx = self
            .model
            .new_context(backend, params)
            .map_err(|e| setup(format!("creating a context for the surprise pass: {e}")))?;
        let started = Instant::now();
        let mut out = fanfold_model::Surprises::default();
        let mut batch = LlamaBatch::new(n_batch as usize, 1);
        let bos = vocab.bos();
        for text in texts {
            let mut tokens = vocab.tokenize(text.as_bytes(), false, false);
            tokens.truncate(SURPRISE_TOKENS);
            let mut spans = Vec::with_capacity(tokens.len());
            let mut spelled: Vec<u8> = Vec::with_capacity(text.len());
            for t in &tokens {
                let piece = vocab.token_to_piece(*t, false, None);
                spans.push((spelled.len(), spelled.len() + piece.len()));
                spelled.extend(piece);
            }
            // Cut at the token limit, the tokens spell the text's start.
            if tokens.is_empty() || !text.as_bytes().starts_with(&spelled) {
                out.texts.push(Vec::new());
                continue;
            }
            // The sequence read: the beginning-of-text token where the
            // model has one (so the first word is scored too), then the text.
            let mut seq: Vec<LlamaToken> = Vec::with_capacity(tokens.len() + 1);
            if bos.0 >= 0 {
                seq.push(bos);
            }
            let first_scored = seq.len();
            seq.extend(&tokens);
            ctx.clear_kv_cache();
            let mut nats = vec![f64::NAN; seq.len()];
            for (chunk_no, chunk) in seq.chunks(n_batch as usize).enumerate() {
                batch.clear();
                let base = chunk_no * n_batch as usize;
                for (i, t) in chunk.iter().enumerate() {
                    batch
                        .add(*t, (base + i) as i32, &[0], true)
                        .map_err(|e| setup(e.to_string()))?;
                }
                ctx.decode(&mut batch)
                    .map_err(|e| setup(format!("the surprise pass: {e}")))?;
                for i in 0..chunk.len() {
                    let Some(next) = seq.get(base + i + 1) else {
                        continue;
                    };
                    let logits = ctx.get_logits_ith(i as i32);
                    if let Some(slot) = nats.get_mut(base + i + 1) {
                        *slot = negative_log_probability(logits, next.0);
                    }
                }
            }
            out.usage.prompt_tokens += seq.len() as u64;
            out.texts.push(
                spans
                    .iter()
                    .enumerate()
                    .filter_map(|(j, &(start, end))| {
                        let n = *nats.get(first_scored + j)?;
                        n.is_finite().then_some(fanfold_model::TokenSurprise {
                            start,
                            end,
                            nats: n,
                        })
                    })
                    .collect(),
            );
        }
        out.usage.latency_ms = started.elapsed().as_millis() as u64;
        Ok(out)
    }
}

/// `-ln p(token)` under the softmax of `logits`.
fn negative_log_probability(logits: &[f32], token: i32) -> f64 {
    let Some(&own) = usize::try_from(token).ok().and_then(|t| logits.get(t)) else {
        return f64::NAN;
    };
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&l| ((l as f64) - max).exp()).sum();
    (max + sum.ln()) - own as f64
}

impl ModelBackend for EmbeddedModel {
    fn info(&self) -> BackendInfo {
        BackendInfo {
            kind: "llama".into(),
            model_id: self.model_id.clone(),
            simulated: false,
        }
    }

    fn run(&self, job: &dyn Job) -> Result<(), BackendError> {
        let stats = self.run_job(job)?;
        tracing::info!(
            prefix_tokens = stats.prefix_tokens,
            decode_ms = stats.decode_ms,
            sample_us = stats.sample_us,
            samples = stats.samples,
            full_vocab_samples = stats.full_vocab_samples,
            decode_calls = stats.decode_calls,
            largest_batch = stats.largest_batch,
            truncated_units = stats.truncated_units,
            drafted = stats.drafted,
            accepted = stats.accepted,
            forced = stats.forced,
            forced_accepted = stats.forced_accepted,
            ended_early = stats.ended_early,
            jumped = stats.jumped,
            scored = stats.scored,
            "llama job finished"
        );
        Ok(())
    }

    fn token_surprise(
        &self,
        texts: &[String],
    ) -> Result<Option<fanfold_model::Surprises>, BackendError> {
        self.read_surprise(texts).map(Some)
    }
}

/// What llama.cpp itself can do on this machine with this model, measured
/// by the same binary: the ceiling the fabric's throughput is judged by.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ThroughputLimit {
    /// Tokens per second evaluating one full batch of prompt tokens.
    pub prompt_tps: f64,
    /// Tokens per second generating with `seqs` sequences, one token each
    /// per step.
    pub generation_tps: f64,
}

/// Measures the limits with the KV cache already `depth` tokens deep: one
/// 512-token prompt batch evaluated at positions `depth..depth + 512`, then
/// 32 generation steps of `seqs` sequences forked from there. Attention
/// costs grow with depth, so the limit a run is judged by should be taken
/// at the depth its slots work at.
pub fn throughput_limit(
    model_path: &Path,
    seqs: usize,
    depth: usize,
    attention: Attention,
) -> Result<ThroughputLimit, LlamaError> {
    const PROMPT: usize = 512;
    const STEPS: usize = 32;
    let backend = backend()?;
    let fail = |e: String| LlamaError::Backend(e);
    let model = LlamaModel::load_from_file(backend, model_path, &model_params()).map_err(|e| {
        LlamaError::Load {
            path: model_path.display().to_string(),
            detail: e.to_string(),
        }
    })?;
    let seqs = seqs.max(1);
    let threads = std::thread::available_parallelism()
        .map(|n| n.get() as i32)
        .unwrap_or(2);
    let per_seq = (depth + PROMPT + STEPS + 16) as u32;
    let params = LlamaContextParams::default()
        .with_n_ctx(NonZeroU32::new(per_seq * (seqs as u32 + 1)))
        .with_n_batch(PROMPT as u32)
        .with_n_ubatch(PROMPT as u32)
        .with_n_seq_max(seqs as u32 + 1)
        .with_n_threads(threads)
        .with_n_threads_batch(threads);
    let mut ctx = model
        .new_context(backend, attention.apply(params))
        .map_err(|e| fail(e.to_string()))?;
    let n_vocab = model.n_vocab().max(1000);
    let mut batch = LlamaBatch::new(PROMPT, seqs as i32 + 1);
    // Filler prompt tokens for sequence 0 at positions `from..to`.
    let fill = |ctx: &mut LlamaContext<'_>, batch: &mut LlamaBatch, from: usize, to: usize| {
        for chunk_start in (from..to).step_by(PROMPT) {
            batch.clear();
            let chunk_end = (chunk_start + PROMPT).min(to);
            for i in chunk_start..chunk_end {
                let token = LlamaToken::new(100 + (i as i32 * 37) % (n_vocab - 100));
                batch
                    .add(token, i as i32, &[0], i + 1 == chunk_end)
                    .map_err(|e| fail(e.to_string()))?;
            }
            ctx.decode(batch).map_err(|e| fail(e.to_string()))?;
        }
        Ok::<(), LlamaError>(())
    };
    // One warm-up batch, then the measured one on a cleared cache filled
    // to `depth`.
    fill(&mut ctx, &mut batch, 0, PROMPT)?;
    ctx.clear_kv_cache();
    fill(&mut ctx, &mut batch, 0, depth)?;
    let started = Instant::now();
    fill(&mut ctx, &mut batch, depth, depth + PROMPT)?;
    let prompt_tps = PROMPT as f64 / started.elapsed().as_secs_f64();
    for s in 1..=seqs {
        fork(&mut ctx, s as i32).map_err(fail)?;
    }
    let started = Instant::now();
    for step in 0..STEPS {
        batch.clear();
        for s in 1..=seqs {
            batch
                .add(
                    LlamaToken::new(200 + step as i32),
                    (depth + PROMPT + step) as i32,
                    &[s as i32],
                    true,
                )
                .map_err(|e| fail(e.to_string()))?;
        }
        ctx.decode(&mut batch).map_err(|e| fail(e.to_string()))?;
    }
    let generation_tps = (STEPS * seqs) as f64 / started.elapsed().as_secs_f64();
    Ok(ThroughputLimit {
        prompt_tps,
        generation_tps,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schema_grammar_allows_no_whitespace_between_json_tokens() {
        let schema = serde_json::json!({
            "type": "object",
            "required": ["decision", "quote"],
            "properties": {"decision": {"enum": ["yes", "no"]}, "quote": {"type": "string"}}
        });
        let grammar = schema_grammar(&schema).unwrap();
        let space: Vec<&str> = grammar
            .lines()
            .filter(|l| l.starts_with("space ::="))
            .collect();
        assert_eq!(space, ["space ::= \"\""], "{grammar}");
        // Every other rule is the converter's own.
        let original = grammar::schema_to_grammar(&schema).unwrap();
        let others = |g: &str| -> Vec<String> {
            g.lines()
                .filter(|l| !l.starts_with("space ::="))
                .map(str::to_owned)
                .collect()
        };
        assert_eq!(others(&original), others(&grammar));
        assert!(
            original
                .lines()
                .any(|l| l.starts_with("space ::=") && l.contains("\\n"))
        );
    }
}
