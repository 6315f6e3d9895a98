//! The transport both backends share: endpoint pool, admission, retries,
//! circuit breakers, warm-up, and the worker loop that drains a job.
//!
//! `ModelBackend::run` is synchronous and a `Job` borrows the engine's
//! state, so nothing here is spawned: `run` blocks on one future that joins
//! one worker future per slot. The workers borrow the job; their
//! concurrency is I/O concurrency on one task, which is all an HTTP client
//! needs. The runtime's worker threads drive the sockets and timers.

use std::future::Future;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fanfold_model::{
    BackendError, CallError, Completion, Job, Next, Request, Usage, approx_tokens,
};
use reqwest::header::HeaderMap;
use serde::Serialize;
use tokio::sync::{Semaphore, SemaphorePermit};

use crate::HttpError;
use crate::breaker::{Breaker, Gate};
use crate::config::TransportConfig;
use crate::limits::{Budget, MAX_WAIT, RateInfo};
use crate::secret::ApiKey;

/// How long a waiting request sleeps between looks at a half-open
/// breaker's probe or at cancellation.
const POLL: Duration = Duration::from_millis(20);
/// Most of an error status's body read for its excerpt.
const ERROR_BODY_BYTES: u64 = 64 << 10;
/// Longest excerpt of a provider's error body kept in an error.
const EXCERPT_CHARS: usize = 300;
/// Most connections one endpoint may be given.
const MAX_CONCURRENCY: usize = 4096;

/// A parsed answer, before latency is known.
#[derive(Debug)]
pub(crate) struct Reply {
    pub text: String,
    pub usage: Usage,
    /// Every token the provider counts against its per-minute limit, when
    /// it reported usage.
    pub billed_tokens: Option<u64>,
    /// The answer's tokens with their likeliest alternatives, when the
    /// provider was asked for them.
    pub tokens: Vec<crate::logprobs::TokenChoices>,
}

/// Why one attempt failed.
#[derive(Clone, Debug)]
pub(crate) enum Fault {
    Status {
        status: u16,
        excerpt: String,
        retry_after: Option<Duration>,
    },
    Timeout,
    /// No connection was made: refused, or the host did not resolve.
    Unreachable(String),
    /// Connected, then reset or closed before the response headers.
    Connection(String),
    Truncated(String),
    Invalid(String),
}

impl Fault {
    /// Transport faults that a later attempt may not repeat. Client errors
    /// would, and so would a whole body that does not parse: both go back
    /// to the engine at once.
    pub(crate) fn retryable(&self) -> bool {
        match self {
            Fault::Status { status, .. } => *status == 408 || *status == 429 || *status >= 500,
            Fault::Timeout | Fault::Unreachable(_) | Fault::Connection(_) | Fault::Truncated(_) => {
                true
            }
            Fault::Invalid(_) => false,
        }
    }

    /// Faults that say the endpoint is unhealthy, for its breaker.
    fn is_endpoint_failure(&self) -> bool {
        match self {
            Fault::Status { status, .. } => *status >= 500,
            Fault::Timeout
            | Fault::Unreachable(_)
            | Fault::Connection(_)
            | Fault::Truncated(_)
            | Fault::Invalid(_) => true,
        }
    }

    /// Statuses that will not change for this endpoint during a run: bad
    /// key, no permission, wrong URL or model. The endpoint is set aside.
    fn disables_endpoint(&self) -> bool {
        matches!(
            self,
            Fault::Status {
                status: 401 | 403 | 404,
                ..
            }
        )
    }

    pub(crate) fn scrubbed(self, key: Option<&ApiKey>) -> Fault {
        let Some(key) = key else { return self };
        match self {
            Fault::Status {
                status,
                excerpt,
                retry_after,
            } => Fault::Status {
                status,
                excerpt: key.scrub(&excerpt),
                retry_after,
            },
            Fault::Timeout => Fault::Timeout,
            Fault::Unreachable(m) => Fault::Unreachable(key.scrub(&m)),
            Fault::Connection(m) => Fault::Connection(key.scrub(&m)),
            Fault::Truncated(m) => Fault::Truncated(key.scrub(&m)),
            Fault::Invalid(m) => Fault::Invalid(key.scrub(&m)),
        }
    }
}

/// One provider protocol: how a request is written and an answer read.
pub(crate) trait Protocol: Sync {
    /// Appended to an endpoint's base URL.
    fn path(&self) -> &'static str;
    /// Headers sent with every request, credentials included (marked
    /// sensitive).
    fn headers(&self, key: Option<&ApiKey>) -> Result<HeaderMap, HttpError>;
    /// The JSON body. Built once per request and resent as is on retries.
    fn body(&self, job: &dyn Job, request: &Request) -> serde_json::Value;
    /// Reads a successful response of at most `limit` bytes.
    fn read(
        &self,
        response: reqwest::Response,
        limit: u64,
    ) -> impl Future<Output = Result<Reply, Fault>>;
}

/// The fault of a body over the bound.
pub(crate) fn too_large(limit: u64) -> Fault {
    Fault::Invalid(format!(
        "the response body is larger than max_response_bytes = {limit}"
    ))
}

