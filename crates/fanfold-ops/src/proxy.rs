//! The trained proxy: a logistic regression over each unit's embedding,
//! fitted on the labels a cascade has gathered, and cross-fitted: units
//! fall into folds by their label key, and a fold is scored by the model
//! fitted on every other fold's labels. So no label scores its own unit,
//! nor a unit that shows the same thing (they share a key, so a fold).
//!
//! The classifier is `linfa-logistic`: maintained, pure Rust (no BLAS to
//! install), L2-regularised, fitted by L-BFGS; a cascade's few hundred
//! labels over 384 dimensions fit in milliseconds.
//!
//! The fit's labels may be chosen actively ([`next_round`],
//! [`active_draws`]): a seeded first round at random, then rounds of the
//! units a model fitted on the labels so far is least sure of (nearest its
//! decision boundary), refitted after each. The choice depends only on the
//! seed, the keys, the vectors and the labels given, so a rerun asks for
//! the same labels. A cascade's proof draws its own labels from its own
//! proposal (`cascade::run`): a unit labelled for the fit enters the proof
//! only when the proof draws it, so the scores never depend on the proof's
//! draws and the guarantee is untouched. Choosing by the vectors, not by
//! the labels, also keeps the logistic regression's estimate of a unit's
//! chance of being positive consistent, so its cut ([`CUT`]) can decide.
//!
//! A run's trained proxy fits actively unless its cascade says `fit =
//! "random"` (one seeded sample, [`training_draws`]); its report says
//! which, and how many labels each round asked ([`TrainedReport::rounds`]).

use fanfold_core::spec::ProxyFit;
use linfa::prelude::*;
use linfa_logistic::LogisticRegression;
use ndarray::{Array1, Array2};
use serde::{Deserialize, Serialize};

/// Folds the units are split into.
pub const FOLDS: u64 = 5;

/// The L2 penalty: the labels are few and the dimensions many, so the
/// weights are held small.
const PENALTY: f64 = 1.0;

const MAX_ITERATIONS: u64 = 200;

#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("unit {0} has no vector")]
    Missing(usize),
    #[error("vectors of {0} and {1} dimensions cannot be fitted together")]
    Dimensions(usize, usize),
}

/// What the fit did, for the cascade's report.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TrainedReport {
    /// Labels the classifier was fitted on (positive or negative).
    pub labels: usize,
    pub positives: usize,
    /// Folds with a model of their own; the others (a fold whose training
    /// labels hold one class only) score every unit with the training
    /// share of positives.
    pub folds_fitted: u64,
    /// The area under the ROC curve of the cross-fitted scores over the
    /// labelled units: how well the proxy orders what it never saw. `None`
    /// when the labels hold one class only.
    pub auc: Option<f64>,
    /// How the labels were chosen (the cascade's `fit`), where the caller
    /// says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fit: Option<ProxyFit>,
    /// Labels asked in each round, in the order asked: one round for a
    /// random fit; an active fit's first round is its random one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rounds: Vec<usize>,
}

/// The fold of a unit with label key `key`.
pub fn fold_of(key: u64) -> u64 {
    mix(key) % FOLDS
}

