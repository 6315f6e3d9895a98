//! A whole spec run end to end through the `openai` backend type: the
//! engine (plan, queue, cache, fold, outputs) talks HTTP to an in-process
//! OpenAI-style server on 127.0.0.1 that answers each record by its content,
//! reports usage with cached prompt tokens, and injects faults per unit.

// A failed step should fail the test loudly, right there.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use fanfold_core::{FactRecord, Status};
use fanfold_engine::{NoProgress, Plan, RunOptions, RunReport};
use fanfold_http::{ModelPrice, PriceTable};
use serde_json::{Value, json};

use fanfold_testkit::Server;

/// The environment variable the spec names for the API key.
const KEY_VAR: &str = "FANFOLD_TEST_HTTP_KEY";
const MODEL: &str = "gpt-4o-mini";
const UNITS: usize = 12;
/// The stage's `max_attempts`: engine attempts per unit.
const MAX_ATTEMPTS: usize = 2;
/// The backend's `max_retries`: transport retries per engine attempt.
const MAX_RETRIES: usize = 1;
const RUBRIC: &str = "Say yes when the record is flagged, no otherwise.\n";
const SCHEMA: &str = r#"{"type": "object", "required": ["decision"], "additionalProperties": false, "properties": {"decision": {"enum": ["yes", "no"]}}}"#;

/// A key unique to this process, put in the environment once. Every test
/// calls this before anything else, so the environment is written before
/// any test thread reads it.
fn api_key() -> &'static str {
    static KEY: OnceLock<String> = OnceLock::new();
    KEY.get_or_init(|| {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        let key = format!("sk-test-{}-{nanos}", std::process::id());
        // SAFETY: runs once, inside the OnceLock; the other tests block on
        // the lock before they touch the environment, and no thread of this
        // binary reads it concurrently.
        unsafe { std::env::set_var(KEY_VAR, &key) };
        key
    })
}

// ---------------------------------------------------------------------------
// The mock provider.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    /// 429 with `Retry-After: 0` on the unit's first request, then answers.
    RateLimitedOnce,
    /// 500 on every request; the body echoes the credentials it was sent.
    ServerError,
    /// 200 whose message content is not JSON.
    Malformed,
}

#[derive(Clone, Debug)]
struct Hit {
    unit: String,
    path: String,
    authorization: Option<String>,
    body: Value,
}

/// The usage one 200 answer reported.
#[derive(Clone, Copy, Debug)]
struct Served {
    prompt: u64,
    cached: u64,
    completion: u64,
}

#[derive(Default)]
struct MockState {
    faults: Mutex<HashMap<String, Fault>>,
    hits: Mutex<Vec<Hit>>,
    served: Mutex<Vec<(String, Served)>>,
    /// The first answer evaluates the whole prompt; later ones report the
    /// system message as read from the prefix cache.
    answered: AtomicBool,
}

struct Mock {
    addr: SocketAddr,
    state: Arc<MockState>,
    _server: Server,
}

impl Mock {
    fn start() -> Mock {
        let state = Arc::new(MockState::default());
        let server = Server::start(Router::new().fallback(handle).with_state(state.clone()))
            .expect("mock server");
        Mock {
            addr: server.addr,
            state,
            _server: server,
        }
    }

    fn fault(&self, unit: &str, fault: Fault) {
        self.state
            .faults
            .lock()
            .expect("faults")
            .insert(unit.to_owned(), fault);
    }

    fn clear_faults(&self) {
        self.state.faults.lock().expect("faults").clear();
    }

    fn hits(&self) -> Vec<Hit> {
        self.state.hits.lock().expect("hits").clone()
    }

    fn hits_for(&self, unit: &str) -> usize {
        self.hits().iter().filter(|h| h.unit == unit).count()
    }

    fn served(&self) -> Vec<(String, Served)> {
        self.state.served.lock().expect("served").clone()
    }
}

