//! `fanfold bench fleet`: processes sharing one PostgreSQL store (a
//! throwaway server), against a loopback judge with a fixed latency and a
//! declared capacity (requests it serves at once; more wait).
//!
//! - Overhead: one process on the scripted backend (no latency, so the
//!   wall is fanfold's own work) with the store in SQLite and in
//!   PostgreSQL, and a coordinator with one worker: the store's cost per
//!   unit, and the queue's.
//! - Scaling: a coordinator with 1, 2, 4 and 8 workers of a fixed number
//!   of slots each, and as many whole `fanfold run` processes (peers),
//!   over the same records; throughput against 1 times N.
//! - Faults: workers killed with SIGKILL, one at a time at random, and
//!   replaced; every unit must end with one fact, the calls paid twice
//!   are counted at the judge against the calls the killed workers held,
//!   and the answer is compared with one process's on SQLite.
//! - Budget: four workers under one `max_model_calls`, counted at the
//!   judge.
//! - Partition: a worker paused (SIGSTOP) past its lease, then resumed.
//!
//! Every figure is measured here; the judge counts the calls.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, anyhow, bail, ensure};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use clap::Args;
use fanfold_testkit::{Postgres, Server, wire};
use serde_json::{Value, json};

const NAME: &str = "fleet";

#[derive(Args)]
pub struct FleetArgs {
    /// Records in the scaling runs.
    #[arg(long, default_value_t = 20_000)]
    units: usize,
    /// The judge's latency per request.
    #[arg(long, default_value_t = 100)]
    latency_ms: u64,
    /// Requests in flight per process (`--slots`).
    #[arg(long, default_value_t = 8)]
    slots: usize,
    /// Requests the judge serves at once; more wait their turn.
    #[arg(long, default_value_t = 64)]
    capacity: usize,
    /// Process counts of the scaling runs.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
    processes: Vec<usize>,
    /// Also scale whole `fanfold run` processes (peers), not only workers.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    peers: bool,
    /// The budget of the budget run (`max_model_calls`).
    #[arg(long, default_value_t = 100)]
    budget_calls: u64,
    /// Records in the fault runs.
    #[arg(long, default_value_t = 4_000)]
    fault_units: usize,
    /// Processes killed, one at a time, in the fault run.
    #[arg(long, default_value_t = 20)]
    kills: usize,
    /// The Markdown report; only its fleet section is replaced.
    #[arg(long, value_name = "PATH", default_value = "docs/benchmarks.md")]
    report: PathBuf,
}

/// The loopback judge: answers `yes` for a flagged record after the
/// latency, at most `capacity` at once, counting the calls per record.
struct Judge {
    server: Server,
    calls: Arc<Mutex<HashMap<String, usize>>>,
    max_in_flight: Arc<AtomicUsize>,
}

#[derive(Clone)]
struct JudgeState {
    calls: Arc<Mutex<HashMap<String, usize>>>,
    gate: Arc<tokio::sync::Semaphore>,
    latency: Duration,
    in_flight: Arc<AtomicUsize>,
    max_in_flight: Arc<AtomicUsize>,
}

async fn judge(State(s): State<JudgeState>, body: Bytes) -> Response {
    let body: Value = serde_json::from_slice(&body).unwrap_or_default();
    let content = wire::user_content(&body).unwrap_or_default();
    let Some((id, record)) = wire::record_of(content) else {
        return wire::json_reply(
            StatusCode::BAD_REQUEST,
            json!({"error": {"message": "unrecognised request"}}),
        );
    };
    let Ok(_permit) = s.gate.acquire().await else {
        return wire::json_reply(StatusCode::SERVICE_UNAVAILABLE, json!({}));
    };
    // Counted as it arrives: a call a killed process had in flight was
    // made, and is paid again by the process that takes its unit.
    if let Ok(mut calls) = s.calls.lock() {
        *calls.entry(id).or_default() += 1;
    }
    let now = s.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    s.max_in_flight.fetch_max(now, Ordering::SeqCst);
    tokio::time::sleep(s.latency).await;
    s.in_flight.fetch_sub(1, Ordering::SeqCst);
    let flagged = record.get("flag") == Some(&Value::Bool(true));
    let answer = json!({"decision": if flagged { "yes" } else { "no" }}).to_string();
    wire::json_reply(
        StatusCode::OK,
        wire::openai_chat_reply("m", &answer, content.len()),
    )
}

