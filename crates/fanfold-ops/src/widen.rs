//! Widening: the related units a unit is read with, and the view that
//! shows them to a model.
//!
//! A group relates units by a key (same author, same thread), by time (within
//! a window of each other) or by near-duplication (embedding similarity at
//! or above a floor). A widened unit is shown with its `k` nearest group
//! members, nearest first, as many as fit a token bound. The view is a pure
//! function of the unit's projected view and its members' (id, projected
//! view) in order, so the answer's verify phase rebuilds it from the ids a
//! fact cites, and a cache key over the view covers every member shown.

use std::collections::HashMap;

use serde_json::{Map, Value};

/// The key under which a widened view lists the related units.
pub const RELATED: &str = "related";

/// How the units of a table are related, one entry per table position.
#[derive(Clone, Debug)]
pub enum Grouping {
    /// Units with an equal key are one group; a unit without one (`None`)
    /// has no group.
    Key(Vec<Option<String>>),
    /// Units whose times (seconds) are at most `within` apart.
    Time { at: Vec<Option<f64>>, within: f64 },
    /// Units whose vectors have a cosine similarity of at least
    /// `min_similarity` (vectors are compared as given; an embed stage's
    /// are unit length).
    Near {
        vectors: Vec<Option<Vec<f32>>>,
        min_similarity: f64,
    },
}

/// Candidate members, nearest first, with a precomputed index where one
/// pays: built once per table and asked for many units.
pub struct Groups<'a> {
    grouping: &'a Grouping,
    ordinals: &'a [u64],
    by_key: HashMap<&'a str, Vec<usize>>,
    by_time: Vec<(f64, usize)>,
}

impl<'a> Groups<'a> {
    /// `ordinals` orders the units as the source does; ties in distance go
    /// to the unit nearer in source order, then the earlier one.
    pub fn new(grouping: &'a Grouping, ordinals: &'a [u64]) -> Groups<'a> {
        let mut by_key: HashMap<&str, Vec<usize>> = HashMap::new();
        let mut by_time = Vec::new();
        match grouping {
            Grouping::Key(keys) => {
                for (i, k) in keys.iter().enumerate() {
                    if let Some(k) = k {
                        by_key.entry(k.as_str()).or_default().push(i);
                    }
                }
            }
            Grouping::Time { at, .. } => {
                by_time = at
                    .iter()
                    .enumerate()
                    .filter_map(|(i, t)| t.map(|t| (t, i)))
                    .collect();
                by_time.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            }
            Grouping::Near { .. } => {}
        }
        Groups {
            grouping,
            ordinals,
            by_key,
            by_time,
        }
    }

    /// Every group member of `unit` but itself, nearest first.
    pub fn candidates(&self, unit: usize) -> Vec<usize> {
        let mut scored: Vec<(f64, usize)> = match self.grouping {
            Grouping::Key(keys) => {
                let Some(Some(key)) = keys.get(unit) else {
                    return Vec::new();
                };
                self.by_key
                    .get(key.as_str())
                    .map(|members| members.iter().map(|&m| (0.0, m)).collect())
                    .unwrap_or_default()
            }
            Grouping::Time { at, within } => {
                let Some(Some(t)) = at.get(unit) else {
                    return Vec::new();
                };
                let from = self.by_time.partition_point(|(s, _)| *s < t - within);
                self.by_time
                    .get(from..)
                    .unwrap_or_default()
                    .iter()
                    .take_while(|(s, _)| *s <= t + within)
                    .map(|&(s, m)| ((s - t).abs(), m))
                    .collect()
            }
            Grouping::Near {
                vectors,
                min_similarity,
            } => {
                let Some(Some(v)) = vectors.get(unit) else {
                    return Vec::new();
                };
                vectors
                    .iter()
                    .enumerate()
                    .filter_map(|(m, w)| {
                        let sim = cosine(v, w.as_ref()?);
                        (sim >= *min_similarity).then_some((-sim, m))
                    })
                    .collect()
            }
        };
        scored.retain(|&(_, m)| m != unit);
        let place = |m: usize| self.ordinals.get(m).copied().unwrap_or(u64::MAX);
        let here = place(unit);
        scored.sort_by(|a, b| {
            a.0.total_cmp(&b.0)
                .then_with(|| place(a.1).abs_diff(here).cmp(&place(b.1).abs_diff(here)))
                .then_with(|| place(a.1).cmp(&place(b.1)))
        });
        scored.into_iter().map(|(_, m)| m).collect()
    }
}

/// The members a widened context shows: of the `k` nearest candidates,
/// those that fit `max_tokens` together, nearest first (a member too large
/// is left out, a smaller one after it may still fit); and how many of the
/// `k` the bound left out.
pub fn within_bound<E>(
    candidates: &[usize],
    k: usize,
    max_tokens: u64,
    mut tokens: impl FnMut(usize) -> Result<u64, E>,
) -> Result<(Vec<usize>, u64), E> {
    let mut kept = Vec::new();
    let mut left_out = 0;
    let mut used = 0u64;
    for &m in candidates.iter().take(k) {
        let t = tokens(m)?;
        if used + t <= max_tokens {
            used += t;
            kept.push(m);
        } else {
            left_out += 1;
        }
    }
    Ok((kept, left_out))
}

/// Why a widened view cannot be built.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum WidenError {
    #[error("the projected view must be a JSON object to be widened, not {0}")]
    NotAnObject(&'static str),
    #[error("the projected view already has a `{RELATED}` field; rename it in the projection")]
    Taken,
}

