//! The quotable spans of a field's text: what a unit's output grammar
//! offers as evidence quotes, so a backend that decodes under it can only
//! quote the unit verbatim.
//!
//! Real text rarely splits into tidy sentences: a review table may store
//! every full stop as `&#46;`, a log line has no sentence end at all, and
//! a paragraph's sentences may all be longer than the schema's
//! `maxLength`. So a field offers, in this order, until a budget that
//! keeps the grammar small is spent:
//! 1. the whole field, when it fits;
//! 2. its sentences, ended by `. ! ?` (bare, as an HTML entity such as
//!    `&#46;`, or the full-width `。！？`) or a line break;
//! 3. its clauses, cut at `, ; :` and dashes (bare or as entities);
//! 4. windows of whole words covering every sentence too long to quote,
//!    end to end, then half a window on (a word longer than a window is
//!    cut at a character boundary).
//!
//! Every span is a slice of the text, trimmed, so it is verbatim by
//! construction, whatever the script or the punctuation.

/// Most spans offered for one field.
pub const MAX_SPANS_PER_FIELD: usize = 48;

/// Most bytes of spans offered for one unit, over all its fields: the
/// grammar holds each span as a literal, and its size (and the sampler's
/// work at the opening quote) grows with them.
pub const MAX_SPAN_BYTES_PER_UNIT: usize = 16 * 1024;

/// The quotable spans of `text`, each between `min_len` and `max_len`
/// bytes, first occurrences only, best first, at most
/// [`MAX_SPANS_PER_FIELD`] of them and `budget` bytes in all.
pub fn quotable_spans(text: &str, min_len: usize, max_len: usize, budget: usize) -> Vec<String> {
    let mut offer = Offer::new(min_len, max_len, budget);
    offer.push(text);
    let sentences = split(text, sentence_end);
    for s in &sentences {
        offer.push(s);
    }
    for s in &sentences {
        for c in split(s, clause_end) {
            offer.push(c);
        }
    }
    let long: Vec<&str> = sentences
        .iter()
        .flat_map(|s| {
            if s.len() > max_len {
                split(s, clause_end)
            } else {
                Vec::new()
            }
        })
        .filter(|c| c.len() > max_len)
        .collect();
    for piece in &long {
        for w in word_windows(piece, max_len, false) {
            offer.push(w);
        }
    }
    for piece in &long {
        for w in word_windows(piece, max_len, true) {
            offer.push(w);
        }
    }
    offer.spans
}

struct Offer {
    min_len: usize,
    max_len: usize,
    budget: usize,
    bytes: usize,
    spans: Vec<String>,
}

impl Offer {
    fn new(min_len: usize, max_len: usize, budget: usize) -> Self {
        Offer {
            min_len: min_len.max(1),
            max_len,
            budget,
            bytes: 0,
            spans: Vec::new(),
        }
    }

    fn push(&mut self, raw: &str) {
        let s = raw.trim();
        if s.len() < self.min_len
            || s.len() > self.max_len
            || self.spans.len() >= MAX_SPANS_PER_FIELD
            || self.bytes + s.len() > self.budget
            || self.spans.iter().any(|o| o == s)
        {
            return;
        }
        self.bytes += s.len();
        self.spans.push(s.to_owned());
    }
}

/// `text` cut after each end `ends_at` finds, trimmed, empty pieces
/// dropped. `ends_at(text, i)` is the byte just past the end starting at
/// `i`, if one does.
fn split(text: &str, ends_at: fn(&str, usize) -> Option<usize>) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut i = 0;
    while i < text.len() {
        if !text.is_char_boundary(i) {
            i += 1;
            continue;
        }
        match ends_at(text, i) {
            Some(end) => {
                let piece = text[start..end].trim();
                if !piece.is_empty() {
                    out.push(piece);
                }
                start = end;
                i = end;
            }
            None => i += 1,
        }
    }
    let rest = text[start..].trim();
    if !rest.is_empty() {
        out.push(rest);
    }
    out
}

/// HTML entities (named and numeric) of a character that ends a sentence.
const SENTENCE_ENTITIES: [&str; 9] = [
    "&#46;", "&#x2e;", "&#x2E;", "&period;", "&#33;", "&#x21;", "&excl;", "&#63;", "&quest;",
];

/// HTML entities of a character that ends a clause.
const CLAUSE_ENTITIES: [&str; 11] = [
    "&#44;", "&#x2c;", "&#x2C;", "&comma;", "&#59;", "&semi;", "&#58;", "&colon;", "&#8212;",
    "&mdash;", "&ndash;",
];

