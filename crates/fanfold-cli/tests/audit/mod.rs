//! The audit stage: what each rung missed, bounds on recall, and its
//! refusals.

use super::*;

/// An audit stage over a fixture whose prefilter throws away flagged rows
/// (ids 0–99 are "noise"; every tenth of them is flagged) and whose judge
/// misses "subtle" rows an independent judge catches.
fn audit_fixture(audit: &str) -> Fixture {
    let f = Fixture::new(
        JSON_ARRAY,
        r#"[[prefilter]]
name = "noise"
when = '.kind == "noise"'
action = "exclude"
"#,
    );
    let spec = std::fs::read_to_string(f.path("spec.toml")).expect("spec");
    let spec = spec.replace(
        "[backends.default]",
        &format!(
            r#"{audit}
[stages.judge]
version = 1
rubric = "audit.md"
output_schema = "schema.json"
backend = "auditor"
decision = {{ pointer = "/decision", positive = ["yes"], negative = ["no"] }}

[backends.auditor]
type = "scripted"
script = "audit.jq"

[backends.default]"#
        ),
    );
    std::fs::write(f.path("spec.toml"), spec).expect("spec");
    std::fs::write(
        f.path("audit.md"),
        "Say yes when the record should have been kept.\n",
    )
    .expect("audit rubric");
    std::fs::write(
        f.path("audit.jq"),
        r#"{decision: (if .flag == true or .subtle == true then "yes" else "no" end)}"#,
    )
    .expect("audit script");
    let mut rows = Vec::new();
    for i in 0..200 {
        let noise = i < 100;
        let flag = if noise { i % 10 == 0 } else { i % 4 == 0 };
        let subtle = !noise && i % 10 == 5;
        rows.push(serde_json::json!({
            "id": i,
            "kind": if noise { "noise" } else { "signal" },
            "flag": flag,
            "subtle": subtle,
        }));
    }
    f.input(serde_json::to_string(&rows).expect("rows").as_bytes());
    f
}

#[test]
fn an_audit_measures_each_rung_and_escalates_what_was_missed() {
    let f = audit_fixture(
        r#"[[stages]]
name = "recall"
type = "audit"
version = 1
rungs = ["prefilter", "judge"]
sample = 30
seed = 3
escalate = "judge"
"#,
    );
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let c = f.certificate();
    let audit = &c["stats"]["audits"]["recall"];
    let pre = &audit["rungs"]["prefilter"];
    assert_eq!(pre["miss"]["population"], 100);
    assert_eq!(pre["sampled"], 30);
    assert_eq!(pre["miss"]["judged"], 30);
    let missed_by_prefilter = ids_of(&pre["disagreeing"]);
    // 10 of the prefilter's 100 exclusions are flagged; the seeded sample
    // of 30 holds some of them.
    assert!(!missed_by_prefilter.is_empty(), "{pre}");
    assert!(
        missed_by_prefilter.iter().all(|i| *i < 100 && i % 10 == 0),
        "only flagged noise rows disagree: {missed_by_prefilter:?}"
    );
    let (rate, low, high) = (
        pre["miss"]["rate"].as_f64().unwrap(),
        pre["miss"]["low"].as_f64().unwrap(),
        pre["miss"]["high"].as_f64().unwrap(),
    );
    assert!((rate - missed_by_prefilter.len() as f64 / 30.0).abs() < 1e-9);
    assert!(low <= rate && rate <= high && high < 1.0, "{pre}");

    // The judge's own negatives: 75 of the 100 signal rows.
    let neg = &audit["rungs"]["judge"];
    assert_eq!(neg["miss"]["population"], 75);
    let missed_by_judge = ids_of(&neg["disagreeing"]);
    // 10 of the judge's 75 negatives are subtle, and the sample holds some.
    assert!(!missed_by_judge.is_empty(), "{neg}");
    assert!(
        missed_by_judge.iter().all(|i| *i >= 100 && i % 10 == 5),
        "only subtle rows disagree: {missed_by_judge:?}"
    );

    // The prefilter's misses went to the judge and are in the answer; the
    // judge's own negatives were not sent back to it.
    assert_eq!(
        audit["escalated"].as_u64(),
        Some(missed_by_prefilter.len() as u64)
    );
    let answer: Vec<u64> = f.answer_ids().iter().map(|i| i.parse().unwrap()).collect();
    for id in &missed_by_prefilter {
        assert!(
            answer.contains(id),
            "escalated {id} is answered: {answer:?}"
        );
    }
    assert_eq!(
        answer.len(),
        25 + missed_by_prefilter.len(),
        "the signal rows' 25 positives plus the recovered ones"
    );
    // One fact per escalated unit in the answer's statuses.
    assert_eq!(
        c["statuses"]["positive"].as_u64(),
        Some(answer.len() as u64)
    );
    let calls = c["stats"]["model_calls"].as_u64().unwrap();
    assert_eq!(
        calls,
        100 + 30 + 30 + missed_by_prefilter.len() as u64,
        "judge, two audit samples, escalations"
    );
    let md = std::fs::read_to_string(f.path("out/answer.md")).expect("answer.md");
    assert!(md.contains("audit `recall`"), "{md}");
    assert!(md.contains("| prefilter | 100 | 30 |"), "{md}");

    // The sample is seeded: a rerun judges the same units from the cache.
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let again = f.certificate();
    assert_eq!(again["stats"]["model_calls"], 0);
    let audit_again = &again["stats"]["audits"]["recall"];
    assert_eq!(audit_again["rungs"], audit["rungs"]);
    assert_eq!(audit_again["cached"], 60);
    assert_eq!(audit_again["calls"], 0);
}

