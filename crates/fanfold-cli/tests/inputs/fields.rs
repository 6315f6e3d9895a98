//! A field of a record as a unit of its own (`unit_fields`): ids
//! `<key>.<field>`, evidence confined to that field, read back for verify.

use super::*;

const FIELD_PARTITION: &str =
    r#"{ type = "json_array", key = "id", kind = "issue", unit_fields = ["body"] }"#;

/// Two issues whose body is a unit of its own, judged with evidence by
/// `judge` (a jq program over the unit's view).
fn field_fixture(judge: &str) -> Fixture {
    let f = Fixture::new(FIELD_PARTITION, "");
    let spec = std::fs::read_to_string(f.path("spec.toml")).expect("spec");
    let spec = spec.replace(
        r#"decision = { pointer = "/decision", positive = ["yes"], negative = ["no"] }"#,
        "decision = { pointer = \"/decision\", positive = [\"yes\"], negative = [\"no\"] }\nevidence = \"/evidence\"\nmax_attempts = 1",
    );
    std::fs::write(f.path("spec.toml"), spec).expect("spec");
    std::fs::write(
        f.path("schema.json"),
        r#"{"type": "object", "required": ["decision", "evidence"], "properties": {
  "decision": {"enum": ["yes", "no"]},
  "evidence": {"type": "array", "items": {"type": "object", "required": ["field", "quote"],
    "properties": {"field": {"enum": ["title", "body"]}, "quote": {"type": "string"}}}}}}"#,
    )
    .expect("schema");
    std::fs::write(f.path("judge.jq"), judge).expect("judge");
    f.input(
        br#"[
  {"id": 1, "title": "Disk failure on node 3", "body": "The disk failed at noon. We replaced it."},
  {"id": 2, "title": "Quarterly report", "body": "All fine this quarter."}
]"#,
    );
    f
}

/// Says yes to a body that reports a failure, quoting `field`.
fn judge_quoting(field: &str, quote: &str) -> String {
    format!(
        r#"if ._unit_field == "body" and (.body | test("failed")) then {{decision: "yes", evidence: [{{field: "{field}", quote: "{quote}"}}]}} else {{decision: "no", evidence: []}} end"#
    )
}

#[test]
fn a_body_is_a_unit_of_its_own_and_quotes_only_itself() {
    let f = field_fixture(&judge_quoting("body", "The disk failed at noon."));
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let c = f.certificate();
    // Two records, each its own unit and its body's.
    assert_eq!(c["coverage"]["elements"], 4, "{}", c["coverage"]);
    assert_eq!(c["coverage"]["units"], 4);
    assert_eq!(c["coverage_complete"], true);
    assert_eq!(f.answer_ids(), ["1.body"]);
    let facts = f.jsonl("out/facts.jsonl");
    let mut ids: Vec<&str> = facts
        .iter()
        .filter_map(|f| f["source_ids"][0].as_str())
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, ["1", "1.body", "2", "2.body"]);
    // The body unit was read back from the stored source and its quote
    // found there, in the same view.
    assert_eq!(c["verify"]["passed"], true, "{}", c["verify"]);
    assert_eq!(c["verify"]["evidence_checked"], 1);
    let o = run(bin().arg("verify").arg(f.path("out")));
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));

    let o = run(bin().arg("explain").arg(f.path("spec.toml")));
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains(
            "units   each record without its unit fields, and `body` as unit <id>.body, each quoting only its own field"
        ),
        "{}",
        stdout(&o)
    );
}

#[test]
fn a_quote_from_another_field_of_the_same_record_is_refused() {
    // The title is in the body unit's view, as context, and the quote is
    // there verbatim: only the guard refuses it.
    let f = field_fixture(&judge_quoting("title", "Disk failure on node 3"));
    let o = f.run(&[]);
    let facts = f.jsonl("out/facts.jsonl");
    let body = facts
        .iter()
        .find(|f| f["source_ids"][0] == "1.body")
        .expect("a fact of the body unit");
    assert_eq!(body["status"], "error", "{body}");
    let reason = body["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("quote_outside_unit_field"), "{reason}");
    assert!(f.answer_ids().is_empty(), "{}", stdout(&o));
    assert_eq!(f.certificate()["complete"], false);
}

/// The example: each issue's body judged on its own, its quotes from
/// the body, read back by verify.
#[test]
fn the_bodies_example_judges_each_body_as_its_own_unit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let o = run(bin()
        .args(["run", "--backend", "scripted", "--json", "--store"])
        .arg(dir.path().join("store.sqlite"))
        .arg("--out")
        .arg(dir.path().join("out"))
        .arg(repo().join("examples/issue-routing/bodies.toml")));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let cert: Value = serde_json::from_slice(
        &std::fs::read(dir.path().join("out/certificate.json")).expect("certificate"),
    )
    .expect("json");
    // Twelve issues, each its unit and its body's.
    assert_eq!(cert["coverage"]["elements"], 24, "{}", cert["coverage"]);
    assert_eq!(cert["coverage"]["units"], 24);
    let answer: Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("out/answer.json")).expect("answer"))
            .expect("json");
    let items = answer["items"].as_array().expect("items");
    let ids: Vec<&str> = items.iter().filter_map(|i| i["unit_id"].as_str()).collect();
    assert_eq!(
        ids,
        [
            "101.body", "104.body", "201.body", "204.body", "301.body", "302.body", "304.body"
        ]
    );
    for fact in std::fs::read_to_string(dir.path().join("out/facts.jsonl"))
        .expect("facts")
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("json"))
        .filter(|f| f["status"] == "positive")
    {
        assert_eq!(fact["evidence"][0]["field"], "body", "{fact}");
    }
    assert_eq!(cert["verify"]["passed"], true, "{}", cert["verify"]);
    assert_eq!(cert["verify"]["evidence_checked"], 7);
}
