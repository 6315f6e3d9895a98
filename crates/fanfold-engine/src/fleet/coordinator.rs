//! The coordinator's side: a backend that queues its job's requests for
//! workers and hands back what they answer.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use fanfold_model::{BackendError, BackendInfo, CallError, Job, ModelBackend, Next, Request};
use fanfold_store::{FleetJob, Store, StoreError};

use super::{FleetLink, PortableBackend, TaskResult, options_row, task_row};

/// How long the coordinator waits before reading the queue again after
/// a read found no results: from [`POLL_MIN`], doubling to [`POLL_MAX`]
/// while nothing comes, so results that stream in are read within a few
/// milliseconds and a quiet queue costs a few statements a second. While
/// tasks wait unclaimed, reads that find results are [`POLL_MIN`] apart
/// too: each then gathers what a few milliseconds brought, rather than the
/// server answering a read for every result or two, and the waiting tasks
/// keep the workers busy meanwhile. With none waiting, the next tasks are
/// queued at once.
const POLL_MIN: Duration = Duration::from_millis(4);
const POLL_MAX: Duration = Duration::from_millis(20);

/// How long calls may wait with no answer before the run says, once a
/// period, that no worker is taking them.
const NO_WORKER: Duration = Duration::from_secs(30);

/// How long every live worker may have refused a job, when this process
/// started none of them, before the coordinator stops waiting for another.
const REFUSED_GRACE: Duration = Duration::from_secs(10);

/// How often the coordinator takes back the tasks of workers whose leases
/// lapsed, and looks at who is left to answer.
const WATCH: Duration = Duration::from_millis(250);

/// Why the queue stopped serving a job.
#[derive(Debug, thiserror::Error)]
enum QueueError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{0}")]
    Encode(String),
    /// No worker is left that could answer the job.
    #[error("{0}")]
    NoWorker(String),
}

/// What a call comes back as when its worker stopped renewing its lease.
fn lost_worker() -> CallError {
    CallError::Backend(
        "its worker stopped renewing its lease (killed or paused) with the call in flight".into(),
    )
}

/// A backend whose calls are made by workers.
pub struct FleetBackend {
    store: Store,
    run_id: String,
    /// The backend the spec declares: its identity keys the facts.
    info: BackendInfo,
    /// The same backend as workers build it (JSON of a [`PortableBackend`]).
    portable: String,
    /// Jobs opened so far, for job ids unique within the run.
    jobs: AtomicU64,
    /// The declared HTTP backend, built for its identity and asked what a
    /// usage cost; never called.
    priced: Option<Box<dyn ModelBackend>>,
    /// How long a worker stays live without a heartbeat: the run's lease.
    live_ms: u64,
    /// When this backend was made: workers registered before it were not
    /// started by this run (a pid used again).
    since_ms: u64,
}

impl FleetBackend {
    /// A fleet backend standing for `spec`, queueing on `link`'s store with
    /// its own connection.
    pub fn new(
        link: &FleetLink,
        spec: &fanfold_core::spec::BackendSpec,
        spec_dir: &std::path::Path,
    ) -> Result<FleetBackend, BackendError> {
        use fanfold_core::spec::{BackendSpec, Execution};
        // An HTTP backend is cheap to build and knows its prices: it is
        // built here once, for its identity and its prices. The others are
        // named from the spec alone (no weights are loaded here).
        let (info, priced) = match spec {
            BackendSpec::Openai(_) | BackendSpec::Anthropic(_) => {
                let built = crate::backends::build(spec, spec_dir, Execution::Online)?;
                (built.info(), Some(built))
            }
            _ => (
                crate::backends::identity(spec, spec_dir, Execution::Online)?,
                None,
            ),
        };
        let portable = PortableBackend::new(spec, spec_dir)?;
        let portable = serde_json::to_string(&portable)
            .map_err(|e| BackendError::Setup(format!("describing the backend: {e}")))?;
        let store = Store::open(&link.store_path).map_err(|e| BackendError::Store(Box::new(e)))?;
        // Workers beat well within a lease; one silent for a whole lease
        // (the store's default, a minute) is taken for gone.
        let live_ms = store.lease_ms();
        Ok(FleetBackend {
            store,
            run_id: link.run_id.clone(),
            info,
            portable,
            jobs: AtomicU64::new(0),
            priced,
            live_ms,
            since_ms: process_started_ms().unwrap_or(0),
        })
    }

