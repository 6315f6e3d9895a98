use std::collections::BTreeSet;

use fanfold_core::spec::{Order, ReducerKind, Relation};
use proptest::prelude::*;
use serde_json::json;

use super::*;

pub(super) fn spec(fan_in: usize) -> FoldSpec {
    FoldSpec {
        fan_in,
        reducers: every_reducer(),
    }
}

/// Every reducer, in each of its shapes: the property tests run each of
/// them, so a new reducer is covered once it is listed here (and
/// `the_list_holds_every_reducer` fails until it is).
fn every_reducer() -> Vec<ReducerSpec> {
    let r = |name: &str, kind: ReducerKind| ReducerSpec {
        name: name.into(),
        stage: None,
        statuses: None,
        dedupe: None,
        kind,
    };
    let mut simple = vec![
        r("n", ReducerKind::Count),
        r(
            "by_cause",
            ReducerKind::CountBy {
                key: "/cause".into(),
            },
        ),
        r(
            "ids",
            ReducerKind::Set {
                value: None,
                order_by: None,
                limit: None,
            },
        ),
        r(
            "hist",
            ReducerKind::Histogram {
                value: "/score".into(),
                edges: vec![0.25, 0.5, 0.75],
            },
        ),
        r(
            "range",
            ReducerKind::MinMax {
                value: "/score".into(),
            },
        ),
        r(
            "join",
            ReducerKind::Join {
                key: "/cause".into(),
            },
        ),
        r(
            "top",
            ReducerKind::TopK {
                score: "/score".into(),
                k: 3,
            },
        ),
        ReducerSpec {
            name: "all".into(),
            stage: None,
            statuses: Some(Status::ALL.to_vec()),
            dedupe: None,
            kind: ReducerKind::Count,
        },
        r(
            "total",
            ReducerKind::Sum {
                value: "/score".into(),
            },
        ),
        r(
            "mean",
            ReducerKind::Mean {
                value: "/score".into(),
            },
        ),
    ];
    simple.extend(composite_reducers());
    simple
}

/// The reducers of [`every_reducer`] over sides, groups and pairs.
fn composite_reducers() -> Vec<ReducerSpec> {
    let r = |name: &str, kind: ReducerKind| ReducerSpec {
        name: name.into(),
        stage: None,
        statuses: None,
        dedupe: None,
        kind,
    };
    vec![
        r(
            "share_x",
            ReducerKind::Ratio {
                pointer: "/cause".into(),
                numerator: vec!["x".into()],
                denominator: vec!["y".into(), "z".into()],
            },
        ),
        r(
            "mean_by_cause",
            ReducerKind::GroupBy {
                key: "/cause".into(),
                reduce: Box::new(ReducerKind::Mean {
                    value: "/score".into(),
                }),
                order: Order::Desc,
                limit: Some(2),
            },
        ),
        r(
            "opposite",
            ReducerKind::Pairs {
                key: "/cause".into(),
                value: "/score".into(),
                relation: Relation::Different,
                limit: Some(5),
            },
        ),
        r(
            "far_apart_by_film",
            ReducerKind::Pairs {
                key: "unit:/film".into(),
                value: "/score".into(),
                relation: Relation::Jq("(.a - .b) | fabs >= 0.5".into()),
                limit: Some(7),
            },
        ),
        r(
            "mean_by_film",
            ReducerKind::GroupBy {
                key: "unit:/film".into(),
                reduce: Box::new(ReducerKind::Mean {
                    value: "/score".into(),
                }),
                order: Order::Asc,
                limit: None,
            },
        ),
        r(
            "best_three",
            ReducerKind::Set {
                value: Some("/cause".into()),
                order_by: Some("/score".into()),
                limit: Some(3),
            },
        ),
        r(
            "first_four",
            ReducerKind::Set {
                value: None,
                order_by: None,
                limit: Some(4),
            },
        ),
    ]
}

/// Counting reducers with a `dedupe`. Near-duplicates are found over
/// every leaf before the tree: a collapse that hung on the order or
/// grouping of the leaves would fail the property test. Kept apart from
/// [`every_reducer`], whose fold's keys are pinned.
fn deduped_reducers() -> Vec<ReducerSpec> {
    let r = |name: &str, kind: ReducerKind, threshold: f64| ReducerSpec {
        name: name.into(),
        stage: None,
        statuses: None,
        dedupe: Some(by_cause(threshold)),
        kind,
    };
    vec![
        r("incidents", ReducerKind::Count, 0.5),
        r(
            "incidents_by_film",
            ReducerKind::GroupBy {
                key: "unit:/film".into(),
                reduce: Box::new(ReducerKind::Count),
                order: Order::Key,
                limit: None,
            },
            1.0,
        ),
    ]
}

