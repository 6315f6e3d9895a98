//! The group stage: groups as units, each judged in one context whose
//! fact quotes every member.

use super::*;

/// Quotes every member's title; `related` when the titles all open with
/// the same word.
const QUOTES_EVERY_MEMBER: &str = r#"to_entries as $e
| [$e[] | select(.key | endswith(".title"))] as $titles
| {decision: (if ([$titles[] | .value | split(" ") | .[0] | ascii_downcase] | unique | length) == 1 then "related" else "unrelated" end),
   evidence: [$titles[] | {field: .key, quote: .value}]}"#;

/// Quotes the first member only.
const QUOTES_THE_FIRST: &str = r#"to_entries as $e
| {decision: "related", evidence: [{field: $e[0].key, quote: $e[0].value}]}"#;

/// A spec folder whose group stage gathers `by` (the `[stages.by]` table's
/// lines), at most `max` members a context, judged by `script`.
fn group_fixture(by: &str, max: usize, script: &str, rows: &[Value]) -> Fixture {
    let f = Fixture::new(JSON_ARRAY, "");
    let spec = format!(
        r#"name = "g"
question = "Which records are related to the others of their group?"

[input]
path = "input.data"
partition = {JSON_ARRAY}

[[stages]]
name = "together"
type = "group"
max_members = {max}
[stages.by]
{by}
[stages.judge]
version = 1
rubric = "rubric.md"
project = "{{title}}"
output_schema = "schema.json"
backend = "grouper"
decision = {{ pointer = "/decision", positive = ["related"], negative = ["unrelated"] }}
evidence = "/evidence"

[backends.grouper]
type = "scripted"
script = "grouper.jq"

[fold]
fan_in = 4
[[fold.reducers]]
name = "related"
type = "set"

[contract]
type = "exhaustive"
answer = "related"
"#
    );
    std::fs::write(f.path("spec.toml"), spec).expect("spec");
    std::fs::write(
        f.path("schema.json"),
        r#"{"type": "object", "required": ["decision", "evidence"], "properties": {"decision": {"enum": ["related", "unrelated"]}, "evidence": {"type": "array", "items": {"type": "object", "required": ["field", "quote"], "properties": {"field": {"type": "string"}, "quote": {"type": "string"}}}}}}"#,
    )
    .expect("schema");
    std::fs::write(f.path("grouper.jq"), script).expect("script");
    f.input(serde_json::to_string(rows).expect("rows").as_bytes());
    f
}

/// Ten records: components `auth` (1, 4, 7: titles open with "Login"),
/// `ui` (2, 5: one "Dark", one "Button"), `export` (3, alone), none (6),
/// and `billing` (8, 9, 10: "Invoice").
fn component_rows() -> Vec<Value> {
    let rows = [
        (1, Some("auth"), 0, "Login fails after SSO redirect"),
        (2, Some("ui"), 10, "Dark mode colours are wrong"),
        (3, Some("export"), 20, "Export button does nothing"),
        (4, Some("auth"), 30, "Login loops back to the start page"),
        (5, Some("ui"), 40, "Button labels overlap on mobile"),
        (6, None, 50, "Crash on start"),
        (7, Some("auth"), 60, "Login with a passkey is refused"),
        (8, Some("billing"), 70, "Invoice totals are rounded twice"),
        (9, Some("billing"), 80, "Invoice PDF misses the VAT number"),
        (10, Some("billing"), 90, "Invoice emails go out twice"),
    ];
    rows.iter()
        .map(|(id, component, at, title)| {
            serde_json::json!({"id": id, "component": component, "at": at, "title": title})
        })
        .collect()
}

fn report_of(f: &Fixture) -> Value {
    f.certificate()["stats"]["groups"]["together"].clone()
}

fn fact_led_by<'a>(facts: &'a [Value], id: &str) -> &'a Value {
    facts
        .iter()
        .find(|x| x["source_ids"][0] == id)
        .unwrap_or_else(|| panic!("no fact of {id}: {facts:?}"))
}

