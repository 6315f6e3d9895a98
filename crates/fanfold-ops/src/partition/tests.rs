use super::*;

fn json_array_spec() -> PartitionSpec {
    PartitionSpec::JsonArray {
        key: Some("number".into()),
        kind: "issue".into(),
        unit_fields: Vec::new(),
        path: None,
        element_key: None,
    }
}

/// A JSON array written on the fly, counting the bytes handed out.
struct LazyArray {
    next: usize,
    count: usize,
    pending: Vec<u8>,
    read: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl std::io::Read for LazyArray {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        if self.pending.is_empty() && self.next <= self.count {
            self.pending = match self.next {
                0 => b"[\n".to_vec(),
                n if n == self.count => b"]\n".to_vec(),
                n => format!(
                    "{}{{\"number\": {n}, \"body\": \"{}\"}}\n",
                    if n > 1 { "," } else { "" },
                    "é".repeat(400)
                )
                .into_bytes(),
            };
            self.next += 1;
        }
        let n = out.len().min(self.pending.len());
        out[..n].copy_from_slice(&self.pending[..n]);
        self.pending.drain(..n);
        self.read
            .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
        Ok(n)
    }
}

/// A JSON array streams: what is read ahead of the element being
/// emitted stays within a few chunks of the window, however long the
/// array; offsets and lines stay absolute across the window's moves.
#[test]
fn a_json_array_is_read_through_a_bounded_window() {
    let read = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let bytes_read = || read.load(std::sync::atomic::Ordering::Relaxed);
    let count = 40_000;
    let source = LazyArray {
        next: 0,
        count,
        pending: Vec::new(),
        read: read.clone(),
    };
    let mut ahead = 0u64;
    let mut units = 0;
    let mut last = None;
    let coverage = partition_reader(
        &json_array_spec(),
        ContentHash::of_bytes(b"lazy"),
        std::io::BufReader::new(source),
        PartitionOptions::default(),
        &mut SeenKeys::default(),
        &mut |el| {
            if let Element::Unit(u) = el {
                ahead = ahead.max(bytes_read() - u.unit.bytes.end);
                units += 1;
                last = Some(u);
            }
        },
    )
    .expect("partitions");
    assert_eq!(coverage.elements, count as u64 - 1);
    assert_eq!(units, count - 1);
    let total = bytes_read();
    assert!(total > 30_000_000, "{total}");
    assert!(ahead <= 4 << 20, "read {ahead} bytes ahead of {total}");
    // The last element starts on its own line, after the opening line.
    let last = last.expect("a unit");
    assert_eq!(last.unit.unit_id.as_str(), format!("{}", count - 1));
    let element = format!(
        "{{\"number\": {}, \"body\": \"{}\"}}",
        count - 1,
        "é".repeat(400)
    );
    assert_eq!(last.unit.bytes.end, total - 3);
    assert_eq!(
        last.unit.bytes.end - last.unit.bytes.start,
        element.len() as u64
    );
}

/// Errors past the first window name absolute offsets and lines.
#[test]
fn errors_deep_in_a_json_array_name_absolute_places() {
    let mut src = String::from("[\n");
    for n in 0..5000 {
        src.push_str(&format!(
            "{{\"number\": {n}, \"body\": \"{}\"}},\n",
            "x".repeat(400)
        ));
    }
    let at = src.len();
    src.push_str("{\"number\": 5000, \"body\": tru}\n]");
    let err = partition_all(
        &json_array_spec(),
        src.as_bytes(),
        PartitionOptions::default(),
    )
    .expect_err("fails");
    match err {
        PartitionError::Malformed { offset, line, .. } => {
            assert_eq!(line, 5002);
            assert!(
                (at as u64..src.len() as u64).contains(&offset),
                "{offset} vs {at}"
            );
        }
        other => panic!("unexpected {other}"),
    }
    let mut bad = src.replace("tru}", "true}").into_bytes();
    bad.truncate(at);
    bad.extend_from_slice(b"{\"number\": 5000, \"t\": \"caf\xe9\"}]");
    let err =
        partition_all(&json_array_spec(), &bad, PartitionOptions::default()).expect_err("fails");
    assert!(
        matches!(err, PartitionError::NotUtf8 { offset, line: 5002 } if offset == at as u64 + 26),
        "{err}"
    );
}

#[test]
fn json_array_units_carry_ids_and_ranges() {
    let src = br#"[ {"number": 2, "title": "b"}, {"number": 1, "title": "a, [x]"} ]"#;
    let (units, rej, cov) =
        partition_all(&json_array_spec(), src, PartitionOptions::default()).expect("ok");
    assert!(rej.is_empty());
    assert_eq!(
        cov,
        Coverage {
            elements: 2,
            units: 2,
            rejected: 0,
            repeated_identical: 0,
        }
    );
    assert_eq!(units[0].unit.unit_id.as_str(), "2");
    let r = units[1].unit.bytes;
    assert_eq!(
        &src[r.start as usize..r.end as usize],
        br#"{"number": 1, "title": "a, [x]"}"#
    );
    assert_eq!(units[0].unit.source_hash, ContentHash::of_bytes(src));
}

