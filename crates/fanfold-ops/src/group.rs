//! The group operator's pure half: units gathered into bounded groups, and
//! the one view that shows a group to a model.
//!
//! Units are gathered by an equal key, by a time window, or as
//! near-duplicates (word-shingle Jaccard at or above a floor, candidates
//! found by MinHash and each confirmed by its exact Jaccard). A group larger
//! than the bound is split in its own order into even parts. A group's
//! view is a pure function of its members' ids and projected views in
//! order, so verify rebuilds it from the ids a fact cites, and a cache key
//! over the view covers every member shown.

use std::collections::HashMap;

use serde_json::{Map, Value};

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum GroupError {
    #[error("members `{first}` and `{second}` would both show a field named `{field}`")]
    FieldClash {
        first: String,
        second: String,
        field: String,
    },
    #[error("a group needs at least two members, not {0}")]
    TooSmall(usize),
}

/// How units are gathered, one entry per unit in source order.
#[derive(Clone, Debug)]
pub enum Gathering {
    /// Units with an equal key are one group; `None` has no group.
    Key(Vec<Option<String>>),
    /// A group starts at the earliest unit not yet grouped and holds every
    /// unit at most `window` seconds after it.
    Time { at: Vec<Option<f64>>, window: f64 },
    /// Units whose shingle sets ([`shingles`]) have a Jaccard similarity of
    /// at least `min_jaccard` are linked; linked units are one group. An
    /// empty set has no group.
    Similar {
        sets: Vec<Vec<u64>>,
        min_jaccard: f64,
    },
}

/// A group to judge: unit positions (indexes into the gathering's lists),
/// in the order its context shows them.
#[derive(Clone, Debug, PartialEq)]
pub struct Group {
    pub members: Vec<usize>,
    /// Which part of a split group this is, if it was split.
    pub part: Option<Part>,
}

/// One part of a group larger than the bound.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Part {
    /// 1-based.
    pub index: usize,
    pub of: usize,
    /// Members of the whole group.
    pub whole: usize,
}

/// A group larger than the bound and how it was split.
#[derive(Clone, Debug, PartialEq)]
pub struct Split {
    /// The whole group's first unit.
    pub first: usize,
    pub whole: usize,
    /// The size of each part, in order.
    pub parts: Vec<usize>,
}

/// What gathering made of the units.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Gathered {
    /// Groups of two or more, in order of their first member's place in
    /// the source (a split group's parts in their order).
    pub groups: Vec<Group>,
    /// Units alone in their group: not judged.
    pub alone: Vec<usize>,
    /// Units with no group at all (no key, no time, no text).
    pub ungrouped: Vec<usize>,
    pub splits: Vec<Split>,
}

/// Gathers the units of `by` into groups of at most `max_members` (at
/// least [`MIN_BOUND`]). Deterministic: the same lists give the same groups.
pub fn gather(by: &Gathering, max_members: usize) -> Gathered {
    let max_members = max_members.max(MIN_BOUND);
    let (whole, ungrouped) = match by {
        Gathering::Key(keys) => by_key(keys),
        Gathering::Time { at, window } => by_time(at, *window),
        Gathering::Similar { sets, min_jaccard } => by_similarity(sets, *min_jaccard),
    };
    let mut out = Gathered {
        ungrouped,
        ..Gathered::default()
    };
    for members in whole {
        match members.as_slice() {
            [] => {}
            [one] => out.alone.push(*one),
            _ if members.len() <= max_members => out.groups.push(Group {
                members,
                part: None,
            }),
            _ => {
                let parts = split(&members, max_members);
                out.splits.push(Split {
                    first: members.first().copied().unwrap_or_default(),
                    whole: members.len(),
                    parts: parts.iter().map(Vec::len).collect(),
                });
                let of = parts.len();
                for (n, part) in parts.into_iter().enumerate() {
                    out.groups.push(Group {
                        members: part,
                        part: Some(Part {
                            index: n + 1,
                            of,
                            whole: members.len(),
                        }),
                    });
                }
            }
        }
    }
    out.alone.sort_unstable();
    out
}

/// The least bound on a group's members: under it a split could leave a
/// part of one (three members in parts of two), which no context judges.
pub const MIN_BOUND: usize = 3;

