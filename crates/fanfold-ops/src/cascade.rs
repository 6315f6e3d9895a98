//! Cascades with a stated guarantee: a cheap proxy score decides the units
//! it is sure of, an oracle (a person, a labels file, a strong model)
//! decides the rest, and a declared quality target (recall, precision or
//! accuracy at least γ) holds with probability at least 1 − δ, however
//! badly the proxy is calibrated.
//!
//! How the guarantee is kept:
//! - Every label is drawn with replacement from one proposal over the
//!   units that mixes uniform mass with mass leaning where the plans can
//!   err (importance sampling by the proxy's rank). The draws that land in
//!   a plan's region (the units it drops, for recall; keeps, for
//!   precision; decides, for accuracy) are a sample from the proposal
//!   restricted to that region; weighted by `q(R) / (|R| q_i)`, an error
//!   indicator's mean is the region's error rate.
//! - Every bound is a betting confidence sequence (Waudby-Smith and
//!   Ramdas, "Estimating means of bounded random variables by betting",
//!   JRSS-B 2023): a capital process that is a nonnegative supermartingale
//!   under the null, so by Ville's inequality it holds at every sample
//!   size at once. Testing again as labels arrive, and stopping when the
//!   budget ends, costs nothing extra.
//! - Learn, then test. A first third of the budget orders the candidate
//!   plans, those its draws prove best first. Fresh draws then test them
//!   in that order, fixed before they are drawn, stopping at the first
//!   that is not proven, and the most aggressive proven plan is chosen.
//!   Fixed-sequence testing bounds the chance that any proven plan misses
//!   the target by δ whatever the order, so no union bound over the
//!   candidates is paid; only the fresh draws enter the proof.
//! - Draws are the arrivals of one Poisson process a unit, of rate its
//!   proposal probability, seeded by the unit's label key: an edit to one
//!   unit moves only that unit's draws, so a rerun asks again only for
//!   what changed.
//! - The safest plan, the oracle deciding every unit, needs no proof: it
//!   is what the cascade falls back to when nothing else is proven.
//! - A label the oracle could not give counts against every plan.
//!
//! Labels only ever correct the plan's decisions (a labelled unit is
//! decided by its label), which can only raise recall, precision and
//! accuracy, so the bound proven for the proxy's decisions holds for the
//! answer.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

/// The quality a cascade must reach.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    /// Of the units the oracle would call positive, the share the answer
    /// keeps.
    Recall,
    /// Of the units the answer calls positive, the share the oracle would.
    Precision,
    /// Of all units, the share decided as the oracle would.
    Accuracy,
}

impl Metric {
    pub fn name(self) -> &'static str {
        match self {
            Metric::Recall => "recall",
            Metric::Precision => "precision",
            Metric::Accuracy => "accuracy",
        }
    }
}

/// `metric ≥ at_least` with probability at least `1 − delta`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Target {
    pub metric: Metric,
    pub at_least: f64,
    pub delta: f64,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum CascadeError {
    #[error("at_least must be in (0, 1], got {0}")]
    AtLeast(f64),
    #[error("delta must be in (0, 1), got {0}")]
    Delta(f64),
    #[error("uniform_share must be in (0, 1], got {0}")]
    UniformShare(f64),
    #[error("unit {unit}'s proxy score is not a number")]
    Score { unit: usize },
    #[error("{scores} scores but {keys} label keys")]
    Lengths { scores: usize, keys: usize },
}

/// How a cascade samples and which plans it may choose from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Config {
    pub target: Target,
    /// The most distinct labels the oracle is asked for.
    pub label_budget: usize,
    pub seed: u64,
    /// How many thresholds are tried, at evenly spaced ranks of the score.
    pub candidates: usize,
    /// The proposal's uniform share: each unit is drawn with probability at
    /// least `uniform_share / N`, which bounds every weight by
    /// `1 / uniform_share`. 1 is uniform sampling.
    pub uniform_share: f64,
    /// The proxy's own decision boundary: a score at or above it is
    /// positive. Accuracy plans decide by it; recall and precision plans
    /// choose their own threshold.
    pub cut: f64,
}

impl Config {
    pub fn new(target: Target, label_budget: usize, seed: u64) -> Config {
        Config {
            target,
            label_budget,
            seed,
            candidates: 40,
            uniform_share: 0.5,
            cut: 0.5,
        }
    }

    fn check(&self) -> Result<(), CascadeError> {
        let t = self.target;
        if !(t.at_least > 0.0 && t.at_least <= 1.0) {
            return Err(CascadeError::AtLeast(t.at_least));
        }
        if !(t.delta > 0.0 && t.delta < 1.0) {
            return Err(CascadeError::Delta(t.delta));
        }
        if !(self.uniform_share > 0.0 && self.uniform_share <= 1.0) {
            return Err(CascadeError::UniformShare(self.uniform_share));
        }
        Ok(())
    }
}

/// The plan a cascade chose.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Plan {
    /// Nothing was proven of the proxy: the oracle decides every unit.
    OracleDecidesAll,
    /// The proxy decides every unit: positive at or above `threshold`.
    Threshold { threshold: f64 },
    /// The proxy decides units whose score is below `low` (negative) or at
    /// or above `high` (positive); the oracle decides the band between.
    Band { low: f64, high: f64 },
}

/// Who decides a unit, and what the decision is where it is known.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// The proxy is sure of the unit.
    Proxy { positive: bool },
    /// The oracle labelled the unit while the thresholds were set.
    Label { positive: bool },
    /// The oracle must decide the unit.
    Oracle,
}

