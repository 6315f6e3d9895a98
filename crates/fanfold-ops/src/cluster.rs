//! The cluster operator: a model reducer that reads facts, never raw units,
//! and proposes themes nobody enumerated. Facts are shown `fan_in` at a
//! time; each context names up to `max_themes` labels and then places
//! every item it was shown: in a theme (as a member, an exemplar, or
//! dissent that contradicts it) or in none (an outlier). The themes of one
//! level are the items of the next, merged `fan_in` at a time, until one
//! context holds them all.
//!
//! The answer places items rather than listing members, so its shape is
//! the check: the schema names every id shown exactly once, in order, and
//! a grammar-constrained model cannot repeat, skip or invent one. Nothing
//! else is taken on trust: an id the context did not show, an item left
//! unplaced or a theme number without a label is refused like malformed
//! JSON (retried, then an error of that node), and every count is
//! fanfold's own, from the members. Keys, prompts, the checks and the
//! level-by-level bookkeeping live here; the engine runs the calls.

use std::collections::{BTreeSet, HashMap};
use std::ops::Range;

use fanfold_core::spec::{ClusterStageSpec, DecisionSpec};
use fanfold_core::{Bucket, ContentHash, ModelParams, StableHash, StableHasher, Status};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::map::{Interpreted, Invalid, MapSpecError, ModelTurn, TurnSpec, strip_fences};

/// Version of the context layout below; part of every cluster key.
pub const CLUSTER_TEMPLATE: &str = "cluster-prompt-v2";

/// The most exemplars a theme names.
pub const MAX_EXEMPLARS: usize = 2;

/// The most characters of a theme's label.
pub const MAX_LABEL_CHARS: usize = 80;

#[derive(Debug, thiserror::Error)]
pub enum ClusterSpecError {
    #[error("stage `{stage}`: {detail}")]
    Invalid { stage: String, detail: String },
    #[error(transparent)]
    Turn(#[from] MapSpecError),
}

/// One input of a context: a fact (level 0) or a theme of the level below.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Item {
    /// A unit id for a fact; `T1`, `T2`, ... for the themes of a level.
    pub id: String,
    /// What the item is: a fact's projected view, or a theme's content.
    pub key: ContentHash,
    /// The unit ids of the facts it stands for, in input order.
    pub leaves: Vec<String>,
    /// A theme's label; `None` for a fact.
    pub label: Option<String>,
    /// Unit ids of the facts that best show the theme.
    pub exemplars: Vec<String>,
    /// Unit ids of facts that contradict the theme.
    pub dissent: Vec<String>,
    /// What a context shows of it.
    pub view: Value,
}

/// A theme as one context proposed it, after every check passed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProposedTheme {
    pub label: String,
    /// Ids of the context's items.
    pub members: Vec<String>,
    /// The facts its members hold, counted here, never read from a model.
    pub count: u64,
    pub exemplars: Vec<String>,
    pub dissent: Vec<String>,
}

/// One context's checked answer.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeAnswer {
    pub themes: Vec<ProposedTheme>,
    /// Ids of the items that fit no theme.
    pub outliers: Vec<String>,
}

/// A cluster stage ready to group items, build contexts and read answers.
pub struct ClusterStage {
    pub spec: ClusterStageSpec,
    /// The model turn every context is sent as: the rubric and the output
    /// schema as its shared prefix, the stage's attempts and output tokens.
    pub turn: ModelTurn,
    definition: ContentHash,
}

/// What one level of the tree made of its items.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Level {
    /// The next level's items: every theme proposed, then every item of a
    /// merge level no theme took (carried up unmerged).
    pub items: Vec<Item>,
    /// Facts a context placed in no theme on purpose.
    pub outliers: Vec<String>,
    /// Facts a context neither themed nor called an outlier.
    pub unthemed: Vec<String>,
    /// Facts whose context (at any level) failed: their themes are lost.
    pub failed: Vec<String>,
}

/// The most input orders a cluster's stress test may reduce.
pub const MAX_STRESS_ORDERS: usize = 32;

