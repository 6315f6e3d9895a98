//! The audit operator's arithmetic: which units a seeded sample holds, and
//! what the judge's disagreements say about a rung's miss rate.
//!
//! The sample is the `k` units with the smallest keyed hash of their
//! content. That makes it a simple random sample without replacement that
//! is (a) the same on every rerun with the same seed, so an audit's facts
//! are reused from the cache, (b) nested, so a sample grown from `k` to
//! `2k` keeps the first `k`, and (c) computable over a stream with `k`
//! units of memory.

use std::collections::BinaryHeap;

use fanfold_core::ContentHash;
use serde::{Deserialize, Serialize};

/// Where a unit falls in the sample order of `seed`: smaller is sampled first.
pub fn sample_rank(seed: u64, unit_hash: &ContentHash) -> u64 {
    let mut h = blake3::Hasher::new();
    h.update(b"fanfold-audit-sample-v1");
    h.update(&seed.to_le_bytes());
    h.update(&unit_hash.0);
    let out = h.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&out.as_bytes()[..8]);
    u64::from_le_bytes(first)
}

/// The `k` items of smallest rank seen so far, over a stream.
pub struct BottomK<T> {
    k: usize,
    heap: BinaryHeap<Ranked<T>>,
}

struct Ranked<T> {
    rank: (u64, u64),
    item: T,
}

impl<T> PartialEq for Ranked<T> {
    fn eq(&self, other: &Self) -> bool {
        self.rank == other.rank
    }
}
impl<T> Eq for Ranked<T> {}
impl<T> PartialOrd for Ranked<T> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl<T> Ord for Ranked<T> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.rank.cmp(&other.rank)
    }
}

impl<T> BottomK<T> {
    pub fn new(k: usize) -> BottomK<T> {
        BottomK {
            k,
            heap: BinaryHeap::with_capacity(k.saturating_add(1).min(1 << 16)),
        }
    }

    /// Whether an item of this rank would be kept; lets a caller skip
    /// building an item that would be dropped at once.
    pub fn would_keep(&self, rank: u64, tiebreak: u64) -> bool {
        self.k > 0
            && (self.heap.len() < self.k
                || self
                    .heap
                    .peek()
                    .is_some_and(|top| (rank, tiebreak) < top.rank))
    }

    /// Offers an item; `tiebreak` orders equal ranks (a unit's ordinal).
    pub fn offer(&mut self, rank: u64, tiebreak: u64, item: T) {
        if !self.would_keep(rank, tiebreak) {
            return;
        }
        self.heap.push(Ranked {
            rank: (rank, tiebreak),
            item,
        });
        if self.heap.len() > self.k {
            self.heap.pop();
        }
    }

    /// The kept items, smallest rank first.
    pub fn into_sorted(self) -> Vec<T> {
        self.heap
            .into_sorted_vec()
            .into_iter()
            .map(|r| r.item)
            .collect()
    }
}

/// The first `k` of `units` in the sample order of `seed`.
pub fn sample<T: Copy>(seed: u64, units: &[(T, ContentHash)], k: usize) -> Vec<T> {
    let mut ranked: Vec<(u64, usize, T)> = units
        .iter()
        .enumerate()
        .map(|(i, (t, h))| (sample_rank(seed, h), i, *t))
        .collect();
    ranked.sort_unstable_by_key(|&(r, i, _)| (r, i));
    ranked.into_iter().take(k).map(|(_, _, t)| t).collect()
}

/// One stratum of a rung's negatives, as judged.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Stratum {
    /// Negatives of the rung in this stratum.
    pub population: u64,
    /// Of those, the ones the judge decided.
    pub judged: u64,
    /// Judged units the judge says should not have been thrown away.
    pub disagreements: u64,
    /// The most of the stratum's negatives the judge could disagree on,
    /// at the stratum's share of the level (exact when judged whole).
    pub missed_at_most: u64,
}

