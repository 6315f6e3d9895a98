//! Cascades: a labels file as the oracle, a lower level the user
//! accepts, a person asked past the budget only when told, and the
//! frontier in the run report.

use super::*;

mod oracles;
mod proxies;

/// Every unit the cascade leaves to the oracle is answered by the labels
/// file when it holds that unit's label: with a budget too small to prove
/// anything, the oracle decides every unit, and the file decides them all.
#[test]
fn a_labels_file_answers_every_unit_left_to_the_oracle() {
    let f = cascade_fixture(
        r#"{ proxy = "lex", target = "recall", at_least = 0.95, delta = 0.05, label_budget = 40, labels = "labels.jsonl" }"#,
    );
    truth_labels(&f, "labels.jsonl", (0..1000).map(|i| i.to_string()));
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let cert = f.certificate();
    let report = &cert["stats"]["cascades"]["judge"];
    assert_eq!(report["met"], true, "{report}");
    assert_eq!(report["unlabelled"], 0, "{report}");
    assert_eq!(cert["stats"]["model_calls"], 0);
    let found: std::collections::BTreeSet<u64> = f
        .answer_ids()
        .iter()
        .filter_map(|id| id.parse().ok())
        .collect();
    let kept = (0..150u64).filter(|i| found.contains(i)).count();
    assert!(kept as f64 >= 0.95 * 150.0, "{kept} of 150 flagged found");
    let md = std::fs::read_to_string(f.path("out/answer.md")).expect("answer.md");
    assert!(!md.starts_with("# INCOMPLETE"), "{md}");
}

/// A budget too small for the target: no label past it is asked for, and
/// answer.md and the certificate show what the labels did prove.
#[test]
fn a_budget_too_small_shows_the_frontier_it_proved_and_asks_no_more() {
    let f = cascade_fixture(
        r#"{ proxy = "lex", target = "recall", at_least = 0.99, delta = 0.05, label_budget = 40, labels = "labels.jsonl" }"#,
    );
    truth_labels(&f, "labels.jsonl", (0..1000).map(|i| i.to_string()));
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let cert = f.certificate();
    let report = &cert["stats"]["cascades"]["judge"];
    assert!(report["labels"].as_u64().expect("labels") <= 40, "{report}");
    let frontier = report["frontier"].as_array().expect("a frontier");
    assert!(!frontier.is_empty(), "{report}");
    for p in frontier {
        let proven = p["proven"].as_f64().expect("proven");
        assert!((0.0..=1.0).contains(&proven), "{report}");
    }
    let md = std::fs::read_to_string(f.path("out/answer.md")).expect("answer.md");
    assert!(md.contains("What the labels proved"), "{md}");
    assert!(
        md.contains("| units the proxy decides | recall proven at least |"),
        "{md}"
    );
}

/// The cascade's report of the fixture's run.
fn cascade_report(f: &Fixture) -> Value {
    f.certificate()["stats"]["cascades"]["judge"].clone()
}

fn answer_md(f: &Fixture) -> String {
    std::fs::read_to_string(f.path("out/answer.md")).expect("answer.md")
}

