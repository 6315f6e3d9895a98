//! The answer phase: the ids and themes the contract asks for, read off
//! the fold's root, and whether they are the whole answer.

use std::collections::{BTreeSet, HashMap};

use fanfold_core::spec::{ContractSpec, ReducerKind, Spec};
use fanfold_core::{FactRecord, Status, StatusCounts, UnitId};
use fanfold_ops::contract::StopReason;
use fanfold_ops::fold::{Agg, FoldValue};
use fanfold_ops::map::field_text;
use fanfold_ops::partition::Coverage;

use super::route::UnitTable;
use crate::report::{Aggregate, AnswerItem, Collapsed, Theme};

/// The answer's items, themes and, for a threshold, whether it was reached.
pub struct Answered {
    pub items: Vec<AnswerItem>,
    /// What the contract's answer reducer states, when it is not a set of
    /// units (a mean, a ratio, grouped rows, pairs): the items are then
    /// the units it cites.
    pub stated: Option<Aggregate>,
    pub themes: Vec<Theme>,
    pub aggregates: Vec<Aggregate>,
    /// What each reducer's `dedupe` collapsed.
    pub collapsed: Vec<Collapsed>,
    pub reached: Option<bool>,
}

/// Builds the answer's items from the fold root and the facts (table
/// position, fact).
pub fn answer(
    spec: &Spec,
    root: &FoldValue,
    facts: &[(usize, FactRecord)],
    table: &UnitTable,
) -> Answered {
    let plain: Vec<&FactRecord> = facts.iter().map(|(_, f)| f).collect();
    let (ids, themes, reached) = answer_ids(spec, root, &plain);
    let at: HashMap<&UnitId, usize> = facts
        .iter()
        .filter_map(|(i, f)| f.source_ids.first().map(|id| (id, *i)))
        .collect();
    // A unit's facts: of those that call it positive, one that quotes
    // evidence leads (a stage that decided it by a label or a proxy quotes
    // none, a stage its positives went on to does), and the others add the
    // fields it lacks. A fact that does not call it positive (a later
    // stage that disagrees) lends it neither quote nor field.
    let mut facts_of: HashMap<&UnitId, Vec<&FactRecord>> = HashMap::new();
    for f in &plain {
        if let Some(id) = f.source_ids.first() {
            facts_of.entry(id).or_default().push(*f);
        }
    }
    for list in facts_of.values_mut() {
        if list.iter().any(|f| f.status == Status::Positive) {
            list.retain(|f| f.status == Status::Positive);
        }
        list.reverse();
        list.sort_by_key(|f| f.evidence.is_empty());
    }
    let fact_of: HashMap<&UnitId, &FactRecord> = facts_of
        .iter()
        .filter_map(|(id, list)| Some((*id, *list.first()?)))
        .collect();
    let fields_of = |id: &UnitId| {
        let mut fields = std::collections::BTreeMap::new();
        for f in facts_of.get(id).into_iter().flatten() {
            for (k, v) in extracted(f) {
                fields.entry(k).or_insert(v);
            }
        }
        fields
    };
    let theme_of: HashMap<&UnitId, &str> = themes
        .iter()
        .flat_map(|t| t.ids.iter().map(move |id| (id, t.key.as_str())))
        .collect();
    let items = ids
        .iter()
        .map(|(id, score)| {
            let value = at.get(id).map(|&i| table.value(i));
            AnswerItem {
                unit_id: id.clone(),
                title: value
                    .as_ref()
                    .and_then(|v| spec.output.title.as_deref().and_then(|f| field_text(v, f))),
                link: value
                    .as_ref()
                    .and_then(|v| spec.output.link.as_deref().and_then(|f| field_text(v, f))),
                theme: theme_of.get(id).map(|s| (*s).to_owned()),
                score: *score,
                evidence: fact_of
                    .get(id)
                    .map(|f| f.evidence.clone())
                    .unwrap_or_default(),
                fields: fields_of(id),
                shown: value
                    .as_ref()
                    .map(|v| {
                        spec.output
                            .show
                            .iter()
                            .filter_map(|f| Some((f.clone(), field_text(v, f)?)))
                            .collect()
                    })
                    .unwrap_or_default(),
            }
        })
        .collect();
    Answered {
        items,
        stated: stated_answer(spec, root),
        themes,
        aggregates: aggregates(spec, root),
        collapsed: collapsed(spec, root),
        reached,
    }
}

