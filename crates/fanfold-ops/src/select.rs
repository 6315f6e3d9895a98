//! The select operator: a typed choice per unit from a declared catalog.
//!
//! A choice is one of four actions, each fixed by the spec: run a stage,
//! escalate to a stage, exclude with a reason code, or abstain. Rules (jq
//! over the unit's view) decide first; a model scores only the catalog's
//! names for the rest, its output constrained to them. A choice carries no
//! arguments of its own, so whatever a record says, a unit can only go
//! where the spec already sends some unit.

use std::collections::BTreeSet;

use fanfold_core::spec::{SelectChoice, SelectRule, SelectStageSpec};
use fanfold_core::{Bucket, ContentHash, StableHasher};
use serde_json::{Value, json};

use crate::jq::{JqError, JqProgram, Site, to_val};

/// What a choice does with a unit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// On to this stage.
    Run(String),
    /// On to this stage, counted as an escalation.
    Escalate(String),
    /// Ends here as a negative with this reason code.
    Exclude(String),
    /// Ends here as an abstain.
    Abstain,
}

impl Action {
    /// The stage the unit goes on to, for `run` and `escalate`.
    pub fn target(&self) -> Option<&str> {
        match self {
            Action::Run(s) | Action::Escalate(s) => Some(s),
            Action::Exclude(_) | Action::Abstain => None,
        }
    }

