//! Backends that fail or run out: budgets, dead, failing and hanging
//! endpoints, canaries, slots and unwritable outputs.

use super::*;

/// A run cut short by its budget is marked incomplete where a user looks
/// first, and exits 3; a complete one exits 0.
#[test]
fn a_budget_cut_answer_is_incomplete_and_says_so() {
    let mut rows = String::from("[");
    for i in 0..20 {
        if i > 0 {
            rows.push(',');
        }
        rows.push_str(&format!(r#"{{"id": {i}, "flag": true}}"#));
    }
    rows.push(']');
    let f = Fixture::new(JSON_ARRAY, "[budget]\nmax_model_calls = 5\n");
    f.input(rows.as_bytes());
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(stderr(&o).contains("INCOMPLETE"), "{}", stderr(&o));
    let answer: Value =
        serde_json::from_str(&std::fs::read_to_string(f.path("out/answer.json")).expect("answer"))
            .expect("json");
    assert_eq!(answer["complete"], false);
    assert!(
        answer["incomplete"][0]
            .as_str()
            .is_some_and(|s| s.contains("model_calls"))
    );
    let md = std::fs::read_to_string(f.path("out/answer.md")).expect("answer.md");
    assert!(
        md.lines().next().is_some_and(|l| l.contains("INCOMPLETE")),
        "{md}"
    );
    assert_eq!(f.certificate()["complete"], false);
    // Raising the budget finishes the job; the five paid calls are reused.
    let f2 = Fixture::new(JSON_ARRAY, "[budget]\nmax_model_calls = 100\n");
    f2.input(rows.as_bytes());
    std::fs::copy(f.path("store.sqlite"), f2.path("store.sqlite")).expect("copy store");
    let o = f2.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(f2.certificate()["stats"]["model_calls"].as_u64(), Some(15));
}

/// More slots than the embedded model can hold is refused before the store
/// is written: the run that cannot start leaves nothing behind.
#[test]
fn too_many_slots_for_the_embedded_model_are_refused_before_the_store() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = dir.path().join("s.sqlite");
    let o = run(bin()
        .current_dir(repo())
        .env("FANFOLD_MODEL_DIR", dir.path().join("models"))
        .args([
            "run",
            "examples/issue-triage/spec.toml",
            "--slots",
            "300",
            "--store",
        ])
        .arg(&store)
        .arg("--out")
        .arg(dir.path().join("out")));
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(6), "{err}");
    assert!(
        err.contains("--slots 300") && err.contains("at most 255"),
        "{err}"
    );
    assert!(!store.exists(), "the store was written");
}

/// A closed port: bound, then released.
fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

