//! Provider batch APIs as an execution mode: OpenAI's Batch API and
//! Anthropic's Message Batches.
//!
//! A batch stage pulls every request the job has, writes them as one
//! provider batch, polls it with a growing interval until it ends, and hands
//! each result back to its unit. Requests the provider failed come back as
//! that unit's error, so the engine's attempts send them again in a smaller
//! batch. Batches cost less (the price table's `batch_discount`) and have
//! no per-minute limits, but answer within hours, not seconds.
//!
//! Each submitted batch is written to the job's [`BatchLedger`] with the
//! content key of every request in it. A run stopped while a batch is
//! pending (killed, or out of `max_wait_secs`) finds its requests there on
//! the next run and collects that batch instead of sending them again.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::time::{Duration, Instant};

use fanfold_model::{
    BackendError, BatchLedger, BatchSlot, BatchState, CallError, Completion, Job, Next, Request,
    SubmittedBatch,
};
use reqwest::header::{CONTENT_TYPE, HeaderMap};
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub(crate) use crate::transport::BatchHttp;
use crate::transport::{Fault, Protocol, Reply, Transport, excerpt, parse_json};

/// How a batch is submitted and waited for.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BatchConfig {
    /// The first wait between polls; it doubles up to `poll_max_ms`.
    pub poll_initial_ms: u64,
    pub poll_max_ms: u64,
    /// Stop waiting after this long: requests still in a pending batch end
    /// `not_run` (`batch_pending`) and a later run collects them. `None`
    /// waits until every batch ends.
    pub max_wait_secs: Option<u64>,
    /// OpenAI's `completion_window`.
    pub completion_window: String,
    /// Most requests in one batch; a larger job is split. `None` takes the
    /// provider's limit (OpenAI 50,000, Anthropic 100,000).
    pub max_requests: Option<usize>,
}

impl Default for BatchConfig {
    fn default() -> BatchConfig {
        BatchConfig {
            poll_initial_ms: 5_000,
            poll_max_ms: 300_000,
            max_wait_secs: None,
            completion_window: "24h".into(),
            max_requests: None,
        }
    }
}

/// A batch as the provider describes it when polled.
#[derive(Clone, Debug)]
pub(crate) struct BatchStatus {
    /// The provider's own word for the state, for logs and errors.
    pub state: String,
    pub ended: bool,
    /// Where the results are: file ids (OpenAI) or a results URL
    /// (Anthropic).
    pub outputs: Vec<String>,
    /// Why the whole batch failed, when it did.
    pub failure: Option<String>,
}

/// What a batch says about one request.
pub(crate) type LineOutcome = Result<Reply, CallError>;

