//! `fanfold bench quotes`: evidence quotes on text whose punctuation is
//! HTML entities, on the embedded model, side by side in one run. The same
//! reviews, the same stage and the same model, with two offers of what a
//! quote may be:
//! - **sentences only**, the rule fanfold used to follow: whole sentences
//!   ended by a bare `. ! ?` or a line break, between the schema's length
//!   bounds; a field with none gets no constraint and the model writes its
//!   quote freely;
//! - **spans**, today's [`fanfold_ops::quotes`]: sentences however they
//!   end, clauses, and windows of words.
//!
//! Each output is judged by the stage itself ([`ModelTurn::interpret`]),
//! one attempt a unit, and the report counts each outcome.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, anyhow, ensure};
use fanfold_engine::Plan;
use fanfold_fixtures::reviews::{Punctuation, generate_with};
use fanfold_llama::{EmbeddedModel, LlamaConfig};
use fanfold_model::Request;
use fanfold_ops::map::{ModelTurn, field_text};
use fanfold_ops::view::Projector;
use fanfold_testkit::QueueJob;
use serde_json::Value;

pub struct QuotesArgs {
    /// The film-reviews example folder; its `count-by-film.toml` is the
    /// stage measured.
    pub example: PathBuf,
    pub per_film: usize,
    pub seed: u64,
    pub slots: usize,
    pub report: PathBuf,
}

/// What one offer came to over every unit.
#[derive(Default)]
struct Outcome {
    label: &'static str,
    /// Units whose request carried a narrowed schema.
    constrained: usize,
    /// Bytes of the largest narrowed schema.
    largest_schema: usize,
    /// Outcome (a status, or an error code) to units.
    by_outcome: BTreeMap<String, usize>,
    /// Units whose fact holds at least one quote, all verbatim.
    quoted: usize,
    wall_s: f64,
}

impl Outcome {
    fn false_quotes(&self) -> usize {
        self.by_outcome.get("false_quote").copied().unwrap_or(0)
    }
}

/// The former offer: whole sentences split at a bare `. ! ?` before
/// whitespace or a line break, trimmed, within the length bounds.
fn sentences_only(stage: &ModelTurn, projected: &Value) -> Option<Value> {
    let key = stage.spec.evidence.as_deref()?.strip_prefix('/')?;
    let items = stage.schema.pointer(&format!("/properties/{key}/items"))?;
    let bound = |name: &str, default: u64| {
        items
            .pointer(&format!("/properties/quote/{name}"))
            .and_then(Value::as_u64)
            .unwrap_or(default) as usize
    };
    let (min, max) = (bound("minLength", 8), bound("maxLength", 200));
    let fields = items
        .pointer("/properties/field/enum")
        .and_then(Value::as_array)?;
    let mut alternatives = Vec::new();
    for field in fields.iter().filter_map(Value::as_str) {
        let Some(text) = field_text(projected, field) else {
            continue;
        };
        let mut quotes: Vec<String> = Vec::new();
        let bytes = text.as_bytes();
        let mut start = 0;
        let mut push = |piece: &str| {
            let s = piece.trim();
            if s.len() >= min && s.len() <= max && !quotes.iter().any(|q| q == s) {
                quotes.push(s.to_owned());
            }
        };
        for (i, b) in bytes.iter().enumerate() {
            let end = match b {
                b'\n' => Some(i),
                b'.' | b'!' | b'?' if bytes.get(i + 1).is_none_or(|n| n.is_ascii_whitespace()) => {
                    Some(i + 1)
                }
                _ => None,
            };
            if let Some(end) = end {
                push(&text[start..end]);
                start = i + 1;
            }
        }
        push(&text[start..]);
        if quotes.is_empty() {
            continue;
        }
        alternatives.push(serde_json::json!({
            "type": "object",
            "additionalProperties": false,
            "required": ["field", "quote"],
            "properties": {"field": {"const": field}, "quote": {"enum": quotes}}
        }));
    }
    if alternatives.is_empty() {
        return None;
    }
    let mut narrowed = stage.schema.clone();
    *narrowed.pointer_mut(&format!("/properties/{key}/items"))? =
        serde_json::json!({"anyOf": alternatives});
    Some(narrowed)
}

