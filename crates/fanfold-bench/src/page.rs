//! Reports for people: a run's answer and a ladder's strategies, each as
//! Markdown and as one self-contained HTML page (inline CSS and SVG, no
//! script, nothing fetched), so a page can be mailed, archived or opened
//! from disk. Every figure states its backend, model, machine and date,
//! and a simulated one says so in its title.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};
use fanfold_core::{FactRecord, StatusCounts};
use fanfold_engine::output::{aggregate_table, md_text, safe_link};
use fanfold_engine::report::{Answer, Certificate};

use crate::ladder::{Ladder, Row, frontier, verdict};
use crate::report::utc_datetime;

/// Text for HTML content and attribute values.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The anchor of a unit's section: ids are any text, so they are encoded
/// to the characters an HTML id and a URL fragment both keep as they are.
pub fn anchor(unit_id: &str) -> String {
    let mut out = String::from("unit-");
    for b in unit_id.bytes() {
        if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' {
            out.push(b as char);
        } else {
            let _ = write!(out, ".{b:02x}");
        }
    }
    out
}

const STYLE: &str = "body{font:15px/1.45 system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#1b1f24}\
h1{font-size:1.5em;margin-bottom:.2em}h2{margin-top:1.6em;border-bottom:1px solid #d0d7de}\
.meta{color:#57606a}.banner{padding:.6em 1em;border-radius:6px;font-weight:600;margin:1em 0}\
.ok{background:#dafbe1;color:#116329}.bad{background:#ffebe9;color:#82071e}.sim{background:#fff8c5;color:#6f4e00}.warn{background:#fff1e5;color:#953800}\
table{border-collapse:collapse;margin:1em 0;font-size:.92em}td,th{border:1px solid #d0d7de;padding:.3em .6em;text-align:left;vertical-align:top}\
th{background:#f6f8fa}td.n{text-align:right;font-variant-numeric:tabular-nums}\
blockquote{margin:.3em 0;padding:.2em .8em;border-left:3px solid #8c959f;color:#24292f;background:#f6f8fa}\
section.unit{border:1px solid #d0d7de;border-radius:6px;padding:.4em 1em;margin:.8em 0}\
section.unit:target{border-color:#0969da;box-shadow:0 0 0 2px #0969da33}\
figure{margin:1em 0}figcaption{color:#57606a;font-size:.9em}svg text{font:12px system-ui,sans-serif}";

fn page(title: &str, body: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>{}</title><style>{STYLE}</style></head><body>\n{body}</body></html>\n",
        esc(title)
    )
}

/// The date a run started, from its id (`run-<unix ms>-...`).
fn run_date(run_id: &str) -> String {
    run_id
        .split('-')
        .nth(1)
        .and_then(|ms| ms.parse::<u64>().ok())
        .map(|ms| {
            utc_datetime(std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms)) + " UTC"
        })
        .unwrap_or_else(|| "an unknown date".to_owned())
}

fn backends(c: &Certificate) -> String {
    if c.backends.is_empty() {
        return "no model".to_owned();
    }
    c.backends
        .iter()
        .map(|b| {
            let sim = if b.simulated { " [SIMULATED]" } else { "" };
            format!("{} {}{sim}", b.kind, b.model_id)
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// A run's output folder, read back.
pub struct RunOutput {
    pub answer: Answer,
    pub certificate: Certificate,
    pub facts: Vec<FactRecord>,
    /// What the folder shows of being changed after its run (a fact that
    /// no longer matches its digest, an answer item no fact supports);
    /// empty when nothing does.
    pub changed: Vec<String>,
}

impl RunOutput {
    pub fn read(dir: &Path) -> Result<RunOutput> {
        let read = |name: &str| {
            let path = dir.join(name);
            std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))
        };
        let answer = serde_json::from_str(&read("answer.json")?)
            .with_context(|| format!("{}/answer.json is not a fanfold answer", dir.display()))?;
        let certificate = serde_json::from_str(&read("certificate.json")?).with_context(|| {
            format!(
                "{}/certificate.json is not a fanfold certificate",
                dir.display()
            )
        })?;
        let mut lines = Vec::new();
        for (n, line) in read("facts.jsonl")?.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let fact: FactRecord = serde_json::from_str(line).with_context(|| {
                format!("{}/facts.jsonl line {}: not a fact", dir.display(), n + 1)
            })?;
            lines.push((n + 1, fact));
        }
        let changed = fanfold_engine::recheck::check_folder(&answer, &certificate, &lines);
        Ok(RunOutput {
            answer,
            certificate,
            facts: lines.into_iter().map(|(_, f)| f).collect(),
            changed,
        })
    }
}

