//! Prices per model, from a TOML file users edit.
//!
//! ```toml
//! [models."gpt-4o-mini"]
//! input = 0.15          # USD per million prompt tokens evaluated
//! cached_input = 0.075  # USD per million prompt tokens read from cache
//! output = 0.60         # USD per million completion tokens
//! batch_discount = 0.5  # fraction taken off when run through a batch API
//! ```
//!
//! A model is found by its exact name, else by the longest table name that
//! starts it, so a dated snapshot (`claude-3-5-haiku-20241022`) finds its
//! family's entry (`claude-3-5-haiku`).

use std::collections::BTreeMap;
use std::path::Path;

use fanfold_model::Usage;
use serde::{Deserialize, Serialize};

/// The table shipped with the crate (`prices.toml`).
const BUNDLED: &str = include_str!("../prices.toml");

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelPrice {
    /// USD per million prompt tokens evaluated.
    pub input: f64,
    /// USD per million prompt tokens served from the provider's cache.
    pub cached_input: f64,
    /// USD per million completion tokens.
    pub output: f64,
    /// Fraction of the price taken off for batch requests, in `[0, 1]`.
    #[serde(default)]
    pub batch_discount: f64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PriceTable {
    #[serde(default)]
    pub models: BTreeMap<String, ModelPrice>,
}

#[derive(Debug, thiserror::Error)]
pub enum PriceError {
    #[error("price table {path}: {detail}")]
    Read { path: String, detail: String },
    #[error("price table: {0}")]
    Parse(String),
    #[error("price table: model {model:?}: {detail}")]
    Invalid { model: String, detail: String },
}

impl PriceTable {
    /// The table shipped with the crate. Its prices are as published by
    /// each provider when written; check them before relying on them.
    pub fn bundled() -> Result<PriceTable, PriceError> {
        PriceTable::from_toml_str(BUNDLED)
    }

    pub fn load(path: &Path) -> Result<PriceTable, PriceError> {
        let text = std::fs::read_to_string(path).map_err(|e| PriceError::Read {
            path: path.display().to_string(),
            detail: e.to_string(),
        })?;
        PriceTable::from_toml_str(&text).map_err(|e| match e {
            PriceError::Parse(detail) | PriceError::Invalid { detail, .. } => PriceError::Read {
                path: path.display().to_string(),
                detail,
            },
            other => other,
        })
    }

    pub fn from_toml_str(text: &str) -> Result<PriceTable, PriceError> {
        let table: PriceTable =
            toml::from_str(text).map_err(|e| PriceError::Parse(e.to_string()))?;
        for (model, p) in &table.models {
            let invalid = |detail: String| PriceError::Invalid {
                model: model.clone(),
                detail,
            };
            for (name, v) in [
                ("input", p.input),
                ("cached_input", p.cached_input),
                ("output", p.output),
            ] {
                if !(v.is_finite() && v >= 0.0) {
                    return Err(invalid(format!("{name} = {v} is not a non-negative price")));
                }
            }
            if !(p.batch_discount.is_finite() && (0.0..=1.0).contains(&p.batch_discount)) {
                return Err(invalid(format!(
                    "batch_discount = {} is not a fraction in 0..=1",
                    p.batch_discount
                )));
            }
        }
        Ok(table)
    }

    /// The entry for `model`: exact, else the longest name that prefixes
    /// it. A backend's model id (`host/model`) is accepted too: without a
    /// match, the part before the first `/` is dropped and the rest tried.
    pub fn get(&self, model: &str) -> Option<&ModelPrice> {
        let mut name = model;
        loop {
            let found = self.models.get(name).or_else(|| {
                self.models
                    .iter()
                    .filter(|(entry, _)| name.starts_with(entry.as_str()))
                    .max_by_key(|(entry, _)| entry.len())
                    .map(|(_, p)| p)
            });
            if found.is_some() {
                return found;
            }
            name = name.split_once('/')?.1;
        }
    }

    /// What `usage` cost in US dollars; `None` for a model not in the
    /// table.
    pub fn cost_usd(&self, model: &str, usage: &Usage, batch: bool) -> Option<f64> {
        let p = self.get(model)?;
        let full = (usage.prompt_tokens as f64 * p.input
            + usage.cached_tokens as f64 * p.cached_input
            + usage.completion_tokens as f64 * p.output)
            / 1_000_000.0;
        Some(if batch {
            full * (1.0 - p.batch_discount)
        } else {
            full
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundled_table_loads_and_prices() {
        let t = PriceTable::bundled().expect("bundled table parses");
        for m in [
            "gpt-4o-mini",
            "gpt-4.1-mini",
            "claude-3-5-haiku",
            "claude-sonnet-4",
            "local",
        ] {
            assert!(t.get(m).is_some(), "{m}");
        }
        let u = Usage {
            prompt_tokens: 1_000_000,
            cached_tokens: 2_000_000,
            completion_tokens: 500_000,
            latency_ms: 1,
        };
        let p = t.get("gpt-4o-mini").copied().expect("entry");
        let expected = p.input + 2.0 * p.cached_input + 0.5 * p.output;
        let got = t.cost_usd("gpt-4o-mini", &u, false).expect("priced");
        assert!((got - expected).abs() < 1e-9);
        let batch = t.cost_usd("gpt-4o-mini", &u, true).expect("priced");
        assert!((batch - expected * (1.0 - p.batch_discount)).abs() < 1e-9);
        assert_eq!(t.cost_usd("local", &u, false), Some(0.0));
        assert_eq!(t.cost_usd("no-such-model", &u, false), None);
    }

    #[test]
    fn snapshots_find_their_family_by_longest_prefix() {
        let t = PriceTable::from_toml_str(
            r#"
            [models."gpt-4.1"]
            input = 2.0
            cached_input = 0.5
            output = 8.0
            [models."gpt-4.1-mini"]
            input = 0.4
            cached_input = 0.1
            output = 1.6
            "#,
        )
        .expect("parses");
        assert_eq!(t.get("gpt-4.1-mini-2025-04-14").map(|p| p.input), Some(0.4));
        assert_eq!(t.get("gpt-4.1-2025-04-14").map(|p| p.input), Some(2.0));
        assert_eq!(t.get("gpt-4").map(|p| p.input), None);
        assert_eq!(
            t.get("api.openai.com/gpt-4.1-mini").map(|p| p.input),
            Some(0.4)
        );
        assert_eq!(
            t.get("127.0.0.1:8000/openai/gpt-4.1").map(|p| p.input),
            Some(2.0)
        );
        assert_eq!(t.get("host/other"), None);
    }

    #[test]
    fn bad_tables_are_refused() {
        for bad in [
            "[models.x]\ninput = -1\ncached_input = 0\noutput = 0\n",
            "[models.x]\ninput = 1\ncached_input = 0\noutput = 0\nbatch_discount = 1.5\n",
            "[models.x]\ninput = 1\ncached_input = 0\noutput = 0\ncache_write = 2\n",
            "[models.x]\ninput = 1\n",
            "models = 3",
        ] {
            assert!(PriceTable::from_toml_str(bad).is_err(), "{bad}");
        }
    }
}
