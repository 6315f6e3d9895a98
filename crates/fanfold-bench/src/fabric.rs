//! `fanfold bench fabric`: the execution fabric on the embedded model, side
//! by side in one run: a shared prefix forked into N slots, the naive path
//! (every unit evaluates its whole prompt) and a single slot; then sweeps
//! of prefix length (few-shot examples) and slot count, and the llama.cpp
//! throughput limit measured by the same binary on the same model.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, anyhow, ensure};
use fanfold_engine::Plan;
use fanfold_engine::run::route::Routed;
use fanfold_llama::{Attention, EmbeddedModel, LlamaConfig};
use fanfold_model::{DecisionField, Request};
use fanfold_ops::map::ModelTurn;
use fanfold_ops::view::Projector;
use fanfold_testkit::QueueJob;
use serde_json::Value;

pub struct FabricArgs {
    pub example: PathBuf,
    pub units: usize,
    pub slots: usize,
    pub report: PathBuf,
    pub plot_dir: PathBuf,
    /// Skip the prefix and slot sweeps.
    pub no_sweeps: bool,
}

/// One measured configuration.
#[derive(Clone, Debug, Default)]
struct Measured {
    label: String,
    units: usize,
    slots: usize,
    prefix_tokens: u64,
    prompt_evaluated: u64,
    prompt_reused: u64,
    generated: u64,
    wall_s: f64,
    errors: usize,
    decode_calls: u64,
    /// Time in decode calls, and choosing tokens under the grammar.
    decode_us: u64,
    sample_us: u64,
    samples: u64,
    full_vocab_samples: u64,
    drafted: u64,
    accepted: u64,
    forced: u64,
    forced_accepted: u64,
    ended_early: u64,
    jumped: u64,
    by_batch: [fanfold_llama::BatchCost; fanfold_llama::BATCH_BUCKETS.len()],
    /// Each unit's answer, by request index.
    texts: Vec<(usize, String)>,
}

impl Measured {
    fn units_per_s(&self) -> f64 {
        self.units as f64 / self.wall_s.max(1e-9)
    }
    fn tokens_per_s(&self) -> f64 {
        (self.prompt_evaluated + self.generated) as f64 / self.wall_s.max(1e-9)
    }
    /// How many of this run's answers are byte-identical to `other`'s for
    /// the same unit.
    fn same_answers(&self, other: &Measured) -> usize {
        self.texts
            .iter()
            .filter(|t| other.texts.contains(t))
            .count()
    }
}

/// The example's units and what its prefilter did with them: the same
/// partition and routing a run uses.
pub(crate) fn example_units(plan: &Plan) -> Result<Routed> {
    let source = plan
        .default_source()
        .ok_or_else(|| anyhow!("the example names no input"))?;
    Ok(fanfold_engine::run::route_source(
        plan,
        &source,
        fanfold_ops::partition::DEFAULT_MAX_UNIT_BYTES,
    )?)
}

/// The units the example's prefilter keeps, as requests for `stage`. An
/// embed stage in front is skipped: the bench measures the model, and
/// needs more units than the embed filter would leave.
fn requests(plan: &Plan, stage: &ModelTurn, n: usize) -> Result<Vec<Request>> {
    let routed = example_units(plan)?;
    let projector = Projector::compile(
        stage.name(),
        stage.spec.project.as_deref(),
        &stage.spec.fields,
    )?;
    let mut out = Vec::new();
    for &i in routed
        .by_stage
        .get(plan.first_stage())
        .map(Vec::as_slice)
        .unwrap_or(&[])
    {
        let id = routed.table.id(i)?;
        let projected = projector.project(id.as_str(), &routed.table.value(i))?;
        out.push(Request {
            index: out.len(),
            unit_id: id.0.clone(),
            suffix: stage.suffix(id.as_str(), &projected),
            schema: stage.schema_for_unit(&projected),
            input: projected,
            attempt: 1,
            max_output_tokens: stage.spec.max_output_tokens,
        });
        if out.len() == n {
            break;
        }
    }
    Ok(out)
}

