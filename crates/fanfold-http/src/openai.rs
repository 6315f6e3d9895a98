//! OpenAI-compatible `/chat/completions`: OpenAI, vLLM, llama.cpp's
//! llama-server, Ollama.

use std::fmt;

use fanfold_model::{BackendError, BackendInfo, CallError, Job, ModelBackend, Request, Usage};
use futures_util::StreamExt;
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, HeaderMap, HeaderValue};
use serde_json::{Map, Value, json};

use crate::batch::{
    BatchApi, BatchConfig, BatchHttp, BatchStatus, LineOutcome, invalid_reply, line_error,
    result_lines,
};
use crate::config::{MaxTokensField, OpenAiConfig, OutputMode};
use crate::secret::ApiKey;
use crate::transport::{Fault, Protocol, Reply, Transport, excerpt, parse_json, read_body};
use crate::{HttpError, HttpStats};

/// The `json_schema.name` sent with structured output.
const SCHEMA_NAME: &str = "fanfold_output";

pub(crate) struct OpenAiProtocol {
    config: OpenAiConfig,
}

/// A backend for OpenAI-compatible servers.
///
/// The job's prefix is the system message and each request's suffix the
/// user message, so the prompt's leading bytes are identical across
/// requests and a provider's prefix cache can serve them.
pub struct OpenAiBackend {
    transport: Transport<OpenAiProtocol>,
    /// What the pool serves under the model name, asked once: `Ok(Some)`
    /// when every endpoint lists the same weights, `Ok(None)` when none can
    /// say, `Err` (in words) when they disagree.
    served: std::sync::OnceLock<Result<Option<String>, String>>,
}

/// One endpoint's answer: (base URL, alias) and what it serves, or why it
/// could not say.
type Asked = ((String, String), Result<String, String>);

/// How long asking an endpoint what it serves may take: it only names the
/// weights, so a slow or dead server is not waited on here.
const SERVED_PROBE: std::time::Duration = std::time::Duration::from_secs(5);

impl OpenAiBackend {
    /// Holds the endpoints' `requests_per_minute` and `tokens_per_minute`
    /// in `ledger` as well, shared with every process that uses it (a
    /// fleet's workers), so together they stay within them.
    pub fn share_rates(&mut self, ledger: std::sync::Arc<dyn fanfold_model::SharedRates>) {
        self.transport.share_rates(ledger);
    }

    /// Reads each endpoint's key from its environment variable, checks the
    /// configuration, and starts the backend's runtime.
    pub fn new(config: OpenAiConfig) -> Result<OpenAiBackend, HttpError> {
        if config.model.trim().is_empty() {
            return Err(HttpError::Config("model is empty".into()));
        }
        if let Some(t) = config.temperature
            && !(t.is_finite() && t >= 0.0)
        {
            return Err(HttpError::Config(format!(
                "temperature {t} is not a non-negative number"
            )));
        }
        let transport = config.transport.clone();
        Ok(OpenAiBackend {
            transport: Transport::new(OpenAiProtocol { config }, transport)?,
            served: std::sync::OnceLock::new(),
        })
    }

    /// What the endpoints say they serve under the model name, from their
    /// `GET /models` listings: the served id and a fingerprint of its
    /// entry's fields that name the weights (its `id`, vLLM's `root` and
    /// `parent`, llama.cpp's `meta` with the weights' size and parameter
    /// count; never `created`, prices or limits, which change without the
    /// weights changing). Part of the backend's identity, so
    /// weights swapped behind an alias that the listing tells apart are
    /// new facts, not stale ones. `None` when no endpoint has a listing
    /// that lists the model (the identity is then the host and alias), or
    /// when the endpoints of a pool disagree ([`OpenAiBackend::check_pool`]
    /// refuses that pool).
    pub fn served(&self) -> Option<&str> {
        match self.pool_served() {
            Some(Ok(served)) => served.as_deref(),
            _ => None,
        }
    }

