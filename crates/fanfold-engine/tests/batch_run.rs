//! Batch execution end to end: a spec whose map stage has `execution =
//! "batch"` runs through an in-process server that speaks OpenAI's Batch
//! API (`/files`, `/batches`) and Anthropic's Message Batches, holds batches
//! pending on request, and fails single requests inside a batch.

// A failed step should fail the test loudly, right there.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use fanfold_core::Status;
use fanfold_engine::{NoProgress, Plan, RunOptions, RunReport};
use fanfold_http::PriceTable;
use fanfold_store::Store;
use serde_json::{Value, json};

use fanfold_testkit::Server;

const MODEL_OPENAI: &str = "gpt-4o-mini";
const MODEL_ANTHROPIC: &str = "claude-3-5-haiku";
const UNITS: usize = 12;

// ---------------------------------------------------------------------------
// The mock provider.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    /// The request's first line in a batch is an error line.
    ErrorOnce,
    /// The first answer's content is not JSON.
    MalformedOnce,
    /// The first answer has status 500 (OpenAI output files carry it).
    ServerErrorOnce,
    /// Every batch expires before reaching this request.
    Expired,
}

#[derive(Default)]
struct Batch {
    /// `(custom_id, request body)` in submission order.
    items: Vec<(String, Value)>,
    results: Option<Vec<Value>>,
}

#[derive(Default)]
struct MockState {
    hold: AtomicBool,
    faults: Mutex<HashMap<String, Fault>>,
    files: Mutex<HashMap<String, Vec<u8>>>,
    batches: Mutex<BTreeMap<String, Batch>>,
    /// How many batch lines each unit has been in.
    submitted: Mutex<HashMap<String, usize>>,
    creates: Mutex<usize>,
    /// Paths and credentials of every call.
    calls: Mutex<Vec<(String, HeaderMap)>>,
}

struct Mock {
    state: Arc<MockState>,
    server: Server,
}

impl Mock {
    fn start() -> Mock {
        let state = Arc::new(MockState::default());
        let server = Server::start(Router::new().fallback(handle).with_state(state.clone()))
            .expect("mock server");
        Mock { state, server }
    }

    fn port(&self) -> u16 {
        self.server.addr.port()
    }

    fn hold(&self, on: bool) {
        self.state.hold.store(on, Ordering::SeqCst);
    }

    fn fault(&self, unit: &str, f: Fault) {
        self.state
            .faults
            .lock()
            .expect("faults")
            .insert(unit.into(), f);
    }

    fn creates(&self) -> usize {
        *self.state.creates.lock().expect("creates")
    }

    fn lines(&self) -> usize {
        self.state
            .submitted
            .lock()
            .expect("submitted")
            .values()
            .sum()
    }
}

fn user_message(body: &Value) -> Option<(String, Value)> {
    fanfold_testkit::wire::record_of(fanfold_testkit::wire::user_content(body)?)
}

use fanfold_testkit::wire::json_reply as json_response;