impl Judge {
    fn start(latency: Duration, capacity: usize) -> Result<Judge> {
        let calls = Arc::new(Mutex::new(HashMap::new()));
        let max_in_flight = Arc::new(AtomicUsize::new(0));
        let state = JudgeState {
            calls: calls.clone(),
            gate: Arc::new(tokio::sync::Semaphore::new(capacity)),
            latency,
            in_flight: Arc::new(AtomicUsize::new(0)),
            max_in_flight: max_in_flight.clone(),
        };
        let app = axum::Router::new()
            .route("/v1/chat/completions", axum::routing::post(judge))
            .with_state(state);
        Ok(Judge {
            server: Server::start(app).context("starting the judge")?,
            calls,
            max_in_flight,
        })
    }

    /// The calls per record since the last `take`.
    fn take(&self) -> HashMap<String, usize> {
        self.max_in_flight.store(0, Ordering::SeqCst);
        self.calls
            .lock()
            .map(|mut c| std::mem::take(&mut *c))
            .unwrap_or_default()
    }
}

/// A folder with a spec over `units` records (every third flagged), the
/// judge as backend `http` (`slots` requests in flight) and the same rule
/// as backend `scripted`; `max_calls` as its budget when given.
fn workspace(
    dir: &Path,
    units: usize,
    judge_url: &str,
    slots: usize,
    max_calls: Option<u64>,
) -> Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let budget = max_calls
        .map(|n| format!("[budget]\nmax_model_calls = {n}\n"))
        .unwrap_or_default();
    let spec = format!(
        r#"name = "fleet"
question = "Which records are flagged?"

[input]
path = "input.jsonl"
partition = {{ type = "jsonl", key = "id", kind = "row" }}

{budget}
[[stages]]
name = "judge"
type = "map"
version = 1
rubric = "rubric.md"
output_schema = "schema.json"
decision = {{ pointer = "/decision", positive = ["yes"], negative = ["no"] }}

[backends.http]
type = "openai"
model = "m"
base_url = "{judge_url}"
max_concurrency = {slots}

[backends.scripted]
type = "scripted"
script = "judge.jq"

[fold]
fan_in = 16
[[fold.reducers]]
name = "flagged"
type = "set"

[contract]
type = "exhaustive"
answer = "flagged"
"#
    );
    std::fs::write(dir.join("spec.toml"), spec)?;
    std::fs::write(
        dir.join("rubric.md"),
        "Say yes when the record is flagged.\n",
    )?;
    std::fs::write(
        dir.join("schema.json"),
        r#"{"type": "object", "required": ["decision"], "properties": {"decision": {"enum": ["yes", "no"]}}}"#,
    )?;
    std::fs::write(
        dir.join("judge.jq"),
        r#"{decision: (if .flag == true then "yes" else "no" end)}"#,
    )?;
    let mut input = String::new();
    for i in 0..units {
        input.push_str(&json!({"id": i, "flag": i % 3 == 0}).to_string());
        input.push('\n');
    }
    std::fs::write(dir.join("input.jsonl"), input)?;
    Ok(dir.join("spec.toml"))
}

/// How a run is started: alone, or as a coordinator whose calls workers
/// make (`--workers N`: N started by the run itself, 0 for none).
#[derive(Clone, Copy)]
enum Role {
    Alone,
    Coordinator { workers: usize },
}

/// One `fanfold run` of the spec, logging beside `out`.
fn start_run(
    exe: &Path,
    spec: &Path,
    store: &str,
    backend: &str,
    slots: usize,
    role: Role,
    out: &Path,
) -> Result<Child> {
    let log = std::fs::File::create(out.with_extension("log"))?;
    let mut cmd = Command::new(exe);
    cmd.arg("run")
        .arg(spec)
        .args(["--store", store, "--backend", backend, "--json"])
        .args(["--slots", &slots.to_string(), "--lease-secs", "3"])
        .arg("--out")
        .arg(out);
    if let Role::Coordinator { workers } = role {
        cmd.args(["--workers", &workers.to_string()]);
    }
    cmd.stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting {}", exe.display()))
}

/// One `fanfold worker` with `slots` and 3 s leases, allowed to send to
/// the judge at `judge`, logging to `log`.
fn start_worker(exe: &Path, store: &str, judge: &str, slots: usize, log: &Path) -> Result<Child> {
    Command::new(exe)
        .args(["worker", "--store", store, "--lease-secs", "3"])
        .args(["--slots", &slots.to_string()])
        .args(["--allow-endpoint", judge])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log)?)
        .spawn()
        .with_context(|| format!("starting {} worker", exe.display()))
}

