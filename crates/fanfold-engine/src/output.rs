//! The files a run leaves behind: `answer.json`, `answer.md`, `facts.jsonl`
//! and `certificate.json`, and `selections.jsonl` when a select ran. Anything a simulated backend produced says
//! [SIMULATED] where it is shown.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;

use fanfold_ops::interval::Estimate;

use crate::error::RunError;
use crate::report::RunReport;

pub use crate::markdown::{md_sentence, md_text, safe_link};

pub const SIMULATED: &str = "[SIMULATED]";

/// Fails now, before anything is paid for, if the outputs could not be
/// written to `dir` at the end.
pub fn check_writable(dir: &Path) -> Result<(), RunError> {
    let err = |path: &Path| {
        let path = path.display().to_string();
        move |source| RunError::Output { path, source }
    };
    std::fs::create_dir_all(dir).map_err(err(dir))?;
    let probe = dir.join(".fanfold-write-probe");
    std::fs::write(&probe, b"").map_err(err(&probe))?;
    std::fs::remove_file(&probe).map_err(err(&probe))
}

pub fn write_all(dir: &Path, report: &RunReport) -> Result<(), RunError> {
    let io = |path: &Path| {
        let path = path.display().to_string();
        move |source| RunError::Output { path, source }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let write = |name: &str, text: String| -> Result<(), RunError> {
        let path = dir.join(name);
        // Write beside and rename, so a reader never sees half a file.
        let tmp = dir.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, text)
            .map_err(io(&tmp))
            .and_then(|()| std::fs::rename(&tmp, &path).map_err(io(&path)))
            .inspect_err(|_| {
                // A full disk leaves no half-written file behind.
                let _ = std::fs::remove_file(&tmp);
            })
    };
    write("answer.json", pretty(&report.answer))?;
    write("certificate.json", pretty(&report.certificate))?;
    write("answer.md", markdown(report))?;
    // Facts are streamed to the file: a run may hold many thousands.
    write_jsonl(dir, "facts.jsonl", report.facts.iter())?;
    for (name, lines) in &report.files {
        write_jsonl(dir, name, lines.iter())?;
    }
    Ok(())
}

/// Streams `items` to `dir/name`, one JSON value a line, beside and
/// renamed, so a reader never sees half a file.
fn write_jsonl<T: serde::Serialize>(
    dir: &Path,
    name: &str,
    items: impl Iterator<Item = T>,
) -> Result<(), RunError> {
    let path = dir.join(name);
    let tmp = dir.join(format!(".{name}.tmp"));
    let streamed = (|| {
        let file = std::fs::File::create(&tmp)?;
        let mut w = std::io::BufWriter::new(file);
        for item in items {
            serde_json::to_writer(&mut w, &item)?;
            w.write_all(b"\n")?;
        }
        w.flush()
    })();
    let failed = |p: &Path, source| RunError::Output {
        path: p.display().to_string(),
        source,
    };
    streamed.map_err(|e| failed(&tmp, e)).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })?;
    std::fs::rename(&tmp, &path).map_err(|e| failed(&path, e))
}

/// A select's choices as a table: who chose, and what the chosen stages
/// said of the units sent to them.
fn pretty<T: serde::Serialize>(v: &T) -> String {
    let mut s = serde_json::to_string_pretty(v).unwrap_or_default();
    s.push('\n');
    s
}

/// What answer.md and the report say when no stage declares a quality
/// target.
pub const UNMEASURED: &str = "No stage declares a quality target, so nothing measured how many of these decisions are right: \"complete\" means every unit the contract needs was decided, not that the decisions are correct. Declare a `cascade` target on the judge to have it proven.";

