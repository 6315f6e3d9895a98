//! `count_by`: the leaves counted by their value at `key`, each group
//! with its units.

use std::collections::{BTreeMap, BTreeSet};

use fanfold_core::UnitId;
use serde::{Deserialize, Serialize};

use super::Leaf;
use super::reducer::{Reducer, Stated, as_key, listed};

pub struct CountBy<'a> {
    pub key: &'a str,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Group {
    pub count: u64,
    pub ids: BTreeSet<UnitId>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CountByState {
    pub groups: BTreeMap<String, Group>,
}

impl Reducer for CountBy<'_> {
    type State = CountByState;

    fn empty(&self) -> CountByState {
        CountByState {
            groups: BTreeMap::new(),
        }
    }

    fn update(&self, state: &mut CountByState, leaf: &Leaf) -> bool {
        let Some(k) = leaf.at(self.key) else {
            return false;
        };
        let g = state.groups.entry(as_key(k)).or_insert_with(|| Group {
            count: 0,
            ids: BTreeSet::new(),
        });
        g.count += 1;
        g.ids.insert(leaf.unit_id.clone());
        true
    }

    fn merge(state: &mut CountByState, other: &CountByState) {
        for (k, g) in &other.groups {
            let e = state.groups.entry(k.clone()).or_insert_with(|| Group {
                count: 0,
                ids: BTreeSet::new(),
            });
            e.count += g.count;
            e.ids.extend(g.ids.iter().cloned());
        }
    }

    fn number(&self, state: &CountByState) -> Option<f64> {
        Some(state.groups.values().map(|g| g.count).sum::<u64>() as f64)
    }

    fn evaluate(&self, state: &CountByState) -> Stated {
        let mut g: Vec<(&String, &Group)> = state.groups.iter().collect();
        g.sort_by(|a, b| b.1.count.cmp(&a.1.count).then_with(|| a.0.cmp(b.0)));
        // The counts themselves, so a grouped `count_by` row reads
        // "positive 11, negative 9".
        let counts: Vec<String> = g.iter().map(|(k, g)| format!("{k} {}", g.count)).collect();
        Stated::table(
            counts.join(", "),
            &["key", "facts", "units"],
            g.into_iter()
                .map(|(k, g)| vec![k.clone(), g.count.to_string(), listed(&g.ids)])
                .collect(),
        )
    }

    fn cited(&self, state: &CountByState) -> BTreeSet<UnitId> {
        state
            .groups
            .values()
            .flat_map(|g| g.ids.iter().cloned())
            .collect()
    }
}