/// Statuses and coverage as labelled bars, one per outcome.
fn status_chart(s: &StatusCounts, excluded: u64, rejected: u64, caption: &str) -> String {
    let bars: [(&str, u64, &str); 8] = [
        ("positive", s.positive, "#1a7f37"),
        ("negative", s.negative, "#8c959f"),
        ("abstain", s.abstain, "#bf8700"),
        ("error", s.error, "#cf222e"),
        ("cancelled", s.cancelled, "#6e7781"),
        ("not_run", s.not_run, "#8250df"),
        ("excluded by the prefilter", excluded, "#d0d7de"),
        ("rejected by the partition", rejected, "#ff8182"),
    ];
    let most = bars.iter().map(|b| b.1).max().unwrap_or(0).max(1);
    let (w, row) = (640.0, 24.0);
    let h = row * bars.len() as f64 + 10.0;
    let mut svg = format!(
        "<figure><svg id=\"statuses\" role=\"img\" aria-label=\"units by outcome\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" xmlns=\"http://www.w3.org/2000/svg\">"
    );
    for (i, (label, n, color)) in bars.iter().enumerate() {
        let y = 5.0 + i as f64 * row;
        let len = 380.0 * *n as f64 / most as f64;
        let _ = write!(
            svg,
            "<text x=\"190\" y=\"{:.1}\" text-anchor=\"end\">{}</text><rect class=\"bar\" data-status=\"{label}\" x=\"200\" y=\"{:.1}\" width=\"{len:.1}\" height=\"16\" fill=\"{color}\"/><text x=\"{:.1}\" y=\"{:.1}\">{n}</text>",
            y + 13.0,
            esc(label),
            y + 1.0,
            205.0 + len,
            y + 13.0,
        );
    }
    svg.push_str("</svg>");
    let _ = write!(svg, "<figcaption>{}</figcaption></figure>", esc(caption));
    svg
}

/// An interval contract's estimate as HTML: what it is, the table, how
/// it is computed.
fn estimate_html(e: &fanfold_ops::interval::Estimate, sim: &str) -> String {
    let t = fanfold_engine::output::estimate_text(e);
    let mut h = format!(
        "<h2>Answer: an ESTIMATE{}</h2>\n<p id=\"estimate\">{}</p>\n<table id=\"estimate-table\"><tr>",
        esc(sim),
        esc(&t.statement)
    );
    for cell in &t.header {
        let _ = write!(h, "<th>{}</th>", esc(&cell.replace('`', "")));
    }
    h.push_str("</tr>\n");
    for row in &t.rows {
        h.push_str("<tr>");
        for cell in row {
            let _ = write!(h, "<td>{}</td>", esc(cell));
        }
        h.push_str("</tr>\n");
    }
    let _ = writeln!(h, "</table>\n<p>{}</p>", esc(&t.method));
    h
}