/// What one stage's declared quality target came to: the level proven (or
/// why not) and what the cascade saved. The first lines of answer.md and
/// the last a run prints on the terminal.
#[derive(Clone, Debug, PartialEq)]
pub struct ProvenQuality {
    /// The target holds: every unit the proxy did not decide was decided
    /// by the oracle.
    pub met: bool,
    /// It holds at a level declared before the labels were drawn, so the
    /// probability covers it: only then is the quality called proven.
    pub proven: bool,
    /// The stage's statement: the target, whether it holds, the level.
    pub quality: String,
    /// The share of units the proxy decided and the labels asked.
    pub saving: String,
}

/// Each cascade's proven quality and saving, by stage name.
pub fn proven_quality(report: &RunReport) -> Vec<ProvenQuality> {
    use crate::stages::map_cascade::{CascadeReport, REPORT};
    let reports = report
        .certificate
        .stats
        .reports
        .all::<CascadeReport>(REPORT);
    reports
        .iter()
        .map(|(stage, r)| {
            let share = if r.units == 0 {
                0.0
            } else {
                100.0 * r.proxy_decided as f64 / r.units as f64
            };
            // A labels file is read in place of asking someone: said
            // where the figure is, so nobody takes it for a model's.
            let asked = if r.oracle.starts_with("backend ") {
                "oracle calls"
            } else {
                "labels asked"
            };
            let oracle = match r.oracle.strip_prefix("labels file ") {
                Some(file) => format!("the labels in {file} stand in for a person's"),
                None => format!("the oracle is {}", r.oracle),
            };
            ProvenQuality {
                met: r.met,
                proven: r.proven(),
                quality: r.statement(stage),
                saving: format!(
                    "the proxy `{}` decided {} of {} units ({share:.1} %); {} {asked} ({} to set the thresholds, {} for units left to the oracle) against {} without the cascade; {oracle}",
                    r.proxy,
                    r.proxy_decided,
                    r.units,
                    r.oracle_calls,
                    r.labels,
                    r.oracle_calls.saturating_sub(r.labels),
                    r.calls_without
                ),
            }
        })
        .collect()
}

/// An aggregate's rows as a Markdown table (nothing when it has none),
/// each line after `indent` (two spaces sit it under a list item).
pub fn aggregate_table(out: &mut String, g: &crate::report::Aggregate, indent: &str) {
    if g.stated.columns.is_empty() {
        return;
    }
    let cells = |row: &[String]| {
        row.iter()
            .map(|c| md_text(c))
            .collect::<Vec<_>>()
            .join(" | ")
    };
    let _ = writeln!(out, "\n{indent}| {} |", cells(&g.stated.columns));
    let _ = writeln!(out, "{indent}|{}", "---|".repeat(g.stated.columns.len()));
    for row in &g.stated.rows {
        let _ = writeln!(out, "{indent}| {} |", cells(row));
    }
    let _ = writeln!(out);
}

/// At most this many errored units are named in answer.md; facts.jsonl
/// holds every one.
const ERRORS_NAMED: usize = 20;

/// Units that ended in error, each with its stage and why, where a reader
/// of an incomplete answer looks for what to fix.
fn errors_section(out: &mut String, report: &RunReport) {
    let errors: Vec<&fanfold_core::FactRecord> = report
        .facts
        .iter()
        .filter(|f| f.status == fanfold_core::Status::Error)
        .collect();
    if errors.is_empty() {
        return;
    }
    let n = errors.len();
    let _ = writeln!(
        out,
        "\n## Errors: {n} {} ended in error\n",
        if n == 1 { "unit" } else { "units" }
    );
    for f in errors.iter().take(ERRORS_NAMED) {
        let ids: Vec<String> = f
            .source_ids
            .iter()
            .map(|i| format!("#{}", md_text(&i.0)))
            .collect();
        let _ = writeln!(
            out,
            "- {} at stage `{}`: {}",
            ids.join(", "),
            md_text(&f.stage),
            md_sentence(f.reason.as_deref().unwrap_or("no reason recorded"))
        );
    }
    if n > ERRORS_NAMED {
        let _ = writeln!(
            out,
            "- and {} more (facts.jsonl holds each with its reason)",
            n - ERRORS_NAMED
        );
    }
}

