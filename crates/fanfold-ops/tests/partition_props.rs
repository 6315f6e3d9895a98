//! Properties of the partitioners over generated sources: valid records of
//! every format, and the same records damaged (flipped bytes, truncation,
//! NUL, invalid UTF-8, lone surrogate escapes, out-of-range numbers, a BOM,
//! RTL overrides, deep nesting).
//!
//! - Any input gives units or an error value, never a panic.
//! - Every error that comes from the input's bytes names the byte offset and
//!   line it is at (`at byte N (line L)`), and they are the right ones.
//! - A partition that succeeds covers its source: units and rejections have
//!   ordinals `0..elements`, ranges inside the input that do not overlap,
//!   unique ids derived as documented, hashes of their own values, and bytes
//!   that read back to those values.
//! - Partitioning is deterministic, and appending a record keeps the ids and
//!   hashes of the units before it.
//! - Where one format has several paths (JSONL in one chunk or many, on one
//!   thread or several; `stream` and `partition_all`) they agree, and JSONL
//!   agrees with a JSON array of the same records.

// A failed step should fail the test loudly, right there.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::collections::HashSet;

use fanfold_core::spec::PartitionSpec;
use fanfold_core::{ByteRange, ContentHash, Unit};
use fanfold_ops::partition::{
    self, Coverage, DEFAULT_MAX_UNIT_BYTES, PartUnit, PartitionError, PartitionOptions, Rejection,
    Repeat, SeenKeys, StreamOptions, Streamed, UnitView, jsonl,
};
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::TestCaseError;
use serde_json::Value;

const BOM: &[u8] = b"\xEF\xBB\xBF";
const CASES: u32 = 256;

// ---------------------------------------------------------------- specs

fn jsonl(keyed: bool) -> PartitionSpec {
    PartitionSpec::Jsonl {
        key: keyed.then(|| "id".to_owned()),
        kind: "event".into(),
    }
}

fn json_array(keyed: bool) -> PartitionSpec {
    PartitionSpec::JsonArray {
        key: keyed.then(|| "id".to_owned()),
        kind: "event".into(),
        unit_fields: Vec::new(),
        path: None,
        element_key: None,
    }
}

fn csv(keyed: bool) -> PartitionSpec {
    PartitionSpec::Csv {
        key: keyed.then(|| "id".to_owned()),
        kind: "row".into(),
        delimiter: None,
    }
}

fn log_lines(grouped: bool) -> PartitionSpec {
    PartitionSpec::Lines {
        record_start: grouped.then(|| r"^\d{4}-".to_owned()),
        kind: "log".into(),
    }
}

fn key_of(spec: &PartitionSpec) -> Option<&str> {
    match spec {
        PartitionSpec::JsonArray { key, .. }
        | PartitionSpec::Jsonl { key, .. }
        | PartitionSpec::Csv { key, .. } => key.as_deref(),
        _ => None,
    }
}

/// The default unit limit, or one small enough that some records exceed it.
fn options() -> impl Strategy<Value = PartitionOptions> {
    prop_oneof![3 => Just(DEFAULT_MAX_UNIT_BYTES), 1 => Just(48u64)]
        .prop_map(|max_unit_bytes| PartitionOptions { max_unit_bytes })
}

// ---------------------------------------------------------- generators

fn pick(items: &[&'static str]) -> impl Strategy<Value = String> + use<> {
    prop::sample::select(items.to_vec()).prop_map(str::to_owned)
}

fn json_number() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<i64>().prop_map(|n| n.to_string()),
        any::<f64>()
            .prop_filter("JSON has no NaN or infinity", |f| f.is_finite())
            .prop_map(|f| serde_json::to_string(&f).unwrap()),
        pick(&[
            "0",
            "-0",
            "-0.0",
            "0.1",
            "1.5",
            "2.5E-3",
            "1e308",
            "-1e308",
            "4.9e-324",
            "18446744073709551615",
            "18446744073709551616",
            "-9223372036854775808",
            "123456789012345678901234567890",
        ]),
    ]
}

fn json_string() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-zA-Z0-9 ,:{}\\[\\]]{0,10}".prop_map(|s| format!("\"{s}\"")),
        pick(&[
            r#""caf\u00e9""#,
            r#""\ud83d\ude00""#,
            "\"\u{202E}gnp.exe\"",
            r#""q \"x\" \\ \/ \b\f\n\r\t""#,
            "\"\u{FEFF}bom\"",
            "\"日本語\"",
            "\"\"",
            r#""\u0000""#,
            r#""\u2028""#,
        ]),
    ]
}

/// Object keys, few enough to repeat; `\u0061` is `a` spelled differently.
fn field_key() -> impl Strategy<Value = String> {
    pick(&[
        r#""a""#,
        r#""b""#,
        r#""\u0061""#,
        r#""id""#,
        "\"\u{202E}\"",
        r#""""#,
    ])
}