/// A target the budget cannot prove for a bold plan: accepting a lower
/// level on the command line answers at it on the same labels (no model
/// call, no new label) with the plan its proof chose, the proxy decides
/// more, and the answer, the certificate and explain say the target was
/// lowered, from what to what, and that a level given after the labels
/// were seen is not proven; written into the spec with a new seed, as the
/// answer says, it is.
#[test]
fn accepting_a_lower_level_proves_it_on_the_same_labels_and_says_so() {
    let f = cascade_fixture(
        r#"{ proxy = "lex", target = "recall", at_least = 0.99, delta = 0.1, label_budget = 150 }"#,
    );
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let declared = cascade_report(&f);
    let first_calls = f.certificate()["stats"]["model_calls"]
        .as_u64()
        .expect("calls");
    assert!(first_calls > 0);
    let md = answer_md(&f);
    assert!(md.contains("--accept judge=LEVEL"), "{md}");

    let o = f.run(&["--accept", "0.7"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let cert = f.certificate();
    assert_eq!(
        cert["stats"]["model_calls"], 0,
        "accepting asks the model nothing new"
    );
    let report = &cert["stats"]["cascades"]["judge"];
    let accepted = &report["accepted"];
    assert_eq!(accepted["after_labels"], true, "{report}");
    assert_eq!(
        report["plan"], accepted["accepted_plan"],
        "the answer is the accepted proof's plan: {report}"
    );
    assert_eq!(accepted["declared_at_least"], 0.99, "{report}");
    assert_eq!(accepted["accepted_at_least"], 0.7, "{report}");
    assert_eq!(accepted["by"], "--accept on the command line", "{report}");
    assert_eq!(accepted["not_asked"], 0, "{report}");
    assert_eq!(
        report["labels"], declared["labels"],
        "{report} vs {declared}"
    );
    assert_eq!(report["at_least"], 0.7, "{report}");
    let before = declared["proxy_decided"].as_u64().expect("decided");
    let after = report["proxy_decided"].as_u64().expect("decided");
    assert!(after > before, "the proxy decided {after} against {before}");
    assert_eq!(
        accepted["declared_proxy_decided"].as_u64(),
        Some(before),
        "{report}"
    );
    // The answer still reaches the accepted level against the truth.
    let found = f
        .answer_ids()
        .iter()
        .filter_map(|id| id.parse::<u64>().ok())
        .filter(|&i| i < 150)
        .count();
    assert!(found as f64 >= 0.7 * 150.0, "{found} of 150 flagged found");
    let answer: Value =
        serde_json::from_str(&std::fs::read_to_string(f.path("out/answer.json")).expect("answer"))
            .expect("json");
    let quality = answer["quality"][0].as_str().expect("a quality line");
    assert!(
        quality.contains("recall ≥ 0.7 (chosen after the labels were seen) passes its test on the labels that chose it")
            && quality.contains("the declared target recall ≥ 0.99 was LOWERED by the user to 0.7 (--accept on the command line), a level CHOSEN AFTER THE LABELS WERE SEEN, which the probability does not cover")
            && !quality.contains("with probability"),
        "{quality}"
    );
    let clean = "write `accept_at_least = 0.7` into the cascade with a new `seed` (it is 0 now) and run again";
    assert!(quality.contains(clean), "{quality}");
    let md = answer_md(&f);
    assert!(
        md.contains("**Target LOWERED by the user**: the declared target recall ≥ 0.99 was lowered to recall ≥ 0.7 (--accept on the command line), a level CHOSEN AFTER THE LABELS WERE SEEN"),
        "{md}"
    );
    assert!(
        md.contains("> **Quality:** stage judge") && !md.contains("Proven quality"),
        "{md}"
    );
    assert!(md.contains("not one confidence sequence"), "{md}");
    assert!(md.contains("no label was added"), "{md}");

    // As the answer says: the level written into the spec with a new seed
    // is proven on the labels that seed draws.
    let spec = std::fs::read_to_string(f.path("spec.toml")).expect("spec");
    std::fs::write(
        f.path("spec.toml"),
        spec.replace(
            "label_budget = 150 }",
            "label_budget = 150, accept_at_least = 0.7, seed = 1 }",
        ),
    )
    .expect("spec");
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let report = cascade_report(&f);
    assert_eq!(report["accepted"]["after_labels"], false, "{report}");
    assert_eq!(report["seed"], 1, "{report}");
    let md = answer_md(&f);
    assert!(
        md.contains("> **Proven quality:** stage judge: recall ≥ 0.7 with probability ≥ 0.9 holds"),
        "{md}"
    );

    // explain and --help say it too.
    let o = run(bin().arg("explain").arg(f.path("spec.toml")).args([
        "--no-input",
        "--accept",
        "judge=0.7",
    ]));
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("the user accepts 0.7 (--accept on the command line)"),
        "{}",
        stdout(&o)
    );
    let o = run(bin().args(["run", "--help"]));
    assert!(
        stdout(&o).contains("--accept <[STAGE=]LEVEL>"),
        "{}",
        stdout(&o)
    );
}

/// The spec's `accept_at_least` does the same, and says it came from the
/// spec; a level not below the target, or a stage without a cascade, is
/// refused before anything runs.
#[test]
fn accept_at_least_in_the_spec_lowers_the_target_and_bad_levels_are_refused() {
    let f = cascade_fixture(
        r#"{ proxy = "lex", target = "recall", at_least = 0.99, delta = 0.1, label_budget = 150, accept_at_least = 0.7 }"#,
    );
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let report = cascade_report(&f);
    assert_eq!(report["at_least"], 0.7, "{report}");
    assert_eq!(report["accepted"]["after_labels"], false, "{report}");
    assert_eq!(
        report["accepted"]["by"], "accept_at_least in the spec",
        "{report}"
    );
    assert!(
        answer_md(&f).contains("was lowered to recall ≥ 0.7 (accept_at_least in the spec)"),
        "{}",
        answer_md(&f)
    );

    let o = f.run(&["--accept", "0.995"]);
    assert_ne!(o.status.code(), Some(0));
    assert!(
        stderr(&o).contains("accept_at_least must be above 0 and below at_least (0.99), got 0.995"),
        "{}",
        stderr(&o)
    );
    let o = f.run(&["--accept", "lex=0.8"]);
    assert_ne!(o.status.code(), Some(0));
    assert!(
        stderr(&o)
            .contains("`lex` is not a map stage with a cascade in this spec (cascades: `judge`)"),
        "{}",
        stderr(&o)
    );
}

/// A person as the oracle: the run asks first for the draws that set the
/// thresholds, within the budget, a round at a time after the first
/// sitting, so the person gives exactly the labels the proof reads; once
/// they are given, the units the plan leaves to the oracle are past the
/// budget, and the run's output, answer.md and `fanfold label` say how
/// many and why before the first is asked.
#[test]
fn a_person_is_never_asked_past_the_budget_unannounced() {
    let budget = 40;
    let f = cascade_fixture(&format!(
        r#"{{ proxy = "lex", target = "recall", at_least = 0.99, delta = 0.1, label_budget = {budget}, oracle = "person" }}"#
    ));
    let store = f.path("store.sqlite");
    let import = |file: &std::path::Path| {
        let o = run(bin()
            .arg("label")
            .arg(f.path("out"))
            .arg("--store")
            .arg(&store)
            .arg("--import")
            .arg(file));
        assert!(o.status.success(), "{}", stderr(&o));
        o
    };
    // Until the thresholds are set, every label asked is within the
    // budget, and said to be.
    let mut rounds = 0;
    let mut given = 0;
    let past = loop {
        let o = f.run(&[]);
        assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
        let wanted = f.jsonl("out/labels-wanted.jsonl");
        let report = cascade_report(&f);
        assert!(!wanted.is_empty());
        if wanted.iter().all(|w| w["asked_for"] == "thresholds") {
            assert!(
                wanted.len() <= budget,
                "{} threshold labels against a budget of {budget}",
                wanted.len()
            );
            assert_eq!(report["wanted_past_budget"], 0, "{report}");
            assert!(
                answer_md(&f).contains(&format!("within the label budget of {budget}")),
                "{}",
                answer_md(&f)
            );
            let o = import(&truth_labels(
                &f,
                "truth.jsonl",
                wanted
                    .iter()
                    .map(|w| w["id"].as_str().expect("id").to_owned()),
            ));
            assert!(!stdout(&o).contains("PAST"), "{}", stdout(&o));
            given += wanted.len();
            rounds += 1;
            assert!(rounds < 4, "still setting thresholds after {rounds} rounds");
            continue;
        }
        // Past the budget: every line says so, and the run said how many
        // and why before anyone is asked.
        assert!(
            wanted.iter().all(|w| w["asked_for"] == "oracle"),
            "{wanted:?}"
        );
        let n = wanted.len();
        assert_eq!(
            report["wanted_past_budget"].as_u64(),
            Some(n as u64),
            "{report}"
        );
        assert_eq!(
            report["labels"].as_u64(),
            Some(given as u64),
            "the person gave {given} labels over {rounds} sittings: {report}"
        );
        let said = format!("{n} of these labels are PAST the label budget of {budget}");
        assert!(stderr(&o).contains(&said), "{}", stderr(&o));
        let md = answer_md(&f);
        assert!(md.contains(&said), "{md}");
        assert!(
            md.contains("the labels did not prove the proxy sure of them"),
            "{md}"
        );
        break n;
    };
    // The labeller says it before the first label past the budget, and
    // asks nothing until the person agrees.
    let label = format!(
        "'{}' label '{}' --store '{}' --labeller ann; echo LABEL-EXITED; sleep 60",
        env!("CARGO_BIN_EXE_fanfold"),
        f.path("out").display(),
        store.display()
    );
    let t = Tmux::start(&label);
    let screen = t.wait_for("[enter] start labelling");
    assert!(screen.contains("before you start"), "{screen}");
    assert!(
        screen.contains(&format!("{past} of these {past} labels are PAST its")),
        "{screen}"
    );
    assert!(!screen.contains(&format!("1 of {past}")), "{screen}");
    t.keys("Enter");
    let screen = t.wait_for(&format!("1 of {past}"));
    assert!(screen.contains("Question: Say yes"), "{screen}");
    t.keys("q");
    t.wait_for("LABEL-EXITED");
    drop(t);
    // Quitting at the announcement asks nothing.
    let t = Tmux::start(&label);
    t.wait_for("[enter] start labelling");
    t.keys("q");
    let screen = t.wait_for("LABEL-EXITED");
    assert!(screen.contains("0 labelled"), "{screen}");
    drop(t);
    assert_eq!(
        sqlite3(
            &store,
            "SELECT COUNT(*) FROM labels WHERE labeller = 'person:ann';"
        )
        .trim(),
        "0"
    );
}

/// The run report shows each cascade's frontier as a table and a plot a
/// browser draws: a row and a point per plan, the target as a line, and
/// the lowered target said.
#[test]
fn the_run_report_shows_the_frontier_as_a_table_and_a_plot() {
    let browser = chromium();
    let f = cascade_fixture(
        r#"{ proxy = "lex", target = "recall", at_least = 0.99, delta = 0.1, label_budget = 150, accept_at_least = 0.7 }"#,
    );
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let report = cascade_report(&f);
    let frontier = report["frontier"].as_array().expect("a frontier").clone();
    assert!(frontier.len() > 1, "{report}");
    let o = run(bin().arg("report").arg("run").arg(f.path("out")));
    assert!(o.status.success(), "{}", stderr(&o));
    let (dom, png) = render(&browser, &f.path("out/report.html"));
    assert!(png.len() > 10_000, "a screenshot of {} bytes", png.len());
    assert!(
        dom.contains("Cascade <code>judge</code>: what the labels proved"),
        "{dom}"
    );
    let table = dom
        .split("<table class=\"frontier\"")
        .nth(1)
        .and_then(|t| t.split("</table>").next())
        .expect("the frontier table");
    let rows: Vec<&str> = table.split("<tr class=\"frontier-row\">").skip(1).collect();
    assert_eq!(rows.len(), frontier.len(), "{table}");
    for (row, p) in rows.iter().zip(&frontier) {
        let share = format!("{:.1} %", 100.0 * p["saving"].as_f64().expect("saving"));
        let proven = format!("{:.3}", p["proven"].as_f64().expect("proven"));
        assert!(
            row.contains(&share) && row.contains(&proven),
            "{row} for {p}"
        );
    }
    let plot = dom
        .split("<svg id=\"frontier-unit-judge\"")
        .nth(1)
        .and_then(|t| t.split("</svg>").next())
        .expect("the frontier plot");
    assert_eq!(
        plot.matches("<circle class=\"frontier-point\"").count(),
        frontier.len(),
        "{plot}"
    );
    assert!(plot.contains("class=\"target\""), "{plot}");
    assert!(plot.contains("accepted 0.7"), "{plot}");
    assert!(plot.contains("class=\"declared-target\""), "{plot}");
    assert!(
        dom.contains("The declared target recall ≥ 0.99 was LOWERED by the user to recall ≥ 0.7"),
        "{dom}"
    );
    let md = std::fs::read_to_string(f.path("out/report.md")).expect("report.md");
    assert!(
        md.contains("| units the proxy decides | recall proven at least | meets 0.7 |"),
        "{md}"
    );
}

/// A joint target holds the answer's recall and its precision to the
/// level at once: the proxy keeps the units it is sure of, the labels
/// file decides the rest, and against the file's truth both metrics
/// reach the level.
#[test]
fn a_joint_target_holds_recall_and_precision_both() {
    let f = cascade_fixture(
        r#"{ proxy = "lex", target = "recall_and_precision", at_least = 0.85, delta = 0.1, label_budget = 300, labels = "labels.jsonl" }"#,
    );
    truth_labels(&f, "labels.jsonl", (0..1000).map(|i| i.to_string()));
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let report = cascade_report(&f);
    assert_eq!(report["met"], true, "{report}");
    let target = report["target"].as_str().expect("target");
    assert!(
        target.starts_with("recall and precision ≥ 0.85"),
        "{report}"
    );
    assert!(
        report["proxy_decided"].as_u64().expect("proxy_decided") > 0,
        "the proxy decided nothing: {report}"
    );
    let found: std::collections::BTreeSet<u64> = f
        .answer_ids()
        .iter()
        .filter_map(|id| id.parse().ok())
        .collect();
    let right = (0..150u64).filter(|i| found.contains(i)).count() as f64;
    let recall = right / 150.0;
    let precision = right / found.len().max(1) as f64;
    assert!(
        recall >= 0.85 && precision >= 0.85,
        "recall {recall}, precision {precision}"
    );
    assert!(
        answer_md(&f).contains("recall and precision"),
        "{}",
        answer_md(&f)
    );
}

/// [`cascade_fixture`] with a trained proxy's features in place of the
/// `lex` stage: an embed stage `sim` over each record's title.
fn trained_fixture(cascade: &str) -> Fixture {
    let f = cascade_fixture(cascade);
    let spec = std::fs::read_to_string(f.path("spec.toml")).expect("spec");
    let lex = "name = \"lex\"\ntype = \"bm25\"\nversion = 1\nquery = \"disk failure crash\"\nthreshold = -1\nthen = \"judge\"";
    assert!(spec.contains(lex), "{spec}");
    let sim = "name = \"sim\"\ntype = \"embed\"\nversion = 1\nfields = [\"title\"]\npositive = [\"a machine broke\"]\nthreshold = -1.0\nthen = \"judge\"";
    std::fs::write(f.path("spec.toml"), spec.replace(lex, sim)).expect("spec");
    f
}

/// The ids a trained proxy was fitted on, in the order asked.
fn fitted_on(report: &Value) -> Vec<String> {
    report["fitted_on"]
        .as_array()
        .expect("the fit's units")
        .iter()
        .map(|id| id.as_str().expect("an id").to_owned())
        .collect()
}

/// A trained proxy fits on labels chosen where it is unsure by default:
/// with a labels file, every round at once; the first round is the random
/// fit's own start, the later ones differ from it, and both spend exactly
/// the training half of the budget. explain names the fit, a rerun asks
/// nothing new and fits the same scores, and `fit` on a proxy that is not
/// trained is refused.
#[test]
fn a_trained_proxy_fits_on_labels_chosen_where_it_is_unsure() {
    let cascade = r#"{ proxy = "trained", features = "sim", target = "recall", at_least = 0.9, delta = 0.1, label_budget = 100, labels = "labels.jsonl" }"#;
    let f = trained_fixture(cascade);
    truth_labels(&f, "labels.jsonl", (0..1000).map(|i| i.to_string()));
    let o = run(bin().arg("explain").arg(f.path("spec.toml")));
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("on the first 50 labels, chosen where it is unsure (fit = \"active\"): 20 at random, then 3 rounds of up to 10"),
        "{}",
        stdout(&o)
    );
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let active = cascade_report(&f);
    assert_eq!(active["trained"]["fit"], "active", "{active}");
    assert_eq!(
        active["trained"]["rounds"],
        serde_json::json!([20, 10, 10, 10]),
        "{active}"
    );
    assert_eq!(active["met"], true, "{active}");
    let active_ids = fitted_on(&active);
    let distinct: std::collections::BTreeSet<&String> = active_ids.iter().collect();
    assert_eq!((active_ids.len(), distinct.len()), (50, 50), "{active}");
    assert_eq!(active["trained"]["labels"], 50, "{active}");
    assert!(
        active["labels"].as_u64().expect("labels") <= 100,
        "within the budget: {active}"
    );

    // A rerun on the same labels asks the same and fits the same scores.
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(cascade_report(&f), active);

    let spec = std::fs::read_to_string(f.path("spec.toml")).expect("spec");
    std::fs::write(
        f.path("spec.toml"),
        spec.replace(
            "label_budget = 100,",
            "label_budget = 100, fit = \"random\",",
        ),
    )
    .expect("spec");
    let o = run(bin().arg("explain").arg(f.path("spec.toml")));
    assert!(
        stdout(&o).contains("on the first 50 labels, a seeded random sample (fit = \"random\")"),
        "{}",
        stdout(&o)
    );
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let random = cascade_report(&f);
    assert_eq!(random["trained"]["fit"], "random", "{random}");
    assert_eq!(
        random["trained"]["rounds"],
        serde_json::json!([50]),
        "{random}"
    );
    let random_ids = fitted_on(&random);
    assert_eq!(random_ids.len(), 50, "{random}");
    assert_eq!(
        active_ids[..20],
        random_ids[..20],
        "the active fit starts with the random fit's seeded draws"
    );
    let random_set: std::collections::BTreeSet<&String> = random_ids.iter().collect();
    let chosen_apart = active_ids[20..]
        .iter()
        .filter(|id| !random_set.contains(id))
        .count();
    assert!(
        chosen_apart > 0,
        "the later rounds chose what the random fit drew: {active_ids:?}"
    );

    // `fit` chooses a trained proxy's labels, and no other proxy's.
    let f = cascade_fixture(
        r#"{ proxy = "lex", target = "recall", at_least = 0.9, label_budget = 40, fit = "active" }"#,
    );
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(
            "fit = \"active\" chooses a trained proxy's labels; the proxy `lex` is not trained"
        ),
        "{}",
        stderr(&o)
    );
}

