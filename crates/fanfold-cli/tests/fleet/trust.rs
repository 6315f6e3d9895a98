//! A worker never obeys a store row blindly: whoever can write the store
//! must not choose which files a worker writes, where it sends, or which
//! key it sends. The fleet's budget holds when workers die mid-call, and
//! a coordinator with no worker left ends instead of waiting forever.

use super::*;

/// A live run holding one open job, keyed by `model_id`, whose backend is
/// `backend` (a portable backend as the engine writes it), with one task
/// waiting; planted straight into the store at `path`, as anyone who can
/// write the store could.
pub(super) fn planted_job(path: &Path, run: &str, backend: &Value, model_id: &str) {
    let store = fanfold_store::Store::open(path).expect("store");
    let h = fanfold_core::ContentHash::of_bytes(b"planted");
    store.begin_run(run, "t", &h, &h).expect("run");
    let job = fanfold_store::FleetJob {
        job_id: format!("{run}/0"),
        run_id: run.to_owned(),
        backend: backend.to_string(),
        model_id: model_id.to_owned(),
        prefix: "p".into(),
        options: fanfold_engine::fleet::options_row(&fanfold_model::JobOptions::default())
            .expect("options"),
    };
    store.open_fleet_job(&job).expect("job");
    let task = fanfold_engine::fleet::task_row(&fanfold_model::Request {
        index: 0,
        unit_id: "u0".into(),
        suffix: "s".into(),
        input: serde_json::json!({"id": 0}),
        attempt: 1,
        max_output_tokens: 16,
        schema: None,
    })
    .expect("task");
    store
        .put_fleet_tasks(&job.job_id, &[(0, task)])
        .expect("task");
}

/// A worker on `store` with its temporary files under `tmp`, logging to
/// `log`, stopping after 20 s without work.
pub(super) fn worker_in(
    tmp: &Path,
    store: &Path,
    log: &Path,
    extra: &[&str],
) -> std::process::Child {
    let log = std::fs::File::create(log).expect("log");
    bin()
        .arg("worker")
        .arg("--store")
        .arg(store)
        .args([
            "--lease-secs",
            "30",
            "--slots",
            "1",
            "--idle-exit-secs",
            "20",
        ])
        .args(extra)
        .env("TMPDIR", tmp)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("starts")
}

/// Waits until `path` holds `needle`; its text.
pub(super) fn wait_for_text(path: &Path, needle: &str) -> String {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.contains(needle) {
            return text;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{} never said `{needle}`: {text}",
            path.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Every file under `dir`, recursively.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                todo.push(p);
            } else {
                found.push(p);
            }
        }
    }
    found
}

/// Stops `worker` (SIGTERM) and waits for it.
pub(super) fn stop(mut worker: std::process::Child) {
    signal(&worker, "TERM");
    let _ = wait_all(
        std::slice::from_mut(&mut worker),
        std::time::Duration::from_secs(30),
    );
}

/// A job whose files are named `../../escaped.jq` or by an absolute path
/// is refused, naming the file, and nothing is written anywhere: not
/// outside the worker's folder, and not inside it either.
#[test]
fn a_job_naming_a_file_outside_the_workers_folder_is_refused_and_nothing_is_written() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tmp = dir.path().join("tmp");
    std::fs::create_dir_all(&tmp).expect("tmp");
    let absolute = dir.path().join("absolute.jq").display().to_string();
    for (n, name) in ["../../escaped.jq", absolute.as_str(), ""]
        .iter()
        .enumerate()
    {
        let store = dir.path().join(format!("s{n}.sqlite"));
        let backend = serde_json::json!({
            "spec": {"type": "scripted", "script": name},
            "files": {*name: "{decision: \"yes\"}"}
        });
        planted_job(&store, "r", &backend, "scripted");
        let log = dir.path().join(format!("w{n}.log"));
        let worker = worker_in(&tmp, &store, &log, &[]);
        let text = wait_for_text(&log, "job refused");
        assert!(
            text.contains("not a plain file name")
                && text.contains(&name.escape_debug().to_string()),
            "{text}"
        );
        assert!(
            files_under(&tmp).is_empty(),
            "nothing written under the worker's folder: {:?}",
            files_under(&tmp)
        );
        stop(worker);
        assert!(!tmp.join("escaped.jq").exists() && !dir.path().join("escaped.jq").exists());
        assert!(!Path::new(&absolute).exists());
        // The refusal is in the store, for the job's coordinator.
        assert!(
            sqlite3(&store, "SELECT reason FROM fleet_refusals;").contains("plain file name"),
            "refusal recorded"
        );
    }
}

/// A job keyed by another model than the one its backend makes here is
/// refused before any of its files is written.
#[test]
fn a_job_keyed_by_another_model_is_refused_before_its_files_are_written() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tmp = dir.path().join("tmp");
    std::fs::create_dir_all(&tmp).expect("tmp");
    let store = dir.path().join("s.sqlite");
    let backend = serde_json::json!({
        "spec": {"type": "scripted", "script": "script.jq"},
        "files": {"script.jq": "{decision: \"yes\"}"}
    });
    planted_job(&store, "r", &backend, "some-other-model");
    let log = dir.path().join("w.log");
    let worker = worker_in(&tmp, &store, &log, &[]);
    let text = wait_for_text(&log, "job refused");
    assert!(text.contains("some-other-model"), "{text}");
    assert!(
        files_under(&tmp).is_empty(),
        "nothing written: {:?}",
        files_under(&tmp)
    );
    stop(worker);
}