/// What a cascade did and what it proved.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    pub target: Target,
    pub plan: Plan,
    /// One per unit, in the order of the scores.
    pub decisions: Vec<Decision>,
    /// Distinct labels the oracle was asked for while the thresholds were
    /// set (a label it could not give is counted: it was asked).
    pub labels: usize,
    /// Draws from the proposal (with replacement: a unit drawn again costs
    /// no new label).
    pub draws: usize,
    /// The metric's point estimate for the plan's proxy decisions, and its
    /// one-sided lower bound at `1 − delta`. For `OracleDecidesAll` both
    /// are 1: the oracle is the truth the target is measured against.
    pub estimate: f64,
    pub lower_bound: f64,
    /// Units the proxy decided.
    pub proxy_decided: usize,
    /// Units left to the oracle beyond the labels already given, and the
    /// calls that takes: one per distinct key among them.
    pub oracle_units: usize,
    pub oracle_needed: usize,
    /// Every label the sample could use was known: the plan was chosen on
    /// the exact population, not on a bound.
    pub exact: bool,
}

impl Outcome {
    /// Calls the oracle makes in all: labels plus the units left to it.
    pub fn oracle_calls(&self) -> usize {
        self.labels + self.oracle_needed
    }
}

/// Runs a cascade. `scores[i]` is unit `i`'s proxy score (higher: more
/// likely positive); `keys[i]` says which units share one label (the same
/// content asked the same question); `oracle` gives the label of a unit,
/// `None` where it cannot.
pub fn run(
    config: &Config,
    scores: &[f64],
    keys: &[u64],
    oracle: &mut dyn FnMut(usize) -> Option<bool>,
) -> Result<Outcome, CascadeError> {
    config.check()?;
    if scores.len() != keys.len() {
        return Err(CascadeError::Lengths {
            scores: scores.len(),
            keys: keys.len(),
        });
    }
    if let Some(unit) = scores.iter().position(|s| !s.is_finite()) {
        return Err(CascadeError::Score { unit });
    }
    if scores.is_empty() {
        let sampler = Sampler {
            config,
            scores,
            keys,
            labels: HashMap::new(),
            proposal: Proposal::new(config, scores),
            draws: 0,
            held: None,
        };
        return Ok(sampler.finish(&Candidate::All, Proof::exact(1.0)));
    }
    let candidates = candidates(config, scores);
    let distinct_keys = keys.iter().collect::<std::collections::HashSet<_>>().len();
    let mut sampler = Sampler {
        config,
        scores,
        keys,
        labels: HashMap::new(),
        proposal: Proposal::new(config, scores),
        draws: 0,
        held: None,
    };
    let mut arrivals = sampler.proposal.arrivals(config.seed, keys);
    // Learn, then test. The first part of the budget orders the plans:
    // those its draws support most strongly come first. Fresh draws then
    // test the plans in that order at δ, stopping at the first that is not
    // proven, and the most aggressive proven plan is chosen. Testing in an
    // order fixed before the proof's draws bounds the chance that any
    // proven plan misses the target by δ, whatever the order; only the
    // second part's draws enter the proof.
    let learn_budget = (config.label_budget / 3).max(config.label_budget.min(30));
    let learn = sampler.sample(&mut arrivals, oracle, learn_budget, distinct_keys);
    // How far the learning draws prove each plan, at δ: the plans they
    // prove best are the likeliest to pass again on fresh draws.
    let support = |k: usize| -> f64 {
        match candidates
            .get(k)
            .map(|c| sampler.test(c, &learn, config.target.delta))
        {
            Some(Verdict::Proven(p)) => p.lower_bound,
            Some(Verdict::Undecided { lower_bound }) => lower_bound,
            Some(Verdict::Refuted) | None => -1.0,
        }
    };
    let mut order: Vec<(f64, usize)> = (1..candidates.len()).map(|k| (support(k), k)).collect();
    // Best proven first; among equals, the safer plan first.
    order.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    let order: Vec<usize> = order.into_iter().map(|(_, k)| k).collect();
    let mut proof_draws: Vec<usize> = Vec::new();
    let mut look: usize = 16;
    let chosen = loop {
        let batch = look.saturating_sub(proof_draws.len()).max(1);
        let before = proof_draws.len();
        let more = sampler.sample_into(
            &mut arrivals,
            oracle,
            config.label_budget,
            distinct_keys,
            batch,
            &mut proof_draws,
        );
        look += look / 2;
        let finished = !more || proof_draws.len() == before;
        let (proven, stop) = sampler.walk(&candidates, &order, &proof_draws, config.target.delta);
        if finished || stop {
            break proven;
        }
    };
    let (k, proof) = chosen;
    let plan = candidates.get(k).unwrap_or(&Candidate::All);
    Ok(sampler.finish(plan, proof))
}

/// The units a cascade with this configuration may ask the oracle about,
/// first of each key, in the order it would ask. Its draws do not depend
/// on the labels, so an oracle best asked in bulk (a model's slots) can
/// label all of these first; the cascade asks for a prefix of them, at
/// most `label_budget` keys.
pub fn label_draws(config: &Config, scores: &[f64], keys: &[u64]) -> Vec<usize> {
    if scores.is_empty() || scores.len() != keys.len() {
        return Vec::new();
    }
    let proposal = Proposal::new(config, scores);
    let mut arrivals = proposal.arrivals(config.seed, keys);
    let distinct = keys.iter().collect::<std::collections::HashSet<_>>().len();
    let want = config.label_budget.min(distinct);
    // Both phases together never draw more than this.
    let most = config
        .label_budget
        .saturating_mul(50)
        .saturating_add(1000)
        .saturating_mul(2);
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for _ in 0..most {
        if seen.len() >= want {
            break;
        }
        let Some(unit) = arrivals.next() else {
            break;
        };
        if let Some(&key) = keys.get(unit)
            && seen.insert(key)
        {
            out.push(unit);
        }
    }
    out
}

