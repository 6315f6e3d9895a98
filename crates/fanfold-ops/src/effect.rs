//! The `effect` operator's pure half: the action one selected unit gets,
//! built from the unit and the answer's fact by jq, checked against the
//! stage's argument schema and filled into the fixed templates of the
//! action and its read-back; its idempotency key; and the reading of a
//! read-back. Nothing here sends anything; the engine's runner leases,
//! journals, sends and reads back what this builds.
//!
//! A filled value can only be one URL path segment or query value, or one
//! JSON value of the body where the template put a hole: the method, the
//! origin, the path's shape and the body's structure are the template's.

use std::collections::BTreeMap;

use fanfold_core::spec::effect::{EffectAction, EffectStageSpec, KEY_HOLE};
use fanfold_core::{Bucket, ContentHash, StableHasher};
use serde_json::Value;

use crate::jq::{JqError, JqProgram, Site, to_val};
use crate::tool::{
    Piece, Refused, Template, ToolSpecError, args_validator, build_args, check_quota, fill_url,
    url_template,
};

/// The namespace of an effect stage's definition.
pub const DEFINITION: Bucket = Bucket::Kind("effect-def-v1");
/// The namespace of an effect's idempotency key: the action, the unit and
/// the arguments.
pub const KEY: Bucket = Bucket::Kind("effect-key-v1");

/// One unit's action, ready to send.
#[derive(Clone, Debug, PartialEq)]
pub struct Action {
    pub unit_id: String,
    pub args: BTreeMap<String, Value>,
    /// The idempotency key: the same action on the same unit with the same
    /// arguments is one effect, whichever run or process carries it out.
    pub key: ContentHash,
    pub method: &'static str,
    pub url: String,
    pub body: Option<Value>,
    pub read_url: String,
}

impl Action {
    /// The action as the journal and the certificate show it.
    pub fn describe(&self) -> Value {
        serde_json::json!({
            "method": self.method,
            "url": self.url,
            "body": self.body,
            "read_back": self.read_url,
        })
    }
}

/// A compiled effect stage.
pub struct EffectStage {
    pub spec: EffectStageSpec,
    request: JqProgram,
    holds: JqProgram,
    validator: jsonschema::Validator,
    url: Template,
    read_url: Template,
    /// `scheme://host:port` of the action, which the read-back shares.
    origin: String,
    definition: ContentHash,
    /// What the key hashes of the stage: its version and action.
    action_hash: ContentHash,
}

impl EffectStage {
    pub fn new(spec: EffectStageSpec) -> Result<EffectStage, ToolSpecError> {
        let invalid = |detail: String| ToolSpecError::Invalid {
            stage: spec.name.clone(),
            detail,
        };
        let jq = |source| ToolSpecError::Jq {
            stage: spec.name.clone(),
            source,
        };
        let request = JqProgram::compile(&spec.request).map_err(jq)?;
        let holds = JqProgram::compile(&spec.read_back.holds).map_err(jq)?;
        check_quota(&spec.quota).map_err(&invalid)?;
        if spec.attempts == 0 || spec.timeout_ms == 0 {
            return Err(invalid(
                "attempts and timeout_ms must each be at least 1".into(),
            ));
        }
        if spec.args.contains_key(KEY_HOLE) {
            return Err(invalid(format!(
                "`{KEY_HOLE}` is the effect's idempotency key and cannot be an argument"
            )));
        }
        let validator = args_validator(&spec.args).map_err(&invalid)?;
        let EffectAction::Http { url, body, .. } = &spec.action;
        let (url, origin) = url_template(url).map_err(&invalid)?;
        let (read_url, read_origin) = url_template(&spec.read_back.url).map_err(&invalid)?;
        if read_origin != origin {
            return Err(invalid(format!(
                "the read-back goes to {read_origin}, not to the action's {origin}"
            )));
        }
        let known = |hole: &str| hole == KEY_HOLE || spec.args.contains_key(hole);
        let mut holes: Vec<String> = url
            .holes()
            .chain(read_url.holes())
            .map(str::to_owned)
            .collect();
        if let Some(body) = body {
            body_holes(body, &mut holes).map_err(&invalid)?;
        }
        if let Some(h) = holes.iter().find(|h| !known(h)) {
            return Err(invalid(format!(
                "the hole `{{{h}}}` is not `{KEY_HOLE}` or one of args [{}]",
                spec.args.keys().cloned().collect::<Vec<_>>().join(", ")
            )));
        }
        if let Some(pointer) = &spec.marker {
            check_marker(&spec.name, pointer, body.as_ref()).map_err(&invalid)?;
        }
        let action_json = serde_json::to_value(&spec.action).unwrap_or(Value::Null);
        let mut h = StableHasher::new(KEY);
        h.field("version", &spec.version)
            .field("action", &action_json);
        let action_hash = h.finish();
        let mut h = StableHasher::new(DEFINITION);
        h.field("action", &action_hash)
            .field("request", spec.request.as_str())
            .field(
                "args",
                &serde_json::to_value(&spec.args).unwrap_or(Value::Null),
            )
            .field("read_back", spec.read_back.url.as_str())
            .field("holds", spec.read_back.holds.as_str());
        if let Some(pointer) = &spec.marker {
            h.field("marker", pointer.as_str());
        }
        let definition = h.finish();
        Ok(EffectStage {
            spec,
            request,
            holds,
            validator,
            url,
            read_url,
            origin,
            definition,
            action_hash,
        })
    }