impl ClusterStage {
    pub fn new(spec: ClusterStageSpec, rubric: String) -> Result<ClusterStage, ClusterSpecError> {
        let invalid = |detail: String| ClusterSpecError::Invalid {
            stage: spec.name.clone(),
            detail,
        };
        let mut fan_ins = vec![spec.fan_in];
        if let Some(stress) = &spec.stress {
            fan_ins.extend(&stress.fan_ins);
            // Each order reduces every fact again: past a few dozen the
            // stress costs more than the answer and says nothing new.
            if stress.orders == 0 || stress.orders > MAX_STRESS_ORDERS {
                return Err(invalid(format!(
                    "stress.orders {} must be within 1..={MAX_STRESS_ORDERS}",
                    stress.orders
                )));
            }
            if !(0.0..=1.0).contains(&stress.max_drift) {
                return Err(invalid(format!(
                    "stress.max_drift {} must be within [0, 1]",
                    stress.max_drift
                )));
            }
        }
        if spec.max_themes == 0 {
            return Err(invalid("max_themes must be at least 1".into()));
        }
        // Each level then has at most half as many items as the one below
        // (plus one context's worth), so the tree always narrows.
        for f in fan_ins {
            if f < 2 * spec.max_themes {
                return Err(invalid(format!(
                    "a fan-in of {f} with max_themes = {}: the fan-in must be at least twice max_themes, so every level is smaller than the one below",
                    spec.max_themes
                )));
            }
        }
        if spec.statuses.is_empty() {
            return Err(invalid("statuses names no status to read".into()));
        }
        for s in &spec.statuses {
            if !Status::ALL.iter().any(|st| st.as_str() == s) {
                return Err(invalid(format!("statuses: {s:?} is not a status")));
            }
        }
        let decision = DecisionSpec {
            pointer: "/themes".into(),
            positive: vec!["themes".into()],
            negative: Vec::new(),
            abstain: Vec::new(),
        };
        let turn_spec = TurnSpec {
            rubric: spec.rubric.clone(),
            project: spec.project.clone(),
            ..TurnSpec::new(&spec.name, spec.version, spec.call(), decision)
        };
        let turn = ModelTurn::new(turn_spec, rubric, output_schema(spec.max_themes, None))?;
        let mut h = StableHasher::new(Bucket::ClusterDef);
        h.field("name", &spec.name)
            .field("version", &spec.version)
            .field("reads", &spec.reads)
            .field("statuses", &spec.statuses)
            .field("project", &spec.project)
            .field("max_themes", &(spec.max_themes as u64))
            .field("turn", &turn.definition_hash())
            .field("template", CLUSTER_TEMPLATE);
        let definition = h.finish();
        Ok(ClusterStage {
            spec,
            turn,
            definition,
        })
    }

    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// What the stage means, except its rubric (keyed on its own). The
    /// fan-in is not part of it: a context's answer depends only on what
    /// it shows, so contexts alike under two fan-ins are one.
    pub fn definition_hash(&self) -> ContentHash {
        self.definition
    }

    /// Every status the stage reads.
    pub fn reads_status(&self, status: Status) -> bool {
        self.spec.statuses.iter().any(|s| s == status.as_str())
    }

    /// A fact as level 0 shows it: its unit id and its projected view.
    pub fn fact_item(unit_id: &str, view: Value) -> Item {
        Item {
            id: unit_id.to_owned(),
            key: view.key_in(Bucket::Input),
            leaves: vec![unit_id.to_owned()],
            label: None,
            exemplars: Vec::new(),
            dissent: Vec::new(),
            view,
        }
    }

    /// The tokens one item's line of a context takes, estimated as the
    /// chunk stage estimates without a tokenizer.
    pub fn item_tokens(&self, item: &Item) -> u64 {
        crate::chunk::TokenCount::Estimate.tokens(&item_line(item, item.label.is_some()))
    }

    /// The contexts of one level: consecutive runs of at most `fan_in`
    /// items, each closed early where the next item would take its items
    /// past `max_context_tokens`. An item that passes the bound alone is a
    /// context of its own, which [`ClusterStage::over_bound`] refuses.
    pub fn contexts(&self, items: &[Item], fan_in: usize) -> Vec<Range<usize>> {
        let Some(bound) = self.spec.max_context_tokens else {
            return ClusterStage::groups(items.len(), fan_in);
        };
        let fan_in = fan_in.max(1);
        let mut out = Vec::new();
        let (mut start, mut used) = (0, 0u64);
        for (i, item) in items.iter().enumerate() {
            let t = self.item_tokens(item);
            if i > start && (i - start == fan_in || used + t > bound) {
                out.push(start..i);
                (start, used) = (i, 0);
            }
            used += t;
        }
        if start < items.len() {
            out.push(start..items.len());
        }
        out
    }

