//! Prompt compression after LLMLingua: drop the words of a text the model
//! finds least surprising, at a declared ratio. The model's per-token
//! surprise is measured by the backend; what is kept is decided here.

use serde_json::Value;

/// One token of a text: its byte range in the text and its surprise, the
/// negative log-probability (nats) the model gave it after the text
/// before it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TokenSurprise {
    pub start: usize,
    pub end: usize,
    pub nats: f64,
}

/// A text after compression.
#[derive(Clone, Debug, PartialEq)]
pub struct Compressed {
    pub text: String,
    /// Words in the text, and words kept.
    pub words: usize,
    pub kept: usize,
}

/// Keeps the `keep` share (rounded up) of `text`'s words that surprised
/// the model most, in their order, one space between them. A word (a run
/// of non-whitespace) scores the mean surprise of the tokens overlapping
/// it; LLMLingua drops tokens, but dropping whole words leaves only words
/// of the source for the judge to read. Ties go to the earlier word. A
/// word no token covers is kept, and the share applies to the words
/// scored; a text with none scored, or of fewer than `min_words` words,
/// is returned whole.
pub fn compress(text: &str, tokens: &[TokenSurprise], keep: f64, min_words: usize) -> Compressed {
    let words = word_ranges(text);
    let n = words.len();
    if n < min_words.max(1) || keep >= 1.0 {
        return Compressed {
            text: text.to_owned(),
            words: n,
            kept: n,
        };
    }
    let scores: Vec<f64> = words
        .iter()
        .map(|&(start, end)| {
            let (sum, count) = tokens
                .iter()
                .filter(|t| t.start < end && t.end > start)
                .fold((0.0, 0usize), |(s, c), t| (s + t.nats, c + 1));
            if count == 0 {
                f64::INFINITY
            } else {
                sum / count as f64
            }
        })
        .collect();
    // The ratio applies to the words the model scored; a word it did not
    // (a tokenizer that spells a text differently, or a tail past its
    // window) is kept, never cut unseen. With none scored, the text is
    // whole: cutting it would be plain truncation.
    let scored: Vec<usize> = (0..n)
        .filter(|&w| scores.get(w).is_some_and(|s| s.is_finite()))
        .collect();
    if scored.is_empty() {
        return Compressed {
            text: text.to_owned(),
            words: n,
            kept: n,
        };
    }
    let want = ((scored.len() as f64) * keep.max(0.0)).ceil() as usize;
    let mut order = scored;
    order.sort_by(|&a, &b| {
        let (sa, sb) = (scores.get(a), scores.get(b));
        sb.partial_cmp(&sa)
            .unwrap_or(std::cmp::Ordering::Equal)
            .then(a.cmp(&b))
    });
    let mut kept: Vec<usize> = order.into_iter().take(want).collect();
    kept.extend((0..n).filter(|&w| scores.get(w).is_none_or(|s| !s.is_finite())));
    kept.sort_unstable();
    let text_out = kept
        .iter()
        .filter_map(|&w| words.get(w).and_then(|&(s, e)| text.get(s..e)))
        .collect::<Vec<_>>()
        .join(" ");
    Compressed {
        text: text_out,
        words: n,
        kept: kept.len(),
    }
}

/// The byte ranges of `text`'s words: runs of non-whitespace.
fn word_ranges(text: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, c) in text.char_indices() {
        match (c.is_whitespace(), start) {
            (true, Some(s)) => {
                out.push((s, i));
                start = None;
            }
            (false, None) => start = Some(i),
            _ => {}
        }
    }
    if let Some(s) = start {
        out.push((s, text.len()));
    }
    out
}

/// The strings of a view a stage compresses: its top-level string
/// fields, by name (a view that is one string is named `""`).
pub fn strings(view: &Value) -> Vec<(String, String)> {
    match view {
        Value::String(s) => vec![(String::new(), s.clone())],
        Value::Object(o) => o
            .iter()
            .filter_map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_owned())))
            .collect(),
        _ => Vec::new(),
    }
}