/// The byte past a sentence end at `i`: a line break; `. ! ?` or one of
/// their entities followed by whitespace, a closing quote or the end; or
/// a full-width `。！？`.
fn sentence_end(text: &str, i: usize) -> Option<usize> {
    let rest = &text[i..];
    match rest.as_bytes().first()? {
        b'\n' => return Some(i + 1),
        b'.' | b'!' | b'?' | b'&' | 0xE3 | 0xEF => {}
        _ => return None,
    }
    for full_width in ["。", "！", "？"] {
        if rest.starts_with(full_width) {
            return Some(i + full_width.len());
        }
    }
    let mark = match rest.as_bytes().first() {
        Some(b'.' | b'!' | b'?') => 1,
        _ => SENTENCE_ENTITIES
            .iter()
            .find(|e| rest.starts_with(*e))
            .map(|e| e.len())?,
    };
    at_word_end(text, i + mark)
}

/// The byte past a clause end at `i`: `, ; :` or a dash, bare or as an
/// entity, followed by whitespace.
fn clause_end(text: &str, i: usize) -> Option<usize> {
    let rest = &text[i..];
    if !matches!(rest.as_bytes().first()?, b',' | b';' | b':' | b'&' | 0xE2) {
        return None;
    }
    let mark = match rest.as_bytes().first() {
        Some(b',' | b';' | b':') => 1,
        _ if rest.starts_with('\u{2014}') || rest.starts_with('\u{2013}') => '\u{2014}'.len_utf8(),
        _ => CLAUSE_ENTITIES
            .iter()
            .find(|e| rest.starts_with(*e))
            .map(|e| e.len())?,
    };
    let after = i + mark;
    text[after..]
        .starts_with(char::is_whitespace)
        .then_some(after)
}

/// `end` when it closes a word: at the end of the text, before whitespace,
/// or past closing quotes and brackets that are themselves followed by
/// whitespace or the end.
fn at_word_end(text: &str, end: usize) -> Option<usize> {
    let mut at = end;
    loop {
        let rest = &text[at..];
        let Some(c) = rest.chars().next() else {
            return Some(at);
        };
        if c.is_whitespace() {
            return Some(at);
        }
        if matches!(
            c,
            '"' | '\'' | ')' | ']' | '\u{201D}' | '\u{2019}' | '\u{00BB}'
        ) {
            at += c.len_utf8();
            continue;
        }
        return None;
    }
}

/// Windows of whole words of `piece`, each at most `max_len` bytes: end
/// to end from the first word (`shifted` false), or starting half a
/// window in (`shifted` true), so a quote that straddles two windows has
/// another that holds it.
fn word_windows(piece: &str, max_len: usize, shifted: bool) -> Vec<&str> {
    let words: Vec<(usize, usize)> = words(piece, max_len);
    let mut out = Vec::new();
    let mut first = 0;
    if shifted {
        // Start at the word nearest the middle of the first window.
        let Some(&(_, end)) = window_from(&words, 0, max_len) else {
            return out;
        };
        let half = end / 2;
        first = words
            .iter()
            .position(|&(s, _)| s >= half)
            .unwrap_or(words.len());
        if first == 0 {
            return out;
        }
    }
    while first < words.len() {
        let Some(&(_, end)) = window_from(&words, first, max_len) else {
            break;
        };
        let start = words.get(first).map(|w| w.0).unwrap_or(end);
        out.push(&piece[start..end]);
        first = words
            .iter()
            .position(|&(s, _)| s >= end)
            .unwrap_or(words.len());
    }
    out
}

/// The last word of the longest window from word `first` that fits in
/// `max_len` bytes.
fn window_from(words: &[(usize, usize)], first: usize, max_len: usize) -> Option<&(usize, usize)> {
    let start = words.get(first)?.0;
    words
        .get(first..)?
        .iter()
        .take_while(|&&(_, end)| end - start <= max_len)
        .last()
}