#[test]
fn keys_people_cannot_read_as_stored_are_rejected() {
    for bad in [
        "",
        "a\u{0}b",
        "evil\u{202E}txt.exe",
        "line\nbreak",
        "\u{2066}x",
    ] {
        assert!(key_flaw(bad).is_some(), "{bad:?} was accepted");
    }
    for good in ["1", "café", "a b", "issue-42", "日本語"] {
        assert_eq!(key_flaw(good), None, "{good:?} was refused");
    }
    assert_eq!(
        key_flaw("a\u{202E}b").as_deref(),
        Some("holds a bidirectional control character (U+202E) at byte 1")
    );
}

#[test]
fn records_whose_key_cannot_be_read_as_stored_are_rejected_in_both_formats() {
    let rows = [
        r#"{"number": "a\u0000b"}"#,
        r#"{"number": "evil\u202Etxt"}"#,
        r#"{"number": ""}"#,
        r#"{"number": "fine"}"#,
    ];
    let array = format!("[{}]", rows.join(","));
    let lines = format!("{}\n", rows.join("\n"));
    let jsonl = PartitionSpec::Jsonl {
        key: Some("number".into()),
        kind: "issue".into(),
    };
    for (spec, src) in [(json_array_spec(), array), (jsonl, lines)] {
        let (units, rej, _) =
            partition_all(&spec, src.as_bytes(), PartitionOptions::default()).expect("ok");
        assert_eq!(units.len(), 1, "{spec:?}");
        assert_eq!(
            rej.iter().map(|r| r.reason.as_str()).collect::<Vec<_>>(),
            ["bad_key", "bad_key", "bad_key"],
            "{spec:?}"
        );
        assert!(rej[1].detail.contains("U+202E"), "{}", rej[1].detail);
    }
}

#[test]
fn duplicate_and_missing_keys_are_explicit_rejections() {
    let src = br#"[{"number": 1}, {"number": 1, "title": "other"}, {"title": "no key"}]"#;
    let (units, rej, cov) =
        partition_all(&json_array_spec(), src, PartitionOptions::default()).expect("ok");
    assert_eq!(units.len(), 1);
    assert_eq!(
        rej.iter().map(|r| r.reason.as_str()).collect::<Vec<_>>(),
        ["duplicate_key", "missing_key"]
    );
    assert!(cov.is_complete());
}

#[test]
fn reformatting_keeps_unit_hashes() {
    let compact = br#"[{"number":1,"title":"a"}]"#;
    let pretty = b"[\n  {\n    \"title\": \"a\",\n    \"number\": 1\n  }\n]\n";
    let a = partition_all(&json_array_spec(), compact, PartitionOptions::default())
        .expect("ok")
        .0;
    let b = partition_all(&json_array_spec(), pretty, PartitionOptions::default())
        .expect("ok")
        .0;
    assert_eq!(a[0].unit.unit_hash, b[0].unit.unit_hash);
    assert_ne!(a[0].unit.source_hash, b[0].unit.source_hash);
}

#[test]
fn malformed_json_names_the_byte_offset() {
    let src = b"[{\"number\": 1},\n {\"number\": 2,, }]";
    let err =
        partition_all(&json_array_spec(), src, PartitionOptions::default()).expect_err("fails");
    match err {
        PartitionError::Malformed { offset, line, .. } => {
            assert_eq!(line, 2);
            assert!((17..=31).contains(&offset), "offset {offset}");
        }
        other => panic!("unexpected {other}"),
    }
    let truncated = br#"[{"number": 1}, {"number": 2"#;
    let err = partition_all(&json_array_spec(), truncated, PartitionOptions::default())
        .expect_err("fails");
    assert!(err.to_string().contains("truncated"), "{err}");
}

#[test]
fn empty_and_non_utf8_inputs_are_clear_errors() {
    for src in [&b""[..], b"   \n"] {
        let err =
            partition_all(&json_array_spec(), src, PartitionOptions::default()).expect_err("fails");
        assert!(matches!(err, PartitionError::Empty), "{err}");
    }
    // An empty array is no records, not a mistake.
    let empty = partition_all(&json_array_spec(), b"[]", PartitionOptions::default())
        .expect("an empty array partitions");
    assert_eq!(empty.2.elements, 0);
    let bad = b"[{\"number\": 1, \"t\": \"caf\xe9\"}]";
    let err =
        partition_all(&json_array_spec(), bad, PartitionOptions::default()).expect_err("fails");
    assert!(
        matches!(
            err,
            PartitionError::NotUtf8 {
                offset: 24,
                line: 1
            }
        ),
        "{err}"
    );
}

#[test]
fn oversized_records_are_rejected_not_lost() {
    let big = format!(
        "[{{\"number\": 1, \"body\": \"{}\"}}, {{\"number\": 2}}]",
        "x".repeat(5000)
    );
    let opts = PartitionOptions {
        max_unit_bytes: 1000,
    };
    let (units, rej, cov) = partition_all(&json_array_spec(), big.as_bytes(), opts).expect("ok");
    assert_eq!(units.len(), 1);
    assert_eq!(rej[0].reason, "too_large");
    assert!(cov.is_complete());
}

