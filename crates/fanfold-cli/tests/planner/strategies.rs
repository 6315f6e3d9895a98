//! `fanfold plan`: the proxy and the whole-run strategy that meet a
//! target cheapest.

use crate::*;

/// `fanfold plan` measures each proxy a cascade could use and writes the
/// cheapest that proves the target; `run --plan` runs it and `explain
/// --plan` says where it departs from the spec. The spec declares a proxy
/// that ranks the wrong records first.
#[test]
fn a_plan_chooses_the_proxy_that_meets_the_target_cheapest() {
    let f = cascade_fixture(
        r#"{ proxy = "noisy", target = "recall", at_least = 0.7, delta = 0.2, label_budget = 300 }"#,
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
    let plan = f.path("plan.toml");
    let o = run(bin()
        .arg("plan")
        .arg(f.path("spec.toml"))
        .arg("--store")
        .arg(f.path("store.sqlite"))
        .arg("--out")
        .arg(f.path("plans"))
        .arg("--write")
        .arg(&plan)
        .arg("--proxies-only")
        .env("FANFOLD_LOG", "error"));
    let table = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{table}{}", stderr(&o));
    assert!(
        table.contains("2 candidates, each tested at delta 0.1"),
        "{table}"
    );
    let chosen = table
        .lines()
        .find(|l| l.contains("(chosen)"))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(chosen.contains("proxy `lex`"), "{table}");
    let noisy = table
        .lines()
        .find(|l| l.starts_with("| proxy `noisy`"))
        .unwrap_or_else(|| panic!("{table}"));
    let column =
        |line: &str, n: usize| -> u64 { line.split('|').nth(n).unwrap().trim().parse().unwrap() };
    let calls = |line: &str| column(line, 6);
    assert!(calls(chosen) < calls(noisy), "{table}");
    // Planning pays for labels, not for what a loser leaves to the oracle.
    assert!(column(noisy, 8) < 1000, "{table}");
    let written = std::fs::read_to_string(&plan).expect("plan file");
    assert!(written.contains("proxy = \"lex\""), "{written}");
    assert!(written.contains("delta = 0.1"), "{written}");

    let o = run(bin()
        .arg("explain")
        .arg(f.path("spec.toml"))
        .arg("--no-input")
        .arg("--plan")
        .arg(&plan));
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("stage `judge`: proxy `noisy` -> `lex`; delta 0.2 -> 0.1"),
        "{}",
        stdout(&o)
    );
    assert!(stdout(&o).contains("the proxy is `lex`"), "{}", stdout(&o));

    // The planned run reuses every label and fact the plan paid for, and
    // proves the same.
    let o = f.run(&["--plan", plan.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let c = f.certificate();
    let r = &c["stats"]["cascades"]["judge"];
    // Units left to the oracle that a candidate labelled while planning
    // are cached too.
    let model_calls = c["stats"]["model_calls"].as_u64().unwrap_or(u64::MAX);
    let left = r["oracle_calls"].as_u64().unwrap_or(0) - r["labels"].as_u64().unwrap_or(0);
    assert!(
        model_calls <= left,
        "the labels were paid for by the plan: {model_calls} calls for {left} units left: {r}"
    );
    assert_eq!(r["proxy"], "lex", "{r}");
    assert_eq!(r["met"], true, "{r}");
    assert!(r["proxy_decided"].as_u64().unwrap() > 0, "{r}");
    assert_eq!(
        r["oracle_calls"].as_u64(),
        Some(calls(chosen)),
        "the run proves what the plan measured"
    );

    // A plan file is data: one that raises the stage's delta past the
    // spec's is refused, naming the stage and both values.
    let tampered = f.path("tampered.toml");
    std::fs::write(&tampered, written.replace("delta = 0.1", "delta = 0.5")).expect("plan");
    let o = f.run(&["--plan", tampered.to_str().unwrap()]);
    assert_ne!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("delta to 0.5, but the spec declares 0.2"),
        "{}",
        stderr(&o)
    );
}

/// With a person's labels as the oracle, `fanfold plan` also measures the
/// whole-run strategies on a labelled sample. The scripted judge agrees
/// with every label, so one micro-context per record proves the target
/// with no label asked at run time, and is chosen over every cascade; the
/// BM25 rung alone keeps everything and fails on precision. `run --plan`
/// then runs micro, reusing the sample's facts.
#[test]
fn a_plan_measures_whole_run_strategies_and_chooses_one() {
    let f = cascade_fixture(
        r#"{ proxy = "lex", target = "recall", at_least = 0.7, delta = 0.2, label_budget = 300, labels = "labels.jsonl" }"#,
    );
    truth_labels(&f, "labels.jsonl", (0..1000).map(|i| i.to_string()));
    let plan = f.path("plan.toml");
    let o = run(bin()
        .arg("plan")
        .arg(f.path("spec.toml"))
        .arg("--store")
        .arg(f.path("store.sqlite"))
        .arg("--out")
        .arg(f.path("plans"))
        .arg("--write")
        .arg(&plan)
        .env("FANFOLD_LOG", "error"));
    let table = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{table}{}", stderr(&o));
    // The union bound covers the proxy and the three strategies.
    assert!(
        table.contains("4 candidates, each tested at delta 0.0500"),
        "{table}"
    );
    assert!(
        table.contains("a seeded sample of 300 of the 1000 units the prefilter keeps (300 labelled by the oracle"),
        "{table}"
    );
    let row = |name: &str| {
        table
            .lines()
            .find(|l| l.starts_with(&format!("| {name}")))
            .unwrap_or_else(|| panic!("no row {name}: {table}"))
            .to_owned()
    };
    let cell = |line: &str, n: usize| line.split('|').nth(n).unwrap().trim().to_owned();
    let micro = row("micro");
    assert!(micro.contains("(chosen)"), "{table}");
    assert_eq!(cell(&micro, 2), "yes", "{table}");
    assert_eq!(
        cell(&micro, 9),
        "300",
        "judged every sampled record: {table}"
    );
    assert_eq!(
        cell(&micro, 10),
        "1000",
        "scaled to the population: {table}"
    );
    let alone = row("`lex` alone");
    assert_eq!(cell(&alone, 2), "no", "{table}");
    assert_eq!(cell(&alone, 5), "300", "kept every sampled record: {table}");
    let precision: f64 = cell(&alone, 7).parse().unwrap();
    assert!(precision < 0.2, "keeping everything is imprecise: {table}");
    assert!(table.contains("Not measured: chunk-10"), "{table}");
    // A proven strategy asks no oracle call, so no proxy can be cheaper:
    // the proxy's run is not made.
    assert!(
        table.contains("Not measured: proxy `lex`: a proven candidate costs 0 oracle calls"),
        "{table}"
    );
    assert!(!f.path("plans/1-lex").exists(), "{table}");
    let written = std::fs::read_to_string(&plan).expect("plan file");
    assert!(written.contains("strategy = \"micro\""), "{written}");

    let o = run(bin()
        .arg("explain")
        .arg(f.path("spec.toml"))
        .arg("--no-input")
        .arg("--plan")
        .arg(&plan));
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("stage `judge`: the whole-run strategy `micro` in place of the spec's stages and cascade"),
        "{}",
        stdout(&o)
    );
    let o = f.run(&["--plan", plan.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let c = f.certificate();
    assert!(
        c["stats"]["cascades"]
            .as_object()
            .is_none_or(|m| m.is_empty()),
        "no cascade runs: {}",
        c["stats"]
    );
    assert_eq!(
        c["stats"]["model_calls"], 700,
        "the sample's 300 judgements are reused"
    );
    let mut found: Vec<u64> = f.answer_ids().iter().map(|i| i.parse().unwrap()).collect();
    found.sort_unstable();
    assert_eq!(found, (0..150).collect::<Vec<u64>>());
}

/// `fanfold plan` runs a whole-run strategy on the sample's first units
/// before the rest, and stops it once even the rest decided right could
/// not prove the target: a judge that misses most of what the labels call
/// positive is asked about the first eighth of the sample (a sixteenth is
/// not enough to tell), not all of it.
/// A scoring rung alone, which calls no model, runs on the whole sample;
/// and the rungs without the cascade leave out the scored stage only the
/// cascade reached, rather than refuse it.
#[test]
fn a_plan_stops_a_strategy_that_cannot_meet_the_target_on_the_first_units() {
    let f = cascade_fixture(
        r#"{ proxy = "lex", target = "recall", at_least = 0.9, delta = 0.2, label_budget = 300, labels = "labels.jsonl" }"#,
    );
    // A scored map stage only the cascade reaches: a proxy the plan may
    // choose, which the strategies, with no cascade, leave out.
    let spec = std::fs::read_to_string(f.path("spec.toml")).expect("spec");
    let cheap = r#"[[stages]]
name = "cheap"
type = "map"
version = 1
rubric = "rubric.md"
output_schema = "choice.schema.json"
backend = "cheap"
decode = "choice"
decision = { pointer = "/decision", positive = ["yes"], negative = ["no"] }

[backends.cheap]
type = "scripted"
script = "cheap.jq"

[backends.default]"#;
    std::fs::write(
        f.path("spec.toml"),
        spec.replacen("[backends.default]", cheap, 1),
    )
    .expect("spec");
    std::fs::write(
        f.path("choice.schema.json"),
        r#"{"type": "object", "required": ["decision"], "additionalProperties": false, "properties": {"decision": {"enum": ["yes", "no"]}}}"#,
    )
    .expect("schema");
    std::fs::write(
        f.path("cheap.jq"),
        r#"{decision: "no", _scores: {yes: 0.2, no: 0.8}}"#,
    )
    .expect("script");
    // The labels call 850 records positive; the judge says yes to 150.
    let labels: String = (0..1000)
        .map(|i| {
            let yes = !(150..300).contains(&i);
            format!(
                "{{\"id\": {i}, \"decision\": \"{}\"}}\n",
                if yes { "yes" } else { "no" }
            )
        })
        .collect();
    std::fs::write(f.path("labels.jsonl"), labels).expect("labels");
    let o = run(bin()
        .arg("plan")
        .arg(f.path("spec.toml"))
        .arg("--store")
        .arg(f.path("store.sqlite"))
        .arg("--out")
        .arg(f.path("plans"))
        .arg("--write")
        .arg(f.path("plan.toml"))
        .env("FANFOLD_LOG", "error"));
    let table = stdout(&o);
    assert!(
        matches!(o.status.code(), Some(0) | Some(3)),
        "{table}{}",
        stderr(&o)
    );
    // The union bound still covers every candidate: two proxies and three
    // strategies.
    assert!(
        table.contains("5 candidates, each tested at delta 0.0400"),
        "{table}"
    );
    let row = |name: &str| {
        table
            .lines()
            .find(|l| l.starts_with(&format!("| {name}")))
            .unwrap_or_else(|| panic!("no row {name}: {table}"))
            .to_owned()
    };
    let cell = |line: &str, n: usize| line.split('|').nth(n).unwrap().trim().to_owned();
    for name in ["micro", "the spec's rungs, no cascade"] {
        let r = row(name);
        assert_eq!(cell(&r, 2), "no", "{table}");
        // 38 of the 300 sampled records: the first eighth.
        let judged: u64 = cell(&r, 9).parse().unwrap();
        assert_eq!(judged, 38, "judged only the first units: {table}");
    }
    assert!(
        table.contains("Not a candidate: stopped after the sample's first 38 units (38 of them decided as on the whole sample)"),
        "{table}"
    );
    // The judge was asked about 38 records in all, over micro's runs on
    // the first 19 and 38: the rungs' runs reused micro's facts, and the
    // proxies' labels come from the file.
    let asked = sqlite3(
        &f.path("store.sqlite"),
        "SELECT COUNT(*) FROM facts WHERE stage = 'judge';",
    );
    assert_eq!(asked.trim(), "38", "{table}");
    // The BM25 rung alone calls no model: it ran on the whole sample.
    let alone = row("`lex` alone");
    assert_eq!(cell(&alone, 5), "300", "{table}");
}

/// Units that share a view share one call, so the planner scales a
/// strategy of one context a unit by the judge's distinct views: here the
/// judge sees only `flag`, two views among 1,000 units.
#[test]
fn a_plan_scales_one_context_a_unit_by_distinct_views() {
    let f = cascade_fixture(
        r#"{ proxy = "lex", target = "recall", at_least = 0.7, delta = 0.2, label_budget = 300, labels = "labels.jsonl" }"#,
    );
    let spec = std::fs::read_to_string(f.path("spec.toml")).expect("spec");
    std::fs::write(
        f.path("spec.toml"),
        spec.replacen(
            "rubric = \"rubric.md\"\n",
            "rubric = \"rubric.md\"\nfields = [\"flag\"]\n",
            1,
        ),
    )
    .expect("spec");
    truth_labels(&f, "labels.jsonl", (0..1000).map(|i| i.to_string()));
    let o = run(bin()
        .arg("plan")
        .arg(f.path("spec.toml"))
        .arg("--store")
        .arg(f.path("store.sqlite"))
        .arg("--out")
        .arg(f.path("plans"))
        .env("FANFOLD_LOG", "error"));
    let table = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{table}{}", stderr(&o));
    let micro = table
        .lines()
        .find(|l| l.starts_with("| micro"))
        .unwrap_or_else(|| panic!("no micro row: {table}"))
        .to_owned();
    let cell = |n: usize| micro.split('|').nth(n).unwrap_or("").trim().to_owned();
    assert_eq!(cell(9), "2", "one call a view on the sample: {table}");
    assert_eq!(
        cell(10),
        "2",
        "two views in all, not 2 × 1000 / 300: {table}"
    );
}