/// Reads a whole body of at most `limit` bytes, classifying a cut-off as
/// truncation; a larger body is refused as soon as it shows, without
/// reading the rest.
pub(crate) async fn read_body(
    mut response: reqwest::Response,
    limit: u64,
) -> Result<Vec<u8>, Fault> {
    if response.content_length().is_some_and(|n| n > limit) {
        return Err(too_large(limit));
    }
    let mut out = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| classify(&e))? {
        if (out.len() + chunk.len()) as u64 > limit {
            return Err(too_large(limit));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// Parses a JSON envelope. A body that stops mid-value was truncated
/// (retryable); anything else that does not parse is invalid.
pub(crate) fn parse_json(bytes: &[u8]) -> Result<serde_json::Value, Fault> {
    serde_json::from_slice(bytes).map_err(|e| {
        if e.is_eof() {
            Fault::Truncated(format!("body ends mid-JSON after {} bytes", bytes.len()))
        } else {
            Fault::Invalid(format!(
                "body is not JSON ({e}); it starts {:?}",
                excerpt(&String::from_utf8_lossy(bytes))
            ))
        }
    })
}

pub(crate) fn excerpt(text: &str) -> String {
    let t = text.trim();
    match t.char_indices().nth(EXCERPT_CHARS) {
        Some((i, _)) => format!("{}...", &t[..i]),
        None => t.to_owned(),
    }
}

/// Classifies a client error by what the caller can do about it.
pub(crate) fn classify(e: &reqwest::Error) -> Fault {
    // reqwest's own message names the URL; the causes below it say what
    // happened.
    let mut parts = Vec::new();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        let m = s.to_string();
        if parts.last() != Some(&m) {
            parts.push(m);
        }
        source = s.source();
    }
    let msg = if parts.is_empty() {
        e.to_string()
    } else {
        parts.join(": ")
    };
    if e.is_timeout() {
        Fault::Timeout
    } else if e.is_body() || e.is_decode() {
        Fault::Truncated(msg)
    } else if e.is_connect() {
        Fault::Unreachable(msg)
    } else {
        Fault::Connection(msg)
    }
}

struct EndpointState {
    budget: Budget,
    breaker: Breaker,
    /// Set when the endpoint answered 401, 403 or 404, or could not be
    /// reached before it ever answered; cleared each run.
    disabled: Option<CallError>,
    /// It has answered at least once since the backend was built: a
    /// connection that fails after that is a sick endpoint (breaker and
    /// retries), before it a dead one (set aside at once).
    answered: bool,
    /// The error its last failed attempt ended in.
    last_failure: Option<CallError>,
}

struct Endpoint {
    /// `host[:port]` of the base URL; never the path or credentials.
    host: String,
    /// The API root as configured, without a trailing slash.
    base: String,
    url: reqwest::Url,
    headers: HeaderMap,
    key: Option<ApiKey>,
    weight: u32,
    max_concurrency: usize,
    permits: Semaphore,
    state: Mutex<EndpointState>,
    requests: AtomicU64,
    failures: AtomicU64,
    /// The per-minute limits, for the shared ledger.
    rpm: Option<u64>,
    tpm: Option<u64>,
}

impl Endpoint {
    fn lock(&self) -> std::sync::MutexGuard<'_, EndpointState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Counters over the backend's lifetime.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct HttpStats {
    /// HTTP attempts sent, retries included.
    pub requests: u64,
    /// Attempts after a request's first.
    pub retries: u64,
    /// 429 answers received.
    pub rate_limited: u64,
    pub succeeded: u64,
    pub failed: u64,
    /// Sums of the usage providers reported for successful requests.
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub completion_tokens: u64,
    /// The usage the provider reported for the last job's warm-up request,
    /// when it succeeded. Its `cached_tokens` is what the provider says it
    /// served from cache; nothing is assumed.
    pub warm_up: Option<Usage>,
    pub endpoints: Vec<EndpointStats>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct EndpointStats {
    pub host: String,
    pub requests: u64,
    pub failures: u64,
    /// Times its circuit breaker opened.
    pub breaker_opened: u64,
}

#[derive(Default)]
struct Counters {
    requests: AtomicU64,
    retries: AtomicU64,
    rate_limited: AtomicU64,
    succeeded: AtomicU64,
    failed: AtomicU64,
    prompt_tokens: AtomicU64,
    cached_tokens: AtomicU64,
    completion_tokens: AtomicU64,
    warm_up: Mutex<Option<Usage>>,
}

fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// The HTTP side of batch calls: the primary endpoint, its credentials,
/// and bounded retries of transport faults.
pub(crate) struct BatchHttp<'a> {
    pub client: &'a reqwest::Client,
    /// The API root, without a trailing slash.
    pub base: &'a str,
    pub headers: &'a HeaderMap,
    pub key: Option<&'a ApiKey>,
    pub max_retries: u32,
    pub backoff_base: Duration,
    pub timeout: Duration,
}

pub(crate) struct Transport<P> {
    pub(crate) protocol: P,
    cfg: TransportConfig,
    endpoints: Vec<Endpoint>,
    client: reqwest::Client,
    /// Taken only by `drop`.
    runtime: Option<tokio::runtime::Runtime>,
    counters: Counters,
    /// Limits shared with other processes, taken after this process's own.
    shared: Option<std::sync::Arc<dyn fanfold_model::SharedRates>>,
}

impl<P> Drop for Transport<P> {
    /// A backend can be dropped on another runtime's thread (a server
    /// that held it, a task that owned it), where blocking to join this
    /// runtime's threads would panic: there it is shut down in the
    /// background instead.
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take()
            && tokio::runtime::Handle::try_current().is_ok()
        {
            runtime.shutdown_background();
        }
    }
}

enum Acquired<'a> {
    Got(Lease<'a>),
    /// Every usable endpoint's breaker is open until then.
    OpenUntil(Instant),
    /// No endpoint is usable this run.
    Disabled(CallError),
    Cancelled,
}

/// The right to send one attempt to one endpoint: a concurrency permit,
/// and for a half-open breaker the probe's turn. Dropping it unreported
/// gives the probe's turn back.
struct Lease<'a> {
    endpoint: &'a Endpoint,
    probe: bool,
    reported: bool,
    _permit: SemaphorePermit<'a>,
}

