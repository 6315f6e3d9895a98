//! fanfold on a PostgreSQL store that several processes share (a
//! throwaway server per test): they split the units between them through
//! their leases, and give the answer one process gives on SQLite.

use super::*;

mod rows;
mod trust;

/// Waits until the judge has answered `n` calls in all.
fn wait_for_calls(calls: &Calls, n: usize) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while calls.lock().expect("calls").values().sum::<usize>() < n {
        assert!(std::time::Instant::now() < deadline, "no calls came");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// One fact a unit in the store at `url`, every unit called, and at most
/// `slots` units called twice: those in flight when a process stopped, and
/// for a whole run (a peer) those it had decided and not yet written (a
/// shared store's facts are written within a few milliseconds).
fn assert_one_fact_a_unit(
    url: &str,
    calls: &Calls,
    units: usize,
    slots: usize,
) -> fanfold_store::Store {
    let store = fanfold_store::Store::open(std::path::Path::new(url)).expect("store");
    assert_eq!(
        store.count_facts().expect("facts"),
        units as u64,
        "one fact a unit"
    );
    let calls = calls.lock().expect("calls");
    assert_eq!(calls.len(), units, "every unit called");
    let repeats: Vec<_> = calls.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        repeats.len() <= slots && repeats.iter().all(|(_, n)| **n == 2),
        "only the units in flight of a process that stopped are paid twice: {repeats:?}"
    );
    store
}

fn postgres() -> fanfold_testkit::Postgres {
    fanfold_testkit::Postgres::start()
        .unwrap_or_else(|e| panic!("a PostgreSQL server for this test: {e}"))
}

/// The items one process answers on SQLite (in `out0`); the judge's count
/// is cleared after it.
fn answer_on_sqlite(f: &Fixture, calls: &Calls) -> Value {
    let sqlite = f.path("store.sqlite");
    let mut one = [start_run(f, &sqlite.display().to_string(), 0)];
    let codes = wait_all(&mut one, std::time::Duration::from_secs(120));
    let err = std::fs::read_to_string(f.path("err0.log")).unwrap_or_default();
    assert_eq!(codes, [Some(0)], "{err}");
    calls.lock().expect("calls").clear();
    items(f, 0)
}

/// Sends signal `name` (`STOP`, `CONT`, `TERM`) to `child`.
fn signal(child: &std::process::Child, name: &str) {
    let o = run(std::process::Command::new("kill")
        .arg(format!("-{name}"))
        .arg(child.id().to_string()));
    assert!(o.status.success(), "kill -{name}: {}", stderr(&o));
}

/// The same spec gives the same answer on SQLite with one process and on
/// PostgreSQL with four, which call each unit once between them; `status`
/// reads the shared store.
#[test]
fn four_processes_on_postgres_answer_as_one_process_on_sqlite() {
    let pg = postgres();
    let url = pg.create_database().expect("database");
    let units: usize = 48;
    let (f, _server, calls) = judge_fixture(units);
    let expected = answer_on_sqlite(&f, &calls);
    assert_eq!(expected.as_array().map(Vec::len), Some(units.div_ceil(3)));

    let mut fleet: Vec<_> = (1..=4).map(|n| start_run(&f, &url, n)).collect();
    let codes = wait_all(&mut fleet, std::time::Duration::from_secs(120));
    for (i, code) in codes.iter().enumerate() {
        let n = i + 1;
        let err = std::fs::read_to_string(f.path(&format!("err{n}.log"))).unwrap_or_default();
        assert_eq!(*code, Some(0), "run {n}: {err}");
        assert_eq!(items(&f, n), expected, "run {n} answers as SQLite did");
    }
    {
        let calls = calls.lock().expect("calls");
        assert_eq!(calls.len(), units, "every unit called");
        let repeats: Vec<_> = calls.iter().filter(|(_, n)| **n > 1).collect();
        assert!(repeats.is_empty(), "called more than once: {repeats:?}");
    }
    let store = fanfold_store::Store::open(std::path::Path::new(&url)).expect("store");
    assert_eq!(store.count_facts().expect("facts"), units as u64);

    // `status` reads the shared store: four runs, each completed.
    let o = run(bin().args(["status", "--json", "--store", &url]));
    assert!(o.status.success(), "{}", stderr(&o));
    let runs: Vec<Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect();
    assert_eq!(runs.len(), 4, "{runs:?}");
    assert!(
        runs.iter()
            .all(|r| r.get("stop_reason") == Some(&Value::from("completed"))),
        "{runs:?}"
    );

    // A rerun on the shared store pays for nothing.
    calls.lock().expect("calls").clear();
    let mut again = [start_run(&f, &url, 5)];
    assert_eq!(
        wait_all(&mut again, std::time::Duration::from_secs(60)),
        [Some(0)]
    );
    assert_eq!(items(&f, 5), expected);
    assert!(
        calls.lock().expect("calls").is_empty(),
        "no calls on a rerun"
    );
}

