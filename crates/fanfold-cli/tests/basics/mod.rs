//! The command line itself: selfcheck, `explain`, the outputs of a run,
//! replay, the shipped schema, `status` and the main job end to end.

use super::*;

#[test]
fn selfcheck_json_is_ok() {
    let o = run(bin().current_dir(repo()).args(["selfcheck", "--json"]));
    assert!(o.status.success(), "{}\n{}", stdout(&o), stderr(&o));
    let v: Value = serde_json::from_str(&stdout(&o)).expect("json");
    assert_eq!(v["ok"], true);
    assert_eq!(v["simulated"], true);
    let names: Vec<&str> = v["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(
        names,
        [
            "source_accounting",
            "bounded_concurrency",
            "reuse_unchanged",
            "audit_interval",
            "canary_breaker",
            "precise_invalidation",
            "cited_output_vs_oracle",
            "stopping_contract",
            "statuses_distinct",
            "incomplete_exit_code",
            "shared_store_claims",
            "cascade_guarantee",
            "main_job_proven",
            "select_allowlist",
            "coarse_rungs",
            "cluster_invalidation",
            "group_invalidation"
        ]
    );
}

#[test]
fn explain_snapshot() {
    let o = run(bin().current_dir(repo()).args([
        "explain",
        "examples/issue-triage/spec.toml",
        "--backend",
        "scripted",
        "--store",
        "/nonexistent/store.sqlite",
    ]));
    assert!(o.status.success(), "{}", stderr(&o));
    insta::assert_snapshot!("explain_issue_triage", stdout(&o));
}

/// The main job's answer opens with what was proven of it: the cascade's
/// recall target, met from the fixture's truth labels standing in for a
/// person, and what the proxy saved, in the certificate's own figures; the
/// run says both again last on the terminal.
#[test]
fn main_job_answer_opens_with_its_proven_quality() {
    let dir = tempfile::tempdir().expect("tempdir");
    let o = run(bin()
        .current_dir(repo())
        .args([
            "run",
            "examples/issue-triage/spec.toml",
            "--backend",
            "scripted",
            "--slots",
            "2",
        ])
        .arg("--store")
        .arg(dir.path().join("s.sqlite"))
        .arg("--out")
        .arg(dir.path().join("out")));
    assert!(o.status.success(), "{}", stderr(&o));
    let certificate: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("out/certificate.json")).expect("certificate"),
    )
    .expect("json");
    let r = &certificate["stats"]["cascades"]["release_blocker"];
    assert_eq!(r["met"], true, "{r}");
    let number = |k: &str| r[k].as_u64().unwrap_or_else(|| panic!("{k} in {r}"));
    let (decided, units, asked) = (
        number("proxy_decided"),
        number("units"),
        number("oracle_calls"),
    );
    assert!(units > 0 && asked <= units, "{r}");
    let md = std::fs::read_to_string(dir.path().join("out/answer.md")).expect("md");
    let opening: Vec<&str> = md
        .lines()
        .filter(|l| !l.trim().is_empty())
        .take(4)
        .collect();
    assert!(opening[0].starts_with("# Which open issues"), "{md}");
    assert!(
        opening[1].starts_with(
            "> **Proven quality:** stage release\\_blocker: recall ≥ 0.9 with probability ≥ 0.9 holds;"
        ),
        "{md}"
    );
    let saving = format!(
        "> **Saving:** the proxy `auth_similarity` decided {decided} of {units} units ({:.1} %); {asked} labels asked",
        100.0 * decided as f64 / units as f64
    );
    assert!(opening[3].starts_with(&saving), "{saving}\n{md}");
    assert!(
        opening[3].ends_with("the labels in `labels.fixture-truth.jsonl` stand in for a person's"),
        "{md}"
    );
    // Last on the terminal, where the run leaves the reader.
    let out = stdout(&o);
    let last: Vec<&str> = out.lines().rev().take(2).collect();
    assert!(
        last[1].starts_with("proven quality: stage release_blocker: recall ≥ 0.9"),
        "{out}"
    );
    assert!(
        last[0].starts_with(&format!(
            "saving: the proxy `auth_similarity` decided {decided} of {units} units"
        )),
        "{out}"
    );
}

