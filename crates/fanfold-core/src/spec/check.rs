//! Settings a spec can get wrong in ways its types cannot refuse: a
//! decision value no output can hold, a floor nothing can reach, settings
//! that cancel each other, numbers out of range. A run with any of them
//! pays for its calls and then answers wrongly or not at all, so the plan
//! refuses them first. Each check names the stage and the setting at
//! fault, as the spec spells it.

use serde_json::Value;

use super::{BackendSpec, DecisionSpec, MapStageSpec, Sampling};

/// A model turn's sampling settings: at least one output token, and a
/// temperature that is a number, 0 or more.
pub fn sampling(stage: &str, s: &Sampling) -> Result<(), String> {
    let at = s.at;
    if s.max_output_tokens == 0 {
        return Err(format!(
            "stage `{stage}` {at}max_output_tokens = 0: no answer fits in no tokens, so every call would be paid for and fail; allow at least 1"
        ));
    }
    if !(s.temperature.is_finite() && s.temperature >= 0.0) {
        return Err(format!(
            "stage `{stage}` {at}temperature = {}: it must be a number, 0 or more (0 decodes greedily)",
            s.temperature
        ));
    }
    Ok(())
}

/// What a stage sees is its `project` expression or its `fields`, never
/// both: the expression wins and the list would be ignored.
pub fn view(stage: &str, project: Option<&str>, fields: &[String]) -> Result<(), String> {
    if project.is_some() && !fields.is_empty() {
        return Err(format!(
            "stage `{stage}` sets both `project` and `fields`: the expression builds what the stage sees and `fields` would be ignored; keep one (pick the fields inside the expression, e.g. `{{{}}}`)",
            fields.join(", ")
        ));
    }
    Ok(())
}

/// The decision and confidence settings of a map stage's model turn (a
/// map stage, an audit's or a widen stage's judge) against its output
/// schema and its backend.
pub fn map_turn(
    s: &MapStageSpec,
    schema: &Value,
    backend: Option<&BackendSpec>,
) -> Result<(), String> {
    decision_negative(&s.name, &s.decision)?;
    decision_values(&s.name, &s.decision, schema)?;
    confidence_floor(s, backend)
}

/// A decision with no negative value: no unit could ever be judged not to
/// belong, so every unit the model decides is in the answer.
fn decision_negative(stage: &str, d: &DecisionSpec) -> Result<(), String> {
    if d.negative.is_empty() {
        return Err(format!(
            "stage `{stage}` decision.negative names no value: no unit could be judged negative, so every unit decided would be in the answer; name the value(s) that mean no"
        ));
    }
    Ok(())
}