/// A miss rate measured on a sample of a rung's negatives: the share of
/// what the rung threw away that the judge says should have been kept.
/// It bounds how many units the rung missed, not the answer's recall
/// (that needs the number found too: [`recall_at_least`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MissRate {
    /// Negatives the rung produced.
    pub population: u64,
    /// Of those, the ones the judge decided.
    pub judged: u64,
    /// Judged units the judge says should not have been thrown away.
    pub disagreements: u64,
    /// The estimated rate: each stratum's sample rate weighted by its size.
    pub rate: f64,
    /// Lower and upper bounds of the rate, each one-sided at the level the
    /// rung was given (exact hypergeometric bounds, summed over strata;
    /// exact when the whole rung was judged).
    pub low: f64,
    pub high: f64,
    /// `high` as a count: the most units the rung can have missed.
    pub missed_at_most: u64,
    /// The failure probability of `high` (and of `low`).
    pub alpha: f64,
    /// The strata sampled apart: the units nearest the rung's threshold
    /// (or of least confidence) first, then the rest; one stratum when the
    /// rung has no score to order by.
    pub strata: Vec<Stratum>,
}

impl MissRate {
    /// The rate of a rung whose strata hold `(population, judged,
    /// disagreements)`, with bounds failing with probability at most
    /// `alpha` (split evenly over the strata).
    pub fn measure(strata: &[(u64, u64, u64)], alpha: f64) -> MissRate {
        let share = alpha / strata.len().max(1) as f64;
        let mut out = MissRate {
            population: 0,
            judged: 0,
            disagreements: 0,
            rate: 0.0,
            low: 0.0,
            high: 0.0,
            missed_at_most: 0,
            alpha,
            strata: Vec::with_capacity(strata.len()),
        };
        // The estimate weighs each sampled stratum's rate by its size, over
        // the strata that were sampled: one with nothing judged says
        // nothing of its rate (its bound still counts all of it).
        let (mut estimate, mut weight, mut least) = (0.0, 0u64, 0u64);
        for &(population, judged, disagreements) in strata {
            let judged = judged.min(population);
            let disagreements = disagreements.min(judged);
            let most = misses_at_most(population, judged, disagreements, share);
            least += misses_at_least(population, judged, disagreements, share);
            if judged > 0 {
                estimate += population as f64 * disagreements as f64 / judged as f64;
                weight += population;
            }
            out.population += population;
            out.judged += judged;
            out.disagreements += disagreements;
            out.missed_at_most += most;
            out.strata.push(Stratum {
                population,
                judged,
                disagreements,
                missed_at_most: most,
            });
        }
        if out.population > 0 {
            let n = out.population as f64;
            // Nothing judged proves nothing, and estimates nothing.
            out.rate = match weight {
                0 => 0.0,
                w => estimate / w as f64,
            };
            out.low = least as f64 / n;
            out.high = out.missed_at_most as f64 / n;
        }
        out
    }
}

/// The recall an answer has at least, against the judge of its audit:
/// `found` positives, and at most `missed` positives among what was thrown
/// away. An answer that found nothing and can have missed nothing has
/// missed nothing.
pub fn recall_at_least(found: u64, missed: u64) -> f64 {
    match found + missed {
        0 => 1.0,
        all => found as f64 / all as f64,
    }
}

/// How a round of `size` units divides between a rung's boundary stratum
/// (`near` units) and the rest (`far`): half to each, the share a stratum
/// cannot fill going to the other. Each stratum's count never shrinks as
/// `size` grows, so a grown sample keeps every unit it judged.
pub fn allocate(size: usize, near: usize, far: usize) -> (usize, usize) {
    let half = size.div_ceil(2).min(near);
    let far_take = size.saturating_sub(half).min(far);
    let near_take = size.saturating_sub(far_take).min(near);
    (near_take, far_take)
}