/// SplitMix64's finaliser: keys are hash prefixes already, but a cascade's
/// draws are seeded on them, so folds and training ranks mix them again.
fn mix(key: u64) -> u64 {
    let mut z = key.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Labels a trained proxy is fitted on, of a cascade's `budget`: half;
/// the other half sets its thresholds.
pub fn training_budget(budget: usize) -> usize {
    (budget / 2).max(1)
}

/// Fits the proxy on the oracle's labels of the `training` positions (a
/// position the oracle cannot label is left out) and scores every unit.
pub fn fit_on(
    vectors: &[Vec<f32>],
    keys: &[u64],
    training: &[usize],
    mut label: impl FnMut(usize) -> Option<bool>,
) -> Result<(Vec<f64>, TrainedReport), ProxyError> {
    let labelled: Vec<(usize, bool)> = training
        .iter()
        .filter_map(|&p| Some((p, label(p)?)))
        .collect();
    cross_fit(vectors, keys, &labelled)
}

/// What a cascade with a trained proxy spent, given its `training`
/// positions and the `outcome` of the cascade run on the trained scores:
/// the distinct labels of the training and the threshold draws, and the
/// distinct views asked of the oracle (those labels and the units left
/// to it).
pub fn spent(
    keys: &[u64],
    training: &[usize],
    outcome: &crate::cascade::Outcome,
) -> (usize, usize) {
    let draws = &outcome.asked;
    let left: Vec<usize> = outcome
        .decisions
        .iter()
        .enumerate()
        .filter(|(_, d)| matches!(d, crate::cascade::Decision::Oracle))
        .map(|(p, _)| p)
        .collect();
    distinct_asked(keys, training, draws, &left)
}

/// The distinct labels of `training` and `draws`, and the distinct views
/// asked of the oracle with `left` added: a view labelled once is never
/// asked again.
fn distinct_asked(
    keys: &[u64],
    training: &[usize],
    draws: &[usize],
    left: &[usize],
) -> (usize, usize) {
    let key = |p: &usize| keys.get(*p).copied();
    let mut asked: std::collections::HashSet<u64> =
        training.iter().chain(draws).filter_map(key).collect();
    let labels = asked.len();
    asked.extend(left.iter().filter_map(key));
    (labels, asked.len())
}

/// A synthetic population for the bench: `n` units, the first
/// `prevalence` of them positive, each a `dims`-dimensional vector of unit
/// normals whose class means lie `separation` apart (split evenly over the
/// dimensions), seeded.
pub fn synthetic_vectors(
    seed: u64,
    n: usize,
    prevalence: f64,
    dims: usize,
    separation: f64,
) -> (Vec<Vec<f32>>, Vec<bool>) {
    let shift = separation / 2.0 / (dims.max(1) as f64).sqrt();
    let mut state = mix(seed ^ 0x7379_6e74_6865_7469);
    let mut unit = || {
        state = mix(state);
        ((state >> 11) as f64 / (1u64 << 53) as f64).max(1e-12)
    };
    let mut vectors = Vec::with_capacity(n);
    let mut truth = Vec::with_capacity(n);
    for i in 0..n {
        let y = (i as f64) < prevalence * n as f64;
        let v = (0..dims)
            .map(|_| {
                let (u, w) = (unit(), unit());
                let z = (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * w).cos();
                (z + if y { shift } else { -shift }) as f32
            })
            .collect();
        vectors.push(v);
        truth.push(y);
    }
    (vectors, truth)
}

/// The positions to label first for training: one per distinct key, the
/// `n` keys of smallest seeded rank, in rank order.
pub fn training_draws(keys: &[u64], n: usize, seed: u64) -> Vec<usize> {
    let mut ranked = seeded_order(keys, seed);
    ranked.truncate(n);
    ranked
}

/// The first position of every distinct key, in the seeded order of the
/// keys: the order random training labels are asked in.
fn seeded_order(keys: &[u64], seed: u64) -> Vec<usize> {
    let mut first: std::collections::HashMap<u64, usize> = std::collections::HashMap::new();
    for (p, &k) in keys.iter().enumerate() {
        first.entry(k).or_insert(p);
    }
    let mut ranked: Vec<(u64, usize)> = first
        .into_iter()
        .map(|(k, p)| (mix(k ^ mix(seed ^ 0x7472_6169_6e65_6421)), p))
        .collect();
    ranked.sort_unstable();
    ranked.into_iter().map(|(_, p)| p).collect()
}

/// The trained proxy's own decision boundary: its scores are chances of a
/// positive, so a unit scored at or above a half is more likely positive
/// than not. An accuracy plan decides by it (`cascade::Config::cut`).
pub const CUT: f64 = 0.5;

/// Rounds after the first of an active fit: each is a batch the oracle
/// answers before the model is refitted, so few and large suit a backend
/// judging in slots and a person labelling between runs.
const ACTIVE_ROUNDS: usize = 3;

/// How an active fit spreads its labels over rounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rounds {
    /// Labels of the fit in all: distinct keys.
    pub labels: usize,
    /// Labels of the first round, seeded at random: no model exists yet.
    pub first: usize,
    /// Labels of each later round.
    pub each: usize,
    /// Of each later round's labels, how many go on in seeded order
    /// rather than nearest the boundary: a model of few labels can be
    /// sure and wrong about a region none of them lies in, and only
    /// labels drawn at random find it.
    pub explore: usize,
}

impl Rounds {
    /// `labels` spread as two fifths at random (enough that both classes
    /// are seen and a first model is fitted, most of the time), then the
    /// rest in three rounds nearest the boundary.
    pub fn of(labels: usize) -> Rounds {
        let first = (labels * 2).div_ceil(5).min(labels);
        let rest = labels - first;
        Rounds {
            labels,
            first,
            each: rest.div_ceil(ACTIVE_ROUNDS).max(1),
            explore: 0,
        }
    }
}

