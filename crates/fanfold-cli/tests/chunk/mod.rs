//! The chunk stage: contexts of several units, packed and reused by
//! content.

use super::*;

/// A chunk stage in place of the per-unit judge: `size` records a context,
/// a [SIMULATED] model listing the flagged ids of each.
fn chunk_fixture(settings: &str, script: &str, rows: usize) -> Fixture {
    let f = Fixture::new(
        JSON_ARRAY,
        &format!(
            r#"[[stages]]
name = "coarse"
type = "chunk"
version = 1
rubric = "rubric.md"
fields = ["id", "flag", "text"]
backend = "lister"
max_attempts = 2
max_output_tokens = 64
{settings}
"#
        ),
    );
    let spec = std::fs::read_to_string(f.path("spec.toml")).expect("spec");
    let spec = spec.replace(
        "[backends.default]",
        "[backends.lister]\ntype = \"scripted\"\nscript = \"lister.jq\"\n\n[backends.default]",
    );
    std::fs::write(f.path("spec.toml"), spec).expect("spec");
    std::fs::write(f.path("lister.jq"), script).expect("script");
    let rows: Vec<Value> = (0..rows)
        .map(|i| serde_json::json!({"id": i, "flag": i % 3 == 0, "text": format!("record {i}")}))
        .collect();
    f.input(serde_json::to_string(&rows).expect("rows").as_bytes());
    f
}

const LIST_FLAGGED: &str = r#"{matches: [.records[] | select(.record.flag == true) | .id]}"#;

#[test]
fn a_chunk_stage_judges_contexts_of_units_and_reuses_them_by_content() {
    let f = chunk_fixture("size = 5\nwindow_tokens = 4000", LIST_FLAGGED, 23);
    let explain = |f: &Fixture| {
        let o = run(bin()
            .arg("explain")
            .arg(f.path("spec.toml"))
            .arg("--store")
            .arg(f.path("store.sqlite")));
        assert!(o.status.success(), "{}", stderr(&o));
        stdout(&o)
    };
    // One call a context, before and after the store knows anything.
    let before = explain(&f);
    assert!(
        before.contains("stage coarse: 23 units, 0 cached, expected model calls 5"),
        "{before}"
    );
    assert!(before.contains("5 units a context"), "{before}");
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let c = f.certificate();
    assert_eq!(c["stats"]["chunks"]["coarse"]["contexts"], 5);
    assert_eq!(c["stats"]["chunks"]["coarse"]["largest"], 5);
    assert_eq!(c["stats"]["model_calls"], 5);
    assert_eq!(c["statuses"]["positive"], 8);
    assert_eq!(c["statuses"]["negative"], 15);
    let expected: Vec<String> = (0..23)
        .filter(|i| i % 3 == 0)
        .map(|i| i.to_string())
        .collect();
    assert_eq!(f.answer_ids(), expected);
    let facts = f.jsonl("out/facts.jsonl");
    assert!(
        facts.iter().all(|f| f["stage"] == "coarse"),
        "every unit's fact is the chunk stage's"
    );

    // A rerun pays for nothing; an edit to one record pays for its context.
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(f.certificate()["stats"]["model_calls"], 0);
    let input = std::fs::read_to_string(f.path("input.data")).expect("input");
    f.input(input.replace("record 7\"", "record 7, edited\"").as_bytes());
    let after = explain(&f);
    assert!(
        after.contains("stage coarse: 23 units, 18 cached, expected model calls 1"),
        "{after}"
    );
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let c = f.certificate();
    assert_eq!(c["stats"]["model_calls"], 1);
    assert_eq!(c["stats"]["cache_hits"], 18);
}

