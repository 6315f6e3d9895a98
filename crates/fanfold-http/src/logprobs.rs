//! A decision's probabilities from an OpenAI-compatible server's token
//! log probabilities.
//!
//! With `logprobs` and `top_logprobs` the server returns, for each token
//! of the answer, the most likely tokens it could have put there. At the
//! token where the decision's value begins, those alternatives say how
//! likely each allowed value was: each is matched to the one value it
//! begins, and the masses are normalised over the values. A token that
//! begins two values (`un` of `unsure` and `unknown`) cannot tell them
//! apart, so no probability is given and the caller says the floor could
//! not apply; nothing is guessed.

use fanfold_model::DecisionField;
use serde_json::Value;

/// Alternatives a server is asked for at each token (OpenAI's maximum).
pub(crate) const TOP_LOGPROBS: u32 = 20;

/// One token of the answer and the alternatives the server listed for it.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct TokenChoices {
    pub token: String,
    /// (token, log probability), the token itself among them.
    pub top: Vec<(String, f64)>,
}

/// The tokens of `choices[0].logprobs.content`; empty when absent.
pub(crate) fn parse(v: &Value) -> Vec<TokenChoices> {
    let Some(content) = v
        .pointer("/choices/0/logprobs/content")
        .and_then(Value::as_array)
    else {
        return Vec::new();
    };
    let pair = |t: &Value| -> Option<(String, f64)> {
        Some((
            t.get("token")?.as_str()?.to_owned(),
            t.get("logprob")?.as_f64()?,
        ))
    };
    content
        .iter()
        .filter_map(|t| {
            let (token, logprob) = pair(t)?;
            let mut top: Vec<(String, f64)> = t
                .get("top_logprobs")
                .and_then(Value::as_array)
                .map(|alts| alts.iter().filter_map(pair).collect())
                .unwrap_or_default();
            if !top.iter().any(|(alt, _)| *alt == token) {
                top.push((token.clone(), logprob));
            }
            Some(TokenChoices { token, top })
        })
        .collect()
}

/// Each allowed value's probability where the answer `text` writes the
/// decision, from its `tokens`; `None` when the tokens do not spell the
/// text, the decision cannot be found, or the alternatives do not tell
/// the values apart.
pub(crate) fn decision_probabilities(
    text: &str,
    tokens: &[TokenChoices],
    field: &DecisionField,
) -> Option<Vec<(String, f64)>> {
    if tokens.is_empty() || tokens.iter().map(|t| t.token.as_str()).collect::<String>() != text {
        return None;
    }
    let start = value_start(text, &field.key)?;
    let mut at = 0;
    for t in tokens {
        let end = at + t.token.len();
        if end <= start {
            at = end;
            continue;
        }
        // What the token holds before the value (an opening quote): every
        // alternative that continues into a value starts with it too.
        let lead = text.get(at..start)?;
        let mut mass = vec![0.0; field.choices.len()];
        for (alt, logprob) in &t.top {
            let Some(rest) = alt.strip_prefix(lead) else {
                continue;
            };
            if rest.is_empty() {
                continue;
            }
            let begun: Vec<usize> = field
                .choices
                .iter()
                .enumerate()
                .filter(|(_, c)| begins(rest, c))
                .map(|(i, _)| i)
                .collect();
            match begun.as_slice() {
                [] => {}
                [one] => {
                    if let Some(m) = mass.get_mut(*one) {
                        *m += logprob.exp();
                    }
                }
                _ => return None,
            }
        }
        let total: f64 = mass.iter().sum();
        if total.is_nan() || total <= 0.0 {
            return None;
        }
        return Some(
            field
                .choices
                .iter()
                .cloned()
                .zip(mass.into_iter().map(|m| m / total))
                .collect(),
        );
    }
    None
}

/// Whether a token's text after the value's start, `rest`, begins
/// `choice`: a prefix of it, or the whole of it followed by its closing
/// quote.
fn begins(rest: &str, choice: &str) -> bool {
    choice.starts_with(rest)
        || rest
            .strip_prefix(choice)
            .is_some_and(|after| after.starts_with('"'))
}

