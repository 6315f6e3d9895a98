//! Configuration. Every struct here is plain data that may be printed or
//! serialized: none holds a key, only the name of the environment variable
//! that does.

use serde::{Deserialize, Serialize};

pub use crate::batch::BatchConfig;

/// One server that can answer for the model, with its own limits.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointConfig {
    /// The API root as the provider's SDK spells it: for OpenAI-compatible
    /// servers including `/v1` (`https://api.openai.com/v1`,
    /// `http://127.0.0.1:8080/v1`), for Anthropic without it
    /// (`https://api.anthropic.com`).
    pub base_url: String,
    /// The environment variable holding the API key; `None` for a server
    /// without authentication (a local llama-server, vLLM or Ollama).
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// Share of traffic relative to the other endpoints of the pool; at
    /// least 1.
    #[serde(default = "default_weight")]
    pub weight: u32,
    /// Most requests in flight to this endpoint at once.
    #[serde(default = "default_concurrency")]
    pub max_concurrency: usize,
    /// Requests-per-minute budget; `None` learns it from the provider's
    /// rate-limit headers, if it sends any.
    #[serde(default)]
    pub requests_per_minute: Option<u64>,
    /// Tokens-per-minute budget (prompt plus completion); `None` learns it
    /// from the provider's rate-limit headers, if it sends any.
    #[serde(default)]
    pub tokens_per_minute: Option<u64>,
}

impl EndpointConfig {
    /// An endpoint with default limits and no key.
    pub fn new(base_url: impl Into<String>) -> EndpointConfig {
        EndpointConfig {
            base_url: base_url.into(),
            api_key_env: None,
            weight: default_weight(),
            max_concurrency: default_concurrency(),
            requests_per_minute: None,
            tokens_per_minute: None,
        }
    }
}

/// Transport-level retries. Output the engine judges invalid is not retried
/// here; the engine's attempts cover it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetryConfig {
    /// Retries after the first try, so at most `max_retries + 1` sends.
    pub max_retries: u32,
    /// The first backoff ceiling; it doubles each retry. The actual wait is
    /// uniform in `[0, ceiling]` (full jitter), so many clients that failed
    /// together do not come back together.
    pub backoff_base_ms: u64,
    /// The largest backoff ceiling.
    pub backoff_max_ms: u64,
    /// A `Retry-After` longer than this fails the request at once instead
    /// of holding a slot that long.
    pub max_retry_after_ms: u64,
}

impl Default for RetryConfig {
    fn default() -> RetryConfig {
        RetryConfig {
            max_retries: 4,
            backoff_base_ms: 500,
            backoff_max_ms: 30_000,
            max_retry_after_ms: 120_000,
        }
    }
}

/// The per-endpoint circuit breaker.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BreakerConfig {
    /// Consecutive failures (5xx, timeouts, connection faults, truncated or
    /// unreadable bodies) that open the breaker. Rate limiting and client
    /// errors do not count: they say nothing about the endpoint's health.
    pub failure_threshold: u32,
    /// How long an open breaker refuses traffic before one probe request
    /// may test the endpoint again (half-open).
    pub cooldown_ms: u64,
}

impl Default for BreakerConfig {
    fn default() -> BreakerConfig {
        BreakerConfig {
            failure_threshold: 5,
            cooldown_ms: 30_000,
        }
    }
}

/// What both backends share: the endpoints and how they are driven.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransportConfig {
    /// The pool; the first endpoint names the model id.
    pub endpoints: Vec<EndpointConfig>,
    /// The whole of one attempt: connecting, sending, and reading the body.
    #[serde(default = "default_request_timeout")]
    pub request_timeout_ms: u64,
    /// The whole of one call, every attempt and the waits between them,
    /// from its first send: a hanging endpoint fails a call within this
    /// (or within one attempt, when `request_timeout_ms` is longer).
    #[serde(default = "default_call_timeout")]
    pub call_timeout_ms: u64,
    #[serde(default = "default_connect_timeout")]
    pub connect_timeout_ms: u64,
    #[serde(default)]
    pub retry: RetryConfig,
    #[serde(default)]
    pub breaker: BreakerConfig,
    /// Send a job's first request alone and wait for it before fanning
    /// out, so the provider's prefix cache holds the shared prefix before
    /// the other requests arrive.
    #[serde(default = "default_true")]
    pub warm_up: bool,
    /// The largest response body read; a larger one is refused as an
    /// invalid response (a runaway or hostile server cannot fill memory).
    #[serde(default = "default_max_response_bytes")]
    pub max_response_bytes: u64,
}

impl TransportConfig {
    pub fn new(endpoints: Vec<EndpointConfig>) -> TransportConfig {
        TransportConfig {
            endpoints,
            request_timeout_ms: default_request_timeout(),
            call_timeout_ms: default_call_timeout(),
            connect_timeout_ms: default_connect_timeout(),
            retry: RetryConfig::default(),
            breaker: BreakerConfig::default(),
            warm_up: true,
            max_response_bytes: default_max_response_bytes(),
        }
    }
}