/// On the embedded model one long context is packed by the model's own
/// tokenizer: it fills its window (not the two thirds a bytes-a-token
/// estimate leaves), and nothing is cut.
#[test]
fn one_long_context_on_the_embedded_model_fills_its_window() {
    let f = chunk_fixture("window_tokens = 1024\nmax_contexts = 1", LIST_FLAGGED, 150);
    let spec = std::fs::read_to_string(f.path("spec.toml")).expect("spec");
    let spec = spec.replace(
        "[backends.lister]\ntype = \"scripted\"\nscript = \"lister.jq\"",
        "[backends.lister]\ntype = \"llama\"\nslot_tokens = 1024",
    );
    std::fs::write(f.path("spec.toml"), spec).expect("spec");
    let o = f.run(&[]);
    // Most records are outside the one window: incomplete by design.
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let c = f.certificate();
    let chunks = &c["stats"]["chunks"]["coarse"];
    assert_eq!(
        chunks["counted"], "counted by the model's tokenizer",
        "{chunks}"
    );
    let room = chunks["room_tokens"].as_u64().expect("room");
    // The window less the answer's 64 tokens, the prefix and the template.
    assert!(
        room > 1024 * 3 / 4,
        "{room} tokens of records in a 1024 window"
    );
    assert_eq!(c["stats"]["truncated_units"], 0, "no context was cut: {c}");
    let calls = c["stats"]["model_calls"].as_u64().expect("calls").max(1);
    let cost = &c["stats"]["cost"];
    let prompt =
        cost["prompt_tokens"].as_u64().unwrap_or(0) + cost["cached_tokens"].as_u64().unwrap_or(0);
    assert!(
        prompt / calls > 1024 * 85 / 100 - 64,
        "{} prompt tokens a call fill {:.0} % of 960",
        prompt / calls,
        (prompt / calls) as f64 / 9.6
    );
}

#[test]
fn one_long_context_leaves_what_it_cannot_hold_not_run_never_negative() {
    // A window that holds a few records: the rest is outside it.
    let f = chunk_fixture("window_tokens = 800\nmax_contexts = 1", LIST_FLAGGED, 40);
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let c = f.certificate();
    let held = c["stats"]["chunks"]["coarse"]["largest"]
        .as_u64()
        .expect("largest");
    assert!((1..40).contains(&held), "{held} records in the window");
    assert_eq!(c["stats"]["chunks"]["coarse"]["outside_window"], 40 - held);
    assert_eq!(c["statuses"]["not_run"], 40 - held);
    assert_eq!(
        c["statuses"]["positive"].as_u64().unwrap() + c["statuses"]["negative"].as_u64().unwrap(),
        held
    );
    assert_eq!(c["complete"], false);
    let reasons: Vec<&str> = f
        .jsonl("out/facts.jsonl")
        .iter()
        .filter(|f| f["status"] == "not_run")
        .filter_map(|f| f["reason"].as_str().map(str::to_owned))
        .map(|r| {
            if r.starts_with("outside_window") {
                "outside_window"
            } else {
                "other"
            }
        })
        .collect();
    assert_eq!(reasons.len() as u64, 40 - held);
    assert!(reasons.iter().all(|r| *r == "outside_window"));
}

#[test]
fn a_context_that_names_a_record_it_never_showed_is_an_error_for_each_member() {
    // The model answers for ids outside its context, on every attempt.
    let f = chunk_fixture(
        "size = 4\nwindow_tokens = 4000",
        r#"{matches: ([.records[].id] | if index("8") != null then ["999"] else [] end)}"#,
        12,
    );
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let c = f.certificate();
    assert_eq!(c["statuses"]["error"], 4);
    assert_eq!(c["statuses"]["negative"], 8);
    // Two attempts for the failing context, one for each of the others.
    assert_eq!(c["stats"]["model_calls"], 2 + 2);
    let errors: Vec<Value> = f
        .jsonl("out/facts.jsonl")
        .into_iter()
        .filter(|f| f["status"] == "error")
        .collect();
    assert!(
        errors.iter().all(|f| f["reason"]
            .as_str()
            .unwrap_or("")
            .contains("not a record of this context")),
        "{errors:?}"
    );
}