/// The unit id and record of a request, from its user message
/// (`Record ID:` then the record in a json fence).
fn parse_user(content: &str) -> Option<(String, Value)> {
    let (id, _) = content.strip_prefix("Record ")?.split_once(':')?;
    let id = id.trim_matches('"');
    let (_, rest) = content.split_once("```json\n")?;
    let (record, _) = rest.rsplit_once("\n```")?;
    Some((id.to_owned(), serde_json::from_str(record).ok()?))
}

fn message(body: &Value, role: &str) -> String {
    body["messages"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["role"] == role))
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_owned()
}

async fn handle(
    State(st): State<Arc<MockState>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    // No model listing: the identity stays host and alias.
    if uri.path().ends_with("/models") {
        return (StatusCode::NOT_FOUND, "no listing").into_response();
    }
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let parsed = parse_user(&message(&body, "user"));
    let unit = parsed
        .as_ref()
        .map(|(id, _)| id.clone())
        .unwrap_or_default();
    let authorization = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let earlier = {
        let mut hits = st.hits.lock().expect("hits");
        let n = hits.iter().filter(|h| h.unit == unit).count();
        hits.push(Hit {
            unit: unit.clone(),
            path: uri.path().to_owned(),
            authorization: authorization.clone(),
            body: body.clone(),
        });
        n
    };
    let Some((_, record)) = parsed else {
        return (StatusCode::BAD_REQUEST, "unrecognised request").into_response();
    };
    let fault = st.faults.lock().expect("faults").get(&unit).copied();
    match fault {
        Some(Fault::RateLimitedOnce) if earlier == 0 => (
            StatusCode::TOO_MANY_REQUESTS,
            [(header::RETRY_AFTER, "0")],
            json!({"error": {"message": "injected 429", "type": "rate_limit"}}).to_string(),
        )
            .into_response(),
        Some(Fault::ServerError) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            json!({"error": {"message": format!(
                "injected 500; you sent {}",
                authorization.unwrap_or_default()
            )}})
            .to_string(),
        )
            .into_response(),
        Some(Fault::Malformed) => success(&st, &body, &unit, "not json".into()),
        _ => {
            let decision = if record["flag"] == true { "yes" } else { "no" };
            success(
                &st,
                &body,
                &unit,
                json!({ "decision": decision }).to_string(),
            )
        }
    }
}

fn success(st: &MockState, body: &Value, unit: &str, content: String) -> Response {
    let system = message(body, "system");
    let user = message(body, "user");
    let prompt = ((system.len() + user.len()) / 4) as u64;
    let cached = if st.answered.swap(true, Ordering::SeqCst) {
        ((system.len() / 4) as u64 / 8 * 8).min(prompt)
    } else {
        0
    };
    let completion = (content.len() / 4 + 1) as u64;
    st.served.lock().expect("served").push((
        unit.to_owned(),
        Served {
            prompt,
            cached,
            completion,
        },
    ));
    let v = json!({
        "id": "chatcmpl-test", "object": "chat.completion", "model": MODEL,
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": content}}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                  "total_tokens": prompt + completion,
                  "prompt_tokens_details": {"cached_tokens": cached}}
    });
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        v.to_string(),
    )
        .into_response()
}

// ---------------------------------------------------------------------------
// The spec.

fn unit_ids() -> Vec<String> {
    (1..=UNITS).map(|i| format!("r{i:02}")).collect()
}

fn flagged(id: &str) -> bool {
    id[1..].parse::<usize>().expect("numbered id") % 3 == 0
}

struct Fixture {
    dir: tempfile::TempDir,
}

