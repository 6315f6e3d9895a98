//! The chunk operator: many units in one model context, the model listing
//! the ids of those that match. It is the coarse-grained alternative to one
//! micro-context per unit (`size` units a context) and, with a single
//! context as wide as the window, the long-context one. Packing, prompts,
//! keys and the reading of an answer are here; the engine runs the calls.

use std::ops::Range;

use fanfold_core::spec::{ChunkStageSpec, DecisionSpec};
use fanfold_core::{Bucket, ContentHash, ModelParams, StableHasher, Status};
use serde_json::{Value, json};

use crate::map::{Interpreted, Invalid, MapSpecError, ModelTurn, TurnSpec, strip_fences};

/// Version of the context layout below; part of every chunk key.
pub const CHUNK_TEMPLATE: &str = "chunk-prompt-v1";

/// Bytes a token is counted as when packing for a backend whose tokenizer
/// fanfold cannot run (an HTTP model). Records shown as JSON run at two to
/// four bytes a token with the tokenizers fanfold meets (quotes, braces
/// and digits are tokens of their own); two leaves room, so a context
/// planned to fit the window does fit, at the price of filling about two
/// thirds of it. A backend that still cuts a context says so, and the
/// engine ends its members in error.
pub const BYTES_PER_TOKEN: u64 = 2;

/// Tokens kept free for what a backend wraps around a prompt (a chat
/// template's role markers), when packing counts with its own tokenizer.
pub const TEMPLATE_TOKENS: u64 = 32;

/// How packing counts the tokens of a text.
pub enum TokenCount<'a> {
    /// The backend's own tokenizer.
    Tokenizer(&'a (dyn Fn(&str) -> u64 + Sync)),
    /// [`BYTES_PER_TOKEN`], where no tokenizer can be run.
    Estimate,
}

impl TokenCount<'_> {
    pub fn tokens(&self, text: &str) -> u64 {
        match self {
            TokenCount::Tokenizer(count) => count(text),
            TokenCount::Estimate => (text.len() as u64).div_ceil(BYTES_PER_TOKEN),
        }
    }

    /// What the count is, as `explain` and reports say it.
    pub fn describe(&self) -> &'static str {
        match self {
            TokenCount::Tokenizer(_) => "counted by the model's tokenizer",
            TokenCount::Estimate => "estimated at 2 bytes a token",
        }
    }
}

/// The line that closes every context, after its records.
const CLOSING: &str = "\nList the ids of the records above that match, in the `matches` array; an empty array when none does.\n";

#[derive(Debug, thiserror::Error)]
pub enum ChunkSpecError {
    #[error("stage `{stage}`: {detail}")]
    Invalid { stage: String, detail: String },
    #[error(transparent)]
    Turn(#[from] MapSpecError),
}

/// A chunk stage ready to pack units, build contexts and read answers.
pub struct ChunkStage {
    pub spec: ChunkStageSpec,
    /// The model turn every context is sent as: the rubric and the output
    /// schema as its shared prefix, the stage's attempts and output tokens.
    /// Its decision is never read: a chunk's answer is the list of ids.
    pub turn: ModelTurn,
    definition: ContentHash,
}

/// How a stage's units fall into contexts, by position in the list packed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Packing {
    /// Consecutive runs of units, one per context, in order.
    pub contexts: Vec<Range<usize>>,
    /// Units too large for a context of their own.
    pub too_large: Vec<usize>,
    /// Units past the last context the stage may open.
    pub outside: Vec<usize>,
}

