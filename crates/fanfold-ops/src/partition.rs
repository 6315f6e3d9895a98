//! Deterministic structural partition: source bytes -> units with stable ids.
//!
//! Coverage is checkable by construction: every element the parser finds is
//! reported either as a unit or as a [`Rejection`] with a reason, and
//! [`Coverage`] counts both. A malformed source is an error that names the
//! byte offset and line; nothing is dropped silently.

use std::collections::HashMap;
use std::io::BufRead;

use fanfold_core::spec::PartitionSpec;
use fanfold_core::{ByteRange, ContentHash, StableHash, Unit, UnitId};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Largest unit a micro-context is given; larger elements are rejected with
/// reason `too_large` (coverage keeps them) rather than sent to a model.
pub const DEFAULT_MAX_UNIT_BYTES: u64 = 4 * 1024 * 1024;

/// A unit and its parsed value.
#[derive(Clone, Debug)]
pub struct PartUnit {
    pub unit: Unit,
    pub value: Value,
}

/// An element of the source that is deliberately not a unit.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Rejection {
    pub ordinal: u64,
    pub bytes: ByteRange,
    /// `duplicate_key`, `missing_key`, `too_large`.
    pub reason: String,
    pub detail: String,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Coverage {
    pub elements: u64,
    pub units: u64,
    pub rejected: u64,
}

impl Coverage {
    /// Every element is a unit or an explicit rejection.
    pub fn is_complete(&self) -> bool {
        self.units + self.rejected == self.elements
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PartitionError {
    #[error(
        "the input is empty: there is nothing to partition (check the file or the command's output)"
    )]
    Empty,
    #[error("malformed {format} at byte {offset} (line {line}): {detail}")]
    Malformed {
        format: &'static str,
        offset: u64,
        line: u64,
        detail: String,
    },
    #[error(
        "invalid UTF-8 at byte {offset} (line {line}): the input must be UTF-8 text; convert it first (e.g. `iconv -f latin1 -t utf-8`)"
    )]
    NotUtf8 { offset: u64, line: u64 },
    #[error("invalid record_start regex: {0}")]
    Regex(#[from] regex::Error),
    #[error("csv delimiter must be one byte, got {0:?}")]
    Delimiter(String),
    #[error("reading the input: {0}")]
    Io(#[from] std::io::Error),
}

/// Options that are runtime knobs, not meaning.
#[derive(Clone, Copy, Debug)]
pub struct PartitionOptions {
    pub max_unit_bytes: u64,
}

impl Default for PartitionOptions {
    fn default() -> Self {
        PartitionOptions {
            max_unit_bytes: DEFAULT_MAX_UNIT_BYTES,
        }
    }
}

/// One element of the source, as the partitioner emits it.
pub enum Element {
    Unit(PartUnit),
    Rejected(Rejection),
}

/// Assigns ids and tracks duplicates and coverage while elements stream by.
struct Assigner<'a> {
    spec_kind: &'a str,
    key: Option<&'a str>,
    source_hash: ContentHash,
    max_unit_bytes: u64,
    seen: HashMap<String, u64>,
    coverage: Coverage,
}

impl<'a> Assigner<'a> {
    fn element(&mut self, value: Value, bytes: ByteRange, canonical: ContentHash) -> Element {
        let ordinal = self.coverage.elements;
        self.coverage.elements += 1;
        let reject = |this: &mut Self, reason: &str, detail: String| {
            this.coverage.rejected += 1;
            Element::Rejected(Rejection {
                ordinal,
                bytes,
                reason: reason.to_owned(),
                detail,
            })
        };
        if bytes.len() > self.max_unit_bytes {
            let detail = format!(
                "element {ordinal} at bytes {}..{} is {} bytes, over the {}-byte unit limit; raise --max-unit-bytes or split the record",
                bytes.start,
                bytes.end,
                bytes.len(),
                self.max_unit_bytes
            );
            return reject(self, "too_large", detail);
        }
        let id = match self.key {
            Some(key) => match value.get(key) {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Number(n)) => n.to_string(),
                Some(Value::Bool(b)) => b.to_string(),
                _ => {
                    let detail = format!(
                        "element {ordinal} at byte {} has no scalar `{key}` field",
                        bytes.start
                    );
                    return reject(self, "missing_key", detail);
                }
            },
            None => format!("c{}", canonical.short(16)),
        };
        let count = self.seen.entry(id.clone()).or_insert(0);
        *count += 1;
        let id = match (self.key, *count) {
            (_, 1) => id,
            // Content-derived ids of identical records are told apart by
            // occurrence, which an edit elsewhere in the source cannot shift.
            (None, n) => format!("{id}-{n}"),
            (Some(key), _) => {
                let detail = format!(
                    "element {ordinal} at byte {} repeats {key} = {id}; the first occurrence is kept",
                    bytes.start
                );
                return reject(self, "duplicate_key", detail);
            }
        };
        self.coverage.units += 1;
        Element::Unit(PartUnit {
            unit: Unit {
                unit_id: UnitId(id),
                unit_kind: self.spec_kind.to_owned(),
                ordinal,
                source_hash: self.source_hash,
                unit_hash: canonical,
                bytes,
                neighborhood: Vec::new(),
                required_relations: Vec::new(),
            },
            value,
        })
    }
}