/// The next round of positions to label for an active fit, given the
/// positions `chosen` by every earlier round (in order) and `label`, their
/// labels (`None`: the oracle could not give one; it is left out of the
/// fit but was asked). The first round is the seeded random one
/// ([`training_draws`]); each later round is the `rounds.explore` next
/// keys in seeded order, then the keys not yet chosen whose unit a model
/// fitted on the labels so far scores nearest [`CUT`], ties in seeded
/// order, `rounds.each` in all. While the labels hold one class
/// no model can be fitted, and the round goes on in seeded order. Empty
/// once `rounds.labels` keys are chosen or every key is.
///
/// A caller whose oracle answers in batches (a backend's slots, a person
/// between runs) labels each round before asking for the next; the fit
/// itself is then [`fit_on`] over every round's positions.
pub fn next_round(
    vectors: &[Vec<f32>],
    keys: &[u64],
    rounds: Rounds,
    seed: u64,
    chosen: &[usize],
    mut label: impl FnMut(usize) -> Option<bool>,
) -> Result<Vec<usize>, ProxyError> {
    check(vectors, Some(keys), chosen.iter().copied())?;
    let chosen_keys: std::collections::HashSet<u64> = chosen
        .iter()
        .filter_map(|&p| keys.get(p).copied())
        .collect();
    let left = rounds.labels.saturating_sub(chosen_keys.len());
    if left == 0 {
        return Ok(Vec::new());
    }
    let fresh = seeded_order(keys, seed)
        .into_iter()
        .filter(|&p| keys.get(p).is_some_and(|k| !chosen_keys.contains(k)));
    if chosen.is_empty() {
        return Ok(fresh.take(rounds.first.min(left)).collect());
    }
    let want = rounds.each.min(left);
    let labelled: Vec<(usize, bool)> = chosen
        .iter()
        .filter_map(|&p| Some((p, label(p)?)))
        .collect();
    let Some(scores) = fit_all(vectors, &labelled)? else {
        return Ok(fresh.take(want).collect());
    };
    let mut fresh = fresh.peekable();
    let mut round: Vec<usize> = fresh.by_ref().take(rounds.explore.min(want)).collect();
    round.extend(nearest_cut(&scores, fresh, want - round.len()));
    Ok(round)
}

/// The `n` of `positions` (in seeded order) whose score is nearest
/// [`CUT`]; a stable sort keeps the seeded order among ties.
fn nearest_cut(scores: &[f64], positions: impl Iterator<Item = usize>, n: usize) -> Vec<usize> {
    let distance = |p: usize| scores.get(p).map_or(f64::INFINITY, |s| (s - CUT).abs());
    let mut by_distance: Vec<(f64, usize)> = positions.map(|p| (distance(p), p)).collect();
    by_distance.sort_by(|a, b| a.0.total_cmp(&b.0));
    by_distance.into_iter().take(n).map(|(_, p)| p).collect()
}

/// Every round of an active fit, for an oracle that answers at once (a
/// labels file, a bench's truth): the positions chosen, in the order they
/// were asked. `label` is asked once a position.
pub fn active_draws(
    vectors: &[Vec<f32>],
    keys: &[u64],
    rounds: Rounds,
    seed: u64,
    label: impl FnMut(usize) -> Option<bool>,
) -> Result<Vec<usize>, ProxyError> {
    Ok(active_rounds(vectors, keys, rounds, seed, label)?
        .into_iter()
        .flatten()
        .collect())
}

/// [`active_draws`] round by round: each round's positions, in the order
/// asked, so a caller can say how many labels each round took.
pub fn active_rounds(
    vectors: &[Vec<f32>],
    keys: &[u64],
    rounds: Rounds,
    seed: u64,
    mut label: impl FnMut(usize) -> Option<bool>,
) -> Result<Vec<Vec<usize>>, ProxyError> {
    let mut known: std::collections::HashMap<usize, Option<bool>> =
        std::collections::HashMap::new();
    let mut chosen = Vec::new();
    let mut asked = Vec::new();
    loop {
        let round = next_round(vectors, keys, rounds, seed, &chosen, |p| {
            *known.entry(p).or_insert_with(|| label(p))
        })?;
        if round.is_empty() {
            return Ok(asked);
        }
        chosen.extend(round.iter().copied());
        asked.push(round);
    }
}