#[test]
fn run_writes_cited_outputs_labelled_simulated() {
    let dir = tempfile::tempdir().expect("tempdir");
    let o = run(bin()
        .current_dir(repo())
        .args([
            "run",
            "examples/issue-triage/spec.toml",
            "--backend",
            "scripted",
            "--json",
            "--slots",
            "2",
        ])
        .arg("--store")
        .arg(dir.path().join("s.sqlite"))
        .arg("--out")
        .arg(dir.path().join("out")));
    assert!(o.status.success(), "{}", stderr(&o));
    let lines: Vec<Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).expect("jsonl"))
        .collect();
    assert_eq!(lines[0]["type"], "answer");
    assert_eq!(lines[1]["type"], "certificate");
    let phases: Vec<&str> = lines[1]["data"]["stats"]["phases_ms"]
        .as_array()
        .expect("phases")
        .iter()
        .filter_map(|p| p[0].as_str())
        .collect();
    assert_eq!(
        phases,
        [
            "source",
            "route",
            "embed:auth_similarity",
            "map:release_blocker",
            "map:auth_blocker",
            "audit:second_look",
            "fold",
            "answer",
            "verify"
        ]
    );
    // The audit sampled every rung it names, and its verdicts stay out of
    // the facts below.
    let audit = &lines[1]["data"]["stats"]["audits"]["second_look"]["rungs"];
    for rung in ["prefilter", "auth_similarity", "release_blocker"] {
        assert!(
            audit[rung]["sampled"].as_u64().is_some_and(|n| n > 0),
            "{audit}"
        );
    }
    let md = std::fs::read_to_string(dir.path().join("out/answer.md")).expect("md");
    assert!(md.contains("audit `second_look`"), "{md}");
    assert!(md.contains("[SIMULATED]"));
    assert!(md.contains("https://github.com/acme-corp/widget/issues/"));
    let facts = std::fs::read_to_string(dir.path().join("out/facts.jsonl")).expect("facts");
    // One deciding fact per kept unit: the embed stage's for those it
    // dropped, the cascade's for the rest; and the scripted judge's for
    // each positive the cascade passed on for its cause.
    let kept = lines[1]["data"]["routed_by_stage"]["auth_similarity"]
        .as_u64()
        .expect("kept");
    let (mut judged, mut decided, mut positives) = (0, 0, 0);
    for line in facts.lines() {
        let f: Value = serde_json::from_str(line).expect("fact");
        assert_eq!(f["schema"], "fanfold.fact/v1");
        if f["stage"] == "auth_blocker" {
            judged += 1;
            assert_eq!(f["model"]["simulated"], true);
        } else if f["stage"] == "release_blocker" {
            decided += 1;
            positives += u64::from(f["status"] == "positive");
            assert_eq!(f["model"]["backend"], "cascade");
            assert_eq!(f["model"]["simulated"], false);
        } else {
            assert_eq!(f["stage"], "auth_similarity");
            assert_eq!(f["status"], "negative");
            assert_eq!(f["model"]["simulated"], false);
        }
        assert!(!f["reducer_path"].as_array().expect("path").is_empty());
    }
    assert_eq!(
        Some(decided),
        lines[1]["data"]["routed_by_stage"]["release_blocker"].as_u64()
    );
    let dropped = facts.lines().count() as u64 - judged - decided;
    assert_eq!(dropped + decided, kept);
    assert_eq!(judged, positives);
    assert_eq!(
        Some(judged),
        lines[1]["data"]["routed_by_stage"]["auth_blocker"].as_u64()
    );
    // The store is plain SQLite.
    let out = sqlite3(
        &dir.path().join("s.sqlite"),
        "SELECT COUNT(*) FROM facts WHERE stage = 'auth_blocker';",
    );
    assert_eq!(out.trim(), judged.to_string());
}