#[test]
fn an_unproven_miss_rate_leaves_the_answer_incomplete() {
    let f = audit_fixture(
        r#"[[stages]]
name = "recall"
type = "audit"
version = 1
rungs = ["prefilter"]
sample = 10
max_sample = 40
max_miss_rate = 0.02
"#,
    );
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let c = f.certificate();
    let pre = &c["stats"]["audits"]["recall"]["rungs"]["prefilter"];
    // A 10 % miss rate cannot be shown under 2 %: the sample grew 10 -> 20
    // -> 40 and stopped at its cap.
    assert_eq!(pre["sampled"], 40, "{pre}");
    assert_eq!(pre["proven"], false);
    assert!(
        c["incomplete"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r.as_str().unwrap().contains("audit `recall`")),
        "{}",
        c["incomplete"]
    );

    // A prefilter that throws nothing flagged away is shown in one round
    // once the whole rung is judged.
    let f = audit_fixture(
        r#"[[stages]]
name = "recall"
type = "audit"
version = 1
rungs = ["prefilter"]
sample = 100
max_miss_rate = 0.02
"#,
    );
    let rows: Vec<Value> = (0..60)
        .map(|i| serde_json::json!({"id": i, "kind": if i < 30 { "noise" } else { "signal" }, "flag": i >= 50}))
        .collect();
    f.input(serde_json::to_string(&rows).unwrap().as_bytes());
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let pre = &f.certificate()["stats"]["audits"]["recall"]["rungs"]["prefilter"];
    assert_eq!(pre["miss"]["judged"], 30);
    assert_eq!(pre["miss"]["high"], 0.0, "the whole rung was judged: exact");
    assert_eq!(pre["proven"], true);
}

#[test]
fn an_audit_bounds_recall_and_samples_the_boundary_first() {
    let audit = r#"[[stages]]
name = "recall"
type = "audit"
version = 1
rungs = ["prefilter", "judge"]
sample = 16
max_sample = 64
min_recall = 0.9
seed = 5
"#;
    let f = audit_fixture(audit);
    // The judge is unsure (0.55) of the subtle rows it throws away and sure
    // (0.95) of the rest: the subtle ones are its boundary.
    let spec = std::fs::read_to_string(f.path("spec.toml")).expect("spec");
    std::fs::write(
        f.path("spec.toml"),
        spec.replacen(
            "decision = { pointer = \"/decision\", positive = [\"yes\"], negative = [\"no\"] }",
            "decision = { pointer = \"/decision\", positive = [\"yes\"], negative = [\"no\"] }\nconfidence = \"/confidence\"",
            1,
        ),
    )
    .expect("spec");
    std::fs::write(
        f.path("judge.jq"),
        r#"{decision: (if .flag == true then "yes" else "no" end), confidence: (if .subtle == true then 0.55 else 0.95 end)}"#,
    )
    .expect("script");
    let o = f.run(&[]);
    // 25 found; the judge would keep 45 (10 flagged noise rows thrown away
    // by the prefilter, 10 subtle rows by the judge): 90 % cannot be shown.
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let c = f.certificate();
    let a = &c["stats"]["audits"]["recall"];
    let judge = &a["rungs"]["judge"];
    let strata = judge["miss"]["strata"].as_array().expect("strata");
    assert_eq!(strata.len(), 2, "{judge}");
    assert_eq!(strata[0]["population"], 19, "a quarter of 75, rounded up");
    assert_eq!(strata[1]["population"], 56);
    // The boundary holds every subtle row, so half of each round finds
    // them; the rest holds none.
    assert!(strata[0]["disagreements"].as_u64().unwrap() > 0, "{judge}");
    assert_eq!(strata[1]["disagreements"], 0, "{judge}");
    assert!(
        ids_of(&judge["disagreeing"])
            .iter()
            .all(|i| *i >= 100 && i % 10 == 5),
        "{judge}"
    );
    // Three looks (16, 32, 64) of two rungs share delta 0.05.
    assert_eq!(judge["looks"], 3);
    let alpha = judge["miss"]["alpha"].as_f64().unwrap();
    assert!((alpha - 0.05 / 2.0 / 3.0).abs() < 1e-12, "{alpha}");
    let recall = &a["recall"];
    assert_eq!(recall["found"], 25, "{recall}");
    assert_eq!(recall["unaudited"], 0, "{recall}");
    assert_eq!(recall["proven"], false, "{recall}");
    let at_least = recall["at_least"].as_f64().unwrap();
    assert!(
        at_least <= 25.0 / 45.0,
        "a bound, never above the truth: {at_least}"
    );
    let missed = recall["missed_at_most"].as_u64().unwrap();
    assert!((at_least - 25.0 / (25.0 + missed as f64)).abs() < 1e-12);
    assert!(
        c["incomplete"].as_array().unwrap().iter().any(|r| r
            .as_str()
            .unwrap()
            .contains("could not show a recall of 90.0 %")),
        "{}",
        c["incomplete"]
    );
    let md = std::fs::read_to_string(f.path("out/answer.md")).expect("answer.md");
    assert!(md.contains("Recall against the judge: at least"), "{md}");
    // Said at the top, where a reader looks first, in place of
    // "unmeasured".
    let top = md
        .find("**Quality:** audit recall: recall against its judge is at least")
        .expect(&md);
    assert!(top < md.find("## ").unwrap_or(md.len()), "{md}");
    assert!(md.contains("the 90.0 % asked for is UNMET"), "{md}");
    assert!(!md.contains("Quality: unmeasured"), "{md}");
    assert!(md.contains("short of the 90.0 % asked for"), "{md}");
    assert!(md.contains("sampled by stratum"), "{md}");

    // A rung the audit does not read counts whole against recall.
    let f = audit_fixture(&audit.replace("[\"prefilter\", \"judge\"]", "[\"judge\"]"));
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let recall = &f.certificate()["stats"]["audits"]["recall"]["recall"];
    assert_eq!(recall["unaudited"], 100, "{recall}");

    // Nothing missed anywhere, every rung judged whole: recall is shown.
    let f = audit_fixture(&audit.replace("sample = 16\nmax_sample = 64", "sample = 100"));
    let rows: Vec<Value> = (0..60)
        .map(|i| serde_json::json!({"id": i, "kind": if i < 30 { "noise" } else { "signal" }, "flag": i >= 50, "subtle": false}))
        .collect();
    f.input(serde_json::to_string(&rows).unwrap().as_bytes());
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let recall = &f.certificate()["stats"]["audits"]["recall"]["recall"];
    assert_eq!(recall["at_least"], 1.0, "{recall}");
    assert_eq!(recall["proven"], true, "{recall}");
}