impl ChunkStage {
    pub fn new(spec: ChunkStageSpec, rubric: String) -> Result<ChunkStage, ChunkSpecError> {
        let invalid = |detail: &str| ChunkSpecError::Invalid {
            stage: spec.name.clone(),
            detail: detail.to_owned(),
        };
        if spec.size == Some(0) {
            return Err(invalid("size must be at least 1"));
        }
        if spec.max_contexts == Some(0) {
            return Err(invalid("max_contexts must be at least 1"));
        }
        if spec.window_tokens <= u64::from(spec.max_output_tokens) {
            return Err(invalid(
                "window_tokens must exceed max_output_tokens: the answer is part of the window",
            ));
        }
        let decision = DecisionSpec {
            pointer: "/matches".into(),
            positive: vec!["listed".into()],
            negative: Vec::new(),
            abstain: Vec::new(),
        };
        let turn_spec = TurnSpec {
            rubric: spec.rubric.clone(),
            fields: spec.fields.clone(),
            project: spec.project.clone(),
            ..TurnSpec::new(&spec.name, spec.version, spec.call(), decision)
        };
        let turn = ModelTurn::new(turn_spec, rubric, output_schema(spec.size))?;
        let mut h = StableHasher::new(Bucket::ChunkDef);
        h.field("name", &spec.name)
            .field("version", &spec.version)
            .field("fields", &spec.fields)
            .field("project", &spec.project)
            .field("size", &spec.size.map(|s| s as u64))
            .field("window_tokens", &spec.window_tokens)
            .field("max_contexts", &spec.max_contexts.map(|s| s as u64))
            .field("turn", &turn.definition_hash())
            .field("template", CHUNK_TEMPLATE);
        let definition = h.finish();
        Ok(ChunkStage {
            spec,
            turn,
            definition,
        })
    }

    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// What the stage means, except its rubric (keyed on its own).
    pub fn definition_hash(&self) -> ContentHash {
        self.definition
    }

    /// One unit as a context shows it: one line, the id a quoted string
    /// and the fields compact JSON, so no text of a record can open a line
    /// of its own (a newline inside a value is escaped), and a context of
    /// many units spends no tokens on indentation.
    pub fn member(&self, unit_id: &str, projected: &Value) -> String {
        let id = serde_json::to_string(unit_id).unwrap_or_default();
        let body = serde_json::to_string(projected).unwrap_or_default();
        format!("Record {id}: {body}\n")
    }

    /// A context's suffix: its members, then the closing instruction.
    pub fn suffix(&self, members: &[String]) -> String {
        let mut s = String::with_capacity(members.iter().map(String::len).sum::<usize>() + 128);
        for m in members {
            s.push_str(m);
        }
        s.push_str(CLOSING);
        s
    }

    /// The tokens of members one context holds: the window less the
    /// answer, the shared prefix, the closing line and, with a tokenizer,
    /// the chat template's markers.
    pub fn member_tokens_per_context(&self, count: &TokenCount<'_>) -> u64 {
        let template = match count {
            TokenCount::Tokenizer(_) => TEMPLATE_TOKENS,
            TokenCount::Estimate => 0,
        };
        (self.spec.window_tokens - u64::from(self.spec.max_output_tokens))
            .saturating_sub(count.tokens(self.turn.prefix()) + count.tokens(CLOSING) + template)
    }

    /// Packs units, in order, into contexts of at most `size` units and
    /// `room` tokens of members ([`ChunkStage::member_tokens_per_context`];
    /// `member_tokens` is each unit's block, as [`ChunkStage::member`]
    /// writes it, counted the same way).
    pub fn pack(&self, member_tokens: &[u64], room: u64) -> Packing {
        let size = self.spec.size.unwrap_or(usize::MAX);
        let most = self.spec.max_contexts.unwrap_or(usize::MAX);
        let mut p = Packing::default();
        let mut start: Option<usize> = None;
        let mut used = 0u64;
        let close = |p: &mut Packing, from: usize, to: usize| {
            if p.contexts.len() < most {
                p.contexts.push(from..to);
            } else {
                p.outside.extend(from..to);
            }
        };
        for (i, &b) in member_tokens.iter().enumerate() {
            if b > room {
                p.too_large.push(i);
                if let Some(s) = start.take() {
                    close(&mut p, s, i);
                    used = 0;
                }
                continue;
            }
            if let Some(s) = start
                && (i - s >= size || used + b > room)
            {
                close(&mut p, s, i);
                start = None;
                used = 0;
            }
            start.get_or_insert(i);
            used += b;
        }
        if let Some(s) = start {
            close(&mut p, s, member_tokens.len());
        }
        p
    }