impl BatchHttp<'_> {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Sends one control request, retrying transport faults with doubling
    /// backoff; returns the body of a 2xx answer.
    pub async fn send(
        &self,
        build: impl Fn() -> reqwest::RequestBuilder,
    ) -> Result<Vec<u8>, Fault> {
        let mut tries = 0u32;
        loop {
            tries += 1;
            let result = match tokio::time::timeout(self.timeout, self.once(build())).await {
                Ok(r) => r,
                Err(_) => Err(Fault::Timeout),
            };
            match result {
                Ok(bytes) => return Ok(bytes),
                Err(fault) => {
                    let fault = fault.scrubbed(self.key);
                    if !fault.retryable() || tries > self.max_retries {
                        return Err(fault);
                    }
                    let wait = match &fault {
                        Fault::Status {
                            retry_after: Some(d),
                            ..
                        } => *d,
                        _ => self.backoff_base.saturating_mul(1 << tries.min(10)),
                    };
                    tracing::debug!(?fault, tries, "batch call failed; retrying");
                    tokio::time::sleep(wait.min(Duration::from_secs(120))).await;
                }
            }
        }
    }

    async fn once(&self, request: reqwest::RequestBuilder) -> Result<Vec<u8>, Fault> {
        let response = request
            .send()
            .await
            .map_err(|e| crate::transport::classify(&e))?;
        let status = response.status();
        let retry_after = crate::limits::RateInfo::from_headers(response.headers()).retry_after;
        // A batch's files hold every answer of the batch: their size
        // follows the job's, which the engine already bounds.
        let bytes = crate::transport::read_body(response, u64::MAX).await?;
        if !status.is_success() {
            return Err(Fault::Status {
                status: status.as_u16(),
                excerpt: excerpt(&String::from_utf8_lossy(&bytes)),
                retry_after,
            });
        }
        Ok(bytes)
    }

    pub async fn get_json(&self, url: &str) -> Result<Value, Fault> {
        let bytes = self
            .send(|| self.client.get(url).headers(self.headers.clone()))
            .await?;
        parse_json(&bytes)
    }

    pub async fn post_json(&self, url: &str, body: &Value) -> Result<Value, Fault> {
        let body = serde_json::to_vec(body)
            .map_err(|e| Fault::Invalid(format!("could not encode the request: {e}")))?;
        let bytes = self
            .send(|| {
                self.client
                    .post(url)
                    .headers(self.headers.clone())
                    .body(body.clone())
            })
            .await?;
        parse_json(&bytes)
    }

    /// Headers for a request whose body sets its own content type.
    pub fn headers_without_content_type(&self) -> HeaderMap {
        let mut h = self.headers.clone();
        h.remove(CONTENT_TYPE);
        h
    }
}

/// One provider's batch protocol.
pub(crate) trait BatchApi: Protocol {
    /// `openai` or `anthropic`, for the ledger.
    const PROVIDER: &'static str;
    /// The provider's limit on requests per batch.
    const MAX_REQUESTS: usize;
    /// Submits `(custom_id, request body)` pairs; returns the batch id.
    fn create(
        &self,
        http: &BatchHttp<'_>,
        cfg: &BatchConfig,
        items: &[(String, Value)],
    ) -> impl Future<Output = Result<String, Fault>>;
    fn status(
        &self,
        http: &BatchHttp<'_>,
        id: &str,
    ) -> impl Future<Output = Result<BatchStatus, Fault>>;
    /// The outcome of every request the ended batch has a line for.
    fn results(
        &self,
        http: &BatchHttp<'_>,
        status: &BatchStatus,
    ) -> impl Future<Output = Result<Vec<(String, LineOutcome)>, Fault>>;
}

/// The ledger key of one request: everything that decides its answer.
fn request_key(provider: &str, base: &str, attempt: u32, body: &[u8]) -> String {
    let mut h = blake3::Hasher::new();
    for part in [provider.as_bytes(), base.as_bytes(), &attempt.to_le_bytes()] {
        h.update(&(part.len() as u64).to_le_bytes());
        h.update(part);
    }
    h.update(body);
    h.finalize().to_hex().to_string()
}

/// Requests waiting on one batch, by their id inside it.
type Waiting = BTreeMap<String, Vec<(String, Request)>>;

impl<P: BatchApi> Transport<P> {
    /// Drains the job through provider batches: every request the job has
    /// goes into one round of batches, and retries the engine queues from
    /// that round go into the next.
    pub(crate) fn run_batch(&self, job: &dyn Job, cfg: &BatchConfig) -> Result<(), BackendError> {
        self.block_on(async {
            loop {
                // Pull no more than the job's slots (the engine gives a
                // batch stage a slot per unit), and never wait for a unit
                // another run holds while this round's requests are held
                // unsent: that run may be waiting on ours.
                let mut requests = Vec::new();
                while requests.len() < job.slots().max(1) {
                    match job.poll_next() {
                        Next::Request(r) => requests.push(r),
                        Next::Done => break,
                        Next::Later(d) if requests.is_empty() => {
                            tokio::time::sleep(
                                d.clamp(Duration::from_millis(1), crate::transport::NEXT_POLL),
                            )
                            .await;
                        }
                        Next::Later(_) => break,
                    }
                }
                if requests.is_empty() {
                    break;
                }
                self.batch_round(job, cfg, requests).await;
            }
        });
        Ok(())
    }

