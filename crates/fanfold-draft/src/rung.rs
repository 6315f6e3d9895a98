//! The first rung `fanfold new` puts in front of the model. A question
//! that names distinctive terms (proper names, quoted words, a
//! parenthesised list) gets a keyword rule keeping only the units that
//! mention one; a question that names none gets a local embedder that
//! drops the units farthest from the question. Either is on in the spec it
//! writes, and its comment says how many units it kept of the input when
//! the spec was written.

use std::fmt::Write as _;

/// Words that open or glue a question: capitalised, they are still no
/// names. Months and weekdays are capitalised by convention, not because
/// they are distinctive.
const NOT_NAMES: &[&str] = &[
    "a",
    "all",
    "also",
    "an",
    "and",
    "any",
    "are",
    "both",
    "but",
    "by",
    "can",
    "could",
    "count",
    "did",
    "do",
    "does",
    "each",
    "either",
    "every",
    "find",
    "for",
    "from",
    "give",
    "he",
    "how",
    "however",
    "i",
    "if",
    "in",
    "is",
    "it",
    "its",
    "just",
    "list",
    "many",
    "most",
    "my",
    "name",
    "neither",
    "no",
    "not",
    "now",
    "of",
    "on",
    "only",
    "or",
    "our",
    "please",
    "she",
    "should",
    "show",
    "so",
    "some",
    "tell",
    "that",
    "the",
    "then",
    "there",
    "these",
    "they",
    "this",
    "those",
    "to",
    "was",
    "we",
    "were",
    "what",
    "when",
    "where",
    "which",
    "who",
    "whom",
    "whose",
    "why",
    "will",
    "with",
    "would",
    "yes",
    "you",
    "your",
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
    "monday",
    "tuesday",
    "wednesday",
    "thursday",
    "friday",
    "saturday",
    "sunday",
];

/// Items of a parenthesised list that are answers to choose from, not
/// terms to look for.
const NOT_TERMS: &[&str] = &[
    "yes", "no", "true", "false", "none", "other", "others", "unsure", "maybe", "both", "either",
    "neither", "all", "any", "etc",
];

/// Longest quoted phrase or list item taken as a term, in characters.
const MOST_TERM_CHARS: usize = 60;
/// Most words in a list item or quoted phrase taken as a term.
const MOST_TERM_WORDS: usize = 6;
/// Most terms a rule matches; a question naming more is rare, and a rule
/// of fifty alternatives keeps nearly everything.
const MOST_TERMS: usize = 24;

/// The embed rung's threshold: a unit whose cosine similarity to the
/// question (all-MiniLM-L6-v2) is below it ends there. On the two
/// labelled sets in the examples every unit that answers the question
/// scored 0.099 or more, while unrelated text scored from about 0 up
/// (docs/benchmarks.md): a cut of what is far off, not a judgment.
pub const EMBED_THRESHOLD: f64 = 0.08;
/// Most units the embed rung is tried on when the spec is written (about
/// 0.1 s each on two cores); a larger input is sampled evenly and the
/// count is an estimate.
pub const EMBED_PREVIEW_UNITS: usize = 200;
/// The embed rung's stage name.
pub const EMBED_STAGE: &str = "near_question";
/// The keyword rule's name and the reason it records.
pub const KEYWORD_RULE: &str = "question_terms";
pub const KEYWORD_REASON: &str = "names_no_question_term";

/// The question's distinctive terms, in the order it names them: the items
/// of a parenthesised list, quoted words and phrases, and proper names
/// (capitalised words not at a sentence's start and not question words;
/// capitalised words in a row are one name). Never its common words.
pub fn distinctive_terms(question: &str) -> Vec<String> {
    let mut terms = Vec::new();
    parenthesised(question, &mut terms);
    quoted(question, &mut terms);
    proper_names(question, &mut terms);
    let mut seen = std::collections::BTreeSet::new();
    terms.retain(|t: &String| !t.is_empty() && seen.insert(t.to_lowercase()));
    terms.truncate(MOST_TERMS);
    terms
}

fn is_term_sized(t: &str) -> bool {
    !t.is_empty()
        && t.chars().count() <= MOST_TERM_CHARS
        && t.split_whitespace().count() <= MOST_TERM_WORDS
}

/// Strips what surrounds a word or phrase: punctuation and quote marks.
fn bare(s: &str) -> &str {
    s.trim_matches(|c: char| !c.is_alphanumeric())
}

