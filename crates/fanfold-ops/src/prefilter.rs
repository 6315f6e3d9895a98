//! The deterministic prefilter: jq rules that keep, exclude (with a reason
//! code) or route each unit before any model sees it.

use fanfold_core::spec::{PrefilterAction, PrefilterRule};
use serde::{Deserialize, Serialize};

use crate::jq::{JqError, JqProgram};

/// What the prefilter decided for one unit.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum Outcome {
    /// Goes to the default (first) stage.
    Keep {
        rule: Option<String>,
    },
    Exclude {
        rule: String,
        reason: String,
    },
    Route {
        rule: String,
        stage: String,
    },
}

impl Outcome {
    /// The stage the unit goes to, if any.
    pub fn stage<'a>(&'a self, default_stage: &'a str) -> Option<&'a str> {
        match self {
            Outcome::Keep { .. } => Some(default_stage),
            Outcome::Route { stage, .. } => Some(stage),
            Outcome::Exclude { .. } => None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PrefilterError {
    #[error("prefilter rule `{rule}`: {source}")]
    Jq { rule: String, source: JqError },
    #[error("prefilter rule `{rule}`: action `route` needs `stage`")]
    MissingStage { rule: String },
    #[error("prefilter rule `{rule}` on unit {unit}: {source}")]
    Eval {
        rule: String,
        unit: String,
        source: JqError,
    },
}

struct CompiledRule {
    rule: PrefilterRule,
    program: JqProgram,
}

/// The compiled rule list. Compile once per thread (jq values are not Send).
pub struct Prefilter {
    rules: Vec<CompiledRule>,
}

impl Prefilter {
    pub fn compile(rules: &[PrefilterRule]) -> Result<Prefilter, PrefilterError> {
        let mut compiled = Vec::with_capacity(rules.len());
        for rule in rules {
            if rule.action == PrefilterAction::Route && rule.stage.is_none() {
                return Err(PrefilterError::MissingStage {
                    rule: rule.name.clone(),
                });
            }
            let program = JqProgram::compile(&rule.when).map_err(|source| PrefilterError::Jq {
                rule: rule.name.clone(),
                source,
            })?;
            compiled.push(CompiledRule {
                rule: rule.clone(),
                program,
            });
        }
        Ok(Prefilter { rules: compiled })
    }

    /// Decides one unit. A rule that fails at run time (e.g. `.labels[]` on a
    /// unit without labels) is an error naming the rule and the unit, not a
    /// silent exclusion.
    pub fn decide(&self, unit_id: &str, value: jaq_json::Val) -> Result<Outcome, PrefilterError> {
        for c in &self.rules {
            let hit = c
                .program
                .test(value.clone())
                .map_err(|source| PrefilterError::Eval {
                    rule: c.rule.name.clone(),
                    unit: unit_id.to_owned(),
                    source,
                })?;
            if !hit {
                continue;
            }
            let rule = c.rule.name.clone();
            return Ok(match c.rule.action {
                PrefilterAction::Keep => Outcome::Keep { rule: Some(rule) },
                PrefilterAction::Exclude => Outcome::Exclude {
                    reason: c.rule.reason.clone().unwrap_or_else(|| rule.clone()),
                    rule,
                },
                PrefilterAction::Route => Outcome::Route {
                    stage: c.rule.stage.clone().unwrap_or_default(),
                    rule,
                },
            });
        }
        Ok(Outcome::Keep { rule: None })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jq::to_val;
    use serde_json::json;

    fn rule(name: &str, when: &str, action: PrefilterAction) -> PrefilterRule {
        PrefilterRule {
            name: name.into(),
            when: when.into(),
            action,
            reason: None,
            stage: if action == PrefilterAction::Route {
                Some("deep".into())
            } else {
                None
            },
        }
    }

    #[test]
    fn first_matching_rule_decides() {
        let pf = Prefilter::compile(&[
            rule("closed", r#".state == "CLOSED""#, PrefilterAction::Exclude),
            rule("long", ".body | length > 10", PrefilterAction::Route),
        ])
        .expect("compiles");
        let closed = json!({"state": "CLOSED", "body": "a very long body"});
        assert_eq!(
            pf.decide("1", to_val(&closed)).expect("ok"),
            Outcome::Exclude {
                rule: "closed".into(),
                reason: "closed".into()
            }
        );
        let long = json!({"state": "OPEN", "body": "a very long body"});
        assert_eq!(
            pf.decide("2", to_val(&long)).expect("ok").stage("main"),
            Some("deep")
        );
        let short = json!({"state": "OPEN", "body": "short"});
        assert_eq!(
            pf.decide("3", to_val(&short)).expect("ok"),
            Outcome::Keep { rule: None }
        );
    }

    #[test]
    fn errors_name_the_rule_and_unit() {
        let err = Prefilter::compile(&[rule("bad", ".state ==", PrefilterAction::Keep)])
            .err()
            .expect("fails");
        assert!(err.to_string().contains("`bad`"), "{err}");
        let pf = Prefilter::compile(&[rule(
            "labels",
            ".labels[] | .name == \"x\"",
            PrefilterAction::Keep,
        )])
        .expect("ok");
        let err = pf
            .decide("42", to_val(&json!({"labels": 3})))
            .expect_err("fails");
        assert!(err.to_string().contains("unit 42"), "{err}");
    }
}