    /// Why a context cannot be sent within `max_context_tokens`, if it
    /// cannot: its items' estimated tokens pass the bound.
    pub fn over_bound(&self, items: &[Item]) -> Option<String> {
        let bound = self.spec.max_context_tokens?;
        let used: u64 = items.iter().map(|i| self.item_tokens(i)).sum();
        (used > bound).then(|| {
            format!(
                "refused, not cut: its items take about {used} tokens, more than max_context_tokens = {bound}"
            )
        })
    }

    /// The contexts of one level: consecutive runs of at most `fan_in`.
    pub fn groups(n: usize, fan_in: usize) -> Vec<Range<usize>> {
        let f = fan_in.max(1);
        (0..n.div_ceil(f))
            .map(|g| g * f..((g + 1) * f).min(n))
            .collect()
    }

    /// The key of one context's answer: its items' ids and keys in order,
    /// the stage, the rubric and the model. An edit to any fact a context
    /// shows recomputes that context and the ones above it, nothing else.
    pub fn node_key(&self, items: &[Item], model: &ModelParams) -> ContentHash {
        let mut h = StableHasher::new(Bucket::ClusterNode);
        h.field("stage", &self.definition)
            .field("rubric", &self.turn.rubric_hash);
        model.key_into(&mut h);
        h.field("items", &(items.len() as u64));
        for it in items {
            h.field("id", &it.id).field("key", &it.key);
        }
        h.finish()
    }

    /// One context's suffix: its items, one line each, then what to do.
    /// Ids are quoted JSON strings and views compact JSON, so no text of
    /// a fact can open a line of its own.
    pub fn suffix(&self, items: &[Item]) -> String {
        let mut s = String::new();
        let merging = items.iter().any(|i| i.label.is_some());
        for it in items {
            s.push_str(&item_line(it, merging));
        }
        let most = self.spec.max_themes;
        if merging {
            s.push_str(&format!(
                "\nThe themes above may repeat one another. Name at most {most} themes in `themes`, a short label each. Then place every theme above in `assign`, in the order shown: `theme` is the number of the new theme it belongs to (1 for the first label), or 0 for a theme that matches no other; `as` is `member`, or `exemplar` for the one that shows the new theme best.\n"
            ));
        } else {
            s.push_str(&format!(
                "\nName at most {most} themes in `themes`, a short label each. Then place every fact above in `assign`, in the order shown: `theme` is the number of its theme (1 for the first label), or 0 for a fact that fits no theme; `as` is `member`, `exemplar` for at most {MAX_EXEMPLARS} members that show the theme best, or `dissent` for a fact that speaks of the theme but contradicts it.\n"
            ));
        }
        s
    }

    /// The output schema narrowed to one context: `assign` holds exactly
    /// its ids, in the order shown, so a grammar-constrained model can
    /// neither skip an item, repeat one, nor name one it was not shown.
    pub fn schema_for(&self, items: &[Item]) -> Value {
        let ids: Vec<&str> = items.iter().map(|i| i.id.as_str()).collect();
        output_schema(self.spec.max_themes, Some(&ids))
    }

    /// Reads one context's answer against the items it showed. Refused:
    /// no JSON, the wrong shape, an id the context did not show, an item
    /// it showed left unplaced, a theme number no label was given for, and
    /// an answer that places nothing in any theme. Counts are never read
    /// from the model: a theme's count is the facts its members hold.
    pub fn interpret(&self, raw: &str, items: &[Item]) -> Result<Interpreted, Invalid> {
        let answer = self.check(raw, items)?;
        Ok(Interpreted {
            status: Status::Positive,
            decision: None,
            facts: serde_json::to_value(&answer).unwrap_or(Value::Null),
            confidence: None,
            choice_scores: Vec::new(),
            evidence: Vec::new(),
            reason: None,
        })
    }

