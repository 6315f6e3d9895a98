//! Prompt compression: a map stage's model reads each unit's text with its
//! least surprising words dropped, while its evidence is quoted from, and
//! verified against, the uncompressed unit.

use super::*;

const LONG: &str = "the login page of the new authentication path returns an error after the token refresh and every user is logged out";

/// A spec judging `text` with evidence, compressed to `keep` when given.
fn spec(keep: Option<f64>) -> Fixture {
    let compress = keep
        .map(|k| format!("compress = {{ keep = {k}, min_words = 4 }}\n"))
        .unwrap_or_default();
    let f = Fixture::new(JSON_ARRAY, "");
    let text = std::fs::read_to_string(f.path("spec.toml")).expect("spec");
    let text = text.replace(
        "decision = { pointer = \"/decision\", positive = [\"yes\"], negative = [\"no\"] }\n",
        &format!(
            "fields = [\"text\"]\ndecision = {{ pointer = \"/decision\", positive = [\"yes\"], negative = [\"no\"] }}\nevidence = \"/evidence\"\n{compress}"
        ),
    );
    std::fs::write(f.path("spec.toml"), text).expect("spec");
    std::fs::write(
        f.path("schema.json"),
        r#"{"type": "object", "required": ["decision", "evidence"], "properties": {"decision": {"enum": ["yes", "no"]}, "evidence": {"type": "array", "items": {"type": "object", "required": ["field", "quote"], "properties": {"field": {"type": "string"}, "quote": {"type": "string"}}}}}}"#,
    )
    .expect("schema");
    // The scripted judge quotes the whole field it was given to check.
    std::fs::write(
        f.path("judge.jq"),
        r#"{decision: (if .text | test("login") then "yes" else "no" end), evidence: [{field: "text", quote: .text}]}"#,
    )
    .expect("script");
    let rows: Vec<Value> = (0..4)
        .map(|i| {
            let text = if i % 2 == 0 {
                format!("{LONG} ({i})")
            } else {
                format!("record {i} is about the quarterly budget spreadsheet and its many colourful charts")
            };
            serde_json::json!({"id": i, "text": text})
        })
        .collect();
    f.input(serde_json::to_string(&rows).expect("rows").as_bytes());
    f
}

/// The prompt tokens the judge's facts were billed, by unit.
fn judge_prompt_tokens(f: &Fixture) -> Vec<(String, u64)> {
    let mut out: Vec<(String, u64)> = f
        .jsonl("out/facts.jsonl")
        .into_iter()
        .filter(|x| x["stage"] == "judge")
        .map(|x| {
            (
                x["source_ids"][0].as_str().unwrap_or("").to_owned(),
                x["cost"]["prompt_tokens"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    out.sort();
    out
}

#[test]
fn a_compressed_unit_is_read_shorter_and_its_evidence_is_still_the_source_s() {
    let plain = spec(None);
    let o = plain.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let compressed = spec(Some(0.5));
    let o = run(bin().arg("explain").arg(compressed.path("spec.toml")));
    assert!(o.status.success(), "{}", stderr(&o));
    let plan = stdout(&o);
    assert!(
        plan.contains("compress: the model reads 50 % of each text field's words"),
        "{plan}"
    );
    let o = compressed.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // The same answer, every citation verified against the stored unit.
    assert_eq!(plain.answer_ids(), ["0", "2"]);
    assert_eq!(compressed.answer_ids(), plain.answer_ids());
    let c = compressed.certificate();
    assert_eq!(
        c["verify"]["evidence_failures"],
        serde_json::json!([]),
        "{c}"
    );
    let answer: Value = serde_json::from_str(
        &std::fs::read_to_string(compressed.path("out/answer.json")).expect("answer"),
    )
    .expect("json");
    let quote = answer["items"][0]["evidence"][0]["quote"]
        .as_str()
        .expect("a quote");
    assert!(quote.starts_with(LONG), "{quote}");
    // What the judge read of each unit was about half as long.
    let (p, k) = (
        judge_prompt_tokens(&plain),
        judge_prompt_tokens(&compressed),
    );
    assert_eq!(p.len(), 4);
    assert_eq!(k.len(), 4);
    let total = |v: &[(String, u64)]| v.iter().map(|(_, t)| t).sum::<u64>();
    assert!(
        total(&k) < total(&p),
        "compressed {k:?} against plain {p:?}"
    );
    // The surprise pass is paid for: one call a unit beside the judge's.
    assert_eq!(c["stats"]["model_calls"], 4 + 4, "{c}");
}

#[test]
fn compression_on_a_backend_that_scores_no_tokens_is_refused() {
    let f = spec(Some(0.5));
    let text = std::fs::read_to_string(f.path("spec.toml")).expect("spec");
    let text = text.replace(
        "[backends.default]\ntype = \"scripted\"\nscript = \"judge.jq\"",
        "[backends.default]\ntype = \"openai\"\nmodel = \"m\"\nbase_url = \"http://127.0.0.1:9\"",
    );
    std::fs::write(f.path("spec.toml"), text).expect("spec");
    let o = run(bin().arg("explain").arg(f.path("spec.toml")));
    assert!(!o.status.success(), "{}", stdout(&o));
    assert!(stderr(&o).contains("cannot score tokens"), "{}", stderr(&o));
}