/// A run as Markdown and HTML: the answer and its citations first, then
/// what every unit came to, then each cited unit with its facts.
pub fn run_page(out: &RunOutput, cores: usize) -> (String, String) {
    let (a, c) = (&out.answer, &out.certificate);
    let sim = if c.simulated { " [SIMULATED]" } else { "" };
    let date = run_date(&c.run_id);
    let machine = format!("{cores} cores");
    let title = format!("{}{sim}", a.question);
    // What a record or the question says is shown as written, never as
    // markup: escaped like answer.md.
    let mut md = format!("# {}{sim}\n\n", md_text(&a.question));
    let mut h = format!("<h1>{}</h1>\n", esc(&title));
    let meta = format!(
        "Run {} of spec `{}`, {date}; backend {}; report written on {machine}.",
        c.run_id,
        c.spec,
        backends(c)
    );
    let _ = writeln!(md, "{meta}\n");
    let _ = writeln!(h, "<p class=\"meta\">{}</p>", esc(&meta));
    if c.simulated {
        let t = "[SIMULATED]: answers come from a scripted or replayed backend, not a model.";
        let _ = writeln!(md, "**{t}**\n");
        let _ = writeln!(h, "<div class=\"banner sim\">{}</div>", esc(t));
    }
    if !out.changed.is_empty() {
        let t = format!(
            "NOT VERIFIED: this folder was changed after its run, so what it shows cannot be trusted: {}",
            out.changed.join("; ")
        );
        let _ = writeln!(md, "**{t}**\n");
        let _ = writeln!(
            h,
            "<div class=\"banner bad\" id=\"changed\">{}</div>",
            esc(&t)
        );
    } else if a.complete {
        let t = format!(
            "Complete: every unit the contract needs was decided{}.",
            if a.verified {
                ", and verify passed"
            } else {
                "; verify FAILED"
            }
        );
        let class = if a.verified { "ok" } else { "bad" };
        let _ = writeln!(md, "**{t}**\n");
        let _ = writeln!(h, "<div class=\"banner {class}\">{}</div>", esc(&t));
    } else {
        let t = format!("INCOMPLETE: {}", a.incomplete.join("; "));
        let _ = writeln!(md, "**{t}**\n");
        let _ = writeln!(
            h,
            "<div class=\"banner bad\" id=\"incomplete\">{}</div>",
            esc(&t)
        );
    }

    if a.quality.is_empty() {
        let t = format!(
            "Quality: unmeasured. {}",
            fanfold_engine::output::UNMEASURED
        );
        let _ = writeln!(md, "**{t}**\n");
        let _ = writeln!(
            h,
            "<div class=\"banner warn\" id=\"quality\">{}</div>",
            esc(&t)
        );
    }
    for line in &a.quality {
        let t = format!("Quality: {line}");
        // A verdict is green or red; a bound with no target to meet is
        // neither.
        let class = if line.contains("UNMET") {
            "bad"
        } else if line.contains(" holds") {
            "ok"
        } else {
            "warn"
        };
        let _ = writeln!(md, "**{}**\n", md_text(&t));
        let _ = writeln!(h, "<div class=\"banner {class} quality\">{}</div>", esc(&t));
    }
    // Every unit the page cites gets a section further down.
    let cited: BTreeSet<&str> = a
        .items
        .iter()
        .map(|i| i.unit_id.as_str())
        .chain(
            a.themes
                .iter()
                .flat_map(|t| t.ids.iter().map(|i| i.as_str())),
        )
        .collect();
    // An interval contract's answer is its estimate, as in answer.md: the
    // count of the units judged is not the answer.
    if let Some(e) = &a.estimate {
        md.push_str(&fanfold_engine::output::estimate_markdown(e, sim));
        h.push_str(&estimate_html(e, sim));
        let _ = writeln!(md, "### Cited: {} units\n", a.items.len());
        let _ = writeln!(
            h,
            "<h3>Cited: {} units</h3>\n<ol id=\"answer\">",
            a.items.len()
        );
    } else {
        match &a.stated {
            Some(g) => {
                let _ = writeln!(md, "## Answer: {}\n", md_text(&g.stated.statement));
                aggregate_table(&mut md, g, "");
                let _ = writeln!(
                    h,
                    "<h2>Answer: {}</h2>\n<div id=\"stated\">{}</div>",
                    esc(&g.stated.statement),
                    aggregate_html(g, &cited)
                );
                let _ = writeln!(md, "\n### Cited: {} units\n", a.items.len());
                let _ = writeln!(
                    h,
                    "<h3>Cited: {} units</h3>\n<ol id=\"answer\">",
                    a.items.len()
                );
            }
            None => {
                let _ = writeln!(md, "## Answer: {} items\n", a.items.len());
                let _ = writeln!(
                    h,
                    "<h2>Answer: {} items</h2>\n<ol id=\"answer\">",
                    a.items.len()
                );
            }
        }
    }
    for item in &a.items {
        let id = item.unit_id.as_str();
        let title = item.title.as_deref().unwrap_or("");
        let theme = item
            .theme
            .as_deref()
            .map(|t| format!(" ({t})"))
            .unwrap_or_default();
        let _ = writeln!(
            md,
            "- **{}** {}{}",
            md_text(id),
            md_text(title),
            md_text(&theme)
        );
        let _ = write!(
            h,
            "<li><a class=\"cite\" href=\"#{}\">{}</a> {}{}",
            anchor(id),
            esc(id),
            esc(title),
            esc(&theme)
        );
        // A field whose value is the item's theme is already shown by it.
        let extracted = item
            .fields
            .iter()
            .filter(|(_, v)| item.theme.is_none() || v.as_str() != item.theme.as_deref())
            .map(|(k, v)| {
                (
                    k.clone(),
                    v.as_str().map_or_else(|| v.to_string(), str::to_owned),
                )
            });
        // The source's own fields first, then what the fact extracted.
        for shown in [item.shown.clone(), extracted.collect()] {
            if shown.is_empty() {
                continue;
            }
            let text: Vec<String> = shown
                .iter()
                .map(|(k, v)| format!("{}: {}", md_text(k), md_text(v)))
                .collect();
            let _ = writeln!(md, "  {}", text.join(" · "));
            let html: Vec<String> = shown
                .iter()
                .map(|(k, v)| format!("<span class=\"meta\">{}:</span> {}", esc(k), esc(v)))
                .collect();
            let _ = write!(h, "<div class=\"fields\">{}</div>", html.join(" · "));
        }
        for e in &item.evidence {
            let _ = writeln!(md, "  > {} ({})", md_text(&e.quote), md_text(&e.field));
            let _ = write!(
                h,
                "<blockquote>{} <span class=\"meta\">({})</span></blockquote>",
                esc(&e.quote),
                esc(&e.field)
            );
        }
        h.push_str("</li>\n");
    }
    h.push_str("</ol>\n");
    if !a.themes.is_empty() {
        let _ = writeln!(md, "\n## Themes\n");
        let _ = writeln!(
            h,
            "<h2>Themes</h2>\n<table><tr><th>theme</th><th>count</th><th>cited</th></tr>"
        );
        for t in &a.themes {
            let ids: Vec<&str> = t.ids.iter().map(|i| i.as_str()).collect();
            let listed: Vec<String> = ids.iter().map(|i| md_text(i)).collect();
            let _ = writeln!(
                md,
                "- {}: {} ({})",
                md_text(&t.key),
                t.count,
                listed.join(", ")
            );
            let links: Vec<String> = ids
                .iter()
                .map(|i| format!("<a class=\"cite\" href=\"#{}\">{}</a>", anchor(i), esc(i)))
                .collect();
            let _ = writeln!(
                h,
                "<tr><td>{}</td><td class=\"n\">{}</td><td>{}</td></tr>",
                esc(&t.key),
                t.count,
                links.join(", ")
            );
        }
        h.push_str("</table>\n");
    }
    if !a.aggregates.is_empty() {
        let _ = writeln!(md, "\n## Aggregates\n");
        let _ = writeln!(h, "<h2>Aggregates</h2>\n<div id=\"aggregates\">");
        for g in &a.aggregates {
            let _ = writeln!(
                md,
                "- **{}** ({}): {}",
                md_text(&g.name),
                g.kind,
                md_text(&g.stated.statement)
            );
            aggregate_table(&mut md, g, "");
            let _ = writeln!(
                h,
                "<h3>{} <span class=\"meta\">({})</span></h3><p>{}</p>{}",
                esc(&g.name),
                esc(&g.kind),
                esc(&g.stated.statement),
                aggregate_html(g, &cited)
            );
        }
        h.push_str("</div>\n");
    }
    collapsed_page(&mut md, &mut h, &a.collapsed);

    let cov = &c.coverage;
    let caption = format!(
        "{} elements: {} units, {} rejected; {} excluded by the prefilter. Backend {}, {date}, {machine}.",
        cov.elements,
        cov.units,
        cov.rejected,
        a.excluded,
        backends(c)
    );
    let _ = writeln!(md, "\n## Outcomes\n\n| outcome | units |\n|---|---:|");
    for (k, v) in [
        ("positive", c.statuses.positive),
        ("negative", c.statuses.negative),
        ("abstain", c.statuses.abstain),
        ("error", c.statuses.error),
        ("cancelled", c.statuses.cancelled),
        ("not_run", c.statuses.not_run),
        ("excluded by the prefilter", a.excluded),
        ("rejected by the partition", cov.rejected),
    ] {
        let _ = writeln!(md, "| {k} | {v} |");
    }
    let _ = writeln!(md, "\n{caption}");
    let _ = writeln!(h, "<h2>Outcomes</h2>");
    h.push_str(&status_chart(
        &c.statuses,
        a.excluded,
        cov.rejected,
        &caption,
    ));

    let (cascades_md, cascades_html) = cascade_sections(c);
    md.push_str(&cascades_md);
    h.push_str(&cascades_html);

    // Every cited unit's section, with what each stage said.
    let mut by_unit: BTreeMap<&str, Vec<&FactRecord>> = BTreeMap::new();
    for f in &out.facts {
        if let Some(id) = f.source_ids.first()
            && cited.contains(id.as_str())
        {
            by_unit.entry(id.as_str()).or_default().push(f);
        }
    }
    let links: BTreeMap<&str, &str> = a
        .items
        .iter()
        .filter_map(|i| Some((i.unit_id.as_str(), i.link.as_deref()?)))
        .collect();
    let _ = writeln!(h, "<h2>Cited units</h2>");
    for id in &cited {
        let _ = write!(
            h,
            "<section class=\"unit\" id=\"{}\"><h3>{}</h3>",
            anchor(id),
            esc(id)
        );
        // Only a web address becomes a link: a record's `javascript:` or
        // `data:` URL is shown as text.
        match links.get(id) {
            Some(link) if safe_link(link) => {
                let _ = write!(h, "<p><a href=\"{}\">{}</a></p>", esc(link), esc(link));
            }
            Some(link) => {
                let _ = write!(h, "<p>{}</p>", esc(link));
            }
            None => {}
        }
        for f in by_unit.get(id).map(Vec::as_slice).unwrap_or_default() {
            let _ = write!(
                h,
                "<p><b>{}</b>: {} {}{}</p>",
                esc(&f.stage),
                esc(f.status.as_str()),
                esc(f.decision.as_deref().unwrap_or("")),
                f.reason
                    .as_deref()
                    .map(|r| format!(" ({})", esc(r)))
                    .unwrap_or_default()
            );
            for e in &f.evidence {
                let _ = write!(
                    h,
                    "<blockquote>{} <span class=\"meta\">({}, bytes {}..{})</span></blockquote>",
                    esc(&e.quote),
                    esc(&e.field),
                    e.start,
                    e.end
                );
            }
        }
        h.push_str("</section>\n");
    }
    (md, page(&title, &h))
}

