//! The select stage: routing by rule, then by a scored choice, and
//! choice decoding on the embedded model.

use super::*;

mod routing;

#[test]
fn a_floor_no_probability_can_meet_is_said_not_to_apply() {
    let f = select_fixture();
    // The router names its pick and nothing else, as an HTTP model does.
    std::fs::write(
        f.path("router.jq"),
        r#"if .kind == "docs" then {choice: "docs"} else {choice: "judge"} end"#,
    )
    .expect("router");
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let s = &f.certificate()["stats"]["selects"]["triage"];
    assert_eq!(s["below_floor"], 0, "{s}");
    assert_eq!(s["floor_unapplied"], 30, "every pick of the model: {s}");
    let md = std::fs::read_to_string(f.path("out/answer.md")).expect("answer.md");
    assert!(
        md.contains("30 model picks were kept without a probability"),
        "{md}"
    );
    // Where the backend can never return one, `explain` says so up front.
    let spec = std::fs::read_to_string(f.path("spec.toml")).expect("spec");
    std::fs::write(
        f.path("spec.toml"),
        spec.replace(
            "[backends.router]\ntype = \"scripted\"\nscript = \"router.jq\"",
            "[backends.router]\ntype = \"openai\"\nmodel = \"m\"\nbase_url = \"http://127.0.0.1:9/v1\"",
        ),
    )
    .expect("spec");
    let o = run(bin().arg("explain").arg(f.path("spec.toml")));
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o)
            .contains("a floor that cannot apply: the openai backend returns no probabilities"),
        "{}",
        stdout(&o)
    );
}

#[test]
fn a_select_routes_by_rule_then_by_scored_choice_and_nothing_else() {
    let f = select_fixture();
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let c = f.certificate();
    let s = &c["stats"]["selects"]["triage"];
    assert_eq!(s["units"], 40);
    // Docs rows never reach the model.
    assert_eq!(s["chosen"]["docs"]["rule:docs-rows"], 10);
    assert_eq!(s["chosen"]["judge"]["model"], 20);
    // Weak picks fall below the floor; hijacked answers are outside the
    // catalog, fail the schema on every attempt and take `otherwise`.
    assert_eq!(s["below_floor"], 5);
    assert_eq!(s["floor_unapplied"], 0, "every pick came with its scores");
    assert_eq!(s["chosen"]["unsure"]["model"], 5);
    assert_eq!(s["chosen"]["unsure"]["otherwise"], 5);
    assert_eq!(s["undecided"], 0);
    // The judge saw exactly the units sent to it.
    assert_eq!(c["routed_by_stage"]["judge"], 20);
    // 25 scored units, and the 5 hijacked ones, whose views are equal,
    // share one unit's three attempts.
    assert_eq!(s["calls"], 25 + 3);
    assert_eq!(c["stats"]["model_calls"], 28 + 20);
    let answer: Vec<u64> = f.answer_ids().iter().map(|i| i.parse().unwrap()).collect();
    let expected: Vec<u64> = (0..40).filter(|i| i % 4 == 1).collect();
    assert_eq!(answer, expected);
    // Every unit has one fact: the judge's, or the select's own.
    assert_eq!(c["statuses"]["negative"], 10 + 10);
    assert_eq!(c["statuses"]["positive"], 10);
    assert_eq!(c["statuses"]["abstain"], 10);
    // The judge called the unflagged bugs negative: the routing's confusion.
    assert_eq!(s["confusion"]["judge"]["positive"], 10);
    assert_eq!(s["confusion"]["judge"]["negative"], 10);
    let missed = ids_of(&s["disagreements"]["judge"]);
    assert!(missed.iter().all(|i| i % 4 == 2), "{missed:?}");

    // Nothing a record says can move it outside the catalog.
    let selections = f.jsonl("out/selections.jsonl");
    assert_eq!(selections.len(), 40);
    for sel in &selections {
        let choice = sel["choice"].as_str().unwrap();
        assert!(["judge", "docs", "unsure"].contains(&choice), "{sel}");
        let id: u64 = sel["unit_id"].as_str().unwrap().parse().unwrap();
        if id % 8 == 7 {
            assert_eq!(sel["decided_by"], "otherwise", "{sel}");
        }
        if id % 8 == 3 {
            assert_eq!(sel["below_floor_of"], "judge", "{sel}");
            assert_eq!(sel["alternatives"].as_array().map(Vec::len), Some(3));
        }
    }
    let docs: Vec<Value> = f
        .jsonl("out/facts.jsonl")
        .into_iter()
        .filter(|f| f["decision"] == "docs")
        .collect();
    assert_eq!(docs.len(), 10);
    assert!(
        docs.iter()
            .all(|f| f["reason"].as_str().unwrap().starts_with("documentation"))
    );

    let md = std::fs::read_to_string(f.path("out/answer.md")).expect("answer.md");
    assert!(md.contains("select `triage`"), "{md}");
    assert!(md.contains("| judge | 0 | 20 | 0 | 10 | 10 |"), "{md}");
    let o = run(bin().args(["report", "confusion"]).arg(f.path("out")));
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("[SIMULATED]"));
    assert!(
        stdout(&o).contains("| docs | 10 | 0 | 0 |"),
        "{}",
        stdout(&o)
    );

    // Choices are cached facts: a rerun pays nothing; one edited record
    // costs one choice and one judgement.
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(
        f.certificate()["stats"]["model_calls"],
        3,
        "only the hijacked view, never cached, is asked again"
    );
    let text = std::fs::read_to_string(f.path("input.data")).expect("input");
    f.input(text.replace("record 5\"", "record 5, edited\"").as_bytes());
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(f.certificate()["stats"]["model_calls"], 3 + 2);
}

