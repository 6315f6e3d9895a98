//! Building model backends from the spec's `[backends]` table.

use std::path::Path;

use fanfold_core::spec::{BackendSpec, Execution, HttpBackendSpec, HttpOutput};
use fanfold_http::{
    AnthropicBackend, AnthropicConfig, BatchConfig, EndpointConfig, OpenAiBackend, OpenAiConfig,
    OutputMode, PriceTable, TransportConfig,
};
use fanfold_llama::{EmbeddedModel, LlamaConfig};
use fanfold_model::{BackendError, BackendInfo, Job, ModelBackend, Usage};
use fanfold_sim::{ReplayBackend, ScriptedBackend};

use crate::models;

/// Builds the backend `spec` declares; `execution` chooses between one
/// request per unit and the provider's batch API.
pub fn build(
    spec: &BackendSpec,
    spec_dir: &Path,
    execution: Execution,
) -> Result<Box<dyn ModelBackend>, BackendError> {
    build_sharing(spec, spec_dir, execution, None)
}

/// [`build`], with an HTTP backend's per-minute limits held in `rates` as
/// well, shared with the other processes using it.
pub fn build_sharing(
    spec: &BackendSpec,
    spec_dir: &Path,
    execution: Execution,
    rates: Option<std::sync::Arc<dyn fanfold_model::SharedRates>>,
) -> Result<Box<dyn ModelBackend>, BackendError> {
    let batch = execution == Execution::Batch;
    if batch && !matches!(spec, BackendSpec::Openai(_) | BackendSpec::Anthropic(_)) {
        return Err(BackendError::Setup(
            "batch execution needs an `openai` or `anthropic` backend".into(),
        ));
    }
    match spec {
        BackendSpec::Scripted {
            script,
            faults,
            delay_ms,
        } => {
            let path = spec_dir.join(script);
            let text = std::fs::read_to_string(&path).map_err(|e| {
                BackendError::Setup(format!("reading script {}: {e}", path.display()))
            })?;
            Ok(Box::new(ScriptedBackend::new(
                text,
                faults.clone(),
                *delay_ms,
            )?))
        }
        BackendSpec::Replay { cassette } => {
            Ok(Box::new(ReplayBackend::open(&spec_dir.join(cassette))?))
        }
        BackendSpec::Llama {
            model,
            threads,
            n_batch,
            slot_tokens,
            draft_tokens,
            jump_forward,
        } => {
            let identity = identity(spec, spec_dir, execution)?;
            let path = match model {
                Some(m) => spec_dir.join(m),
                None => models::ensure(&models::SMOLLM2_135M, &models::cache_dir(), &|line| {
                    tracing::info!("{line}")
                })
                .map_err(|e| BackendError::Setup(e.to_string()))?,
            };
            let mut cfg = LlamaConfig::new(path);
            cfg.threads = *threads;
            cfg.n_batch = *n_batch;
            cfg.slot_tokens = *slot_tokens;
            cfg.draft_tokens = *draft_tokens;
            cfg.jump_forward = *jump_forward;
            cfg.model_id = Some(identity.model_id);
            let model = EmbeddedModel::load(cfg).map_err(|e| BackendError::Setup(e.to_string()))?;
            Ok(Box::new(model))
        }
        BackendSpec::Openai(h) => {
            let mut cfg = OpenAiConfig::new(h.model.clone(), Vec::new());
            cfg.transport = transport(h)?;
            cfg.output = output_mode(h.output);
            cfg.per_request_schema = h.per_unit_schema;
            cfg.stream = h.stream;
            if h.logprobs && h.stream {
                return Err(BackendError::Setup(
                    "logprobs are read from whole answers: drop `stream` or `logprobs`".into(),
                ));
            }
            cfg.logprobs = h.logprobs;
            cfg.batch = batch.then(|| batch_config(h));
            let prices = prices(h, spec_dir)?;
            let mut inner = OpenAiBackend::new(cfg)?;
            // Before any call: a pool whose endpoints serve different
            // weights would store one's answers as the other's.
            inner.check_pool()?;
            if let Some(r) = rates {
                inner.share_rates(r);
            }
            Ok(Box::new(Priced {
                inner,
                model: h.model.clone(),
                prices,
                batch,
                output: h.output,
            }))
        }
        BackendSpec::Anthropic(h) => {
            if h.logprobs {
                return Err(BackendError::Setup(
                    "Anthropic's Messages API returns no log probabilities: drop `logprobs`".into(),
                ));
            }
            let mut cfg = AnthropicConfig::new(h.model.clone(), Vec::new());
            cfg.transport = transport(h)?;
            cfg.output = output_mode(h.output);
            cfg.batch = batch.then(|| batch_config(h));
            let prices = prices(h, spec_dir)?;
            let mut inner = AnthropicBackend::new(cfg)?;
            if let Some(r) = rates {
                inner.share_rates(r);
            }
            Ok(Box::new(Priced {
                inner,
                model: h.model.clone(),
                prices,
                batch,
                output: h.output,
            }))
        }
    }
}