async fn handle(
    State(st): State<Arc<MockState>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_owned();
    // No model listing: the identity stays host and alias.
    if path.ends_with("/models") {
        return (StatusCode::NOT_FOUND, "no listing").into_response();
    }
    st.calls
        .lock()
        .expect("calls")
        .push((path.clone(), headers.clone()));
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    match (method.as_str(), segments.as_slice()) {
        // OpenAI.
        ("POST", ["v1", "files"]) => {
            let Some(file) = fanfold_testkit::wire::multipart_batch_file(&headers, &body) else {
                return json_response(StatusCode::BAD_REQUEST, json!({"error": "no batch file"}));
            };
            let mut files = st.files.lock().expect("files");
            let id = format!("file-in-{}", files.len());
            files.insert(id.clone(), file);
            json_response(StatusCode::OK, json!({"id": id, "object": "file"}))
        }
        ("POST", ["v1", "batches"]) => {
            let req: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            assert_eq!(req["endpoint"], "/v1/chat/completions");
            let file_id = req["input_file_id"].as_str().unwrap_or_default();
            let Some(file) = st.files.lock().expect("files").get(file_id).cloned() else {
                return json_response(StatusCode::NOT_FOUND, json!({"error": "no such file"}));
            };
            let items = file
                .split(|b| *b == b'\n')
                .filter(|l| !l.is_empty())
                .map(|l| {
                    let v: Value = serde_json::from_slice(l).expect("batch line is JSON");
                    assert_eq!(v["url"], "/v1/chat/completions");
                    assert!(
                        v["body"].get("stream").is_none(),
                        "batch bodies never stream"
                    );
                    (
                        v["custom_id"].as_str().expect("custom_id").to_owned(),
                        v["body"].clone(),
                    )
                })
                .collect();
            let id = create(&st, items);
            json_response(StatusCode::OK, json!({"id": id, "status": "validating"}))
        }
        ("GET", ["v1", "batches", id]) => {
            let id = (*id).to_owned();
            match settle(&st, &id, false) {
                None => json_response(StatusCode::NOT_FOUND, json!({"error": "no such batch"})),
                Some(false) => {
                    json_response(StatusCode::OK, json!({"id": id, "status": "in_progress"}))
                }
                Some(true) => json_response(
                    StatusCode::OK,
                    json!({"id": id, "status": "completed",
                           "output_file_id": format!("{id}-out"),
                           "error_file_id": format!("{id}-err")}),
                ),
            }
        }
        ("GET", ["v1", "files", file, "content"]) => {
            match st.files.lock().expect("files").get(*file) {
                Some(bytes) => (StatusCode::OK, bytes.clone()).into_response(),
                None => json_response(StatusCode::NOT_FOUND, json!({"error": "no such file"})),
            }
        }
        // Anthropic.
        ("POST", ["v1", "messages", "batches"]) => {
            let req: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let items = req["requests"]
                .as_array()
                .expect("requests")
                .iter()
                .map(|r| {
                    (
                        r["custom_id"].as_str().expect("custom_id").to_owned(),
                        r["params"].clone(),
                    )
                })
                .collect();
            let id = create(&st, items);
            json_response(
                StatusCode::OK,
                json!({"id": id, "type": "message_batch", "processing_status": "in_progress"}),
            )
        }
        ("GET", ["v1", "messages", "batches", id]) => {
            let id = (*id).to_owned();
            let host = headers
                .get(header::HOST)
                .and_then(|h| h.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            match settle(&st, &id, true) {
                None => json_response(StatusCode::NOT_FOUND, json!({"error": "no such batch"})),
                Some(false) => json_response(
                    StatusCode::OK,
                    json!({"id": id, "processing_status": "in_progress", "results_url": null}),
                ),
                Some(true) => json_response(
                    StatusCode::OK,
                    json!({"id": id, "processing_status": "ended",
                           "results_url": format!("http://{host}/v1/messages/batches/{id}/results")}),
                ),
            }
        }
        ("GET", ["v1", "messages", "batches", id, "results"]) => {
            match st
                .files
                .lock()
                .expect("files")
                .get(&format!("{id}-results"))
            {
                Some(bytes) => (StatusCode::OK, bytes.clone()).into_response(),
                None => json_response(StatusCode::NOT_FOUND, json!({"error": "no results"})),
            }
        }
        _ => json_response(
            StatusCode::NOT_FOUND,
            json!({"error": format!("no route {path}")}),
        ),
    }
}

fn create(st: &MockState, items: Vec<(String, Value)>) -> String {
    let mut submitted = st.submitted.lock().expect("submitted");
    for (_, body) in &items {
        let (unit, _) = user_message(body).expect("a record in every request");
        *submitted.entry(unit).or_default() += 1;
    }
    let mut creates = st.creates.lock().expect("creates");
    *creates += 1;
    let id = format!("batch_{}", *creates);
    st.batches.lock().expect("batches").insert(
        id.clone(),
        Batch {
            items,
            results: None,
        },
    );
    id
}

/// Whether the batch has ended; computes its results the first time.
fn settle(st: &MockState, id: &str, anthropic: bool) -> Option<bool> {
    let mut batches = st.batches.lock().expect("batches");
    let batch = batches.get_mut(id)?;
    if st.hold.load(Ordering::SeqCst) {
        return Some(false);
    }
    if batch.results.is_some() {
        return Some(true);
    }
    let faults = st.faults.lock().expect("faults").clone();
    let mut lines = Vec::new();
    for (custom_id, body) in &batch.items {
        let (unit, record) = user_message(body).expect("record");
        // Faults marked "once" hit a unit's first batch line only.
        let first = st.submitted.lock().expect("submitted").get(&unit).copied() == Some(1);
        let fault = faults.get(&unit).copied();
        let decision = if record["flag"] == true { "yes" } else { "no" };
        let content = match fault {
            Some(Fault::MalformedOnce) if first => "not json".to_owned(),
            _ => json!({ "decision": decision }).to_string(),
        };
        let line = match (anthropic, fault) {
            (false, Some(Fault::ErrorOnce)) if first => {
                json!({"custom_id": custom_id, "response": null,
                "error": {"code": "server_error", "message": "injected"}})
            }
            (false, Some(Fault::Expired)) => json!({"custom_id": custom_id, "response": null,
                "error": {"code": "batch_expired", "message": "This request could not be executed before the completion window expired."}}),
            (false, Some(Fault::ServerErrorOnce)) if first => json!({"custom_id": custom_id,
                "response": {"status_code": 500, "body": {"error": {"message": "injected 500"}}}, "error": null}),
            (false, _) => {
                json!({"custom_id": custom_id, "error": null, "response": {"status_code": 200, "body": {
                "choices": [{"index": 0, "message": {"role": "assistant", "content": content}}],
                "usage": {"prompt_tokens": 100, "completion_tokens": 5,
                          "prompt_tokens_details": {"cached_tokens": 64}}}}})
            }
            (true, Some(Fault::ErrorOnce)) if first => {
                json!({"custom_id": custom_id, "result": {"type": "errored",
                "error": {"type": "error", "error": {"type": "api_error", "message": "injected"}}}})
            }
            (true, Some(Fault::Expired)) => {
                json!({"custom_id": custom_id, "result": {"type": "expired"}})
            }
            (true, _) => {
                let input: Value = serde_json::from_str(&content).unwrap_or(json!("not json"));
                let block = if input.is_object() {
                    json!({"type": "tool_use", "id": "t", "name": "emit", "input": input})
                } else {
                    json!({"type": "text", "text": content})
                };
                json!({"custom_id": custom_id, "result": {"type": "succeeded", "message": {
                    "type": "message", "content": [block], "stop_reason": "tool_use",
                    "usage": {"input_tokens": 30, "cache_read_input_tokens": 70,
                              "cache_creation_input_tokens": 0, "output_tokens": 5}}}})
            }
        };
        lines.push(line);
    }
    // Results come back in any order; custom ids map them.
    lines.reverse();
    let jsonl = |ls: &[&Value]| {
        ls.iter()
            .map(|l| format!("{l}\n"))
            .collect::<String>()
            .into_bytes()
    };
    let mut files = st.files.lock().expect("files");
    if anthropic {
        files.insert(
            format!("{id}-results"),
            jsonl(&lines.iter().collect::<Vec<_>>()),
        );
    } else {
        let (errors, outputs): (Vec<&Value>, Vec<&Value>) =
            lines.iter().partition(|l| !l["error"].is_null());
        files.insert(format!("{id}-out"), jsonl(&outputs));
        files.insert(format!("{id}-err"), jsonl(&errors));
    }
    batch.results = Some(lines);
    Some(true)
}

// ---------------------------------------------------------------------------
// The spec.

fn unit_ids() -> Vec<String> {
    (1..=UNITS).map(|i| format!("r{i:02}")).collect()
}

fn flagged(id: &str) -> bool {
    id[1..].parse::<usize>().expect("numbered id") % 3 == 0
}

fn expected(id: &str) -> Status {
    if flagged(id) {
        Status::Positive
    } else {
        Status::Negative
    }
}

struct Fixture {
    dir: tempfile::TempDir,
}

impl Fixture {
    fn new(backend: &str) -> Fixture {
        let dir = tempfile::tempdir().expect("tempdir");
        let spec = format!(
            r#"name = "batch-e2e"
question = "Which records are flagged?"

[input]
path = "input.json"
partition = {{ type = "json_array", key = "id", kind = "row" }}

[[stages]]
name = "judge"
type = "map"
version = 1
rubric = "rubric.md"
output_schema = "schema.json"
max_attempts = 2
max_output_tokens = 32
decision = {{ pointer = "/decision", positive = ["yes"], negative = ["no"] }}
execution = "batch"

{backend}
api_key_env = "FANFOLD_TEST_BATCH_KEY"
max_retries = 1
timeout_ms = 3000
batch_poll_ms = 10
batch_poll_max_ms = 40
batch_wait_secs = 1

[fold]
fan_in = 4
[[fold.reducers]]
name = "flagged"
type = "set"

[contract]
type = "exhaustive"
answer = "flagged"
"#
        );
        let records: Vec<Value> = unit_ids()
            .iter()
            .map(|id| json!({"id": id, "title": format!("Record {id}"), "flag": flagged(id)}))
            .collect();
        let fx = Fixture { dir };
        std::fs::write(fx.path("spec.toml"), spec).expect("spec");
        std::fs::write(
            fx.path("rubric.md"),
            "Say yes when the record is flagged.\n",
        )
        .expect("rubric");
        std::fs::write(
            fx.path("schema.json"),
            r#"{"type": "object", "required": ["decision"], "additionalProperties": false, "properties": {"decision": {"enum": ["yes", "no"]}}}"#,
        )
        .expect("schema");
        std::fs::write(
            fx.path("input.json"),
            serde_json::to_vec(&records).expect("records"),
        )
        .expect("input");
        fx
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn run(&self) -> RunReport {
        // SAFETY: every test sets the same value before its first run, and
        // nothing in this binary reads the variable concurrently with a
        // write of a different value.
        unsafe { std::env::set_var("FANFOLD_TEST_BATCH_KEY", "sk-batch-test") };
        let plan = Plan::load(&self.path("spec.toml")).expect("plan loads");
        let mut opts = RunOptions::new(self.path("store.sqlite"));
        opts.out_dir = Some(self.path("out"));
        fanfold_engine::run(&plan, &opts, &NoProgress).expect("run completes")
    }

    fn batches(&self) -> Vec<(String, u64)> {
        let store = Store::open(&self.path("store.sqlite")).expect("store");
        let mut rows: Vec<(String, u64)> = store
            .batches()
            .expect("batches")
            .into_iter()
            .map(|b| (b.state.to_string(), b.requests))
            .collect();
        rows.sort();
        rows
    }
}

fn statuses(report: &RunReport) -> BTreeMap<String, (Status, String)> {
    report
        .facts
        .iter()
        .map(|f| {
            (
                f.source_ids[0].0.clone(),
                (f.status, f.reason.clone().unwrap_or_default()),
            )
        })
        .collect()
}

// ---------------------------------------------------------------------------
// Tests.

#[test]
fn openai_batch_resumes_a_pending_batch_and_retries_failed_lines() {
    let mock = Mock::start();
    mock.fault("r01", Fault::ErrorOnce);
    mock.fault("r02", Fault::MalformedOnce);
    mock.fault("r03", Fault::Expired);
    mock.fault("r04", Fault::ServerErrorOnce);
    let fx = Fixture::new(&format!(
        "[backends.default]\ntype = \"openai\"\nmodel = \"{MODEL_OPENAI}\"\nbase_url = \"http://127.0.0.1:{}/v1\"",
        mock.port()
    ));

    // The provider holds the batch past the wait: every unit is pending,
    // none is an error or a negative, and the batch is recorded open.
    mock.hold(true);
    let first = fx.run();
    let got = statuses(&first);
    assert_eq!(got.len(), UNITS);
    for (id, (status, reason)) in &got {
        assert_eq!(*status, Status::NotRun, "{id}");
        assert!(
            reason.starts_with("batch_pending: batch_1"),
            "{id}: {reason}"
        );
    }
    let counts = &first.certificate.statuses;
    assert_eq!(
        (counts.not_run, counts.error, counts.negative),
        (UNITS as u64, 0, 0)
    );
    assert_eq!((mock.creates(), mock.lines()), (1, UNITS));
    assert_eq!(fx.batches(), vec![("open".to_owned(), UNITS as u64)]);

    // The batch ends; a new process collects it without resubmitting, and
    // the four failed lines go into one retry batch.
    mock.hold(false);
    let second = fx.run();
    assert_eq!(mock.creates(), 2, "one retry batch, no resubmission");
    assert_eq!(mock.lines(), UNITS + 4);
    let got = statuses(&second);
    for id in unit_ids() {
        let (status, reason) = &got[&id];
        if id == "r03" {
            assert_eq!(*status, Status::Error, "an expired request is an error");
            assert!(reason.contains("batch_expired"), "{reason}");
            assert!(reason.contains("after 2 attempts"), "{reason}");
        } else {
            assert_eq!(*status, expected(&id), "{id}: {reason}");
        }
    }
    assert_eq!(
        fx.batches(),
        vec![
            ("consumed".to_owned(), 4),
            ("consumed".to_owned(), UNITS as u64)
        ]
    );

    // Batch answers are priced at the batch discount.
    let price = *PriceTable::bundled()
        .expect("prices")
        .get(MODEL_OPENAI)
        .expect("priced");
    assert!(price.batch_discount > 0.0);
    let r06 = second
        .facts
        .iter()
        .find(|f| f.source_ids[0].0 == "r06")
        .expect("r06");
    assert_eq!(
        (
            r06.cost.prompt_tokens,
            r06.cost.cached_tokens,
            r06.cost.completion_tokens
        ),
        (36, 64, 5)
    );
    let full = (36.0 * price.input + 64.0 * price.cached_input + 5.0 * price.output) / 1e6;
    let want = full * (1.0 - price.batch_discount);
    assert!(
        (r06.cost.usd - want).abs() < 1e-15,
        "{} != {want}",
        r06.cost.usd
    );

    // Decided units are cached; the error is asked again in a new batch,
    // not found in a consumed one.
    let third = fx.run();
    assert_eq!(mock.creates(), 4, "r03's two attempts, one batch each");
    assert_eq!(mock.lines(), UNITS + 6);
    assert_eq!(statuses(&third)["r03"].0, Status::Error);
    assert_eq!(third.certificate.stats.cache_hits, UNITS as u64 - 1);

    // Every call carried the key; the store does not.
    let calls = mock.state.calls.lock().expect("calls").clone();
    assert!(calls.iter().all(|(_, h)| {
        h.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) == Some("Bearer sk-batch-test")
    }));
    for f in ["store.sqlite", "store.sqlite-wal"] {
        if let Ok(bytes) = std::fs::read(fx.path(f)) {
            assert!(!bytes.windows(13).any(|w| w == b"sk-batch-test"), "{f}");
        }
    }
}

#[test]
fn anthropic_message_batches_map_results_back_by_custom_id() {
    let mock = Mock::start();
    mock.fault("r01", Fault::ErrorOnce);
    mock.fault("r05", Fault::Expired);
    let fx = Fixture::new(&format!(
        "[backends.default]\ntype = \"anthropic\"\nmodel = \"{MODEL_ANTHROPIC}\"\nbase_url = \"http://127.0.0.1:{}\"",
        mock.port()
    ));
    let report = fx.run();
    let got = statuses(&report);
    for id in unit_ids() {
        let (status, reason) = &got[&id];
        if id == "r05" {
            assert_eq!(*status, Status::Error);
            assert!(reason.contains("expired"), "{reason}");
        } else {
            assert_eq!(*status, expected(&id), "{id}: {reason}");
        }
    }
    assert_eq!(mock.creates(), 2);
    assert_eq!(mock.lines(), UNITS + 2);
    let r06 = report
        .facts
        .iter()
        .find(|f| f.source_ids[0].0 == "r06")
        .expect("r06");
    assert_eq!((r06.cost.prompt_tokens, r06.cost.cached_tokens), (30, 70));
    // Anthropic's headers on every call, and the shared prefix marked for
    // its cache inside the batch's params.
    let calls = mock.state.calls.lock().expect("calls").clone();
    assert!(calls.iter().all(|(_, h)| {
        h.get("x-api-key").and_then(|v| v.to_str().ok()) == Some("sk-batch-test")
            && h.get("anthropic-version").is_some()
    }));
    let batches = mock.state.batches.lock().expect("batches");
    let (_, params) = &batches["batch_1"].items[0];
    assert_eq!(params["system"][0]["cache_control"]["type"], "ephemeral");
    assert_eq!(params["tool_choice"]["name"], "emit");
}