#[test]
fn select_specs_name_their_mistakes() {
    for (from, to, needle) in [
        (
            r#"run = "judge", description"#,
            r#"run = "nowhere", description"#,
            "passes units on to `nowhere`, which is not a stage declared after it",
        ),
        (
            r#"exclude = "documentation" }"#,
            r#"exclude = "documentation", abstain = true }"#,
            "choice `docs` has 2 actions",
        ),
        (
            r#"below_floor = "unsure""#,
            r#"below_floor = "judge""#,
            "must be an `escalate` or `abstain` choice",
        ),
        (
            r#"choose = "docs""#,
            r#"choose = "drop""#,
            "rule `docs-rows` names choice `drop`",
        ),
        (
            r#"when = '.kind == "docs"'"#,
            r#"when = '.kind =='"#,
            "rule `docs-rows`",
        ),
    ] {
        let f = select_fixture();
        let spec = std::fs::read_to_string(f.path("spec.toml")).expect("spec");
        assert!(spec.contains(from), "{from}");
        std::fs::write(f.path("spec.toml"), spec.replace(from, to)).expect("spec");
        let o = f.run(&[]);
        assert_eq!(o.status.code(), Some(2), "{to}: {}", stderr(&o));
        assert!(stderr(&o).contains(needle), "{to}: {}", stderr(&o));
    }
}

