//! What a live run reports of itself through its heartbeat, for
//! `fanfold status`: each stage's units and statuses so far, and the
//! budget spent against its limits. It watches the progress the run
//! reports anyway, so it costs a few counters.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};

use fanfold_core::Status;
use fanfold_core::spec::BudgetSpec;
use serde_json::json;

use crate::kit::Progress;
use crate::queue::BudgetPool;

#[derive(Default, Clone)]
struct StageTally {
    units: u64,
    cached: u64,
    by_status: BTreeMap<&'static str, u64>,
}

/// Counts what the run reports to `inner` on its way through.
pub(crate) struct Tally<'a> {
    inner: &'a dyn Progress,
    stages: Mutex<BTreeMap<String, StageTally>>,
    budget: OnceLock<(Arc<BudgetPool>, BudgetSpec)>,
}

impl<'a> Tally<'a> {
    pub fn new(inner: &'a dyn Progress) -> Tally<'a> {
        Tally {
            inner,
            stages: Mutex::new(BTreeMap::new()),
            budget: OnceLock::new(),
        }
    }

    /// The run's budget, once it has one, so spend is reported too.
    pub fn watch_budget(&self, pool: Arc<BudgetPool>, limits: BudgetSpec) {
        let _ = self.budget.set((pool, limits));
    }

    /// The progress as JSON: `{"stages": {name: {units, cached, <status>:
    /// n}}, "spent": {...}, "limits": {...}}`.
    pub fn snapshot(&self) -> String {
        let stages: serde_json::Map<String, serde_json::Value> = self
            .stages
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(name, t)| {
                let mut s = serde_json::Map::new();
                s.insert("units".into(), json!(t.units));
                s.insert("cached".into(), json!(t.cached));
                for (status, n) in &t.by_status {
                    s.insert((*status).to_owned(), json!(n));
                }
                (name.clone(), serde_json::Value::Object(s))
            })
            .collect();
        let mut out = serde_json::Map::new();
        out.insert("stages".into(), serde_json::Value::Object(stages));
        if let Some((pool, limits)) = self.budget.get() {
            let used = pool.used();
            out.insert(
                "spent".into(),
                json!({
                    "model_calls": used.calls,
                    "tokens": used.tokens,
                    "usd": used.usd,
                    "wall_secs": pool.wall_ms() / 1000,
                }),
            );
            out.insert(
                "limits".into(),
                json!({
                    "model_calls": limits.max_model_calls,
                    "tokens": limits.max_tokens,
                    "usd": limits.max_usd,
                    "wall_secs": limits.max_wall_secs,
                }),
            );
        }
        serde_json::Value::Object(out).to_string()
    }
}

impl Progress for Tally<'_> {
    fn stage_started(&self, stage: &str, units: u64, cached: u64) {
        {
            let mut stages = self.stages.lock().unwrap_or_else(|e| e.into_inner());
            let t = stages.entry(stage.to_owned()).or_default();
            t.units += units;
            t.cached += cached;
        }
        self.inner.stage_started(stage, units, cached);
    }

    fn unit_finished(&self, stage: &str, status: Status) {
        {
            let mut stages = self.stages.lock().unwrap_or_else(|e| e.into_inner());
            let t = stages.entry(stage.to_owned()).or_default();
            *t.by_status.entry(status.as_str()).or_default() += 1;
        }
        if let Some((pool, _)) = self.budget.get() {
            self.inner.model_calls(pool.used().calls);
        }
        self.inner.unit_finished(stage, status);
    }

    fn stage_finished(&self, stage: &str) {
        self.inner.stage_finished(stage);
    }
}
