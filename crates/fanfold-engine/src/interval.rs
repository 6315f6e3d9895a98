//! The interval contract in a run: what the plan checks and resolves
//! (the reducer, its stage, the groups the confidence is split over), the
//! order the stage judges its units in, and how the estimate is said.
//!
//! "The number" is the share of routed units the reducer counts: for a
//! `count`, the units whose fact at the reducer's stage has one of the
//! reducer's statuses; for a `count_by`, one share per group, the units
//! counted with that key. Routed units the stage never receives (an
//! earlier rung dropped them) count for no group and cost nothing; the
//! stage's own units are drawn in a seeded random order, so the judged
//! ones are a sample without replacement of them.

use fanfold_core::Status;
use fanfold_core::spec::{ContractSpec, ReducerKind, Spec, StageSpec};
use fanfold_ops::interval::{Estimate, IntervalTarget, draw_rank};

use crate::kit::{Stage, UnitTable};

/// The most groups a `count_by` under an interval contract may split its
/// confidence over: each group keeps two confidence sequences, each fact
/// updates all of them, and the split widens every interval.
const MAX_GROUPS: usize = 32;

/// The narrowest half width an interval contract may ask for: its grid of
/// candidate shares is finer than the half width, and bounded.
const MIN_HALF_WIDTH: f64 = 0.001;

/// The interval contract's target, checked against the spec; `None` for
/// another contract. Every refusal names the setting at fault.
pub fn target(spec: &Spec, stages: &[Box<dyn Stage>]) -> Result<Option<IntervalTarget>, String> {
    let ContractSpec::Interval {
        reducer,
        half_width,
        confidence,
        seed,
    } = &spec.contract
    else {
        return Ok(None);
    };
    if !(half_width.is_finite() && *half_width > 0.0 && *half_width <= 0.5) {
        return Err(format!(
            "contract.half_width must be above 0 and at most 0.5 (a share is in [0, 1]); got {half_width}"
        ));
    }
    if !(confidence.is_finite() && *confidence > 0.0 && *confidence < 1.0) {
        return Err(format!(
            "contract.confidence must be above 0 and below 1; got {confidence}"
        ));
    }
    let Some(r) = spec.fold.reducers.iter().find(|r| &r.name == reducer) else {
        return Err(format!(
            "contract.reducer `{reducer}` names no reducer of the fold"
        ));
    };
    let key = match &r.kind {
        ReducerKind::Count => None,
        ReducerKind::CountBy { key } => Some(key.clone()),
        other => {
            return Err(format!(
                "contract.reducer `{reducer}` is a `{}` reducer; an interval contract estimates a `count` or a `count_by`",
                other.type_name()
            ));
        }
    };
    let Some(stage) = &r.stage else {
        return Err(format!(
            "contract.reducer `{reducer}` must name its `stage`: the interval contract judges that stage's units in a seeded random order"
        ));
    };
    let map = spec.stages.iter().find_map(|s| match s {
        StageSpec::Map(m) if &m.name == stage => Some(m),
        _ => None,
    });
    let Some(map) = map else {
        return Err(format!(
            "contract.reducer `{reducer}` reads stage `{stage}`, which is not a map stage; the interval contract orders a map stage's units"
        ));
    };
    if map.cascade.is_some() || map.widen.is_some() {
        return Err(format!(
            "contract.reducer `{reducer}` reads stage `{stage}`, whose {} decides units in an order of its own; the interval contract needs the stage to judge its units itself",
            if map.cascade.is_some() {
                "cascade"
            } else {
                "`widen`"
            }
        ));
    }
    if let Some(back) = stages.iter().find(|s| {
        let shape = s.shape();
        shape.reads_negatives().is_some() && shape.targets().contains(&stage.as_str())
    }) {
        return Err(format!(
            "contract.reducer `{reducer}` reads stage `{stage}`, to which stage `{}` sends units back for a second pass; the interval contract draws that stage's units once, in one seeded order",
            back.name()
        ));
    }
    if *half_width < MIN_HALF_WIDTH {
        return Err(format!(
            "contract.half_width must be at least {MIN_HALF_WIDTH}; got {half_width}"
        ));
    }
    let statuses = r.statuses.clone().unwrap_or_else(|| vec![Status::Positive]);
    if let Some(s) = statuses
        .iter()
        .find(|s| !matches!(s, Status::Positive | Status::Negative | Status::Abstain))
    {
        return Err(format!(
            "contract.reducer `{reducer}` counts `{}` facts; an interval estimates a share of decided units (positive, negative, abstain)",
            s.as_str()
        ));
    }
    let groups = match &key {
        None => Vec::new(),
        Some(key) => {
            let named = stages
                .iter()
                .find(|s| s.name() == stage)
                .and_then(|s| s.output_schema())
                .filter(|_| fanfold_ops::fold::unit_pointer(key).is_none())
                .and_then(|schema| fanfold_core::spec::check::schema_at(schema, key))
                .and_then(|node| node.get("enum"))
                .and_then(|e| e.as_array());
            let Some(values) = named.filter(|v| !v.is_empty()) else {
                return Err(format!(
                    "contract.reducer `{reducer}` is a `count_by` on `{key}`: under an interval contract stage `{stage}`'s output schema must name its groups with an `enum` at `{key}`, so the confidence can be split over every group"
                ));
            };
            let mut groups: Vec<String> = values
                .iter()
                .filter(|v| !v.is_null())
                .map(|v| match v {
                    serde_json::Value::String(s) => s.clone(),
                    other => other.to_string(),
                })
                .collect();
            groups.sort();
            groups.dedup();
            if groups.len() > MAX_GROUPS {
                return Err(format!(
                    "contract.reducer `{reducer}` is a `count_by` on `{key}` with {} groups; an interval contract splits its confidence over at most {MAX_GROUPS}",
                    groups.len()
                ));
            }
            groups
        }
    };
    Ok(Some(IntervalTarget {
        reducer: reducer.clone(),
        kind: r.kind.type_name().to_owned(),
        stage: stage.clone(),
        statuses,
        key,
        groups,
        half_width: *half_width,
        confidence: *confidence,
        seed: *seed,
    }))
}