fn object(fields: &[(String, String)]) -> String {
    let body: Vec<String> = fields.iter().map(|(k, v)| format!("{k}: {v}")).collect();
    format!("{{{}}}", body.join(", "))
}

fn json_value() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        pick(&["null", "true", "false"]),
        json_number(),
        json_string(),
    ];
    leaf.prop_recursive(4, 32, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4)
                .prop_map(|items| format!("[{}]", items.join(","))),
            prop::collection::vec((field_key(), inner), 0..4).prop_map(|f| object(&f)),
        ]
    })
}

/// An `id` field's value: small integers (so ids repeat), strings, other
/// scalars, non-scalars, or no field at all.
fn id_value() -> impl Strategy<Value = Option<String>> {
    prop_oneof![
        4 => (0u8..8).prop_map(|n| Some(n.to_string())),
        2 => pick(&[
            r#""x-1""#,
            r#""\u0031""#,
            "\"\u{202E}1\"",
            "true",
            "1.5",
            "-3",
            "1e2",
            r#""""#,
            "null",
            "{}",
            "[1]",
        ])
        .prop_map(Some),
        1 => Just(None),
    ]
}

/// One JSON record on one line: mostly an object with an `id`, sometimes
/// any value, sometimes nested around the parser's depth limit.
fn record() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => (id_value(), prop::collection::vec((field_key(), json_value()), 0..3)).prop_map(
            |(id, mut fields)| {
                if let Some(id) = id {
                    fields.insert(0, (r#""id""#.to_owned(), id));
                }
                object(&fields)
            }
        ),
        1 => json_value(),
        1 => (110usize..140).prop_map(|depth| {
            format!(
                r#"{{"id": {depth}, "deep": {}1{}}}"#,
                "[".repeat(depth),
                "]".repeat(depth)
            )
        }),
    ]
}

/// A valid JSONL source and its number of records.
fn jsonl_source() -> impl Strategy<Value = (Vec<u8>, u64)> {
    (
        prop::collection::vec(
            (
                record(),
                pick(&["\n", "\r\n", "\n\n", "\n \t\n", "\r\n\r\n"]),
            ),
            1..8,
        ),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(lines, final_end, bom)| {
            let mut src = if bom { BOM.to_vec() } else { Vec::new() };
            let n = lines.len();
            for (i, (line, end)) in lines.iter().enumerate() {
                src.extend_from_slice(line.as_bytes());
                if i + 1 < n || final_end {
                    src.extend_from_slice(end.as_bytes());
                }
            }
            (src, n as u64)
        })
}

/// A valid JSON array source and its number of elements.
fn json_array_source() -> impl Strategy<Value = (Vec<u8>, u64)> {
    (
        prop::collection::vec(record(), 0..8),
        pick(&[",", ", ", ",\n  ", "\r\n,"]),
        any::<bool>(),
    )
        .prop_map(|(records, sep, bom)| {
            let mut src = if bom { BOM.to_vec() } else { Vec::new() };
            src.extend_from_slice(format!("[{}]\n", records.join(&sep)).as_bytes());
            (src, records.len() as u64)
        })
}

fn csv_field() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z0-9 ]{0,6}",
        pick(&[
            r#""a, b""#,
            "\"two\nlines\"",
            "\"two\r\nlines\"",
            r#""say ""hi""""#,
            "\u{202E}gnp.exe",
            "caf\u{e9}",
            r#""""#,
            "\u{FEFF}x",
        ]),
    ]
}

/// A valid CSV source (header `id,name,note`) and its number of rows.
fn csv_source() -> impl Strategy<Value = (Vec<u8>, u64)> {
    let id = prop_oneof![
        (0u8..6).prop_map(|n| n.to_string()),
        Just(String::new()),
        Just(r#""7""#.to_owned()),
    ];
    (
        prop::collection::vec((id, csv_field(), csv_field()), 1..8),
        pick(&["\n", "\r\n"]),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(rows, end, final_end, bom)| {
            let mut src = if bom { BOM.to_vec() } else { Vec::new() };
            src.extend_from_slice(b"id,name,note");
            for (id, name, note) in &rows {
                src.extend_from_slice(end.as_bytes());
                src.extend_from_slice(format!("{id},{name},{note}").as_bytes());
            }
            if final_end {
                src.extend_from_slice(end.as_bytes());
            }
            (src, rows.len() as u64)
        })
}

fn log_line() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => "2024-0[1-9]-[0-2][1-9] (INFO|WARN|ERROR) [a-z ]{0,12}",
        2 => "  at [a-z]{1,6}\\.rs:[0-9]{1,3}",
        2 => pick(&[
            "",
            "   ",
            "\u{202E}desrever",
            "\u{FEFF}bom",
            "caf\u{e9} \t tab",
            "Caused by: x",
        ]),
    ]
}

