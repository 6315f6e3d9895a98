//! Near-duplicate collapse before counting: forty reports of one crash
//! are one incident.
//!
//! A reducer with a `dedupe` compares the text at its `field` of every
//! fact it reads. Each text is cut into character shingles and summed up
//! by [`HASHES`] seeded min-hashes ([`MinHasher`]); the share of equal
//! min-hashes estimates the Jaccard similarity of two texts' shingle
//! sets. Candidates are found by banding the signatures (two texts share
//! a band only when every min-hash in it agrees), so a text is compared
//! with the few kept texts it may be near, not with all of them.
//!
//! Facts are taken in ascending (unit id, stage), ids of digits by their
//! number ([`id_order`]). Each one is collapsed
//! into the kept fact it is most similar to at or above the threshold
//! (ties to the lower id), or kept. Only kept facts are compared with, so
//! every collapsed fact is a near-duplicate of the unit it is collapsed
//! into (no chains), the kept unit of a group is its lowest id, and the
//! outcome depends on the facts alone, never on the order they arrive in:
//! the fold may still group and order its leaves as it likes.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use fanfold_core::UnitId;
use fanfold_core::spec::ReducerSpec;
use fanfold_core::spec::dedupe::DedupeSpec;
use serde::{Deserialize, Serialize};

/// Min-hashes in a signature.
pub const HASHES: usize = 128;

/// The seeded hash family of one dedupe: `HASHES` multiply-shift hashes
/// of each shingle's 64-bit hash.
pub struct MinHasher {
    /// An odd multiplier per min-hash, and its addend: kept apart so the
    /// inner loop runs over plain arrays.
    multipliers: Vec<u64>,
    addends: Vec<u64>,
    shingle_chars: usize,
}

/// A text's min-hashes: the least of each hash over its shingles, the
/// upper 32 bits kept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Signature(Vec<u32>);

/// SplitMix64's finalizer: a bijection of 64 bits that mixes every input
/// bit into every output bit.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl MinHasher {
    pub fn new(seed: u64, shingle_chars: usize) -> MinHasher {
        let mut state = mix(seed ^ 0x6D69_6E68_6173_6821);
        let mut next = || {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            mix(state)
        };
        let multipliers = (0..HASHES).map(|_| next() | 1).collect();
        let addends = (0..HASHES).map(|_| next()).collect();
        MinHasher {
            multipliers,
            addends,
            shingle_chars: shingle_chars.max(1),
        }
    }

    /// The text's signature; `None` for a text with no character but
    /// whitespace, which nothing can be near.
    pub fn signature(&self, text: &str) -> Option<Signature> {
        let chars = normalized(text);
        if chars.is_empty() {
            return None;
        }
        let k = self.shingle_chars.min(chars.len());
        let mut mins = vec![u32::MAX; HASHES];
        for shingle in chars.windows(k) {
            let x = shingle_hash(shingle);
            for ((m, a), b) in mins.iter_mut().zip(&self.multipliers).zip(&self.addends) {
                let h = (a.wrapping_mul(x).wrapping_add(*b) >> 32) as u32;
                *m = (*m).min(h);
            }
        }
        Some(Signature(mins))
    }
}

/// The text lowercased, each run of whitespace one space, none at either
/// end: "Crash  on\nStart" and "crash on start" are one text.
fn normalized(text: &str) -> Vec<char> {
    let mut out = Vec::with_capacity(text.len());
    for word in text.split_whitespace() {
        if !out.is_empty() {
            out.push(' ');
        }
        out.extend(word.chars().flat_map(char::to_lowercase));
    }
    out
}

/// A shingle's 64 bits: its characters folded in, then mixed once.
fn shingle_hash(chars: &[char]) -> u64 {
    let h = chars.iter().fold(0xCBF2_9CE4_8422_2325u64, |h, c| {
        (h ^ u64::from(u32::from(*c))).wrapping_mul(0x0000_0100_0000_01B3)
    });
    mix(h)
}

impl Signature {
    /// The share of equal min-hashes: an estimate of the Jaccard
    /// similarity of the two texts' shingle sets.
    pub fn similarity(&self, other: &Signature) -> f64 {
        let equal = self.0.iter().zip(&other.0).filter(|(a, b)| a == b).count();
        equal as f64 / HASHES as f64
    }

    fn band_key(&self, band: usize, rows: usize) -> u64 {
        let start = band * rows;
        let values = self.0.get(start..start + rows).unwrap_or_default();
        values
            .iter()
            .fold(mix(band as u64 ^ 0xB4D5), |h, v| mix(h ^ u64::from(*v)))
    }
}

