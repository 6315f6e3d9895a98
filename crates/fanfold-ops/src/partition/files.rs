//! `files`: one unit per file of a folder, its id the relative path.

use fanfold_core::ContentHash;
use serde_json::{Value, json};

use super::documents::{Document, Piece};

pub(super) fn split(doc: &Document, content: &[u8]) -> Result<Vec<Piece>, (String, String)> {
    let text = super::documents::as_text(content)?;
    Ok(vec![Piece::unit(
        doc.path.clone(),
        json!({
            "path": doc.path,
            "size": doc.size,
            "modified": doc.modified,
            "text": text,
        }),
        text.len() as u64,
    )])
}

/// A file unit's content hash leaves its modification time out: a file
/// touched, copied or checked out again is the same unit, and a fact
/// about it stands; an edit to its text or a rename is a new unit.
pub(super) fn hash(value: &Value) -> ContentHash {
    let mut content = value.clone();
    if let Some(obj) = content.as_object_mut() {
        obj.remove("modified");
    }
    super::unit_hash(&content)
}