/// Each cascade's frontier, as Markdown and HTML: what the labels proved
/// of each plan (the share of units it lets the proxy decide and the level
/// of the target's metric proven for it), as a table and as a plot of the
/// proven level against that share with the target drawn across.
fn cascade_sections(c: &Certificate) -> (String, String) {
    use fanfold_engine::stages::map_cascade::{CascadeReport, REPORT};
    let (mut md, mut h) = (String::new(), String::new());
    for (stage, r) in c.stats.reports.all::<CascadeReport>(REPORT) {
        let metric = r.metric();
        let _ = writeln!(
            md,
            "\n## Cascade `{}`: what the labels proved\n",
            md_text(&stage)
        );
        let _ = writeln!(
            h,
            "<h2>Cascade <code>{}</code>: what the labels proved</h2>",
            esc(&stage)
        );
        let mut said = vec![format!("Target: {}.", r.target)];
        if let Some(a) = &r.accepted {
            said.push(format!(
                "The declared target {metric} ≥ {} was LOWERED by the user to {metric} ≥ {} ({}): {}.",
                a.declared_at_least,
                a.accepted_at_least,
                a.by,
                a.cost(r.delta)
            ));
        }
        said.push(format!(
            "{} labels of a budget of {}; the proxy decided {} of {} units.",
            r.labels, r.label_budget, r.proxy_decided, r.units
        ));
        if r.wanted_past_budget > 0 {
            said.push(format!(
                "A person is asked for {} labels PAST the budget: the units the plan leaves to the oracle.",
                r.wanted_past_budget
            ));
        }
        for line in &said {
            let _ = writeln!(md, "{}\n", md_text(line));
            let _ = writeln!(h, "<p class=\"cascade-note\">{}</p>", esc(line));
        }
        if r.frontier.is_empty() {
            let t = "No frontier: the labels were not enough to test a plan bolder than the oracle deciding every unit.";
            let _ = writeln!(md, "{t}\n");
            let _ = writeln!(h, "<p>{t}</p>");
            continue;
        }
        let head = format!("{metric} proven at least");
        let _ = writeln!(
            md,
            "| units the proxy decides | {head} | meets {} |\n|---:|---:|---|",
            r.at_least
        );
        let _ = writeln!(
            h,
            "<table class=\"frontier\" data-stage=\"{}\"><tr><th>units the proxy decides</th><th>{}</th><th>meets {}</th></tr>",
            esc(&stage),
            esc(&head),
            r.at_least
        );
        for p in &r.frontier {
            let meets = if p.proven >= r.at_least { "yes" } else { "no" };
            let share = format!("{:.1} %", 100.0 * p.saving);
            let proven = format!("{:.3}", p.proven);
            let _ = writeln!(md, "| {share} | {proven} | {meets} |");
            let _ = writeln!(
                h,
                "<tr class=\"frontier-row\"><td class=\"n\">{share}</td><td class=\"n\">{proven}</td><td>{meets}</td></tr>"
            );
        }
        h.push_str("</table>\n");
        h.push_str(&frontier_plot(&stage, &r, metric));
        let _ = writeln!(
            md,
            "\nEach level is proven at δ = {} by its own plan's test.",
            r.delta
        );
    }
    (md, h)
}