/// A port that accepts connections and counts them, answering nothing.
fn counting_port() -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}/v1", listener.local_addr().expect("addr"));
    let seen = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = std::sync::Arc::clone(&seen);
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            drop(conn);
        }
    });
    (url, seen)
}

/// An HTTP job naming an endpoint the worker was not started with is
/// refused, naming it, and nothing reaches that endpoint; one naming a key
/// variable the worker was not given is refused the same way, on an
/// allowed endpoint, so the key is never sent.
#[test]
fn a_job_naming_a_foreign_endpoint_or_key_variable_is_refused_and_sends_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tmp = dir.path().join("tmp");
    std::fs::create_dir_all(&tmp).expect("tmp");
    let (foreign, seen) = counting_port();
    let openai = |url: &str, key: Option<&str>| {
        let mut spec = serde_json::json!({"type": "openai", "model": "m", "base_url": url});
        if let Some(k) = key {
            spec["api_key_env"] = Value::from(k);
        }
        serde_json::json!({"spec": spec, "files": {}})
    };
    // Another endpoint than the one it was allowed.
    let store = dir.path().join("a.sqlite");
    planted_job(
        &store,
        "r",
        &openai(&foreign, None),
        "127.0.0.1/m#json_schema",
    );
    let log = dir.path().join("a.log");
    let worker = worker_in(
        &tmp,
        &store,
        &log,
        &["--allow-endpoint", "http://127.0.0.1:9/v1"],
    );
    let text = wait_for_text(&log, "job refused");
    assert!(
        text.contains(&format!("endpoint `{foreign}`")) && text.contains("--allow-endpoint"),
        "{text}"
    );
    stop(worker);
    // An allowed endpoint, with a key variable the worker was not given,
    // though the variable is set in its environment.
    let store = dir.path().join("b.sqlite");
    planted_job(
        &store,
        "r",
        &openai(&foreign, Some("FANFOLD_TEST_SECRET_KEY")),
        "127.0.0.1/m#json_schema",
    );
    let log = dir.path().join("b.log");
    let log_file = std::fs::File::create(&log).expect("log");
    let worker = bin()
        .arg("worker")
        .arg("--store")
        .arg(&store)
        .args([
            "--lease-secs",
            "30",
            "--slots",
            "1",
            "--idle-exit-secs",
            "20",
        ])
        .args(["--allow-endpoint", &foreign])
        .env("TMPDIR", &tmp)
        .env("FANFOLD_TEST_SECRET_KEY", "sk-not-to-be-sent")
        .stdout(Stdio::null())
        .stderr(log_file)
        .spawn()
        .expect("starts");
    let text = wait_for_text(&log, "job refused");
    assert!(
        text.contains("key variable `FANFOLD_TEST_SECRET_KEY`") && text.contains("--allow-key-env"),
        "{text}"
    );
    assert!(!text.contains("sk-not-to-be-sent"), "{text}");
    stop(worker);
    assert_eq!(
        seen.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "no connection reached the job's endpoint"
    );
}

/// Rows for the budget: each call held `delay_ms` at the judge, so calls
/// are in flight when a worker is killed.
fn slow_rows(n: usize, delay_ms: u64) -> Vec<Value> {
    (0..n)
        .map(|i| serde_json::json!({"id": i, "flag": i % 3 == 0, "delay_ms": delay_ms}))
        .collect()
}

/// A worker killed with calls in flight: their tasks are taken back by the
/// coordinator once the lease lapses and asked again under new
/// reservations, so the endpoint never sees more calls than the budget.
/// Taken again by another worker without a reservation, they were paid
/// twice for one.
#[test]
fn a_worker_killed_mid_call_never_spends_past_the_budget() {
    let budget = 16;
    let (f, _server, calls) = judged(
        &slow_rows(60, 400),
        &format!("[budget]\nmax_model_calls = {budget}"),
        None,
    );
    let store = f.path("fleet.sqlite").display().to_string();
    let mut killed = start_worker(&f, &store, 0, 4);
    let other = start_worker(&f, &store, 1, 4);
    let coordinator = start_coordinator(&f, &store, 0, 8, 0);
    wait_for_calls(&calls, 6);
    killed.kill().expect("SIGKILL");
    killed.wait().expect("reaped");
    let (code, err) = coordinator_done(&f, coordinator, 0);
    assert_ne!(code, Some(0), "a spent budget is incomplete: {err}");
    let made: usize = calls.lock().expect("calls").values().sum();
    assert!(
        made <= budget,
        "{made} calls reached the endpoint under a budget of {budget}"
    );
    let c: Value = serde_json::from_str(
        &std::fs::read_to_string(f.path("out0/certificate.json")).expect("certificate"),
    )
    .expect("json");
    assert!(
        c["stats"]["model_calls"].as_u64().unwrap_or(0) <= budget as u64,
        "{}",
        c["stats"]
    );
    stop(other);
}