/// The canonical hash of a unit's content.
pub fn unit_hash(value: &Value) -> ContentHash {
    value.key_in("unit-v1")
}

/// Partitions `source` into elements, calling `emit` for each in source
/// order. Returns the coverage accounting.
pub fn partition(
    spec: &PartitionSpec,
    source: &[u8],
    options: PartitionOptions,
    mut emit: impl FnMut(Element),
) -> Result<Coverage, PartitionError> {
    let source_hash = ContentHash::of_bytes(source);
    partition_reader(spec, source_hash, source, options, &mut emit)
}

/// The streaming form: reads `reader` once and holds one element at a time
/// (a JSON array is the exception: it is read whole).
pub fn partition_reader(
    spec: &PartitionSpec,
    source_hash: ContentHash,
    mut reader: impl BufRead,
    options: PartitionOptions,
    emit: &mut dyn FnMut(Element),
) -> Result<Coverage, PartitionError> {
    let (key, kind) = match spec {
        PartitionSpec::JsonArray { key, kind }
        | PartitionSpec::Jsonl { key, kind }
        | PartitionSpec::Csv { key, kind, .. } => (key.as_deref(), kind.as_str()),
        PartitionSpec::Lines { kind, .. } => (None, kind.as_str()),
    };
    let mut assigner = Assigner {
        spec_kind: kind,
        key,
        source_hash,
        max_unit_bytes: options.max_unit_bytes,
        seen: HashMap::new(),
        coverage: Coverage::default(),
    };
    match spec {
        PartitionSpec::JsonArray { .. } => {
            let mut bytes = Vec::new();
            reader.read_to_end(&mut bytes)?;
            json_array(&bytes, &mut assigner, emit)?
        }
        PartitionSpec::Jsonl { .. } => jsonl(reader, &mut assigner, emit)?,
        PartitionSpec::Csv { delimiter, .. } => {
            csv_rows(reader, delimiter.as_deref(), &mut assigner, emit)?
        }
        PartitionSpec::Lines { record_start, .. } => {
            let start = record_start.as_deref().map(regex::Regex::new).transpose()?;
            lines(reader, start.as_ref(), &mut assigner, emit)?
        }
    }
    if assigner.coverage.elements == 0 {
        return Err(PartitionError::Empty);
    }
    Ok(assigner.coverage)
}

fn line_of(bytes: &[u8], offset: usize) -> u64 {
    memchr::memchr_iter(b'\n', &bytes[..offset.min(bytes.len())]).count() as u64 + 1
}

fn check_utf8(bytes: &[u8], base: u64, line_base: u64) -> Result<(), PartitionError> {
    if let Err(e) = std::str::from_utf8(bytes) {
        let at = e.valid_up_to();
        return Err(PartitionError::NotUtf8 {
            offset: base + at as u64,
            line: line_base + line_of(bytes, at) - 1,
        });
    }
    Ok(())
}

fn malformed_json(whole: &[u8], base: usize, e: &serde_json::Error) -> PartitionError {
    // serde_json reports line/column inside the slice it parsed; turn that
    // into an absolute byte offset so editors can jump to it.
    let slice = &whole[base..];
    let mut offset = base;
    let mut line = 1;
    for (i, b) in slice.iter().enumerate() {
        if line == e.line() {
            offset = base + i + e.column().saturating_sub(1);
            break;
        }
        if *b == b'\n' {
            line += 1;
        }
    }
    PartitionError::Malformed {
        format: "JSON",
        offset: offset as u64,
        line: line_of(whole, offset),
        detail: e.to_string(),
    }
}