/// The frontier as a plot: the level proven against the share of units
/// the proxy decides, one point a plan, the target's level as a line (and
/// the declared one as a dashed line when the user lowered it).
fn frontier_plot(
    stage: &str,
    r: &fanfold_engine::stages::map_cascade::CascadeReport,
    metric: &str,
) -> String {
    let (w, h) = (520.0, 320.0);
    let (left, right, top, bottom) = (60.0, 20.0, 20.0, 50.0);
    let declared = r.accepted.as_ref().map(|a| a.declared_at_least);
    // The levels span a narrow band near the target: the axis starts at
    // the tenth below the lowest level shown.
    let lowest = r
        .frontier
        .iter()
        .map(|p| p.proven)
        .chain([r.at_least])
        .chain(declared)
        .fold(1.0f64, f64::min);
    let floor = ((lowest * 10.0).floor() / 10.0 - 0.1).clamp(0.0, 0.9);
    let x = |v: f64| left + (w - left - right) * v.clamp(0.0, 1.0);
    let y =
        |v: f64| top + (h - top - bottom) * (1.0 - ((v - floor) / (1.0 - floor)).clamp(0.0, 1.0));
    let mut s = format!(
        "<figure><svg id=\"frontier-{}\" class=\"plot frontier-plot\" role=\"img\" aria-label=\"{} proven against the share of units the proxy decides\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" xmlns=\"http://www.w3.org/2000/svg\">",
        anchor(stage),
        esc(metric)
    );
    let _ = write!(
        s,
        "<line x1=\"{left}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\" stroke=\"#57606a\"/><line x1=\"{left}\" y1=\"{top}\" x2=\"{left}\" y2=\"{:.1}\" stroke=\"#57606a\"/>",
        h - bottom,
        w - right,
        h - bottom,
        h - bottom
    );
    for k in 0..=4 {
        let v = floor + (1.0 - floor) * f64::from(k) / 4.0;
        let _ = write!(
            s,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{v:.2}</text>",
            left - 6.0,
            y(v) + 4.0
        );
        let share = f64::from(k) / 4.0;
        let _ = write!(
            s,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{:.0} %</text>",
            x(share),
            h - bottom + 16.0,
            100.0 * share
        );
    }
    let _ = write!(
        s,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">units the proxy decides</text><text transform=\"translate(14 {:.1}) rotate(-90)\" text-anchor=\"middle\">{} proven at least</text>",
        (left + w - right) / 2.0,
        h - 8.0,
        (top + h - bottom) / 2.0,
        esc(metric)
    );
    let mut line = |level: f64, class: &str, label: String, dash: &str| {
        let _ = write!(
            s,
            "<line class=\"{class}\" x1=\"{left}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\" stroke=\"#cf222e\" stroke-width=\"1.5\"{dash}/><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\" fill=\"#cf222e\">{}</text>",
            y(level),
            w - right,
            y(level),
            w - right,
            y(level) - 4.0,
            esc(&label)
        );
    };
    match declared {
        Some(d) => {
            line(
                d,
                "declared-target",
                format!("declared {d}"),
                " stroke-dasharray=\"5 3\"",
            );
            line(r.at_least, "target", format!("accepted {}", r.at_least), "");
        }
        None => line(r.at_least, "target", format!("target {}", r.at_least), ""),
    }
    let path: Vec<String> = r
        .frontier
        .iter()
        .map(|p| format!("{:.1},{:.1}", x(p.saving), y(p.proven)))
        .collect();
    if path.len() > 1 {
        let _ = write!(
            s,
            "<polyline points=\"{}\" fill=\"none\" stroke=\"#0969da\" stroke-width=\"1.5\"/>",
            path.join(" ")
        );
    }
    for p in &r.frontier {
        let _ = write!(
            s,
            "<circle class=\"frontier-point\" cx=\"{:.1}\" cy=\"{:.1}\" r=\"5\" fill=\"#0969da\"><title>the proxy decides {:.1} %: {} proven at least {:.3}</title></circle>",
            x(p.saving),
            y(p.proven),
            100.0 * p.saving,
            esc(metric),
            p.proven
        );
    }
    s.push_str("</svg>");
    let _ = write!(
        s,
        "<figcaption>{}</figcaption></figure>",
        esc(&format!(
            "Stage {stage}: each point a plan, the share of units it lets the proxy decide against the level of {metric} its labels prove (each at δ = {} on its own); the red line is the target's level.",
            r.delta
        ))
    );
    s
}