/// The byte where the string value of `key` begins in the JSON `text`:
/// found by its key and checked against the value the text parses to.
fn value_start(text: &str, key: &str) -> Option<usize> {
    let parsed: Value = serde_json::from_str(text).ok()?;
    let value = parsed.get(key)?.as_str()?;
    let quoted = serde_json::to_string(key).ok()?;
    let mut from = 0;
    while let Some(found) = text.get(from..)?.find(&quoted) {
        let after = from + found + quoted.len();
        let rest = text.get(after..)?;
        let trimmed = rest.trim_start();
        if let Some(colon) = trimmed.strip_prefix(':') {
            let value_part = colon.trim_start();
            if let Some(inner) = value_part.strip_prefix('"') {
                let start = text.len() - inner.len();
                if inner.starts_with(value) && inner.get(value.len()..)?.starts_with('"') {
                    return Some(start);
                }
            }
        }
        from = after;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field() -> DecisionField {
        DecisionField {
            key: "choice".into(),
            choices: vec!["judge".into(), "docs".into(), "unsure".into()],
        }
    }

    fn tokens(parts: &[&str], at: usize, top: &[(&str, f64)]) -> Vec<TokenChoices> {
        parts
            .iter()
            .enumerate()
            .map(|(i, p)| TokenChoices {
                token: (*p).to_owned(),
                top: if i == at {
                    top.iter().map(|(t, p)| ((*t).to_owned(), p.ln())).collect()
                } else {
                    vec![((*p).to_owned(), 0.0)]
                },
            })
            .collect()
    }

    fn p(of: &[(String, f64)], name: &str) -> f64 {
        of.iter().find(|(n, _)| n == name).map_or(-1.0, |(_, p)| *p)
    }

    #[test]
    fn alternatives_at_the_value_give_each_values_probability() {
        let t = tokens(
            &["{\"", "choice", "\":\"", "judge", "\"}"],
            3,
            &[
                ("judge", 0.6),
                ("docs", 0.3),
                ("uns", 0.05),
                ("hello", 0.05),
            ],
        );
        let got = decision_probabilities("{\"choice\":\"judge\"}", &t, &field()).expect("scored");
        assert!((p(&got, "judge") - 0.6 / 0.95).abs() < 1e-9, "{got:?}");
        assert!((p(&got, "docs") - 0.3 / 0.95).abs() < 1e-9);
        assert!((p(&got, "unsure") - 0.05 / 0.95).abs() < 1e-9);
    }

    #[test]
    fn a_token_holding_the_opening_quote_and_the_closing_one() {
        // `: "` then `"docs"` as one token: the lead is the quote.
        let t = tokens(
            &["{\"choice\":", " ", "\"docs\"", "}"],
            2,
            &[("\"docs\"", 0.5), ("\"judge", 0.5)],
        );
        let got = decision_probabilities("{\"choice\": \"docs\"}", &t, &field()).expect("scored");
        assert!((p(&got, "docs") - 0.5).abs() < 1e-9, "{got:?}");
        assert!((p(&got, "judge") - 0.5).abs() < 1e-9);
    }

    #[test]
    fn what_cannot_be_told_apart_or_found_gives_nothing() {
        let both = DecisionField {
            key: "choice".into(),
            choices: vec!["unsure".into(), "unknown".into()],
        };
        let t = tokens(
            &["{\"choice\":\"", "un", "sure\"}"],
            1,
            &[("un", 0.9), ("x", 0.1)],
        );
        assert_eq!(
            decision_probabilities("{\"choice\":\"unsure\"}", &t, &both),
            None,
            "`un` begins both values"
        );
        let t = tokens(&["{\"choice\":\"judge\"}"], 9, &[]);
        assert_eq!(
            decision_probabilities("{\"choice\":\"docs\"}", &t, &field()),
            None,
            "tokens that do not spell the text"
        );
        assert_eq!(
            decision_probabilities(
                "{\"other\":\"judge\"}",
                &tokens(&["{\"other\":\"judge\"}"], 0, &[]),
                &field()
            ),
            None,
            "no decision in the answer"
        );
        // The key's name inside another value is passed over.
        let text = "{\"note\":\"\\\"choice\\\": no\",\"choice\":\"docs\"}";
        assert_eq!(value_start(text, "choice"), text.rfind("docs"));
    }

    #[test]
    fn parsing_keeps_the_chosen_token_among_its_alternatives() {
        let v = serde_json::json!({"choices": [{"logprobs": {"content": [
            {"token": "a", "logprob": -0.1, "top_logprobs": [{"token": "b", "logprob": -2.0}]},
            {"token": "c", "logprob": -0.2}
        ]}}]});
        let t = parse(&v);
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].top, vec![("b".into(), -2.0), ("a".into(), -0.1)]);
        assert_eq!(t[1].top, vec![("c".into(), -0.2)]);
        assert!(parse(&serde_json::json!({"choices": [{}]})).is_empty());
    }
}