/// Splits a JSON array into element byte ranges with a small scanner, then
/// parses each element on its own, so every unit knows where it came from.
fn json_array(
    bytes: &[u8],
    assigner: &mut Assigner,
    emit: &mut dyn FnMut(Element),
) -> Result<(), PartitionError> {
    check_utf8(bytes, 0, 1)?;
    let malformed = |offset: usize, detail: &str| PartitionError::Malformed {
        format: "JSON",
        offset: offset as u64,
        line: line_of(bytes, offset),
        detail: detail.to_owned(),
    };
    let skip_ws = |mut i: usize| {
        while i < bytes.len() && bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        i
    };
    let mut i = skip_ws(0);
    if i == bytes.len() {
        return Err(PartitionError::Empty);
    }
    if bytes[i] != b'[' {
        return Err(malformed(
            i,
            "expected a JSON array (`[`), the shape `gh ... --json` writes; for one object a line use `type = \"jsonl\"`",
        ));
    }
    i = skip_ws(i + 1);
    if i < bytes.len() && bytes[i] == b']' {
        let rest = skip_ws(i + 1);
        if rest != bytes.len() {
            return Err(malformed(rest, "trailing characters after the array"));
        }
        return Ok(());
    }
    loop {
        let start = i;
        let end = scan_value(bytes, start).map_err(|(at, why)| malformed(at, why))?;
        let slice = &bytes[start..end];
        let value: Value =
            serde_json::from_slice(slice).map_err(|e| malformed_json(bytes, start, &e))?;
        let canonical = unit_hash(&value);
        emit(assigner.element(
            value,
            ByteRange {
                start: start as u64,
                end: end as u64,
            },
            canonical,
        ));
        i = skip_ws(end);
        match bytes.get(i) {
            Some(b',') => i = skip_ws(i + 1),
            Some(b']') => {
                let rest = skip_ws(i + 1);
                if rest != bytes.len() {
                    return Err(malformed(rest, "trailing characters after the array"));
                }
                return Ok(());
            }
            Some(_) => return Err(malformed(i, "expected `,` or `]` after an array element")),
            None => return Err(malformed(i, "the array is not closed (truncated input?)")),
        }
    }
}

/// The end of the JSON value starting at `start`: strings, nesting and
/// escapes are tracked; the value itself is validated by serde afterwards.
fn scan_value(bytes: &[u8], start: usize) -> Result<usize, (usize, &'static str)> {
    let mut depth = 0usize;
    let mut i = start;
    let mut in_string = false;
    while i < bytes.len() {
        let b = bytes[i];
        if in_string {
            match b {
                b'\\' => i += 1,
                b'"' => {
                    in_string = false;
                    if depth == 0 {
                        return Ok(i + 1);
                    }
                }
                _ => {}
            }
        } else {
            match b {
                b'"' => in_string = true,
                b'{' | b'[' => depth += 1,
                b'}' | b']' => {
                    if depth == 0 {
                        return Ok(i);
                    }
                    depth -= 1;
                    if depth == 0 {
                        return Ok(i + 1);
                    }
                }
                b',' if depth == 0 => return Ok(i),
                _ => {}
            }
        }
        i += 1;
    }
    if in_string {
        Err((start, "a string is not closed (truncated input?)"))
    } else if depth > 0 {
        Err((start, "an element is not closed (truncated input?)"))
    } else {
        Ok(bytes.len())
    }
}

fn jsonl(
    mut reader: impl BufRead,
    assigner: &mut Assigner,
    emit: &mut dyn FnMut(Element),
) -> Result<(), PartitionError> {
    let mut line = Vec::new();
    let mut offset = 0u64;
    let mut line_no = 0u64;
    loop {
        line.clear();
        let n = reader.read_until(b'\n', &mut line)?;
        if n == 0 {
            return Ok(());
        }
        line_no += 1;
        let start = offset;
        offset += n as u64;
        let body = trim_line(&line);
        if body.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        check_utf8(body, start, line_no)?;
        let value: Value = serde_json::from_slice(body).map_err(|e| PartitionError::Malformed {
            format: "JSON line",
            offset: start + e.column().saturating_sub(1) as u64,
            line: line_no,
            detail: e.to_string(),
        })?;
        let canonical = unit_hash(&value);
        let end = start + body.len() as u64;
        emit(assigner.element(value, ByteRange { start, end }, canonical));
    }
}

fn trim_line(line: &[u8]) -> &[u8] {
    let mut end = line.len();
    while end > 0 && (line[end - 1] == b'\n' || line[end - 1] == b'\r') {
        end -= 1;
    }
    &line[..end]
}