    pub fn label(&self) -> String {
        match self {
            Action::Run(s) => format!("run({s})"),
            Action::Escalate(s) => format!("escalate({s})"),
            Action::Exclude(r) => format!("exclude({r})"),
            Action::Abstain => "abstain".to_owned(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SelectSpecError {
    #[error("select `{stage}`: {detail}")]
    Invalid { stage: String, detail: String },
    #[error("select `{stage}` rule `{rule}`: {source}")]
    Rule {
        stage: String,
        rule: String,
        source: JqError,
    },
}

/// The JSON pointer of the choice in the model's output.
pub const CHOICE_POINTER: &str = "/choice";

/// A checked catalog with its compiled rules.
pub struct Catalog {
    stage: String,
    names: Vec<String>,
    descriptions: Vec<String>,
    actions: Vec<Action>,
    rules: Vec<(String, JqProgram, usize)>,
    /// How a runaway rule names itself, per rule.
    sites: Vec<String>,
    below_floor: Option<usize>,
    min_confidence: Option<f64>,
    otherwise: Option<usize>,
}

impl Catalog {
    pub fn new(spec: &SelectStageSpec) -> Result<Catalog, SelectSpecError> {
        let invalid = |detail: String| SelectSpecError::Invalid {
            stage: spec.name.clone(),
            detail,
        };
        if spec.choices.is_empty() {
            return Err(invalid("declares no choices".into()));
        }
        let mut seen = BTreeSet::new();
        let mut actions = Vec::with_capacity(spec.choices.len());
        for c in &spec.choices {
            if c.name.is_empty() || !seen.insert(c.name.as_str()) {
                return Err(invalid(format!(
                    "choice names must be unique and not empty; {:?} is not",
                    c.name
                )));
            }
            actions.push(action_of(c).map_err(&invalid)?);
        }
        let names: Vec<String> = spec.choices.iter().map(|c| c.name.clone()).collect();
        let index = |what: &str, name: &str| {
            names.iter().position(|n| n == name).ok_or_else(|| {
                invalid(format!(
                    "{what} names choice `{name}`, which is not in the catalog ({})",
                    names.join(", ")
                ))
            })
        };
        let mut rules = Vec::with_capacity(spec.rules.len());
        for SelectRule { name, when, choose } in &spec.rules {
            let program = JqProgram::compile(when).map_err(|source| SelectSpecError::Rule {
                stage: spec.name.clone(),
                rule: name.clone(),
                source,
            })?;
            rules.push((
                name.clone(),
                program,
                index(&format!("rule `{name}`"), choose)?,
            ));
        }
        let (below_floor, min_confidence) = match &spec.model {
            Some(m) => {
                if let Some(c) = m.min_confidence
                    && !(0.0..=1.0).contains(&c)
                {
                    return Err(invalid(format!("min_confidence {c} must be within [0, 1]")));
                }
                let below = match &m.below_floor {
                    Some(name) => {
                        let i = index("below_floor", name)?;
                        if !matches!(actions.get(i), Some(Action::Escalate(_) | Action::Abstain)) {
                            return Err(invalid(format!(
                                "below_floor `{name}` must be an `escalate` or `abstain` choice: a unit the model is unsure of is not run or excluded on its word"
                            )));
                        }
                        Some(i)
                    }
                    None => None,
                };
                if m.min_confidence.is_some() != below.is_some() {
                    return Err(invalid(
                        "min_confidence and below_floor go together: the floor, and where a unit below it goes".into(),
                    ));
                }
                (below, m.min_confidence)
            }
            None => (None, None),
        };
        let otherwise = match &spec.otherwise {
            Some(name) => Some(index("otherwise", name)?),
            None => None,
        };
        if spec.model.is_none() && otherwise.is_none() {
            return Err(invalid(
                "has no model and no `otherwise`: a unit no rule decides would have nowhere to go"
                    .into(),
            ));
        }
        Ok(Catalog {
            sites: spec
                .rules
                .iter()
                .map(|r| format!("rule `{}` of select `{}`", r.name, spec.name))
                .collect(),
            stage: spec.name.clone(),
            descriptions: spec.choices.iter().map(|c| c.description.clone()).collect(),
            names,
            actions,
            rules,
            below_floor,
            min_confidence,
            otherwise,
        })
    }

    pub fn names(&self) -> &[String] {
        &self.names
    }

    pub fn action(&self, choice: usize) -> Option<&Action> {
        self.actions.get(choice)
    }

    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.names.iter().position(|n| n == name)
    }

    /// Every stage a choice may send a unit to.
    pub fn targets(&self) -> Vec<&str> {
        let mut out: Vec<&str> = self.actions.iter().filter_map(Action::target).collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    pub fn rule_names(&self) -> impl Iterator<Item = &str> {
        self.rules.iter().map(|(n, _, _)| n.as_str())
    }

    pub fn rule_choice(&self, rule: usize) -> Option<usize> {
        self.rules.get(rule).map(|r| r.2)
    }

    pub fn otherwise(&self) -> Option<usize> {
        self.otherwise
    }

    /// The first rule that matches `view`, with the choice it picks.
    pub fn decide(&self, unit: &str, view: &Value) -> Result<Option<(usize, usize)>, JqError> {
        let val = to_val(view);
        for (i, ((_, program, choice), site)) in self.rules.iter().zip(&self.sites).enumerate() {
            if program.test_bool(val.clone(), Site::new(site, unit))? {
                return Ok(Some((i, *choice)));
            }
        }
        Ok(None)
    }

    /// Whether a confidence floor is declared.
    pub fn has_floor(&self) -> bool {
        self.min_confidence.is_some() && self.below_floor.is_some()
    }

    /// The choice taken for a model's pick at `confidence`: its own, or
    /// `below_floor` when the probability is under the floor. The flag
    /// says whether the floor moved it.
    pub fn settle(&self, picked: usize, confidence: Option<f64>) -> (usize, bool) {
        match (self.min_confidence, confidence, self.below_floor) {
            (Some(min), Some(c), Some(below)) if c < min && picked != below => (below, true),
            _ => (picked, false),
        }
    }

    /// The schema the model's output must satisfy: one name of the
    /// catalog, nothing else.
    pub fn output_schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {"choice": {"type": "string", "enum": self.names}},
            "required": ["choice"],
            "additionalProperties": false
        })
    }

    /// The rubric with the catalog appended: the names the model may pick
    /// and what each means. The actions are not shown: what a choice does
    /// is the spec's business, not the model's.
    pub fn rubric(&self, rubric: &str) -> String {
        let mut out = rubric.trim_end().to_owned();
        out.push_str("\n\n## Choices\n\nPick exactly one:\n");
        for (name, desc) in self.names.iter().zip(&self.descriptions) {
            if desc.is_empty() {
                out.push_str(&format!("- `{name}`\n"));
            } else {
                out.push_str(&format!("- `{name}`: {desc}\n"));
            }
        }
        out
    }

    /// What the select means, for its facts' keys: the catalog, the rules,
    /// the floor.
    pub fn definition_hash(&self, spec: &SelectStageSpec) -> ContentHash {
        let mut h = StableHasher::new(Bucket::SelectDef);
        h.field("name", &self.stage);
        h.field("version", &spec.version);
        h.field("choices", &self.names);
        h.field(
            "actions",
            &self.actions.iter().map(Action::label).collect::<Vec<_>>(),
        );
        h.field("descriptions", &self.descriptions);
        h.field(
            "rules",
            &spec
                .rules
                .iter()
                .map(|r| format!("{}\u{0}{}\u{0}{}", r.name, r.when, r.choose))
                .collect::<Vec<_>>(),
        );
        h.field("fields", &spec.fields);
        h.field("project", &spec.project);
        h.field("otherwise", &spec.otherwise);
        h.field(
            "min_confidence",
            &self.min_confidence.map(|c| c.to_string()),
        );
        h.field("below_floor", &self.below_floor);
        h.finish()
    }
}

fn action_of(c: &SelectChoice) -> Result<Action, String> {
    let mut set = Vec::new();
    if let Some(s) = &c.run {
        set.push(Action::Run(s.clone()));
    }
    if let Some(s) = &c.escalate {
        set.push(Action::Escalate(s.clone()));
    }
    if let Some(r) = &c.exclude {
        set.push(Action::Exclude(r.clone()));
    }
    if c.abstain {
        set.push(Action::Abstain);
    }
    match set.len() {
        1 => Ok(set.remove(0)),
        0 => Err(format!(
            "choice `{}` has no action; give one of run, escalate, exclude or abstain",
            c.name
        )),
        _ => Err(format!(
            "choice `{}` has {} actions ({}); a choice does exactly one thing",
            c.name,
            set.len(),
            set.iter().map(Action::label).collect::<Vec<_>>().join(", ")
        )),
    }
}

#[cfg(test)]
mod tests {
    use fanfold_core::spec::SelectModelSpec;