/// What a passed test showed of a plan.
#[derive(Clone, Copy, Debug)]
struct Proof {
    estimate: f64,
    lower_bound: f64,
    exact: bool,
}

impl Proof {
    fn exact(value: f64) -> Proof {
        Proof {
            estimate: value,
            lower_bound: value,
            exact: true,
        }
    }
}

enum Verdict {
    Proven(Proof),
    /// The plan's errors are likely above what the target allows: more
    /// labels would be spent for nothing.
    Refuted,
    /// Not proven yet; what the draws prove of the metric so far.
    Undecided {
        lower_bound: f64,
    },
}

/// The distribution the labels are drawn from, over every unit.
struct Proposal {
    probabilities: Vec<f64>,
}

/// Draws with replacement from a proposal, as the superposition of one
/// Poisson process a unit, of rate its probability: the next arrival is
/// unit `i` with probability `q_i`, independently of the past. A unit's
/// arrival times depend only on its own rate and on its key, so an edit
/// to one unit moves that unit's draws and leaves the others' (a uniform
/// rescaling of every rate keeps their order): a rerun after an edit asks
/// for the labels it already has.
struct Arrivals {
    /// (arrival time as ordered bits, unit, arrivals so far).
    next: std::collections::BinaryHeap<std::cmp::Reverse<(u64, usize, u64)>>,
    rates: Vec<f64>,
    salts: Vec<u64>,
    seed: u64,
}

impl Arrivals {
    /// Unit `i`'s arrival after time `after`, its `k`-th.
    fn arrival(&self, i: usize, k: u64, after: f64) -> Option<(u64, usize, u64)> {
        let rate = *self.rates.get(i)?;
        if rate <= 0.0 {
            return None;
        }
        let salt = *self.salts.get(i)?;
        let mut h = SplitMix(
            self.seed
                ^ salt.wrapping_mul(0x9E37_79B9_7F4A_7C15)
                ^ k.wrapping_mul(0xD1B5_4A32_D192_ED03),
        );
        let u = 1.0 - h.unit();
        let t = after + (-u.ln()) / rate;
        // Nonnegative floats order as their bits.
        Some((t.to_bits(), i, k))
    }
}

impl Iterator for Arrivals {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        let std::cmp::Reverse((bits, i, k)) = self.next.pop()?;
        if let Some(a) = self.arrival(i, k + 1, f64::from_bits(bits)) {
            self.next.push(std::cmp::Reverse(a));
        }
        Some(i)
    }
}

impl Proposal {
    /// A mixture of uniform mass (`uniform_share`) and mass that leans
    /// where the plans can err: to high scores for precision (its plans
    /// keep the top), mildly to high scores for recall (the positives that
    /// bound it from below sit there), to the cut for accuracy.
    fn new(config: &Config, scores: &[f64]) -> Proposal {
        let n = scores.len();
        let mut order: Vec<(f64, usize)> = scores.iter().copied().zip(0..).collect();
        order.sort_by(|a, b| a.0.total_cmp(&b.0));
        let cut_rank = scores.iter().filter(|&&s| s < config.cut).count() as f64;
        let mut g = vec![0.0; n];
        for (rank, &(_, i)) in order.iter().enumerate() {
            let r = (rank as f64 + 0.5) / n as f64;
            let Some(slot) = g.get_mut(i) else { continue };
            *slot = match config.target.metric {
                Metric::Recall => r,
                Metric::Precision => r.powi(3),
                Metric::Accuracy => {
                    1.0 - ((rank as f64 + 0.5 - cut_rank).abs() / n as f64).min(1.0)
                }
            };
        }
        let total: f64 = g.iter().sum();
        let a = config.uniform_share;
        let mut probabilities = Vec::with_capacity(n);
        for gi in &g {
            let lean = if total > 0.0 {
                gi / total
            } else {
                1.0 / n as f64
            };
            let q = a / n as f64 + (1.0 - a) * lean;
            probabilities.push(q);
        }
        Proposal { probabilities }
    }

    /// The draws, seeded: a unit's arrivals are salted by its key (and
    /// its place among the units sharing that key).
    fn arrivals(&self, seed: u64, keys: &[u64]) -> Arrivals {
        let mut seen: HashMap<u64, u64> = HashMap::new();
        let salts = keys
            .iter()
            .map(|&k| {
                let n = seen.entry(k).or_insert(0);
                *n += 1;
                k ^ n.wrapping_mul(0xA24B_AED4_963E_E407)
            })
            .collect();
        let mut a = Arrivals {
            next: std::collections::BinaryHeap::new(),
            rates: self.probabilities.clone(),
            salts,
            seed: seed ^ 0x6361_7363_6164_6521,
        };
        let first: Vec<_> = (0..a.rates.len())
            .filter_map(|i| a.arrival(i, 0, 0.0))
            .map(std::cmp::Reverse)
            .collect();
        a.next = first.into();
        a
    }

    /// The draws that land in `region` are a sample from the proposal
    /// restricted to it. Weighted by `q(R) / (|R| q_i)`, an indicator's
    /// mean is its share of the region; scaled by the largest weight into
    /// [0, 1]. Returns the scaled values and that largest weight.
    fn within(
        &self,
        draws: &[usize],
        region: &[bool],
        mut indicator: impl FnMut(usize) -> bool,
    ) -> (Vec<f64>, f64) {
        let (mut mass, mut count, mut least) = (0.0, 0usize, f64::INFINITY);
        for (&q, &inside) in self.probabilities.iter().zip(region) {
            if inside {
                mass += q;
                count += 1;
                least = least.min(q);
            }
        }
        if count == 0 {
            return (Vec::new(), 1.0);
        }
        let xs = draws
            .iter()
            .filter(|&&i| region.get(i).copied().unwrap_or(false))
            .filter_map(|&i| {
                let q = *self.probabilities.get(i)?;
                Some(if indicator(i) { least / q } else { 0.0 })
            })
            .collect();
        (xs, mass / (count as f64 * least))
    }
}