/// `n` workers with `slots` each, logging to `{name}-worker-{i}.log` in
/// `tmp`.
fn start_pool(
    exe: &Path,
    store: &str,
    judge: &str,
    slots: usize,
    tmp: &Path,
    name: &str,
    n: usize,
) -> Result<Vec<(Child, PathBuf)>> {
    (0..n)
        .map(|i| {
            let log = tmp.join(format!("{name}-worker-{i}.log"));
            Ok((start_worker(exe, store, judge, slots, &log)?, log))
        })
        .collect()
}

/// A coordinator for `workers` workers of `slots` each, started elsewhere,
/// with twice their slots: a queue as deep as the calls in flight, so a
/// worker whose call ends finds the next one waiting.
fn start_coordinator(
    exe: &Path,
    spec: &Path,
    store: &str,
    slots: usize,
    workers: usize,
    out: &Path,
) -> Result<Child> {
    let role = Role::Coordinator { workers: 0 };
    start_run(exe, spec, store, "http", 2 * workers * slots, role, out)
}

/// Sends `signal` (`TERM`, `STOP`, `CONT`) to a process.
fn signal(child: &Child, signal: &str) -> Result<()> {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(child.id().to_string())
        .status()?;
    ensure!(status.success(), "kill -{signal} {}", child.id());
    Ok(())
}

/// Stops workers with SIGTERM and waits for them; the answers each wrote
/// late (after another worker's stood), from their logs.
fn stop_workers(workers: Vec<(Child, PathBuf)>) -> Result<u64> {
    for (w, _) in &workers {
        signal(w, "TERM")?;
    }
    let mut late = 0;
    for (mut w, log) in workers {
        let status = w.wait()?;
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        ensure!(status.success(), "worker ended {status}: {text}");
        late += text
            .split_once("calls answered, ")
            .and_then(|(_, rest)| rest.split(' ').next()?.parse::<u64>().ok())
            .unwrap_or(0);
    }
    Ok(late)
}

/// Waits for a run; an error with its log when it did not answer.
fn finish(mut child: Child, out: &Path) -> Result<()> {
    let status = child.wait()?;
    if !status.success() {
        let log = std::fs::read_to_string(out.with_extension("log")).unwrap_or_default();
        bail!("run {} ended {status}: {log}", out.display());
    }
    Ok(())
}

/// The answer's items, and their unit ids in order.
fn answer(out: &Path) -> Result<(Value, Vec<String>)> {
    let path = out.join("answer.json");
    let text = std::fs::read_to_string(&path).with_context(|| path.display().to_string())?;
    let v: Value = serde_json::from_str(&text)?;
    let items = v.get("items").cloned().unwrap_or(Value::Null);
    let ids = items
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|i| i.get("unit_id").and_then(Value::as_str).map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    Ok((items, ids))
}

fn count_facts(store: &str) -> Result<u64> {
    Ok(fanfold_store::Store::open(Path::new(store))?.count_facts()?)
}

/// One scaling row: a coordinator and N workers, or N peers.
struct Scaling {
    processes: usize,
    workers: bool,
    wall: Duration,
    calls: usize,
    repeats: usize,
    facts: u64,
    max_in_flight: usize,
    agree: bool,
}

struct Overhead {
    units: usize,
    sqlite: Duration,
    postgres: Duration,
    /// A coordinator and one worker on PostgreSQL.
    fleet: Duration,
}

struct Faults {
    units: usize,
    workers: usize,
    kills: usize,
    wall: Duration,
    facts: u64,
    calls: usize,
    repeated_units: usize,
    /// The calls the killed workers held, read from the store just before
    /// each kill.
    held_at_kills: u64,
    same_as_sqlite: bool,
}

struct Budgeted {
    workers: usize,
    limit: u64,
    calls: usize,
    complete: bool,
}

struct Partition {
    units: usize,
    facts: u64,
    calls: usize,
    repeated_units: usize,
    slots: usize,
    late: u64,
    same_as_sqlite: bool,
}