fn by_cause(threshold: f64) -> fanfold_core::spec::dedupe::DedupeSpec {
    fanfold_core::spec::dedupe::DedupeSpec {
        method: fanfold_core::spec::dedupe::DedupeMethod::Minhash,
        threshold,
        field: "/cause".into(),
        shingle_chars: 5,
        seed: 7,
    }
}

fn leaf_strategy() -> impl Strategy<Value = Leaf> {
    (0u32..40, 0usize..6, 0usize..4, 0u32..5, 0usize..2).prop_map(
        |(id, st, cause, score, stage)| Leaf {
            unit_id: UnitId(format!("{id}")),
            stage: ["a", "b"][stage].into(),
            status: Status::ALL[st],
            facts: {
                let causes = [json!("x"), json!("y"), json!("z"), Value::Null];
                json!({"cause": causes[cause].clone(), "score": f64::from(score) * 2.5})
            },
            unit: json!({"unit:/film": format!("f{}", id % 3)}),
        },
    )
}

fn dedup(mut leaves: Vec<Leaf>) -> Vec<Leaf> {
    // A unit has one outcome per stage.
    let mut seen = std::collections::HashSet::new();
    leaves.retain(|l| seen.insert((l.unit_id.clone(), l.stage.clone())));
    leaves
}

/// A seeded Fisher-Yates shuffle.
fn shuffled(leaves: &[Leaf], seed: u64) -> Vec<Leaf> {
    let mut out = leaves.to_vec();
    let mut s = seed;
    for i in (1..out.len()).rev() {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let j = (s >> 33) as usize % (i + 1);
        out.swap(i, j);
    }
    out
}

/// The one body every reducer is tested by: the tree agrees with the
/// flat fold at one fan-in, and again over the leaves reordered at
/// another; the empty state is the merge's identity; the value survives
/// the JSON nodes are cached as.
fn reorder_and_regroup_hold(
    reducer: &ReducerSpec,
    leaves: &[Leaf],
    seed: u64,
    fan_a: usize,
    fan_b: usize,
) -> Result<(), TestCaseError> {
    let alone = |fan_in| FoldSpec {
        fan_in,
        reducers: vec![reducer.clone()],
    };
    let name = &reducer.name;
    let flat = fold_flat(&alone(fan_a), leaves);
    let tree = fold_tree(&alone(fan_a), leaves, &mut NoCache).root;
    prop_assert_eq!(&tree, &flat, "{} grouped by {}", name, fan_a);
    let regrouped = fold_tree(&alone(fan_b), &shuffled(leaves, seed), &mut NoCache).root;
    prop_assert_eq!(
        &regrouped,
        &flat,
        "{} reordered, grouped by {}",
        name,
        fan_b
    );
    let mut with_empty = FoldValue::empty(&alone(fan_a));
    with_empty.merge(&flat);
    prop_assert_eq!(&with_empty, &flat, "{} merged into its empty state", name);
    let json = serde_json::to_value(&flat).expect("a fold value is JSON");
    let back: FoldValue = serde_json::from_value(json).expect("and back");
    prop_assert_eq!(&back, &flat, "{} through JSON", name);
    Ok(())
}

proptest! {
    #[test]
    fn reorder_and_regroup_never_change_any_reducer(
        leaves in prop::collection::vec(leaf_strategy(), 0..60).prop_map(dedup),
        seed in any::<u64>(),
        fan_a in 2usize..9,
        fan_b in 2usize..9,
    ) {
        for reducer in every_reducer().into_iter().chain(deduped_reducers()) {
            reorder_and_regroup_hold(&reducer, &leaves, seed, fan_a, fan_b)?;
        }
        // All of them in one fold, as a spec has them.
        let flat = fold_flat(&spec(fan_a), &leaves);
        let regrouped = fold_tree(&spec(fan_b), &shuffled(&leaves, seed), &mut NoCache).root;
        prop_assert_eq!(&regrouped, &flat);
    }
}

#[test]
fn the_list_holds_every_reducer() {
    let listed: BTreeSet<&str> = every_reducer()
        .iter()
        .map(|r| reducer::empty_agg(&r.kind).tag())
        .collect();
    let all: BTreeSet<&str> = Agg::TAGS.iter().copied().collect();
    assert_eq!(listed, all);
    // The tag is the one the cache's JSON carries.
    for r in every_reducer() {
        let agg = reducer::empty_agg(&r.kind);
        let json = serde_json::to_value(&agg).expect("an aggregate is JSON");
        assert_eq!(json["type"], agg.tag(), "{}", r.name);
    }
}