/// `units` in the order the contract draws them: by each unit's keyed
/// rank under `seed`, ties (never in practice) by table position.
pub fn draw_order(units: &[usize], table: &UnitTable, seed: u64) -> Vec<usize> {
    let mut ranked: Vec<(u64, usize)> = units
        .iter()
        .map(|&i| {
            let rank = table
                .id(i)
                .map_or(u64::MAX, |id| draw_rank(seed, id.as_str()));
            (rank, i)
        })
        .collect();
    ranked.sort_unstable();
    ranked.into_iter().map(|(_, i)| i).collect()
}

/// `fanfold explain`'s line for the contract.
pub fn explain(target: Option<&IntervalTarget>, spec: &Spec) -> String {
    let ContractSpec::Interval {
        reducer,
        half_width,
        confidence,
        seed,
    } = &spec.contract
    else {
        return String::new();
    };
    let Some(t) = target else {
        return format!("interval: {reducer} ±{half_width} at {confidence}");
    };
    let groups = if t.groups.is_empty() {
        String::new()
    } else {
        format!(
            " for each of {} groups ({}; confidence split over them)",
            t.groups.len(),
            t.groups.join(", ")
        )
    };
    format!(
        "interval: estimate the share of routed units `{reducer}` ({}) counts{groups} within ±{half_width} at {confidence}; stage `{}` judges its units in a random order (seed {seed}) and the rest are cancelled once reached",
        t.kind, t.stage
    )
}

/// Why an interval contract's answer is not whole: its estimate fell
/// short of the declared half width (a budget, failures), or the stage
/// never declared its units. `None` when it is whole or the contract is
/// another.
pub fn shortfall(target: Option<&IntervalTarget>, estimate: Option<&Estimate>) -> Option<String> {
    let target = target?;
    match estimate {
        Some(e) if e.reached => None,
        Some(e) => Some(format!(
            "the estimate of `{}` is within ±{:.4} after {} of {} units, wider than the contract's ±{}",
            e.reducer,
            e.groups.iter().map(|g| g.half_width).fold(0.0, f64::max),
            e.judged,
            e.population,
            e.half_width
        )),
        None => Some(format!(
            "stage `{}` never ran, so `{}` has no estimate",
            target.stage, target.reducer
        )),
    }
}
