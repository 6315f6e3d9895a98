//! The one shape every reducer has, after DataFusion's `Accumulator`: an
//! empty state, `update` with one leaf, `merge` of two states, the state
//! itself as what a fold node caches, and `evaluate` into what the answer
//! states. Each reducer lives in its own file; this one holds the trait,
//! the [`Agg`] every node stores (one variant a reducer, serialized with
//! a `type` tag), and the one place a spec's [`ReducerKind`] picks its
//! reducer.

use std::collections::BTreeSet;
use std::fmt::Debug;

use fanfold_core::UnitId;
use fanfold_core::spec::ReducerKind;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::Leaf;
use super::{
    count, count_by, group_by, histogram, join, min_max, moments, pairs, ranked, ratio, set, top_k,
};

/// A reducer: its settings, borrowed from the spec, and the operations
/// over its state. Every reducer is deterministic, and `merge` is
/// associative and commutative with `empty` as its identity, so the tree
/// may group and order the leaves as it likes.
pub trait Reducer {
    /// What a fold node holds for this reducer. It carries whatever
    /// merging needs (a limit, a histogram's edges), so that two nodes
    /// merge without the spec.
    type State: AggState;

    /// The state of no leaves.
    fn empty(&self) -> Self::State;

    /// Adds one leaf; false when the leaf lacks the value the reducer
    /// reads (the fold counts it as missing).
    fn update(&self, state: &mut Self::State, leaf: &Leaf) -> bool;

    /// Folds `other` into `state`.
    fn merge(state: &mut Self::State, other: &Self::State);

    /// The one number the state stands for, what a `group_by` orders its
    /// rows by; `None` for a reducer that states no one number.
    fn number(&self, _state: &Self::State) -> Option<f64> {
        None
    }

    /// What the state says, as the answer shows it.
    fn evaluate(&self, state: &Self::State) -> Stated;

    /// The units the statement rests on: what verify reads back and an
    /// answer naming the reducer cites.
    fn cited(&self, state: &Self::State) -> BTreeSet<UnitId>;
}

/// A reducer's state as one variant of [`Agg`]: what a fold node caches
/// as JSON.
pub trait AggState:
    Clone + Debug + PartialEq + Serialize + DeserializeOwned + Into<Agg> + Sized
{
    fn of(agg: &Agg) -> Option<&Self>;
    fn of_mut(agg: &mut Agg) -> Option<&mut Self>;
}