    /// The key of one context's answer: its members' ids and projected
    /// inputs in order, the stage, the rubric and the model. An edit to any
    /// member recomputes its context and nothing else.
    pub fn context_key(&self, members: &[(&str, ContentHash)], model: &ModelParams) -> ContentHash {
        let mut h = StableHasher::new(Bucket::Chunk);
        h.field("stage", &self.definition)
            .field("rubric", &self.turn.rubric_hash);
        model.key_into(&mut h);
        h.field("members", &(members.len() as u64));
        for (id, input) in members {
            h.field("id", *id).field("input", input);
        }
        h.finish()
    }

    /// A member's fact key: its context's key and its own id.
    pub fn unit_key(context: &ContentHash, unit_id: &str) -> ContentHash {
        let mut h = StableHasher::new(Bucket::Chunk);
        h.field("context", context).field("unit", unit_id);
        h.finish()
    }

    /// The output schema narrowed to one context: only its ids can be
    /// listed, each once.
    pub fn schema_for(&self, ids: &[&str]) -> Value {
        json!({
            "type": "object",
            "additionalProperties": false,
            "required": ["matches"],
            "properties": {
                "matches": {
                    "type": "array",
                    "items": {"enum": ids},
                    "uniqueItems": true,
                    "maxItems": ids.len(),
                }
            }
        })
    }

    /// Reads one context's answer: the ids listed, each one of `ids`.
    /// Anything else (no JSON, no `matches` array, an id the context did
    /// not hold) is refused, so a context cannot answer for a unit it never
    /// showed.
    pub fn interpret(&self, raw: &str, ids: &[&str]) -> Result<Interpreted, Invalid> {
        let out: Value = serde_json::from_str(strip_fences(raw))
            .map_err(|e| Invalid::MalformedJson(e.to_string()))?;
        let list = out
            .get("matches")
            .and_then(Value::as_array)
            .ok_or_else(|| Invalid::Schema("`matches` must be an array of ids".into()))?;
        let mut matches: Vec<String> = Vec::with_capacity(list.len());
        for v in list {
            let id = match v {
                Value::String(s) => s.clone(),
                Value::Number(n) => n.to_string(),
                other => return Err(Invalid::Schema(format!("{other} is not an id"))),
            };
            if !ids.contains(&id.as_str()) {
                return Err(Invalid::Schema(format!(
                    "id {id:?} is not a record of this context"
                )));
            }
            if !matches.contains(&id) {
                matches.push(id);
            }
        }
        Ok(Interpreted {
            status: Status::Positive,
            decision: None,
            facts: json!({ "matches": matches }),
            confidence: None,
            choice_scores: Vec::new(),
            evidence: Vec::new(),
            reason: None,
        })
    }
}

