//! An in-process provider for the backend tests: an axum server on
//! 127.0.0.1:0 that speaks just enough of both APIs and injects faults per
//! unit, plus a raw TCP server that drops every connection unanswered.

#![allow(dead_code, clippy::indexing_slicing)]

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use fanfold_model::{CallError, Completion, Request};
use fanfold_testkit::{QueueJob, Server};
use serde_json::{Value, json};

/// What the server does with one request.
#[derive(Clone, Debug)]
pub enum Action {
    Ok,
    /// A success with extra response headers.
    OkWithHeaders(Vec<(&'static str, String)>),
    Status(u16, Option<&'static str>),
    /// Answers after this long.
    Slow(u64),
    /// Declares a longer body than it sends, then closes.
    Truncate,
    /// Starts a chunked body, then aborts the connection.
    Abort,
    /// A whole 200 body that is not JSON.
    Garbage,
    /// 401 whose body echoes the credentials it was sent, as some
    /// providers do.
    EchoAuth401,
    /// 200 whose answer echoes the credentials it was sent.
    EchoAuth200,
    /// 200 whose body is this many bytes, chunked (no length announced).
    Huge(usize),
}

#[derive(Clone, Debug)]
pub struct Hit {
    pub unit: String,
    pub path: String,
    pub headers: HeaderMap,
    pub body: Value,
    pub at: Instant,
    pub start_seq: u64,
}

#[derive(Default)]
pub struct MockState {
    plans: Mutex<HashMap<String, VecDeque<Action>>>,
    /// For units without a plan.
    default: Mutex<Option<Action>>,
    pub hits: Mutex<Vec<Hit>>,
    /// Sequence numbers at which each hit's handler finished, by hit index.
    pub ends: Mutex<HashMap<usize, u64>>,
    seq: AtomicU64,
    in_flight: AtomicUsize,
    pub max_in_flight: AtomicUsize,
    served_prefix: AtomicBool,
    /// Handler delay for successes, to make overlap likely.
    pub delay_ms: AtomicU64,
    /// What `GET /v1/models` lists (404 when unset); never a hit.
    pub models: Mutex<Option<Value>>,
}

pub struct Mock {
    pub addr: SocketAddr,
    pub state: Arc<MockState>,
    _server: Server,
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("mock runtime")
}

impl Mock {
    pub fn start() -> Mock {
        let state = Arc::new(MockState::default());
        let app = Router::new().fallback(handle).with_state(state.clone());
        let server = Server::start(app).expect("mock server");
        Mock {
            addr: server.addr,
            state,
            _server: server,
        }
    }

    /// The OpenAI-style base URL (with `/v1`).
    pub fn openai_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    pub fn anthropic_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Actions for successive requests of `unit`; after they run out, or
    /// for units without a plan, the last action repeats.
    pub fn plan(&self, unit: &str, actions: Vec<Action>) {
        self.state
            .plans
            .lock()
            .expect("plans")
            .insert(unit.to_owned(), actions.into());
    }

    /// What units without a plan get (a success unless set).
    pub fn set_default(&self, action: Action) {
        *self.state.default.lock().expect("default") = Some(action);
    }

    pub fn hits(&self) -> Vec<Hit> {
        self.state.hits.lock().expect("hits").clone()
    }

    pub fn hits_for(&self, unit: &str) -> usize {
        self.hits().iter().filter(|h| h.unit == unit).count()
    }

    pub fn max_in_flight(&self) -> usize {
        self.state.max_in_flight.load(Ordering::SeqCst)
    }
}

fn unit_of(body: &Value) -> String {
    body.get("messages")
        .and_then(Value::as_array)
        .and_then(|m| m.last())
        .and_then(|m| m.get("content"))
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned()
}

struct InFlight<'a>(&'a MockState, usize);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
        let seq = self.0.seq.fetch_add(1, Ordering::SeqCst);
        self.0.ends.lock().expect("ends").insert(self.1, seq);
    }
}