/// An aggregate's rows as an HTML table; a cell naming a unit the page
/// cites (`#id`) links to its section.
/// What each reducer's `dedupe` collapsed before counting: a table of
/// the kept units, how many were collapsed into each, and which.
fn collapsed_page(
    md: &mut String,
    h: &mut String,
    collapsed: &[fanfold_engine::report::Collapsed],
) {
    if collapsed.is_empty() {
        return;
    }
    let _ = writeln!(md, "\n## Near-duplicates collapsed\n");
    let _ = writeln!(
        h,
        "<h2>Near-duplicates collapsed</h2>\n<div id=\"collapsed\">"
    );
    for c in collapsed {
        let s = &c.summary;
        let _ = writeln!(
            md,
            "- **{}**: {}\n",
            md_text(&c.reducer),
            md_text(&s.sentence())
        );
        let _ = writeln!(md, "  | kept | collapsed | units |\n  |---|---:|---|");
        let _ = writeln!(
            h,
            "<h3>{}</h3><p>{}</p>\n<table><tr><th>kept</th><th>collapsed</th><th>units</th></tr>",
            esc(&c.reducer),
            esc(&s.sentence())
        );
        for g in &s.groups {
            let ids: Vec<String> = g.ids.iter().map(|i| format!("#{}", i.as_str())).collect();
            let _ = writeln!(
                md,
                "  | #{} | {} | {} |",
                md_text(g.kept.as_str()),
                g.collapsed,
                md_text(&ids.join(", "))
            );
            let _ = writeln!(
                h,
                "<tr><td>#{}</td><td class=\"n\">{}</td><td>{}</td></tr>",
                esc(g.kept.as_str()),
                g.collapsed,
                esc(&ids.join(", "))
            );
        }
        h.push_str("</table>\n");
    }
    h.push_str("</div>\n");
}

