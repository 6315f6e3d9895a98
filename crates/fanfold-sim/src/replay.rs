//! [SIMULATED] Replay from a cassette, and recording of one.
//!
//! A cassette is JSON Lines: one entry per request, keyed by the hash of the
//! prefix and suffix, holding the answer text and the usage the recording
//! backend reported. Retries of one request are recorded in attempt order.

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use fanfold_core::{ContentHash, StableHasher};
use serde::{Deserialize, Serialize};

use fanfold_model::{
    BackendError, BackendInfo, CallError, Completion, Job, ModelBackend, Request, Usage,
};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CassetteEntry {
    pub request: ContentHash,
    pub attempt: u32,
    pub unit_id: String,
    pub model_id: String,
    /// `None` records a failed call, replayed as a backend error.
    pub text: Option<String>,
    pub error: Option<String>,
    pub usage: Usage,
    #[serde(default)]
    pub choices: Option<Vec<(String, f64)>>,
}

/// The key of one request in a cassette.
pub fn request_key(prefix: &str, suffix: &str) -> ContentHash {
    let mut h = StableHasher::new(fanfold_core::Bucket::Cassette);
    h.field("prefix", prefix).field("suffix", suffix);
    h.finish()
}

#[derive(Default)]
pub struct Cassette {
    entries: HashMap<ContentHash, Vec<CassetteEntry>>,
    model_id: Option<String>,
}

impl Cassette {
    pub fn load(path: &Path) -> Result<Cassette, BackendError> {
        let err = |detail: String| BackendError::Cassette {
            path: path.display().to_string(),
            detail,
        };
        let file = std::fs::File::open(path).map_err(|e| err(e.to_string()))?;
        let mut c = Cassette::default();
        for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
            let line = line.map_err(|e| err(e.to_string()))?;
            if line.trim().is_empty() {
                continue;
            }
            let entry: CassetteEntry =
                serde_json::from_str(&line).map_err(|e| err(format!("line {}: {e}", i + 1)))?;
            c.model_id.get_or_insert_with(|| entry.model_id.clone());
            c.entries.entry(entry.request).or_default().push(entry);
        }
        for list in c.entries.values_mut() {
            list.sort_by_key(|e| e.attempt);
        }
        Ok(c)
    }

    fn answer(&self, req: &Request, prefix: &str) -> Result<Completion, CallError> {
        let list = self
            .entries
            .get(&request_key(prefix, &req.suffix))
            .ok_or(CallError::Missing)?;
        let entry = list
            .iter()
            .find(|e| e.attempt == req.attempt)
            .or_else(|| list.last())
            .ok_or(CallError::Missing)?;
        match &entry.text {
            Some(text) => Ok(Completion {
                text: text.clone(),
                usage: entry.usage,
                choices: entry.choices.clone(),
                truncated_tokens: 0,
            }),
            None => Err(CallError::Backend(entry.error.clone().unwrap_or_default())),
        }
    }
}

pub struct ReplayBackend {
    cassette: Cassette,
    path: PathBuf,
}

impl ReplayBackend {
    pub fn open(path: &Path) -> Result<ReplayBackend, BackendError> {
        Ok(ReplayBackend {
            cassette: Cassette::load(path)?,
            path: path.to_owned(),
        })
    }
}

impl ModelBackend for ReplayBackend {
    fn info(&self) -> BackendInfo {
        BackendInfo {
            kind: "replay".into(),
            // Replayed answers share the recorded model's cache keys, so a
            // replay of a run reuses nothing it should not.
            model_id: self
                .cassette
                .model_id
                .clone()
                .unwrap_or_else(|| format!("replay:{}", self.path.display())),
            simulated: true,
        }
    }

    fn run(&self, job: &dyn Job) -> Result<(), BackendError> {
        while let Some(req) = job.next() {
            let result = self.cassette.answer(&req, job.prefix());
            job.complete(req, result);
        }
        Ok(())
    }
}

/// Wraps any backend and appends every call it makes to a cassette.
pub struct RecordingBackend<B> {
    inner: B,
    out: Mutex<std::io::BufWriter<std::fs::File>>,
}

impl<B: ModelBackend> RecordingBackend<B> {
    pub fn create(inner: B, path: &Path) -> Result<RecordingBackend<B>, BackendError> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| BackendError::Cassette {
                path: path.display().to_string(),
                detail: e.to_string(),
            })?;
        Ok(RecordingBackend {
            inner,
            out: Mutex::new(std::io::BufWriter::new(file)),
        })
    }
}

struct RecordingJob<'a> {
    inner: &'a dyn Job,
    model_id: String,
    out: &'a Mutex<std::io::BufWriter<std::fs::File>>,
}

impl Job for RecordingJob<'_> {
    fn prefix(&self) -> &str {
        self.inner.prefix()
    }
    fn slots(&self) -> usize {
        self.inner.slots()
    }
    fn next(&self) -> Option<Request> {
        self.inner.next()
    }
    fn poll_next(&self) -> fanfold_model::Next {
        self.inner.poll_next()
    }
    fn is_cancelled(&self) -> bool {
        self.inner.is_cancelled()
    }
    fn options(&self) -> &fanfold_model::JobOptions {
        self.inner.options()
    }
    fn batch_ledger(&self) -> Option<&dyn fanfold_model::BatchLedger> {
        self.inner.batch_ledger()
    }
    fn complete(&self, request: Request, result: Result<Completion, CallError>) {
        let entry = CassetteEntry {
            request: request_key(self.inner.prefix(), &request.suffix),
            attempt: request.attempt,
            unit_id: request.unit_id.clone(),
            model_id: self.model_id.clone(),
            text: result.as_ref().ok().map(|c| c.text.clone()),
            error: result.as_ref().err().map(|e| e.to_string()),
            usage: result.as_ref().map(|c| c.usage).unwrap_or_default(),
            choices: result.as_ref().ok().and_then(|c| c.choices.clone()),
        };
        if let Ok(line) = serde_json::to_string(&entry) {
            let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
            // A failed cassette write loses a recording, never an answer.
            let _ = writeln!(out, "{line}");
        }
        self.inner.complete(request, result);
    }
}

impl<B: ModelBackend> ModelBackend for RecordingBackend<B> {
    fn info(&self) -> BackendInfo {
        self.inner.info()
    }

    fn run(&self, job: &dyn Job) -> Result<(), BackendError> {
        let rec = RecordingJob {
            inner: job,
            model_id: self.inner.info().model_id,
            out: &self.out,
        };
        let r = self.inner.run(&rec);
        let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        out.flush()
            .map_err(|e| BackendError::Setup(format!("flushing the cassette: {e}")))?;
        r
    }

    fn cost_usd(&self, usage: &fanfold_model::Usage) -> Option<f64> {
        self.inner.cost_usd(usage)
    }

    fn token_surprise(
        &self,
        texts: &[String],
    ) -> Result<Option<fanfold_model::Surprises>, BackendError> {
        self.inner.token_surprise(texts)
    }
}
