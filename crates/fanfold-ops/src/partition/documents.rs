//! Documents as input: the documents stream, one JSON [`Document`] line
//! per file in path order (written by the engine's folder walk, which is
//! where files are read), split here into units.
//!
//! The document formats (`files`, `email`, `markdown`, `code`) read this
//! stream and split each document into pieces; [`each_piece`] gives every
//! piece to the one assigner. A unit's byte range is its document's line
//! in the stream; where a piece lies inside its file is in its own fields
//! (`start`, `end`, `line`).

use std::io::BufRead;

use fanfold_core::ByteRange;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::assign::{Assigner, Proposed};
use super::{Element, PartitionError};

/// One file of the stream.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Document {
    /// Relative to the folder, `/`-separated.
    pub path: String,
    pub size: u64,
    /// Last modification, RFC 3339 in UTC to the second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub modified: Option<String>,
    /// BLAKE3 of the file's bytes.
    pub digest: String,
    /// The file as UTF-8 text (a leading byte order mark dropped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// The file's bytes in base64 when they are not UTF-8: a format that
    /// decodes bytes itself (an e-mail declares its charset) reads them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<String>,
    /// Why there is no text: `binary`, `not_utf8`, `too_large`,
    /// `unreadable`, `link_outside`, `not_a_file`, with the detail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped: Option<Skipped>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Skipped {
    pub reason: String,
    pub detail: String,
}

/// A piece of a document that becomes a unit: its id (unique within the
/// document, or made so with `-n`), its value and its own size.
pub(super) struct Piece {
    pub id: String,
    pub value: Value,
    pub size: u64,
    /// Why this piece cannot be a unit (a message of an mbox without
    /// headers), while the document's other pieces can.
    pub rejected: Option<(String, String)>,
}

impl Piece {
    pub fn unit(id: String, value: Value, size: u64) -> Piece {
        Piece {
            id,
            value,
            size,
            rejected: None,
        }
    }
}

/// A derived id as people read it: whitespace (a newline in a multi-line
/// type, a tab in a heading) collapsed to single spaces.
pub(super) fn tidy_id(id: &str) -> String {
    id.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Numbers repeated ids within one document, in order: the first keeps
/// its id, later ones gain `-2`, `-3`. Partition and read-back both number
/// a document's pieces this way, so a read-back finds the same unit.
/// Each repeated id's last number is kept, so the next repeat starts its
/// search there: the first free number only grows (ids are only added),
/// and numbering stays linear however often an id repeats.
fn number_repeats(pieces: &mut [Piece]) {
    let mut seen = std::collections::HashSet::new();
    let mut last: std::collections::HashMap<String, u64> = std::collections::HashMap::new();
    for piece in pieces {
        if seen.insert(piece.id.clone()) {
            continue;
        }
        let n = last.entry(piece.id.clone()).or_insert(1);
        loop {
            *n += 1;
            let numbered = format!("{}-{n}", piece.id);
            if seen.insert(numbered.clone()) {
                piece.id = numbered;
                break;
            }
        }
    }
}

/// What a document format does with one readable document's content (its
/// text's bytes, or for a format that decodes bytes itself, the bytes of a
/// file that is not UTF-8): its pieces, or why it has none (a reason and a
/// detail).
pub(super) type Split<'a> =
    dyn FnMut(&Document, &[u8]) -> Result<Vec<Piece>, (String, String)> + 'a;

/// The content as text, for a format that reads only text.
pub(super) fn as_text(bytes: &[u8]) -> Result<&str, (String, String)> {
    std::str::from_utf8(bytes).map_err(|e| {
        (
            "not_utf8".to_owned(),
            format!("invalid UTF-8 at byte {}", e.valid_up_to()),
        )
    })
}

/// The content a format splits: the text, or, when the format decodes
/// bytes itself, a non-UTF-8 file's bytes.
fn content(doc: &Document, takes_bytes: bool) -> Option<std::borrow::Cow<'_, [u8]>> {
    if let Some(text) = &doc.text {
        return Some(std::borrow::Cow::Borrowed(text.as_bytes()));
    }
    use base64::Engine as _;
    let bytes = doc.bytes.as_deref().filter(|_| takes_bytes)?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(bytes)
        .ok()?;
    Some(std::borrow::Cow::Owned(decoded))
}

