//! What mock providers read out of fanfold's requests, and their replies.

use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

/// A JSON response, as providers send them.
pub fn json_reply(status: StatusCode, v: Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        v.to_string(),
    )
        .into_response()
}

/// An OpenAI chat completion whose message is `content`, with usage
/// counted at about four bytes a token.
pub fn openai_chat_reply(model: &str, content: &str, prompt_bytes: usize) -> Value {
    let prompt = (prompt_bytes / 4) as u64;
    let completion = (content.len() / 4 + 1) as u64;
    serde_json::json!({
        "id": "chatcmpl-test", "object": "chat.completion", "model": model,
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": content}}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                  "total_tokens": prompt + completion}
    })
}

/// The user message of a chat request body (OpenAI's `messages` or
/// Anthropic's `params`), when it is a string.
pub fn user_content(body: &Value) -> Option<&str> {
    body.get("messages")?
        .as_array()?
        .iter()
        .find(|m| m.get("role").and_then(Value::as_str) == Some("user"))?
        .get("content")?
        .as_str()
}

/// The unit id and projected record of a map stage's user message
/// (`Record "<id>":` and the record as a JSON block).
pub fn record_of(content: &str) -> Option<(String, Value)> {
    let (id, _) = content.strip_prefix("Record ")?.split_once(':')?;
    let id = id.trim_matches('"');
    let (_, rest) = content.split_once("```json\n")?;
    let (record, _) = rest.rsplit_once("\n```")?;
    Some((id.to_owned(), serde_json::from_str(record).ok()?))
}

/// The JSONL file of a `multipart/form-data` upload with purpose `batch`
/// (OpenAI's `POST /files`).
pub fn multipart_batch_file(headers: &HeaderMap, body: &[u8]) -> Option<Vec<u8>> {
    let ct = headers.get(header::CONTENT_TYPE)?.to_str().ok()?;
    let boundary = ct.split("boundary=").nth(1)?.trim_matches('"');
    let text = String::from_utf8_lossy(body);
    let delimiter = format!("--{boundary}");
    let mut purpose_batch = false;
    let mut file = None;
    for part in text.split(&delimiter) {
        let Some((head, content)) = part.split_once("\r\n\r\n") else {
            continue;
        };
        let content = content.strip_suffix("\r\n").unwrap_or(content);
        if head.contains("name=\"purpose\"") {
            purpose_batch = content == "batch";
        } else if head.contains("name=\"file\"") {
            file = Some(content.as_bytes().to_vec());
        }
    }
    file.filter(|_| purpose_batch)
}
