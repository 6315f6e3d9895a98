//! `fanfold bench http`: how close the HTTP backend's scheduler comes to
//! the ideal schedule when the endpoint is never the bottleneck.
//!
//! An in-process axum server answers every `POST /v1/chat/completions`
//! after a fixed latency (a timer, so no thread waits). fanfold's
//! `OpenAiBackend` drains a synthetic job through it with as many slots as
//! the endpoint's `max_concurrency`. With the prefix warm-up (one request
//! alone, then the fan-out) the best possible wall time is
//! `latency + ceil((n - 1) / c) * latency`; the report gives the measured
//! wall time against it and against the plain `ceil(n / c) * latency`, the
//! concurrency achieved on both sides of the socket, and CPU time per
//! request, split by thread between fanfold and the mock server.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, anyhow, ensure};
use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use clap::Args;
use fanfold_http::{EndpointConfig, OpenAiBackend, OpenAiConfig};
use fanfold_model::{ModelBackend, Request};
use fanfold_testkit::{Finished, QueueJob, Server};
use serde_json::{Value, json};

const NAME: &str = "http";
/// The second, smaller configuration reported next to the main one.
const SMALL_REQUESTS: usize = 1_000;
const SMALL_CONCURRENCY: usize = 64;
/// The most connections the backend accepts for one endpoint.
const MAX_CONCURRENCY: usize = 4096;
/// Thread names, as `/proc/self/task/*/comm` shows them (at most 15 bytes).
const MOCK_THREAD: &str = fanfold_testkit::THREAD_NAME;
const BACKEND_THREAD: &str = "fanfold-http";
/// The answer every request gets: valid against [`schema`].
const ANSWER: &str = r#"{"decision":"no"}"#;
const PROMPT_TOKENS: u64 = 60;
const COMPLETION_TOKENS: u64 = 5;
/// Linux reports `/proc/*/stat` times in USER_HZ ticks, 100 a second on
/// every mainstream architecture.
const TICK_NS: u64 = 10_000_000;

#[derive(Args)]
pub struct HttpArgs {
    /// Requests in the main configuration's job.
    #[arg(long, default_value_t = 10_000)]
    requests: usize,
    /// Slots of the main configuration: the job's `slots()` and the
    /// endpoint's `max_concurrency`.
    #[arg(long, default_value_t = 256)]
    concurrency: usize,
    /// The mock server's fixed latency per request.
    #[arg(long, default_value_t = 200)]
    latency_ms: u64,
    /// The Markdown report; only its HTTP-scheduler section is replaced.
    #[arg(long, value_name = "PATH", default_value = "docs/benchmarks.md")]
    report: PathBuf,
}

pub fn main(args: &HttpArgs) -> Result<()> {
    ensure!(args.requests >= 1, "--requests must be at least 1");
    ensure!(
        (1..=MAX_CONCURRENCY).contains(&args.concurrency),
        "--concurrency must be in 1..={MAX_CONCURRENCY}"
    );
    ensure!(args.latency_ms >= 1, "--latency-ms must be at least 1");
    let latency = Duration::from_millis(args.latency_ms);
    let load = crate::report::load_average();
    let configs = [
        (args.requests, args.concurrency),
        (SMALL_REQUESTS, SMALL_CONCURRENCY),
    ];
    let mut results = Vec::with_capacity(configs.len());
    for (n, c) in configs {
        eprintln!(
            "bench http: {n} requests, concurrency {c}, latency {} ms",
            args.latency_ms
        );
        let m = run_config(n, c, latency)
            .with_context(|| format!("measuring {n} requests at concurrency {c}"))?;
        eprintln!(
            "  wall {:.3} s, efficiency {:.1}% (warm-up ideal {:.3} s), mean concurrency {:.1}, max in flight {} (server {}), fanfold CPU {} per request",
            m.wall.as_secs_f64(),
            m.efficiency(true) * 100.0,
            ms_to_s(m.ideal_ms(true)),
            m.client_mean_concurrency(),
            m.client_max_in_flight,
            m.server_max_in_flight,
            per_request(m.cpu.fanfold_ns, m.requests),
        );
        results.push(m);
    }
    let section = render(args.latency_ms, &load, &results);
    crate::report::write_marked_section(&args.report, NAME, &section)?;
    eprintln!("wrote {}", args.report.display());
    Ok(())
}

