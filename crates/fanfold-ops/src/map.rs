//! The map operator's contract: what one micro-context receives (a shared
//! prefix of rubric and schema, then the unit's projected fields) and how its
//! raw output becomes a typed, schema-checked, evidence-checked fact.

use fanfold_core::spec::StageSpec;
use fanfold_core::{ContentHash, Evidence, ModelParams, StableHash, StableHasher, Status};
use serde_json::Value;

/// Version of the prompt layout below; part of every map cache key.
pub const PROMPT_TEMPLATE: &str = "map-prompt-v1";

#[derive(Debug, thiserror::Error)]
pub enum MapSpecError {
    #[error("stage `{stage}`: output schema is not a valid JSON Schema: {detail}")]
    Schema { stage: String, detail: String },
    #[error("stage `{stage}`: `{pointer}` must be a JSON pointer starting with `/`")]
    Pointer { stage: String, pointer: String },
}

/// Why an output was refused. Every kind is retried within the stage's
/// attempt budget and then recorded as `error`, never as a negative.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    #[error("output is not JSON: {0}")]
    MalformedJson(String),
    #[error("output violates the schema: {0}")]
    Schema(String),
    #[error("decision {0} is not one the stage declares")]
    UnknownDecision(String),
    #[error("evidence quote not found verbatim in field `{field}`: {quote:?}")]
    FalseQuote { field: String, quote: String },
    #[error("evidence is malformed: {0}")]
    Evidence(String),
}

impl Invalid {
    pub fn code(&self) -> &'static str {
        match self {
            Invalid::MalformedJson(_) => "malformed_json",
            Invalid::Schema(_) => "schema_violation",
            Invalid::UnknownDecision(_) => "unknown_decision",
            Invalid::FalseQuote { .. } => "false_quote",
            Invalid::Evidence(_) => "bad_evidence",
        }
    }
}

/// A decided output.
#[derive(Clone, Debug, PartialEq)]
pub struct Interpreted {
    pub status: Status,
    pub decision: Option<String>,
    pub facts: Value,
    pub confidence: Option<f64>,
    pub evidence: Vec<Evidence>,
    pub reason: Option<String>,
}

/// A map stage ready to build prompts and judge outputs.
pub struct MapStage {
    pub spec: StageSpec,
    pub rubric: String,
    pub rubric_hash: ContentHash,
    pub schema: Value,
    validator: jsonschema::Validator,
    definition: ContentHash,
    prefix: String,
}

impl MapStage {
    pub fn new(spec: StageSpec, rubric: String, schema: Value) -> Result<MapStage, MapSpecError> {
        let validator = jsonschema::validator_for(&schema).map_err(|e| MapSpecError::Schema {
            stage: spec.name.clone(),
            detail: e.to_string(),
        })?;
        let pointers = [
            Some(&spec.decision.pointer),
            spec.evidence.as_ref(),
            spec.confidence.as_ref(),
        ];
        for p in pointers.into_iter().flatten() {
            if !p.starts_with('/') {
                return Err(MapSpecError::Pointer {
                    stage: spec.name.clone(),
                    pointer: p.clone(),
                });
            }
        }
        let rubric_hash = rubric.key_in("rubric-v1");
        let schema_text = serde_json::to_string_pretty(&schema).unwrap_or_default();
        let prefix = format!(
            "{rubric}\n\n## Output\n\nAnswer with one JSON object and nothing else. It must validate against this JSON Schema:\n\n```json\n{schema_text}\n```\n\nEvery evidence quote must be copied verbatim from the named field of the record.\n",
            rubric = rubric.trim_end()
        );
        let mut h = StableHasher::new("stage-def-v1");
        h.field("name", &spec.name)
            .field("type", "map")
            .field("version", &spec.version)
            .field("fields", &spec.fields)
            .field("schema", &schema)
            .field("decision_pointer", &spec.decision.pointer)
            .field("positive", &spec.decision.positive)
            .field("negative", &spec.decision.negative)
            .field("abstain", &spec.decision.abstain)
            .field("evidence", &spec.evidence)
            .field("confidence", &spec.confidence)
            .field("min_confidence", &spec.min_confidence)
            .field("template", PROMPT_TEMPLATE);
        let definition = h.finish();
        Ok(MapStage {
            spec,
            rubric,
            rubric_hash,
            schema,
            validator,
            definition,
            prefix,
        })
    }

    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// Hash of everything about the stage that bears on meaning except the
    /// rubric, which is keyed on its own.
    pub fn definition_hash(&self) -> ContentHash {
        self.definition
    }

