//! The widen stage: a unit judged with its group, and what an edit
//! recomputes.

use super::*;

/// 30 records in 5 threads (`id % 5`); records 10, 11 and 12 say only "see
/// thread", so the judge abstains on them and widens them by thread, 2
/// members a context. A thread-mate with `confirmed` makes one a yes: 5 is
/// shown with 10 and 17 with 12; 11's nearest thread-mates (6 and 16) are
/// not confirmed.
fn widen_fixture(group: &str, judge_widen: &str) -> Fixture {
    let f = Fixture::new(JSON_ARRAY, "");
    let spec = format!(
        r#"name = "t"
question = "Which records are flagged?"

[input]
path = "input.data"
partition = {JSON_ARRAY}

[[stages]]
name = "judge"
type = "map"
version = 1
rubric = "rubric.md"
output_schema = "schema.json"
decision = {{ pointer = "/decision", positive = ["yes"], negative = ["no"], abstain = ["unsure"] }}
{judge_widen}

[[stages]]
name = "context"
type = "widen"
k = 2
[stages.group]
{group}
[stages.judge]
version = 1
rubric = "rubric.md"
output_schema = "schema.json"
backend = "widener"
decision = {{ pointer = "/decision", positive = ["yes"], negative = ["no"] }}
evidence = "/evidence"

[backends.default]
type = "scripted"
script = "judge.jq"

[backends.widener]
type = "scripted"
script = "widener.jq"

[fold]
fan_in = 4
[[fold.reducers]]
name = "flagged"
type = "set"

[contract]
type = "exhaustive"
answer = "flagged"
"#
    );
    std::fs::write(f.path("spec.toml"), spec).expect("spec");
    std::fs::write(
        f.path("schema.json"),
        r#"{"type": "object", "required": ["decision"], "properties": {"decision": {"enum": ["yes", "no", "unsure"]}, "needs": {"type": "array"}, "evidence": {"type": "array", "items": {"type": "object", "required": ["field", "quote"], "properties": {"field": {"type": "string"}, "quote": {"type": "string"}}}}}}"#,
    )
    .expect("schema");
    std::fs::write(
        f.path("judge.jq"),
        r#"if .note | startswith("see thread") then {decision: "unsure", needs: ["thread"]} else {decision: (if .flag then "yes" else "no" end), needs: []} end"#,
    )
    .expect("judge");
    // Quotes the confirming member as the related list shows it.
    std::fs::write(
        f.path("widener.jq"),
        r#"[.related[] | select(.record.confirmed == true)] as $c | if ($c | length) > 0 then {decision: "yes", evidence: [{field: "related", quote: ($c[0].record.note | tojson)}]} else {decision: "no", evidence: []} end"#,
    )
    .expect("widener");
    let rows: Vec<Value> = (0..30)
        .map(|i| {
            let note = match i {
                10..=12 => "see thread".to_owned(),
                _ => format!("report {i}"),
            };
            serde_json::json!({
                "id": i,
                "thread": format!("t{}", i % 5),
                "at": 1000 * i,
                "flag": i % 3 == 0 && !(10..=12).contains(&i),
                "confirmed": i == 5 || i == 17,
                "note": note,
            })
        })
        .collect();
    f.input(serde_json::to_string(&rows).expect("rows").as_bytes());
    f
}

fn widen_of(c: &Value) -> &Value {
    &c["stats"]["widens"]["context"]
}