    fn check(&self, raw: &str, items: &[Item]) -> Result<NodeAnswer, Invalid> {
        let out: Value = serde_json::from_str(strip_fences(raw))
            .map_err(|e| Invalid::MalformedJson(e.to_string()))?;
        let schema = |d: String| Invalid::Schema(d);
        let labels = out
            .get("themes")
            .and_then(Value::as_array)
            .ok_or_else(|| schema("`themes` must be an array of labels".into()))?;
        if labels.is_empty() {
            return Err(schema(
                "no theme proposed: a context proposes at least one".into(),
            ));
        }
        if labels.len() > self.spec.max_themes {
            return Err(schema(format!(
                "{} themes, more than the {} allowed",
                labels.len(),
                self.spec.max_themes
            )));
        }
        let mut themes = Vec::with_capacity(labels.len());
        for l in labels {
            let label = l
                .as_str()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .ok_or_else(|| schema(format!("theme label {l} is not a non-empty string")))?;
            themes.push(ProposedTheme {
                label: label.chars().take(MAX_LABEL_CHARS).collect(),
                members: Vec::new(),
                count: 0,
                exemplars: Vec::new(),
                dissent: Vec::new(),
            });
        }
        let assign = out
            .get("assign")
            .and_then(Value::as_object)
            .ok_or_else(|| schema("`assign` must be an object keyed by the ids shown".into()))?;
        if let Some(foreign) = assign.keys().find(|k| !items.iter().any(|i| &i.id == *k)) {
            return Err(schema(format!(
                "assign: id {foreign:?} is not one this context showed"
            )));
        }
        let mut answer = NodeAnswer::default();
        for item in items {
            let place = assign
                .get(&item.id)
                .ok_or_else(|| schema(format!("assign: {:?} was shown but not placed", item.id)))?;
            let theme = place
                .get("theme")
                .and_then(Value::as_u64)
                .ok_or_else(|| schema(format!("assign: {:?} has no theme number", item.id)))?;
            let role = place.get("as").and_then(Value::as_str).unwrap_or("member");
            if !["member", "exemplar", "dissent"].contains(&role) {
                return Err(schema(format!(
                    "assign: {:?} is placed as {role:?}, not member, exemplar or dissent",
                    item.id
                )));
            }
            let n = themes.len();
            let Some(index) = theme.checked_sub(1) else {
                if item.label.is_none() {
                    answer.outliers.push(item.id.clone());
                }
                continue;
            };
            let t = usize::try_from(index)
                .ok()
                .and_then(|i| themes.get_mut(i))
                .ok_or_else(|| {
                    schema(format!(
                        "assign: {:?} is placed in theme {theme}, but {n} were named",
                        item.id
                    ))
                })?;
            if role == "dissent" {
                t.dissent.push(item.id.clone());
                continue;
            }
            // Exemplars are a presentation hint: beyond the first few a
            // theme's members are simply members.
            if role == "exemplar" && t.exemplars.len() < MAX_EXEMPLARS {
                t.exemplars.push(item.id.clone());
            }
            t.members.push(item.id.clone());
            t.count += item.leaves.len() as u64;
        }
        // A label no item was placed under is no theme.
        answer.themes = themes
            .into_iter()
            .filter(|t| !t.members.is_empty())
            .collect();
        if answer.themes.is_empty() {
            return Err(schema(
                "no item placed in any theme: a context proposes at least one theme of one member"
                    .into(),
            ));
        }
        Ok(answer)
    }