    async fn batch_round(&self, job: &dyn Job, cfg: &BatchConfig, requests: Vec<Request>) {
        let Some(http) = self.batch_http() else {
            for request in requests {
                job.complete(
                    request,
                    Err(CallError::Backend("the backend has no endpoint".into())),
                );
            }
            return;
        };
        let ledger = job.batch_ledger();
        let mut waiting: Waiting = BTreeMap::new();
        let mut fresh: Vec<(String, Value, Request)> = Vec::new();
        for request in requests {
            let mut body = self.protocol.body(job, &request);
            if let Some(o) = body.as_object_mut() {
                // A batch answer is one document, never a stream.
                o.remove("stream");
                o.remove("stream_options");
            }
            let bytes = match serde_json::to_vec(&body) {
                Ok(b) => b,
                Err(e) => {
                    job.complete(
                        request,
                        Err(CallError::Backend(format!(
                            "could not encode the request: {e}"
                        ))),
                    );
                    continue;
                }
            };
            let key = request_key(P::PROVIDER, http.base, request.attempt, &bytes);
            match ledger.map(|l| l.find(&key)).transpose() {
                Ok(Some(Some(BatchSlot {
                    batch_id,
                    custom_id,
                }))) => {
                    tracing::debug!(unit = %request.unit_id, batch = %batch_id, "request already in a pending batch");
                    waiting
                        .entry(batch_id)
                        .or_default()
                        .push((custom_id, request));
                }
                Ok(_) => fresh.push((key, body, request)),
                Err(e) => job.complete(
                    request,
                    Err(CallError::Backend(format!("batch ledger: {e}"))),
                ),
            }
        }

        for (batch_id, requests) in &waiting {
            tracing::info!(batch = %batch_id, requests = requests.len(), "collecting a batch submitted earlier");
        }
        let limit = cfg.max_requests.unwrap_or(P::MAX_REQUESTS).max(1);
        while !fresh.is_empty() {
            let rest = fresh.split_off(fresh.len().min(limit));
            let chunk = std::mem::replace(&mut fresh, rest);
            self.submit(job, cfg, &http, ledger, chunk, &mut waiting)
                .await;
        }
        self.wait(job, cfg, &http, ledger, waiting).await;
    }

    async fn submit(
        &self,
        job: &dyn Job,
        cfg: &BatchConfig,
        http: &BatchHttp<'_>,
        ledger: Option<&dyn BatchLedger>,
        chunk: Vec<(String, Value, Request)>,
        waiting: &mut Waiting,
    ) {
        let mut items = Vec::with_capacity(chunk.len());
        let mut keys = Vec::with_capacity(chunk.len());
        let mut requests = Vec::with_capacity(chunk.len());
        for (i, (key, body, request)) in chunk.into_iter().enumerate() {
            let custom_id = format!("r{i}");
            keys.push((key, custom_id.clone()));
            items.push((custom_id.clone(), body));
            requests.push((custom_id, request));
        }
        self.count_request();
        match self.protocol.create(http, cfg, &items).await {
            Ok(batch_id) => {
                tracing::info!(batch = %batch_id, requests = items.len(), provider = P::PROVIDER, "batch submitted");
                if let Some(l) = ledger
                    && let Err(e) = l.submitted(&SubmittedBatch {
                        batch_id: batch_id.clone(),
                        provider: P::PROVIDER.into(),
                        endpoint: http.base.to_owned(),
                        requests: keys,
                    })
                {
                    // The batch runs either way; only a restart would not
                    // find it.
                    tracing::warn!(batch = %batch_id, error = %e, "batch not recorded; a restart would submit its requests again");
                }
                waiting.insert(batch_id, requests);
            }
            Err(fault) => {
                tracing::warn!(?fault, requests = items.len(), "batch submission failed");
                self.fail_all(job, requests, &self.fault_error(&fault));
            }
        }
    }

