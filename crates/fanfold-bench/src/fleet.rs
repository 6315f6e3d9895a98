//! `fanfold bench fleet`: `fanfold run` processes sharing one PostgreSQL
//! store (a throwaway server), against a loopback judge with a fixed
//! latency and a declared capacity (requests it serves at once; more
//! wait).
//!
//! - Scaling: 1, 2, 4 and 8 processes with a fixed number of slots each
//!   over the same records; throughput against 1 process times N.
//! - Overhead: one process on the scripted backend (no latency, so the
//!   wall is fanfold's own work) with the store in SQLite and in
//!   PostgreSQL: the store's cost per unit.
//! - Faults: a fleet whose processes are killed with SIGKILL, one at a
//!   time at random, and replaced; every unit must end with one fact, the
//!   calls paid twice are counted at the judge, and the answer is compared
//!   with one process's on SQLite.
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
/// as backend `scripted`.
fn workspace(dir: &Path, units: usize, judge_url: &str, slots: usize) -> Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let spec = format!(
        r#"name = "fleet"
question = "Which records are flagged?"

[input]
path = "input.jsonl"
partition = {{ type = "jsonl", key = "id", kind = "row" }}

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

/// One `fanfold run` of the spec.
fn start_run(
    exe: &Path,
    spec: &Path,
    store: &str,
    backend: &str,
    slots: usize,
    out: &Path,
) -> Result<Child> {
    let log = std::fs::File::create(out.with_extension("log"))?;
    Command::new(exe)
        .arg("run")
        .arg(spec)
        .args(["--store", store, "--backend", backend, "--json"])
        .args(["--slots", &slots.to_string(), "--lease-secs", "3"])
        .arg("--out")
        .arg(out)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting {}", exe.display()))
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

struct Scaling {
    processes: usize,
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
}

struct Faults {
    units: usize,
    processes: usize,
    kills: usize,
    wall: Duration,
    facts: u64,
    calls: usize,
    repeated_units: usize,
    killed_slots: usize,
    same_as_sqlite: bool,
    survivors: usize,
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

    // Overhead: one process, no model latency, each store.
    let spec = workspace(&tmp.path().join("scale"), args.units, &url, args.slots)?;
    let timed = |store: &str, out: &Path| -> Result<Duration> {
        let t = Instant::now();
        finish(
            start_run(&exe, &spec, store, "scripted", args.slots, out)?,
            out,
        )?;
        Ok(t.elapsed())
    };
    eprintln!("bench fleet: store overhead, {} records", args.units);
    let sqlite_store = tmp.path().join("overhead.sqlite").display().to_string();
    let overhead = Overhead {
        units: args.units,
        sqlite: timed(&sqlite_store, &tmp.path().join("overhead-sqlite"))?,
        postgres: timed(
            &pg.create_database().map_err(|e| anyhow!(e))?,
            &tmp.path().join("overhead-postgres"),
        )?,
    };
    eprintln!(
        "  SQLite {:.2} s, PostgreSQL {:.2} s",
        overhead.sqlite.as_secs_f64(),
        overhead.postgres.as_secs_f64()
    );

    // Scaling.
    let mut scaling = Vec::new();
    for &n in &args.processes {
        eprintln!(
            "bench fleet: {n} processes x {} slots, {} records, {} ms",
            args.slots, args.units, args.latency_ms
        );
        let store = pg.create_database().map_err(|e| anyhow!(e))?;
        judge.take();
        let t = Instant::now();
        let outs: Vec<PathBuf> = (0..n)
            .map(|i| tmp.path().join(format!("scale-{n}-{i}")))
            .collect();
        let children = outs
            .iter()
            .map(|out| start_run(&exe, &spec, &store, "http", args.slots, out))
            .collect::<Result<Vec<_>>>()?;
        for (child, out) in children.into_iter().zip(&outs) {
            finish(child, out)?;
        }
        let wall = t.elapsed();
        let max_in_flight = judge.max_in_flight.load(Ordering::SeqCst);
        let calls = judge.take();
        let answers = outs
            .iter()
            .map(|o| answer(o).map(|(items, _)| items))
            .collect::<Result<Vec<_>>>()?;
        let row = Scaling {
            processes: n,
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
        scaling.push(row);
    }

    let faults = fault_run(&exe, &pg, &judge, tmp.path(), args)?;
    let section = render(args, &load, started, &overhead, &scaling, &faults);
    crate::report::write_marked_section(&args.report, NAME, &section)?;
    eprintln!("wrote {}", args.report.display());
    Ok(())
}

/// Four processes over `fault_units` records; one is killed with SIGKILL
/// at a random moment and a new one started in its place, `kills` times.
fn fault_run(
    exe: &Path,
    pg: &Postgres,
    judge: &Judge,
    tmp: &Path,
    args: &FleetArgs,
) -> Result<Faults> {
    let processes = 4;
    let spec = workspace(
        &tmp.join("faults"),
        args.fault_units,
        &judge.server.openai_url(),
        args.slots,
    )?;
    eprintln!(
        "bench fleet: faults, {} records, {processes} processes, {} kills",
        args.fault_units, args.kills
    );
    // The answer one process gives on SQLite.
    let base_out = tmp.join("faults-sqlite");
    let base_store = tmp.join("faults.sqlite").display().to_string();
    finish(
        start_run(exe, &spec, &base_store, "http", args.slots, &base_out)?,
        &base_out,
    )?;
    let (_, expected) = answer(&base_out)?;
    judge.take();

    let store = pg.create_database().map_err(|e| anyhow!(e))?;
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut random = move |n: usize| {
        // xorshift: a fixed sequence, so two runs kill alike.
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n.max(1) as u64) as usize
    };
    let mut serial = 0;
    let mut live: Vec<(Child, PathBuf)> = Vec::new();
    let mut start = |live: &mut Vec<(Child, PathBuf)>| -> Result<()> {
        let out = tmp.join(format!("faults-{serial}"));
        serial += 1;
        live.push((
            start_run(exe, &spec, &store, "http", args.slots, &out)?,
            out,
        ));
        Ok(())
    };
    let t = Instant::now();
    for _ in 0..processes {
        start(&mut live)?;
    }
    // Spread the kills over about half the work a fault-free fleet takes.
    let ideal = args.fault_units as f64 * args.latency_ms as f64
        / (processes * args.slots).min(args.capacity) as f64;
    let gap = Duration::from_millis((ideal / 2.0 / args.kills.max(1) as f64).max(50.0) as u64);
    let mut kills = 0;
    while kills < args.kills {
        std::thread::sleep(gap);
        let victim = random(live.len());
        let (mut child, out) = live.swap_remove(victim);
        if child.try_wait()?.is_some() {
            // It finished already: nothing left to kill.
            live.push((child, out));
            break;
        }
        child.kill()?;
        child.wait()?;
        kills += 1;
        start(&mut live)?;
    }
    let mut survivors = 0;
    let mut answers = Vec::new();
    for (child, out) in live {
        finish(child, &out)?;
        survivors += 1;
        answers.push(answer(&out)?.1);
    }
    let wall = t.elapsed();
    let calls = judge.take();
    Ok(Faults {
        units: args.fault_units,
        processes,
        kills,
        wall,
        facts: count_facts(&store)?,
        calls: calls.values().sum(),
        repeated_units: calls.values().filter(|c| **c > 1).count(),
        killed_slots: kills * args.slots,
        same_as_sqlite: answers.iter().all(|a| *a == expected),
        survivors,
    })
}

fn render(
    args: &FleetArgs,
    load: &str,
    started: SystemTime,
    overhead: &Overhead,
    scaling: &[Scaling],
    faults: &Faults,
) -> String {
    let mut s = String::new();
    s.push_str("## Fleet: processes sharing a PostgreSQL store\n\n");
    s.push_str(&format!(
        "`fanfold bench fleet`, {}; {}; load before: {load}. A throwaway PostgreSQL server on loopback; the judge is a loopback OpenAI-compatible endpoint answering after {} ms, serving at most {} requests at once. Each process is a whole `fanfold run` with {} slots and 3 s leases.\n\n",
        crate::report::utc_datetime(started),
        crate::report::machine_line(),
        args.latency_ms,
        args.capacity,
        args.slots,
    ));
    let per_unit = |d: Duration| d.as_secs_f64() * 1e6 / overhead.units as f64;
    s.push_str(&format!(
        "**Store overhead** (one process, the scripted backend, {} records, so the wall is fanfold's own work): SQLite {:.2} s ({:.0} µs a record), PostgreSQL {:.2} s ({:.0} µs a record).\n\n",
        overhead.units,
        overhead.sqlite.as_secs_f64(),
        per_unit(overhead.sqlite),
        overhead.postgres.as_secs_f64(),
        per_unit(overhead.postgres),
    ));
    s.push_str(&format!(
        "**Scaling** over {} records:\n\n| processes | wall | records/s | vs 1 process × N | judge's ideal | calls | units paid twice | facts | most in flight at the judge | answers agree |\n|---|---|---|---|---|---|---|---|---|---|\n",
        args.units
    ));
    let base = scaling
        .iter()
        .find(|r| r.processes == 1)
        .map(|r| args.units as f64 / r.wall.as_secs_f64());
    for r in scaling {
        let rate = args.units as f64 / r.wall.as_secs_f64();
        let efficiency = base
            .map(|b| format!("{:.2}", rate / (b * r.processes as f64)))
            .unwrap_or_else(|| "–".into());
        let concurrent = (r.processes * args.slots).min(args.capacity);
        let ideal = args.units as f64 * args.latency_ms as f64 / 1000.0 / concurrent as f64;
        s.push_str(&format!(
            "| {} | {:.1} s | {:.0} | {} | {:.1} s | {} | {} | {} | {} | {} |\n",
            r.processes,
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
    s.push_str(&format!(
        "\n**Faults**: {} processes over {} records; {} times one of them, chosen at random, was killed with SIGKILL and a new one started. {} processes finished, in {:.1} s. Facts stored: {} (one per record: {}). Calls at the judge: {} for {} records, {} paid again ({} records called more than once); at most {} could be: the kills times the slots a process has in flight. The survivors' answers are {} one process's answer on SQLite.\n",
        faults.processes,
        faults.units,
        faults.kills,
        faults.survivors,
        faults.wall.as_secs_f64(),
        faults.facts,
        if faults.facts == faults.units as u64 { "yes" } else { "no" },
        faults.calls,
        faults.units,
        faults.calls.saturating_sub(faults.units),
        faults.repeated_units,
        faults.killed_slots,
        if faults.same_as_sqlite { "the same as" } else { "NOT the same as" },
    ));
    s
}
