//! A loopback provider with OpenAI's Batch API (`POST /files`, `POST
//! /batches`, `GET /batches/{id}`, `GET /files/{id}/content`) whose model is
//! any fanfold backend, for the ladder's provider-batching strategy: the
//! requests go through fanfold's real batch path (upload, create, poll,
//! read back, map results to units by `custom_id`) and are answered by the
//! same model the other strategies ran on, so the row's answers and tokens
//! are that model's. What it cannot show is a provider's queueing: a real
//! batch answers within hours and costs less; this one answers as fast as
//! the model runs, and its price is whatever the model's is.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use anyhow::{Context, Result};
use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use fanfold_model::{BackendInfo, CallError, ModelBackend, Request};
use fanfold_testkit::wire::{json_reply as reply, multipart_batch_file, record_of, user_content};
use fanfold_testkit::{QueueJob, Server};
use serde_json::{Value, json};

/// A batch's progress: running until the model has answered every line.
enum Progress {
    Running,
    Done,
    Failed(String),
}

struct Shared {
    /// The model's identity, read once at start (asking it inside the
    /// server's runtime could block on the model's own).
    model_id: String,
    model: Box<dyn ModelBackend>,
    slots: usize,
    files: Mutex<HashMap<String, Vec<u8>>>,
    batches: Mutex<BTreeMap<String, Progress>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The provider, serving on loopback until dropped.
pub struct LoopbackBatches {
    server: Server,
    info: BackendInfo,
}

impl LoopbackBatches {
    pub fn start(model: Box<dyn ModelBackend>, slots: usize) -> Result<LoopbackBatches> {
        let info = model.info();
        let shared = Arc::new(Shared {
            model_id: info.model_id.clone(),
            model,
            slots: slots.max(1),
            files: Mutex::new(HashMap::new()),
            batches: Mutex::new(BTreeMap::new()),
        });
        let server = Server::start(Router::new().fallback(handle).with_state(shared))
            .context("starting the loopback batch provider")?;
        Ok(LoopbackBatches { server, info })
    }

    /// The base URL an `openai` backend points at, with `/v1`.
    pub fn base_url(&self) -> String {
        self.server.openai_url()
    }