/// A process killed with SIGKILL loses only its units in flight: the
/// others take them once its leases lapse, every unit ends with one fact,
/// and the answer is whole.
#[test]
fn a_killed_process_on_postgres_loses_only_its_units_in_flight() {
    let pg = postgres();
    let url = pg.create_database().expect("database");
    let units: usize = 60;
    let (f, _server, calls) = judge_fixture(units);
    let slots = 2;
    let start = |n: usize| start_leased(&f, &url, n, slots, 3);
    let mut children: Vec<_> = (0..3).map(start).collect();
    // Kill the first once a sixth of the units were answered.
    wait_for_calls(&calls, units / 6);
    children[0].kill().expect("SIGKILL");
    children[0].wait().expect("reaped");
    let mut survivors = children.split_off(1);
    let codes = wait_all(&mut survivors, std::time::Duration::from_secs(120));
    for (i, code) in codes.iter().enumerate() {
        let n = i + 1;
        let err = std::fs::read_to_string(f.path(&format!("err{n}.log"))).unwrap_or_default();
        assert_eq!(*code, Some(0), "run {n}: {err}");
    }
    let (a, b) = (items(&f, 1), items(&f, 2));
    assert_eq!(a, b, "the survivors agree");
    let ids: Vec<String> = a
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|i| i.get("unit_id").and_then(Value::as_str).map(str::to_owned))
        .collect();
    let expected: Vec<String> = (0..units)
        .filter(|i| i % 3 == 0)
        .map(|i| i.to_string())
        .collect();
    let mut sorted = ids.clone();
    sorted.sort_by_key(|s| s.parse::<usize>().unwrap_or(usize::MAX));
    assert_eq!(sorted, expected, "the answer is whole");

    // In flight, or decided in the last write's few milliseconds.
    let store = assert_one_fact_a_unit(&url, &calls, units, 2 * slots);
    // The killed run ends `abandoned` once noticed; the others completed.
    let runs = store.run_overview(10).expect("runs");
    let reasons: Vec<Option<String>> = runs.iter().map(|r| r.stop_reason.clone()).collect();
    assert_eq!(
        reasons
            .iter()
            .filter(|r| r.as_deref() == Some("completed"))
            .count(),
        2,
        "{reasons:?}"
    );
}

/// A process paused (SIGSTOP) past its leases, then resumed: the other
/// takes its units meanwhile, the paused one's late writes change nothing
/// (the first fact under a key stands), and both answer whole and alike.
#[test]
fn a_process_paused_past_its_leases_writes_nothing_twice_on_postgres() {
    let pg = postgres();
    let url = pg.create_database().expect("database");
    let units: usize = 60;
    let (f, _server, calls) = judge_fixture(units);
    let slots = 2;
    let start = |n: usize| start_leased(&f, &url, n, slots, 3);
    let mut paused = start(0);
    wait_for_calls(&calls, 4);
    signal(&paused, "STOP");
    let mut other = [start(1)];
    // The other runs while the first is stopped past its 3 s leases.
    std::thread::sleep(std::time::Duration::from_secs(5));
    signal(&paused, "CONT");
    let codes = wait_all(&mut other, std::time::Duration::from_secs(120));
    let err = std::fs::read_to_string(f.path("err1.log")).unwrap_or_default();
    assert_eq!(codes, [Some(0)], "{err}");
    let status = paused.wait().expect("paused run ends");
    let err = std::fs::read_to_string(f.path("err0.log")).unwrap_or_default();
    assert_eq!(status.code(), Some(0), "{err}");
    assert_eq!(items(&f, 0), items(&f, 1), "both answer alike");
    assert_eq!(
        items(&f, 1).as_array().map(Vec::len),
        Some(units.div_ceil(3)),
        "the answer is whole"
    );
    // In flight, or decided in the last write's few milliseconds.
    assert_one_fact_a_unit(&url, &calls, units, 2 * slots);
}