impl Lease<'_> {
    fn success(&mut self) {
        self.reported = true;
        let mut st = self.endpoint.lock();
        st.breaker.success();
        st.answered = true;
    }

    fn failure(&mut self) {
        self.reported = true;
        bump(&self.endpoint.failures, 1);
        if self.endpoint.lock().breaker.failure(Instant::now()) {
            tracing::warn!(endpoint = %self.endpoint.host, "circuit breaker opened");
        }
    }

    fn neutral(&mut self) {
        self.reported = true;
        self.endpoint.lock().breaker.neutral(self.probe);
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        if !self.reported {
            self.endpoint.lock().breaker.neutral(self.probe);
        }
    }
}

/// Longest a worker sleeps before asking a job that had nothing to open
/// again: another worker's completion may free a slot or a unit sooner.
pub(crate) const NEXT_POLL: Duration = Duration::from_millis(50);

/// The job's next request, waiting without blocking the thread: the
/// workers share it, and a unit another run holds must not keep this run's
/// answers in flight from being completed (two runs would each wait on
/// the other's leases forever).
async fn next_request(job: &dyn Job) -> Option<Request> {
    loop {
        match job.poll_next() {
            Next::Request(r) => return Some(r),
            Next::Done => return None,
            Next::Later(d) => {
                tokio::time::sleep(d.clamp(Duration::from_millis(1), NEXT_POLL)).await
            }
        }
    }
}