/// A valid log source (its records are counted by [`log_records`]).
fn log_source() -> impl Strategy<Value = Vec<u8>> {
    (
        prop::collection::vec(log_line(), 1..10),
        pick(&["\n", "\r\n"]),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(lines, end, final_end, bom)| {
            let mut src = if bom { BOM.to_vec() } else { Vec::new() };
            src.extend_from_slice(lines.join(&end).as_bytes());
            if final_end {
                src.extend_from_slice(end.as_bytes());
            }
            src
        })
}

/// The records in a valid log source: with `record_start`, the first line
/// and each later line that starts one; without, the non-blank lines.
fn log_records(src: &[u8], grouped: bool) -> u64 {
    let text = std::str::from_utf8(src).unwrap();
    let mut lines: Vec<&str> = text.split('\n').map(|l| l.trim_end_matches('\r')).collect();
    if text.is_empty() || text.ends_with('\n') {
        lines.pop();
    }
    let starts = |l: &&&str| {
        let b = l.as_bytes();
        b.len() >= 5 && b[..4].iter().all(u8::is_ascii_digit) && b[4] == b'-'
    };
    if grouped {
        lines.iter().skip(1).filter(starts).count() as u64 + u64::from(!lines.is_empty())
    } else {
        lines.iter().filter(|l| !l.trim().is_empty()).count() as u64
    }
}

/// A way to damage a source.
#[derive(Clone, Debug)]
enum Mutation {
    Flip(Index, u8),
    Truncate(Index),
    Insert(Index, Vec<u8>),
    PrependBom,
}

fn snippets() -> Vec<Vec<u8>> {
    let mut s: Vec<Vec<u8>> = [
        &b"\0"[..],
        b"\xff",
        b"\xc3",
        b"\xed\xa0\x80",
        b"\xf4\x90\x80\x80",
        b"\xc0\xaf",
        br"\ud800",
        br#""\ud800""#,
        br#""\udc00\ud800""#,
        b"1e999",
        b"-1e999",
        b"1E400",
        BOM,
        "\u{202E}".as_bytes(),
        b"\r",
        b"\n",
        b"\r\n",
        b"\"",
        b",",
        b":",
        b"{",
        b"}",
        b"[",
        b"]",
        b"\\",
        br"\u",
        b" ",
        b"\x0c",
        b"\t",
        b"2024-01-01 ",
        b"\"\"",
    ]
    .iter()
    .map(|s| s.to_vec())
    .collect();
    s.push(b"[".repeat(200));
    s.push(br#"{"a":"#.repeat(150));
    s
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<Index>(), 1u8..=255).prop_map(|(at, x)| Mutation::Flip(at, x)),
        any::<Index>().prop_map(Mutation::Truncate),
        (any::<Index>(), prop::sample::select(snippets()))
            .prop_map(|(at, bytes)| Mutation::Insert(at, bytes)),
        Just(Mutation::PrependBom),
    ]
}

fn apply(mut src: Vec<u8>, mutations: &[Mutation]) -> Vec<u8> {
    for m in mutations {
        match m {
            Mutation::Flip(at, x) => {
                if !src.is_empty() {
                    let i = at.index(src.len());
                    src[i] ^= x;
                }
            }
            Mutation::Truncate(at) => {
                let i = at.index(src.len() + 1);
                src.truncate(i);
            }
            Mutation::Insert(at, bytes) => {
                let i = at.index(src.len() + 1);
                src.splice(i..i, bytes.iter().copied());
            }
            Mutation::PrependBom => {
                src.splice(0..0, BOM.iter().copied());
            }
        }
    }
    src
}

/// A valid source, damaged a few times (or not at all).
fn damaged(valid: impl Strategy<Value = Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
    (valid, prop::collection::vec(mutation(), 0..4)).prop_map(|(src, m)| apply(src, &m))
}

/// Any format's spec with a damaged source of that format.
fn any_spec_and_source() -> impl Strategy<Value = (PartitionSpec, Vec<u8>)> {
    prop_oneof![
        (any::<bool>(), damaged(jsonl_source().prop_map(|s| s.0)))
            .prop_map(|(k, src)| (jsonl(k), src)),
        (
            any::<bool>(),
            damaged(json_array_source().prop_map(|s| s.0))
        )
            .prop_map(|(k, src)| (json_array(k), src)),
        (any::<bool>(), damaged(csv_source().prop_map(|s| s.0))).prop_map(|(k, src)| (csv(k), src)),
        (any::<bool>(), damaged(log_source())).prop_map(|(g, src)| (log_lines(g), src)),
    ]
}

