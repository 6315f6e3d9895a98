//! The embed operator's contract: which text of a unit is embedded, which
//! texts it is compared with, and how a similarity becomes a decision.
//!
//! The vectors themselves come from a local encoder the engine owns; this
//! module is pure, so scoring and keys are tested without a model.

use fanfold_core::spec::EmbedStageSpec;
use fanfold_core::{Bucket, ContentHash, StableHasher, Status};
use serde_json::Value;

use crate::map::{field_text, project_fields};

/// Version of the text layout below; part of every embed key.
pub const EMBED_TEXT_TEMPLATE: &str = "embed-text-v1";

#[derive(Debug, thiserror::Error)]
pub enum EmbedSpecError {
    #[error("stage `{stage}`: {file} line {line}: {detail}")]
    Example {
        stage: String,
        file: String,
        line: usize,
        detail: String,
    },
    #[error("stage `{stage}`: {detail}")]
    Invalid { stage: String, detail: String },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Polarity {
    Positive,
    Negative,
}

/// A text a unit is compared with.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Anchor {
    pub polarity: Polarity,
    pub text: String,
}

/// A unit's similarity to the anchors.
#[derive(Clone, Debug, PartialEq)]
pub struct Scored {
    pub score: f64,
    /// Index into the anchors and similarity of the closest positive.
    pub best_positive: Option<(usize, f64)>,
    pub best_negative: Option<(usize, f64)>,
}

/// An embed stage ready to render texts, key vectors and decide.
pub struct EmbedStage {
    pub spec: EmbedStageSpec,
    pub anchors: Vec<Anchor>,
    definition: ContentHash,
}

impl EmbedStage {
    /// `examples` is the text of the spec's examples file, with its name
    /// for error messages.
    pub fn new(
        spec: EmbedStageSpec,
        examples: Option<(&str, &str)>,
    ) -> Result<EmbedStage, EmbedSpecError> {
        let mut anchors: Vec<Anchor> = spec
            .positive
            .iter()
            .map(|t| Anchor {
                polarity: Polarity::Positive,
                text: t.clone(),
            })
            .chain(spec.negative.iter().map(|t| Anchor {
                polarity: Polarity::Negative,
                text: t.clone(),
            }))
            .collect();
        if let Some((file, text)) = examples {
            anchors.extend(parse_examples(&spec.name, file, text)?);
        }
        if spec.max_tokens == 0 {
            return Err(EmbedSpecError::Invalid {
                stage: spec.name.clone(),
                detail: "max_tokens must be at least 1: a unit cut to no tokens embeds as nothing"
                    .into(),
            });
        }
        if !anchors.iter().any(|a| a.polarity == Polarity::Positive) {
            return Err(EmbedSpecError::Invalid {
                stage: spec.name.clone(),
                detail: "needs at least one positive text (`positive` or a positive example)"
                    .into(),
            });
        }
        if spec.top_k == Some(0) {
            return Err(EmbedSpecError::Invalid {
                stage: spec.name.clone(),
                detail: "top_k must be at least 1".into(),
            });
        }
        if !spec.threshold.is_finite() {
            return Err(EmbedSpecError::Invalid {
                stage: spec.name.clone(),
                detail: "threshold must be a finite number".into(),
            });
        }
        let mut h = StableHasher::new(Bucket::StageDef);
        h.field("name", &spec.name)
            .field("type", "embed")
            .field("version", &spec.version)
            .field("fields", &spec.fields)
            .field("project", &spec.project)
            .field("positive", &texts(&anchors, Polarity::Positive))
            .field("negative", &texts(&anchors, Polarity::Negative))
            .field("threshold", &spec.threshold)
            .field("then", &spec.then)
            .field("max_tokens", &spec.max_tokens)
            .field("template", EMBED_TEXT_TEMPLATE);
        // Absent, it changes no key a stage without it had.
        if let Some(k) = spec.top_k {
            h.field("top_k", &k);
        }
        Ok(EmbedStage {
            definition: h.finish(),
            spec,
            anchors,
        })
    }

    pub fn name(&self) -> &str {
        &self.spec.name
    }

    pub fn definition_hash(&self) -> ContentHash {
        self.definition
    }

    /// The unit's fields this stage embeds, by `fields`.
    pub fn project(&self, value: &Value) -> Value {
        project_fields(&self.spec.fields, value)
    }