/// A person labels an active fit round by round: the first run waits for
/// the random first round, each run after an import waits for the next
/// round (units never asked before, chosen on the labels given), then the
/// proof's draws are asked, and once every label is given the run
/// decides; a rerun asks for nothing new.
#[test]
fn a_person_labels_an_active_fit_round_by_round() {
    let budget = 100;
    let f = trained_fixture(&format!(
        r#"{{ proxy = "trained", features = "sim", target = "recall", at_least = 0.9, delta = 0.1, label_budget = {budget}, oracle = "person" }}"#
    ));
    let store = f.path("store.sqlite");
    let import = |ids: Vec<String>| {
        let file = truth_labels(&f, "truth.jsonl", ids.into_iter());
        let o = run(bin()
            .arg("label")
            .arg(f.path("out"))
            .arg("--store")
            .arg(&store)
            .arg("--import")
            .arg(&file));
        assert!(o.status.success(), "{}", stderr(&o));
    };
    let wanted_ids = |f: &Fixture| -> Vec<(String, Value)> {
        if !f.path("out/labels-wanted.jsonl").exists() {
            return Vec::new();
        }
        f.jsonl("out/labels-wanted.jsonl")
            .into_iter()
            .map(|w| {
                (
                    w["id"].as_str().expect("id").to_owned(),
                    w["asked_for"].clone(),
                )
            })
            .collect()
    };
    let mut given: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
    let mut fit_rounds: Vec<usize> = Vec::new();
    let mut sittings = 0;
    let report = loop {
        let o = f.run(&[]);
        let report = cascade_report(&f);
        if !report["plan"].is_null() {
            break report;
        }
        assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
        let wanted = wanted_ids(&f);
        assert!(!wanted.is_empty(), "{report}");
        for (id, why) in &wanted {
            assert_eq!(why, "thresholds", "{report}");
            assert!(!given.contains(id), "unit {id} was asked again");
        }
        let rounds: Vec<usize> = report["trained"]["rounds"]
            .as_array()
            .expect("the fit's rounds so far")
            .iter()
            .map(|n| n.as_u64().expect("a count") as usize)
            .collect();
        if rounds.len() > fit_rounds.len() {
            // A round of the fit: the report counts it, and the run asks
            // for every label of it.
            assert_eq!(rounds[..fit_rounds.len()], fit_rounds[..], "{report}");
            assert_eq!(rounds.last().copied(), Some(wanted.len()), "{report}");
            fit_rounds = rounds;
        }
        given.extend(wanted.into_iter().map(|(id, _)| id));
        import(given.iter().cloned().collect());
        sittings += 1;
        assert!(sittings < 12, "still asking after {sittings} sittings");
    };
    assert_eq!(fit_rounds, [20, 10, 10, 10], "one run a round: {report}");
    assert_eq!(report["trained"]["fit"], "active", "{report}");
    let fitted = fitted_on(&report);
    assert_eq!(fitted.len(), 50, "{report}");
    assert!(fitted.iter().all(|id| given.contains(id)), "{report}");
    assert!(
        sittings > fit_rounds.len(),
        "the proof's draws were asked after the fit: {sittings} sittings"
    );
    // What the plan leaves to the oracle is asked past the budget, said
    // so; given too, the run decides every unit.
    let past = wanted_ids(&f);
    assert!(past.iter().all(|(_, why)| why == "oracle"), "{past:?}");
    if !past.is_empty() {
        given.extend(past.into_iter().map(|(id, _)| id));
        import(given.iter().cloned().collect());
        let o = f.run(&[]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    }
    let decided = cascade_report(&f);
    assert_eq!(decided["met"], true, "{decided}");
    assert_eq!(decided["wanted"], 0, "{decided}");
    // A rerun asks for no new label and fits the same proxy.
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(wanted_ids(&f).is_empty(), "{:?}", wanted_ids(&f));
    assert_eq!(cascade_report(&f), decided);
}

/// With the stage's backend as the oracle, an active fit's rounds are
/// judged one after another, each before the next is chosen: the model is
/// asked once per view for the fit's labels, the proof's and the units
/// left to it, and a rerun asks it nothing and fits the same proxy.
#[test]
fn the_backend_judges_an_active_fit_round_by_round() {
    let f = trained_fixture(
        r#"{ proxy = "trained", features = "sim", target = "recall", at_least = 0.9, delta = 0.1, label_budget = 400 }"#,
    );
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let cert = f.certificate();
    let report = &cert["stats"]["cascades"]["judge"];
    assert_eq!(report["trained"]["fit"], "active", "{report}");
    assert_eq!(
        report["trained"]["rounds"],
        serde_json::json!([80, 40, 40, 40]),
        "{report}"
    );
    assert_eq!(report["trained"]["labels"], 200, "{report}");
    assert_eq!(fitted_on(report).len(), 200, "{report}");
    assert!(
        report["proxy_decided"].as_u64().expect("decided") > 0,
        "{report}"
    );
    assert_eq!(report["met"], true, "{report}");
    let calls = cert["stats"]["model_calls"].as_u64().expect("calls");
    assert_eq!(report["oracle_calls"].as_u64(), Some(calls), "{report}");
    assert!(
        calls < 1000,
        "fewer calls than judging every record: {calls}"
    );
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let again = f.certificate();
    assert_eq!(again["stats"]["model_calls"], 0);
    assert_eq!(&again["stats"]["cascades"]["judge"], report);
}
