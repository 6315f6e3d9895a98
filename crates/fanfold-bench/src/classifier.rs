//! A classifier from fifty labels that decides: the trained proxy fitted
//! on labels chosen where it is unsure (`fanfold_ops::proxy::active_draws`)
//! and deciding under an accuracy target through the cascade, against a
//! plain logistic regression fitted on as many random labels and deciding
//! every unit by its cut. Over seeded trials, on the trained-proxy
//! section's synthetic vectors and on an example with human labels; every
//! answer is scored on the units it never labelled.
//!
//! `fanfold bench cascade` appends this section to its own; `fanfold bench
//! classifier` prints it alone, and after it the example's quality-target
//! spec run through the engine with its cascade's proxy trained, fitted
//! actively and at random.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, anyhow};
use fanfold_core::spec::{ProxyFit, QualityMetric, Spec, StageSpec, TRAINED_PROXY};
use fanfold_engine::stages::map_cascade::{CascadeReport, REPORT};
use fanfold_engine::{NoProgress, Plan, RunOptions};
use fanfold_ops::cascade::{self, Config, Decision, Metric, Target};
use fanfold_ops::proxy::{self, Rounds};

use crate::population::{DIMS, PREVALENCE, UNITS, population, synthetic_vectors};
use crate::report::machine_line;

pub struct ClassifierArgs {
    pub example: PathBuf,
    /// Seeded trials per population, method and proof budget.
    pub trials: u64,
}

/// Labels the classifier is fitted on.
const FIT_LABELS: usize = 50;
/// Label budgets of the cascade's proof, drawn from its own proposal, on
/// the synthetic populations and on the example (whose views are few: a
/// larger budget labels nearly all of them and leaves nothing held out).
const PROOF_BUDGETS: [usize; 2] = [50, 150];
const EXAMPLE_PROOF_BUDGETS: [usize; 2] = [25, 50];
const TARGET: Target = Target {
    metric: Metric::Accuracy,
    at_least: 0.9,
    delta: 0.1,
};
/// Runs the section alone on the example and prints it.
pub fn main(args: &ClassifierArgs) -> Result<()> {
    let started = Instant::now();
    let pop = population(&args.example)?;
    let mut body = String::new();
    let _ = writeln!(
        body,
        "`fanfold bench classifier`, {}. Every figure below is measured by the run that wrote it.\n",
        machine_line()
    );
    section(
        &mut body,
        args.trials,
        &args.example,
        &pop.vectors,
        &pop.keys,
        &pop.truth,
    )?;
    through_the_engine(&mut body, &args.example, args.trials)?;
    let _ = writeln!(
        body,
        "Measured in {:.0} s.",
        started.elapsed().as_secs_f64()
    );
    print!("{body}");
    Ok(())
}

/// The label budget of the engine's runs: half fits the proxy.
const ENGINE_BUDGET: usize = 100;