    /// The immutable prefix every unit of this stage shares.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The unit's fields this stage is allowed to see.
    pub fn project(&self, value: &Value) -> Value {
        if self.spec.fields.is_empty() {
            return value.clone();
        }
        let mut out = serde_json::Map::new();
        for f in &self.spec.fields {
            out.insert(f.clone(), value.get(f).cloned().unwrap_or(Value::Null));
        }
        Value::Object(out)
    }

    /// The per-unit suffix: the record and nothing else.
    pub fn suffix(&self, unit_id: &str, projected: &Value) -> String {
        let body = serde_json::to_string_pretty(projected).unwrap_or_default();
        format!("Record {unit_id}:\n```json\n{body}\n```\n")
    }

    /// The cache key of this stage's fact for one unit. `input_hash` is the
    /// hash of the projected fields, so a change to a field the stage does
    /// not see keeps the fact.
    pub fn cache_key(&self, input_hash: ContentHash, model: &ModelParams) -> ContentHash {
        let mut h = StableHasher::new("facts-v1");
        h.field("input", &input_hash)
            .field("stage", &self.definition)
            .field("rubric", &self.rubric_hash)
            .field("backend", &model.backend)
            .field("model", &model.model_id)
            .field("temperature", &model.temperature)
            .field("max_output_tokens", &model.max_output_tokens)
            .field("seed", &model.seed);
        h.finish()
    }

    /// Judges one raw output against the schema, the decision lists and the
    /// unit's own text.
    pub fn interpret(&self, raw: &str, projected: &Value) -> Result<Interpreted, Invalid> {
        let facts: Value = serde_json::from_str(strip_fences(raw))
            .map_err(|e| Invalid::MalformedJson(e.to_string()))?;
        if let Some(first) = self.validator.iter_errors(&facts).next() {
            return Err(Invalid::Schema(format!(
                "{} at {}",
                first,
                first.instance_path()
            )));
        }
        let decision = match facts.pointer(&self.spec.decision.pointer) {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Bool(b)) => b.to_string(),
            other => {
                return Err(Invalid::UnknownDecision(
                    other
                        .map(|v| v.to_string())
                        .unwrap_or_else(|| "(missing)".into()),
                ));
            }
        };
        let d = &self.spec.decision;
        let mut status = if d.positive.contains(&decision) {
            Status::Positive
        } else if d.negative.contains(&decision) {
            Status::Negative
        } else if d.abstain.contains(&decision) {
            Status::Abstain
        } else {
            return Err(Invalid::UnknownDecision(format!("{decision:?}")));
        };
        let evidence = match &self.spec.evidence {
            Some(p) => check_evidence(facts.pointer(p), projected)?,
            None => Vec::new(),
        };
        let confidence = self
            .spec
            .confidence
            .as_ref()
            .and_then(|p| facts.pointer(p))
            .and_then(Value::as_f64);
        let mut reason = None;
        if let (Some(min), Some(c)) = (self.spec.min_confidence, confidence)
            && c < min
            && status != Status::Abstain
        {
            reason = Some(format!("low_confidence: {c:.3} < {min}"));
            status = Status::Abstain;
        }
        Ok(Interpreted {
            status,
            decision: Some(decision),
            facts,
            confidence,
            evidence,
            reason,
        })
    }
}

/// Models like to wrap JSON in Markdown fences; the content is what counts.
fn strip_fences(raw: &str) -> &str {
    let t = raw.trim();
    let t = t
        .strip_prefix("```json")
        .or_else(|| t.strip_prefix("```"))
        .unwrap_or(t);
    t.strip_suffix("```").unwrap_or(t).trim()
}

/// The text of a field as a context saw it: strings as themselves, anything
/// else as compact JSON.
pub fn field_text(projected: &Value, field: &str) -> Option<String> {
    match projected.get(field)? {
        Value::String(s) => Some(s.clone()),
        Value::Null => None,
        other => Some(other.to_string()),
    }
}

