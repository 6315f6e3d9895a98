//! Model calls spread over worker processes through the store.
//!
//! A run started with workers (`fanfold run --workers N`) is the
//! **coordinator**: it plans, ingests, routes, runs every stage, folds and
//! verifies as any run does, but its model backends are [`FleetBackend`]s.
//! A fleet backend does not call a model: it writes each request the
//! stage's job hands it to the store's work queue and hands back the
//! result a worker wrote. Budgets, slots, retries, the breaker and the
//! contract stay in the coordinator's job, the one place that decides
//! what is asked: N workers cannot spend past a budget together, because
//! no request reaches the queue before the budget is reserved for it.
//!
//! A **worker** (`fanfold worker`, [`worker::serve`]) is stateless: it
//! takes the open job of a live run, builds the job's backend from the
//! description the coordinator stored (the spec's backend table with the
//! files it names inlined), claims tasks under a lease, calls its model
//! and writes each result once.

mod coordinator;
pub mod worker;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use fanfold_core::spec::{BackendSpec, Execution};
use fanfold_model::{BackendError, DecisionField, ModelBackend};
use serde::{Deserialize, Serialize};

pub use coordinator::FleetBackend;

/// Where a coordinator's fleet backends queue their work.
#[derive(Clone, Debug)]
pub struct FleetLink {
    pub store_path: PathBuf,
    pub run_id: String,
}

/// A backend as the store carries it to workers: the spec's table, with
/// each file it names (a script, a cassette, a price table) inlined, and
/// a model file named by its absolute path (a worker needs the same file
/// there; the default model is fetched by the worker itself).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PortableBackend {
    pub spec: BackendSpec,
    /// File name (as `spec` names it) -> contents.
    pub files: BTreeMap<String, String>,
}

impl PortableBackend {
    pub fn new(spec: &BackendSpec, spec_dir: &Path) -> Result<PortableBackend, BackendError> {
        let mut spec = spec.clone();
        let mut files = BTreeMap::new();
        let mut inline = |name: &mut String, file: &'static str| -> Result<(), BackendError> {
            let path = spec_dir.join(&*name);
            let text = std::fs::read_to_string(&path).map_err(|e| {
                BackendError::Setup(format!("reading {} for the workers: {e}", path.display()))
            })?;
            files.insert(file.to_owned(), text);
            *name = file.to_owned();
            Ok(())
        };
        match &mut spec {
            BackendSpec::Scripted { script, .. } => inline(script, "script.jq")?,
            BackendSpec::Replay { cassette } => inline(cassette, "cassette.jsonl")?,
            BackendSpec::Openai(h) | BackendSpec::Anthropic(h) => {
                if let Some(prices) = &mut h.prices {
                    inline(prices, "prices.toml")?;
                }
            }
            BackendSpec::Llama { model, .. } => {
                if let Some(m) = model {
                    let path = spec_dir.join(&*m);
                    *m = std::path::absolute(&path)
                        .unwrap_or(path)
                        .display()
                        .to_string();
                }
            }
        }
        Ok(PortableBackend { spec, files })
    }

    /// Builds the backend in `dir` (where its files are written), with
    /// `endpoint` in place of an HTTP backend's own.
    pub fn build(
        &self,
        dir: &Path,
        endpoint: Option<&str>,
        rates: Option<std::sync::Arc<dyn fanfold_model::SharedRates>>,
    ) -> Result<Box<dyn ModelBackend>, BackendError> {
        for (name, text) in &self.files {
            std::fs::write(dir.join(name), text).map_err(|e| {
                BackendError::Setup(format!("writing {name} in {}: {e}", dir.display()))
            })?;
        }
        let mut spec = self.spec.clone();
        if let (Some(url), BackendSpec::Openai(h) | BackendSpec::Anthropic(h)) =
            (endpoint, &mut spec)
        {
            h.base_url = Some(url.to_owned());
            h.endpoints.clear();
        }
        crate::backends::build_sharing(&spec, dir, Execution::Online, rates)
    }

    /// Whether a worker's `endpoint` replaces this backend's.
    pub fn takes_endpoint(&self) -> bool {
        matches!(
            self.spec,
            BackendSpec::Openai(_) | BackendSpec::Anthropic(_)
        )
    }

    /// Whether this backend, built on a worker's own endpoint and named
    /// `here`, may make the facts of a job keyed by `job`: the two
    /// identities (`host/alias[@served][suffixes]`, the host being each
    /// one's own endpoint) must agree past the host. A job whose endpoint
    /// named the weights it serves needs the worker's endpoint to name the
    /// same ones; one whose endpoint could not say is keyed by host and
    /// alias alone, and nothing here can prove the two differ. The error
    /// says what each side serves.
    pub fn serves_as(&self, job: &str, here: &str) -> Result<(), String> {
        let (BackendSpec::Openai(h) | BackendSpec::Anthropic(h)) = &self.spec else {
            return if job == here {
                Ok(())
            } else {
                Err(format!(
                    "it is `{here}`, the job's facts are keyed by `{job}`"
                ))
            };
        };
        let tail = |id: &str| {
            id.split_once('/')
                .and_then(|(_, rest)| rest.strip_prefix(h.model.as_str()))
                .map(str::to_owned)
        };
        let (Some(wanted), Some(found)) = (tail(job), tail(here)) else {
            return Err(format!(
                "its identity `{here}` and the job's `{job}` do not both name model `{}`",
                h.model
            ));
        };
        if wanted == found || !wanted.starts_with('@') {
            return Ok(());
        }
        match served_of(&found) {
            Some(served) => Err(format!(
                "it serves `{served}` under `{}`, the job's facts are keyed by `{}`",
                h.model,
                served_of(&wanted).unwrap_or_default()
            )),
            None => Err(format!(
                "it does not say what it serves under `{}` (no `GET /models` listing names it), \
                 and the job's facts are keyed by `{}`",
                h.model,
                served_of(&wanted).unwrap_or_default()
            )),
        }
    }
}