/// The pids of the workers a run started on `store`, once `n` registered.
fn worker_pids(store: &Path, n: usize) -> Vec<u32> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        // The store may not hold its tables yet.
        let out = std::process::Command::new("sqlite3")
            .arg(store)
            .arg("SELECT pid FROM fleet_workers;")
            .output()
            .expect("the sqlite3 shell runs");
        let pids: Vec<u32> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        if pids.len() >= n {
            return pids;
        }
        assert!(std::time::Instant::now() < deadline, "workers: {pids:?}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// A run whose workers all die ends: it knows it started them, notices
/// they are gone, and writes an incomplete answer saying why, keeping what
/// was answered. The store's address is not on the workers' command line.
#[test]
fn a_run_whose_workers_all_died_ends_incomplete_and_says_why() {
    let (f, _server, calls) = judged(&slow_rows(40, 300), "", None);
    let store = f.path("fleet.sqlite");
    let started = std::time::Instant::now();
    let coordinator = start_coordinator(&f, &store.display().to_string(), 0, 4, 2);
    let pids = worker_pids(&store, 2);
    for pid in &pids {
        let argv = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let argv = String::from_utf8_lossy(&argv).replace('\0', " ");
        assert!(
            !argv.contains(&store.display().to_string()) && !argv.contains("fleet.sqlite"),
            "the store's address is on a worker's command line: {argv}"
        );
    }
    wait_for_calls(&calls, 4);
    for pid in &pids {
        let o = run(std::process::Command::new("kill")
            .arg("-KILL")
            .arg(pid.to_string()));
        assert!(o.status.success(), "kill: {}", stderr(&o));
    }
    let (code, err) = coordinator_done(&f, coordinator, 0);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(45),
        "took {:?}",
        started.elapsed()
    );
    assert!(matches!(code, Some(c) if c != 0), "{err}");
    assert!(
        err.contains("workers this run started have stopped or died"),
        "{err}"
    );
    let answer: Value =
        serde_json::from_str(&std::fs::read_to_string(f.path("out0/answer.json")).expect("answer"))
            .expect("json");
    assert_eq!(answer["complete"], false, "{answer}");
    let kept: u64 = sqlite3(&store, "SELECT COUNT(*) FROM facts;")
        .trim()
        .parse()
        .expect("count");
    assert!(kept > 0, "what was answered is kept");
}

/// A coordinator whose only worker refused its job ends, naming the
/// refusal, instead of waiting for a worker forever.
#[test]
fn a_run_whose_only_worker_refused_the_job_ends_and_names_the_refusal() {
    let (f, _server, calls) = judged(&slow_rows(8, 0), "", None);
    let store = f.path("fleet.sqlite").display().to_string();
    // Started without the spec's endpoint among those it may send to.
    let log = std::fs::File::create(f.path("worker0.log")).expect("log");
    let worker = bin()
        .args([
            "worker",
            "--store",
            &store,
            "--lease-secs",
            "3",
            "--slots",
            "2",
        ])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("starts");
    let started = std::time::Instant::now();
    let coordinator = start_coordinator(&f, &store, 0, 4, 0);
    let (code, err) = coordinator_done(&f, coordinator, 0);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(45),
        "took {:?}",
        started.elapsed()
    );
    assert!(matches!(code, Some(c) if c != 0), "{err}");
    assert!(
        err.contains("every live worker refused the job") && err.contains("--allow-endpoint"),
        "{err}"
    );
    assert!(calls.lock().expect("calls").is_empty());
    stop(worker);
}

/// Each retry of a failing call is logged with its attempt and cause, as
/// it happens, not only once the call gives up.
#[test]
fn each_retry_of_a_hanging_endpoint_is_logged() {
    let app = axum::Router::new().route(
        "/v1/chat/completions",
        axum::routing::post(|| async {
            tokio::time::sleep(std::time::Duration::from_secs(600)).await;
            "never"
        }),
    );
    let server = fanfold_testkit::Server::start(app).expect("mock server");
    let f = Fixture::new(
        JSON_ARRAY,
        &format!(
            "[backends.hang]\ntype = \"openai\"\nmodel = \"m\"\nbase_url = \"{}\"\ntimeout_ms = 300\nmax_retries = 2\n",
            server.openai_url()
        ),
    );
    f.input(&serde_json::to_vec(&slow_rows(1, 0)).expect("rows"));
    let o = run_within(
        f.run_command()
            .args(["--backend", "hang", "--slots", "1"])
            .env("FANFOLD_LOG", "warn"),
        std::time::Duration::from_secs(50),
    );
    let err = stderr(&o);
    assert_ne!(o.status.code(), Some(0), "{err}");
    for attempt in ["attempt=1", "attempt=2"] {
        assert!(
            err.lines()
                .any(|l| l.contains("retrying") && l.contains(attempt) && l.contains("timed out")),
            "{attempt}: {err}"
        );
    }
}
