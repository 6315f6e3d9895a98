//! Stages that score without a model call: BM25 and an embed stage's top-k.

use super::*;

#[test]
fn a_bm25_stage_sends_on_what_matches_the_query_and_calls_no_model() {
    let f = Fixture::new(
        JSON_ARRAY,
        r#"[[stages]]
name = "lexical"
type = "bm25"
version = 1
fields = ["text"]
query = "disk failure"
threshold = 0.5
then = "judge"
"#,
    );
    let texts = [
        "the disk reported a failure at boot",
        "all good",
        "fan speed nominal",
        "disk failure again, disk replaced",
        "user logged in",
        "failure of the disk controller",
    ];
    let rows: Vec<Value> = texts
        .iter()
        .enumerate()
        .map(|(i, t)| serde_json::json!({"id": i, "flag": true, "text": t}))
        .collect();
    f.input(serde_json::to_string(&rows).expect("rows").as_bytes());
    let o = run(bin().arg("explain").arg(f.path("spec.toml")));
    assert!(o.status.success(), "{}", stderr(&o));
    let plan = stdout(&o);
    assert!(plan.contains("query terms [disk, failure]"), "{plan}");
    assert!(plan.contains("stage lexical: 6 units"), "{plan}");
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let c = f.certificate();
    assert_eq!(c["routed_by_stage"]["judge"], 3, "{c}");
    assert_eq!(c["stats"]["bm25"]["lexical"]["kept"], 3);
    assert_eq!(c["stats"]["model_calls"], 3, "only the judge calls a model");
    assert_eq!(f.answer_ids(), ["0", "3", "5"]);
    let negatives: Vec<Value> = f
        .jsonl("out/facts.jsonl")
        .into_iter()
        .filter(|x| x["stage"] == "lexical")
        .collect();
    assert_eq!(negatives.len(), 3);
    assert!(negatives.iter().all(|x| {
        x["status"] == "negative"
            && x["reason"]
                .as_str()
                .is_some_and(|r| r.contains("below the threshold"))
    }));
}

#[test]
fn an_embed_stage_with_top_k_keeps_the_highest_scores_and_says_why_the_rest_went() {
    let f = Fixture::new(
        JSON_ARRAY,
        r#"[[stages]]
name = "similar"
type = "embed"
version = 1
fields = ["text"]
positive = ["the disk failed and data was lost"]
threshold = -1.0
top_k = 2
"#,
    );
    let texts = [
        "lunch menu for friday",
        "the hard disk failed overnight and we lost data",
        "new logo colours",
        "disk failure: the drive died and files are gone",
        "parking spaces",
    ];
    let rows: Vec<Value> = texts
        .iter()
        .enumerate()
        .map(|(i, t)| serde_json::json!({"id": i, "flag": true, "text": t}))
        .collect();
    f.input(serde_json::to_string(&rows).expect("rows").as_bytes());
    let o = run(bin().arg("explain").arg(f.path("spec.toml")));
    assert!(
        stdout(&o).contains("keeps the 2 highest scores"),
        "{}",
        stdout(&o)
    );
    for pass in 0..2 {
        let o = f.run(&[]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        let mut ids = f.answer_ids();
        ids.sort();
        assert_eq!(ids, ["1", "3"], "pass {pass}");
        let c = f.certificate();
        assert_eq!(c["stats"]["model_calls"], 0);
        if pass == 1 {
            assert_eq!(c["stats"]["embed"]["similar"]["vectors_computed"], 0);
        }
    }
    let facts = f.jsonl("out/facts.jsonl");
    let dropped: Vec<&Value> = facts.iter().filter(|x| x["status"] == "negative").collect();
    assert_eq!(dropped.len(), 3);
    assert!(dropped.iter().all(|x| {
        x["reason"]
            .as_str()
            .is_some_and(|r| r.contains("only the 2 highest are kept"))
            && x["facts"]["rank"].as_u64().is_some_and(|r| r > 2)
    }));
    // Fewer units: the same stored scores rank again.
    f.input(serde_json::to_string(&rows[..2]).expect("rows").as_bytes());
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let mut ids = f.answer_ids();
    ids.sort();
    assert_eq!(ids, ["0", "1"]);
}
