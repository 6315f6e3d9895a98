//! The rerank stage: the model scores each (question, unit) pair and only
//! the best-scored units go on to the judge.

use super::*;

/// A fixture whose first stage is a reranker over `rel`, the scripted
/// model's probability of `yes`, keeping what `cut` declares.
fn reranked(cut: &str) -> Fixture {
    let f = Fixture::new(
        JSON_ARRAY,
        &format!(
            r#"[[stages]]
name = "rank"
type = "rerank"
version = 1
fields = ["text", "rel"]
backend = "ranker"
{cut}
then = "judge"

[backends.ranker]
type = "scripted"
script = "rank.jq"
"#
        ),
    );
    std::fs::write(
        f.path("rank.jq"),
        r#"{relevant: (if .rel >= 0.5 then "yes" else "no" end), _scores: {yes: .rel, no: (1 - .rel)}}"#,
    )
    .expect("script");
    let rels = [0.9, 0.2, 0.7, 0.95, 0.1, 0.6];
    let rows: Vec<Value> = rels
        .iter()
        .enumerate()
        .map(|(i, rel)| serde_json::json!({"id": i, "flag": i != 2, "rel": rel, "text": format!("record {i}")}))
        .collect();
    f.input(serde_json::to_string(&rows).expect("rows").as_bytes());
    f
}

#[test]
fn a_reranker_sends_its_top_k_to_the_judge_and_cuts_the_rest_with_their_rank() {
    let f = reranked("top_k = 3");
    let o = run(bin().arg("explain").arg(f.path("spec.toml")));
    assert!(o.status.success(), "{}", stderr(&o));
    let plan = stdout(&o);
    assert!(plan.contains("rank rerank v1"), "{plan}");
    assert!(
        plan.contains("probability of `yes`") && plan.contains("the top 3 go on to `judge`"),
        "{plan}"
    );
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let c = f.certificate();
    // Units 3 (0.95), 0 (0.9) and 2 (0.7) are the top three; the judge
    // reads only them and calls 2 not flagged.
    assert_eq!(c["routed_by_stage"]["judge"], 3, "{c}");
    assert_eq!(c["stats"]["rerank"]["rank"]["kept"], 3, "{c}");
    assert_eq!(c["stats"]["rerank"]["rank"]["cut"], 3, "{c}");
    assert_eq!(c["stats"]["model_calls"], 6 + 3, "{c}");
    assert_eq!(f.answer_ids(), ["0", "3"]);
    let cut: Vec<Value> = f
        .jsonl("out/facts.jsonl")
        .into_iter()
        .filter(|x| x["stage"] == "rank")
        .collect();
    let mut cut_ids: Vec<&str> = cut
        .iter()
        .filter_map(|x| x["source_ids"][0].as_str())
        .collect();
    cut_ids.sort_unstable();
    assert_eq!(cut_ids, ["1", "4", "5"]);
    assert!(cut.iter().all(|x| x["status"] == "negative"), "{cut:?}");
    let five = cut
        .iter()
        .find(|x| x["source_ids"][0] == "5")
        .expect("unit 5");
    assert_eq!(five["facts"]["rank"], 4, "{five}");
    assert!((five["facts"]["score"].as_f64().unwrap_or(0.0) - 0.6).abs() < 1e-9);
    assert!(
        five["reason"]
            .as_str()
            .is_some_and(|r| r.contains("cut it")),
        "{five}"
    );
    // A rerun pays for nothing and cuts the same way.
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let again = f.certificate();
    assert_eq!(again["stats"]["model_calls"], 0, "{again}");
    assert_eq!(f.answer_ids(), ["0", "3"]);
}

#[test]
fn a_score_floor_keeps_every_unit_at_or_above_it() {
    let f = reranked("min_score = 0.65");
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let c = f.certificate();
    assert_eq!(c["stats"]["rerank"]["rank"]["kept"], 3, "{c}");
    assert_eq!(c["routed_by_stage"]["judge"], 3, "{c}");
}

#[test]
fn a_reranker_without_a_cut_is_refused_before_anything_runs() {
    let f = reranked("");
    let o = run(bin().arg("explain").arg(f.path("spec.toml")));
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("needs `top_k`, `min_score` or both"),
        "{}",
        stderr(&o)
    );
}
