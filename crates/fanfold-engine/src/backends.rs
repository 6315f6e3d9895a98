//! Building model backends from the spec's `[backends]` table.

use std::path::Path;

use fanfold_core::spec::BackendSpec;
use fanfold_model::{BackendError, ModelBackend, ReplayBackend, ScriptedBackend};

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
    }
}