/// The served weights an identity's tail past the alias names
/// (`@id#fingerprint`, before any suffix the backend adds), for messages.
fn served_of(tail: &str) -> Option<&str> {
    let rest = tail.strip_prefix('@')?;
    let id_end = rest.find('#').unwrap_or(rest.len());
    // The fingerprint is 12 hex digits after the id's `#`.
    let end = (id_end + 13).min(rest.len());
    rest.get(..end)
}

/// What a job asks of a backend besides its prefix.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct JobOptions {
    schema: Option<serde_json::Value>,
    /// The decision's key and allowed values.
    decision: Option<(String, Vec<String>)>,
    choice_only: bool,
}

impl JobOptions {
    fn decision(&self) -> Option<DecisionField> {
        self.decision
            .clone()
            .map(|(key, choices)| DecisionField { key, choices })
    }
}

/// One request, as a task carries it.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct TaskRequest {
    unit_id: String,
    suffix: String,
    input: serde_json::Value,
    attempt: u32,
    max_output_tokens: u32,
    schema: Option<serde_json::Value>,
}

/// A task's result as a worker writes it.
type TaskResult = Result<fanfold_model::Completion, fanfold_model::CallError>;

#[cfg(test)]
mod tests {
    use super::*;

    fn openai(model: &str) -> PortableBackend {
        let spec: BackendSpec = serde_json::from_value(serde_json::json!({
            "type": "openai", "model": model, "base_url": "http://declared:8000/v1"
        }))
        .unwrap_or_else(|e| panic!("spec: {e}"));
        PortableBackend {
            spec,
            files: BTreeMap::new(),
        }
    }

    /// On a worker's own endpoint the host differs by design: what decides
    /// is what each endpoint says it serves under the alias.
    #[test]
    fn a_workers_endpoint_must_name_the_weights_the_job_is_keyed_by() {
        let p = openai("org/m");
        let job = "declared:8000/org/m@org/m#0123456789ab+logprobs#json_schema";
        // The same weights, named alike from another host.
        assert_eq!(
            p.serves_as(
                job,
                "gpu7:8000/org/m@org/m#0123456789ab+logprobs#json_schema"
            ),
            Ok(())
        );
        // Other weights behind the same alias.
        let other = p
            .serves_as(
                job,
                "gpu7:8000/org/m@org/m#ba9876543210+logprobs#json_schema",
            )
            .expect_err("other weights");
        assert!(
            other.contains("serves `org/m#ba9876543210`")
                && other.contains("keyed by `org/m#0123456789ab`"),
            "{other}"
        );
        // An endpoint that cannot say is not taken for the job's weights.
        let mute = p
            .serves_as(job, "gpu7:8000/org/m+logprobs#json_schema")
            .expect_err("cannot say");
        assert!(mute.contains("does not say what it serves"), "{mute}");
        // A job whose own endpoint could not say is keyed by host and alias:
        // nothing proves another endpoint serves other weights.
        let unnamed = "declared:8000/org/m#json_schema";
        assert_eq!(p.serves_as(unnamed, "gpu7:8000/org/m#json_schema"), Ok(()));
        assert_eq!(
            p.serves_as(unnamed, "gpu7:8000/org/m@org/m#0123456789ab#json_schema"),
            Ok(())
        );
        // Another alias is never the job's model.
        assert!(p.serves_as(job, "gpu7:8000/org/n#json_schema").is_err());
    }
}
