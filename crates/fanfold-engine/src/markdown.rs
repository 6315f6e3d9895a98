//! Text shown in Markdown (answer.md, and the HTML report rendered from
//! it): input text escaped so it shows as written, fanfold's own sentences
//! with their code spans kept, and which links may be shown as links.

/// Text from the input, escaped so Markdown and HTML show it as written:
/// on one line, with every character that could start markup escaped.
pub fn md_text(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\n' | '\r' | '\t' => out.push(' '),
            // Mid-line, these are all that can start markup; our text is
            // never at the start of a line, where `#`, `-`, `+` would.
            '\\' | '`' | '*' | '_' | '[' | ']' | '<' | '>' | '|' | '~' | '&' => {
                out.push('\\');
                out.push(c);
            }
            c if c.is_control() => {}
            c => out.push(c),
        }
    }
    out
}

/// One of fanfold's own sentences, whose names are `code spans` and
/// whose other words may come from the input: a lone backtick paired with
/// the next lone backtick stays a code span (where nothing is markup, so
/// only a table's `|` needs its escape), everything else is escaped as
/// [`md_text`] escapes it. Markdown closes a span only with a run of
/// backticks as long as the one that opened it, so a backtick next to
/// another (input can hold ```` ``` ````) never opens or closes a span:
/// it is shown as written, and so is a backtick left without a partner.
pub fn md_sentence(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 8);
    let mut rest = s;
    while let Some(open) = rest.find('`') {
        let after = &rest[open + 1..];
        let lone = !after.starts_with('`');
        let close = after
            .find('`')
            .filter(|&len| lone && len > 0 && !after[len + 1..].starts_with('`'));
        let Some(len) = close else {
            // Not a span: the text up to the first backtick that is not
            // this one's run, shown as written.
            let run = after.len() - after.trim_start_matches('`').len();
            let end = open + 1 + run;
            out.push_str(&md_text(&rest[..end]));
            rest = &rest[end..];
            continue;
        };
        out.push_str(&md_text(&rest[..open]));
        out.push('`');
        for c in after[..len].chars() {
            match c {
                '\n' | '\r' | '\t' => out.push(' '),
                '|' => out.push_str("\\|"),
                c if c.is_control() => {}
                c => out.push(c),
            }
        }
        out.push('`');
        rest = &after[len + 1..];
    }
    out.push_str(&md_text(rest));
    out
}

/// Whether a link from the input may be shown as a link: http(s) only,
/// and nothing that could end the Markdown link early.
pub fn safe_link(link: &str) -> bool {
    (link.starts_with("https://") || link.starts_with("http://"))
        && !link.chars().any(|c| {
            c.is_whitespace() || c.is_control() || matches!(c, '(' | ')' | '<' | '>' | '"' | '`')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sentence_keeps_its_code_spans_and_escapes_the_rest() {
        assert_eq!(
            md_sentence("widen `context` (key `.thread`): bad_key <b>"),
            "widen `context` (key `.thread`): bad\\_key \\<b\\>"
        );
        // In a table cell a pipe would end the cell, even in a span.
        assert_eq!(md_sentence("a `x|y` b"), "a `x\\|y` b");
        // A lone backtick is not a span: shown as written.
        assert_eq!(md_sentence("it's `open"), "it's \\`open");
        assert_eq!(md_sentence("`a\nb`"), "`a b`");
        // A run of backticks from the input opens and closes nothing, so
        // nothing between them turns into a link, an image or HTML.
        let id = "`![x](https://evil.example/p.png)```";
        let shown = md_sentence(&format!("repeats id = `{id}` of element 2"));
        assert!(!shown.contains("![x]"), "{shown}");
        assert!(shown.contains("!\\[x\\]"), "{shown}");
        let shown = md_sentence("a ``b`` c `d`");
        assert_eq!(shown, "a \\`\\`b\\`\\` c `d`");
    }

    #[test]
    fn input_text_shows_as_written() {
        let t = md_text("![x](javascript:alert(1)) <img src=x onerror=y> *bold*\n## h");
        assert!(!t.contains("!["), "{t}");
        assert!(t.contains("\\<img") && !t.contains(" <img"), "{t}");
        assert!(t.contains("\\*bold\\*"), "{t}");
        assert!(!t.contains('\n'), "{t}");
        assert!(safe_link("https://github.com/o/r/issues/1"));
        assert!(!safe_link("javascript:alert(1)"));
        assert!(!safe_link("https://x.test/a) [y](javascript:z"));
        assert!(!safe_link("data:text/html,hi"));
    }
}