    /// Folds one level's answers into the next level's items. `nodes` is
    /// each context's range of `items` with its key and its answer (`None`
    /// when it failed). Theme ids run `T1`, `T2`, ... across the level.
    pub fn next_level(
        items: &[Item],
        nodes: &[(Range<usize>, ContentHash, Option<NodeAnswer>)],
    ) -> Level {
        let mut level = Level::default();
        let mut carried = Vec::new();
        for (range, key, answer) in nodes {
            let shown = items.get(range.clone()).unwrap_or_default();
            let Some(answer) = answer else {
                // A failed leaf context loses its facts' themes; a failed
                // merge carries its themes up unmerged.
                if shown.iter().all(|i| i.label.is_none()) {
                    level
                        .failed
                        .extend(shown.iter().flat_map(|i| i.leaves.iter().cloned()));
                } else {
                    carried.extend(shown.iter().cloned());
                }
                continue;
            };
            let by_id: HashMap<&str, &Item> = shown.iter().map(|i| (i.id.as_str(), i)).collect();
            let mut taken: BTreeSet<&str> = BTreeSet::new();
            for (n, t) in answer.themes.iter().enumerate() {
                let members: Vec<&Item> = t
                    .members
                    .iter()
                    .filter_map(|m| by_id.get(m.as_str()).copied())
                    .collect();
                taken.extend(t.members.iter().map(String::as_str));
                let leaves: Vec<String> = members
                    .iter()
                    .flat_map(|i| i.leaves.iter().cloned())
                    .collect();
                // A merged theme's exemplars are its exemplar themes'; a
                // fact theme's, the facts named.
                let exemplars: Vec<String> = t
                    .exemplars
                    .iter()
                    .filter_map(|e| by_id.get(e.as_str()))
                    .flat_map(|i| {
                        if i.label.is_some() {
                            i.exemplars.clone()
                        } else {
                            vec![i.id.clone()]
                        }
                    })
                    .take(MAX_EXEMPLARS)
                    .collect();
                let mut dissent: Vec<String> = members
                    .iter()
                    .flat_map(|i| i.dissent.iter().cloned())
                    .chain(
                        t.dissent
                            .iter()
                            .filter_map(|d| by_id.get(d.as_str()))
                            .flat_map(|i| i.leaves.iter().cloned()),
                    )
                    .filter(|d| !leaves.contains(d))
                    .collect();
                dissent.dedup();
                let example = exemplars
                    .first()
                    .and_then(|e| members.iter().find(|i| i.leaves.contains(e)))
                    .map(|i| match &i.label {
                        Some(_) => i.view.get("example").cloned().unwrap_or(Value::Null),
                        None => i.view.clone(),
                    })
                    .or_else(|| members.first().map(|i| i.view.clone()))
                    .unwrap_or(Value::Null);
                let view = json!({"theme": t.label, "example": example});
                let mut h = StableHasher::new(Bucket::ClusterNode);
                h.field("node", key).field("theme", &(n as u64));
                level.items.push(Item {
                    id: String::new(),
                    key: h.finish(),
                    leaves,
                    label: Some(t.label.clone()),
                    exemplars,
                    dissent,
                    view,
                });
            }
            for i in shown {
                if taken.contains(i.id.as_str()) {
                    continue;
                }
                if i.label.is_some() {
                    carried.push(i.clone());
                } else if answer.outliers.contains(&i.id) {
                    level.outliers.push(i.id.clone());
                } else {
                    level.unthemed.push(i.id.clone());
                }
            }
        }
        level.items.extend(carried);
        for (n, it) in level.items.iter_mut().enumerate() {
            it.id = format!("T{}", n + 1);
        }
        level
    }
}

/// The schema of a context's answer: up to `max_themes` labels, then every
/// item's place. `ids` narrows `assign` to one context's ids, all required
/// in the order shown; without it (the shared prefix) any id may appear.
fn output_schema(max_themes: usize, ids: Option<&[&str]>) -> Value {
    let place = json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["theme", "as"],
        "properties": {
            "theme": {"enum": (0..=max_themes).collect::<Vec<_>>()},
            "as": {"enum": ["member", "exemplar", "dissent"]},
        }
    });
    let assign = match ids {
        Some(ids) => {
            let properties: serde_json::Map<String, Value> = ids
                .iter()
                .map(|id| ((*id).to_owned(), place.clone()))
                .collect();
            json!({
                "type": "object",
                "additionalProperties": false,
                "required": ids,
                "properties": properties,
            })
        }
        None => json!({"type": "object", "additionalProperties": place}),
    };
    json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["themes", "assign"],
        "properties": {
            "themes": {
                "type": "array",
                "minItems": 1,
                "maxItems": max_themes,
                "items": {"type": "string", "minLength": 1, "maxLength": MAX_LABEL_CHARS},
            },
            "assign": assign,
        }
    })
}

/// `ids` in a seeded order: the identity for order 0, else sorted by a
/// keyed hash of each id, so every order is reproducible.
pub fn shuffled<T: Clone>(items: &[T], id: impl Fn(&T) -> &str, seed: u64, order: usize) -> Vec<T> {
    let mut out: Vec<T> = items.to_vec();
    if order == 0 {
        return out;
    }
    out.sort_by_cached_key(|t| {
        let mut h = StableHasher::new(Bucket::ClusterNode);
        h.field("seed", &seed)
            .field("order", &(order as u64))
            .field("id", id(t));
        h.finish()
    });
    out
}

