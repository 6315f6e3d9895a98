//! `fanfold bench cascade`: does a cascade keep its guarantee, and what
//! does it save?
//!
//! - On synthetic scores with known truth: for recall, precision and
//!   accuracy targets at 0.8 and 0.9 (δ = 0.1), how often the answer meets
//!   the target over seeded trials, with the labels it spent and the share
//!   of units the proxy decided, for uniform and importance sampling.
//! - The same with a trained proxy on synthetic vectors: fitted on half
//!   the budget in every trial.
//! - On an example with human labels (loghub's for `examples/bgl-alerts`):
//!   the units the prefilter keeps, BM25, the embedding margin and the
//!   trained proxy over the embedding as proxies, the labels as the oracle, a recall target. Over seeds: how
//!   often the target is met, the labels and oracle calls spent against
//!   the calls one micro-context per unit makes, and the quality on the
//!   units the cascade never labelled.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime};

use anyhow::Result;
use fanfold_ops::cascade::{self, Config, Decision, Metric, Outcome, Plan as CascadePlan, Target};
use fanfold_ops::proxy;

use crate::population::{DIMS, PREVALENCE, SEPARATION, UNITS, population, synthetic_vectors};
use crate::report::{cpu_model, load_average, utc_date, write_marked_section};

pub struct CascadeArgs {
    pub example: PathBuf,
    pub report: PathBuf,
    /// Synthetic trials per target and sampling.
    pub trials: u64,
    /// Seeds per proxy and budget on the example.
    pub seeds: u64,
}

const SYNTHETIC_BUDGET: usize = 800;
const DELTA: f64 = 0.1;

pub fn main(args: &CascadeArgs) -> Result<()> {
    let started = Instant::now();
    let mut body = String::new();
    let _ = writeln!(
        body,
        "## The cascade's guarantee (`fanfold bench cascade`)\n"
    );
    let _ = writeln!(
        body,
        "`fanfold bench cascade`, {} cores ({}), load {}, {}. Every figure below is measured by the run that wrote it.\n",
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        cpu_model(),
        load_average(),
        utc_date(SystemTime::now()),
    );
    savings(&mut body, args.trials);
    held_out(&mut body, args.trials);
    choices(&mut body, args.trials);
    synthetic(&mut body, args.trials);
    synthetic_trained(&mut body, args.trials);
    example(&mut body, &args.example, args.seeds)?;
    let _ = writeln!(
        body,
        "Measured in {:.0} s.\n",
        started.elapsed().as_secs_f64()
    );
    eprint!("{body}");
    write_marked_section(&args.report, "cascade", &body)?;
    eprintln!("wrote {}", args.report.display());
    Ok(())
}

/// Means over trials.
#[derive(Default)]
struct Tally {
    trials: u64,
    met: u64,
    proven: u64,
    labels: f64,
    oracle_calls: f64,
    proxy_share: f64,
    realized: f64,
    lower_bound: f64,
    held_out: f64,
    held_out_recall: f64,
    held_out_precision: f64,
    held_out_f1: f64,
}

impl Tally {
    fn add(&mut self, outcome: &Outcome, truth: &[bool]) {
        self.add_spent(outcome, truth, None);
    }

    /// With a trained proxy, `fit` holds the labels and oracle calls both
    /// halves spent and the positions its training labelled, which are
    /// not held out either.
    fn add_spent(&mut self, outcome: &Outcome, truth: &[bool], fit: Option<&Fit>) {
        let t = outcome.target;
        let realized = outcome.realized(truth);
        self.trials += 1;
        if realized >= t.at_least {
            self.met += 1;
        }
        if outcome.plan != CascadePlan::OracleDecidesAll {
            self.proven += 1;
        }
        let (labels, calls) = fit.map_or((outcome.labels, outcome.oracle_calls()), |f| {
            (f.labels, f.calls)
        });
        self.labels += labels as f64;
        self.oracle_calls += calls as f64;
        self.proxy_share += outcome.proxy_decided as f64 / truth.len().max(1) as f64;
        self.realized += realized;
        self.lower_bound += outcome.lower_bound;
        let unlabelled = |i: usize, d: &Decision| {
            !matches!(d, Decision::Label { .. }) && fit.is_none_or(|f| !f.trained.contains(&i))
        };
        self.held_out += outcome
            .decisions
            .iter()
            .enumerate()
            .filter(|(i, d)| unlabelled(*i, d))
            .count() as f64;
        let held_out = outcome.quality(truth, unlabelled);
        self.held_out_recall += held_out.recall;
        self.held_out_precision += held_out.precision;
        self.held_out_f1 += held_out.f1;
    }

