//! `fanfold plan`: chooses how a stage's declared quality target is met
//! at the least cost, by measuring every candidate, and writes the
//! cheapest that proves the target as a plan file for `run --plan`. The
//! candidates are the cascade's proxies and the whole-run strategies of
//! [`strategies`].
//!
//! Each candidate is a run of the spec with that proxy, on one store, so
//! a label or an oracle's fact one candidate paid for is reused by the
//! next: planning costs the union of their labels, not their sum. What a
//! candidate's proof leaves to the oracle is not judged while planning
//! (only the chosen plan's run pays for it). The
//! candidates are tested at the declared failure probability split over
//! them (a union bound), so picking the cheapest after seeing them all
//! keeps the declared guarantee; the plan file carries that split delta,
//! and the run it plans makes the same draws and the same proof.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result, anyhow, bail};
use clap::Args;
use fanfold_core::spec::{CascadeSpec, Spec, StageSpec, TRAINED_PROXY};
use fanfold_engine::plan::{CascadeChoice, PlanFile, apply_choice};
use fanfold_engine::stages::map_cascade::{CascadeReport, REPORT, WANTED_FILE, WantedLabel};
use fanfold_engine::{NoProgress, Plan, RunOptions};

use crate::InputArgs;

mod strategies;

#[derive(Args)]
pub struct PlanArgs {
    /// The spec file (TOML).
    spec: PathBuf,
    #[command(flatten)]
    input: InputArgs,
    /// The map stage whose cascade is planned; the only one with a
    /// cascade when absent.
    #[arg(long)]
    stage: Option<String>,
    /// Where each candidate's run is written; `.fanfold/plans/<spec name>`
    /// when absent.
    #[arg(long)]
    out: Option<PathBuf>,
    /// The plan file written; `plan.toml` in the output folder when absent.
    #[arg(long, value_name = "FILE")]
    write: Option<PathBuf>,
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=4096))]
    slots: u64,
    /// Measure only the proxies a cascade could use, not the whole-run
    /// strategies (micro, chunks, long, the rungs alone).
    #[arg(long)]
    proxies_only: bool,
}

/// One candidate's measured run.
struct Measured {
    choice: CascadeChoice,
    report: CascadeReport,
    wall_secs: f64,
    /// Model calls this candidate's run paid for (the others' are cached).
    new_calls: u64,
    /// Where its run was written.
    out_dir: PathBuf,
}

