//! `fanfold label OUT_DIR`: a person answers the labels a cascade asked
//! for (`labels-wanted.jsonl`), one unit at a time, in a terminal of 80 by
//! 24 or larger; each answer is stored at once, so quitting loses nothing
//! and the next start resumes with the first unit still unlabelled.
//! `--import FILE` takes `{"id", "decision"}` lines instead, for labels
//! that already exist (a data set's own).

use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use crossterm::event::{self, Event, KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use crossterm::{cursor, execute, terminal};
use fanfold_engine::stages::map_cascade::{AskedFor, WANTED_FILE, WantedLabel, lower_level_hint};
use fanfold_store::{Label, Store};

#[derive(clap::Args)]
pub struct LabelArgs {
    /// The run's output folder, holding `labels-wanted.jsonl`.
    out: PathBuf,
    /// The store the run used (a file, or a PostgreSQL address).
    #[arg(long, env = crate::env_vars::STORE, default_value = ".fanfold/store.sqlite")]
    store: PathBuf,
    /// Who is labelling, stored with each label.
    #[arg(long, env = "USER", default_value = "someone")]
    labeller: String,
    /// Take the labels from this JSONL file of `{"id", "decision"}` lines
    /// instead of asking.
    #[arg(long, value_name = "FILE")]
    import: Option<PathBuf>,
}

/// The rows of the screen, and the rows kept for the header and the keys.
const ROWS: usize = 24;
const COLS: usize = 80;

pub fn label(args: &LabelArgs) -> Result<()> {
    let wanted = read_wanted(&args.out.join(WANTED_FILE))?;
    if fanfold_store::postgres_url(&args.store).is_none() && !args.store.is_file() {
        bail!("no store at {}", args.store.display());
    }
    let store = Store::open(&args.store)?;
    let labeller = format!("person:{}", args.labeller);
    if let Some(file) = &args.import {
        return import(&store, &wanted, file, &labeller);
    }
    let open: Vec<WantedLabel> = wanted
        .into_iter()
        .filter(|w| matches!(store.get_label(&w.key), Ok(None)))
        .collect();
    if open.is_empty() {
        println!("every label the run asked for is given; run the spec again to use them");
        return Ok(());
    }
    // Labels past a cascade's budget are said, with why, before any is
    // asked, and a person at the terminal agrees to them first.
    let past = past_budget(&open);
    if let Some(note) = &past {
        println!("{note}");
    }
    if !std::io::IsTerminal::is_terminal(&std::io::stdin()) {
        bail!(
            "fanfold label asks a person at a terminal; without one, give the labels with --import FILE"
        );
    }
    let summary = ask(&store, &open, &labeller, past.as_deref())?;
    println!(
        "{} labelled, {} skipped, {} still wanted; run the spec again to use them",
        summary.labelled,
        summary.skipped,
        open.len() - summary.labelled
    );
    Ok(())
}

fn read_wanted(path: &Path) -> Result<Vec<WantedLabel>> {
    let text = std::fs::read_to_string(path).with_context(|| {
        format!(
            "reading {} (a run whose cascade has a person as its oracle writes it)",
            path.display()
        )
    })?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(n, l)| {
            serde_json::from_str(l)
                .with_context(|| format!("{} line {}: not a wanted label", path.display(), n + 1))
        })
        .collect()
}

