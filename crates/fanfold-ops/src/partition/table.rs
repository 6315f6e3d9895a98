//! CSV with a header row: each row becomes an object keyed by the header.

use super::*;

/// A short row that spans several lines and runs to the end of the input
/// is a quote opened and never closed: the quoted field swallowed the
/// rows after it. Said so, with the line where the row starts, rather than
/// as a count of fields. (A closed multi-line field in a short row that
/// ends before the input does keeps the count-of-fields message.)
fn unterminated_quote(
    e: &::csv::Error,
    start: &::csv::Position,
    end: &::csv::Position,
    at_end: bool,
) -> Option<PartitionError> {
    let ::csv::ErrorKind::UnequalLengths {
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
    let mut rdr = ::csv::ReaderBuilder::new()
        .delimiter(delimiter)
        .has_headers(true)
        .from_reader(reader);
    let csv_error = |e: ::csv::Error| {
        let (offset, line) = e.position().map(|p| (p.byte(), p.line())).unwrap_or((0, 0));
        match e.kind() {
            ::csv::ErrorKind::Utf8 { .. } => PartitionError::NotUtf8 { offset, line },
            ::csv::ErrorKind::UnequalLengths {
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
    let mut record = ::csv::StringRecord::new();
    loop {
        let start = rdr.position().clone();
        let read = rdr.read_record(&mut record);
        let read = match read {
            Err(e) => {
                // The row ran to the end when nothing follows it (the
                // read is failing anyway, so looking ahead costs nothing).
                let at_end = matches!(rdr.read_record(&mut ::csv::StringRecord::new()), Ok(false));
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
        let value = row_object(&headers, &record);
        let canonical = unit_hash(&value);
        emit(assigner.element(value, ByteRange { start, end }, canonical)?);
    }
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