/// `view` with each named string replaced by its compressed text.
pub fn replace_strings(view: &Value, compressed: &[(String, String)]) -> Value {
    match view {
        Value::String(_) => compressed
            .iter()
            .find(|(k, _)| k.is_empty())
            .map_or_else(|| view.clone(), |(_, s)| Value::String(s.clone())),
        Value::Object(o) => {
            let mut out = o.clone();
            for (k, s) in compressed {
                if let Some(v) = out.get_mut(k) {
                    *v = Value::String(s.clone());
                }
            }
            Value::Object(out)
        }
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One token a word, `text`'s words given these surprises in order.
    fn tokens(text: &str, nats: &[f64]) -> Vec<TokenSurprise> {
        word_ranges(text)
            .into_iter()
            .zip(nats)
            .map(|((start, end), &nats)| TokenSurprise { start, end, nats })
            .collect()
    }

    #[test]
    fn the_least_surprising_words_go_first_and_the_rest_keep_their_order() {
        let text = "the login page of the new auth path returns 500";
        //          the  login page of  the  new  auth path returns 500
        let nats = [0.1, 5.0, 2.0, 0.2, 0.1, 3.0, 6.0, 2.5, 1.0, 7.0];
        let c = compress(text, &tokens(text, &nats), 0.5, 1);
        assert_eq!(c.words, 10);
        assert_eq!(c.kept, 5);
        assert_eq!(c.text, "login new auth path 500");
        // Every kept word is a word of the source.
        assert!(c.text.split(' ').all(|w| text.split(' ').any(|s| s == w)));
    }

    #[test]
    fn a_word_of_many_tokens_scores_their_mean_and_short_texts_stay_whole() {
        let text = "ab cd";
        let toks = [
            TokenSurprise {
                start: 0,
                end: 1,
                nats: 9.0,
            },
            TokenSurprise {
                start: 1,
                end: 2,
                nats: 1.0,
            },
            TokenSurprise {
                start: 2,
                end: 5,
                nats: 4.0,
            },
        ];
        // "ab" = (9 + 1) / 2 = 5 > "cd" = 4: "ab" stays. The token over
        // " cd" counts for "cd" alone.
        assert_eq!(compress(text, &toks, 0.5, 1).text, "ab");
        assert_eq!(compress(text, &toks, 0.5, 3).text, text);
        assert_eq!(compress(text, &toks, 1.0, 1).text, text);
    }

    #[test]
    fn the_ratio_rounds_up_and_ties_keep_the_earlier_word() {
        let text = "a b c";
        let c = compress(text, &tokens(text, &[1.0, 1.0, 1.0]), 0.4, 1);
        assert_eq!(c.kept, 2);
        assert_eq!(c.text, "a b");
    }

    #[test]
    fn words_the_model_did_not_score_are_kept_and_none_scored_is_no_cut() {
        let text = "one two three four five six";
        // Only the first four words scored (a window that ended early):
        // half of those go, the unscored tail stays.
        let c = compress(text, &tokens(text, &[1.0, 4.0, 3.0, 2.0]), 0.5, 1);
        assert_eq!(c.text, "two three five six");
        assert_eq!(c.kept, 4);
        // No token at all: the text is whole, not its first half.
        let whole = compress(text, &[], 0.5, 1);
        assert_eq!(whole.text, text);
        assert_eq!(whole.kept, 6);
    }

    #[test]
    fn strings_of_a_view_are_replaced_by_name() {
        let view = serde_json::json!({"title": "t", "n": 3, "labels": ["x"]});
        assert_eq!(strings(&view), vec![("title".to_owned(), "t".to_owned())]);
        let out = replace_strings(&view, &[("title".into(), "u".into())]);
        assert_eq!(out["title"], "u");
        assert_eq!(out["labels"][0], "x");
    }
}