/// Takes labels from a JSONL file of `{"id", "decision"}` lines. A file
/// that contradicts itself (one id, two decisions) is refused, naming the
/// id and both lines. An id written as a number is matched as the unit's
/// id text; a whole number written as a float (`2.0`) is read as the
/// integer id (`"2"`) when the run asked for that unit, and said so. Ids
/// the run did not ask labels for are named, not stored: a data set's
/// labels often cover more units than a run asks about, so that is a
/// warning, unless no id of the file matches at all, which means the
/// file names units some other way and is refused.
fn import(store: &Store, wanted: &[WantedLabel], file: &Path, labeller: &str) -> Result<()> {
    if let Some(note) = past_budget(wanted) {
        println!("{note}");
    }
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let asked: std::collections::HashSet<&str> = wanted.iter().map(|w| w.id.as_str()).collect();
    let at = |line: usize| format!("{} line {line}", file.display());
    // id -> (line, decision), for the ids the run asked about.
    let mut given: std::collections::HashMap<String, (usize, String)> =
        std::collections::HashMap::new();
    let mut decided: std::collections::HashMap<String, (usize, String)> =
        std::collections::HashMap::new();
    let mut unknown: Vec<(usize, String)> = Vec::new();
    let mut read_as: Vec<String> = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let n = n + 1;
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value =
            serde_json::from_str(line).with_context(|| format!("{}: not JSON", at(n)))?;
        let id = match v.get("id") {
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(serde_json::Value::Number(num)) => {
                let (id, note) =
                    number_id(num, &asked).map_err(|e| anyhow::anyhow!("{}: {e}", at(n)))?;
                read_as.extend(note.map(|note| format!("line {n}: {note}")));
                id
            }
            _ => bail!("{}: no string or number `id`", at(n)),
        };
        let Some(decision) = v.get("decision").and_then(serde_json::Value::as_str) else {
            bail!("{}: no string `decision`", at(n));
        };
        // Every id, asked about or not: a file that says two things of
        // one unit cannot be taken at its word for either.
        match decided.get(&id) {
            Some((first, said)) if said != decision => bail!(
                "{}: unit {id:?} is labelled `{said}` on line {first} and `{decision}` on line {n}; keep the one that is right",
                file.display()
            ),
            Some(_) => continue,
            None => {
                decided.insert(id.clone(), (n, decision.to_owned()));
            }
        }
        if asked.contains(id.as_str()) {
            given.insert(id, (n, decision.to_owned()));
        } else {
            unknown.push((n, id));
        }
    }
    if given.is_empty() && !unknown.is_empty() {
        bail!(
            "none of the {} ids in {} is a unit the run asked labels for ({}); the run asked about {}",
            unknown.len(),
            file.display(),
            listed(&unknown),
            listed_ids(wanted)
        );
    }
    let (mut stored, mut missing) = (0, 0);
    for w in wanted {
        let Some((line, decision)) = given.get(&w.id) else {
            missing += 1;
            continue;
        };
        if !w.decisions.contains(decision) {
            bail!(
                "{}: unit {} may be labelled {}, not `{decision}`",
                at(*line),
                w.id,
                w.decisions.join(", ")
            );
        }
        give(store, w, decision, labeller)?;
        stored += 1;
    }
    for note in &read_as {
        eprintln!("note: {}: {note}", file.display());
    }
    if !unknown.is_empty() {
        eprintln!(
            "warning: {} ids in {} are not units the run asked labels for, and were not stored: {}",
            unknown.len(),
            file.display(),
            listed(&unknown)
        );
    }
    println!(
        "{stored} labels stored, {missing} wanted labels not in {}",
        file.display()
    );
    Ok(())
}

/// The id a number names. Its text as JSON writes it when the run asked
/// about that; else a whole number written as a float (`2.0`) is the
/// integer's text (`"2"`), with a note saying so. A float past 2^53 is
/// refused: it no longer tells neighbouring integers apart
/// (18446744073709551616 and ...617 read as one).
fn number_id(
    num: &serde_json::Number,
    asked: &std::collections::HashSet<&str>,
) -> Result<(String, Option<String>)> {
    let text = num.to_string();
    if asked.contains(text.as_str()) || !num.is_f64() {
        return Ok((text, None));
    }
    let Some(x) = num.as_f64() else {
        return Ok((text, None));
    };
    /// The largest magnitude below which every integer is a distinct float.
    const EXACT: f64 = 9_007_199_254_740_992.0;
    if x.fract() != 0.0 {
        return Ok((text, None));
    }
    if x.abs() >= EXACT {
        bail!(
            "id {text} is a number too large to be read exactly (integers past 2^53 share their floats); write the id as a string"
        );
    }
    // Exact: |x| < 2^53, so the integer is the float's value.
    let whole = format!("{}", x as i64);
    if asked.contains(whole.as_str()) {
        let note = format!("id {text} was read as unit \"{whole}\"");
        Ok((whole, Some(note)))
    } else {
        Ok((text, None))
    }
}

/// Up to ten ids with their lines, and how many more.
fn listed(ids: &[(usize, String)]) -> String {
    let mut out: Vec<String> = ids
        .iter()
        .take(10)
        .map(|(line, id)| format!("{id:?} (line {line})"))
        .collect();
    if ids.len() > 10 {
        out.push(format!("and {} more", ids.len() - 10));
    }
    out.join(", ")
}

/// Up to five ids the run asked about, and how many in all.
fn listed_ids(wanted: &[WantedLabel]) -> String {
    let shown: Vec<String> = wanted
        .iter()
        .take(5)
        .map(|w| format!("{:?}", w.id))
        .collect();
    match wanted.len() {
        0 => "no unit".to_owned(),
        n if n > 5 => format!("{n} units, such as {}", shown.join(", ")),
        n => format!("{n}: {}", shown.join(", ")),
    }
}

