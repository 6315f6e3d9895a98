//! Cascade oracles: a backend that fails, a person at a terminal, a labels
//! file too small, and a run with no target.

use crate::*;

/// A backend oracle that cannot decide some of the units it is asked
/// about gives no labels for them: the target is unmet, said at the top
/// of the answer and in the exit code, never "holds".
#[test]
fn an_oracle_that_fails_leaves_the_target_unmet() {
    let f = cascade_fixture(
        r#"{ proxy = "lex", target = "recall", at_least = 0.7, delta = 0.2, label_budget = 300 }"#,
    );
    let spec = std::fs::read_to_string(f.path("spec.toml")).expect("spec");
    let failing: Vec<String> = (0..1000).map(|i| format!("\"{i}\"")).collect();
    std::fs::write(
        f.path("spec.toml"),
        spec.replacen(
            "script = \"judge.jq\"",
            &format!(
                "script = \"judge.jq\"\nfaults = [{{ kind = \"error\", units = [{}] }}]",
                failing.join(", ")
            ),
            1,
        ),
    )
    .expect("spec");
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let r = &f.certificate()["stats"]["cascades"]["judge"];
    assert_eq!(r["met"], false, "{r}");
    assert!(r["unlabelled"].as_u64().unwrap() > 0, "{r}");
    let md = std::fs::read_to_string(f.path("out/answer.md")).expect("answer.md");
    assert!(md.contains("is UNMET"), "{md}");
}

/// A person is the oracle: the run lists what it needs, the person answers
/// it in an 80×24 terminal with single keys (undo, skip and quit
/// included), the labels are stored at once and a new start resumes; the
/// rest come from a file of the data's own labels, and the runs after use
/// every label until the target is met.
#[test]
fn a_person_labels_what_the_cascade_asks_for_and_the_reruns_use_it() {
    let f = cascade_fixture(
        r#"{ proxy = "lex", target = "recall", at_least = 0.7, delta = 0.1, label_budget = 300, oracle = "person" }"#,
    );
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert_eq!(f.certificate()["stats"]["model_calls"], 0);
    let md = std::fs::read_to_string(f.path("out/answer.md")).expect("answer.md");
    assert!(md.contains("waits for a person"), "{md}");
    let wanted = f.jsonl("out/labels-wanted.jsonl");
    let n = wanted.len();
    assert!(n > 2, "{n} labels wanted");
    let id = |k: usize| wanted[k]["id"].as_str().expect("id").to_owned();

    let store = f.path("store.sqlite");
    let label = format!(
        "'{}' label '{}' --store '{}' --labeller ann; echo LABEL-EXITED; sleep 60",
        env!("CARGO_BIN_EXE_fanfold"),
        f.path("out").display(),
        store.display()
    );
    let t = Tmux::start(&label);
    let screen = t.wait_for(&format!("1 of {n}"));
    assert!(screen.contains(&format!("unit {}", id(0))), "{screen}");
    assert!(screen.contains("Question: Say yes"), "{screen}");
    assert!(
        screen.contains("[1] yes  [2] no  [s] skip  [u] undo  [q] quit"),
        "{screen}"
    );
    assert!(
        screen.contains("\"title\""),
        "the unit's view is shown: {screen}"
    );
    assert!(screen.lines().count() <= 24 && screen.lines().all(|l| l.chars().count() <= 80));
    t.keys("1");
    t.wait_for(&format!("2 of {n} · 1 labelled"));
    assert_eq!(sqlite3(&store, "SELECT COUNT(*) FROM labels;").trim(), "1");
    t.keys("u");
    t.wait_for(&format!("1 of {n} · 0 labelled"));
    assert_eq!(sqlite3(&store, "SELECT COUNT(*) FROM labels;").trim(), "0");
    t.keys("2");
    t.wait_for(&format!("2 of {n} · 1 labelled"));
    t.keys("s");
    t.wait_for(&format!("3 of {n} · 1 labelled, 1 skipped"));
    t.keys("q");
    let screen = t.wait_for("LABEL-EXITED");
    assert!(screen.contains("1 labelled, 1 skipped"), "{screen}");
    assert_eq!(
        sqlite3(&store, "SELECT unit_id, decision, labeller FROM labels;").trim(),
        format!("{}|no|person:ann", id(0))
    );
    drop(t);
    // A new start resumes with the first unit still unlabelled.
    let t = Tmux::start(&label);
    let screen = t.wait_for(&format!("1 of {}", n - 1));
    assert!(screen.contains(&format!("unit {}", id(1))), "{screen}");
    t.keys("q");
    t.wait_for("LABEL-EXITED");
    drop(t);

    // The rest from the data's own labels; each run asks for what its
    // proof leaves to the oracle, until none is left.
    let truth = |id: &str| id.parse::<u64>().is_ok_and(|i| i < 150);
    let mut rounds = 0;
    loop {
        let wanted = f.jsonl("out/labels-wanted.jsonl");
        let ids = wanted
            .iter()
            .map(|w| w["id"].as_str().expect("id").to_owned());
        truth_labels(&f, "truth.jsonl", ids);
        let o = run(bin()
            .arg("label")
            .arg(f.path("out"))
            .arg("--store")
            .arg(&store)
            .arg("--import")
            .arg(f.path("truth.jsonl")));
        assert!(o.status.success(), "{}", stderr(&o));
        let o = f.run(&[]);
        rounds += 1;
        if o.status.code() == Some(0) {
            break;
        }
        assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
        // A person labels round by round what the proof still reads;
        // rounds double, so from a first round of an eighth of the
        // budget there are at most four more, then the units the proven
        // plan leaves to the oracle.
        assert!(rounds < 7, "still waiting after {rounds} rounds");
    }
    let cert = f.certificate();
    let report = &cert["stats"]["cascades"]["judge"];
    assert_eq!(report["met"], true, "{report}");
    assert_eq!(report["oracle"], "a person", "{report}");
    assert_eq!(
        cert["stats"]["model_calls"], 0,
        "a person, not the model, was the oracle"
    );
    assert!(f.jsonl("out/labels-wanted.jsonl").is_empty());
    let found = f.answer_ids().iter().filter(|id| truth(id)).count();
    assert!(found as f64 >= 0.7 * 150.0, "{found} of 150 flagged found");
}