async fn handle(
    State(st): State<Arc<MockState>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if uri.path().ends_with("/models") {
        return match st.models.lock().expect("models").clone() {
            Some(listing) => (StatusCode::OK, axum::Json(listing)).into_response(),
            None => (StatusCode::NOT_FOUND, "no listing").into_response(),
        };
    }
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let unit = unit_of(&body);
    let now = st.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    st.max_in_flight.fetch_max(now, Ordering::SeqCst);
    let start_seq = st.seq.fetch_add(1, Ordering::SeqCst);
    let index = {
        let mut hits = st.hits.lock().expect("hits");
        hits.push(Hit {
            unit: unit.clone(),
            path: uri.path().to_owned(),
            headers: headers.clone(),
            body: body.clone(),
            at: Instant::now(),
            start_seq,
        });
        hits.len() - 1
    };
    let _guard = InFlight(&st, index);
    let action = {
        let mut plans = st.plans.lock().expect("plans");
        match plans.get_mut(&unit) {
            Some(q) if q.len() > 1 => q.pop_front().unwrap_or(Action::Ok),
            Some(q) => q.front().cloned().unwrap_or(Action::Ok),
            None => st
                .default
                .lock()
                .expect("default")
                .clone()
                .unwrap_or(Action::Ok),
        }
    };
    let anthropic = uri.path().ends_with("/messages");
    match action {
        Action::Ok => success(&st, &body, &unit, anthropic, Vec::new()).await,
        Action::OkWithHeaders(h) => success(&st, &body, &unit, anthropic, h).await,
        Action::Slow(ms) => {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            success(&st, &body, &unit, anthropic, Vec::new()).await
        }
        Action::Status(code, retry_after) => {
            let mut r = (
                StatusCode::from_u16(code).expect("status"),
                json!({"error": {"message": format!("injected {code}"), "type": "injected"}})
                    .to_string(),
            )
                .into_response();
            if let Some(ra) = retry_after {
                r.headers_mut()
                    .insert(header::RETRY_AFTER, ra.parse().expect("header"));
            }
            r
        }
        Action::Truncate => Response::builder()
            .status(200)
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::CONTENT_LENGTH, "1000")
            .body(cut_body(false))
            .expect("response"),
        Action::Abort => Response::builder()
            .status(200)
            .header(header::CONTENT_TYPE, "application/json")
            .body(cut_body(true))
            .expect("response"),
        Action::Garbage => (StatusCode::OK, "<html>gateway says hello</html>").into_response(),
        Action::EchoAuth200 => {
            let sent = headers
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_owned();
            let content = json!({"decision": "yes", "note": format!("you sent {sent}")});
            (
                StatusCode::OK,
                json!({"id": "c", "object": "chat.completion", "model": "m",
                       "choices": [{"index": 0, "finish_reason": "stop",
                                    "message": {"role": "assistant", "content": content.to_string()}}]})
                .to_string(),
            )
                .into_response()
        }
        Action::Huge(n) => {
            let chunks = (0..n.div_ceil(4096))
                .map(|_| Ok::<_, std::io::Error>(axum::body::Bytes::from(vec![b' '; 4096])));
            Response::builder()
                .status(200)
                .body(axum::body::Body::from_stream(futures_util::stream::iter(
                    chunks,
                )))
                .expect("response")
        }
        Action::EchoAuth401 => {
            let sent = headers
                .get(header::AUTHORIZATION)
                .or_else(|| headers.get("x-api-key"))
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_owned();
            (
                StatusCode::UNAUTHORIZED,
                json!({"error": {"message": format!("Incorrect API key provided: {sent}")}})
                    .to_string(),
            )
                .into_response()
        }
    }
}

/// A body that sends its start, pauses so the headers and that start
/// reach the client, then ends early (or fails, aborting the connection).
fn cut_body(fail: bool) -> Body {
    let stream = futures_util::stream::unfold(0u8, move |step| async move {
        match step {
            0 => Some((
                Ok::<_, std::io::Error>(Bytes::from_static(b"{\"choices\": [{\"mess")),
                1,
            )),
            1 => {
                tokio::time::sleep(Duration::from_millis(30)).await;
                fail.then(|| (Err(std::io::Error::other("injected abort")), 2))
            }
            _ => None,
        }
    });
    Body::from_stream(stream)
}