/// How far two reductions' themes are apart: 1 less the symmetric,
/// size-weighted best-match Jaccard of their memberships. 0 when each
/// theme of one has an identical theme in the other; 1 when no theme of
/// one shares a fact with any of the other.
pub fn drift(a: &[Vec<String>], b: &[Vec<String>]) -> f64 {
    fn sim(a: &[Vec<String>], b: &[Vec<String>]) -> f64 {
        let total: usize = a.iter().map(Vec::len).sum();
        if total == 0 {
            return if b.iter().all(Vec::is_empty) {
                1.0
            } else {
                0.0
            };
        }
        let sets: Vec<BTreeSet<&str>> = b
            .iter()
            .map(|t| t.iter().map(String::as_str).collect())
            .collect();
        let weighted: f64 = a
            .iter()
            .map(|t| {
                let s: BTreeSet<&str> = t.iter().map(String::as_str).collect();
                let best = sets
                    .iter()
                    .map(|o| {
                        let inter = s.intersection(o).count() as f64;
                        let union = s.union(o).count() as f64;
                        if union == 0.0 { 0.0 } else { inter / union }
                    })
                    .fold(0.0, f64::max);
                best * t.len() as f64
            })
            .sum();
        weighted / total as f64
    }
    1.0 - (sim(a, b) + sim(b, a)) / 2.0
}

