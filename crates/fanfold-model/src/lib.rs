//! Model backends behind one trait.
//!
//! A backend is handed a [`Job`]: one stage's shared prefix plus a queue of
//! per-unit suffixes. It pulls requests with [`Job::next`] whenever it has a
//! free slot and hands each result back with [`Job::complete`]. The engine
//! owns the queue, so it alone enforces slots, budgets, retries and
//! cancellation, and it measures concurrency itself instead of trusting the
//! backend. This shape fits an in-process model with KV-shared slots
//! (continuous batching: pull the moment a slot frees), HTTP endpoints
//! (one pull per connection) and provider batch APIs (pull all, submit,
//! poll) alike.

//!
//! The simulated backends (scripted, replay) live in `fanfold-sim`, so a
//! real backend's crate compiles no jq engine.

pub use fanfold_core::BatchState;
use serde::{Deserialize, Serialize};

/// One unit's turn. It is carried whole wherever it goes (a fleet's
/// store holds it as this type's JSON), so a field added here reaches
/// every backend that answers it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Request {
    /// The engine's handle for this unit; opaque to backends. A carrier
    /// may give it its own meaning (a fleet worker's task number).
    #[serde(default)]
    pub index: usize,
    pub unit_id: String,
    /// The per-unit part of the prompt; it follows the job's prefix.
    pub suffix: String,
    /// The projected fields the suffix was built from. Real backends ignore
    /// it; the scripted backend computes its answer from it.
    pub input: serde_json::Value,
    /// 1 for the first try.
    pub attempt: u32,
    pub max_output_tokens: u32,
    /// The job's output schema narrowed to this unit (its quotable
    /// sentences), for backends that constrain decoding per request.
    pub schema: Option<serde_json::Value>,
}

/// What a job has for a backend that asks without blocking.
#[derive(Debug)]
pub enum Next {
    Request(Request),
    /// Nothing can be opened now (every queued unit is held by another run
    /// sharing the store, or every slot is taken): ask again after at most
    /// this long, or sooner once a request of this job completes.
    Later(std::time::Duration),
    /// No more work.
    Done,
}

/// Token counts and time as the backend measured them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens the backend evaluated for this request.
    pub prompt_tokens: u64,
    /// Prompt tokens served from a shared or cached prefix.
    pub cached_tokens: u64,
    pub completion_tokens: u64,
    pub latency_ms: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Completion {
    pub text: String,
    pub usage: Usage,
    /// The probability of each allowed decision, read from the model's
    /// logits where the decision was generated. Backends that cannot see
    /// logits leave it empty.
    #[serde(default)]
    pub choices: Option<Vec<(String, f64)>>,
    /// Tokens of the unit's prompt the backend cut to fit its window; 0
    /// when it saw the unit whole.
    #[serde(default)]
    pub truncated_tokens: u64,
}

/// The output field that carries a stage's decision and its allowed values.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecisionField {
    /// The object key, e.g. `decision`.
    pub key: String,
    pub choices: Vec<String>,
}

impl From<&fanfold_core::spec::DecisionSpec> for DecisionField {
    /// The spec's decision: its pointer's last key and every declared value,
    /// positives first.
    fn from(d: &fanfold_core::spec::DecisionSpec) -> DecisionField {
        DecisionField {
            key: d.pointer.rsplit('/').next().unwrap_or_default().to_owned(),
            choices: d
                .positive
                .iter()
                .chain(&d.negative)
                .chain(&d.abstain)
                .cloned()
                .collect(),
        }
    }
}

/// A failed call. Each is retried within the stage's budget and then
/// recorded as `error` with its cause; none is ever a negative.
/// Serializable, so a call made in another process comes back as it was.
#[derive(Clone, Debug, PartialEq, thiserror::Error, Serialize, Deserialize)]
pub enum CallError {
    #[error("timed out after {ms} ms")]
    Timeout { ms: u64 },
    #[error("backend error: {0}")]
    Backend(String),
    #[error("no recorded answer for this request (cassette miss)")]
    Missing,
    /// The provider kept answering 429 until the retries ran out, or asked
    /// for a longer wait than the backend allows.
    #[error("rate limited (HTTP 429) after {attempts} attempts{}", wait_note(*retry_after_ms))]
    RateLimited {
        attempts: u32,
        retry_after_ms: Option<u64>,
    },
    /// The provider answered with an error status; the excerpt is the start
    /// of its body, with any credential removed.
    #[error("HTTP {status}: {body_excerpt}")]
    Http { status: u16, body_excerpt: String },
    /// No response arrived: refused, reset or closed before the headers.
    #[error("connection failed: {0}")]
    Connection(String),
    /// The response started but its body ended early.
    #[error("response body truncated: {0}")]
    Truncated(String),
    /// The response arrived whole but is not what the protocol promises.
    #[error("invalid response: {0}")]
    InvalidResponse(String),
    /// Every endpoint's circuit breaker was open and stayed open.
    #[error("circuit open on every endpoint: {0}")]
    CircuitOpen(String),
    /// The job was cancelled before the request was sent.
    #[error("cancelled before sending")]
    Cancelled,
    /// The request sits in a provider batch that had not ended when the
    /// backend stopped waiting. The batch is recorded in the job's ledger,
    /// so a later run collects its answer instead of sending it again.
    #[error("batch {batch_id} still pending at the provider ({state})")]
    BatchPending { batch_id: String, state: String },
}