#[test]
fn a_widened_unit_is_judged_with_its_group_and_an_edited_member_recomputes_only_it() {
    let f = widen_fixture(r#"key = ".thread""#, r#"widen = { stage = "context" }"#);
    let o = run(bin().arg("explain").arg(f.path("spec.toml")));
    assert!(o.status.success(), "{}", stderr(&o));
    let plan = stdout(&o);
    assert!(
        plan.contains("context widen: group key `.thread`, up to 2 members"),
        "{plan}"
    );
    assert!(plan.contains("widens to context on abstain"), "{plan}");

    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let c = f.certificate();
    let w = widen_of(&c);
    assert_eq!(w["units"], 3, "{w}");
    assert_eq!(w["widened"], 3, "{w}");
    assert_eq!(w["members_shown"], 6, "{w}");
    assert_eq!(c["stats"]["model_calls"], 30 + 3);
    let mut ids = f.answer_ids();
    ids.sort_by_key(|i| i.parse::<u32>().unwrap_or(0));
    assert_eq!(
        ids,
        ["0", "3", "6", "9", "10", "12", "15", "18", "21", "24", "27"]
    );
    // The widened fact cites its unit first, then every member it showed,
    // each with its hash; the abstain it replaced is not an answer fact.
    let facts = f.jsonl("out/facts.jsonl");
    let ten: Vec<&Value> = facts
        .iter()
        .filter(|x| x["source_ids"][0] == "10")
        .collect();
    assert_eq!(ten.len(), 1, "{ten:?}");
    assert_eq!(ten[0]["stage"], "context");
    assert_eq!(
        ten[0]["source_ids"],
        serde_json::json!(["10", "5", "15"]),
        "nearest thread-mates in source order"
    );
    assert_eq!(ten[0]["source_hashes"].as_array().map(Vec::len), Some(3));
    // Verify rebuilt the widened view from the cited ids to find the quote.
    assert_eq!(c["verify"]["passed"], true, "{}", c["verify"]);
    assert!(c["verify"]["evidence_checked"].as_u64() >= Some(2));

    // Nothing changed: nothing is paid again.
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let c = f.certificate();
    assert_eq!(c["stats"]["model_calls"], 0);
    assert_eq!(widen_of(&c)["cached"], 3);

    // Record 15 is shown only with 10: its own call and 10's, nothing else.
    let input = std::fs::read_to_string(f.path("input.data")).expect("input");
    let edited = input.replacen("report 15", "report 15, edited", 1);
    assert_ne!(edited, input);
    f.input(edited.as_bytes());
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let c = f.certificate();
    assert_eq!(c["stats"]["model_calls"], 2, "{}", c["stats"]);
    assert_eq!(widen_of(&c)["cached"], 2);
}

#[test]
fn widening_on_a_needs_field_by_time_window_and_a_bound_that_leaves_members_out() {
    // A needs field asks for context whatever the decision; the group is
    // a time window, and one member's worth of tokens fits.
    let f = widen_fixture(
        "time = \".at\"\nwithin_secs = 5000",
        r#"widen = { stage = "context", on_abstain = false, needs = "/needs" }"#,
    );
    let spec = std::fs::read_to_string(f.path("spec.toml")).expect("spec");
    std::fs::write(
        f.path("spec.toml"),
        spec.replace("k = 2\n", "k = 2\nmax_related_tokens = 70\n"),
    )
    .expect("spec");
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let c = f.certificate();
    let w = widen_of(&c);
    assert_eq!(w["units"], 3, "{w}");
    assert_eq!(w["members_shown"], 3, "{w}");
    assert_eq!(w["left_out"], 3, "{w}");
    // Within 5 s of 12 the nearest are 11 and 13: neither is confirmed.
    let facts = f.jsonl("out/facts.jsonl");
    let twelve = facts
        .iter()
        .find(|x| x["source_ids"][0] == "12")
        .expect("12");
    assert_eq!(twelve["stage"], "context");
    assert_eq!(twelve["decision"], "no");
    assert_eq!(twelve["source_ids"].as_array().map(Vec::len), Some(2));
}

#[test]
fn widen_specs_name_their_mistakes() {
    for (group, judge_widen, says) in [
        (
            r#"key = ".thread""#,
            r#"widen = { stage = "judge" }"#,
            "not a stage declared after it",
        ),
        (
            "key = \".thread\"\ntime = \".at\"",
            r#"widen = { stage = "context" }"#,
            "exactly one of key, time or near",
        ),
        (
            r#"time = ".at""#,
            r#"widen = { stage = "context" }"#,
            "within_secs",
        ),
        (
            "near = \"nothing\"\nmin_similarity = 0.9",
            r#"widen = { stage = "context" }"#,
            "not an embed stage",
        ),
        (
            r#"key = ".thread | ""#,
            r#"widen = { stage = "context" }"#,
            "group key",
        ),
    ] {
        let f = widen_fixture(group, judge_widen);
        let o = run(bin().arg("explain").arg(f.path("spec.toml")));
        assert!(!o.status.success(), "{group}");
        assert!(stderr(&o).contains(says), "{says}: {}", stderr(&o));
    }
}

#[test]
fn near_duplicates_by_an_embed_stage_s_vectors_are_the_group() {
    let f = widen_fixture(
        "near = \"sim\"\nmin_similarity = 0.5",
        r#"widen = { stage = "context" }"#,
    );
    let spec = std::fs::read_to_string(f.path("spec.toml")).expect("spec");
    let embed = r#"[[stages]]
name = "sim"
type = "embed"
version = 1
project = "{note}"
positive = ["a problem report"]
threshold = -1.0
then = "judge"

[[stages]]
name = "judge""#;
    std::fs::write(
        f.path("spec.toml"),
        spec.replacen("[[stages]]\nname = \"judge\"", embed, 1),
    )
    .expect("spec");
    let notes = [
        (
            5,
            "The payment page times out at checkout since the release",
        ),
        (10, "see thread: the payment page times out at checkout"),
        (
            11,
            "see thread: dark mode colours are wrong on the settings screen",
        ),
        (12, "see thread: the app crashes when uploading photos"),
        (17, "Uploading photos crashes the app on every phone"),
    ];
    let rows: Vec<Value> = (0..30)
        .map(|i| {
            let note = notes
                .iter()
                .find(|(n, _)| *n == i)
                .map_or(format!("report number {i}"), |(_, t)| (*t).to_owned());
            serde_json::json!({"id": i, "thread": "-", "at": i, "flag": false,
                "confirmed": i == 5 || i == 17, "note": note})
        })
        .collect();
    f.input(serde_json::to_string(&rows).expect("rows").as_bytes());
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let c = f.certificate();
    assert_eq!(widen_of(&c)["units"], 3, "{}", widen_of(&c));
    let facts = f.jsonl("out/facts.jsonl");
    let of = |id: &str| {
        facts
            .iter()
            .find(|x| x["source_ids"][0] == id)
            .cloned()
            .expect("fact")
    };
    assert_eq!(of("10")["source_ids"][1], "5", "{}", of("10"));
    assert_eq!(of("12")["source_ids"][1], "17", "{}", of("12"));
    assert_eq!(of("10")["decision"], "yes");
    assert_eq!(of("12")["decision"], "yes");
    assert_eq!(of("11")["decision"], "no");
    let mut ids = f.answer_ids();
    ids.sort();
    assert_eq!(ids, ["10", "12"]);
}
