//! `email`: RFC 5322 messages, one a file or many in an mbox file, parsed
//! with `mail-parser`. The headers people ask about become fields; the
//! body's text becomes `body`, which is what a question is about and what
//! evidence quotes.

use mail_parser::{Address, MessageParser, MimeHeaders};
use serde_json::{Value, json};

use super::documents::{Document, Piece, tidy_id};

/// The raw bytes, not text: a message declares its charset, and
/// `mail-parser` decodes it (a Latin-1 message is read, not rejected).
pub(super) fn split(doc: &Document, raw: &[u8]) -> Result<Vec<Piece>, (String, String)> {
    // An mbox file opens with a `From ` separator line (no colon); a single
    // message opens with a header.
    if !raw.starts_with(b"From ") {
        let value = message(doc, raw)?;
        let size = value_size(&value);
        return Ok(vec![Piece::unit(doc.path.clone(), value, size)]);
    }
    let mut pieces = Vec::new();
    let iter = mail_parser::mailbox::mbox::MessageIterator::new(raw);
    for (n, raw) in iter.enumerate() {
        let n = n + 1;
        let raw = raw.map_err(|e| ("unreadable".to_owned(), format!("mbox message {n}: {e}")))?;
        let mut value = match message(doc, raw.contents()) {
            Ok(value) => value,
            // One message that is not one (a body line `From ...` that an
            // mbox writer did not escape splits a message in two) is
            // rejected alone; the mailbox's other messages stand.
            Err((reason, detail)) => {
                pieces.push(Piece {
                    id: format!("{}#{n}", doc.path),
                    value: Value::Null,
                    size: 0,
                    rejected: Some((reason, format!("mbox message {n}: {detail}"))),
                });
                continue;
            }
        };
        let id = match value.get("message_id").and_then(Value::as_str) {
            Some(mid) if !mid.is_empty() => format!("{}#{}", doc.path, tidy_id(mid)),
            _ => format!("{}#{n}", doc.path),
        };
        if let Some(obj) = value.as_object_mut() {
            obj.insert("message".into(), json!(n));
        }
        let size = value_size(&value);
        pieces.push(Piece::unit(id, value, size));
    }
    Ok(pieces)
}

/// A message unit's size is what a context is given of it (headers, body,
/// attachment names), not its raw bytes: an attachment is not sent.
fn value_size(value: &Value) -> u64 {
    serde_json::to_string(value).map_or(0, |s| s.len() as u64)
}

fn message(doc: &Document, raw: &[u8]) -> Result<Value, (String, String)> {
    let not_email = || {
        (
            "not_email".to_owned(),
            "no RFC 5322 message headers (From, Date, Subject or Message-ID) in it".to_owned(),
        )
    };
    let msg = MessageParser::default().parse(raw).ok_or_else(not_email)?;
    if msg.from().is_none()
        && msg.date().is_none()
        && msg.subject().is_none()
        && msg.message_id().is_none()
    {
        return Err(not_email());
    }
    let body: Vec<String> = (0..msg.text_body_count())
        .filter_map(|i| msg.body_text(i).map(|t| t.trim_end().to_owned()))
        .filter(|t| !t.is_empty())
        .collect();
    let attachments: Vec<String> = msg
        .attachments()
        .filter_map(|a| a.attachment_name().map(str::to_owned))
        .collect();
    Ok(json!({
        "path": doc.path,
        "from": addresses(msg.from()),
        "to": addresses(msg.to()),
        "cc": addresses(msg.cc()),
        "date": msg.date().map(|d| d.to_rfc3339()),
        "subject": msg.subject(),
        "message_id": msg.message_id(),
        "in_reply_to": msg.in_reply_to().as_text(),
        "attachments": attachments,
        "body": body.join("\n\n"),
    }))
}

/// Addresses as people write them: `Name <address>`, comma-separated.
fn addresses(a: Option<&Address<'_>>) -> Option<String> {
    let list: Vec<String> = a?
        .iter()
        .map(|addr| match (addr.name(), addr.address()) {
            (Some(name), Some(address)) => format!("{name} <{address}>"),
            (None, Some(address)) => address.to_owned(),
            (Some(name), None) => name.to_owned(),
            (None, None) => String::new(),
        })
        .filter(|s| !s.is_empty())
        .collect();
    (!list.is_empty()).then(|| list.join(", "))
}