pub fn plan(args: PlanArgs) -> Result<ExitCode> {
    let base = args.input.plan(&args.spec)?;
    let (stage, declared) = planned_stage(&base.spec, args.stage.as_deref())?;
    let mut choices = candidates(&base.spec, &stage, &declared);
    let oracle_is_backend = strategies::oracle_is_backend(&declared);
    let (whole_runs, skipped) = if args.proxies_only {
        (
            Vec::new(),
            vec!["every whole-run strategy: --proxies-only".to_owned()],
        )
    } else {
        strategies::candidates(&base.spec, &base.spec_dir, &stage, &declared)
    };
    // A union bound over every candidate, so choosing the cheapest after
    // seeing them all keeps the declared delta.
    let k = choices.len() + whole_runs.len();
    let split = declared.delta / k.max(1) as f64;
    for c in &mut choices {
        c.delta = split;
    }
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from(".fanfold/plans").join(&base.spec.name));
    // The strategies are measured first: with a person as the oracle, a
    // proven one asks no oracle call, which no proxy's proof can match. A
    // candidate is measured only while it could still be chosen: once one
    // is proven, a candidate that must cost more is not run (it stays in
    // the union bound, so the delta is the same as with every one run).
    let mut cheapest: Option<(f64, f64)> = None;
    let mut pruned: Vec<String> = Vec::new();
    let mut runs = Vec::new();
    let mut sampled = None;
    let mut skipped = skipped;
    if !whole_runs.is_empty() {
        let set = strategies::Setting {
            base: &base,
            stage: &stage,
            declared: &declared,
            source: args.input.source(),
            store: args.input.store.clone(),
            slots: args.slots as usize,
            max_unit_bytes: args.input.max_unit_bytes,
            out: &out.join("strategies"),
        };
        eprintln!("labelling a sample of {} units ...", declared.label_budget);
        let sample = strategies::sample(&set)?;
        for choice in whole_runs {
            let least = strategy_cost(
                strategies::least_model_calls(&choice, &sample),
                oracle_is_backend,
            );
            if let Some(best) = cheapest.filter(|b| costlier(least, *b)) {
                skipped.push(format!(
                    "{}: a proven candidate costs {}, less than it could",
                    strategies::describe(&choice),
                    cost_text(best, oracle_is_backend)
                ));
                continue;
            }
            if let Some(silent) = strategies::after_silent_chunk(&choice, &runs) {
                skipped.push(format!(
                    "{}: {} listed no id of the {} sampled units it decided, {} of them positive, and a larger context asks the same model the same question",
                    strategies::describe(&choice),
                    silent.name(),
                    silent.counts.tp + silent.counts.fp + silent.counts.fn_ + silent.counts.tn,
                    silent.counts.fn_
                ));
                continue;
            }
            // One context holds the population for `long`; records that
            // already fill more than a window in a chunk strategy's run on
            // the sample cannot fit it, so it is no candidate.
            if choice.strategy == "long"
                && let Some(full) = runs
                    .iter()
                    .find(|r: &&strategies::Measured| r.overflows_window)
            {
                skipped.push(format!(
                    "long: the sampled records {} ran on needed more than one window of {} tokens, so the population's cannot fit the one context it holds",
                    full.name(),
                    fanfold_engine::strategy::WINDOW_TOKENS
                ));
                continue;
            }
            eprintln!("measuring strategy {} ...", choice.strategy);
            let r = strategies::measure(&set, &sample, choice, split)?;
            if r.meets {
                keep_cheapest(
                    &mut cheapest,
                    strategy_cost(r.model_calls(), oracle_is_backend),
                );
            }
            runs.push(r);
        }
        sampled = Some(sample);
    }
    let mut measured = Vec::new();
    for (n, choice) in choices.into_iter().enumerate() {
        // A proof needs labels, and every label is an oracle call.
        if let Some(best) = cheapest.filter(|b| costlier((1.0, 0.0), *b)) {
            pruned.push(format!(
                "{}: a proven candidate costs {}, and a proxy's proof asks the oracle at least once",
                describe(&choice),
                cost_text(best, oracle_is_backend)
            ));
            continue;
        }
        let m = measure_proxy(&args, &base, &stage, &out, n, choice)?;
        if m.report.met && m.report.proxy_decided > 0 {
            keep_cheapest(&mut cheapest, (m.report.oracle_calls as f64, 0.0));
        }
        measured.push(m);
    }
    // Cheapest first by the oracle's calls (a person's label costs more
    // than any model call), then by model calls; with the stage's backend
    // as the oracle both are model calls, and they are added.
    let cost = |c: &Choice| -> (f64, f64) {
        let (oracle, model) = match c {
            Choice::Proxy(i) => (
                measured
                    .get(*i)
                    .map_or(f64::MAX, |m| m.report.oracle_calls as f64),
                0.0,
            ),
            Choice::Strategy(i) => (
                0.0,
                runs.get(*i)
                    .map_or(f64::MAX, strategies::Measured::model_calls),
            ),
        };
        if oracle_is_backend {
            (oracle + model, 0.0)
        } else {
            (oracle, model)
        }
    };
    let proven = measured
        .iter()
        .enumerate()
        .filter(|(_, m)| m.report.met && m.report.proxy_decided > 0)
        .map(|(i, _)| Choice::Proxy(i))
        .chain(
            runs.iter()
                .enumerate()
                .filter(|(_, r)| r.meets)
                .map(|(i, _)| Choice::Strategy(i)),
        );
    let chosen = proven.min_by(|a, b| {
        let (x, y) = (cost(a), cost(b));
        x.0.total_cmp(&y.0).then(x.1.total_cmp(&y.1))
    });
    let proxy_chosen = match chosen {
        Some(Choice::Proxy(i)) => Some(i),
        _ => None,
    };
    print!("{}", table(&stage, &declared, &measured, proxy_chosen, k));
    if !pruned.is_empty() {
        println!("\nNot measured: {}.", pruned.join("; "));
    }
    if strategies::oracle_is_person(&declared) {
        let asked = person_labels(&measured, &out, declared.label_budget)?;
        if let Some(text) = asked {
            println!("\n{text}");
        }
    }
    if let Some(sample) = &sampled {
        let strategy_chosen = match chosen {
            Some(Choice::Strategy(i)) => Some(i),
            _ => None,
        };
        print!(
            "{}",
            strategies::table(&declared, sample, &runs, strategy_chosen, split, &skipped)
        );
    } else if !skipped.is_empty() {
        println!("\nNot measured: {}.", skipped.join("; "));
    }
    let (written, what) = match chosen {
        None => {
            println!(
                "\nNo candidate proved the target: the oracle decides every unit, as without a cascade. No plan file was written."
            );
            return Ok(ExitCode::from(fanfold_engine::EXIT_INCOMPLETE));
        }
        Some(Choice::Proxy(i)) => {
            let m = measured.get(i).ok_or_else(|| anyhow!("no candidate {i}"))?;
            (
                PlanFile {
                    cascade: vec![m.choice.clone()],
                    strategy: None,
                },
                describe(&m.choice),
            )
        }
        Some(Choice::Strategy(i)) => {
            let m = runs.get(i).ok_or_else(|| anyhow!("no strategy {i}"))?;
            (
                PlanFile {
                    cascade: Vec::new(),
                    strategy: Some(m.choice.clone()),
                },
                format!("strategy {}", m.name()),
            )
        }
    };
    let file = args.write.clone().unwrap_or_else(|| out.join("plan.toml"));
    if let Some(dir) = file.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let text = format!(
        "# What `fanfold plan` measured cheapest for the declared target.\n# Run it with: fanfold run {} --plan {}\n{}",
        args.spec.display(),
        file.display(),
        toml::to_string(&written)?
    );
    std::fs::write(&file, text).with_context(|| format!("writing {}", file.display()))?;
    println!(
        "\nChosen: {what}. Wrote {}; run it with `fanfold run {} --plan {}`.",
        file.display(),
        args.spec.display(),
        file.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// A candidate's cost as the plan orders them: the oracle's calls, then
/// the model's; with the stage's backend as the oracle, both are model
/// calls and are added.
fn strategy_cost(model_calls: f64, oracle_is_backend: bool) -> (f64, f64) {
    if oracle_is_backend {
        (model_calls, 0.0)
    } else {
        (0.0, model_calls)
    }
}

/// Whether cost `a` is more than cost `b`: a candidate that must cost
/// more than a proven one can never be the cheapest (equal costs keep
/// the order of the table, so they are measured).
fn costlier(a: (f64, f64), b: (f64, f64)) -> bool {
    a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1)) == std::cmp::Ordering::Greater
}