/// The example's `target.toml` run through the engine, its cascade's proxy
/// replaced by a classifier trained over the example's embed stage under
/// recall and accuracy targets, fitted actively and at random, seeds 0 to
/// `seeds` − 1: what the certificate reports, and the answer's F1 against
/// the example's truth. Nothing is written when the example has no
/// `target.toml`.
fn through_the_engine(body: &mut String, example: &Path, seeds: u64) -> Result<()> {
    let spec_path = example.join("target.toml");
    if !spec_path.exists() {
        return Ok(());
    }
    let text = std::fs::read_to_string(&spec_path)
        .with_context(|| format!("reading {}", spec_path.display()))?;
    let base = Spec::from_toml(&text).map_err(|e| anyhow!("{}: {e}", spec_path.display()))?;
    let cfg = crate::ladder::LadderConfig::read(example)?;
    // The truth as the ladder reads it, through the example's own spec:
    // target.toml names the oracle's column where it says where its
    // labels file came from.
    let ladder_path = example.join("spec.toml");
    let ladder_text = std::fs::read_to_string(&ladder_path)
        .with_context(|| format!("reading {}", ladder_path.display()))?;
    let ladder_spec =
        Spec::from_toml(&ladder_text).map_err(|e| anyhow!("{}: {e}", ladder_path.display()))?;
    let positives = crate::ladder::read_truth(&cfg, example, &ladder_spec, &ladder_text)?;
    let tmp = tempfile::tempdir().context("creating a temporary folder")?;
    let store = tmp.path().join("engine.sqlite");
    let _ = writeln!(
        body,
        "### The trained proxy through the engine

`{}` run by the engine with `{}`'s cascade set to `proxy = \"{TRAINED_PROXY}\", features = \"{}\"`, label budget {ENGINE_BUDGET} (half fits the proxy), at least 0.9 at δ = 0.1 (accuracy with cut 0.5), the labels file as the oracle; seeds 0 to {}. Means over the seeds of the certificate's figures; the answer's F1 is against the example's truth.

| target | fit | rounds | labels | oracle calls | units the proxy decided | cross-fitted AUC | answer F1 (lowest) | met |
|---|---|---|---:|---:|---:|---:|---:|---|",
        spec_path.display(),
        cfg.judge,
        cfg.embed,
        seeds.saturating_sub(1)
    );
    for target in [QualityMetric::Recall, QualityMetric::Accuracy] {
        for fit in [ProxyFit::Active, ProxyFit::Random] {
            let (mut labels, mut calls, mut decided, mut auc) = (0.0, 0.0, 0.0, 0.0);
            let (mut f1s, mut met, mut rounds) = (Vec::new(), 0, String::new());
            for seed in 0..seeds {
                let mut spec = base.clone();
                let cascade = spec
                    .stages
                    .iter_mut()
                    .find_map(|s| match s {
                        StageSpec::Map(m) if m.name == cfg.judge => m.cascade.as_mut(),
                        _ => None,
                    })
                    .ok_or_else(|| anyhow!("`{}` has no cascade in target.toml", cfg.judge))?;
                cascade.proxy = TRAINED_PROXY.into();
                cascade.features = Some(cfg.embed.clone());
                cascade.fit = Some(fit);
                cascade.seed = seed;
                cascade.label_budget = ENGINE_BUDGET;
                cascade.target = target;
                cascade.at_least = 0.9;
                cascade.delta = 0.1;
                cascade.cut = (target == QualityMetric::Accuracy).then_some(proxy::CUT);
                let plan = Plan::from_spec(spec, &spec_path, example)?;
                let run = fanfold_engine::run(&plan, &RunOptions::new(store.clone()), &NoProgress)?;
                let r: CascadeReport = run
                    .certificate
                    .stats
                    .reports
                    .get(REPORT, &cfg.judge)
                    .ok_or_else(|| anyhow!("no cascade report for `{}`", cfg.judge))?;
                let said: HashSet<String> = run
                    .answer
                    .items
                    .iter()
                    .map(|i| i.unit_id.0.clone())
                    .collect();
                let tp = said.iter().filter(|id| positives.contains(*id)).count();
                let (fp, fn_) = (said.len() - tp, positives.len() - tp);
                f1s.push(2.0 * tp as f64 / (2 * tp + fp + fn_).max(1) as f64);
                labels += r.labels as f64;
                calls += r.oracle_calls as f64;
                decided += r.proxy_decided as f64;
                met += usize::from(r.met);
                if let Some(t) = &r.trained {
                    auc += t.auc.unwrap_or(0.5);
                    rounds = format!("{:?}", t.rounds);
                }
            }
            let n = seeds.max(1) as f64;
            let (f1, _) = mean_and_half_width(&f1s);
            let lowest = f1s.iter().copied().fold(f64::INFINITY, f64::min);
            let _ = writeln!(
                body,
                "| {target:?} | {} | {rounds} | {:.1} | {:.1} | {:.1} | {:.3} | {f1:.3} ({lowest:.3}) | {met} of {seeds} |",
                fit.name(),
                labels / n,
                calls / n,
                decided / n,
                auc / n,
            );
        }
    }
    let _ = writeln!(body);
    Ok(())
}

/// Units with their embeddings, label keys and truth.
#[derive(Clone, Copy)]
struct Units<'a> {
    vectors: &'a [Vec<f32>],
    keys: &'a [u64],
    truth: &'a [bool],
}

impl Units<'_> {
    fn label(&self, p: usize) -> Option<bool> {
        self.truth.get(p).copied()
    }

    fn distinct_keys(&self) -> usize {
        self.keys.iter().collect::<HashSet<_>>().len()
    }

    fn keys_of(&self, positions: impl Iterator<Item = usize>) -> HashSet<u64> {
        positions
            .filter_map(|p| self.keys.get(p).copied())
            .collect()
    }
}

