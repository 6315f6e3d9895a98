//! Routing per unit among rungs: the issue-routing example sends short
//! issues to the micro judge, long ones to a chunk stage and ones naming a
//! pull request to a read-only tool and the judge after it.

use super::*;

/// The example copied into a folder of its own, so its store and outputs
/// stay out of the repository.
fn routing_example() -> tempfile::TempDir {
    let ex = repo().join("examples/issue-routing");
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(dir.path().join("prs")).expect("prs");
    for entry in walk(&ex) {
        let rel = entry.strip_prefix(&ex).expect("inside the example");
        std::fs::copy(&entry, dir.path().join(rel)).expect("copy");
    }
    dir
}

/// Every file under `dir`, one level of folders deep.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).expect("lists") {
        let p = e.expect("entry").path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

fn run_example(dir: &Path, extra: &[&str]) -> Output {
    run(bin()
        .current_dir(dir)
        .args(["run", "spec.toml", "--json", "--store", "store.sqlite"])
        .args(["--out", "out"])
        .args(extra))
}

fn lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .expect("output file")
        .lines()
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect()
}

/// Unit id -> field of each line.
fn by_unit(lines: &[Value], id: &str, field: &str) -> std::collections::BTreeMap<String, String> {
    lines
        .iter()
        .map(|l| {
            let unit = match &l[id] {
                Value::Array(ids) => ids[0].as_str().unwrap_or_default().to_owned(),
                v => v.as_str().unwrap_or_default().to_owned(),
            };
            (unit, l[field].as_str().unwrap_or_default().to_owned())
        })
        .collect()
}

/// The routes the example is written to take, each issue's: its choice,
/// what decided it, and the stage whose fact answers it.
const ROUTES: [(&str, &str, &str, &str); 12] = [
    ("101", "short", "model", "judge"),
    ("102", "short", "model", "judge"),
    ("103", "short", "model", "judge"),
    ("104", "short", "model", "judge"),
    ("201", "long", "rule:very_long", "long_read"),
    ("202", "long", "rule:very_long", "long_read"),
    ("203", "long", "model", "long_read"),
    ("204", "long", "model", "long_read"),
    ("301", "with_pr", "rule:names_a_pr", "pr_judge"),
    ("302", "with_pr", "rule:names_a_pr", "pr_judge"),
    ("303", "with_pr", "rule:names_a_pr", "pr_judge"),
    ("304", "with_pr", "rule:names_a_pr", "pr_judge"),
];

#[test]
fn each_issue_takes_its_own_rung_and_the_facts_say_which() {
    let dir = routing_example();
    let o = run_example(dir.path(), &["--backend", "scripted"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));

    let selections = lines(&dir.path().join("out/selections.jsonl"));
    assert_eq!(selections.len(), ROUTES.len());
    let choice = by_unit(&selections, "unit_id", "choice");
    let decided_by = by_unit(&selections, "unit_id", "decided_by");
    let answered_by = by_unit(&selections, "unit_id", "answered_by");
    let facts = lines(&dir.path().join("out/facts.jsonl"));
    assert_eq!(facts.len(), ROUTES.len(), "one fact an issue");
    let stage = by_unit(&facts, "source_ids", "stage");
    for (id, want_choice, want_decider, want_stage) in ROUTES {
        assert_eq!(choice[id], want_choice, "issue {id}");
        assert_eq!(decided_by[id], want_decider, "issue {id}");
        assert_eq!(stage[id], want_stage, "issue {id}: the fact's stage");
        // What came of the choice is found past a stage that passes its
        // units on: the tool's judge answers what the tool looked up.
        assert_eq!(answered_by[id], want_stage, "issue {id}");
    }

    let cert: Value = serde_json::from_slice(
        &std::fs::read(dir.path().join("out/certificate.json")).expect("certificate"),
    )
    .expect("json");
    // Each rung received exactly the issues routed to it.
    let received = &cert["routed_by_stage"];
    for (rung, n) in [("judge", 4), ("long_read", 4), ("pr_lookup", 4)] {
        assert_eq!(received[rung], n, "{rung}: {received}");
    }
    let s = &cert["stats"]["selects"]["route"];
    assert_eq!(s["chosen"]["with_pr"]["rule:names_a_pr"], 4, "{s}");
    assert_eq!(s["chosen"]["long"]["rule:very_long"], 2, "{s}");
    assert_eq!(s["chosen"]["long"]["model"], 2, "{s}");
    assert_eq!(s["chosen"]["short"]["model"], 4, "{s}");
    // The tool's issues are followed to the judge after it: none of
    // them is left without a downstream word.
    assert_eq!(s["confusion"]["with_pr"]["positive"], 2, "{s}");
    assert_eq!(s["confusion"]["with_pr"]["negative"], 2, "{s}");
    assert!(s["confusion"]["with_pr"].get("not_run").is_none(), "{s}");
    // Three pull requests are in `prs/`; the fourth is not found, and its
    // issue is still judged.
    let tool = &cert["stats"]["tools"]["pr_lookup"];
    assert_eq!(tool["statuses"]["ok"], 3, "{tool}");
    assert_eq!(tool["statuses"]["not_found"], 1, "{tool}");

    // The crashes, whichever rung found them: a merged pull request's
    // issue is fixed, an open one's is not.
    let answer: Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("out/answer.json")).expect("answer"))
            .expect("json");
    let ids: Vec<&str> = answer["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|i| i["unit_id"].as_str())
        .collect();
    assert_eq!(ids, ["101", "104", "201", "204", "302", "304"]);
    assert_eq!(cert["verify"]["passed"], true);

    // `explain` names the rungs the select routes among, by kind.
    let o = run(bin().current_dir(dir.path()).args(["explain", "spec.toml"]));
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("routes to: map `judge`, chunk `long_read`, tool `pr_lookup`"),
        "{}",
        stdout(&o)
    );
}

/// On the embedded default model the model's picks are its own: the
/// rules' routes hold, every issue gets one fact from the rung its choice
/// leads to, and the run verifies.
#[test]
fn the_routing_example_runs_on_the_embedded_model() {
    let dir = routing_example();
    let o = run_example(dir.path(), &[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let selections = lines(&dir.path().join("out/selections.jsonl"));
    assert_eq!(selections.len(), ROUTES.len());
    let choice = by_unit(&selections, "unit_id", "choice");
    let decided_by = by_unit(&selections, "unit_id", "decided_by");
    let facts = lines(&dir.path().join("out/facts.jsonl"));
    let stage = by_unit(&facts, "source_ids", "stage");
    let rung_of = |choice: &str| match choice {
        "short" => "judge",
        "long" => "long_read",
        _ => "pr_judge",
    };
    for (id, want_choice, want_decider, _) in ROUTES {
        if want_decider.starts_with("rule:") {
            assert_eq!(choice[id], want_choice, "issue {id}");
            assert_eq!(decided_by[id], want_decider, "issue {id}");
        } else {
            assert_eq!(decided_by[id], "model", "issue {id}");
        }
        assert_eq!(stage[id], rung_of(&choice[id]), "issue {id}");
    }
    let cert: Value = serde_json::from_slice(
        &std::fs::read(dir.path().join("out/certificate.json")).expect("certificate"),
    )
    .expect("json");
    assert!(
        cert["backends"]
            .as_array()
            .expect("backends")
            .iter()
            .any(|b| b["kind"] == "llama"),
        "{}",
        cert["backends"]
    );
    assert_eq!(cert["verify"]["passed"], true, "{}", cert["verify"]);
}