/// Few-shot examples drawn from units outside the measured ones, answered
/// in the output format, so a longer prefix carries real content.
fn few_shots(stage: &ModelTurn, pool: &[Request], k: usize) -> String {
    let mut text = String::new();
    for (i, r) in pool.iter().take(k).enumerate() {
        let title = r.input.get("title").and_then(Value::as_str).unwrap_or("");
        let _ = write!(
            text,
            "\n### Example {}\n{}\nAnswer: {{\"decision\": \"not_blocker\", \"cause\": \"none\", \"evidence\": [{{\"field\": \"title\", \"quote\": {}}}]}}\n",
            i + 1,
            r.suffix,
            serde_json::to_string(title).unwrap_or_default()
        );
    }
    format!("{}\n## Examples\n{text}", stage.prefix())
}

/// How one configuration runs the model.
#[derive(Clone, Copy)]
struct Setup {
    slots: usize,
    /// Fork a shared prefix (otherwise every unit evaluates its whole prompt).
    share: bool,
    draft_tokens: usize,
    /// Jump forward over the text the grammar forces.
    jump_forward: bool,
    /// Read the decision from the scores of its values instead of
    /// generating it.
    choice_only: bool,
    attention: Attention,
}

fn run_config(
    model_path: &Path,
    label: &str,
    prefix: &str,
    schema: &Value,
    reqs: &[Request],
    decision: Option<&DecisionField>,
    setup: Setup,
) -> Result<Measured> {
    let Setup {
        slots,
        share,
        draft_tokens,
        jump_forward,
        choice_only,
        attention,
    } = setup;
    let mut cfg = LlamaConfig::new(model_path.to_owned());
    cfg.share_prefix = share;
    cfg.draft_tokens = draft_tokens;
    cfg.jump_forward = jump_forward;
    cfg.attention = attention;
    cfg.slot_tokens = 1024;
    let model = EmbeddedModel::load(cfg)?;
    let mut job = QueueJob::new(prefix, reqs.to_vec(), slots).with_schema(schema.clone());
    if let Some(d) = decision {
        job = if choice_only {
            job.with_choice_only(d.clone())
        } else {
            job.with_decision(d.clone())
        };
    }
    let started = Instant::now();
    let stats = model.run_job(&job).map_err(|e| anyhow!("{e}"))?;
    let wall_s = started.elapsed().as_secs_f64();
    let breaches = job.contract_breaches();
    ensure!(
        breaches.is_empty(),
        "the embedded model broke the job's contract: {}",
        breaches.join("; ")
    );
    let mut m = Measured {
        label: label.to_owned(),
        units: reqs.len(),
        slots,
        prefix_tokens: stats.prefix_tokens,
        wall_s,
        decode_calls: stats.decode_calls,
        decode_us: stats.by_batch.iter().map(|b| b.micros).sum(),
        sample_us: stats.sample_us,
        samples: stats.samples,
        full_vocab_samples: stats.full_vocab_samples,
        drafted: stats.drafted,
        accepted: stats.accepted,
        forced: stats.forced,
        forced_accepted: stats.forced_accepted,
        ended_early: stats.ended_early,
        jumped: stats.jumped,
        by_batch: stats.by_batch,
        ..Measured::default()
    };
    for f in job.finished() {
        match &f.result {
            Ok(c) => {
                m.prompt_evaluated += c.usage.prompt_tokens;
                m.prompt_reused += c.usage.cached_tokens;
                m.generated += c.usage.completion_tokens;
                m.texts.push((f.request.index, c.text.clone()));
            }
            Err(_) => m.errors += 1,
        }
    }
    m.texts.sort();
    eprintln!(
        "  {label}: {:.1}s, {} prompt tokens evaluated, {} reused, {} generated, {} decode calls, {} forced ({} accepted, {} ends), {} drafted, {} accepted",
        m.wall_s,
        m.prompt_evaluated,
        m.prompt_reused,
        m.generated,
        m.decode_calls,
        m.forced,
        m.forced_accepted,
        m.ended_early,
        m.drafted,
        m.accepted
    );
    Ok(m)
}