    pub fn name(&self) -> &str {
        &self.spec.name
    }

    pub fn definition_hash(&self) -> ContentHash {
        self.definition
    }

    /// `scheme://host:port`, the one origin the stage reaches.
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// The unit's action, `None` when the request yields `null`. `fact` is
    /// the answer's fact about the unit (its `facts`).
    pub fn action(
        &self,
        unit_id: &str,
        unit: &Value,
        fact: &Value,
    ) -> Result<Option<Action>, Refused> {
        let input = serde_json::json!({"unit": unit, "fact": fact});
        let Some(args) = build_args(
            &self.request,
            &self.validator,
            &input,
            Site::new("the effect's request", unit_id),
        )?
        else {
            return Ok(None);
        };
        let mut h = StableHasher::new(KEY);
        h.field("action", &self.action_hash)
            .field("unit", unit_id)
            .field("args", &serde_json::to_value(&args).unwrap_or(Value::Null));
        let key = h.finish();
        let mut filled = args.clone();
        filled.insert(KEY_HOLE.to_owned(), Value::String(key.to_hex()));
        let EffectAction::Http { method, body, .. } = &self.spec.action;
        let mut body = body.as_ref().map(|b| fill_body(b, &filled)).transpose()?;
        if let (Some(pointer), Some(b)) = (&self.spec.marker, body.as_mut())
            && let Some(Value::String(text)) = b.pointer_mut(pointer)
        {
            text.push_str("\n\n");
            text.push_str(&marker(&self.spec.name, &key));
        }
        Ok(Some(Action {
            unit_id: unit_id.to_owned(),
            url: fill_url(&self.url, &filled)?,
            read_url: fill_url(&self.read_url, &filled)?,
            args,
            key,
            method: method.as_str(),
            body,
        }))
    }

    /// Whether a read-back (`status`, `body`) shows the action in place.
    pub fn holds(&self, action: &Action, status: u16, body: &Value) -> Result<bool, JqError> {
        let input = serde_json::json!({
            "status": status,
            "body": body,
            "args": action.args,
            "key": action.key.to_hex(),
        });
        self.holds.test_bool(
            to_val(&input),
            Site::new("the effect's read-back", &action.unit_id),
        )
    }

    /// The fanfold markers of this effect a read-back shows: how many carry
    /// `action`'s key, and the other keys of the same effect name (earlier
    /// versions), in the order seen.
    pub fn markers(&self, action: &Action, body: &Value) -> Markers {
        let mut found = Markers::default();
        let key = action.key.to_hex();
        scan_markers(body, &self.spec.name, &key, &mut found);
        found
    }
}

/// What a read-back shows of an effect's markers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Markers {
    /// Markers carrying the action's own key: 1 when it is in place once.
    pub own: usize,
    /// Keys of other markers of the same effect name: an earlier version
    /// of the effect on this unit.
    pub earlier: Vec<String>,
}

/// What opens every marker.
pub const MARKER_OPEN: &str = "<!-- fanfold:effect ";

/// The marker of effect `name` with `key`, as the target shows it.
pub fn marker(name: &str, key: &ContentHash) -> String {
    format!("{MARKER_OPEN}{name} {} -->", key.to_hex())
}

/// A marker needs a name that reads back as one word, and a pointer to a
/// string of the body template.
fn check_marker(name: &str, pointer: &str, body: Option<&Value>) -> Result<(), String> {
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
    {
        return Err(format!(
            "a marker carries the stage's name, which must be letters, digits, `_`, `-` or `.`: `{name}`"
        ));
    }
    match body.and_then(|b| b.pointer(pointer)) {
        Some(Value::String(_)) => Ok(()),
        Some(_) => Err(format!(
            "marker `{pointer}` points at a body value that is not a string"
        )),
        None => Err(format!(
            "marker `{pointer}` points at nothing in the action's body"
        )),
    }
}