/// At most this many kept units are shown a reducer, and this many
/// collapsed ids a kept unit, in answer.md; answer.json holds every one.
const KEPT_SHOWN: usize = 20;
const COLLAPSED_SHOWN: usize = 10;

/// What each reducer's `dedupe` collapsed before it counted: each kept
/// unit, how many were collapsed into it, and which.
fn collapsed_section(out: &mut String, collapsed: &[crate::report::Collapsed], sim: &str) {
    if collapsed.is_empty() {
        return;
    }
    let _ = writeln!(out, "\n## Near-duplicates collapsed{sim}\n");
    let more = |n: usize, shown: usize| {
        if n > shown {
            format!(" and {} more", n - shown)
        } else {
            String::new()
        }
    };
    for c in collapsed {
        let s = &c.summary;
        // The sentence names the spec's own field in a code span; only
        // a backtick could end it early.
        let _ = writeln!(
            out,
            "- **{}**: {}",
            md_text(&c.reducer),
            s.sentence().replace('\n', " ")
        );
        for g in s.groups.iter().take(KEPT_SHOWN) {
            let ids: Vec<String> = g
                .ids
                .iter()
                .take(COLLAPSED_SHOWN)
                .map(|i| format!("#{}", md_text(&i.0)))
                .collect();
            let _ = writeln!(
                out,
                "  - #{} kept, {} collapsed into it: {}{}",
                md_text(&g.kept.0),
                g.collapsed,
                ids.join(", "),
                more(g.ids.len(), COLLAPSED_SHOWN)
            );
        }
        if s.groups.len() > KEPT_SHOWN {
            let _ = writeln!(
                out,
                "  - and {} more kept units (answer.json lists every one)",
                s.groups.len() - KEPT_SHOWN
            );
        }
    }
}