    fn queue(&self, job: &dyn Job, job_id: &str) -> Result<(), QueueError> {
        let mut out: HashMap<u64, Request> = HashMap::new();
        let mut next_seq = 0_u64;
        let mut pulled_all = false;
        let mut wait = POLL_MIN;
        let mut answered = std::time::Instant::now();
        let mut watched = std::time::Instant::now();
        let mut all_refused: Option<std::time::Instant> = None;
        // Results handled and not yet removed from the queue: removed by
        // the next read, in the same statement.
        let mut handled: Vec<u64> = Vec::new();
        loop {
            if !out.is_empty() && watched.elapsed() >= WATCH {
                watched = std::time::Instant::now();
                // A task whose worker died or paused past its lease: its
                // call may have been sent, so it fails as a call does and
                // the job asks again, reserving the budget again.
                for seq in self.store.take_back_lapsed_tasks(job_id)? {
                    if let Some(r) = out.remove(&seq) {
                        tracing::warn!(
                            job = %job_id, unit = %r.unit_id,
                            "a worker stopped renewing its lease with this call; asking again"
                        );
                        job.complete(r, Err(lost_worker()));
                        // It may come back as a retry.
                        pulled_all = false;
                    }
                }
                if let Some(why) = self.nobody_left(job_id, &mut all_refused)? {
                    tracing::error!(job = %job_id, "the fleet's calls stop: {why}");
                    self.store.close_fleet_job(job_id, "cancelled")?;
                    for (_, r) in out.drain() {
                        job.complete(r, Err(CallError::Backend(why.clone())));
                    }
                    return Err(QueueError::NoWorker(why));
                }
            }
            if job.is_cancelled() {
                self.store.close_fleet_job(job_id, "cancelled")?;
                for (_, r) in out.drain() {
                    job.complete(r, Err(CallError::Cancelled));
                }
                return Ok(());
            }
            // The job's slots bound the requests out across the fleet.
            let mut fresh = Vec::new();
            while !pulled_all && out.len() + fresh.len() < job.slots().max(1) {
                match job.poll_next() {
                    Next::Request(r) => fresh.push(r),
                    Next::Later(_) => break,
                    Next::Done => pulled_all = true,
                }
            }
            if !fresh.is_empty() {
                let mut rows = Vec::with_capacity(fresh.len());
                for r in &fresh {
                    let text = task_row(r).map_err(|e| QueueError::Encode(e.to_string()))?;
                    rows.push((next_seq + rows.len() as u64, text));
                }
                // Held before the write, so a failed write still ends them.
                for r in fresh {
                    out.insert(next_seq, r);
                    next_seq += 1;
                }
                self.store.put_fleet_tasks(job_id, &rows)?;
            }
            if pulled_all && out.is_empty() {
                return Ok(());
            }
            let read_at = std::time::Instant::now();
            // No result is waited for below the oldest task out.
            let from = out.keys().min().copied().unwrap_or(next_seq);
            let read = self.store.next_fleet_results(job_id, &handled, from)?;
            let (results, unclaimed) = (read.results, read.unclaimed);
            handled.clear();
            if results.is_empty() {
                if !out.is_empty() && answered.elapsed() >= NO_WORKER {
                    tracing::warn!(
                        job = %job_id, waiting = out.len(), store = %self.store.location(),
                        "no worker has answered for {} s: start `fanfold worker` on this store, or read the workers' logs for a job they refused",
                        NO_WORKER.as_secs()
                    );
                    answered = std::time::Instant::now();
                }
                std::thread::sleep(wait);
                wait = (wait * 2).min(POLL_MAX);
                continue;
            }
            wait = POLL_MIN;
            answered = std::time::Instant::now();
            handled.extend(results.iter().map(|(s, _)| *s));
            for (seq, text) in results {
                let Some(request) = out.remove(&seq) else {
                    continue;
                };
                let result: TaskResult = serde_json::from_str(&text).unwrap_or_else(|e| {
                    Err(CallError::InvalidResponse(format!(
                        "a worker's result does not read: {e}"
                    )))
                });
                job.complete(request, result);
                // A failed call may come back as a retry.
                pulled_all = false;
            }
            if unclaimed > 0
                && let Some(rest) = POLL_MIN.checked_sub(read_at.elapsed())
            {
                std::thread::sleep(rest);
            }
        }
    }
}