/// A run goes on through a restart of the PostgreSQL server (a failover,
/// an upgrade): its store connection is opened again, and it answers
/// whole with one fact a unit.
#[test]
fn a_run_goes_on_through_a_postgres_restart() {
    let pg = postgres();
    let url = pg.create_database().expect("database");
    let units: usize = 60;
    let (f, _server, calls) = judge_fixture(units);
    let mut child = [start_leased(&f, &url, 0, 2, 60)];
    wait_for_calls(&calls, 10);
    pg.restart().expect("restart");
    let at_restart = calls.lock().expect("calls").len();
    assert!(at_restart < units, "the run was still going at the restart");
    let codes = wait_all(&mut child, std::time::Duration::from_secs(120));
    let err = std::fs::read_to_string(f.path("err0.log")).unwrap_or_default();
    assert_eq!(codes, [Some(0)], "{err}");
    assert_eq!(
        items(&f, 0).as_array().map(Vec::len),
        Some(units.div_ceil(3))
    );
    let store = fanfold_store::Store::open(std::path::Path::new(&url)).expect("store");
    assert_eq!(store.count_facts().expect("facts"), units as u64);
}

/// A coordinator, `fanfold run --workers N` with `slots` calls out across
/// the fleet and leases of 3 s; its answer goes to `out{n}`.
fn start_coordinator(
    f: &Fixture,
    store: &str,
    n: usize,
    slots: usize,
    workers: usize,
) -> std::process::Child {
    start_run_with(f, store, n, slots, 3, &["--workers", &workers.to_string()])
}

/// An external `fanfold worker` with `slots` and leases of 3 s, logging
/// to `worker{n}.log`.
fn start_worker(f: &Fixture, store: &str, n: usize, slots: usize) -> std::process::Child {
    start_worker_with(f, store, n, slots, &[])
}

/// The `--allow-endpoint` arguments for every `base_url` the fixture's
/// spec names: a worker sends only where it was told to.
fn allowances(f: &Fixture) -> Vec<String> {
    let spec = std::fs::read_to_string(f.path("spec.toml")).expect("spec");
    spec.lines()
        .filter_map(|l| l.trim().strip_prefix("base_url = \""))
        .filter_map(|rest| rest.split('"').next())
        .flat_map(|url| ["--allow-endpoint".to_owned(), url.to_owned()])
        .collect()
}

/// [`start_worker`] with `extra` arguments.
fn start_worker_with(
    f: &Fixture,
    store: &str,
    n: usize,
    slots: usize,
    extra: &[&str],
) -> std::process::Child {
    let log = std::fs::File::create(f.path(&format!("worker{n}.log"))).expect("log");
    bin()
        .args(["worker", "--store", store, "--lease-secs", "3"])
        .args(["--slots", &slots.to_string()])
        .args(allowances(f))
        .args(extra)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("starts")
}

/// Stops workers as a service manager does (SIGTERM); each must end by
/// itself, cleanly. Their logs.
fn stop_workers(f: &Fixture, workers: &mut [std::process::Child]) -> Vec<String> {
    for w in workers.iter() {
        signal(w, "TERM");
    }
    let codes = wait_all(workers, std::time::Duration::from_secs(30));
    (0..workers.len())
        .map(|n| {
            let log =
                std::fs::read_to_string(f.path(&format!("worker{n}.log"))).unwrap_or_default();
            assert_eq!(codes[n], Some(0), "worker {n}: {log}");
            assert!(log.contains("stopped:"), "worker {n}: {log}");
            log
        })
        .collect()
}

/// The coordinator's exit code and its log.
fn coordinator_done(f: &Fixture, child: std::process::Child, n: usize) -> (Option<i32>, String) {
    let codes = wait_all(&mut [child], std::time::Duration::from_secs(120));
    let err = std::fs::read_to_string(f.path(&format!("err{n}.log"))).unwrap_or_default();
    (codes[0], err)
}