#[test]
fn jsonl_skips_blank_lines_and_reports_bad_lines() {
    let spec = PartitionSpec::Jsonl {
        key: Some("id".into()),
        kind: "event".into(),
    };
    let src = b"{\"id\": 1}\n\n{\"id\": 2}\r\n";
    let (units, _, cov) = partition_all(&spec, src, PartitionOptions::default()).expect("ok");
    assert_eq!(cov.elements, 2);
    assert_eq!(units[1].unit.bytes, ByteRange { start: 11, end: 20 });
    // A line that is not JSON is that one record's rejection.
    let (units, rejected, _) = partition_all(
        &spec,
        b"{\"id\": 1}\n{\"id\": }\n{\"id\": 3}\n",
        PartitionOptions::default(),
    )
    .expect("the other lines stand");
    assert_eq!(units.len(), 2);
    assert_eq!(rejected.len(), 1);
    let r = &rejected[0];
    assert_eq!(r.reason, "malformed_line");
    assert_eq!(r.bytes, ByteRange { start: 10, end: 18 });
    assert!(
        r.detail.contains("(line 2) is not JSON") && r.detail.contains("at byte 17"),
        "{}",
        r.detail
    );
}

/// A quote opened and never closed is that row's rejection, named where
/// the quote opened, however many fields the runaway row has; a closed
/// field over two lines in a short row is still a count of fields.
#[test]
fn an_unclosed_csv_quote_is_told_from_a_short_multi_line_row() {
    let spec = PartitionSpec::Csv {
        key: Some("id".into()),
        kind: "row".into(),
        delimiter: None,
    };
    let open = b"id,title,body\n1,a,b\n2,\"open,x\n3,a,b\n4,c,d\n";
    let (units, rejected, coverage) =
        partition_all(&spec, open, PartitionOptions::default()).expect("partitions");
    let ids: Vec<&str> = units.iter().map(|u| u.unit.unit_id.as_str()).collect();
    assert_eq!(ids, ["1", "3", "4"]);
    assert_eq!(rejected.len(), 1);
    assert_eq!(rejected[0].reason, "unterminated_quote");
    assert!(
        rejected[0]
            .detail
            .contains("element 1 at byte 20 (line 3): the quoted field opened at byte 22 (line 3) is never closed"),
        "{}",
        rejected[0].detail
    );
    assert!(coverage.is_complete());
    let closed = b"id,title,body\n1,\"two\nlines\"\n2,a,b\n";
    let err = partition_all(&spec, closed, PartitionOptions::default()).expect_err("fails");
    let shown = err.to_string();
    assert!(
        !shown.contains("never closed") && shown.contains("2 fields"),
        "{shown}"
    );
}

fn csv_spec() -> PartitionSpec {
    PartitionSpec::Csv {
        key: Some("id".into()),
        kind: "row".into(),
        delimiter: None,
    }
}

/// 100 rows of `id,flag,text`, the text last, so a quote opened in it and
/// never closed leaves the row its full count of fields.
fn hundred_rows(bad: impl Fn(usize) -> Option<String>) -> String {
    let mut src = String::from("id,flag,text\n");
    for i in 1..=100 {
        let row = bad(i).unwrap_or_else(|| format!("{i},{},row {i} text", i % 5 == 0));
        src.push_str(&row);
        src.push('\n');
    }
    src
}

/// The partition of a CSV source, every element checked against the
/// source: units read back from their own bytes, rejections and units in
/// order without overlap.
fn csv_parts(src: &str) -> Parts {
    let spec = csv_spec();
    let parts =
        partition_parts(&spec, src.as_bytes(), PartitionOptions::default()).expect("partitions");
    assert!(parts.coverage.is_complete(), "{:?}", parts.coverage);
    let header = csv_header(src.as_bytes(), None);
    let mut ends = 0;
    let mut placed: Vec<(u64, ByteRange)> = parts
        .units
        .iter()
        .map(|u| (u.unit.ordinal, u.unit.bytes))
        .chain(parts.rejections.iter().map(|r| (r.ordinal, r.bytes)))
        .collect();
    placed.sort_by_key(|p| p.0);
    for (_, r) in &placed {
        assert!(r.start >= ends && r.end >= r.start, "{r:?} after {ends}");
        ends = r.end;
    }
    for u in &parts.units {
        let r = u.unit.bytes;
        let bytes = &src.as_bytes()[r.start as usize..r.end as usize];
        let value = reread(&spec, bytes, header, 0, u.unit.unit_id.as_str()).expect("reads back");
        assert_eq!(value, u.value);
    }
    parts
}