/// Whether the backend `spec` declares takes batches through a provider's
/// own batch API: Anthropic's always does; an OpenAI-compatible endpoint
/// is asked (most local servers have none); the others never do.
pub fn offers_batch_api(spec: &BackendSpec) -> Result<bool, BackendError> {
    match spec {
        BackendSpec::Openai(h) => {
            let mut cfg = OpenAiConfig::new(h.model.clone(), Vec::new());
            cfg.transport = transport(h)?;
            OpenAiBackend::new(cfg)?
                .offers_batch_api()
                .map_err(BackendError::Setup)
        }
        BackendSpec::Anthropic(_) => Ok(true),
        BackendSpec::Scripted { .. } | BackendSpec::Replay { .. } | BackendSpec::Llama { .. } => {
            Ok(false)
        }
    }
}

/// A backend's identity, from the spec alone: the embedded model is named
/// by its pinned hash (or its file's hash) and is never loaded or fetched
/// here. Everything that changes what a backend answers is in it: the
/// embedded model's slot window (a longer window truncates fewer units)
/// and an HTTP backend's output mode.
pub fn identity(
    spec: &BackendSpec,
    spec_dir: &Path,
    execution: Execution,
) -> Result<BackendInfo, BackendError> {
    match spec {
        BackendSpec::Llama {
            model, slot_tokens, ..
        } => {
            let id = match model {
                Some(m) => fanfold_llama::model_identity(&spec_dir.join(m))
                    .map_err(|e| BackendError::Setup(e.to_string()))?,
                None => format!(
                    "gguf:{}:sha256-{}",
                    models::SMOLLM2_135M.file,
                    &models::SMOLLM2_135M.sha256[..16]
                ),
            };
            Ok(BackendInfo {
                kind: "llama".into(),
                model_id: format!("{id}/slot{slot_tokens}"),
                simulated: false,
            })
        }
        BackendSpec::Openai(_)
        | BackendSpec::Anthropic(_)
        | BackendSpec::Scripted { .. }
        | BackendSpec::Replay { .. } => Ok(build(spec, spec_dir, execution)?.info()),
    }
}

fn output_mode(o: HttpOutput) -> OutputMode {
    match o {
        HttpOutput::JsonSchema => OutputMode::JsonSchema,
        HttpOutput::JsonObject => OutputMode::JsonObject,
        HttpOutput::Prompt => OutputMode::Prompt,
    }
}

fn transport(h: &HttpBackendSpec) -> Result<TransportConfig, BackendError> {
    let endpoints = h
        .endpoint_list()
        .map_err(BackendError::Setup)?
        .into_iter()
        .map(|spec| {
            let mut e = EndpointConfig::new(spec.base_url);
            e.api_key_env = spec.api_key_env;
            e.weight = spec.weight;
            if let Some(c) = spec.max_concurrency {
                e.max_concurrency = c;
            }
            e.requests_per_minute = spec.requests_per_minute;
            e.tokens_per_minute = spec.tokens_per_minute;
            e
        })
        .collect();
    let mut t = TransportConfig::new(endpoints);
    if let Some(ms) = h.timeout_ms {
        t.request_timeout_ms = ms;
    }
    if let Some(n) = h.max_retries {
        t.retry.max_retries = n;
    }
    if let Some(n) = h.breaker_failures {
        t.breaker.failure_threshold = n;
    }
    if let Some(ms) = h.breaker_cooldown_ms {
        t.breaker.cooldown_ms = ms;
    }
    if let Some(n) = h.max_response_bytes {
        t.max_response_bytes = n;
    }
    Ok(t)
}

fn batch_config(h: &HttpBackendSpec) -> BatchConfig {
    let mut b = BatchConfig::default();
    if let Some(ms) = h.batch_poll_ms {
        b.poll_initial_ms = ms;
    }
    if let Some(ms) = h.batch_poll_max_ms {
        b.poll_max_ms = ms;
    }
    b.max_wait_secs = h.batch_wait_secs;
    b
}

fn prices(h: &HttpBackendSpec, spec_dir: &Path) -> Result<PriceTable, BackendError> {
    match &h.prices {
        Some(file) => PriceTable::load(&spec_dir.join(file)),
        None => PriceTable::bundled(),
    }
    .map_err(|e| BackendError::Setup(e.to_string()))
}

/// An HTTP backend with its price table: the engine asks it what each
/// call's usage cost, at the batch discount for a batch backend.
struct Priced<B> {
    inner: B,
    model: String,
    prices: PriceTable,
    batch: bool,
    /// The output mode, part of the identity: the same model answers
    /// differently under a schema than under a prompt.
    output: HttpOutput,
}

impl<B: ModelBackend> ModelBackend for Priced<B> {
    fn info(&self) -> BackendInfo {
        let mut info = self.inner.info();
        let mode = match self.output {
            HttpOutput::JsonSchema => "json_schema",
            HttpOutput::JsonObject => "json_object",
            HttpOutput::Prompt => "prompt",
        };
        info.model_id = format!("{}#{mode}", info.model_id);
        info
    }
    fn run(&self, job: &dyn Job) -> Result<(), BackendError> {
        self.inner.run(job)
    }
    fn cost_usd(&self, usage: &Usage) -> Option<f64> {
        self.prices.cost_usd(&self.model, usage, self.batch)
    }
}