/// A run whose model calls are made by workers it starts itself gives the
/// answer a run without workers gives, on SQLite; the scripted backend's
/// script reaches the workers through the store.
#[test]
fn a_run_with_local_workers_answers_as_a_run_without() {
    let f = Fixture::new(JSON_ARRAY, "");
    let rows: Vec<Value> = (0..40)
        .map(|i| serde_json::json!({"id": i, "flag": i % 4 == 1}))
        .collect();
    f.input(&serde_json::to_vec(&rows).expect("rows"));
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let expected = f.answer_ids();
    assert_eq!(expected.len(), 10);

    let store = f.path("fleet.sqlite");
    let o = run(bin()
        .arg("run")
        .arg(f.path("spec.toml"))
        .arg("--store")
        .arg(&store)
        .arg("--out")
        .arg(f.path("out"))
        .args(["--json", "--workers", "2", "--slots", "6"]));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(f.answer_ids(), expected);
    assert_eq!(
        f.certificate()["verify"]["passed"],
        true,
        "verified like any run"
    );
    // Both workers stopped cleanly when the run ended, and answered every
    // call between them.
    assert_eq!(
        sqlite3(
            &store,
            "SELECT COUNT(*), SUM(calls) FROM fleet_workers WHERE state = 'stopped';"
        )
        .trim(),
        "2|40"
    );
    assert_eq!(
        sqlite3(&store, "SELECT COUNT(*) FROM fleet_tasks;").trim(),
        "0",
        "the queue is empty"
    );
}

/// The same spec gives the same answer on SQLite with one process and on
/// PostgreSQL with a coordinator and four workers started on their own,
/// which call each unit once between them; `status` shows the workers.
#[test]
fn four_workers_on_postgres_answer_as_one_process_on_sqlite() {
    let pg = postgres();
    let url = pg.create_database().expect("database");
    let units: usize = 48;
    let (f, _server, calls) = judge_fixture(units);
    let expected = answer_on_sqlite(&f, &calls);

    let mut workers: Vec<_> = (0..4).map(|n| start_worker(&f, &url, n, 3)).collect();
    let coordinator = start_coordinator(&f, &url, 1, 12, 0);
    let (code, err) = coordinator_done(&f, coordinator, 1);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(items(&f, 1), expected, "answers as SQLite did");
    {
        let calls = calls.lock().expect("calls");
        assert_eq!(calls.len(), units, "every unit called");
        let repeats: Vec<_> = calls.iter().filter(|(_, n)| **n > 1).collect();
        assert!(repeats.is_empty(), "called more than once: {repeats:?}");
    }
    let o = run(bin().args(["status", "--store", &url]));
    assert!(o.status.success(), "{}", stderr(&o));
    let shown = stdout(&o);
    assert_eq!(
        shown.lines().filter(|l| l.contains(" slots, ")).count(),
        4,
        "{shown}"
    );
    let logs = stop_workers(&f, &mut workers);
    let answered: u64 = logs
        .iter()
        .filter_map(|l| {
            let (_, rest) = l.split_once("stopped: ")?;
            rest.split(' ').next()?.parse::<u64>().ok()
        })
        .sum();
    assert_eq!(answered, units as u64, "{logs:?}");
}

/// Four workers share the coordinator's budget: `max_model_calls = 20`
/// lets 20 calls reach the endpoint between them, never more, and the
/// answer says it is incomplete.
#[test]
fn four_workers_share_one_budget() {
    let pg = postgres();
    let url = pg.create_database().expect("database");
    let rows: Vec<Value> = (0..60)
        .map(|i| serde_json::json!({"id": i, "flag": i % 3 == 0, "delay_ms": 30}))
        .collect();
    let (f, _server, calls) = judged(&rows, "[budget]\nmax_model_calls = 20", None);
    let mut workers: Vec<_> = (0..4).map(|n| start_worker(&f, &url, n, 4)).collect();
    let coordinator = start_coordinator(&f, &url, 0, 16, 0);
    let (code, err) = coordinator_done(&f, coordinator, 0);
    assert_ne!(
        code,
        Some(0),
        "an incomplete answer is not a success: {err}"
    );
    let made: usize = calls.lock().expect("calls").values().sum();
    assert_eq!(made, 20, "the budget, and no call past it");
    let answer: Value =
        serde_json::from_str(&std::fs::read_to_string(f.path("out0/answer.json")).expect("answer"))
            .expect("json");
    assert_eq!(answer["complete"], false);
    stop_workers(&f, &mut workers);
}