/// The unit's view with its members: the unit's own fields as they are,
/// plus `related`, a list of `{"id", "record"}` in the order given.
pub fn widened_view(unit: Value, members: Vec<(String, Value)>) -> Result<Value, WidenError> {
    let Value::Object(mut fields) = unit else {
        return Err(WidenError::NotAnObject(kind_of(&unit)));
    };
    if fields.contains_key(RELATED) {
        return Err(WidenError::Taken);
    }
    let related = members
        .into_iter()
        .map(|(id, record)| {
            let mut m = Map::new();
            m.insert("id".into(), Value::String(id));
            m.insert("record".into(), record);
            Value::Object(m)
        })
        .collect();
    fields.insert(RELATED.into(), Value::Array(related));
    Ok(Value::Object(fields))
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    if a.len() != b.len() {
        return f64::NEG_INFINITY;
    }
    let (mut dot, mut na, mut nb) = (0.0f64, 0.0f64, 0.0f64);
    for (x, y) in a.iter().zip(b) {
        let (x, y) = (f64::from(*x), f64::from(*y));
        dot += x * y;
        na += x * x;
        nb += y * y;
    }
    if na == 0.0 || nb == 0.0 {
        return f64::NEG_INFINITY;
    }
    dot / (na.sqrt() * nb.sqrt())
}

/// The key a unit's group is found by: a jq output rendered as compact
/// JSON, so `"7"` and `7` are different keys and `null` is no key.
pub fn key_text(v: &Value) -> Option<String> {
    match v {
        Value::Null => None,
        Value::String(s) if s.is_empty() => None,
        other => Some(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn key_groups_list_the_nearest_in_source_order_first() {
        let g = Grouping::Key(vec![
            Some("a".into()),
            Some("b".into()),
            Some("a".into()),
            None,
            Some("a".into()),
            Some("a".into()),
        ]);
        let ordinals = [0, 1, 2, 3, 4, 5];
        let groups = Groups::new(&g, &ordinals);
        assert_eq!(groups.candidates(4), vec![5, 2, 0]);
        assert_eq!(groups.candidates(1), Vec::<usize>::new());
        assert_eq!(groups.candidates(3), Vec::<usize>::new());
        // Equal distance: the earlier unit first.
        assert_eq!(groups.candidates(2), vec![0, 4, 5]);
    }

    #[test]
    fn time_groups_hold_what_lies_within_the_window() {
        let g = Grouping::Time {
            at: vec![Some(100.0), Some(160.0), Some(400.0), None, Some(90.0)],
            within: 60.0,
        };
        let ordinals = [0, 1, 2, 3, 4];
        let groups = Groups::new(&g, &ordinals);
        assert_eq!(groups.candidates(0), vec![4, 1]);
        assert_eq!(groups.candidates(1), vec![0]);
        assert_eq!(groups.candidates(2), Vec::<usize>::new());
        assert_eq!(groups.candidates(3), Vec::<usize>::new());
    }

    #[test]
    fn near_groups_rank_by_similarity_above_the_floor() {
        let g = Grouping::Near {
            vectors: vec![
                Some(vec![1.0, 0.0]),
                Some(vec![0.8, 0.6]),
                Some(vec![0.0, 1.0]),
                Some(vec![0.99, 0.141]),
                None,
            ],
            min_similarity: 0.7,
        };
        let ordinals = [0, 1, 2, 3, 4];
        let groups = Groups::new(&g, &ordinals);
        assert_eq!(groups.candidates(0), vec![3, 1]);
        assert_eq!(groups.candidates(2), Vec::<usize>::new());
        assert_eq!(groups.candidates(4), Vec::<usize>::new());
    }

    #[test]
    fn the_bound_keeps_the_nearest_that_fit() {
        let sizes = [10, 50, 20, 5, 5];
        let size = |m: usize| Ok::<u64, ()>(sizes[m]);
        let (kept, left) = within_bound(&[0, 1, 2, 3, 4], 4, 40, size).unwrap();
        assert_eq!(kept, vec![0, 2, 3]);
        assert_eq!(left, 1);
        let (kept, left) = within_bound(&[0, 1, 2], 2, 1000, size).unwrap();
        assert_eq!(kept, vec![0, 1]);
        assert_eq!(left, 0);
    }

    #[test]
    fn a_widened_view_keeps_the_unit_and_lists_members_in_order() {
        let v = widened_view(
            json!({"title": "t"}),
            vec![("2".into(), json!({"title": "u"})), ("9".into(), json!(1))],
        )
        .unwrap();
        assert_eq!(
            v,
            json!({"title": "t", "related": [
                {"id": "2", "record": {"title": "u"}},
                {"id": "9", "record": 1}
            ]})
        );
        assert_eq!(
            widened_view(json!("x"), vec![]),
            Err(WidenError::NotAnObject("a string"))
        );
        assert_eq!(
            widened_view(json!({"related": 1}), vec![]),
            Err(WidenError::Taken)
        );
    }

    #[test]
    fn keys_are_typed_and_null_is_none() {
        assert_eq!(key_text(&json!("7")), Some("\"7\"".into()));
        assert_eq!(key_text(&json!(7)), Some("7".into()));
        assert_eq!(key_text(&json!(null)), None);
        assert_eq!(key_text(&json!("")), None);
    }
}
