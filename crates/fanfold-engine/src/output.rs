//! The files a run leaves behind: `answer.json`, `answer.md`, `facts.jsonl`
//! and `certificate.json`, and `selections.jsonl` when a select ran. Anything a simulated backend produced says
//! [SIMULATED] where it is shown.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;

use crate::error::RunError;
use crate::report::RunReport;

pub const SIMULATED: &str = "[SIMULATED]";

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

/// Whether a link from the input may be shown as a link: http(s) only,
/// and nothing that could end the Markdown link early.
pub fn safe_link(link: &str) -> bool {
    (link.starts_with("https://") || link.starts_with("http://"))
        && !link.chars().any(|c| {
            c.is_whitespace() || c.is_control() || matches!(c, '(' | ')' | '<' | '>' | '"' | '`')
        })
}

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
    let selects = &report.certificate.stats.selects;
    if !selects.is_empty() {
        let selections = selects
            .values()
            .flat_map(|r| r.selections.iter().map(|(_, s)| s));
        write_jsonl(dir, "selections.jsonl", selections)?;
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
pub fn confusion_table(name: &str, r: &crate::stages::select::SelectReport) -> String {
    use fanfold_core::Status;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "select `{name}`: {} units, {} scorer calls, {} cached, {} moved by the confidence floor, {} undecided\n",
        r.units, r.calls, r.cached, r.below_floor, r.undecided
    );
    let _ = writeln!(
        out,
        "| choice | by rule | by model | otherwise | then positive | negative | abstain | error | not run |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for (choice, by) in &r.chosen {
        let rule: u64 = by
            .iter()
            .filter(|(k, _)| k.starts_with("rule:"))
            .map(|(_, n)| n)
            .sum();
        let get = |k: &str| by.get(k).copied().unwrap_or(0);
        let c = r.confusion.get(choice);
        let cell = |st: Status| match c {
            Some(m) => m.get(&st).copied().unwrap_or(0).to_string(),
            None => "-".to_owned(),
        };
        let _ = writeln!(
            out,
            "| {} | {rule} | {} | {} | {} | {} | {} | {} | {} |",
            md_text(choice),
            get("model"),
            get("otherwise"),
            cell(Status::Positive),
            cell(Status::Negative),
            cell(Status::Abstain),
            cell(Status::Error),
            cell(Status::NotRun),
        );
    }
    for (choice, ids) in &r.disagreements {
        let _ = writeln!(
            out,
            "\n- sent as `{}`, then judged negative: {}",
            md_text(choice),
            ids.iter()
                .map(|i| md_text(i))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    out
}

fn pretty<T: serde::Serialize>(v: &T) -> String {
    let mut s = serde_json::to_string_pretty(v).unwrap_or_default();
    s.push('\n');
    s
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
            "> **This answer is incomplete.** {}. The items below are only part of the answer; rerun (cached facts are reused) once the cause is fixed.\n",
            a.incomplete.join("; ")
        );
    }
    if a.simulated {
        let _ = writeln!(
            out,
            "> {SIMULATED} These answers come from a scripted or replayed backend, not a model. The accounting (coverage, statuses, caching, stopping) is real; the judgments and token figures are not a quality claim.\n"
        );
    }
    if let Some(reached) = a.reached {
        let _ = writeln!(out, "Threshold reached: **{reached}**{sim}\n");
    }
    let _ = writeln!(out, "## Answer: {} units{sim}\n", a.items.len());
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
    for (name, cluster) in &c.stats.clusters {
        out.push_str(&cluster_section(name, cluster, &sim));
    }
    for (name, select) in &c.stats.selects {
        let _ = writeln!(
            out,
            "\n## Routing: select `{name}`{sim}\n\nEach unit took one choice of the spec's catalog, by a rule or by the model scoring the choices. The right-hand columns are what the chosen stage then said (every selection is in `selections.jsonl`).\n"
        );
        out.push_str(&confusion_table(name, select));
    }
    for (name, audit) in &c.stats.audits {
        let _ = writeln!(
            out,
            "\n## What was thrown away: audit `{name}`{sim}\n\nA seeded sample of each rung's negatives, judged again independently. The miss rate is the share the judge says should have been kept, with its 95 % interval{}.\n",
            match audit.max_miss_rate {
                Some(r) => format!("; the answer needs at most {:.1} %", r * 100.0),
                None => String::new(),
            }
        );
        let _ = writeln!(
            out,
            "| rung | thrown away | judged | disagreed | miss rate | 95 % interval | missed at most | shown |\n|---|---:|---:|---:|---:|---|---:|---|"
        );
        for (rung, r) in &audit.rungs {
            let m = &r.miss;
            let _ = writeln!(
                out,
                "| {rung} | {} | {} | {} | {:.1} % | {:.1}–{:.1} % | {} | {} |",
                m.population,
                m.judged,
                m.disagreements,
                m.rate * 100.0,
                m.low * 100.0,
                m.high * 100.0,
                m.missed_at_most(),
                match r.proven {
                    Some(true) => "yes",
                    Some(false) => "**no**",
                    None => "-",
                }
            );
        }
        for (rung, r) in &audit.rungs {
            if !r.disagreeing.is_empty() {
                let _ = writeln!(
                    out,
                    "\n- `{rung}` disagreements: {}",
                    r.disagreeing
                        .iter()
                        .map(|i| md_text(i))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
        }
        if let Some(to) = &audit.escalate {
            let _ = writeln!(
                out,
                "- {} disagreements were sent to `{to}` and judged there; {} judge calls",
                audit.escalated, audit.calls
            );
        }
    }
    let s = &a.statuses;
    let _ = writeln!(out, "\n## Accounting\n");
    let _ = writeln!(
        out,
        "- source `{}` ({} bytes, {}): {} elements = {} units + {} rejected",
        c.source_hash.short(16),
        c.source_bytes,
        c.source_origin,
        c.coverage.elements,
        c.coverage.units,
        c.coverage.rejected
    );
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
    for (name, w) in &st.widens {
        let _ = writeln!(
            out,
            "- widen `{name}` ({}): {} units judged again, {} with related units ({} shown, {} left out by the token bound), {} with none found; {} reused",
            md_text(&w.group),
            w.units,
            w.widened,
            w.members_shown,
            w.left_out,
            w.alone,
            w.cached
        );
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
        "- verify: {} ({} cited ids, {} evidence quotes checked; {} negatives sampled and {} abstains listed for read-back)",
        if c.verify.passed { "passed" } else { "FAILED" },
        c.verify.cited_checked,
        c.verify.evidence_checked,
        c.verify.negative_sample.len(),
        c.verify.abstains.len()
    );
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

/// A cluster stage's themes as answer.md shows them: each theme with its
/// recounted size and every member cited, then what fits no theme, the
/// contexts that failed and the reorder stress.
fn cluster_section(name: &str, c: &crate::stages::cluster::ClusterReport, sim: &str) -> String {
    let ids = |v: &[fanfold_core::UnitId]| -> String {
        v.iter()
            .map(|i| format!("#{}", md_text(&i.0)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n## Themes: cluster `{name}`{sim}\n\nProposed by the model from the {} facts of `{}`, {} at a time over {} levels ({} contexts, {} reused). Counts are fanfold's own, from the members.\n",
        c.facts, c.reads, c.fan_in, c.levels, c.nodes, c.cached_nodes
    );
    for (n, t) in c.themes.iter().enumerate() {
        let _ = writeln!(
            out,
            "{}. **{}** — {} {}: {}",
            n + 1,
            md_text(&t.label),
            t.count,
            if t.count == 1 { "fact" } else { "facts" },
            ids(&t.members)
        );
        if !t.exemplars.is_empty() {
            let _ = writeln!(out, "   - exemplars: {}", ids(&t.exemplars));
        }
        if !t.dissent.is_empty() {
            let _ = writeln!(out, "   - dissent: {}", ids(&t.dissent));
        }
    }
    if c.themes.is_empty() {
        let _ = writeln!(out, "No theme was found.");
    }
    for (what, list) in [
        ("Outliers (fit no theme)", &c.outliers),
        ("Placed in no theme", &c.unthemed),
        ("**In no theme: their context failed**", &c.failed),
    ] {
        if !list.is_empty() {
            let _ = writeln!(out, "\n{what}: {}", ids(list));
        }
    }
    for e in &c.errors {
        let _ = writeln!(
            out,
            "- context at level {} ({}..{}) failed: {}",
            e.level,
            md_text(&e.first),
            md_text(&e.last),
            md_text(&e.reason)
        );
    }
    if c.unmerged {
        let _ = writeln!(
            out,
            "\nThe merge stopped narrowing: the themes above were never all compared in one context."
        );
    }
    if let Some(why) = &c.stress_skipped {
        let _ = writeln!(out, "\nReorder stress not run: {}.", md_text(why));
    }
    if let Some(s) = &c.stress {
        let verdict = if s.drift <= s.max_drift {
            "within"
        } else {
            "**above**"
        };
        let _ = writeln!(
            out,
            "\nReorder stress: the largest drift over {} reductions is {:.2}, {verdict} the declared {:.2}.\n\n| order | fan-in | themes | drift | failed contexts |\n|---:|---:|---:|---:|---:|",
            s.runs.len(),
            s.drift,
            s.max_drift
        );
        for r in &s.runs {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {:.2} | {} |",
                r.order, r.fan_in, r.themes, r.drift, r.errors
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

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