fn keep_cheapest(cheapest: &mut Option<(f64, f64)>, cost: (f64, f64)) {
    if cheapest.is_none_or(|c| costlier(c, cost)) {
        *cheapest = Some(cost);
    }
}

fn cost_text(cost: (f64, f64), oracle_is_backend: bool) -> String {
    if oracle_is_backend {
        format!("{:.0} model calls", cost.0)
    } else {
        format!("{:.0} oracle calls and {:.0} model calls", cost.0, cost.1)
    }
}

/// The labels `fanfold plan` has asked a person for, over every round
/// of planning into one output folder: one store key a line.
const ASKED_FILE: &str = "labels-asked.txt";

/// With a person as the oracle, each candidate's run lists the labels it
/// waits for in its own folder: they are gathered into one list in `out`
/// for `fanfold label`, each label once, and said in words: how many, how
/// many the plan asked for in all (its earlier rounds' too, kept in
/// [`ASKED_FILE`]), how many of those lie past the label budget, and why.
/// `None` when no candidate waits for a label.
fn person_labels(measured: &[Measured], out: &Path, budget: usize) -> Result<Option<String>> {
    let asked_file = out.join(ASKED_FILE);
    let mut asked: Vec<String> = std::fs::read_to_string(&asked_file)
        .map(|t| t.lines().map(str::to_owned).collect())
        .unwrap_or_default();
    let before = asked.len();
    let mut seen: std::collections::HashSet<String> = asked.iter().cloned().collect();
    let mut wanted_keys = std::collections::HashSet::new();
    let mut lines = Vec::new();
    let mut asking = 0;
    for m in measured {
        let file = m.out_dir.join(WANTED_FILE);
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        let mut own = false;
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let wanted: WantedLabel = serde_json::from_str(line)
                .with_context(|| format!("reading {}", file.display()))?;
            own = true;
            if wanted_keys.insert(wanted.key) {
                lines.push(line.to_owned());
                let key = wanted.key.to_string();
                if seen.insert(key.clone()) {
                    asked.push(key);
                }
            }
        }
        asking += usize::from(own);
    }
    let file = out.join(WANTED_FILE);
    if lines.is_empty() {
        // An earlier plan's list must not outlive its need.
        if file.is_file() {
            std::fs::remove_file(&file).with_context(|| format!("removing {}", file.display()))?;
        }
        return Ok(None);
    }
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let mut text = lines.join("\n");
    text.push('\n');
    std::fs::write(&file, text).with_context(|| format!("writing {}", file.display()))?;
    let mut text = asked.join("\n");
    text.push('\n');
    std::fs::write(&asked_file, text)
        .with_context(|| format!("writing {}", asked_file.display()))?;
    let n = lines.len();
    let total = asked.len();
    let earlier = if before > 0 {
        format!(
            " With the {before} its earlier rounds asked for (one not given yet is asked again), this plan has asked for {total} distinct labels in all."
        )
    } else {
        String::new()
    };
    let past = if total > budget {
        format!(
            " {} of the {total} are PAST the label budget of {budget}: each candidate draws the labels that set its thresholds by its own proxy's scores, within the budget, and their draws overlap only in part, so measuring {asking} candidates asks for their union. Plan with fewer candidates to ask for fewer, or run the spec as declared, whose draws stay within the budget.",
            total - budget
        )
    } else {
        format!(" The {total} are within the label budget of {budget}.")
    };
    Ok(Some(format!(
        "A person is asked for {n} labels, listed in {}: the draws that set the thresholds of the {asking} candidates waiting for labels (a label two candidates draw is asked once).{earlier}{past} Give them with `fanfold label {}` (with this plan's --store), then plan again.",
        file.display(),
        out.display()
    )))
}