fn scored(id: &str, film: &str, score: f64, sentiment: &str) -> Leaf {
    Leaf {
        unit_id: UnitId(id.into()),
        stage: "a".into(),
        status: Status::Positive,
        facts: json!({"film": film, "score": score, "sentiment": sentiment}),
        unit: Value::Null,
    }
}

#[test]
fn a_mean_is_exact_and_states_its_count_and_standard_error() {
    let spec = FoldSpec {
        fan_in: 2,
        reducers: vec![ReducerSpec {
            name: "m".into(),
            stage: None,
            statuses: None,
            dedupe: None,
            kind: ReducerKind::Mean {
                value: "/score".into(),
            },
        }],
    };
    // 0.1 + 0.2 is not 0.3 in floating point; in fixed point it is.
    let leaves = [
        scored("1", "a", 0.1, "pos"),
        scored("2", "a", 0.2, "pos"),
        scored("3", "a", 0.3, "neg"),
    ];
    let root = fold_flat(&spec, &leaves);
    let Some(Agg::Moments(MomentsState {
        n,
        sum,
        sum_sq,
        ids,
    })) = root.reducers.get("m")
    else {
        panic!("{root:?}");
    };
    assert_eq!(*n, 3);
    assert_eq!(*sum, 600_000_000);
    assert_eq!(ids.len(), 3);
    let m = moments(*n, *sum, *sum_sq);
    assert_eq!(m.mean, Some(0.2));
    // The sample standard deviation of 0.1, 0.2, 0.3 is 0.1.
    let se = m.standard_error.expect("three facts");
    assert!((se - 0.1 / 3f64.sqrt()).abs() < 1e-12, "{se}");
}