    /// The text embedded for a unit: one `field: value` line per projected
    /// field, in the projection's order, empty fields left out.
    pub fn text(&self, projected: &Value) -> String {
        let Some(obj) = projected.as_object() else {
            return field_text(&serde_json::json!({ "v": projected }), "v").unwrap_or_default();
        };
        let mut out = String::new();
        for key in obj.keys() {
            let Some(t) = field_text(projected, key) else {
                continue;
            };
            let t = match &obj[key] {
                // Lists of names read better as words than as JSON.
                Value::Array(items) if items.iter().all(Value::is_string) => items
                    .iter()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join(", "),
                _ => t,
            };
            if t.trim().is_empty() {
                continue;
            }
            out.push_str(key);
            out.push_str(": ");
            out.push_str(t.trim());
            out.push('\n');
        }
        out
    }

    /// The key of this stage's fact for one unit.
    pub fn cache_key(&self, input_hash: ContentHash, model_id: &str) -> ContentHash {
        let mut h = StableHasher::new(Bucket::EmbedFacts);
        h.field("input", &input_hash)
            .field("stage", &self.definition)
            .field("model", model_id);
        h.finish()
    }

    /// Scores a unit vector against the anchors' vectors (same order as
    /// [`EmbedStage::anchors`]). Vectors are unit length, so a dot product
    /// is the cosine similarity.
    pub fn score(&self, unit: &[f32], anchors: &[Vec<f32>]) -> Scored {
        let mut best_positive: Option<(usize, f64)> = None;
        let mut best_negative: Option<(usize, f64)> = None;
        for (i, (a, v)) in self.anchors.iter().zip(anchors).enumerate() {
            let sim = f64::from(dot(unit, v));
            let slot = match a.polarity {
                Polarity::Positive => &mut best_positive,
                Polarity::Negative => &mut best_negative,
            };
            if slot.is_none_or(|(_, s)| sim > s) {
                *slot = Some((i, sim));
            }
        }
        let pos = best_positive.map_or(0.0, |(_, s)| s);
        let score = match best_negative {
            Some((_, neg)) => pos - neg,
            None => pos,
        };
        Scored {
            score,
            best_positive,
            best_negative,
        }
    }

    /// The status a score earns: below the threshold the unit ends here as
    /// a negative; at or above it passes (to `then`, or as a positive).
    pub fn decide(&self, scored: &Scored) -> Status {
        if scored.score < self.spec.threshold {
            Status::Negative
        } else {
            Status::Positive
        }
    }

    /// The fact body recorded for a scored unit: the score and the closest
    /// anchor texts, so a reader sees why the unit was kept or dropped.
    pub fn facts(&self, scored: &Scored) -> Value {
        let nearest = |best: Option<(usize, f64)>| {
            let (i, s) = best?;
            let anchor = self.anchors.get(i)?;
            Some(serde_json::json!({"text": anchor.text, "similarity": round4(s)}))
        };
        serde_json::json!({
            "score": round4(scored.score),
            "threshold": self.spec.threshold,
            "nearest_positive": nearest(scored.best_positive),
            "nearest_negative": nearest(scored.best_negative),
        })
    }
}

/// Ranks units by score, highest first (ties to the earlier position):
/// each unit's rank (0-based) among those at or above `threshold`, or
/// `None` below it. A stage with `top_k` keeps the ranks under `k`.
pub fn ranks(scores: &[f64], threshold: f64) -> Vec<Option<usize>> {
    let mut order: Vec<(usize, f64)> = scores
        .iter()
        .copied()
        .enumerate()
        .filter(|(_, s)| *s >= threshold)
        .collect();
    order.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut out = vec![None; scores.len()];
    for (rank, (i, _)) in order.into_iter().enumerate() {
        if let Some(slot) = out.get_mut(i) {
            *slot = Some(rank);
        }
    }
    out
}

/// The key of one embedded text: the model, the token limit and the text.
/// Shared by every stage, so two stages (or two thresholds) embedding the
/// same text compute it once.
pub fn vector_key(model_id: &str, max_tokens: usize, text: &str) -> ContentHash {
    let mut h = StableHasher::new(Bucket::Embedding);
    h.field("model", model_id)
        .field("max_tokens", &max_tokens)
        .field("text", text);
    h.finish()
}

