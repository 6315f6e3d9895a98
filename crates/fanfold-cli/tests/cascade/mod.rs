//! Cascades whose oracle is a labels file.

use super::*;

/// Every unit the cascade leaves to the oracle is answered by the labels
/// file when it holds that unit's label: with a budget too small to prove
/// anything, the oracle decides every unit, and the file decides them all.
#[test]
fn a_labels_file_answers_every_unit_left_to_the_oracle() {
    let f = cascade_fixture(
        r#"{ proxy = "lex", target = "recall", at_least = 0.95, delta = 0.05, label_budget = 40, labels = "labels.jsonl" }"#,
    );
    let lines: String = (0..1000)
        .map(|i| {
            format!(
                "{{\"id\": {i}, \"decision\": \"{}\"}}\n",
                if i < 150 { "yes" } else { "no" }
            )
        })
        .collect();
    std::fs::write(f.path("labels.jsonl"), lines).expect("labels");
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let cert = f.certificate();
    let report = &cert["stats"]["cascades"]["judge"];
    assert_eq!(report["met"], true, "{report}");
    assert_eq!(report["unlabelled"], 0, "{report}");
    assert_eq!(cert["stats"]["model_calls"], 0);
    let found: std::collections::BTreeSet<u64> = f
        .answer_ids()
        .iter()
        .filter_map(|id| id.parse().ok())
        .collect();
    let kept = (0..150u64).filter(|i| found.contains(i)).count();
    assert!(kept as f64 >= 0.95 * 150.0, "{kept} of 150 flagged found");
    let md = std::fs::read_to_string(f.path("out/answer.md")).expect("answer.md");
    assert!(!md.starts_with("# INCOMPLETE"), "{md}");
}

/// A budget too small for the target: no label past it is asked for, and
/// answer.md and the certificate show what the labels did prove.
#[test]
fn a_budget_too_small_shows_the_frontier_it_proved_and_asks_no_more() {
    let f = cascade_fixture(
        r#"{ proxy = "lex", target = "recall", at_least = 0.99, delta = 0.05, label_budget = 40, labels = "labels.jsonl" }"#,
    );
    let lines: String = (0..1000)
        .map(|i| {
            format!(
                "{{\"id\": {i}, \"decision\": \"{}\"}}\n",
                if i < 150 { "yes" } else { "no" }
            )
        })
        .collect();
    std::fs::write(f.path("labels.jsonl"), lines).expect("labels");
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let cert = f.certificate();
    let report = &cert["stats"]["cascades"]["judge"];
    assert!(report["labels"].as_u64().expect("labels") <= 40, "{report}");
    let frontier = report["frontier"].as_array().expect("a frontier");
    assert!(!frontier.is_empty(), "{report}");
    for p in frontier {
        let proven = p["proven"].as_f64().expect("proven");
        assert!((0.0..=1.0).contains(&proven), "{report}");
    }
    let md = std::fs::read_to_string(f.path("out/answer.md")).expect("answer.md");
    assert!(md.contains("What the labels proved"), "{md}");
    assert!(
        md.contains("| units the proxy decides | recall proven at least |"),
        "{md}"
    );
}
