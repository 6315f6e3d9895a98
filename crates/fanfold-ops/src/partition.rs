//! Deterministic structural partition: source bytes -> units with stable ids.
//!
//! Coverage is checkable by construction: every element the parser finds is
//! reported either as a unit or as a [`Rejection`] with a reason, and
//! [`Coverage`] counts both. A malformed source is an error that names the
//! byte offset and line; nothing is dropped silently.

use std::collections::{BTreeMap, HashSet};
use std::io::{BufRead, Read};

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
    /// `duplicate_key`, `missing_key`, `bad_key`, `too_large`, `too_deep`,
    /// `truncated_line` (a last line cut off), `malformed_line`.
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

/// The UTF-8 byte order mark some tools write before the first byte.
const BOM: &[u8] = b"\xEF\xBB\xBF";

/// The deepest nesting serde_json parses.
const MAX_DEPTH: usize = 128;

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

/// Remembers the ids given so far, to tell a repeat from a first
/// occurrence. The engine's implementation keeps compact fingerprints and
/// confirms a hit against the store, so it stays exact and small at any
/// size; [`SeenKeys`] keeps everything in memory.
pub trait SeenIds {
    /// Records `id` for the element at `ordinal`; false when an earlier
    /// element already has it.
    fn first(&mut self, id: &str, ordinal: u64) -> Result<bool, PartitionError>;
}

/// Why a repeated key is rejected. Keys compare as text, so a number and
/// the string of its digits are one id, which the message says where it
/// may be the cause.
fn repeat_detail(ordinal: u64, byte: u64, key: &str, id: &str) -> String {
    let mut detail = format!(
        "element {ordinal} at byte {byte} repeats {key} = {id}; the first occurrence is kept \
         and this element is not judged"
    );
    if canonical_u64(id).is_some() {
        detail.push_str(&format!(
            " (keys compare as text: {id} and \"{id}\" are one id)"
        ));
    }
    detail
}

/// The id of the `n`-th occurrence (from 1) of a content-derived id: the
/// first keeps it, later ones gain `-n`, which an edit elsewhere in the
/// source cannot shift.
fn content_id(
    seen: &mut dyn SeenIds,
    base: String,
    ordinal: u64,
) -> Result<String, PartitionError> {
    if seen.first(&base, ordinal)? {
        return Ok(base);
    }
    let mut n = 2u64;
    loop {
        let id = format!("{base}-{n}");
        if seen.first(&id, ordinal)? {
            return Ok(id);
        }
        n += 1;
    }
}

/// Assigns ids and tracks duplicates and coverage while elements stream by.
struct Assigner<'a> {
    spec_kind: &'a str,
    key: Option<&'a str>,
    source_hash: ContentHash,
    max_unit_bytes: u64,
    seen: &'a mut dyn SeenIds,
    coverage: Coverage,
}

impl<'a> Assigner<'a> {
    /// An element that cannot become a unit, counted and explained.
    fn reject(&mut self, bytes: ByteRange, reason: &str, detail: String) -> Element {
        let ordinal = self.coverage.elements;
        self.coverage.elements += 1;
        self.coverage.rejected += 1;
        Element::Rejected(Rejection {
            ordinal,
            bytes,
            reason: reason.to_owned(),
            detail: format!("element {ordinal}: {detail}"),
        })
    }

    fn element(
        &mut self,
        value: Value,
        bytes: ByteRange,
        canonical: ContentHash,
    ) -> Result<Element, PartitionError> {
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
            return Ok(reject(self, "too_large", detail));
        }
        let id = match self.key {
            Some(key) => {
                let id = match value.get(key) {
                    Some(Value::String(s)) => s.clone(),
                    Some(Value::Number(n)) => n.to_string(),
                    Some(Value::Bool(b)) => b.to_string(),
                    _ => {
                        let detail = format!(
                            "element {ordinal} at byte {} has no scalar `{key}` field",
                            bytes.start
                        );
                        return Ok(reject(self, "missing_key", detail));
                    }
                };
                if let Some(flaw) = key_flaw(&id) {
                    let detail = format!(
                        "element {ordinal} at byte {}: its `{key}` {flaw}",
                        bytes.start
                    );
                    return Ok(reject(self, "bad_key", detail));
                }
                if !self.seen.first(&id, ordinal)? {
                    let detail = repeat_detail(ordinal, bytes.start, key, &id);
                    return Ok(reject(self, "duplicate_key", detail));
                }
                id
            }
            None => content_id(self.seen, format!("c{}", canonical.short(16)), ordinal)?,
        };
        self.coverage.units += 1;
        Ok(Element::Unit(PartUnit {
            unit: Unit {
                unit_id: UnitId(id),
                unit_kind: self.spec_kind.to_owned(),
                ordinal,
                source_hash: self.source_hash,
                unit_hash: canonical,
                bytes,
            },
            value,
        }))
    }
}

/// Why a record's key cannot be a unit id, if it cannot: an id is shown
/// to people (answer.md, the report, citations), so it must be visible and
/// read the way it is stored. An empty id cites nothing; a control
/// character (a NUL, a newline) vanishes or breaks a line; a bidirectional
/// control (U+202E and its kin) makes the text around it read in another
/// order than it is.
pub fn key_flaw(id: &str) -> Option<String> {
    if id.is_empty() {
        return Some("is empty".into());
    }
    let (at, c) = id.char_indices().find(|&(_, c)| {
        c.is_control()
            || matches!(c, '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
    })?;
    let what = if c.is_control() {
        "a control character"
    } else {
        "a bidirectional control character"
    };
    Some(format!(
        "holds {what} (U+{:04X}) at byte {at}",
        u32::from(c)
    ))
}

/// Keys seen so far. Decimal-integer ids are kept as runs of consecutive
/// numbers, so a source with sequential ids costs a few bytes in all.
#[derive(Default)]
pub struct SeenKeys {
    /// Run start -> run end (inclusive); runs neither overlap nor touch.
    runs: BTreeMap<u64, u64>,
    others: HashSet<Box<str>>,
}

impl SeenIds for SeenKeys {
    fn first(&mut self, id: &str, _ordinal: u64) -> Result<bool, PartitionError> {
        Ok(self.insert(id))
    }
}

impl SeenKeys {
    /// False when `id` was seen before.
    pub fn insert(&mut self, id: &str) -> bool {
        match canonical_u64(id) {
            Some(n) => self.insert_int(n),
            None => self.others.insert(id.into()),
        }
    }

    fn insert_int(&mut self, n: u64) -> bool {
        let before = self.runs.range(..=n).next_back().map(|(&s, &e)| (s, e));
        if let Some((_, end)) = before
            && n <= end
        {
            return false;
        }
        let joins_before = before.filter(|&(_, end)| end + 1 == n).map(|(s, _)| s);
        let after = n
            .checked_add(1)
            .and_then(|next| self.runs.get(&next).map(|&end| (next, end)));
        match (joins_before, after) {
            (Some(start), Some((next, end))) => {
                self.runs.remove(&next);
                self.runs.insert(start, end);
            }
            (Some(start), None) => {
                self.runs.insert(start, n);
            }
            (None, Some((next, end))) => {
                self.runs.remove(&next);
                self.runs.insert(n, end);
            }
            (None, None) => {
                self.runs.insert(n, n);
            }
        }
        true
    }
}

/// The number an id spells, when the id is exactly that number's
/// decimal form (so `7` and `07` stay different ids).
fn canonical_u64(id: &str) -> Option<u64> {
    let b = id.as_bytes();
    if b.is_empty() || (b.len() > 1 && b.starts_with(b"0")) || !b.iter().all(u8::is_ascii_digit) {
        return None;
    }
    id.parse().ok()
}

/// Confirms that an id whose fingerprint was seen before really belongs to
/// an earlier element (fingerprints of different ids can collide).
pub trait ConfirmRepeat {
    fn earlier(&mut self, id: &str, ordinal: u64) -> Result<bool, PartitionError>;
}

/// Ids in little memory, exactly: decimal-integer ids as runs (like
/// [`SeenKeys`]), every other id as a 64-bit fingerprint. A fingerprint hit
/// is confirmed through [`ConfirmRepeat`] (the engine asks the store), so a
/// collision never makes a unit a duplicate. Memory is 8 bytes and change
/// per non-integer id, not the id itself.
pub struct CompactSeen<C> {
    runs: SeenKeys,
    fingerprints: HashSet<u64>,
    confirm: C,
}

impl<C: ConfirmRepeat> CompactSeen<C> {
    pub fn new(confirm: C) -> Self {
        CompactSeen {
            runs: SeenKeys::default(),
            fingerprints: std::collections::HashSet::new(),
            confirm,
        }
    }
}

impl<C: ConfirmRepeat> SeenIds for CompactSeen<C> {
    fn first(&mut self, id: &str, ordinal: u64) -> Result<bool, PartitionError> {
        if let Some(n) = canonical_u64(id) {
            return Ok(self.runs.insert_int(n));
        }
        let digest = ContentHash::of_bytes(id.as_bytes());
        let mut fp = [0u8; 8];
        fp.copy_from_slice(&digest.0[..8]);
        if self.fingerprints.insert(u64::from_le_bytes(fp)) {
            return Ok(true);
        }
        Ok(!self.confirm.earlier(id, ordinal)?)
    }
}

/// The canonical hash of a unit's content.
pub fn unit_hash(value: &Value) -> ContentHash {
    value.key_in(fanfold_core::Bucket::Unit)
}

/// The content hash a unit of `spec`'s format has, from its value: the
/// canonical JSON hash, or for log lines the hash of the text itself.
pub fn content_hash(spec: &PartitionSpec, value: &Value) -> ContentHash {
    match (spec, value.get("text")) {
        (PartitionSpec::Lines { .. }, Some(Value::String(text))) => {
            ContentHash::of_bytes(text.as_bytes())
        }
        _ => unit_hash(value),
    }
}

/// Partitions `source` into elements, calling `emit` for each in source
/// order, with every id remembered in memory. Returns the coverage.
pub fn partition(
    spec: &PartitionSpec,
    source: &[u8],
    options: PartitionOptions,
    mut emit: impl FnMut(Element),
) -> Result<Coverage, PartitionError> {
    let source_hash = ContentHash::of_bytes(source);
    partition_reader(
        spec,
        source_hash,
        source,
        options,
        &mut SeenKeys::default(),
        &mut emit,
    )
}

/// The streaming form: reads `reader` once and holds one element at a time
/// (plus a read-ahead window of about a megabyte). JSONL goes through
/// [`fast_jsonl`] on the calling thread, the one JSONL parser there is.
pub fn partition_reader(
    spec: &PartitionSpec,
    source_hash: ContentHash,
    reader: impl BufRead + Send,
    options: PartitionOptions,
    seen: &mut dyn SeenIds,
    emit: &mut dyn FnMut(Element),
) -> Result<Coverage, PartitionError> {
    if let PartitionSpec::Jsonl { key, kind } = spec {
        let fast = fast_jsonl::FastOptions {
            partition: options,
            threads: 1,
            chunk_bytes: 1 << 20,
        };
        let mut failed = None;
        let coverage = fast_jsonl::partition_jsonl(
            key.as_deref(),
            kind,
            source_hash,
            reader,
            fast,
            seen,
            || |_: &str, _: &fast_jsonl::Record| (),
            &mut |el| match el {
                fast_jsonl::FastElement::Unit { unit, raw, .. } => {
                    // The line parsed once already; this cannot fail.
                    match serde_json::from_slice(raw) {
                        Ok(value) => emit(Element::Unit(PartUnit { unit, value })),
                        Err(e) => {
                            failed.get_or_insert(PartitionError::Malformed {
                                format: "JSON line",
                                offset: unit.bytes.start,
                                line: 0,
                                detail: e.to_string(),
                            });
                        }
                    }
                }
                fast_jsonl::FastElement::Rejected(r) => emit(Element::Rejected(r)),
            },
        )?;
        return match failed {
            Some(e) => Err(e),
            None => Ok(coverage),
        };
    }
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
        seen,
        coverage: Coverage::default(),
    };
    match spec {
        PartitionSpec::JsonArray { .. } => json_array(reader, &mut assigner, emit)?,
        PartitionSpec::Jsonl { .. } => {}
        PartitionSpec::Csv { delimiter, .. } => {
            csv_rows(reader, delimiter.as_deref(), &mut assigner, emit)?
        }
        PartitionSpec::Lines { record_start, .. } => {
            let start = record_start.as_deref().map(regex::Regex::new).transpose()?;
            lines(reader, start.as_ref(), &mut assigner, emit)?
        }
    }
    // An empty array is an answer (`gh` found nothing); an input with no
    // records at all is more likely a mistake.
    if assigner.coverage.elements == 0 && !matches!(spec, PartitionSpec::JsonArray { .. }) {
        return Err(PartitionError::Empty);
    }
    Ok(assigner.coverage)
}