/// A worker killed with SIGKILL loses only its calls in flight: once their
/// leases lapse the other workers take them, every unit ends with one
/// fact, and the answer is whole.
#[test]
fn a_killed_worker_loses_only_its_calls_in_flight() {
    let pg = postgres();
    let url = pg.create_database().expect("database");
    let units: usize = 60;
    let (f, _server, calls) = judge_fixture(units);
    let slots = 3;
    let mut workers: Vec<_> = (0..3).map(|n| start_worker(&f, &url, n, slots)).collect();
    let coordinator = start_coordinator(&f, &url, 0, 9, 0);
    wait_for_calls(&calls, units / 6);
    let mut killed = workers.pop().expect("a worker");
    killed.kill().expect("SIGKILL");
    killed.wait().expect("reaped");
    let (code, err) = coordinator_done(&f, coordinator, 0);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        items(&f, 0).as_array().map(Vec::len),
        Some(units.div_ceil(3)),
        "the answer is whole"
    );
    assert_one_fact_a_unit(&url, &calls, units, slots);
    stop_workers(&f, &mut workers);
}

/// A worker paused (SIGSTOP) past its leases, then resumed: the others
/// take its calls meanwhile, and its late answers change nothing.
#[test]
fn a_worker_paused_past_its_leases_writes_nothing_twice() {
    let pg = postgres();
    let url = pg.create_database().expect("database");
    let units: usize = 60;
    let (f, _server, calls) = judge_fixture(units);
    let slots = 3;
    let paused = start_worker(&f, &url, 0, slots);
    let coordinator = start_coordinator(&f, &url, 0, 6, 0);
    wait_for_calls(&calls, 4);
    signal(&paused, "STOP");
    let other = start_worker(&f, &url, 1, slots);
    std::thread::sleep(std::time::Duration::from_secs(5));
    signal(&paused, "CONT");
    let (code, err) = coordinator_done(&f, coordinator, 0);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        items(&f, 0).as_array().map(Vec::len),
        Some(units.div_ceil(3)),
        "the answer is whole"
    );
    assert_one_fact_a_unit(&url, &calls, units, slots);
    let logs = stop_workers(&f, &mut [paused, other]);
    assert!(
        !logs[0].contains(" 0 answered late"),
        "its answers after the pause came late: {}",
        logs[0]
    );
}

/// When the coordinator stops early (its wall budget spent), the workers
/// learn it within one lease period: no call starts after that, and they
/// hold nothing.
#[test]
fn a_stop_reaches_every_worker_within_one_lease() {
    let pg = postgres();
    let url = pg.create_database().expect("database");
    let rows: Vec<Value> = (0..200)
        .map(|i| serde_json::json!({"id": i, "flag": false, "delay_ms": 400}))
        .collect();
    let (f, _server, calls) = judged(&rows, "[budget]\nmax_wall_secs = 3", None);
    let mut workers: Vec<_> = (0..2).map(|n| start_worker(&f, &url, n, 4)).collect();
    let coordinator = start_coordinator(&f, &url, 0, 8, 0);
    let (code, err) = coordinator_done(&f, coordinator, 0);
    assert_ne!(code, Some(0), "stopped on its budget: {err}");
    // One lease (3 s) later, nothing more is asked.
    std::thread::sleep(std::time::Duration::from_secs(3));
    let settled: usize = calls.lock().expect("calls").values().sum();
    assert!(settled < 200, "the run stopped early");
    std::thread::sleep(std::time::Duration::from_secs(2));
    let later: usize = calls.lock().expect("calls").values().sum();
    assert_eq!(later, settled, "no call after the stop reached the workers");
    let store = fanfold_store::Store::open(std::path::Path::new(&url)).expect("store");
    let held: u64 = store
        .workers(60_000)
        .expect("workers")
        .iter()
        .map(|w| w.holding)
        .sum();
    assert_eq!(held, 0, "the workers hold nothing");
    stop_workers(&f, &mut workers);
}