/// Appends the section: the synthetic populations over `trials` seeds,
/// then the example's units (`vectors`, `keys`, `truth`).
pub fn section(
    body: &mut String,
    trials: u64,
    example: &Path,
    vectors: &[Vec<f32>],
    keys: &[u64],
    truth: &[bool],
) -> Result<()> {
    let rounds = Rounds::of(FIT_LABELS);
    let _ = writeln!(
        body,
        "### A classifier from {FIT_LABELS} labels that decides

The trained proxy (`fanfold_ops::proxy`, a logistic regression over the embedding) fitted on {FIT_LABELS} labels chosen where it is unsure: {} at random, then {} rounds of {} the model of the labels so far scores nearest its cut (0.5), refitted after each. It then decides under {} ≥ {} at δ = {} through the cascade (cut 0.5): the classifier decides both sides of its cut, the oracle a band around it, and the proof's labels are the cascade's own draws (a proof budget of {:?} on the synthetic vectors, {:?} on the example, whose views are few). \"Exploring\" takes half of each later round in seeded random order instead. Against it, a plain logistic regression fitted on as many random labels as the cascade spent in the same trial (and on as many as the oracle was asked in all, band included), deciding every unit it was not given by its cut. \"Random fit + cascade\" is the same cascade with the fit's labels drawn at random: what choosing them is worth. Seeds 0 to {} for every row. \"Labels\" counts the distinct labels of the fit and the proof; \"oracle calls\" adds the distinct units the oracle decides in the band. Held-out F1 scores the answer (the oracle's decisions as the truth) on the units whose label was never asked, with its 95 % interval over trials; the classifier's own F1 scores only the held-out units it decided; \"met\" counts the trials whose whole answer reaches the target.\n",
        rounds.first,
        (FIT_LABELS - rounds.first).div_ceil(rounds.each.max(1)),
        rounds.each,
        TARGET.metric.name(),
        TARGET.at_least,
        TARGET.delta,
        PROOF_BUDGETS,
        EXAMPLE_PROOF_BUDGETS,
        trials.saturating_sub(1),
    );
    let _ = writeln!(
        body,
        "| population | proof budget | method | labels | oracle calls | units the classifier decided | held-out units | held-out F1 | the classifier's own F1 | met |\n|---|---:|---|---:|---:|---:|---:|---:|---:|---|"
    );
    let synthetic = format!(
        "synthetic, {UNITS} units, {:.0} % positive, {DIMS} dimensions",
        PREVALENCE * 100.0
    );
    for budget in PROOF_BUDGETS {
        let mut rows = Rows::default();
        for seed in 0..trials {
            let (vectors, truth) = synthetic_vectors(seed);
            let keys: Vec<u64> = (0..vectors.len() as u64).collect();
            let pop = Units {
                vectors: &vectors,
                keys: &keys,
                truth: &truth,
            };
            rows.trial(pop, rounds, budget, seed)?;
        }
        rows.write(body, &synthetic, budget);
    }
    let pop = Units {
        vectors,
        keys,
        truth,
    };
    let name = format!(
        "`{}`, {} lines, {} views, {} positive",
        example.display(),
        truth.len(),
        pop.distinct_keys(),
        truth.iter().filter(|&&y| y).count()
    );
    for budget in EXAMPLE_PROOF_BUDGETS {
        let mut rows = Rows::default();
        for seed in 0..trials {
            rows.trial(pop, rounds, budget, seed)?;
        }
        rows.write(body, &name, budget);
    }
    let _ = writeln!(body);
    Ok(())
}

/// One trial of one method.
struct Trial {
    labels: usize,
    calls: usize,
    /// Share of the units the classifier decided.
    decided: f64,
    held_out: usize,
    f1: f64,
    /// F1 of the classifier's own decisions among the held-out units.
    own_f1: f64,
    met: bool,
}

/// Every method's trials for one population and proof budget.
#[derive(Default)]
struct Rows {
    active: Tally,
    exploring: Tally,
    random_fit: Tally,
    plain_same_labels: Tally,
    plain_same_calls: Tally,
}

impl Rows {
    fn trial(&mut self, pop: Units<'_>, rounds: Rounds, budget: usize, seed: u64) -> Result<()> {
        let active = proxy::active_draws(pop.vectors, pop.keys, rounds, seed, |p| pop.label(p))?;
        let a = through_cascade(pop, &active, budget, seed)?;
        let half = Rounds {
            explore: rounds.each / 2,
            ..rounds
        };
        let exploring = proxy::active_draws(pop.vectors, pop.keys, half, seed, |p| pop.label(p))?;
        self.exploring
            .add(&through_cascade(pop, &exploring, budget, seed)?);
        let random = proxy::training_draws(pop.keys, rounds.labels, seed);
        self.random_fit
            .add(&through_cascade(pop, &random, budget, seed)?);
        self.plain_same_labels.add(&plain(pop, a.labels, seed)?);
        self.plain_same_calls.add(&plain(pop, a.calls, seed)?);
        self.active.add(&a);
        Ok(())
    }

