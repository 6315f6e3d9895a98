//! A queue-backed job: what a backend sees of the engine, and a record of
//! what it did with each request.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use fanfold_model::{CallError, Completion, DecisionField, Job, JobOptions, Request};
use serde_json::Value;

/// One request as it came back.
#[derive(Clone, Debug)]
pub struct Finished {
    pub request: Request,
    pub result: Result<Completion, CallError>,
    /// From the moment the backend pulled the request to its completion.
    pub held: Duration,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Request>,
    /// When each handed-out request left the queue, by request index.
    started: Vec<Option<Instant>>,
    finished: Vec<Finished>,
    handed: usize,
    in_flight: usize,
    max_in_flight: usize,
    cancelled: bool,
}

/// A [`Job`] over a fixed list of requests, handed out in order.
pub struct QueueJob {
    pub prefix: String,
    pub slots: usize,
    pub schema: Option<Value>,
    pub decision: Option<DecisionField>,
    /// Ask for the decision alone, scored rather than generated.
    pub choice_only: bool,
    /// Hand out no more than this many requests.
    pub limit: usize,
    /// Turn cancelled once this many results are back.
    pub cancel_after: usize,
    /// `schema`, `decision` and `choice_only` as the job's options, taken
    /// when a backend first asks (a test sets them before it runs the job).
    options: std::sync::OnceLock<JobOptions>,
    state: Mutex<State>,
}

impl QueueJob {
    pub fn new(prefix: impl Into<String>, requests: Vec<Request>, slots: usize) -> QueueJob {
        let n = requests.iter().map(|r| r.index + 1).max().unwrap_or(0);
        QueueJob {
            prefix: prefix.into(),
            slots,
            schema: None,
            decision: None,
            choice_only: false,
            limit: usize::MAX,
            cancel_after: usize::MAX,
            options: std::sync::OnceLock::new(),
            state: Mutex::new(State {
                queue: requests.into(),
                started: vec![None; n],
                ..State::default()
            }),
        }
    }

    pub fn with_schema(mut self, schema: Value) -> QueueJob {
        self.schema = Some(schema);
        self
    }

    pub fn with_decision(mut self, decision: DecisionField) -> QueueJob {
        self.decision = Some(decision);
        self
    }

    /// Asks for `decision` alone, read from the model's scores.
    pub fn with_choice_only(mut self, decision: DecisionField) -> QueueJob {
        self.decision = Some(decision);
        self.choice_only = true;
        self
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The results in the order they came back.
    pub fn finished(&self) -> Vec<Finished> {
        self.lock().finished.clone()
    }

    /// The most requests the backend held at once.
    pub fn max_in_flight(&self) -> usize {
        self.lock().max_in_flight
    }

    /// Requests handed out so far.
    pub fn handed(&self) -> usize {
        self.lock().handed
    }

    /// Requests never handed out.
    pub fn left(&self) -> usize {
        self.lock().queue.len()
    }

    /// What the backend broke of the contract a job states: every request
    /// handed out comes back exactly once, the queue is drained unless the
    /// job was cancelled or limited, and no more requests than slots are
    /// ever held. Empty when it kept all of it.
    pub fn contract_breaches(&self) -> Vec<String> {
        let s = self.lock();
        let mut out = Vec::new();
        if s.finished.len() != s.handed {
            out.push(format!(
                "{} requests handed out, {} completed",
                s.handed,
                s.finished.len()
            ));
        }
        let mut seen = std::collections::HashSet::new();
        for f in &s.finished {
            if !seen.insert(f.request.index) {
                out.push(format!("unit {} completed twice", f.request.unit_id));
            }
        }
        if !s.cancelled && s.handed < self.limit && !s.queue.is_empty() {
            out.push(format!("{} requests left in the queue", s.queue.len()));
        }
        if s.max_in_flight > self.slots {
            out.push(format!(
                "{} requests held at once with {} slots",
                s.max_in_flight, self.slots
            ));
        }
        out
    }
}

impl Job for QueueJob {
    fn prefix(&self) -> &str {
        &self.prefix
    }

    fn slots(&self) -> usize {
        self.slots
    }

    fn next(&self) -> Option<Request> {
        let mut s = self.lock();
        // A cancelled job still hands out: a backend drains what is left
        // and hands it back as cancelled, which a test may count.
        if s.handed >= self.limit {
            return None;
        }
        let request = s.queue.pop_front()?;
        if let Some(slot) = s.started.get_mut(request.index) {
            *slot = Some(Instant::now());
        }
        s.handed += 1;
        s.in_flight += 1;
        s.max_in_flight = s.max_in_flight.max(s.in_flight);
        Some(request)
    }

    fn complete(&self, request: Request, result: Result<Completion, CallError>) {
        let now = Instant::now();
        let mut s = self.lock();
        let held = s
            .started
            .get_mut(request.index)
            .and_then(Option::take)
            .map(|t| now.saturating_duration_since(t))
            .unwrap_or_default();
        s.in_flight = s.in_flight.saturating_sub(1);
        s.finished.push(Finished {
            request,
            result,
            held,
        });
        if s.finished.len() >= self.cancel_after {
            s.cancelled = true;
        }
    }

    fn is_cancelled(&self) -> bool {
        self.lock().cancelled
    }

    fn options(&self) -> &JobOptions {
        self.options.get_or_init(|| JobOptions {
            schema: self.schema.clone(),
            decision: self.decision.clone(),
            choice_only: self.choice_only,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(i: usize) -> Request {
        Request {
            index: i,
            unit_id: format!("u{i}"),
            suffix: String::new(),
            input: Value::Null,
            attempt: 1,
            max_output_tokens: 8,
            schema: None,
        }
    }

    #[test]
    fn a_backend_that_drops_a_request_is_caught() {
        let job = QueueJob::new("p", (0..3).map(request).collect(), 2);
        let a = job.next().expect("first");
        let _b = job.next().expect("second");
        job.complete(a, Err(CallError::Timeout { ms: 1 }));
        let breaches = job.contract_breaches();
        assert!(
            breaches
                .iter()
                .any(|b| b.contains("2 requests handed out, 1 completed")),
            "{breaches:?}"
        );
        assert!(breaches.iter().any(|b| b.contains("left in the queue")));
    }

    #[test]
    fn a_cancelled_job_may_be_left_undrained_or_limited() {
        let mut job = QueueJob::new("p", (0..4).map(request).collect(), 1);
        job.cancel_after = 1;
        let a = job.next().expect("first");
        job.complete(a, Err(CallError::Timeout { ms: 1 }));
        assert!(job.is_cancelled());
        assert!(job.contract_breaches().is_empty());
        assert_eq!(job.left(), 3);

        let mut limited = QueueJob::new("p", (0..4).map(request).collect(), 1);
        limited.limit = 1;
        let a = limited.next().expect("first");
        assert!(limited.next().is_none());
        limited.complete(a, Err(CallError::Timeout { ms: 1 }));
        assert!(limited.contract_breaches().is_empty());
    }
}