async fn success(
    st: &MockState,
    body: &Value,
    unit: &str,
    anthropic: bool,
    extra: Vec<(&'static str, String)>,
) -> Response {
    let delay = st.delay_ms.load(Ordering::SeqCst);
    if delay > 0 {
        tokio::time::sleep(Duration::from_millis(delay)).await;
    }
    // The first answer evaluates the whole prompt; later ones find the
    // shared prefix in the cache.
    let cached = if st.served_prefix.swap(true, Ordering::SeqCst) {
        64
    } else {
        0
    };
    let answer = json!({"unit": unit});
    let mut response = if anthropic {
        let v = json!({
            "id": "msg_1", "type": "message", "role": "assistant",
            "content": [
                {"type": "text", "text": "Recording."},
                {"type": "tool_use", "id": "toolu_1", "name": "emit", "input": answer}
            ],
            "stop_reason": "tool_use",
            "usage": {"input_tokens": 36, "cache_creation_input_tokens": 64 - cached,
                      "cache_read_input_tokens": cached, "output_tokens": 5}
        });
        (StatusCode::OK, v.to_string()).into_response()
    } else if body.get("stream").and_then(Value::as_bool) == Some(true) {
        let text = answer.to_string();
        let (a, b) = text.split_at(text.len() / 2);
        let mut sse = String::new();
        sse.push_str(": keep-alive\n\n");
        for part in ["", a, b] {
            sse.push_str(&format!(
                "data: {}\n\n",
                json!({"choices": [{"index": 0, "delta": {"content": part}}]})
            ));
        }
        sse.push_str(&format!(
            "data: {}\n\ndata: [DONE]\n\n",
            json!({"choices": [], "usage": {"prompt_tokens": 100, "completion_tokens": 5,
                   "prompt_tokens_details": {"cached_tokens": cached}}})
        ));
        Response::builder()
            .header(header::CONTENT_TYPE, "text/event-stream")
            .body(Body::from(sse))
            .expect("response")
    } else {
        let mut v = json!({
            "id": "chatcmpl-1", "object": "chat.completion",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": answer.to_string()}}],
            "usage": {"prompt_tokens": 100, "completion_tokens": 5,
                      "prompt_tokens_details": {"cached_tokens": cached}}
        });
        // Asked for log probabilities: the answer's three tokens, the
        // unit's name three times likelier than "zz" where it begins.
        if body.get("logprobs").and_then(Value::as_bool) == Some(true) {
            let token = |t: &str| json!({"token": t, "logprob": 0.0, "top_logprobs": []});
            v["choices"][0]["logprobs"] = json!({"content": [
                token("{\"unit\":\""),
                {"token": unit, "logprob": 0.75f64.ln(), "top_logprobs": [
                    {"token": unit, "logprob": 0.75f64.ln()},
                    {"token": "zz", "logprob": 0.25f64.ln()}
                ]},
                token("\"}")
            ]});
        }
        (StatusCode::OK, v.to_string()).into_response()
    };
    for (k, v) in extra {
        response
            .headers_mut()
            .insert(k, v.parse().expect("header value"));
    }
    response
}

/// A server that reads each request and closes the connection without a
/// word.
pub struct DropServer {
    pub addr: SocketAddr,
    pub hits: Arc<AtomicUsize>,
    runtime: tokio::runtime::Runtime,
}

impl DropServer {
    pub fn start() -> DropServer {
        let rt = runtime();
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let hits = Arc::new(AtomicUsize::new(0));
        let counter = hits.clone();
        rt.spawn(async move {
            use tokio::io::AsyncReadExt;
            while let Ok((mut socket, _)) = listener.accept().await {
                let counter = counter.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 65536];
                    let mut seen = Vec::new();
                    // Read up to the end of the headers, count, close.
                    while let Ok(n) = socket.read(&mut buf).await {
                        if n == 0 {
                            return;
                        }
                        seen.extend_from_slice(&buf[..n]);
                        if seen.windows(4).any(|w| w == b"\r\n\r\n") {
                            counter.fetch_add(1, Ordering::SeqCst);
                            return;
                        }
                    }
                });
            }
        });
        DropServer {
            addr,
            hits,
            runtime: rt,
        }
    }
}

pub fn job_schema() -> Value {
    json!({
        "type": "object",
        "properties": {"unit": {"type": "string"}},
        "required": ["unit"],
        "additionalProperties": false
    })
}

/// A job whose units answer with their own id.
pub fn job(units: &[&str], slots: usize) -> QueueJob {
    let requests = units
        .iter()
        .enumerate()
        .map(|(i, u)| Request {
            index: i,
            unit_id: (*u).to_owned(),
            suffix: (*u).to_owned(),
            input: json!({"id": u}),
            attempt: 1,
            max_output_tokens: 64,
            schema: Some(json!({
                "type": "object",
                "properties": {"unit": {"const": u}},
                "required": ["unit"]
            })),
        })
        .collect();
    QueueJob::new(
        "You are a careful reader. Answer with JSON.\nRubric: report the unit id.",
        requests,
        slots,
    )
    .with_schema(job_schema())
}

pub fn numbered(n: usize, slots: usize) -> QueueJob {
    let names: Vec<String> = (0..n).map(|i| format!("u{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    job(&refs, slots)
}

/// Every handed-out request came back exactly once, within the slots;
/// the results by unit id.
pub fn outcomes(job: &QueueJob) -> HashMap<String, Result<Completion, CallError>> {
    let breaches = job.contract_breaches();
    assert!(
        breaches.is_empty(),
        "the backend broke the job's contract: {breaches:?}"
    );
    job.finished()
        .into_iter()
        .map(|f| (f.request.unit_id, f.result))
        .collect()
}