// ------------------------------------------------------------- checks

type Parts = partition::Parts;

/// Units as descriptors, rejections, identical repeats, coverage; or the
/// error as shown.
type Flat = Result<(Vec<Unit>, Vec<Rejection>, Vec<Repeat>, Coverage), String>;

fn flat(result: &Result<Parts, PartitionError>) -> Flat {
    match result {
        Ok(p) => Ok((
            p.units.iter().map(|u| u.unit.clone()).collect(),
            p.rejections.clone(),
            p.repeats.clone(),
            p.coverage,
        )),
        Err(e) => Err(e.to_string()),
    }
}

/// The line `offset` is on, counting from 1.
fn line_of(src: &[u8], offset: u64) -> u64 {
    let end = (offset as usize).min(src.len());
    src[..end].iter().filter(|&&b| b == b'\n').count() as u64 + 1
}

/// Whether a source really holds nothing to partition.
fn holds_no_record(spec: &PartitionSpec, src: &[u8]) -> bool {
    let body = src.strip_prefix(BOM).unwrap_or(src);
    match spec {
        PartitionSpec::JsonArray { .. } | PartitionSpec::Jsonl { .. } => {
            body.iter().all(u8::is_ascii_whitespace)
        }
        PartitionSpec::Csv { .. } => csv::Reader::from_reader(src).records().next().is_none(),
        PartitionSpec::Lines {
            record_start: Some(_),
            ..
        } => src.is_empty(),
        PartitionSpec::Lines {
            record_start: None, ..
        } => std::str::from_utf8(src).is_ok_and(|s| s.trim().is_empty()),
        _ => src.is_empty(),
    }
}

/// An error from the input's bytes names the byte and line it is at, and
/// they are where the input has them; an empty input is the one error with
/// no place, and it must really be empty.
fn check_error(
    spec: &PartitionSpec,
    src: &[u8],
    err: &PartitionError,
) -> Result<(), TestCaseError> {
    let shown = err.to_string();
    match *err {
        PartitionError::Malformed { offset, line, .. }
        | PartitionError::NotUtf8 { offset, line } => {
            prop_assert!(
                shown.contains(&format!("at byte {offset} (line {line})")),
                "no place in {shown:?}"
            );
            prop_assert!(
                offset <= src.len() as u64,
                "{shown:?} points past the {}-byte input",
                src.len()
            );
            prop_assert_eq!(
                line,
                line_of(src, offset),
                "{:?} names the wrong line for its byte",
                shown
            );
        }
        PartitionError::Empty => {
            prop_assert!(
                holds_no_record(spec, src),
                "{shown:?} for a source with records"
            )
        }
        _ => prop_assert!(
            false,
            "{shown:?} is not an error an input's bytes can cause"
        ),
    }
    Ok(())
}

/// The id a unit must have: its key field's scalar, or `c` and 16 hex
/// digits of its hash, with `-N` from the second occurrence on.
fn check_id(spec: &PartitionSpec, u: &PartUnit) -> Result<(), TestCaseError> {
    let id = u.unit.unit_id.as_str();
    match key_of(spec) {
        Some(key) => {
            let want = match u.value.get(key) {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Number(n)) => n.to_string(),
                Some(Value::Bool(b)) => b.to_string(),
                other => return Err(TestCaseError::fail(format!("unit {id} has key {other:?}"))),
            };
            // An integer past 64 bits keeps its digits, which read as
            // the float `Value` holds.
            let big = matches!(u.value.get(key), Some(Value::Number(n)) if n.is_f64())
                && id
                    .trim_start_matches('-')
                    .bytes()
                    .all(|b| b.is_ascii_digit())
                && id.parse::<f64>().ok() == u.value.get(key).and_then(Value::as_f64);
            prop_assert!(id == want || big, "id {} for key {}", id, want);
        }
        None => {
            let base = format!("c{}", u.unit.unit_hash.short(16));
            let repeat = id
                .strip_prefix(&base)
                .and_then(|rest| rest.strip_prefix('-'))
                .and_then(|n| n.parse::<u64>().ok());
            prop_assert!(
                id == base || repeat.is_some_and(|n| n >= 2),
                "{id} is not derived from {base}"
            );
        }
    }
    Ok(())
}