    /// The model behind the provider.
    pub fn model(&self) -> &BackendInfo {
        &self.info
    }
}

async fn handle(
    State(st): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_owned();
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    match (method.as_str(), segments.as_slice()) {
        ("POST", ["v1", "files"]) => {
            let Some(file) = multipart_batch_file(&headers, &body) else {
                return reply(
                    StatusCode::BAD_REQUEST,
                    json!({"error": {"message": "no file with purpose batch"}}),
                );
            };
            let mut files = lock(&st.files);
            let id = format!("file-in-{}", files.len());
            files.insert(id.clone(), file);
            reply(StatusCode::OK, json!({"id": id, "object": "file"}))
        }
        ("POST", ["v1", "batches"]) => {
            let req: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let file_id = req
                .get("input_file_id")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let Some(file) = lock(&st.files).get(file_id).cloned() else {
                return reply(
                    StatusCode::NOT_FOUND,
                    json!({"error": {"message": format!("no file {file_id}")}}),
                );
            };
            let id = {
                let mut batches = lock(&st.batches);
                let id = format!("batch_{}", batches.len() + 1);
                batches.insert(id.clone(), Progress::Running);
                id
            };
            let (worker, batch) = (st.clone(), id.clone());
            // The model runs on its own threads; the server keeps answering
            // polls meanwhile.
            tokio::task::spawn_blocking(move || {
                let progress = match answer(&worker, &batch, &file) {
                    Ok(()) => Progress::Done,
                    Err(e) => Progress::Failed(e),
                };
                lock(&worker.batches).insert(batch, progress);
            });
            reply(StatusCode::OK, json!({"id": id, "status": "validating"}))
        }
        // The one model behind the provider, named by its own identity, so
        // a backend pointed here names the weights that answer.
        ("GET", ["v1", "models"]) => {
            let id = st.model_id.clone();
            reply(
                StatusCode::OK,
                json!({"object": "list", "data": [{"id": id, "object": "model", "owned_by": "fanfold"}]}),
            )
        }
        ("GET", ["v1", "batches", id]) => match lock(&st.batches).get(*id) {
            None => reply(
                StatusCode::NOT_FOUND,
                json!({"error": {"message": "no such batch"}}),
            ),
            Some(Progress::Running) => {
                reply(StatusCode::OK, json!({"id": id, "status": "in_progress"}))
            }
            Some(Progress::Done) => reply(
                StatusCode::OK,
                json!({"id": id, "status": "completed", "output_file_id": format!("{id}-out")}),
            ),
            Some(Progress::Failed(e)) => reply(
                StatusCode::OK,
                json!({"id": id, "status": "failed", "errors": {"data": [{"message": e}]}}),
            ),
        },
        ("GET", ["v1", "files", file, "content"]) => match lock(&st.files).get(*file) {
            Some(bytes) => (StatusCode::OK, bytes.clone()).into_response(),
            None => reply(
                StatusCode::NOT_FOUND,
                json!({"error": {"message": "no such file"}}),
            ),
        },
        _ => reply(
            StatusCode::NOT_FOUND,
            json!({"error": {"message": format!("no route {path}")}}),
        ),
    }
}

/// One batch line as the model sees it.
struct Line {
    custom_id: String,
    system: String,
    request: Request,
}

fn parse_line(n: usize, line: &[u8]) -> Result<Line, String> {
    let v: Value =
        serde_json::from_slice(line).map_err(|e| format!("line {}: not JSON: {e}", n + 1))?;
    let custom_id = v
        .get("custom_id")
        .and_then(Value::as_str)
        .ok_or_else(|| format!("line {}: no custom_id", n + 1))?
        .to_owned();
    let body = v.get("body").unwrap_or(&Value::Null);
    let system = body
        .get("messages")
        .and_then(Value::as_array)
        .and_then(|m| m.iter().find(|m| m.get("role") == Some(&json!("system"))))
        .and_then(|m| m.get("content"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let suffix = user_content(body)
        .ok_or_else(|| format!("line {}: no user message", n + 1))?
        .to_owned();
    let (unit_id, input) = record_of(&suffix).unwrap_or_else(|| (custom_id.clone(), Value::Null));
    let max_output_tokens = ["max_tokens", "max_completion_tokens"]
        .iter()
        .find_map(|k| body.get(*k).and_then(Value::as_u64))
        .and_then(|t| u32::try_from(t).ok())
        .unwrap_or(256);
    let schema = body
        .pointer("/response_format/schema")
        .or_else(|| body.pointer("/response_format/json_schema/schema"))
        .cloned();
    Ok(Line {
        custom_id,
        system,
        request: Request {
            index: n,
            unit_id,
            suffix,
            input,
            attempt: 1,
            max_output_tokens,
            schema,
        },
    })
}

/// Runs every line of `file` through the model, one job per system prompt
/// (a stage's shared prefix), and stores the output file.
fn answer(st: &Shared, batch: &str, file: &[u8]) -> Result<(), String> {
    let lines: Vec<Line> = file
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .enumerate()
        .map(|(n, l)| parse_line(n, l))
        .collect::<Result<_, _>>()?;
    let mut by_prefix: BTreeMap<&str, Vec<&Line>> = BTreeMap::new();
    for line in &lines {
        by_prefix.entry(&line.system).or_default().push(line);
    }
    let mut out = Vec::new();
    for (prefix, group) in by_prefix {
        let requests = group.iter().map(|l| l.request.clone()).collect();
        let mut job = QueueJob::new(prefix, requests, st.slots);
        if let Some(schema) = group.first().and_then(|l| l.request.schema.clone()) {
            job = job.with_schema(schema);
        }
        st.model.run(&job).map_err(|e| e.to_string())?;
        let ids: HashMap<usize, &str> = group
            .iter()
            .map(|l| (l.request.index, l.custom_id.as_str()))
            .collect();
        for done in job.finished() {
            let custom_id = ids.get(&done.request.index).copied().unwrap_or_default();
            let line = match done.result {
                Ok(c) => json!({"custom_id": custom_id, "error": null, "response": {
                    "status_code": 200,
                    "body": {
                        "choices": [{"index": 0, "message": {"role": "assistant", "content": c.text}}],
                        "usage": {
                            "prompt_tokens": c.usage.prompt_tokens + c.usage.cached_tokens,
                            "completion_tokens": c.usage.completion_tokens,
                            "prompt_tokens_details": {"cached_tokens": c.usage.cached_tokens},
                        },
                    },
                }}),
                Err(e) => {
                    let code = match e {
                        CallError::Timeout { .. } => "timeout",
                        _ => "server_error",
                    };
                    json!({"custom_id": custom_id, "response": null,
                           "error": {"code": code, "message": e.to_string()}})
                }
            };
            out.extend(line.to_string().into_bytes());
            out.push(b'\n');
        }
    }
    lock(&st.files).insert(format!("{batch}-out"), out);
    Ok(())
}