impl Fixture {
    fn new(port: u16) -> Fixture {
        let dir = tempfile::tempdir().expect("tempdir");
        let spec = format!(
            r#"name = "http-e2e"
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
max_attempts = {MAX_ATTEMPTS}
max_output_tokens = 32
decision = {{ pointer = "/decision", positive = ["yes"], negative = ["no"] }}

[backends.default]
type = "openai"
model = "{MODEL}"
base_url = "http://127.0.0.1:{port}/v1"
api_key_env = "{KEY_VAR}"
max_retries = {MAX_RETRIES}
timeout_ms = 3000

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
            .map(|id| {
                json!({
                    "id": id,
                    "title": format!("Record {id} about the quarterly report"),
                    "flag": flagged(id),
                })
            })
            .collect();
        let fx = Fixture { dir };
        std::fs::write(fx.path("spec.toml"), spec).expect("spec");
        std::fs::write(fx.path("rubric.md"), RUBRIC).expect("rubric");
        std::fs::write(fx.path("schema.json"), SCHEMA).expect("schema");
        std::fs::write(
            fx.path("input.json"),
            serde_json::to_vec_pretty(&records).expect("records"),
        )
        .expect("input");
        fx
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn run(&self) -> RunReport {
        self.run_with(None)
    }

    fn run_with(&self, budget: Option<fanfold_core::spec::BudgetSpec>) -> RunReport {
        let plan = Plan::load(&self.path("spec.toml")).expect("plan loads");
        let mut opts = RunOptions::new(self.path("store.sqlite"));
        opts.budget = budget;
        opts.out_dir = Some(self.path("out"));
        opts.slots = 4;
        // Every call is also written to a replay cassette, which the secret
        // scan reads with the rest of the folder.
        opts.record = Some(self.path("cassette.jsonl"));
        fanfold_engine::run(&plan, &opts, &NoProgress).expect("run completes")
    }
}

// ---------------------------------------------------------------------------
// Checks.

fn fact<'a>(report: &'a RunReport, id: &str) -> &'a FactRecord {
    let found: Vec<&FactRecord> = report
        .facts
        .iter()
        .filter(|f| f.source_ids.first().map(|u| u.0.as_str()) == Some(id))
        .collect();
    assert_eq!(found.len(), 1, "one fact for unit {id}");
    found[0]
}

fn statuses(report: &RunReport) -> BTreeMap<String, Status> {
    report
        .facts
        .iter()
        .map(|f| (f.source_ids[0].0.clone(), f.status))
        .collect()
}

fn expected_status(id: &str) -> Status {
    if flagged(id) {
        Status::Positive
    } else {
        Status::Negative
    }
}

fn answer_ids(report: &RunReport) -> Vec<String> {
    report
        .answer
        .items
        .iter()
        .map(|i| i.unit_id.0.clone())
        .collect()
}

fn flagged_ids() -> Vec<String> {
    unit_ids().into_iter().filter(|id| flagged(id)).collect()
}

fn gpt_4o_mini() -> ModelPrice {
    *PriceTable::bundled()
        .expect("bundled price table")
        .get(MODEL)
        .expect("gpt-4o-mini is priced")
}

/// Dollars for the answers the mock served, computed here from the price
/// table's rates. OpenAI's `prompt_tokens` includes the cached ones.
fn usd(price: &ModelPrice, served: &[Served]) -> f64 {
    served
        .iter()
        .map(|s| {
            ((s.prompt - s.cached) as f64 * price.input
                + s.cached as f64 * price.cached_input
                + s.completion as f64 * price.output)
                / 1_000_000.0
        })
        .sum()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12 + 1e-9 * b.abs()
}

fn served_for(served: &[(String, Served)], id: &str) -> Vec<Served> {
    served
        .iter()
        .filter(|(u, _)| u == id)
        .map(|(_, s)| *s)
        .collect()
}

