//! `fanfold plan` spends only what the choice needs: a larger context is
//! not run after a smaller one listed nothing, and with a person as the
//! oracle the labels its candidates wait for are gathered into one list,
//! said with how many lie past the label budget before any is asked.

use super::*;

mod strategies;

/// The plan's stdout and the strategy runs it made (the folders under
/// `plans/strategies` holding a certificate).
fn plan_in(f: &Fixture, extra: &[&str]) -> (Output, Vec<String>) {
    let o = run(bin()
        .arg("plan")
        .arg(f.path("spec.toml"))
        .arg("--store")
        .arg(f.path("store.sqlite"))
        .arg("--out")
        .arg(f.path("plans"))
        .arg("--write")
        .arg(f.path("plan.toml"))
        .args(extra)
        .env("FANFOLD_LOG", "error"));
    let mut ran: Vec<String> = std::fs::read_dir(f.path("plans/strategies"))
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter(|e| e.path().join("certificate.json").is_file())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    ran.sort();
    (o, ran)
}

/// A lister that names no id, standing in for the embedded model's
/// chunk contexts on bgl-alerts and issue-triage: `chunk-10` is run,
/// lists nothing of a sample whose labels call a sixth positive, and
/// `chunk-50`, `chunk-200` and `long` are not run after it, each said
/// why; the union bound still counts them.
#[test]
fn a_plan_runs_no_larger_context_after_a_smaller_one_listed_nothing() {
    let f = cascade_fixture(
        r#"{ proxy = "lex", target = "recall", at_least = 0.7, delta = 0.2, label_budget = 300, labels = "labels.jsonl" }"#,
    );
    truth_labels(&f, "labels.jsonl", (0..1000).map(|i| i.to_string()));
    std::fs::write(
        f.path("chunk.md"),
        "List the ids of the records that report a failure.\n",
    )
    .expect("chunk rubric");
    std::fs::write(f.path("scripted-chunk.jq"), "{matches: []}\n").expect("lister");
    let (o, ran) = plan_in(&f, &[]);
    let table = stdout(&o);
    assert!(
        matches!(o.status.code(), Some(0) | Some(3)),
        "{table}{}",
        stderr(&o)
    );
    // The proxy, the rung alone, micro, the rungs without the cascade,
    // three chunk sizes and long.
    assert!(
        table.contains("8 candidates, each tested at delta 0.0250"),
        "{table}"
    );
    assert!(
        ran.iter().any(|d| d == "strategy-chunk-10"),
        "{ran:?}\n{table}"
    );
    for larger in ["chunk-50", "chunk-200", "long"] {
        assert!(
            !ran.iter().any(|d| d == &format!("strategy-{larger}")),
            "{larger} ran: {ran:?}\n{table}"
        );
        assert!(
            table.contains(&format!("{larger}: chunk-10 listed no id of the ")),
            "{larger}: {table}"
        );
    }
    let chunk = table
        .lines()
        .find(|l| l.starts_with("| chunk-10"))
        .unwrap_or_else(|| panic!("{table}"));
    assert_eq!(
        chunk.split('|').nth(5).map(str::trim),
        Some("0"),
        "kept nothing: {table}"
    );
}