/// One model fitted on every label in `labelled`, scoring every unit: what
/// an active round chooses by, and a plain classifier's scores. Not
/// cross-fitted: a labelled unit's own score is its training fit. `None`
/// while the labels hold one class (or none), or the fit fails.
pub fn fit_all(
    vectors: &[Vec<f32>],
    labelled: &[(usize, bool)],
) -> Result<Option<Vec<f64>>, ProxyError> {
    let dims = check(vectors, None, labelled.iter().map(|&(p, _)| p))?;
    let positives = labelled.iter().filter(|(_, y)| *y).count();
    if positives == 0 || positives == labelled.len() {
        return Ok(None);
    }
    let Some(model) = fit(vectors, labelled, dims) else {
        return Ok(None);
    };
    Ok(Some(model.predict(&matrix(
        vectors,
        0..vectors.len(),
        dims,
    ))))
}

/// The vectors' common dimension, refusing vectors of two and a position
/// past the vectors (or past `keys`, where given).
fn check(
    vectors: &[Vec<f32>],
    keys: Option<&[u64]>,
    positions: impl Iterator<Item = usize>,
) -> Result<usize, ProxyError> {
    let dims = vectors.first().map_or(0, Vec::len);
    if let Some(v) = vectors.iter().find(|v| v.len() != dims) {
        return Err(ProxyError::Dimensions(dims, v.len()));
    }
    for p in positions {
        if p >= vectors.len() || keys.is_some_and(|k| p >= k.len()) {
            return Err(ProxyError::Missing(p));
        }
    }
    Ok(dims)
}

/// Every unit's cross-fitted probability of being positive. `vectors[p]`
/// is unit `p`'s embedding, `keys[p]` its label key, and `labelled` the
/// labels known: (position, positive).
pub fn cross_fit(
    vectors: &[Vec<f32>],
    keys: &[u64],
    labelled: &[(usize, bool)],
) -> Result<(Vec<f64>, TrainedReport), ProxyError> {
    let dims = check(vectors, Some(keys), labelled.iter().map(|&(p, _)| p))?;
    let fold = |p: usize| keys.get(p).map_or(0, |&k| fold_of(k));
    let mut scores = vec![0.5; vectors.len()];
    let mut report = TrainedReport {
        labels: labelled.len(),
        positives: labelled.iter().filter(|(_, y)| *y).count(),
        ..TrainedReport::default()
    };
    for k in 0..FOLDS {
        let train: Vec<(usize, bool)> = labelled
            .iter()
            .copied()
            .filter(|&(p, _)| fold(p) != k)
            .collect();
        let scored: Vec<usize> = (0..vectors.len()).filter(|&p| fold(p) == k).collect();
        if scored.is_empty() {
            continue;
        }
        let positives = train.iter().filter(|(_, y)| *y).count();
        let fitted = match positives {
            0 => None,
            n if n == train.len() => None,
            _ => fit(vectors, &train, dims),
        };
        match fitted {
            Some(model) => {
                report.folds_fitted += 1;
                let x = matrix(vectors, scored.iter().copied(), dims);
                for (&p, s) in scored.iter().zip(model.predict(&x)) {
                    if let Some(slot) = scores.get_mut(p) {
                        *slot = s;
                    }
                }
            }
            None => {
                // One class, or none: the share of positives is all the
                // training labels say.
                let prior = match train.len() {
                    0 => 0.5,
                    n => positives as f64 / n as f64,
                };
                for p in scored {
                    if let Some(slot) = scores.get_mut(p) {
                        *slot = prior;
                    }
                }
            }
        }
    }
    report.auc = auc(labelled
        .iter()
        .map(|&(p, y)| (scores.get(p).copied().unwrap_or(0.5), y)));
    Ok((scores, report))
}

/// A fitted model: its probabilities are of the positive class.
struct Model {
    fitted: linfa_logistic::FittedLogisticRegression<f64, bool>,
}

impl Model {
    fn predict(&self, x: &Array2<f64>) -> Vec<f64> {
        let p = self.fitted.predict_probabilities(x);
        // linfa names the class it scores; the labels say which one it is.
        let flip = !self.fitted.labels().pos.class;
        p.iter().map(|&q| if flip { 1.0 - q } else { q }).collect()
    }
}