    /// Refuses a pool whose endpoints do not all say they serve the same
    /// weights: its facts are keyed by one identity, so one member serving
    /// other weights (or one that cannot say, beside members that can)
    /// would store its answers as the others'. Every endpoint is asked; a
    /// pool where none has a listing is keyed by the first's host and the
    /// alias, as a single endpoint without one is.
    pub fn check_pool(&self) -> Result<(), HttpError> {
        if self.config().transport.endpoints.len() < 2 {
            // One endpoint always agrees with itself; it is asked when its
            // identity is first read.
            return Ok(());
        }
        match self.pool_served() {
            Some(Err(why)) => Err(HttpError::MixedPool(why.clone())),
            _ => Ok(()),
        }
    }

    fn pool_served(&self) -> Option<&Result<Option<String>, String>> {
        if let Some(served) = self.served.get() {
            return Some(served);
        }
        // Inside another runtime this thread must not block on ours; the
        // listing is asked (and kept) at the first call outside one.
        if tokio::runtime::Handle::try_current().is_ok() {
            return None;
        }
        Some(self.served.get_or_init(|| {
            let alias = &self.config().model;
            let answers: Vec<(String, Result<String, String>)> = self
                .transport
                .endpoints_http()
                .iter()
                .map(|http| (http.base.to_owned(), self.asked(http)))
                .collect();
            let verdict = pool_verdict(alias, &answers);
            if let Ok(None) = verdict {
                for (base, answer) in &answers {
                    if let Err(why) = answer {
                        tracing::warn!(
                            "GET {base}/models: {why}; the cache names the model by host and \
                             alias only, so weights swapped behind `{alias}` would be served \
                             from cached facts"
                        );
                    }
                }
            }
            verdict
        }))
    }

    /// What the endpoint `http` serves, asked once per process and
    /// endpoint: a run builds its backends more than once (to count cached
    /// facts, then to call), and must name one model throughout.
    fn asked(&self, http: &crate::batch::BatchHttp<'_>) -> Result<String, String> {
        static ASKED: std::sync::Mutex<Vec<Asked>> = std::sync::Mutex::new(Vec::new());
        let at = (http.base.to_owned(), self.config().model.clone());
        let known = ASKED
            .lock()
            .ok()
            .and_then(|a| a.iter().find(|(k, _)| *k == at).map(|(_, v)| v.clone()));
        if let Some(known) = known {
            return known;
        }
        let served = self.ask_served(http);
        if let Ok(mut asked) = ASKED.lock() {
            asked.push((at, served.clone()));
        }
        served
    }

    fn ask_served(&self, http: &crate::batch::BatchHttp<'_>) -> Result<String, String> {
        let url = http.url("/models");
        let alias = &self.config().model;
        let listed = self
            .transport
            .block_on(async { tokio::time::timeout(SERVED_PROBE, http.get_json(&url)).await });
        match listed {
            Ok(Ok(listing)) => match served_entry(&listing, alias) {
                Some(served) => {
                    // The server's words: never the key, never unbounded.
                    let served = match http.key {
                        Some(key) => key.scrub(&served),
                        None => served,
                    };
                    Ok(served
                        .chars()
                        .filter(|c| !c.is_control())
                        .take(160)
                        .collect())
                }
                None => Err(format!("its listing has no model `{alias}`")),
            },
            Ok(Err(fault)) => Err(self.transport.fault_error(&fault).to_string()),
            Err(_) => Err(format!("no answer within {} s", SERVED_PROBE.as_secs())),
        }
    }

    pub fn config(&self) -> &OpenAiConfig {
        &self.transport.protocol.config
    }

    /// Counters since the backend was built.
    pub fn stats(&self) -> HttpStats {
        self.transport.stats()
    }

    /// Whether the primary endpoint serves the Batch API: a listing of its
    /// batches (`GET /batches?limit=1`) answers. Servers that speak only
    /// `/chat/completions` (llama.cpp's, llama-cpp-python's) answer 404 or
    /// 405; any other failure is an error, since no request would fare
    /// better.
    pub fn offers_batch_api(&self) -> Result<bool, String> {
        let http = self
            .transport
            .batch_http()
            .ok_or_else(|| "the backend has no endpoint".to_owned())?;
        let url = http.url("/batches?limit=1");
        match self.transport.block_on(http.get_json(&url)) {
            Ok(_) => Ok(true),
            Err(Fault::Status {
                status: 404 | 405, ..
            }) => Ok(false),
            Err(fault) => Err(format!("GET {url}: {}", self.transport.fault_error(&fault))),
        }
    }
}

