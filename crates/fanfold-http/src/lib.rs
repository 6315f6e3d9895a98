//! HTTP model backends: OpenAI-compatible chat completions (vLLM,
//! llama.cpp's llama-server, Ollama, OpenAI) and the Anthropic Messages API.
//!
//! Both implement [`fanfold_model::ModelBackend`] over one shared transport
//! that is built to survive real providers:
//!
//! - **Admission control** per endpoint: a concurrency cap, and
//!   requests-per-minute and tokens-per-minute budgets. A request's token
//!   cost (estimated prompt tokens plus its completion limit) is reserved
//!   before sending and corrected with the usage the provider reports. The
//!   provider's own rate-limit headers (`x-ratelimit-*`,
//!   `anthropic-ratelimit-*`, `retry-after`) tighten the budgets further.
//! - **Retries** of transport faults (429, 5xx, timeouts, connection
//!   failures, truncated bodies) with exponential backoff and full jitter,
//!   honouring `Retry-After`, bounded by `max_retries`. Client errors (400,
//!   401, 403, 404, ...) and well-formed but invalid envelopes fail at once;
//!   the engine's own attempts decide whether to try again.
//! - **Circuit breakers** per endpoint and weighted choice among the
//!   endpoints of a pool whose breakers admit traffic.
//! - **Prefix warm-up**: the first request of a job is sent alone, so the
//!   provider's prefix cache is warm before the fan-out. Cached tokens are
//!   only ever what the provider reported.
//!
//! API keys are read from environment variables into [`ApiKey`], whose
//! `Debug` is redacted and which is never serialized, logged, or echoed in
//! an error (response excerpts are scrubbed of it).
//!
//! **Batch mode** ([`BatchConfig`]) sends a whole job through OpenAI's
//! Batch API or Anthropic's Message Batches instead: submit, poll, map each
//! result back to its unit. Submitted batches go to the job's ledger, so a
//! run stopped while one is pending collects it when run again.
//!
//! [`PriceTable`] turns [`fanfold_model::Usage`] into US dollars from an
//! editable TOML file.

mod anthropic;
mod batch;
mod breaker;
mod config;
mod limits;
mod logprobs;
mod openai;
mod price;
mod secret;
mod transport;

pub use anthropic::AnthropicBackend;
pub use config::{
    AnthropicConfig, BatchConfig, BreakerConfig, EndpointConfig, MaxTokensField, OpenAiConfig,
    OutputMode, RetryConfig, TransportConfig,
};
pub use openai::OpenAiBackend;
pub use price::{ModelPrice, PriceError, PriceTable};
pub use secret::ApiKey;
pub use transport::{EndpointStats, HttpStats};

use fanfold_model::BackendError;

/// Why a backend could not be built.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error(
        "environment variable {var} is not set (or is not valid UTF-8); set it to the API key, or leave api_key_env unset for a server without authentication"
    )]
    MissingKey { var: String },
    #[error("invalid base URL {url:?}: {detail}")]
    BadUrl { url: String, detail: String },
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("could not start the HTTP runtime: {0}")]
    Runtime(String),
    #[error("could not build the HTTP client: {0}")]
    Client(String),
    /// The endpoints of one pool do not all say they serve the same
    /// weights.
    #[error("the endpoints of one pool serve different models: {0}")]
    MixedPool(String),
}

impl From<HttpError> for BackendError {
    fn from(e: HttpError) -> BackendError {
        BackendError::Setup(e.to_string())
    }
}