/// Min-hashes a band: the most (so the fewest pairs compared) for which
/// two texts exactly at `threshold` still share a band with probability
/// at least 0.99. A band of `r` rows, `HASHES / r` bands: two texts of
/// similarity `s` share one with probability `1 - (1 - s^r)^(HASHES/r)`.
pub fn rows_per_band(threshold: f64) -> usize {
    let mut best = 1;
    let mut rows = 1;
    while rows <= HASHES {
        let bands = (HASHES / rows) as i32;
        let shared = 1.0 - (1.0 - threshold.powi(rows as i32)).powi(bands);
        if shared >= 0.99 {
            best = rows;
        }
        rows *= 2;
    }
    best
}

/// One fact a dedupe compares: its unit, stage and text.
pub struct Entry<'a> {
    pub unit: &'a UnitId,
    pub stage: &'a str,
    pub text: Option<String>,
}

/// For each entry, the entry it is collapsed into (a kept one), or
/// `None` when it is kept.
pub fn collapse(spec: &DedupeSpec, entries: &[Entry<'_>]) -> Vec<Option<usize>> {
    let hasher = MinHasher::new(spec.seed, spec.shingle_chars);
    let rows = rows_per_band(spec.threshold);
    let bands = HASHES / rows;
    let mut order: Vec<usize> = (0..entries.len()).collect();
    order.sort_by(|&a, &b| match (entries.get(a), entries.get(b)) {
        (Some(x), Some(y)) => id_order(x.unit, y.unit).then_with(|| x.stage.cmp(y.stage)),
        _ => a.cmp(&b),
    });
    let mut into = vec![None; entries.len()];
    // Kept entries only: a collapsed one is never compared with again.
    let mut kept: Vec<Option<Signature>> = vec![None; entries.len()];
    // Each band key's kept entries as a list threaded through `chain`:
    // `heads` holds a key's latest link, each link its entry and the
    // link before it. No list is allocated a key.
    let mut heads: HashMap<u64, usize> = HashMap::new();
    let mut chain: Vec<(usize, usize)> = Vec::new();
    // The last entry each kept one was compared with, so a candidate
    // sharing many bands is compared once.
    let mut compared_for: Vec<usize> = vec![usize::MAX; entries.len()];
    for &i in &order {
        let Some(entry) = entries.get(i) else {
            continue;
        };
        let Some(sig) = entry.text.as_deref().and_then(|t| hasher.signature(t)) else {
            continue;
        };
        let keys: Vec<u64> = (0..bands).map(|b| sig.band_key(b, rows)).collect();
        let mut best: Option<(f64, usize)> = None;
        for key in &keys {
            let mut link = heads.get(key).copied().unwrap_or(usize::MAX);
            while let Some(&(k, before)) = chain.get(link) {
                link = before;
                match compared_for.get_mut(k) {
                    Some(last) if *last != i => *last = i,
                    _ => continue,
                }
                let same_unit = entries.get(k).is_some_and(|e| e.unit == entry.unit);
                let Some(other) = kept.get(k).and_then(Option::as_ref).filter(|_| !same_unit)
                else {
                    continue;
                };
                let s = sig.similarity(other);
                // Candidates come from many bands, newest first: on a
                // tie the lower (unit, stage) wins, whichever came first.
                let better = match best {
                    None => true,
                    Some((bs, bk)) => s > bs || (s == bs && earlier(entries, k, bk)),
                };
                if s >= spec.threshold && better {
                    best = Some((s, k));
                }
            }
        }
        match best {
            Some((_, k)) => {
                if let Some(slot) = into.get_mut(i) {
                    *slot = Some(k);
                }
            }
            None => {
                for key in keys {
                    let before = heads.insert(key, chain.len()).unwrap_or(usize::MAX);
                    chain.push((i, before));
                }
                if let Some(slot) = kept.get_mut(i) {
                    *slot = Some(sig);
                }
            }
        }
    }
    into
}

fn earlier(entries: &[Entry<'_>], a: usize, b: usize) -> bool {
    match (entries.get(a), entries.get(b)) {
        (Some(x), Some(y)) => id_order(x.unit, y.unit)
            .then_with(|| x.stage.cmp(y.stage))
            .is_lt(),
        _ => a < b,
    }
}

/// Which of two ids is the lower, as a person reads them: ids of digits
/// alone by their number (`5` before `11`), before every other id, and
/// those by their text; equal numbers (`7`, `007`) by their text.
pub fn id_order(a: &UnitId, b: &UnitId) -> std::cmp::Ordering {
    let number = |id: &UnitId| -> Option<u128> {
        let s = id.as_str();
        if s.is_empty() || !s.bytes().all(|c| c.is_ascii_digit()) {
            return None;
        }
        s.parse().ok()
    };
    match (number(a), number(b)) {
        (Some(x), Some(y)) => x.cmp(&y),
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (None, None) => std::cmp::Ordering::Equal,
    }
    .then_with(|| a.cmp(b))
}

/// One kept unit and the units collapsed into it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KeptGroup {
    pub kept: UnitId,
    /// How many facts were collapsed into it.
    pub collapsed: u64,
    pub ids: Vec<UnitId>,
}

/// What a reducer's `dedupe` did, as the answer states it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CollapseSummary {
    pub method: String,
    pub threshold: f64,
    pub field: String,
    /// Facts collapsed into another, and so not counted.
    pub collapsed: u64,
    /// Kept units with at least one fact collapsed into them, the most
    /// collapsed first, then by id.
    pub groups: Vec<KeptGroup>,
}

