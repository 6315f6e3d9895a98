//! Independent read-back of an answer against its source artifact.
//!
//! The engine reads each cited unit back from the stored artifact by its
//! recorded byte range (not from the units it ran on) and hands it here
//! through [`ReadBack`]: every cited id must exist with the recorded hash,
//! and every evidence quote must sit at its recorded range in the same
//! projected view the stage judged it in.

use std::collections::{BTreeSet, HashMap};

use fanfold_core::{ContentHash, FactRecord, StableHash, StableHasher, Status, UnitId};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::map::field_text;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct VerifyReport {
    pub passed: bool,
    pub cited_checked: u64,
    pub cited_missing: Vec<UnitId>,
    pub hash_mismatches: Vec<UnitId>,
    pub evidence_checked: u64,
    pub evidence_failures: Vec<String>,
    /// Seeded random negatives listed for a human or second model to read back.
    pub negative_sample: Vec<UnitId>,
    /// Every abstain, listed for read-back.
    pub abstains: Vec<UnitId>,
    /// Reducers whose aggregate was recomputed from the facts alone, in
    /// one flat pass, without the cached fold tree.
    #[serde(default)]
    pub numbers_checked: u64,
    /// Each reducer whose recomputed aggregate differs from the answer's:
    /// what the fold said against what the facts say.
    #[serde(default)]
    pub number_mismatches: Vec<String>,
}

/// Recomputes every reducer from `leaves` in one flat pass, with no
/// cached node, and compares each with the answer's fold `root`: a stale
/// or altered node cannot state a number its facts do not give.
pub fn recheck_numbers(
    spec: &fanfold_core::spec::FoldSpec,
    root: &crate::fold::FoldValue,
    leaves: impl IntoIterator<Item = crate::fold::Leaf>,
    report: &mut VerifyReport,
) {
    // One leaf at a time: a million facts are not copied to be re-added.
    let mut flat = crate::fold::FoldValue::empty(spec);
    for leaf in leaves {
        flat.merge(&crate::fold::FoldValue::of_leaf(spec, &leaf));
    }
    for r in &spec.reducers {
        report.numbers_checked += 1;
        let (told, recomputed) = (root.reducers.get(&r.name), flat.reducers.get(&r.name));
        if told == recomputed {
            continue;
        }
        let say = |a: Option<&crate::fold::Agg>| {
            a.map(|a| crate::fold::state(&r.kind, a))
                .unwrap_or_default()
        };
        let (told, recomputed) = (say(told), say(recomputed));
        // The statement, or the first row where they part.
        let (a, b) = if told.statement != recomputed.statement {
            (told.statement, recomputed.statement)
        } else {
            let row = |rows: &[Vec<String>], i: usize| {
                rows.get(i).map(|r| r.join(" | ")).unwrap_or_default()
            };
            let i = (0..told.rows.len().max(recomputed.rows.len()))
                .find(|&i| told.rows.get(i) != recomputed.rows.get(i))
                .unwrap_or(0);
            (row(&told.rows, i), row(&recomputed.rows, i))
        };
        report.number_mismatches.push(format!(
            "reducer `{}`: the fold says {a:?}, its facts say {b:?}",
            r.name
        ));
    }
    if root.statuses != flat.statuses {
        report
            .number_mismatches
            .push("the fold's status counts differ from its facts'".into());
    }
    report.passed = report.passed && report.number_mismatches.is_empty();
}

/// The source, as verify reads it back.
pub trait ReadBack {
    /// The content hash of the stored unit `id`, recomputed from its bytes;
    /// `None` when the source has no such unit.
    fn unit_hash(&mut self, id: &UnitId) -> Option<ContentHash>;
    /// The view `fact`'s stage had of its unit, recomputed from the source.
    fn view(&mut self, fact: &FactRecord) -> Option<Value>;
}

/// Checks `cited` ids and every fact's evidence against the source.
pub fn verify(
    source: &mut dyn ReadBack,
    facts: &[&FactRecord],
    cited: &BTreeSet<UnitId>,
    negative_sample: usize,
    seed: u64,
) -> VerifyReport {
    let mut report = VerifyReport::default();
    // Every unit a fact cites, with the hash it was judged at: a widened
    // fact cites the members its context showed as well as its unit.
    let fact_hash: HashMap<&UnitId, &ContentHash> = facts
        .iter()
        .flat_map(|f| f.source_ids.iter().zip(&f.source_hashes))
        .collect();
    for id in cited {
        report.cited_checked += 1;
        match source.unit_hash(id) {
            None => report.cited_missing.push(id.clone()),
            Some(hash) => {
                if let Some(&recorded) = fact_hash.get(id)
                    && *recorded != hash
                {
                    report.hash_mismatches.push(id.clone());
                }
            }
        }
    }
    for &f in facts {
        let Some(id) = f.source_ids.first() else {
            continue;
        };
        if f.evidence.is_empty() {
            continue;
        }
        let view = source.view(f);
        for ev in &f.evidence {
            report.evidence_checked += 1;
            let ok = view
                .as_ref()
                .and_then(|v| field_text(v, &ev.field))
                .and_then(|t| {
                    t.get(ev.start as usize..ev.end as usize)
                        .map(|s| s == ev.quote)
                })
                .unwrap_or(false);
            if !ok {
                report.evidence_failures.push(format!(
                    "unit {id} field `{}` bytes {}..{}: {:?}",
                    ev.field, ev.start, ev.end, ev.quote
                ));
            }
        }
    }
    let mut negatives: Vec<(ContentHash, &UnitId)> = facts
        .iter()
        .filter(|f| f.status == Status::Negative)
        .filter_map(|f| f.source_ids.first())
        .map(|id| {
            let mut h = StableHasher::new(fanfold_core::Bucket::NegativeSample);
            h.field("seed", &seed);
            id.stable_hash(&mut h);
            (h.finish(), id)
        })
        .collect();
    negatives.sort();
    report.negative_sample = negatives
        .into_iter()
        .take(negative_sample)
        .map(|(_, id)| id.clone())
        .collect();
    report.abstains = facts
        .iter()
        .filter(|f| f.status == Status::Abstain)
        .filter_map(|f| f.source_ids.first().cloned())
        .collect();
    report.passed = report.cited_missing.is_empty()
        && report.hash_mismatches.is_empty()
        && report.evidence_failures.is_empty();
    report
}
