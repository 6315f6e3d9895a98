//! The store: resuming, reuse of facts and vectors, corrupt and full
//! stores, several processes on one store, `gc`, and bounded memory.

use super::*;

#[test]
fn a_killed_run_resumes_from_the_store() {
    let f = Fixture::new(r#"{ type = "jsonl", key = "id", kind = "row" }"#, "");
    let spec = std::fs::read_to_string(f.path("spec.toml")).expect("spec");
    std::fs::write(
        f.path("spec.toml"),
        spec.replace(
            "script = \"judge.jq\"",
            "script = \"judge.jq\"\ndelay_ms = 25",
        ),
    )
    .expect("spec");
    let input: String = (0..200)
        .map(|i| format!("{{\"id\": {i}, \"flag\": {}}}\n", i % 3 == 0))
        .collect();
    f.input(input.as_bytes());
    let mut child = bin()
        .arg("run")
        .arg(f.path("spec.toml"))
        .args(["--json", "--slots", "2", "--store"])
        .arg(f.path("store.sqlite"))
        .arg("--out")
        .arg(f.path("out"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while std::time::Instant::now() < deadline {
        if f.path("store.sqlite").exists() && f.fact_count() >= 20 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.kill().expect("kill");
    child.wait().expect("reaped");
    let kept = f.fact_count();
    assert!((20..200).contains(&kept), "kept {kept}");
    // The rerun reuses every fact stored before the kill.
    let o = f.run(&[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let c = f.certificate();
    assert_eq!(c["stats"]["cache_hits"].as_u64(), Some(kept));
    assert_eq!(c["stats"]["model_calls"].as_u64(), Some(200 - kept));
    assert_eq!(f.answer_ids().len(), 67);
}

/// A new threshold re-scores cached vectors: nothing is embedded again, and
/// the model stage is asked only about the units that newly pass.
#[test]
fn a_new_embed_threshold_reuses_every_vector() {
    let dir = tempfile::tempdir().expect("tempdir");
    let example = dir.path().join("example");
    std::fs::create_dir_all(&example).expect("dir");
    for entry in std::fs::read_dir(repo().join("examples/issue-triage")).expect("example") {
        let entry = entry.expect("entry");
        std::fs::copy(entry.path(), example.join(entry.file_name())).expect("copy");
    }
    // The judged form, in which the model stage reads every unit the
    // embed stage passes.
    let store = dir.path().join("s.sqlite");
    let certificate = |tag: &str| -> Value {
        let o = run(bin()
            .args(["run"])
            .arg(example.join("judged.toml"))
            .args(["--backend", "scripted", "--json", "--store"])
            .arg(&store)
            .arg("--out")
            .arg(dir.path().join(tag)));
        assert!(o.status.success(), "{}", stderr(&o));
        let lines: Vec<Value> = stdout(&o)
            .lines()
            .map(|l| serde_json::from_str(l).expect("jsonl"))
            .collect();
        lines[1]["data"].clone()
    };
    let first = certificate("a");
    let e1 = &first["stats"]["embed"]["auth_similarity"];
    assert!(e1["vectors_computed"].as_u64().unwrap_or(0) > 0);
    assert!(e1["dropped"].as_u64().unwrap_or(0) > 0, "{e1}");

    let spec_path = example.join("judged.toml");
    let spec = std::fs::read_to_string(&spec_path).expect("spec");
    assert!(spec.contains("threshold = -0.03"));
    std::fs::write(
        &spec_path,
        spec.replace("threshold = -0.03", "threshold = -1.0"),
    )
    .expect("spec");
    let second = certificate("b");
    let e2 = &second["stats"]["embed"]["auth_similarity"];
    assert_eq!(e2["vectors_computed"], 0, "{e2}");
    assert_eq!(e2["cached"], 0, "the threshold is part of the fact key");
    assert_eq!(e2["dropped"], 0);
    let passed_before = e1["passed"].as_u64().unwrap_or(0);
    let passed_now = e2["passed"].as_u64().unwrap_or(0);
    assert_eq!(
        second["stats"]["model_calls"].as_u64(),
        Some(passed_now - passed_before)
    );
    assert_eq!(second["stats"]["cache_hits"].as_u64(), Some(passed_before));
}

/// Two units whose projected inputs are equal cost one call.
#[test]
fn equal_inputs_in_one_run_share_one_call() {
    let f = Fixture::new(JSON_ARRAY, "");
    // The stage sees every field but `id`: records 1 and 2 look the same.
    let spec = std::fs::read_to_string(f.path("spec.toml")).expect("spec");
    std::fs::write(
        f.path("spec.toml"),
        spec.replace(
            "rubric = \"rubric.md\"",
            "rubric = \"rubric.md\"\nproject = '{flag}'",
        ),
    )
    .expect("spec");
    f.input(br#"[{"id": 1, "flag": true}, {"id": 2, "flag": true}, {"id": 3, "flag": false}]"#);
    let o = f.run(&[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let c = f.certificate();
    assert_eq!(c["stats"]["model_calls"].as_u64(), Some(2));
    assert_eq!(c["stats"]["deduplicated"].as_u64(), Some(1));
    assert_eq!(f.answer_ids(), ["1", "2"]);
}

/// A damaged fact row in the store is dropped and computed again, and the
/// run says so, instead of every later run failing on it.
#[test]
fn a_corrupt_fact_row_is_computed_again_and_reported() {
    let f = Fixture::new(JSON_ARRAY, "");
    f.input(br#"[{"id": 1, "flag": true}, {"id": 2, "flag": false}, {"id": 3, "flag": true}]"#);
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let first = f.answer_ids();
    sqlite3(
        &f.path("store.sqlite"),
        "UPDATE facts SET record = '{\"not\": \"a fact' WHERE unit_id = '2';",
    );
    for _ in 0..2 {
        let o = f.run(&[]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        assert_eq!(f.answer_ids(), first);
    }
    // The second run found it damaged and paid for it again; the third
    // found the fact it stored.
    let c = f.certificate();
    assert_eq!(c["stats"]["corrupt_facts"].as_u64(), Some(0), "{c}");
    f.input(br#"[{"id": 1, "flag": true}, {"id": 2, "flag": false}, {"id": 3, "flag": true}]"#);
    sqlite3(
        &f.path("store.sqlite"),
        "UPDATE facts SET record = 'garbage' WHERE unit_id = '3';",
    );
    let o = f.run(&[]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    let c = f.certificate();
    assert_eq!(c["stats"]["corrupt_facts"].as_u64(), Some(1), "{c}");
    assert_eq!(c["stats"]["model_calls"].as_u64(), Some(1), "{c}");
    let answer = std::fs::read_to_string(f.path("out/answer.md")).expect("answer");
    assert!(answer.contains("1 stored facts did not decode"), "{answer}");
    assert_eq!(f.answer_ids(), first);
}

/// Memory stays bounded by the routed units, not the input: 200k records,
/// 1 % routed, under 256 MiB of peak RSS (the release figures at 1M are in
/// docs/benchmarks.md, from `fanfold bench scale`).
#[test]
fn slow_run_at_200k_records_stays_under_256_mib() {
    let dir = tempfile::tempdir().expect("tempdir");
    let input = dir.path().join("records.jsonl");
    let o = run(bin()
        .args(["fixture", "jsonl", "--records", "200000", "--out"])
        .arg(&input));
    assert!(o.status.success(), "{}", stderr(&o));
    let o = run(bin()
        .current_dir(repo())
        .args(["run", "bench/scale/spec.toml", "--json", "--input"])
        .arg(&input)
        .arg("--store")
        .arg(dir.path().join("s.sqlite"))
        .arg("--out")
        .arg(dir.path().join("out")));
    assert!(o.status.success(), "{}", stderr(&o));
    let cert: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("out/certificate.json")).expect("certificate"),
    )
    .expect("json");
    assert_eq!(cert["coverage"]["units"].as_u64(), Some(200_000));
    let routed = cert["routed_by_stage"]["upstream"].as_u64().unwrap_or(0);
    assert!((1000..4000).contains(&routed), "routed {routed}");
    let peak = cert["stats"]["peak_rss_kib"]
        .as_u64()
        .expect("peak RSS measured");
    assert!(peak <= 256 * 1024, "peak RSS {} MiB", peak / 1024);
}

/// A store that fills up stops the run at the first fact it cannot keep,
/// instead of paying for every remaining unit.
#[test]
fn a_full_store_stops_the_calls() {
    let f = Fixture::new(JSON_ARRAY, "");
    f.input(&flagged_rows(1000));
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let before = f.fact_count();
    // A new stage version: every fact is new, and the store has room for
    // only a few of them.
    let spec = std::fs::read_to_string(f.path("spec.toml")).expect("spec");
    std::fs::write(
        f.path("spec.toml"),
        spec.replacen("version = 1", "version = 2", 1),
    )
    .expect("spec");
    let size = std::fs::metadata(f.path("store.sqlite"))
        .expect("store")
        .len();
    let cap = (size + 32 * 1024).to_string();
    let o = f.run(&[
        "--slots",
        "1",
        "--store-max-bytes",
        &cap,
        "--record",
        f.path("calls.jsonl").to_str().expect("path"),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("full"), "{}", stderr(&o));
    let kept = f.fact_count() - before;
    let calls = std::fs::read_to_string(f.path("calls.jsonl"))
        .map(|t| t.lines().count() as u64)
        .unwrap_or(0);
    assert!(kept < 1000, "the cap bit: {kept} facts kept");
    assert!(
        calls <= kept + 2,
        "{calls} calls for {kept} kept facts: nothing paid for after the failure"
    );
}

/// Two processes on one store pay for each unit once: a unit is called by
/// the run that claimed it, and the other takes its fact from the store.
#[test]
fn two_processes_on_one_store_pay_for_each_unit_once() {
    let f = Fixture::new(JSON_ARRAY, "");
    let spec = std::fs::read_to_string(f.path("spec.toml")).expect("spec");
    std::fs::write(
        f.path("spec.toml"),
        spec.replacen(
            "script = \"judge.jq\"",
            "script = \"judge.jq\"\ndelay_ms = 40",
            1,
        ),
    )
    .expect("spec");
    let units = 60;
    f.input(&flagged_rows(units));
    let start = |n: usize| {
        bin()
            .arg("run")
            .arg(f.path("spec.toml"))
            .arg("--store")
            .arg(f.path("store.sqlite"))
            .arg("--out")
            .arg(f.path(&format!("out{n}")))
            .arg("--json")
            .args(["--slots", "2", "--record"])
            .arg(f.path(&format!("calls{n}.jsonl")))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starts")
    };
    let runs: Vec<_> = (0..2).map(start).collect();
    let mut calls = 0;
    for (n, child) in runs.into_iter().enumerate() {
        let o = child.wait_with_output().expect("ends");
        assert_eq!(o.status.code(), Some(0), "run {n}: {}", stderr(&o));
        calls += std::fs::read_to_string(f.path(&format!("calls{n}.jsonl")))
            .map(|t| t.lines().count())
            .unwrap_or(0);
        let answer =
            std::fs::read_to_string(f.path(&format!("out{n}/answer.json"))).expect("answer");
        let v: Value = serde_json::from_str(&answer).expect("json");
        assert_eq!(
            v["items"].as_array().map(Vec::len),
            Some(units.div_ceil(3)),
            "run {n}"
        );
    }
    assert_eq!(calls, units, "{calls} calls for {units} units");
    assert_eq!(f.fact_count(), units as u64);
}

/// Four processes on one store with an HTTP backend and several slots
/// each: every unit is called once between them, every process ends, and
/// they give the same answer. A run waiting for a unit another run holds
/// must keep completing its own requests in flight, or each waits on the
/// other's leases forever.
#[test]
fn four_processes_on_one_store_with_an_http_backend_all_finish() {
    let units: usize = 48;
    let (f, _server, calls) = judge_fixture(units);
    let store = f.path("store.sqlite").display().to_string();
    let mut children: Vec<_> = (0..4).map(|n| start_run(&f, &store, n)).collect();
    let codes = wait_all(&mut children, std::time::Duration::from_secs(120));
    let mut answers = Vec::new();
    for (n, code) in codes.iter().enumerate() {
        let err = std::fs::read_to_string(f.path(&format!("err{n}.log"))).unwrap_or_default();
        assert_eq!(*code, Some(0), "run {n}: {err}");
        answers.push(items(&f, n));
    }
    assert_eq!(answers[0].as_array().map(Vec::len), Some(units.div_ceil(3)));
    assert!(answers.iter().all(|a| a == &answers[0]), "{answers:?}");
    let calls = calls.lock().unwrap();
    assert_eq!(calls.len(), units, "every unit called");
    let repeats: Vec<_> = calls.iter().filter(|(_, n)| **n > 1).collect();
    assert!(repeats.is_empty(), "called more than once: {repeats:?}");
}

/// Reruns do not grow the store for good: `gc` keeps the per-unit rows of
/// the latest answered run of a spec over a source, and the certificates
/// of all.
#[test]
fn gc_drops_the_unit_rows_of_superseded_runs() {
    let f = Fixture::new(JSON_ARRAY, "");
    f.input(&flagged_rows(6));
    for _ in 0..3 {
        let o = f.run(&[]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    }
    let store = f.path("store.sqlite");
    assert_eq!(
        sqlite3(&store, "SELECT COUNT(*) FROM run_units;").trim(),
        "18"
    );
    let o = run(bin().arg("gc").arg("--store").arg(&store).arg("--json"));
    assert!(o.status.success(), "{}", stderr(&o));
    let r: Value = serde_json::from_str(&stdout(&o)).expect("json");
    assert_eq!(r["superseded_unit_rows"], 12, "{r}");
    assert!(
        r["bytes_after"].as_u64() <= r["bytes_before"].as_u64(),
        "the store and its log did not grow: {r}"
    );
    assert_eq!(
        sqlite3(&store, "SELECT COUNT(*) FROM run_units;").trim(),
        "6"
    );
    assert_eq!(
        sqlite3(
            &store,
            "SELECT COUNT(*) FROM runs WHERE certificate IS NOT NULL;"
        )
        .trim(),
        "3"
    );
    // The next run still reuses every fact.
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(f.certificate()["stats"]["model_calls"], 0);
}

/// An input that does not parse leaves nothing in the store, and `gc`
/// removes failed runs and the sources only they read, keeping answers.
#[test]
fn refused_inputs_and_failed_runs_do_not_stay_in_the_store() {
    let f = Fixture::new(JSON_ARRAY, "");
    let sources = || {
        fanfold_store::Store::open(&f.path("store.sqlite"))
            .expect("store")
            .count_sources()
            .expect("count")
    };
    f.input(&flagged_rows(6));
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(sources(), 1);
    f.input(br#"{"not": "an array"}"#);
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(5), "{}", stderr(&o));
    assert_eq!(sources(), 1, "the refused file is not kept");

    // A run that fails after parsing keeps its source until gc.
    let spec = std::fs::read_to_string(f.path("spec.toml")).expect("spec");
    let good = spec.clone();
    std::fs::write(
        f.path("spec.toml"),
        spec.replacen("version = 1", "version = 1\nproject = 'error(\"boom\")'", 1),
    )
    .expect("spec");
    f.input(&flagged_rows(9));
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(5), "{}", stderr(&o));
    assert_eq!(sources(), 2);
    let gc = run(bin()
        .arg("gc")
        .arg("--store")
        .arg(f.path("store.sqlite"))
        .arg("--json"));
    assert_eq!(gc.status.code(), Some(0), "{}", stderr(&gc));
    let r: Value = serde_json::from_str(stdout(&gc).trim()).expect("json");
    assert_eq!(r["runs"], 1, "{r}");
    assert_eq!(r["sources"], 1, "{r}");
    assert_eq!(sources(), 1);
    // The answered run still answers from the cache: no call paid.
    std::fs::write(f.path("spec.toml"), good).expect("spec");
    f.input(&flagged_rows(6));
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(f.certificate()["stats"]["model_calls"], 0);
}

/// A kill during the embed stage keeps every batch of vectors written
/// before it, and the rerun computes only the rest.
#[test]
fn slow_a_killed_embed_stage_keeps_its_finished_batches() {
    let dir = tempfile::tempdir().expect("tempdir");
    let example = dir.path().join("example");
    std::fs::create_dir_all(&example).expect("dir");
    for entry in std::fs::read_dir(repo().join("examples/issue-triage")).expect("example") {
        let entry = entry.expect("entry");
        std::fs::copy(entry.path(), example.join(entry.file_name())).expect("copy");
    }
    let total = 200u64;
    let issues: Vec<Value> = (0..total)
        .map(|i| {
            serde_json::json!({
                "number": i,
                "title": format!("Release blocker {i}: login token refresh fails on auth/v2"),
                "body": format!("Case {i}: users are logged out after the refresh token rotates."),
                "state": "OPEN",
                "labels": [{"name": "bug"}],
                "url": format!("https://example.com/issues/{i}"),
            })
        })
        .collect();
    let input = dir.path().join("issues.json");
    std::fs::write(&input, serde_json::to_vec(&issues).expect("json")).expect("input");
    let store = dir.path().join("s.sqlite");
    let start = |out: &str| {
        let mut cmd = bin();
        cmd.arg("run")
            .arg(example.join("judged.toml"))
            .args(["--backend", "scripted", "--json", "--input"])
            .arg(&input)
            .arg("--store")
            .arg(&store)
            .arg("--out")
            .arg(dir.path().join(out));
        cmd
    };
    let vectors = || {
        fanfold_store::Store::open(&store)
            .and_then(|s| s.count_embeddings())
            .unwrap_or(0)
    };
    let log = dir.path().join("a.stderr");
    let mut child = start("a")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("spawn");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    while std::time::Instant::now() < deadline && (!store.exists() || vectors() < 32) {
        // A run that ends before the kill cannot test it: say why it ended.
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "the run ended ({status}) before the kill: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    child.kill().expect("kill");
    child.wait().expect("reaped");
    let kept = vectors();
    assert!(
        (32..total).contains(&kept),
        "{kept} vectors kept of {total}"
    );
    let o = run(&mut start("b"));
    assert!(o.status.success(), "{}", stderr(&o));
    let lines: Vec<Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).expect("jsonl"))
        .collect();
    let e = &lines[1]["data"]["stats"]["embed"]["auth_similarity"];
    // Every vector stored before the kill is reused; only the rest (the
    // units' texts and the stage's descriptions) are computed.
    assert_eq!(e["vectors_reused"].as_u64(), Some(kept), "{e}");
    let computed = e["vectors_computed"].as_u64().unwrap_or(0);
    assert_eq!(kept + computed, vectors(), "{e}");
    assert!(vectors() > total, "{e}");
}