pub fn markdown(report: &RunReport) -> String {
    let a = &report.answer;
    let c = &report.certificate;
    let sim = if a.simulated {
        format!(" {SIMULATED}")
    } else {
        String::new()
    };
    let mut out = String::new();
    if a.complete {
        let _ = writeln!(out, "# {}{sim}\n", a.question);
    } else {
        let _ = writeln!(out, "# INCOMPLETE: {}{sim}\n", a.question);
        let _ = writeln!(
            out,
            "> **This answer is incomplete.** {}. What follows may be only part of the answer; rerun (cached facts are reused, effects in place are only read back) once the cause is fixed.\n",
            a.incomplete.join("; ")
        );
    }
    // What was proven of the answer comes first, with what it saved; a
    // target that is unmet says so in the same place.
    let proven = proven_quality(report);
    for p in &proven {
        let head = if p.proven {
            "Proven quality"
        } else {
            "Quality"
        };
        let _ = writeln!(
            out,
            "> **{head}:** {}\n>\n> **Saving:** {}\n",
            md_sentence(&p.quality),
            md_sentence(&p.saving)
        );
    }
    if a.simulated {
        let _ = writeln!(
            out,
            "> {SIMULATED} These answers come from a scripted or replayed backend, not a model. The accounting (coverage, statuses, caching, stopping) is real; the judgments and token figures are not a quality claim.\n"
        );
    }
    // A path that matched nothing, a broken bound: said where a reader
    // looks first, since the answer above them may be empty for that
    // reason alone.
    for note in &c.notes {
        let _ = writeln!(out, "> **Warning:** {}\n", md_sentence(note));
    }
    // Complete is not correct: a reader learns here whether anything
    // measured how good the answer is.
    if a.quality.is_empty() {
        let _ = writeln!(out, "> **Quality: unmeasured.** {UNMEASURED}\n");
    }
    for line in a
        .quality
        .iter()
        .filter(|l| !proven.iter().any(|p| &p.quality == *l))
    {
        let _ = writeln!(out, "> **Quality:** {}\n", md_sentence(line));
    }
    if let Some(reached) = a.reached {
        let _ = writeln!(out, "Threshold reached: **{reached}**{sim}\n");
    }
    match &a.stated {
        // An interval contract's answer is its estimate.
        _ if a.estimate.is_some() => {
            if let Some(e) = &a.estimate {
                out.push_str(&estimate_markdown(e, &sim));
            }
        }
        // A number, rows or pairs: stated first, then the units cited.
        Some(g) => {
            let _ = writeln!(
                out,
                "## Answer: {}{sim}\n\n`{}` ({})",
                md_sentence(&g.stated.statement),
                md_text(&g.name),
                g.kind
            );
            aggregate_table(&mut out, g, "  ");
            let _ = writeln!(out, "\n### Cited: {} units{sim}\n", a.items.len());
        }
        None => {
            let _ = writeln!(out, "## Answer: {} units{sim}\n", a.items.len());
        }
    }
    for item in &a.items {
        // Titles, ids and quotes are the input's text: shown as text,
        // never as Markdown or HTML, and only http(s) links are links.
        let title = md_text(item.title.as_deref().unwrap_or(""));
        let id = match item.link.as_deref().filter(|l| safe_link(l)) {
            Some(link) => format!("[#{}]({link})", md_text(&item.unit_id.0)),
            None => format!("#{}", md_text(&item.unit_id.0)),
        };
        let theme = item
            .theme
            .as_deref()
            .map(|t| format!(" — *{}*", md_text(t)))
            .unwrap_or_default();
        let score = item
            .score
            .map(|s| format!(" (score {s})"))
            .unwrap_or_default();
        let _ = writeln!(out, "- {id} {title}{theme}{score}");
        if !item.shown.is_empty() {
            let shown: Vec<String> = item
                .shown
                .iter()
                .map(|(k, v)| format!("{}: {}", md_text(k), md_text(v)))
                .collect();
            let _ = writeln!(out, "  {}", shown.join(" · "));
        }
        // A field whose value is the item's theme is already shown by it.
        let fields: Vec<(&String, &serde_json::Value)> = item
            .fields
            .iter()
            .filter(|(_, v)| item.theme.is_none() || v.as_str() != item.theme.as_deref())
            .collect();
        if !fields.is_empty() {
            let shown: Vec<String> = fields
                .iter()
                .map(|(k, v)| {
                    let v = v.as_str().map_or_else(|| v.to_string(), str::to_owned);
                    format!("{}: {}", md_text(k), md_text(&v))
                })
                .collect();
            let _ = writeln!(out, "  {}", shown.join(" · "));
        }
        for ev in item.evidence.iter().take(2) {
            let _ = writeln!(
                out,
                "  > {} ({} bytes {}..{})",
                md_text(&ev.quote),
                md_text(&ev.field),
                ev.start,
                ev.end
            );
        }
    }
    if !a.themes.is_empty() {
        let _ = writeln!(out, "\n## Recurring causes{sim}\n");
        for (n, t) in a.themes.iter().enumerate() {
            let ids: Vec<String> = t
                .ids
                .iter()
                .map(|i| format!("#{}", md_text(&i.0)))
                .collect();
            let _ = writeln!(
                out,
                "{}. **{}** — {} units: {}",
                n + 1,
                md_text(&t.key),
                t.count,
                ids.join(", ")
            );
        }
    }
    if !a.aggregates.is_empty() {
        let _ = writeln!(out, "\n## Aggregates{sim}\n");
        for g in &a.aggregates {
            let _ = writeln!(
                out,
                "- **{}** ({}): {}",
                md_text(&g.name),
                g.kind,
                md_sentence(&g.stated.statement)
            );
            aggregate_table(&mut out, g, "  ");
        }
    }
    collapsed_section(&mut out, &a.collapsed, &sim);
    for section in &report.sections {
        out.push_str(section);
    }
    // What was not read is part of the answer: a skipped file or a bad
    // record is named here, where a reader looks, not only in the
    // certificate.
    if !c.rejections.is_empty() {
        let _ = writeln!(
            out,
            "\n## Not read: {} elements rejected before any stage\n",
            c.coverage.rejected
        );
        for r in c.rejections.iter().take(20) {
            let _ = writeln!(out, "- {}", md_sentence(r));
        }
        let more = c
            .coverage
            .rejected
            .saturating_sub(20.min(c.rejections.len() as u64));
        if more > 0 {
            let _ = writeln!(
                out,
                "- and {more} more (certificate.json counts them by reason)"
            );
        }
    }
    errors_section(&mut out, report);
    let s = &a.statuses;
    let _ = writeln!(out, "\n## Accounting\n");
    let repeated = c.coverage.repeated_identical;
    let _ = writeln!(
        out,
        "- source `{}` ({} bytes, {}): {} elements = {} units + {} rejected{}",
        c.source_hash.short(16),
        c.source_bytes,
        c.source_origin,
        c.coverage.elements,
        c.coverage.units,
        c.coverage.rejected,
        if repeated > 0 {
            format!(" + {repeated} repeated identically")
        } else {
            String::new()
        }
    );
    // A repeat is its unit again, judged once: said, so that a count of
    // input rows against units is explained, and named, so it can be found.
    if repeated > 0 {
        let _ = writeln!(
            out,
            "- repeated_identical: {repeated} elements repeat an earlier unit's key and content; each is that unit, judged once{}",
            c.repeats
                .first()
                .map(|r| format!(" (the first: {})", md_sentence(r)))
                .unwrap_or_default()
        );
    }
    let _ = writeln!(
        out,
        "- excluded by the prefilter: {} {:?}",
        a.excluded, c.excluded_by_reason
    );
    let _ = writeln!(
        out,
        "- statuses{sim}: positive {}, negative {}, abstain {}, error {}, cancelled {}, not run {}",
        s.positive, s.negative, s.abstain, s.error, s.cancelled, s.not_run
    );
    let _ = writeln!(out, "- stop: {} (contract {})", c.stop.code(), c.contract);
    let st = &c.stats;
    let _ = writeln!(
        out,
        "- model calls {}, cache hits {}, misses {}; slots {}, most in flight {}",
        st.model_calls, st.cache_hits, st.cache_misses, st.slots, st.max_in_flight
    );
    if st.corrupt_facts > 0 {
        let _ = writeln!(
            out,
            "- {} stored facts did not decode: they were dropped and computed again",
            st.corrupt_facts
        );
    }
    let _ = writeln!(
        out,
        "- tokens{sim}: prompt {}, cached {}, completion {}",
        st.cost.prompt_tokens, st.cost.cached_tokens, st.cost.completion_tokens
    );
    let phases: Vec<String> = st
        .phases_ms
        .iter()
        .map(|(p, ms)| format!("{p} {ms} ms"))
        .collect();
    let _ = writeln!(out, "- wall {} ms: {}", st.wall_ms, phases.join(", "));
    for line in &report.accounting {
        let _ = writeln!(out, "- {line}");
    }
    if st.truncated_units > 0 {
        let _ = writeln!(
            out,
            "- {} units were cut to fit the model's window (see `truncated_tokens` in facts.jsonl)",
            st.truncated_units
        );
    }
    for note in &c.notes {
        let _ = writeln!(out, "- note: {note}");
    }
    let _ = writeln!(
        out,
        "- verify: {} ({} cited ids, {} evidence quotes checked, {} reducers recomputed from their facts; {} negatives sampled and {} abstains listed for read-back)",
        if c.verify.passed { "passed" } else { "FAILED" },
        c.verify.cited_checked,
        c.verify.evidence_checked,
        c.verify.numbers_checked,
        c.verify.negative_sample.len(),
        c.verify.abstains.len()
    );
    for m in &c.verify.number_mismatches {
        let _ = writeln!(out, "  - **numbers differ:** {}", md_sentence(m));
    }
    if !c.verify.negative_sample.is_empty() {
        let ids: Vec<String> = c
            .verify
            .negative_sample
            .iter()
            .map(|i| md_text(&i.0))
            .collect();
        let _ = writeln!(out, "  - negatives to read back: {}", ids.join(", "));
    }
    if !c.verify.abstains.is_empty() {
        let ids: Vec<String> = c.verify.abstains.iter().map(|i| md_text(&i.0)).collect();
        let _ = writeln!(out, "  - abstains to read back: {}", ids.join(", "));
    }
    let _ = writeln!(out, "\nRun `{}`.", report.run_id);
    out
}