pub fn main(args: &FleetArgs) -> Result<()> {
    ensure!(
        args.units >= 1 && args.fault_units >= 1,
        "units must be at least 1"
    );
    ensure!(
        args.slots >= 1 && args.capacity >= 1,
        "slots and capacity must be at least 1"
    );
    let started = SystemTime::now();
    let load = crate::report::load_average();
    let exe = std::env::current_exe().context("locating the fanfold executable")?;
    let pg = Postgres::start().map_err(|e| anyhow!("starting PostgreSQL: {e}"))?;
    let judge = Judge::start(Duration::from_millis(args.latency_ms), args.capacity)?;
    let tmp = tempfile::tempdir()?;
    let url = judge.server.openai_url();

    // Overhead: no model latency; one process on each store, then a
    // coordinator and one worker.
    let spec = workspace(
        &tmp.path().join("scale"),
        args.units,
        &url,
        args.slots,
        None,
    )?;
    let database = || pg.create_database().map_err(|e| anyhow!(e));
    let timed = |store: &str, role: Role, out: &Path| -> Result<Duration> {
        let t = Instant::now();
        finish(
            start_run(&exe, &spec, store, "scripted", args.slots, role, out)?,
            out,
        )?;
        Ok(t.elapsed())
    };
    eprintln!("bench fleet: store overhead, {} records", args.units);
    let sqlite_store = tmp.path().join("overhead.sqlite").display().to_string();
    let overhead = Overhead {
        units: args.units,
        sqlite: timed(
            &sqlite_store,
            Role::Alone,
            &tmp.path().join("overhead-sqlite"),
        )?,
        postgres: timed(
            &database()?,
            Role::Alone,
            &tmp.path().join("overhead-postgres"),
        )?,
        fleet: timed(
            &database()?,
            Role::Coordinator { workers: 1 },
            &tmp.path().join("overhead-fleet"),
        )?,
    };
    eprintln!(
        "  SQLite {:.2} s, PostgreSQL {:.2} s, coordinator and worker {:.2} s",
        overhead.sqlite.as_secs_f64(),
        overhead.postgres.as_secs_f64(),
        overhead.fleet.as_secs_f64()
    );

    let mut scaling = Vec::new();
    let modes: &[bool] = if args.peers { &[true, false] } else { &[true] };
    for &workers in modes {
        for &n in &args.processes {
            scaling.push(scale(
                &exe,
                &pg,
                &judge,
                &spec,
                tmp.path(),
                args,
                n,
                workers,
            )?);
        }
    }

    let faults = fault_run(&exe, &pg, &judge, tmp.path(), args)?;
    let budgeted = budget_run(&exe, &pg, &judge, tmp.path(), args)?;
    let partition = partition_run(&exe, &pg, &judge, tmp.path(), args)?;
    let section = render(
        args, &load, started, &overhead, &scaling, &faults, &budgeted, &partition,
    );
    crate::report::write_marked_section(&args.report, NAME, &section)?;
    eprintln!("wrote {}", args.report.display());
    Ok(())
}

/// One scaling row: `n` workers under one coordinator, or `n` peers.
#[allow(clippy::too_many_arguments)]
fn scale(
    exe: &Path,
    pg: &Postgres,
    judge: &Judge,
    spec: &Path,
    tmp: &Path,
    args: &FleetArgs,
    n: usize,
    workers: bool,
) -> Result<Scaling> {
    let what = if workers { "workers" } else { "peers" };
    eprintln!(
        "bench fleet: {n} {what} x {} slots, {} records, {} ms",
        args.slots, args.units, args.latency_ms
    );
    let store = pg.create_database().map_err(|e| anyhow!(e))?;
    judge.take();
    let t = Instant::now();
    let outs: Vec<PathBuf> = if workers {
        vec![tmp.join(format!("scale-{what}-{n}"))]
    } else {
        (0..n)
            .map(|i| tmp.join(format!("scale-{what}-{n}-{i}")))
            .collect()
    };
    let mut pool = Vec::new();
    let children = if workers {
        let judge_url = judge.server.openai_url();
        pool = start_pool(
            exe,
            &store,
            &judge_url,
            args.slots,
            tmp,
            &format!("scale-{n}"),
            n,
        )?;
        outs.iter()
            .map(|out| start_coordinator(exe, spec, &store, args.slots, n, out))
            .collect::<Result<Vec<_>>>()?
    } else {
        outs.iter()
            .map(|out| start_run(exe, spec, &store, "http", args.slots, Role::Alone, out))
            .collect::<Result<Vec<_>>>()?
    };
    for (child, out) in children.into_iter().zip(&outs) {
        finish(child, out)?;
    }
    let wall = t.elapsed();
    stop_workers(pool)?;
    let max_in_flight = judge.max_in_flight.load(Ordering::SeqCst);
    let calls = judge.take();
    let answers = outs
        .iter()
        .map(|o| answer(o).map(|(items, _)| items))
        .collect::<Result<Vec<_>>>()?;
    let row = Scaling {
        processes: n,
        workers,
        wall,
        calls: calls.values().sum(),
        repeats: calls.values().filter(|c| **c > 1).count(),
        facts: count_facts(&store)?,
        max_in_flight,
        agree: answers.iter().all(|a| Some(a) == answers.first()),
    };
    eprintln!(
        "  {:.2} s, {} calls, {} facts",
        wall.as_secs_f64(),
        row.calls,
        row.facts
    );
    Ok(row)
}