    fn write(&self, body: &mut String, population: &str, budget: usize) {
        for (method, tally) in [
            ("active fit + cascade", &self.active),
            ("active fit, exploring + cascade", &self.exploring),
            ("random fit + cascade", &self.random_fit),
            (
                "plain logistic, random labels as many as the cascade's",
                &self.plain_same_labels,
            ),
            (
                "plain logistic, random labels as many as the cascade's oracle calls",
                &self.plain_same_calls,
            ),
        ] {
            let _ = writeln!(
                body,
                "| {population} | {budget} | {method} | {} |",
                tally.cells()
            );
        }
    }
}

/// The classifier fitted (cross-fitted, as a run fits it) on the labels
/// of `fit`, deciding under the accuracy target through the cascade,
/// whose proof draws its own labels.
fn through_cascade(pop: Units<'_>, fit: &[usize], budget: usize, seed: u64) -> Result<Trial> {
    let (scores, _) = proxy::fit_on(pop.vectors, pop.keys, fit, |p| pop.label(p))?;
    let config = Config {
        cut: proxy::CUT,
        ..Config::new(TARGET, budget, seed)
    };
    let outcome = cascade::run(&config, &scores, pop.keys, &mut |p| pop.label(p))?;
    let positions = || outcome.decisions.iter().enumerate();
    let mut asked = pop.keys_of(fit.iter().copied());
    asked.extend(
        pop.keys_of(
            positions()
                .filter(|(_, d)| matches!(d, Decision::Label { .. }))
                .map(|(p, _)| p),
        ),
    );
    let labels = asked.len();
    let never_labelled = |p: usize, d: &Decision| {
        !matches!(d, Decision::Label { .. }) && pop.keys.get(p).is_some_and(|k| !asked.contains(k))
    };
    let held_out = positions().filter(|&(p, d)| never_labelled(p, d)).count();
    let f1 = outcome.quality(pop.truth, never_labelled).f1;
    let own_f1 = outcome
        .quality(pop.truth, |p, d| {
            matches!(d, Decision::Proxy { .. }) && never_labelled(p, d)
        })
        .f1;
    let met = outcome.realized(pop.truth) >= TARGET.at_least;
    let band = pop.keys_of(
        positions()
            .filter(|(_, d)| matches!(d, Decision::Oracle))
            .map(|(p, _)| p),
    );
    Ok(Trial {
        labels,
        calls: asked.union(&band).count(),
        decided: outcome.proxy_decided as f64 / pop.truth.len().max(1) as f64,
        held_out,
        f1,
        own_f1,
        met,
    })
}

/// A plain logistic regression fitted on `n` random labels (one a key),
/// deciding every other unit by its cut; with labels of one class, that
/// class.
fn plain(pop: Units<'_>, n: usize, seed: u64) -> Result<Trial> {
    let training = proxy::training_draws(pop.keys, n, seed);
    let labelled: Vec<(usize, bool)> = training
        .iter()
        .filter_map(|&p| Some((p, pop.label(p)?)))
        .collect();
    let by_key: std::collections::HashMap<u64, bool> = labelled
        .iter()
        .filter_map(|&(p, y)| Some((*pop.keys.get(p)?, y)))
        .collect();
    let scores = proxy::fit_all(pop.vectors, &labelled)?;
    let majority = 2 * labelled.iter().filter(|(_, y)| *y).count() > labelled.len();
    let (mut held, mut right) = (Counts::default(), 0usize);
    for (p, &y) in pop.truth.iter().enumerate() {
        let key = pop.keys.get(p);
        let said = match key.and_then(|k| by_key.get(k)) {
            Some(&label) => label,
            None => {
                let said = scores
                    .as_ref()
                    .and_then(|s| s.get(p))
                    .map_or(majority, |&s| s >= proxy::CUT);
                held.add(said, y);
                said
            }
        };
        right += usize::from(said == y);
    }
    Ok(Trial {
        labels: by_key.len(),
        calls: by_key.len(),
        decided: held.total() as f64 / pop.truth.len().max(1) as f64,
        held_out: held.total(),
        f1: held.f1(),
        own_f1: held.f1(),
        met: right as f64 >= TARGET.at_least * pop.truth.len() as f64,
    })
}

