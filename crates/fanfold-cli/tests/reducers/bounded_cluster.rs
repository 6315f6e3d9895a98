//! A model reducer bounded in tokens as well as in fan-in: a cluster
//! context closes early at `max_context_tokens`, and a fact too long for
//! any context is refused and said, never cut.

use super::*;

#[test]
fn a_cluster_context_past_its_token_bound_is_refused_never_cut() {
    let f = cluster_fixture("max_context_tokens = 210", THEME_BY_TOPIC, 12);
    // Every row a defect; row 4 carries a note no context of 210 tokens
    // holds (a fact line is about 30 tokens, this one over 300).
    let topics = ["login", "billing", "search"];
    let rows: Vec<Value> = (0..12)
        .map(|i| {
            let note = if i == 4 {
                "x".repeat(600)
            } else {
                String::new()
            };
            serde_json::json!({"id": i, "flag": true, "topic": topics[i % 3], "note": note})
        })
        .collect();
    f.input(serde_json::to_string(&rows).expect("rows").as_bytes());
    std::fs::write(
        f.path("judge.jq"),
        r#"{decision: (if .flag then "yes" else "no" end), topic: .topic, note: .note}"#,
    )
    .expect("judge");
    let o = run(bin()
        .arg("explain")
        .arg(f.path("spec.toml"))
        .arg("--no-input"));
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("at most 210 tokens of items a context (estimated at 2 bytes a token): a context closes early, an item past it alone is refused, never cut"),
        "{}",
        stdout(&o)
    );

    let o = f.run(&[]);
    // Incomplete: one fact is in no theme, and the answer says why.
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let c = f.certificate();
    let k = &c["stats"]["clusters"]["themes"];
    assert_eq!(k["failed"], serde_json::json!(["4"]), "{k}");
    let reason = k["errors"][0]["reason"].as_str().expect("a reason");
    assert!(
        reason.starts_with("refused, not cut: its items take about 3")
            && reason.ends_with("more than max_context_tokens = 210"),
        "{reason}"
    );
    assert_eq!(k["errors"].as_array().map(Vec::len), Some(1), "{k}");
    // Every other fact is in a theme, counted from its members.
    let counted: u64 = k["themes"]
        .as_array()
        .expect("themes")
        .iter()
        .map(|t| t["count"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(counted, 11, "{k}");
    assert_eq!(k["unmerged"], false, "{k}");
    let answer: Value =
        serde_json::from_str(&std::fs::read_to_string(f.path("out/answer.json")).expect("answer"))
            .expect("json");
    let incomplete = answer["incomplete"].to_string();
    assert!(
        incomplete.contains("cluster `themes`: 1 of its contexts failed")
            && incomplete.contains("refused, not cut"),
        "{incomplete}"
    );
    let md = std::fs::read_to_string(f.path("out/answer.md")).expect("answer.md");
    assert!(
        md.contains("**In no theme: their context failed**: #4"),
        "{md}"
    );
}