fn aggregate_html(g: &fanfold_engine::report::Aggregate, cited: &BTreeSet<&str>) -> String {
    if g.stated.columns.is_empty() {
        return String::new();
    }
    let mut h = String::from("<table class=\"aggregate\"><tr>");
    for c in &g.stated.columns {
        let _ = write!(h, "<th>{}</th>", esc(c));
    }
    h.push_str("</tr>\n");
    for row in &g.stated.rows {
        h.push_str("<tr>");
        for cell in row {
            let linked = cell
                .strip_prefix('#')
                .filter(|id| cited.contains(id))
                .map(|id| {
                    format!(
                        "<a class=\"cite\" href=\"#{}\">{}</a>",
                        anchor(id),
                        esc(cell)
                    )
                });
            let _ = write!(h, "<td>{}</td>", linked.unwrap_or_else(|| esc(cell)));
        }
        h.push_str("</tr>\n");
    }
    h.push_str("</table>\n");
    h
}

/// A scatter of held-out F1 against one cost, the frontier joined.
fn scatter(
    id: &str,
    rows: &[Row],
    cost: impl Fn(&Row) -> f64,
    axis: &str,
    caption: &str,
) -> String {
    let (w, h) = (520.0, 340.0);
    let (left, right, top, bottom) = (60.0, 20.0, 20.0, 50.0);
    let most = rows.iter().map(&cost).fold(0.0f64, f64::max);
    // Costs span orders of magnitude (no calls to tens of thousands of
    // tokens): a log scale, with zero drawn at the left edge.
    let lmax = (most.max(1.0) + 1.0).log10().ceil().max(1.0);
    let x = |v: f64| left + (w - left - right) * ((v + 1.0).log10() / lmax);
    let y = |f: f64| top + (h - top - bottom) * (1.0 - f.clamp(0.0, 1.0));
    let mut s = format!(
        "<figure><svg id=\"{id}\" class=\"plot\" role=\"img\" aria-label=\"held-out F1 against {}\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" xmlns=\"http://www.w3.org/2000/svg\">",
        esc(axis)
    );
    let _ = write!(
        s,
        "<line x1=\"{left}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\" stroke=\"#57606a\"/><line x1=\"{left}\" y1=\"{top}\" x2=\"{left}\" y2=\"{:.1}\" stroke=\"#57606a\"/>",
        h - bottom,
        w - right,
        h - bottom,
        h - bottom
    );
    for f in [0.0, 0.25, 0.5, 0.75, 1.0] {
        let _ = write!(
            s,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{f:.2}</text><line x1=\"{left}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\" stroke=\"#eaeef2\"/>",
            left - 6.0,
            y(f) + 4.0,
            y(f),
            w - right,
            y(f)
        );
    }
    for p in 0..=(lmax as u32) {
        let v = 10f64.powi(p as i32) - 1.0;
        let label = if p == 0 {
            "0".to_owned()
        } else {
            format!("1e{p}")
        };
        let _ = write!(
            s,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{label}</text>",
            x(v),
            h - bottom + 16.0
        );
    }
    let _ = write!(
        s,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text><text transform=\"translate(14 {:.1}) rotate(-90)\" text-anchor=\"middle\">held-out F1</text>",
        (left + w - right) / 2.0,
        h - 8.0,
        esc(axis),
        (top + h - bottom) / 2.0
    );
    let mut front: Vec<usize> = frontier(rows, &cost);
    front.sort_by(|&a, &b| {
        let (ca, cb) = (rows.get(a).map(&cost), rows.get(b).map(&cost));
        ca.partial_cmp(&cb).unwrap_or(std::cmp::Ordering::Equal)
    });
    let path: Vec<String> = front
        .iter()
        .filter_map(|&i| rows.get(i))
        .map(|r| format!("{:.1},{:.1}", x(cost(r)), y(r.held_out.f1)))
        .collect();
    if path.len() > 1 {
        let _ = write!(
            s,
            "<polyline class=\"frontier\" points=\"{}\" fill=\"none\" stroke=\"#0969da\" stroke-width=\"2\" stroke-dasharray=\"5 3\"/>",
            path.join(" ")
        );
    }
    for (i, r) in rows.iter().enumerate() {
        let on = front.contains(&i);
        let (cx, cy) = (x(cost(r)), y(r.held_out.f1));
        let _ = write!(
            s,
            "<circle class=\"point{}\" data-strategy=\"{}\" cx=\"{cx:.1}\" cy=\"{cy:.1}\" r=\"{}\" fill=\"{}\"><title>{}: F1 {:.2}, {} {:.0}</title></circle><text x=\"{:.1}\" y=\"{:.1}\">{}</text>",
            if on { " on-frontier" } else { "" },
            esc(&r.strategy),
            if on { 6 } else { 4 },
            if on { "#0969da" } else { "#8c959f" },
            esc(&r.strategy),
            r.held_out.f1,
            esc(axis),
            cost(r),
            cx + 8.0,
            cy - 6.0,
            esc(&r.strategy)
        );
    }
    s.push_str("</svg>");
    let _ = write!(s, "<figcaption>{}</figcaption></figure>", esc(caption));
    s
}