/// Each fact's tokens and dollars are the sum of what the mock reported for
/// its unit, priced by the table.
fn assert_costs_match(report: &RunReport, served: &[(String, Served)]) {
    let price = gpt_4o_mini();
    for id in unit_ids() {
        let f = fact(report, &id);
        let s = served_for(served, &id);
        let prompt: u64 = s.iter().map(|s| s.prompt).sum();
        let cached: u64 = s.iter().map(|s| s.cached).sum();
        let completion: u64 = s.iter().map(|s| s.completion).sum();
        assert_eq!(f.cost.cached_tokens, cached, "{id}: cached tokens");
        assert_eq!(
            f.cost.prompt_tokens + f.cost.cached_tokens,
            prompt,
            "{id}: prompt tokens (evaluated + cached)"
        );
        assert_eq!(f.cost.completion_tokens, completion, "{id}: completion");
        let want = usd(&price, &s);
        assert!(
            close(f.cost.usd, want),
            "{id}: usd {} != {want} from the price table",
            f.cost.usd
        );
    }
    let all: Vec<Served> = served.iter().map(|(_, s)| *s).collect();
    let reported_cached: u64 = all.iter().map(|s| s.cached).sum();
    let fact_cached: u64 = report.facts.iter().map(|f| f.cost.cached_tokens).sum();
    assert!(reported_cached > 0, "the mock reported cached tokens");
    assert_eq!(fact_cached, reported_cached, "cached tokens sum");
    let want = usd(&price, &all);
    let got: f64 = report.facts.iter().map(|f| f.cost.usd).sum();
    assert!(got > 0.0, "facts carry a price");
    assert!(close(got, want), "facts' usd {got} != {want}");
    let stats = &report.certificate.stats.cost;
    assert!(
        close(stats.usd, want),
        "certificate usd {} != {want}",
        stats.usd
    );
    assert_eq!(stats.cached_tokens, reported_cached, "certificate cached");
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

fn files_under(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read dir") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            files_under(&path, out);
        } else {
            out.push(path);
        }
    }
}

/// The key is nowhere the runs left anything: the store (with its WAL),
/// the output folder, the replay cassette, the reports' Debug and JSON
/// forms.
fn assert_key_absent(fx: &Fixture, mock: &Mock, reports: &[&RunReport]) {
    let key = api_key();
    // The key was in use: every request carried it.
    let hits = mock.hits();
    assert!(!hits.is_empty());
    for h in &hits {
        assert_eq!(
            h.authorization.as_deref(),
            Some(format!("Bearer {key}").as_str()),
            "request for {} carried the key",
            h.unit
        );
    }
    let mut files = Vec::new();
    files_under(fx.dir.path(), &mut files);
    let mut store_bytes = Vec::new();
    let mut out_files = 0;
    for f in &files {
        let bytes = std::fs::read(f).expect("read");
        assert!(
            !contains(&bytes, key.as_bytes()),
            "{} holds the API key",
            f.display()
        );
        let name = f.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if name.starts_with("store.sqlite") {
            store_bytes.extend_from_slice(&bytes);
        }
        if f.parent() == Some(fx.path("out").as_path()) {
            out_files += 1;
        }
    }
    // The scan read real content: the store holds the facts and the
    // outputs were written.
    assert!(
        contains(&store_bytes, MODEL.as_bytes()),
        "the store's bytes name the model"
    );
    assert!(out_files >= 4, "answer, certificate, facts, markdown");
    let cassette = std::fs::read(fx.path("cassette.jsonl")).expect("cassette");
    assert!(
        contains(&cassette, b"decision"),
        "the cassette holds the recorded answers"
    );
    for r in reports {
        let debug = format!(
            "{:?}\n{:?}\n{:?}\n{:?}\n{}",
            r.answer, r.certificate, r.facts, r.fold, r.run_id
        );
        assert!(!debug.contains(key), "the report's Debug holds the key");
        let json = serde_json::to_string(&(&r.answer, &r.certificate, &r.facts, &r.fold))
            .expect("report serializes");
        assert!(!json.contains(key), "the report's JSON holds the key");
        assert!(json.contains(MODEL));
    }
}

// ---------------------------------------------------------------------------
// Tests.

