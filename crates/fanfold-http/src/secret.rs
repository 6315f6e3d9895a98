//! The API key, kept out of every printable surface.

use std::fmt;

use crate::HttpError;

/// An API key read from the environment.
///
/// It has no `Display` and no `Serialize`, and its `Debug` prints
/// `ApiKey([redacted])`, so a key cannot reach a log line, a config dump or
/// a report by accident. The only way out is the request header, which is
/// marked sensitive.
#[derive(Clone)]
pub struct ApiKey(String);

impl ApiKey {
    /// Reads the key from the environment variable `var`. The error names
    /// the variable, never a value.
    pub fn from_env(var: &str) -> Result<ApiKey, HttpError> {
        match std::env::var(var) {
            Ok(v) if !v.trim().is_empty() => {
                let key = ApiKey(v.trim().to_owned());
                if !key.scrubbable() {
                    tracing::info!(
                        var,
                        "the key in {var} is shorter than {MIN_SCRUBBED_KEY} characters: \
                         taken for a placeholder, and not redacted from answers"
                    );
                }
                Ok(key)
            }
            _ => Err(HttpError::MissingKey {
                var: var.to_owned(),
            }),
        }
    }

    pub(crate) fn expose(&self) -> &str {
        &self.0
    }

    /// Removes the key from text that came from elsewhere (a provider's
    /// error body may echo what it was sent, a model may repeat it): as
    /// written, and inside any JSON string whose escapes (`\u0073k-...`)
    /// spell it once decoded, since the answer is decoded before it is
    /// stored. A key shorter than [`MIN_SCRUBBED_KEY`] is not scrubbed: a
    /// placeholder such as `EMPTY` is a word an answer may hold.
    pub(crate) fn scrub(&self, text: &str) -> String {
        if !self.scrubbable() {
            return text.to_owned();
        }
        let plain = text.replace(&self.0, "[redacted]");
        if !plain.contains('\\') {
            return plain;
        }
        scrub_json_strings(&plain, &self.0)
    }

    /// Whether the key is long enough to be told from words.
    pub fn scrubbable(&self) -> bool {
        self.0.chars().count() >= MIN_SCRUBBED_KEY
    }
}

/// Keys shorter than this (`EMPTY`, `login`, the placeholders local
/// servers take) are not redacted from answers: they are words, and
/// redacting them changes what an answer quotes.
pub const MIN_SCRUBBED_KEY: usize = 12;

/// `text` with every JSON string literal that decodes to something
/// holding `key` written again with the key redacted.
fn scrub_json_strings(text: &str, key: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(open) = rest.find('"') {
        let (before, from) = rest.split_at(open);
        out.push_str(before);
        // The literal's end: the next quote no backslash escapes.
        let mut end = None;
        let mut escaped = false;
        for (i, c) in from.char_indices().skip(1) {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => {
                    end = Some(i);
                    break;
                }
                _ => {}
            }
        }
        let Some(end) = end else {
            out.push_str(from);
            return out;
        };
        let literal = from.get(..=end).unwrap_or(from);
        match serde_json::from_str::<String>(literal) {
            Ok(decoded) if decoded.contains(key) => {
                let clean = decoded.replace(key, "[redacted]");
                out.push_str(&serde_json::to_string(&clean).unwrap_or_default());
            }
            _ => out.push_str(literal),
        }
        rest = from.get(end + 1..).unwrap_or_default();
    }
    out.push_str(rest);
    out
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey([redacted])")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_and_scrub_hide_the_key() {
        let k = ApiKey("sk-very-secret".into());
        assert_eq!(format!("{k:?}"), "ApiKey([redacted])");
        assert_eq!(
            k.scrub("bad key sk-very-secret given"),
            "bad key [redacted] given"
        );
    }

    #[test]
    fn an_escaped_echo_is_scrubbed_as_decoded() {
        let k = ApiKey("sk-very-secret".into());
        // `\u0073` is `s`, `\/` is `/`: the decoded answer holds the key.
        let reply = r#"{"answer": "the key is \u0073k-very-secret", "n": 1, "q": "a \"quoted\" \u0073k-very-secret"}"#;
        let scrubbed = k.scrub(reply);
        let decoded: serde_json::Value = serde_json::from_str(&scrubbed).expect("still JSON");
        assert_eq!(decoded["answer"], "the key is [redacted]");
        assert_eq!(decoded["q"], "a \"quoted\" [redacted]");
        assert_eq!(decoded["n"], 1);
        assert!(!decoded.to_string().contains("very-secret"), "{decoded}");
        // Text with no key in it is left as it was, escapes and all.
        let other = r#"{"a": "caf\u00e9 \"x\"", "b": "unterminated"#;
        assert_eq!(k.scrub(other), other);
    }

    #[test]
    fn a_short_placeholder_key_is_not_scrubbed() {
        for placeholder in ["EMPTY", "login", "sk-local"] {
            let k = ApiKey(placeholder.into());
            assert!(!k.scrubbable());
            let answer = format!("the {placeholder} field is EMPTY until login");
            assert_eq!(k.scrub(&answer), answer);
        }
        assert!(ApiKey("sk-0123456789".into()).scrubbable());
    }
}
