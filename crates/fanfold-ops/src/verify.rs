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
    // One leaf at a time: a million facts are not copied to be re-added,
    // unless a reducer collapses near-duplicates, which compares them all.
    let flat = if spec.reducers.iter().any(|r| r.dedupe.is_some()) {
        let all: Vec<crate::fold::Leaf> = leaves.into_iter().collect();
        crate::fold::fold_flat(spec, &all)
    } else {
        let mut flat = crate::fold::FoldValue::empty(spec);
        for leaf in leaves {
            flat.merge(&crate::fold::FoldValue::of_leaf(spec, &leaf));
        }
        flat
    };
    for r in &spec.reducers {
        report.numbers_checked += 1;
        let (told, recomputed) = (root.reducers.get(&r.name), flat.reducers.get(&r.name));
        if root.collapsed.get(&r.name) != flat.collapsed.get(&r.name) {
            let collapsed = |v: &crate::fold::FoldValue| {
                v.collapsed
                    .get(&r.name)
                    .map_or(0, |g| g.values().map(|ids| ids.len()).sum::<usize>())
            };
            report.number_mismatches.push(format!(
                "reducer `{}`: the fold collapsed {} near-duplicates, its facts collapse {}",
                r.name,
                collapsed(root),
                collapsed(&flat)
            ));
        }
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
        // A unit that is one field of a record may quote that field only,
        // whatever else of the record its view shows.
        let only = view
            .as_ref()
            .and_then(crate::partition::unit_field)
            .map(str::to_owned);
        for ev in &f.evidence {
            report.evidence_checked += 1;
            if let Some(only) = only.as_deref()
                && only != ev.field
            {
                report.evidence_failures.push(format!(
                    "unit {id} field `{}` bytes {}..{}: {:?} is outside the unit's own field `{only}`",
                    ev.field, ev.start, ev.end, ev.quote
                ));
                continue;
            }
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

#[cfg(test)]
mod tests {
    use std::collections::{BTreeSet, HashMap};

    use fanfold_core::spec::{FoldSpec, ReducerKind, ReducerSpec};
    use fanfold_core::{ContentHash, Cost, Evidence, FactRecord, ModelParams, Status, UnitId};
    use serde_json::{Value, json};

    use super::{ReadBack, recheck_numbers, verify};
    use crate::fold::{Leaf, fold_flat};

    /// A source of units by id, each read back as stored.
    struct Units(HashMap<UnitId, Value>);

    impl ReadBack for Units {
        fn unit_hash(&mut self, id: &UnitId) -> Option<ContentHash> {
            self.0
                .get(id)
                .map(|v| ContentHash::of_bytes(v.to_string().as_bytes()))
        }
        fn view(&mut self, fact: &FactRecord) -> Option<Value> {
            self.0.get(fact.source_ids.first()?).cloned()
        }
    }

    fn unit(id: &str, text: &str) -> (UnitId, Value) {
        (UnitId(id.into()), json!({ "text": text }))
    }

    fn fact(id: &str, judged: &Value, quote: &str, start: u64) -> FactRecord {
        FactRecord {
            schema: fanfold_core::FACT_SCHEMA.into(),
            key: ContentHash::of_bytes(id.as_bytes()),
            source_ids: vec![UnitId(id.into())],
            source_hashes: vec![ContentHash::of_bytes(judged.to_string().as_bytes())],
            stage: "judge".into(),
            stage_version: 1,
            rubric_hash: ContentHash::of_bytes(b"rubric"),
            model: ModelParams {
                backend: "scripted".into(),
                model_id: "test".into(),
                temperature: 0.0,
                max_output_tokens: 8,
                seed: 0,
                simulated: true,
            },
            status: Status::Positive,
            decision: Some("yes".into()),
            facts: json!({ "decision": "yes", "score": 2 }),
            confidence: None,
            choice_scores: Vec::new(),
            reason: None,
            evidence: vec![Evidence {
                field: "text".into(),
                start,
                end: start + quote.len() as u64,
                quote: quote.into(),
            }],
            cost: Cost::default(),
            attempts: 1,
            reducer_path: Vec::new(),
            truncated_tokens: 0,
            digest: None,
        }
    }

    #[test]
    fn an_answer_that_matches_its_source_passes() {
        let (a, av) = unit("1", "the disk failed twice");
        let mut source = Units(HashMap::from([(a.clone(), av.clone())]));
        let f = fact("1", &av, "disk failed", 4);
        let report = verify(&mut source, &[&f], &BTreeSet::from([a]), 0, 0);
        assert!(report.passed, "{report:?}");
        assert_eq!((report.cited_checked, report.evidence_checked), (1, 1));
    }

    #[test]
    fn a_field_unit_quoting_another_field_of_its_record_fails() {
        // The body of record 1 as its own unit, with its title beside it.
        let id = UnitId("1.body".into());
        let view = json!({
            "title": "the disk failed twice",
            "text": "the disk failed twice, then it was replaced",
            crate::partition::UNIT_FIELD: "text",
        });
        let mut source = Units(HashMap::from([(id.clone(), view.clone())]));
        let own = fact("1.body", &view, "disk failed", 4);
        let report = verify(&mut source, &[&own], &BTreeSet::from([id.clone()]), 0, 0);
        assert!(report.passed, "{report:?}");
        // The same words, found verbatim in the title: refused.
        let mut other = fact("1.body", &view, "disk failed", 4);
        other.evidence[0].field = "title".into();
        let report = verify(&mut source, &[&other], &BTreeSet::from([id]), 0, 0);
        assert!(!report.passed);
        assert!(
            report.evidence_failures[0].contains("outside the unit's own field `text`"),
            "{:?}",
            report.evidence_failures
        );
    }

    #[test]
    fn a_missing_unit_an_edited_unit_and_a_moved_quote_each_fail() {
        let (a, av) = unit("1", "the disk failed twice");
        let (b, bv) = unit("2", "a fan is loud");
        // Unit 2 was judged as other text than the source now holds.
        let judged_b = json!({ "text": "a fan is very loud" });
        let mut source = Units(HashMap::from([(a.clone(), av.clone()), (b.clone(), bv)]));
        let moved = fact("1", &av, "disk failed", 5);
        let edited = fact("2", &judged_b, "a fan", 0);
        let gone = UnitId("3".into());
        let cited = BTreeSet::from([a, b.clone(), gone.clone()]);
        let report = verify(&mut source, &[&moved, &edited], &cited, 0, 0);
        assert!(!report.passed);
        assert_eq!(report.cited_missing, [gone]);
        assert_eq!(report.hash_mismatches, [b]);
        assert_eq!(report.evidence_failures.len(), 1, "{report:?}");
        assert!(report.evidence_failures[0].starts_with("unit 1 field `text` bytes 5..16"));
    }

    #[test]
    fn a_fold_that_states_other_numbers_than_its_facts_fails() {
        let spec = FoldSpec {
            fan_in: 2,
            reducers: vec![ReducerSpec {
                name: "total".into(),
                stage: None,
                statuses: None,
                dedupe: None,
                kind: ReducerKind::Sum {
                    value: "/score".into(),
                },
            }],
        };
        let leaf = |id: &str, score: f64| Leaf {
            unit_id: UnitId(id.into()),
            stage: "judge".into(),
            status: Status::Positive,
            facts: json!({ "score": score }),
            unit: Value::Null,
        };
        let leaves = vec![leaf("1", 2.0), leaf("2", 3.0)];
        let root = fold_flat(&spec, &leaves);
        let mut report = super::VerifyReport {
            passed: true,
            ..Default::default()
        };
        recheck_numbers(&spec, &root, leaves.clone(), &mut report);
        assert!(report.passed && report.number_mismatches.is_empty());
        assert_eq!(report.numbers_checked, 1);
        // One fact fewer than the fold was told about.
        recheck_numbers(&spec, &root, leaves.into_iter().take(1), &mut report);
        assert!(!report.passed);
        assert_eq!(
            report.number_mismatches,
            [
                "reducer `total`: the fold says \"sum 5 over 2 facts: #1, #2\", its facts say \"sum 2 over 1 fact: #1\"",
                "the fold's status counts differ from its facts'"
            ]
        );
    }
}