/// ln Γ(x) for x > 0: Lanczos' approximation (g = 7, nine terms), good
/// to about 15 digits, which the bounds below need only to 1e-9.
fn ln_gamma(x: f64) -> f64 {
    const G: f64 = 7.0;
    const C: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        // Reflection keeps the series in its accurate range.
        let pi = std::f64::consts::PI;
        return (pi / (pi * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let mut sum = C[0];
    for (i, c) in C.iter().enumerate().skip(1) {
        sum += c / (x + i as f64);
    }
    let t = x + G + 0.5;
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + sum.ln()
}

fn ln_choose(n: u64, k: u64) -> f64 {
    if k > n {
        return f64::NEG_INFINITY;
    }
    ln_gamma(n as f64 + 1.0) - ln_gamma(k as f64 + 1.0) - ln_gamma((n - k) as f64 + 1.0)
}

/// P(lo <= X <= hi) for X the number of marked units among `n` drawn
/// without replacement from `big_n` units of which `m` are marked.
fn hypergeometric_mass(big_n: u64, m: u64, n: u64, lo: u64, hi: u64) -> f64 {
    let lo = lo.max(n.saturating_sub(big_n - m));
    let hi = hi.min(n).min(m);
    if lo > hi {
        return 0.0;
    }
    let all = ln_choose(big_n, n);
    (lo..=hi)
        .map(|k| (ln_choose(m, k) + ln_choose(big_n - m, n - k) - all).exp())
        .sum::<f64>()
        .min(1.0)
}

/// The exact upper confidence bound on how many of `population` units are
/// marked, after `d` of `n` drawn without replacement were: the largest
/// count under which seeing `d` or fewer has probability above `alpha`.
pub fn misses_at_most(population: u64, n: u64, d: u64, alpha: f64) -> u64 {
    let unseen = population.saturating_sub(n);
    if unseen == 0 {
        return d;
    }
    // Counts from `d` (all marked units seen) to `d + unseen`; the
    // probability of `d` or fewer falls as the count grows.
    let likely = |m: u64| hypergeometric_mass(population, m, n, 0, d) > alpha;
    let (mut lo, mut hi) = (d, d + unseen);
    if likely(hi) {
        return hi;
    }
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if likely(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo
}

/// The exact lower bound, by the same reasoning: the smallest count under
/// which seeing `d` or more has probability above `alpha`.
pub fn misses_at_least(population: u64, n: u64, d: u64, alpha: f64) -> u64 {
    let unseen = population.saturating_sub(n);
    if unseen == 0 || d == 0 {
        return d;
    }
    let likely = |m: u64| hypergeometric_mass(population, m, n, d, n) > alpha;
    let (mut lo, mut hi) = (d, d + unseen);
    if likely(lo) {
        return lo;
    }
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if likely(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    hi
}

/// The sample sizes an audit judges in turn: `first`, doubled until `max`
/// (or the whole rung), each round a superset of the last.
pub fn rounds(first: usize, max: usize, population: usize) -> Vec<usize> {
    let cap = max.max(first).min(population);
    let mut out = vec![first.min(cap)];
    while let Some(&last) = out.last() {
        if last >= cap {
            break;
        }
        out.push(last.saturating_mul(2).max(1).min(cap));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(i: u32) -> ContentHash {
        ContentHash::of_bytes(&i.to_le_bytes())
    }

    #[test]
    fn bounds_match_exact_hypergeometric_values() {
        // Computed by summing binomial coefficients exactly.
        for (population, n, d, alpha, most, least) in [
            (100, 20, 0, 0.05, 12, 0),
            (100, 20, 3, 0.05, 32, 5),
            (934, 40, 0, 0.05, 65, 0),
            (934, 40, 2, 0.025, 155, 7),
            (1000, 100, 10, 0.05, 160, 58),
        ] {
            assert_eq!(
                misses_at_most(population, n, d, alpha),
                most,
                "upper bound of {d}/{n} of {population}"
            );
            assert_eq!(
                misses_at_least(population, n, d, alpha),
                least,
                "lower bound of {d}/{n} of {population}"
            );
        }
        // A million units: no overflow, and close to the binomial bound
        // 1 - 0.05^(1/20) = 13.9 %.
        let most = misses_at_most(1_000_000, 20, 0, 0.05) as f64 / 1e6;
        assert!((most - 0.1391).abs() < 1e-3, "{most}");
    }

    #[test]
    fn whole_rung_is_exact() {
        let m = MissRate::measure(&[(12, 12, 3)], 0.05);
        assert_eq!((m.low, m.high), (0.25, 0.25));
        assert_eq!(m.missed_at_most, 3);
        let m = MissRate::measure(&[(100, 0, 0)], 0.05);
        assert_eq!(m.high, 1.0, "nothing judged proves nothing");
        let m = MissRate::measure(&[(0, 0, 0)], 0.05);
        assert_eq!((m.rate, m.high), (0.0, 0.0), "an empty rung missed nothing");
    }

    #[test]
    fn strata_add_their_bounds_and_weigh_their_rates() {
        // A boundary quarter with 2 of 10 disagreeing, a rest with none.
        let m = MissRate::measure(&[(25, 10, 2), (75, 10, 0)], 0.05);
        assert_eq!(m.strata.len(), 2);
        assert_eq!(
            m.missed_at_most,
            misses_at_most(25, 10, 2, 0.025) + misses_at_most(75, 10, 0, 0.025)
        );
        assert!((m.rate - 0.05).abs() < 1e-12, "25 * 0.2 / 100: {}", m.rate);
        assert!(m.low <= m.rate && m.rate <= m.high);
        // A stratum nobody sampled leaves the estimate to the others and
        // its whole population to the bound.
        let m = MissRate::measure(&[(25, 10, 2), (75, 0, 0)], 0.05);
        assert!((m.rate - 0.2).abs() < 1e-12, "{}", m.rate);
        assert!(m.missed_at_most >= 75, "{}", m.missed_at_most);
    }

    #[test]
    fn the_bound_holds_in_at_least_one_minus_alpha_of_samples() {
        // 300 units of which 15 are misses, sampled 30 at a time.
        let misses: Vec<bool> = (0..300).map(|i| i % 20 == 0).collect();
        let (mut held, trials) = (0, 400);
        for seed in 0..trials {
            let units: Vec<(bool, ContentHash)> = misses
                .iter()
                .enumerate()
                .map(|(i, &m)| (m, h(i as u32)))
                .collect();
            let drawn = sample(seed, &units, 30);
            let d = drawn.iter().filter(|&&m| m).count() as u64;
            if misses_at_most(300, 30, d, 0.1) >= 15 {
                held += 1;
            }
        }
        assert!(
            held as f64 >= 0.9 * trials as f64,
            "held in {held} of {trials}"
        );
    }

    #[test]
    fn recall_and_allocation() {
        assert_eq!(recall_at_least(0, 0), 1.0);
        assert_eq!(recall_at_least(0, 3), 0.0);
        assert_eq!(recall_at_least(90, 10), 0.9);
        assert_eq!(allocate(20, 100, 100), (10, 10));
        assert_eq!(allocate(20, 4, 100), (4, 16));
        assert_eq!(allocate(20, 100, 3), (17, 3));
        assert_eq!(allocate(21, 100, 100), (11, 10));
        let mut last = (0, 0);
        for size in 0..60 {
            let now = allocate(size, 13, 29);
            assert!(now.0 >= last.0 && now.1 >= last.1, "nested at {size}");
            assert_eq!(now.0 + now.1, size.min(42));
            last = now;
        }
    }

    #[test]
    fn samples_are_seeded_nested_and_streamable() {
        let units: Vec<(u32, ContentHash)> = (0..500).map(|i| (i, h(i))).collect();
        let ten = sample(7, &units, 10);
        let twenty = sample(7, &units, 20);
        assert_eq!(ten, twenty[..10], "a grown sample keeps the first");
        assert_eq!(ten, sample(7, &units, 10), "same seed, same sample");
        assert_ne!(ten, sample(8, &units, 10), "another seed, another sample");
        let mut stream = BottomK::new(10);
        for (i, (t, hash)) in units.iter().enumerate().rev() {
            stream.offer(sample_rank(7, hash), i as u64, *t);
        }
        assert_eq!(stream.into_sorted(), ten, "streamed in any order");
    }

    #[test]
    fn rounds_double_up_to_the_cap() {
        assert_eq!(rounds(20, 80, 1000), vec![20, 40, 80]);
        assert_eq!(rounds(20, 100, 1000), vec![20, 40, 80, 100]);
        assert_eq!(rounds(20, 80, 30), vec![20, 30]);
        assert_eq!(rounds(20, 0, 1000), vec![20]);
        assert_eq!(rounds(20, 80, 0), vec![0]);
    }
}