/// The answer one process gives on SQLite, for the fault runs' spec.
fn sqlite_answer(
    exe: &Path,
    spec: &Path,
    tmp: &Path,
    args: &FleetArgs,
    name: &str,
) -> Result<Vec<String>> {
    let out = tmp.join(format!("{name}-sqlite"));
    let store = tmp.join(format!("{name}.sqlite")).display().to_string();
    finish(
        start_run(exe, spec, &store, "http", args.slots, Role::Alone, &out)?,
        &out,
    )?;
    Ok(answer(&out)?.1)
}

/// The calls worker `child` holds now, as the store says.
fn held_by(store: &fanfold_store::Store, child: &Child) -> Result<u64> {
    Ok(store
        .workers(60_000)?
        .iter()
        .filter(|w| w.pid == child.id() && w.state != "stopped")
        .map(|w| w.holding)
        .sum())
}

/// A coordinator and four workers over `fault_units` records; one worker
/// is killed with SIGKILL at a random moment and a new one started in its
/// place, `kills` times.
fn fault_run(
    exe: &Path,
    pg: &Postgres,
    judge: &Judge,
    tmp: &Path,
    args: &FleetArgs,
) -> Result<Faults> {
    let workers = 4;
    let judge_url = judge.server.openai_url();
    let spec = workspace(
        &tmp.join("faults"),
        args.fault_units,
        &judge_url,
        args.slots,
        None,
    )?;
    eprintln!(
        "bench fleet: faults, {} records, {workers} workers, {} kills",
        args.fault_units, args.kills
    );
    let expected = sqlite_answer(exe, &spec, tmp, args, "faults")?;
    judge.take();

    let store = pg.create_database().map_err(|e| anyhow!(e))?;
    let watch = fanfold_store::Store::open(Path::new(&store))?;
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut random = move |n: usize| {
        // xorshift: a fixed sequence, so two runs kill alike.
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n.max(1) as u64) as usize
    };
    let mut serial = 0;
    let mut start = |live: &mut Vec<(Child, PathBuf)>| -> Result<()> {
        let log = tmp.join(format!("faults-worker-{serial}.log"));
        serial += 1;
        live.push((
            start_worker(exe, &store, &judge_url, args.slots, &log)?,
            log,
        ));
        Ok(())
    };
    let t = Instant::now();
    let mut live = Vec::new();
    for _ in 0..workers {
        start(&mut live)?;
    }
    let out = tmp.join("faults-fleet");
    let coordinator = start_coordinator(exe, &spec, &store, args.slots, workers, &out)?;
    // Spread the kills over about half the work a fault-free fleet takes.
    let ideal = args.fault_units as f64 * args.latency_ms as f64
        / (workers * args.slots).min(args.capacity) as f64;
    let gap = Duration::from_millis((ideal / 2.0 / args.kills.max(1) as f64).max(50.0) as u64);
    let mut kills = 0;
    let mut held_at_kills = 0;
    let mut coordinator = Some(coordinator);
    while kills < args.kills {
        std::thread::sleep(gap);
        if let Some(c) = coordinator.as_mut()
            && c.try_wait()?.is_some()
        {
            break;
        }
        let victim = random(live.len());
        let (mut child, _) = live.swap_remove(victim);
        held_at_kills += held_by(&watch, &child)?;
        child.kill()?;
        child.wait()?;
        kills += 1;
        start(&mut live)?;
    }
    if let Some(c) = coordinator.take() {
        finish(c, &out)?;
    }
    let wall = t.elapsed();
    stop_workers(live)?;
    let calls = judge.take();
    Ok(Faults {
        units: args.fault_units,
        workers,
        kills,
        wall,
        facts: count_facts(&store)?,
        calls: calls.values().sum(),
        repeated_units: calls.values().filter(|c| **c > 1).count(),
        held_at_kills,
        same_as_sqlite: answer(&out)?.1 == expected,
    })
}

