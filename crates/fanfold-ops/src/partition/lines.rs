//! Text lines: one record a line, or multi-line records opened by a line
//! that matches `record_start` (stack traces).

use super::*;

/// Log lines: one record a line, or multi-line records opened by a line that
/// matches `record_start`. A unit's value is `{"text": ..., "line": N}`.
pub(super) fn lines(
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

/// One record read back from its own bytes: its lines, without their ends.
pub(super) fn reread_record(bytes: &[u8], first_line: u64) -> Result<Value, String> {
    let text = std::str::from_utf8(bytes).map_err(|e| e.to_string())?;
    let text = text
        .split('\n')
        .map(|l| l.trim_end_matches('\r'))
        .collect::<Vec<_>>()
        .join("\n");
    Ok(serde_json::json!({"text": text, "line": first_line}))
}