#[test]
fn audit_specs_name_their_mistakes() {
    for (audit, needle) in [
        ("rungs = [\"nowhere\"]\n", "unknown rung `nowhere`"),
        (
            "rungs = [\"prefilter\"]\nescalate = \"recall\"\n",
            "not a map stage",
        ),
        (
            "rungs = [\"prefilter\"]\nmax_miss_rate = 2.0\n",
            "between 0 and 1",
        ),
        (
            "rungs = [\"prefilter\"]\nmin_recall = 90\n",
            "min_recall 90 must be a fraction",
        ),
        (
            "rungs = [\"prefilter\"]\ndelta = 0\n",
            "delta 0 must be a probability",
        ),
    ] {
        let f = audit_fixture(&format!(
            "[[stages]]\nname = \"recall\"\ntype = \"audit\"\nversion = 1\n{audit}"
        ));
        let o = f.run(&[]);
        assert_eq!(o.status.code(), Some(2), "{audit}: {}", stderr(&o));
        assert!(stderr(&o).contains(needle), "{audit}: {}", stderr(&o));
    }
    // An audit's judge answers for no unit, so it has nothing to widen.
    let f = audit_fixture(
        "[[stages]]\nname = \"recall\"\ntype = \"audit\"\nversion = 1\nrungs = [\"prefilter\"]\n",
    );
    let spec = std::fs::read_to_string(f.path("spec.toml")).expect("spec");
    std::fs::write(
        f.path("spec.toml"),
        spec.replace(
            "backend = \"auditor\"",
            "backend = \"auditor\"\nwiden = { stage = \"judge\" }",
        ),
    )
    .expect("spec");
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("its judge widens nothing"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn an_empty_rung_missed_nothing() {
    let f = audit_fixture(
        r#"[[stages]]
name = "recall"
type = "audit"
version = 1
rungs = ["judge"]
sample = 10
max_miss_rate = 0.02
"#,
    );
    // Every record the judge sees is flagged: it ends none as negative.
    let rows: Vec<Value> = (0..20)
        .map(|i| serde_json::json!({"id": i, "kind": "signal", "flag": true}))
        .collect();
    f.input(serde_json::to_string(&rows).unwrap().as_bytes());
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let c = f.certificate();
    let rung = &c["stats"]["audits"]["recall"]["rungs"]["judge"];
    assert_eq!(rung["miss"]["population"], 0);
    assert_eq!(rung["proven"], true, "{rung}");
    assert_eq!(c["stats"]["audits"]["recall"]["calls"], 0);
}