/// The labels, the draws and the test of each plan.
struct Sampler<'a> {
    config: &'a Config,
    scores: &'a [f64],
    keys: &'a [u64],
    /// Asked labels by key; `None`: asked, not given.
    labels: HashMap<u64, Option<bool>>,
    proposal: Proposal,
    /// Draws so far, learning and proof together.
    draws: usize,
    /// A unit drawn when the learning budget ran out, taken first by the
    /// proof.
    held: Option<usize>,
}

/// How sure a test must be that a plan fails before the cascade stops
/// spending labels on it.
const GIVE_UP_DELTA: f64 = 0.2;

impl Sampler<'_> {
    fn score(&self, i: usize) -> f64 {
        self.scores.get(i).copied().unwrap_or(f64::NEG_INFINITY)
    }

    fn known(&self, i: usize) -> Option<Option<bool>> {
        self.keys.get(i).and_then(|k| self.labels.get(k)).copied()
    }

    /// Draws until `budget` labels are spent (or every key is known, or
    /// the draws stop costing anything), and returns the draws.
    fn sample(
        &mut self,
        arrivals: &mut Arrivals,
        oracle: &mut dyn FnMut(usize) -> Option<bool>,
        budget: usize,
        distinct_keys: usize,
    ) -> Vec<usize> {
        let mut draws = Vec::new();
        while self.sample_into(arrivals, oracle, budget, distinct_keys, 64, &mut draws) {}
        draws
    }

    /// Adds up to `count` draws to `draws`; false once a new label would
    /// pass `budget`, every key is known, or too many draws were free.
    fn sample_into(
        &mut self,
        arrivals: &mut Arrivals,
        oracle: &mut dyn FnMut(usize) -> Option<bool>,
        budget: usize,
        distinct_keys: usize,
        count: usize,
        draws: &mut Vec<usize>,
    ) -> bool {
        // Draws of units already labelled cost nothing; this only stops a
        // sampler whose every remaining draw would be free.
        let max_draws = budget.saturating_mul(50).saturating_add(1000);
        for _ in 0..count {
            if self.labels.len() >= distinct_keys || draws.len() >= max_draws {
                return false;
            }
            let Some(unit) = self.held.take().or_else(|| arrivals.next()) else {
                return false;
            };
            if self.known(unit).is_none() {
                if self.labels.len() >= budget {
                    // Kept for the next phase: the units considered are
                    // the generator's sequence, whatever the phases.
                    self.held = Some(unit);
                    return false;
                }
                let y = oracle(unit);
                if let Some(&key) = self.keys.get(unit) {
                    self.labels.insert(key, y);
                }
            }
            self.draws += 1;
            draws.push(unit);
        }
        true
    }

    /// Tests the plans in `order` on `draws` at `delta`, stopping at the
    /// first not proven, and returns the most aggressive proven (with its
    /// proof), and whether sampling should stop: every plan is proven, or
    /// the first unproven one is refuted.
    fn walk(
        &self,
        candidates: &[Candidate],
        order: &[usize],
        draws: &[usize],
        delta: f64,
    ) -> ((usize, Proof), bool) {
        // The safest plan needs no proof: the oracle is the truth.
        let mut proven = (0, Proof::exact(1.0));
        for &k in order {
            let Some(c) = candidates.get(k) else {
                continue;
            };
            match self.test(c, draws, delta) {
                Verdict::Proven(proof) => {
                    if k > proven.0 {
                        proven = (k, proof);
                    }
                }
                Verdict::Refuted => return (proven, true),
                Verdict::Undecided { .. } => return (proven, false),
            }
        }
        (proven, true)
    }

    /// One plan's test on the draws so far. Each test is a sequential test
    /// at δ, valid at every sample size; the plans are tested in a fixed
    /// order, so the chosen plan misses the target with probability at
    /// most δ whatever the tests share.
    fn test(&self, c: &Candidate, draws: &[usize], delta: f64) -> Verdict {
        let t = Target {
            delta,
            ..self.config.target
        };
        let n = self.scores.len();
        let proxy: Vec<Option<bool>> = self.scores.iter().map(|&s| c.proxy(s)).collect();
        // Where the plan can err: recall's dropped units, precision's kept
        // ones, accuracy's decided ones.
        let region: Vec<bool> = proxy
            .iter()
            .map(|p| match t.metric {
                Metric::Recall => *p == Some(false),
                Metric::Precision => *p == Some(true),
                Metric::Accuracy => p.is_some(),
            })
            .collect();
        // Recall is bounded by the positives the plan keeps.
        let kept: Vec<bool> = proxy.iter().map(|p| *p == Some(true)).collect();
        let size = region.iter().filter(|&&r| r).count();
        let kept_size = kept.iter().filter(|&&r| r).count();
        if let Some(verdict) = self.exact(c, &region, &kept) {
            return verdict;
        }
        let gamma = t.at_least;
        let label = |i: usize| self.known(i).flatten();
        let (errs, err_bound) = self.proposal.within(draws, &region, |i| {
            error(t.metric, c, self.score(i), label(i))
        });
        let (pos, pos_bound) = if t.metric == Metric::Recall {
            self.proposal
                .within(draws, &kept, |i| label(i) == Some(true))
        } else {
            (Vec::new(), 1.0)
        };
        let delta_e = match t.metric {
            Metric::Recall => t.delta / 2.0,
            _ => t.delta,
        };
        // The most errors the target allows, given the kept positives'
        // share (recall) or fixed (the others), as a share of the region.
        let allowed = |kept_share: f64| -> f64 {
            let count = match t.metric {
                // recall ≥ γ ⟺ FN ≤ (1 − γ) / γ · TP.
                Metric::Recall => (1.0 - gamma) / gamma * kept_share * kept_size as f64,
                // precision ≥ γ ⟺ FP ≤ (1 − γ) · |kept|.
                Metric::Precision => (1.0 - gamma) * size as f64,
                // accuracy ≥ γ ⟺ errors ≤ (1 − γ) · N.
                Metric::Accuracy => (1.0 - gamma) * n as f64,
            };
            count / size.max(1) as f64
        };
        let share = |xs: &[f64], bound: f64, low: bool, delta: f64| {
            let v = if low {
                lower_bound(xs, delta)
            } else {
                upper_bound(xs, delta)
            };
            (v * bound).min(1.0)
        };
        let kept_low = share(&pos, pos_bound, true, t.delta / 2.0);
        let limit = allowed(kept_low) / err_bound;
        let metric = |errors: f64, kept_share: f64| -> f64 {
            let v = match t.metric {
                Metric::Recall => {
                    let tp = kept_share * kept_size as f64;
                    if tp + errors > 0.0 {
                        tp / (tp + errors)
                    } else {
                        1.0
                    }
                }
                Metric::Precision => 1.0 - errors / size.max(1) as f64,
                Metric::Accuracy => 1.0 - errors / n as f64,
            };
            v.clamp(0.0, 1.0)
        };
        let err_high = || share(&errs, err_bound, false, delta_e) * size as f64;
        if limit > 0.0 && below(&errs, limit, delta_e) {
            let rate = |xs: &[f64]| xs.iter().sum::<f64>() / xs.len().max(1) as f64;
            let err_hat = (rate(&errs) * err_bound).min(1.0) * size as f64;
            let kept_hat = (rate(&pos) * pos_bound).min(1.0);
            return Verdict::Proven(Proof {
                estimate: metric(err_hat, kept_hat),
                lower_bound: metric(err_high(), kept_low),
                exact: false,
            });
        }
        let kept_high = share(&pos, pos_bound, false, GIVE_UP_DELTA);
        if above(&errs, allowed(kept_high) / err_bound, GIVE_UP_DELTA) {
            return Verdict::Refuted;
        }
        Verdict::Undecided {
            lower_bound: metric(err_high(), kept_low),
        }
    }

    /// A plan whose every unit that matters is labelled is judged on the
    /// labels themselves.
    fn exact(&self, c: &Candidate, region: &[bool], kept: &[bool]) -> Option<Verdict> {
        let t = self.config.target;
        let needs_kept = t.metric == Metric::Recall;
        let (mut errors, mut size, mut tp) = (0usize, 0usize, 0usize);
        for (i, ((&s, &inside), &keeps)) in self.scores.iter().zip(region).zip(kept).enumerate() {
            if inside {
                let y = self.known(i)?;
                size += 1;
                if error(t.metric, c, s, y) {
                    errors += 1;
                }
            }
            if needs_kept && keeps && self.known(i)? == Some(true) {
                tp += 1;
            }
        }
        let (errors, n) = (errors as f64, self.scores.len() as f64);
        let value = match t.metric {
            Metric::Recall => {
                let tp = tp as f64;
                if tp + errors == 0.0 {
                    1.0
                } else {
                    tp / (tp + errors)
                }
            }
            Metric::Precision if size == 0 => 1.0,
            Metric::Precision => 1.0 - errors / size as f64,
            Metric::Accuracy => 1.0 - errors / n,
        };
        Some(if value >= t.at_least {
            Verdict::Proven(Proof::exact(value))
        } else {
            Verdict::Refuted
        })
    }

    fn finish(&self, c: &Candidate, proof: Proof) -> Outcome {
        let mut decisions = Vec::with_capacity(self.scores.len());
        let (mut proxy_decided, mut oracle_units) = (0, 0);
        let mut oracle_keys = std::collections::HashSet::new();
        for (i, &s) in self.scores.iter().enumerate() {
            let d = match (self.known(i).flatten(), c.proxy(s)) {
                (Some(positive), _) => Decision::Label { positive },
                (None, Some(positive)) => {
                    proxy_decided += 1;
                    Decision::Proxy { positive }
                }
                (None, None) => {
                    oracle_units += 1;
                    if let Some(k) = self.keys.get(i) {
                        oracle_keys.insert(*k);
                    }
                    Decision::Oracle
                }
            };
            decisions.push(d);
        }
        Outcome {
            target: self.config.target,
            plan: c.plan(),
            decisions,
            labels: self.labels.len(),
            draws: self.draws,
            estimate: proof.estimate,
            lower_bound: proof.lower_bound,
            proxy_decided,
            oracle_units,
            oracle_needed: oracle_keys.len(),
            exact: proof.exact,
        }
    }
}