impl fmt::Debug for OpenAiBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The config holds only the names of key variables; keys live in
        // the transport, which is not printed.
        f.debug_struct("OpenAiBackend")
            .field("config", self.config())
            .finish_non_exhaustive()
    }
}

/// `id#fingerprint` of the `/models` entry for `alias`; a server that lists
/// one model serves it under any name (llama.cpp's lists its file path).
fn served_entry(listing: &Value, alias: &str) -> Option<String> {
    let entries = listing.get("data")?.as_array()?;
    let id_of = |e: &Value| e.get("id").and_then(Value::as_str).map(str::to_owned);
    let entry = entries
        .iter()
        .find(|e| id_of(e).as_deref() == Some(alias))
        .or(match entries.as_slice() {
            [only] => Some(only),
            _ => None,
        })?;
    let id = id_of(entry)?;
    // Only what names the weights: a listing's prices, descriptions,
    // limits and timestamps change without the model changing.
    let fields = entry.as_object()?;
    let named: Map<String, Value> = ["id", "root", "parent", "meta"]
        .into_iter()
        .filter_map(|k| Some((k.to_owned(), fields.get(k)?.clone())))
        .collect();
    let text = serde_json::to_string(&Value::Object(named)).ok()?;
    let hash = blake3::hash(text.as_bytes()).to_hex();
    Some(format!("{id}#{}", hash.get(..12).unwrap_or_default()))
}

/// What a pool serves, from each endpoint's answer (its base URL, and what
/// it serves or why it cannot say): the weights every endpoint names, none
/// when no endpoint can say, and an error naming each endpoint when some
/// name other weights than the rest or cannot say beside ones that can.
fn pool_verdict(
    alias: &str,
    answers: &[(String, Result<String, String>)],
) -> Result<Option<String>, String> {
    let named: Vec<&String> = answers
        .iter()
        .filter_map(|(_, a)| a.as_ref().ok())
        .collect();
    let Some(first) = named.first() else {
        return Ok(None);
    };
    if named.len() == answers.len() && named.iter().all(|s| s == first) {
        return Ok(Some((*first).clone()));
    }
    let each: Vec<String> = answers
        .iter()
        .map(|(base, answer)| match answer {
            Ok(served) => format!("{base} serves `{served}`"),
            Err(why) => format!("{base} does not say what it serves ({why})"),
        })
        .collect();
    Err(format!(
        "under `{alias}`, {}. Facts are keyed by the weights a backend serves, so the \
         endpoints of one backend must all list the same ones: give each model a backend \
         of its own",
        each.join("; ")
    ))
}

impl ModelBackend for OpenAiBackend {
    fn info(&self) -> BackendInfo {
        let mut model_id = format!("{}/{}", self.transport.primary_host(), self.config().model);
        if let Some(served) = self.served() {
            model_id.push('@');
            model_id.push_str(served);
        }
        // Facts made with probabilities differ from those made without.
        if self.config().logprobs {
            model_id.push_str("+logprobs");
        }
        BackendInfo {
            kind: "openai".into(),
            model_id,
            simulated: false,
        }
    }

    fn run(&self, job: &dyn Job) -> Result<(), BackendError> {
        match &self.config().batch {
            Some(batch) => self.transport.run_batch(job, batch),
            None => self.transport.run(job),
        }
    }
}

/// The Batch API: the requests go up as a JSONL file (`POST /files`,
/// purpose `batch`), a batch is created over it (`POST /batches`), polled
/// (`GET /batches/{id}`), and its output and error files are read back
/// (`GET /files/{id}/content`), one JSON line per request.
impl BatchApi for OpenAiProtocol {
    const PROVIDER: &'static str = "openai";
    const MAX_REQUESTS: usize = 50_000;

