//! [SIMULATED] The scripted backend: answers computed by a jq program over
//! the unit's projected fields, with injectable faults. It exists to test the
//! engine's accounting (slots, retries, statuses, caching) deterministically;
//! its answers are never a quality claim.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use fanfold_core::StableHash;
use fanfold_core::spec::{FaultKind, FaultSpec};
use fanfold_ops::jq::{JqProgram, Site, to_val};

use fanfold_model::{
    BackendError, BackendInfo, CallError, Completion, Job, ModelBackend, Usage, approx_tokens,
};

pub struct ScriptedBackend {
    script: String,
    faults: Vec<FaultSpec>,
    delay: Duration,
    /// Attempts seen per (fault index, unit), for faults limited by `times`.
    hits: Mutex<HashMap<(usize, String), u32>>,
}

impl ScriptedBackend {
    pub fn new(
        script: String,
        faults: Vec<FaultSpec>,
        delay_ms: u64,
    ) -> Result<ScriptedBackend, BackendError> {
        JqProgram::compile(&script)
            .map_err(|e| BackendError::Setup(format!("scripted backend script: {e}")))?;
        Ok(ScriptedBackend {
            script,
            faults,
            delay: Duration::from_millis(delay_ms),
            hits: Mutex::new(HashMap::new()),
        })
    }

    fn fault_for(&self, unit: &str) -> Option<FaultKind> {
        let mut hits = self.hits.lock().unwrap_or_else(|e| e.into_inner());
        for (i, f) in self.faults.iter().enumerate() {
            if !f.units.iter().any(|u| u == unit) {
                continue;
            }
            let n = hits.entry((i, unit.to_owned())).or_insert(0);
            *n += 1;
            if f.times.is_none_or(|t| *n <= t) {
                return Some(f.kind);
            }
        }
        None
    }

    fn answer(
        &self,
        program: &JqProgram,
        prefix_tokens: u64,
        req: &fanfold_model::Request,
    ) -> Result<Completion, CallError> {
        let started = Instant::now();
        if !self.delay.is_zero() {
            std::thread::sleep(self.delay);
        }
        let fault = self.fault_for(&req.unit_id);
        let mut choices = None;
        let text = match fault {
            Some(FaultKind::Error) => return Err(CallError::Backend("injected 500".into())),
            Some(FaultKind::Timeout) => return Err(CallError::Timeout { ms: 30_000 }),
            Some(FaultKind::Malformed) => "{\"decision\": \"blocker\", \"cause\": ".to_owned(),
            Some(FaultKind::SchemaViolation) => "{\"decision\": 42}".to_owned(),
            Some(FaultKind::FalseQuote) | None => {
                let mut out = program
                    .first_json(
                        to_val(&req.input),
                        Site::new("the scripted judge", &req.unit_id),
                    )
                    .map_err(|e| CallError::Backend(e.to_string()))?
                    .unwrap_or(serde_json::Value::Null);
                if fault == Some(FaultKind::FalseQuote)
                    && let Some(ev) = out.get_mut("evidence")
                {
                    *ev = serde_json::json!([{"field": "body", "quote": "a sentence that is in no issue"}]);
                }
                // A script may score the decision's choices, as the embedded
                // model does from its logits: `_scores` is taken out of the
                // answer and handed back as the choices' probabilities.
                if let Some(scores) = out.as_object_mut().and_then(|o| o.remove("_scores")) {
                    choices = scores.as_object().map(|o| {
                        o.iter()
                            .filter_map(|(k, v)| v.as_f64().map(|p| (k.clone(), p)))
                            .collect()
                    });
                }
                out.to_string()
            }
        };
        Ok(Completion {
            usage: Usage {
                prompt_tokens: prefix_tokens + approx_tokens(&req.suffix),
                cached_tokens: 0,
                completion_tokens: approx_tokens(&text),
                latency_ms: started.elapsed().as_millis() as u64,
            },
            text,
            choices,
            truncated_tokens: 0,
        })
    }
}

impl ModelBackend for ScriptedBackend {
    fn info(&self) -> BackendInfo {
        BackendInfo {
            kind: "scripted".into(),
            model_id: format!(
                "scripted:{}",
                self.script.key_in(fanfold_core::Bucket::Script).short(16)
            ),
            simulated: true,
        }
    }

    fn run(&self, job: &dyn Job) -> Result<(), BackendError> {
        let prefix_tokens = approx_tokens(job.prefix());
        let workers = job.slots().max(1);
        std::thread::scope(|scope| {
            let mut handles = Vec::with_capacity(workers);
            for _ in 0..workers {
                handles.push(scope.spawn(|| -> Result<(), BackendError> {
                    // jq values are not Send: each slot compiles its own copy.
                    let program = JqProgram::compile(&self.script)
                        .map_err(|e| BackendError::Setup(e.to_string()))?;
                    while let Some(req) = job.next() {
                        // A unit opened after the job was cancelled was
                        // never asked: it ends cancelled, not in error.
                        if job.is_cancelled() {
                            job.complete(req, Err(CallError::Cancelled));
                            continue;
                        }
                        let result = self.answer(&program, prefix_tokens, &req);
                        job.complete(req, result);
                    }
                    Ok(())
                }));
            }
            for h in handles {
                h.join()
                    .map_err(|_| BackendError::Setup("a scripted slot panicked".into()))??;
            }
            Ok(())
        })
    }

    /// [SIMULATED] A word a token, its surprise its length in characters:
    /// longer words read as rarer. Enough to drive prompt compression
    /// through the engine in tests; no model's measure.
    fn token_surprise(
        &self,
        texts: &[String],
    ) -> Result<Option<fanfold_model::Surprises>, BackendError> {
        let mut out = fanfold_model::Surprises::default();
        for text in texts {
            let mut tokens = Vec::new();
            let mut start = None;
            for (i, c) in text
                .char_indices()
                .chain(std::iter::once((text.len(), ' ')))
            {
                match (c.is_whitespace(), start) {
                    (true, Some(s)) => {
                        let word: &str = text.get(s..i).unwrap_or_default();
                        tokens.push(fanfold_model::TokenSurprise {
                            start: s,
                            end: i,
                            nats: word.chars().count() as f64,
                        });
                        start = None;
                    }
                    (false, None) => start = Some(i),
                    _ => {}
                }
            }
            out.usage.prompt_tokens += tokens.len() as u64;
            out.texts.push(tokens);
        }
        Ok(Some(out))
    }
}