/// The best wall time for `n` requests of `latency_ms` each at concurrency
/// `c`. With the warm-up the first request runs alone and the rest fan
/// out; without it all go out in waves of `c`.
pub(crate) fn ideal_ms(n: u64, c: u64, latency_ms: u64, warm_up: bool) -> u64 {
    if n == 0 {
        return 0;
    }
    let c = c.max(1);
    if warm_up {
        latency_ms.saturating_add((n - 1).div_ceil(c).saturating_mul(latency_ms))
    } else {
        n.div_ceil(c).saturating_mul(latency_ms)
    }
}

/// One measured configuration.
struct Measured {
    requests: usize,
    concurrency: usize,
    latency_ms: u64,
    wall: Duration,
    succeeded: usize,
    failed: usize,
    first_error: Option<String>,
    /// Sum over requests of the time from `next` to `complete`.
    client_held: Duration,
    client_max_in_flight: usize,
    server: ServerCounts,
    server_max_in_flight: usize,
    http_requests: u64,
    retries: u64,
    warm_up_answered: bool,
    cpu: CpuSplit,
}

impl Measured {
    fn ideal_ms(&self, warm_up: bool) -> u64 {
        ideal_ms(
            self.requests as u64,
            self.concurrency as u64,
            self.latency_ms,
            warm_up,
        )
    }
    fn efficiency(&self, warm_up: bool) -> f64 {
        self.ideal_ms(warm_up) as f64 / (self.wall.as_secs_f64() * 1000.0).max(1e-9)
    }
    fn client_mean_concurrency(&self) -> f64 {
        self.client_held.as_secs_f64() / self.wall.as_secs_f64().max(1e-9)
    }
    fn server_mean_concurrency(&self) -> f64 {
        Duration::from_nanos(self.server.busy_ns).as_secs_f64() / self.wall.as_secs_f64().max(1e-9)
    }
}

fn run_config(n: usize, c: usize, latency: Duration) -> Result<Measured> {
    let mock = MockServer::start(latency).context("starting the mock server")?;
    let mut endpoint = EndpointConfig::new(format!("http://{}/v1", mock.addr));
    endpoint.max_concurrency = c;
    endpoint.requests_per_minute = None;
    endpoint.tokens_per_minute = None;
    let config = OpenAiConfig::new("bench-mock", vec![endpoint]);
    let warm_up = config.transport.warm_up;
    let backend = OpenAiBackend::new(config).context("building the OpenAI backend")?;
    let job = bench_job(n, c);

    let caller = caller_tid();
    let before = CpuSnapshot::take();
    let started = Instant::now();
    backend
        .run(&job)
        .map_err(|e| anyhow!("the backend could not run: {e}"))?;
    let wall = started.elapsed();
    let after = CpuSnapshot::take();

    let stats = backend.stats();
    drop(backend);
    let server = mock.counts();
    let server_max_in_flight = mock.state.max_in_flight.load(Ordering::Relaxed);
    drop(mock);

    let breaches = job.contract_breaches();
    ensure!(
        breaches.is_empty(),
        "the backend broke the job's contract: {}",
        breaches.join("; ")
    );
    let state = client_side(&job.finished());
    ensure!(
        state.succeeded + state.failed == n,
        "the backend returned after {} of {n} requests completed",
        state.succeeded + state.failed
    );
    Ok(Measured {
        requests: n,
        concurrency: c,
        latency_ms: u64::try_from(latency.as_millis()).unwrap_or(u64::MAX),
        wall,
        succeeded: state.succeeded,
        failed: state.failed,
        first_error: state.first_error,
        client_held: state.held,
        client_max_in_flight: job.max_in_flight(),
        server,
        server_max_in_flight,
        http_requests: stats.requests,
        retries: stats.retries,
        warm_up_answered: warm_up && stats.warm_up.is_some(),
        cpu: CpuSplit::between(&before, &after, caller),
    })
}