/// `(Raptor, Condor, Jedi or Kestrel)`: each item, when there are two or
/// more.
fn parenthesised(question: &str, out: &mut Vec<String>) {
    let mut rest = question;
    while let Some((_, after)) = rest.split_once('(') {
        let Some((inside, next)) = after.split_once(')') else {
            break;
        };
        rest = next;
        let mut items: Vec<String> = Vec::new();
        for piece in inside.split([',', ';', '/', '|']) {
            // `A or B`, `A and B`: split on the words, not inside names.
            let mut words: Vec<&str> = Vec::new();
            for w in piece.split_whitespace() {
                if matches!(
                    w.to_lowercase().as_str(),
                    "or" | "and" | "e.g." | "i.e." | "eg"
                ) {
                    items.push(words.join(" "));
                    words.clear();
                } else {
                    words.push(w);
                }
            }
            items.push(words.join(" "));
        }
        let items: Vec<String> = items
            .iter()
            .map(|i| bare(i).to_owned())
            .filter(|i| is_term_sized(i) && !NOT_TERMS.contains(&i.to_lowercase().as_str()))
            .collect();
        if items.len() >= 2 {
            out.extend(items);
        }
    }
}

/// `"deferred revenue"`, `“Project X”`, `'Kestrel'`: the quoted words.
fn quoted(question: &str, out: &mut Vec<String>) {
    let chars: Vec<char> = question.chars().collect();
    let is_word = |at: Option<&char>| at.is_some_and(|c| c.is_alphanumeric());
    let mut i = 0;
    while let Some(&c) = chars.get(i) {
        let close = match c {
            '"' => Some('"'),
            '“' => Some('”'),
            '‘' => Some('’'),
            '«' => Some('»'),
            // An apostrophe inside a word (`it's`) opens nothing.
            '\'' if !is_word(i.checked_sub(1).and_then(|b| chars.get(b))) => Some('\''),
            _ => None,
        };
        let Some(close) = close else {
            i += 1;
            continue;
        };
        let end = (i + 1..chars.len()).find(|&j| {
            chars.get(j) == Some(&close) && (close != '\'' || !is_word(chars.get(j + 1)))
        });
        match end {
            Some(j) => {
                let inner: String = chars.get(i + 1..j).unwrap_or_default().iter().collect();
                let t = bare(&inner);
                if is_term_sized(t) {
                    out.push(t.to_owned());
                }
                i = j + 1;
            }
            None => i += 1,
        }
    }
}

/// Capitalised words that do not open a sentence and are no question
/// words; capitalised words in a row, with nothing between them, are one
/// name (`Acme Corp`).
fn proper_names(question: &str, out: &mut Vec<String>) {
    let mut run: Vec<String> = Vec::new();
    let flush = |run: &mut Vec<String>, out: &mut Vec<String>| {
        if !run.is_empty() {
            out.push(run.join(" "));
            run.clear();
        }
    };
    let mut sentence_start = true;
    // A name that opens a sentence is skipped whole, not its second word.
    let mut skipping = false;
    for raw in question.split_whitespace() {
        let lead = raw.trim_start_matches(|c: char| !c.is_alphanumeric());
        let word = lead.trim_end_matches(|c: char| !c.is_alphanumeric());
        let word = word
            .strip_suffix("'s")
            .or_else(|| word.strip_suffix("’s"))
            .unwrap_or(word);
        let opened = lead.len() != raw.len();
        let closed = word.len() != lead.len();
        if opened {
            flush(&mut run, out);
            skipping = false;
        }
        let capitalised = word.chars().next().is_some_and(char::is_uppercase)
            && word.chars().count() >= 2
            && !NOT_NAMES.contains(&word.to_lowercase().as_str());
        if capitalised && (sentence_start || skipping) {
            skipping = true;
        } else if capitalised {
            run.push(word.to_owned());
        } else {
            flush(&mut run, out);
            skipping = false;
        }
        if closed {
            flush(&mut run, out);
            skipping = false;
        }
        // A sentence ends at `.`, `!`, `?` or `:`, closing quotes and
        // brackets after it included; a lone dash leaves things as they were.
        let ends = raw
            .trim_end_matches(['"', '\'', ')', ']', '”', '’', '»'])
            .ends_with(['.', '!', '?', ':']);
        sentence_start = ends || (word.is_empty() && sentence_start);
    }
    flush(&mut run, out);
}

/// A regular expression matching any of `terms` as whole words (a plural
/// `s` allowed), a phrase's words across any whitespace; matched with jq's
/// `test(...; "i")`, case-insensitively.
pub fn terms_regex(terms: &[String]) -> String {
    let alternatives: Vec<String> = terms
        .iter()
        .map(|t| {
            let words: Vec<String> = t.split_whitespace().map(escape_regex).collect();
            // `\b` is an ASCII word boundary in jq's regex engine: only
            // beside an ASCII letter or digit does it mean one.
            let start = if t.starts_with(|c: char| c.is_ascii_alphanumeric()) {
                r"\b"
            } else {
                ""
            };
            let end = if t.ends_with(|c: char| c.is_ascii_alphanumeric()) {
                r"s?\b"
            } else {
                ""
            };
            format!("{start}{}{end}", words.join(r"\s+"))
        })
        .collect();
    alternatives.join("|")
}