fn fit(vectors: &[Vec<f32>], train: &[(usize, bool)], dims: usize) -> Option<Model> {
    let x = matrix(vectors, train.iter().map(|&(p, _)| p), dims);
    let y: Array1<bool> = train.iter().map(|&(_, y)| y).collect();
    let fitted = LogisticRegression::default()
        .alpha(PENALTY)
        .max_iterations(MAX_ITERATIONS)
        .fit(&Dataset::new(x, y))
        .ok()?;
    Some(Model { fitted })
}

fn matrix(vectors: &[Vec<f32>], rows: impl Iterator<Item = usize>, dims: usize) -> Array2<f64> {
    let mut data = Vec::new();
    let mut n = 0;
    for p in rows {
        if let Some(v) = vectors.get(p) {
            data.extend(v.iter().map(|&x| f64::from(x)));
            n += 1;
        }
    }
    Array2::from_shape_vec((n, dims), data).unwrap_or_else(|_| Array2::zeros((0, dims)))
}

/// The area under the ROC curve: the chance a positive scores above a
/// negative, ties counting half.
pub fn auc(pairs: impl Iterator<Item = (f64, bool)>) -> Option<f64> {
    let (mut pos, mut neg) = (Vec::new(), Vec::new());
    for (s, y) in pairs {
        if y { pos.push(s) } else { neg.push(s) }
    }
    if pos.is_empty() || neg.is_empty() {
        return None;
    }
    let mut wins = 0.0;
    for &p in &pos {
        for &n in &neg {
            wins += match p.partial_cmp(&n) {
                Some(std::cmp::Ordering::Greater) => 1.0,
                Some(std::cmp::Ordering::Equal) => 0.5,
                _ => 0.0,
            };
        }
    }
    Some(wins / (pos.len() * neg.len()) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Units on two clusters: positives near (1, 0, ...), negatives near
    /// (0, 1, ...), with a little seeded jitter.
    fn population(n: usize) -> (Vec<Vec<f32>>, Vec<bool>, Vec<u64>) {
        let mut vectors = Vec::new();
        let mut truth = Vec::new();
        let mut keys = Vec::new();
        for i in 0..n {
            let positive = i % 3 == 0;
            let jitter = ((i * 7919) % 101) as f32 / 500.0;
            let mut v = vec![jitter; 8];
            if let Some(x) = v.get_mut(usize::from(!positive)) {
                *x += 1.0;
            }
            vectors.push(v);
            truth.push(positive);
            keys.push(mix(i as u64));
        }
        (vectors, truth, keys)
    }

    #[test]
    fn a_separable_population_is_ordered_by_the_cross_fitted_scores() {
        let (vectors, truth, keys) = population(90);
        let draws = training_draws(&keys, 40, 3);
        assert_eq!(draws.len(), 40);
        let labelled: Vec<(usize, bool)> = draws.iter().map(|&p| (p, truth[p])).collect();
        let (scores, report) = cross_fit(&vectors, &keys, &labelled).expect("fit");
        assert_eq!(report.folds_fitted, FOLDS);
        assert!(report.auc.is_some_and(|a| a > 0.95), "{report:?}");
        let all = auc(scores.iter().copied().zip(truth.iter().copied())).expect("both classes");
        assert!(all > 0.95, "ordered on units never labelled too: {all}");
    }

    #[test]
    fn a_label_never_scores_its_own_unit() {
        let (vectors, truth, keys) = population(60);
        let labelled: Vec<(usize, bool)> = (0..60).step_by(2).map(|p| (p, truth[p])).collect();
        let (before, _) = cross_fit(&vectors, &keys, &labelled).expect("fit");
        // Flip one label: its own unit's score (and that of every unit in
        // its fold) stays; only other folds move.
        let mut flipped = labelled.clone();
        let (p, y) = flipped[4];
        flipped[4] = (p, !y);
        let (after, _) = cross_fit(&vectors, &keys, &flipped).expect("fit");
        let mine = fold_of(keys[p]);
        for q in 0..60 {
            if fold_of(keys[q]) == mine {
                assert_eq!(
                    before[q], after[q],
                    "unit {q} shares the flipped label's fold"
                );
            }
        }
        assert!(
            (0..60).any(|q| fold_of(keys[q]) != mine && before[q] != after[q]),
            "the other folds were fitted on the flipped label"
        );
    }

    /// How far a synthetic unit lies from the classes' true boundary:
    /// their means differ along the diagonal, so it is the distance of
    /// the coordinates' sum from where the two classes' densities cross.
    fn off_boundary(v: &[f32]) -> f64 {
        v.iter().map(|&x| f64::from(x)).sum::<f64>().abs()
    }

    #[test]
    fn active_rounds_are_deterministic_and_choose_units_nearest_the_cut() {
        let (vectors, truth) = synthetic_vectors(11, 800, 0.5, 4, 2.0);
        let keys: Vec<u64> = (0..vectors.len() as u64).map(mix).collect();
        let rounds = Rounds::of(50);
        assert_eq!(
            rounds,
            Rounds {
                labels: 50,
                first: 20,
                each: 10,
                explore: 0
            }
        );
        let truth_of = |p: usize| truth.get(p).copied();
        let chosen = active_draws(&vectors, &keys, rounds, 5, truth_of).expect("active fit");
        assert_eq!(
            chosen,
            active_draws(&vectors, &keys, rounds, 5, truth_of).expect("active fit"),
            "a rerun asks for the same labels"
        );
        assert_ne!(
            chosen,
            active_draws(&vectors, &keys, rounds, 6, truth_of).expect("active fit"),
            "another seed draws another first round"
        );
        let distinct: std::collections::HashSet<u64> = chosen.iter().map(|&p| keys[p]).collect();
        assert_eq!((chosen.len(), distinct.len()), (50, 50));
        assert_eq!(
            chosen[..20],
            training_draws(&keys, 20, 5)[..],
            "seeded first"
        );
        // Each later round takes the units not yet chosen that the model
        // of the labels before it scores nearest the cut.
        for start in [20, 30, 40] {
            let before: Vec<(usize, bool)> =
                chosen[..start].iter().map(|&p| (p, truth[p])).collect();
            let scores = fit_all(&vectors, &before)
                .expect("fit")
                .expect("both classes");
            let distance = |p: usize| (scores[p] - CUT).abs();
            let round = &chosen[start..start + 10];
            let farthest = round.iter().map(|&p| distance(p)).fold(0.0, f64::max);
            let nearest_left = (0..vectors.len())
                .filter(|p| !chosen[..start + 10].contains(p))
                .map(distance)
                .fold(f64::INFINITY, f64::min);
            assert!(
                farthest <= nearest_left,
                "round at {start}: {farthest} against {nearest_left}"
            );
        }
        // And those units lie nearer the true boundary than random ones:
        // the coordinates' sum is a normal of mean ±2 and deviation 2, so
        // units drawn at random lie about 2.2 from it on average.
        let mean = |ps: &[usize]| {
            ps.iter().map(|&p| off_boundary(&vectors[p])).sum::<f64>() / ps.len() as f64
        };
        let (random, active) = (mean(&chosen[..20]), mean(&chosen[20..]));
        assert!(
            active < random * 2.0 / 3.0,
            "active {active}, random {random}"
        );
    }

    /// Round by round, the same choice as all at once: the first round
    /// the seeded one, then rounds of `each`, each chosen on the labels
    /// before it, and no key twice.
    #[test]
    fn active_rounds_are_the_draws_split_where_each_round_was_asked() {
        let (vectors, truth) = synthetic_vectors(4, 600, 0.3, 4, 2.0);
        let keys: Vec<u64> = (0..vectors.len() as u64).map(mix).collect();
        let truth_of = |p: usize| truth.get(p).copied();
        let rounds = Rounds::of(50);
        let split = active_rounds(&vectors, &keys, rounds, 9, truth_of).expect("rounds");
        let sizes: Vec<usize> = split.iter().map(Vec::len).collect();
        assert_eq!(sizes, [20, 10, 10, 10]);
        let flat: Vec<usize> = split.iter().flatten().copied().collect();
        assert_eq!(
            flat,
            active_draws(&vectors, &keys, rounds, 9, truth_of).expect("draws")
        );
        let mut chosen = Vec::new();
        for round in &split {
            let next = next_round(&vectors, &keys, rounds, 9, &chosen, truth_of).expect("round");
            assert_eq!(&next, round, "a round asked on the labels before it");
            chosen.extend(next);
        }
        let distinct: std::collections::HashSet<u64> = flat.iter().map(|&p| keys[p]).collect();
        assert_eq!(distinct.len(), 50);
    }

    #[test]
    fn labels_of_one_class_go_on_at_random_and_the_rounds_stop_at_the_budget() {
        let (vectors, _, keys) = population(60);
        let rounds = Rounds::of(20);
        let first = next_round(&vectors, &keys, rounds, 3, &[], |_| Some(false)).expect("round");
        assert_eq!(first, training_draws(&keys, rounds.first, 3));
        let second =
            next_round(&vectors, &keys, rounds, 3, &first, |_| Some(false)).expect("round");
        assert_eq!(
            second[..],
            training_draws(&keys, rounds.first + rounds.each, 3)[rounds.first..],
            "no model from one class: the seeded order goes on"
        );
        let all = active_draws(&vectors, &keys, rounds, 3, |_| Some(false)).expect("rounds");
        assert_eq!(all.len(), 20);
        assert!(
            next_round(&vectors, &keys, rounds, 3, &all, |_| Some(false))
                .expect("round")
                .is_empty()
        );
        assert!(matches!(
            next_round(&vectors, &keys, rounds, 3, &[60], |_| None),
            Err(ProxyError::Missing(60))
        ));
    }

    #[test]
    fn an_exploring_round_goes_on_in_seeded_order_before_the_boundary() {
        let (vectors, truth, keys) = population(90);
        let rounds = Rounds {
            explore: 3,
            ..Rounds::of(30)
        };
        let truth_of = |p: usize| truth.get(p).copied();
        let first = next_round(&vectors, &keys, rounds, 4, &[], truth_of).expect("round");
        let second = next_round(&vectors, &keys, rounds, 4, &first, truth_of).expect("round");
        assert_eq!(second.len(), rounds.each);
        assert_eq!(
            second[..3],
            training_draws(&keys, rounds.first + 3, 4)[rounds.first..],
            "the exploring labels come first, in seeded order"
        );
        let pure = next_round(&vectors, &keys, Rounds::of(30), 4, &first, truth_of).expect("round");
        assert_ne!(second, pure, "exploring changes the round");
    }

    #[test]
    fn an_actively_fitted_proxy_keeps_the_accuracy_guarantee() {
        use crate::cascade::{self, Config, Metric, Target};
        let target = Target {
            metric: Metric::Accuracy,
            at_least: 0.9,
            delta: 0.1,
        };
        let trials = 40;
        let (mut met, mut decided) = (0, 0);
        for seed in 0..trials {
            let (vectors, truth) = synthetic_vectors(seed, 1000, 0.2, 16, 2.5);
            let keys: Vec<u64> = (0..vectors.len() as u64).collect();
            let truth_of = |p: usize| truth.get(p).copied();
            let training =
                active_draws(&vectors, &keys, Rounds::of(50), seed, truth_of).expect("rounds");
            let (scores, _) = fit_on(&vectors, &keys, &training, truth_of).expect("fit");
            let config = Config {
                cut: CUT,
                ..Config::new(target, 150, seed)
            };
            let outcome = cascade::run(&config, &scores, &keys, &mut |p| truth.get(p).copied())
                .expect("cascade");
            if outcome.realized(&truth) >= target.at_least {
                met += 1;
            }
            decided += outcome.proxy_decided;
        }
        assert!(
            met as f64 >= (1.0 - target.delta) * trials as f64,
            "met in {met} of {trials}"
        );
        assert!(decided > 0, "the classifier decided no unit in any trial");
    }

    #[test]
    fn a_view_is_labelled_and_asked_once() {
        // Positions 0 and 3 show one view; 1 and 4 another.
        let keys = [7, 8, 9, 7, 8, 10];
        assert_eq!(distinct_asked(&keys, &[0, 1], &[3, 2], &[4, 5]), (3, 4));
        assert_eq!(distinct_asked(&keys, &[], &[], &[]), (0, 0));
    }

    #[test]
    fn one_class_scores_its_share_and_bad_vectors_are_refused() {
        let (vectors, _, keys) = population(30);
        let labelled: Vec<(usize, bool)> = (0..10).map(|p| (p, false)).collect();
        let (scores, report) = cross_fit(&vectors, &keys, &labelled).expect("fit");
        assert_eq!(report.folds_fitted, 0);
        assert_eq!(report.auc, None);
        assert!(scores.iter().all(|&s| s == 0.0), "{scores:?}");
        let mut bad = vectors.clone();
        bad[3].push(0.0);
        assert!(matches!(
            cross_fit(&bad, &keys, &labelled),
            Err(ProxyError::Dimensions(8, 9))
        ));
    }
}