// The job.

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {"decision": {"type": "string", "enum": ["yes", "no"]}},
        "required": ["decision"],
        "additionalProperties": false
    })
}

fn bench_job(n: usize, slots: usize) -> QueueJob {
    let requests = (0..n)
        .map(|i| Request {
            index: i,
            unit_id: format!("u{i}"),
            suffix: format!("Record u{i}: level=INFO latency_ms={}", i % 997),
            input: Value::Null,
            attempt: 1,
            max_output_tokens: 16,
            schema: None,
        })
        .collect();
    QueueJob::new(
        "Decide whether the record below reports a failure. Answer with JSON: \
         {\"decision\": \"yes\" | \"no\"}.",
        requests,
        slots,
    )
    .with_schema(schema())
}

/// What the client side saw of the requests it got back.
struct ClientSide {
    succeeded: usize,
    failed: usize,
    first_error: Option<String>,
    held: Duration,
}

fn client_side(finished: &[Finished]) -> ClientSide {
    let mut side = ClientSide {
        succeeded: 0,
        failed: 0,
        first_error: None,
        held: Duration::ZERO,
    };
    for f in finished {
        side.held += f.held;
        match &f.result {
            Ok(c) if c.text == ANSWER => side.succeeded += 1,
            Ok(c) => {
                side.failed += 1;
                side.first_error
                    .get_or_insert_with(|| format!("unexpected answer {:?}", c.text));
            }
            Err(e) => {
                side.failed += 1;
                side.first_error.get_or_insert_with(|| e.to_string());
            }
        }
    }
    side
}

// The mock endpoint.

#[derive(Default)]
struct MockState {
    latency: Duration,
    reply: Bytes,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    requests: AtomicU64,
    rejected: AtomicU64,
    /// Sum over requests of the handler's time, latency included.
    busy_ns: AtomicU64,
}

#[derive(Clone, Copy, Debug, Default)]
struct ServerCounts {
    requests: u64,
    rejected: u64,
    busy_ns: u64,
}

/// Lowers the in-flight count when the handler ends, also when the client
/// goes away mid-wait and the handler is dropped.
struct InFlight<'a>(&'a MockState, Instant);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
        let ns = u64::try_from(self.1.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.0.busy_ns.fetch_add(ns, Ordering::Relaxed);
    }
}

async fn chat_completions(State(state): State<Arc<MockState>>, body: Bytes) -> Response {
    let now = state.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
    state.max_in_flight.fetch_max(now, Ordering::Relaxed);
    state.requests.fetch_add(1, Ordering::Relaxed);
    let guard = InFlight(&state, Instant::now());
    // Read the request as a server would; a body that is not a chat request
    // is refused after the same latency.
    let valid = serde_json::from_slice::<Value>(&body)
        .ok()
        .is_some_and(|v| v.get("messages").is_some_and(Value::is_array));
    tokio::time::sleep(state.latency).await;
    drop(guard);
    if valid {
        (
            [(header::CONTENT_TYPE, "application/json")],
            state.reply.clone(),
        )
            .into_response()
    } else {
        state.rejected.fetch_add(1, Ordering::Relaxed);
        (StatusCode::BAD_REQUEST, "expected a JSON chat request").into_response()
    }
}

struct MockServer {
    addr: SocketAddr,
    state: Arc<MockState>,
    /// Stops and joins the server when dropped.
    _server: Server,
}

impl MockServer {
    fn start(latency: Duration) -> Result<MockServer> {
        let reply = serde_json::to_vec(&json!({
            "id": "chatcmpl-bench",
            "object": "chat.completion",
            "created": 0,
            "model": "bench-mock",
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": ANSWER},
                "finish_reason": "stop"
            }],
            "usage": {
                "prompt_tokens": PROMPT_TOKENS,
                "completion_tokens": COMPLETION_TOKENS,
                "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS
            }
        }))
        .context("encoding the mock answer")?;
        let state = Arc::new(MockState {
            latency,
            reply: Bytes::from(reply),
            ..MockState::default()
        });
        let app = Router::new()
            .route("/v1/chat/completions", post(chat_completions))
            .with_state(Arc::clone(&state));
        let server = Server::start_with(app, mock_workers()).context("starting the mock server")?;
        Ok(MockServer {
            addr: server.addr,
            state,
            _server: server,
        })
    }

    fn counts(&self) -> ServerCounts {
        ServerCounts {
            requests: self.state.requests.load(Ordering::Relaxed),
            rejected: self.state.rejected.load(Ordering::Relaxed),
            busy_ns: self.state.busy_ns.load(Ordering::Relaxed),
        }
    }
}

