//! Cascades end to end: trained and scored-choice proxies, and the calls
//! a met target saves.

use crate::*;

/// A cascade whose proxy is trained: a logistic regression over the
/// embedded model's vectors of each record, fitted on half the label
/// budget and cross-fitted; the scripted judge is the oracle. 1,000
/// records, 200 flagged, in words a query would not all share.
#[test]
fn a_trained_proxy_is_fitted_on_its_labels_and_decides_what_it_is_sure_of() {
    let f = Fixture::new(JSON_ARRAY, "");
    let spec = std::fs::read_to_string(f.path("spec.toml")).expect("spec");
    let cascade = r#"{ proxy = "trained", features = "sim", target = "recall", at_least = 0.7, delta = 0.1, label_budget = 400 }"#;
    let spec = spec
        .replacen(
            "[[stages]]\nname = \"judge\"",
            "[[stages]]\nname = \"sim\"\ntype = \"embed\"\nversion = 1\nfields = [\"title\"]\npositive = [\"a machine broke\"]\nthreshold = -1.0\nthen = \"judge\"\n\n[[stages]]\nname = \"judge\"",
            1,
        )
        .replacen(
            "decision = { pointer = \"/decision\", positive = [\"yes\"], negative = [\"no\"] }",
            &format!("decision = {{ pointer = \"/decision\", positive = [\"yes\"], negative = [\"no\"] }}\ncascade = {cascade}"),
            1,
        );
    std::fs::write(f.path("spec.toml"), spec).expect("spec");
    let broken = [
        "the disk on node {} failed and the data is gone",
        "node {} crashed with a kernel panic",
        "power supply of rack {} burned out",
        "memory errors keep killing host {}",
    ];
    let routine = [
        "weekly status meeting notes {}",
        "lunch menu for day {}",
        "new colleague joins team {}",
        "holiday schedule for week {}",
        "office plants watered on floor {}",
    ];
    let rows: Vec<Value> = (0..1000)
        .map(|i| {
            let (flag, title) = match i % 5 {
                0 => (true, broken[i / 5 % 4].replace("{}", &i.to_string())),
                _ => (
                    false,
                    routine[(i + i / 5) % 5].replace("{}", &i.to_string()),
                ),
            };
            serde_json::json!({"id": i, "flag": flag, "title": title})
        })
        .collect();
    f.input(serde_json::to_string(&rows).expect("rows").as_bytes());
    let o = run(bin().arg("explain").arg(f.path("spec.toml")));
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("a logistic regression over `sim`'s embeddings, cross-fitted over 5 folds on the first 200 labels"),
        "{}",
        stdout(&o)
    );
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let c = f.certificate();
    let r = &c["stats"]["cascades"]["judge"];
    let trained = &r["trained"];
    assert_eq!(trained["labels"], 200, "{r}");
    assert_eq!(trained["folds_fitted"], 5, "{r}");
    let auc = trained["auc"].as_f64().expect("both classes labelled");
    assert!(auc > 0.9, "the embeddings tell broken from routine: {r}");
    assert_eq!(r["met"], true, "{r}");
    let labels = r["labels"].as_u64().unwrap();
    assert!(labels <= 400, "within the budget: {r}");
    assert!(r["proxy_decided"].as_u64().unwrap() > 0, "{r}");
    let calls = c["stats"]["model_calls"].as_u64().unwrap();
    // Every record's view is its own: the report's oracle calls (training,
    // thresholds and what was left to the oracle, once per view) are the
    // judge's calls.
    assert_eq!(r["oracle_calls"].as_u64(), Some(calls), "{r}");
    assert!(
        calls < 1000,
        "fewer calls than judging every record: {calls}"
    );
    // Recall against the judge's truth (the flag), over every record.
    let found: Vec<u64> = f.answer_ids().iter().map(|i| i.parse().unwrap()).collect();
    let hit = found.iter().filter(|&&i| i % 5 == 0).count();
    assert!(hit as f64 >= 0.7 * 200.0, "{hit} of 200 found");
    // A rerun fits the same proxy on the same labels, all from the cache.
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let again = f.certificate();
    assert_eq!(again["stats"]["model_calls"], 0);
    assert_eq!(
        again["stats"]["cascades"]["judge"],
        c["stats"]["cascades"]["judge"]
    );

    // A trained proxy needs the stage its vectors come from.
    let spec = std::fs::read_to_string(f.path("spec.toml")).expect("spec");
    std::fs::write(
        f.path("spec.toml"),
        spec.replace("features = \"sim\", ", ""),
    )
    .expect("spec");
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("a trained proxy needs `features`"),
        "{}",
        stderr(&o)
    );
}