/// Four workers under a coordinator whose budget allows `budget_calls`.
fn budget_run(
    exe: &Path,
    pg: &Postgres,
    judge: &Judge,
    tmp: &Path,
    args: &FleetArgs,
) -> Result<Budgeted> {
    let workers = 4;
    let spec = workspace(
        &tmp.join("budget"),
        args.fault_units,
        &judge.server.openai_url(),
        args.slots,
        Some(args.budget_calls),
    )?;
    eprintln!(
        "bench fleet: budget of {} calls, {workers} workers",
        args.budget_calls
    );
    let store = pg.create_database().map_err(|e| anyhow!(e))?;
    judge.take();
    let url = judge.server.openai_url();
    let pool = start_pool(exe, &store, &url, args.slots, tmp, "budget", workers)?;
    let out = tmp.join("budget-fleet");
    let mut coordinator = start_coordinator(exe, &spec, &store, args.slots, workers, &out)?;
    // The answer is incomplete (the budget ran out): the run says so in
    // its exit code, which is expected here.
    coordinator.wait()?;
    stop_workers(pool)?;
    let text = std::fs::read_to_string(out.join("answer.json"))?;
    let v: Value = serde_json::from_str(&text)?;
    Ok(Budgeted {
        workers,
        limit: args.budget_calls,
        calls: judge.take().values().sum(),
        complete: v.get("complete") == Some(&Value::Bool(true)),
    })
}

/// Two workers; one is paused with SIGSTOP past its 3 s lease, then
/// resumed.
fn partition_run(
    exe: &Path,
    pg: &Postgres,
    judge: &Judge,
    tmp: &Path,
    args: &FleetArgs,
) -> Result<Partition> {
    let units = args.fault_units.min(1_000);
    let spec = workspace(
        &tmp.join("partition"),
        units,
        &judge.server.openai_url(),
        args.slots,
        None,
    )?;
    eprintln!("bench fleet: partition, {units} records, a worker paused for 5 s");
    let expected = sqlite_answer(exe, &spec, tmp, args, "partition")?;
    judge.take();
    let store = pg.create_database().map_err(|e| anyhow!(e))?;
    let logs = [tmp.join("partition-0.log"), tmp.join("partition-1.log")];
    let url = judge.server.openai_url();
    let paused = start_worker(exe, &store, &url, args.slots, &logs[0])?;
    let out = tmp.join("partition-fleet");
    let coordinator = start_coordinator(exe, &spec, &store, args.slots, 2, &out)?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while judge.calls.lock().map(|c| c.len()).unwrap_or(0) < args.slots && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    signal(&paused, "STOP")?;
    let other = start_worker(exe, &store, &url, args.slots, &logs[1])?;
    std::thread::sleep(Duration::from_secs(5));
    signal(&paused, "CONT")?;
    finish(coordinator, &out)?;
    let [l0, l1] = logs;
    let late = stop_workers(vec![(paused, l0), (other, l1)])?;
    let calls = judge.take();
    Ok(Partition {
        units,
        facts: count_facts(&store)?,
        calls: calls.values().sum(),
        repeated_units: calls.values().filter(|c| **c > 1).count(),
        slots: args.slots,
        late,
        same_as_sqlite: answer(&out)?.1 == expected,
    })
}