fn escape_regex(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(
            c,
            '\\' | '.'
                | '+'
                | '*'
                | '?'
                | '('
                | ')'
                | '|'
                | '['
                | ']'
                | '{'
                | '}'
                | '^'
                | '$'
                | '#'
                | '&'
                | '-'
                | '~'
        ) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// A string as a TOML value: a literal string (`'...'`, read as written)
/// when it can be one, else an escaped basic string.
pub fn toml_value(s: &str) -> String {
    if !s.contains(['\'', '\n', '\r']) && !s.chars().any(char::is_control) {
        format!("'{s}'")
    } else {
        toml::Value::String(s.to_owned()).to_string()
    }
}

/// The first rung a spec gets.
#[derive(Debug, Clone, PartialEq)]
pub enum Rung {
    /// A prefilter rule keeping units that mention one of the terms.
    Keyword { terms: Vec<String> },
    /// An embed stage keeping units near the question.
    Embed,
}

impl Rung {
    pub fn for_question(question: &str) -> Rung {
        let terms = distinctive_terms(question);
        if terms.is_empty() {
            Rung::Embed
        } else {
            Rung::Keyword { terms }
        }
    }

    /// What the rung is, in a sentence.
    pub fn summary(&self) -> String {
        match self {
            Rung::Keyword { terms } => format!(
                "First rung: the prefilter rule `{KEYWORD_RULE}` keeps the units that name {}.",
                or_list(terms)
            ),
            Rung::Embed => format!(
                "First rung: the embed stage `{EMBED_STAGE}` keeps the units whose similarity to the question is at least {EMBED_THRESHOLD}."
            ),
        }
    }

    /// The rung's TOML, its comment first. `text_of` is the jq expression
    /// of a unit's text; `embedded` the fields the embedder reads;
    /// `counted` what the rung kept when the spec was written.
    pub fn toml(
        &self,
        question: &str,
        text_of: &str,
        embedded: &[String],
        then: &str,
        counted: Option<&Counted>,
    ) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "{}", self.comment(counted));
        match self {
            Rung::Keyword { terms } => {
                let pattern = serde_json::to_string(&terms_regex(terms)).unwrap_or_default();
                let when = format!("({text_of}) | test({pattern}; \"i\") | not");
                let _ = writeln!(
                    s,
                    "[[prefilter]]\nname = \"{KEYWORD_RULE}\"\nwhen = {}\naction = \"exclude\"\nreason = \"{KEYWORD_REASON}\"",
                    toml_value(&when)
                );
            }
            Rung::Embed => {
                let fields: Vec<String> = embedded
                    .iter()
                    .map(|f| toml::Value::String(f.clone()).to_string())
                    .collect();
                let _ = writeln!(
                    s,
                    "[[stages]]\nname = \"{EMBED_STAGE}\"\ntype = \"embed\"\nversion = 1\nfields = [{}]\npositive = [{}]\nthreshold = {EMBED_THRESHOLD}\nthen = \"{then}\"",
                    fields.join(", "),
                    toml::Value::String(question.to_owned())
                );
            }
        }
        s
    }

    /// What the rung does and, once counted, what it kept, as TOML
    /// comment lines.
    pub fn comment(&self, counted: Option<&Counted>) -> String {
        let what = match self {
            Rung::Keyword { terms } => {
                let named: Vec<String> = terms.iter().map(|t| format!("\"{t}\"")).collect();
                format!(
                    "The first rung, before any model: the question names {}, so a unit whose text mentions none of them (as whole words, in any case) is excluded as `{KEYWORD_REASON}`.",
                    named.join(", ")
                )
            }
            Rung::Embed => format!(
                "The first rung, before any model: the question names no distinctive term (no proper name, quoted word or parenthesised list), so a local sentence embedder (all-MiniLM-L6-v2, no model calls) scores each unit against the question, and a unit scoring below the threshold {EMBED_THRESHOLD} (cosine similarity) ends here as a negative."
            ),
        };
        let said = match counted {
            Some(c) => c.sentence(),
            None => "Not counted yet.".to_owned(),
        };
        let undo = match self {
            Rung::Keyword { .. } => {
                "Add terms to the pattern, or delete the rule to send every unit to the model."
            }
            Rung::Embed => {
                "Lower the threshold to keep more, or delete the stage to send every unit to the model."
            }
        };
        let text = format!("{what} {said} {undo}");
        wrap_comment(&text, 76)
    }
}