/// Quality against the truth, for the units of one answer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Quality {
    pub recall: f64,
    pub precision: f64,
    pub accuracy: f64,
    pub f1: f64,
}

impl Quality {
    pub fn of(&self, metric: Metric) -> f64 {
        match metric {
            Metric::Recall => self.recall,
            Metric::Precision => self.precision,
            Metric::Accuracy => self.accuracy,
        }
    }
}

impl Outcome {
    /// What the answer reaches against `truth`, over the units `include`
    /// admits: labelled units and the proxy's decided as they were,
    /// the oracle's decided as the truth. An answer with no positive has
    /// precision 1; a truth with none, recall 1.
    pub fn quality(&self, truth: &[bool], include: impl Fn(usize, &Decision) -> bool) -> Quality {
        let (mut tp, mut fp, mut fn_, mut right, mut n) = (0.0f64, 0.0f64, 0.0f64, 0.0f64, 0.0f64);
        for (i, (d, &y)) in self.decisions.iter().zip(truth).enumerate() {
            if !include(i, d) {
                continue;
            }
            let said = match *d {
                Decision::Proxy { positive } | Decision::Label { positive } => positive,
                Decision::Oracle => y,
            };
            match (said, y) {
                (true, true) => tp += 1.0,
                (true, false) => fp += 1.0,
                (false, true) => fn_ += 1.0,
                (false, false) => {}
            }
            if said == y {
                right += 1.0;
            }
            n += 1.0;
        }
        let recall = if tp + fn_ == 0.0 {
            1.0
        } else {
            tp / (tp + fn_)
        };
        let precision = if tp + fp == 0.0 { 1.0 } else { tp / (tp + fp) };
        let f1 = if recall + precision == 0.0 {
            0.0
        } else {
            2.0 * recall * precision / (recall + precision)
        };
        Quality {
            recall,
            precision,
            accuracy: if n == 0.0 { 1.0 } else { right / n },
            f1,
        }
    }

