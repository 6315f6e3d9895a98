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
            Ok(v) if !v.trim().is_empty() => Ok(ApiKey(v.trim().to_owned())),
            _ => Err(HttpError::MissingKey {
                var: var.to_owned(),
            }),
        }
    }

    pub(crate) fn expose(&self) -> &str {
        &self.0
    }

    /// Removes the key from text that came from elsewhere (a provider's
    /// error body may echo what it was sent).
    pub(crate) fn scrub(&self, text: &str) -> String {
        if self.0.is_empty() {
            return text.to_owned();
        }
        text.replace(&self.0, "[redacted]")
    }
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
}