/// Ends once the job is cancelled.
async fn cancelled(job: &dyn Job) {
    while !job.is_cancelled() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Sleeps for `d` unless the job is cancelled first; false when it was.
async fn pause(d: Duration, job: &dyn Job) -> bool {
    let end = crate::limits::later(Instant::now(), d);
    loop {
        if job.is_cancelled() {
            return false;
        }
        let now = Instant::now();
        if now >= end {
            return true;
        }
        tokio::time::sleep((end - now).min(Duration::from_millis(100))).await;
    }
}

impl<P: Protocol> Transport<P> {
    pub(crate) fn new(protocol: P, cfg: TransportConfig) -> Result<Transport<P>, HttpError> {
        if cfg.endpoints.is_empty() {
            return Err(HttpError::Config("no endpoints configured".into()));
        }
        let day = MAX_WAIT.as_millis() as u64;
        for (name, ms, min) in [
            ("request_timeout_ms", cfg.request_timeout_ms, 1),
            ("call_timeout_ms", cfg.call_timeout_ms, 1),
            ("connect_timeout_ms", cfg.connect_timeout_ms, 1),
            ("retry.backoff_base_ms", cfg.retry.backoff_base_ms, 0),
            ("retry.backoff_max_ms", cfg.retry.backoff_max_ms, 0),
            ("retry.max_retry_after_ms", cfg.retry.max_retry_after_ms, 0),
            ("breaker.cooldown_ms", cfg.breaker.cooldown_ms, 0),
        ] {
            if !(min..=day).contains(&ms) {
                return Err(HttpError::Config(format!(
                    "{name} = {ms} is outside {min}..={day}"
                )));
            }
        }
        if cfg.max_response_bytes == 0 {
            return Err(HttpError::Config(
                "max_response_bytes = 0 would refuse every answer".into(),
            ));
        }
        let now = Instant::now();
        let mut endpoints = Vec::with_capacity(cfg.endpoints.len());
        for e in &cfg.endpoints {
            let bad = |detail: &str| HttpError::BadUrl {
                url: e.base_url.clone(),
                detail: detail.to_owned(),
            };
            if e.weight == 0 {
                return Err(HttpError::Config(format!(
                    "endpoint {}: weight must be at least 1",
                    e.base_url
                )));
            }
            if !(1..=MAX_CONCURRENCY).contains(&e.max_concurrency) {
                return Err(HttpError::Config(format!(
                    "endpoint {}: max_concurrency must be in 1..={MAX_CONCURRENCY}",
                    e.base_url
                )));
            }
            if e.requests_per_minute == Some(0) || e.tokens_per_minute == Some(0) {
                return Err(HttpError::Config(format!(
                    "endpoint {}: a per-minute budget of 0 would send nothing; leave it unset for no budget",
                    e.base_url
                )));
            }
            let full = format!("{}{}", e.base_url.trim_end_matches('/'), protocol.path());
            let url = reqwest::Url::parse(&full).map_err(|err| bad(&err.to_string()))?;
            if !matches!(url.scheme(), "http" | "https") {
                return Err(bad("the scheme must be http or https"));
            }
            if !url.username().is_empty() || url.password().is_some() {
                return Err(bad(
                    "credentials in the URL would be printed; use api_key_env",
                ));
            }
            let host = match (url.host_str(), url.port()) {
                (Some(h), Some(p)) => format!("{h}:{p}"),
                (Some(h), None) => h.to_owned(),
                (None, _) => return Err(bad("no host")),
            };
            let key = e.api_key_env.as_deref().map(ApiKey::from_env).transpose()?;
            let headers = protocol.headers(key.as_ref())?;
            endpoints.push(Endpoint {
                host,
                base: e.base_url.trim_end_matches('/').to_owned(),
                url,
                headers,
                key,
                weight: e.weight,
                max_concurrency: e.max_concurrency,
                permits: Semaphore::new(e.max_concurrency),
                state: Mutex::new(EndpointState {
                    budget: Budget::new(
                        e.requests_per_minute,
                        e.tokens_per_minute,
                        Duration::from_millis(cfg.retry.max_retry_after_ms),
                        now,
                    ),
                    breaker: Breaker::new(
                        cfg.breaker.failure_threshold,
                        Duration::from_millis(cfg.breaker.cooldown_ms),
                    ),
                    disabled: None,
                    answered: false,
                    last_failure: None,
                }),
                requests: AtomicU64::new(0),
                failures: AtomicU64::new(0),
                rpm: e.requests_per_minute,
                tpm: e.tokens_per_minute,
            });
        }
        let total: usize = endpoints.iter().map(|e| e.max_concurrency).sum();
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_millis(cfg.connect_timeout_ms.max(1)))
            .pool_max_idle_per_host(total)
            .user_agent(concat!("fanfold-http/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| HttpError::Client(e.to_string()))?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("fanfold-http")
            .enable_all()
            .build()
            .map_err(|e| HttpError::Runtime(e.to_string()))?;
        Ok(Transport {
            protocol,
            cfg,
            endpoints,
            client,
            runtime: Some(runtime),
            counters: Counters::default(),
            shared: None,
        })
    }

    /// Takes the endpoints' per-minute limits from `ledger` too, shared
    /// with the other processes that use it.
    pub(crate) fn share_rates(&mut self, ledger: std::sync::Arc<dyn fanfold_model::SharedRates>) {
        self.shared = Some(ledger);
    }

    /// Runs batch work on the backend's runtime.
    pub(crate) fn block_on<F: Future>(&self, f: F) -> F::Output {
        self.runtime().block_on(f)
    }

    fn runtime(&self) -> &tokio::runtime::Runtime {
        match &self.runtime {
            Some(runtime) => runtime,
            None => unreachable!("the runtime is taken only in drop"),
        }
    }

    /// The primary endpoint's HTTP side, for batch calls: a batch lives at
    /// one provider account, so pools do not apply. `new` refuses an empty
    /// pool, so there is always a first endpoint.
    pub(crate) fn batch_http(&self) -> Option<BatchHttp<'_>> {
        self.endpoint_http(0)
    }

    /// Every endpoint's HTTP side, in the pool's order: each is asked what
    /// it serves.
    pub(crate) fn endpoints_http(&self) -> Vec<BatchHttp<'_>> {
        (0..self.endpoints.len())
            .filter_map(|i| self.endpoint_http(i))
            .collect()
    }

    fn endpoint_http(&self, index: usize) -> Option<BatchHttp<'_>> {
        let e = self.endpoints.get(index)?;
        Some(BatchHttp {
            client: &self.client,
            base: &e.base,
            headers: &e.headers,
            key: e.key.as_ref(),
            max_retries: self.cfg.retry.max_retries,
            backoff_base: Duration::from_millis(self.cfg.retry.backoff_base_ms),
            timeout: Duration::from_millis(self.cfg.request_timeout_ms),
        })
    }

    /// Transport retries per call.
    pub(crate) fn retry_limit(&self) -> u32 {
        self.cfg.retry.max_retries
    }

    /// The error a unit records for a fault of a batch call.
    pub(crate) fn fault_error(&self, fault: &Fault) -> CallError {
        self.to_error(fault, 1, 0, None)
    }

    pub(crate) fn count_request(&self) {
        bump(&self.counters.requests, 1);
    }

    pub(crate) fn count_failed(&self) {
        bump(&self.counters.failed, 1);
    }

    pub(crate) fn count_answer(&self, reply: &Reply) {
        let c = &self.counters;
        bump(&c.succeeded, 1);
        bump(&c.prompt_tokens, reply.usage.prompt_tokens);
        bump(&c.cached_tokens, reply.usage.cached_tokens);
        bump(&c.completion_tokens, reply.usage.completion_tokens);
    }

    /// What the pool's most recent failed attempt ended in, for a request
    /// that never got to send one.
    fn last_failure(&self) -> Option<CallError> {
        self.endpoints
            .iter()
            .find_map(|e| e.lock().last_failure.clone())
    }

    /// Whether any endpoint of the pool has answered since the backend was
    /// built.
    fn ever_answered(&self) -> bool {
        self.endpoints.iter().any(|e| e.lock().answered)
    }

    /// The first endpoint's `host[:port]`, for the model id.
    pub(crate) fn primary_host(&self) -> &str {
        self.endpoints.first().map_or("", |e| e.host.as_str())
    }

    pub(crate) fn stats(&self) -> HttpStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        HttpStats {
            requests: get(&c.requests),
            retries: get(&c.retries),
            rate_limited: get(&c.rate_limited),
            succeeded: get(&c.succeeded),
            failed: get(&c.failed),
            prompt_tokens: get(&c.prompt_tokens),
            cached_tokens: get(&c.cached_tokens),
            completion_tokens: get(&c.completion_tokens),
            warm_up: *c.warm_up.lock().unwrap_or_else(|e| e.into_inner()),
            endpoints: self
                .endpoints
                .iter()
                .map(|e| EndpointStats {
                    host: e.host.clone(),
                    requests: get(&e.requests),
                    failures: get(&e.failures),
                    breaker_opened: e.lock().breaker.opened,
                })
                .collect(),
        }
    }

    /// Drains the job: the first request alone (warm-up), then up to
    /// `min(job.slots(), total endpoint concurrency)` workers.
    ///
    /// Each worker holds at most one request, and there are no more workers
    /// than slots; a worker with nothing to take sleeps on the runtime
    /// (`next_request`), never blocking the thread the other workers'
    /// requests complete on.
    pub(crate) fn run(&self, job: &dyn Job) -> Result<(), BackendError> {
        for e in &self.endpoints {
            // A key or URL fixed between runs gets another chance. Budgets
            // and breakers carry over: the provider's window does not
            // restart with a new job.
            e.lock().disabled = None;
        }
        let capacity: usize = self.endpoints.iter().map(|e| e.max_concurrency).sum();
        let workers = job.slots().max(1).min(capacity.max(1));
        self.runtime().block_on(async {
            if self.cfg.warm_up
                && let Some(request) = next_request(job).await
            {
                let result = if job.is_cancelled() {
                    Err(CallError::Cancelled)
                } else {
                    self.call(job, &request).await
                };
                let warm = result.as_ref().ok().map(|c| c.usage);
                if let Some(u) = warm {
                    tracing::info!(
                        prompt_tokens = u.prompt_tokens,
                        cached_tokens = u.cached_tokens,
                        "prefix warm-up answered"
                    );
                }
                *self
                    .counters
                    .warm_up
                    .lock()
                    .unwrap_or_else(|e| e.into_inner()) = warm;
                job.complete(request, result);
            }
            futures_util::future::join_all((0..workers).map(|_| self.worker(job))).await;
        });
        Ok(())
    }

    async fn worker(&self, job: &dyn Job) {
        // Drain until the job has nothing more, even once cancelled: the
        // engine hands out queued retries after a stop and expects each
        // back through `complete`.
        while let Some(request) = next_request(job).await {
            let result = if job.is_cancelled() {
                Err(CallError::Cancelled)
            } else {
                self.call(job, &request).await
            };
            job.complete(request, result);
        }
    }

    /// One request, with transport retries, to a result.
    async fn call(&self, job: &dyn Job, request: &Request) -> Result<Completion, CallError> {
        let result = self.call_inner(job, request).await;
        match &result {
            Ok(c) => {
                bump(&self.counters.succeeded, 1);
                bump(&self.counters.prompt_tokens, c.usage.prompt_tokens);
                bump(&self.counters.cached_tokens, c.usage.cached_tokens);
                bump(&self.counters.completion_tokens, c.usage.completion_tokens);
            }
            Err(e) => {
                bump(&self.counters.failed, 1);
                tracing::debug!(unit = %request.unit_id, code = e.code(), error = %e, "request failed");
            }
        }
        result
    }

    async fn call_inner(&self, job: &dyn Job, request: &Request) -> Result<Completion, CallError> {
        let body = serde_json::to_vec(&self.protocol.body(job, request))
            .map_err(|e| CallError::Backend(format!("could not encode the request body: {e}")))?;
        // The reservation: estimated prompt plus the most it may generate.
        let cost = approx_tokens(job.prefix())
            + approx_tokens(&request.suffix)
            + u64::from(request.max_output_tokens);
        let retry = &self.cfg.retry;
        let timeout = Duration::from_millis(self.cfg.request_timeout_ms);
        // Set at the first send: waiting for a slot is not the call's time.
        let mut deadline: Option<Instant> = None;
        let whole =
            Duration::from_millis(self.cfg.call_timeout_ms.max(self.cfg.request_timeout_ms));
        let mut attempts: u32 = 0;
        let mut rate_limited: u32 = 0;
        let mut last: Option<Fault> = None;
        let mut last_retry_after: Option<Duration> = None;
        let mut set_aside: Option<CallError> = None;
        while attempts <= retry.max_retries {
            if job.is_cancelled() {
                return Err(CallError::Cancelled);
            }
            let mut lease = match self.acquire(job).await {
                Acquired::Got(l) => l,
                Acquired::Cancelled => return Err(CallError::Cancelled),
                Acquired::Disabled(e) => return Err(e),
                Acquired::OpenUntil(t) => {
                    // A pool that never answered and opened its breakers is
                    // not coming up for this request: fail it now rather
                    // than wait out a cool-down (the stage's fail-fast rule
                    // then stops the stage).
                    if !self.ever_answered() {
                        if last.is_none()
                            && let Some(e) = self.last_failure()
                        {
                            return Err(e);
                        }
                        break;
                    }
                    // Waiting out a cool-down uses up an attempt, so a pool
                    // that stays down fails its requests in bounded time.
                    attempts += 1;
                    if attempts > retry.max_retries {
                        break;
                    }
                    if !pause(t.saturating_duration_since(Instant::now()), job).await {
                        return Err(CallError::Cancelled);
                    }
                    continue;
                }
            };
            let endpoint = lease.endpoint;
            loop {
                let wait = endpoint.lock().budget.admit(cost, Instant::now());
                match wait {
                    Ok(()) => break,
                    Err(d) => {
                        if !pause(d, job).await {
                            return Err(CallError::Cancelled);
                        }
                    }
                }
            }
            if !self.take_shared(endpoint, cost, job).await {
                return Err(CallError::Cancelled);
            }
            let now = Instant::now();
            let end = *deadline.get_or_insert_with(|| crate::limits::later(now, whole));
            if now >= end && last.is_some() {
                break;
            }
            let timeout = timeout
                .min(end.saturating_duration_since(now))
                .max(Duration::from_millis(1));
            attempts += 1;
            if attempts > 1 {
                bump(&self.counters.retries, 1);
            }
            bump(&self.counters.requests, 1);
            bump(&endpoint.requests, 1);
            let started = Instant::now();
            // The attempt races the job's cancellation: a hanging or
            // dripping server must not hold a run past its wall budget or a
            // stage that has given up.
            let attempt =
                std::pin::pin!(tokio::time::timeout(timeout, self.attempt(endpoint, &body)));
            let outcome =
                match futures_util::future::select(attempt, std::pin::pin!(cancelled(job))).await {
                    futures_util::future::Either::Left((Ok(o), _)) => o,
                    futures_util::future::Either::Left((Err(_), _)) => Err((Fault::Timeout, None)),
                    futures_util::future::Either::Right(((), _)) => {
                        // Sent, so perhaps billed: the reservation stands.
                        lease.neutral();
                        return Err(CallError::Cancelled);
                    }
                };
            // The attempt that answered, from send to parsed body; time
            // spent waiting for budget or after failed attempts is not the
            // model's and is left out.
            let latency_ms = started.elapsed().as_millis() as u64;
            let (fault, info) = match outcome {
                Ok((reply, info)) => {
                    lease.success();
                    let mut st = endpoint.lock();
                    st.budget.settle(cost, reply.billed_tokens.unwrap_or(cost));
                    self.settle_shared(endpoint, cost, reply.billed_tokens.unwrap_or(cost));
                    st.budget.observe(&info, Instant::now());
                    let choices = job.decision().and_then(|d| {
                        crate::logprobs::decision_probabilities(&reply.text, &reply.tokens, d)
                    });
                    return Ok(Completion {
                        text: reply.text,
                        usage: Usage {
                            latency_ms,
                            ..reply.usage
                        },
                        choices,
                        truncated_tokens: 0,
                    });
                }
                Err(f) => f,
            };
            if fault.is_endpoint_failure() {
                lease.failure();
                endpoint.lock().last_failure =
                    Some(self.to_error(&fault, attempts, rate_limited, last_retry_after));
            } else {
                lease.neutral();
            }
            drop(lease);
            {
                let mut st = endpoint.lock();
                let now = Instant::now();
                if let Some(info) = &info {
                    st.budget.observe(info, now);
                }
                if let Fault::Status {
                    retry_after: Some(d),
                    ..
                } = &fault
                {
                    // Everyone sending to this endpoint waits, not only
                    // this request.
                    st.budget.hold(*d, now);
                }
                if let Fault::Status { .. } = &fault {
                    // An error status was not billed.
                    st.budget.settle(cost, 0);
                    self.settle_shared(endpoint, cost, 0);
                }
            }
            tracing::debug!(
                endpoint = %endpoint.host,
                unit = %request.unit_id,
                attempt = attempts,
                fault = ?fault,
                "attempt failed"
            );
            let retry_after = match &fault {
                Fault::Status { retry_after, .. } => *retry_after,
                _ => None,
            };
            if let Fault::Status { status: 429, .. } = &fault {
                rate_limited += 1;
                bump(&self.counters.rate_limited, 1);
            }
            last_retry_after = retry_after.or(last_retry_after);
            if retry_after.is_some_and(|d| d > Duration::from_millis(retry.max_retry_after_ms)) {
                // Holding a slot that long would stall the run; the engine
                // records the cause and a later run retries.
                return Err(self.to_error(&fault, attempts, rate_limited, retry_after));
            }
            // Refused or unresolvable before it ever answered: an endpoint
            // that is not there, which retries and cool-downs would only
            // wait on.
            let unreachable = match &fault {
                Fault::Unreachable(m) if !endpoint.lock().answered => Some(m.clone()),
                _ => None,
            };
            if fault.disables_endpoint() || unreachable.is_some() {
                let err = match &unreachable {
                    Some(m) => {
                        CallError::Connection(format!("{} could not be reached: {m}", endpoint.url))
                    }
                    None => self.to_error(&fault, attempts, rate_limited, last_retry_after),
                };
                tracing::warn!(endpoint = %endpoint.host, error = %err, "endpoint set aside for this run");
                endpoint.lock().disabled = Some(err.clone());
                // Another endpoint of the pool may still serve; `acquire`
                // reports the cause once none is left.
                set_aside = Some(err);
                last = Some(fault);
                continue;
            }
            if !fault.retryable() {
                return Err(self.to_error(&fault, attempts, rate_limited, last_retry_after));
            }
            last = Some(fault);
            if attempts > retry.max_retries {
                break;
            }
            let delay = self.backoff(attempts).max(retry_after.unwrap_or_default());
            let left = deadline.map_or(delay, |end| end.saturating_duration_since(Instant::now()));
            let cause = last
                .as_ref()
                .map(|f| {
                    self.to_error(f, attempts, rate_limited, last_retry_after)
                        .to_string()
                })
                .unwrap_or_default();
            if left <= delay {
                // The call's whole time would pass before the next attempt.
                tracing::warn!(
                    endpoint = %endpoint.host, unit = %request.unit_id, attempt = attempts,
                    %cause, "call failed; its {} ms are spent, no retry", whole.as_millis()
                );
                break;
            }
            tracing::warn!(
                endpoint = %endpoint.host, unit = %request.unit_id, attempt = attempts,
                %cause, retry_in_ms = delay.as_millis() as u64, "call failed; retrying"
            );
            if !pause(delay, job).await {
                return Err(CallError::Cancelled);
            }
        }
        Err(match (set_aside, &last) {
            (Some(e), _) => e,
            (None, Some(f)) => self.to_error(f, attempts, rate_limited, last_retry_after),
            (None, None) => CallError::CircuitOpen(format!(
                "{} endpoint(s) stayed open through {attempts} attempts",
                self.endpoints.len()
            )),
        })
    }

    /// Full jitter: uniform in `[0, min(max, base * 2^(n-1))]`.
    fn backoff(&self, attempts_done: u32) -> Duration {
        let r = &self.cfg.retry;
        let exp = attempts_done.saturating_sub(1).min(30);
        let ceiling = r
            .backoff_base_ms
            .saturating_mul(1u64 << exp)
            .min(r.backoff_max_ms);
        Duration::from_millis(fastrand::u64(0..=ceiling))
    }

    fn to_error(
        &self,
        fault: &Fault,
        attempts: u32,
        rate_limited: u32,
        retry_after: Option<Duration>,
    ) -> CallError {
        match fault {
            Fault::Status { status: 429, .. } => CallError::RateLimited {
                attempts: attempts.max(rate_limited),
                retry_after_ms: retry_after.map(|d| d.as_millis() as u64),
            },
            Fault::Status {
                status, excerpt, ..
            } => CallError::Http {
                status: *status,
                body_excerpt: excerpt.clone(),
            },
            Fault::Timeout => CallError::Timeout {
                ms: self.cfg.request_timeout_ms,
            },
            Fault::Unreachable(m) | Fault::Connection(m) => CallError::Connection(m.clone()),
            Fault::Truncated(m) => CallError::Truncated(m.clone()),
            Fault::Invalid(m) => CallError::InvalidResponse(m.clone()),
        }
    }

    /// Waits for the limits shared with other processes, when there are
    /// any; false when the job was cancelled meanwhile. A ledger that
    /// cannot be read does not stop the call: this process's own limits
    /// still hold.
    async fn take_shared(&self, endpoint: &Endpoint, cost: u64, job: &dyn Job) -> bool {
        let Some(shared) = &self.shared else {
            return true;
        };
        if endpoint.rpm.is_none() && endpoint.tpm.is_none() {
            return true;
        }
        loop {
            let (ledger, key, rpm, tpm) = (
                std::sync::Arc::clone(shared),
                endpoint.base.clone(),
                endpoint.rpm,
                endpoint.tpm,
            );
            let taken =
                tokio::task::spawn_blocking(move || ledger.take(&key, rpm, tpm, cost)).await;
            match taken {
                Ok(Ok(None)) => return true,
                Ok(Ok(Some(wait))) => {
                    if !pause(wait.min(crate::limits::MAX_WAIT), job).await {
                        return false;
                    }
                }
                Ok(Err(e)) => {
                    tracing::warn!(endpoint = %endpoint.host, error = %e, "shared rate limits not read");
                    return true;
                }
                Err(e) => {
                    tracing::warn!(endpoint = %endpoint.host, error = %e, "shared rate limits not read");
                    return true;
                }
            }
        }
    }

    /// Corrects the shared token reservation with what was billed.
    fn settle_shared(&self, endpoint: &Endpoint, reserved: u64, used: u64) {
        if let Some(shared) = &self.shared
            && endpoint.tpm.is_some()
            && reserved != used
        {
            let (ledger, key, tpm) = (
                std::sync::Arc::clone(shared),
                endpoint.base.clone(),
                endpoint.tpm,
            );
            drop(tokio::task::spawn_blocking(move || {
                ledger.settle(&key, tpm, reserved, used)
            }));
        }
    }

    /// Picks an endpoint: weighted among those whose breaker admits
    /// traffic, preferring those with a free connection slot, then waits
    /// for a slot there.
    async fn acquire<'a>(&'a self, job: &dyn Job) -> Acquired<'a> {
        loop {
            if job.is_cancelled() {
                return Acquired::Cancelled;
            }
            let now = Instant::now();
            let mut open: Vec<&Endpoint> = Vec::new();
            let mut earliest: Option<Instant> = None;
            let mut probing = false;
            let mut disabled: Option<CallError> = None;
            for e in &self.endpoints {
                let st = e.lock();
                if let Some(err) = &st.disabled {
                    disabled.get_or_insert_with(|| err.clone());
                    continue;
                }
                match st.breaker.peek(now) {
                    Gate::Pass => open.push(e),
                    Gate::OpenUntil(t) => earliest = Some(earliest.map_or(t, |x| x.min(t))),
                    Gate::ProbeInFlight => probing = true,
                }
            }
            if open.is_empty() {
                if probing {
                    // A probe is testing an endpoint; its answer comes
                    // within one request timeout.
                    if !pause(POLL, job).await {
                        return Acquired::Cancelled;
                    }
                    continue;
                }
                if let Some(t) = earliest {
                    return Acquired::OpenUntil(t);
                }
                return Acquired::Disabled(disabled.unwrap_or_else(|| {
                    CallError::CircuitOpen("no endpoint is configured".into())
                }));
            }
            let free: Vec<&Endpoint> = open
                .iter()
                .copied()
                .filter(|e| e.permits.available_permits() > 0)
                .collect();
            let choices = if free.is_empty() { &open } else { &free };
            let Some(endpoint) = weighted(choices) else {
                continue;
            };
            let Ok(permit) = endpoint.permits.acquire().await else {
                return Acquired::Disabled(CallError::Backend("endpoint slots were closed".into()));
            };
            let Some(probe) = endpoint.lock().breaker.enter(Instant::now()) else {
                // The breaker opened, or another request took the probe,
                // while this one waited for a slot.
                continue;
            };
            return Acquired::Got(Lease {
                endpoint,
                probe,
                reported: false,
                _permit: permit,
            });
        }
    }

    /// One HTTP exchange.
    async fn attempt(
        &self,
        endpoint: &Endpoint,
        body: &[u8],
    ) -> Result<(Reply, RateInfo), (Fault, Option<RateInfo>)> {
        let key = endpoint.key.as_ref();
        let response = self
            .client
            .post(endpoint.url.clone())
            .headers(endpoint.headers.clone())
            .body(body.to_vec())
            .send()
            .await
            .map_err(|e| (classify(&e).scrubbed(key), None))?;
        let info = RateInfo::from_headers(response.headers());
        let status = response.status();
        if !status.is_success() {
            // The body only explains the status; if it cannot be read (or
            // is over the bound) the status still says enough.
            let text = match read_body(response, self.cfg.max_response_bytes.min(ERROR_BODY_BYTES))
                .await
            {
                Ok(b) => String::from_utf8_lossy(&b).into_owned(),
                Err(_) => String::new(),
            };
            let fault = Fault::Status {
                status: status.as_u16(),
                excerpt: excerpt(&text),
                retry_after: info.retry_after,
            };
            return Err((fault.scrubbed(key), Some(info)));
        }
        match self
            .protocol
            .read(response, self.cfg.max_response_bytes)
            .await
        {
            // A server that echoes the key in its answer must not put it
            // in a fact, the store, a cassette or a log.
            Ok(mut reply) => {
                if let Some(k) = key {
                    reply.text = k.scrub(&reply.text);
                }
                Ok((reply, info))
            }
            Err(f) => Err((f.scrubbed(key), Some(info))),
        }
    }
}