    /// Polls every batch until it ends, the job is cancelled, or the wait
    /// runs out; every request is completed exactly once.
    async fn wait(
        &self,
        job: &dyn Job,
        cfg: &BatchConfig,
        http: &BatchHttp<'_>,
        ledger: Option<&dyn BatchLedger>,
        mut waiting: Waiting,
    ) {
        let started = Instant::now();
        let mut interval = Duration::from_millis(cfg.poll_initial_ms);
        let max_interval = Duration::from_millis(cfg.poll_max_ms.max(cfg.poll_initial_ms));
        let mut last_state: HashMap<String, String> = HashMap::new();
        let mut failures: HashMap<String, u32> = HashMap::new();
        while !waiting.is_empty() {
            let ids: Vec<String> = waiting.keys().cloned().collect();
            for id in ids {
                self.count_request();
                let status = match self.protocol.status(http, &id).await {
                    Ok(s) => s,
                    Err(fault) => {
                        let n = failures.entry(id.clone()).or_default();
                        *n += 1;
                        tracing::warn!(batch = %id, ?fault, "batch poll failed");
                        if *n > self.retry_limit() {
                            // The batch may still finish; a later run asks
                            // again.
                            let state = format!("unreachable: {}", self.fault_error(&fault));
                            self.end_pending(job, &id, &state, waiting.remove(&id));
                        }
                        continue;
                    }
                };
                failures.remove(&id);
                if last_state.get(&id) != Some(&status.state) {
                    tracing::info!(batch = %id, state = %status.state, "batch state");
                    last_state.insert(id.clone(), status.state.clone());
                }
                if !status.ended {
                    continue;
                }
                let Some(requests) = waiting.remove(&id) else {
                    continue;
                };
                if let Some(failure) = &status.failure {
                    let err = CallError::Backend(format!("batch {id} failed: {failure}"));
                    self.fail_all(job, requests, &err);
                    self.close(ledger, &id, BatchState::Failed);
                    continue;
                }
                self.count_request();
                match self.protocol.results(http, &status).await {
                    Ok(lines) => {
                        self.deliver(job, &id, &status.state, lines, requests);
                        self.close(ledger, &id, BatchState::Consumed);
                    }
                    Err(fault) => {
                        // The results stay at the provider; the batch stays
                        // open in the ledger for the next run.
                        let state = format!(
                            "{} but its results could not be read: {}",
                            status.state,
                            self.fault_error(&fault)
                        );
                        self.end_pending(job, &id, &state, Some(requests));
                    }
                }
            }
            if waiting.is_empty() {
                break;
            }
            if job.is_cancelled() {
                for (_, requests) in std::mem::take(&mut waiting) {
                    for (_, request) in requests {
                        job.complete(request, Err(CallError::Cancelled));
                    }
                }
                break;
            }
            if let Some(max) = cfg.max_wait_secs
                && started.elapsed() >= Duration::from_secs(max)
            {
                for (id, requests) in std::mem::take(&mut waiting) {
                    let state = last_state.get(&id).cloned().unwrap_or_default();
                    self.end_pending(job, &id, &state, Some(requests));
                }
                break;
            }
            let deadline = cfg
                .max_wait_secs
                .map(|s| Duration::from_secs(s).saturating_sub(started.elapsed()));
            let nap = deadline.map_or(interval, |d| d.min(interval));
            let woke = Instant::now();
            while woke.elapsed() < nap && !job.is_cancelled() {
                tokio::time::sleep((nap - woke.elapsed()).min(Duration::from_millis(200))).await;
            }
            interval = (interval * 2).min(max_interval);
        }
    }