fn percent(x: f64) -> String {
    format!("{:.1} %", 100.0 * x)
}

/// An estimate in words and as a table, for answer.md and the HTML
/// report alike.
pub struct EstimateText {
    /// Whether the interval reached its half width, and how many units
    /// were judged of how many.
    pub statement: String,
    pub header: [String; 5],
    /// One row a group (one for a `count`), cells as plain text.
    pub rows: Vec<[String; 5]>,
    /// How the interval is computed.
    pub method: String,
}

pub fn estimate_text(e: &Estimate) -> EstimateText {
    let state = if e.reached {
        format!(
            "the interval reached ±{} at {} confidence",
            percent(e.half_width),
            percent(e.confidence)
        )
    } else {
        format!(
            "INCOMPLETE: the interval did not reach ±{} (the widest is ±{})",
            percent(e.half_width),
            percent(e.groups.iter().map(|g| g.half_width).fold(0.0, f64::max))
        )
    };
    let statement = format!(
        "An estimate, not a count of every unit: {state}. {} of {} units judged in a seeded random order (seed {}) at stage `{}`, of {} routed{}.",
        e.judged,
        e.population,
        e.seed,
        e.stage,
        e.routed,
        if e.unknown > 0 {
            format!(
                "; {} more failed and count as either value, which widens the interval",
                e.unknown
            )
        } else {
            String::new()
        }
    );
    let header = [
        format!("`{}` ({})", e.reducer, e.kind),
        "share of routed units".to_owned(),
        format!("{} % interval", trim(100.0 * e.confidence)),
        "estimated total".to_owned(),
        "total interval".to_owned(),
    ];
    let rows = e
        .groups
        .iter()
        .map(|g| {
            [
                g.key.clone().unwrap_or_else(|| "counted".into()),
                percent(g.share),
                format!("{} – {}", percent(g.lower), percent(g.upper)),
                format!("{:.0}", g.total),
                format!("{:.0} – {:.0}", g.total_lower.floor(), g.total_upper.ceil()),
            ]
        })
        .collect();
    let method = format!(
        "The interval is a betting confidence sequence for sampling without replacement (valid at whatever point judging stopped){}.",
        if e.groups.len() > 1 {
            format!(
                "; the {} groups hold together, each at 1 − {}/{}",
                e.groups.len(),
                trim(1.0 - e.confidence),
                e.groups.len()
            )
        } else {
            String::new()
        }
    );
    EstimateText {
        statement,
        header,
        rows,
        method,
    }
}

/// answer.md's statement of the estimate.
pub fn estimate_markdown(e: &Estimate, sim: &str) -> String {
    let t = estimate_text(e);
    let mut out = String::new();
    let _ = writeln!(out, "## Answer: an ESTIMATE{sim}\n\n{}\n", t.statement);
    let _ = writeln!(out, "| {} |", t.header.join(" | "));
    let _ = writeln!(out, "|---|---|---|---|---|");
    for row in &t.rows {
        // A group is a value from the data: shown as written, never as
        // markup.
        let [key, rest @ ..] = row;
        let _ = writeln!(out, "| {} | {} |", md_text(key), rest.join(" | "));
    }
    let _ = writeln!(out, "\n{}\n", t.method);
    out
}

/// A number without trailing zeros.
fn trim(x: f64) -> String {
    let s = format!("{x:.4}");
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}