pub fn main(args: &QuotesArgs) -> Result<()> {
    let model_path = fanfold_engine::models::ensure(
        &fanfold_engine::models::SMOLLM2_135M,
        &fanfold_engine::models::cache_dir(),
        &|l| eprintln!("{l}"),
    )?;
    let spec = args.example.join("count-by-film.toml");
    let plan = Plan::load(&spec)?;
    let stage = plan
        .stages
        .iter()
        .find_map(|s| plan.map_stage(s.name()))
        .ok_or_else(|| anyhow!("{} has no map stage", spec.display()))?;
    let projector = Projector::compile(
        stage.name(),
        stage.spec.project.as_deref(),
        &stage.spec.fields,
    )?;
    let reviews = generate_with(args.seed, args.per_film, Punctuation::Entities).reviews;
    let mut units = Vec::new();
    for review in &reviews {
        let id = review["id"].as_str().context("a review without an id")?;
        units.push((id.to_owned(), projector.project(id, review)?));
    }
    let requests = |offer: &dyn Fn(&Value) -> Option<Value>| -> Vec<Request> {
        units
            .iter()
            .enumerate()
            .map(|(index, (id, projected))| Request {
                index,
                unit_id: id.clone(),
                suffix: stage.suffix(id, projected),
                schema: offer(projected),
                input: projected.clone(),
                attempt: 1,
                max_output_tokens: stage.spec.max_output_tokens,
            })
            .collect()
    };
    let offers: [(&'static str, Vec<Request>); 2] = [
        (
            "sentences only (the former offer)",
            requests(&|p| sentences_only(stage, p)),
        ),
        (
            "spans (sentences, clauses, word windows)",
            requests(&|p| stage.schema_for_unit(p)),
        ),
    ];
    let mut outcomes = Vec::new();
    for (label, reqs) in offers {
        eprintln!("{label}: {} units", reqs.len());
        let mut cfg = LlamaConfig::new(model_path.clone());
        cfg.slot_tokens = 1024;
        let model = EmbeddedModel::load(cfg)?;
        let mut outcome = Outcome {
            label,
            constrained: reqs.iter().filter(|r| r.schema.is_some()).count(),
            largest_schema: reqs
                .iter()
                .filter_map(|r| r.schema.as_ref())
                .map(|s| s.to_string().len())
                .max()
                .unwrap_or(0),
            ..Outcome::default()
        };
        let job = QueueJob::new(stage.prefix(), reqs, args.slots).with_schema(stage.schema.clone());
        let started = Instant::now();
        model.run_job(&job).map_err(|e| anyhow!("{e}"))?;
        outcome.wall_s = started.elapsed().as_secs_f64();
        let finished = job.finished();
        ensure!(
            finished.len() == units.len(),
            "{} of {} units finished",
            finished.len(),
            units.len()
        );
        for f in finished {
            let key = match &f.result {
                Ok(c) => match stage.interpret(&c.text, &f.request.input, None) {
                    Ok(fact) => {
                        let text = field_text(&f.request.input, "text").unwrap_or_default();
                        if !fact.evidence.is_empty()
                            && fact.evidence.iter().all(|e| text.contains(&e.quote))
                        {
                            outcome.quoted += 1;
                        }
                        fact.status.as_str().to_owned()
                    }
                    Err(invalid) => invalid.code().to_owned(),
                },
                Err(e) => format!("call error: {e}"),
            };
            *outcome.by_outcome.entry(key).or_default() += 1;
        }
        eprintln!(
            "  {:.0}s; {} false quotes; {:?}",
            outcome.wall_s,
            outcome.false_quotes(),
            outcome.by_outcome
        );
        outcomes.push(outcome);
    }
    let body = render(args, units.len(), &outcomes);
    crate::report::write_marked_section(&args.report, "quotes", &body)?;
    eprintln!("wrote the quotes section of {}", args.report.display());
    Ok(())
}

fn render(args: &QuotesArgs, units: usize, outcomes: &[Outcome]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "## Evidence quotes on entity-punctuated text\n");
    let _ = writeln!(
        out,
        "`fanfold bench quotes --per-film {} --seed {}`, {}; SmolLM2-135M-Instruct (embedded), {} slots, one attempt a unit. {units} film reviews in the style of a public review table that stores punctuation as HTML entities (`fanfold fixture film-reviews --entities`: `&#44;` `&#46;` `&#8217;`, one review in three on two lines, some with a dash and accented letters), judged by the `review` stage of `{}/count-by-film.toml` (quotes of 8 to 120 bytes). Both offers run side by side on the same units; each output is judged by the stage itself.\n",
        args.per_film,
        args.seed,
        crate::report::machine_line(),
        args.slots,
        args.example.display(),
    );
    let _ = writeln!(
        out,
        "| quotes offered | units constrained | largest unit schema | false_quote | other errors | facts with verbatim quotes | outcomes | wall |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---|---:|");
    for o in outcomes {
        let decided: usize = ["positive", "negative", "abstain"]
            .iter()
            .filter_map(|k| o.by_outcome.get(*k))
            .sum();
        let other = units - decided - o.false_quotes();
        let outcomes = o
            .by_outcome
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect::<Vec<_>>()
            .join(", ");
        let _ = writeln!(
            out,
            "| {} | {} of {units} | {:.1} KiB | {} ({:.0} %) | {other} | {} | {outcomes} | {:.0} s |",
            o.label,
            o.constrained,
            o.largest_schema as f64 / 1024.0,
            o.false_quotes(),
            100.0 * o.false_quotes() as f64 / units.max(1) as f64,
            o.quoted,
            o.wall_s,
        );
    }
    let _ = writeln!(
        out,
        "\nA unit whose schema is not narrowed is decoded under the stage's own schema, where a quote is any string of the allowed length: that is where a false quote comes from. The span offer narrows every unit with text, so its quotes are verbatim by construction; what the model decides is another matter, and this table does not score it.\n"
    );
    out
}