/// A successful partition accounts for its source.
fn check_coverage(spec: &PartitionSpec, src: &[u8], parts: &Parts) -> Result<(), TestCaseError> {
    let Parts {
        units,
        rejections,
        repeats,
        coverage,
    } = parts;
    prop_assert_eq!(coverage.units, units.len() as u64);
    prop_assert_eq!(coverage.rejected, rejections.len() as u64);
    prop_assert_eq!(coverage.repeated_identical, repeats.len() as u64);
    prop_assert!(coverage.is_complete(), "{:?}", coverage);
    let mut placed: Vec<(u64, ByteRange)> = units
        .iter()
        .map(|u| (u.unit.ordinal, u.unit.bytes))
        .chain(rejections.iter().map(|r| (r.ordinal, r.bytes)))
        .chain(repeats.iter().map(|r| (r.ordinal, r.bytes)))
        .collect();
    placed.sort_by_key(|p| p.0);
    let ordinals: Vec<u64> = placed.iter().map(|p| p.0).collect();
    prop_assert_eq!(ordinals, (0..coverage.elements).collect::<Vec<_>>());
    let mut before = 0;
    for (ordinal, r) in &placed {
        prop_assert!(
            r.start <= r.end && r.end <= src.len() as u64,
            "element {ordinal} at {r:?} lies outside the {}-byte input",
            src.len()
        );
        prop_assert!(
            r.start >= before,
            "element {ordinal} at {r:?} overlaps the one before, which ends at {before}"
        );
        before = r.end;
    }
    for r in rejections {
        prop_assert!(
            [
                "duplicate_key",
                "bad_key",
                "missing_key",
                "too_large",
                "too_deep",
                "truncated_line",
                "malformed_line",
                "repeated_field",
                "unterminated_quote"
            ]
            .contains(&r.reason.as_str()),
            "unknown reason {:?}",
            r.reason
        );
    }
    let source_hash = ContentHash::of_bytes(src);
    let header = partition::csv_header(src, None);
    // The header is found as the CSV reader finds it, for every source.
    if matches!(spec, PartitionSpec::Csv { .. }) {
        prop_assert!(csv_header_is_right(src, header), "header {:?}", header);
    }
    let mut ids = HashSet::new();
    for u in units {
        let unit = &u.unit;
        prop_assert_eq!(unit.source_hash, source_hash);
        prop_assert_eq!(unit.unit_kind.as_str(), spec.kind());
        prop_assert_eq!(unit.unit_hash, partition::content_hash(spec, &u.value));
        prop_assert!(
            ids.insert(unit.unit_id.as_str()),
            "id {} given twice",
            unit.unit_id.as_str()
        );
        check_id(spec, u)?;
        let bytes = &src[unit.bytes.start as usize..unit.bytes.end as usize];
        let first_line = u.value.get("line").and_then(Value::as_u64).unwrap_or(0);
        let reread = partition::reread(spec, bytes, header, first_line, unit.unit_id.as_str());
        prop_assert!(
            matches!(&reread, Ok(v) if *v == u.value),
            "unit {} at {:?} reads back as {:?}, not {}",
            unit.unit_id.as_str(),
            unit.bytes,
            reread,
            u.value
        );
    }
    // A repeat reads back, from its own bytes, as the unit it names.
    for r in repeats {
        let first = units.iter().find(|u| u.unit.unit_id.as_str() == r.unit_id);
        prop_assert!(first.is_some(), "repeat of a unit {} not given", r.unit_id);
        let first = first.unwrap();
        prop_assert_eq!(
            (first.unit.ordinal, first.unit.bytes.start),
            (r.first_ordinal, r.first_byte)
        );
        prop_assert!(r.first_ordinal < r.ordinal);
        let bytes = &src[r.bytes.start as usize..r.bytes.end as usize];
        let value = partition::reread(spec, bytes, header, 0, &r.unit_id);
        prop_assert!(
            matches!(&value, Ok(v) if partition::content_hash(spec, v) == first.unit.unit_hash),
            "repeat {:?} reads back as {:?}, not as unit {}",
            r,
            value,
            r.unit_id
        );
    }
    Ok(())
}

/// Whether `header` ends where the CSV reader ends the header row (which
/// may be before the `\n` of a `\r\n`).
fn csv_header_is_right(src: &[u8], header: Option<&[u8]>) -> bool {
    match (header.map(<[u8]>::len), csv_reader_header_end(src)) {
        (Some(got), Some(end)) => got == end || (got == end + 1 && src[end] == b'\n'),
        (None, None) => true,
        _ => false,
    }
}

/// Where the CSV reader ends the header row.
fn csv_reader_header_end(src: &[u8]) -> Option<usize> {
    let mut rdr = csv::ReaderBuilder::new()
        .has_headers(false)
        .from_reader(src);
    let mut record = csv::ByteRecord::new();
    match rdr.read_byte_record(&mut record) {
        Ok(true) => Some(rdr.position().byte() as usize),
        _ => None,
    }
}

/// Partitions `src`, checks the result whichever it is, and returns it.
fn partition_checked(
    spec: &PartitionSpec,
    src: &[u8],
    options: PartitionOptions,
) -> Result<Result<Parts, PartitionError>, TestCaseError> {
    let result = partition::partition_parts(spec, src, options);
    match &result {
        Ok(parts) => check_coverage(spec, src, parts)?,
        Err(e) => check_error(spec, src, e)?,
    }
    Ok(result)
}