/// The select's scorer on the embedded model: the choice is read from the
/// model's probabilities over the catalog's names alone, and is cached.
#[test]
fn embedded_select_scores_only_the_catalog() {
    let f = Fixture::new(
        JSON_ARRAY,
        r#"[[stages]]
name = "triage"
type = "select"
version = 1
fields = ["line"]
choices = [
  { name = "hardware", run = "judge", description = "the line reports a failing or faulty hardware part" },
  { name = "routine", exclude = "routine", description = "the line is routine information" },
  { name = "unsure", abstain = true, description = "you cannot tell" },
]
[stages.model]
rubric = "router.md"
backend = "local"
min_confidence = 0.4
below_floor = "unsure"
max_output_tokens = 16

[backends.local]
type = "llama"
slot_tokens = 512
"#,
    );
    std::fs::write(
        f.path("router.md"),
        "You triage one line of a supercomputer's system log.\n",
    )
    .expect("rubric");
    let lines = [
        "RAS KERNEL FATAL data storage interrupt",
        "RAS KERNEL INFO instruction cache parity error corrected",
        "RAS KERNEL INFO generating core.2275",
        "RAS KERNEL FATAL machine check interrupt (bit=0x1d): L2 dcache unit data parity error",
        "RAS APP FATAL ciod: failed to read message prefix on control stream",
        "RAS KERNEL INFO total of 12 ddr error(s) detected and corrected",
    ];
    let rows: Vec<Value> = lines
        .iter()
        .enumerate()
        .map(|(i, l)| serde_json::json!({"id": i, "line": l, "flag": l.contains("FATAL")}))
        .collect();
    f.input(serde_json::to_string(&rows).expect("rows").as_bytes());
    let o = f.run(&["--slots", "2"]);
    assert!(matches!(o.status.code(), Some(0 | 3)), "{}", stderr(&o));
    let c = f.certificate();
    assert!(
        c["backends"]
            .as_array()
            .expect("backends")
            .iter()
            .any(|b| b["kind"] == "llama")
    );
    let s = &c["stats"]["selects"]["triage"];
    assert_eq!(s["units"], 6);
    assert_eq!(s["undecided"], 0, "{s}");
    let selections = f.jsonl("out/selections.jsonl");
    assert_eq!(selections.len(), 6);
    for sel in &selections {
        assert_eq!(sel["decided_by"], "model", "{sel}");
        assert!(
            ["hardware", "routine", "unsure"].contains(&sel["choice"].as_str().unwrap()),
            "{sel}"
        );
        let alts = sel["alternatives"].as_array().expect("scored choices");
        let names: Vec<&str> = alts.iter().filter_map(|a| a["choice"].as_str()).collect();
        assert_eq!(names, ["hardware", "routine", "unsure"], "{sel}");
        let total: f64 = alts.iter().filter_map(|a| a["p"].as_f64()).sum();
        assert!((total - 1.0).abs() < 1e-6, "{sel}");
        let picked = sel["below_floor_of"]
            .as_str()
            .or(sel["choice"].as_str())
            .unwrap();
        let p = alts
            .iter()
            .find(|a| a["choice"] == picked)
            .and_then(|a| a["p"].as_f64())
            .unwrap();
        assert_eq!(sel["confidence"].as_f64(), Some(p), "{sel}");
        assert_eq!(sel["below_floor_of"].is_string(), p < 0.4, "{sel}");
    }
    let o = f.run(&["--slots", "2"]);
    assert!(matches!(o.status.code(), Some(0 | 3)), "{}", stderr(&o));
    assert_eq!(f.certificate()["stats"]["selects"]["triage"]["calls"], 0);
    assert_eq!(f.certificate()["stats"]["selects"]["triage"]["cached"], 6);
}

/// A map stage with `decode = "choice"` on the embedded model: each fact is
/// the decision alone, read from the scores of the allowed values, with the
/// chosen value's probability as its confidence and one completion token.
#[test]
fn embedded_choice_decoding_reads_the_decision_from_scores() {
    let f = choice_fixture();
    let explain = run(bin().arg("explain").arg(f.path("spec.toml")));
    assert!(
        stdout(&explain).contains("decode=choice"),
        "{}",
        stdout(&explain)
    );
    let o = f.run(&["--slots", "2"]);
    assert!(matches!(o.status.code(), Some(0 | 3)), "{}", stderr(&o));
    let facts = f.jsonl("out/facts.jsonl");
    assert_eq!(facts.len(), 6);
    for fact in &facts {
        assert_eq!(fact["model"]["backend"], "llama", "{fact}");
        let decision = fact["decision"].as_str().expect("decided");
        assert_eq!(fact["facts"], serde_json::json!({ "decision": decision }));
        let scores = fact["choice_scores"].as_array().expect("scored");
        let names: Vec<&str> = scores.iter().filter_map(|c| c["choice"].as_str()).collect();
        assert_eq!(names, ["yes", "no"], "{fact}");
        let p = |name: &str| {
            scores
                .iter()
                .find(|c| c["choice"] == name)
                .and_then(|c| c["p"].as_f64())
                .expect("p")
        };
        assert!((p("yes") + p("no") - 1.0).abs() < 1e-6, "{fact}");
        let other = if decision == "yes" { "no" } else { "yes" };
        assert!(p(decision) >= p(other), "the more probable value: {fact}");
        assert_eq!(fact["confidence"].as_f64(), Some(p(decision)), "{fact}");
        assert_eq!(fact["cost"]["completion_tokens"], 1, "{fact}");
    }
}