fn wait_note(retry_after_ms: Option<u64>) -> String {
    retry_after_ms
        .map(|ms| format!("; the provider asked to wait {ms} ms"))
        .unwrap_or_default()
}

impl CallError {
    pub fn code(&self) -> &'static str {
        match self {
            CallError::Timeout { .. } => "timeout",
            CallError::Backend(_) => "backend_error",
            CallError::Missing => "cassette_miss",
            CallError::RateLimited { .. } => "rate_limited",
            CallError::Http { .. } => "http_status",
            CallError::Connection(_) => "connection",
            CallError::Truncated(_) => "truncated",
            CallError::InvalidResponse(_) => "invalid_response",
            CallError::CircuitOpen(_) => "circuit_open",
            CallError::Cancelled => "cancelled",
            CallError::BatchPending { .. } => "batch_pending",
        }
    }
}

/// What a backend is, for fact records and reports.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BackendInfo {
    pub kind: String,
    /// A stable identity of the model: a weights hash, a provider model
    /// name, a script hash. Part of every cache key.
    pub model_id: String,
    /// True when answers come from a script or a cassette, not a model;
    /// every output such a backend touches is labelled [SIMULATED].
    pub simulated: bool,
}

/// What a job asks of a backend besides its prefix and its requests: one
/// value, so whatever carries a job elsewhere (a fleet's store, a wrapper
/// that records it) carries all of it; a stored row is read strictly (a
/// field unknown here refuses it).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobOptions {
    /// The JSON Schema every output must satisfy; backends that can
    /// constrain decoding to it do.
    pub schema: Option<serde_json::Value>,
    /// Where the decision is, for backends that score choices.
    pub decision: Option<DecisionField>,
    /// True when the output is the decision alone: a backend that scores
    /// choices may answer from one forward pass at the decision's position,
    /// writing `{"<key>": "<value>"}` itself with the scores as `choices`.
    /// Others generate as usual, under the output schema.
    pub choice_only: bool,
}

/// The options of a job that asks for free text.
pub static FREE_TEXT: JobOptions = JobOptions {
    schema: None,
    decision: None,
    choice_only: false,
};

/// The engine's side of a stage run.
pub trait Job: Sync {
    /// The immutable prefix shared by every request of this job.
    fn prefix(&self) -> &str;
    /// Most requests the backend may hold at once.
    fn slots(&self) -> usize;
    /// The next request, or `None` when there is no more work (queue empty,
    /// budget spent, or the contract cancelled the rest). It may block until
    /// a unit can be opened: only a backend with nothing of this job in
    /// flight on the calling thread may call it.
    fn next(&self) -> Option<Request>;
    /// The next request without blocking. A backend whose requests in
    /// flight are completed by the thread that asks for more (an HTTP
    /// worker loop, a decode loop) must ask this way: a blocked `next`
    /// would starve the very completions that free what it waits for.
    /// The default suits a job that only ever waits on its own
    /// completions from other threads: it asks `next`.
    fn poll_next(&self) -> Next {
        match self.next() {
            Some(r) => Next::Request(r),
            None => Next::Done,
        }
    }
    /// Hands back one result. May queue a retry that a later `next` returns.
    fn complete(&self, request: Request, result: Result<Completion, CallError>);
    /// True once queued and in-flight work should be abandoned.
    fn is_cancelled(&self) -> bool;
    /// Everything the job asks of the backend besides its prefix and its
    /// requests. The three readers below read it; a job implements this
    /// one, never them.
    fn options(&self) -> &JobOptions {
        &FREE_TEXT
    }
    /// [`JobOptions::schema`].
    fn output_schema(&self) -> Option<&serde_json::Value> {
        self.options().schema.as_ref()
    }
    /// [`JobOptions::decision`].
    fn decision(&self) -> Option<&DecisionField> {
        self.options().decision.as_ref()
    }
    /// [`JobOptions::choice_only`].
    fn choice_only(&self) -> bool {
        self.options().choice_only
    }
    /// Durable bookkeeping for provider batches; `None` when the engine
    /// keeps no store, and then a batch cannot outlive the process.
    fn batch_ledger(&self) -> Option<&dyn BatchLedger> {
        None
    }
}

