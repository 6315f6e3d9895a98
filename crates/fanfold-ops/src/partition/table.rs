//! CSV with a header row: each row becomes an object keyed by the header.

use std::io::Read;

use super::*;

/// A reader that keeps the bytes it hands out, from the start of the row
/// being read on, so a row's own bytes can be looked at, and the input read
/// again from inside a row that went wrong.
struct Kept<R> {
    inner: R,
    /// Bytes to hand out again before reading `inner` on.
    replay: Vec<u8>,
    replayed: usize,
    /// The source offset of `kept[0]`.
    base: u64,
    kept: Vec<u8>,
}

impl<R: Read> Read for Kept<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = match self.replay.get(self.replayed..) {
            Some(rest) if !rest.is_empty() => {
                let n = rest.len().min(buf.len());
                for (to, from) in buf.iter_mut().zip(rest) {
                    *to = *from;
                }
                self.replayed += n;
                n
            }
            _ => self.inner.read(buf)?,
        };
        self.kept
            .extend_from_slice(buf.get(..n).unwrap_or_default());
        Ok(n)
    }
}

impl<R> Kept<R> {
    /// The bytes at source offsets `start..end`, when still kept.
    fn bytes(&self, start: u64, end: u64) -> Option<&[u8]> {
        let from = usize::try_from(start.checked_sub(self.base)?).ok()?;
        let to = usize::try_from(end.checked_sub(self.base)?).ok()?;
        self.kept.get(from..to)
    }

    /// Forgets the bytes before source offset `at`, once they are most of
    /// what is kept (so each byte is moved a few times at most).
    fn forget_before(&mut self, at: u64) {
        let Some(n) = at
            .checked_sub(self.base)
            .and_then(|n| usize::try_from(n).ok())
        else {
            return;
        };
        if n >= 1 << 16 && n * 2 >= self.kept.len() && n <= self.kept.len() {
            self.kept.drain(..n);
            self.base = at;
        }
    }

    /// Hands out the bytes from source offset `at` on again, before
    /// whatever had not been handed out yet.
    fn rewind_to(&mut self, at: u64) {
        let from = at
            .checked_sub(self.base)
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or(0)
            .min(self.kept.len());
        let mut replay = self.kept.split_off(from);
        replay.extend_from_slice(self.replay.get(self.replayed..).unwrap_or_default());
        self.replay = replay;
        self.replayed = 0;
        self.kept.clear();
        self.base = at;
    }
}

/// A quoted field the CSV reader read to the end of the input, or closed
/// only lines later by a quote with text after it: the quote was opened by
/// mistake, and the field swallowed the rows after it.
struct QuoteFault {
    /// Index of the opening quote in the row's bytes.
    open: usize,
    /// Index of the quote that closed it, when one did.
    closed_at: Option<usize>,
}

/// Reads a row's bytes as the CSV reader (`csv-core`, default quoting)
/// reads them, for a quoted field that ran on wrongly: one still open at
/// the row's end (the reader met the end of the input inside it), or one
/// spanning lines whose closing quote is followed by text rather than a
/// delimiter or a line end (the reader takes such a quote as closing, and
/// reads on; a well-formed field never has one).
fn quote_fault(row: &[u8], delimiter: u8) -> Option<QuoteFault> {
    enum At {
        FieldStart,
        Field,
        Quoted,
        QuoteInQuoted,
    }
    let ends_field = |b: u8| b == delimiter || b == b'\n' || b == b'\r';
    let mut at = At::FieldStart;
    let mut open = 0;
    let mut spans_lines = false;
    for (i, &b) in row.iter().enumerate() {
        at = match at {
            At::FieldStart if b == b'"' => {
                open = i;
                spans_lines = false;
                At::Quoted
            }
            At::FieldStart | At::Field if ends_field(b) => At::FieldStart,
            At::FieldStart | At::Field => At::Field,
            At::Quoted if b == b'"' => At::QuoteInQuoted,
            At::Quoted => {
                spans_lines |= b == b'\n' || b == b'\r';
                At::Quoted
            }
            At::QuoteInQuoted if b == b'"' => At::Quoted,
            At::QuoteInQuoted if ends_field(b) => At::FieldStart,
            At::QuoteInQuoted if spans_lines => {
                return Some(QuoteFault {
                    open,
                    closed_at: Some(i - 1),
                });
            }
            At::QuoteInQuoted => At::Field,
        };
    }
    matches!(at, At::Quoted).then_some(QuoteFault {
        open,
        closed_at: None,
    })
}