fn texts(anchors: &[Anchor], polarity: Polarity) -> Vec<&str> {
    anchors
        .iter()
        .filter(|a| a.polarity == polarity)
        .map(|a| a.text.as_str())
        .collect()
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn round4(x: f64) -> f64 {
    (x * 10_000.0).round() / 10_000.0
}

fn parse_examples(stage: &str, file: &str, text: &str) -> Result<Vec<Anchor>, EmbedSpecError> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let err = |detail: String| EmbedSpecError::Example {
            stage: stage.to_owned(),
            file: file.to_owned(),
            line: n + 1,
            detail,
        };
        let v: Value = serde_json::from_str(line).map_err(|e| err(e.to_string()))?;
        let polarity = match v.get("label").and_then(Value::as_str) {
            Some("positive") => Polarity::Positive,
            Some("negative") => Polarity::Negative,
            _ => return Err(err("`label` must be \"positive\" or \"negative\"".into())),
        };
        let text = v
            .get("text")
            .and_then(Value::as_str)
            .filter(|t| !t.trim().is_empty())
            .ok_or_else(|| err("`text` must be a non-empty string".into()))?;
        out.push(Anchor {
            polarity,
            text: text.to_owned(),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use fanfold_core::StableHash;

    #[test]
    fn ranks_order_the_scores_at_or_above_the_threshold() {
        assert_eq!(
            ranks(&[0.2, 0.9, 0.5, 0.9, -0.1], 0.0),
            vec![Some(3), Some(0), Some(2), Some(1), None]
        );
        assert_eq!(ranks(&[], 0.0), Vec::<Option<usize>>::new());
    }

    fn spec(negative: &[&str], threshold: f64) -> EmbedStageSpec {
        EmbedStageSpec {
            top_k: None,
            name: "near".into(),
            version: 1,
            fields: vec!["title".into(), "labels".into()],
            project: None,
            positive: vec!["login broken".into(), "token expired".into()],
            negative: negative.iter().map(|s| (*s).to_owned()).collect(),
            examples: None,
            threshold,
            then: Some("judge".into()),
            model: None,
            max_tokens: 256,
        }
    }

    #[test]
    fn score_is_best_positive_minus_best_negative() {
        let stage = EmbedStage::new(spec(&["typo in docs"], 0.1), None).expect("stage");
        let anchors = vec![vec![1.0, 0.0], vec![0.6, 0.8], vec![0.0, 1.0]];
        let s = stage.score(&[0.8, 0.6], &anchors);
        assert_eq!(s.best_positive.map(|b| b.0), Some(1));
        assert!((s.best_positive.map_or(0.0, |b| b.1) - 0.96).abs() < 1e-6);
        assert!((s.score - (0.96 - 0.6)).abs() < 1e-6);
        assert_eq!(stage.decide(&s), Status::Positive);
        let far = stage.score(&[0.0, 1.0], &anchors);
        assert!(far.score < 0.0);
        assert_eq!(stage.decide(&far), Status::Negative);
    }

    #[test]
    fn without_negatives_the_score_is_the_best_positive() {
        let stage = EmbedStage::new(spec(&[], 0.5), None).expect("stage");
        let s = stage.score(&[0.0, 1.0], &[vec![1.0, 0.0], vec![0.6, 0.8]]);
        assert!((s.score - 0.8).abs() < 1e-6);
        assert_eq!(s.best_negative, None);
    }

    #[test]
    fn text_lists_fields_in_order_and_joins_names() {
        let stage = EmbedStage::new(spec(&[], 0.5), None).expect("stage");
        let p = stage.project(&serde_json::json!({
            "labels": ["bug", "auth"], "title": "Login loops", "body": "unseen"
        }));
        assert_eq!(stage.text(&p), "title: Login loops\nlabels: bug, auth\n");
    }

    #[test]
    fn keys_move_with_meaning_only() {
        let a = EmbedStage::new(spec(&[], 0.5), None).expect("stage");
        let b = EmbedStage::new(spec(&[], 0.6), None).expect("stage");
        let input = "x".key_in(Bucket::Input);
        assert_ne!(a.cache_key(input, "m"), b.cache_key(input, "m"));
        assert_eq!(a.cache_key(input, "m"), a.cache_key(input, "m"));
        assert_ne!(a.cache_key(input, "m"), a.cache_key(input, "n"));
        // A threshold change keeps the vectors.
        assert_eq!(vector_key("m", 256, "t"), vector_key("m", 256, "t"));
        assert_ne!(vector_key("m", 256, "t"), vector_key("m", 128, "t"));
    }

    #[test]
    fn examples_are_parsed_with_line_numbers() {
        let ok = "{\"label\":\"negative\",\"text\":\"docs typo\"}\n\n{\"label\":\"positive\",\"text\":\"sso loop\"}\n";
        let stage = EmbedStage::new(spec(&[], 0.5), Some(("ex.jsonl", ok))).expect("stage");
        assert_eq!(stage.anchors.len(), 4);
        let bad = "{\"label\":\"positive\",\"text\":\"a\"}\n{\"label\":\"maybe\",\"text\":\"b\"}\n";
        let err = EmbedStage::new(spec(&[], 0.5), Some(("ex.jsonl", bad)))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("ex.jsonl line 2"), "{err}");
    }

    #[test]
    fn a_stage_without_positives_is_refused() {
        let mut s = spec(&["x"], 0.5);
        s.positive.clear();
        assert!(EmbedStage::new(s, None).is_err());
    }
}