/// `members` cut in order into the fewest parts of at most `max` (at least
/// [`MIN_BOUND`]), their sizes as even as can be, the larger parts first:
/// a part of a group over the bound has at least two members.
pub fn split(members: &[usize], max: usize) -> Vec<Vec<usize>> {
    let max = max.max(MIN_BOUND);
    let n = members.len();
    let parts = n.div_ceil(max).max(1);
    let (base, extra) = (n / parts, n % parts);
    let mut out = Vec::with_capacity(parts);
    let mut rest = members;
    for p in 0..parts {
        let size = base + usize::from(p < extra);
        let (part, tail) = rest.split_at(size.min(rest.len()));
        out.push(part.to_vec());
        rest = tail;
    }
    out
}

/// Groups by equal key, each in source order, ordered by first member.
fn by_key(keys: &[Option<String>]) -> (Vec<Vec<usize>>, Vec<usize>) {
    let mut place: HashMap<&str, usize> = HashMap::new();
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut ungrouped = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        let Some(key) = key else {
            ungrouped.push(i);
            continue;
        };
        match place.get(key.as_str()) {
            Some(&g) => {
                if let Some(group) = groups.get_mut(g) {
                    group.push(i);
                }
            }
            None => {
                place.insert(key.as_str(), groups.len());
                groups.push(vec![i]);
            }
        }
    }
    (groups, ungrouped)
}

/// Windows from each group's earliest unit, members in time order (ties
/// in source order), ordered by their start.
fn by_time(at: &[Option<f64>], window: f64) -> (Vec<Vec<usize>>, Vec<usize>) {
    let mut timed: Vec<(f64, usize)> = Vec::new();
    let mut ungrouped = Vec::new();
    for (i, t) in at.iter().enumerate() {
        match t {
            Some(t) if t.is_finite() => timed.push((*t, i)),
            _ => ungrouped.push(i),
        }
    }
    timed.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut start = f64::NEG_INFINITY;
    for (t, i) in timed {
        match groups.last_mut() {
            Some(group) if t - start <= window => group.push(i),
            _ => {
                start = t;
                groups.push(vec![i]);
            }
        }
    }
    (groups, ungrouped)
}

/// Connected components of the near-duplicate links, members in source
/// order, ordered by first member.
fn by_similarity(sets: &[Vec<u64>], min_jaccard: f64) -> (Vec<Vec<usize>>, Vec<usize>) {
    let ungrouped: Vec<usize> = (0..sets.len())
        .filter(|&i| sets.get(i).is_none_or(Vec::is_empty))
        .collect();
    let components = near_duplicate_components(sets, min_jaccard);
    let mut in_component = vec![false; sets.len()];
    for c in &components {
        for &i in c {
            if let Some(slot) = in_component.get_mut(i) {
                *slot = true;
            }
        }
    }
    let mut groups = components;
    groups.extend(
        (0..sets.len())
            .filter(|&i| !in_component.get(i).copied().unwrap_or(true))
            .filter(|i| !ungrouped.contains(i))
            .map(|i| vec![i]),
    );
    groups.sort_by_key(|g| g.first().copied().unwrap_or(usize::MAX));
    (groups, ungrouped)
}

/// Hashes a MinHash signature holds.
pub const SIGNATURE_LEN: usize = 128;

/// The text a unit's projected view offers for similarity: its strings in
/// order (an object's values in its field order, an array's items), one a
/// line; a number or boolean as its JSON.
pub fn view_text(view: &Value) -> String {
    fn walk(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Null => {}
            Value::String(s) => out.push(s.clone()),
            Value::Array(items) => items.iter().for_each(|x| walk(x, out)),
            Value::Object(fields) => fields.values().for_each(|x| walk(x, out)),
            other => out.push(other.to_string()),
        }
    }
    let mut parts = Vec::new();
    walk(view, &mut parts);
    parts.join("\n")
}

/// The set of `words`-word shingles of `text` (lowercased runs of letters
/// and digits), as sorted distinct 64-bit hashes. A text shorter than one
/// shingle is one shingle of all its words; a text without words is empty.
pub fn shingles(text: &str, words: usize) -> Vec<u64> {
    let words = words.max(1);
    let tokens: Vec<String> = text
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect();
    let mut out: Vec<u64> = if tokens.is_empty() {
        Vec::new()
    } else if tokens.len() < words {
        vec![shingle_hash(&tokens)]
    } else {
        tokens.windows(words).map(shingle_hash).collect()
    };
    out.sort_unstable();
    out.dedup();
    out
}