/// A confusion matrix.
#[derive(Default)]
struct Counts {
    tp: usize,
    fp: usize,
    fn_: usize,
    tn: usize,
}

impl Counts {
    fn add(&mut self, said: bool, truth: bool) {
        match (said, truth) {
            (true, true) => self.tp += 1,
            (true, false) => self.fp += 1,
            (false, true) => self.fn_ += 1,
            (false, false) => self.tn += 1,
        }
    }

    fn total(&self) -> usize {
        self.tp + self.fp + self.fn_ + self.tn
    }

    /// As `cascade::Outcome::quality` counts it: no positive in the truth
    /// is recall 1, none said is precision 1.
    fn f1(&self) -> f64 {
        let ratio = |a: usize, b: usize| {
            if a + b == 0 {
                1.0
            } else {
                a as f64 / (a + b) as f64
            }
        };
        let (recall, precision) = (ratio(self.tp, self.fn_), ratio(self.tp, self.fp));
        if recall + precision == 0.0 {
            0.0
        } else {
            2.0 * recall * precision / (recall + precision)
        }
    }
}

/// Means over trials, and the spread of F1.
#[derive(Default)]
struct Tally {
    trials: u64,
    met: u64,
    labels: f64,
    calls: f64,
    decided: f64,
    held_out: f64,
    f1: Vec<f64>,
    own_f1: Vec<f64>,
}

impl Tally {
    fn add(&mut self, t: &Trial) {
        self.trials += 1;
        self.met += u64::from(t.met);
        self.labels += t.labels as f64;
        self.calls += t.calls as f64;
        self.decided += t.decided;
        self.held_out += t.held_out as f64;
        self.f1.push(t.f1);
        self.own_f1.push(t.own_f1);
    }

    /// Labels, oracle calls, the classifier's share, held-out units,
    /// held-out F1 and the classifier's own, each with its 95 % interval,
    /// met.
    fn cells(&self) -> String {
        let n = self.trials.max(1) as f64;
        let (mean, half) = mean_and_half_width(&self.f1);
        let (own, own_half) = mean_and_half_width(&self.own_f1);
        format!(
            "{:.0} | {:.0} | {:.0} % | {:.0} | {mean:.3} ± {half:.3} | {own:.3} ± {own_half:.3} | met in {:.0} % of {} trials",
            self.labels / n,
            self.calls / n,
            100.0 * self.decided / n,
            self.held_out / n,
            100.0 * self.met as f64 / n,
            self.trials,
        )
    }
}

/// The mean and the half-width of its normal 95 % interval.
fn mean_and_half_width(xs: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    if xs.is_empty() {
        return (0.0, 0.0);
    }
    let mean = xs.iter().sum::<f64>() / n;
    if xs.len() < 2 {
        return (mean, 0.0);
    }
    let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, 1.96 * (var / n).sqrt())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_interval_and_the_f1_count_as_stated() {
        assert_eq!(mean_and_half_width(&[]), (0.0, 0.0));
        assert_eq!(mean_and_half_width(&[0.5]), (0.5, 0.0));
        let (mean, half) = mean_and_half_width(&[0.0, 1.0, 0.0, 1.0]);
        assert!((mean - 0.5).abs() < 1e-12);
        // sd = √(1/3), n = 4: 1.96 · √(1/12).
        assert!((half - 1.96 * (1.0f64 / 12.0).sqrt()).abs() < 1e-12);
        let mut c = Counts::default();
        for (said, truth) in [(true, true), (true, false), (false, true), (false, false)] {
            c.add(said, truth);
        }
        assert!((c.f1() - 0.5).abs() < 1e-12);
        assert_eq!(Counts::default().f1(), 1.0);
    }

    /// The section on a small synthetic population standing in for the
    /// example: every method's row is written, each over every trial.
    #[test]
    fn the_section_writes_every_method_for_every_budget() {
        let (vectors, truth) = proxy::synthetic_vectors(3, 300, 0.3, 8, 2.5);
        let keys: Vec<u64> = (0..vectors.len() as u64).collect();
        let mut body = String::new();
        section(&mut body, 2, Path::new("small"), &vectors, &keys, &truth).expect("section");
        for method in [
            "active fit + cascade",
            "random fit + cascade",
            "plain logistic",
        ] {
            assert!(body.contains(method), "{body}");
        }
        let rows = body.lines().filter(|l| l.contains("of 2 trials")).count();
        assert_eq!(
            rows,
            (PROOF_BUDGETS.len() + EXAMPLE_PROOF_BUDGETS.len()) * 5,
            "{body}"
        );
    }
}