#[test]
fn openai_run_decides_every_unit_and_prices_the_reported_usage() {
    let key = api_key();
    let mock = Mock::start();
    let fx = Fixture::new(mock.addr.port());
    let report = fx.run();

    // Every unit decided, by its content.
    let got = statuses(&report);
    let want: BTreeMap<String, Status> = unit_ids()
        .into_iter()
        .map(|id| {
            let s = expected_status(&id);
            (id, s)
        })
        .collect();
    assert_eq!(got, want);
    assert_eq!(answer_ids(&report), flagged_ids());
    let c = &report.certificate;
    assert_eq!(c.stop.code(), "completed");
    assert!(c.coverage_complete);
    assert_eq!(c.statuses.positive, 4);
    assert_eq!(c.statuses.negative, 8);
    assert_eq!(
        c.statuses.error + c.statuses.abstain + c.statuses.cancelled + c.statuses.not_run,
        0
    );
    assert_eq!(c.stats.cache_misses, UNITS as u64);
    assert_eq!(c.stats.cache_hits, 0);

    // A real backend, labelled as such.
    assert_eq!(c.backends.len(), 1);
    assert_eq!(c.backends[0].kind, "openai");
    assert!(!c.backends[0].simulated);
    // The identity names the model and the output mode it answered in.
    assert!(c.backends[0].model_id.contains(MODEL));
    assert!(!c.simulated);
    assert!(!report.answer.simulated);
    assert!(c.simulated_figures.is_empty());
    for f in &report.facts {
        assert_eq!(f.model.backend, "openai");
        assert!(!f.model.simulated);
        assert_eq!(f.attempts, 1);
    }

    // One request a unit, each priced from the usage the mock reported.
    let served = mock.served();
    assert_eq!(served.len(), UNITS);
    assert_costs_match(&report, &served);

    // The requests: one shared system message first (prefix-cache
    // friendly), the record in the user message, structured output.
    let hits = mock.hits();
    assert_eq!(hits.len(), UNITS);
    let units: BTreeSet<&str> = hits.iter().map(|h| h.unit.as_str()).collect();
    assert_eq!(units.len(), UNITS, "every unit asked once");
    let schema: Value = serde_json::from_str(SCHEMA).expect("schema");
    let system = hits[0].body["messages"][0]["content"]
        .as_str()
        .expect("system content")
        .to_owned();
    assert!(system.starts_with(RUBRIC.trim_end()), "{system}");
    for h in &hits {
        assert_eq!(h.path, "/v1/chat/completions");
        assert_eq!(h.body["model"], MODEL);
        let messages = h.body["messages"].as_array().expect("messages");
        assert_eq!(messages.len(), 2);
        assert_eq!(messages[0]["role"], "system");
        assert_eq!(messages[0]["content"], system.as_str(), "same prefix");
        assert_eq!(messages[1]["role"], "user");
        let rf = &h.body["response_format"];
        assert_eq!(rf["type"], "json_schema", "{rf}");
        assert_eq!(rf["json_schema"]["schema"], schema);
        let sent = serde_json::to_string(&h.body).expect("body");
        assert!(!sent.contains(key), "the key is not in a request body");
    }

    assert_key_absent(&fx, &mock, &[&report]);
}

/// A money budget is reserved before each call at its worst case and
/// settled to what the reported usage cost: a budget below one call's
/// worst case sends nothing; a budget for about half the units stops
/// there, never over the limit, and the answer says it is incomplete.
#[test]
fn a_money_budget_is_reserved_before_each_call() {
    api_key();
    let mock = Mock::start();
    let fx = Fixture::new(mock.addr.port());
    let tiny = fanfold_core::spec::BudgetSpec {
        max_usd: Some(1e-9),
        ..Default::default()
    };
    let report = fx.run_with(Some(tiny));
    let c = &report.certificate;
    assert_eq!(c.stop.code(), "budget_exhausted");
    assert!(matches!(
        &c.stop,
        fanfold_ops::contract::StopReason::BudgetExhausted {
            budget: fanfold_ops::contract::Budget::UsdMicros,
            ..
        }
    ));
    assert_eq!(mock.served().len(), 0, "nothing was paid for");
    assert_eq!(c.statuses.not_run, UNITS as u64);
    assert!(!report.answer.complete);

    let enough = fanfold_core::spec::BudgetSpec {
        max_usd: Some(1.0),
        ..Default::default()
    };
    let report = fx.run_with(Some(enough));
    let c = &report.certificate;
    assert_eq!(c.stop.code(), "completed");
    assert!(report.answer.complete);
    assert!(c.stats.cost.usd > 0.0 && c.stats.cost.usd <= 1.0);
}