/// A cascade whose proxy is a cheap map stage's scored choice: its
/// probability of a positive decision ranks the units. The cascade runs
/// the cheap stage over its units (no unit is routed to it), and the
/// scripted judge, the oracle, decides what the proof leaves to it.
#[test]
fn a_scored_choice_proxy_ranks_by_the_cheap_stage_probability() {
    let f = cascade_fixture(
        r#"{ proxy = "cheap", target = "recall", at_least = 0.7, delta = 0.2, label_budget = 300 }"#,
    );
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
    // Sure of the disk failures, unsure of everything else.
    std::fs::write(
        f.path("cheap.jq"),
        r#"(if (.title | test("disk")) then 0.9 else 0.2 end) as $p | {decision: (if $p > 0.5 then "yes" else "no" end), _scores: {yes: $p, no: (1 - $p)}}"#,
    )
    .expect("script");
    let o = run(bin().arg("explain").arg(f.path("spec.toml")));
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("the proxy is `cheap`'s scored probability of a positive decision"),
        "{}",
        stdout(&o)
    );
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let c = f.certificate();
    let r = &c["stats"]["cascades"]["judge"];
    assert_eq!(r["proxy"], "cheap", "{r}");
    assert_eq!(r["met"], true, "{r}");
    assert!(r["proxy_decided"].as_u64().unwrap() > 0, "{r}");
    // The cheap stage scored every record once; the judge was asked only
    // what the cascade gave the oracle.
    let calls = c["stats"]["model_calls"].as_u64().unwrap();
    let oracle = r["oracle_calls"].as_u64().unwrap();
    assert_eq!(calls, 1000 + oracle, "{r}");
    assert!(oracle < 1000, "{r}");
    let found: Vec<u64> = f.answer_ids().iter().map(|i| i.parse().unwrap()).collect();
    let hit = found.iter().filter(|&&i| i < 150).count();
    assert!(hit as f64 >= 0.7 * 150.0, "{hit} of 150 found");
    assert!(
        found.iter().all(|&i| i < 150),
        "the oracle confirmed every one"
    );
    // A rerun reuses the cheap stage's scores and the judge's facts.
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(f.certificate()["stats"]["model_calls"], 0);

    // A map stage whose decisions carry no probability cannot rank.
    let spec = std::fs::read_to_string(f.path("spec.toml")).expect("spec");
    std::fs::write(
        f.path("spec.toml"),
        spec.replace("decode = \"choice\"\n", ""),
    )
    .expect("spec");
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("the proxy `cheap` is a map stage whose decisions are not scored"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn a_cascade_meets_its_target_for_fewer_calls_and_says_so() {
    let f = cascade_fixture(
        r#"{ proxy = "lex", target = "recall", at_least = 0.7, delta = 0.1, label_budget = 300 }"#,
    );
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let cert = f.certificate();
    let report = &cert["stats"]["cascades"]["judge"];
    assert_eq!(report["met"], true, "{report}");
    assert_ne!(report["plan"]["type"], "oracle_decides_all", "{report}");
    let labels = report["labels"].as_u64().expect("labels");
    assert!(labels > 0 && labels <= 300, "{labels} labels");
    let proxy = report["proxy_decided"].as_u64().expect("proxy_decided");
    assert!(proxy > 300, "the proxy decided {proxy} units");
    // Every model call is a label or a unit left to the oracle, and
    // together they are fewer than one call per record.
    let calls = cert["stats"]["model_calls"].as_u64().expect("calls");
    assert_eq!(
        calls,
        report["oracle_calls"].as_u64().expect("oracle calls")
    );
    assert!(calls < 1000, "{calls} calls");
    // The answer reaches the target against the truth.
    let found: std::collections::BTreeSet<u64> = f
        .answer_ids()
        .iter()
        .filter_map(|id| id.parse().ok())
        .collect();
    let kept = (0..150u64).filter(|i| found.contains(i)).count();
    assert!(kept as f64 >= 0.7 * 150.0, "{kept} of 150 flagged found");
    let answer: Value =
        serde_json::from_str(&std::fs::read_to_string(f.path("out/answer.json")).expect("answer"))
            .expect("json");
    let quality = answer["quality"][0].as_str().expect("a quality line");
    assert!(
        quality.contains("recall ≥ 0.7") && quality.contains("holds"),
        "{quality}"
    );
    let md = std::fs::read_to_string(f.path("out/answer.md")).expect("answer.md");
    assert!(
        md.contains("> **Proven quality:** stage judge: recall"),
        "{md}"
    );
    assert!(md.contains("## Quality of `judge`"), "{md}");
    assert!(!md.contains("Quality: unmeasured"), "{md}");
    // The same run again pays for nothing: labels and oracle calls are
    // the judge's own facts, cached by what it saw.
    let again = f.run(&[]);
    assert_eq!(again.status.code(), Some(0), "{}", stderr(&again));
    assert_eq!(f.certificate()["stats"]["model_calls"], 0);
    // An edit to one record moves only that record's draws: the labels
    // the cascade asks again are at most that record's and one that takes
    // its place in the budget.
    let input = std::fs::read_to_string(f.path("input.data")).expect("input");
    let edited = input.replacen(
        "routine status report 500",
        "routine status report 500, rechecked",
        1,
    );
    assert_ne!(input, edited);
    f.input(edited.as_bytes());
    let edit = f.run(&[]);
    assert_eq!(edit.status.code(), Some(0), "{}", stderr(&edit));
    let calls = f.certificate()["stats"]["model_calls"]
        .as_u64()
        .expect("calls");
    assert!(calls <= 2, "an edit to one record paid {calls} calls");
}