fn line_of(bytes: &[u8], offset: usize) -> u64 {
    memchr::memchr_iter(b'\n', bytes.get(..offset).unwrap_or(bytes)).count() as u64 + 1
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

/// Where serde_json's error in the value starting at `start` lies, as an
/// index into `bytes`: it reports a line and column inside the slice it
/// parsed, and editors want an absolute byte offset.
fn json_error_at(bytes: &[u8], start: usize, e: &serde_json::Error) -> usize {
    let mut line = 1;
    for (i, b) in bytes.iter().skip(start).enumerate() {
        if line == e.line() {
            return start + i + e.column().saturating_sub(1);
        }
        if *b == b'\n' {
            line += 1;
        }
    }
    start
}

/// A read-ahead window over a source that is never held whole: the JSON
/// array scanner's view. Indices are relative to `buf`; `base` is the
/// source offset of `buf[0]`.
struct Window<R> {
    reader: R,
    buf: Vec<u8>,
    base: u64,
    /// Newlines in the source before `buf[0]`.
    lines_before: u64,
    /// `buf[..validated]` is known to be UTF-8.
    validated: usize,
    eof: bool,
}

impl<R: BufRead> Window<R> {
    const CHUNK: usize = 1 << 20;

    fn new(reader: R) -> Window<R> {
        Window {
            reader,
            buf: Vec::new(),
            base: 0,
            lines_before: 0,
            validated: 0,
            eof: false,
        }
    }

    /// Reads at least a chunk, and at least as much as is buffered, so an
    /// element of n bytes is rescanned O(log n) times. False at the end.
    fn fill(&mut self) -> Result<bool, PartitionError> {
        if self.eof {
            return Ok(false);
        }
        let want = Self::CHUNK.max(self.buf.len());
        let n = (&mut self.reader)
            .take(want as u64)
            .read_to_end(&mut self.buf)?;
        self.eof = n == 0;
        self.validate()?;
        Ok(n > 0)
    }

    /// The first byte that is not UTF-8 is an error at its source offset;
    /// a character cut by the chunk's end waits for the next read.
    fn validate(&mut self) -> Result<(), PartitionError> {
        match std::str::from_utf8(self.buf.get(self.validated..).unwrap_or_default()) {
            Ok(_) => self.validated = self.buf.len(),
            Err(e) if e.error_len().is_none() && !self.eof => self.validated += e.valid_up_to(),
            Err(e) => {
                let at = self.validated + e.valid_up_to();
                return Err(PartitionError::NotUtf8 {
                    offset: self.base + at as u64,
                    line: self.line_at(at),
                });
            }
        }
        Ok(())
    }

    /// Forgets the bytes before `at`, once they are most of the buffer.
    /// Returns the index `at` now has.
    fn release(&mut self, at: usize) -> usize {
        if at < Self::CHUNK || at * 2 < self.buf.len() {
            return at;
        }
        let Some(released) = self.buf.get(..at) else {
            return at;
        };
        self.lines_before += memchr::memchr_iter(b'\n', released).count() as u64;
        self.buf.drain(..at);
        self.base += at as u64;
        self.validated -= at;
        0
    }

    fn skip_ws(&mut self, mut i: usize) -> Result<usize, PartitionError> {
        loop {
            while self.buf.get(i).is_some_and(u8::is_ascii_whitespace) {
                i += 1;
            }
            if i < self.buf.len() || !self.fill()? {
                return Ok(i);
            }
        }
    }

    /// The 1-based source line of `buf[at]`.
    fn line_at(&self, at: usize) -> u64 {
        self.lines_before + line_of(&self.buf, at)
    }

    fn malformed(&self, at: usize, detail: &str) -> PartitionError {
        PartitionError::Malformed {
            format: "JSON",
            offset: self.base + at as u64,
            line: self.line_at(at),
            detail: detail.to_owned(),
        }
    }
}

/// Splits a JSON array into element byte ranges with a small scanner, then
/// parses each element on its own, so every unit knows where it came from.
/// The source streams through a window: memory is bounded by the largest
/// element, not the array.
fn json_array(
    reader: impl BufRead,
    assigner: &mut Assigner,
    emit: &mut dyn FnMut(Element),
) -> Result<(), PartitionError> {
    let mut w = Window::new(reader);
    while w.buf.len() < BOM.len() && w.fill()? {}
    let mut i = w.skip_ws(if w.buf.starts_with(BOM) { BOM.len() } else { 0 })?;
    if i == w.buf.len() {
        return Err(PartitionError::Empty);
    }
    if w.buf.get(i) != Some(&b'[') {
        return Err(w.malformed(
            i,
            "expected a JSON array (`[`), the shape `gh ... --json` writes; for one object a line use `type = \"jsonl\"`",
        ));
    }
    i = w.skip_ws(i + 1)?;
    if w.buf.get(i) == Some(&b']') {
        let rest = w.skip_ws(i + 1)?;
        if rest != w.buf.len() {
            return Err(w.malformed(rest, "trailing characters after the array"));
        }
        return Ok(());
    }
    loop {
        let start = w.release(i);
        // A value running into the window's end may go on: read more and
        // scan it again.
        let end = loop {
            match scan_value(&w.buf, start) {
                Ok(end) if end < w.buf.len() || w.eof => break end,
                Err((at, why)) if w.eof => return Err(w.malformed(at, why)),
                _ => {
                    w.fill()?;
                }
            }
        };
        let Some(slice) = w.buf.get(start..end) else {
            return Err(w.malformed(start, "an element runs past the read window"));
        };
        let range = ByteRange {
            start: w.base + start as u64,
            end: w.base + end as u64,
        };
        match serde_json::from_slice::<Value>(slice) {
            Ok(value) => {
                let canonical = unit_hash(&value);
                emit(assigner.element(value, range, canonical)?);
            }
            // Valid JSON nested past the parser's depth limit: that one
            // record is rejected, the rest stand.
            Err(e) if e.to_string().contains("recursion limit") => {
                let detail = format!(
                    "element at bytes {}..{} (line {}) is nested more than {MAX_DEPTH} levels deep",
                    range.start,
                    range.end,
                    w.line_at(start)
                );
                emit(assigner.reject(range, "too_deep", detail));
            }
            Err(e) => {
                let at = json_error_at(&w.buf, start, &e);
                return Err(w.malformed(at, &e.to_string()));
            }
        }
        i = w.skip_ws(end)?;
        match w.buf.get(i) {
            Some(b',') => i = w.skip_ws(i + 1)?,
            Some(b']') => {
                let rest = w.skip_ws(i + 1)?;
                if rest != w.buf.len() {
                    return Err(w.malformed(rest, "trailing characters after the array"));
                }
                return Ok(());
            }
            Some(_) => return Err(w.malformed(i, "expected `,` or `]` after an array element")),
            None => return Err(w.malformed(i, "the array is not closed (truncated input?)")),
        }
    }
}

/// The end of the JSON value starting at `start`: strings, nesting and
/// escapes are tracked; the value itself is validated by serde afterwards.
fn scan_value(bytes: &[u8], start: usize) -> Result<usize, (usize, &'static str)> {
    let mut depth = 0usize;
    let mut in_string = false;
    // The byte after a backslash in a string is taken as it is.
    let mut escaped = false;
    for (i, &b) in bytes.iter().enumerate().skip(start) {
        if escaped {
            escaped = false;
        } else if in_string {
            match b {
                b'\\' => escaped = true,
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
    }
    if in_string {
        Err((start, "a string is not closed (truncated input?)"))
    } else if depth > 0 {
        Err((start, "an element is not closed (truncated input?)"))
    } else {
        Ok(bytes.len())
    }
}

fn trim_line(mut line: &[u8]) -> &[u8] {
    while let [rest @ .., b'\n' | b'\r'] = line {
        line = rest;
    }
    line
}

/// A short row that spans several lines and runs to the end of the input
/// is a quote opened and never closed: the quoted field swallowed the
/// rows after it. Said so, with the line where the row starts, rather than
/// as a count of fields. (A closed multi-line field in a short row that
/// ends before the input does keeps the count-of-fields message.)
fn unterminated_quote(
    e: &csv::Error,
    start: &csv::Position,
    end: &csv::Position,
    at_end: bool,
) -> Option<PartitionError> {
    let csv::ErrorKind::UnequalLengths {
        expected_len, len, ..
    } = e.kind()
    else {
        return None;
    };
    if !at_end || *len >= *expected_len || end.line() <= start.line() + 1 {
        return None;
    }
    Some(PartitionError::Malformed {
        format: "CSV",
        offset: start.byte(),
        line: start.line(),
        detail: format!(
            "a quoted field in this row is never closed: the row runs on to line {} with {len} of \
             the header's {expected_len} fields; close the quote, or double a quote inside a field (\"\")",
            end.line().saturating_sub(1).max(start.line())
        ),
    })
}

fn csv_rows(
    reader: impl BufRead,
    delimiter: Option<&str>,
    assigner: &mut Assigner,
    emit: &mut dyn FnMut(Element),
) -> Result<(), PartitionError> {
    let delimiter = match delimiter {
        None => b',',
        Some(d) => match d.as_bytes() {
            &[b] => b,
            _ => return Err(PartitionError::Delimiter(d.to_owned())),
        },
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
        let start = rdr.position().clone();
        let read = rdr.read_record(&mut record);
        let read = match read {
            Err(e) => {
                // The row ran to the end when nothing follows it (the
                // read is failing anyway, so looking ahead costs nothing).
                let at_end = matches!(rdr.read_record(&mut csv::StringRecord::new()), Ok(false));
                Err(unterminated_quote(&e, &start, rdr.position(), at_end)
                    .unwrap_or_else(|| csv_error(e)))
            }
            Ok(more) => Ok(more),
        };
        if !read? {
            return Ok(());
        }
        let start = start.byte();
        let end = rdr.position().byte();
        let mut obj = serde_json::Map::new();
        for (h, v) in headers.iter().zip(record.iter()) {
            obj.insert(h.to_owned(), Value::String(v.to_owned()));
        }
        let value = Value::Object(obj);
        let canonical = unit_hash(&value);
        emit(assigner.element(value, ByteRange { start, end }, canonical)?);
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
    let mut flush = |open: &mut Option<(String, u64, ByteRange)>,
                     assigner: &mut Assigner|
     -> Result<(), PartitionError> {
        if let Some((text, line, range)) = open.take() {
            let canonical = ContentHash::of_bytes(text.as_bytes());
            let value = serde_json::json!({"text": text, "line": line});
            emit(assigner.element(value, range, canonical)?);
        }
        Ok(())
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
        flush(&mut open, assigner)?;
        if start_re.is_none() && text.trim().is_empty() {
            // Blank lines carry nothing to judge; they are not elements.
            continue;
        }
        open = Some((text.to_owned(), line_no, ByteRange { start, end }));
    }
    flush(&mut open, assigner)?;
    Ok(())
}

/// What a per-unit function sees of a unit while the source streams by:
/// the JSONL fast path's flat record, or a parsed value for other formats.
pub enum UnitView<'a> {
    Record(&'a fast_jsonl::Record),
    Value(&'a Value),
}

impl UnitView<'_> {
    /// The unit as a jq value.
    pub fn to_val(&self) -> jaq_json::Val {
        match self {
            UnitView::Record(r) => r.to_val(),
            UnitView::Value(v) => crate::jq::to_val(v),
        }
    }
}

/// One element of a streamed partition.
pub enum Streamed<'a, T> {
    /// A unit, its value as JSON text (the line itself for JSONL), and what
    /// the per-unit function returned for it.
    Unit {
        unit: Unit,
        json: &'a [u8],
        extra: T,
    },
    Rejected(Rejection),
}

/// Runtime knobs of [`stream`]; none of them changes the result.
#[derive(Clone, Copy, Debug)]
pub struct StreamOptions {
    pub partition: PartitionOptions,
    /// Worker threads for JSONL (other formats parse on the calling thread).
    pub threads: usize,
}

/// The one partition entry point for large sources: every format, read once
/// from `reader`, with `per_unit` run on each element that can become a unit
/// (on JSONL's worker threads; `make_per_unit` is called once per thread).
/// Memory is bounded by a few chunks per thread plus what `seen` keeps; a
/// JSON array is read whole first.
pub fn stream<T, R, M, F>(
    spec: &PartitionSpec,
    source_hash: ContentHash,
    reader: R,
    options: StreamOptions,
    seen: &mut dyn SeenIds,
    make_per_unit: M,
    emit: &mut dyn FnMut(Streamed<'_, T>),
) -> Result<Coverage, PartitionError>
where
    T: Send,
    R: std::io::Read + Send,
    M: Fn() -> F + Sync,
    F: FnMut(&str, UnitView<'_>) -> T,
{
    if let PartitionSpec::Jsonl { key, kind } = spec {
        let fast = fast_jsonl::FastOptions {
            partition: options.partition,
            threads: options.threads,
            chunk_bytes: 1 << 20,
        };
        return fast_jsonl::partition_jsonl(
            key.as_deref(),
            kind,
            source_hash,
            reader,
            fast,
            seen,
            || {
                let mut f = make_per_unit();
                move |id: &str, r: &fast_jsonl::Record| f(id, UnitView::Record(r))
            },
            &mut |el| match el {
                fast_jsonl::FastElement::Unit { unit, raw, extra } => emit(Streamed::Unit {
                    unit,
                    json: raw,
                    extra,
                }),
                fast_jsonl::FastElement::Rejected(r) => emit(Streamed::Rejected(r)),
            },
        );
    }
    let mut per_unit = make_per_unit();
    let mut json = Vec::new();
    partition_reader(
        spec,
        source_hash,
        std::io::BufReader::with_capacity(1 << 20, reader),
        options.partition,
        seen,
        &mut |el| match el {
            Element::Unit(u) => {
                let extra = per_unit(u.unit.unit_id.as_str(), UnitView::Value(&u.value));
                json.clear();
                // Writing a `Value` to memory cannot fail.
                let _ = serde_json::to_writer(&mut json, &u.value);
                emit(Streamed::Unit {
                    unit: u.unit,
                    json: &json,
                    extra,
                });
            }
            Element::Rejected(r) => emit(Streamed::Rejected(r)),
        },
    )
}

/// Reads one unit's value back from its own bytes in the source: the
/// independent read-back `verify` does. `header` is a CSV source's header
/// row; `first_line` is a log unit's line number.
pub fn reread(
    spec: &PartitionSpec,
    bytes: &[u8],
    header: Option<&[u8]>,
    first_line: u64,
) -> Result<Value, PartitionError> {
    let malformed = |detail: String| PartitionError::Malformed {
        format: spec.type_name(),
        offset: 0,
        line: first_line,
        detail,
    };
    match spec {
        PartitionSpec::JsonArray { .. } | PartitionSpec::Jsonl { .. } => {
            serde_json::from_slice(bytes).map_err(|e| malformed(e.to_string()))
        }
        PartitionSpec::Csv { delimiter, .. } => {
            let mut whole = header.unwrap_or_default().to_vec();
            whole.extend_from_slice(bytes);
            let delimiter = delimiter
                .as_deref()
                .and_then(|d| d.as_bytes().first().copied())
                .unwrap_or(b',');
            let mut rdr = csv::ReaderBuilder::new()
                .delimiter(delimiter)
                .has_headers(true)
                .from_reader(whole.as_slice());
            let headers = rdr.headers().map_err(|e| malformed(e.to_string()))?.clone();
            let mut record = csv::StringRecord::new();
            if !rdr
                .read_record(&mut record)
                .map_err(|e| malformed(e.to_string()))?
            {
                return Err(malformed("no row at the recorded bytes".into()));
            }
            let mut obj = serde_json::Map::new();
            for (h, v) in headers.iter().zip(record.iter()) {
                obj.insert(h.to_owned(), Value::String(v.to_owned()));
            }
            Ok(Value::Object(obj))
        }
        PartitionSpec::Lines { .. } => {
            let text = std::str::from_utf8(bytes).map_err(|e| malformed(e.to_string()))?;
            let text = text
                .split('\n')
                .map(|l| l.trim_end_matches('\r'))
                .collect::<Vec<_>>()
                .join("\n");
            Ok(serde_json::json!({"text": text, "line": first_line}))
        }
    }
}

/// The CSV header row's bytes at the start of a source, through its line
/// end, for [`reread`]. The CSV reader itself finds the end, so quoting,
/// `\r\n` and lone `\r` line ends are read as the partition read them.
pub fn csv_header<'a>(source_start: &'a [u8], delimiter: Option<&str>) -> Option<&'a [u8]> {
    let delimiter = delimiter
        .and_then(|d| d.as_bytes().first().copied())
        .unwrap_or(b',');
    let mut rdr = csv::ReaderBuilder::new()
        .delimiter(delimiter)
        .has_headers(false)
        .flexible(true)
        .from_reader(source_start);
    let mut record = csv::ByteRecord::new();
    if !rdr.read_byte_record(&mut record).ok()? {
        return None;
    }
    let mut end = usize::try_from(rdr.position().byte()).ok()?;
    // The reader stops between the `\r` and `\n` of a `\r\n`.
    if end > 0 && source_start.get(end - 1) == Some(&b'\r') && source_start.get(end) == Some(&b'\n')
    {
        end += 1;
    }
    source_start.get(..end)
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

/// The JSONL path for large inputs.
///
/// [`partition_reader`] parses each line into a `serde_json::Value`, hashes it
/// through many small hasher updates, and the prefilter then converts the
/// value again into a jq value. On multi-gigabyte sources those steps
/// dominate. This path parses each line once, with serde_json's own parser
/// (so exactly the same lines are accepted, the same errors reported and
/// numbers read identically), into a flat [`Record`] whose buffers are reused
/// from line to line; derives the same canonical unit hash from it; builds a
/// jq value only when a caller asks for one; and can spread the per-line work
/// over worker threads while still emitting elements in source order.
///
/// Unit semantics are those of [`partition_reader`] with
/// [`PartitionSpec::Jsonl`]: the same ids, hashes, ordinals, byte ranges,
/// rejections and errors (the tests below check this). What differs is the
/// memory used to detect duplicate keys: ids that are decimal integers are
/// kept as runs of consecutive numbers, so sequential ids cost nothing per
/// record; other ids are kept one by one.
pub mod fast_jsonl {
    use std::collections::BTreeMap;
    use std::fmt;
    use std::io::{self, Read};
    use std::sync::mpsc::{Receiver, sync_channel};
    use std::sync::{Arc, Mutex};

    use fanfold_core::{ByteRange, ContentHash, Unit, UnitId};
    use jaq_json::{Map, Num, Rc, Val};
    use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

    use super::{
        Coverage, PartitionError, PartitionOptions, Rejection, SeenIds, check_utf8, trim_line,
    };

    /// The hash bucket of [`super::unit_hash`].
    const UNIT_BUCKET: &str = fanfold_core::Bucket::Unit.name();

    /// Runtime knobs of the fast path; none of them changes the result.
    #[derive(Clone, Copy, Debug)]
    pub struct FastOptions {
        pub partition: PartitionOptions,
        /// Worker threads for parsing, hashing and the per-unit function;
        /// 0 or 1 runs everything on the calling thread.
        pub threads: usize,
        /// Bytes read per chunk; a chunk always ends at a line end, so a
        /// longer line makes its chunk longer.
        pub chunk_bytes: usize,
    }

    impl Default for FastOptions {
        fn default() -> Self {
            FastOptions {
                partition: PartitionOptions::default(),
                threads: std::thread::available_parallelism().map_or(1, usize::from),
                chunk_bytes: 1 << 20,
            }
        }
    }

    /// One element, in source order.
    pub enum FastElement<'a, T> {
        /// A unit, its line as it is in the source, and what the per-unit
        /// function returned for it.
        Unit {
            unit: Unit,
            raw: &'a [u8],
            extra: T,
        },
        Rejected(Rejection),
    }

    /// One JSON value read into flat buffers that are reused from line to
    /// line, so that reading a record allocates nothing once they have grown.
    /// It reads exactly what `serde_json::from_slice::<Value>` reads, with
    /// the same errors; [`Record::to_val`] equals [`crate::jq::to_val`] of
    /// that `Value` and [`Record::unit_hash`] equals [`super::unit_hash`].
    #[derive(Default)]
    pub struct Record {
        /// The value in document order: a container is followed by its
        /// items (objects: key and value, alternately).
        nodes: Vec<Node>,
        /// The parsed line, then the unescaped text of strings that had
        /// escapes; strings without escapes point into the line.
        text: Vec<u8>,
        /// Where the line being parsed lies in memory, to tell its own
        /// strings from serde's unescaped copies.
        input: (usize, usize),
    }

    #[derive(Clone, Copy, Debug)]
    enum Node {
        Null,
        Bool(bool),
        U64(u64),
        I64(i64),
        F64(f64),
        Str {
            start: usize,
            len: usize,
        },
        /// `end` is the index after the container's last descendant.
        Arr {
            len: usize,
            end: usize,
        },
        Obj {
            len: usize,
            end: usize,
        },
    }

    /// A value inside a [`Record`].
    #[derive(Clone, Copy)]
    pub struct ValueRef<'a> {
        record: &'a Record,
        at: usize,
    }

    /// What a [`ValueRef`] is, with scalars read out.
    pub enum Shape<'a> {
        Null,
        Bool(bool),
        Num(Num),
        Str(&'a [u8]),
        Arr,
        Obj,
    }

    impl Record {
        /// Replaces the content with one JSON text.
        pub fn parse(&mut self, bytes: &[u8]) -> Result<(), serde_json::Error> {
            self.nodes.clear();
            self.text.clear();
            self.text.extend_from_slice(bytes);
            self.input = (bytes.as_ptr() as usize, bytes.len());
            // Checking the whole text once is cheaper than serde checking
            // each string; invalid UTF-8 goes to serde for its own error.
            match std::str::from_utf8(bytes) {
                Ok(text) => {
                    let mut de = serde_json::Deserializer::from_str(text);
                    NodeSeed(self).deserialize(&mut de)?;
                    de.end()
                }
                Err(_) => {
                    let mut de = serde_json::Deserializer::from_slice(bytes);
                    NodeSeed(self).deserialize(&mut de)?;
                    de.end()
                }
            }
        }

        pub fn root(&self) -> ValueRef<'_> {
            ValueRef {
                record: self,
                at: 0,
            }
        }

        /// The record as a jq value.
        pub fn to_val(&self) -> Val {
            self.root().to_val()
        }

        /// The canonical unit hash; `None` only for an empty record.
        pub fn unit_hash(&self) -> Option<ContentHash> {
            self.hash_with(&mut HashScratch::default())
        }
    }

    impl<'a> ValueRef<'a> {
        pub fn shape(&self) -> Shape<'a> {
            match self.record.nodes.get(self.at) {
                None | Some(Node::Null) => Shape::Null,
                Some(Node::Bool(b)) => Shape::Bool(*b),
                Some(Node::U64(n)) => Shape::Num(Num::from_integral(*n)),
                Some(Node::I64(n)) => Shape::Num(Num::from_integral(*n)),
                Some(Node::F64(f)) => Shape::Num(Num::Float(*f)),
                Some(Node::Str { start, len }) => Shape::Str(self.record.bytes(*start, *len)),
                Some(Node::Arr { .. }) => Shape::Arr,
                Some(Node::Obj { .. }) => Shape::Obj,
            }
        }

        /// An object's field. A repeated key yields its last value, as
        /// `Value`'s map keeps it; `None` when absent or not an object.
        pub fn get(&self, key: &[u8]) -> Option<ValueRef<'a>> {
            let r = self.record;
            let Some(Node::Obj { len, .. }) = r.nodes.get(self.at) else {
                return None;
            };
            let mut found = None;
            let mut i = self.at + 1;
            for _ in 0..*len {
                if r.str_at(i) == Some(key) {
                    found = Some(i + 1);
                }
                i = r.next(i + 1);
            }
            found.map(|at| ValueRef { record: r, at })
        }

        pub fn to_val(&self) -> Val {
            self.record.val_at(self.at)
        }
    }

    /// Partitions a JSONL source like [`super::partition_reader`] with
    /// [`super::PartitionSpec::Jsonl`], and runs `per_unit` on every element
    /// that can become a unit, on the worker thread that parsed it.
    ///
    /// `make_per_unit` is called once per worker thread, because jq values
    /// and compiled jq programs cannot cross threads. `per_unit` receives
    /// the element's id and its record; it runs before duplicates are known,
    /// so its result is dropped for an element later rejected as a
    /// duplicate, and a content-derived id may still gain its `-N`
    /// occurrence suffix: the unit handed to `emit` is authoritative.
    ///
    /// Memory is bounded by a few chunks per thread, independent of the
    /// source's size (apart from the duplicate-key set, see the module docs).
    // Each input is independent of the others; a struct would only rename
    // them at every call.
    #[allow(clippy::too_many_arguments)]
    pub fn partition_jsonl<T, R, M, F>(
        key: Option<&str>,
        kind: &str,
        source_hash: ContentHash,
        reader: R,
        options: FastOptions,
        seen: &mut dyn SeenIds,
        make_per_unit: M,
        emit: &mut dyn FnMut(FastElement<'_, T>),
    ) -> Result<Coverage, PartitionError>
    where
        T: Send,
        R: Read + Send,
        M: Fn() -> F + Sync,
        F: FnMut(&str, &Record) -> T,
    {
        let lines = LineConfig {
            key,
            max_unit_bytes: options.partition.max_unit_bytes,
        };
        let mut assigner = FastAssigner {
            kind,
            key,
            source_hash,
            max_unit_bytes: options.partition.max_unit_bytes,
            seen,
            coverage: Coverage::default(),
            line_base: 0,
        };
        let chunker = Chunker {
            reader,
            carry: Vec::new(),
            offset: 0,
            chunk_bytes: options.chunk_bytes.max(1),
            eof: false,
        };
        if options.threads <= 1 {
            sequential(chunker, lines, &mut assigner, &make_per_unit, emit)?;
        } else {
            parallel(
                chunker,
                lines,
                &mut assigner,
                &make_per_unit,
                options.threads,
                emit,
            )?;
        }
        if assigner.coverage.elements == 0 {
            return Err(PartitionError::Empty);
        }
        Ok(assigner.coverage)
    }

    fn sequential<T, R: Read, F: FnMut(&str, &Record) -> T>(
        mut chunker: Chunker<R>,
        lines: LineConfig,
        assigner: &mut FastAssigner,
        make_per_unit: &dyn Fn() -> F,
        emit: &mut dyn FnMut(FastElement<'_, T>),
    ) -> Result<(), PartitionError> {
        let mut lines = LineParser::new(lines);
        let mut per_unit = make_per_unit();
        let mut buf = Vec::new();
        while let Some(base) = chunker.next_into(&mut buf)? {
            let parsed = lines.chunk(&buf, base, &mut per_unit);
            assigner.take(&buf, parsed, emit)?;
        }
        Ok(())
    }

    type Job = (u64, io::Result<(u64, Vec<u8>)>);
    type Done<T> = (u64, io::Result<(Vec<u8>, ParsedChunk<T>)>);

    /// A reader thread cuts the source into chunks of whole lines, workers
    /// parse them, and the calling thread assigns ids in source order. The
    /// chunk buffers circulate through a fixed pool, which is what bounds
    /// memory: the reader waits for a free buffer before reading on.
    fn parallel<T, R, M, F>(
        mut chunker: Chunker<R>,
        lines: LineConfig,
        assigner: &mut FastAssigner,
        make_per_unit: &M,
        threads: usize,
        emit: &mut dyn FnMut(FastElement<'_, T>),
    ) -> Result<(), PartitionError>
    where
        T: Send,
        R: Read + Send,
        M: Fn() -> F + Sync,
        F: FnMut(&str, &Record) -> T,
    {
        let slots = 2 * threads + 2;
        std::thread::scope(|s| {
            let (pool_tx, pool_rx) = sync_channel::<Vec<u8>>(slots);
            for _ in 0..slots {
                // The channel holds `slots` items, so this cannot block.
                let _ = pool_tx.send(Vec::new());
            }
            let (job_tx, job_rx) = sync_channel::<Job>(slots);
            let (done_tx, done_rx) = sync_channel::<Done<T>>(slots);
            s.spawn(move || {
                let mut seq = 0u64;
                while let Ok(mut buf) = pool_rx.recv() {
                    let job = match chunker.next_into(&mut buf) {
                        Ok(Some(base)) => Ok((base, buf)),
                        Ok(None) => return,
                        Err(e) => Err(e),
                    };
                    let failed = job.is_err();
                    if job_tx.send((seq, job)).is_err() || failed {
                        return;
                    }
                    seq += 1;
                }
            });
            // Shared by the workers only: once they all stop, the reader's
            // sends fail and it stops too.
            let job_rx = Arc::new(Mutex::new(job_rx));
            for _ in 0..threads {
                let job_rx = Arc::clone(&job_rx);
                let done_tx = done_tx.clone();
                s.spawn(move || {
                    let mut lines = LineParser::new(lines);
                    let mut per_unit = make_per_unit();
                    while let Some((seq, job)) = next_job(&job_rx) {
                        let done = job.map(|(base, buf)| {
                            let parsed = lines.chunk(&buf, base, &mut per_unit);
                            (buf, parsed)
                        });
                        if done_tx.send((seq, done)).is_err() {
                            return;
                        }
                    }
                });
            }
            drop(job_rx);
            drop(done_tx);
            let mut pending = BTreeMap::new();
            let mut next = 0u64;
            for (seq, done) in done_rx.iter() {
                pending.insert(seq, done);
                while let Some(done) = pending.remove(&next) {
                    let (buf, parsed) = done?;
                    assigner.take(&buf, parsed, emit)?;
                    let _ = pool_tx.send(buf);
                    next += 1;
                }
            }
            if pending.is_empty() {
                Ok(())
            } else {
                Err(PartitionError::Io(io::Error::other(
                    "a partition worker stopped before finishing its chunk",
                )))
            }
        })
    }

    fn next_job(rx: &Mutex<Receiver<Job>>) -> Option<Job> {
        rx.lock().ok()?.recv().ok()
    }

    /// Cuts a byte stream into chunks of whole lines.
    struct Chunker<R> {
        reader: R,
        /// The start of a line that did not fit in the previous chunk.
        carry: Vec<u8>,
        offset: u64,
        chunk_bytes: usize,
        eof: bool,
    }

    impl<R: Read> Chunker<R> {
        /// Fills `buf` with the next chunk and returns its source offset, or
        /// `None` at the end. Only the last chunk may end without a newline.
        fn next_into(&mut self, buf: &mut Vec<u8>) -> io::Result<Option<u64>> {
            buf.clear();
            buf.append(&mut self.carry);
            let mut cut = None;
            while !self.eof && cut.is_none() {
                let from = buf.len();
                let want = if from < self.chunk_bytes {
                    self.chunk_bytes - from
                } else {
                    self.chunk_bytes
                };
                buf.reserve(want);
                // `read_to_end` fills spare capacity without zeroing it first.
                let n = (&mut self.reader).take(want as u64).read_to_end(buf)?;
                if n < want {
                    self.eof = true;
                }
                // The carried part holds no newline, so only new bytes can.
                cut = buf
                    .get(from..)
                    .and_then(|new| memchr::memrchr(b'\n', new))
                    .map(|i| from + i + 1);
            }
            if !self.eof
                && let Some(cut) = cut
                && let Some(rest) = buf.get(cut..)
            {
                self.carry.extend_from_slice(rest);
                buf.truncate(cut);
            }
            if buf.is_empty() {
                return Ok(None);
            }
            let at = self.offset;
            self.offset += buf.len() as u64;
            Ok(Some(at))
        }
    }

    /// What a worker found for one non-blank line.
    struct Parsed<T> {
        /// Where the line starts in its chunk.
        at: usize,
        bytes: ByteRange,
        hash: ContentHash,
        candidate: Candidate<T>,
    }

    /// Whether a line can become a unit, decided without knowing the lines
    /// before it; duplicates are left to the assigner.
    enum Candidate<T> {
        TooLarge,
        MissingKey,
        /// The input's last line, without a line end, does not parse;
        /// `line` counts from the chunk's start.
        Truncated {
            line: u64,
            detail: String,
        },
        /// A line that does not parse, with more input after it: that one
        /// record is rejected, as in any other bad unit, and the rest
        /// stand. `line` counts from the chunk's start.
        Malformed {
            line: u64,
            offset: u64,
            detail: String,
        },
        /// Valid JSON nested past the parser's depth limit; `line` counts
        /// from the chunk's start.
        TooDeep {
            line: u64,
        },
        Ready {
            id: String,
            extra: T,
        },
    }

    struct ParsedChunk<T> {
        items: Vec<Parsed<T>>,
        lines: u64,
        /// The first bad line ends the chunk and the partition; its line
        /// number counts from the chunk's start.
        error: Option<PartitionError>,
    }

    #[derive(Clone, Copy)]
    struct LineConfig<'a> {
        key: Option<&'a str>,
        max_unit_bytes: u64,
    }

    /// Per-thread parsing state, reused from line to line.
    struct LineParser<'a> {
        key: Option<&'a str>,
        max_unit_bytes: u64,
        record: Record,
        scratch: HashScratch,
    }

    impl<'a> LineParser<'a> {
        fn new(config: LineConfig<'a>) -> Self {
            LineParser {
                key: config.key,
                max_unit_bytes: config.max_unit_bytes,
                record: Record::default(),
                scratch: HashScratch::default(),
            }
        }

        fn chunk<T, F: FnMut(&str, &Record) -> T>(
            &mut self,
            data: &[u8],
            base: u64,
            per_unit: &mut F,
        ) -> ParsedChunk<T> {
            let mut out = ParsedChunk {
                // Sized for typical log lines, so the vector rarely grows.
                items: Vec::with_capacity(data.len() / 128 + 1),
                lines: 0,
                error: None,
            };
            // `rest` is `data` from `pos` on.
            let mut rest = data;
            let mut pos = 0;
            while !rest.is_empty() {
                let len = memchr::memchr(b'\n', rest).map_or(rest.len(), |i| i + 1);
                let (line, tail) = rest.split_at_checked(len).unwrap_or((rest, &[]));
                rest = tail;
                let mut at = pos;
                pos += line.len();
                let end = pos;
                out.lines += 1;
                let mut body = trim_line(line);
                // A UTF-8 byte order mark before the first line is not data.
                if base == 0
                    && at == 0
                    && let Some(after) = body.strip_prefix(super::BOM)
                {
                    body = after;
                    at = super::BOM.len();
                }
                if body.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                let start = base + at as u64;
                let bytes = ByteRange {
                    start,
                    end: start + body.len() as u64,
                };
                match self.line(body, start, out.lines, per_unit) {
                    Ok((hash, candidate)) => out.items.push(Parsed {
                        at,
                        bytes,
                        hash,
                        candidate,
                    }),
                    // A last line with no line end that does not parse was
                    // cut off (a killed writer, a full disk): that record
                    // is rejected, the rest stand.
                    Err(PartitionError::Malformed {
                        detail,
                        line,
                        offset,
                        ..
                    }) => {
                        let candidate = if end == data.len() && data.last() != Some(&b'\n') {
                            Candidate::Truncated { line, detail }
                        } else {
                            Candidate::Malformed {
                                line,
                                offset,
                                detail,
                            }
                        };
                        out.items.push(Parsed {
                            at,
                            bytes,
                            hash: ContentHash::of_bytes(body),
                            candidate,
                        });
                    }
                    Err(e) => {
                        out.error = Some(e);
                        break;
                    }
                }
            }
            out
        }

        fn line<T, F: FnMut(&str, &Record) -> T>(
            &mut self,
            body: &[u8],
            start: u64,
            line_no: u64,
            per_unit: &mut F,
        ) -> Result<(ContentHash, Candidate<T>), PartitionError> {
            if let Err(e) = self.record.parse(body) {
                // A line that parses is valid UTF-8, so the UTF-8 check, whose
                // error takes precedence, is only needed on failure.
                check_utf8(body, start, line_no)?;
                // Nested past the parser's limit: that one record is
                // rejected, as in a JSON array, and the rest stand.
                if e.to_string().contains("recursion limit") {
                    return Ok((
                        ContentHash::of_bytes(body),
                        Candidate::TooDeep { line: line_no },
                    ));
                }
                return Err(PartitionError::Malformed {
                    format: "JSON line",
                    offset: start + e.column().saturating_sub(1) as u64,
                    line: line_no,
                    detail: e.to_string(),
                });
            }
            let record = &self.record;
            let hash = record.hash_with(&mut self.scratch);
            let hash = hash.ok_or_else(|| PartitionError::Malformed {
                format: "JSON line",
                offset: start,
                line: line_no,
                detail: "the value has no canonical JSON form".to_owned(),
            })?;
            if body.len() as u64 > self.max_unit_bytes {
                return Ok((hash, Candidate::TooLarge));
            }
            let id = match self.key {
                Some(key) => match key_id(record, key) {
                    Some(id) => id,
                    None => return Ok((hash, Candidate::MissingKey)),
                },
                None => format!("c{}", hash.short(16)),
            };
            let extra = per_unit(&id, record);
            Ok((hash, Candidate::Ready { id, extra }))
        }
    }

    impl Record {
        /// The index after the value at `i` and its descendants.
        fn next(&self, i: usize) -> usize {
            match self.nodes.get(i) {
                Some(Node::Arr { end, .. } | Node::Obj { end, .. }) => *end,
                _ => i + 1,
            }
        }

        /// The text of a string node; nodes only point into `text`.
        fn bytes(&self, start: usize, len: usize) -> &[u8] {
            self.text.get(start..start + len).unwrap_or_default()
        }

        fn str_at(&self, i: usize) -> Option<&[u8]> {
            match self.nodes.get(i) {
                Some(Node::Str { start, len }) => Some(self.bytes(*start, *len)),
                _ => None,
            }
        }

        fn val_at(&self, i: usize) -> Val {
            match self.nodes.get(i) {
                None | Some(Node::Null) => Val::Null,
                Some(Node::Bool(b)) => Val::Bool(*b),
                Some(Node::U64(n)) => Val::Num(Num::from_integral(*n)),
                Some(Node::I64(n)) => Val::Num(Num::from_integral(*n)),
                Some(Node::F64(f)) => Val::Num(Num::Float(*f)),
                Some(Node::Str { start, len }) => Val::utf8_str(self.bytes(*start, *len).to_vec()),
                Some(Node::Arr { len, .. }) => {
                    let mut items = Vec::with_capacity(*len);
                    let mut j = i + 1;
                    for _ in 0..*len {
                        items.push(self.val_at(j));
                        j = self.next(j);
                    }
                    Val::Arr(Rc::new(items))
                }
                Some(Node::Obj { len, .. }) => {
                    let mut map = Map::with_capacity_and_hasher(*len, Default::default());
                    let mut j = i + 1;
                    for _ in 0..*len {
                        // A repeated key keeps its first position and its
                        // last value, as `Value`'s ordered map does.
                        map.insert(self.val_at(j), self.val_at(j + 1));
                        j = self.next(j + 1);
                    }
                    Val::obj(map)
                }
            }
        }

        /// Writes the byte stream `StableHasher::new(Bucket::Unit)` followed by
        /// `serde_json::Value::stable_hash` would feed BLAKE3, then hashes it
        /// in one call: one pass over a few hundred contiguous bytes instead
        /// of dozens of tiny hasher updates.
        fn hash_with(&self, scratch: &mut HashScratch) -> Option<ContentHash> {
            if self.nodes.is_empty() {
                return None;
            }
            scratch.bytes.clear();
            scratch.fields.clear();
            put_bytes(&mut scratch.bytes, UNIT_BUCKET.as_bytes());
            self.encode(0, scratch);
            Some(ContentHash::of_bytes(&scratch.bytes))
        }

        fn encode(&self, i: usize, s: &mut HashScratch) {
            let Some(node) = self.nodes.get(i) else {
                return;
            };
            match *node {
                Node::Null => s.bytes.push(b'n'),
                Node::Bool(b) => s.bytes.push(if b { b'T' } else { b'F' }),
                Node::U64(n) => put_number(&mut s.bytes, |buf| write_int(false, n, buf)),
                Node::I64(n) => {
                    put_number(&mut s.bytes, |buf| write_int(n < 0, n.unsigned_abs(), buf))
                }
                Node::F64(f) => match serde_json::Number::from_f64(f) {
                    Some(n) => put_number(&mut s.bytes, |buf| {
                        buf.extend_from_slice(n.to_string().as_bytes())
                    }),
                    // Never read from JSON: `Value` holds such a float as null.
                    None => s.bytes.push(b'n'),
                },
                Node::Str { start, len } => {
                    s.bytes.push(b's');
                    put_bytes(&mut s.bytes, self.bytes(start, len));
                }
                Node::Arr { len, .. } => {
                    s.bytes.push(b'[');
                    put_u64(&mut s.bytes, len as u64);
                    let mut j = i + 1;
                    for _ in 0..len {
                        self.encode(j, s);
                        j = self.next(j);
                    }
                }
                Node::Obj { len, .. } => {
                    // The fields go on a stack shared with nested objects,
                    // so no object needs a buffer of its own.
                    let base = s.fields.len();
                    let mut j = i + 1;
                    for _ in 0..len {
                        let key = match self.nodes.get(j) {
                            Some(Node::Str { start, len }) => (*start, *len),
                            _ => (0, 0),
                        };
                        s.fields.push((key, j + 1));
                        j = self.next(j + 1);
                    }
                    let key = |f: &((usize, usize), usize)| self.bytes(f.0.0, f.0.1);
                    if i == 0 {
                        self.sort_root_fields(s);
                    } else if let Some(fields) = s.fields.get_mut(base..) {
                        // Stable, so a repeated key's occurrences stay in
                        // order and the last one (the value `Value` keeps)
                        // is found.
                        fields.sort_by(|a, b| key(a).cmp(key(b)));
                    }
                    let top = s.fields.len();
                    // The field at `k` is kept unless the next one repeats
                    // its key.
                    let kept = |s: &HashScratch, k: usize| {
                        k + 1 == top
                            || match s.fields.get(k..k + 2) {
                                Some([a, b]) => key(a) != key(b),
                                _ => true,
                            }
                    };
                    let distinct = (base..top).filter(|&k| kept(s, k)).count();
                    s.bytes.push(b'o');
                    put_u64(&mut s.bytes, distinct as u64);
                    for k in base..top {
                        if !kept(s, k) {
                            continue;
                        }
                        let Some(&field) = s.fields.get(k) else {
                            continue;
                        };
                        s.bytes.push(b's');
                        put_bytes(&mut s.bytes, key(&field));
                        self.encode(field.1, s);
                    }
                    s.fields.truncate(base);
                }
            }
        }
    }

    impl Record {
        /// Sorts the root object's fields (all of `s.fields`) by key, stably.
        /// Lines of one source mostly repeat the previous line's keys in the
        /// same order, so the order found for those keys is reused.
        fn sort_root_fields(&self, s: &mut HashScratch) {
            let key = |f: &((usize, usize), usize)| self.bytes(f.0.0, f.0.1);
            s.keys.clear();
            for f in &s.fields {
                put_bytes(&mut s.keys, key(f));
            }
            if s.keys != s.root_keys || s.root_order.len() != s.fields.len() {
                s.root_order.clear();
                s.root_order.extend(0..s.fields.len());
                let fields = &s.fields;
                s.root_order
                    .sort_by(|&a, &b| fields.get(a).map(key).cmp(&fields.get(b).map(key)));
                std::mem::swap(&mut s.keys, &mut s.root_keys);
            }
            s.sorted.clear();
            s.sorted.extend(
                s.root_order
                    .iter()
                    .filter_map(|&k| s.fields.get(k).copied()),
            );
            s.fields.clear();
            s.fields.append(&mut s.sorted);
        }
    }

    /// Buffers of the hash encoding, reused from record to record.
    #[derive(Default)]
    struct HashScratch {
        /// The root object's keys, length-prefixed, in document order.
        keys: Vec<u8>,
        /// The same for the record whose order is in `root_order`.
        root_keys: Vec<u8>,
        root_order: Vec<usize>,
        sorted: Vec<((usize, usize), usize)>,
        bytes: Vec<u8>,
        /// ((key start, key length) in the text, value index) of the
        /// fields of the objects being encoded.
        fields: Vec<((usize, usize), usize)>,
    }

    /// The id a declared key gives, as the serde path derives it.
    fn key_id(record: &Record, key: &str) -> Option<String> {
        let value = record.root().get(key.as_bytes())?;
        let mut text = Vec::new();
        match record.nodes.get(value.at)? {
            Node::Str { start, len } => text.extend_from_slice(record.bytes(*start, *len)),
            Node::U64(n) => write_int(false, *n, &mut text),
            Node::I64(n) => write_int(*n < 0, n.unsigned_abs(), &mut text),
            Node::F64(f) => text = serde_json::Number::from_f64(*f)?.to_string().into_bytes(),
            Node::Bool(b) => text.extend_from_slice(if *b { b"true" } else { b"false" }),
            _ => return None,
        }
        String::from_utf8(text).ok()
    }

    fn put_u64(buf: &mut Vec<u8>, v: u64) {
        buf.extend_from_slice(&v.to_le_bytes());
    }

    fn put_bytes(buf: &mut Vec<u8>, bytes: &[u8]) {
        put_u64(buf, bytes.len() as u64);
        buf.extend_from_slice(bytes);
    }

    /// A number's text, length first, as `serde_json::Number` displays it.
    fn put_number(buf: &mut Vec<u8>, text: impl FnOnce(&mut Vec<u8>)) {
        buf.push(b'#');
        let at = buf.len();
        put_u64(buf, 0);
        text(buf);
        let len = (buf.len() - at - 8) as u64;
        if let Some(slot) = buf.get_mut(at..at + 8) {
            slot.copy_from_slice(&len.to_le_bytes());
        }
    }

    /// Decimal digits, as `itoa` (which `serde_json::Number` uses) writes
    /// them; u64 arithmetic, as 128-bit division showed in profiles.
    fn write_int(negative: bool, mut m: u64, buf: &mut Vec<u8>) {
        // u64::MAX has 20 digits.
        let mut digits = [0u8; 20];
        let mut used = 0;
        for d in digits.iter_mut().rev() {
            *d = b'0' + (m % 10) as u8;
            m /= 10;
            used += 1;
            if m == 0 {
                break;
            }
        }
        if negative {
            buf.push(b'-');
        }
        buf.extend_from_slice(digits.get(digits.len() - used..).unwrap_or_default());
    }

    /// Appends one value to a record.
    struct NodeSeed<'r>(&'r mut Record);

    impl<'de> DeserializeSeed<'de> for NodeSeed<'_> {
        type Value = ();

        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            d.deserialize_any(self)
        }
    }

    /// Receives the same calls `Value`'s visitor would and records what
    /// `Value` would keep.
    impl<'de> Visitor<'de> for NodeSeed<'_> {
        type Value = ();

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("any valid JSON value")
        }

        fn visit_bool<E>(self, v: bool) -> Result<(), E> {
            self.0.nodes.push(Node::Bool(v));
            Ok(())
        }

        fn visit_i64<E>(self, v: i64) -> Result<(), E> {
            self.0.nodes.push(if v < 0 {
                Node::I64(v)
            } else {
                Node::U64(v as u64)
            });
            Ok(())
        }

        fn visit_u64<E>(self, v: u64) -> Result<(), E> {
            self.0.nodes.push(Node::U64(v));
            Ok(())
        }

        fn visit_f64<E>(self, v: f64) -> Result<(), E> {
            // `Value` turns a float it cannot hold into null.
            self.0.nodes.push(if v.is_finite() {
                Node::F64(v)
            } else {
                Node::Null
            });
            Ok(())
        }

        fn visit_borrowed_str<E: serde::de::Error>(self, v: &'de str) -> Result<(), E> {
            let (base, len) = self.0.input;
            match (v.as_ptr() as usize).checked_sub(base) {
                Some(start) if start + v.len() <= len => {
                    self.0.nodes.push(Node::Str {
                        start,
                        len: v.len(),
                    });
                    Ok(())
                }
                _ => self.visit_str(v),
            }
        }

        fn visit_str<E>(self, v: &str) -> Result<(), E> {
            let start = self.0.text.len();
            self.0.text.extend_from_slice(v.as_bytes());
            self.0.nodes.push(Node::Str {
                start,
                len: v.len(),
            });
            Ok(())
        }

        fn visit_unit<E>(self) -> Result<(), E> {
            self.0.nodes.push(Node::Null);
            Ok(())
        }

        fn visit_none<E>(self) -> Result<(), E> {
            self.0.nodes.push(Node::Null);
            Ok(())
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
            let at = self.0.nodes.len();
            self.0.nodes.push(Node::Null);
            let mut len = 0;
            while seq.next_element_seed(NodeSeed(&mut *self.0))?.is_some() {
                len += 1;
            }
            let end = self.0.nodes.len();
            if let Some(node) = self.0.nodes.get_mut(at) {
                *node = Node::Arr { len, end };
            }
            Ok(())
        }

        fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<(), A::Error> {
            let at = self.0.nodes.len();
            self.0.nodes.push(Node::Null);
            let mut len = 0;
            while access.next_key_seed(NodeSeed(&mut *self.0))?.is_some() {
                access.next_value_seed(NodeSeed(&mut *self.0))?;
                len += 1;
            }
            let end = self.0.nodes.len();
            if let Some(node) = self.0.nodes.get_mut(at) {
                *node = Node::Obj { len, end };
            }
            Ok(())
        }
    }

    /// The sequential half of the partitioner: ordinals, duplicates,
    /// coverage. Mirrors `Assigner` message for message.
    struct FastAssigner<'a> {
        kind: &'a str,
        key: Option<&'a str>,
        source_hash: ContentHash,
        max_unit_bytes: u64,
        seen: &'a mut dyn SeenIds,
        coverage: Coverage,
        /// Lines in the chunks taken so far.
        line_base: u64,
    }

    impl FastAssigner<'_> {
        fn take<T>(
            &mut self,
            data: &[u8],
            parsed: ParsedChunk<T>,
            emit: &mut dyn FnMut(FastElement<'_, T>),
        ) -> Result<(), PartitionError> {
            for p in parsed.items {
                let Some(raw) = data.get(p.at..p.at + p.bytes.len() as usize) else {
                    return Err(PartitionError::Io(io::Error::other(format!(
                        "bytes {}..{} lie outside the chunk that was read",
                        p.bytes.start, p.bytes.end
                    ))));
                };
                emit(self.element(p, raw)?);
            }
            if let Some(mut e) = parsed.error {
                if let PartitionError::Malformed { line, .. }
                | PartitionError::NotUtf8 { line, .. } = &mut e
                {
                    *line += self.line_base;
                }
                return Err(e);
            }
            self.line_base += parsed.lines;
            Ok(())
        }

        fn element<'r, T>(
            &mut self,
            p: Parsed<T>,
            raw: &'r [u8],
        ) -> Result<FastElement<'r, T>, PartitionError> {
            let ordinal = self.coverage.elements;
            self.coverage.elements += 1;
            let bytes = p.bytes;
            let mut reject = |reason: &str, detail: String| {
                self.coverage.rejected += 1;
                FastElement::Rejected(Rejection {
                    ordinal,
                    bytes,
                    reason: reason.to_owned(),
                    detail,
                })
            };
            let (id, extra) = match p.candidate {
                Candidate::TooLarge => {
                    let detail = format!(
                        "element {ordinal} at bytes {}..{} is {} bytes, over the {}-byte unit limit; raise --max-unit-bytes or split the record",
                        bytes.start,
                        bytes.end,
                        bytes.len(),
                        self.max_unit_bytes
                    );
                    return Ok(reject("too_large", detail));
                }
                Candidate::MissingKey => {
                    let key = self.key.unwrap_or_default();
                    let detail = format!(
                        "element {ordinal} at byte {} has no scalar `{key}` field",
                        bytes.start
                    );
                    return Ok(reject("missing_key", detail));
                }
                Candidate::Truncated { line, detail } => {
                    let detail = format!(
                        "element {ordinal} at bytes {}..{}, the last line, has no line end and does not parse (line {}: {detail}); it was cut off",
                        bytes.start,
                        bytes.end,
                        self.line_base + line
                    );
                    return Ok(reject("truncated_line", detail));
                }
                Candidate::Malformed {
                    line,
                    offset,
                    detail,
                } => {
                    let detail = format!(
                        "element {ordinal} at bytes {}..{} (line {}) is not JSON: {detail} at byte {offset}",
                        bytes.start,
                        bytes.end,
                        self.line_base + line
                    );
                    return Ok(reject("malformed_line", detail));
                }
                Candidate::TooDeep { line } => {
                    let detail = format!(
                        "element {ordinal} at bytes {}..{} (line {}) is nested more than {} levels deep",
                        bytes.start,
                        bytes.end,
                        self.line_base + line,
                        super::MAX_DEPTH
                    );
                    return Ok(reject("too_deep", detail));
                }
                Candidate::Ready { id, extra } => (id, extra),
            };
            let id = match self.key {
                Some(key) => {
                    if let Some(flaw) = super::key_flaw(&id) {
                        let detail = format!(
                            "element {ordinal} at byte {}: its `{key}` {flaw}",
                            bytes.start
                        );
                        return Ok(reject("bad_key", detail));
                    }
                    if !self.seen.first(&id, ordinal)? {
                        self.coverage.rejected += 1;
                        let detail = super::repeat_detail(ordinal, bytes.start, key, &id);
                        return Ok(FastElement::Rejected(Rejection {
                            ordinal,
                            bytes,
                            reason: "duplicate_key".to_owned(),
                            detail,
                        }));
                    }
                    id
                }
                None => super::content_id(&mut *self.seen, id, ordinal)?,
            };
            self.coverage.units += 1;
            Ok(FastElement::Unit {
                unit: Unit {
                    unit_id: UnitId(id),
                    unit_kind: self.kind.to_owned(),
                    ordinal,
                    source_hash: self.source_hash,
                    unit_hash: p.hash,
                    bytes,
                },
                raw,
                extra,
            })
        }
    }

    #[cfg(test)]
    mod tests {
        use super::super::{Element, PartitionSpec, partition_all};
        use super::*;
        use crate::jq::to_val;
        use crate::prefilter::{Outcome, Prefilter};
        use fanfold_core::spec::{PrefilterAction, PrefilterRule};

        /// Lines that exercise every kind of value, duplicate and missing
        /// keys, blank lines, CRLF and a missing final newline.
        const SOURCE: &str = concat!(
            "{\"id\": 3, \"level\": \"ERROR\", \"latency_ms\": 900, \"user\": {\"b\": 1, \"a\": [1, 2.5, -3, null, true]}}\n",
            "\n",
            "{\"id\": \"x-1\", \"level\": \"INFO\", \"latency_ms\": 12, \"msg\": \"caf\\u00e9 \\\"q\\\" \\n\"}\r\n",
            "{\"id\": 4, \"level\": \"ERROR\", \"latency_ms\": 1e3, \"big\": 18446744073709551615, \"neg\": -9223372036854775808}\n",
            "   \n",
            "{\"id\": 3, \"level\": \"WARN\"}\n",
            "{\"level\": \"ERROR\", \"latency_ms\": 501}\n",
            "{\"id\": true, \"x\": 0.1, \"y\": -0.0, \"z\": 123456789012345678901234567890}\n",
            "{\"id\": 5, \"dup\": 1, \"dup\": 2, \"e\": {}, \"f\": []}\n",
            "{\"id\": \"5\"}\n",
            "{\"id\": 6, \"pad\": \"0123456789012345678901234567890123456789\"}\n",
            "{\"id\": 7, \"level\": \"ERROR\", \"latency_ms\": 501}"
        );

        fn rules() -> Vec<PrefilterRule> {
            vec![PrefilterRule {
                name: "quiet".into(),
                when: r#"(.level == "ERROR" and .latency_ms > 500) | not"#.into(),
                action: PrefilterAction::Exclude,
                reason: None,
                stage: None,
            }]
        }

        type Row = (Result<(Unit, Outcome), Rejection>, Vec<u8>);

        fn serde_path(key: Option<&str>, max: u64) -> Vec<Row> {
            let spec = PartitionSpec::Jsonl {
                key: key.map(str::to_owned),
                kind: "event".into(),
            };
            let pf = Prefilter::compile(&rules()).expect("compiles");
            let mut rows = Vec::new();
            super::super::partition(
                &spec,
                SOURCE.as_bytes(),
                PartitionOptions {
                    max_unit_bytes: max,
                },
                |el| match el {
                    Element::Unit(u) => {
                        let raw = SOURCE.as_bytes()
                            [u.unit.bytes.start as usize..u.unit.bytes.end as usize]
                            .to_vec();
                        let outcome = pf
                            .decide(u.unit.unit_id.as_str(), to_val(&u.value))
                            .expect("decides");
                        rows.push((Ok((u.unit, outcome)), raw));
                    }
                    Element::Rejected(r) => rows.push((Err(r), Vec::new())),
                },
            )
            .expect("partitions");
            rows
        }

        fn fast_path(key: Option<&str>, max: u64, threads: usize, chunk: usize) -> Vec<Row> {
            let options = FastOptions {
                partition: PartitionOptions {
                    max_unit_bytes: max,
                },
                threads,
                chunk_bytes: chunk,
            };
            let mut rows = Vec::new();
            partition_jsonl(
                key,
                "event",
                ContentHash::of_bytes(SOURCE.as_bytes()),
                SOURCE.as_bytes(),
                options,
                &mut crate::partition::SeenKeys::default(),
                || {
                    let pf = Prefilter::compile(&rules()).expect("compiles");
                    move |id: &str, r: &Record| pf.decide(id, r.to_val()).expect("decides")
                },
                &mut |el| match el {
                    FastElement::Unit { unit, raw, extra } => {
                        rows.push((Ok((unit, extra)), raw.to_vec()))
                    }
                    FastElement::Rejected(r) => rows.push((Err(r), Vec::new())),
                },
            )
            .expect("partitions");
            rows
        }

        #[test]
        fn same_units_hashes_and_decisions_as_the_serde_path() {
            for (key, max) in [(Some("id"), 1 << 20), (None, 1 << 20), (Some("id"), 60)] {
                let want = serde_path(key, max);
                assert!(want.iter().any(|r| r.0.is_ok()));
                for (threads, chunk) in [(1, 1 << 20), (1, 7), (2, 1), (3, 50)] {
                    let got = fast_path(key, max, threads, chunk);
                    assert_eq!(got, want, "key {key:?}, threads {threads}, chunk {chunk}");
                }
            }
            let keyed = serde_path(Some("id"), 1 << 20);
            let reasons: Vec<&str> = keyed
                .iter()
                .filter_map(|r| r.0.as_ref().err().map(|r| r.reason.as_str()))
                .collect();
            assert_eq!(reasons, ["duplicate_key", "missing_key", "duplicate_key"]);
        }

        #[test]
        fn content_ids_count_repeats() {
            let src = "{\"a\": 1}\n{\"a\": 1}\n{\"a\": 2}\n";
            let mut ids = Vec::new();
            partition_jsonl(
                None,
                "row",
                ContentHash::of_bytes(src.as_bytes()),
                src.as_bytes(),
                FastOptions::default(),
                &mut crate::partition::SeenKeys::default(),
                || |_: &str, _: &Record| (),
                &mut |el| {
                    if let FastElement::Unit { unit, .. } = el {
                        ids.push(unit.unit_id.0)
                    }
                },
            )
            .expect("partitions");
            assert_eq!(ids[1], format!("{}-2", ids[0]));
            assert_ne!(ids[2], ids[0]);
        }

        #[test]
        fn errors_match_the_serde_path() {
            let spec = PartitionSpec::Jsonl {
                key: Some("id".into()),
                kind: "event".into(),
            };
            let cases: [&[u8]; 2] = [b"{\"id\": 1}\n{\"id\": 2, \"t\": \"caf\xe9\"}\n", b"\n  \n"];
            for src in cases {
                let want = partition_all(&spec, src, PartitionOptions::default())
                    .map(|(_, _, coverage)| coverage)
                    .expect_err("fails")
                    .to_string();
                for (threads, chunk) in [(1, 1 << 20), (2, 3)] {
                    let options = FastOptions {
                        threads,
                        chunk_bytes: chunk,
                        ..FastOptions::default()
                    };
                    let got = partition_jsonl(
                        Some("id"),
                        "event",
                        ContentHash::of_bytes(src),
                        src,
                        options,
                        &mut crate::partition::SeenKeys::default(),
                        || |_: &str, _: &Record| (),
                        &mut |_| {},
                    )
                    .expect_err("fails")
                    .to_string();
                    assert_eq!(got, want);
                }
            }
        }

        /// A line that is not JSON is rejected alike however the input is
        /// cut into chunks and threads.
        #[test]
        fn malformed_lines_are_rejected_alike_at_any_chunking() {
            for src in [
                &b"{\"id\": 1}\n{\"id\": 2}\n\n{\"id\": }\n{\"id\": 4}\n"[..],
                b"{\"id\": 1} x\n{\"id\": 2}\n",
            ] {
                let spec = PartitionSpec::Jsonl {
                    key: Some("id".into()),
                    kind: "event".into(),
                };
                let (_, want, _) =
                    partition_all(&spec, src, PartitionOptions::default()).expect("partitions");
                assert_eq!(want.len(), 1);
                assert_eq!(want[0].reason, "malformed_line");
                for (threads, chunk) in [(1, 1 << 20), (2, 3)] {
                    let options = FastOptions {
                        threads,
                        chunk_bytes: chunk,
                        ..FastOptions::default()
                    };
                    let mut got = Vec::new();
                    partition_jsonl(
                        Some("id"),
                        "event",
                        ContentHash::of_bytes(src),
                        src,
                        options,
                        &mut crate::partition::SeenKeys::default(),
                        || |_: &str, _: &Record| (),
                        &mut |e| {
                            if let FastElement::Rejected(r) = e {
                                got.push(r);
                            }
                        },
                    )
                    .expect("partitions");
                    assert_eq!(got, want, "threads {threads}, chunk {chunk}");
                }
            }
        }

        #[test]
        fn hashes_match_for_odd_values() {
            for text in [
                "[]",
                "{}",
                "\"\"",
                "1.5e300",
                "-1",
                "[{\"b\": {\"d\": 1, \"c\": [[]]}, \"a\": null}]",
                "{\"\\u00e9\": 1, \"e\": 2, \"z\": 3}",
            ] {
                let value: serde_json::Value = serde_json::from_str(text).expect("json");
                let mut record = Record::default();
                record.parse(text.as_bytes()).expect("parses");
                assert_eq!(record.unit_hash(), Some(super::super::unit_hash(&value)));
                assert_eq!(record.to_val(), to_val(&value), "{text}");
            }
        }

        #[test]
        fn hashes_stay_right_when_key_orders_repeat() {
            let mut record = Record::default();
            let mut scratch = HashScratch::default();
            for text in [
                r#"{"b": 1, "a": 2}"#,
                r#"{"b": 3, "a": {"y": 1, "x": 2}}"#,
                r#"{"a": 1, "b": 2}"#,
                r#"{"b": 5, "a": 6, "b": 7}"#,
                r#"{"b": 5, "a": 6, "b": 8}"#,
                r#"{"b": 1, "a": 2}"#,
                r#"{"b": 1, "aa": 2}"#,
                r#"{"bb": 1, "a": 2}"#,
            ] {
                let value: serde_json::Value = serde_json::from_str(text).expect("json");
                record.parse(text.as_bytes()).expect("parses");
                assert_eq!(
                    record.hash_with(&mut scratch),
                    Some(super::super::unit_hash(&value)),
                    "{text}"
                );
            }
        }

        #[test]
        fn integer_runs_detect_repeats_exactly() {
            let mut seen = crate::partition::SeenKeys::default();
            for n in ["5", "7", "6", "4", "8", "10", "0", "18446744073709551615"] {
                assert!(seen.insert(n), "{n}");
            }
            assert_eq!(seen.runs.len(), 4);
            for n in ["4", "5", "6", "7", "8", "10", "0", "18446744073709551615"] {
                assert!(!seen.insert(n), "{n}");
            }
            assert!(seen.insert("9"));
            assert_eq!(seen.runs.len(), 3);
            assert!(seen.insert("007"));
            assert!(!seen.insert("007"));
            assert!(seen.insert("18446744073709551616"));
        }
    }
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
        let err = partition_all(&json_array_spec(), &bad, PartitionOptions::default())
            .expect_err("fails");
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
            let err = partition_all(&json_array_spec(), src, PartitionOptions::default())
                .expect_err("fails");
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
}