impl FleetBackend {
    /// Why no worker is left to answer `job_id`, if none is: every worker
    /// this process started is gone (stopped, killed, silent past the
    /// lease), or every live worker refused the job (at once when this
    /// process started workers; after [`REFUSED_GRACE`] when they were
    /// started elsewhere, where another may yet come).
    fn nobody_left(
        &self,
        job_id: &str,
        all_refused: &mut Option<std::time::Instant>,
    ) -> Result<Option<String>, QueueError> {
        let w = self.store.fleet_watch(
            job_id,
            &fanfold_store::this_host(),
            std::process::id(),
            self.since_ms,
            self.live_ms,
        )?;
        let started = !w.started.is_empty();
        let gone = |pid: u32, gone: bool| gone || !process_alive(pid);
        if started && w.started.iter().all(|(_, pid, g)| gone(*pid, *g)) {
            return Ok(Some(format!(
                "all {} workers this run started have stopped or died; what was answered is kept",
                w.started.len()
            )));
        }
        let refused_all = !w.live.is_empty()
            && w.live
                .iter()
                .all(|id| w.refused.iter().any(|(r, _)| r == id));
        if !refused_all {
            *all_refused = None;
            return Ok(None);
        }
        let since = *all_refused.get_or_insert_with(std::time::Instant::now);
        if started || since.elapsed() >= REFUSED_GRACE {
            let reasons: Vec<String> = w
                .refused
                .iter()
                .map(|(id, why)| format!("{id}: {why}"))
                .collect();
            return Ok(Some(format!(
                "every live worker refused the job ({})",
                reasons.join("; ")
            )));
        }
        Ok(None)
    }
}

/// When this process started (ms since the epoch, to within a second or
/// two, and never later than it did), read from `/proc`; `None` elsewhere.
fn process_started_ms() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The 22nd field, the 20th past the command's closing parenthesis:
    // clock ticks (100 a second on Linux) since boot.
    let ticks: u64 = stat
        .rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(19)?
        .parse()
        .ok()?;
    let boot: u64 = std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    Some((boot * 1_000 + ticks * 10).saturating_sub(2_000))
}

/// Whether process `pid` on this host is running (not gone, not a zombie
/// waiting to be reaped).
fn process_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command's closing parenthesis.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        // Without /proc (not Linux), the heartbeat alone decides.
        Err(_) => !std::path::Path::new("/proc/self/stat").exists(),
    }
}

impl ModelBackend for FleetBackend {
    fn info(&self) -> BackendInfo {
        self.info.clone()
    }

    fn run(&self, job: &dyn Job) -> Result<(), BackendError> {
        let n = self.jobs.fetch_add(1, Ordering::Relaxed);
        let job_id = format!("{}/{n}", self.run_id);
        let row = FleetJob {
            job_id: job_id.clone(),
            run_id: self.run_id.clone(),
            backend: self.portable.clone(),
            model_id: self.info.model_id.clone(),
            prefix: job.prefix().to_owned(),
            options: options_row(job.options()).map_err(|e| {
                BackendError::Setup(format!("the job's options not written as JSON: {e}"))
            })?,
        };
        self.store
            .open_fleet_job(&row)
            .map_err(|e| BackendError::Store(Box::new(e)))?;
        let queued = self.queue(job, &job_id);
        if let Err(e) = self.store.close_fleet_job(&job_id, "closed") {
            tracing::warn!(job = %job_id, error = %e, "the fleet job not closed");
        }
        match queued {
            Ok(()) => Ok(()),
            // The store's failure, as the store's: the run ends as a store
            // failure does, not as a backend that cannot be set up.
            Err(QueueError::Store(e)) => Err(BackendError::Store(Box::new(e))),
            Err(QueueError::Encode(e)) => Err(BackendError::Setup(format!(
                "the fleet's queue: a request not written as JSON: {e}"
            ))),
            // The calls not answered end unanswered, and the run goes on
            // to an incomplete answer, keeping what was answered.
            Err(QueueError::NoWorker(_)) => Ok(()),
        }
    }

    fn cost_usd(&self, usage: &fanfold_model::Usage) -> Option<f64> {
        self.priced.as_ref().and_then(|b| b.cost_usd(usage))
    }
}