    /// The target's metric the whole answer reaches against `truth`.
    pub fn realized(&self, truth: &[bool]) -> f64 {
        self.quality(truth, |_, _| true).of(self.target.metric)
    }
}

/// A synthetic population with known truth, for measuring the guarantee:
/// `n` units, the first `prevalence` share positive, each scored by a
/// noisy proxy (the logistic of a unit normal whose mean is `separation`
/// apart between the classes). Seeded: the same arguments give the same
/// population.
pub fn synthetic_population(
    seed: u64,
    n: usize,
    prevalence: f64,
    separation: f64,
) -> (Vec<f64>, Vec<bool>) {
    let mut rng = SplitMix(seed);
    let mut normal = || {
        let (u, v) = (rng.unit().max(1e-12), rng.unit());
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    };
    let mut scores = Vec::with_capacity(n);
    let mut truth = Vec::with_capacity(n);
    for i in 0..n {
        let y = (i as f64) < prevalence * n as f64;
        let z = normal()
            + if y {
                separation / 2.0
            } else {
                -separation / 2.0
            };
        scores.push(1.0 / (1.0 + (-z).exp()));
        truth.push(y);
    }
    (scores, truth)
}

/// A plan under test: what the proxy decides of each score.
#[derive(Clone, Debug, PartialEq)]
enum Candidate {
    All,
    Threshold(f64),
    Band(f64, f64),
}

impl Candidate {
    /// The proxy's decision of a score, `None` where the oracle decides.
    fn proxy(&self, score: f64) -> Option<bool> {
        match *self {
            Candidate::All => None,
            Candidate::Threshold(t) => Some(score >= t),
            Candidate::Band(low, high) => {
                if score < low {
                    Some(false)
                } else if score >= high {
                    Some(true)
                } else {
                    None
                }
            }
        }
    }

    fn plan(&self) -> Plan {
        match *self {
            Candidate::All => Plan::OracleDecidesAll,
            Candidate::Threshold(threshold) => Plan::Threshold { threshold },
            Candidate::Band(low, high) => Plan::Band { low, high },
        }
    }
}

/// The nested plans, safest first. Recall: thresholds rising from the
/// lowest score (each drops more units as negative). Precision: thresholds
/// falling from the highest (each keeps more as positive). Accuracy: bands
/// around the cut narrowing in rank (each lets the proxy decide more).
fn candidates(config: &Config, scores: &[f64]) -> Vec<Candidate> {
    let mut sorted: Vec<f64> = scores.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    let k = config.candidates.max(2);
    let mut out = vec![Candidate::All];
    let at = |i: usize| sorted.get(i).copied().unwrap_or(f64::INFINITY);
    let lowest = at(0);
    match config.target.metric {
        Metric::Recall => {
            let mut last = f64::NEG_INFINITY;
            for step in 1..k {
                let t = at(step * n / k);
                if t > last && t > lowest {
                    out.push(Candidate::Threshold(t));
                    last = t;
                }
            }
        }
        Metric::Precision => {
            let mut last = f64::INFINITY;
            for step in 1..k {
                let t = at(n.saturating_sub(1 + step * n / k));
                // At the lowest score every unit is positive: no filter.
                if t < last && t > lowest {
                    out.push(Candidate::Threshold(t));
                    last = t;
                }
            }
        }
        Metric::Accuracy => {
            // The cut splits the sorted scores; a band leaves the units
            // nearest it on each side to the oracle, fewer at each step.
            let cut = config.cut;
            let below = sorted.partition_point(|&s| s < cut);
            let above = n - below;
            let mut last = None;
            for step in (0..k).rev() {
                let (keep_below, keep_above) = (below * step / k, above * step / k);
                let low = if keep_below == 0 {
                    cut
                } else {
                    at(below - keep_below)
                };
                let high = if keep_above == 0 {
                    cut
                } else {
                    at(below + keep_above)
                };
                if last != Some((low, high)) {
                    out.push(Candidate::Band(low, high));
                    last = Some((low, high));
                }
            }
        }
    }
    out
}

/// Whether unit `i`, with label `y` (`None`: the oracle could not say),
/// counts as an error of candidate `c`: a missed positive (recall), a
/// wrong positive (precision) or any wrong decision (accuracy).
fn error(metric: Metric, c: &Candidate, score: f64, y: Option<bool>) -> bool {
    let Some(proxy) = c.proxy(score) else {
        return false;
    };
    match (metric, y) {
        (Metric::Recall, Some(y)) => y && !proxy,
        (Metric::Recall, None) => !proxy,
        (Metric::Precision, Some(y)) => !y && proxy,
        (Metric::Precision, None) => proxy,
        (Metric::Accuracy, Some(y)) => y != proxy,
        (Metric::Accuracy, None) => true,
    }
}