/// Every value `positive`, `negative` and `abstain` name must be one the
/// output schema allows at the decision's pointer, where the schema says
/// (an `enum`, a `const`, a boolean): a value it never allows matches no
/// answer, and every unit would end in error after its calls.
fn decision_values(stage: &str, d: &DecisionSpec, schema: &Value) -> Result<(), String> {
    let Some(allowed) = schema_at(schema, &d.pointer).and_then(closed_values) else {
        return Ok(());
    };
    for (list, values) in [
        ("positive", &d.positive),
        ("negative", &d.negative),
        ("abstain", &d.abstain),
    ] {
        for v in values {
            if allowed.contains(v) {
                continue;
            }
            let listed = if allowed.is_empty() {
                "no string or boolean".to_owned()
            } else {
                format!(
                    "only {}",
                    allowed
                        .iter()
                        .map(|a| format!("{a:?}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            };
            let hint = allowed
                .iter()
                .find(|a| a.eq_ignore_ascii_case(v))
                .map(|a| format!("; did you mean {a:?}?"))
                .unwrap_or_default();
            return Err(format!(
                "stage `{stage}` decision.{list} names {v:?}, which no output can hold: the output schema allows {listed} at `{}`{hint}",
                d.pointer
            ));
        }
    }
    Ok(())
}

/// `min_confidence` compares a fact's confidence with the floor. Without a
/// `confidence` pointer the confidence is the probability a backend gives
/// the decision it chose; a backend that gives none (Anthropic, an
/// OpenAI-compatible one without `logprobs`) leaves the floor with nothing
/// to compare, and it silently never applies.
fn confidence_floor(s: &MapStageSpec, backend: Option<&BackendSpec>) -> Result<(), String> {
    let Some(min) = s.min_confidence else {
        return Ok(());
    };
    if s.confidence.is_some() {
        return Ok(());
    }
    let unscored = match backend {
        Some(BackendSpec::Anthropic(_)) => Some("an anthropic backend returns no probabilities"),
        Some(BackendSpec::Openai(h)) if !h.logprobs => Some(
            "an openai backend returns none without `logprobs = true` (an OpenAI-compatible server gives them with it)",
        ),
        _ => None,
    };
    match unscored {
        Some(why) => Err(format!(
            "stage `{}` min_confidence = {min} has no confidence to compare with: the stage sets no `confidence` pointer, and its backend `{}` gives no probability for its decision ({why}); add a `confidence` pointer to a number the output holds, or drop min_confidence",
            s.name, s.backend
        )),
        None => Ok(()),
    }
}

/// A reducer that reads numbers at `pointer` of a stage's facts, where
/// the stage's output schema says the value there is never a number: it
/// would skip every fact and state an empty result.
pub fn numeric_read(
    reducer: &str,
    kind: &str,
    pointer: &str,
    stage: &str,
    schema: &Value,
) -> Result<(), String> {
    let Some(node) = schema_at(schema, pointer) else {
        return Ok(());
    };
    match never_a_number(node) {
        Some(what) => Err(format!(
            "reducer `{reducer}` ({kind}) reads `{pointer}` as a number, but stage `{stage}`'s output schema declares {what} there: every fact would be skipped"
        )),
        None => Ok(()),
    }
}

/// The schema of the value at `pointer` in an instance of `schema`,
/// where the schema says plainly (`properties`, `items`); `None` when it
/// does not (a combinator, a reference, an undeclared property).
pub fn schema_at<'a>(schema: &'a Value, pointer: &str) -> Option<&'a Value> {
    let mut node = schema;
    for step in pointer.split('/').skip(1) {
        let step = step.replace("~1", "/").replace("~0", "~");
        node = match node.get("items") {
            Some(items) if items.is_object() && step.parse::<usize>().is_ok() => items,
            _ => node.get("properties")?.get(&step)?,
        };
    }
    Some(node)
}

/// The decision values a schema node allows, as the map stage reads a
/// decision (a string as it is, a boolean as `true` or `false`), when the
/// node lists them; `None` when any string may come.
fn closed_values(node: &Value) -> Option<Vec<String>> {
    let scalar = |v: &Value| match v {
        Value::String(s) => Some(s.clone()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    };
    if let Some(c) = node.get("const") {
        return Some(scalar(c).into_iter().collect());
    }
    if let Some(values) = node.get("enum").and_then(Value::as_array) {
        return Some(values.iter().filter_map(scalar).collect());
    }
    for combinator in ["anyOf", "oneOf"] {
        if let Some(branches) = node.get(combinator).and_then(Value::as_array) {
            let mut all = Vec::new();
            for b in branches {
                all.extend(closed_values(b)?);
            }
            return Some(all);
        }
    }
    if node.get("type").and_then(Value::as_str) == Some("boolean") {
        return Some(vec!["true".into(), "false".into()]);
    }
    None
}

/// What a schema node declares instead of a number, when it can never
/// hold one: its types or its values. `None` when it can, or does not say.
fn never_a_number(node: &Value) -> Option<String> {
    let numeric = |t: &str| t == "number" || t == "integer";
    match node.get("type") {
        Some(Value::String(t)) if !numeric(t) => return Some(format!("type `{t}`")),
        Some(Value::Array(types)) => {
            let names: Vec<&str> = types.iter().filter_map(Value::as_str).collect();
            if names.len() == types.len() && !names.iter().any(|t| numeric(t)) {
                return Some(format!("types `{}`", names.join("`, `")));
            }
        }
        _ => {}
    }
    let values: Option<Vec<&Value>> = match (node.get("const"), node.get("enum")) {
        (Some(c), _) => Some(vec![c]),
        (None, Some(Value::Array(e))) => Some(e.iter().collect()),
        _ => None,
    };
    match values {
        Some(v) if !v.iter().any(|x| x.is_number()) => Some(format!(
            "only the values {}",
            v.iter()
                .map(|x| x.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use serde_json::json;

    use super::*;

    /// A spec's name becomes its output folder's name, so one that would
    /// leave `.fanfold/runs` is refused when the spec is read.
    #[test]
    fn a_spec_name_is_one_plain_path_component() {
        let minimal = include_str!("../../../../examples/minimal/spec.toml");
        let named = |name: &str| {
            minimal.replacen(
                "name = \"auth-blockers\"",
                &format!("name = {}", toml::Value::String(name.to_owned())),
                1,
            )
        };
        assert!(crate::spec::Spec::from_toml(&named("auth-blockers.v2")).is_ok());
        for bad in ["", ".", "..", "../../etc", "/abs", "a/b", "a\\b", "x\0y"] {
            let err = crate::spec::Spec::from_toml(&named(bad)).expect_err(bad);
            assert!(
                err.to_string().contains("one plain path component"),
                "{bad:?}: {err}"
            );
        }
    }

    fn decision(positive: &[&str], negative: &[&str]) -> DecisionSpec {
        DecisionSpec {
            pointer: "/decision".into(),
            positive: positive.iter().map(|s| (*s).to_owned()).collect(),
            negative: negative.iter().map(|s| (*s).to_owned()).collect(),
            abstain: Vec::new(),
        }
    }

    #[test]
    fn a_decision_value_the_schema_never_allows_is_named() {
        let schema = json!({"properties": {"decision": {"enum": ["yes", "no"]}}});
        let err =
            decision_values("judge", &decision(&["Yes"], &["no"]), &schema).expect_err("refused");
        assert!(err.contains("decision.positive names \"Yes\""), "{err}");
        assert!(err.contains("did you mean \"yes\""), "{err}");
        let err =
            decision_values("judge", &decision(&["yes"], &["nope"]), &schema).expect_err("refused");
        assert!(err.contains("decision.negative"), "{err}");
        assert!(decision_values("judge", &decision(&["yes"], &["no"]), &schema).is_ok());
        // A free string, or a schema that does not say, allows anything.
        let free = json!({"properties": {"decision": {"type": "string"}}});
        assert!(decision_values("judge", &decision(&["Yes"], &["no"]), &free).is_ok());
        assert!(decision_values("judge", &decision(&["Yes"], &["no"]), &json!({})).is_ok());
        // Booleans are read as `true` and `false`; a const is one value.
        let flag = json!({"properties": {"decision": {"type": "boolean"}}});
        assert!(decision_values("judge", &decision(&["true"], &["false"]), &flag).is_ok());
        assert!(decision_values("judge", &decision(&["yes"], &["false"]), &flag).is_err());
        let nested = json!({"properties": {"verdict": {"properties": {"v": {"anyOf": [{"const": "a"}, {"enum": ["b"]}]}}}}});
        let d = DecisionSpec {
            pointer: "/verdict/v".into(),
            ..decision(&["a"], &["c"])
        };
        assert!(
            decision_values("judge", &d, &nested)
                .expect_err("c")
                .contains("only \"a\", \"b\"")
        );
    }

    #[test]
    fn no_negative_is_refused() {
        let err = decision_negative("judge", &decision(&["yes"], &[])).expect_err("refused");
        assert!(err.contains("decision.negative names no value"), "{err}");
    }

    #[test]
    fn sampling_settings_are_in_range() {
        let ok = Sampling {
            at: "",
            max_output_tokens: 1,
            temperature: 0.0,
        };
        assert!(sampling("s", &ok).is_ok());
        let zero = Sampling {
            max_output_tokens: 0,
            ..ok
        };
        assert!(
            sampling("s", &zero)
                .expect_err("0")
                .contains("stage `s` max_output_tokens = 0")
        );
        for t in [-0.1, f64::NAN, f64::INFINITY] {
            let bad = Sampling {
                at: "judge.",
                temperature: t,
                ..ok
            };
            assert!(
                sampling("a", &bad)
                    .expect_err("temperature")
                    .contains("stage `a` judge.temperature"),
                "{t}"
            );
        }
    }

    #[test]
    fn a_numeric_read_of_a_string_is_refused() {
        let schema = json!({"properties": {
            "label": {"type": "string"},
            "score": {"type": ["number", "null"]},
            "kind": {"enum": ["a", "b"]},
            "items": {"type": "array", "items": {"properties": {"n": {"type": "integer"}}}},
        }});
        let read = |p: &str| numeric_read("r", "histogram", p, "judge", &schema);
        assert!(
            read("/label")
                .expect_err("string")
                .contains("type `string`")
        );
        assert!(read("/kind").expect_err("enum").contains("\"a\", \"b\""));
        assert!(read("/score").is_ok());
        assert!(read("/items/0/n").is_ok());
        assert!(read("/undeclared").is_ok());
    }
}