#[test]
fn a_labels_oracle_too_small_for_the_target_leaves_it_unmet_and_exits_non_zero() {
    let f = cascade_fixture(
        r#"{ proxy = "lex", target = "recall", at_least = 0.95, delta = 0.05, label_budget = 40, labels = "labels.jsonl" }"#,
    );
    // A person labelled twenty records.
    truth_labels(&f, "labels.jsonl", (190..210).map(|i| i.to_string()));
    let o = f.run(&[]);
    assert_ne!(o.status.code(), Some(0), "{}", stderr(&o));
    let md = std::fs::read_to_string(f.path("out/answer.md")).expect("answer.md");
    assert!(md.starts_with("# INCOMPLETE"), "{md}");
    assert!(md.contains("is UNMET"), "{md}");
    let cert = f.certificate();
    let report = &cert["stats"]["cascades"]["judge"];
    assert_eq!(report["met"], false);
    assert!(report["unlabelled"].as_u64().expect("unlabelled") > 0);
    // No model is asked when the oracle is a labels file.
    assert_eq!(cert["stats"]["model_calls"], 0);

    // A label that is not one of the stage's decisions is refused, naming
    // the file and line.
    std::fs::write(
        f.path("labels.jsonl"),
        "{\"id\": 1, \"decision\": \"maybe\"}\n",
    )
    .expect("labels");
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("`labels.jsonl` line 1"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn a_run_without_a_target_says_its_quality_is_unmeasured() {
    let f = Fixture::new(JSON_ARRAY, "");
    f.input(br#"[{"id": 1, "flag": true}, {"id": 2, "flag": false}]"#);
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let md = std::fs::read_to_string(f.path("out/answer.md")).expect("answer.md");
    let top: String = md.lines().take(8).collect::<Vec<_>>().join("\n");
    assert!(top.contains("> **Quality: unmeasured.**"), "{top}");
    // A cascade whose proxy is not declared before the judge is refused.
    let f = cascade_fixture(
        r#"{ proxy = "nowhere", target = "recall", at_least = 0.9, label_budget = 10 }"#,
    );
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("the proxy `nowhere` is not a stage declared before this one"),
        "{}",
        stderr(&o)
    );
}