/// The example's stage asking for its decision alone: no evidence, no
/// confidence, a schema of the one decision field.
fn decision_only(stage: &ModelTurn) -> Result<ModelTurn> {
    let DecisionField { key, choices } = DecisionField::from(&stage.spec.decision);
    let schema = serde_json::json!({
        "type": "object",
        "required": [key],
        "additionalProperties": false,
        "properties": {key: {"type": "string", "enum": choices}}
    });
    let spec = fanfold_ops::map::TurnSpec {
        evidence: None,
        confidence: None,
        min_confidence: None,
        decode: fanfold_core::spec::Decode::Choice,
        ..stage.spec.clone()
    };
    Ok(ModelTurn::new(spec, stage.rubric.clone(), schema)?)
}

/// The prefix sweep's wall time and the slot sweep's throughput, as SVG.
fn write_sweep_plots(dir: &Path, prefix_sweep: &[Measured], slot_sweep: &[Measured]) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let prefix_svg = dir.join("fabric-prefix-sweep.svg");
    let points: Vec<(f64, f64)> = prefix_sweep
        .iter()
        .map(|m| (m.prefix_tokens as f64, m.wall_s))
        .collect();
    std::fs::write(
        &prefix_svg,
        svg_chart(
            "Wall time vs shared prefix length",
            "prefix tokens",
            "wall s",
            &points,
        ),
    )?;
    let slots_svg = dir.join("fabric-slot-sweep.svg");
    let points: Vec<(f64, f64)> = slot_sweep
        .iter()
        .map(|m| (m.slots as f64, m.units_per_s()))
        .collect();
    std::fs::write(
        &slots_svg,
        svg_chart("Throughput vs slots", "slots", "units/s", &points),
    )?;
    Ok(())
}

/// A line chart as SVG, written by hand to keep the build small.
fn svg_chart(title: &str, x_label: &str, y_label: &str, points: &[(f64, f64)]) -> String {
    let (w, h, pad) = (640.0, 400.0, 60.0);
    let max_x = points.iter().map(|p| p.0).fold(1.0, f64::max);
    let max_y = points.iter().map(|p| p.1).fold(1e-9, f64::max) * 1.1;
    let sx = |x: f64| pad + x / max_x * (w - 2.0 * pad);
    let sy = |y: f64| h - pad - y / max_y * (h - 2.0 * pad);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{}\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">{title}</text>\n",
        w / 2.0
    );
    let _ = writeln!(
        s,
        "<line x1=\"{pad}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/><line x1=\"{pad}\" y1=\"{pad}\" x2=\"{pad}\" y2=\"{}\" stroke=\"black\"/>",
        h - pad,
        w - pad,
        h - pad,
        h - pad
    );
    let _ = writeln!(
        s,
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{x_label}</text>",
        w / 2.0,
        h - 15.0
    );
    let _ = writeln!(
        s,
        "<text x=\"15\" y=\"{}\" text-anchor=\"middle\" transform=\"rotate(-90 15 {})\">{y_label}</text>",
        h / 2.0,
        h / 2.0
    );
    for i in 0..=4 {
        let y = max_y * f64::from(i) / 4.0;
        let _ = writeln!(
            s,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{y:.1}</text>",
            pad - 6.0,
            sy(y) + 4.0
        );
    }
    let path: Vec<String> = points
        .iter()
        .map(|(x, y)| format!("{:.1},{:.1}", sx(*x), sy(*y)))
        .collect();
    let _ = writeln!(
        s,
        "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"2\" points=\"{}\"/>",
        path.join(" ")
    );
    for (x, y) in points {
        let _ = writeln!(
            s,
            "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"4\" fill=\"#1f77b4\"/><text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{x}</text>",
            sx(*x),
            sy(*y),
            sx(*x),
            h - pad + 16.0
        );
    }
    s.push_str("</svg>\n");
    s
}