/// Each reducer's `dedupe`, with what it collapsed.
fn collapsed(spec: &Spec, root: &FoldValue) -> Vec<Collapsed> {
    spec.fold
        .reducers
        .iter()
        .filter_map(|r| {
            Some(Collapsed {
                reducer: r.name.clone(),
                summary: fanfold_ops::dedupe::summary(r, root.collapsed.get(&r.name))?,
            })
        })
        .collect()
}

/// What a reducer states; a count after a `dedupe` says what it
/// collapsed first, so the number is never read as the raw count.
fn stated(r: &fanfold_core::spec::ReducerSpec, root: &FoldValue, agg: &Agg) -> Aggregate {
    let mut stated = fanfold_ops::fold::state(&r.kind, agg);
    if let Some(c) = fanfold_ops::dedupe::summary(r, root.collapsed.get(&r.name)) {
        stated.statement = format!("{}, after {}", stated.statement, c.sentence());
    }
    Aggregate {
        name: r.name.clone(),
        kind: r.kind.type_name().to_owned(),
        stated,
    }
}

/// The contract's answer reducer, stated, when it is not a `set`.
fn stated_answer(spec: &Spec, root: &FoldValue) -> Option<Aggregate> {
    let ContractSpec::Exhaustive { answer, .. } = &spec.contract else {
        return None;
    };
    let r = spec.fold.reducers.iter().find(|r| &r.name == answer)?;
    if matches!(r.kind, ReducerKind::Set { .. }) {
        return None;
    }
    let agg = root.reducers.get(answer)?;
    Some(stated(r, root, agg))
}

/// Every reducer the answer's items and themes do not already show,
/// stated in the spec's order.
fn aggregates(spec: &Spec, root: &FoldValue) -> Vec<Aggregate> {
    let shown: Vec<&str> = match &spec.contract {
        ContractSpec::Exhaustive { answer, themes, .. } => std::iter::once(answer.as_str())
            .chain(themes.as_deref())
            .collect(),
        _ => Vec::new(),
    };
    spec.fold
        .reducers
        .iter()
        .filter(|r| !shown.contains(&r.name.as_str()))
        .filter_map(|r| Some(stated(r, root, root.reducers.get(&r.name)?)))
        .collect()
}

/// Why the answer is not the whole answer the contract asks for; empty
/// when it is. An exhaustive or top-k answer needs every routed unit
/// decided; a threshold answer that was reached stands whatever else
/// failed. Elements rejected as too large or without their key were never
/// judged; a repeated key's first occurrence was.
pub fn incomplete(
    spec: &Spec,
    statuses: &StatusCounts,
    stop: &StopReason,
    coverage: &Coverage,
    rejected_by_reason: &std::collections::BTreeMap<String, u64>,
    reached: Option<bool>,
) -> Vec<String> {
    if reached == Some(true) {
        return Vec::new();
    }
    let mut why = Vec::new();
    if let StopReason::BudgetExhausted {
        budget,
        limit,
        used,
    } = stop
    {
        why.push(format!(
            "budget {budget} exhausted ({used} of {limit}): the units it left are not_run"
        ));
    }
    if *stop == StopReason::Interrupted {
        why.push(
            "interrupted: the run was stopped from outside (Ctrl-C); the units it left are not_run"
                .to_owned(),
        );
    }
    if let StopReason::BreakerTripped { stage, detail } = stop {
        why.push(format!(
            "stage `{stage}` stopped itself: {detail}; the units it left are not_run"
        ));
    }
    if statuses.error > 0 {
        why.push(match statuses.error {
            1 => "1 unit ended in error".to_owned(),
            n => format!("{n} units ended in error"),
        });
    }
    if statuses.not_run > 0 {
        why.push(match statuses.not_run {
            1 => "1 unit was not run".to_owned(),
            n => format!("{n} units were not run"),
        });
    }
    let contract_cancel = matches!(stop, StopReason::ContractSatisfied { .. })
        && matches!(
            spec.contract,
            ContractSpec::TopK { .. }
                | ContractSpec::Threshold { .. }
                | ContractSpec::Interval { .. }
        );
    if statuses.cancelled > 0 && !contract_cancel {
        why.push(format!("{} units were cancelled", statuses.cancelled));
    }
    // A repeated key is no exception: the repeat is a record nobody judged.
    let unjudged: u64 = rejected_by_reason.values().sum();
    if unjudged > 0 {
        why.push(format!(
            "{unjudged} of {} input elements were rejected before any stage (answer.md lists them under Not read)",
            coverage.elements
        ));
    }
    // No elements at all (an empty array) is an empty, whole answer;
    // elements that all failed to become units are counted above.
    why
}