/// A weighted random pick; `None` only for no choices.
fn weighted<'a>(choices: &[&'a Endpoint]) -> Option<&'a Endpoint> {
    let total: u64 = choices.iter().map(|e| u64::from(e.weight)).sum();
    let mut pick = fastrand::u64(0..total.max(1));
    for e in choices {
        let w = u64::from(e.weight);
        if pick < w {
            return Some(e);
        }
        pick -= w;
    }
    choices.last().copied()
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::{Duration, Instant};

    use fanfold_model::{CallError, Completion, Job, ModelBackend, Request};

    use crate::{EndpointConfig, OpenAiBackend, OpenAiConfig, TransportConfig};

    /// One request; its result is kept.
    struct One {
        request: Mutex<Option<Request>>,
        result: Mutex<Option<Result<Completion, CallError>>>,
    }

    impl Job for One {
        fn prefix(&self) -> &str {
            "p"
        }
        fn slots(&self) -> usize {
            1
        }
        fn next(&self) -> Option<Request> {
            self.request.lock().ok()?.take()
        }
        fn complete(&self, _: Request, result: Result<Completion, CallError>) {
            if let Ok(mut r) = self.result.lock() {
                *r = Some(result);
            }
        }
        fn is_cancelled(&self) -> bool {
            false
        }
    }

    /// A server that accepts connections and never answers.
    fn hanging() -> String {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}/v1", listener.local_addr().expect("addr"));
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for conn in listener.incoming() {
                held.push(conn);
            }
        });
        url
    }

    /// By default a call fails within a minute, retries included.
    #[test]
    fn a_call_fails_within_a_minute_by_default() {
        let t = TransportConfig::new(Vec::new());
        assert!(
            t.call_timeout_ms.max(t.request_timeout_ms) <= 60_000,
            "{t:?}"
        );
        assert!(t.request_timeout_ms < t.call_timeout_ms, "a retry fits");
    }

    /// A hanging endpoint: attempts are retried until the call's whole
    /// time is spent, and not past it, however many retries are left.
    #[test]
    fn a_hanging_endpoint_fails_the_call_at_its_whole_time() {
        let mut transport = TransportConfig::new(vec![EndpointConfig::new(hanging())]);
        transport.request_timeout_ms = 400;
        transport.call_timeout_ms = 1_000;
        transport.retry.max_retries = 50;
        transport.retry.backoff_base_ms = 10;
        transport.retry.backoff_max_ms = 20;
        transport.breaker.failure_threshold = 1_000;
        let mut config = OpenAiConfig::new("m", Vec::new());
        config.transport = transport;
        let backend = OpenAiBackend::new(config).expect("backend");
        let job = One {
            request: Mutex::new(Some(Request {
                index: 0,
                unit_id: "u".into(),
                suffix: "s".into(),
                input: serde_json::Value::Null,
                attempt: 1,
                max_output_tokens: 8,
                schema: None,
            })),
            result: Mutex::new(None),
        };
        let started = Instant::now();
        backend.run(&job).expect("run");
        let took = started.elapsed();
        let result = job.result.lock().expect("result").take();
        assert!(
            matches!(result, Some(Err(CallError::Timeout { .. }))),
            "{result:?}"
        );
        assert!(
            took >= Duration::from_millis(800) && took < Duration::from_millis(1_800),
            "took {took:?}"
        );
        let sent = backend.stats().requests;
        assert!((2..=3).contains(&sent), "{sent} attempts");
    }
}