/// A candidate, by its index among the proxies or the strategies.
#[derive(Clone, Copy)]
enum Choice {
    Proxy(usize),
    Strategy(usize),
}

/// Runs the spec with one proxy for the cascade, on the planning store.
fn measure_proxy(
    args: &PlanArgs,
    base: &Plan,
    stage: &str,
    out: &Path,
    n: usize,
    choice: CascadeChoice,
) -> Result<Measured> {
    let mut spec = base.spec.clone();
    apply_choice(&mut spec, &choice).map_err(|e| anyhow!(e))?;
    // A candidate is measured by its labels; what its proof leaves to
    // the oracle is paid for only by the run of the chosen plan.
    for s in &mut spec.stages {
        if let StageSpec::Map(m) = s
            && m.name == stage
            && let Some(c) = m.cascade.as_mut()
        {
            c.measure_only = true;
        }
    }
    let plan = Plan::from_spec(spec, &base.spec_path, &base.spec_dir)?;
    let mut opts = RunOptions::new(args.input.store.clone());
    opts.source = args.input.source();
    opts.slots = args.slots as usize;
    opts.max_unit_bytes = args.input.max_unit_bytes;
    let out_dir = out.join(format!("{}-{}", n + 1, label(&choice)));
    opts.out_dir = Some(out_dir.clone());
    eprintln!("measuring {} ...", describe(&choice));
    let what = describe(&choice);
    let _span = tracing::info_span!("proxy candidate", candidate = %what).entered();
    let started = Instant::now();
    let report = fanfold_engine::run(&plan, &opts, &NoProgress)
        .with_context(|| format!("the run with {}", describe(&choice)))?;
    let wall_secs = started.elapsed().as_secs_f64();
    tracing::info!(
        wall_secs,
        model_calls = report.certificate.stats.model_calls,
        "proxy candidate measured"
    );
    let cascade = report
        .certificate
        .stats
        .reports
        .get::<CascadeReport>(REPORT, stage)
        .ok_or_else(|| anyhow!("the run with {} reported no cascade", describe(&choice)))?;
    Ok(Measured {
        choice,
        report: cascade,
        wall_secs,
        new_calls: report.certificate.stats.model_calls,
        out_dir,
    })
}