/// The mock server's worker threads: its handlers only wait on timers, so
/// one per core is plenty.
fn mock_workers() -> usize {
    cores().max(2)
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

// CPU time, per thread, from /proc.

/// CPU time of each live thread and of the whole process.
struct CpuSnapshot {
    /// user + sys of the process, dead threads included.
    process_ns: Option<u64>,
    threads: HashMap<String, (String, u64)>,
}

impl CpuSnapshot {
    fn take() -> CpuSnapshot {
        let process_ns = std::fs::read_to_string("/proc/self/stat")
            .ok()
            .and_then(|s| stat_cpu_ns(&s));
        let mut threads = HashMap::new();
        if let Ok(dir) = std::fs::read_dir("/proc/self/task") {
            for entry in dir.flatten() {
                let path = entry.path();
                let tid = entry.file_name().to_string_lossy().into_owned();
                let name = std::fs::read_to_string(path.join("comm"))
                    .map(|s| s.trim().to_owned())
                    .unwrap_or_default();
                // A thread may end between the listing and the read.
                if let Some(ns) = thread_cpu_ns(&path) {
                    threads.insert(tid, (name, ns));
                }
            }
        }
        CpuSnapshot {
            process_ns,
            threads,
        }
    }
}

/// Nanoseconds on CPU from `schedstat`, else user + sys ticks from `stat`.
fn thread_cpu_ns(task: &Path) -> Option<u64> {
    std::fs::read_to_string(task.join("schedstat"))
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .or_else(|| stat_cpu_ns(&std::fs::read_to_string(task.join("stat")).ok()?))
}

/// utime + stime of a `stat` line, in nanoseconds. The command name may
/// hold spaces and parentheses, so fields are counted after its last `)`.
fn stat_cpu_ns(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // Field 3 (state) is index 0; utime and stime are fields 14 and 15.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    utime.checked_add(stime)?.checked_mul(TICK_NS)
}

/// The id of the calling thread, from the `/proc/thread-self` link.
fn caller_tid() -> Option<String> {
    let link = std::fs::read_link("/proc/thread-self").ok()?;
    Some(link.file_name()?.to_string_lossy().into_owned())
}

/// CPU time spent during a run, by who spent it.
#[derive(Clone, Copy, Debug, Default)]
struct CpuSplit {
    /// The thread that called `run` (it polls every request future and
    /// this bench's queue) plus the backend runtime's threads (sockets,
    /// timers, connection tasks).
    fanfold_ns: Option<u64>,
    mock_ns: Option<u64>,
    process_ns: Option<u64>,
}

impl CpuSplit {
    fn between(before: &CpuSnapshot, after: &CpuSnapshot, caller: Option<String>) -> CpuSplit {
        if after.threads.is_empty() {
            return CpuSplit {
                process_ns: delta(before.process_ns, after.process_ns),
                ..CpuSplit::default()
            };
        }
        let (mut fanfold, mut mock) = (0u64, 0u64);
        for (tid, (name, ns)) in &after.threads {
            let was = before.threads.get(tid).map_or(0, |(_, ns)| *ns);
            let spent = ns.saturating_sub(was);
            if caller.as_deref() == Some(tid.as_str()) || name == BACKEND_THREAD {
                fanfold = fanfold.saturating_add(spent);
            } else if name == MOCK_THREAD {
                mock = mock.saturating_add(spent);
            }
        }
        CpuSplit {
            fanfold_ns: caller.is_some().then_some(fanfold),
            mock_ns: Some(mock),
            process_ns: delta(before.process_ns, after.process_ns),
        }
    }
}

fn delta(before: Option<u64>, after: Option<u64>) -> Option<u64> {
    Some(after?.saturating_sub(before?))
}

// The report.

fn ms_to_s(ms: u64) -> f64 {
    ms as f64 / 1000.0
}

fn per_request(ns: Option<u64>, n: usize) -> String {
    match ns {
        Some(ns) => format!("{:.1} µs", ns as f64 / 1000.0 / n.max(1) as f64),
        None => "not measured".to_owned(),
    }
}

fn render(latency_ms: u64, load: &str, results: &[Measured]) -> String {
    let mut s = String::new();
    let mut line = |text: String| {
        s.push_str(&text);
        s.push('\n');
    };
    line("## HTTP scheduler".to_owned());
    line(String::new());
    line(format!(
        "`fanfold bench http` measures how close the HTTP backend's scheduler comes to the best possible schedule when the endpoint is never the bottleneck. An in-process axum server on 127.0.0.1 (its own tokio runtime, {} worker threads) answers every `POST /v1/chat/completions` after a fixed {latency_ms} ms, waited with `tokio::time::sleep`, with a small JSON completion and its usage. fanfold's `OpenAiBackend` sends to it with `max_concurrency` equal to the job's slots, no requests- or tokens-per-minute budget, and the default prefix warm-up: the first request goes alone and the fan-out starts when it has answered. The job is a queue of N requests made by the bench; its `slots()` is the concurrency c. Each configuration gets a fresh server and a fresh backend, so opening its connections is part of the measured time.",
        mock_workers()
    ));
    line(String::new());
    line("The ideal wall time with the warm-up is latency + ⌈(N − 1) / c⌉ × latency; without it, ⌈N / c⌉ × latency. Efficiency is ideal / measured wall time; the target is at least 95% against the warm-up ideal. Mean concurrency is the sum of per-request times divided by the wall time: on the client side from the job's `next` to its `complete`, on the server side the handler's time.".to_owned());
    line(String::new());
    line(format!(
        "Measured on {} ({} cores), Linux {}, {} build, {}; load average {load} when the bench started. The mock server shares the process and the cores with fanfold.",
        crate::report::cpu_model(),
        cores(),
        crate::report::kernel(),
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        crate::report::utc_date(SystemTime::now()),
    ));
    line(String::new());
    let header: Vec<String> = results
        .iter()
        .map(|m| format!("N = {}, c = {}", m.requests, m.concurrency))
        .collect();
    line(format!("| | {} |", header.join(" | ")));
    line(format!("|---|{}", "---:|".repeat(results.len())));
    let mut row = |label: &str, f: &dyn Fn(&Measured) -> String| {
        let cells: Vec<String> = results.iter().map(f).collect();
        line(format!("| {label} | {} |", cells.join(" | ")));
    };
    row("wall time", &|m| format!("{:.3} s", m.wall.as_secs_f64()));
    row("ideal with warm-up", &|m| {
        format!("{:.3} s", ms_to_s(m.ideal_ms(true)))
    });
    row("**efficiency** (against the warm-up ideal)", &|m| {
        format!("**{:.1}%**", m.efficiency(true) * 100.0)
    });
    row("ideal without warm-up, ⌈N / c⌉ × latency", &|m| {
        format!("{:.3} s", ms_to_s(m.ideal_ms(false)))
    });
    row("efficiency against that", &|m| {
        format!("{:.1}%", m.efficiency(false) * 100.0)
    });
    row("mean concurrency, client side", &|m| {
        format!("{:.1}", m.client_mean_concurrency())
    });
    row("mean concurrency, server side", &|m| {
        format!("{:.1}", m.server_mean_concurrency())
    });
    row("max in flight, client side (job)", &|m| {
        m.client_max_in_flight.to_string()
    });
    row("max in flight, server side", &|m| {
        m.server_max_in_flight.to_string()
    });
    row("requests answered by the server", &|m| {
        m.server.requests.to_string()
    });
    row("HTTP attempts / retries", &|m| {
        format!("{} / {}", m.http_requests, m.retries)
    });
    row("succeeded / failed", &|m| {
        format!("{} / {}", m.succeeded, m.failed)
    });
    row("warm-up request answered", &|m| {
        if m.warm_up_answered { "yes" } else { "no" }.to_owned()
    });
    row("fanfold CPU per request", &|m| {
        per_request(m.cpu.fanfold_ns, m.requests)
    });
    row("mock server CPU per request", &|m| {
        per_request(m.cpu.mock_ns, m.requests)
    });
    row("process CPU per request (user + sys, both sides)", &|m| {
        per_request(m.cpu.process_ns, m.requests)
    });
    line(String::new());
    line(format!(
        "fanfold CPU is the thread that calls `run` (it polls every request's future and this bench's queue) plus the backend's `{BACKEND_THREAD}` runtime threads (sockets, timers, connection tasks); mock server CPU is the server runtime's threads. Both are read per thread from `/proc/self/task/*/schedstat` before and after the run. Process CPU is user + sys of the whole process from `/proc/self/stat` (10 ms ticks) and includes the mock server's share."
    ));
    line(String::new());
    let verdicts: Vec<String> = results
        .iter()
        .map(|m| {
            let e = m.efficiency(true) * 100.0;
            format!(
                "N = {}, c = {}: {e:.1}% ({})",
                m.requests,
                m.concurrency,
                if e >= 95.0 {
                    "meets the 95% target"
                } else {
                    "below the 95% target"
                }
            )
        })
        .collect();
    line(format!(
        "Efficiency against the warm-up ideal: {}.",
        verdicts.join("; ")
    ));
    for m in results {
        if let Some(e) = &m.first_error {
            line(String::new());
            line(format!(
                "N = {}, c = {}: {} request(s) failed; the first: {e}",
                m.requests, m.concurrency, m.failed
            ));
        }
        if m.server.rejected > 0 {
            line(String::new());
            line(format!(
                "N = {}, c = {}: the server refused {} request body(ies) as not a chat request.",
                m.requests, m.concurrency, m.server.rejected
            ));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ideal_time_counts_the_warm_up_alone() {
        // 10,000 at 256: 39 full waves and one of 16; the warm-up adds a
        // wave of one in front of the other 9,999.
        assert_eq!(ideal_ms(10_000, 256, 200, false), 40 * 200);
        assert_eq!(ideal_ms(10_000, 256, 200, true), 200 + 40 * 200);
        assert_eq!(ideal_ms(1_000, 64, 200, false), 16 * 200);
        assert_eq!(ideal_ms(1_000, 64, 200, true), 200 + 16 * 200);
        // When n - 1 fills whole waves the warm-up costs a full latency.
        assert_eq!(ideal_ms(257, 256, 100, true), 200);
        assert_eq!(ideal_ms(257, 256, 100, false), 200);
        assert_eq!(ideal_ms(256, 256, 100, true), 200);
        assert_eq!(ideal_ms(256, 256, 100, false), 100);
        assert_eq!(ideal_ms(1, 8, 50, true), 50);
        assert_eq!(ideal_ms(0, 8, 50, true), 0);
    }

    #[test]
    fn splice_replaces_only_its_section() {
        let old = "# Benchmarks\n\n<!-- bench:fabric:start -->\nF\n<!-- bench:fabric:end -->\n";
        let added = crate::report::splice_marked(old, NAME, "A\n").expect("appends");
        assert!(added.starts_with(old));
        assert!(added.ends_with("<!-- bench:http:start -->\nA\n<!-- bench:http:end -->\n"));
        let replaced = crate::report::splice_marked(&added, NAME, "B\n").expect("replaces");
        assert_eq!(replaced, added.replace("\nA\n", "\nB\n"));
        assert!(crate::report::splice_marked("<!-- bench:http:end -->", NAME, "x").is_err());
    }

    #[test]
    fn stat_line_with_spaces_in_the_name() {
        let line = "42 (a b) c) S 1 42 42 0 -1 4194560 100 0 0 0 7 3 0 0 20 0 1 0";
        assert_eq!(stat_cpu_ns(line), Some(10 * TICK_NS));
    }
}
