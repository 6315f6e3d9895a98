//! `markdown`: a document split into sections at its headings (ATX `#` and
//! setext), found with `pulldown-cmark` so a `#` inside a code block is
//! never a heading. A section runs from its heading to the next heading of
//! any level; its id is the heading path.

use pulldown_cmark::{Event, Options, Parser, Tag, TagEnd};
use serde_json::json;

use super::documents::{Document, Piece, tidy_id};

pub(super) fn split(doc: &Document, content: &[u8]) -> Result<Vec<Piece>, (String, String)> {
    let text = super::documents::as_text(content)?;
    // Each heading: where it starts, its level and its text.
    let mut headings: Vec<(usize, usize, String)> = Vec::new();
    let mut open: Option<(usize, usize, String)> = None;
    // Front matter (`---` YAML `---`) is metadata, not a heading.
    let options = Options::ENABLE_YAML_STYLE_METADATA_BLOCKS;
    for (event, range) in Parser::new_ext(text, options).into_offset_iter() {
        match event {
            Event::Start(Tag::Heading { level, .. }) => {
                open = Some((range.start, level as usize, String::new()));
            }
            Event::Text(t) | Event::Code(t) => {
                if let Some((_, _, title)) = open.as_mut() {
                    title.push_str(&t);
                }
            }
            Event::SoftBreak | Event::HardBreak => {
                if let Some((_, _, title)) = open.as_mut() {
                    title.push(' ');
                }
            }
            Event::End(TagEnd::Heading(_)) => {
                if let Some((start, level, title)) = open.take() {
                    headings.push((start, level, tidy_id(&title)));
                }
            }
            _ => {}
        }
    }
    let mut pieces = Vec::new();
    let first = headings.first().map_or(text.len(), |h| h.0);
    let preamble = text.get(..first).unwrap_or_default();
    if !preamble.trim().is_empty() {
        pieces.push(section(doc, text, 0, first, None, String::new(), 0));
    }
    // The open headings above the current one: (level, title).
    let mut stack: Vec<(usize, String)> = Vec::new();
    for (i, (start, level, title)) in headings.iter().enumerate() {
        let end = headings.get(i + 1).map_or(text.len(), |h| h.0);
        while stack.last().is_some_and(|(l, _)| *l >= *level) {
            stack.pop();
        }
        stack.push((*level, title.clone()));
        let path: Vec<&str> = stack.iter().map(|(_, t)| t.as_str()).collect();
        pieces.push(section(
            doc,
            text,
            *start,
            end,
            Some(title),
            path.join("/"),
            *level,
        ));
    }
    Ok(pieces)
}

fn section(
    doc: &Document,
    text: &str,
    start: usize,
    end: usize,
    title: Option<&str>,
    heading: String,
    level: usize,
) -> Piece {
    let body = text.get(start..end).unwrap_or_default().trim_end();
    let line = text
        .get(..start)
        .map_or(0, |b| b.bytes().filter(|&c| c == b'\n').count())
        + 1;
    let id = if heading.is_empty() {
        doc.path.clone()
    } else {
        format!("{}#{heading}", doc.path)
    };
    Piece::unit(
        id,
        json!({
            "path": doc.path,
            "heading": heading,
            "title": title,
            "level": level,
            "start": start,
            "end": start + body.len(),
            "line": line,
            "text": body,
        }),
        body.len() as u64,
    )
}