fn ids(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn groups_by_key_cite_every_member_and_a_rerun_pays_nothing() {
    let f = group_fixture(
        r#"key = ".component""#,
        8,
        QUOTES_EVERY_MEMBER,
        &component_rows(),
    );
    let o = run(bin().arg("explain").arg(f.path("spec.toml")));
    assert!(o.status.success(), "{}", stderr(&o));
    let plan = stdout(&o);
    assert!(
        plan.contains("together group: by key `.component`; at most 8 members a context"),
        "{plan}"
    );
    assert!(plan.contains("a unit alone is not judged"), "{plan}");

    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let c = f.certificate();
    let r = report_of(&f);
    assert_eq!(r["groups"], 3, "{r}");
    assert_eq!(r["grouped"], 8, "{r}");
    assert_eq!(r["alone"], 1, "{r}");
    assert_eq!(r["ungrouped"], 1, "{r}");
    assert_eq!(r["calls"], 3, "{r}");
    assert_eq!(c["stats"]["model_calls"], 3, "{}", c["stats"]);
    // One fact per group, standing for its first member and citing every
    // member with its hash; each member quoted in its own field.
    let facts = f.jsonl("out/facts.jsonl");
    let auth = fact_led_by(&facts, "1");
    assert_eq!(ids(&auth["source_ids"]), ["1", "4", "7"]);
    assert_eq!(auth["source_hashes"].as_array().map(Vec::len), Some(3));
    assert_eq!(auth["decision"], "related");
    let fields: Vec<&str> = auth["evidence"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["field"].as_str())
        .collect();
    assert_eq!(fields, ["1.title", "4.title", "7.title"]);
    // The other members carry the group's decision; the unjudged end
    // negative with why.
    assert_eq!(fact_led_by(&facts, "4")["decision"], "related");
    assert_eq!(fact_led_by(&facts, "5")["decision"], "unrelated");
    assert!(
        fact_led_by(&facts, "3")["reason"]
            .as_str()
            .is_some_and(|r| r.starts_with("alone")),
        "{facts:?}"
    );
    assert!(
        fact_led_by(&facts, "6")["reason"]
            .as_str()
            .is_some_and(|r| r.starts_with("ungrouped")),
        "{facts:?}"
    );
    let mut answer = f.answer_ids();
    answer.sort_by_key(|i| i.parse::<u32>().unwrap_or(0));
    assert_eq!(answer, ["1", "4", "7", "8", "9", "10"]);
    // Verify rebuilt each group's view from the stored units.
    assert_eq!(c["verify"]["passed"], true, "{}", c["verify"]);
    assert!(
        c["verify"]["evidence_checked"].as_u64() >= Some(8),
        "{}",
        c["verify"]
    );
    let md = std::fs::read_to_string(f.path("out/answer.md")).unwrap();
    assert!(
        md.contains(
            "3 groups of 8 units judged (the largest 3, at most 8), 1 alone and 1 ungrouped not judged"
        ),
        "{md}"
    );

    // Nothing changed: nothing is paid again.
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let c = f.certificate();
    assert_eq!(c["stats"]["model_calls"], 0, "{}", c["stats"]);
    assert_eq!(report_of(&f)["cached"], 3);
    let o = run(bin()
        .arg("explain")
        .arg(f.path("spec.toml"))
        .arg("--store")
        .arg(f.path("store.sqlite")));
    assert!(o.status.success(), "{}", stderr(&o));

    // One member edited: only its group is judged again.
    let mut rows = component_rows();
    rows[8]["title"] = Value::String("Invoice PDF lacks the VAT number".into());
    f.input(serde_json::to_string(&rows).unwrap().as_bytes());
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let c = f.certificate();
    assert_eq!(c["stats"]["model_calls"], 1, "{}", c["stats"]);
    assert_eq!(report_of(&f)["cached"], 2);
}

#[test]
fn a_time_window_groups_from_its_earliest_unit() {
    // Windows of 25 s from each group's earliest: 0-20 (1, 2, 3), 30-50
    // (4, 5, 6), 60-80 (7, 8, 9), 90 alone.
    let f = group_fixture(
        "time = \".at\"\nwindow_secs = 25",
        8,
        QUOTES_EVERY_MEMBER,
        &component_rows(),
    );
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let r = report_of(&f);
    assert_eq!(r["groups"], 3, "{r}");
    assert_eq!(r["alone"], 1, "{r}");
    let facts = f.jsonl("out/facts.jsonl");
    assert_eq!(
        ids(&fact_led_by(&facts, "4")["source_ids"]),
        ["4", "5", "6"]
    );
    assert_eq!(
        ids(&fact_led_by(&facts, "7")["source_ids"]),
        ["7", "8", "9"]
    );
    assert!(
        fact_led_by(&facts, "10")["reason"]
            .as_str()
            .is_some_and(|r| r.starts_with("alone"))
    );
}

#[test]
fn near_duplicates_are_one_group_split_under_the_bound() {
    // Seven wordings of one login bug, three of other things.
    let titles = [
        "Login fails after the SSO redirect on Safari",
        "Dark mode colours are wrong on settings",
        "Login fails after the SSO redirect on Safari 17",
        "login fails after the sso redirect on safari",
        "Export button does nothing for large reports",
        "Login fails after the SSO redirect on Safari again",
        "Login fails after the SSO redirect on Safari (iPad)",
        "Invoice totals are rounded twice",
        "Login fails after the SSO redirect on Safari today",
        "Login fails after the SSO redirect on Safari!",
    ];
    let rows: Vec<Value> = titles
        .iter()
        .enumerate()
        .map(|(i, t)| serde_json::json!({"id": i + 1, "title": t}))
        .collect();
    let f = group_fixture("min_jaccard = 0.6", 3, QUOTES_EVERY_MEMBER, &rows);
    let o = run(bin().arg("explain").arg(f.path("spec.toml")));
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("near-duplicate text (Jaccard of 3-word shingles >= 0.6"),
        "{}",
        stdout(&o)
    );
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let r = report_of(&f);
    // 1, 3, 4, 6, 7, 9, 10 in parts of 3, 2, 2; 2, 5 and 8 alone.
    assert_eq!(r["groups"], 3, "{r}");
    assert_eq!(r["grouped"], 7, "{r}");
    assert_eq!(r["largest"], 3, "{r}");
    assert_eq!(r["alone"], 3, "{r}");
    assert_eq!(
        r["split"],
        serde_json::json!(["the group from 1: 7 members in 3 parts of 3, 2, 2"]),
        "{r}"
    );
    let facts = f.jsonl("out/facts.jsonl");
    assert_eq!(
        ids(&fact_led_by(&facts, "1")["source_ids"]),
        ["1", "3", "4"]
    );
    assert_eq!(ids(&fact_led_by(&facts, "6")["source_ids"]), ["6", "7"]);
    assert_eq!(ids(&fact_led_by(&facts, "9")["source_ids"]), ["9", "10"]);
    let md = std::fs::read_to_string(f.path("out/answer.md")).unwrap();
    assert!(
        md.contains("split the group from 1: 7 members in 3 parts of 3, 2, 2"),
        "{md}"
    );
}