type Ranked = Vec<(UnitId, Option<f64>)>;

/// The answer's ids and themes, as the contract defines them.
fn answer_ids(
    spec: &Spec,
    root: &FoldValue,
    facts: &[&FactRecord],
) -> (Ranked, Vec<Theme>, Option<bool>) {
    match &spec.contract {
        ContractSpec::Exhaustive {
            answer,
            themes,
            top_themes,
        } => {
            let kind = spec
                .fold
                .reducers
                .iter()
                .find(|r| &r.name == answer)
                .map(|r| &r.kind);
            let ranked: Ranked = match (kind, root.reducers.get(answer)) {
                // A limited set keeps its own order, and its numbers when
                // it is ordered by one.
                (Some(ReducerKind::Set { order_by, .. }), Some(Agg::Ranked(ranked))) => ranked
                    .items
                    .iter()
                    .map(|(x, id, _)| (id.clone(), order_by.as_ref().map(|_| *x)))
                    .collect(),
                (Some(ReducerKind::Set { value: None, .. }), Some(Agg::Set(set))) => {
                    in_natural_order(set.items.keys().map(|k| UnitId(k.clone())).collect())
                }
                (Some(ReducerKind::Set { .. }), Some(Agg::Set(set))) => {
                    in_natural_order(set.items.values().flatten().cloned().collect())
                }
                (Some(kind), Some(agg)) => in_natural_order(fanfold_ops::fold::cited(kind, agg)),
                _ => Vec::new(),
            };
            let themes = match themes.as_ref().and_then(|t| root.reducers.get(t)) {
                Some(Agg::CountBy(count_by)) => {
                    let mut list: Vec<Theme> = count_by
                        .groups
                        .iter()
                        .map(|(k, g)| Theme {
                            key: k.clone(),
                            count: g.count,
                            ids: g.ids.iter().cloned().collect(),
                        })
                        .collect();
                    list.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.key.cmp(&b.key)));
                    list.truncate(*top_themes);
                    list
                }
                _ => Vec::new(),
            };
            (ranked, themes, None)
        }
        ContractSpec::TopK { k, score, .. } => {
            let mut scored: Ranked = facts
                .iter()
                .filter(|f| f.status == Status::Positive)
                .filter_map(|f| {
                    Some((
                        f.source_ids.first()?.clone(),
                        Some(f.facts.pointer(score)?.as_f64()?),
                    ))
                })
                .collect();
            scored.sort_by(|a, b| {
                b.1.unwrap_or(0.0)
                    .total_cmp(&a.1.unwrap_or(0.0))
                    .then_with(|| a.0.cmp(&b.0))
            });
            scored.truncate(*k);
            (scored, Vec::new(), None)
        }
        ContractSpec::Threshold { count } => {
            let pos: Ranked = facts
                .iter()
                .filter(|f| f.status == Status::Positive)
                .filter_map(|f| Some((f.source_ids.first()?.clone(), None)))
                .collect();
            let reached = pos.len() as u64 >= *count;
            (pos, Vec::new(), Some(reached))
        }
        // The answer is the estimate the contract's controller kept, not
        // a list of units.
        ContractSpec::Interval { .. } => (Vec::new(), Vec::new(), None),
    }
}

fn in_natural_order(ids: BTreeSet<UnitId>) -> Ranked {
    let mut ranked: Ranked = ids.into_iter().map(|i| (i, None)).collect();
    ranked.sort_by(|a, b| natural(&a.0.0).cmp(&natural(&b.0.0)));
    ranked
}

/// Sort key that puts "9" before "10".
fn natural(s: &str) -> (usize, &str) {
    if s.bytes().all(|b| b.is_ascii_digit()) {
        (s.len(), s)
    } else {
        (usize::MAX, s)
    }
}

/// What a fact extracted beside its decision, as the answer shows it: the
/// output's scalar fields (a sender, a subject, a cause), not the decision
/// itself, its evidence or other lists and objects.
fn extracted(f: &FactRecord) -> std::collections::BTreeMap<String, serde_json::Value> {
    let Some(map) = f.facts.as_object() else {
        return Default::default();
    };
    map.iter()
        .filter(|(_, v)| v.is_string() || v.is_number() || v.is_boolean())
        .filter(|(_, v)| v.as_str().is_none_or(|s| Some(s) != f.decision.as_deref()))
        .filter(|(k, _)| k.as_str() != "confidence")
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}