    fn mean(&self, v: f64) -> f64 {
        v / self.trials.max(1) as f64
    }

    fn met_pct(&self) -> f64 {
        100.0 * self.met as f64 / self.trials.max(1) as f64
    }

    /// A synthetic table's cells after the target (and sampling): met,
    /// proven, labels, the proxy's share, realized and lower bound.
    fn synthetic_cells(&self) -> String {
        format!(
            "met in {:.1} % of {} trials | {:.0} % | {:.0} | {:.0} % | {:.3} | {:.3} |",
            self.met_pct(),
            self.trials,
            100.0 * self.proven as f64 / self.trials.max(1) as f64,
            self.mean(self.labels),
            100.0 * self.mean(self.proxy_share),
            self.mean(self.realized),
            self.mean(self.lower_bound),
        )
    }
}

const TARGETS: [(Metric, f64); 6] = [
    (Metric::Recall, 0.8),
    (Metric::Recall, 0.9),
    (Metric::Precision, 0.8),
    (Metric::Precision, 0.9),
    (Metric::Accuracy, 0.8),
    (Metric::Accuracy, 0.9),
];

fn synthetic(body: &mut String, trials: u64) {
    let _ = writeln!(
        body,
        "### On synthetic scores with known truth\n\n{UNITS} units per trial, {:.0} % positive, each scored by the logistic of a unit normal whose mean is {SEPARATION} apart between the classes; a new population and a new sample every trial (seeds 0 to {}). Label budget {SYNTHETIC_BUDGET}, δ = {DELTA}. \"Met\" counts the trials whose whole answer (labels, the proxy's decisions, and the oracle's where it was left the unit) reaches the target against the truth; the guarantee asks for at least {:.0} %. \"Proven\" counts the trials that proved a plan in which the proxy decides anything (the others fall back to the oracle deciding every unit). Importance sampling draws half of the labels' mass uniformly and half leaning where the plans can err.\n",
        PREVALENCE * 100.0,
        trials.saturating_sub(1),
        (1.0 - DELTA) * 100.0,
    );
    let _ = writeln!(
        body,
        "| target | sampling | met | proven | labels | units the proxy decided | realized (mean) | proven lower bound (mean) |\n|---|---|---|---:|---:|---:|---:|---:|"
    );
    for (metric, at_least) in TARGETS {
        for (sampling, share) in [("uniform", 1.0), ("importance", 0.5)] {
            let mut tally = Tally::default();
            for seed in 0..trials {
                let (scores, truth) =
                    cascade::synthetic_population(seed, UNITS, PREVALENCE, SEPARATION);
                let keys: Vec<u64> = (0..scores.len() as u64).collect();
                let config = Config {
                    uniform_share: share,
                    ..Config::new(
                        Target {
                            metric,
                            at_least,
                            delta: DELTA,
                        },
                        SYNTHETIC_BUDGET,
                        seed,
                    )
                };
                match cascade::run(&config, &scores, &keys, &mut |i| truth.get(i).copied()) {
                    Ok(outcome) => tally.add(&outcome, &truth),
                    Err(e) => {
                        let _ = writeln!(
                            body,
                            "| {} ≥ {at_least} | {sampling} | error: {e} |||||",
                            metric.name()
                        );
                        continue;
                    }
                }
            }
            let _ = writeln!(
                body,
                "| {} ≥ {at_least} | {sampling} | {}",
                metric.name(),
                tally.synthetic_cells()
            );
        }
    }
    let _ = writeln!(body);
}