    use super::*;

    fn choice(name: &str) -> SelectChoice {
        SelectChoice {
            name: name.into(),
            description: String::new(),
            run: None,
            escalate: None,
            exclude: None,
            abstain: false,
        }
    }

    fn spec() -> SelectStageSpec {
        SelectStageSpec {
            name: "route".into(),
            version: 1,
            choices: vec![
                SelectChoice {
                    run: Some("judge".into()),
                    description: "might be a blocker".into(),
                    ..choice("judge")
                },
                SelectChoice {
                    exclude: Some("docs".into()),
                    ..choice("docs")
                },
                SelectChoice {
                    abstain: true,
                    ..choice("unsure")
                },
            ],
            rules: vec![SelectRule {
                name: "doc-label".into(),
                when: r#".labels | index("docs") != null"#.into(),
                choose: "docs".into(),
            }],
            fields: vec![],
            project: None,
            model: Some(SelectModelSpec {
                rubric: "r.md".into(),
                backend: "default".into(),
                min_confidence: Some(0.6),
                below_floor: Some("unsure".into()),
                max_attempts: 2,
                max_output_tokens: 16,
                temperature: 0.0,
                seed: 0,
                execution: Default::default(),
            }),
            otherwise: None,
        }
    }

    #[test]
    fn rules_decide_first_and_the_floor_moves_unsure_picks() {
        let c = Catalog::new(&spec()).expect("valid");
        let docs = json!({"labels": ["docs", "auth"]});
        assert_eq!(c.decide("u1", &docs).expect("runs"), Some((0, 1)));
        assert_eq!(c.decide("u2", &json!({"labels": []})).expect("runs"), None);
        assert_eq!(c.settle(0, Some(0.9)), (0, false));
        assert_eq!(c.settle(0, Some(0.3)), (2, true));
        // No probability, no floor to apply.
        assert_eq!(c.settle(0, None), (0, false));
        assert_eq!(c.targets(), vec!["judge"]);
        let schema = c.output_schema();
        assert_eq!(
            schema["properties"]["choice"]["enum"],
            json!(["judge", "docs", "unsure"])
        );
        assert!(
            c.rubric("Route it.")
                .contains("- `judge`: might be a blocker")
        );
    }

    #[test]
    fn catalog_mistakes_are_named() {
        let mut s = spec();
        s.choices[0].exclude = Some("x".into());
        let e = Catalog::new(&s).err().expect("two actions").to_string();
        assert!(e.contains("choice `judge` has 2 actions"), "{e}");

        let mut s = spec();
        s.rules[0].choose = "nowhere".into();
        let e = Catalog::new(&s).err().expect("unknown").to_string();
        assert!(e.contains("rule `doc-label` names choice `nowhere`"), "{e}");

        let mut s = spec();
        if let Some(m) = s.model.as_mut() {
            m.below_floor = Some("judge".into());
        }
        let e = Catalog::new(&s).err().expect("run below floor").to_string();
        assert!(
            e.contains("must be an `escalate` or `abstain` choice"),
            "{e}"
        );

        let mut s = spec();
        s.choices[2].abstain = false;
        let e = Catalog::new(&s).err().expect("no action").to_string();
        assert!(e.contains("choice `unsure` has no action"), "{e}");
    }

    #[test]
    fn the_definition_covers_the_catalog() {
        let a = Catalog::new(&spec()).expect("valid");
        let mut s = spec();
        s.choices[1].exclude = Some("documentation".into());
        let b = Catalog::new(&s).expect("valid");
        assert_ne!(a.definition_hash(&spec()), b.definition_hash(&s));
        assert_eq!(a.definition_hash(&spec()), a.definition_hash(&spec()));
    }
}