/// A quote opened in row 10 of 100 and never closed once swallowed rows 11
/// to 100 into one field: 10 units and a complete answer. Now row 10 is
/// rejected, naming the line and byte where its quote opened, and rows 11
/// to 100 are units again.
#[test]
fn an_unterminated_quote_rejects_its_row_and_keeps_the_rows_after_it() {
    let src = hundred_rows(|i| (i == 10).then(|| "10,true,\"row 10 text".to_owned()));
    let parts = csv_parts(&src);
    assert_eq!(parts.units.len(), 99);
    assert!(parts.units.iter().all(|u| u.unit.unit_id.as_str() != "10"));
    assert_eq!(parts.units[9].unit.unit_id.as_str(), "11");
    assert_eq!(parts.units[9].value["text"], "row 11 text");
    assert_eq!(parts.units[98].value["text"], "row 100 text");
    let r = &parts.rejections[..];
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].reason, "unterminated_quote");
    assert_eq!(r[0].ordinal, 9);
    let row = src.find("10,true").expect("row 10") as u64;
    let quote = src.find("\"row 10").expect("quote") as u64;
    assert_eq!(r[0].bytes.start, row);
    assert_eq!(
        &src[row as usize..r[0].bytes.end as usize],
        "10,true,\"row 10 text"
    );
    assert!(
        r[0].detail.contains(&format!(
            "element 9 at byte {row} (line 11): the quoted field opened at byte {quote} (line 11) is never closed"
        )) && r[0].detail.contains("to the end of the input (line 101)")
            && r[0].detail.contains("read again as rows"),
        "{}",
        r[0].detail
    );
}

/// The same on the last row: it is rejected, not read as a complete row
/// whose field ends in a line break.
#[test]
fn an_unterminated_quote_on_the_last_row_is_rejected() {
    for end in ["\n", ""] {
        let mut src = hundred_rows(|i| (i == 100).then(|| "100,true,\"row 100 text".to_owned()));
        if end.is_empty() {
            src.pop();
        }
        let parts = csv_parts(&src);
        assert_eq!(parts.units.len(), 99);
        assert_eq!(parts.rejections.len(), 1);
        let r = &parts.rejections[0];
        assert_eq!(r.reason, "unterminated_quote");
        assert!(
            r.detail.contains("(line 101): the quoted field opened")
                && !r.detail.contains("read again"),
            "{}",
            r.detail
        );
    }
}

/// A runaway quote closed many lines later by a quote inside ordinary
/// text (`he said "hi"`) once merged the rows between into one field with
/// the right count; it is a runaway too, and the rows between are units.
#[test]
fn a_quote_closed_lines_later_by_text_is_a_runaway_row() {
    let src = hundred_rows(|i| match i {
        10 => Some("10,true,\"row 10 text".to_owned()),
        50 => Some("50,true,he said \"hi\" to row 50".to_owned()),
        _ => None,
    });
    let parts = csv_parts(&src);
    assert_eq!(parts.units.len(), 99);
    let fifty = parts
        .units
        .iter()
        .find(|u| u.unit.unit_id.as_str() == "50")
        .expect("row 50");
    assert_eq!(fifty.value["text"], "he said \"hi\" to row 50");
    let r = &parts.rejections[0];
    assert_eq!(r.reason, "unterminated_quote");
    assert!(r.detail.contains("closed only on line 51"), "{}", r.detail);
}

/// Legitimate quoting stays as it was: a field over several lines, doubled
/// quotes, a quote inside an unquoted field, CRLF line ends.
#[test]
fn well_quoted_csv_is_read_as_before() {
    let src = "id,flag,text\r\n1,true,\"two\r\nlines, \"\"quoted\"\"\"\r\n2,false,say \"hi\"\r\n3,true,\"\"\r\n";
    let parts = csv_parts(src);
    assert!(parts.rejections.is_empty(), "{:?}", parts.rejections);
    let texts: Vec<&Value> = parts.units.iter().map(|u| &u.value["text"]).collect();
    assert_eq!(texts, ["two\r\nlines, \"quoted\"", "say \"hi\"", ""]);
}