/// The map stage whose cascade is planned, and its declared cascade.
fn planned_stage(spec: &Spec, named: Option<&str>) -> Result<(String, CascadeSpec)> {
    let mut with: Vec<(String, CascadeSpec)> = spec
        .stages
        .iter()
        .filter_map(|s| match s {
            StageSpec::Map(m) => Some((m.name.clone(), m.cascade.clone()?)),
            _ => None,
        })
        .collect();
    match named {
        Some(name) => with
            .into_iter()
            .find(|(n, _)| n == name)
            .ok_or_else(|| anyhow!("stage `{name}` is not a map stage with a cascade")),
        None if with.len() == 1 => with.pop().ok_or_else(|| anyhow!("no cascade")),
        None if with.is_empty() => bail!(
            "no map stage declares a cascade: `fanfold plan` chooses how a declared target is met, so declare one (`cascade = {{ proxy = ..., target = ..., at_least = ... }}`)"
        ),
        None => bail!(
            "several map stages declare a cascade ({}): name one with --stage",
            with.iter()
                .map(|(n, _)| n.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// The BM25 and embed stages declared before `stage`: each scores the
/// units, so each can be a proxy or a strategy alone.
fn rungs_before<'a>(spec: &'a Spec, stage: &str) -> impl Iterator<Item = &'a str> {
    let before = spec
        .stages
        .iter()
        .position(|s| s.name() == stage)
        .unwrap_or(0);
    spec.stages
        .iter()
        .take(before)
        .filter(|s| matches!(s, StageSpec::Bm25(_) | StageSpec::Embed(_)))
        .map(StageSpec::name)
}

/// The proxies a cascade can use: the declared one, every scoring stage
/// declared before the stage, every map stage whose decisions are scored,
/// and a proxy trained on each embed stage.
fn candidates(spec: &Spec, stage: &str, declared: &CascadeSpec) -> Vec<CascadeChoice> {
    let choice = |proxy: &str, features: Option<&str>| CascadeChoice {
        stage: stage.to_owned(),
        proxy: proxy.to_owned(),
        features: features.map(str::to_owned),
        delta: declared.delta,
    };
    let mut out = vec![choice(&declared.proxy, declared.features.as_deref())];
    for rung in rungs_before(spec, stage) {
        out.push(choice(rung, None));
    }
    // A map stage whose decisions are scored proxies wherever it is
    // declared: the cascade runs it.
    for s in &spec.stages {
        if let StageSpec::Map(m) = s
            && m.name != stage
            && m.cascade.is_none()
            && (m.decode == fanfold_core::spec::Decode::Choice
                || matches!(
                    spec.backends.get(&m.backend),
                    Some(fanfold_core::spec::BackendSpec::Openai(h)) if h.logprobs
                ))
        {
            out.push(choice(&m.name, None));
        }
    }
    for s in &spec.stages {
        if let StageSpec::Embed(e) = s {
            out.push(choice(TRAINED_PROXY, Some(&e.name)));
        }
    }
    let mut seen = std::collections::HashSet::new();
    out.retain(|c| seen.insert((c.proxy.clone(), c.features.clone())));
    out
}

fn describe(c: &CascadeChoice) -> String {
    match &c.features {
        Some(f) => format!("proxy `{}` over `{f}`", c.proxy),
        None => format!("proxy `{}`", c.proxy),
    }
}

fn label(c: &CascadeChoice) -> String {
    match &c.features {
        Some(f) => format!("{}-{f}", c.proxy),
        None => c.proxy.clone(),
    }
}

fn table(
    stage: &str,
    declared: &CascadeSpec,
    measured: &[Measured],
    chosen: Option<usize>,
    k: usize,
) -> String {
    let mut out = String::new();
    let k = k.max(1);
    let _ = writeln!(
        out,
        "Stage `{stage}`: {} ≥ {} with probability ≥ {}; {k} candidates, each tested at delta {:.4} (the declared {} split over them).\n",
        strategies::metric_name(declared.target),
        declared.at_least,
        1.0 - declared.delta,
        declared.delta / k as f64,
        declared.delta
    );
    if measured.is_empty() {
        let _ = writeln!(out, "No proxy was measured.");
        return out;
    }
    let without = measured.first().map_or(0, |m| m.report.calls_without);
    let _ = writeln!(
        out,
        "| candidate | proven | lower bound | proxy decided | labels | oracle calls | of the oracle deciding all ({without}) | new model calls | wall s |\n|---|---|---:|---:|---:|---:|---:|---:|---:|"
    );
    for (i, m) in measured.iter().enumerate() {
        let r = &m.report;
        let proven = r.met && r.proxy_decided > 0;
        let _ = writeln!(
            out,
            "| {}{} | {} | {:.3} | {} | {} | {} | {:.0} % | {} | {:.1} |",
            describe(&m.choice),
            if Some(i) == chosen { " (chosen)" } else { "" },
            if proven { "yes" } else { "no" },
            r.lower_bound,
            r.proxy_decided,
            r.labels,
            r.oracle_calls,
            100.0 * r.oracle_calls as f64 / without.max(1) as f64,
            m.new_calls,
            m.wall_secs
        );
    }
    out
}

/// Where a plan file departs from the spec, for `explain --plan`.
pub fn departures(spec_path: &Path, file: &Path) -> Result<String> {
    let plan = PlanFile::read(file)?;
    let text = std::fs::read_to_string(spec_path)
        .with_context(|| format!("reading {}", spec_path.display()))?;
    let spec = Spec::from_toml(&text).map_err(|e| anyhow!("{}: {e}", spec_path.display()))?;
    let mut out = format!("plan {}:\n", file.display());
    for c in &plan.cascade {
        let declared = spec.stages.iter().find_map(|s| match s {
            StageSpec::Map(m) if m.name == c.stage => m.cascade.clone(),
            _ => None,
        });
        let Some(d) = declared else {
            let _ = writeln!(out, "  stage `{}`: no cascade in the spec", c.stage);
            continue;
        };
        let was = match &d.features {
            Some(f) => format!("`{}` over `{f}`", d.proxy),
            None => format!("`{}`", d.proxy),
        };
        let now = match &c.features {
            Some(f) => format!("`{}` over `{f}`", c.proxy),
            None => format!("`{}`", c.proxy),
        };
        let proxy = if (&d.proxy, &d.features) == (&c.proxy, &c.features) {
            format!("proxy {was} as declared")
        } else {
            format!("proxy {was} -> {now}")
        };
        let _ = writeln!(
            out,
            "  stage `{}`: {proxy}; delta {} -> {} (split over the candidates the plan measured)",
            c.stage, d.delta, c.delta
        );
    }
    if let Some(c) = &plan.strategy {
        let rung = c
            .rung
            .as_deref()
            .map(|r| format!(" (`{r}` alone)"))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "  stage `{}`: the whole-run strategy `{}`{rung} in place of the spec's stages and cascade",
            c.stage, c.strategy
        );
    }
    Ok(out)
}
