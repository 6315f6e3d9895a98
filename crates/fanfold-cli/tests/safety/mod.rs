//! The paths that keep an answer honest when something stops it: a tool
//! whose requests a contract, `max_requests` or the wall budget ended, an
//! effect held back from an answer that is not whole, and a run that fails
//! its own verification.

use super::*;

/// A first judge that abstains on every row but one (`flag`), a tool it
/// widens to on abstain, and a second judge after the tool; `extra` goes
/// into the tool stage, `tail` after the backends.
fn widening_spec(f: &Fixture, addr: &std::net::SocketAddr, extra: &str, tail: &str) {
    let spec = format!(
        r#"name = "t"
question = "Is there a flagged row?"

[input]
path = "input.data"
partition = {JSON_ARRAY}

[[stages]]
name = "first"
type = "map"
version = 1
rubric = "rubric.md"
output_schema = "schema.json"
decision = {{ pointer = "/decision", positive = ["yes"], negative = ["no"], abstain = ["unsure"] }}
widen = {{ stage = "milestone", on_abstain = true }}

{tool}
[[stages]]
name = "judge"
type = "map"
version = 1
rubric = "rubric.md"
output_schema = "schema.json"
decision = {{ pointer = "/decision", positive = ["yes"], negative = ["no"], abstain = ["unsure"] }}

[backends.default]
type = "scripted"
script = "judge.jq"

[fold]
fan_in = 4
[[fold.reducers]]
name = "flagged"
type = "set"

{tail}
"#,
        tool = milestone_tool(addr, extra),
    );
    std::fs::write(f.path("spec.toml"), spec).unwrap();
    std::fs::write(
        f.path("schema.json"),
        r#"{"type": "object", "required": ["decision"], "properties": {"decision": {"enum": ["yes", "no", "unsure"]}}}"#,
    )
    .unwrap();
    // The last row is flagged; the rest are unsure until the milestone
    // says no. With one slot the first judge reaches the flagged row last,
    // so every other row is widened before the contract is met.
    std::fs::write(
        f.path("judge.jq"),
        r#"{decision: (if .id == 7 then "yes" elif .ms_info then "no" else "unsure" end)}"#,
    )
    .unwrap();
}

fn tool_rows(n: usize) -> Vec<u8> {
    milestone_rows(n).0
}

#[test]
fn a_satisfied_contract_that_cancels_a_tools_requests_leaves_the_answer_whole() {
    let (server, stats) = tracker(Default::default());
    let f = Fixture::new(JSON_ARRAY, "");
    widening_spec(
        &f,
        &server.addr,
        "",
        "[contract]\ntype = \"threshold\"\ncount = 1\n",
    );
    f.input(&tool_rows(8));
    let o = f.run(&["--slots", "1"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(!stdout(&o).contains("INCOMPLETE"), "{}", stdout(&o));
    let r = tool_report(&f, "milestone");
    assert_eq!(r["units"], 7, "{r}");
    assert!(r["requests"].as_u64().unwrap() > 0, "{r}");
    assert_eq!(r["cancelled"], r["requests"], "{r}");
    assert_eq!(r["not_sent"], 0, "{r}");
    // The tracker was asked nothing the contract had no use for.
    assert_eq!(seen(&stats)["requests"], r["sent"], "{r}");
    let c = f.certificate();
    assert!(
        c["statuses"]["cancelled"].as_u64().unwrap() > 0,
        "{}",
        c["statuses"]
    );
}

#[test]
fn a_tool_held_to_max_requests_leaves_the_answer_incomplete() {
    let (server, stats) = tracker(Default::default());
    let f = Fixture::new(JSON_ARRAY, "");
    widening_spec(
        &f,
        &server.addr,
        "max_requests = 2",
        "[contract]\ntype = \"exhaustive\"\nanswer = \"flagged\"\n",
    );
    f.input(&tool_rows(8));
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(stdout(&o).starts_with("# INCOMPLETE") || stderr(&o).contains("INCOMPLETE"));
    assert!(
        stderr(&o).contains("requests were never sent"),
        "{}",
        stderr(&o)
    );
    let r = tool_report(&f, "milestone");
    assert_eq!(r["sent"], 2, "{r}");
    assert!(r["not_sent"].as_u64().unwrap() > 0, "{r}");
    assert_eq!(seen(&stats)["requests"], 2);
    assert!(f.certificate()["statuses"]["not_run"].as_u64().unwrap() > 0);
}

#[test]
fn a_tool_stopped_by_the_wall_budget_leaves_the_answer_incomplete() {
    let faults = fanfold_testkit::tracker::Faults {
        latency_ms: 400,
        ..Default::default()
    };
    let (server, _stats) = tracker(faults);
    let f = Fixture::new(JSON_ARRAY, "");
    widening_spec(
        &f,
        &server.addr,
        "quota = { concurrency = 1 }",
        "[budget]\nmax_wall_secs = 1\n\n[contract]\ntype = \"exhaustive\"\nanswer = \"flagged\"\n",
    );
    f.input(&tool_rows(12));
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let r = tool_report(&f, "milestone");
    assert!(r["not_sent"].as_u64().unwrap() > 0, "{r}");
    assert_eq!(r["cancelled"], 0, "{r}");
}

#[test]
fn a_damaged_copy_of_the_source_in_the_store_is_never_judged() {
    let f = Fixture::new(JSON_ARRAY, "");
    f.input(br#"[{"id": 1, "flag": true, "note": "the disk failed hard"}, {"id": 2, "flag": false, "note": "all quiet"}]"#);
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // The store's copy of the source is edited behind fanfold's back.
    let store = f.path("store.sqlite");
    sqlite3(
        &store,
        "UPDATE chunks SET bytes = CAST(replace(CAST(bytes AS TEXT), 'failed', 'FAILED') AS BLOB)",
    );
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("no longer matches its hash"),
        "{}",
        stderr(&o)
    );
    // The next run stores the source again and answers from the file.
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let facts = std::fs::read_to_string(f.path("out/facts.jsonl")).unwrap();
    assert!(!facts.contains("FAILED"), "{facts}");
    assert_eq!(f.answer_ids(), ["1"]);
}