/// A header row whose quote runs on cannot be read past: an error at the
/// quote.
#[test]
fn a_header_whose_quote_runs_on_is_an_error() {
    let err = partition_all(
        &csv_spec(),
        b"id,\"flag,text\n1,true,a\n",
        PartitionOptions::default(),
    )
    .expect_err("fails");
    assert!(
        matches!(
            err,
            PartitionError::Malformed {
                offset: 3,
                line: 1,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn csv_rows_become_objects_and_ragged_rows_fail() {
    let spec = PartitionSpec::Csv {
        key: Some("LineId".into()),
        kind: "row".into(),
        delimiter: None,
    };
    let src = b"LineId,Content\n1,hello\n2,\"a, b\"\n";
    let (units, _, _) = partition_all(&spec, src, PartitionOptions::default()).expect("ok");
    assert_eq!(units[1].value["Content"], "a, b");
    assert_eq!(units[1].unit.unit_id.as_str(), "2");
    let err = partition_all(
        &spec,
        b"LineId,Content\n1,a\n2,b,c\n",
        PartitionOptions::default(),
    )
    .expect_err("fails");
    match err {
        PartitionError::Malformed {
            line: 3,
            offset: 19,
            ..
        } => {}
        other => panic!("unexpected {other}"),
    }
}

#[test]
fn lines_group_continuations_and_ids_are_content_derived() {
    let spec = PartitionSpec::Lines {
        record_start: Some(r"^\d{4}-".into()),
        kind: "log".into(),
    };
    let src = b"2024-01-01 boom\n  at a.rs:1\n  at b.rs:2\n2024-01-02 ok\n2024-01-02 ok\n";
    let (units, _, cov) = partition_all(&spec, src, PartitionOptions::default()).expect("ok");
    assert_eq!(cov.elements, 3);
    assert_eq!(
        units[0].value["text"],
        "2024-01-01 boom\n  at a.rs:1\n  at b.rs:2"
    );
    assert_eq!(units[0].value["line"], 1);
    assert_eq!(
        units[2].unit.unit_id.0,
        format!("{}-2", units[1].unit.unit_id.0)
    );
    // An edit before a record does not change its id.
    let edited = b"2024-01-01 BOOM\n2024-01-02 ok\n";
    let (after, _, _) = partition_all(&spec, edited, PartitionOptions::default()).expect("ok");
    assert_eq!(after[1].unit.unit_id, units[1].unit.unit_id);
}

/// The same records as CSV, JSONL and a JSON array: `1` and `2` once each,
/// then `1` again byte for byte, then `2` again with other content.
fn repeated_rows() -> [(PartitionSpec, String); 3] {
    let key = || Some("id".to_owned());
    let rows = [
        (1, "a", "true"),
        (2, "b", "false"),
        (1, "a", "true"),
        (2, "changed", "false"),
    ];
    let csv: String = std::iter::once("id,text,flag\n".to_owned())
        .chain(rows.iter().map(|(id, t, f)| format!("{id},{t},{f}\n")))
        .collect();
    let objects: Vec<String> = rows
        .iter()
        .map(|(id, t, f)| format!(r#"{{"id": {id}, "text": "{t}", "flag": {f}}}"#))
        .collect();
    [
        (
            PartitionSpec::Csv {
                key: key(),
                kind: "row".into(),
                delimiter: None,
            },
            csv,
        ),
        (
            PartitionSpec::Jsonl {
                key: key(),
                kind: "row".into(),
            },
            format!("{}\n", objects.join("\n")),
        ),
        (
            PartitionSpec::JsonArray {
                key: key(),
                kind: "row".into(),
                unit_fields: Vec::new(),
                path: None,
                element_key: None,
            },
            format!("[{}]", objects.join(",\n")),
        ),
    ]
}

/// An identical repeat (same key, same content once parsed) is the unit it
/// repeats: counted and named, no unit and no rejection, so the coverage
/// is complete with nothing rejected. A repeat with other content stays a
/// `duplicate_key` rejection that names both places.
#[test]
fn identical_repeats_are_counted_and_conflicting_ones_rejected_in_every_format() {
    for (spec, src) in repeated_rows() {
        let parts =
            partition_parts(&spec, src.as_bytes(), PartitionOptions::default()).expect("ok");
        let name = spec.type_name();
        let ids: Vec<&str> = parts
            .units
            .iter()
            .map(|u| u.unit.unit_id.as_str())
            .collect();
        assert_eq!(ids, ["1", "2"], "{name}");
        assert_eq!(
            parts.coverage,
            Coverage {
                elements: 4,
                units: 2,
                rejected: 1,
                repeated_identical: 1,
            },
            "{name}"
        );
        assert!(parts.coverage.is_complete());
        let first = &parts.units[0].unit;
        let repeat = &parts.repeats[..];
        assert_eq!(repeat.len(), 1, "{name}");
        assert_eq!(
            (repeat[0].ordinal, repeat[0].unit_id.as_str()),
            (2, "1"),
            "{name}"
        );
        assert_eq!(
            (repeat[0].first_ordinal, repeat[0].first_byte),
            (0, first.bytes.start)
        );
        assert!(
            repeat[0].detail.contains(&format!(
                "element 2 at byte {} repeats element 0 at byte {} exactly",
                repeat[0].bytes.start, first.bytes.start
            )),
            "{name}: {}",
            repeat[0].detail
        );
        let conflict = &parts.rejections[0];
        assert_eq!(conflict.reason, "duplicate_key", "{name}");
        let second = &parts.units[1].unit;
        assert!(
            conflict.detail.contains(&format!(
                "element 3 at byte {} repeats id = 2 of element 1 at byte {} with other content",
                conflict.bytes.start, second.bytes.start
            )),
            "{name}: {}",
            conflict.detail
        );
    }
}

/// Fields in another order are the same content once parsed.
#[test]
fn a_repeat_with_its_fields_reordered_is_identical() {
    let spec = PartitionSpec::Jsonl {
        key: Some("id".into()),
        kind: "row".into(),
    };
    let src =
        b"{\"id\": 1, \"a\": [1, 2]}\n{\"a\": [1, 2], \"id\": 1}\n{\"id\": 1, \"a\": [2, 1]}\n";
    let parts = partition_parts(&spec, src, PartitionOptions::default()).expect("ok");
    assert_eq!(parts.coverage.repeated_identical, 1);
    assert_eq!(parts.rejections[0].reason, "duplicate_key");
}

/// The store a run settles repeats through, kept in memory here: the units
/// emitted so far, and how often it was asked.
#[derive(Default)]
struct StoredUnits {
    units: std::collections::HashMap<String, UnitPlace>,
    asked: u64,
}

struct AskStored<'a>(&'a std::cell::RefCell<StoredUnits>);

impl ConfirmRepeat for AskStored<'_> {
    fn earlier(&mut self, id: &str, ordinal: u64) -> Result<Option<UnitPlace>, PartitionError> {
        let mut stored = self.0.borrow_mut();
        stored.asked += 1;
        Ok(stored
            .units
            .get(id)
            .copied()
            .filter(|u| u.ordinal < ordinal))
    }
}

/// The compact id set of a run keeps no content per id, and asks the store
/// for the earlier unit only when an id repeats; it tells identical repeats
/// from conflicting ones exactly as the in-memory set does, for integer
/// ids (kept as runs) and others (kept as fingerprints).
#[test]
fn the_compact_id_set_asks_the_store_only_on_a_repeat_and_agrees_with_memory() {
    for (spec, src) in repeated_rows() {
        for renamed in [false, true] {
            // Non-integer ids go through fingerprints.
            let src = match (renamed, &spec) {
                (false, _) => src.clone(),
                (true, PartitionSpec::Csv { .. }) => {
                    src.replace("\n1,", "\nk1,").replace("\n2,", "\nk2,")
                }
                (true, _) => src
                    .replace("\"id\": 1", "\"id\": \"k1\"")
                    .replace("\"id\": 2", "\"id\": \"k2\""),
            };
            assert_eq!(src.matches("k1").count(), 2 * usize::from(renamed));
            let want =
                partition_parts(&spec, src.as_bytes(), PartitionOptions::default()).expect("ok");
            let stored = std::cell::RefCell::new(StoredUnits::default());
            let mut seen = CompactSeen::new(AskStored(&stored));
            let (mut units, mut rejections, mut repeats) = (Vec::new(), Vec::new(), Vec::new());
            let coverage = partition_reader(
                &spec,
                ContentHash::of_bytes(src.as_bytes()),
                src.as_bytes(),
                PartitionOptions::default(),
                &mut seen,
                &mut |el| match el {
                    Element::Unit(u) => {
                        let unit = &u.unit;
                        stored.borrow_mut().units.insert(
                            unit.unit_id.0.clone(),
                            UnitPlace {
                                ordinal: unit.ordinal,
                                byte: unit.bytes.start,
                                unit_hash: unit.unit_hash,
                            },
                        );
                        units.push(u.unit);
                    }
                    Element::Rejected(r) => rejections.push(r),
                    Element::Repeated(r) => repeats.push(r),
                },
            )
            .expect("partitions");
            let name = spec.type_name();
            assert_eq!(coverage, want.coverage, "{name}");
            assert_eq!(rejections, want.rejections, "{name}");
            assert_eq!(repeats, want.repeats, "{name}");
            let want_units: Vec<_> = want.units.iter().map(|u| u.unit.clone()).collect();
            assert_eq!(units, want_units, "{name}");
            assert_eq!(
                stored.borrow().asked,
                2,
                "{name}: asked for the two repeats only"
            );
        }
    }
}

/// Integer keys too large for 64 bits keep their digits: two ids, not one
/// float, in JSONL and in a JSON array.
#[test]
fn integer_keys_beyond_64_bits_stay_distinct() {
    let records = [
        r#"{"id": 18446744073709551616, "t": "a"}"#,
        r#"{"id": 18446744073709551617, "t": "b"}"#,
        r#"{"id": -18446744073709551617, "t": "c"}"#,
        r#"{"id": 1e3, "t": "d"}"#,
    ];
    for (spec, src) in [
        (
            PartitionSpec::Jsonl {
                key: Some("id".into()),
                kind: "row".into(),
            },
            format!("{}\n", records.join("\n")),
        ),
        (
            PartitionSpec::JsonArray {
                key: Some("id".into()),
                kind: "row".into(),
                unit_fields: Vec::new(),
                path: None,
                element_key: None,
            },
            format!("[{}]", records.join(",")),
        ),
    ] {
        let (units, rejected, _) =
            partition_all(&spec, src.as_bytes(), PartitionOptions::default()).expect("ok");
        assert!(rejected.is_empty(), "{rejected:?}");
        let ids: Vec<&str> = units.iter().map(|u| u.unit.unit_id.as_str()).collect();
        assert_eq!(
            ids,
            [
                "18446744073709551616",
                "18446744073709551617",
                "-18446744073709551617",
                "1000.0"
            ],
            "{}",
            spec.type_name()
        );
    }
}

/// A record whose object holds a name twice is rejected, naming the
/// element, its byte and line, and the name, alike in JSONL and a JSON
/// array, nested objects included; the record was read as its last value.
#[test]
fn records_with_a_repeated_field_are_rejected_in_both_formats() {
    let records = [
        r#"{"id": 1, "t": "a"}"#,
        r#"{"id": 2, "id": 3}"#,
        r#"{"id": 4, "user": {"name": "x", "\u006eame": "y"}}"#,
        r#"{"id": 5, "list": [{"k": 1}, {"k": 2}]}"#,
    ];
    for (spec, src, lines) in [
        (
            PartitionSpec::Jsonl {
                key: Some("id".into()),
                kind: "row".into(),
            },
            format!("{}\n", records.join("\n")),
            [2, 3],
        ),
        (
            PartitionSpec::JsonArray {
                key: Some("id".into()),
                kind: "row".into(),
                unit_fields: Vec::new(),
                path: None,
                element_key: None,
            },
            format!("[\n{}\n]", records.join(",\n")),
            [3, 4],
        ),
    ] {
        let name = spec.type_name();
        let (units, rejected, coverage) =
            partition_all(&spec, src.as_bytes(), PartitionOptions::default()).expect("ok");
        let ids: Vec<&str> = units.iter().map(|u| u.unit.unit_id.as_str()).collect();
        assert_eq!(ids, ["1", "5"], "{name}");
        assert!(coverage.is_complete());
        let expected = [(1, "id", lines[0]), (2, "name", lines[1])];
        for (r, (ordinal, field, line)) in rejected.iter().zip(expected) {
            assert_eq!(r.reason, "repeated_field", "{name}");
            let at = src.find(records[ordinal]).expect("record") as u64;
            assert_eq!(r.bytes.start, at, "{name}");
            assert!(
                r.detail.starts_with(&format!(
                    "element {ordinal} at byte {at} (line {line}) holds the field \"{field}\" twice"
                )),
                "{name}: {}",
                r.detail
            );
        }
        assert_eq!(rejected.len(), 2, "{name}");
    }
}

fn inner_spec(key: Option<&str>, unit_fields: &[&str], path: Option<&str>) -> PartitionSpec {
    PartitionSpec::JsonArray {
        key: key.map(str::to_owned),
        kind: "issue".into(),
        unit_fields: unit_fields.iter().map(|f| (*f).to_owned()).collect(),
        path: path.map(str::to_owned),
        element_key: None,
    }
}

/// Every unit read back from its own bytes is the unit the partition
/// made, with the hash it was given.
fn assert_reread(spec: &PartitionSpec, src: &[u8], units: &[PartUnit]) {
    for u in units {
        let bytes = &src[u.unit.bytes.start as usize..u.unit.bytes.end as usize];
        let back = reread(spec, bytes, None, 0, u.unit.unit_id.as_str()).expect("reads back");
        assert_eq!(back, u.value, "{}", u.unit.unit_id);
        assert_eq!(content_hash(spec, &back), u.unit.unit_hash);
        // A record split once gives every unit inside it the same, but
        // for an occurrence-numbered id, which `reread` alone finds.
        if let Some(all) = super::reread_record(spec, bytes).expect("splits") {
            match all.get(u.unit.unit_id.as_str()) {
                Some(v) => assert_eq!(v, &u.value, "{}", u.unit.unit_id),
                None => assert!(
                    u.unit.unit_id.as_str().rsplit_once('-').is_some(),
                    "{} is missing from its record's units",
                    u.unit.unit_id
                ),
            }
        }
    }
}

#[test]
fn a_field_of_a_record_is_a_unit_of_its_own_confined_to_that_field() {
    let src = br#"[
 {"number": 7, "title": "Crash on save", "body": "It crashes. Every time."},
 {"number": 8, "title": "No body"},
 {"title": "no key", "body": "x"}
]"#;
    let spec = inner_spec(Some("number"), &["body"], None);
    let (units, rejected, coverage) =
        partition_all(&spec, src, PartitionOptions::default()).expect("partitions");
    let ids: Vec<&str> = units.iter().map(|u| u.unit.unit_id.as_str()).collect();
    assert_eq!(ids, ["7", "7.body", "8"]);
    // The record's unit holds the rest; the field's unit holds the field,
    // the record's other fields as context, and which field it is.
    assert_eq!(
        units[0].value,
        serde_json::json!({"number": 7, "title": "Crash on save"})
    );
    assert_eq!(
        units[1].value,
        serde_json::json!({"number": 7, "title": "Crash on save",
            "body": "It crashes. Every time.", "_unit_field": "body"})
    );
    assert_eq!(unit_field(&units[1].value), Some("body"));
    assert_eq!(unit_field(&units[0].value), None);
    // Both units lie in the record's bytes.
    assert_eq!(units[0].unit.bytes, units[1].unit.bytes);
    assert_eq!(rejected.len(), 1);
    assert_eq!(rejected[0].reason, "missing_key");
    assert!(
        rejected[0].detail.contains("has no scalar `number` field"),
        "{}",
        rejected[0].detail
    );
    assert_eq!(coverage.elements, 4);
    assert!(coverage.is_complete(), "{coverage:?}");
    assert_reread(&spec, src, &units);

    // Without a key, the record's content id names it and its field.
    let spec = inner_spec(None, &["body"], None);
    let (units, _, _) = partition_all(&spec, src, PartitionOptions::default()).expect("ok");
    assert!(
        units[1].unit.unit_id.as_str().ends_with(".body"),
        "{}",
        units[1].unit.unit_id
    );
    assert!(
        units[1]
            .unit
            .unit_id
            .as_str()
            .starts_with(units[0].unit.unit_id.as_str())
    );
    assert_reread(&spec, src, &units);
}

#[test]
fn elements_at_a_path_are_units_with_ids_from_their_place_or_their_key() {
    let src = br#"[
 {"number": 7, "events": [{"id": "e1", "message": "disk full"}, {"id": "e2", "message": "retry"}]},
 {"number": 8, "events": []},
 {"number": 9, "events": "none"},
 {"number": 10, "events": [{"id": "e1", "message": "other"}]}
]"#;
    let spec = inner_spec(Some("number"), &[], Some(".events[].message"));
    let (units, rejected, coverage) =
        partition_all(&spec, src, PartitionOptions::default()).expect("partitions");
    let ids: Vec<&str> = units.iter().map(|u| u.unit.unit_id.as_str()).collect();
    assert_eq!(
        ids,
        [
            "7.events[0].message",
            "7.events[1].message",
            "10.events[0].message"
        ]
    );
    // A string element is held under the field the path ends in.
    assert_eq!(units[0].value, serde_json::json!({"message": "disk full"}));
    // A record the path cannot enter is one rejection, named and placed,
    // and so is one whose array is empty: no record goes unaccounted for.
    assert_eq!(rejected.len(), 2);
    assert_eq!(rejected[0].reason, "empty_path");
    assert!(
        rejected[0]
            .detail
            .contains("has no element at .events[].message"),
        "{}",
        rejected[0].detail
    );
    let rejected = &rejected[1..];
    assert_eq!(rejected[0].reason, "missing_path");
    assert!(
        rejected[0]
            .detail
            .contains("cannot be split by .events[].message: no array at `.events`"),
        "{}",
        rejected[0].detail
    );
    assert_eq!(coverage.elements, 5, "three elements and two rejections");
    assert!(coverage.is_complete(), "{coverage:?}");
    assert_reread(&spec, src, &units);

    // Ids from the elements' own key: a repeat with other content is a
    // duplicate, worded like any other.
    let spec = PartitionSpec::JsonArray {
        key: Some("number".into()),
        kind: "event".into(),
        unit_fields: Vec::new(),
        path: Some(".events[]".into()),
        element_key: Some("id".into()),
    };
    let (units, rejected, coverage) =
        partition_all(&spec, src, PartitionOptions::default()).expect("partitions");
    let ids: Vec<&str> = units.iter().map(|u| u.unit.unit_id.as_str()).collect();
    assert_eq!(ids, ["e1", "e2"]);
    let reasons: Vec<&str> = rejected.iter().map(|r| r.reason.as_str()).collect();
    assert_eq!(reasons, ["empty_path", "missing_path", "duplicate_key"]);
    assert!(
        rejected[2].detail.contains("repeats id = e1 of element 0"),
        "{}",
        rejected[2].detail
    );
    assert!(coverage.is_complete(), "{coverage:?}");
    assert_reread(&spec, src, &units);
}

#[test]
fn a_top_level_object_is_one_record_whose_elements_are_named_by_place() {
    let src = br#"{"total": 2, "items": [{"name": "a"}, {"name": "b", "tags": ["x"]}]}"#;
    let spec = inner_spec(None, &[], Some(".items[]"));
    let (units, rejected, coverage) =
        partition_all(&spec, src, PartitionOptions::default()).expect("partitions");
    let ids: Vec<&str> = units.iter().map(|u| u.unit.unit_id.as_str()).collect();
    assert_eq!(ids, ["items[0]", "items[1]"]);
    assert!(rejected.is_empty());
    assert_eq!(coverage.elements, 2);
    assert_reread(&spec, src, &units);
    // Nested twice.
    let spec = inner_spec(None, &[], Some(".items[].tags[]"));
    let (units, _, _) = partition_all(&spec, src, PartitionOptions::default()).expect("ok");
    assert!(
        units.is_empty(),
        "the first item has no tags: one rejection"
    );
}

#[test]
fn paths_and_settings_that_cannot_split_a_record_are_refused() {
    for (path, needle) in [
        (".events", "has no `[]`"),
        ("events[]", "cannot read"),
        (".events[].", "without a field name"),
    ] {
        let e = UnitPath::parse(path).expect_err(path);
        assert!(e.contains(needle), "{path}: {e}");
    }
    let spec = inner_spec(Some("number"), &["body"], Some(".events[]"));
    let e = partition_all(&spec, b"[]", PartitionOptions::default()).expect_err("refused");
    assert!(e.to_string().contains("cannot go together"), "{e}");
}

#[test]
fn identical_records_without_a_key_read_back_each_of_their_pieces() {
    let src = br#"[{"title": "t", "body": "b", "events": [1]}, {"title": "t", "body": "b", "events": [1]}]"#;
    for spec in [
        inner_spec(None, &["body"], None),
        inner_spec(None, &[], Some(".events[]")),
    ] {
        let (units, rejected, coverage) =
            partition_all(&spec, src, PartitionOptions::default()).expect("partitions");
        assert!(rejected.is_empty());
        assert!(coverage.is_complete(), "{coverage:?}");
        // The second record's pieces are numbered, and read back.
        assert!(
            units
                .iter()
                .any(|u| u.unit.unit_id.as_str().ends_with("-2")),
            "{:?}",
            units
                .iter()
                .map(|u| u.unit.unit_id.as_str())
                .collect::<Vec<_>>()
        );
        assert_reread(&spec, src, &units);
    }
}