/// FNV-1a over the words, each followed by a unit separator: stable
/// across platforms and releases, unlike the standard library's hasher.
fn shingle_hash(words: &[String]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for w in words {
        for b in w.bytes().chain(std::iter::once(0x1f)) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// SplitMix64's finalizer: a fixed permutation of 64-bit values.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The MinHash signature of a shingle set: for each of
/// [`SIGNATURE_LEN`] fixed permutations, the least permuted shingle. Two
/// sets agree at a place with probability their Jaccard similarity. Empty
/// for an empty set.
pub fn minhash(set: &[u64]) -> Vec<u64> {
    if set.is_empty() {
        return Vec::new();
    }
    (0..SIGNATURE_LEN as u64)
        .map(|p| {
            let seed = mix(p.wrapping_add(0x9e37_79b9_7f4a_7c15));
            set.iter().map(|&s| mix(s ^ seed)).min().unwrap_or(u64::MAX)
        })
        .collect()
}

/// The exact Jaccard similarity of two sorted distinct sets; 0 when both
/// are empty.
pub fn jaccard(a: &[u64], b: &[u64]) -> f64 {
    let (mut i, mut j, mut both) = (0, 0, 0usize);
    while let (Some(x), Some(y)) = (a.get(i), b.get(j)) {
        match x.cmp(y) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => {
                both += 1;
                i += 1;
                j += 1;
            }
        }
    }
    let union = a.len() + b.len() - both;
    if union == 0 {
        0.0
    } else {
        both as f64 / union as f64
    }
}

/// Rows per band of the MinHash index for a floor of `min_jaccard`: the
/// most rows for which a pair exactly at the floor is still a candidate
/// with probability at least 0.999 (more rows, fewer false candidates).
fn rows_per_band(min_jaccard: f64) -> usize {
    let t = min_jaccard.clamp(0.0, 1.0);
    for rows in [16usize, 8, 4, 2] {
        let bands = (SIGNATURE_LEN / rows) as i32;
        let missed = (1.0 - t.powi(rows as i32)).powi(bands);
        if 1.0 - missed >= 0.999 {
            return rows;
        }
    }
    1
}

/// The groups of two or more of the links between sets whose exact
/// Jaccard is at least `min_jaccard` (single linkage), each in index
/// order, ordered by first member. Candidate pairs are those whose MinHash
/// signatures agree on a whole band; a pair exactly at the floor is a
/// candidate with probability at least 0.999, a pair further above it
/// more surely. Deterministic: the permutations are fixed.
pub fn near_duplicate_components(sets: &[Vec<u64>], min_jaccard: f64) -> Vec<Vec<usize>> {
    let rows = rows_per_band(min_jaccard);
    let signatures: Vec<Vec<u64>> = sets.iter().map(|s| minhash(s)).collect();
    let mut parent: Vec<usize> = (0..sets.len()).collect();
    fn root(parent: &mut [usize], mut i: usize) -> usize {
        while let Some(&p) = parent.get(i) {
            if p == i {
                break;
            }
            let grand = parent.get(p).copied().unwrap_or(p);
            if let Some(slot) = parent.get_mut(i) {
                *slot = grand;
            }
            i = p;
        }
        i
    }
    for band in 0..SIGNATURE_LEN / rows {
        let mut buckets: HashMap<&[u64], Vec<usize>> = HashMap::new();
        for (i, sig) in signatures.iter().enumerate() {
            if let Some(rows) = sig.get(band * rows..(band + 1) * rows) {
                buckets.entry(rows).or_default().push(i);
            }
        }
        for members in buckets.values() {
            for (n, &a) in members.iter().enumerate() {
                for &b in members.get(n + 1..).unwrap_or_default() {
                    let (ra, rb) = (root(&mut parent, a), root(&mut parent, b));
                    if ra == rb {
                        continue;
                    }
                    let (Some(sa), Some(sb)) = (sets.get(a), sets.get(b)) else {
                        continue;
                    };
                    if jaccard(sa, sb) >= min_jaccard
                        && let Some(slot) = parent.get_mut(ra.max(rb))
                    {
                        *slot = ra.min(rb);
                    }
                }
            }
        }
    }
    let mut by_root: HashMap<usize, Vec<usize>> = HashMap::new();
    for i in 0..sets.len() {
        let r = root(&mut parent, i);
        by_root.entry(r).or_default().push(i);
    }
    let mut out: Vec<Vec<usize>> = by_root.into_values().filter(|c| c.len() > 1).collect();
    out.sort_by_key(|c| c.first().copied().unwrap_or(usize::MAX));
    out
}

/// A group as its context shows it: one field per member and field of the
/// member's projected view, named `"<id>.<field>"` (a view that is not an
/// object is one field named by the id), members in order.
#[derive(Clone, Debug, PartialEq)]
pub struct GroupView {
    pub view: Value,
    /// Each member's id and the view's fields that are its.
    pub fields: Vec<(String, Vec<String>)>,
}

/// The view of a group of `members` (id, projected view), in order.
pub fn group_view(members: Vec<(String, Value)>) -> Result<GroupView, GroupError> {
    if members.len() < 2 {
        return Err(GroupError::TooSmall(members.len()));
    }
    let mut view = Map::new();
    let mut owner: HashMap<String, String> = HashMap::new();
    let mut fields = Vec::with_capacity(members.len());
    for (id, projected) in members {
        let named: Vec<(String, Value)> = match projected {
            Value::Object(m) => {
                // A member that is one field of a record shows, and may be
                // quoted in, that field only, as it is alone.
                let only = m
                    .get(crate::partition::UNIT_FIELD)
                    .and_then(Value::as_str)
                    .map(str::to_owned);
                m.into_iter()
                    .filter(|(f, _)| match &only {
                        Some(own) => f == own,
                        None => true,
                    })
                    .map(|(f, v)| (format!("{id}.{f}"), v))
                    .collect()
            }
            other => vec![(id.clone(), other)],
        };
        let mut own = Vec::with_capacity(named.len());
        for (field, value) in named {
            if let Some(first) = owner.get(&field) {
                return Err(GroupError::FieldClash {
                    first: first.clone(),
                    second: id,
                    field,
                });
            }
            owner.insert(field.clone(), id.clone());
            own.push(field.clone());
            view.insert(field, value);
        }
        fields.push((id, own));
    }
    Ok(GroupView {
        view: Value::Object(view),
        fields,
    })
}

impl GroupView {
    /// The members no evidence field of `cited` belongs to, in order.
    pub fn uncited<'a>(&self, cited: impl IntoIterator<Item = &'a str>) -> Vec<String> {
        let cited: Vec<&str> = cited.into_iter().collect();
        self.fields
            .iter()
            .filter(|(_, own)| !own.iter().any(|f| cited.contains(&f.as_str())))
            .map(|(id, _)| id.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]

    use super::*;
    use serde_json::json;

    fn keys(k: &[Option<&str>]) -> Gathering {
        Gathering::Key(k.iter().map(|k| k.map(str::to_owned)).collect())
    }

    fn members(g: &Gathered) -> Vec<Vec<usize>> {
        g.groups.iter().map(|g| g.members.clone()).collect()
    }

    #[test]
    fn an_equal_key_is_a_group_in_source_order_and_a_lone_unit_is_not_judged() {
        let g = gather(
            &keys(&[Some("a"), Some("b"), None, Some("a"), Some("c"), Some("b")]),
            8,
        );
        assert_eq!(members(&g), vec![vec![0, 3], vec![1, 5]]);
        assert_eq!(g.alone, vec![4]);
        assert_eq!(g.ungrouped, vec![2]);
        assert!(g.splits.is_empty());
    }

    #[test]
    fn a_time_window_runs_from_its_group_s_earliest_unit_in_time_order() {
        let at = [
            Some(100.0),
            Some(0.0),
            Some(50.0),
            Some(61.0),
            None,
            Some(130.0),
        ];
        let g = gather(
            &Gathering::Time {
                at: at.to_vec(),
                window: 60.0,
            },
            8,
        );
        // 0 starts a window to 60: 0, 50; 61 starts the next, to 121: 61, 100.
        assert_eq!(members(&g), vec![vec![1, 2], vec![3, 0]]);
        assert_eq!(g.alone, vec![5]);
        assert_eq!(g.ungrouped, vec![4]);
    }

    #[test]
    fn a_group_over_the_bound_is_split_in_order_into_even_parts_none_alone() {
        assert_eq!(
            split(&[1, 2, 3, 4, 5, 6, 7], 3),
            vec![vec![1, 2, 3], vec![4, 5], vec![6, 7]]
        );
        assert_eq!(split(&[1, 2, 3, 4, 5], 4), vec![vec![1, 2, 3], vec![4, 5]]);
        let g = gather(&keys(&[Some("x"); 9]), 4);
        assert_eq!(
            members(&g),
            vec![vec![0, 1, 2], vec![3, 4, 5], vec![6, 7, 8]]
        );
        assert_eq!(
            g.splits,
            vec![Split {
                first: 0,
                whole: 9,
                parts: vec![3, 3, 3]
            }]
        );
        assert_eq!(
            g.groups[2].part,
            Some(Part {
                index: 3,
                of: 3,
                whole: 9
            })
        );
    }

    #[test]
    fn near_duplicates_by_shingle_jaccard_are_one_group_and_others_stay_apart() {
        let texts = [
            "Login page redirects to itself after SSO on Safari",
            "Dark mode colours wrong on the settings screen",
            "login page redirects to itself after SSO on Safari 17",
            "",
            "The export button does nothing for large reports",
            "Login page redirects to itself after SSO on Safari!",
        ];
        let sets: Vec<Vec<u64>> = texts.iter().map(|t| shingles(t, 3)).collect();
        assert!(
            jaccard(&sets[0], &sets[2]) >= 0.7,
            "{}",
            jaccard(&sets[0], &sets[2])
        );
        assert_eq!(jaccard(&sets[0], &sets[5]), 1.0);
        assert!(jaccard(&sets[0], &sets[1]) < 0.1);
        let by = Gathering::Similar {
            sets: sets.clone(),
            min_jaccard: 0.6,
        };
        let g = gather(&by, 8);
        assert_eq!(members(&g), vec![vec![0, 2, 5]]);
        assert_eq!(g.alone, vec![1, 4]);
        assert_eq!(g.ungrouped, vec![3]);
        assert_eq!(gather(&by, 8), g, "deterministic");
        // A bound under three is raised to three: no part is left alone.
        assert_eq!(gather(&by, 2), g);
        assert_eq!(split(&[0, 1, 2, 3], 2), vec![vec![0, 1], vec![2, 3]]);
    }

    #[test]
    fn minhash_agreement_estimates_jaccard() {
        let a: Vec<u64> = (0..400).collect();
        let b: Vec<u64> = (100..500).collect();
        let exact = jaccard(&a, &b);
        assert!((exact - 0.6).abs() < 1e-9);
        let (sa, sb) = (minhash(&a), minhash(&b));
        let agree = sa.iter().zip(&sb).filter(|(x, y)| x == y).count() as f64;
        let estimate = agree / SIGNATURE_LEN as f64;
        assert!((estimate - exact).abs() < 0.15, "{estimate}");
        assert_eq!(minhash(&a), sa, "fixed permutations");
        // At 0.9, 8 bands of 16 rows find a pair at the floor with
        // probability 0.80; 16 bands of 8 with 0.9999.
        assert_eq!(rows_per_band(0.9), 8);
        assert!(rows_per_band(0.3) <= 2);
    }

    #[test]
    fn a_member_that_is_one_field_of_a_record_shows_that_field_only() {
        let body = json!({"title": "crash", "body": "it crashes", "_unit_field": "body"});
        let whole = json!({"title": "crash too", "body": "same"});
        let g = group_view(vec![("7.body".into(), body), ("8".into(), whole)]).unwrap();
        let shown: Vec<&String> = g.view.as_object().unwrap().keys().collect();
        assert_eq!(shown, ["7.body.body", "8.title", "8.body"]);
    }

    #[test]
    fn a_group_view_names_each_member_s_fields_and_finds_the_uncited() {
        let v = group_view(vec![
            (
                "12".into(),
                json!({"title": "Crash on upload", "body": "b1"}),
            ),
            ("15".into(), json!({"title": "Upload crashes"})),
            ("20".into(), json!("plain text")),
        ])
        .unwrap();
        let keys: Vec<&String> = v.view.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["12.title", "12.body", "15.title", "20"]);
        assert_eq!(v.view["15.title"], "Upload crashes");
        assert_eq!(v.uncited(["12.body", "20"]), vec!["15".to_owned()]);
        assert!(v.uncited(["12.title", "15.title", "20"]).is_empty());
        let clash = group_view(vec![
            ("a.b".into(), json!({"c": 1})),
            ("a".into(), json!({"b.c": 2})),
        ]);
        assert!(matches!(clash, Err(GroupError::FieldClash { .. })));
        assert_eq!(
            group_view(vec![("1".into(), json!({}))]),
            Err(GroupError::TooSmall(1))
        );
    }

    #[test]
    fn view_text_reads_every_string_in_order() {
        assert_eq!(
            view_text(&json!({"title": "A", "labels": ["x", "y"], "n": 3, "none": null})),
            "A\nx\ny\n3"
        );
    }
}
