//! The files a run leaves behind: `answer.json`, `answer.md`, `facts.jsonl`
//! and `certificate.json`. Anything a simulated backend produced says
//! [SIMULATED] where it is shown.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;

use crate::error::RunError;
use crate::report::RunReport;

pub const SIMULATED: &str = "[SIMULATED]";

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
        std::fs::write(&tmp, text).map_err(io(&tmp))?;
        std::fs::rename(&tmp, &path).map_err(io(&path))
    };
    write("answer.json", pretty(&report.answer))?;
    write("certificate.json", pretty(&report.certificate))?;
    write("answer.md", markdown(report))?;
    // Facts are streamed to the file: a run may hold many thousands.
    let path = dir.join("facts.jsonl");
    let tmp = dir.join(".facts.jsonl.tmp");
    let file = std::fs::File::create(&tmp).map_err(io(&tmp))?;
    let mut w = std::io::BufWriter::new(file);
    for f in &report.facts {
        serde_json::to_writer(&mut w, f)
            .map_err(std::io::Error::from)
            .and_then(|()| w.write_all(b"\n"))
            .map_err(io(&tmp))?;
    }
    w.flush().map_err(io(&tmp))?;
    drop(w);
    std::fs::rename(&tmp, &path).map_err(io(&path))?;
    Ok(())
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
        let title = item.title.as_deref().unwrap_or("");
        let id = match &item.link {
            Some(link) => format!("[#{}]({link})", item.unit_id),
            None => format!("`{}`", item.unit_id),
        };
        let theme = item
            .theme
            .as_deref()
            .map(|t| format!(" — *{t}*"))
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
                ev.quote.replace('\n', " "),
                ev.field,
                ev.start,
                ev.end
            );
        }
    }
    if !a.themes.is_empty() {
        let _ = writeln!(out, "\n## Recurring causes{sim}\n");
        for (n, t) in a.themes.iter().enumerate() {
            let ids: Vec<String> = t.ids.iter().map(|i| format!("#{i}")).collect();
            let _ = writeln!(
                out,
                "{}. **{}** — {} units: {}",
                n + 1,
                t.key,
                t.count,
                ids.join(", ")
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
            .map(|i| i.0.clone())
            .collect();
        let _ = writeln!(out, "  - negatives to read back: {}", ids.join(", "));
    }
    if !c.verify.abstains.is_empty() {
        let ids: Vec<String> = c.verify.abstains.iter().map(|i| i.0.clone()).collect();
        let _ = writeln!(out, "  - abstains to read back: {}", ids.join(", "));
    }
    let _ = writeln!(out, "\nRun `{}`.", report.run_id);
    out
}