/// A reducer's collapse as the fold's value holds it (`held`: each kept
/// unit with the units collapsed into it), or `None` when it has no
/// `dedupe`.
pub fn summary(
    r: &ReducerSpec,
    held: Option<&BTreeMap<UnitId, BTreeSet<UnitId>>>,
) -> Option<CollapseSummary> {
    let d = r.dedupe.as_ref()?;
    let empty = BTreeMap::new();
    let held = held.unwrap_or(&empty);
    let mut groups: Vec<KeptGroup> = held
        .iter()
        .map(|(kept, ids): (&UnitId, &BTreeSet<UnitId>)| KeptGroup {
            kept: kept.clone(),
            collapsed: ids.len() as u64,
            ids: ids.iter().cloned().collect(),
        })
        .collect();
    groups.sort_by(|a, b| {
        b.collapsed
            .cmp(&a.collapsed)
            .then_with(|| a.kept.cmp(&b.kept))
    });
    Some(CollapseSummary {
        method: d.method.as_str().to_owned(),
        threshold: d.threshold,
        field: d.field.clone(),
        collapsed: groups.iter().map(|g| g.collapsed).sum(),
        groups,
    })
}

impl CollapseSummary {
    /// "12 near-duplicates collapsed into 3 kept units (minhash, similarity
    /// at least 0.8 on `unit:/title`)".
    pub fn sentence(&self) -> String {
        let n = self.collapsed;
        let k = self.groups.len();
        format!(
            "{n} near-{} collapsed into {k} kept {} ({}, similarity at least {} on `{}`)",
            if n == 1 { "duplicate" } else { "duplicates" },
            if k == 1 { "unit" } else { "units" },
            self.method,
            self.threshold,
            // A backtick would end the code span early.
            self.field.replace('`', "'")
        )
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use fanfold_core::Status;
    use fanfold_core::spec::dedupe::DedupeMethod;
    use fanfold_core::spec::{ReducerKind, ReducerSpec};
    use serde_json::json;

    use super::*;
    use fanfold_core::spec::FoldSpec;

    use crate::fold::{FoldValue, Leaf, NoCache, fold_flat, fold_tree, mark};

    fn minhash(threshold: f64, field: &str) -> DedupeSpec {
        DedupeSpec {
            method: DedupeMethod::Minhash,
            threshold,
            field: field.into(),
            shingle_chars: 5,
            seed: 0,
        }
    }

    fn counting(threshold: f64) -> FoldSpec {
        FoldSpec {
            fan_in: 4,
            reducers: vec![ReducerSpec {
                name: "incidents".into(),
                stage: None,
                statuses: None,
                dedupe: Some(minhash(threshold, "unit:/title")),
                kind: ReducerKind::Count,
            }],
        }
    }

    fn leaf(id: &str, title: &str) -> Leaf {
        Leaf {
            unit_id: UnitId(id.into()),
            stage: "judge".into(),
            status: Status::Positive,
            facts: json!({}),
            unit: json!({ "unit:/title": title }),
        }
    }

    /// A seeded stream of numbers for the generated sets.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            mix(self.0)
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    /// A made-up word of 3 to 9 letters.
    fn word(rng: &mut Rng) -> String {
        let len = 3 + rng.below(7);
        (0..len)
            .map(|_| char::from(b'a' + rng.below(26) as u8))
            .collect()
    }

    /// `families` texts of 20 words from a vocabulary of 2,000, and for
    /// each a planted near-duplicate: one word replaced, or the last
    /// dropped, or the same words cased and spaced otherwise. Ids are
    /// shuffled, so a copy's id is as often below its original's as
    /// above. Returns the leaves and the planted (original, copy) pairs.
    fn planted(families: usize, seed: u64) -> (Vec<Leaf>, Vec<(UnitId, UnitId)>) {
        let mut rng = Rng(seed);
        let vocabulary: Vec<String> = (0..2000).map(|_| word(&mut rng)).collect();
        let mut texts: Vec<(String, Option<usize>)> = Vec::new();
        for f in 0..families {
            let words: Vec<String> = (0..20)
                .map(|_| vocabulary[rng.below(vocabulary.len())].clone())
                .collect();
            let original = texts.len();
            texts.push((words.join(" "), None));
            // Every other family has a copy; the rest stand alone.
            if f % 2 == 1 {
                continue;
            }
            let copy = match rng.below(3) {
                0 => {
                    let mut w = words.clone();
                    let at = rng.below(w.len());
                    w[at] = vocabulary[rng.below(vocabulary.len())].clone();
                    w.join(" ")
                }
                1 => words[..words.len() - 1].join(" "),
                _ => words
                    .iter()
                    .map(|w| w.to_uppercase())
                    .collect::<Vec<_>>()
                    .join("  \n"),
            };
            texts.push((copy, Some(original)));
        }
        let mut ids: Vec<usize> = (0..texts.len()).collect();
        for i in (1..ids.len()).rev() {
            ids.swap(i, rng.below(i + 1));
        }
        let id = |i: usize| UnitId(format!("u{:06}", ids[i]));
        let leaves = texts
            .iter()
            .enumerate()
            .map(|(i, (t, _))| leaf(&id(i).0, t))
            .collect();
        let pairs = texts
            .iter()
            .enumerate()
            .filter_map(|(i, (_, of))| Some((id((*of)?), id(i))))
            .collect();
        (leaves, pairs)
    }

    /// Every unordered pair of units one collapse group holds.
    fn grouped_pairs(root: &FoldValue) -> HashSet<(UnitId, UnitId)> {
        let mut out = HashSet::new();
        for (kept, ids) in root.collapsed.get("incidents").into_iter().flatten() {
            let group: Vec<&UnitId> = std::iter::once(kept).chain(ids).collect();
            for (i, a) in group.iter().enumerate() {
                for b in group.iter().skip(i + 1) {
                    out.insert(((*a).min(*b).clone(), (*a).max(*b).clone()));
                }
            }
        }
        out
    }

    #[test]
    fn planted_near_duplicates_are_found_with_high_precision_and_recall() {
        let (leaves, planted) = planted(2000, 11);
        let spec = counting(0.8);
        let root = fold_flat(&spec, &leaves);
        let found = grouped_pairs(&root);
        let planted: HashSet<(UnitId, UnitId)> = planted
            .into_iter()
            .map(|(a, b)| (a.clone().min(b.clone()), a.max(b)))
            .collect();
        let hits = found.intersection(&planted).count();
        let recall = hits as f64 / planted.len() as f64;
        let precision = hits as f64 / found.len().max(1) as f64;
        eprintln!(
            "planted {} pairs in {} texts; grouped {} pairs; recall {recall:.4}, precision {precision:.4}",
            planted.len(),
            leaves.len(),
            found.len()
        );
        assert!(recall >= 0.9, "recall {recall}");
        assert!(precision >= 0.98, "precision {precision}");
        // Every planted copy that was found is counted once with its
        // original: the count is the texts less the collapsed ones.
        let Some(crate::fold::Agg::Count(c)) = root.reducers.get("incidents") else {
            panic!("{root:?}");
        };
        let collapsed: usize = root
            .collapsed
            .get("incidents")
            .map_or(0, |g| g.values().map(BTreeSet::len).sum());
        assert_eq!(c.n as usize + collapsed, leaves.len());
    }

    #[test]
    fn the_kept_unit_is_the_lowest_id_whatever_the_order() {
        let leaves = vec![
            leaf("7", "Crash on startup when the settings file is missing"),
            leaf("3", "crash on startup when the  settings file is missing"),
            leaf("5", "Crash on startup when the settings file is missing!"),
            leaf("9", "Dark mode toggle does nothing on the login page"),
        ];
        let spec = counting(0.8);
        let root = fold_flat(&spec, &leaves);
        let groups = root.collapsed.get("incidents").expect("a collapse");
        assert_eq!(groups.len(), 1, "{groups:?}");
        let (kept, ids) = groups.iter().next().expect("one group");
        assert_eq!(kept.0, "3");
        let ids: Vec<&str> = ids.iter().map(UnitId::as_str).collect();
        assert_eq!(ids, ["5", "7"]);
        let mut reversed = leaves.clone();
        reversed.reverse();
        assert_eq!(fold_tree(&spec, &reversed, &mut NoCache).root, root);
        let summary =
            summary(&spec.reducers[0], root.collapsed.get("incidents")).expect("a dedupe");
        assert_eq!(summary.collapsed, 2);
        assert_eq!(
            summary.sentence(),
            "2 near-duplicates collapsed into 1 kept unit (minhash, similarity at least 0.8 on `unit:/title`)"
        );
    }

    #[test]
    fn ids_of_digits_are_ordered_by_their_number() {
        let id = |s: &str| UnitId(s.into());
        let mut ids = [id("b"), id("11"), id("a"), id("5"), id("007"), id("7")];
        ids.sort_by(id_order);
        let ids: Vec<&str> = ids.iter().map(UnitId::as_str).collect();
        assert_eq!(ids, ["5", "007", "7", "11", "a", "b"]);
        // So the report filed as 5 is kept, not 11.
        let leaves = vec![
            leaf("11", "Upload of files larger than 2 GB fails"),
            leaf("5", "Upload of files larger than 2 GB fails"),
        ];
        let root = fold_flat(&counting(0.8), &leaves);
        let groups = root.collapsed.get("incidents").expect("a collapse");
        assert_eq!(groups.keys().map(UnitId::as_str).collect::<Vec<_>>(), ["5"]);
    }

    #[test]
    fn a_higher_threshold_keeps_what_a_lower_one_collapses() {
        // One word of eight changed: similar, not the same.
        let leaves = vec![
            leaf("1", "disk full on node seven during nightly backup"),
            leaf("2", "disk full on node eight during nightly backup"),
        ];
        let collapsed = |t: f64| fold_flat(&counting(t), &leaves).collapsed.len();
        assert_eq!(collapsed(0.5), 1);
        assert_eq!(collapsed(0.95), 0);
    }

    #[test]
    fn facts_without_text_are_kept_and_a_unit_never_collapses_into_itself() {
        let mut leaves = vec![leaf("1", "same words"), leaf("2", "   ")];
        leaves.push(Leaf {
            stage: "other".into(),
            ..leaf("1", "same words")
        });
        leaves.push(Leaf {
            unit: json!({}),
            ..leaf("3", "")
        });
        let root = fold_flat(&counting(0.8), &leaves);
        assert!(root.collapsed.is_empty(), "{:?}", root.collapsed);
        let Some(crate::fold::Agg::Count(c)) = root.reducers.get("incidents") else {
            panic!("{root:?}");
        };
        assert_eq!(c.n, 4);
    }

    #[test]
    fn a_collapse_changes_the_leaf_keys_so_no_cached_node_is_reused() {
        let mut leaves = vec![leaf("1", "printer jams on tray two"), leaf("2", "x")];
        let plain = fold_tree(&counting(0.8), &leaves, &mut NoCache);
        leaves[1] = leaf("2", "printer jams on tray two");
        let after = fold_tree(&counting(0.8), &leaves, &mut NoCache);
        assert_ne!(plain.root_key, after.root_key);
        assert_eq!(after.root.collapsed.len(), 1);
    }

    #[test]
    fn bands_narrow_as_the_threshold_rises() {
        assert_eq!(rows_per_band(0.5), 2);
        assert_eq!(rows_per_band(0.8), 4);
        assert_eq!(rows_per_band(0.9), 8);
        assert_eq!(rows_per_band(1.0), HASHES);
        // A pair exactly at the threshold shares a band nearly always.
        for t in [0.3, 0.5, 0.7, 0.8, 0.9, 0.95] {
            let r = rows_per_band(t);
            let b = (HASHES / r) as i32;
            assert!(1.0 - (1.0 - f64::powi(t, r as i32)).powi(b) >= 0.99, "{t}");
        }
    }

    /// The collapse's speed on 100,000 texts, a third of them planted
    /// copies: `cargo nextest run --cargo-profile release -p fanfold-ops
    /// -E 'test(collapse_speed)' --run-ignored only --no-capture`.
    #[test]
    #[ignore = "a measurement, not a check"]
    fn collapse_speed_on_100k_units() {
        let (leaves, planted) = planted(66_667, 5);
        let spec = counting(0.8);
        let start = std::time::Instant::now();
        let marks = mark(&spec, &leaves);
        let secs = start.elapsed().as_secs_f64();
        let collapsed = (0..leaves.len())
            .filter(|&i| !marks.of(i).is_empty())
            .count();
        eprintln!(
            "dedupe of {} units ({} planted copies): {collapsed} collapsed in {secs:.2} s",
            leaves.len(),
            planted.len()
        );
        assert!(collapsed > 0);
    }
}
