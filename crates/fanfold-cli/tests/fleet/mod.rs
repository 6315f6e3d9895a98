//! fanfold on a PostgreSQL store that several processes share (a
//! throwaway server per test): they split the units between them through
//! their leases, and give the answer one process gives on SQLite.

use super::*;

/// Waits until the judge has answered `n` calls in all.
fn wait_for_calls(calls: &Calls, n: usize) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while calls.lock().expect("calls").values().sum::<usize>() < n {
        assert!(std::time::Instant::now() < deadline, "no calls came");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// One fact a unit in the store at `url`, every unit called, and at most
/// `slots` units (those in flight when a process stopped) called twice.
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

/// The same spec gives the same answer on SQLite with one process and on
/// PostgreSQL with four, which call each unit once between them; `status`
/// reads the shared store.
#[test]
fn four_processes_on_postgres_answer_as_one_process_on_sqlite() {
    let pg = postgres();
    let url = pg.create_database().expect("database");
    let units: usize = 48;
    let (f, _server, calls) = judge_fixture(units);

    let sqlite = f.path("store.sqlite");
    let mut one = [start_run(&f, &sqlite.display().to_string(), 0)];
    let codes = wait_all(&mut one, std::time::Duration::from_secs(120));
    let err = std::fs::read_to_string(f.path("err0.log")).unwrap_or_default();
    assert_eq!(codes, [Some(0)], "{err}");
    let expected = items(&f, 0);
    assert_eq!(expected.as_array().map(Vec::len), Some(units.div_ceil(3)));
    calls.lock().expect("calls").clear();

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

    let store = assert_one_fact_a_unit(&url, &calls, units, slots);
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
    let signal = |name: &str| {
        let o = run(std::process::Command::new("kill")
            .arg(format!("-{name}"))
            .arg(paused.id().to_string()));
        assert!(o.status.success(), "kill -{name}: {}", stderr(&o));
    };
    signal("STOP");
    let mut other = [start(1)];
    // The other runs while the first is stopped past its 3 s leases.
    std::thread::sleep(std::time::Duration::from_secs(5));
    signal("CONT");
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
    assert_one_fact_a_unit(&url, &calls, units, slots);
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