#[test]
fn a_fact_that_leaves_a_member_unquoted_is_an_error_for_its_group() {
    let f = group_fixture(
        r#"key = ".component""#,
        8,
        QUOTES_THE_FIRST,
        &component_rows(),
    );
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let r = report_of(&f);
    assert_eq!(
        r["uncited"],
        serde_json::json!([
            "1: no quote of 4, 7",
            "2: no quote of 5",
            "8: no quote of 9, 10"
        ]),
        "{r}"
    );
    let facts = f.jsonl("out/facts.jsonl");
    let auth = fact_led_by(&facts, "1");
    assert_eq!(auth["status"], "error", "{auth}");
    assert!(
        auth["reason"]
            .as_str()
            .is_some_and(|r| r.contains("uncited_member") && r.contains("4, 7")),
        "{auth}"
    );
    assert_eq!(fact_led_by(&facts, "7")["status"], "error");
    assert!(f.answer_ids().is_empty(), "{:?}", f.answer_ids());
    let answer: Value =
        serde_json::from_str(&std::fs::read_to_string(f.path("out/answer.json")).unwrap()).unwrap();
    assert_eq!(answer["complete"], false, "{answer}");
    // The same answer read again is refused again, and costs nothing.
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert_eq!(f.certificate()["stats"]["model_calls"], 0);
    assert_eq!(report_of(&f)["uncited"].as_array().map(Vec::len), Some(3));
}

#[test]
fn verify_fails_once_a_member_s_source_text_is_changed() {
    let f = group_fixture(
        r#"key = ".component""#,
        8,
        QUOTES_EVERY_MEMBER,
        &component_rows(),
    );
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = run(bin()
        .arg("verify")
        .arg(f.path("out"))
        .arg("--input")
        .arg(f.path("input.data")));
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    // Record 9, the billing group's second member, changed after the run.
    let mut rows = component_rows();
    rows[8]["title"] = Value::String("Invoice PDF lacks the VAT number".into());
    f.input(serde_json::to_string(&rows).unwrap().as_bytes());
    let o = run(bin()
        .arg("verify")
        .arg(f.path("out"))
        .arg("--input")
        .arg(f.path("input.data")));
    let text = stdout(&o) + &stderr(&o);
    assert_eq!(o.status.code(), Some(4), "{text}");
    assert!(
        text.contains("cited unit `9` changed in the source"),
        "{text}"
    );
    assert!(
        text.contains("9.title"),
        "the quote of 9 no longer found: {text}"
    );
}