/// Reads the document stream and gives each document's pieces to the
/// assigner, in order. A skipped file, or a document the format finds
/// nothing in, is one rejection naming the file.
pub(super) fn each_piece(
    mut reader: impl BufRead,
    format: &'static str,
    takes_bytes: bool,
    hash: &dyn Fn(&Value) -> fanfold_core::ContentHash,
    assigner: &mut Assigner,
    emit: &mut dyn FnMut(Element),
    split: &mut Split<'_>,
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
        let bytes = ByteRange {
            start: offset,
            end: offset + n as u64,
        };
        offset += n as u64;
        let doc: Document =
            serde_json::from_slice(&line).map_err(|e| PartitionError::Malformed {
                format,
                offset: bytes.start,
                line: line_no,
                detail: format!(
                    "not a document stream line ({e}); a `{format}` input is a folder or a file, \
                 read by fanfold itself"
                ),
            })?;
        let path = doc.path.clone();
        let (reason, detail) = match (content(&doc, takes_bytes), &doc.skipped) {
            (Some(content), _) => match split(&doc, &content) {
                Ok(mut pieces) if !pieces.is_empty() => {
                    number_repeats(&mut pieces);
                    for piece in pieces {
                        if let Some((reason, detail)) = piece.rejected {
                            let id = piece.id;
                            emit(Element::Rejected(assigner.reject(
                                bytes,
                                &reason,
                                |ordinal| format!("element {ordinal}: {id}: {detail}"),
                            )));
                            continue;
                        }
                        let hash = hash(&piece.value);
                        // Unique within the document already; a repeat
                        // across documents is rejected, never renamed,
                        // so a read-back of one document finds its units.
                        let id = Proposed::Key(Some(piece.id));
                        emit(
                            assigner
                                .admit(bytes, piece.size, id, hash)?
                                .with_value(piece.value),
                        );
                    }
                    continue;
                }
                Ok(_) => ("empty".to_owned(), format!("no {format} units in it")),
                Err(why) => why,
            },
            (None, Some(s)) => (s.reason.clone(), s.detail.clone()),
            (None, None) => ("unreadable".to_owned(), "no text recorded".to_owned()),
        };
        emit(Element::Rejected(assigner.reject(
            bytes,
            &reason,
            |ordinal| format!("element {ordinal}: file {path}: {detail}"),
        )));
    }
}

/// One document's pieces again, for reading a unit back from its
/// document's line: the ids as [`each_piece`] gave them within it.
pub(super) fn pieces_of(
    line: &[u8],
    takes_bytes: bool,
    split: &mut Split<'_>,
) -> Result<Vec<Piece>, String> {
    let doc: Document = serde_json::from_slice(line).map_err(|e| e.to_string())?;
    let Some(content) = content(&doc, takes_bytes) else {
        return Ok(Vec::new());
    };
    let mut pieces = split(&doc, &content).map_err(|(_, detail)| detail)?;
    number_repeats(&mut pieces);
    Ok(pieces)
}

#[cfg(test)]
mod numbering {
    use super::{Piece, number_repeats};

    fn numbered(ids: &[&str]) -> Vec<String> {
        let mut pieces: Vec<Piece> = ids
            .iter()
            .map(|id| Piece::unit((*id).to_owned(), serde_json::Value::Null, 0))
            .collect();
        number_repeats(&mut pieces);
        pieces.into_iter().map(|p| p.id).collect()
    }

    #[test]
    fn repeats_are_numbered_past_ids_already_taken() {
        assert_eq!(
            numbered(&["a", "a", "a-2", "a", "a-3", "a", "b"]),
            ["a", "a-2", "a-2-2", "a-3", "a-3-2", "a-4", "b"]
        );
        assert_eq!(numbered(&["a-2", "a", "a"]), ["a-2", "a", "a-3"]);
    }

    #[test]
    fn twenty_thousand_repeats_are_numbered_in_one_pass() {
        let ids = vec!["doc.md#Notes"; 20_000];
        let got = numbered(&ids);
        assert_eq!(got[0], "doc.md#Notes");
        assert_eq!(got[19_999], "doc.md#Notes-20000");
        let unique: std::collections::HashSet<&String> = got.iter().collect();
        assert_eq!(unique.len(), 20_000);
    }
}