/// A ladder as Markdown and HTML: the verdict, the two plots and the table.
pub fn ladder_page(l: &Ladder) -> (String, String) {
    let sim = if l.simulated { " [SIMULATED]" } else { "" };
    let title = format!("The ladder: every strategy on the same question{sim}");
    let meta = format!(
        "{} on {}; backend {}; {} cores ({}), {} slots; measured {}; records split by a seeded hash of the id (seed {}).",
        "fanfold bench ladder",
        l.example,
        l.backend_label(),
        l.cores,
        l.cpu,
        l.slots,
        l.date,
        l.split_seed
    );
    let verdict = verdict(l);
    let mut md = format!("# {title}\n\n{meta}\n\n{verdict}\n\n");
    let mut h = format!(
        "<h1>{}</h1>\n<p class=\"meta\">{}</p>\n",
        esc(&title),
        esc(&meta)
    );
    if l.simulated {
        let _ = writeln!(
            h,
            "<div class=\"banner sim\">[SIMULATED]: the model strategies ran on a scripted backend; no quality claim.</div>"
        );
    }
    let _ = writeln!(h, "<p id=\"verdict\">{}</p>", esc(&verdict));
    let caption = |what: &str| {
        format!(
            "Held-out F1 against {what}, log scale; the dashed line joins the Pareto frontier. Backend {}, {} cores, {}{sim}.",
            l.backend_label(),
            l.cores,
            l.date
        )
    };
    h.push_str(&scatter(
        "plot-tokens",
        &l.rows,
        Row::tokens,
        "tokens evaluated and generated",
        &caption("tokens"),
    ));
    h.push_str(&scatter(
        "plot-wall",
        &l.rows,
        |r| r.wall_s,
        "wall seconds",
        &caption("wall time"),
    ));
    let header = "| strategy | held-out P / R / F1 | dev F1 | held-out misses | calls | tokens | wall | verified citations |";
    let _ = writeln!(md, "{header}\n|---|---|---:|---|---:|---:|---:|---:|");
    h.push_str("<table id=\"strategies\"><tr><th>strategy</th><th>held-out P / R / F1</th><th>dev F1</th><th>held-out misses (by id)</th><th>calls</th><th>tokens</th><th>wall</th><th>verified citations</th><th>what it ran</th></tr>\n");
    for r in &l.rows {
        let misses = if r.held_out.false_negatives.is_empty() {
            "none".to_owned()
        } else {
            r.held_out.false_negatives.join(", ")
        };
        let cells = [
            format!(
                "{:.2} / {:.2} / {:.2}",
                r.held_out.precision, r.held_out.recall, r.held_out.f1
            ),
            format!("{:.2}", r.dev.f1),
            format!(
                "{} of {}: {misses}",
                r.held_out.false_negatives.len(),
                r.held_out.positives
            ),
            r.model_calls.to_string(),
            (r.prompt_tokens + r.completion_tokens).to_string(),
            format!("{:.1} s", r.wall_s),
            format!("{:.0} %", r.auditability * 100.0),
        ];
        let _ = writeln!(md, "| {} | {} |", r.strategy, cells.join(" | "));
        let _ = write!(h, "<tr><td>{}</td>", esc(&r.strategy));
        for c in &cells {
            let _ = write!(h, "<td>{}</td>", esc(c));
        }
        let _ = writeln!(h, "<td>{}</td></tr>", esc(&r.plan));
    }
    h.push_str("</table>\n");
    (md, page(&title, &h))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anchors_keep_only_safe_characters_and_stay_distinct() {
        assert_eq!(anchor("123"), "unit-123");
        assert_eq!(anchor("a b"), "unit-a.20b");
        assert_ne!(anchor("a/b"), anchor("a.b"));
        assert_eq!(
            esc("<a href=\"x\">&'"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
        );
    }

    #[test]
    fn a_run_date_comes_from_its_id() {
        assert_eq!(
            run_date("run-1764547200000-abcd-12-0"),
            "2025-12-01 00:00:00 UTC"
        );
        assert_eq!(run_date("nonsense"), "an unknown date");
    }
}