/// A population the proven saving is measured on: name, units,
/// prevalence, the proxy's AUC, label budget.
type Shape = (&'static str, usize, f64, f64, usize);

/// The populations the proven saving is measured on.
const SHAPES: [Shape; 4] = [
    ("A-shaped", 1500, 1.0 / 3.0, 0.80, 300),
    ("A-shaped", 100_000, 1.0 / 3.0, 0.80, 1000),
    ("B-shaped", 2000, 0.03, 0.87, 300),
    ("B-shaped", 100_000, 0.03, 0.87, 1000),
];

/// One seeded trial of a population's row.
struct Trial {
    hindsight: f64,
    saved: f64,
    met: bool,
    positives: f64,
    auc: f64,
}

/// `trial(seed)` for seeds `0..trials`, spread over the machine's cores
/// (each trial depends on its seed alone), in seed order.
fn by_seed<T: Send>(trials: u64, trial: impl Fn(u64) -> T + Sync) -> Vec<T> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    let mut out: Vec<(u64, T)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|first| {
                let trial = &trial;
                scope.spawn(move || {
                    (first..trials)
                        .step_by(threads as usize)
                        .map(|seed| (seed, trial(seed)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    });
    out.sort_by_key(|(seed, _)| *seed);
    out.into_iter().map(|(_, t)| t).collect()
}

/// Median and 10th percentile.
fn quantiles(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    let at = |q: f64| {
        v.get(((v.len().max(1) - 1) as f64 * q).round() as usize)
            .copied()
            .unwrap_or(0.0)
    };
    (at(0.5), at(0.1))
}

/// Proven savings against the hindsight optimum, on populations shaped
/// like two real sets, at recall and precision 0.9.
fn savings(body: &mut String, trials: u64) {
    let _ = writeln!(
        body,
        "### Proven saving against hindsight

Synthetic populations shaped like two real sets (A: a third positive, a proxy of AUC 0.80; B: 3 % positive, AUC 0.87), each unit scored by the logistic of a unit normal whose class means lie `√2 Φ⁻¹(AUC)` apart; a new population and sample every trial (seeds 0 to {}), δ = {DELTA}. The saving is the share of units the proxy decides (recall: those it drops below its threshold; precision: those it keeps from its threshold; recall and precision: both, those it drops below one threshold and those it keeps from another, each side proven on its own at δ / 2; the oracle decides the rest). Hindsight is the largest share any threshold of the same family could decide with the whole answer meeting the target, knowing every label. \"Met\" counts the trials whose whole answer reaches the target against the truth.
",
        trials.saturating_sub(1)
    );
    let _ = writeln!(
        body,
        "| population | target | units | label budget | positives (mean) | measured AUC (mean) | hindsight saving (median) | proven saving, median | proven saving, 10th percentile | median / hindsight | met |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"
    );
    let mut b_small: Option<(f64, f64, f64)> = None;
    for metric in [
        Metric::Recall,
        Metric::Precision,
        Metric::RecallAndPrecision,
    ] {
        for shape in SHAPES {
            let row = match shape_row(shape, metric, 0, trials) {
                Ok(row) => row,
                Err(e) => {
                    let _ = writeln!(body, "| {} | error: {e} ||||||||||", shape.0);
                    continue;
                }
            };
            if metric == Metric::Recall && shape.1 == 2000 {
                b_small = Some((row.positives, row.hindsight, row.median));
            }
            let _ = writeln!(body, "{}", row.line(shape, metric, trials));
        }
    }
    if let Some((positives, h, m)) = b_small {
        // Dropping a region the labels see no positive in proves at most
        // `misses` of them only if a region holding one more would show
        // one with probability 1 − δ: n ≥ u (1 − δ^(1 / (misses + 1))).
        let misses = ((1.0 - 0.9) * positives).floor();
        let share = 1.0 - DELTA.powf(1.0 / (misses + 1.0));
        let units = 2000.0;
        let need = share * h * units;
        let most = (300.0 / share).min(units);
        let _ = writeln!(
            body,
            "\nB-shaped at 2,000 units holds about {positives:.0} positives, so recall ≥ 0.9 allows {misses:.0} misses. To drop a region of `u` units, any valid method must rule out {} positives in it, and a sample that sees none there does so at δ = {DELTA} only once it has labelled `u (1 − δ^(1/{}))` = {:.0} % of the region (hypergeometric, sampling without replacement, before bounding the positives kept). The hindsight region ({:.0} % of the units) needs about {need:.0} labels for its proof alone; a budget of 300 can clear a region of at most {most:.0} units, {:.0} % of the population, of which the proxy decides the units not labelled. The cascade proved a median of {:.1} % here.",
            misses + 1.0,
            misses + 1.0,
            100.0 * share,
            100.0 * h,
            100.0 * (most - 300.0).max(0.0) / units,
            100.0 * m,
        );
    }
    let _ = writeln!(body);
}

/// One population's row of the saving table: medians and shares over
/// its seeds.
struct ShapeRow {
    positives: f64,
    auc: f64,
    hindsight: f64,
    median: f64,
    tenth: f64,
    met: f64,
}

impl ShapeRow {
    fn line(&self, (name, n, _, _, budget): Shape, metric: Metric, trials: u64) -> String {
        format!(
            "| {name} | {} ≥ 0.9 | {n} | {budget} | {:.0} | {:.3} | {:.1} % | {:.1} % | {:.1} % | {:.2} | met in {:.1} % of {trials} trials |",
            metric.name(),
            self.positives,
            self.auc,
            100.0 * self.hindsight,
            100.0 * self.median,
            100.0 * self.tenth,
            if self.hindsight > 0.0 {
                self.median / self.hindsight
            } else {
                0.0
            },
            100.0 * self.met,
        )
    }
}

/// A shape's trials at seeds `first..first + trials`, each a new
/// population and sample.
fn shape_row(
    (_, n, prevalence, auc, budget): Shape,
    metric: Metric,
    first: u64,
    trials: u64,
) -> Result<ShapeRow, cascade::CascadeError> {
    let target = Target {
        metric,
        at_least: 0.9,
        delta: DELTA,
    };
    let trials_run = by_seed(trials, |seed| {
        let seed = first + seed;
        let (scores, truth) =
            cascade::synthetic_population(seed, n, prevalence, cascade::separation_for_auc(auc));
        let keys: Vec<u64> = (0..n as u64).collect();
        let config = Config::new(target, budget, seed);
        let o = cascade::run(&config, &scores, &keys, &mut |i| truth.get(i).copied())?;
        Ok::<_, cascade::CascadeError>(Trial {
            hindsight: cascade::hindsight(target, &scores, &truth),
            saved: o.proxy_decided as f64 / n as f64,
            met: o.realized(&truth) >= target.at_least,
            positives: truth.iter().filter(|&&y| y).count() as f64,
            auc: cascade::auc(&scores, &truth).unwrap_or(0.5),
        })
    });
    let (mut hind, mut saved, mut met, mut pos, mut aucs) =
        (Vec::new(), Vec::new(), 0u64, 0.0, 0.0);
    for trial in trials_run {
        let t = trial?;
        hind.push(t.hindsight);
        saved.push(t.saved);
        met += u64::from(t.met);
        pos += t.positives;
        aucs += t.auc;
    }
    let t = trials.max(1) as f64;
    let (hindsight, _) = quantiles(hind);
    let (median, tenth) = quantiles(saved);
    Ok(ShapeRow {
        positives: pos / t,
        auc: aucs / t,
        hindsight,
        median,
        tenth,
        met: met as f64 / t,
    })
}

/// The first seed of the held-out trials: the sampling choices were made
/// looking at seeds below it.
const HELD_OUT_FROM: u64 = 1000;

/// The saving table's recall and precision rows again on seeds never
/// looked at while the cascade's choices were made.
fn held_out(body: &mut String, trials: u64) {
    let _ = writeln!(
        body,
        "### Held out

The cascade's sampling choices (its proposals, the bets sized to the budget, the thresholds) were made looking at seeds below {HELD_OUT_FROM} of these populations. The same rows on seeds {HELD_OUT_FROM} to {}, never looked at before this run:

| population | target | units | label budget | positives (mean) | measured AUC (mean) | hindsight saving (median) | proven saving, median | proven saving, 10th percentile | median / hindsight | met |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        HELD_OUT_FROM + trials.saturating_sub(1)
    );
    for metric in [Metric::Recall, Metric::Precision] {
        for shape in SHAPES {
            match shape_row(shape, metric, HELD_OUT_FROM, trials) {
                Ok(row) => {
                    let _ = writeln!(body, "{}", row.line(shape, metric, trials));
                }
                Err(e) => {
                    let _ = writeln!(body, "| {} | error: {e} ||||||||||", shape.0);
                }
            }
        }
    }
    let _ = writeln!(body);
}

/// A configuration's name and how it departs from the shipped one.
type Variant = (&'static str, fn(&mut Config));

/// What each of the cascade's sampling choices is worth: the shipped
/// configuration against the same with one choice undone, on the
/// A-shaped population of 1,500 units and 300 labels, and for the lean
/// toward low scores on the B-shaped population of 100,000 units and
/// 1,000 labels, where positives are rare, and for the calibrated later
/// rounds on the A-shaped population of as many.
fn choices(body: &mut String, trials: u64) {
    let (n, prevalence, auc, budget) = (1500, 1.0 / 3.0, 0.80, 300);
    let _ = writeln!(
        body,
        "### What each choice is worth

The A-shaped population of {n} units with {budget} labels, seeds 0 to {}: the shipped configuration, then the same with one choice undone. Then the A-shaped population of {B_WIDE} units with {B_WIDE_BUDGET} labels, with and without the later rounds' calibrated proposal when the first round finds positives common (at least {} units a label), and the B-shaped population of as many, with and without the later rounds' lean toward low scores when the first round finds positives rarer than {:.0} %. Last, precision on both populations of {B_WIDE} units, with and without the bets sized to the budget and the later rounds' calibrated proposal. \"Growth-rate bets\" size each bet to grow the capital fastest on the draws so far (`d / (σ² + d²)`) instead of to pass by the budget's draws (`√(2 ln(1/δ) / (σ² n))`).
",
        trials.saturating_sub(1),
        cascade::CALIBRATE_FROM,
        100.0 * cascade::RARE_POSITIVES,
    );
    let _ = writeln!(
        body,
        "| population | target | configuration | proven saving, median | proven saving, 10th percentile | met |\n|---|---|---|---:|---:|---|"
    );
    let variants: [Variant; 4] = [
        ("as shipped", |_| {}),
        ("uniform draws (no lean toward high scores)", |c| {
            c.uniform_share = 1.0
        }),
        ("40 thresholds instead of 200", |c| c.candidates = 40),
        (GROWTH_BETS, |c| c.bet_to_budget = false),
    ];
    let wide_precision: [Variant; 3] = [
        ("as shipped", |_| {}),
        (GROWTH_BETS, |c| c.bet_to_budget = false),
        (
            "no calibrated later rounds (a fixed lean toward the top)",
            |c| c.calibrate_when_common = false,
        ),
    ];
    let calibrated: [Variant; 2] = [
        ("as shipped", |_| {}),
        (
            "no calibrated later rounds when positives are common",
            |c| c.calibrate_when_common = false,
        ),
    ];
    let rare: [Variant; 2] = [
        ("as shipped", |_| {}),
        ("no lean toward low scores when positives are rare", |c| {
            c.lean_low_when_rare = false
        }),
    ];
    let runs = [
        (
            "A-shaped",
            n,
            prevalence,
            auc,
            budget,
            Metric::Recall,
            &variants[..],
        ),
        (
            "A-shaped",
            n,
            prevalence,
            auc,
            budget,
            Metric::Precision,
            &variants[..],
        ),
        (
            "A-shaped",
            B_WIDE,
            prevalence,
            auc,
            B_WIDE_BUDGET,
            Metric::Recall,
            &calibrated[..],
        ),
        (
            "B-shaped",
            B_WIDE,
            0.03,
            0.87,
            B_WIDE_BUDGET,
            Metric::Recall,
            &rare[..],
        ),
        (
            "A-shaped",
            B_WIDE,
            prevalence,
            auc,
            B_WIDE_BUDGET,
            Metric::Precision,
            &wide_precision[..],
        ),
        (
            "B-shaped",
            B_WIDE,
            0.03,
            0.87,
            B_WIDE_BUDGET,
            Metric::Precision,
            &wide_precision[..],
        ),
    ];
    for (population, n, prevalence, auc, budget, metric, variants) in runs {
        for &(name, change) in variants {
            let target = Target {
                metric,
                at_least: 0.9,
                delta: DELTA,
            };
            let (mut saved, mut met) = (Vec::new(), 0u64);
            let trials_run = by_seed(trials, |seed| {
                let (scores, truth) = cascade::synthetic_population(
                    seed,
                    n,
                    prevalence,
                    cascade::separation_for_auc(auc),
                );
                let keys: Vec<u64> = (0..n as u64).collect();
                let mut config = Config::new(target, budget, seed);
                change(&mut config);
                let o =
                    cascade::run(&config, &scores, &keys, &mut |i| truth.get(i).copied()).ok()?;
                Some((
                    o.proxy_decided as f64 / n as f64,
                    o.realized(&truth) >= target.at_least,
                ))
            });
            for (share, reached) in trials_run.into_iter().flatten() {
                saved.push(share);
                met += u64::from(reached);
            }
            let (m, p10) = quantiles(saved);
            let _ = writeln!(
                body,
                "| {population} | {} ≥ 0.9 | {name} | {:.1} % | {:.1} % | met in {:.1} % of {trials} trials |",
                metric.name(),
                100.0 * m,
                100.0 * p10,
                100.0 * met as f64 / trials.max(1) as f64,
            );
        }
    }
    let _ = writeln!(body);
}

/// The name of the rows whose bets grow the capital fastest.
const GROWTH_BETS: &str = "growth-rate bets (not sized to the budget)";

/// The B-shaped population's wide size, and its label budget.
const B_WIDE: usize = 100_000;
const B_WIDE_BUDGET: usize = 1000;

/// The name of the trained proxy's rows.
const TRAINED: &str = "trained (logistic over the embedding, cross-fitted)";

/// What a trained proxy's cascade spent beyond its outcome's own count.
struct Fit {
    /// Distinct labels of both halves.
    labels: usize,
    /// Distinct views labelled or left to the oracle.
    calls: usize,
    /// Positions whose view the training labelled.
    trained: std::collections::HashSet<usize>,
}

/// A cascade whose proxy is trained on half of `budget` (as a run does:
/// `fanfold_ops::proxy`), the rest setting its thresholds.
fn trained_run(
    target: Target,
    budget: usize,
    seed: u64,
    vectors: &[Vec<f32>],
    keys: &[u64],
    truth: &[bool],
) -> Result<(Outcome, Fit)> {
    use std::collections::HashSet;
    let training = proxy::training_draws(keys, proxy::training_budget(budget), seed);
    let (scores, _) = proxy::fit_on(vectors, keys, &training, |p| truth.get(p).copied())?;
    let config = Config::new(target, budget.saturating_sub(training.len()).max(1), seed);
    let outcome = cascade::run(&config, &scores, keys, &mut |i| truth.get(i).copied())?;
    let (labels, calls) = proxy::spent(keys, &training, &outcome);
    let trained_keys: HashSet<u64> = training
        .iter()
        .filter_map(|&p| keys.get(p).copied())
        .collect();
    let trained = (0..keys.len())
        .filter(|&p| keys.get(p).is_some_and(|k| trained_keys.contains(k)))
        .collect();
    Ok((
        outcome,
        Fit {
            labels,
            calls,
            trained,
        },
    ))
}

/// The trained proxy's guarantee on synthetic vectors: the same targets,
/// the proxy fitted on half the budget in every trial.
fn synthetic_trained(body: &mut String, trials: u64) {
    let _ = writeln!(
        body,
        "### A trained proxy on synthetic vectors\n\nThe same populations drawn as {DIMS}-dimensional vectors (unit normals whose class means lie {SEPARATION} apart), no score given: each trial fits the trained proxy (`fanfold_ops::proxy`, a logistic regression cross-fitted over five folds) on {} labels of a seeded sample, and the cascade sets its thresholds with the other {}. \"Labels\" counts the distinct units labelled by both halves.\n",
        proxy::training_budget(SYNTHETIC_BUDGET),
        SYNTHETIC_BUDGET - proxy::training_budget(SYNTHETIC_BUDGET),
    );
    let _ = writeln!(
        body,
        "| target | met | proven | labels | units the proxy decided | realized (mean) | proven lower bound (mean) |\n|---|---|---:|---:|---:|---:|---:|"
    );
    for (metric, at_least) in TARGETS {
        let mut tally = Tally::default();
        let mut failed = None;
        for seed in 0..trials {
            let (vectors, truth) = synthetic_vectors(seed);
            let keys: Vec<u64> = (0..vectors.len() as u64).collect();
            let target = Target {
                metric,
                at_least,
                delta: DELTA,
            };
            match trained_run(target, SYNTHETIC_BUDGET, seed, &vectors, &keys, &truth) {
                Ok((outcome, fit)) => tally.add_spent(&outcome, &truth, Some(&fit)),
                Err(e) => failed = Some(e),
            }
        }
        if let Some(e) = failed {
            let _ = writeln!(body, "| {} ≥ {at_least} | error: {e} ||||||", metric.name());
            continue;
        }
        let _ = writeln!(
            body,
            "| {} ≥ {at_least} | {}",
            metric.name(),
            tally.synthetic_cells()
        );
    }
    let _ = writeln!(body);
}

const EXAMPLE_BUDGETS: [usize; 3] = [50, 100, 200];
const EXAMPLE_TARGET: f64 = 0.9;

fn example(body: &mut String, example: &Path, seeds: u64) -> Result<()> {
    let pop = population(example)?;
    let positives = pop.truth.iter().filter(|&&y| y).count();
    let _ = writeln!(
        body,
        "### On `{}`, with its human labels as the oracle\n\nThe {} lines the example's prefilter keeps ({positives} of them alerts by loghub's labels, which stand in for a person here), a recall target of {EXAMPLE_TARGET} at δ = {DELTA}, {seeds} seeds per row. Labels are keyed by what the judge sees of a line (its view), as a run keys facts: lines with the same view share one label, the loghub label of the first of them asked, and every line is scored against its own loghub label. One micro-context per line makes {} calls (one per distinct view), before retries. \"Oracle calls\" are the labels plus the distinct views the cascade leaves to the oracle; the held-out columns score the answer on the lines whose view was never labelled.\n",
        example.display(),
        pop.ids.len(),
        pop.micro_calls,
    );
    let _ = writeln!(
        body,
        "| proxy | label budget | met | proven | labels | oracle calls | of micro's calls | held-out lines | held-out recall | held-out precision | held-out F1 | proven lower bound |\n|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    let trained = (TRAINED, Vec::new());
    for (name, scores) in pop.proxies.iter().chain([&trained]) {
        for budget in EXAMPLE_BUDGETS {
            let mut tally = Tally::default();
            for seed in 0..seeds {
                let target = Target {
                    metric: Metric::Recall,
                    at_least: EXAMPLE_TARGET,
                    delta: DELTA,
                };
                if *name == TRAINED {
                    let (outcome, fit) =
                        trained_run(target, budget, seed, &pop.vectors, &pop.keys, &pop.truth)?;
                    tally.add_spent(&outcome, &pop.truth, Some(&fit));
                    continue;
                }
                let config = Config::new(target, budget, seed);
                let outcome = cascade::run(&config, scores, &pop.keys, &mut |i| {
                    pop.truth.get(i).copied()
                })?;
                tally.add(&outcome, &pop.truth);
            }
            let calls = tally.mean(tally.oracle_calls);
            let _ = writeln!(
                body,
                "| {name} | {budget} | met in {:.0} % of {} seeds | {:.0} % | {:.0} | {calls:.0} | {:.0} % | {:.0} | {:.3} | {:.3} | {:.3} | {:.3} |",
                tally.met_pct(),
                tally.trials,
                100.0 * tally.proven as f64 / tally.trials.max(1) as f64,
                tally.mean(tally.labels),
                100.0 * calls / pop.micro_calls.max(1) as f64,
                tally.mean(tally.held_out),
                tally.mean(tally.held_out_recall),
                tally.mean(tally.held_out_precision),
                tally.mean(tally.held_out_f1),
                tally.mean(tally.lower_bound),
            );
        }
    }
    if let Some(note) = pop.note {
        let _ = writeln!(body, "\nThe example's own caveat: {note}");
    }
    let _ = writeln!(body);
    crate::classifier::section(body, seeds, example, &pop.vectors, &pop.keys, &pop.truth)?;
    Ok(())
}