/// Counts the markers of effect `name` in every string of `v`.
fn scan_markers(v: &Value, name: &str, key: &str, out: &mut Markers) {
    match v {
        Value::String(text) => {
            let mut rest = text.as_str();
            while let Some(at) = rest.find(MARKER_OPEN) {
                let after = rest.get(at + MARKER_OPEN.len()..).unwrap_or("");
                let end = after.find("-->").unwrap_or(after.len());
                let inner = after.get(..end).unwrap_or("");
                let mut words = inner.split_whitespace();
                if let (Some(n), Some(k), None) = (words.next(), words.next(), words.next())
                    && n == name
                {
                    if k == key {
                        out.own += 1;
                    } else if !out.earlier.iter().any(|e| e == k) {
                        out.earlier.push(k.to_owned());
                    }
                }
                rest = after.get(end..).unwrap_or("");
            }
        }
        Value::Array(items) => items.iter().for_each(|i| scan_markers(i, name, key, out)),
        Value::Object(map) => map.values().for_each(|i| scan_markers(i, name, key, out)),
        _ => {}
    }
}

/// The holes of a body template's strings.
fn body_holes(body: &Value, out: &mut Vec<String>) -> Result<(), String> {
    match body {
        Value::String(s) => out.extend(Template::parse(s)?.holes().map(str::to_owned)),
        Value::Array(items) => {
            for v in items {
                body_holes(v, out)?;
            }
        }
        Value::Object(map) => {
            for v in map.values() {
                body_holes(v, out)?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// The body with its holes filled: a string that is one hole takes the
/// argument's JSON value, any other string the arguments' text. Keys and
/// the structure are the template's.
fn fill_body(body: &Value, args: &BTreeMap<String, Value>) -> Result<Value, Refused> {
    Ok(match body {
        Value::String(s) => {
            let t = Template::parse(s).map_err(|e| Refused::Expression(e.to_string()))?;
            match t.0.as_slice() {
                [Piece::Hole(name)] => args.get(name).cloned().unwrap_or(Value::Null),
                _ => Value::String(t.fill(args, |_, v| Ok(v.to_owned()))?),
            }
        }
        Value::Array(items) => Value::Array(
            items
                .iter()
                .map(|v| fill_body(v, args))
                .collect::<Result<_, _>>()?,
        ),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| Ok((k.clone(), fill_body(v, args)?)))
                .collect::<Result<_, Refused>>()?,
        ),
        other => other.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use fanfold_core::spec::effect::{Method, ReadBack};
    use serde_json::json;

    fn spec(request: &str) -> EffectStageSpec {
        EffectStageSpec {
            name: "label".into(),
            version: 1,
            request: request.into(),
            args: [
                (
                    "number".to_owned(),
                    json!({"type": "integer", "minimum": 1}),
                ),
                (
                    "label".to_owned(),
                    json!({"enum": ["release-blocker", "needs-triage"]}),
                ),
            ]
            .into_iter()
            .collect(),
            action: EffectAction::Http {
                method: Method::Post,
                url: "http://127.0.0.1:9/repos/acme/widget/issues/{number}/labels".into(),
                body: Some(json!({"labels": ["{label}"], "note": "by fanfold {effect_key}"})),
                token_env: None,
                idempotency_header: None,
            },
            read_back: ReadBack {
                url: "http://127.0.0.1:9/repos/acme/widget/issues/{number}/labels".into(),
                holds: ".args.label as $l | any(.body[]; .name == $l)".into(),
            },
            quota: Default::default(),
            timeout_ms: 1000,
            attempts: 3,
            max_actions: None,
            marker: None,
            settle_ms: None,
            allow_new_version: false,
        }
    }

    #[test]
    fn an_action_fills_its_templates_and_keys_the_unit_and_arguments() {
        let stage =
            EffectStage::new(spec("{number: .unit.number, label: .fact.label}")).expect("stage");
        let a = stage
            .action(
                "7",
                &json!({"number": 7}),
                &json!({"label": "release-blocker"}),
            )
            .expect("built")
            .expect("some");
        assert_eq!(
            a.url,
            "http://127.0.0.1:9/repos/acme/widget/issues/7/labels"
        );
        assert_eq!(a.method, "POST");
        let body = a.body.clone().expect("body");
        assert_eq!(body["labels"], json!(["release-blocker"]));
        assert_eq!(
            body["note"],
            json!(format!("by fanfold {}", a.key.to_hex()))
        );
        // The same action on another unit, or with other arguments, is
        // another effect; the same one again is the same key.
        let again = stage
            .action(
                "7",
                &json!({"number": 7, "title": "edited"}),
                &json!({"label": "release-blocker"}),
            )
            .expect("built")
            .expect("some");
        assert_eq!(again.key, a.key);
        let other = stage
            .action(
                "7",
                &json!({"number": 7}),
                &json!({"label": "needs-triage"}),
            )
            .expect("built")
            .expect("some");
        assert_ne!(other.key, a.key);
    }

    #[test]
    fn what_a_record_or_a_model_says_cannot_widen_the_action() {
        let stage =
            EffectStage::new(spec("{number: .unit.number, label: .fact.label}")).expect("stage");
        // A label the schema does not list.
        let e = stage
            .action(
                "7",
                &json!({"number": 7}),
                &json!({"label": "wontfix\", \"admin"}),
            )
            .expect_err("refused");
        assert!(matches!(e, Refused::Schema(_)), "{e:?}");
        // A number that would climb the path.
        let e = stage
            .action(
                "7",
                &json!({"number": "1/../../admin"}),
                &json!({"label": "release-blocker"}),
            )
            .expect_err("refused");
        assert!(matches!(e, Refused::Schema(_)), "{e:?}");
        // An extra argument.
        let loose = EffectStage::new(spec(
            "{number: .unit.number, label: .fact.label, repo: \"x\"}",
        ))
        .expect("stage");
        assert!(
            loose
                .action(
                    "7",
                    &json!({"number": 7}),
                    &json!({"label": "release-blocker"})
                )
                .is_err()
        );
    }

    #[test]
    fn a_template_cannot_move_the_host_or_name_an_unknown_hole() {
        let mut s = spec("{number: .unit.number, label: .fact.label}");
        s.read_back.url = "http://127.0.0.2:9/x/{number}".into();
        assert!(EffectStage::new(s).is_err());
        let mut s = spec("{number: .unit.number, label: .fact.label}");
        let EffectAction::Http { body, .. } = &mut s.action;
        *body = Some(json!({"labels": ["{who}"]}));
        assert!(EffectStage::new(s).is_err());
        let mut s = spec("{number: .unit.number, label: .fact.label}");
        s.args.insert(KEY_HOLE.into(), json!({"type": "string"}));
        assert!(EffectStage::new(s).is_err());
    }

    #[test]
    fn a_marker_shows_the_key_and_a_read_back_tells_it_from_an_earlier_version() {
        let mut s = spec("{number: .unit.number, label: .fact.label}");
        let EffectAction::Http { body, .. } = &mut s.action;
        *body = Some(json!({"body": "Cause `{label}`."}));
        s.marker = Some("/body".into());
        let stage = EffectStage::new(s.clone()).expect("stage");
        let a = stage
            .action(
                "7",
                &json!({"number": 7}),
                &json!({"label": "release-blocker"}),
            )
            .expect("built")
            .expect("some");
        let text = a
            .body
            .as_ref()
            .and_then(|b| b["body"].as_str())
            .expect("text")
            .to_owned();
        let mark = format!("<!-- fanfold:effect label {} -->", a.key.to_hex());
        assert_eq!(text, format!("Cause `release-blocker`.\n\n{mark}"));
        let nothing = stage.markers(&a, &json!([{"body": "hello"}]));
        assert_eq!(nothing, Markers::default());
        let once = stage.markers(&a, &json!([{"body": "x"}, {"body": text}]));
        assert_eq!((once.own, once.earlier.len()), (1, 0));
        let twice = stage.markers(&a, &json!([{"body": text}, {"body": text}]));
        assert_eq!(twice.own, 2);
        // The template changed: another key under the same name is an
        // earlier version; another effect's marker is not.
        let mut changed = s.clone();
        let EffectAction::Http { body, .. } = &mut changed.action;
        *body = Some(json!({"body": "Cause: {label}."}));
        let newer = EffectStage::new(changed).expect("stage");
        let b = newer
            .action(
                "7",
                &json!({"number": 7}),
                &json!({"label": "release-blocker"}),
            )
            .expect("built")
            .expect("some");
        assert_ne!(a.key, b.key);
        let other = "<!-- fanfold:effect tag 00ff -->";
        let seen = newer.markers(&b, &json!([{"body": text}, {"body": other}]));
        assert_eq!(seen.own, 0);
        assert_eq!(seen.earlier, vec![a.key.to_hex()]);
        // A marker needs a string to go in, and a name that reads back.
        let mut bad = s.clone();
        bad.marker = Some("/nope".into());
        assert!(EffectStage::new(bad).is_err());
        let mut bad = s;
        bad.name = "two words".into();
        assert!(EffectStage::new(bad).is_err());
    }

    #[test]
    fn a_read_back_is_read_by_its_predicate() {
        let stage =
            EffectStage::new(spec("{number: .unit.number, label: .fact.label}")).expect("stage");
        let a = stage
            .action(
                "7",
                &json!({"number": 7}),
                &json!({"label": "release-blocker"}),
            )
            .expect("built")
            .expect("some");
        assert!(
            stage
                .holds(&a, 200, &json!([{"name": "release-blocker"}]))
                .expect("ran")
        );
        assert!(
            !stage
                .holds(&a, 200, &json!([{"name": "bug"}]))
                .expect("ran")
        );
    }
}
