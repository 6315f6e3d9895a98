//! Building model backends from the spec's `[backends]` table.

use std::path::Path;

use fanfold_core::spec::BackendSpec;
use fanfold_llama::{EmbeddedModel, LlamaConfig};
use fanfold_model::{BackendError, ModelBackend, ReplayBackend, ScriptedBackend};

use crate::models;

pub fn build(spec: &BackendSpec, spec_dir: &Path) -> Result<Box<dyn ModelBackend>, BackendError> {
    match spec {
        BackendSpec::Scripted {
            script,
            faults,
            delay_ms,
        } => {
            let path = spec_dir.join(script);
            let text = std::fs::read_to_string(&path).map_err(|e| {
                BackendError::Setup(format!("reading script {}: {e}", path.display()))
            })?;
            Ok(Box::new(ScriptedBackend::new(
                text,
                faults.clone(),
                *delay_ms,
            )?))
        }
        BackendSpec::Replay { cassette } => {
            Ok(Box::new(ReplayBackend::open(&spec_dir.join(cassette))?))
        }
        BackendSpec::Llama {
            model,
            threads,
            n_batch,
            slot_tokens,
        } => {
            let path = match model {
                Some(m) => spec_dir.join(m),
                None => models::ensure(&models::SMOLLM2_135M, &models::cache_dir(), &|line| {
                    eprintln!("{line}")
                })
                .map_err(|e| BackendError::Setup(e.to_string()))?,
            };
            let mut cfg = LlamaConfig::new(path);
            cfg.threads = *threads;
            cfg.n_batch = *n_batch;
            cfg.slot_tokens = *slot_tokens;
            let model = EmbeddedModel::load(cfg).map_err(|e| BackendError::Setup(e.to_string()))?;
            Ok(Box::new(model))
        }
    }
}
