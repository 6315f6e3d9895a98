//! Nested records as units (`path`, `element_key`): each element a unit,
//! ids from the record's id and the element's place or from the
//! element's own key, coverage counted by element, read back for verify.

use super::*;

/// Four records of events; the second's are none, the third's `events`
/// is no array.
const EVENTS: &str = r#"[
  {"id": 7, "events": [{"flag": true, "message": "disk full"}, {"flag": false, "message": "retry"}]},
  {"id": 8, "events": []},
  {"id": 9, "events": "none"},
  {"id": 10, "events": [{"flag": true, "message": "fan stopped"}]}
]"#;

#[test]
fn each_element_at_a_path_is_a_unit_named_by_its_place() {
    let f = Fixture::new(
        r#"{ type = "json_array", key = "id", kind = "event", path = ".events[]" }"#,
        "",
    );
    f.input(EVENTS.as_bytes());
    let o = f.run(&[]);
    // The record the path cannot enter is rejected, and so is the one
    // with no events: the answer says so.
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let c = f.certificate();
    assert_eq!(c["coverage"]["elements"], 5, "{}", c["coverage"]);
    assert_eq!(c["coverage"]["units"], 3);
    assert_eq!(c["coverage"]["rejected"], 2);
    assert_eq!(c["coverage_complete"], true);
    assert_eq!(c["rejected_by_reason"]["missing_path"], 1);
    assert_eq!(c["rejected_by_reason"]["empty_path"], 1);
    assert!(
        stderr(&o).contains("cannot be split by .events[]: no array at `.events`"),
        "{}",
        stderr(&o)
    );
    assert_eq!(f.answer_ids(), ["10.events[0]", "7.events[0]"]);
    assert_eq!(c["verify"]["passed"], true, "{}", c["verify"]);
    assert_eq!(c["verify"]["cited_checked"], 2);
    let o = run(bin().arg("verify").arg(f.path("out")));
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));

    let o = run(bin().arg("explain").arg(f.path("spec.toml")));
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains(
            "units   each element at `.events[]` of each record, ids <id> and the element's place (`<id>.events[0]`)"
        ),
        "{}",
        stdout(&o)
    );
}

#[test]
fn an_element_key_names_elements_and_a_repeat_is_a_duplicate() {
    let f = Fixture::new(
        r#"{ type = "json_array", key = "id", kind = "event", path = ".events[]", element_key = "eid" }"#,
        "",
    );
    f.input(
        br#"[
  {"id": 1, "events": [{"eid": "a", "flag": true}, {"eid": "b", "flag": false}]},
  {"id": 2, "events": [{"eid": "a", "flag": false}, {"eid": "c", "flag": true}]}
]"#,
    );
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let c = f.certificate();
    assert_eq!(c["coverage"]["elements"], 4);
    assert_eq!(c["rejected_by_reason"]["duplicate_key"], 1);
    assert!(stderr(&o).contains("repeats eid = a"), "{}", stderr(&o));
    assert_eq!(f.answer_ids(), ["a", "c"]);
    assert_eq!(c["verify"]["passed"], true, "{}", c["verify"]);
}

/// An element added to one record moves no other record's element ids.
#[test]
fn element_ids_do_not_move_when_another_record_changes() {
    let f = Fixture::new(
        r#"{ type = "json_array", key = "id", kind = "event", path = ".events[]" }"#,
        "",
    );
    f.input(EVENTS.as_bytes());
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let before = f.answer_ids();
    let edited = EVENTS.replace(r#""events": []}"#, r#""events": [{"flag": true}]}"#);
    assert_ne!(edited, EVENTS);
    f.input(edited.as_bytes());
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let after = f.answer_ids();
    assert_eq!(before, ["10.events[0]", "7.events[0]"]);
    assert_eq!(after, ["10.events[0]", "7.events[0]", "8.events[0]"]);
    // Only the new element was judged: the others' facts are cached.
    assert_eq!(f.certificate()["stats"]["model_calls"], 1);
}