/// Four workers on one endpoint share its `requests_per_minute` through the
/// store: together they send at its rate, not four times it.
#[test]
fn workers_share_an_endpoints_requests_per_minute() {
    let pg = postgres();
    let url = pg.create_database().expect("database");
    let units = 20;
    let rows: Vec<Value> = (0..units)
        .map(|i| serde_json::json!({"id": i, "flag": i % 2 == 0, "delay_ms": 10}))
        .collect();
    let (f, _server, calls) = judged(&rows, "requests_per_minute = 120", None);
    let mut workers: Vec<_> = (0..4).map(|n| start_worker(&f, &url, n, 4)).collect();
    let started = std::time::Instant::now();
    let coordinator = start_coordinator(&f, &url, 0, 16, 0);
    let (code, err) = coordinator_done(&f, coordinator, 0);
    let wall = started.elapsed();
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(calls.lock().expect("calls").values().sum::<usize>(), units);
    // 120 a minute holds two at once and two more a second: 20 calls take
    // 9 s at the least. Four workers each spending the whole limit would
    // take about 1.5 s.
    assert!(
        wall >= std::time::Duration::from_secs(8),
        "20 calls at 2 a second took {wall:?}"
    );
    stop_workers(&f, &mut workers);
}

/// A worker runs the embedded model itself: the coordinator loads no
/// model, the worker loads it once and scores each decision as a run
/// would, and the facts are the embedded model's.
#[test]
fn a_worker_runs_the_embedded_model_for_its_coordinator() {
    let f = choice_fixture();
    let o = f.run(&["--slots", "2", "--workers", "1"]);
    assert!(matches!(o.status.code(), Some(0 | 3)), "{}", stderr(&o));
    let facts = f.jsonl("out/facts.jsonl");
    assert_eq!(facts.len(), 6);
    for fact in &facts {
        assert_eq!(fact["model"]["backend"], "llama", "{fact}");
        assert!(fact["decision"].is_string(), "decided: {fact}");
        // The decision was read from the model's scores, in the worker.
        assert_eq!(
            fact["choice_scores"].as_array().map(Vec::len),
            Some(2),
            "{fact}"
        );
    }
    assert_eq!(
        sqlite3(
            &f.path("store.sqlite"),
            "SELECT COUNT(*), SUM(calls) FROM fleet_workers WHERE state = 'stopped';"
        )
        .trim(),
        "1|6"
    );
}

/// A worker pointed at its own model server (`--endpoint`) sends the calls
/// there, not to the endpoint the spec declares, and the facts are stored
/// as the declared backend's.
#[test]
fn a_worker_sends_its_calls_to_its_own_endpoint() {
    let pg = postgres();
    let url = pg.create_database().expect("database");
    // The spec's endpoint has no server behind it.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let units = 12;
    let rows: Vec<Value> = (0..units)
        .map(|i| serde_json::json!({"id": i, "flag": i % 3 == 0, "delay_ms": 10}))
        .collect();
    let declared = format!("http://127.0.0.1:{dead}/v1");
    let (f, server, calls) = judged(&rows, "", Some(&declared));
    let mut worker = [start_worker_with(
        &f,
        &url,
        0,
        4,
        &["--endpoint", &server.openai_url()],
    )];
    let coordinator = start_coordinator(&f, &url, 0, 8, 0);
    let (code, err) = coordinator_done(&f, coordinator, 0);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        calls.lock().expect("calls").len(),
        units,
        "every call came here"
    );
    let facts: Vec<Value> = std::fs::read_to_string(f.path("out0/facts.jsonl"))
        .expect("facts")
        .lines()
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect();
    assert_eq!(facts.len(), units);
    let model = facts[0]["model"]["model_id"].as_str().expect("model id");
    assert!(
        model.contains(&format!("127.0.0.1:{dead}")),
        "keyed as the declared backend: {model}"
    );
    stop_workers(&f, &mut worker);
}