/// The largest bet a capital process places on one draw. Below 1, so the
/// capital stays positive for every candidate mean, and independent of the
/// mean, so the capital is monotone in it and one evaluation answers
/// "is the mean below m?".
const MAX_BET: f64 = 0.75;

/// Predictable plug-in bets (Waudby-Smith and Ramdas, eq. 26): each uses
/// only the draws before it.
fn bets(xs: &[f64], delta: f64) -> Vec<f64> {
    let log_inv = (1.0 / delta).ln();
    let (mut mean_acc, mut var_acc) = (0.5, 0.25);
    let mut out = Vec::with_capacity(xs.len());
    for (j, &x) in xs.iter().enumerate() {
        let t = (j + 1) as f64;
        let var = var_acc / t;
        let lambda = (2.0 * log_inv / (var * t * (1.0 + t).ln())).sqrt();
        out.push(lambda.min(MAX_BET));
        let mean = mean_acc / t;
        var_acc += (x - mean) * (x - mean);
        mean_acc += x;
    }
    out
}

/// Whether the capital that bets `gain(x)` on each draw `x` (with
/// predictable plug-in stakes) passes `1 / delta` at some sample size.
fn ruined(xs: &[f64], delta: f64, gain: impl Fn(f64) -> f64) -> bool {
    let goal = (1.0 / delta).ln();
    let mut log_capital = 0.0;
    for (&x, &lambda) in xs.iter().zip(&bets(xs, delta)) {
        log_capital += (1.0 + lambda * gain(x)).ln();
        if log_capital >= goal {
            return true;
        }
    }
    false
}

/// Whether the draws prove, at level `delta`, that their mean is below
/// `m`: the capital betting that the mean is at least `m` is ruined.
fn below(xs: &[f64], m: f64, delta: f64) -> bool {
    ruined(xs, delta, |x| m - x)
}

/// Whether the draws prove, at level `delta`, that their mean is above `m`.
fn above(xs: &[f64], m: f64, delta: f64) -> bool {
    ruined(xs, delta, |x| x - m)
}