    async fn create(
        &self,
        http: &BatchHttp<'_>,
        cfg: &BatchConfig,
        items: &[(String, Value)],
    ) -> Result<String, Fault> {
        let mut jsonl = Vec::new();
        for (custom_id, body) in items {
            let line = json!({
                "custom_id": custom_id,
                "method": "POST",
                "url": BATCH_ENDPOINT,
                "body": body,
            });
            serde_json::to_writer(&mut jsonl, &line)
                .map_err(|e| Fault::Invalid(format!("could not encode a batch line: {e}")))?;
            jsonl.push(b'\n');
        }
        let files = http.url("/files");
        let uploaded = http
            .send(|| {
                let part = reqwest::multipart::Part::bytes(jsonl.clone())
                    .file_name("fanfold-batch.jsonl")
                    .mime_str("application/jsonl")
                    .unwrap_or_else(|_| reqwest::multipart::Part::bytes(jsonl.clone()));
                let form = reqwest::multipart::Form::new()
                    .text("purpose", "batch")
                    .part("file", part);
                http.client
                    .post(&files)
                    .headers(http.headers_without_content_type())
                    .multipart(form)
            })
            .await?;
        let file_id = string_field(&parse_json(&uploaded)?, "id", "the uploaded file")?;
        let batch = http
            .post_json(
                &http.url("/batches"),
                &json!({
                    "input_file_id": file_id,
                    "endpoint": BATCH_ENDPOINT,
                    "completion_window": cfg.completion_window,
                    "metadata": {"created_by": "fanfold"},
                }),
            )
            .await?;
        string_field(&batch, "id", "the created batch")
    }

    async fn status(&self, http: &BatchHttp<'_>, id: &str) -> Result<BatchStatus, Fault> {
        let v = http.get_json(&http.url(&format!("/batches/{id}"))).await?;
        let state = string_field(&v, "status", "the batch")?;
        let ended = matches!(
            state.as_str(),
            "completed" | "failed" | "expired" | "cancelled"
        );
        let outputs = ["output_file_id", "error_file_id"]
            .iter()
            .filter_map(|k| v.get(*k).and_then(Value::as_str))
            .map(str::to_owned)
            .collect();
        let failure = (state == "failed").then(|| {
            v.pointer("/errors/data")
                .and_then(Value::as_array)
                .map(|errors| {
                    errors
                        .iter()
                        .filter_map(|e| e.get("message").and_then(Value::as_str))
                        .collect::<Vec<_>>()
                        .join("; ")
                })
                .filter(|m| !m.is_empty())
                .unwrap_or_else(|| "no reason given".into())
        });
        Ok(BatchStatus {
            state,
            ended,
            outputs,
            failure,
        })
    }

    async fn results(
        &self,
        http: &BatchHttp<'_>,
        status: &BatchStatus,
    ) -> Result<Vec<(String, LineOutcome)>, Fault> {
        let mut out = Vec::new();
        for file in &status.outputs {
            let url = http.url(&format!("/files/{file}/content"));
            let bytes = http
                .send(|| http.client.get(&url).headers(http.headers.clone()))
                .await?;
            for (custom_id, v) in result_lines(&bytes, &format!("batch file {file}"))? {
                out.push((custom_id, batch_line(&v)));
            }
        }
        Ok(out)
    }
}

/// The `url` of every batch line and the batch's `endpoint`.
const BATCH_ENDPOINT: &str = "/v1/chat/completions";

fn string_field(v: &Value, key: &str, what: &str) -> Result<String, Fault> {
    v.get(key)
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| Fault::Invalid(format!("{what} has no {key:?}")))
}

/// One line of an output or error file.
fn batch_line(v: &Value) -> LineOutcome {
    if let Some(e) = v.get("error").filter(|e| !e.is_null()) {
        let code = e.get("code").and_then(Value::as_str).unwrap_or("error");
        return Err(line_error(code, e));
    }
    let status = v
        .pointer("/response/status_code")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    let body = v.pointer("/response/body").unwrap_or(&Value::Null);
    if status != 200 {
        return Err(CallError::Http {
            status: u16::try_from(status).unwrap_or(0),
            body_excerpt: excerpt(&body.to_string()),
        });
    }
    parse_completion(body).map_err(invalid_reply)
}