fn check_partition(
    spec: &PartitionSpec,
    src: &[u8],
    options: PartitionOptions,
) -> Result<(), TestCaseError> {
    partition_checked(spec, src, options).map(drop)
}

/// The JSONL scanner called directly, with its own threads and chunk size.
fn fast_path(
    spec: &PartitionSpec,
    src: &[u8],
    options: PartitionOptions,
    threads: usize,
    chunk_bytes: usize,
) -> (Flat, Vec<Vec<u8>>) {
    let mut units = Vec::new();
    let mut raws = Vec::new();
    let mut rejections = Vec::new();
    let mut repeats = Vec::new();
    let coverage = jsonl::partition_jsonl(
        key_of(spec),
        spec.kind(),
        ContentHash::of_bytes(src),
        src,
        jsonl::FastOptions {
            partition: options,
            threads,
            chunk_bytes,
        },
        &mut SeenKeys::default(),
        || |_: &str, _: &jsonl::Record| (),
        &mut |el| match el {
            jsonl::FastElement::Unit { unit, raw, .. } => {
                units.push(unit);
                raws.push(raw.to_vec());
            }
            jsonl::FastElement::Rejected(r) => rejections.push(r),
            jsonl::FastElement::Repeated(r) => repeats.push(r),
        },
    );
    let flat = coverage
        .map(|c| (units, rejections, repeats, c))
        .map_err(|e| e.to_string());
    (flat, raws)
}

/// The streaming entry point; each unit comes with its JSON text.
fn streamed(
    spec: &PartitionSpec,
    src: &[u8],
    options: PartitionOptions,
    threads: usize,
) -> (Flat, Vec<Vec<u8>>) {
    let mut units = Vec::new();
    let mut jsons = Vec::new();
    let mut rejections = Vec::new();
    let mut repeats = Vec::new();
    let coverage = partition::stream(
        spec,
        ContentHash::of_bytes(src),
        src,
        StreamOptions {
            partition: options,
            threads,
        },
        &mut SeenKeys::default(),
        || |_: &str, _: UnitView<'_>| (),
        &mut |el| match el {
            Streamed::Unit { unit, json, .. } => {
                units.push(unit);
                jsons.push(json.to_vec());
            }
            Streamed::Rejected(r) => rejections.push(r),
            Streamed::Repeated(r) => repeats.push(r),
        },
    );
    let flat = coverage
        .map(|c| (units, rejections, repeats, c))
        .map_err(|e| e.to_string());
    (flat, jsons)
}

/// Unit ids, hashes and byte ranges, in order.
fn id_hash_bytes(units: &[PartUnit]) -> Vec<(String, ContentHash, ByteRange)> {
    units
        .iter()
        .map(|u| (u.unit.unit_id.0.clone(), u.unit.unit_hash, u.unit.bytes))
        .collect()
}

/// Partitions `src`, then `src` with `line` appended as a last line, and
/// checks that the units and rejections before it did not change.
fn check_append_keeps_earlier_units(
    spec: &PartitionSpec,
    src: &[u8],
    line: &str,
    options: PartitionOptions,
) -> Result<(), TestCaseError> {
    let Ok((units, rejections, coverage)) = partition::partition_all(spec, src, options) else {
        return Ok(());
    };
    // A cut-off last line is only forgiven while it is last.
    if rejections.iter().any(|r| r.reason == "truncated_line") {
        return Ok(());
    }
    let mut longer = src.to_vec();
    if !longer.is_empty() && !longer.ends_with(b"\n") {
        longer.push(b'\n');
    }
    longer.extend_from_slice(line.as_bytes());
    longer.push(b'\n');
    let after = partition_checked(spec, &longer, options)?;
    let Parts {
        units: units_after,
        rejections: rejections_after,
        coverage: coverage_after,
        ..
    } = match after {
        Ok(parts) => parts,
        Err(e) => return Err(TestCaseError::fail(format!("appending {line:?}: {e}"))),
    };
    prop_assert_eq!(coverage_after.elements, coverage.elements + 1);
    let before = id_hash_bytes(&units);
    let now = id_hash_bytes(&units_after);
    prop_assert_eq!(&now[..before.len().min(now.len())], &before[..]);
    prop_assert_eq!(&rejections_after[..rejections.len()], &rejections[..]);
    Ok(())
}

// ---------------------------------------------------------- properties

