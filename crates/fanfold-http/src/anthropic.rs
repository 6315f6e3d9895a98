//! The Anthropic Messages API (`/v1/messages`).

use std::fmt;

use fanfold_model::{BackendError, BackendInfo, CallError, Job, ModelBackend, Request, Usage};
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use serde_json::{Map, Value, json};

use crate::batch::{
    BatchApi, BatchConfig, BatchHttp, BatchStatus, LineOutcome, invalid_reply, line_error,
    result_lines,
};
use crate::config::{AnthropicConfig, OutputMode};
use crate::secret::ApiKey;
use crate::transport::{Fault, Protocol, Reply, Transport, parse_json, read_body};
use crate::{HttpError, HttpStats};

/// The single tool structured output is forced through.
const TOOL: &str = "emit";
const API_VERSION: &str = "2023-06-01";

pub(crate) struct AnthropicProtocol {
    config: AnthropicConfig,
}

/// A backend for the Anthropic Messages API.
///
/// The job's prefix is the system block, marked `cache_control:
/// ephemeral` so later requests read it from Anthropic's prompt cache;
/// structured output is a forced call of a single tool whose input schema
/// is the job's output schema, and the tool's input is the answer text.
pub struct AnthropicBackend {
    transport: Transport<AnthropicProtocol>,
}

impl AnthropicBackend {
    /// Holds the endpoints' `requests_per_minute` and `tokens_per_minute`
    /// in `ledger` as well, shared with every process that uses it (a
    /// fleet's workers), so together they stay within them.
    pub fn share_rates(&mut self, ledger: std::sync::Arc<dyn fanfold_model::SharedRates>) {
        self.transport.share_rates(ledger);
    }

    /// Reads each endpoint's key from its environment variable, checks the
    /// configuration, and starts the backend's runtime.
    pub fn new(config: AnthropicConfig) -> Result<AnthropicBackend, HttpError> {
        if config.model.trim().is_empty() {
            return Err(HttpError::Config("model is empty".into()));
        }
        if let Some(t) = config.temperature
            && !(t.is_finite() && (0.0..=1.0).contains(&t))
        {
            return Err(HttpError::Config(format!(
                "temperature {t} is outside Anthropic's range 0..=1"
            )));
        }
        let transport = config.transport.clone();
        Ok(AnthropicBackend {
            transport: Transport::new(AnthropicProtocol { config }, transport)?,
        })
    }

    pub fn config(&self) -> &AnthropicConfig {
        &self.transport.protocol.config
    }

    /// Counters since the backend was built.
    pub fn stats(&self) -> HttpStats {
        self.transport.stats()
    }
}

impl fmt::Debug for AnthropicBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The config holds only the names of key variables; keys live in
        // the transport, which is not printed.
        f.debug_struct("AnthropicBackend")
            .field("config", self.config())
            .finish_non_exhaustive()
    }
}