fn csv_rows(
    reader: impl BufRead,
    delimiter: Option<&str>,
    assigner: &mut Assigner,
    emit: &mut dyn FnMut(Element),
) -> Result<(), PartitionError> {
    let delimiter = match delimiter {
        None => b',',
        Some(d) if d.len() == 1 => d.as_bytes()[0],
        Some(d) => return Err(PartitionError::Delimiter(d.to_owned())),
    };
    let mut rdr = csv::ReaderBuilder::new()
        .delimiter(delimiter)
        .has_headers(true)
        .from_reader(reader);
    let csv_error = |e: csv::Error| {
        let (offset, line) = e.position().map(|p| (p.byte(), p.line())).unwrap_or((0, 0));
        match e.kind() {
            csv::ErrorKind::Utf8 { .. } => PartitionError::NotUtf8 { offset, line },
            csv::ErrorKind::UnequalLengths {
                expected_len, len, ..
            } => PartitionError::Malformed {
                format: "CSV",
                offset,
                line,
                detail: format!(
                    "row has {len} fields, the header has {expected_len}; quote fields that contain the delimiter"
                ),
            },
            _ => PartitionError::Malformed {
                format: "CSV",
                offset,
                line,
                detail: e.to_string(),
            },
        }
    };
    let headers = rdr.headers().map_err(csv_error)?.clone();
    let mut record = csv::StringRecord::new();
    loop {
        let start = rdr.position().byte();
        if !rdr.read_record(&mut record).map_err(csv_error)? {
            return Ok(());
        }
        let end = rdr.position().byte();
        let mut obj = serde_json::Map::new();
        for (h, v) in headers.iter().zip(record.iter()) {
            obj.insert(h.to_owned(), Value::String(v.to_owned()));
        }
        let value = Value::Object(obj);
        let canonical = unit_hash(&value);
        emit(assigner.element(value, ByteRange { start, end }, canonical));
    }
}

/// Log lines: one record a line, or multi-line records opened by a line that
/// matches `record_start`. A unit's value is `{"text": ..., "line": N}`.
fn lines(
    mut reader: impl BufRead,
    start_re: Option<&regex::Regex>,
    assigner: &mut Assigner,
    emit: &mut dyn FnMut(Element),
) -> Result<(), PartitionError> {
    let mut buf = Vec::new();
    let mut offset = 0u64;
    let mut line_no = 0u64;
    // The open record: its text, first line number and byte range.
    let mut open: Option<(String, u64, ByteRange)> = None;
    let mut flush = |open: &mut Option<(String, u64, ByteRange)>, assigner: &mut Assigner| {
        if let Some((text, line, range)) = open.take() {
            let canonical = ContentHash::of_bytes(text.as_bytes());
            let value = serde_json::json!({"text": text, "line": line});
            emit(assigner.element(value, range, canonical));
        }
    };
    loop {
        buf.clear();
        let n = reader.read_until(b'\n', &mut buf)?;
        if n == 0 {
            break;
        }
        line_no += 1;
        let start = offset;
        offset += n as u64;
        let body = trim_line(&buf);
        check_utf8(body, start, line_no)?;
        let text = std::str::from_utf8(body).unwrap_or_default();
        let end = start + body.len() as u64;
        let continues = match (start_re, &open) {
            (Some(re), Some(_)) => !re.is_match(text),
            _ => false,
        };
        if continues {
            if let Some((t, _, range)) = open.as_mut() {
                t.push('\n');
                t.push_str(text);
                range.end = end;
            }
            continue;
        }
        flush(&mut open, assigner);
        if start_re.is_none() && text.trim().is_empty() {
            // Blank lines carry nothing to judge; they are not elements.
            continue;
        }
        open = Some((text.to_owned(), line_no, ByteRange { start, end }));
    }
    flush(&mut open, assigner);
    Ok(())
}

/// Collects all elements into memory: convenient for the engine and tests.
pub fn partition_all(
    spec: &PartitionSpec,
    source: &[u8],
    options: PartitionOptions,
) -> Result<(Vec<PartUnit>, Vec<Rejection>, Coverage), PartitionError> {
    let mut units = Vec::new();
    let mut rejections = Vec::new();
    let coverage = partition(spec, source, options, |el| match el {
        Element::Unit(u) => units.push(u),
        Element::Rejected(r) => rejections.push(r),
    })?;
    Ok((units, rejections, coverage))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json_array_spec() -> PartitionSpec {
        PartitionSpec::JsonArray {
            key: Some("number".into()),
            kind: "issue".into(),
        }
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
        for src in [&b""[..], b"   \n", b"[]"] {
            let err = partition_all(&json_array_spec(), src, PartitionOptions::default())
                .expect_err("fails");
            assert!(matches!(err, PartitionError::Empty), "{err}");
        }
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
        let (units, rej, cov) =
            partition_all(&json_array_spec(), big.as_bytes(), opts).expect("ok");
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
        let err = partition_all(
            &spec,
            b"{\"id\": 1}\n{\"id\": }\n",
            PartitionOptions::default(),
        )
        .expect_err("fails");
        assert!(
            matches!(
                err,
                PartitionError::Malformed {
                    line: 2,
                    offset: 17,
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
}