/// The smallest mean the draws cannot rule out as too high: every mean at
/// or above it is proven too high (by bisection; the test is monotone).
pub fn upper_bound(xs: &[f64], delta: f64) -> f64 {
    let (mut lo, mut hi) = (0.0, 1.0);
    if xs.is_empty() {
        return 1.0;
    }
    for _ in 0..40 {
        let mid = 0.5 * (lo + hi);
        if below(xs, mid, delta) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    hi
}

/// The lower bound, by the same reasoning.
pub fn lower_bound(xs: &[f64], delta: f64) -> f64 {
    let (mut lo, mut hi) = (0.0, 1.0);
    if xs.is_empty() {
        return 0.0;
    }
    for _ in 0..40 {
        let mid = 0.5 * (lo + hi);
        if above(xs, mid, delta) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo
}

/// SplitMix64: a small seeded generator, so a cascade's sample depends on
/// its seed and nothing else.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trial(metric: Metric, at_least: f64, seed: u64, budget: usize) -> (Outcome, f64) {
        let (scores, truth) = synthetic_population(seed, 2000, 0.2, 2.5);
        let keys: Vec<u64> = (0..scores.len() as u64).collect();
        let target = Target {
            metric,
            at_least,
            delta: 0.1,
        };
        let config = Config {
            cut: 0.5,
            ..Config::new(target, budget, seed)
        };
        let outcome = run(&config, &scores, &keys, &mut |i| Some(truth[i])).expect("valid config");
        let r = outcome.realized(&truth);
        (outcome, r)
    }

    #[test]
    fn the_target_holds_in_at_least_one_minus_delta_of_trials() {
        for (metric, at_least) in [
            (Metric::Recall, 0.9),
            (Metric::Precision, 0.8),
            (Metric::Accuracy, 0.9),
        ] {
            let trials = 200;
            let mut met = 0;
            let mut proxy_decided = 0;
            for seed in 0..trials {
                let (outcome, r) = trial(metric, at_least, seed, 800);
                if r >= at_least {
                    met += 1;
                }
                proxy_decided += outcome.proxy_decided;
            }
            assert!(
                met as f64 >= 0.9 * trials as f64,
                "{metric:?} ≥ {at_least}: met in {met} of {trials} trials"
            );
            // A guarantee bought by never trusting the proxy proves
            // nothing: on this separable population the proxy decides
            // most of the units the labels leave.
            assert!(
                proxy_decided > trials as usize * 800,
                "{metric:?}: the proxy decided only {proxy_decided} units over {trials} trials"
            );
        }
    }

    #[test]
    fn the_oracle_is_asked_only_about_units_drawn_in_advance() {
        let (scores, truth) = synthetic_population(9, 2000, 0.2, 2.5);
        let keys: Vec<u64> = (0..scores.len() as u64).map(|k| k % 700).collect();
        let target = Target {
            metric: Metric::Recall,
            at_least: 0.9,
            delta: 0.1,
        };
        let config = Config::new(target, 300, 9);
        let drawn: std::collections::HashSet<usize> =
            label_draws(&config, &scores, &keys).into_iter().collect();
        assert!(drawn.len() <= 300);
        let mut asked = Vec::new();
        let outcome = run(&config, &scores, &keys, &mut |i| {
            asked.push(i);
            Some(truth[i])
        })
        .expect("runs");
        assert_eq!(outcome.labels, asked.len());
        assert!(!asked.is_empty());
        for i in asked {
            assert!(
                drawn.contains(&i),
                "unit {i} was asked but not drawn in advance"
            );
        }
    }

    #[test]
    fn an_edit_to_one_unit_moves_only_that_units_draws() {
        let (scores, _) = synthetic_population(4, 2000, 0.2, 2.5);
        let keys: Vec<u64> = (0..scores.len() as u64).map(|k| k * 7919).collect();
        let target = Target {
            metric: Metric::Recall,
            at_least: 0.9,
            delta: 0.1,
        };
        let config = Config::new(target, 300, 4);
        let before: std::collections::HashSet<u64> = label_draws(&config, &scores, &keys)
            .into_iter()
            .map(|i| keys[i])
            .collect();
        // Unit 5 is edited: new content (a new key) and a new score.
        let (mut scores2, mut keys2) = (scores.clone(), keys.clone());
        scores2[5] = 1.0 - scores[5];
        keys2[5] = 42;
        let after: std::collections::HashSet<u64> = label_draws(&config, &scores2, &keys2)
            .into_iter()
            .map(|i| keys2[i])
            .collect();
        // At most the edited unit, and one unit that takes its place in
        // the budget if the edit moved it out of the sample.
        let asked_again: Vec<&u64> = after.difference(&before).collect();
        assert!(
            asked_again.iter().filter(|&&&k| k != 42).count() <= 1,
            "an edit to one unit asks for {asked_again:?}"
        );
    }

    #[test]
    fn a_budget_too_small_leaves_every_undecided_unit_to_the_oracle() {
        let (outcome, r) = trial(Metric::Recall, 0.99, 3, 10);
        assert_eq!(outcome.plan, Plan::OracleDecidesAll);
        assert_eq!(outcome.labels, 10);
        assert_eq!(outcome.proxy_decided, 0);
        assert_eq!(outcome.oracle_needed, 2000 - 10);
        assert_eq!(r, 1.0);
    }

    #[test]
    fn missing_labels_count_against_the_proxy() {
        let (scores, truth) = synthetic_population(5, 2000, 0.2, 2.5);
        let keys: Vec<u64> = (0..scores.len() as u64).collect();
        let target = Target {
            metric: Metric::Accuracy,
            at_least: 0.9,
            delta: 0.1,
        };
        let config = Config::new(target, 400, 5);
        let all = run(&config, &scores, &keys, &mut |i| Some(truth[i])).expect("runs");
        // The oracle gives no label for half of what it is asked.
        let mut asked = 0;
        let half = run(&config, &scores, &keys, &mut |i| {
            asked += 1;
            (asked % 2 == 0).then_some(truth[i])
        })
        .expect("runs");
        assert!(
            half.proxy_decided < all.proxy_decided,
            "{} vs {}",
            half.proxy_decided,
            all.proxy_decided
        );
    }

    #[test]
    fn shared_keys_cost_one_label_and_full_knowledge_is_exact() {
        // 300 units of 3 contents: three labels tell everything.
        let scores: Vec<f64> = (0..300).map(|i| (i % 3) as f64 / 2.0).collect();
        let keys: Vec<u64> = (0..300).map(|i| (i % 3) as u64).collect();
        let truth = |i: usize| i % 3 == 2;
        let target = Target {
            metric: Metric::Recall,
            at_least: 0.9,
            delta: 0.1,
        };
        let mut calls = 0;
        let outcome = run(&Config::new(target, 50, 1), &scores, &keys, &mut |i| {
            calls += 1;
            Some(truth(i))
        })
        .expect("runs");
        assert_eq!(calls, 3);
        assert_eq!(outcome.labels, 3);
        assert!(outcome.exact);
        assert_eq!(outcome.plan, Plan::Threshold { threshold: 1.0 });
        assert_eq!(outcome.lower_bound, 1.0);
    }

    #[test]
    fn bounds_cover_the_mean_and_tighten_with_draws() {
        let mut rng = SplitMix(11);
        let (mut covered_up, mut covered_low) = (0, 0);
        for _ in 0..300 {
            let xs: Vec<f64> = (0..200).map(|_| f64::from(rng.unit() < 0.3)).collect();
            if upper_bound(&xs, 0.05) >= 0.3 {
                covered_up += 1;
            }
            if lower_bound(&xs, 0.05) <= 0.3 {
                covered_low += 1;
            }
        }
        assert!(covered_up >= 285, "upper bound covered {covered_up} of 300");
        assert!(
            covered_low >= 285,
            "lower bound covered {covered_low} of 300"
        );
        let zeros = vec![0.0; 400];
        assert!(
            upper_bound(&zeros, 0.05) < 0.02,
            "{}",
            upper_bound(&zeros, 0.05)
        );
        assert!(upper_bound(&zeros[..50], 0.05) > upper_bound(&zeros, 0.05));
    }

    #[test]
    fn a_bad_target_or_score_is_refused() {
        let t = |at_least, delta| {
            Config::new(
                Target {
                    metric: Metric::Recall,
                    at_least,
                    delta,
                },
                10,
                1,
            )
        };
        let mut oracle = |_| Some(true);
        assert_eq!(
            run(&t(1.5, 0.1), &[0.5], &[0], &mut oracle),
            Err(CascadeError::AtLeast(1.5))
        );
        assert_eq!(
            run(&t(0.9, 0.0), &[0.5], &[0], &mut oracle),
            Err(CascadeError::Delta(0.0))
        );
        assert_eq!(
            run(&t(0.9, 0.1), &[0.5, f64::NAN], &[0, 1], &mut oracle),
            Err(CascadeError::Score { unit: 1 })
        );
    }
}