/// Where a part of the source read by one CSV reader starts.
#[derive(Clone, Copy)]
struct Part {
    byte: u64,
    line: u64,
}

impl Part {
    /// A reader position as a source offset and line.
    fn at(&self, p: &::csv::Position) -> (u64, u64) {
        (self.byte + p.byte(), self.line + p.line() - 1)
    }
}

/// CSV rows as units under the header row. A row whose quote runs on
/// wrongly ([`quote_fault`]) is rejected as `unterminated_quote`, naming
/// where it opened, and the input is read again from the line after that
/// quote's, so the rows the field swallowed are units still.
pub(super) fn csv_rows(
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
    let mut source = Kept {
        inner: reader,
        replay: Vec::new(),
        replayed: 0,
        base: 0,
        kept: Vec::new(),
    };
    let mut part = Part { byte: 0, line: 1 };
    let mut headers: Option<::csv::StringRecord> = None;
    let mut record = ::csv::StringRecord::new();
    loop {
        // Field counts are checked here, against the header, so that a
        // reader started inside the source checks them the same way.
        let mut rdr = ::csv::ReaderBuilder::new()
            .delimiter(delimiter)
            .has_headers(false)
            .flexible(true)
            .from_reader(source);
        let resume = loop {
            let (start, start_line) = part.at(rdr.position());
            if !rdr
                .read_record(&mut record)
                .map_err(|e| csv_error(e, part))?
            {
                break None;
            }
            let (end, _) = part.at(rdr.position());
            let row = rdr.get_ref().bytes(start, end).unwrap_or_default();
            let fault = match memchr::memchr(b'"', row) {
                Some(_) => quote_fault(row, delimiter),
                None => None,
            };
            if let Some(fault) = fault {
                let (rejection, resume) =
                    runaway_quote(row, start, start_line, &fault, headers.is_none())?;
                emit(Element::Rejected(assigner.reject(
                    rejection.bytes,
                    "unterminated_quote",
                    |ordinal| rejection.detail(ordinal),
                )));
                break resume;
            }
            rdr.get_mut().forget_before(end);
            let Some(headers) = &headers else {
                headers = Some(record.clone());
                continue;
            };
            if record.len() != headers.len() {
                return Err(PartitionError::Malformed {
                    format: "CSV",
                    offset: start,
                    line: start_line,
                    detail: format!(
                        "row has {} fields, the header has {}; quote fields that contain the delimiter",
                        record.len(),
                        headers.len()
                    ),
                });
            }
            let value = row_object(headers, &record);
            let canonical = unit_hash(&value);
            emit(assigner.element(value, ByteRange { start, end }, canonical)?);
        };
        let Some(resume) = resume else {
            return Ok(());
        };
        source = rdr.into_inner();
        source.rewind_to(resume.byte);
        part = resume;
    }
}

/// A CSV reader's error, at its place in the source.
fn csv_error(e: ::csv::Error, part: Part) -> PartitionError {
    let (offset, line) = e.position().map(|p| part.at(p)).unwrap_or((part.byte, 0));
    match e.kind() {
        ::csv::ErrorKind::Utf8 { .. } => PartitionError::NotUtf8 { offset, line },
        _ => PartitionError::Malformed {
            format: "CSV",
            offset,
            line,
            detail: e.to_string(),
        },
    }
}

/// A row rejected for a quote that ran on, and why.
struct RunawayRow {
    bytes: ByteRange,
    line: u64,
    quote: u64,
    quote_line: u64,
    /// The line where the reader found it closed, or `None` at the end.
    closed_line: Option<u64>,
    last_line: u64,
    /// Whether lines follow the opening quote's, to be read again.
    lines_after: bool,
}

impl RunawayRow {
    fn detail(&self, ordinal: u64) -> String {
        let (at, start) = (self.bytes.start, self.line);
        let (quote, quote_line) = (self.quote, self.quote_line);
        let ran = match self.closed_line {
            None => format!(
                "is never closed: the CSV reader read it on to the end of the input (line {})",
                self.last_line
            ),
            Some(l) => format!(
                "is closed only on line {l}, by a quote with text after it, where no field ends"
            ),
        };
        let again = if self.lines_after {
            ", and the lines after it are read again as rows"
        } else {
            ""
        };
        format!(
            "element {ordinal} at byte {at} (line {start}): the quoted field opened at byte {quote} \
             (line {quote_line}) {ran}; this row is not judged{again}: close the quote, or double \
             a quote inside a field (\"\")"
        )
    }
}