#[test]
fn faults_end_as_errors_and_a_rerun_asks_only_the_errored_units() {
    api_key();
    let mock = Mock::start();
    mock.fault("r02", Fault::RateLimitedOnce);
    mock.fault("r05", Fault::RateLimitedOnce);
    mock.fault("r07", Fault::ServerError);
    mock.fault("r10", Fault::Malformed);
    let fx = Fixture::new(mock.addr.port());

    let first = fx.run();
    let got = statuses(&first);
    assert_eq!(got.len(), UNITS);
    for id in unit_ids() {
        let want = match id.as_str() {
            "r07" | "r10" => Status::Error,
            _ => expected_status(&id),
        };
        assert_eq!(got[&id], want, "unit {id}");
    }
    assert_eq!(first.certificate.stop.code(), "completed");
    let c = &first.certificate.statuses;
    assert_eq!((c.error, c.positive + c.negative), (2, UNITS as u64 - 2));
    assert_eq!(c.abstain + c.cancelled + c.not_run, 0);

    // 500 forever: an error naming the status, never a negative; every
    // engine attempt spent its transport retries.
    let server = fact(&first, "r07");
    assert_ne!(server.status, Status::Negative);
    let reason = server.reason.clone().unwrap_or_default();
    assert!(reason.contains("HTTP 500"), "r07 reason: {reason}");
    assert!(reason.contains("injected 500"), "r07 reason: {reason}");
    assert_eq!(server.attempts as usize, MAX_ATTEMPTS);
    assert_eq!(mock.hits_for("r07"), MAX_ATTEMPTS * (MAX_RETRIES + 1));

    // Not JSON: the engine's retries, then an error.
    let malformed = fact(&first, "r10");
    assert_eq!(malformed.attempts as usize, MAX_ATTEMPTS);
    assert!(malformed.reason.is_some());
    assert_eq!(mock.hits_for("r10"), MAX_ATTEMPTS);

    // 429 once: the transport retried, the engine saw one attempt.
    for id in ["r02", "r05"] {
        assert_eq!(fact(&first, id).attempts, 1, "{id}");
        assert_eq!(mock.hits_for(id), 2, "{id}: 429 then the answer");
    }
    for id in unit_ids() {
        if !["r02", "r05", "r07", "r10"].contains(&id.as_str()) {
            assert_eq!(mock.hits_for(&id), 1, "{id}");
        }
    }
    // Failed calls bill nothing; the malformed answers still cost tokens.
    assert_costs_match(&first, &mock.served());
    assert!(fact(&first, "r10").cost.usd > 0.0);
    assert_eq!(fact(&first, "r07").cost.usd, 0.0);

    // Resume with the faults gone: only the errored units are asked again.
    mock.clear_faults();
    let before = mock.hits().len();
    let second = fx.run();
    let mut asked: Vec<String> = mock.hits()[before..]
        .iter()
        .map(|h| h.unit.clone())
        .collect();
    asked.sort();
    assert_eq!(asked, ["r07", "r10"]);
    let stats = &second.certificate.stats;
    assert_eq!(stats.cache_hits, UNITS as u64 - 2);
    assert_eq!(stats.cache_misses, 2);
    assert_eq!(stats.recomputed_units, ["r07", "r10"]);
    let want: BTreeMap<String, Status> = unit_ids()
        .into_iter()
        .map(|id| {
            let s = expected_status(&id);
            (id, s)
        })
        .collect();
    assert_eq!(statuses(&second), want);
    assert_eq!(answer_ids(&second), flagged_ids());
    assert_eq!(second.certificate.statuses.error, 0);

    assert_key_absent(&fx, &mock, &[&first, &second]);
}