/// A mock OpenAI endpoint that judges as the counting judge does, and
/// whose `GET /v1/models` lists model `m` with the weights at `root`.
fn listing_judge(root: &str) -> (fanfold_testkit::Server, Calls) {
    use axum::extract::State;
    async fn judge(
        State(calls): State<Calls>,
        body: axum::body::Bytes,
    ) -> axum::response::Response {
        let body: Value = serde_json::from_slice(&body).unwrap_or_default();
        let content = fanfold_testkit::wire::user_content(&body).unwrap_or_default();
        let Some((id, record)) = fanfold_testkit::wire::record_of(content) else {
            return fanfold_testkit::wire::json_reply(
                axum::http::StatusCode::BAD_REQUEST,
                serde_json::json!({"error": {"message": "unrecognised request"}}),
            );
        };
        *calls.lock().expect("calls").entry(id).or_default() += 1;
        let decision = if record["flag"] == true { "yes" } else { "no" };
        let answer = serde_json::json!({"decision": decision}).to_string();
        fanfold_testkit::wire::json_reply(
            axum::http::StatusCode::OK,
            fanfold_testkit::wire::openai_chat_reply("m", &answer, content.len()),
        )
    }
    let listing = serde_json::json!({"object": "list", "data": [
        {"id": "m", "object": "model", "owned_by": "test", "root": root}
    ]});
    let calls = Calls::default();
    let app = axum::Router::new()
        .route("/v1/chat/completions", axum::routing::post(judge))
        .route(
            "/v1/models",
            axum::routing::get(move || std::future::ready(axum::Json(listing.clone()))),
        )
        .with_state(calls.clone());
    (
        fanfold_testkit::Server::start(app).expect("mock server"),
        calls,
    )
}

/// `units` rows, every third flagged, under backend `http` whose table is
/// `backend` (its endpoint or endpoints).
fn http_fixture(units: usize, backend: &str) -> Fixture {
    let rows: Vec<Value> = (0..units)
        .map(|i| serde_json::json!({"id": i, "flag": i % 3 == 0}))
        .collect();
    let f = Fixture::new(
        JSON_ARRAY,
        &format!("[backends.http]\ntype = \"openai\"\nmodel = \"m\"\n{backend}\n"),
    );
    f.input(&serde_json::to_vec(&rows).expect("rows"));
    f
}