impl Protocol for OpenAiProtocol {
    fn path(&self) -> &'static str {
        "/chat/completions"
    }

    fn headers(&self, key: Option<&ApiKey>) -> Result<HeaderMap, HttpError> {
        let mut h = HeaderMap::new();
        h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let Some(key) = key {
            let mut v =
                HeaderValue::from_str(&format!("Bearer {}", key.expose())).map_err(|_| {
                    HttpError::Config(
                        "the API key contains characters not allowed in an HTTP header".into(),
                    )
                })?;
            v.set_sensitive(true);
            h.insert(AUTHORIZATION, v);
        }
        Ok(h)
    }

    fn body(&self, job: &dyn Job, request: &Request) -> Value {
        let c = &self.config;
        let mut messages = Vec::with_capacity(2);
        if !job.prefix().is_empty() {
            messages.push(json!({"role": "system", "content": job.prefix()}));
        }
        messages.push(json!({"role": "user", "content": request.suffix}));
        let mut body = Map::new();
        body.insert("model".into(), json!(c.model));
        body.insert("messages".into(), json!(messages));
        let limit = match c.max_tokens_field {
            MaxTokensField::MaxTokens => "max_tokens",
            MaxTokensField::MaxCompletionTokens => "max_completion_tokens",
        };
        body.insert(limit.into(), json!(request.max_output_tokens));
        if let Some(t) = c.temperature {
            body.insert("temperature".into(), json!(t));
        }
        if let Some(s) = c.seed {
            body.insert("seed".into(), json!(s));
        }
        if c.output != OutputMode::Prompt {
            let schema = if c.per_request_schema {
                request.schema.as_ref().or(job.output_schema())
            } else {
                job.output_schema().or(request.schema.as_ref())
            };
            if let Some(schema) = schema {
                let format = if c.output == OutputMode::JsonObject {
                    json!({"type": "json_object", "schema": schema})
                } else {
                    json!({
                        "type": "json_schema",
                        "json_schema": {"name": SCHEMA_NAME, "schema": schema, "strict": c.strict},
                    })
                };
                body.insert("response_format".into(), format);
            }
        }
        // Streamed answers are read as text alone, so their tokens are not
        // asked for.
        if c.logprobs && !c.stream && job.decision().is_some() {
            body.insert("logprobs".into(), json!(true));
            body.insert("top_logprobs".into(), json!(crate::logprobs::TOP_LOGPROBS));
        }
        if c.stream {
            body.insert("stream".into(), json!(true));
            body.insert("stream_options".into(), json!({"include_usage": true}));
        }
        Value::Object(body)
    }

    async fn read(&self, response: reqwest::Response, limit: u64) -> Result<Reply, Fault> {
        if self.config.stream {
            read_stream(response, limit).await
        } else {
            let bytes = read_body(response, limit).await?;
            parse_completion(&parse_json(&bytes)?)
        }
    }
}

/// Usage as OpenAI reports it: `prompt_tokens` includes the cached ones,
/// so the evaluated count is the difference.
fn usage(v: &Value) -> (Usage, Option<u64>) {
    let Some(u) = v.get("usage").filter(|u| u.is_object()) else {
        return (Usage::default(), None);
    };
    let n = |p: &str| u.pointer(p).and_then(Value::as_u64).unwrap_or(0);
    let prompt = n("/prompt_tokens");
    let cached = n("/prompt_tokens_details/cached_tokens").min(prompt);
    let completion = n("/completion_tokens");
    (
        Usage {
            prompt_tokens: prompt - cached,
            cached_tokens: cached,
            completion_tokens: completion,
            latency_ms: 0,
        },
        Some(prompt.saturating_add(completion)),
    )
}

fn error_message(v: &Value) -> Option<String> {
    let e = v.get("error")?;
    Some(
        e.get("message")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .unwrap_or_else(|| e.to_string()),
    )
}

fn parse_completion(v: &Value) -> Result<Reply, Fault> {
    if let Some(m) = error_message(v) {
        return Err(Fault::Invalid(format!("error object in a 200 answer: {m}")));
    }
    let message = v
        .pointer("/choices/0/message")
        .ok_or_else(|| Fault::Invalid("no choices[0].message in the answer".into()))?;
    let text = match message.get("content") {
        Some(Value::String(s)) => s.clone(),
        _ => {
            let refusal = message
                .get("refusal")
                .and_then(Value::as_str)
                .map(|r| format!("the model refused: {r}"))
                .unwrap_or_else(|| "choices[0].message.content is not a string".into());
            return Err(Fault::Invalid(refusal));
        }
    };
    let (usage, billed_tokens) = usage(v);
    Ok(Reply {
        text,
        usage,
        billed_tokens,
        tokens: crate::logprobs::parse(v),
    })
}