/// The schema every context's answer satisfies, as the shared prefix shows
/// it; each context narrows `items` to its own ids.
fn output_schema(size: Option<usize>) -> Value {
    let mut matches = json!({"type": "array", "items": {"type": "string"}, "uniqueItems": true});
    if let (Some(n), Some(obj)) = (size, matches.as_object_mut()) {
        obj.insert("maxItems".into(), json!(n));
    }
    json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["matches"],
        "properties": {"matches": matches}
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(size: Option<usize>, window: u64, contexts: Option<usize>) -> ChunkStageSpec {
        ChunkStageSpec {
            name: "coarse".into(),
            version: 1,
            rubric: "r.md".into(),
            fields: Vec::new(),
            project: None,
            backend: "default".into(),
            size,
            window_tokens: window,
            max_contexts: contexts,
            max_attempts: 2,
            max_output_tokens: 10,
            temperature: 0.0,
            seed: 0,
            execution: Default::default(),
        }
    }

    fn stage(size: Option<usize>, window: u64, contexts: Option<usize>) -> ChunkStage {
        ChunkStage::new(spec(size, window, contexts), "Find the matches.".into()).unwrap()
    }

    #[test]
    fn packs_by_size_and_by_window_in_order() {
        let s = stage(Some(3), 10_000, None);
        let room = s.member_tokens_per_context(&TokenCount::Estimate);
        let p = s.pack(&[10; 7], room);
        assert_eq!(p.contexts, vec![0..3, 3..6, 6..7]);
        assert!(p.too_large.is_empty() && p.outside.is_empty());

        // A window that holds two members, not three.
        let s = stage(None, 10_000, None);
        let room = s.member_tokens_per_context(&TokenCount::Estimate);
        let b = room / 2 - 1;
        let p = s.pack(&[b, b, b, b, b], room);
        assert_eq!(p.contexts, vec![0..2, 2..4, 4..5]);
    }

    /// A tokenizer that reads more bytes a token than the estimate fills
    /// the window with more members; the template's markers are kept free.
    #[test]
    fn a_tokenizer_packs_closer_to_the_window_than_the_estimate() {
        let s = stage(None, 10_000, None);
        let four = |t: &str| (t.len() as u64).div_ceil(4);
        let by_tokenizer = TokenCount::Tokenizer(&four);
        let estimated = s.member_tokens_per_context(&TokenCount::Estimate);
        let counted = s.member_tokens_per_context(&by_tokenizer);
        let member = s.member("7", &json!({"title": "x".repeat(200)}));
        let fit = |count: &TokenCount<'_>, room: u64| room / count.tokens(&member);
        let (few, many) = (
            fit(&TokenCount::Estimate, estimated),
            fit(&by_tokenizer, counted),
        );
        assert!(
            many > few * 3 / 2,
            "{few} members by estimate, {many} by tokenizer"
        );
        let prefix = four(s.turn.prefix()) + four(CLOSING);
        assert_eq!(counted, 10_000 - 10 - prefix - TEMPLATE_TOKENS);
    }

    #[test]
    fn a_unit_larger_than_a_context_and_units_past_the_last_context_are_left_out() {
        let s = stage(None, 10_000, Some(1));
        let room = s.member_tokens_per_context(&TokenCount::Estimate);
        let p = s.pack(&[10, room + 5, 10, 10], room);
        assert_eq!(p.too_large, vec![1]);
        assert_eq!(p.contexts, vec![0..1]);
        assert_eq!(p.outside, vec![2, 3]);
    }

    #[test]
    fn an_answer_names_only_ids_of_its_context() {
        let s = stage(Some(3), 1000, None);
        let ok = s.interpret(r#"{"matches": ["7", 9, "7"]}"#, &["7", "8", "9"]);
        assert_eq!(ok.unwrap().facts, json!({"matches": ["7", "9"]}));
        let foreign = s.interpret(r#"{"matches": ["12"]}"#, &["7", "8"]);
        assert!(matches!(foreign, Err(Invalid::Schema(_))));
        assert!(matches!(
            s.interpret("the first one", &["7"]),
            Err(Invalid::MalformedJson(_))
        ));
        assert!(matches!(
            s.interpret(r#"{"decision": "yes"}"#, &["7"]),
            Err(Invalid::Schema(_))
        ));
    }

    #[test]
    fn a_context_key_covers_every_member_and_its_order() {
        let s = stage(Some(3), 1000, None);
        let model = ModelParams {
            backend: "scripted".into(),
            model_id: "m".into(),
            temperature: 0.0,
            max_output_tokens: 10,
            seed: 0,
            simulated: true,
        };
        let a = ContentHash::of_bytes(b"a");
        let b = ContentHash::of_bytes(b"b");
        let b2 = ContentHash::of_bytes(b"b, edited");
        let k = s.context_key(&[("1", a), ("2", b)], &model);
        assert_ne!(k, s.context_key(&[("1", a), ("2", b2)], &model));
        assert_ne!(k, s.context_key(&[("2", b), ("1", a)], &model));
        assert_eq!(k, s.context_key(&[("1", a), ("2", b)], &model));
        assert_ne!(ChunkStage::unit_key(&k, "1"), ChunkStage::unit_key(&k, "2"));
    }

    #[test]
    fn bad_settings_are_refused_with_the_stage_named() {
        for bad in [
            spec(Some(0), 1000, None),
            spec(None, 1000, Some(0)),
            spec(None, 10, None),
        ] {
            let e = ChunkStage::new(bad, String::new()).err().unwrap();
            assert!(e.to_string().contains("coarse"), "{e}");
        }
    }
}
