//! The cluster stage: themes over facts, and what an edit recomputes.

use super::*;

fn cluster_of(c: &Value) -> &Value {
    &c["stats"]["clusters"]["themes"]
}

#[test]
fn a_cluster_stage_themes_the_facts_and_an_edit_recomputes_only_its_branch() {
    let f = cluster_fixture("", THEME_BY_TOPIC, 40);
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let c = f.certificate();
    let k = cluster_of(&c);
    // 20 facts, 6 a context: 4 contexts, then 2, then 1.
    assert_eq!(k["facts"], 20, "{k}");
    assert_eq!(k["levels"], 3, "{k}");
    assert_eq!(k["nodes"], 7, "{k}");
    assert_eq!(k["calls"], 7, "{k}");
    assert_eq!(c["stats"]["model_calls"], 40 + 7);
    let themes = k["themes"].as_array().expect("themes");
    assert_eq!(themes.len(), 3, "{k}");
    for t in themes {
        let topic = t["label"].as_str().expect("label");
        let at = ["login", "billing", "search"]
            .iter()
            .position(|x| *x == topic)
            .expect("a topic");
        let expected: Vec<String> = (0..40)
            .filter(|i| i % 2 == 0 && i % 3 == at)
            .map(|i| i.to_string())
            .collect();
        let mut members: Vec<String> = t["members"]
            .as_array()
            .expect("members")
            .iter()
            .filter_map(|m| m.as_str().map(str::to_owned))
            .collect();
        members.sort_by_key(|m| m.parse::<u32>().unwrap_or(0));
        assert_eq!(members, expected, "{topic}");
        assert_eq!(t["count"], expected.len() as u64);
    }
    assert_eq!(c["verify"]["passed"], true);
    let md = std::fs::read_to_string(f.path("out/answer.md")).expect("answer.md");
    assert!(
        md.contains("## Themes: cluster `themes` [SIMULATED]"),
        "{md}"
    );
    assert!(md.contains("**login** — 7 facts"), "{md}");

    // Nothing changed: every context is reused.
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let c = f.certificate();
    assert_eq!(c["stats"]["model_calls"], 0);
    assert_eq!(cluster_of(&c)["cached_nodes"], 7);

    // One fact's topic changes: its context and the two above it, nothing else.
    let input = std::fs::read_to_string(f.path("input.data")).expect("input");
    let edited = input.replacen(
        r#"{"id":6,"flag":true,"topic":"login"}"#,
        r#"{"id":6,"flag":true,"topic":"search"}"#,
        1,
    );
    assert_ne!(edited, input, "the fixture's row 6");
    f.input(edited.as_bytes());
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let c = f.certificate();
    assert_eq!(cluster_of(&c)["calls"], 3, "{}", cluster_of(&c));
    assert_eq!(cluster_of(&c)["cached_nodes"], 4);
    assert_eq!(c["stats"]["model_calls"], 1 + 3);
}

#[test]
fn a_cluster_answer_naming_an_unlabelled_theme_or_a_foreign_id_is_an_error_never_a_theme() {
    for (themer, says) in [
        (
            // Every fact in a second theme that has no label.
            r#"{themes: ["x"], assign: (.items | map({key: .id, value: {theme: 2, as: "member"}}) | from_entries)}"#,
            "but 1 were named",
        ),
        (
            r#"{themes: ["x"], assign: {"999": {theme: 1, as: "member"}}}"#,
            "not one this context showed",
        ),
    ] {
        // A declared stress is not paid for when the answer's own tree failed.
        let f = cluster_fixture("[stages.stress]\norders = 3\nmax_drift = 0.5", themer, 12);
        let o = f.run(&[]);
        assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
        let c = f.certificate();
        let k = cluster_of(&c);
        assert_eq!(k["themes"].as_array().map(Vec::len), Some(0), "{k}");
        assert_eq!(k["failed"].as_array().map(Vec::len), Some(6), "{k}");
        // Two attempts for the one context, and no stress reduction.
        assert_eq!(k["calls"], 2, "{k}");
        assert!(k["stress"].is_null(), "{k}");
        assert!(
            k["stress_skipped"]
                .as_str()
                .is_some_and(|w| w.contains("failed")),
            "{k}"
        );
        let reason = k["errors"][0]["reason"].as_str().unwrap_or("");
        assert!(reason.contains(says), "{reason}");
        assert_eq!(c["complete"], false);
        let why = c["incomplete"].to_string();
        assert!(why.contains("cluster `themes`"), "{why}");
        // A refused answer is never stored: a rerun asks again.
        let o = f.run(&[]);
        assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
        assert_eq!(cluster_of(&f.certificate())["calls"], 2);
    }
}

#[test]
fn reorder_stress_measures_the_drift_of_theme_memberships_against_a_bound() {
    let stress = "[stages.stress]\norders = 3\nfan_ins = [6, 8]\nmax_drift = 0.0\nseed = 4";
    let f = cluster_fixture(stress, THEME_BY_TOPIC, 40);
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let c = f.certificate();
    let s = &cluster_of(&c)["stress"];
    // 3 orders x 2 fan-ins, less the answer's own reduction.
    assert_eq!(s["runs"].as_array().map(Vec::len), Some(5), "{s}");
    assert_eq!(s["drift"], 0.0, "{s}");

    // A themer that groups by position: its themes move with the order.
    let by_position = r#"{themes: ["one half", "the other"], assign: (.items | to_entries | map({key: .value.id, value: {theme: (.key % 2 + 1), as: "member"}}) | from_entries)}"#;
    let f = cluster_fixture(stress, by_position, 40);
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let c = f.certificate();
    let drift = cluster_of(&c)["stress"]["drift"].as_f64().expect("drift");
    assert!(drift > 0.0, "{drift}");
    assert!(
        c["incomplete"].to_string().contains("drift"),
        "{}",
        c["incomplete"]
    );
}

#[test]
fn a_cluster_must_read_a_unit_stage_declared_before_it() {
    let f = cluster_fixture("", THEME_BY_TOPIC, 4);
    let spec = std::fs::read_to_string(f.path("spec.toml")).expect("spec");
    for (from, to, says) in [
        (
            "reads = \"judge\"",
            "reads = \"nobody\"",
            "reads the facts of `nobody`",
        ),
        (
            "max_themes = 3",
            "max_themes = 4",
            "at least twice max_themes",
        ),
    ] {
        std::fs::write(f.path("spec.toml"), spec.replace(from, to)).expect("spec");
        let o = f.run(&[]);
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        assert!(stderr(&o).contains(says), "{}", stderr(&o));
    }
}