#[allow(clippy::too_many_arguments)]
fn render(
    args: &FleetArgs,
    load: &str,
    started: SystemTime,
    overhead: &Overhead,
    scaling: &[Scaling],
    faults: &Faults,
    budgeted: &Budgeted,
    partition: &Partition,
) -> String {
    let mut s = String::new();
    s.push_str("## Fleet: processes sharing a PostgreSQL store\n\n");
    s.push_str(&format!(
        "`fanfold bench fleet`, {}; {}; load before: {load}. A throwaway PostgreSQL server on loopback; the judge is a loopback OpenAI-compatible endpoint answering after {} ms, serving at most {} requests at once. Workers (`fanfold worker`) have {} slots each and 3 s leases; their coordinator (`fanfold run --workers 0`) has twice as many slots as all its workers, so a queue as deep as the calls in flight: a worker whose call ends finds the next one waiting. Peers are whole `fanfold run` processes with {} slots each.\n\n",
        crate::report::utc_datetime(started),
        crate::report::machine_line(),
        args.latency_ms,
        args.capacity,
        args.slots,
        args.slots,
    ));
    let per_unit = |d: Duration| d.as_secs_f64() * 1e6 / overhead.units as f64;
    s.push_str(&format!(
        "**Store overhead** (the scripted backend, {} records, so the wall is fanfold's own work): one process on SQLite {:.2} s ({:.0} µs a record), on PostgreSQL {:.2} s ({:.0} µs a record); a coordinator and one worker on PostgreSQL {:.2} s ({:.0} µs a record).\n\n",
        overhead.units,
        overhead.sqlite.as_secs_f64(),
        per_unit(overhead.sqlite),
        overhead.postgres.as_secs_f64(),
        per_unit(overhead.postgres),
        overhead.fleet.as_secs_f64(),
        per_unit(overhead.fleet),
    ));
    s.push_str(&format!(
        "**Scaling** over {} records:\n\n| processes | wall | records/s | vs 1 × N | judge's ideal | calls | units paid twice | facts | most in flight at the judge | answers agree |\n|---|---|---|---|---|---|---|---|---|---|\n",
        args.units
    ));
    for workers in [true, false] {
        let rows: Vec<&Scaling> = scaling.iter().filter(|r| r.workers == workers).collect();
        let base = rows
            .iter()
            .find(|r| r.processes == 1)
            .map(|r| args.units as f64 / r.wall.as_secs_f64());
        for r in rows {
            let rate = args.units as f64 / r.wall.as_secs_f64();
            let efficiency = base
                .map(|b| format!("{:.2}", rate / (b * r.processes as f64)))
                .unwrap_or_else(|| "–".into());
            let concurrent = (r.processes * args.slots).min(args.capacity);
            let ideal = args.units as f64 * args.latency_ms as f64 / 1000.0 / concurrent as f64;
            let what = if workers {
                format!("coordinator + {} workers", r.processes)
            } else {
                format!("{} peers", r.processes)
            };
            s.push_str(&format!(
                "| {what} | {:.1} s | {:.0} | {} | {:.1} s | {} | {} | {} | {} | {} |\n",
                r.wall.as_secs_f64(),
                rate,
                efficiency,
                ideal,
                r.calls,
                r.repeats,
                r.facts,
                r.max_in_flight,
                if r.agree { "yes" } else { "no" },
            ));
        }
    }
    s.push_str(&format!(
        "\n**Faults**: a coordinator and {} workers over {} records; {} times one worker, chosen at random, was killed with SIGKILL and a new one started. The run answered in {:.1} s. Facts stored: {} (one per record: {}). Calls at the judge: {} for {} records, {} paid again ({} records called more than once); the killed workers held {} calls when they were killed (read from the store just before each kill). The answer is {} one process's answer on SQLite.\n\n",
        faults.workers,
        faults.units,
        faults.kills,
        faults.wall.as_secs_f64(),
        faults.facts,
        if faults.facts == faults.units as u64 { "yes" } else { "no" },
        faults.calls,
        faults.units,
        faults.calls.saturating_sub(faults.units),
        faults.repeated_units,
        faults.held_at_kills,
        if faults.same_as_sqlite { "the same as" } else { "NOT the same as" },
    ));
    s.push_str(&format!(
        "**Budget**: {} workers under one coordinator with `max_model_calls = {}`: {} calls reached the judge; the answer says it is {}.\n\n",
        budgeted.workers,
        budgeted.limit,
        budgeted.calls,
        if budgeted.complete { "complete" } else { "incomplete" },
    ));
    s.push_str(&format!(
        "**Partition**: two workers over {} records; one was paused with SIGSTOP for 5 s (past its 3 s lease), then resumed. Facts stored: {} (one per record: {}). Calls at the judge: {}, {} records called more than once (at most the paused worker's {} slots); the paused worker's answers that came after another's stood: {} (no-ops). The answer is {} one process's answer on SQLite.\n",
        partition.units,
        partition.facts,
        if partition.facts == partition.units as u64 { "yes" } else { "no" },
        partition.calls,
        partition.repeated_units,
        partition.slots,
        partition.late,
        if partition.same_as_sqlite { "the same as" } else { "NOT the same as" },
    ));
    s
}
