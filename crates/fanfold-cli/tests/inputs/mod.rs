//! Reading inputs: partitions, input commands, malformed and hostile
//! records, and the ids people can read.

use super::*;

mod fields;
mod nested;

#[test]
fn stdin_and_command_inputs_share_the_artifact() {
    let f = Fixture::new(JSON_ARRAY, "");
    let data = br#"[{"id": 1, "flag": true}, {"id": 2, "flag": false}]"#;
    f.input(data);
    let mut child = bin()
        .arg("run")
        .arg(f.path("spec.toml"))
        .args(["--input", "-", "--json", "--store"])
        .arg(f.path("store.sqlite"))
        .arg("--out")
        .arg(f.path("out"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn");
    use std::io::Write;
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(data)
        .expect("write");
    let o = child.wait_with_output().expect("wait");
    assert!(o.status.success());
    let from_stdin = f.certificate()["source_hash"].clone();
    assert_eq!(f.answer_ids(), ["1"]);
    let cmd = format!("cat {}", f.path("input.data").display());
    let o = f.run(&["--input-command", &cmd]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(f.certificate()["source_hash"], from_stdin);
    assert_eq!(f.certificate()["stats"]["model_calls"], 0);
}

#[test]
fn input_command_is_split_by_shell_quoting_without_a_shell() {
    let f = Fixture::new(JSON_ARRAY, "");
    let data = r#"[{"id": 1, "flag": true}, {"id": 2, "flag": false}]"#;
    f.input(data.as_bytes());
    assert!(f.run(&[]).status.success());
    let from_file = f.certificate()["source_hash"].clone();
    // printf echoes the JSON unchanged only if the single-quoted text, spaces
    // and double quotes included, reaches it as one argument.
    let cmd = format!("printf %s '{data}'");
    let o = f.run(&["--input-command", &cmd]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(f.certificate()["source_hash"], from_file);
    assert_eq!(f.answer_ids(), ["1"]);
    let facts = f.fact_count();
    let o = f.run(&["--input-command", "printf %s '[1, 2]"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("unclosed quote"), "{}", stderr(&o));
    assert_eq!(f.fact_count(), facts);
}

#[test]
fn bad_inputs_fail_clearly_and_keep_the_store() {
    let f = Fixture::new(JSON_ARRAY, "");
    f.input(br#"[{"id": 1, "flag": true}]"#);
    assert!(f.run(&[]).status.success());
    let facts_before = f.fact_count();
    assert_eq!(facts_before, 1);

    let cases: Vec<(&[u8], &str)> = vec![
        (b"[{\"id\": 1},\n {\"id\": 2,, }]", "malformed JSON at byte"),
        (
            b"[{\"id\": 1, \"t\": \"caf\xe9\"}]",
            "invalid UTF-8 at byte 20",
        ),
        (b"", "the input is empty"),
        (b"{\"id\": 1}", "expected a JSON array"),
        (b"[{\"id\": 1}, {\"id\": 2}", "truncated"),
    ];
    for (input, expect) in cases {
        f.input(input);
        let o = f.run(&[]);
        // 5: the input is at fault.
        assert_eq!(o.status.code(), Some(5), "{expect}");
        let err = stderr(&o);
        assert!(err.contains(expect), "expected {expect:?} in {err}");
        assert!(
            err.contains("input.data"),
            "the error names the file: {err}"
        );
        assert_eq!(f.fact_count(), facts_before, "nothing stored is lost");
    }
}

/// A quote opened and never closed would swallow the rows after it; the
/// row is rejected, named where it opened, and the rows after it are read.
#[test]
fn an_unterminated_csv_quote_is_named_as_one() {
    let f = Fixture::new(r#"{ type = "csv", key = "id", kind = "row" }"#, "");
    f.input(b"id,text,flag\n1,fine,true\n2,\"never closed,false\n3,x,true\n4,y,false\n");
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(3));
    let err = stderr(&o);
    assert!(
        err.contains("element 1 at byte 25 (line 3)") && err.contains("never closed"),
        "{err}"
    );
    assert_eq!(f.answer_ids(), ["1", "3"]);
}

#[test]
fn ragged_csv_names_the_line() {
    let f = Fixture::new(r#"{ type = "csv", key = "id", kind = "row" }"#, "");
    f.input(b"id,flag\n1,true\n2,false,extra\n");
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(5));
    let err = stderr(&o);
    assert!(
        err.contains("malformed CSV at byte 15 (line 3)") && err.contains("3 fields"),
        "{err}"
    );
}

#[test]
fn duplicate_ids_and_huge_records_are_reported_not_lost() {
    let f = Fixture::new(JSON_ARRAY, "");
    let huge = "x".repeat(50 * 1024 * 1024);
    let input = format!(
        r#"[{{"id": 1, "flag": true}}, {{"id": 1, "flag": false}}, {{"id": 3, "body": "{huge}"}}, {{"id": 4, "flag": true}}]"#
    );
    f.input(input.as_bytes());
    let o = f.run(&[]);
    // The huge record and the repeat were never judged: the answer says
    // it is incomplete.
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let c = f.certificate();
    assert_eq!(c["complete"], false);
    assert!(
        c["incomplete"][0]
            .as_str()
            .is_some_and(|s| s.contains("2 of 4 input elements were rejected")),
        "{}",
        c["incomplete"]
    );
    assert_eq!(c["coverage"]["elements"], 4);
    assert_eq!(c["coverage"]["units"], 2);
    assert_eq!(c["rejected_by_reason"]["duplicate_key"], 1);
    assert_eq!(c["rejected_by_reason"]["too_large"], 1);
    assert_eq!(c["coverage_complete"], true);
    assert_eq!(f.answer_ids(), ["1", "4"]);
    assert!(stderr(&o).contains("repeats id = 1"), "{}", stderr(&o));
}

/// Multi-line log records, written here, so the check runs on any clone.
#[test]
fn multi_line_log_records_keep_their_lines() {
    let mut log = String::new();
    for i in 0..50 {
        log.push_str(&format!("2025-01-01T00:00:{i:02} ERROR job {i} failed\n"));
        log.push_str("  at worker.rs:10\r\n  at main.rs:3\n");
        log.push_str(&format!("2025-01-01T00:01:{i:02} INFO job {i} ok\n"));
    }
    let extra =
        "[[prefilter]]\nname = \"info\"\nwhen = '.text | test(\"INFO\")'\naction = \"exclude\"\n";
    let f = Fixture::new(
        r#"{ type = "lines", kind = "log", record_start = "^\\d{4}-" }"#,
        extra,
    );
    f.input(log.as_bytes());
    let o = f.run(&[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let c = f.certificate();
    assert_eq!(c["coverage"]["elements"].as_u64(), Some(100));
    assert_eq!(c["routed_by_stage"]["judge"].as_u64(), Some(50));
    // Read back by byte range, the multi-line units hash as partitioned.
    assert_eq!(c["verify"]["hash_mismatches"], serde_json::json!([]));
    assert_eq!(c["complete"], true);
}

/// Log lines in the shape of loghub's BGL logs: a label first ("-" for a
/// normal line, the alert type otherwise), then epoch, date, node, time and
/// the message. Every line is a unit, and a jq rule on the label routes
/// only the alerts to the model.
#[test]
fn log_lines_partition_with_full_coverage() {
    let alerts = ["KERNDTLB", "APPREAD", "KERNSTOR", "KERNMNTF"];
    let mut bytes = Vec::new();
    let mut expected_alerts = 0u64;
    for i in 0..2000u64 {
        let node = format!("R{:02}-M{}-N{}-C:J{:02}-U11", i % 64, i % 2, i % 16, i % 18);
        let (label, message) = if i % 14 == 3 {
            expected_alerts += 1;
            let label = alerts[(i as usize / 14) % alerts.len()];
            (label, "RAS KERNEL FATAL data TLB error interrupt")
        } else {
            (
                "-",
                "RAS KERNEL INFO instruction cache parity error corrected",
            )
        };
        let epoch = 1_117_838_570 + i;
        bytes.extend_from_slice(
            format!(
                "{label} {epoch} 2005.06.03 {node} 2005-06-03-15.42.50.{i:06} {node} {message}\n"
            )
            .as_bytes(),
        );
    }
    let extra = "[[prefilter]]\nname = \"normal\"\nwhen = '.text | startswith(\"-\")'\naction = \"exclude\"\n";
    let f = Fixture::new(r#"{ type = "lines", kind = "log_line" }"#, extra);
    f.input(&bytes);
    let o = f.run(&[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let c = f.certificate();
    assert_eq!(c["coverage"]["elements"].as_u64(), Some(2000));
    assert_eq!(c["coverage_complete"], true);
    assert_eq!(
        c["routed_by_stage"]["judge"].as_u64(),
        Some(expected_alerts)
    );
}

/// Repeated string keys in JSONL are found exactly through the store, and
/// the first occurrence is kept.
#[test]
fn repeated_string_keys_in_jsonl_are_rejected() {
    let f = Fixture::new(r#"{ type = "jsonl", key = "id", kind = "row" }"#, "");
    f.input(
        b"{\"id\": \"a\", \"flag\": true}\n{\"id\": \"b\", \"flag\": true}\n{\"id\": \"a\", \"flag\": false}\n",
    );
    let o = f.run(&[]);
    // The first occurrence is judged, the repeat is a record nobody
    // judged: the answer is incomplete and says so.
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let c = f.certificate();
    assert_eq!(c["coverage"]["units"].as_u64(), Some(2));
    assert_eq!(c["rejected_by_reason"]["duplicate_key"].as_u64(), Some(1));
    assert_eq!(f.answer_ids(), ["a", "b"]);
    // The same input again: the stored partition does not make every unit
    // look like a repeat of itself.
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert_eq!(f.certificate()["coverage"]["units"].as_u64(), Some(2));
}

/// `1` and `"1"` are one key: the second record is rejected, named with the
/// reason, and the answer is incomplete, as for any record nobody judged.
#[test]
fn a_number_and_its_string_are_one_key_and_the_repeat_is_not_judged() {
    let f = Fixture::new(JSON_ARRAY, "");
    f.input(br#"[{"id": 1, "flag": true}, {"id": "1", "flag": false}, {"id": 2, "flag": true}]"#);
    let o = f.run(&[]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(err.contains("repeats id = 1"), "{err}");
    assert!(err.contains(r#"1 and "1" are one id"#), "{err}");
    let c = f.certificate();
    assert_eq!(c["complete"], false);
    assert_eq!(c["rejected_by_reason"]["duplicate_key"].as_u64(), Some(1));
    let answer = std::fs::read_to_string(f.path("out/answer.md")).expect("answer");
    assert!(answer.starts_with("# INCOMPLETE"), "{answer}");
}

#[test]
fn one_bad_record_is_a_rejection_not_the_end_of_the_run() {
    // `gh` found nothing: an empty, whole answer.
    let f = Fixture::new(JSON_ARRAY, "");
    f.input(b"[]\n");
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(f.certificate()["complete"], true);
    assert!(f.answer_ids().is_empty());

    // A byte order mark is not data, in either JSON format.
    f.input(b"\xEF\xBB\xBF[{\"id\": 1, \"flag\": true}]");
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(f.answer_ids(), ["1"]);
    let jsonl = Fixture::new(r#"{ type = "jsonl", key = "id", kind = "row" }"#, "");
    jsonl.input(b"\xEF\xBB\xBF{\"id\": 1, \"flag\": true}\n{\"id\": 2, \"flag\": false}\n");
    let o = jsonl.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(jsonl.answer_ids(), ["1"]);
    assert_eq!(jsonl.certificate()["verify"]["passed"], true);

    // A cut-off last line: that record is rejected, the others judged.
    jsonl.input(b"{\"id\": 1, \"flag\": true}\n{\"id\": 3, \"flag\": true}\n{\"id\": 2, \"fl");
    let o = jsonl.run(&[]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let c = jsonl.certificate();
    assert_eq!(c["rejected_by_reason"]["truncated_line"], 1, "{c}");
    assert_eq!(jsonl.answer_ids(), ["1", "3"]);

    // A line that is not JSON in the middle: that record is rejected with
    // its line and byte, and the records after it are judged.
    jsonl.input(
        b"{\"id\": 1, \"flag\": true}\n{\"id\": 2,, \"flag\": true}\n{\"id\": 3, \"flag\": true}\n",
    );
    let o = jsonl.run(&[]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(3), "{err}");
    let c = jsonl.certificate();
    assert_eq!(c["rejected_by_reason"]["malformed_line"], 1, "{c}");
    assert!(err.contains("(line 2) is not JSON"), "{err}");
    assert!(err.contains("at byte 33"), "{err}");
    assert_eq!(jsonl.answer_ids(), ["1", "3"]);

    // Valid JSON nested past the parser's limit: that record is rejected.
    let mut deep = String::from(r#"{"id": 2, "flag": true, "n": "#);
    deep.push_str(&"[".repeat(200));
    deep.push_str(&"]".repeat(200));
    deep.push('}');
    f.input(
        format!(r#"[{{"id": 1, "flag": true}}, {deep}, {{"id": 3, "flag": true}}]"#).as_bytes(),
    );
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let c = f.certificate();
    assert_eq!(c["rejected_by_reason"]["too_deep"], 1, "{c}");
    assert_eq!(f.answer_ids(), ["1", "3"]);
    // The same record as a JSON line.
    jsonl.input(
        format!("{{\"id\": 1, \"flag\": true}}\n{deep}\n{{\"id\": 3, \"flag\": true}}\n")
            .as_bytes(),
    );
    let o = jsonl.run(&[]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let c = jsonl.certificate();
    assert_eq!(c["rejected_by_reason"]["too_deep"], 1, "{c}");
    assert!(
        c.to_string()
            .contains("(line 2) is nested more than 128 levels deep"),
        "{c}"
    );
    assert_eq!(jsonl.answer_ids(), ["1", "3"]);
}

#[test]
fn a_hung_input_command_is_stopped_at_its_limit() {
    let f = Fixture::new(JSON_ARRAY, "");
    let o = f.run(&["--input-command", "sleep 600", "--input-timeout-secs", "1"]);
    assert_eq!(o.status.code(), Some(5), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("ran past its 1 s limit"),
        "{}",
        stderr(&o)
    );
}

/// jq cannot be interrupted, so a program that never answers ends the run
/// with an error naming the program, where it runs and the unit, at the
/// time limit (or the spec's wall budget, when that is shorter).
#[test]
fn a_runaway_jq_program_ends_the_run_naming_it() {
    let cases = [
        (
            "[[prefilter]]\nname = \"spin\"\nwhen = 'def f: f; f'\naction = \"exclude\"\nreason = \"x\"\n",
            "prefilter rule `spin`",
            vec!["--jq-timeout-secs", "1"],
        ),
        (
            "[budget]\nmax_wall_secs = 1\n",
            "the `project` of stage `judge`",
            vec![],
        ),
        (
            "[[prefilter]]\nname = \"hog\"\nwhen = '[repeat(\"xxxxxxxx\")] | length > 0'\naction = \"exclude\"\nreason = \"x\"\n",
            "prefilter rule `hog`",
            vec!["--jq-memory-mib", "64", "--jq-timeout-secs", "600"],
        ),
    ];
    for (extra, site, flags) in cases {
        let f = Fixture::new(JSON_ARRAY, extra);
        if site.contains("project") {
            let spec = std::fs::read_to_string(f.path("spec.toml")).expect("spec");
            std::fs::write(
                f.path("spec.toml"),
                spec.replacen(
                    "version = 1",
                    "version = 1\nproject = 'repeat(.) | select(false)'",
                    1,
                ),
            )
            .expect("spec");
        }
        f.input(&flagged_rows(5));
        let o = run_within(
            bin()
                .arg("run")
                .arg(f.path("spec.toml"))
                .arg("--store")
                .arg(f.path("store.sqlite"))
                .arg("--out")
                .arg(f.path("out"))
                .args(&flags),
            std::time::Duration::from_secs(60),
        );
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(5), "{err}");
        assert!(err.contains(site), "{site}: {err}");
        assert!(err.contains(") on unit "), "{err}");
        assert!(err.contains("cannot be interrupted"), "{err}");
        if flags.contains(&"--jq-memory-mib") {
            assert!(err.contains("holds more than 64 MiB"), "{err}");
        }
        // The store is left as a kill leaves it: consistent.
        let store = fanfold_store::Store::open(&f.path("store.sqlite")).expect("store");
        assert!(store.count_facts().is_ok());
    }
}

/// A record whose id people could not read as stored (a NUL, a
/// right-to-left override, nothing at all) is rejected with its reason,
/// never shown: the answer says it is incomplete.
#[test]
fn ids_people_cannot_read_as_stored_are_rejected_not_shown() {
    let f = Fixture::new(JSON_ARRAY, "");
    f.input(
        br#"[{"id": "a\u0000b", "flag": true}, {"id": "evil\u202Etxt", "flag": true}, {"id": "", "flag": true}, {"id": "ok", "flag": true}]"#,
    );
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert_eq!(f.answer_ids(), ["ok"]);
    let cert = f.certificate();
    assert_eq!(cert["rejected_by_reason"]["bad_key"], 3, "{cert}");
    let md = std::fs::read_to_string(f.path("out/answer.md")).expect("answer.md");
    assert!(!md.contains('\u{202E}') && !md.contains('\u{0}'), "{md}");
}