/// Waits until `file` in the fixture holds `needle`; the file's text.
fn wait_for_line(f: &Fixture, file: &str, needle: &str) -> String {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let text = std::fs::read_to_string(f.path(file)).unwrap_or_default();
        if text.contains(needle) {
            return text;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{file} never said `{needle}`: {text}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// A worker whose own `--endpoint` lists other weights than the endpoint
/// the job's facts are keyed by refuses the job, says why, and sends it
/// nothing; the job stays for a worker whose endpoint serves the same
/// weights, which answers it whole.
#[test]
fn a_worker_whose_endpoint_serves_other_weights_refuses_the_job() {
    let pg = postgres();
    let url = pg.create_database().expect("database");
    let units = 12;
    let (declared, declared_calls) = listing_judge("/weights/a.gguf");
    let (other, other_calls) = listing_judge("/weights/b.gguf");
    let (same, same_calls) = listing_judge("/weights/a.gguf");
    let f = http_fixture(units, &format!("base_url = \"{}\"", declared.openai_url()));
    let refusing = start_worker_with(&f, &url, 0, 4, &["--endpoint", &other.openai_url()]);
    let coordinator = start_coordinator(&f, &url, 0, 8, 0);
    let log = wait_for_line(&f, "worker0.log", "job refused");
    assert!(
        log.contains(&format!("endpoint {}", other.openai_url()))
            && log.contains("it serves `m#")
            && log.contains("the job's facts are keyed by `m#"),
        "{log}"
    );
    let taking = start_worker_with(&f, &url, 1, 4, &["--endpoint", &same.openai_url()]);
    let (code, err) = coordinator_done(&f, coordinator, 0);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        items(&f, 0).as_array().map(Vec::len),
        Some(units.div_ceil(3)),
        "the answer is whole"
    );
    assert!(
        other_calls.lock().expect("calls").is_empty(),
        "nothing was sent to the endpoint serving other weights"
    );
    assert_eq!(same_calls.lock().expect("calls").len(), units);
    assert!(declared_calls.lock().expect("calls").is_empty());
    // Both stop cleanly: the refusal ended nothing but that job there.
    let logs = stop_workers(&f, &mut [refusing, taking]);
    assert!(logs[0].contains("stopped: 0 calls answered"), "{}", logs[0]);
}

/// Every endpoint of a weighted pool is asked what it serves: a pool whose
/// second member lists other weights is refused before any call, naming
/// both endpoints and what each serves; the same pool with a second member
/// serving the same weights runs.
#[test]
fn a_pool_whose_second_endpoint_serves_other_weights_is_refused() {
    let (first, first_calls) = listing_judge("/weights/a.gguf");
    let (other, other_calls) = listing_judge("/weights/b.gguf");
    let (same, same_calls) = listing_judge("/weights/a.gguf");
    let pool = |second: &fanfold_testkit::Server| {
        format!(
            "endpoints = [{{ base_url = \"{}\", weight = 3 }}, {{ base_url = \"{}\" }}]",
            first.openai_url(),
            second.openai_url()
        )
    };
    let units = 9;

    let f = http_fixture(units, &pool(&other));
    let o = f.run(&["--backend", "http"]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(6), "{err}");
    assert!(err.contains("serve different models"), "{err}");
    for server in [&first, &other] {
        assert!(
            err.contains(&format!("{} serves `m#", server.openai_url())),
            "{err}"
        );
    }
    assert!(
        first_calls.lock().expect("calls").is_empty()
            && other_calls.lock().expect("calls").is_empty(),
        "no call was paid"
    );

    let f = http_fixture(units, &pool(&same));
    let o = f.run(&["--backend", "http"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let paid = first_calls.lock().expect("calls").len() + same_calls.lock().expect("calls").len();
    assert_eq!(paid, units, "the pool of one model answered every unit");
}

/// `fanfold run --workers 1` with `slots` on `store`, its store's
/// reconnect wait `reconnect_secs`, writing to `out{n}` and `err{n}.log`.
fn start_impatient_coordinator(
    f: &Fixture,
    store: &str,
    n: usize,
    slots: usize,
    reconnect_secs: u64,
) -> std::process::Child {
    let log = std::fs::File::create(f.path(&format!("err{n}.log"))).expect("log");
    bin()
        .arg("run")
        .arg(f.path("spec.toml"))
        .args(["--store", store, "--backend", "http", "--json"])
        .args(["--slots", &slots.to_string(), "--workers", "1"])
        .args(["--lease-secs", "3"])
        .arg("--out")
        .arg(f.path(&format!("out{n}")))
        .env("FANFOLD_STORE_RECONNECT_SECS", reconnect_secs.to_string())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("starts")
}

/// A PostgreSQL server that stays down past the store's reconnect wait
/// ends a fleet run as a store failure: exit 2 (not a backend's 6), a
/// message that says the store failed and what a rerun does, no answer
/// written. Once the server is back, a rerun pays only for the units
/// without a stored fact.
#[test]
fn a_store_down_past_its_reconnect_wait_ends_a_fleet_run_as_a_store_failure() {
    let pg = postgres();
    let url = pg.create_database().expect("database");
    let units: usize = 60;
    let rows: Vec<Value> = (0..units)
        .map(|i| serde_json::json!({"id": i, "flag": i % 3 == 0, "delay_ms": 150}))
        .collect();
    let (f, _server, calls) = judged(&rows, "", None);
    let coordinator = start_impatient_coordinator(&f, &url, 0, 2, 2);
    wait_for_calls(&calls, 10);
    pg.stop().expect("the server stops");
    let (code, err) = coordinator_done(&f, coordinator, 0);
    assert_eq!(code, Some(2), "the store's exit code: {err}");
    assert!(err.contains("the store failed"), "{err}");
    assert!(
        err.contains("run the same command once the store answers again"),
        "{err}"
    );
    assert!(
        !f.path("out0/answer.json").exists(),
        "no answer pretends to be one"
    );

    pg.start_again().expect("the server starts again");
    let stored = fanfold_store::Store::open(std::path::Path::new(&url))
        .expect("store")
        .count_facts()
        .expect("facts") as usize;
    assert!(
        stored > 0 && stored < units,
        "{stored} facts stored before the outage"
    );
    calls.lock().expect("calls").clear();
    let mut rerun = [start_run(&f, &url, 1)];
    let codes = wait_all(&mut rerun, std::time::Duration::from_secs(120));
    let err = std::fs::read_to_string(f.path("err1.log")).unwrap_or_default();
    assert_eq!(codes, [Some(0)], "{err}");
    assert_eq!(
        items(&f, 1).as_array().map(Vec::len),
        Some(units.div_ceil(3)),
        "the rerun answers whole"
    );
    let calls = calls.lock().expect("calls");
    assert_eq!(
        calls.len(),
        units - stored,
        "only the units without a stored fact are paid for"
    );
    assert!(calls.values().all(|n| *n == 1), "{calls:?}");
}