proptest! {
    #![proptest_config(ProptestConfig {
        // A failure is kept as a named test below, not in a seed file.
        failure_persistence: None,
        ..ProptestConfig::with_cases(CASES)
    })]

    #[test]
    fn jsonl_input_partitions_or_fails_at_a_named_byte_and_line(
        keyed in any::<bool>(),
        src in damaged(jsonl_source().prop_map(|s| s.0)),
        options in options(),
    ) {
        check_partition(&jsonl(keyed), &src, options)?;
    }

    #[test]
    fn json_array_input_partitions_or_fails_at_a_named_byte_and_line(
        keyed in any::<bool>(),
        src in damaged(json_array_source().prop_map(|s| s.0)),
        options in options(),
    ) {
        check_partition(&json_array(keyed), &src, options)?;
    }

    #[test]
    fn csv_input_partitions_or_fails_at_a_named_byte_and_line(
        keyed in any::<bool>(),
        src in damaged(csv_source().prop_map(|s| s.0)),
        options in options(),
    ) {
        check_partition(&csv(keyed), &src, options)?;
    }

    #[test]
    fn log_input_partitions_or_fails_at_a_named_byte_and_line(
        grouped in any::<bool>(),
        src in damaged(log_source()),
        options in options(),
    ) {
        check_partition(&log_lines(grouped), &src, options)?;
    }

    #[test]
    fn valid_sources_yield_one_element_per_record(
        keyed in any::<bool>(),
        jsonl_src in jsonl_source(),
        array_src in json_array_source(),
        csv_src in csv_source(),
        log_src in log_source(),
        options in options(),
    ) {
        let deep = |e: &PartitionError| e.to_string().contains("recursion limit");
        for (spec, (src, records)) in [
            (jsonl(keyed), jsonl_src),
            (json_array(keyed), array_src),
            (csv(keyed), csv_src),
        ] {
            match partition_checked(&spec, &src, options)? {
                Ok(parts) => prop_assert_eq!(parts.coverage.elements, records),
                // JSONL fails on a record nested past the parser's limit
                // (a JSON array rejects that record instead).
                Err(e) if matches!(spec, PartitionSpec::Jsonl { .. }) && deep(&e) => {}
                Err(e) => prop_assert!(false, "valid {} source fails: {e}", spec.type_name()),
            }
        }
        for grouped in [false, true] {
            let spec = log_lines(grouped);
            let records = log_records(&log_src, grouped);
            match partition_checked(&spec, &log_src, options)? {
                Ok(parts) => prop_assert_eq!(parts.coverage.elements, records),
                Err(PartitionError::Empty) => prop_assert_eq!(records, 0),
                Err(e) => prop_assert!(false, "valid log source fails: {e}"),
            }
        }
    }

    #[test]
    fn partitioning_the_same_bytes_twice_gives_the_same_units(
        (spec, src) in any_spec_and_source(),
        options in options(),
    ) {
        let first = partition::partition_parts(&spec, &src, options);
        let second = partition::partition_parts(&spec, &src, options);
        prop_assert_eq!(flat(&first), flat(&second));
    }

    #[test]
    fn appending_a_jsonl_record_keeps_earlier_ids_and_hashes(
        keyed in any::<bool>(),
        src in damaged(jsonl_source().prop_map(|s| s.0)),
        line in record().prop_filter("within the depth limit", |r| !r.contains("[[[[")),
        options in options(),
    ) {
        check_append_keeps_earlier_units(&jsonl(keyed), &src, &line, options)?;
    }

    #[test]
    fn appending_a_log_record_keeps_earlier_ids_and_hashes(
        grouped in any::<bool>(),
        src in damaged(log_source()),
        line in "2024-0[1-9]-[0-2][1-9] [a-z ]{1,12}",
        options in options(),
    ) {
        check_append_keeps_earlier_units(&log_lines(grouped), &src, &line, options)?;
    }

    #[test]
    fn jsonl_paths_agree_across_threads_and_chunk_sizes(
        keyed in any::<bool>(),
        src in damaged(jsonl_source().prop_map(|s| s.0)),
        options in options(),
    ) {
        let spec = jsonl(keyed);
        let want = flat(&partition::partition_parts(&spec, &src, options));
        for (threads, chunk_bytes) in [(1, 1), (1, 13), (2, 1), (2, 29), (3, 1 << 20)] {
            let (got, raws) = fast_path(&spec, &src, options, threads, chunk_bytes);
            prop_assert_eq!(&got, &want, "threads {}, chunks of {}", threads, chunk_bytes);
            if let Ok((units, _, _, _)) = &got {
                for (unit, raw) in units.iter().zip(&raws) {
                    let r = unit.bytes;
                    prop_assert_eq!(&src[r.start as usize..r.end as usize], &raw[..]);
                }
            }
        }
    }

    #[test]
    fn stream_agrees_with_partition_all_for_every_format(
        (spec, src) in any_spec_and_source(),
        options in options(),
        threads in 1usize..4,
    ) {
        let all = partition::partition_parts(&spec, &src, options);
        let (got, jsons) = streamed(&spec, &src, options, threads);
        prop_assert_eq!(&got, &flat(&all));
        if let Ok(partition::Parts { units, .. }) = &all {
            for (u, json) in units.iter().zip(&jsons) {
                let value: Value = serde_json::from_slice(json).expect("stream's unit JSON");
                prop_assert_eq!(&value, &u.value);
            }
        }
    }

    #[test]
    fn jsonl_and_a_json_array_of_the_same_records_give_the_same_units(
        keyed in any::<bool>(),
        records in prop::collection::vec(record(), 1..8),
        options in options(),
    ) {
        let lines = format!("{}\n", records.join("\n"));
        let array = format!("[{}]", records.join(",\n"));
        let from_lines = partition_checked(&jsonl(keyed), lines.as_bytes(), options)?;
        let from_array = partition_checked(&json_array(keyed), array.as_bytes(), options)?;
        let Parts { units, rejections, repeats, .. } =
            from_array.expect("a valid JSON array partitions");
        let too_deep = rejections.iter().any(|r| r.reason == "too_deep");
        let Parts {
            units: line_units,
            rejections: line_rejections,
            repeats: line_repeats,
            ..
        } = match from_lines {
            Ok(parts) => parts,
            // The array rejects a record nested past serde's limit; JSONL,
            // parsing with the same limit, fails on it instead.
            Err(e) if too_deep => {
                prop_assert!(e.to_string().contains("recursion limit"), "{}", e);
                return Ok(());
            }
            Err(e) => {
                return Err(TestCaseError::fail(format!(
                    "JSONL fails where the JSON array partitions: {e}"
                )));
            }
        };
        let ids_hashes = |units: &[PartUnit]| -> Vec<(u64, String, ContentHash)> {
            units
                .iter()
                .map(|u| (u.unit.ordinal, u.unit.unit_id.0.clone(), u.unit.unit_hash))
                .collect()
        };
        prop_assert_eq!(ids_hashes(&line_units), ids_hashes(&units));
        let reasons = |r: &[Rejection]| -> Vec<(u64, String)> {
            r.iter().map(|r| (r.ordinal, r.reason.clone())).collect()
        };
        prop_assert_eq!(reasons(&line_rejections), reasons(&rejections));
        let repeated = |r: &[Repeat]| -> Vec<(u64, String, u64)> {
            r.iter().map(|r| (r.ordinal, r.unit_id.clone(), r.first_ordinal)).collect()
        };
        prop_assert_eq!(repeated(&line_repeats), repeated(&repeats));
        for (a, b) in line_units.iter().zip(&units) {
            prop_assert_eq!(&a.value, &b.value);
        }
    }
}