pub fn main(args: FabricArgs) -> Result<()> {
    let model_path = fanfold_engine::models::ensure(
        &fanfold_engine::models::SMOLLM2_135M,
        &fanfold_engine::models::cache_dir(),
        &|l| eprintln!("{l}"),
    )?;
    let plan = Plan::load(&args.example.join("spec.toml"))?;
    let stage = plan
        .stages
        .iter()
        .find_map(|s| plan.map_stage(s.name()))
        .ok_or_else(|| anyhow!("the example has no map stage"))?;
    let all = requests(&plan, stage, args.units + 16)?;
    if all.len() < args.units + 16 {
        return Err(anyhow!(
            "the example routes only {} units; ask for fewer",
            all.len()
        ));
    }
    let (measured, pool) = all.split_at(args.units);
    let schema = &stage.schema;
    let prefix = stage.prefix();

    eprintln!("throughput limit of this machine on this model:");
    let limit_at = |depth: usize, attention: Attention| {
        let limit = fanfold_llama::throughput_limit(&model_path, args.slots, depth, attention)
            .map_err(|e| anyhow!("{e}"))?;
        eprintln!(
            "  {attention:?} at depth {depth}: prompt {:.0} tokens/s, batched generation ({} seqs) {:.0} tokens/s",
            limit.prompt_tps, args.slots, limit.generation_tps
        );
        Ok::<_, anyhow::Error>(limit)
    };
    let limit = limit_at(0, Attention::PerSequence)?;

    // Drafting is measured against the default (off) at this length.
    const DRAFT: usize = 8;
    let defaults = LlamaConfig::new(PathBuf::new());
    let draft = defaults.draft_tokens;
    let base = Setup {
        slots: args.slots,
        share: true,
        draft_tokens: draft,
        jump_forward: defaults.jump_forward,
        choice_only: false,
        attention: Attention::PerSequence,
    };
    let run = |label: &str, prefix: &str, setup: Setup| {
        run_config(&model_path, label, prefix, schema, measured, None, setup)
    };
    eprintln!("side by side on {} units:", measured.len());
    let shared = run("shared prefix", prefix, base)?;
    // The limits again at the depth the slots work at: a unit's prompt is
    // evaluated after the shared prefix, its answer generated after the
    // prefix and the unit.
    let depth = shared.prefix_tokens as usize;
    let deep_limit = limit_at(depth, Attention::PerSequence)?;
    let unified_limit = limit_at(depth, Attention::UnifiedWithoutFlash)?;
    let stepwise = run(
        "shared prefix, step by step (no jump-forward)",
        prefix,
        Setup {
            jump_forward: false,
            ..base
        },
    )?;
    let drafted = run(
        &format!("shared prefix, drafting {DRAFT} tokens"),
        prefix,
        Setup {
            draft_tokens: DRAFT,
            ..base
        },
    )?;
    let unified = run(
        "shared prefix, unified KV, flash attention off",
        prefix,
        Setup {
            attention: Attention::UnifiedWithoutFlash,
            ..base
        },
    )?;
    let naive = run(
        "naive (full prompt per unit)",
        prefix,
        Setup {
            share: false,
            ..base
        },
    )?;
    let single = run(
        "shared prefix, one slot",
        prefix,
        Setup { slots: 1, ..base },
    )?;
    // The same units asked for their decision alone: generated under the
    // one-field schema, then read from the scores of the values.
    let decision_stage = decision_only(stage)?;
    let field = DecisionField::from(&decision_stage.spec.decision);
    let bare: Vec<Request> = measured
        .iter()
        .map(|r| Request {
            schema: None,
            ..r.clone()
        })
        .collect();
    let decide = |label: &str, choice_only: bool| {
        run_config(
            &model_path,
            label,
            decision_stage.prefix(),
            &decision_stage.schema,
            &bare,
            Some(&field),
            Setup {
                choice_only,
                ..base
            },
        )
    };
    let decided = decide("decision only, generated", false)?;
    let scored = decide("decision only, scored", true)?;

    let sweeps: &[usize] = if args.no_sweeps { &[] } else { &[0, 4, 16] };
    let slot_counts: &[usize] = if args.no_sweeps {
        &[]
    } else {
        &[1, 2, 4, 8, 16]
    };
    eprintln!("prefix sweep (few-shot examples):");
    let mut prefix_sweep = Vec::new();
    for &k in sweeps {
        let p = if k == 0 {
            prefix.to_owned()
        } else {
            few_shots(stage, pool, k)
        };
        let mut m = run(&format!("{k} few-shot"), &p, base)?;
        m.label = format!("{k}");
        prefix_sweep.push(m);
    }
    eprintln!("slot sweep:");
    let mut slot_sweep = Vec::new();
    for &s in slot_counts {
        slot_sweep.push(run(
            &format!("{s} slots"),
            prefix,
            Setup { slots: s, ..base },
        )?);
    }

    // Without sweeps the plots of an earlier run are left as they are.
    if !args.no_sweeps {
        write_sweep_plots(&args.plot_dir, &prefix_sweep, &slot_sweep)?;
    }

    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_owned())
        })
        .unwrap_or_default();
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let mut md = String::new();
    let _ = writeln!(
        md,
        "## Execution fabric on the embedded model (`fanfold bench fabric`)\n"
    );
    let _ = writeln!(
        md,
        "Measured by `fanfold bench fabric` in one run on {cores} cores ({cpu}), model {} (llama.cpp in-process), {} units of the issue-triage example that its prefilter routes to the model, output constrained by the stage's schema. All figures are measured; none is simulated.\n",
        fanfold_engine::models::SMOLLM2_135M.file,
        measured.len()
    );
    let _ = writeln!(
        md,
        "Throughput limit of this binary on this model: prompt **{:.0} tokens/s** (one 512-token batch), batched generation **{:.0} tokens/s** ({} sequences, one token each per step).\n",
        limit.prompt_tps, limit.generation_tps, args.slots
    );
    let row = |m: &Measured| {
        format!(
            "| {} | {} | {} | {} | {} | {} | {:.1} | {:.2} | {:.0} |",
            m.label,
            m.slots,
            m.prefix_tokens,
            m.prompt_evaluated,
            m.prompt_reused,
            m.generated,
            m.wall_s,
            m.units_per_s(),
            m.tokens_per_s()
        )
    };
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
    let header = "| configuration | slots | prefix tokens | prompt tokens evaluated | prompt tokens reused | generated | wall s | units/s | tokens/s |\n|---|---|---|---|---|---|---|---|---|";
    let _ = writeln!(md, "{header}");
    for m in [
        &shared, &stepwise, &drafted, &unified, &naive, &single, &decided, &scored,
    ] {
        let _ = writeln!(md, "{}", row(m));
    }
    let same = drafted.same_answers(&shared);
    let _ = writeln!(
        md,
        "\nWhere the shared run's model time went, by decode batch size (tokens evaluated in one call):\n\n| batch tokens | calls | tokens | decode s | ms per token |\n|---|---:|---:|---:|---:|"
    );
    let mut low = 1;
    for (bound, cost) in fanfold_llama::BATCH_BUCKETS.iter().zip(&shared.by_batch) {
        let label = match *bound {
            usize::MAX => format!("{low}+"),
            b if b == low => format!("{b}"),
            b => format!("{low}-{b}"),
        };
        low = bound.saturating_add(1);
        if cost.calls == 0 {
            continue;
        }
        let _ = writeln!(
            md,
            "| {label} | {} | {} | {:.1} | {:.1} |",
            cost.calls,
            cost.tokens,
            cost.micros as f64 / 1e6,
            cost.ms_per_token()
        );
    }
    let decode_s = shared.decode_us as f64 / 1e6;
    let sample_s = shared.sample_us as f64 / 1e6;
    let rest_s = (shared.wall_s - decode_s - sample_s).max(0.0);
    let share = |x: f64| 100.0 * ratio(x, shared.wall_s);
    let _ = writeln!(
        md,
        "\nThe shared run's wall time by activity: decode calls {decode_s:.1} s ({:.0}%); choosing tokens under the grammar {sample_s:.2} s ({:.1}%: {} tokens chosen, {} of them needing the full vocabulary because the grammar refused the argmax); everything else (prompts, tokenizing, scheduling) {:.1} s ({:.0}%). A faster grammar engine (llama.cpp's `llguidance` sampler) replaces only the choosing, so on this work it could save at most {sample_s:.2} s of {:.1} s.",
        share(decode_s),
        share(sample_s),
        shared.samples,
        shared.full_vocab_samples,
        rest_s,
        share(rest_s),
        shared.wall_s
    );
    let same_stepwise = stepwise.same_answers(&shared);
    let sampled = shared
        .generated
        .saturating_sub(shared.forced_accepted + shared.jumped);
    let _ = writeln!(
        md,
        "\nJump-forward (the default): where the grammar allows one continuation only, its text is drafted whole into the slot's next batch and checked there by greedy decoding, and an answer whose rest is forced is finished without decoding it. Of the shared run's {} generated tokens, {} were forced text checked in a batch ({} drafted, {:.0}% accepted; the rest the model split into other tokens), {} were the forced rest of {} answers, never decoded, and {sampled} were chosen one decode step at a time. {} decode calls against {} step by step (`jump_forward = false`), **{:.2}x** its wall time ({:.1} s against {:.1} s). Answers byte-identical to step-by-step decoding: **{same_stepwise} of {}**.",
        shared.generated,
        shared.forced_accepted,
        shared.forced,
        100.0 * ratio(shared.forced_accepted as f64, shared.forced as f64),
        shared.jumped,
        shared.ended_early,
        shared.decode_calls,
        stepwise.decode_calls,
        ratio(shared.wall_s, stepwise.wall_s),
        shared.wall_s,
        stepwise.wall_s,
        shared.texts.len()
    );
    let _ = writeln!(
        md,
        "\nDrafting (up to {DRAFT} tokens a step, looked up in the unit and the job's last answer, kept only where greedy decoding agrees, after the forced text; the default is {draft}, off): {} tokens drafted, {} accepted ({:.0}%); {} decode calls against {} without drafting, **{:.2}x** the wall time of the undrafted run. Answers byte-identical to the undrafted run: **{same} of {}**.",
        drafted.drafted,
        drafted.accepted,
        100.0 * ratio(drafted.accepted as f64, drafted.drafted as f64),
        drafted.decode_calls,
        shared.decode_calls,
        ratio(drafted.wall_s, shared.wall_s),
        shared.texts.len()
    );
    // The fastest this work could go here: every prompt token at the
    // prompt limit, every token chosen by a decode step at the
    // batched-generation limit, and the forced text taken in a batch at
    // the prompt limit, as it is evaluated like a prompt; a forced rest
    // never decoded costs nothing.
    let ideal = |m: &Measured, l: &fanfold_llama::ThroughputLimit| {
        (m.prompt_evaluated + m.forced_accepted) as f64 / l.prompt_tps.max(1e-9)
            + m.generated.saturating_sub(m.forced_accepted + m.jumped) as f64
                / l.generation_tps.max(1e-9)
    };
    let ideal_s = ideal(&shared, &limit);
    let _ = writeln!(
        md,
        "\nShared vs naive: **{:.2}x** fewer prompt tokens evaluated, **{:.2}x** less wall time. Shared vs one slot: **{:.2}x** less wall time. Aggregate throughput of the shared run: {:.0} tokens/s, **{:.0}%** of the prompt-throughput limit; against the limits for its mix of work ({:.1} s for its prompt tokens and checked forced text at the prompt limit and the tokens it chose step by step at the batched-generation limit; what it never decoded is not counted) it ran at **{:.0}%**.\n",
        ratio(
            naive.prompt_evaluated as f64,
            shared.prompt_evaluated as f64
        ),
        ratio(naive.wall_s, shared.wall_s),
        ratio(single.wall_s, shared.wall_s),
        shared.tokens_per_s(),
        100.0 * ratio(shared.tokens_per_s(), limit.prompt_tps),
        ideal_s,
        100.0 * ratio(ideal_s, shared.wall_s)
    );
    let deep_ideal_s = ideal(&shared, &deep_limit);
    let unified_ideal_s = ideal(&unified, &unified_limit);
    let same_unified = unified.same_answers(&shared);
    let _ = writeln!(
        md,
        "At the depth the slots work at (the cache already {depth} tokens deep: the shared prefix), the same limits are prompt **{:.0} tokens/s** and batched generation **{:.0} tokens/s**; against those, the shared run's mix of work needs {deep_ideal_s:.1} s and it ran at **{:.0}%**. With one unified KV cache and flash attention off, the limits at that depth are prompt {:.0} tokens/s and generation {:.0} tokens/s; the shared run in that layout took **{:.2}x** the default layout's wall time ({:.1} s against {:.1} s), at {:.0}% of its own limits ({unified_ideal_s:.1} s), with answers byte-identical to the default layout's for **{same_unified} of {}** units.\n",
        deep_limit.prompt_tps,
        deep_limit.generation_tps,
        100.0 * ratio(deep_ideal_s, shared.wall_s),
        unified_limit.prompt_tps,
        unified_limit.generation_tps,
        ratio(unified.wall_s, shared.wall_s),
        unified.wall_s,
        shared.wall_s,
        100.0 * ratio(unified_ideal_s, unified.wall_s),
        shared.texts.len()
    );
    let key = field.key.as_str();
    let decisions = |m: &Measured| -> Vec<(usize, Option<String>)> {
        m.texts
            .iter()
            .map(|(i, t)| {
                let v: Option<Value> = serde_json::from_str(t).ok();
                let d = v
                    .as_ref()
                    .and_then(|v| v.get(key))
                    .and_then(Value::as_str)
                    .map(str::to_owned);
                (*i, d)
            })
            .collect()
    };
    let (by_generation, by_score) = (decisions(&decided), decisions(&scored));
    let agree = by_score
        .iter()
        .filter(|(i, d)| d.is_some() && by_generation.iter().any(|(j, e)| j == i && e == d))
        .count();
    let _ = writeln!(
        md,
        "Decision only (the stage's schema cut to its decision, `{key}`): reading the decision from the model's scores of the {} allowed values after the forced opening, instead of generating it, took **{:.2}x** the wall time ({:.1} s against {:.1} s) and {} decode calls against {}; it chose the value greedy generation wrote for **{agree} of {}** units. The scored run's prompt tokens include the opening it forces; its one completion token a unit is the value read.\n",
        field.choices.len(),
        ratio(scored.wall_s, decided.wall_s),
        scored.wall_s,
        decided.wall_s,
        scored.decode_calls,
        decided.decode_calls,
        by_generation.len()
    );
    if args.no_sweeps {
        let _ = writeln!(
            md,
            "The prefix and slot sweeps were not run (`--no-sweeps`)."
        );
    } else {
        let _ = writeln!(
            md,
            "Prefix sweep (few-shot examples in the shared prefix; {} slots): [plot](fabric-prefix-sweep.svg)\n",
            args.slots
        );
        let _ = writeln!(md, "{header}");
        for m in &prefix_sweep {
            let _ = writeln!(md, "{}", row(m));
        }
        let _ = writeln!(
            md,
            "\nSlot sweep (shared prefix): [plot](fabric-slot-sweep.svg)\n"
        );
        let _ = writeln!(md, "{header}");
        for m in &slot_sweep {
            let _ = writeln!(md, "{}", row(m));
        }
    }
    let errors: usize = [
        &shared, &stepwise, &drafted, &unified, &naive, &single, &decided, &scored,
    ]
    .iter()
    .map(|m| m.errors)
    .sum::<usize>()
        + prefix_sweep
            .iter()
            .chain(&slot_sweep)
            .map(|m| m.errors)
            .sum::<usize>();
    let _ = writeln!(md, "\nBackend errors across all configurations: {errors}.");
    crate::report::write_marked_section(&args.report, "fabric", &md)?;
    eprintln!(
        "wrote {} and {}",
        args.report.display(),
        args.plot_dir.display()
    );
    Ok(())
}