/// Accumulates a server-sent-event stream of chat completion chunks.
#[derive(Default)]
struct StreamState {
    text: String,
    usage: Option<(Usage, Option<u64>)>,
    done: bool,
    /// Bytes of the line being received.
    line: Vec<u8>,
    /// `data:` lines of the event being received.
    data: Vec<String>,
    refusal: Option<String>,
}

impl StreamState {
    fn feed(&mut self, chunk: &[u8]) -> Result<(), Fault> {
        for &b in chunk {
            if b == b'\n' {
                let line = std::mem::take(&mut self.line);
                let line = String::from_utf8_lossy(&line);
                self.line_done(line.trim_end_matches('\r'))?;
            } else {
                self.line.push(b);
            }
        }
        Ok(())
    }

    fn line_done(&mut self, line: &str) -> Result<(), Fault> {
        if line.is_empty() {
            return self.dispatch();
        }
        if let Some(rest) = line.strip_prefix("data:") {
            self.data
                .push(rest.strip_prefix(' ').unwrap_or(rest).to_owned());
        }
        // Comments (`:`), `event:`, `id:` and `retry:` carry nothing here.
        Ok(())
    }

    fn dispatch(&mut self) -> Result<(), Fault> {
        if self.data.is_empty() {
            return Ok(());
        }
        let data = self.data.join("\n");
        self.data.clear();
        if data.trim() == "[DONE]" {
            self.done = true;
            return Ok(());
        }
        let v: Value = serde_json::from_str(&data)
            .map_err(|e| Fault::Invalid(format!("stream event is not JSON: {e}")))?;
        if let Some(m) = error_message(&v) {
            return Err(Fault::Invalid(format!("error event in the stream: {m}")));
        }
        if let Some(s) = v
            .pointer("/choices/0/delta/content")
            .and_then(Value::as_str)
        {
            self.text.push_str(s);
        }
        if let Some(r) = v
            .pointer("/choices/0/delta/refusal")
            .and_then(Value::as_str)
        {
            self.refusal.get_or_insert_with(String::new).push_str(r);
        }
        if v.get("usage").is_some_and(Value::is_object) {
            self.usage = Some(usage(&v));
        }
        Ok(())
    }
}

