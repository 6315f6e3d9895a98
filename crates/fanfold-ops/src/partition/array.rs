//! A JSON array of objects, the shape `gh ... --json` writes, read through
//! a bounded window.

use std::io::Read;

use super::assign::Proposed;
use super::nested::{Inner, admit_record};
use super::*;

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
pub(super) fn json_array(
    reader: impl BufRead,
    inner: &Inner,
    record_key: Option<&str>,
    assigner: &mut Assigner,
    emit: &mut dyn FnMut(Element),
) -> Result<(), PartitionError> {
    let mut w = Window::new(reader);
    while w.buf.len() < BOM.len() && w.fill()? {}
    let mut i = w.skip_ws(if w.buf.starts_with(BOM) { BOM.len() } else { 0 })?;
    if i == w.buf.len() {
        return Err(PartitionError::Empty);
    }
    if w.buf.get(i) == Some(&b'{') && matches!(inner, Inner::Path { .. }) {
        return top_level_object(&mut w, i, inner, assigner, emit);
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
            match super::json::scan_value(&w.buf, start) {
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
        match json::parse_value(slice) {
            Ok((_, Some(name))) => {
                let line = w.line_at(start);
                emit(Element::Rejected(
                    assigner.repeated_field(range, line, &name),
                ));
            }
            Ok((value, None)) if inner.is_whole() => {
                let canonical = unit_hash(&value);
                let id = match assigner.key {
                    Some(key) => Proposed::Key(super::json::record_key_id(&value, slice, key)),
                    None => Proposed::Derived(format!("c{}", canonical.short(16))),
                };
                emit(assigner.element_with_id(id, value, range, canonical)?);
            }
            // A record split into units: each is admitted at the record's
            // bytes, under an id from the record's and its place in it.
            Ok((value, None)) => {
                let (record_id, derived) = match record_key {
                    Some(key) => (super::json::record_key_id(&value, slice, key), false),
                    None => (Some(format!("c{}", unit_hash(&value).short(16))), true),
                };
                let line = w.line_at(start);
                admit_record(
                    inner, assigner, record_key, value, record_id, derived, range, line, emit,
                )?;
            }
            // Valid JSON nested past the parser's depth limit: that one
            // record is rejected, the rest stand.
            Err(e) if e.to_string().contains("recursion limit") => {
                let line = w.line_at(start);
                emit(Element::Rejected(assigner.reject(
                    range,
                    "too_deep",
                    |ordinal| too_deep_detail(ordinal, range, line),
                )));
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

/// A source that is one JSON object, read whole: the one record a path
/// splits, its elements named by their place from the top (`items[3]`).
fn top_level_object<R: BufRead>(
    w: &mut Window<R>,
    start: usize,
    inner: &Inner,
    assigner: &mut Assigner,
    emit: &mut dyn FnMut(Element),
) -> Result<(), PartitionError> {
    while w.fill()? {}
    let end = super::json::scan_value(&w.buf, start).map_err(|(at, why)| w.malformed(at, why))?;
    let rest = w.skip_ws(end)?;
    if rest != w.buf.len() {
        return Err(w.malformed(rest, "trailing characters after the object"));
    }
    let Some(slice) = w.buf.get(start..end) else {
        return Err(w.malformed(start, "the object runs past the input"));
    };
    let range = ByteRange {
        start: w.base + start as u64,
        end: w.base + end as u64,
    };
    let line = w.line_at(start);
    match json::parse_value(slice) {
        Ok((_, Some(name))) => {
            emit(Element::Rejected(
                assigner.repeated_field(range, line, &name),
            ));
            Ok(())
        }
        Ok((value, None)) => admit_record(
            inner,
            assigner,
            None,
            value,
            Some(String::new()),
            false,
            range,
            line,
            emit,
        ),
        Err(e) => {
            let at = json_error_at(&w.buf, start, &e);
            Err(w.malformed(at, &e.to_string()))
        }
    }
}