/// Declares [`Agg`], one variant per reducer's state, and merges two of
/// them through their reducer. A new reducer is one line here, one arm of
/// [`with_reducer`] and one entry of the tests' list of every reducer.
macro_rules! aggregates {
    ($($(#[$doc:meta])* $variant:ident($state:ty) by $reducer:ty, $tag:literal;)*) => {
        /// One reducer's state in a fold node. The JSON is the cache's
        /// format: `{"type": tag, ...the state's fields}`.
        #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
        #[serde(tag = "type", rename_all = "snake_case")]
        pub enum Agg {
            $($(#[$doc])* $variant($state),)*
        }

        impl Agg {
            /// Every variant's `type` tag.
            pub const TAGS: &[&str] = &[$($tag),*];

            /// This state's `type` tag.
            pub fn tag(&self) -> &'static str {
                match self {
                    $(Agg::$variant(_) => $tag,)*
                }
            }

            /// Folds `other` into `self`. Both come from the same reducer
            /// spec, so their variants always agree; a pair that does not
            /// is left as it is.
            pub fn merge(&mut self, other: &Agg) {
                match (self, other) {
                    $((Agg::$variant(a), Agg::$variant(b)) => <$reducer as Reducer>::merge(a, b),)*
                    _ => {}
                }
            }
        }

        $(
            impl AggState for $state {
                fn of(agg: &Agg) -> Option<&Self> {
                    match agg {
                        Agg::$variant(s) => Some(s),
                        #[allow(unreachable_patterns)]
                        _ => None,
                    }
                }
                fn of_mut(agg: &mut Agg) -> Option<&mut Self> {
                    match agg {
                        Agg::$variant(s) => Some(s),
                        #[allow(unreachable_patterns)]
                        _ => None,
                    }
                }
            }

            impl From<$state> for Agg {
                fn from(s: $state) -> Agg {
                    Agg::$variant(s)
                }
            }
        )*
    };
}

aggregates! {
    Count(count::CountState) by count::Count, "count";
    CountBy(count_by::CountByState) by count_by::CountBy<'static>, "count_by";
    Set(set::SetState) by set::Set<'static>, "set";
    Histogram(histogram::HistogramState) by histogram::Histogram<'static>, "histogram";
    MinMax(min_max::MinMaxState) by min_max::MinMax<'static>, "min_max";
    Join(join::JoinState) by join::Join<'static>, "join";
    TopK(top_k::TopKState) by top_k::TopK<'static>, "top_k";
    /// A `set` with a `limit`.
    Ranked(ranked::RankedState) by ranked::Ranked<'static>, "ranked";
    /// A `sum` or a `mean`.
    Moments(moments::MomentsState) by moments::Moments<'static>, "moments";
    Ratio(ratio::RatioState) by ratio::Ratio<'static>, "ratio";
    GroupBy(group_by::GroupByState) by group_by::GroupBy<'static>, "group_by";
    Pairs(pairs::PairsState) by pairs::Pairs<'static>, "pairs";
}

/// Runs `$body` with `$r` bound to the reducer a [`ReducerKind`] names,
/// its settings borrowed from the kind.
macro_rules! with_reducer {
    ($kind:expr, $r:ident => $body:expr) => {
        match $kind {
            ReducerKind::Count => {
                let $r = count::Count;
                $body
            }
            ReducerKind::CountBy { key } => {
                let $r = count_by::CountBy { key };
                $body
            }
            ReducerKind::Set {
                value,
                order_by,
                limit: Some(limit),
            } => {
                let $r = ranked::Ranked {
                    value: value.as_deref(),
                    order_by: order_by.as_deref(),
                    limit: *limit,
                };
                $body
            }
            ReducerKind::Set {
                value, limit: None, ..
            } => {
                let $r = set::Set {
                    value: value.as_deref(),
                };
                $body
            }
            ReducerKind::Histogram { value, edges } => {
                let $r = histogram::Histogram { value, edges };
                $body
            }
            ReducerKind::MinMax { value } => {
                let $r = min_max::MinMax { value };
                $body
            }
            ReducerKind::Join { key } => {
                let $r = join::Join { key };
                $body
            }
            ReducerKind::TopK { score, k } => {
                let $r = top_k::TopK { score, k: *k };
                $body
            }
            ReducerKind::Sum { value } => {
                let $r = moments::Moments {
                    value,
                    statistic: moments::Statistic::Sum,
                };
                $body
            }
            ReducerKind::Mean { value } => {
                let $r = moments::Moments {
                    value,
                    statistic: moments::Statistic::Mean,
                };
                $body
            }
            ReducerKind::Ratio {
                pointer,
                numerator,
                denominator,
            } => {
                let $r = ratio::Ratio {
                    pointer,
                    numerator,
                    denominator,
                };
                $body
            }
            ReducerKind::GroupBy {
                key,
                reduce,
                order,
                limit,
            } => {
                let $r = group_by::GroupBy {
                    key,
                    reduce,
                    order: *order,
                    limit: *limit,
                };
                $body
            }
            ReducerKind::Pairs {
                key,
                value,
                relation,
                limit,
            } => {
                let $r = pairs::Pairs {
                    key,
                    value,
                    relation,
                    limit: *limit,
                };
                $body
            }
        }
    };
}

/// The empty state of a reducer of `kind`.
pub fn empty_agg(kind: &ReducerKind) -> Agg {
    with_reducer!(kind, r => r.empty().into())
}

/// Adds one leaf to an aggregate of `kind`; false when the leaf lacks the
/// value (or the aggregate is not of `kind`).
pub fn update(kind: &ReducerKind, agg: &mut Agg, leaf: &Leaf) -> bool {
    fn with<R: Reducer>(r: &R, agg: &mut Agg, leaf: &Leaf) -> bool {
        R::State::of_mut(agg).is_some_and(|s| r.update(s, leaf))
    }
    with_reducer!(kind, r => with(&r, agg, leaf))
}

/// States the aggregate of a reducer of `kind`.
pub fn state(kind: &ReducerKind, agg: &Agg) -> Stated {
    fn with<R: Reducer>(r: &R, agg: &Agg) -> Stated {
        R::State::of(agg).map(|s| r.evaluate(s)).unwrap_or_default()
    }
    with_reducer!(kind, r => with(&r, agg))
}

/// The units whose facts an aggregate's statement rests on: what verify
/// reads back and an answer naming the reducer cites. A `count` and a
/// `histogram` keep no ids; a `group_by` cites the rows it shows, a
/// `pairs` the pairs it lists.
pub fn cited(kind: &ReducerKind, agg: &Agg) -> BTreeSet<UnitId> {
    fn with<R: Reducer>(r: &R, agg: &Agg) -> BTreeSet<UnitId> {
        R::State::of(agg).map(|s| r.cited(s)).unwrap_or_default()
    }
    with_reducer!(kind, r => with(&r, agg))
}

impl Agg {
    /// The one number an aggregate of `kind` states: what a `group_by`
    /// orders its rows by. `None` for the kinds that state no one number.
    pub fn number(&self, kind: &ReducerKind) -> Option<f64> {
        fn with<R: Reducer>(r: &R, agg: &Agg) -> Option<f64> {
            R::State::of(agg).and_then(|s| r.number(s))
        }
        with_reducer!(kind, r => with(&r, self))
    }
}

/// What one reducer's aggregate says, as the answer shows it: a sentence
/// and, where it has rows, a table of text cells.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Stated {
    pub statement: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub columns: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rows: Vec<Vec<String>>,
}

impl Stated {
    /// A statement alone.
    pub fn sentence(statement: String) -> Stated {
        Stated {
            statement,
            ..Stated::default()
        }
    }

    /// A statement with a table under it.
    pub fn table(statement: String, columns: &[&str], rows: Vec<Vec<String>>) -> Stated {
        Stated {
            statement,
            columns: columns.iter().map(|c| (*c).to_owned()).collect(),
            rows,
        }
    }
}

/// A value as a group or set key: a string as itself, anything else as
/// its JSON.
pub fn as_key(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// At most this many ids are listed in one cell.
const LISTED: usize = 5;

/// The first ids, `#`-marked, and how many more there are.
pub fn listed<'a>(ids: impl IntoIterator<Item = &'a UnitId>) -> String {
    let all: Vec<&str> = ids.into_iter().map(|i| i.0.as_str()).collect();
    let mut out = all
        .iter()
        .take(LISTED)
        .map(|i| format!("#{i}"))
        .collect::<Vec<_>>()
        .join(", ");
    if all.len() > LISTED {
        out.push_str(&format!(" and {} more", all.len() - LISTED));
    }
    out
}

/// "1 fact", "3 facts".
pub fn facts(n: u64) -> String {
    if n == 1 {
        "1 fact".to_owned()
    } else {
        format!("{n} facts")
    }
}

/// A number as a statement shows it: to four decimals, no trailing zeros.
pub fn figure(x: f64) -> String {
    let r = (x * 1e4).round() / 1e4;
    format!("{r}")
}

/// Orders ranked entries (`top_k`, a limited `set`): higher number first,
/// then smaller unit id, then the text beside it. A total order, so the
/// best of any grouping agree.
pub fn rank(a: &(f64, UnitId, String), b: &(f64, UnitId, String)) -> std::cmp::Ordering {
    b.0.total_cmp(&a.0)
        .then_with(|| a.1.cmp(&b.1))
        .then_with(|| a.2.cmp(&b.2))
}
