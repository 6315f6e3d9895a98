//! The tree's own tests: node reuse, group sizes, and the keys and cached
//! JSON of stored nodes, pinned.

use std::collections::{BTreeSet, HashMap};

use serde_json::json;

use super::tests::spec;
use super::*;

#[derive(Default)]
struct MapCache(HashMap<ContentHash, FoldValue>);
impl NodeCache for MapCache {
    fn get(&mut self, key: &ContentHash) -> Option<FoldValue> {
        self.0.get(key).cloned()
    }
    fn put(&mut self, key: &ContentHash, _: u32, value: &FoldValue) {
        self.0.insert(*key, value.clone());
    }
}

#[test]
fn one_changed_leaf_recomputes_one_path() {
    let leaves: Vec<Leaf> = (0..1000)
        .map(|i| Leaf {
            unit_id: UnitId(format!("{i}")),
            stage: "a".into(),
            status: if i % 7 == 0 {
                Status::Positive
            } else {
                Status::Negative
            },
            facts: json!({"cause": "x", "score": 0.5}),
            unit: Value::Null,
        })
        .collect();
    let spec = spec(16);
    let mut cache = MapCache::default();
    let first = fold_tree(&spec, &leaves, &mut cache);
    assert_eq!(first.depth, 3);
    assert_eq!(first.root, fold_flat(&spec, &leaves));
    // At most 16 children a node: more nodes than 1000 / 16 a level.
    assert!(
        first.nodes_computed > 63 + 4 + 1,
        "{}",
        first.nodes_computed
    );
    let again = fold_tree(&spec, &leaves, &mut cache);
    assert_eq!((again.nodes_computed, again.root_key), (0, first.root_key));
    let mut changed = leaves.clone();
    changed[500].status = Status::Positive;
    let after = fold_tree(&spec, &changed, &mut cache);
    assert_eq!(after.nodes_computed, u64::from(after.depth));
    assert_ne!(after.root_key, first.root_key);
    assert_eq!(after.paths[500].len(), 3);
    assert_eq!(after.root, fold_flat(&spec, &changed));

    // Inserted and removed units move the groups beside them only.
    let mut inserted = leaves.clone();
    inserted.insert(
        250,
        Leaf {
            unit_id: UnitId("new".into()),
            ..leaves[0].clone()
        },
    );
    let after = fold_tree(&spec, &inserted, &mut cache);
    assert!(
        after.nodes_computed <= 2 * u64::from(after.depth),
        "{after:?}"
    );
    assert_eq!(after.root, fold_flat(&spec, &inserted));
    let mut removed = leaves.clone();
    removed.remove(750);
    let after = fold_tree(&spec, &removed, &mut cache);
    assert!(after.nodes_computed <= 2 * u64::from(after.depth));
    assert_eq!(after.root, fold_flat(&spec, &removed));
}

#[test]
fn groups_hold_two_to_fan_in_nodes_but_the_last() {
    let level: Vec<Node> = (0..500u64)
        .map(|i| Node {
            key: ContentHash::of_bytes(&i.to_le_bytes()),
            anchor: i.wrapping_mul(0x2545_F491_4F6C_DD1D),
            value: None,
        })
        .collect();
    let gs = groups(&level, 8, 1);
    assert_eq!(gs.first().map(|g| g.start), Some(0));
    assert_eq!(gs.last().map(|g| g.end), Some(500));
    for w in gs.windows(2) {
        assert_eq!(w[0].end, w[1].start);
    }
    let (last, rest) = gs.split_last().expect("groups");
    assert!(rest.iter().all(|g| (2..=8).contains(&g.len())), "{gs:?}");
    assert!((1..=8).contains(&last.len()));
}

/// Fixed leaves that give every reducer of [`spec`] something to hold.
fn pinned_leaves() -> Vec<Leaf> {
    (0..24u32)
        .map(|i| {
            let causes = [json!("x"), json!("y"), json!("z"), Value::Null];
            Leaf {
                unit_id: UnitId(format!("u{i}")),
                stage: ["a", "b"][(i / 3 % 2) as usize].into(),
                // Two in three positive, the rest of every status.
                status: if i % 3 == 2 {
                    Status::ALL[(i % 6) as usize]
                } else {
                    Status::Positive
                },
                facts: json!({
                    "cause": causes[(i % 4) as usize].clone(),
                    "score": f64::from(i % 5) * 2.5 + 0.1,
                }),
                unit: json!({"unit:/film": format!("f{}", i % 3)}),
            }
        })
        .collect()
}

/// Stored fold nodes stay valid across releases: their keys and the
/// JSON they are cached as are pinned.
#[test]
fn node_keys_and_cached_values_are_pinned() {
    let leaves = pinned_leaves();
    let out = fold_tree(&spec(4), &leaves, &mut NoCache);
    let json = serde_json::to_string(&out.root).expect("a fold value is JSON");
    // And what the answer says of them, and cites.
    let said: Vec<(Stated, BTreeSet<UnitId>)> = spec(4)
        .reducers
        .iter()
        .map(|r| {
            let agg = &out.root.reducers[&r.name];
            (state(&r.kind, agg), cited(&r.kind, agg))
        })
        .collect();
    let said = serde_json::to_string(&said).expect("statements are JSON");
    assert_eq!(
        (
            fold_definition(&spec(4)).to_hex(),
            out.root_key.to_hex(),
            ContentHash::of_bytes(json.as_bytes()).to_hex(),
            ContentHash::of_bytes(said.as_bytes()).to_hex(),
        ),
        (
            "834fc9856fae69b254332e95691078f086f834aa82b79b16c62ecfbeea551c22".to_owned(),
            "4ef6e6224f486fc9d9b4ad51d162e14e99bf4cdd8e801bec6020cb4356c5cf36".to_owned(),
            "301bf41f85e8b23b93e034cb4718f7e6b78b4865b09f44336283d1fa16691a3f".to_owned(),
            "dd6811996535765373175c0c68010af9d151b03195de9b65e966686afc76e919".to_owned(),
        ),
        "{json}\n{said}"
    );
}