/// The rejection for a row whose quote ran on, and where to read again:
/// from the line end after the opening quote (the line is the row's, and
/// the lines after it are rows the field swallowed). A header row that
/// runs on is an error: without it no row can be read.
fn runaway_quote(
    row: &[u8],
    start: u64,
    start_line: u64,
    fault: &QuoteFault,
    is_header: bool,
) -> Result<(RunawayRow, Option<Part>), PartitionError> {
    let lines_in = |bytes: &[u8]| memchr::memchr_iter(b'\n', bytes).count() as u64;
    // The row's first byte after any line ends the reader skips.
    let lead = row
        .iter()
        .take_while(|b| matches!(b, b'\n' | b'\r'))
        .count();
    let line = start_line + lines_in(row.get(..lead).unwrap_or_default());
    let quote_line = start_line + lines_in(row.get(..fault.open).unwrap_or_default());
    let line_end = row
        .get(fault.open..)
        .and_then(|rest| memchr::memchr2(b'\n', b'\r', rest))
        .map(|i| fault.open + i);
    let closed_line = fault
        .closed_at
        .map(|at| start_line + lines_in(row.get(..at).unwrap_or_default()));
    let rejected = RunawayRow {
        bytes: ByteRange {
            start: start + lead as u64,
            end: start + line_end.unwrap_or(row.len()) as u64,
        },
        line,
        quote: start + fault.open as u64,
        quote_line,
        closed_line,
        last_line: start_line + lines_in(trim_line(row)),
        lines_after: line_end.is_some_and(|i| {
            row.get(i..)
                .is_some_and(|rest| rest.iter().any(|b| !matches!(b, b'\n' | b'\r')))
        }),
    };
    if is_header {
        return Err(PartitionError::Malformed {
            format: "CSV",
            offset: rejected.quote,
            line: quote_line,
            detail: "the header row's quoted field opened here runs on past its line and is \
                     never closed where a field ends; close the quote"
                .into(),
        });
    }
    // Read again from the line end itself: the reader skips it as an
    // empty line, and a byte order mark after it is then a field's.
    let resume = line_end.map(|i| Part {
        byte: start + i as u64,
        line: quote_line,
    });
    Ok((rejected, resume))
}

/// The CSV header row's bytes at the start of a source, through its line
/// end, for [`reread`]. The CSV reader itself finds the end, so quoting,
/// `\r\n` and lone `\r` line ends are read as the partition read them.
pub fn csv_header<'a>(source_start: &'a [u8], delimiter: Option<&str>) -> Option<&'a [u8]> {
    let delimiter = delimiter_byte(delimiter);
    let mut rdr = ::csv::ReaderBuilder::new()
        .delimiter(delimiter)
        .has_headers(false)
        .flexible(true)
        .from_reader(source_start);
    let mut record = ::csv::ByteRecord::new();
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

/// One row read back from its own bytes, under the source's `header`.
pub(super) fn reread_row(
    bytes: &[u8],
    header: Option<&[u8]>,
    delimiter: Option<&str>,
) -> Result<Value, String> {
    let mut whole = header.unwrap_or_default().to_vec();
    whole.extend_from_slice(bytes);
    let delimiter = delimiter_byte(delimiter);
    let mut rdr = ::csv::ReaderBuilder::new()
        .delimiter(delimiter)
        .has_headers(true)
        .from_reader(whole.as_slice());
    let headers = rdr.headers().map_err(|e| e.to_string())?.clone();
    let mut record = ::csv::StringRecord::new();
    if !rdr.read_record(&mut record).map_err(|e| e.to_string())? {
        return Err("no row at the recorded bytes".into());
    }
    Ok(row_object(&headers, &record))
}

/// A read-back's delimiter: the spec's single byte, `,` when absent (the
/// partition has already refused a longer one).
fn delimiter_byte(delimiter: Option<&str>) -> u8 {
    delimiter
        .and_then(|d| d.as_bytes().first().copied())
        .unwrap_or(b',')
}

/// A row as an object keyed by the header.
fn row_object(headers: &::csv::StringRecord, record: &::csv::StringRecord) -> Value {
    let mut obj = serde_json::Map::new();
    for (h, v) in headers.iter().zip(record.iter()) {
        obj.insert(h.to_owned(), Value::String(v.to_owned()));
    }
    Value::Object(obj)
}
