//! What a run measures about itself: the totals every stage adds to, and
//! each stage's own report, kept under the key its kind names so the
//! certificate reads as before while nothing outside a stage names a kind.

use std::collections::BTreeMap;

use fanfold_core::Cost;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Figures a run measured about itself.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunStats {
    pub model_calls: u64,
    pub cache_hits: u64,
    pub cache_misses: u64,
    /// Units a backend cut to fit its window; each such fact says by how
    /// many tokens (`truncated_tokens`).
    #[serde(default)]
    pub truncated_units: u64,
    /// Units whose projected input equalled another unit's in the same
    /// stage of this run: they share that unit's call instead of their own.
    #[serde(default)]
    pub deduplicated: u64,
    /// Stored facts that did not decode: dropped and computed again.
    #[serde(default)]
    pub corrupt_facts: u64,
    pub slots: usize,
    pub max_in_flight: usize,
    pub fold_depth: u32,
    pub fold_nodes_computed: u64,
    pub fold_nodes_reused: u64,
    /// Units whose facts were computed (not reused) in this run.
    pub recomputed_units: Vec<String>,
    pub cost: Cost,
    pub wall_ms: u64,
    /// Wall time of each phase of the run, in order: source, route
    /// (partition, prefilter and their store writes, streamed together),
    /// one entry per stage (`embed:NAME`, `map:NAME`), fold, answer, verify.
    pub phases_ms: Vec<(String, u64)>,
    /// The process's peak resident memory when the certificate was
    /// written (Linux `VmHWM`), in KiB; absent where the OS does not say.
    #[serde(default)]
    pub peak_rss_kib: Option<u64>,
    /// The shape of the tree of units observations bore, when any did or
    /// the budget limits a level.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tree: Option<super::born::TreeShape>,
    /// Each stage's own report, by its kind's key (`audits`, `clusters`,
    /// `embed`, ...) and then by stage name.
    #[serde(flatten)]
    pub reports: StageReports,
}

/// Stage reports by kind key, then by stage name. A kind writes and reads
/// its own typed report through [`StageReports::put`] and
/// [`StageReports::get`]; the run and the outputs only carry them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct StageReports(BTreeMap<String, BTreeMap<String, Value>>);

impl StageReports {
    /// Makes `key` appear in the certificate even before any stage of the
    /// kind reports.
    pub fn declare(&mut self, key: &str) {
        self.0.entry(key.to_owned()).or_default();
    }

    pub fn put<R: Serialize>(&mut self, key: &str, stage: &str, report: &R) {
        let value = serde_json::to_value(report).unwrap_or(Value::Null);
        self.0
            .entry(key.to_owned())
            .or_default()
            .insert(stage.to_owned(), value);
    }

    /// The report of one stage, read back as its kind's type.
    pub fn get<R: DeserializeOwned>(&self, key: &str, stage: &str) -> Option<R> {
        read(key, stage, self.0.get(key)?.get(stage)?)
    }

    /// Every report under `key`, by stage name.
    pub fn all<R: DeserializeOwned>(&self, key: &str) -> BTreeMap<String, R> {
        self.0
            .get(key)
            .into_iter()
            .flatten()
            .filter_map(|(name, v)| Some((name.clone(), read(key, name, v)?)))
            .collect()
    }

    /// Changes one stage's report in place, starting from the default.
    pub fn update<R: Serialize + DeserializeOwned + Default>(
        &mut self,
        key: &str,
        stage: &str,
        f: impl FnOnce(&mut R),
    ) {
        let mut r: R = self.get(key, stage).unwrap_or_default();
        f(&mut r);
        self.put(key, stage, &r);
    }
}

/// A stored report as its kind's type. One that does not read (written by
/// another version, or by a kind that changed its type) is said in the
/// log, naming it, rather than dropped without a word.
fn read<R: DeserializeOwned>(key: &str, stage: &str, v: &Value) -> Option<R> {
    match R::deserialize(v) {
        Ok(r) => Some(r),
        Err(e) => {
            tracing::warn!(
                kind = key,
                stage,
                error = %e,
                "a stage's report does not read as its kind's type and is left out"
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
    struct Counted {
        n: u64,
    }

    #[test]
    fn reports_sit_under_their_kind_key_in_the_stats_json() {
        let mut s = RunStats::default();
        s.reports.declare("audits");
        s.reports
            .update("bm25", "lexical", |r: &mut Counted| r.n += 2);
        s.reports
            .update("bm25", "lexical", |r: &mut Counted| r.n += 1);
        let v = serde_json::to_value(&s).unwrap_or_default();
        assert_eq!(v["bm25"]["lexical"]["n"], 3);
        assert_eq!(v["audits"], serde_json::json!({}));
        let back: RunStats = serde_json::from_value(v).unwrap_or_default();
        assert_eq!(back, s);
        assert_eq!(
            back.reports.get::<Counted>("bm25", "lexical"),
            Some(Counted { n: 3 })
        );
        assert!(back.reports.all::<Counted>("audits").is_empty());
    }
}