/// One item as a context shows it: a quoted id and compact JSON, so no
/// text of a fact can open a line of its own.
fn item_line(it: &Item, merging: bool) -> String {
    let id = serde_json::to_string(&it.id).unwrap_or_default();
    let view = serde_json::to_string(&it.view).unwrap_or_default();
    if merging {
        format!("Theme {id} ({} facts): {view}\n", it.leaves.len())
    } else {
        format!("Fact {id}: {view}\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fanfold_core::spec::StressSpec;

    fn spec(fan_in: usize, max_themes: usize) -> ClusterStageSpec {
        ClusterStageSpec {
            name: "themes".into(),
            version: 1,
            reads: "judge".into(),
            statuses: vec!["positive".into()],
            rubric: "r.md".into(),
            project: None,
            backend: "default".into(),
            fan_in,
            max_context_tokens: None,
            max_themes,
            max_attempts: 2,
            max_output_tokens: 100,
            temperature: 0.0,
            seed: 0,
            execution: Default::default(),
            stress: None,
        }
    }

    fn stage() -> ClusterStage {
        ClusterStage::new(spec(4, 2), "Group by cause.".into()).unwrap()
    }

    fn facts(ids: &[&str]) -> Vec<Item> {
        ids.iter()
            .map(|id| ClusterStage::fact_item(id, json!({"quote": format!("fact {id}")})))
            .collect()
    }

    #[test]
    fn contexts_close_early_at_the_token_bound_and_an_item_past_it_stands_alone() {
        let mut sp = spec(4, 2);
        // Each fact line below takes 30 to 32 bytes: about 16 tokens.
        sp.max_context_tokens = Some(40);
        let s = ClusterStage::new(sp, "Group by cause.".into()).unwrap();
        let mut items = facts(&["1", "2", "3", "4", "5"]);
        items.insert(
            2,
            ClusterStage::fact_item("long", json!({"quote": "x".repeat(200)})),
        );
        let ranges = s.contexts(&items, 4);
        assert_eq!(ranges, [0..2, 2..3, 3..5, 5..6]);
        for r in &ranges {
            let shown = &items[r.clone()];
            let used: u64 = shown.iter().map(|i| s.item_tokens(i)).sum();
            assert_eq!(s.over_bound(shown).is_some(), used > 40, "{r:?}");
        }
        assert!(
            s.over_bound(&items[2..3])
                .unwrap()
                .contains("refused, not cut")
        );
        // Without a bound, contexts are runs of the fan-in.
        assert_eq!(stage().contexts(&items, 4), [0..4, 4..6]);
    }

    #[test]
    fn an_answer_is_checked_against_what_the_context_showed() {
        let s = stage();
        let items = facts(&["1", "2", "3", "4"]);
        let place = |theme: u64, role: &str| json!({"theme": theme, "as": role});
        let ok = s
            .check(
                &json!({"themes": ["a", "never used"], "assign": {
                    "1": place(1, "exemplar"), "2": place(1, "member"),
                    "3": place(1, "dissent"), "4": place(0, "member"),
                }})
                .to_string(),
                &items,
            )
            .unwrap();
        // The unused label is no theme; the count is the members' own.
        assert_eq!(ok.themes.len(), 1);
        assert_eq!(ok.themes[0].members, vec!["1", "2"]);
        assert_eq!(ok.themes[0].count, 2);
        assert_eq!(ok.themes[0].exemplars, vec!["1"]);
        assert_eq!(ok.themes[0].dissent, vec!["3"]);
        assert_eq!(ok.outliers, vec!["4"]);
        let all = |theme: u64| {
            json!({"1": place(theme, "member"), "2": place(theme, "member"),
                   "3": place(theme, "member"), "4": place(theme, "member")})
        };
        for (bad, says) in [
            (
                json!({"themes": ["a"], "assign": {"1": place(1, "member"), "9": place(1, "member")}}),
                "not one this context showed",
            ),
            (
                json!({"themes": ["a"], "assign": {"1": place(1, "member")}}),
                "\"2\" was shown but not placed",
            ),
            (
                json!({"themes": ["a"], "assign": all(2)}),
                "placed in theme 2, but 1 were named",
            ),
            (
                json!({"themes": ["a"], "assign": all(0)}),
                "no item placed in any theme",
            ),
            (
                json!({"themes": ["a", "b", "c"], "assign": all(1)}),
                "more than the 2 allowed",
            ),
            (json!({"themes": [], "assign": all(1)}), "no theme proposed"),
            (
                json!({"themes": [" "], "assign": all(1)}),
                "not a non-empty string",
            ),
            (
                json!({"themes": ["a"], "assign": {"1": place(1, "boss"), "2": place(1, "member"),
                       "3": place(1, "member"), "4": place(1, "member")}}),
                "not member, exemplar or dissent",
            ),
        ] {
            let e = s.check(&bad.to_string(), &items).unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
        assert!(matches!(
            s.check("some themes", &items),
            Err(Invalid::MalformedJson(_))
        ));
    }

    #[test]
    fn the_narrowed_schema_requires_every_id_shown_in_order_and_nothing_else() {
        let s = stage();
        let schema = s.schema_for(&facts(&["b", "a"]));
        let assign = &schema["properties"]["assign"];
        assert_eq!(assign["required"], json!(["b", "a"]));
        let keys: Vec<&String> = assign["properties"].as_object().unwrap().keys().collect();
        assert_eq!(keys, ["b", "a"]);
        assert_eq!(assign["additionalProperties"], false);
        assert_eq!(
            assign["properties"]["a"]["properties"]["theme"]["enum"],
            json!([0, 1, 2])
        );
    }

    #[test]
    fn exemplars_beyond_the_first_few_are_members() {
        let s = stage();
        let items = facts(&["1", "2", "3"]);
        let e = json!({"theme": 1, "as": "exemplar"});
        let ok = s
            .check(
                &json!({"themes": ["a"], "assign": {"1": e, "2": e, "3": e}}).to_string(),
                &items,
            )
            .unwrap();
        assert_eq!(ok.themes[0].exemplars, vec!["1", "2"]);
        assert_eq!(ok.themes[0].members, vec!["1", "2", "3"]);
    }

    #[test]
    fn a_merged_theme_counts_the_facts_of_its_members() {
        let s = stage();
        let leaves = facts(&["1", "2", "3", "4", "5"]);
        let key = ContentHash::of_bytes(b"n");
        let a = NodeAnswer {
            themes: vec![
                ProposedTheme {
                    label: "x".into(),
                    members: vec!["1".into(), "2".into(), "3".into()],
                    count: 3,
                    exemplars: vec!["2".into()],
                    dissent: vec!["5".into()],
                },
                ProposedTheme {
                    label: "y".into(),
                    members: vec!["4".into()],
                    count: 1,
                    exemplars: Vec::new(),
                    dissent: Vec::new(),
                },
            ],
            outliers: Vec::new(),
        };
        let level = ClusterStage::next_level(&leaves, &[(0..5, key, Some(a))]);
        assert_eq!(level.items.len(), 2);
        assert_eq!(level.unthemed, vec!["5"]);
        let t1 = &level.items[0];
        assert_eq!((t1.id.as_str(), t1.leaves.len()), ("T1", 3));
        assert_eq!(t1.exemplars, vec!["2"]);
        assert_eq!(t1.dissent, vec!["5"]);
        // Merging T1 and T2 holds 4 facts, not 2 themes.
        let merged = json!({"themes": ["z"], "assign": {
            "T1": {"theme": 1, "as": "exemplar"}, "T2": {"theme": 1, "as": "member"},
        }});
        let answer = s.check(&merged.to_string(), &level.items).unwrap();
        assert_eq!(answer.themes[0].count, 4);
        // A theme left out of a merge is no outlier: it is carried up.
        let apart = json!({"themes": ["z"], "assign": {
            "T1": {"theme": 1, "as": "member"}, "T2": {"theme": 0, "as": "member"},
        }});
        assert!(
            s.check(&apart.to_string(), &level.items)
                .unwrap()
                .outliers
                .is_empty()
        );
        let key2 = ContentHash::of_bytes(b"m");
        let top = ClusterStage::next_level(&level.items, &[(0..2, key2, Some(answer))]);
        assert_eq!(top.items.len(), 1);
        assert_eq!(top.items[0].leaves, vec!["1", "2", "3", "4"]);
        assert_eq!(top.items[0].exemplars, vec!["2"]);
    }

    #[test]
    fn a_failed_context_loses_its_facts_or_carries_its_themes_up() {
        let leaves = facts(&["1", "2", "3"]);
        let key = ContentHash::of_bytes(b"n");
        let level = ClusterStage::next_level(&leaves, &[(0..3, key, None)]);
        assert_eq!(level.failed, vec!["1", "2", "3"]);
        assert!(level.items.is_empty());
        let themes = vec![
            Item {
                label: Some("a".into()),
                ..ClusterStage::fact_item("T1", json!({}))
            },
            Item {
                label: Some("b".into()),
                ..ClusterStage::fact_item("T2", json!({}))
            },
        ];
        let up = ClusterStage::next_level(&themes, &[(0..2, key, None)]);
        assert_eq!(up.items.len(), 2);
        assert!(up.failed.is_empty());
    }

    #[test]
    fn node_keys_cover_every_item_and_its_order() {
        let s = stage();
        let model = ModelParams {
            backend: "scripted".into(),
            model_id: "m".into(),
            temperature: 0.0,
            max_output_tokens: 10,
            seed: 0,
            simulated: true,
        };
        let items = facts(&["1", "2"]);
        let k = s.node_key(&items, &model);
        let mut rev = items.clone();
        rev.reverse();
        assert_ne!(k, s.node_key(&rev, &model));
        let mut edited = items.clone();
        edited[1] = ClusterStage::fact_item("2", json!({"quote": "edited"}));
        assert_ne!(k, s.node_key(&edited, &model));
        assert_eq!(k, s.node_key(&facts(&["1", "2"]), &model));
    }

    #[test]
    fn drift_is_zero_for_the_same_themes_and_one_for_disjoint_ones() {
        let v = |xs: &[&[&str]]| -> Vec<Vec<String>> {
            xs.iter()
                .map(|t| t.iter().map(|s| s.to_string()).collect())
                .collect()
        };
        let a = v(&[&["1", "2"], &["3"]]);
        assert_eq!(drift(&a, &v(&[&["3"], &["2", "1"]])), 0.0);
        assert_eq!(drift(&a, &v(&[&["7"]])), 1.0);
        let d = drift(&a, &v(&[&["1", "2", "3"]]));
        assert!(d > 0.0 && d < 1.0, "{d}");
    }

    #[test]
    fn shuffles_are_seeded_and_the_first_order_is_the_source_order() {
        let ids: Vec<String> = (0..20).map(|i| i.to_string()).collect();
        assert_eq!(shuffled(&ids, |s| s, 1, 0), ids);
        let a = shuffled(&ids, |s| s, 1, 1);
        assert_eq!(a, shuffled(&ids, |s| s, 1, 1));
        assert_ne!(a, ids);
        assert_ne!(a, shuffled(&ids, |s| s, 1, 2));
    }

    #[test]
    fn a_tree_that_could_not_narrow_is_refused() {
        let e = ClusterStage::new(spec(4, 3), String::new()).err().unwrap();
        assert!(e.to_string().contains("at least twice"), "{e}");
        let mut s = spec(8, 2);
        s.stress = Some(StressSpec {
            orders: 2,
            fan_ins: vec![3],
            max_drift: 0.5,
            seed: 0,
        });
        assert!(ClusterStage::new(s, String::new()).is_err());
        assert_eq!(ClusterStage::groups(5, 2), vec![0..2, 2..4, 4..5]);
    }
}
