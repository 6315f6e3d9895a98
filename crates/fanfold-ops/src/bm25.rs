//! The BM25 operator: lexical relevance of each unit to a query, over the
//! units one stage receives (they are the collection its term statistics
//! come from). The retrieval baseline micro-contexts are measured against:
//! no model, no training, the same units and fold.

use std::collections::HashMap;

use fanfold_core::spec::Bm25StageSpec;
use fanfold_core::{Bucket, ContentHash, StableHasher};
use serde_json::Value;

#[derive(Debug, thiserror::Error)]
pub enum Bm25SpecError {
    #[error("stage `{stage}`: {detail}")]
    Invalid { stage: String, detail: String },
}

/// A BM25 stage ready to score texts.
pub struct Bm25Stage {
    pub spec: Bm25StageSpec,
    /// The query's distinct terms, in first-seen order.
    pub terms: Vec<String>,
    definition: ContentHash,
}

impl Bm25Stage {
    pub fn new(spec: Bm25StageSpec) -> Result<Bm25Stage, Bm25SpecError> {
        let invalid = |detail: String| Bm25SpecError::Invalid {
            stage: spec.name.clone(),
            detail,
        };
        let mut terms: Vec<String> = Vec::new();
        for t in tokens(&spec.query) {
            if !terms.contains(&t) {
                terms.push(t);
            }
        }
        if terms.is_empty() {
            return Err(invalid("the query has no word to search for".into()));
        }
        if !(spec.k1 >= 0.0 && spec.k1.is_finite()) {
            return Err(invalid(format!(
                "k1 {} must be a finite number ≥ 0",
                spec.k1
            )));
        }
        if !(0.0..=1.0).contains(&spec.b) {
            return Err(invalid(format!("b {} must be within [0, 1]", spec.b)));
        }
        let mut h = StableHasher::new(Bucket::Bm25Def);
        h.field("name", &spec.name)
            .field("version", &spec.version)
            .field("fields", &spec.fields)
            .field("project", &spec.project)
            .field("terms", &terms)
            .field("k1", &spec.k1)
            .field("b", &spec.b);
        let definition = h.finish();
        Ok(Bm25Stage {
            spec,
            terms,
            definition,
        })
    }

    pub fn name(&self) -> &str {
        &self.spec.name
    }

    pub fn definition_hash(&self) -> ContentHash {
        self.definition
    }

    /// Every document's score against the query, in order. A term's
    /// inverse document frequency is `ln(1 + (N - df + 0.5) / (df + 0.5))`,
    /// never negative, so a common term never lowers a score.
    pub fn scores(&self, docs: &[Vec<String>]) -> Vec<f64> {
        let n = docs.len() as f64;
        if docs.is_empty() {
            return Vec::new();
        }
        let avg = docs.iter().map(Vec::len).sum::<usize>() as f64 / n;
        let freqs: Vec<HashMap<&str, f64>> = docs
            .iter()
            .map(|d| {
                let mut f: HashMap<&str, f64> = HashMap::new();
                for t in d {
                    if self.terms.contains(t) {
                        *f.entry(t.as_str()).or_default() += 1.0;
                    }
                }
                f
            })
            .collect();
        let idf: Vec<f64> = self
            .terms
            .iter()
            .map(|t| {
                let df = freqs.iter().filter(|f| f.contains_key(t.as_str())).count() as f64;
                (1.0 + (n - df + 0.5) / (df + 0.5)).ln()
            })
            .collect();
        let (k1, b) = (self.spec.k1, self.spec.b);
        docs.iter()
            .zip(&freqs)
            .map(|(d, f)| {
                let norm = if avg > 0.0 {
                    1.0 - b + b * d.len() as f64 / avg
                } else {
                    1.0
                };
                self.terms
                    .iter()
                    .zip(&idf)
                    .map(|(t, idf)| {
                        let tf = f.get(t.as_str()).copied().unwrap_or(0.0);
                        idf * tf * (k1 + 1.0) / (tf + k1 * norm)
                    })
                    .sum()
            })
            .collect()
    }
}

/// A text as BM25 sees it: lowercase runs of letters and digits.
pub fn tokens(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|t| !t.is_empty())
        .map(str::to_lowercase)
        .collect()
}

/// Every string (and number) of a projected view, in order, as one text.
pub fn text_of(v: &Value) -> String {
    fn walk(v: &Value, out: &mut String) {
        match v {
            Value::String(s) => {
                out.push_str(s);
                out.push(' ');
            }
            Value::Number(n) => {
                out.push_str(&n.to_string());
                out.push(' ');
            }
            Value::Array(a) => a.iter().for_each(|x| walk(x, out)),
            Value::Object(o) => o.values().for_each(|x| walk(x, out)),
            Value::Bool(_) | Value::Null => {}
        }
    }
    let mut out = String::new();
    walk(v, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn stage(query: &str) -> Bm25Stage {
        Bm25Stage::new(Bm25StageSpec {
            name: "lexical".into(),
            version: 1,
            fields: Vec::new(),
            project: None,
            query: query.into(),
            threshold: 0.0,
            then: None,
            k1: 1.2,
            b: 0.75,
        })
        .unwrap()
    }

    #[test]
    fn a_document_with_the_rare_query_term_ranks_first() {
        let s = stage("OIDC redirect");
        let docs: Vec<Vec<String>> = [
            "the chart is slow",
            "OIDC callback redirect loop",
            "redirect after save",
            "the export is slow",
        ]
        .iter()
        .map(|t| tokens(t))
        .collect();
        let sc = s.scores(&docs);
        assert_eq!(sc[0], 0.0);
        assert!(sc[1] > sc[2] && sc[2] > 0.0, "{sc:?}");
        assert_eq!(sc[3], 0.0);
    }

    #[test]
    fn repeating_a_term_saturates_and_long_documents_are_normalised() {
        let s = stage("token");
        let docs = vec![
            tokens("token"),
            tokens("token token token token token token token token"),
            tokens("token and many other words that dilute it a lot here"),
        ];
        let sc = s.scores(&docs);
        assert!(sc[1] > sc[0], "{sc:?}");
        assert!(sc[1] < sc[0] * 2.2, "saturates: {sc:?}");
        assert!(sc[2] < sc[0], "{sc:?}");
    }

    #[test]
    fn text_is_every_string_of_the_view_and_tokens_are_lowercase_words() {
        let v = json!({"title": "Login: OIDC", "labels": ["P0"], "n": 7, "ok": true});
        let mut words = tokens(&text_of(&v));
        words.sort();
        assert_eq!(words, vec!["7", "login", "oidc", "p0"]);
        assert!(
            Bm25Stage::new(Bm25StageSpec {
                query: " ,; ".into(),
                ..stage("x").spec
            })
            .is_err()
        );
    }
}