/// Reads a streamed answer. A stream that ends without `[DONE]` was cut
/// off and counts as truncated.
async fn read_stream(response: reqwest::Response, limit: u64) -> Result<Reply, Fault> {
    let mut state = StreamState::default();
    let mut stream = response.bytes_stream();
    let mut read: u64 = 0;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| crate::transport::classify(&e))?;
        read += chunk.len() as u64;
        if read > limit {
            return Err(crate::transport::too_large(limit));
        }
        state.feed(&chunk)?;
        if state.done {
            break;
        }
    }
    if !state.done {
        // A final event without its blank line still counts.
        let tail = std::mem::take(&mut state.line);
        state.line_done(String::from_utf8_lossy(&tail).trim_end_matches('\r'))?;
        state.dispatch()?;
    }
    if !state.done {
        return Err(Fault::Truncated(
            "the event stream ended without [DONE]".into(),
        ));
    }
    if state.text.is_empty()
        && let Some(r) = state.refusal
    {
        return Err(Fault::Invalid(format!("the model refused: {r}")));
    }
    let (usage, billed_tokens) = state.usage.unwrap_or_default();
    Ok(Reply {
        text: state.text,
        usage,
        billed_tokens,
        tokens: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A backend dropped on another runtime's thread (a server that held
    /// it) shuts its own runtime down without blocking, and so without
    /// tokio's "cannot drop a runtime" panic.
    #[test]
    fn a_backend_dropped_inside_another_runtime_does_not_panic() {
        let backend = OpenAiBackend::new(OpenAiConfig::new(
            "m",
            vec![crate::config::EndpointConfig::new("http://127.0.0.1:9/v1")],
        ))
        .expect("builds");
        let outer = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .expect("runtime");
        outer.block_on(async move {
            tokio::spawn(async move { drop(backend) })
                .await
                .expect("the task ends without a panic");
        });
    }

    /// A pool is keyed by the weights its endpoints name only when they all
    /// name the same; one naming others, or one that cannot say beside
    /// ones that can, is an error naming each endpoint.
    #[test]
    fn a_pool_names_its_weights_only_when_every_endpoint_agrees() {
        let ok = |s: &str| Ok::<String, String>(s.to_owned());
        let no = |s: &str| Err::<String, String>(s.to_owned());
        let pool = |answers: &[(&str, Result<String, String>)]| {
            let answers: Vec<(String, Result<String, String>)> = answers
                .iter()
                .map(|(b, a)| ((*b).to_owned(), a.clone()))
                .collect();
            pool_verdict("m", &answers)
        };
        assert_eq!(pool(&[("a", ok("m#1"))]), Ok(Some("m#1".into())));
        assert_eq!(pool(&[("a", no("404"))]), Ok(None));
        assert_eq!(
            pool(&[("a", ok("m#1")), ("b", ok("m#1"))]),
            Ok(Some("m#1".into()))
        );
        assert_eq!(pool(&[("a", no("404")), ("b", no("404"))]), Ok(None));
        let other = pool(&[("a", ok("m#1")), ("b", ok("m#2"))]).expect_err("other weights");
        assert!(
            other.contains("a serves `m#1`") && other.contains("b serves `m#2`"),
            "{other}"
        );
        let mute = pool(&[("a", ok("m#1")), ("b", no("its listing has no model `m`"))])
            .expect_err("one cannot say");
        assert!(
            mute.contains("b does not say what it serves (its listing has no model `m`)"),
            "{mute}"
        );
        assert!(
            pool(&[("a", no("404")), ("b", ok("m#1"))]).is_err(),
            "the first cannot say, the second can"
        );
    }

    #[test]
    fn usage_subtracts_cached_tokens() {
        let v = json!({
            "choices": [{"message": {"role": "assistant", "content": "{}"}}],
            "usage": {"prompt_tokens": 1200, "completion_tokens": 7,
                      "prompt_tokens_details": {"cached_tokens": 1024}}
        });
        let r = parse_completion(&v).expect("parses");
        assert_eq!(r.text, "{}");
        assert_eq!(
            r.usage,
            Usage {
                prompt_tokens: 176,
                cached_tokens: 1024,
                completion_tokens: 7,
                latency_ms: 0
            }
        );
        assert_eq!(r.billed_tokens, Some(1207));
    }

    #[test]
    fn missing_usage_and_refusals() {
        let v = json!({"choices": [{"message": {"content": "x"}}]});
        let r = parse_completion(&v).expect("parses");
        assert_eq!(r.usage, Usage::default());
        assert_eq!(r.billed_tokens, None);
        let v = json!({"choices": [{"message": {"content": null, "refusal": "no"}}]});
        assert!(matches!(parse_completion(&v), Err(Fault::Invalid(m)) if m.contains("refused")));
        assert!(matches!(
            parse_completion(&json!({})),
            Err(Fault::Invalid(_))
        ));
    }

    #[test]
    fn sse_events_split_anywhere() {
        let events = concat!(
            ": keep-alive\n\n",
            "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"content\":\"{\\\"a\\\":\"}}]}\r\n\r\n",
            "data: {\"choices\":[{\"delta\":{\"content\":\"1}\"}}]}\n\n",
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":3,",
            "\"prompt_tokens_details\":{\"cached_tokens\":8}}}\n\n",
            "data: [DONE]\n\n",
        )
        .as_bytes();
        for split in [1, 3, 7, events.len()] {
            let mut s = StreamState::default();
            for chunk in events.chunks(split) {
                s.feed(chunk).expect("feeds");
            }
            assert!(s.done);
            assert_eq!(s.text, "{\"a\":1}");
            let (u, billed) = s.usage.expect("usage");
            assert_eq!(
                (u.prompt_tokens, u.cached_tokens, u.completion_tokens),
                (2, 8, 3)
            );
            assert_eq!(billed, Some(13));
        }
    }
}