/// How the output schema reaches the model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputMode {
    /// The provider constrains the output: `response_format` with a JSON
    /// Schema on OpenAI-compatible servers, a single forced tool on
    /// Anthropic.
    #[default]
    JsonSchema,
    /// `response_format: {"type": "json_object", "schema": ...}`, the form
    /// llama-cpp-python's server accepts (it refuses `json_schema`).
    JsonObject,
    /// The schema is only in the prompt; the engine validates the output.
    Prompt,
}

/// Which body field carries the completion limit. Servers built on the
/// original API (vLLM, llama-server, Ollama) read `max_tokens`; OpenAI's
/// reasoning models accept only `max_completion_tokens`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MaxTokensField {
    #[default]
    MaxTokens,
    MaxCompletionTokens,
}

/// An OpenAI-compatible `/chat/completions` backend.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpenAiConfig {
    /// The model name as the server knows it.
    pub model: String,
    pub transport: TransportConfig,
    /// `None` leaves the field out (some models reject it).
    #[serde(default = "default_temperature")]
    pub temperature: Option<f64>,
    #[serde(default)]
    pub seed: Option<u64>,
    #[serde(default)]
    pub output: OutputMode,
    /// Passed as `json_schema.strict`. OpenAI's strict mode accepts only a
    /// subset of JSON Schema.
    #[serde(default = "default_true")]
    pub strict: bool,
    /// Send each request's narrowed schema instead of the job's. Useful
    /// with local servers, whose grammars cost nothing to build; hosted
    /// providers compile (and may cache by) each distinct schema, so the
    /// job's single schema is the default.
    #[serde(default)]
    pub per_request_schema: bool,
    #[serde(default)]
    pub max_tokens_field: MaxTokensField,
    /// Stream the answer as server-sent events, asking for usage in the
    /// last event.
    #[serde(default)]
    pub stream: bool,
    /// Send the job through the Batch API (`/files` and `/batches`)
    /// instead of one request per unit.
    #[serde(default)]
    pub batch: Option<BatchConfig>,
    /// Ask for each token's likeliest alternatives (`logprobs`,
    /// `top_logprobs`) where a job has a decision, so each allowed value
    /// gets a probability. Off by default: some models refuse the fields.
    #[serde(default)]
    pub logprobs: bool,
}

impl OpenAiConfig {
    pub fn new(model: impl Into<String>, endpoints: Vec<EndpointConfig>) -> OpenAiConfig {
        OpenAiConfig {
            model: model.into(),
            transport: TransportConfig::new(endpoints),
            temperature: default_temperature(),
            seed: None,
            output: OutputMode::JsonSchema,
            strict: true,
            per_request_schema: false,
            max_tokens_field: MaxTokensField::MaxTokens,
            stream: false,
            batch: None,
            logprobs: false,
        }
    }
}

/// An Anthropic Messages API backend.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AnthropicConfig {
    pub model: String,
    pub transport: TransportConfig,
    #[serde(default = "default_temperature")]
    pub temperature: Option<f64>,
    /// `JsonSchema` forces a single tool whose input schema is the job's
    /// output schema. The tool is always the job's schema, never a
    /// request's narrowed one: tools precede the system prompt in
    /// Anthropic's cache order, so a tool that changed per request would
    /// defeat the prefix cache.
    #[serde(default)]
    pub output: OutputMode,
    /// Mark the system block (the shared prefix) `cache_control:
    /// ephemeral`.
    #[serde(default = "default_true")]
    pub cache_prefix: bool,
    /// Send the job through Message Batches instead of one request per
    /// unit.
    #[serde(default)]
    pub batch: Option<BatchConfig>,
}

impl AnthropicConfig {
    pub fn new(model: impl Into<String>, endpoints: Vec<EndpointConfig>) -> AnthropicConfig {
        AnthropicConfig {
            model: model.into(),
            transport: TransportConfig::new(endpoints),
            temperature: default_temperature(),
            output: OutputMode::JsonSchema,
            cache_prefix: true,
            batch: None,
        }
    }
}

fn default_weight() -> u32 {
    1
}
fn default_concurrency() -> usize {
    4
}
/// Two attempts on a hanging endpoint fit in [`default_call_timeout`].
fn default_request_timeout() -> u64 {
    30_000
}
/// A call fails within a minute by default, retries included.
fn default_call_timeout() -> u64 {
    60_000
}
fn default_connect_timeout() -> u64 {
    10_000
}
/// 8 MiB: far above any chat answer, far below what hurts a machine.
fn default_max_response_bytes() -> u64 {
    8 << 20
}
fn default_true() -> bool {
    true
}
fn default_temperature() -> Option<f64> {
    Some(0.0)
}