/// What a rung kept of the input when the spec was written.
#[derive(Debug, Clone, PartialEq)]
pub struct Counted {
    /// Units of the input.
    pub units: u64,
    /// Units the rung was tried on (fewer than `units` when sampled).
    pub tried: u64,
    /// Of those, the ones it kept for the model.
    pub kept: u64,
}

impl Counted {
    pub fn sentence(&self) -> String {
        if self.tried == self.units {
            format!(
                "Counted when this spec was written: it keeps {} of the input's {} units for the model.",
                self.kept, self.units
            )
        } else {
            let share = self.kept as f64 / self.tried.max(1) as f64;
            format!(
                "Counted when this spec was written, on {} of the input's {} units spread evenly over it: it keeps {} of them ({:.0} %), so about {} units go to the model.",
                self.tried,
                self.units,
                self.kept,
                100.0 * share,
                (share * self.units as f64).round() as u64
            )
        }
    }

    /// The units the model is expected to see.
    pub fn expected(&self) -> u64 {
        if self.tried == self.units {
            self.kept
        } else {
            let share = self.kept as f64 / self.tried.max(1) as f64;
            (share * self.units as f64).round() as u64
        }
    }
}

/// `a, b or c`.
fn or_list(terms: &[String]) -> String {
    match terms.split_last() {
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    }
}

/// `text` as `# ` comment lines of at most `width` characters. A control
/// character (from the question) becomes a space: a TOML comment may not
/// hold one, and a line break would end it.
fn wrap_comment(text: &str, width: usize) -> String {
    let text: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let mut lines: Vec<String> = Vec::new();
    let mut line = String::from("#");
    for word in text.split_whitespace() {
        if line.len() > 1 && line.chars().count() + 1 + word.chars().count() > width {
            lines.push(std::mem::replace(&mut line, String::from("#")));
        }
        line.push(' ');
        line.push_str(word);
    }
    if line.len() > 1 {
        lines.push(line);
    }
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_parenthesised_list_of_code_names_is_the_terms_not_the_common_words() {
        let q = "Which e-mails refer first-hand to one of (Raptor, Condor, Jedi, Kestrel), and who sent each with what subject?";
        assert_eq!(
            distinctive_terms(q),
            vec!["Raptor", "Condor", "Jedi", "Kestrel"]
        );
    }

    #[test]
    fn names_quotes_and_lists_are_found_and_question_words_are_not() {
        assert_eq!(
            distinctive_terms("Which issues mention Acme Corp or the \"deferred revenue\" plan?"),
            vec!["deferred revenue", "Acme Corp"]
        );
        assert_eq!(
            distinctive_terms("Did anyone in Berlin say 'Kestrel' or talk about it's launch?"),
            vec!["Kestrel", "Berlin"]
        );
        assert_eq!(
            distinctive_terms(
                "What crashes (oom, segfault or panic) happened on Monday? Which mention GitHub?"
            ),
            vec!["oom", "segfault", "panic", "GitHub"]
        );
        assert_eq!(
            distinctive_terms("Who wrote \"done.\" Then Kestrel shipped — Condor too?"),
            vec!["done", "Kestrel", "Condor"]
        );
        // A sentence's first word is no name, nor a list of answers.
        assert!(distinctive_terms("Which messages report a failed payment?").is_empty());
        assert!(
            distinctive_terms("Is it positive (yes or no)? List those. Which are first-hand?")
                .is_empty()
        );
        assert!(
            distinctive_terms("Which messages report a production incident first-hand?").is_empty()
        );
    }

    #[test]
    fn the_regex_matches_whole_words_and_escapes_what_jq_would_read() {
        let r = terms_regex(&["Raptor".into(), "C++".into(), "Acme Corp".into()]);
        assert_eq!(r, r"\bRaptors?\b|\bC\+\+|\bAcme\s+Corps?\b");
    }

    #[test]
    fn a_comment_states_the_count_and_wraps() {
        let rung = Rung::Keyword {
            terms: vec!["Raptor".into()],
        };
        let c = rung.comment(Some(&Counted {
            units: 120,
            tried: 120,
            kept: 12,
        }));
        assert!(
            c.lines().all(|l| l.starts_with("# ") && l.len() <= 76),
            "{c}"
        );
        let text: Vec<&str> = c.lines().filter_map(|l| l.strip_prefix("# ")).collect();
        assert!(
            text.join(" ").contains("keeps 12 of the input's 120 units"),
            "{c}"
        );
        let sampled = Counted {
            units: 10_000,
            tried: 500,
            kept: 50,
        };
        assert_eq!(sampled.expected(), 1000);
        assert!(sampled.sentence().contains("about 1000 units"));
    }
}