#[test]
fn group_specs_name_their_mistakes() {
    let rows = component_rows();
    for (by, max, says) in [
        (
            "key = \".component\"\ntime = \".at\"",
            8,
            "exactly one of key, time or min_jaccard",
        ),
        (r#"time = ".at""#, 8, "window_secs"),
        ("min_jaccard = 1.5", 8, "within (0, 1]"),
        (r#"key = ".component""#, 2, "max_members must be at least 3"),
        (r#"key = ".component | ""#, 8, "by key"),
    ] {
        let f = group_fixture(by, max, QUOTES_EVERY_MEMBER, &rows);
        let o = run(bin().arg("explain").arg(f.path("spec.toml")));
        assert!(!o.status.success(), "{by}");
        assert!(stderr(&o).contains(says), "{says}: {}", stderr(&o));
    }
    // A judge without evidence could not show it read every member.
    let f = group_fixture(r#"key = ".component""#, 8, QUOTES_EVERY_MEMBER, &rows);
    let spec = std::fs::read_to_string(f.path("spec.toml")).unwrap();
    std::fs::write(
        f.path("spec.toml"),
        spec.replace("evidence = \"/evidence\"\n", ""),
    )
    .unwrap();
    let o = run(bin().arg("explain").arg(f.path("spec.toml")));
    assert!(!o.status.success());
    assert!(stderr(&o).contains("must set `evidence`"), "{}", stderr(&o));
}

/// The example on its scripted judge: the login reports and the dark-mode
/// reports are duplicates, the two "cannot reproduce" pairs contradict.
#[test]
fn the_issue_duplicates_example_finds_its_duplicates_and_contradictions() {
    let scratch = tempfile::tempdir().unwrap();
    let spec = repo().join("examples/issue-duplicates/spec.toml");
    let out = scratch.path().join("out");
    let ran = || {
        run(bin()
            .arg("run")
            .arg(&spec)
            .args(["--backend", "scripted", "--json", "--store"])
            .arg(scratch.path().join("store.sqlite"))
            .arg("--out")
            .arg(&out))
    };
    let o = ran();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let facts: Vec<Value> = std::fs::read_to_string(out.join("facts.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let relation = |id: &str| fact_led_by(&facts, id)["decision"].clone();
    assert_eq!(
        ids(&fact_led_by(&facts, "301")["source_ids"]),
        ["301", "304", "311"]
    );
    assert_eq!(relation("301"), "duplicates");
    assert_eq!(relation("305"), "duplicates");
    assert_eq!(relation("303"), "contradict");
    assert_eq!(relation("306"), "contradict");
    let cert: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("certificate.json")).unwrap())
            .unwrap();
    let report = &cert["stats"]["groups"]["related_issues"];
    assert_eq!(report["groups"], 4, "{report}");
    assert_eq!(report["alone"], 7, "{report}");
    assert_eq!(cert["verify"]["passed"], true, "{}", cert["verify"]);
    let answer: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("answer.json")).unwrap()).unwrap();
    assert_eq!(
        answer["items"].as_array().map(Vec::len),
        Some(9),
        "{answer}"
    );
    let o = ran();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let cert: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("certificate.json")).unwrap())
            .unwrap();
    assert_eq!(cert["stats"]["model_calls"], 0);
}

#[test]
fn a_question_that_needs_groups_says_so_in_explain() {
    let scratch = tempfile::tempdir().unwrap();
    let o = run(bin()
        .arg("explain")
        .arg(repo().join("examples/issue-duplicates/spec.toml"))
        .args(["--backend", "scripted", "--store"])
        .arg(scratch.path().join("store.sqlite")));
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains(
            "needs     groups: the relations duplicate_of, contradicts hold among units, not in one; judged together by `related_issues`"
        ),
        "{}",
        stdout(&o)
    );
    // A spec of one map stage cannot state a relation among units.
    let f = Fixture::new(JSON_ARRAY, "");
    f.input(&flagged_rows(4));
    let spec = std::fs::read_to_string(f.path("spec.toml")).unwrap();
    let (first, rest) = spec.split_once('\n').unwrap();
    std::fs::write(
        f.path("spec.toml"),
        format!("{first}\nrequired_relations = [\"duplicate_of\"]\n{rest}"),
    )
    .unwrap();
    let o = run(bin().arg("explain").arg(f.path("spec.toml")));
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("no stage here judges units together"),
        "{}",
        stdout(&o)
    );
    // Without the declaration, explain says nothing of it.
    let f = Fixture::new(JSON_ARRAY, "");
    f.input(&flagged_rows(4));
    let o = run(bin().arg("explain").arg(f.path("spec.toml")));
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!stdout(&o).contains("needs     groups"), "{}", stdout(&o));
}