#[test]
fn batch_execution_needs_a_batch_api_and_batches_lists_the_store() {
    let f = Fixture::new(JSON_ARRAY, "");
    f.input(br#"[{"id": 1}]"#);
    let o = f.run(&["--execution", "batch"]);
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(
        err.contains("execution = \"batch\"") && err.contains("has no batch API"),
        "{err}"
    );
    assert!(!f.path("store.sqlite").exists(), "refused before any work");

    // A store with no batches says so; a missing store is an error.
    let o = f.run(&[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let list = run(bin()
        .arg("batches")
        .arg("--store")
        .arg(f.path("store.sqlite")));
    assert!(list.status.success());
    assert!(String::from_utf8_lossy(&list.stdout).contains("no provider batches"));
    let missing = run(bin()
        .arg("batches")
        .arg("--store")
        .arg(f.path("nope.sqlite")));
    assert!(!missing.status.success());
    assert!(stderr(&missing).contains("no store at"));
}

#[test]
fn record_then_replay_gives_the_same_answer() {
    let f = Fixture::new(JSON_ARRAY, "");
    f.input(br#"[{"id": 1, "flag": true}, {"id": 2, "flag": false}, {"id": 3, "flag": true}]"#);
    let cassette = f.path("cassette.jsonl");
    let o = f.run(&["--record", cassette.to_str().expect("utf8")]);
    assert!(o.status.success(), "{}", stderr(&o));
    let recorded = f.answer_ids();
    let spec = std::fs::read_to_string(f.path("spec.toml")).expect("spec");
    let spec = spec.replace(
        "type = \"scripted\"\nscript = \"judge.jq\"",
        "type = \"replay\"\ncassette = \"cassette.jsonl\"",
    );
    std::fs::write(f.path("spec.toml"), spec).expect("spec");
    std::fs::remove_file(f.path("store.sqlite")).expect("fresh store");
    let o = f.run(&[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(f.answer_ids(), recorded);
    assert_eq!(f.certificate()["backends"][0]["kind"], "replay");
    assert_eq!(f.certificate()["simulated"], true);
}

#[test]
fn spec_schema_is_shipped_and_current() {
    let o = run(bin().arg("spec-schema"));
    assert!(o.status.success());
    let shipped = std::fs::read_to_string(repo().join("docs/spec.schema.json"))
        .expect("docs/spec.schema.json");
    assert_eq!(
        stdout(&o).trim(),
        shipped.trim(),
        "regenerate with `fanfold spec-schema > docs/spec.schema.json`"
    );
}

#[test]
fn main_job_runs_on_the_embedded_model() {
    let dir = tempfile::tempdir().expect("tempdir");
    // A handful of open auth issues from the fixture, so the test stays short.
    let issues: Vec<Value> = serde_json::from_str(
        &std::fs::read_to_string(repo().join("examples/issue-triage/issues.json"))
            .expect("fixture"),
    )
    .expect("json");
    let few: Vec<&Value> = issues
        .iter()
        .filter(|i| {
            i["state"] == "OPEN"
                && i["body"]
                    .as_str()
                    .is_some_and(|b| b.contains("auth/v2") && b.len() < 2500)
        })
        .take(4)
        .collect();
    assert_eq!(few.len(), 4);
    let input = dir.path().join("few.json");
    std::fs::write(&input, serde_json::to_string(&few).expect("json")).expect("write");
    let o = run(bin()
        .current_dir(repo())
        .args([
            "run",
            "examples/issue-triage/spec.toml",
            "--json",
            "--slots",
            "2",
        ])
        .arg("--input")
        .arg(&input)
        .arg("--store")
        .arg(dir.path().join("s.sqlite"))
        .arg("--out")
        .arg(dir.path().join("out")));
    assert!(o.status.success(), "{}", stderr(&o));
    let lines: Vec<Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).expect("jsonl"))
        .collect();
    let c = &lines[1]["data"];
    assert_eq!(c["backends"][0]["kind"], "llama");
    assert_eq!(c["simulated"], false);
    assert_eq!(c["statuses"]["cancelled"], 0);
    assert_eq!(c["statuses"]["not_run"], 0);
    let ended = |stage: &str| -> u64 {
        let s = &c["statuses_by_stage"][stage];
        ["positive", "negative", "abstain", "error"]
            .iter()
            .map(|k| s[k].as_u64().unwrap_or(0))
            .sum()
    };
    // Every unit the prefilter keeps ends decided or errored, whether the
    // embed stage dropped it or the cascade decided it; the model reads
    // each positive the cascade passes on.
    let kept = c["routed_by_stage"]["auth_similarity"]
        .as_u64()
        .unwrap_or(0);
    assert!(kept >= 1, "the prefilter keeps some of them");
    assert_eq!(ended("auth_similarity") + ended("release_blocker"), kept);
    let embed = &c["stats"]["embed"]["auth_similarity"];
    assert_eq!(
        embed["dropped"].as_u64().unwrap_or(0) + embed["passed"].as_u64().unwrap_or(0),
        kept
    );
    assert_eq!(
        c["routed_by_stage"]["release_blocker"]
            .as_u64()
            .unwrap_or(0),
        embed["passed"].as_u64().unwrap_or(0)
    );
    assert_eq!(
        c["routed_by_stage"]["auth_blocker"].as_u64().unwrap_or(0),
        c["statuses_by_stage"]["release_blocker"]["positive"]
            .as_u64()
            .unwrap_or(0)
    );
    assert!(c["stats"]["cost"]["prompt_tokens"].as_u64().unwrap_or(0) > 0);
    assert!(
        c["stats"]["cost"]["cached_tokens"].as_u64().unwrap_or(0) > 0,
        "the shared prefix was reused"
    );
    assert_eq!(c["verify"]["passed"], true);
    let md = std::fs::read_to_string(dir.path().join("out/answer.md")).expect("md");
    assert!(!md.contains("[SIMULATED]"));
}

#[test]
fn model_flag_needs_an_existing_file() {
    let o = run(bin().current_dir(repo()).args([
        "explain",
        "examples/issue-triage/spec.toml",
        "--no-input",
        "--model",
        "/nonexistent/model.gguf",
    ]));
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("--model /nonexistent/model.gguf: no such file"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn explain_counts_cached_facts_through_the_stage_projection() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = dir.path().join("s.sqlite");
    // The judged form, in which the model stage reads every unit the
    // embed stage passes.
    let spec = "examples/issue-triage/judged.toml";
    let o = run(bin()
        .current_dir(repo())
        .args(["run", spec, "--backend", "scripted", "--json", "--store"])
        .arg(&store)
        .arg("--out")
        .arg(dir.path().join("out")));
    assert!(o.status.success(), "{}", stderr(&o));
    let o = run(bin()
        .current_dir(repo())
        .args(["explain", spec, "--backend", "scripted", "--store"])
        .arg(&store));
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("stage auth_similarity: 66 units, 66 cached, 0 to embed"),
        "{}",
        stdout(&o)
    );
    assert!(
        stdout(&o).contains("stage auth_blocker: 58 units, 58 cached, expected model calls 0"),
        "{}",
        stdout(&o)
    );
}

/// `explain` keys cached facts of the embedded model from the spec alone:
/// with an empty model cache it neither fetches nor loads a model.
#[test]
fn explain_never_loads_or_fetches_a_model() {
    let dir = tempfile::tempdir().expect("tempdir");
    let o = run(bin()
        .current_dir(repo())
        .env("FANFOLD_MODEL_DIR", dir.path().join("models"))
        .args(["explain", "examples/issue-triage/spec.toml", "--store"])
        .arg(dir.path().join("s.sqlite")));
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("stage release_blocker:"),
        "{}",
        stdout(&o)
    );
    assert!(
        !dir.path().join("models").exists(),
        "explain touched the model cache"
    );
    assert!(!stderr(&o).contains("fetching"), "{}", stderr(&o));
}

#[test]
fn logs_have_no_colour_codes_off_a_terminal() {
    let f = Fixture::new(JSON_ARRAY, "");
    // A repeated id is logged as a warning.
    f.input(br#"[{"id": 1, "flag": true}, {"id": 1, "flag": false}]"#);
    let o = run(bin()
        .env("FANFOLD_LOG", "warn")
        .arg("run")
        .arg(f.path("spec.toml"))
        .arg("--store")
        .arg(f.path("store.sqlite"))
        .arg("--out")
        .arg(f.path("out")));
    let err = stderr(&o);
    assert!(err.contains("WARN"), "{err}");
    assert!(!err.contains('\u{1b}'), "{err:?}");
}

#[test]
fn the_readme_shows_a_whole_spec_that_explains() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let spec = std::fs::read_to_string(repo().join("examples/minimal/spec.toml")).unwrap();
    assert!(
        readme.contains(&format!("```toml\n{spec}```")),
        "README.md must show examples/minimal/spec.toml as it is"
    );
    let o = run(bin()
        .arg("explain")
        .arg(repo().join("examples/minimal/spec.toml")));
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(text.contains("excluded closed: 587"), "{text}");
    assert!(text.contains("stage judge: 413 units"), "{text}");
}

/// `fanfold status` on a store a run is working in: the run is live, on
/// this host, with its pid; its heartbeat reports each stage's progress
/// and the budget spent against the limit; once finished, it says how it
/// stopped.
#[test]
fn status_shows_a_live_run_its_progress_and_spend_then_how_it_stopped() {
    // A judge that answers every call, 300 ms later.
    let app = axum::Router::new().route(
        "/v1/chat/completions",
        axum::routing::post(|| async {
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
            fanfold_testkit::wire::json_reply(
                axum::http::StatusCode::OK,
                fanfold_testkit::wire::openai_chat_reply("m", r#"{"decision": "yes"}"#, 100),
            )
        }),
    );
    let server = fanfold_testkit::Server::start(app).expect("mock server");
    let f = Fixture::new(
        JSON_ARRAY,
        &format!(
            "[budget]\nmax_model_calls = 1000\n[backends.slow]\ntype = \"openai\"\nmodel = \"m\"\nbase_url = \"{}\"\n",
            server.openai_url()
        ),
    );
    f.input(&flagged_rows(40));
    // Forty calls one at a time, 300 ms each: the run outlives a
    // heartbeat.
    let mut child = bin()
        .arg("run")
        .arg(f.path("spec.toml"))
        .arg("--store")
        .arg(f.path("store.sqlite"))
        .arg("--out")
        .arg(f.path("out"))
        .args(["--backend", "slow", "--slots", "1"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("run");
    let status = |json: bool| {
        let mut cmd = bin();
        cmd.arg("status").arg("--store").arg(f.path("store.sqlite"));
        if json {
            cmd.arg("--json");
        }
        run(&mut cmd)
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let live = loop {
        assert!(std::time::Instant::now() < deadline, "no progress reported");
        std::thread::sleep(std::time::Duration::from_millis(500));
        if !f.path("store.sqlite").exists() {
            continue;
        }
        let o = status(true);
        let Some(line) = stdout(&o).lines().next().map(str::to_owned) else {
            continue;
        };
        let v: Value = serde_json::from_str(&line).expect("json");
        let finished: u64 = v["progress"]["stages"]
            .as_object()
            .into_iter()
            .flat_map(|stages| stages.values())
            .filter_map(|t| t.as_object())
            .flat_map(|t| t.iter())
            .filter(|(k, _)| *k != "units" && *k != "cached")
            .filter_map(|(_, n)| n.as_u64())
            .sum();
        if finished > 0 {
            break v;
        }
    };
    assert_eq!(live["state"], "live", "{live}");
    assert_eq!(live["pid"], child.id(), "{live}");
    assert_eq!(live["progress"]["stages"]["judge"]["units"], 40, "{live}");
    assert_eq!(live["progress"]["limits"]["model_calls"], 1000, "{live}");
    assert!(live["progress"]["spent"]["model_calls"].is_u64(), "{live}");
    let text = stdout(&status(false));
    assert!(text.starts_with("live run-"), "{text}");
    assert!(text.contains("stage judge: "), "{text}");
    assert!(text.contains("of 1000"), "{text}");
    assert!(child.wait().expect("wait").success());
    let done = stdout(&status(true));
    let v: Value = serde_json::from_str(done.lines().next().expect("a run")).expect("json");
    assert_eq!(v["state"], "completed", "{v}");
    assert_eq!(v["leases"], 0, "{v}");
    let decided: u64 = ["positive", "negative"]
        .iter()
        .filter_map(|k| v["statuses"][*k].as_u64())
        .sum();
    assert_eq!(decided, 40, "{v}");
}
