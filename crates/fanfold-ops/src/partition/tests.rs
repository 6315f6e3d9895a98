use super::*;

fn json_array_spec() -> PartitionSpec {
    PartitionSpec::JsonArray {
        key: Some("number".into()),
        kind: "issue".into(),
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
            rejected: 0
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
    let src = br#"[{"number": 1}, {"number": 1}, {"title": "no key"}]"#;
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

/// Only a short row that runs on to the end of the input is called an
/// unclosed quote; a closed field over two lines in a short row is a
/// count of fields.
#[test]
fn an_unclosed_csv_quote_is_told_from_a_short_multi_line_row() {
    let spec = PartitionSpec::Csv {
        key: Some("id".into()),
        kind: "row".into(),
        delimiter: None,
    };
    let open = b"id,title,body\n1,a,b\n2,\"open,x\n3,a,b\n4,c,d\n";
    let err = partition_all(&spec, open, PartitionOptions::default()).expect_err("fails");
    assert!(err.to_string().contains("never closed"), "{err}");
    assert!(err.to_string().contains("(line 3)"), "{err}");
    let closed = b"id,title,body\n1,\"two\nlines\"\n2,a,b\n";
    let err = partition_all(&spec, closed, PartitionOptions::default()).expect_err("fails");
    let shown = err.to_string();
    assert!(
        !shown.contains("never closed") && shown.contains("2 fields"),
        "{shown}"
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