/// With a person as the oracle and two candidate proxies that rank the
/// records differently, each candidate's run waits for the labels that set
/// its own thresholds. The plan lists their union once, in its output
/// folder, and says how many it asks for now and in all its rounds, and,
/// once that passes the label budget, by how many and why; when one list
/// alone passes it, `fanfold label` says so again before it asks.
#[test]
fn a_plan_with_a_person_as_oracle_says_how_many_labels_it_asks_and_why() {
    let f = cascade_fixture(
        r#"{ proxy = "lex", target = "recall", at_least = 0.7, delta = 0.2, label_budget = 40, oracle = "person" }"#,
    );
    let spec = std::fs::read_to_string(f.path("spec.toml")).expect("spec");
    std::fs::write(
        f.path("spec.toml"),
        spec.replacen(
            "[[stages]]\nname = \"lex\"",
            "[[stages]]\nname = \"noisy\"\ntype = \"bm25\"\nversion = 1\nquery = \"routine status report\"\nthreshold = -1\nthen = \"lex\"\n\n[[stages]]\nname = \"lex\"",
            1,
        ),
    )
    .expect("spec");
    let store = f.path("store.sqlite");
    // The person gives the data's own labels for what the list asks.
    let give = || {
        let wanted = f.jsonl("plans/labels-wanted.jsonl");
        let ids = wanted
            .iter()
            .map(|w| w["id"].as_str().expect("id").to_owned());
        truth_labels(&f, "given.jsonl", ids);
        let o = run(bin()
            .arg("label")
            .arg(f.path("plans"))
            .arg("--store")
            .arg(&store)
            .arg("--import")
            .arg(f.path("given.jsonl")));
        assert!(o.status.success(), "{}", stderr(&o));
    };
    let mut asked: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
    let mut rounds = 0;
    for round in 0..4 {
        let (o, _) = plan_in(&f, &[]);
        let table = stdout(&o);
        if !f.path("plans/labels-wanted.jsonl").is_file() {
            assert!(
                !table.contains("A person is asked for"),
                "round {round}: {table}"
            );
            break;
        }
        rounds += 1;
        let wanted = f.jsonl("plans/labels-wanted.jsonl");
        let keys: std::collections::BTreeSet<String> = wanted
            .iter()
            .filter_map(|w| w["key"].as_str().map(str::to_owned))
            .collect();
        assert_eq!(keys.len(), wanted.len(), "each label once: round {round}");
        let n = wanted.len();
        // The union of the two candidates' own lists.
        let own: std::collections::BTreeSet<String> = ["plans/1-lex", "plans/2-noisy"]
            .iter()
            .flat_map(|d| f.jsonl(&format!("{d}/labels-wanted.jsonl")))
            .filter_map(|w| w["key"].as_str().map(str::to_owned))
            .collect();
        assert_eq!(own, keys, "round {round}: {table}");
        assert!(
            table.contains(&format!("A person is asked for {n} labels, listed in ")),
            "round {round}: {table}"
        );
        asked.extend(keys);
        let total = asked.len();
        if round > 0 {
            assert!(
                table.contains(&format!(
                    "this plan has asked for {total} distinct labels in all"
                )),
                "round {round}: {table}"
            );
        }
        if total > 40 {
            assert!(
                table.contains(&format!(
                    "{} of the {total} are PAST the label budget of 40",
                    total - 40
                )),
                "round {round}: {table}"
            );
        } else {
            assert!(
                table.contains(&format!("The {total} are within the label budget of 40.")),
                "round {round}: {table}"
            );
        }
        if n > 40 {
            // Said again by `fanfold label`, before it asks anything.
            let o = run(bin()
                .arg("label")
                .arg(f.path("plans"))
                .arg("--store")
                .arg(&store)
                .stdin(Stdio::null()));
            assert!(
                stdout(&o).contains(&format!(
                    "stage judge: {} of these {n} labels are PAST its label budget of 40",
                    n - 40
                )),
                "{}{}",
                stdout(&o),
                stderr(&o)
            );
        }
        give();
    }
    assert!(rounds > 0, "a person was asked for labels");
    assert!(
        asked.len() > 40,
        "two candidates drawing by their own scores asked for {} labels, past the budget",
        asked.len()
    );
}

/// A map stage whose every unit is cached asks its backend nothing, so the
/// embedded model does not start a job (it would decode the prompt's
/// shared prefix again, seconds a run on a loaded machine): the plan's
/// reruns of a strategy on more of the sample, and its candidates that
/// reuse another's facts, cost no model time.
#[test]
fn a_map_stage_with_every_unit_cached_starts_no_model_job() {
    let f = choice_fixture();
    let jobs = |o: &Output| stderr(o).matches("llama job finished").count();
    let first = run(f
        .run_command()
        .args(["--slots", "2"])
        .env("FANFOLD_LOG", "fanfold_llama=info"));
    assert!(
        matches!(first.status.code(), Some(0 | 3)),
        "{}",
        stderr(&first)
    );
    assert_eq!(jobs(&first), 1, "{}", stderr(&first));
    let again = run(f
        .run_command()
        .args(["--slots", "2"])
        .env("FANFOLD_LOG", "fanfold_llama=info"));
    assert!(
        matches!(again.status.code(), Some(0 | 3)),
        "{}",
        stderr(&again)
    );
    assert_eq!(f.certificate()["stats"]["model_calls"], 0);
    assert_eq!(jobs(&again), 0, "{}", stderr(&again));
}