#[test]
fn a_dead_endpoint_stops_the_stage_after_three_calls() {
    let port = closed_port();
    let f = Fixture::new(
        JSON_ARRAY,
        &format!(
            "[backends.dead]\ntype = \"openai\"\nmodel = \"m\"\nbase_url = \"http://127.0.0.1:{port}/v1\"\nmax_retries = 0\n"
        ),
    );
    f.input(&flagged_rows(30));
    let o = f.run(&["--backend", "dead", "--slots", "1"]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let c = f.certificate();
    assert_eq!(c["stop"]["reason"], "breaker_tripped", "{}", c["stop"]);
    assert_eq!(c["stop"]["stage"], "judge");
    assert!(
        c["stop"]["detail"]
            .as_str()
            .is_some_and(|d| d.contains("first 3 calls all failed with connection")),
        "{}",
        c["stop"]
    );
    assert_eq!(c["stats"]["model_calls"], 3, "no call after the third");
    assert_eq!(c["statuses"]["error"], 1);
    assert_eq!(c["statuses"]["not_run"], 29);
    let md = std::fs::read_to_string(f.path("out/answer.md")).expect("answer.md");
    assert!(
        md.lines()
            .next()
            .is_some_and(|l| l.starts_with("# INCOMPLETE")),
        "{md}"
    );
    assert!(md.contains("stopped itself"), "{md}");
}

/// A mock OpenAI endpoint that answers every request with `status` after
/// `delay_ms` (a long delay is a server that hangs).
fn sick_server(status: u16, delay_ms: u64) -> fanfold_testkit::Server {
    let app = axum::Router::new().route(
        "/v1/chat/completions",
        axum::routing::post(move || async move {
            tokio::time::sleep(std::time::Duration::from_millis(delay_ms)).await;
            fanfold_testkit::wire::json_reply(
                axum::http::StatusCode::from_u16(status).unwrap(),
                serde_json::json!({"error": {"message": "injected"}}),
            )
        }),
    );
    fanfold_testkit::Server::start(app).expect("mock server")
}

/// Runs the fixture's spec on `backend` with `slots`, killed after
/// `limit`; the output and how long it took.
fn run_on(
    f: &Fixture,
    backend: &str,
    slots: &str,
    limit: std::time::Duration,
) -> (Output, std::time::Duration) {
    let started = std::time::Instant::now();
    let o = run_within(
        bin()
            .arg("run")
            .arg(f.path("spec.toml"))
            .arg("--store")
            .arg(f.path("store.sqlite"))
            .arg("--out")
            .arg(f.path("out"))
            .args(["--backend", backend, "--slots", slots]),
        limit,
    );
    (o, started.elapsed())
}

/// An endpoint that is not there ends the run promptly with the default
/// retries and breaker: refused before it ever answered, it is set aside
/// at once, and the run names the URL, says it is incomplete and exits 3.
#[test]
fn a_closed_port_with_default_retries_ends_the_run_promptly() {
    let port = closed_port();
    let f = Fixture::new(
        JSON_ARRAY,
        &format!(
            "[backends.dead]\ntype = \"openai\"\nmodel = \"m\"\nbase_url = \"http://127.0.0.1:{port}/v1\"\n"
        ),
    );
    f.input(&flagged_rows(30));
    let (o, took) = run_on(&f, "dead", "4", std::time::Duration::from_secs(60));
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(took < std::time::Duration::from_secs(30), "took {took:?}");
    let c = f.certificate();
    assert_eq!(c["stop"]["reason"], "breaker_tripped", "{}", c["stop"]);
    let detail = c["stop"]["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains(&format!("127.0.0.1:{port}")) && detail.contains("could not be reached"),
        "{detail}"
    );
    let err = stderr(&o);
    assert!(
        err.contains("INCOMPLETE") && err.contains(&format!("127.0.0.1:{port}")),
        "{err}"
    );
}

/// A server that answers only 500s gives up without waiting out its
/// breaker's cool-down: the stage stops on its first failing calls, and
/// the calls still in flight are abandoned, not retried.
#[test]
fn a_server_that_only_fails_stops_the_stage_without_waiting_on_its_breaker() {
    let server = sick_server(500, 0);
    let f = Fixture::new(
        JSON_ARRAY,
        &format!(
            "[backends.sick]\ntype = \"openai\"\nmodel = \"m\"\nbase_url = \"{}\"\n",
            server.openai_url()
        ),
    );
    f.input(&flagged_rows(30));
    let (o, took) = run_on(&f, "sick", "4", std::time::Duration::from_secs(120));
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    // The breaker's cool-down is 30 s: a run that waited on it takes longer.
    assert!(took < std::time::Duration::from_secs(30), "took {took:?}");
    let c = f.certificate();
    assert_eq!(c["stop"]["reason"], "breaker_tripped", "{}", c["stop"]);
    assert!(
        c["stop"]["detail"]
            .as_str()
            .is_some_and(|d| d.contains("http_status 500")),
        "{}",
        c["stop"]
    );
}

/// A server that hangs cannot hold a run past its wall budget: calls in
/// flight are abandoned at the limit, and the answer says why.
#[test]
fn a_hanging_server_ends_the_run_at_its_wall_budget() {
    let server = sick_server(200, 3_600_000);
    let f = Fixture::new(
        JSON_ARRAY,
        &format!(
            "[budget]\nmax_wall_secs = 3\n[backends.hang]\ntype = \"openai\"\nmodel = \"m\"\nbase_url = \"{}\"\n",
            server.openai_url()
        ),
    );
    f.input(&flagged_rows(8));
    // The request timeout is 120 s: only the wall budget ends it sooner.
    let (o, _) = run_on(&f, "hang", "2", std::time::Duration::from_secs(60));
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let c = f.certificate();
    assert_eq!(c["stop"]["reason"], "budget_exhausted", "{}", c["stop"]);
    assert_eq!(c["stop"]["budget"], "wall_secs", "{}", c["stop"]);
    assert_eq!(c["statuses"]["positive"], 0);
    let md = std::fs::read_to_string(f.path("out/answer.md")).expect("answer.md");
    assert!(md.starts_with("# INCOMPLETE"), "{md}");
}

/// A judge whose rubric is wrong (the script inverts the decision) trips
/// its breaker on the canaries within the window; the right one passes
/// them, and canaries never reach the answer.
#[test]
fn canaries_trip_a_wrong_rubric_and_never_reach_the_answer() {
    let breaker = |f: &Fixture| {
        let spec = std::fs::read_to_string(f.path("spec.toml")).expect("spec");
        let spec = spec.replacen(
            "rubric = \"rubric.md\"",
            "rubric = \"rubric.md\"\ncanaries = \"canaries.jsonl\"\nbreaker = { window = 10, max_canary_failures = 0 }",
            1,
        );
        std::fs::write(f.path("spec.toml"), spec).expect("spec");
        std::fs::write(
            f.path("canaries.jsonl"),
            concat!(
                r#"{"record": {"flag": true}, "expect": "yes"}"#,
                "\n",
                r#"{"record": {"flag": false}, "expect": "no"}"#,
                "\n",
                r#"{"id": "c3", "record": {"flag": true}, "expect": "yes"}"#,
                "\n"
            ),
        )
        .expect("canaries");
    };
    let wrong = Fixture::new(JSON_ARRAY, "");
    breaker(&wrong);
    std::fs::write(
        wrong.path("judge.jq"),
        r#"{decision: (if .flag == true then "no" else "yes" end)}"#,
    )
    .expect("script");
    wrong.input(&flagged_rows(100));
    let o = wrong.run(&["--slots", "1"]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let c = wrong.certificate();
    assert!(
        c["stop"]["detail"]
            .as_str()
            .is_some_and(|d| d.contains("canaries judged wrongly")),
        "{}",
        c["stop"]
    );
    let calls = c["stats"]["model_calls"].as_u64().unwrap();
    assert!(calls <= 10 + 3, "tripped within the window: {calls} calls");
    assert!(
        c["stats"]["canaries"]["judge"]["failed"]
            .as_array()
            .is_some_and(|f| !f.is_empty())
    );

    let right = Fixture::new(JSON_ARRAY, "");
    breaker(&right);
    right.input(&flagged_rows(100));
    let o = right.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let c = right.certificate();
    assert_eq!(c["stats"]["canaries"]["judge"]["sent"], 3);
    assert_eq!(
        c["stats"]["canaries"]["judge"]["failed"],
        serde_json::json!([])
    );
    assert_eq!(c["stats"]["model_calls"], 103, "100 units and 3 canaries");
    assert_eq!(c["statuses"]["positive"], 34);
    let facts = std::fs::read_to_string(right.path("out/facts.jsonl")).expect("facts");
    assert!(!facts.contains("canary-") && !facts.contains("\"c3\""));
    assert!(right.answer_ids().iter().all(|i| i.parse::<u64>().is_ok()));
    // Nothing to pay for: no canaries either.
    let o = right.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(right.certificate()["stats"]["model_calls"], 0);
}

#[test]
fn an_unwritable_out_fails_before_any_call() {
    let f = Fixture::new(JSON_ARRAY, "");
    f.input(&flagged_rows(10));
    std::fs::write(f.path("out"), b"a file, not a folder").expect("file");
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("out"), "{}", stderr(&o));
    assert!(
        !f.path("store.sqlite").exists() || f.fact_count() == 0,
        "nothing was paid for"
    );
}

#[test]
fn slots_are_bounded_with_a_clear_error() {
    let f = Fixture::new(JSON_ARRAY, "");
    f.input(&flagged_rows(3));
    for slots in ["0", "200000"] {
        let o = f.run(&["--slots", slots]);
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        assert!(stderr(&o).contains("--slots"), "{}", stderr(&o));
    }
}