    fn deliver(
        &self,
        job: &dyn Job,
        id: &str,
        state: &str,
        lines: Vec<(String, LineOutcome)>,
        requests: Vec<(String, Request)>,
    ) {
        let mut by_id: HashMap<String, LineOutcome> = lines.into_iter().collect();
        for (custom_id, request) in requests {
            let result = match by_id.remove(&custom_id) {
                Some(Ok(reply)) => {
                    self.count_answer(&reply);
                    Ok(Completion {
                        text: reply.text,
                        // A batch answer has no latency of its own.
                        usage: reply.usage,
                        choices: None,
                        truncated_tokens: 0,
                    })
                }
                Some(Err(e)) => {
                    self.count_failed();
                    Err(e)
                }
                None => {
                    self.count_failed();
                    Err(CallError::InvalidResponse(format!(
                        "batch {id} ended ({state}) without a result for request {custom_id}"
                    )))
                }
            };
            job.complete(request, result);
        }
    }

    fn fail_all(&self, job: &dyn Job, requests: Vec<(String, Request)>, err: &CallError) {
        for (_, request) in requests {
            self.count_failed();
            job.complete(request, Err(err.clone()));
        }
    }

    fn end_pending(
        &self,
        job: &dyn Job,
        id: &str,
        state: &str,
        requests: Option<Vec<(String, Request)>>,
    ) {
        for (_, request) in requests.unwrap_or_default() {
            job.complete(
                request,
                Err(CallError::BatchPending {
                    batch_id: id.to_owned(),
                    state: state.to_owned(),
                }),
            );
        }
    }

    fn close(&self, ledger: Option<&dyn BatchLedger>, id: &str, state: BatchState) {
        if let Some(l) = ledger
            && let Err(e) = l.close(id, state)
        {
            tracing::warn!(batch = %id, error = %e, "batch not closed in the ledger");
        }
    }
}

/// The lines of a batch result file, each with its `custom_id`. Blank
/// lines are skipped; a line that is not a JSON object with a `custom_id`
/// makes the whole file unreadable.
pub(crate) fn result_lines(bytes: &[u8], what: &str) -> Result<Vec<(String, Value)>, Fault> {
    let mut out = Vec::new();
    for (n, line) in bytes.split(|b| *b == b'\n').enumerate() {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let v: Value = serde_json::from_slice(line)
            .map_err(|e| Fault::Invalid(format!("{what} line {}: {e}", n + 1)))?;
        let Some(custom_id) = v.get("custom_id").and_then(Value::as_str) else {
            return Err(Fault::Invalid(format!(
                "{what} line {} has no custom_id",
                n + 1
            )));
        };
        out.push((custom_id.to_owned(), v));
    }
    Ok(out)
}

/// A reply the protocol's parser refused, as the unit's error.
pub(crate) fn invalid_reply(f: Fault) -> CallError {
    match f {
        Fault::Invalid(m) | Fault::Truncated(m) | Fault::Unreachable(m) | Fault::Connection(m) => {
            CallError::InvalidResponse(m)
        }
        other => CallError::InvalidResponse(format!("{other:?}")),
    }
}

/// The per-line error of a batch result: the provider's code and message.
pub(crate) fn line_error(kind: &str, detail: &Value) -> CallError {
    let message = detail
        .get("message")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .unwrap_or_else(|| detail.to_string());
    CallError::Backend(format!("batch request {kind}: {}", excerpt(&message)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_keys_separate_every_input() {
        let k = request_key("openai", "https://a/v1", 1, b"{}");
        assert_eq!(k, request_key("openai", "https://a/v1", 1, b"{}"));
        for other in [
            request_key("anthropic", "https://a/v1", 1, b"{}"),
            request_key("openai", "https://b/v1", 1, b"{}"),
            request_key("openai", "https://a/v1", 2, b"{}"),
            request_key("openai", "https://a/v1", 1, b"{ }"),
            // Field boundaries are length-prefixed, not concatenated.
            request_key("openaih", "ttps://a/v1", 1, b"{}"),
        ] {
            assert_ne!(k, other);
        }
    }
}