/// Stores `decision` as the label `w` asks for.
fn give(store: &Store, w: &WantedLabel, decision: &str, labeller: &str) -> Result<()> {
    store.put_label(&Label {
        key: w.key,
        stage: w.stage.clone(),
        unit_id: w.id.clone(),
        decision: decision.to_owned(),
        labeller: labeller.to_owned(),
    })?;
    Ok(())
}

struct Summary {
    labelled: usize,
    skipped: usize,
}

/// Leaves the terminal as it found it, however `ask` ends.
struct RawScreen;

impl RawScreen {
    fn enter() -> Result<RawScreen> {
        terminal::enable_raw_mode().context("the terminal cannot take single keys")?;
        // From here on the guard restores the terminal, whatever fails.
        let screen = RawScreen;
        let mut out = std::io::stdout();
        execute!(out, terminal::EnterAlternateScreen, cursor::Hide)?;
        Ok(screen)
    }
}

impl Drop for RawScreen {
    fn drop(&mut self) {
        let mut out = std::io::stdout();
        let _ = execute!(out, cursor::Show, terminal::LeaveAlternateScreen);
        let _ = terminal::disable_raw_mode();
    }
}

/// What `wanted` asks past each cascade's label budget, and why; `None`
/// when every label is within it.
fn past_budget(wanted: &[WantedLabel]) -> Option<String> {
    // stage -> (within the budget, past it, the budget)
    let mut by_stage: std::collections::BTreeMap<&str, (usize, usize, usize)> =
        std::collections::BTreeMap::new();
    for w in wanted {
        let e = by_stage.entry(w.stage.as_str()).or_default();
        match w.asked_for {
            AskedFor::Thresholds => e.0 += 1,
            AskedFor::Oracle => e.1 += 1,
        }
        e.2 = w.label_budget;
    }
    let said: Vec<String> = by_stage
        .iter()
        .filter(|(_, (within, past, budget))| *past > 0 || (*budget > 0 && within > budget))
        .map(|(stage, (within, past, budget))| {
            if *past == 0 {
                // Only `fanfold plan` lists more draws than the budget:
                // the union of its candidates'.
                return format!(
                    "stage {stage}: {} of these {within} labels are PAST its label budget of {budget}. `fanfold plan` measures several candidate proxies; each draws the labels that set its thresholds by its own scores, within the budget, and the plan asks for their union.",
                    within - budget
                );
            }
            let seed = wanted
                .iter()
                .find(|w| w.stage == *stage)
                .map_or(0, |w| w.seed);
            format!(
                "stage {stage}: {past} of these {} labels are PAST its label budget of {budget}. The budget was spent proving where the proxy may decide; these are the units the proven plan leaves to the oracle, because the labels did not prove the proxy sure of them. A lower level leaves fewer: {}",
                within + past,
                lower_level_hint(seed)
            )
        })
        .collect();
    (!said.is_empty()).then(|| said.join("\n"))
}

fn ask(
    store: &Store,
    open: &[WantedLabel],
    labeller: &str,
    past_budget: Option<&str>,
) -> Result<Summary> {
    let _screen = RawScreen::enter()?;
    if let Some(note) = past_budget
        && !agreed(note)?
    {
        return Ok(Summary {
            labelled: 0,
            skipped: 0,
        });
    }
    let mut at = 0;
    let mut history: Vec<usize> = Vec::new();
    let mut skipped = std::collections::BTreeSet::new();
    let mut note = String::new();
    loop {
        // Past the last unit: the last answer can still be taken back.
        let w = open.get(at);
        match w {
            Some(w) => draw(w, at, open.len(), history.len(), skipped.len(), &note)?,
            None => draw_done(open.len(), history.len(), skipped.len())?,
        }
        note.clear();
        let Pressed::Key(code) = next_press()? else {
            break;
        };
        match code {
            KeyCode::Char('s') if w.is_some() => {
                skipped.insert(at);
                at += 1;
            }
            KeyCode::Char('u') => match history.pop() {
                Some(back) => {
                    if let Some(prev) = open.get(back) {
                        store.delete_label(&prev.key)?;
                    }
                    at = back;
                }
                None => note = "nothing to undo".into(),
            },
            KeyCode::Char(c) => {
                let Some(w) = w else { continue };
                let choice = c
                    .to_digit(10)
                    .and_then(|d| usize::try_from(d).ok())
                    .and_then(|d| d.checked_sub(1))
                    .and_then(|d| w.decisions.get(d));
                match choice {
                    Some(decision) => {
                        give(store, w, decision, labeller)?;
                        skipped.remove(&at);
                        history.push(at);
                        at += 1;
                    }
                    None => note = format!("`{c}` is no key here"),
                }
            }
            _ => {}
        }
    }
    Ok(Summary {
        labelled: history.len(),
        skipped: skipped.len(),
    })
}

