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

/// The z value of a two-sided 95 % interval.
const Z95: f64 = 1.959_963_984_540_054;

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

/// A miss rate measured on a sample of a rung's negatives.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MissRate {
    /// Negatives the rung produced.
    pub population: u64,
    /// Of those, the ones the judge decided.
    pub judged: u64,
    /// Judged units the judge says should not have been thrown away.
    pub disagreements: u64,
    /// `disagreements / judged`.
    pub rate: f64,
    /// The 95 % interval of the rung's rate. Exact when the whole rung was
    /// judged; a Wilson score interval otherwise.
    pub low: f64,
    pub high: f64,
}

impl MissRate {
    pub fn measure(population: u64, judged: u64, disagreements: u64) -> MissRate {
        let (rate, low, high) = if population == 0 {
            // A rung that threw nothing away missed nothing.
            (0.0, 0.0, 0.0)
        } else if judged == 0 {
            // Nothing judged proves nothing.
            (0.0, 0.0, 1.0)
        } else {
            let rate = disagreements as f64 / judged as f64;
            let (low, high) = if judged >= population {
                (rate, rate)
            } else {
                wilson(disagreements, judged)
            };
            (rate, low, high)
        };
        MissRate {
            population,
            judged,
            disagreements,
            rate,
            low,
            high,
        }
    }

    /// The most units of the rung this interval allows to be missed.
    pub fn missed_at_most(&self) -> u64 {
        (self.high * self.population as f64).ceil() as u64
    }
}

/// The Wilson score interval at 95 % for `d` successes in `n` trials.
pub fn wilson(d: u64, n: u64) -> (f64, f64) {
    if n == 0 {
        return (0.0, 1.0);
    }
    let n = n as f64;
    let p = d as f64 / n;
    let z2 = Z95 * Z95;
    let denom = 1.0 + z2 / n;
    let centre = (p + z2 / (2.0 * n)) / denom;
    let half = Z95 / denom * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt();
    ((centre - half).max(0.0), (centre + half).min(1.0))
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
    fn wilson_matches_published_values() {
        // Newcombe (1998), table I: 0/10 -> 0.0000–0.2775; 1/29 ->
        // 0.0061–0.1718; 81/263 -> 0.2553–0.3662.
        let close = |a: f64, b: f64| (a - b).abs() < 5e-4;
        let (l, u) = wilson(0, 10);
        assert!(close(l, 0.0) && close(u, 0.2775), "{l} {u}");
        let (l, u) = wilson(1, 29);
        assert!(close(l, 0.0061) && close(u, 0.1718), "{l} {u}");
        let (l, u) = wilson(81, 263);
        assert!(close(l, 0.2553) && close(u, 0.3662), "{l} {u}");
    }

    #[test]
    fn whole_rung_is_exact() {
        let m = MissRate::measure(12, 12, 3);
        assert_eq!((m.low, m.high), (0.25, 0.25));
        assert_eq!(m.missed_at_most(), 3);
        let m = MissRate::measure(100, 0, 0);
        assert_eq!(m.high, 1.0, "nothing judged proves nothing");
        let m = MissRate::measure(0, 0, 0);
        assert_eq!((m.rate, m.high), (0.0, 0.0), "an empty rung missed nothing");
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
