//! `group_by`: one state of an inner reducer (`reduce`) per value at
//! `key`, stated as rows in `order`, cut to `limit`.

use std::collections::{BTreeMap, BTreeSet};

use fanfold_core::UnitId;
use fanfold_core::spec::{Order, ReducerKind};
use serde::{Deserialize, Serialize};

use super::Leaf;
use super::reducer::state as state_of;
use super::reducer::{Agg, Reducer, Stated, as_key, cited, empty_agg, figure, update};

pub struct GroupBy<'a> {
    pub key: &'a str,
    pub reduce: &'a ReducerKind,
    pub order: Order,
    pub limit: Option<usize>,
}

/// One aggregate per group key.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GroupByState {
    pub groups: BTreeMap<String, Agg>,
}

impl Reducer for GroupBy<'_> {
    type State = GroupByState;

    fn empty(&self) -> GroupByState {
        GroupByState {
            groups: BTreeMap::new(),
        }
    }

    fn update(&self, state: &mut GroupByState, leaf: &Leaf) -> bool {
        let Some(k) = leaf.at(self.key).map(as_key) else {
            return false;
        };
        // A group holds only what fed it: a leaf without the inner value
        // opens no group.
        if let Some(inner) = state.groups.get_mut(&k) {
            return update(self.reduce, inner, leaf);
        }
        let mut inner = empty_agg(self.reduce);
        if !update(self.reduce, &mut inner, leaf) {
            return false;
        }
        state.groups.insert(k, inner);
        true
    }

    fn merge(state: &mut GroupByState, other: &GroupByState) {
        for (k, agg) in &other.groups {
            match state.groups.get_mut(k) {
                Some(mine) => mine.merge(agg),
                None => {
                    state.groups.insert(k.clone(), agg.clone());
                }
            }
        }
    }

    fn evaluate(&self, state: &GroupByState) -> Stated {
        let reduce = self.reduce;
        let rows = group_rows(&state.groups, reduce, self.order, self.limit);
        Stated::table(
            format!(
                "{} of {} groups, by {} ({})",
                rows.len(),
                state.groups.len(),
                reduce.type_name(),
                match self.order {
                    Order::Desc => "largest first",
                    Order::Asc => "smallest first",
                    Order::Key => "by key",
                }
            ),
            &["key", reduce.type_name(), "stated"],
            rows.into_iter()
                .map(|(k, a, x)| {
                    vec![
                        k.to_owned(),
                        x.map(figure).unwrap_or_else(|| "-".into()),
                        state_of(reduce, a).statement,
                    ]
                })
                .collect(),
        )
    }

    /// The units of the rows it shows.
    fn cited(&self, state: &GroupByState) -> BTreeSet<UnitId> {
        group_rows(&state.groups, self.reduce, self.order, self.limit)
            .into_iter()
            .flat_map(|(_, a, _)| cited(self.reduce, a))
            .collect()
    }
}

/// The rows of a `group_by`, in its order and cut to its limit: each key
/// with its aggregate and number.
pub fn group_rows<'a>(
    groups: &'a BTreeMap<String, Agg>,
    reduce: &ReducerKind,
    order: Order,
    limit: Option<usize>,
) -> Vec<(&'a str, &'a Agg, Option<f64>)> {
    let mut rows: Vec<(&str, &Agg, Option<f64>)> = groups
        .iter()
        .map(|(k, a)| (k.as_str(), a, a.number(reduce)))
        .collect();
    if order != Order::Key {
        // A row without a number goes last either way; ties by key.
        rows.sort_by(|a, b| {
            a.2.is_none()
                .cmp(&b.2.is_none())
                .then_with(|| match (a.2, b.2) {
                    (Some(x), Some(y)) if order == Order::Asc => x.total_cmp(&y),
                    (Some(x), Some(y)) => y.total_cmp(&x),
                    _ => std::cmp::Ordering::Equal,
                })
                .then_with(|| a.0.cmp(b.0))
        });
    }
    if let Some(n) = limit {
        rows.truncate(n);
    }
    rows
}