/// The byte ranges of `piece`'s words; a word longer than `max_len` is cut
/// into pieces of at most `max_len` bytes at character boundaries.
fn words(piece: &str, max_len: usize) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, c) in piece
        .char_indices()
        .chain(std::iter::once((piece.len(), ' ')))
    {
        match (start, c.is_whitespace()) {
            (None, false) => start = Some(i),
            (Some(s), true) => {
                let mut s = s;
                while i - s > max_len {
                    let mut cut = s + max_len;
                    while !piece.is_char_boundary(cut) {
                        cut -= 1;
                    }
                    if cut == s {
                        break;
                    }
                    out.push((s, cut));
                    s = cut;
                }
                out.push((s, i));
                start = None;
            }
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spans(text: &str, max_len: usize) -> Vec<String> {
        let out = quotable_spans(text, 8, max_len, MAX_SPAN_BYTES_PER_UNIT);
        for s in &out {
            assert!(text.contains(s.as_str()), "{s:?} is not in {text:?}");
            assert!(s.len() <= max_len && s.len() >= 8, "{s:?}");
            assert_eq!(s.trim(), s, "trimmed");
        }
        out
    }

    #[test]
    fn plain_sentences_come_first_whole() {
        let text = "First line here.\nThe callback redirects to /login forever. Short.\n";
        let out = spans(text, 30);
        assert_eq!(out[..2], ["First line here.", "The callback redirects to"]);
        let out = spans(text, 200);
        assert_eq!(out[0], text.trim());
        assert!(out.contains(&"The callback redirects to /login forever.".to_owned()));
    }

    #[test]
    fn entity_punctuated_text_splits_at_its_encoded_ends() {
        let text = "I went into Neon Orchard knowing nothing about it&#46; An absolute masterpiece&#59; \
                    I loved every minute of it&#46; I give it 5 out of 5&#46; It runs a little long&#46;";
        let out = spans(text, 120);
        assert!(
            out.contains(&"I give it 5 out of 5&#46;".to_owned()),
            "{out:?}"
        );
        assert!(
            out.contains(
                &"An absolute masterpiece&#59; I loved every minute of it&#46;".to_owned()
            )
        );
        assert!(
            out.contains(&"An absolute masterpiece&#59;".to_owned()),
            "clauses too: {out:?}"
        );
        // No entity is cut in two.
        for s in &out {
            assert!(!s.ends_with("&#") && !s.ends_with("&#46"), "{s:?}");
        }
    }

    #[test]
    fn a_text_without_any_end_is_covered_by_word_windows() {
        let words: Vec<String> = (0..60).map(|i| format!("word{i}")).collect();
        let text = words.join(" ");
        let out = spans(&text, 40);
        assert!(!out.is_empty());
        // Every word is inside some offered span.
        for w in &words {
            assert!(
                out.iter().any(|s| s.split(' ').any(|x| x == w)),
                "{w} uncovered"
            );
        }
        // Windows end at word boundaries.
        for s in &out {
            let start = text.find(s.as_str()).expect("verbatim");
            let end = start + s.len();
            assert!(start == 0 || text.as_bytes()[start - 1] == b' ', "{s:?}");
            assert!(end == text.len() || text.as_bytes()[end] == b' ', "{s:?}");
        }
        // Shifted windows overlap the end-to-end ones.
        assert!(out.iter().any(|s| s.starts_with("word")
            && !s.starts_with("word0 ")
            && text.find(s.as_str()).is_some_and(|at| at > 0)));
    }

    #[test]
    fn non_ascii_text_is_cut_at_character_boundaries() {
        let text = "日本語のレビューです。とても良い映画でした！".repeat(3) + &"é".repeat(100);
        let out = quotable_spans(&text, 4, 40, MAX_SPAN_BYTES_PER_UNIT);
        assert!(out.iter().any(|s| s == "日本語のレビューです。"), "{out:?}");
        assert!(
            out.iter().any(|s| s == &"é".repeat(20)),
            "a long word is cut: {out:?}"
        );
        for s in &out {
            assert!(text.contains(s.as_str()) && s.len() <= 40);
        }
        // A sentence over the limit without a blank is cut between
        // characters, never inside one.
        let out = quotable_spans(&text, 4, 31, MAX_SPAN_BYTES_PER_UNIT);
        assert!(out.iter().any(|s| s == "日本語のレビューです"), "{out:?}");
    }

    #[test]
    fn the_offer_stays_within_its_budgets() {
        let text = (0..500)
            .map(|i| format!("Sentence number {i} says something&#44; and then more&#46;"))
            .collect::<Vec<_>>()
            .join(" ");
        let out = spans(&text, 120);
        assert_eq!(out.len(), MAX_SPANS_PER_FIELD);
        let small = quotable_spans(&text, 8, 120, 300);
        assert!(small.iter().map(String::len).sum::<usize>() <= 300);
        assert!(!small.is_empty());
    }

    #[test]
    fn short_and_empty_fields_offer_what_the_schema_allows() {
        assert!(spans("", 100).is_empty());
        assert!(spans("   ", 100).is_empty());
        assert!(spans("Great", 100).is_empty(), "under minLength 8");
        assert_eq!(quotable_spans("Great", 1, 100, 1000), ["Great"]);
    }
}