// ------------------------------------------------ cases found by the above

/// A cut-off last line is rejected with its line number in the whole
/// source, not in the chunk that held it.
#[test]
fn truncated_last_line_names_its_line_whatever_the_chunk_size() {
    let spec = jsonl(false);
    let src = b"{\"id\": 0}\n{";
    let options = PartitionOptions::default();
    let want = flat(&partition::partition_parts(&spec, src, options));
    let (_, rejections, _, _) = want.as_ref().expect("partitions");
    assert!(rejections[0].detail.contains("(line 2: "), "{rejections:?}");
    for (threads, chunk_bytes) in [(1, 1), (2, 1)] {
        assert_eq!(fast_path(&spec, src, options, threads, chunk_bytes).0, want);
    }
}

/// A CSV source whose lines end in a lone `\r` reads each row back from
/// its own bytes.
#[test]
fn csv_rows_read_back_when_lines_end_in_a_lone_carriage_return() {
    let spec = csv(true);
    let src = b"id,name\r1,a\r2,b\r";
    let (units, _, _) =
        partition::partition_all(&spec, src, PartitionOptions::default()).expect("partitions");
    assert_eq!(units.len(), 2);
    let header = partition::csv_header(src, None);
    assert_eq!(header, Some(&b"id,name\r"[..]));
    for u in &units {
        let r = u.unit.bytes;
        let bytes = &src[r.start as usize..r.end as usize];
        let value = partition::reread(&spec, bytes, header, 0, u.unit.unit_id.as_str())
            .expect("reads back");
        assert_eq!(value, u.value);
    }
}

/// A quote inside a header field is literal to the CSV reader, and so to
/// `csv_header`.
#[test]
fn csv_header_ends_where_the_csv_reader_ends_it() {
    let src = b"i\"d,name\n1,a\n";
    assert_eq!(csv_reader_header_end(src), Some(9));
    assert!(csv_header_is_right(src, partition::csv_header(src, None)));
}