impl ModelBackend for AnthropicBackend {
    fn info(&self) -> BackendInfo {
        BackendInfo {
            kind: "anthropic".into(),
            model_id: format!("{}/{}", self.transport.primary_host(), self.config().model),
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

/// Message Batches: one `POST /v1/messages/batches` with every request's
/// params, polled at `GET /v1/messages/batches/{id}`, results read as JSONL
/// from the batch's `results_url`.
impl BatchApi for AnthropicProtocol {
    const PROVIDER: &'static str = "anthropic";
    const MAX_REQUESTS: usize = 100_000;

    async fn create(
        &self,
        http: &BatchHttp<'_>,
        _cfg: &BatchConfig,
        items: &[(String, Value)],
    ) -> Result<String, Fault> {
        let requests: Vec<Value> = items
            .iter()
            .map(|(custom_id, params)| json!({"custom_id": custom_id, "params": params}))
            .collect();
        let v = http
            .post_json(&http.url(BATCHES), &json!({ "requests": requests }))
            .await?;
        v.get("id")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| Fault::Invalid("the created batch has no id".into()))
    }

    async fn status(&self, http: &BatchHttp<'_>, id: &str) -> Result<BatchStatus, Fault> {
        let v = http.get_json(&http.url(&format!("{BATCHES}/{id}"))).await?;
        let state = v
            .get("processing_status")
            .and_then(Value::as_str)
            .ok_or_else(|| Fault::Invalid("the batch has no processing_status".into()))?
            .to_owned();
        let ended = state == "ended";
        let results = v.get("results_url").and_then(Value::as_str);
        if ended && results.is_none() {
            return Err(Fault::Invalid(format!(
                "batch {id} ended without a results_url"
            )));
        }
        Ok(BatchStatus {
            state,
            ended,
            outputs: results.map(str::to_owned).into_iter().collect(),
            failure: None,
        })
    }

    async fn results(
        &self,
        http: &BatchHttp<'_>,
        status: &BatchStatus,
    ) -> Result<Vec<(String, LineOutcome)>, Fault> {
        let mut out = Vec::new();
        for url in &status.outputs {
            let url = same_origin(http.base, url)?;
            let bytes = http
                .send(|| http.client.get(url.clone()).headers(http.headers.clone()))
                .await?;
            for (custom_id, v) in result_lines(&bytes, "batch results")? {
                out.push((custom_id, self.batch_line(&v)));
            }
        }
        Ok(out)
    }
}

const BATCHES: &str = "/v1/messages/batches";

impl AnthropicProtocol {
    fn batch_line(&self, v: &Value) -> LineOutcome {
        let result = v.get("result").unwrap_or(&Value::Null);
        match result.get("type").and_then(Value::as_str) {
            Some("succeeded") => {
                let message = result.get("message").unwrap_or(&Value::Null);
                parse_message(message, self.config.output).map_err(invalid_reply)
            }
            Some("errored") => {
                let e = result.pointer("/error/error").unwrap_or(&Value::Null);
                let kind = e.get("type").and_then(Value::as_str).unwrap_or("errored");
                Err(line_error(kind, e))
            }
            Some(kind) => Err(line_error(
                kind,
                &json!({"message": format!("the request was {kind}")}),
            )),
            None => Err(CallError::InvalidResponse(
                "a batch result without a result type".into(),
            )),
        }
    }
}

/// The results URL, refused unless it is on the configured API's origin:
/// the API key goes with the request.
fn same_origin(base: &str, url: &str) -> Result<reqwest::Url, Fault> {
    let base = reqwest::Url::parse(base)
        .map_err(|e| Fault::Invalid(format!("base URL does not parse: {e}")))?;
    let url = base
        .join(url)
        .map_err(|e| Fault::Invalid(format!("results_url does not parse: {e}")))?;
    if url.origin() != base.origin() {
        return Err(Fault::Invalid(format!(
            "results_url is on {}, not the API's origin; the key is not sent there",
            url.origin().ascii_serialization()
        )));
    }
    Ok(url)
}

impl Protocol for AnthropicProtocol {
    fn path(&self) -> &'static str {
        "/v1/messages"
    }

    fn headers(&self, key: Option<&ApiKey>) -> Result<HeaderMap, HttpError> {
        let mut h = HeaderMap::new();
        h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        h.insert(
            HeaderName::from_static("anthropic-version"),
            HeaderValue::from_static(API_VERSION),
        );
        if let Some(key) = key {
            let mut v = HeaderValue::from_str(key.expose()).map_err(|_| {
                HttpError::Config(
                    "the API key contains characters not allowed in an HTTP header".into(),
                )
            })?;
            v.set_sensitive(true);
            h.insert(HeaderName::from_static("x-api-key"), v);
        }
        Ok(h)
    }

    fn body(&self, job: &dyn Job, request: &Request) -> Value {
        let c = &self.config;
        let mut body = Map::new();
        body.insert("model".into(), json!(c.model));
        body.insert("max_tokens".into(), json!(request.max_output_tokens));
        body.insert(
            "messages".into(),
            json!([{"role": "user", "content": request.suffix}]),
        );
        if !job.prefix().is_empty() {
            let mut block = Map::new();
            block.insert("type".into(), json!("text"));
            block.insert("text".into(), json!(job.prefix()));
            if c.cache_prefix {
                block.insert("cache_control".into(), json!({"type": "ephemeral"}));
            }
            body.insert("system".into(), json!([block]));
        }
        if let Some(t) = c.temperature {
            body.insert("temperature".into(), json!(t));
        }
        // The job's schema, not the request's: tools come before the system
        // block in the cached prefix, so they must not vary per request.
        let schema = job.output_schema().or(request.schema.as_ref());
        // Anthropic has no JSON mode: any constrained mode is the tool.
        if c.output != OutputMode::Prompt
            && let Some(schema) = schema
        {
            body.insert(
                "tools".into(),
                json!([{
                    "name": TOOL,
                    "description": "Record the answer. Call this exactly once with the complete answer.",
                    "input_schema": schema,
                }]),
            );
            body.insert("tool_choice".into(), json!({"type": "tool", "name": TOOL}));
        }
        Value::Object(body)
    }

    async fn read(&self, response: reqwest::Response, limit: u64) -> Result<Reply, Fault> {
        let bytes = read_body(response, limit).await?;
        parse_message(&parse_json(&bytes)?, self.config.output)
    }
}

/// Usage as Anthropic reports it: `input_tokens` excludes both cache reads
/// and cache writes. Writes were evaluated, reads were not.
fn usage(v: &Value) -> (Usage, Option<u64>) {
    let Some(u) = v.get("usage").filter(|u| u.is_object()) else {
        return (Usage::default(), None);
    };
    let n = |k: &str| u.get(k).and_then(Value::as_u64).unwrap_or(0);
    let input = n("input_tokens");
    let write = n("cache_creation_input_tokens");
    let read = n("cache_read_input_tokens");
    let output = n("output_tokens");
    (
        Usage {
            prompt_tokens: input.saturating_add(write),
            cached_tokens: read,
            completion_tokens: output,
            latency_ms: 0,
        },
        Some(
            input
                .saturating_add(write)
                .saturating_add(read)
                .saturating_add(output),
        ),
    )
}

fn parse_message(v: &Value, mode: OutputMode) -> Result<Reply, Fault> {
    if v.get("type").and_then(Value::as_str) == Some("error") {
        let m = v
            .pointer("/error/message")
            .and_then(Value::as_str)
            .unwrap_or("no message");
        return Err(Fault::Invalid(format!("error object in a 200 answer: {m}")));
    }
    let content = v
        .get("content")
        .and_then(Value::as_array)
        .ok_or_else(|| Fault::Invalid("no content array in the answer".into()))?;
    let tool_input = content.iter().find_map(|b| {
        (b.get("type").and_then(Value::as_str) == Some("tool_use")
            && b.get("name").and_then(Value::as_str) == Some(TOOL))
        .then(|| b.get("input"))
        .flatten()
    });
    let text = match (mode, tool_input) {
        (_, Some(input)) => input.to_string(),
        (OutputMode::JsonSchema | OutputMode::JsonObject, None) => {
            return Err(Fault::Invalid(format!(
                "no {TOOL} tool_use block in the answer (stop_reason {})",
                v.get("stop_reason").unwrap_or(&Value::Null)
            )));
        }
        (OutputMode::Prompt, None) => content
            .iter()
            .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
            .filter_map(|b| b.get("text").and_then(Value::as_str))
            .collect::<String>(),
    };
    let (usage, billed_tokens) = usage(v);
    Ok(Reply {
        text,
        usage,
        billed_tokens,
        tokens: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_input_is_the_text_and_usage_splits_cache() {
        let v = json!({
            "type": "message",
            "content": [{"type": "tool_use", "id": "t1", "name": "emit",
                         "input": {"decision": "yes", "n": 1}}],
            "stop_reason": "tool_use",
            "usage": {"input_tokens": 20, "cache_creation_input_tokens": 0,
                      "cache_read_input_tokens": 1500, "output_tokens": 12}
        });
        let r = parse_message(&v, OutputMode::JsonSchema).expect("parses");
        assert_eq!(r.text, r#"{"decision":"yes","n":1}"#);
        assert_eq!(
            r.usage,
            Usage {
                prompt_tokens: 20,
                cached_tokens: 1500,
                completion_tokens: 12,
                latency_ms: 0
            }
        );
        assert_eq!(r.billed_tokens, Some(1532));
    }

    #[test]
    fn text_mode_and_missing_tool() {
        let v = json!({"content": [{"type": "text", "text": "{\"a\":"}, {"type": "text", "text": "1}"}]});
        assert_eq!(
            parse_message(&v, OutputMode::Prompt).expect("parses").text,
            "{\"a\":1}"
        );
        assert!(matches!(
            parse_message(&v, OutputMode::JsonSchema),
            Err(Fault::Invalid(_))
        ));
    }
}