/// Where a request already sits in a provider batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchSlot {
    pub batch_id: String,
    /// The request's id inside the batch.
    pub custom_id: String,
}

/// A batch as submitted: the provider's id and, for each request, its
/// content key and its id inside the batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubmittedBatch {
    pub batch_id: String,
    /// `openai` or `anthropic`.
    pub provider: String,
    /// The API root the batch lives at (never a credential).
    pub endpoint: String,
    pub requests: Vec<(String, String)>,
}

/// Durable records of provider batches, so a run killed while a batch is
/// pending collects that batch when it is run again instead of paying for
/// the requests twice. Requests are found by a content key: the provider,
/// the endpoint, the attempt and the exact request body.
pub trait BatchLedger: Sync {
    /// The open batch holding the request with this key, if any.
    fn find(&self, request_key: &str) -> Result<Option<BatchSlot>, LedgerError>;
    /// Records a batch the provider accepted, with all its requests.
    fn submitted(&self, batch: &SubmittedBatch) -> Result<(), LedgerError>;
    /// Marks a batch whose results were all handed back (`Consumed`) or
    /// that can never yield any (`Failed`); its requests are no longer
    /// found.
    fn close(&self, batch_id: &str, state: BatchState) -> Result<(), LedgerError>;
}

/// A ledger's failure, with its source kept: the ledger is the engine's
/// store, which this crate does not know.
pub type LedgerError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Per-minute request and token limits held outside the process, so that
/// processes sending to one endpoint (a fleet's workers) share them
/// instead of each spending the whole limit.
pub trait SharedRates: Send + Sync {
    /// Takes one request and `tokens` from the limits of `endpoint`
    /// (`rpm`, `tpm`; absent ones are not limits), or says how long to
    /// wait before asking again.
    fn take(
        &self,
        endpoint: &str,
        rpm: Option<u64>,
        tpm: Option<u64>,
        tokens: u64,
    ) -> Result<Option<std::time::Duration>, LedgerError>;
    /// Gives back what a request reserved and did not use (`reserved`
    /// less `used` tokens; a negative difference takes more).
    fn settle(&self, endpoint: &str, tpm: Option<u64>, reserved: u64, used: u64);
}

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("backend setup: {0}")]
    Setup(String),
    #[error("cassette {path}: {detail}")]
    Cassette { path: String, detail: String },
    /// The store the backend's calls go through (a fleet's work queue)
    /// failed: neither the model nor its configuration is at fault. The
    /// source is the store's own error.
    #[error("the store failed: {0}")]
    Store(Box<dyn std::error::Error + Send + Sync + 'static>),
}

pub trait ModelBackend: Send + Sync {
    fn info(&self) -> BackendInfo;
    /// Drains `job`, using at most `job.slots()` requests at once. Per-unit
    /// failures go to `complete`; an `Err` means the backend itself could
    /// not run.
    fn run(&self, job: &dyn Job) -> Result<(), BackendError>;
    /// What `usage` cost in US dollars, where the backend knows its price.
    fn cost_usd(&self, _usage: &Usage) -> Option<f64> {
        None
    }
    /// The model's surprise at each token of each text, read in one
    /// forward pass a text (prompt compression needs it), or `None` for a
    /// backend that cannot score tokens (an HTTP API).
    fn token_surprise(&self, _texts: &[String]) -> Result<Option<Surprises>, BackendError> {
        Ok(None)
    }
}

/// One token of a text the model read: its bytes in the text and its
/// surprise, the negative log-probability in nats the model gave it after
/// the text before it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TokenSurprise {
    pub start: usize,
    pub end: usize,
    pub nats: f64,
}

/// What [`ModelBackend::token_surprise`] read: each text's tokens, and
/// the tokens evaluated and the time taken, for the run's accounting.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Surprises {
    pub texts: Vec<Vec<TokenSurprise>>,
    pub usage: Usage,
}

/// A rough token count for backends that have no tokenizer: about four
/// bytes a token. Only simulated backends use it.
pub fn approx_tokens(text: &str) -> u64 {
    (text.len() as u64).div_ceil(4)
}

impl<B: ModelBackend + ?Sized> ModelBackend for Box<B> {
    fn info(&self) -> BackendInfo {
        (**self).info()
    }
    fn run(&self, job: &dyn Job) -> Result<(), BackendError> {
        (**self).run(job)
    }
    fn cost_usd(&self, usage: &Usage) -> Option<f64> {
        (**self).cost_usd(usage)
    }
    fn token_surprise(&self, texts: &[String]) -> Result<Option<Surprises>, BackendError> {
        (**self).token_surprise(texts)
    }
}