/// Resolves each `{field, quote}` to a byte range of the field's text. A quote
/// that is not there verbatim invalidates the whole output.
pub fn check_evidence(items: Option<&Value>, projected: &Value) -> Result<Vec<Evidence>, Invalid> {
    let Some(items) = items else {
        return Ok(Vec::new());
    };
    let Some(items) = items.as_array() else {
        return Err(Invalid::Evidence("expected an array".into()));
    };
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        let field = item.get("field").and_then(Value::as_str);
        let quote = item.get("quote").and_then(Value::as_str);
        let (Some(field), Some(quote)) = (field, quote) else {
            return Err(Invalid::Evidence(format!(
                "item needs string `field` and `quote`: {item}"
            )));
        };
        let false_quote = || Invalid::FalseQuote {
            field: field.to_owned(),
            quote: quote.to_owned(),
        };
        if quote.trim().is_empty() {
            return Err(false_quote());
        }
        let text = field_text(projected, field).ok_or_else(false_quote)?;
        let start = text.find(quote).ok_or_else(false_quote)?;
        out.push(Evidence {
            field: field.to_owned(),
            start: start as u64,
            end: (start + quote.len()) as u64,
            quote: quote.to_owned(),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use fanfold_core::spec::{DecisionSpec, StageType};
    use serde_json::json;

    fn stage() -> MapStage {
        let spec = StageSpec {
            name: "s".into(),
            stage_type: StageType::Map,
            version: 1,
            rubric: "r.md".into(),
            fields: vec!["title".into(), "body".into()],
            output_schema: "o.json".into(),
            backend: "default".into(),
            decision: DecisionSpec {
                pointer: "/decision".into(),
                positive: vec!["yes".into()],
                negative: vec!["no".into()],
                abstain: vec!["unsure".into()],
            },
            evidence: Some("/evidence".into()),
            confidence: Some("/confidence".into()),
            min_confidence: Some(0.5),
            max_attempts: 3,
            max_output_tokens: 64,
            temperature: 0.0,
            seed: 0,
        };
        let schema = json!({
            "type": "object",
            "required": ["decision", "evidence"],
            "properties": {
                "decision": {"enum": ["yes", "no", "unsure"]},
                "confidence": {"type": "number"},
                "evidence": {"type": "array"}
            }
        });
        MapStage::new(spec, "Decide.".into(), schema).expect("valid")
    }

    #[test]
    fn valid_output_becomes_a_fact_with_resolved_evidence() {
        let s = stage();
        let unit =
            json!({"title": "Login loops", "body": "The callback redirects to /login forever."});
        let raw = r#"```json
{"decision": "yes", "confidence": 0.9, "evidence": [{"field": "body", "quote": "redirects to /login forever"}]}
```"#;
        let out = s.interpret(raw, &unit).expect("valid");
        assert_eq!(out.status, Status::Positive);
        assert_eq!(out.evidence[0].start, 13);
        assert_eq!(out.evidence[0].end, 40);
    }

    #[test]
    fn each_kind_of_bad_output_is_refused() {
        let s = stage();
        let unit = json!({"title": "t", "body": "b"});
        let cases = [
            ("not json", "malformed_json"),
            (
                r#"{"decision": "maybe", "evidence": []}"#,
                "schema_violation",
            ),
            (
                r#"{"decision": "yes", "evidence": [{"field": "body", "quote": "not there"}]}"#,
                "false_quote",
            ),
            (
                r#"{"decision": "yes", "evidence": [{"field": "nope", "quote": "b"}]}"#,
                "false_quote",
            ),
            (
                r#"{"decision": "yes", "evidence": [{"quote": "b"}]}"#,
                "bad_evidence",
            ),
        ];
        for (raw, code) in cases {
            assert_eq!(
                s.interpret(raw, &unit).err().map(|e| e.code()),
                Some(code),
                "{raw}"
            );
        }
    }

    #[test]
    fn low_confidence_abstains() {
        let s = stage();
        let unit = json!({"title": "t", "body": "b"});
        let out = s
            .interpret(
                r#"{"decision": "no", "confidence": 0.2, "evidence": []}"#,
                &unit,
            )
            .expect("valid");
        assert_eq!(out.status, Status::Abstain);
        assert!(out.reason.unwrap_or_default().starts_with("low_confidence"));
    }

    #[test]
    fn cache_key_moves_with_every_meaning_bearing_input() {
        let s = stage();
        let model = ModelParams {
            backend: "scripted".into(),
            model_id: "m".into(),
            temperature: 0.0,
            max_output_tokens: 64,
            seed: 0,
            simulated: true,
        };
        let input = ContentHash::of_bytes(b"unit");
        let base = s.cache_key(input, &model);
        assert_eq!(base, s.cache_key(input, &model));
        assert_ne!(base, s.cache_key(ContentHash::of_bytes(b"other"), &model));
        let other_model = ModelParams {
            model_id: "m2".into(),
            ..model.clone()
        };
        assert_ne!(base, s.cache_key(input, &other_model));
        let mut spec = s.spec.clone();
        spec.version = 2;
        let s2 = MapStage::new(spec, s.rubric.clone(), s.schema.clone()).expect("valid");
        assert_ne!(base, s2.cache_key(input, &model));
        let s3 =
            MapStage::new(s.spec.clone(), "Decide again.".into(), s.schema.clone()).expect("valid");
        assert_ne!(base, s3.cache_key(input, &model));
    }
}
