//! Real files: repeated rows, unterminated quotes, ids that only look alike.

#[allow(unused_imports)]
use super::*;

const CSV: &str = r#"{ type = "csv", key = "id", kind = "row" }"#;
const JSONL: &str = r#"{ type = "jsonl", key = "id", kind = "row" }"#;

/// Rows `1..=n` as CSV (`id,flag,text`, the text last), every fifth
/// flagged; `row` may replace a row's line.
fn csv_rows(n: usize, row: impl Fn(usize) -> Option<String>) -> String {
    let mut src = String::from("id,flag,text\n");
    for i in 1..=n {
        let line = row(i).unwrap_or_else(|| format!("{i},{},review {i} text", i % 5 == 0));
        src.push_str(&line);
        src.push('\n');
    }
    src
}

/// The same records as CSV, JSONL and a JSON array.
fn in_every_format(records: &[(u64, bool, &str)]) -> [(&'static str, String); 3] {
    let objects: Vec<String> = records
        .iter()
        .map(|(id, flag, text)| format!(r#"{{"id": {id}, "flag": {flag}, "text": "{text}"}}"#))
        .collect();
    let csv: String = records
        .iter()
        .map(|(id, flag, text)| format!("{id},{flag},{text}\n"))
        .collect();
    [
        (CSV, format!("id,flag,text\n{csv}")),
        (JSONL, format!("{}\n", objects.join("\n"))),
        (JSON_ARRAY, format!("[{}]", objects.join(",\n"))),
    ]
}

fn answer_json(f: &Fixture) -> Value {
    serde_json::from_str(&std::fs::read_to_string(f.path("out/answer.json")).expect("answer"))
        .expect("json")
}

fn answer_md(f: &Fixture) -> String {
    std::fs::read_to_string(f.path("out/answer.md")).expect("answer.md")
}

/// Rows repeated byte for byte (an export that repeats them) are the units
/// they repeat: the answer is complete and counts them; a repeated key
/// with other content is still a rejection that names both places, in
/// CSV, JSONL and a JSON array.
#[test]
fn identical_repeats_leave_the_answer_complete_and_conflicting_ones_do_not() {
    let identical = [
        (1, true, "a"),
        (2, false, "b"),
        (1, true, "a"),
        (3, true, "c"),
        (2, false, "b"),
    ];
    for (partition, src) in in_every_format(&identical) {
        let f = Fixture::new(partition, "");
        f.input(src.as_bytes());
        let o = f.run(&[]);
        assert_eq!(o.status.code(), Some(0), "{partition}: {}", stderr(&o));
        let c = f.certificate();
        assert_eq!(c["complete"], true, "{partition}: {c}");
        assert_eq!(c["coverage"]["elements"], 5);
        assert_eq!(c["coverage"]["units"], 3);
        assert_eq!(c["coverage"]["rejected"], 0);
        assert_eq!(c["coverage"]["repeated_identical"], 2, "{partition}");
        assert_eq!(c["coverage_complete"], true);
        assert!(
            c["repeats"][0]
                .as_str()
                .is_some_and(|r| r.contains("element 2 at byte") && r.contains("repeats element 0")),
            "{partition}: {}",
            c["repeats"]
        );
        assert_eq!(answer_json(&f)["repeated_identical"], 2, "{partition}");
        assert_eq!(f.answer_ids(), ["1", "3"], "{partition}");
        let md = answer_md(&f);
        assert!(!md.starts_with("# INCOMPLETE"), "{md}");
        assert!(
            md.contains("5 elements = 3 units + 0 rejected + 2 repeated identically")
                && md.contains("- repeated_identical: 2 elements"),
            "{partition}: {md}"
        );
        // The stored partition gives the same account the second time.
        let o = f.run(&[]);
        assert_eq!(o.status.code(), Some(0), "{partition}: {}", stderr(&o));
        assert_eq!(f.certificate()["coverage"], c["coverage"], "{partition}");
        // And so does the source read again, without the store.
        let o = run(bin().arg("verify").arg(f.path("out")));
        assert_eq!(o.status.code(), Some(0), "{partition}: {}", stdout(&o));
    }

    let conflicting = [(1, true, "a"), (2, false, "b"), (1, false, "a")];
    for (partition, src) in in_every_format(&conflicting) {
        let f = Fixture::new(partition, "");
        f.input(src.as_bytes());
        let o = f.run(&[]);
        assert_eq!(o.status.code(), Some(3), "{partition}: {}", stderr(&o));
        let c = f.certificate();
        assert_eq!(
            c["rejected_by_reason"]["duplicate_key"], 1,
            "{partition}: {c}"
        );
        assert_eq!(c["coverage"]["repeated_identical"], 0);
        let first = src.find("1").expect("first row") as u64;
        let repeat = src.rfind("1").expect("repeat") as u64;
        let said = c["rejections"][0].as_str().unwrap_or_default();
        // Both places: the repeat's element and byte, the first's.
        let start = |at: u64| {
            // The element starts at its line (CSV, JSONL) or its `{`.
            let line = src[..at as usize].rfind('\n').map_or(0, |i| i + 1) as u64;
            match src[line as usize..].starts_with('{') || partition == CSV {
                true => line,
                false => src[..at as usize].rfind('{').unwrap_or(0) as u64,
            }
        };
        assert!(
            said.contains(&format!(
                "element 2 at byte {} repeats id = 1 of element 0 at byte {} with other content",
                start(repeat),
                start(first)
            )),
            "{partition}: {said}"
        );
        assert!(answer_md(&f).starts_with("# INCOMPLETE"));
    }
}

/// A quote opened in row 10 of 100 and never closed once swallowed rows
/// 11 to 100 into one field: 10 units, exit 0, a complete answer. Now the
/// row is rejected, named where its quote opened, the rows after it are
/// units, and the answer is incomplete; the same for the last row.
#[test]
fn an_unterminated_quote_is_a_named_rejection_and_no_row_after_it_is_lost() {
    for bad in [10, 100] {
        let f = Fixture::new(CSV, "");
        let src = csv_rows(100, |i| {
            (i == bad).then(|| format!("{i},true,\"review {i} text"))
        });
        f.input(src.as_bytes());
        let o = f.run(&[]);
        assert_eq!(o.status.code(), Some(3), "row {bad}: {}", stderr(&o));
        let c = f.certificate();
        assert_eq!(c["complete"], false);
        assert_eq!(c["coverage"]["elements"], 100, "row {bad}: {c}");
        assert_eq!(c["coverage"]["units"], 99);
        assert_eq!(c["rejected_by_reason"]["unterminated_quote"], 1);
        let at = src.find(&format!("\n{bad},true")).expect("row") + 1;
        let said = c["rejections"][0].as_str().unwrap_or_default();
        assert!(
            said.contains(&format!(
                "element {} at byte {at} (line {}): the quoted field opened at byte {} (line {}) is never closed",
                bad - 1,
                bad + 1,
                at + format!("{bad},true,").len(),
                bad + 1
            )),
            "{said}"
        );
        // Every other flagged row is in the answer, the ones after the
        // bad row too.
        let want: Vec<String> = (1..=100)
            .filter(|i| i % 5 == 0 && *i != bad)
            .map(|i| i.to_string())
            .collect();
        let mut got = f.answer_ids();
        got.sort_by_key(|id| id.parse::<u64>().unwrap_or(0));
        assert_eq!(got, want, "row {bad}");
        let md = answer_md(&f);
        assert!(md.starts_with("# INCOMPLETE"), "{md}");
        assert!(md.contains("is never closed"), "{md}");
    }
}

/// Integer ids past 64 bits are two ids, not one float; a record that
/// holds its key twice is rejected, naming the element, its byte and the
/// name.
#[test]
fn big_integer_ids_stay_apart_and_a_repeated_key_is_rejected() {
    let f = Fixture::new(JSONL, "");
    f.input(
        b"{\"id\": 18446744073709551616, \"flag\": true}\n{\"id\": 18446744073709551617, \"flag\": true}\n{\"id\": 3, \"id\": 4, \"flag\": true}\n",
    );
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let c = f.certificate();
    assert_eq!(c["coverage"]["units"], 2, "{c}");
    assert_eq!(c["rejected_by_reason"]["repeated_field"], 1, "{c}");
    assert_eq!(c["rejected_by_reason"].get("duplicate_key"), None, "{c}");
    let mut ids = f.answer_ids();
    ids.sort();
    assert_eq!(ids, ["18446744073709551616", "18446744073709551617"]);
    let said = c["rejections"][0].as_str().unwrap_or_default();
    assert!(
        said.contains("element 2 at byte 86 (line 3) holds the field \"id\" twice"),
        "{said}"
    );
}