/// Standard output with the screen cleared and the cursor home.
fn cleared() -> Result<std::io::Stdout> {
    let mut out = std::io::stdout();
    execute!(
        out,
        cursor::MoveTo(0, 0),
        terminal::Clear(terminal::ClearType::All)
    )?;
    Ok(out)
}

/// The labels past the budget, said before the first of them is asked:
/// true once the person starts, false if they quit.
fn agreed(note: &str) -> Result<bool> {
    let mut out = cleared()?;
    let mut lines = vec!["fanfold label · before you start".to_owned(), String::new()];
    lines.extend(words(note, COLS));
    lines.truncate(ROWS - 2);
    lines.push(String::new());
    lines.push("[enter] start labelling  [q] quit".to_owned());
    write!(out, "{}", lines.join("\r\n"))?;
    out.flush()?;
    loop {
        match next_press()? {
            Pressed::Key(KeyCode::Enter) => return Ok(true),
            Pressed::Quit => return Ok(false),
            Pressed::Key(_) => {}
        }
    }
}

/// A key the person pressed: quitting (q, Esc, Ctrl-C) is the same
/// answer on every screen.
enum Pressed {
    Quit,
    Key(KeyCode),
}

/// Waits for the next key press (releases and other events pass).
fn next_press() -> Result<Pressed> {
    loop {
        let Event::Key(KeyEvent {
            code,
            modifiers,
            kind: KeyEventKind::Press,
            ..
        }) = event::read()?
        else {
            continue;
        };
        return Ok(match code {
            KeyCode::Char('q') | KeyCode::Esc => Pressed::Quit,
            KeyCode::Char('c') if modifiers.contains(KeyModifiers::CONTROL) => Pressed::Quit,
            code => Pressed::Key(code),
        });
    }
}

/// The screen after the last unit.
fn draw_done(of: usize, labelled: usize, skipped: usize) -> Result<()> {
    let mut out = cleared()?;
    write!(
        out,
        "fanfold label · the end of {of} · {labelled} labelled, {skipped} skipped\r\n\r\n[u] undo  [q] quit"
    )?;
    out.flush()?;
    Ok(())
}

/// One unit on the screen: where the person is, the question, what the
/// stage shows of the unit, and the keys. Every line fits 80 columns, and
/// the whole fits 24 rows.
fn draw(
    w: &WantedLabel,
    at: usize,
    of: usize,
    labelled: usize,
    skipped: usize,
    note: &str,
) -> Result<()> {
    let mut lines = vec![
        format!(
            "fanfold label · stage {} · {} of {of} · {labelled} labelled, {skipped} skipped",
            w.stage,
            at + 1
        ),
        format!("unit {}", w.id),
    ];
    const ASKED: &str = "Question: ";
    let question = words(&w.question, COLS - ASKED.len());
    let shown = question.len().min(3);
    for (n, line) in question.iter().take(shown).enumerate() {
        let lead = if n == 0 { ASKED } else { "          " };
        let more = if n + 1 == shown && question.len() > shown {
            " …"
        } else {
            ""
        };
        lines.push(format!("{lead}{line}{more}"));
    }
    lines.push("─".repeat(COLS));
    let keys = w
        .decisions
        .iter()
        .enumerate()
        .map(|(i, d)| format!("[{}] {d}", i + 1))
        .chain(["[s] skip", "[u] undo", "[q] quit"].map(str::to_owned))
        .collect::<Vec<_>>()
        .join("  ");
    let footer = ["─".repeat(COLS), keys, note.to_owned()];
    let room = ROWS.saturating_sub(lines.len() + footer.len());
    let shown = serde_json::to_string_pretty(&w.view).unwrap_or_default();
    let body: Vec<String> = shown.lines().flat_map(|l| wrap(l, COLS)).collect();
    if body.len() > room {
        lines.extend(body.iter().take(room.saturating_sub(1)).cloned());
        lines.push(format!("… {} more lines", body.len() + 1 - room));
    } else {
        lines.extend(body.iter().cloned());
        lines.extend(std::iter::repeat_n(String::new(), room - body.len()));
    }
    lines.extend(footer);
    let mut out = cleared()?;
    for (n, line) in lines.iter().take(ROWS).enumerate() {
        let cut: String = line.chars().take(COLS).collect();
        if n > 0 {
            write!(out, "\r\n")?;
        }
        write!(out, "{cut}")?;
    }
    out.flush()?;
    Ok(())
}