#[test]
fn groups_rank_by_their_number_and_pairs_come_in_a_stable_order() {
    let mean = ReducerKind::Mean {
        value: "/score".into(),
    };
    let spec = FoldSpec {
        fan_in: 3,
        reducers: vec![
            ReducerSpec {
                name: "by_film".into(),
                stage: None,
                statuses: None,
                dedupe: None,
                kind: ReducerKind::GroupBy {
                    key: "/film".into(),
                    reduce: Box::new(mean.clone()),
                    order: Order::Desc,
                    limit: Some(2),
                },
            },
            ReducerSpec {
                name: "opposite".into(),
                stage: None,
                statuses: None,
                dedupe: None,
                kind: ReducerKind::Pairs {
                    key: "/film".into(),
                    value: "/sentiment".into(),
                    relation: Relation::Different,
                    limit: None,
                },
            },
            ReducerSpec {
                name: "share".into(),
                stage: None,
                statuses: None,
                dedupe: None,
                kind: ReducerKind::Ratio {
                    pointer: "/sentiment".into(),
                    numerator: vec!["pos".into()],
                    denominator: vec!["neg".into()],
                },
            },
        ],
    };
    let leaves = [
        scored("1", "alien", 5.0, "pos"),
        scored("2", "alien", 1.0, "neg"),
        scored("3", "brazil", 4.0, "pos"),
        scored("4", "brazil", 4.0, "pos"),
        scored("5", "cube", 2.0, "neg"),
        scored("6", "alien", 4.0, "pos"),
    ];
    let root = fold_tree(&spec, &leaves, &mut NoCache).root;
    let Some(Agg::GroupBy(GroupByState { groups })) = root.reducers.get("by_film") else {
        panic!("{root:?}");
    };
    let rows = group_rows(groups, &mean, Order::Desc, Some(2));
    let ranked: Vec<(&str, Option<f64>)> = rows.iter().map(|r| (r.0, r.2)).collect();
    assert_eq!(ranked, [("brazil", Some(4.0)), ("alien", Some(10.0 / 3.0))]);
    let asc = group_rows(groups, &mean, Order::Asc, None);
    assert_eq!(asc.first().map(|r| r.0), Some("cube"));
    let Some(Agg::Pairs(PairsState { members })) = root.reducers.get("opposite") else {
        panic!("{root:?}");
    };
    let ids = |found: Vec<Pair>| -> Vec<(String, String)> {
        found.into_iter().map(|p| (p.a.0, p.b.0)).collect()
    };
    // Alien's negative review against each positive one; brazil agrees.
    let found = ids(pairs(members, &Relation::Different, None).0);
    assert_eq!(found, [("1".into(), "2".into()), ("2".into(), "6".into())]);
    assert_eq!(pairs(members, &Relation::Equal, Some(1)).0.len(), 1);
    // A declared predicate sees both values and the key.
    let jq = Relation::Jq(r#".key == "alien" and .a == "pos" and .b == "pos""#.into());
    let (found, failed) = pairs(members, &jq, None);
    assert_eq!(ids(found), [("1".into(), "6".into())]);
    assert_eq!(failed, None);
    // One that fails says so, and holds nowhere.
    let (found, failed) = pairs(members, &Relation::Jq(".a - .b > 0".into()), None);
    assert!(found.is_empty());
    let (struck, error) = failed.expect("strings cannot be subtracted");
    assert_eq!(struck, 4, "{error}");
    let Some(
        share @ Agg::Ratio(RatioState {
            numerator,
            denominator,
        }),
    ) = root.reducers.get("share")
    else {
        panic!("{root:?}");
    };
    assert_eq!((numerator.len(), denominator.len()), (4, 2));
    let kind = &spec.reducers[2].kind;
    assert_eq!(share.number(kind), Some(4.0 / 6.0));
    let (lo, hi) = wilson(4, 6);
    assert!(
        lo < 4.0 / 6.0 && 4.0 / 6.0 < hi && lo > 0.2 && hi < 0.95,
        "{lo} {hi}"
    );
}

#[test]
fn a_limited_set_keeps_its_best_units_and_unit_fields_key_groups() {
    let r = |name: &str, kind| ReducerSpec {
        name: name.into(),
        stage: None,
        statuses: None,
        dedupe: None,
        kind,
    };
    let spec = FoldSpec {
        fan_in: 2,
        reducers: vec![
            r(
                "best",
                ReducerKind::Set {
                    value: None,
                    order_by: Some("/score".into()),
                    limit: Some(2),
                },
            ),
            r(
                "by_release",
                ReducerKind::GroupBy {
                    key: "unit:/release".into(),
                    reduce: Box::new(ReducerKind::Count),
                    order: Order::Key,
                    limit: None,
                },
            ),
        ],
    };
    let with_release = |id: &str, score: f64, release: &str| Leaf {
        unit: json!({ "unit:/release": release }),
        ..scored(id, "alien", score, "pos")
    };
    let leaves = [
        with_release("1", 3.0, "1979"),
        with_release("2", 5.0, "1986"),
        with_release("3", 5.0, "1979"),
        with_release("4", 1.0, "1986"),
        // No unit field: it opens no group, and is counted missing.
        scored("5", "alien", 4.0, "pos"),
    ];
    let root = fold_tree(&spec, &leaves, &mut NoCache).root;
    let Some(best @ Agg::Ranked(RankedState { items, .. })) = root.reducers.get("best") else {
        panic!("{root:?}");
    };
    // The two highest, the tie broken by unit id.
    let kept: Vec<(f64, &str)> = items.iter().map(|(x, id, _)| (*x, id.as_str())).collect();
    assert_eq!(kept, [(5.0, "2"), (5.0, "3")]);
    let statement = state(&spec.reducers[0].kind, best).statement;
    assert_eq!(statement, "2 units (the first 2)");
    let Some(Agg::GroupBy(GroupByState { groups })) = root.reducers.get("by_release") else {
        panic!("{root:?}");
    };
    let counts: Vec<(&str, Option<f64>)> =
        group_rows(groups, &ReducerKind::Count, Order::Key, None)
            .into_iter()
            .map(|(k, _, x)| (k, x))
            .collect();
    assert_eq!(counts, [("1979", Some(2.0)), ("1986", Some(2.0))]);
    assert_eq!(root.missing.get("by_release"), Some(&1));
    let best_cites = cited(&spec.reducers[0].kind, best);
    let ids: Vec<&str> = best_cites.iter().map(UnitId::as_str).collect();
    assert_eq!(ids, ["2", "3"]);
    // A count keeps no ids, so a grouped count cites none.
    assert!(cited(&spec.reducers[1].kind, &root.reducers["by_release"]).is_empty());
}

#[test]
fn top_k_breaks_ties_by_unit_id() {
    let spec = spec(2);
    let leaves: Vec<Leaf> = ["d", "b", "c", "a"]
        .iter()
        .map(|id| Leaf {
            unit_id: UnitId((*id).into()),
            stage: "a".into(),
            status: Status::Positive,
            facts: json!({"score": 1.0}),
            unit: Value::Null,
        })
        .collect();
    let root = fold_tree(&spec, &leaves, &mut NoCache).root;
    match root.reducers.get("top") {
        Some(Agg::TopK(TopKState { items, .. })) => {
            let ids: Vec<&str> = items.iter().map(|(_, id, _)| id.as_str()).collect();
            assert_eq!(ids, ["a", "b", "c"]);
        }
        other => panic!("unexpected {other:?}"),
    }
}