/// `text` as lines of whole words of at most `width` characters (a longer
/// word is cut), its line ends kept.
fn words(text: &str, width: usize) -> Vec<String> {
    let mut out = Vec::new();
    for paragraph in text.lines().filter(|l| !l.trim().is_empty()) {
        let mut line = String::new();
        for word in paragraph.split_whitespace().flat_map(|w| wrap(w, width)) {
            let len = line.chars().count();
            if len > 0 && len + 1 + word.chars().count() > width {
                out.push(std::mem::take(&mut line));
            }
            if !line.is_empty() {
                line.push(' ');
            }
            line.push_str(&word);
        }
        out.push(line);
    }
    out
}

/// `text` in pieces of at most `width` characters.
fn wrap(text: &str, width: usize) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    if chars.is_empty() {
        return vec![String::new()];
    }
    chars
        .chunks(width.max(1))
        .map(|c| c.iter().collect())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_number_id_is_the_unit_it_names_or_said_otherwise() {
        let asked: std::collections::HashSet<&str> = ["2", "7.5", "3.0"].into_iter().collect();
        let id = |json: &str| {
            let n: serde_json::Number = serde_json::from_str(json).expect("number");
            number_id(&n, &asked)
        };
        assert_eq!(id("2").expect("int"), ("2".to_owned(), None));
        let (whole, note) = id("2.0").expect("whole float");
        assert_eq!(whole, "2");
        assert!(note.is_some_and(|n| n.contains("2.0") && n.contains("\"2\"")));
        // Written as the unit's own text, it is that unit.
        assert_eq!(id("3.0").expect("as asked"), ("3.0".to_owned(), None));
        assert_eq!(id("7.5").expect("fraction"), ("7.5".to_owned(), None));
        // Not asked about: kept as written, so it is named as unknown.
        assert_eq!(id("4.0").expect("unknown"), ("4.0".to_owned(), None));
        let big = id("18446744073709551616")
            .expect_err("too large")
            .to_string();
        assert!(big.contains("write the id as a string"), "{big}");
        assert_eq!(
            id("18446744073709551615").expect("u64"),
            ("18446744073709551615".to_owned(), None)
        );
    }

    /// A list of more threshold draws than the budget (a plan's union of
    /// its candidates' draws) is said before anything is asked; one
    /// within the budget is not.
    #[test]
    fn draws_past_the_budget_are_said_before_asking() {
        let line = |n: u8| -> WantedLabel {
            serde_json::from_value(serde_json::json!({
                "stage": "judge",
                "id": n.to_string(),
                "key": fanfold_core::ContentHash([n; 32]),
                "question": "Say yes when a disk broke.",
                "decisions": ["yes", "no"],
                "view": {"title": n},
                "asked_for": "thresholds",
                "label_budget": 3,
            }))
            .expect("a wanted label")
        };
        let within: Vec<WantedLabel> = (0..3).map(line).collect();
        assert_eq!(past_budget(&within), None);
        let union: Vec<WantedLabel> = (0..5).map(line).collect();
        let note = past_budget(&union).expect("said");
        assert!(
            note.contains("stage judge: 2 of these 5 labels are PAST its label budget of 3"),
            "{note}"
        );
        assert!(note.contains("`fanfold plan`"), "{note}");
    }

    #[test]
    fn wrapping_keeps_every_character_within_the_width() {
        let text = "é".repeat(170);
        let pieces = wrap(&text, 80);
        assert_eq!(pieces.len(), 3);
        assert!(pieces.iter().all(|p| p.chars().count() <= 80));
        assert_eq!(pieces.concat(), text);
        assert_eq!(wrap("", 80), vec![String::new()]);
    }

    #[test]
    fn words_wrap_at_spaces_and_keep_line_ends() {
        let lines = words("Say yes when a disk broke.\n\nSay no otherwise.", 12);
        assert_eq!(
            lines,
            ["Say yes when", "a disk", "broke.", "Say no", "otherwise."]
        );
        assert_eq!(
            words(&"x".repeat(30), 12),
            ["xxxxxxxxxxxx", "xxxxxxxxxxxx", "xxxxxx"]
        );
    }
}
