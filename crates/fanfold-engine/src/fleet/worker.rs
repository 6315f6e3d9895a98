//! The worker's side: take the tasks of any live run's open job, call the
//! model, write each result once.

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fanfold_model::{
    BackendError, CallError, Completion, Job, JobOptions, ModelBackend, Next, Request, SharedRates,
};
use fanfold_store::{FleetJob, JobState, Store, StoreError};

use super::{Allowed, PortableBackend, TaskResult, read_options, read_task};

/// How a worker runs.
#[derive(Clone, Debug)]
pub struct WorkerOptions {
    pub store_path: PathBuf,
    /// Most requests this worker holds at once.
    pub slots: usize,
    /// Only this run's jobs, when set.
    pub run_id: Option<String>,
    /// How long a task this worker holds stays its own unless renewed.
    pub lease_ms: u64,
    /// An HTTP backend's endpoint, in place of the one the spec declares
    /// (one model server per host). The facts stay keyed by the declared
    /// backend, so it must serve the same model.
    pub endpoint: Option<String>,
    /// Endpoints a job may send to (`--allow-endpoint`), besides
    /// `endpoint`; a job naming another is refused.
    pub allow_endpoints: Vec<String>,
    /// Environment variables a job may read its key from
    /// (`--allow-key-env`); a job naming another is refused.
    pub allow_key_envs: Vec<String>,
    /// Model files a job may name (`--allow-model`); a job naming another
    /// is refused before the file is opened.
    pub allow_models: Vec<std::path::PathBuf>,
    /// Stop after this long with no job to take.
    pub idle_exit: Option<Duration>,
    /// Stop when this process is gone (a worker started by a coordinator).
    pub parent_pid: Option<u32>,
}

/// What a worker did, when it stops.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WorkerReport {
    pub worker_id: String,
    /// Results it wrote that stood.
    pub calls: u64,
    /// Results it wrote after another worker's (a lapsed lease): no-ops.
    pub late: u64,
    pub jobs: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("the store failed: {0}")]
    Store(#[from] StoreError),
    /// The folder a job's backend files are written to.
    #[error("a folder for the backends' files in {dir}: {source}")]
    Files { dir: String, source: std::io::Error },
}

/// When nothing is queued: how long until the queue is read again.
const IDLE_POLL: Duration = Duration::from_millis(100);
/// While a job is open and its queue was found empty, how long until it
/// is read again: from 2 ms, doubling to [`TASK_POLL`] while it stays
/// empty; a read that finds tasks is followed at once by the next.
const TASK_POLL: Duration = Duration::from_millis(20);
const TASK_POLL_MIN: Duration = Duration::from_millis(2);
/// A job whose queue stayed empty this long, with nothing in flight, is
/// left for the next (its backend stays built).
const JOB_IDLE: Duration = Duration::from_secs(1);

/// What the heartbeat thread and the serving loop share.
struct Shared<'a> {
    /// Set from outside (SIGTERM): stop now, giving back what is held.
    outer: &'a AtomicBool,
    worker_id: String,
    job: Mutex<Option<String>>,
    /// The current job was closed, cancelled, or its run died.
    gone: AtomicBool,
    stop: AtomicBool,
    calls: AtomicU64,
    late: AtomicU64,
    /// The store failed while a job was served (a server that stayed away
    /// past its reconnect wait): the job ends, and the worker with it.
    store_failed: Mutex<Option<StoreError>>,
    /// When the leases on the tasks held were last renewed.
    renewed: Mutex<Instant>,
    lease: Duration,
}

/// Serves jobs until `stop` is set, the parent process is gone, or no job
/// came for `idle_exit`.
pub fn serve(opts: &WorkerOptions, stop: &AtomicBool) -> Result<WorkerReport, WorkerError> {
    let store = Store::open(&opts.store_path)?;
    store.set_lease_ms(opts.lease_ms);
    let worker_id = format!(
        "{}-{}-{}",
        fanfold_store::this_host(),
        std::process::id(),
        fanfold_store::now_ms()
    );
    store.register_worker(&worker_id, opts.slots, opts.parent_pid)?;
    tracing::info!(worker = %worker_id, store = %store.location(), "worker started");
    let shared = Shared {
        outer: stop,
        worker_id,
        job: Mutex::new(None),
        gone: AtomicBool::new(false),
        stop: AtomicBool::new(false),
        calls: AtomicU64::new(0),
        late: AtomicU64::new(0),
        store_failed: Mutex::new(None),
        renewed: Mutex::new(Instant::now()),
        lease: Duration::from_millis(opts.lease_ms),
    };
    let (stop_beat, beat) = std::sync::mpsc::channel::<()>();
    let served = std::thread::scope(|scope| {
        let (store, shared) = (&store, &shared);
        scope.spawn(move || heartbeat(store, shared, opts, &beat));
        let served = serve_jobs(store, shared, opts);
        shared.stop.store(true, Ordering::Relaxed);
        drop(stop_beat);
        served
    });
    let calls = shared.calls.load(Ordering::Relaxed);
    let stopped = store.worker_stopped(&shared.worker_id, calls);
    // The failure that ended the serving loop is the one to report.
    let jobs = served?;
    stopped?;
    Ok(WorkerReport {
        worker_id: shared.worker_id.clone(),
        calls,
        late: shared.late.load(Ordering::Relaxed),
        jobs,
    })
}

impl Shared<'_> {
    fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed) || self.outer.load(Ordering::Relaxed)
    }
}

fn parent_gone(opts: &WorkerOptions) -> bool {
    opts.parent_pid
        .is_some_and(|pid| std::os::unix::process::parent_id() != pid)
}

/// Renews the leases of the tasks held, records the worker's state, and
/// learns whether its job is gone: a cancellation reaches the worker
/// within one renewal.
fn heartbeat(
    store: &Store,
    shared: &Shared<'_>,
    opts: &WorkerOptions,
    stop: &std::sync::mpsc::Receiver<()>,
) {
    let every = store.renew_every();
    while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = stop.recv_timeout(every) {
        if parent_gone(opts) {
            shared.stop.store(true, Ordering::Relaxed);
        }
        let job = shared.job.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let calls = shared.calls.load(Ordering::Relaxed);
        // Taken before the renewal is asked for: the leases hold at least
        // a lease from this instant.
        let asked = Instant::now();
        let beat = store.worker_heartbeat(
            &shared.worker_id,
            job.as_deref(),
            calls,
            opts.lease_ms,
            opts.lease_ms,
        );
        if beat.is_ok() {
            *shared.renewed.lock().unwrap_or_else(|e| e.into_inner()) = asked;
        }
        match beat {
            Ok(JobState::Gone) => shared.gone.store(true, Ordering::Relaxed),
            Ok(JobState::Open) => {}
            Err(e) => tracing::warn!(error = %e, "worker heartbeat not recorded"),
        }
    }
}

/// Takes job after job; how many it served.
fn serve_jobs(
    store: &Store,
    shared: &Shared<'_>,
    opts: &WorkerOptions,
) -> Result<u64, WorkerError> {
    let files = tempfile_dir()?;
    // The endpoints' per-minute limits, held in the store for every worker.
    let rates: Arc<dyn SharedRates> = Arc::new(StoreRates(Store::open(&opts.store_path)?));
    // Backends by description: a model is loaded once per worker.
    let mut built: HashMap<String, Result<Box<dyn ModelBackend>, String>> = HashMap::new();
    let mut refused: HashSet<String> = HashSet::new();
    // Identities by description, found before anything is written: an
    // endpoint is asked what it serves, or a model file hashed, once.
    let mut identities: HashMap<String, Result<String, String>> = HashMap::new();
    let mut idle_since = Instant::now();
    let mut served = 0;
    let run_filter = opts.run_id.clone().unwrap_or_default();
    while !shared.stopping() {
        let job = store
            .claimable_fleet_jobs(&run_filter, opts.lease_ms)?
            .into_iter()
            .find(|j| !refused.contains(&j.job_id));
        let Some(job) = job else {
            if opts.idle_exit.is_some_and(|d| idle_since.elapsed() >= d) {
                break;
            }
            std::thread::sleep(IDLE_POLL);
            continue;
        };
        // Before anything is written or built: the job's files, the
        // endpoints and keys it would use, and the model it is keyed by.
        let options = match admit(&job, &files, opts, &mut identities) {
            Ok(options) => options,
            Err(why) => {
                tracing::error!(
                    job = %job.job_id, wanted = %job.model_id,
                    "job refused, left for other workers: {why}"
                );
                refuse(store, &job, &shared.worker_id, &why);
                refused.insert(job.job_id.clone());
                continue;
            }
        };
        let backend = built.entry(job.backend.clone()).or_insert_with(|| {
            build(&job, &files, opts, Arc::clone(&rates)).map_err(|e| e.to_string())
        });
        let backend: &dyn ModelBackend = match &*backend {
            Ok(b) => b.as_ref(),
            Err(e) => {
                tracing::error!(job = %job.job_id, error = %e, "job refused: its backend cannot be built here");
                refuse(
                    store,
                    &job,
                    &shared.worker_id,
                    &format!("its backend cannot be built here: {e}"),
                );
                refused.insert(job.job_id.clone());
                continue;
            }
        };
        if let Err(why) = same_model(&job, &backend.info().model_id, opts) {
            tracing::error!(
                job = %job.job_id, wanted = %job.model_id,
                "job refused, left for other workers: {why}"
            );
            refuse(store, &job, &shared.worker_id, &why);
            refused.insert(job.job_id.clone());
            continue;
        }
        *shared.job.lock().unwrap_or_else(|e| e.into_inner()) = Some(job.job_id.clone());
        shared.gone.store(false, Ordering::Relaxed);
        let worker_job = WorkerJob::new(store, shared, &job, options, opts.slots);
        let ran = backend.run(&worker_job);
        worker_job.end();
        *shared.job.lock().unwrap_or_else(|e| e.into_inner()) = None;
        served += 1;
        let failed = shared
            .store_failed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(e) = failed {
            return Err(WorkerError::Store(e));
        }
        if let Err(e) = ran {
            tracing::error!(job = %job.job_id, error = %e, "job given back: the backend stopped");
            refused.insert(job.job_id.clone());
        }
        idle_since = Instant::now();
    }
    Ok(served)
}

/// Records a refusal for the job's coordinator to read; a refusal not
/// recorded is still logged.
fn refuse(store: &Store, job: &FleetJob, worker: &str, why: &str) {
    if let Err(e) = store.refuse_fleet_job(&job.job_id, worker, why) {
        tracing::warn!(job = %job.job_id, error = %e, "a refusal not recorded");
    }
}

/// Whether this worker takes `job`, decided before anything is written,
/// and the job's options if it does: they decode, the files it carries have plain names, its endpoints and key
/// variables are ones this worker was started with, and the backend it
/// describes, here, is the model its facts are keyed by.
fn admit(
    job: &FleetJob,
    files: &tempfile::TempDir,
    opts: &WorkerOptions,
    identities: &mut HashMap<String, Result<String, String>>,
) -> Result<JobOptions, String> {
    let options = read_options(&job.job_id, &job.options)?;
    let portable: PortableBackend = serde_json::from_str(&job.backend)
        .map_err(|e| format!("the job's backend does not read: {e}"))?;
    portable.check_files()?;
    let allowed = Allowed {
        endpoints: opts.allow_endpoints.clone(),
        key_envs: opts.allow_key_envs.clone(),
        own: opts.endpoint.clone(),
        models: opts.allow_models.clone(),
    };
    portable.check_allowed(&allowed)?;
    let here = identities.entry(job.backend.clone()).or_insert_with(|| {
        portable
            .identity_here(&backend_dir(files, job), opts.endpoint.as_deref())
            .map_err(|e| format!("its backend cannot be named here: {e}"))
    });
    same_model(job, here.as_deref().map_err(Clone::clone)?, opts)?;
    Ok(options)
}

/// The folder a job's backend files go in, one per description.
fn backend_dir(files: &tempfile::TempDir, job: &FleetJob) -> PathBuf {
    files
        .path()
        .join(blake3::hash(job.backend.as_bytes()).to_hex().as_str())
}

/// Whether a backend whose identity here is `here` makes the facts `job`
/// is keyed by. On the declared endpoint its identity must be the job's.
/// On the worker's own `--endpoint` the host differs by design, so that
/// endpoint is asked what it serves ([`PortableBackend::serves_as`]): a
/// job keyed by named weights is refused where they are not named alike.
fn same_model(job: &FleetJob, here: &str, opts: &WorkerOptions) -> Result<(), String> {
    let portable = serde_json::from_str::<PortableBackend>(&job.backend)
        .map_err(|e| format!("the job's backend does not read: {e}"))?;
    match &opts.endpoint {
        Some(url) if portable.takes_endpoint() => portable
            .serves_as(&job.model_id, here)
            .map_err(|why| format!("endpoint {url}: {why}")),
        _ if here == job.model_id => Ok(()),
        _ => Err(format!(
            "this worker's model is `{here}`, the job's facts are keyed by `{}`",
            job.model_id
        )),
    }
}

/// Whether `e` says the store's server is gone: a PostgreSQL connection
/// that could not be opened again within the store's reconnect wait.
fn is_unreachable(e: &StoreError) -> bool {
    matches!(e, StoreError::Db { source, .. } if source.is_lost_connection())
}

/// A folder for the files a job's backend names, removed at exit.
fn tempfile_dir() -> Result<tempfile::TempDir, WorkerError> {
    tempfile::Builder::new()
        .prefix("fanfold-worker-")
        .tempdir()
        .map_err(|source| WorkerError::Files {
            dir: std::env::temp_dir().display().to_string(),
            source,
        })
}

/// The store's `fleet_rates`, as the limits an HTTP backend shares.
struct StoreRates(Store);

impl SharedRates for StoreRates {
    fn take(
        &self,
        endpoint: &str,
        rpm: Option<u64>,
        tpm: Option<u64>,
        tokens: u64,
    ) -> Result<Option<Duration>, fanfold_model::LedgerError> {
        Ok(self.0.take_rate(endpoint, rpm, tpm, tokens)?)
    }

    fn settle(&self, endpoint: &str, tpm: Option<u64>, reserved: u64, used: u64) {
        if let Err(e) = self.0.settle_rate(endpoint, tpm, reserved, used) {
            tracing::warn!(error = %e, "shared token count not corrected");
        }
    }
}

fn build(
    job: &FleetJob,
    files: &tempfile::TempDir,
    opts: &WorkerOptions,
    rates: Arc<dyn SharedRates>,
) -> Result<Box<dyn ModelBackend>, BackendError> {
    let portable: PortableBackend = serde_json::from_str(&job.backend)
        .map_err(|e| BackendError::Setup(format!("the job's backend does not read: {e}")))?;
    // Each backend's files in a folder of their own.
    let dir = backend_dir(files, job);
    std::fs::create_dir_all(&dir)
        .map_err(|e| BackendError::Setup(format!("creating {}: {e}", dir.display())))?;
    portable.build(&dir, opts.endpoint.as_deref(), Some(rates))
}

/// One job as this worker's backend sees it: the tasks it claims.
struct WorkerJob<'a> {
    store: &'a Store,
    shared: &'a Shared<'a>,
    job: &'a FleetJob,
    options: JobOptions,
    slots: usize,
    state: Mutex<Local>,
}

struct Local {
    claimed: VecDeque<(u64, Request)>,
    /// When the tasks in `claimed` were claimed.
    claimed_at: Instant,
    /// Tasks handed to the backend and not yet answered: their calls may
    /// have been sent.
    sent: HashSet<u64>,
    in_flight: usize,
    /// When the queue may be read again, after a read that found it empty.
    next_read: Option<Instant>,
    /// The wait after the next empty read.
    backoff: Duration,
    /// When the queue was last found empty with nothing in flight.
    empty_since: Option<Instant>,
}

impl<'a> WorkerJob<'a> {
    fn new(
        store: &'a Store,
        shared: &'a Shared<'a>,
        job: &'a FleetJob,
        options: JobOptions,
        slots: usize,
    ) -> Self {
        WorkerJob {
            store,
            shared,
            job,
            options,
            slots: slots.max(1),
            state: Mutex::new(Local {
                claimed: VecDeque::new(),
                claimed_at: Instant::now(),
                sent: HashSet::new(),
                in_flight: 0,
                next_read: None,
                backoff: TASK_POLL_MIN,
                empty_since: None,
            }),
        }
    }

    fn stopping(&self) -> bool {
        self.shared.gone.load(Ordering::Relaxed) || self.shared.stopping()
    }

    /// Whether the tasks claimed at `claimed_at` are surely still this
    /// worker's: claimed or renewed within three quarters of a lease. A
    /// worker paused past its lease finds them stale when it resumes,
    /// and sends none of them: the coordinator may have asked for them
    /// again by then.
    fn fresh(&self, claimed_at: Instant) -> bool {
        let renewed = *self
            .shared
            .renewed
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        renewed.max(claimed_at).elapsed() < self.shared.lease * 3 / 4
    }

    /// Ends the worker's part in the job once its backend returned: a
    /// call handed out and never answered (a backend that returned early)
    /// is answered with an error, since it may have been sent, and the
    /// tasks claimed and never handed out go back unsent.
    fn end(&self) {
        let (sent, unsent) = {
            let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
            let sent: Vec<u64> = s.sent.drain().collect();
            let unsent: Vec<u64> = s.claimed.drain(..).map(|(seq, _)| seq).collect();
            (sent, unsent)
        };
        for seq in sent {
            self.write(seq, &Err(lost_in_flight()));
        }
        self.give_back(&unsent);
    }

    fn give_back(&self, seqs: &[u64]) {
        if let Err(e) =
            self.store
                .give_back_fleet_tasks(&self.job.job_id, &self.shared.worker_id, seqs)
        {
            tracing::warn!(error = %e, "tasks not given back; their leases will lapse");
        }
    }
}

/// The answer to a call this worker handed out and lost (it stopped, or
/// the call was cancelled after it may have been sent): an error, so the
/// coordinator asks again under a new reservation rather than a worker
/// sending it again unpaid.
fn lost_in_flight() -> CallError {
    CallError::Backend("the worker stopped with this call in flight; it is asked again".into())
}

impl Job for WorkerJob<'_> {
    fn prefix(&self) -> &str {
        &self.job.prefix
    }

    fn slots(&self) -> usize {
        self.slots
    }

    fn next(&self) -> Option<Request> {
        loop {
            match self.poll_next() {
                Next::Request(r) => return Some(r),
                Next::Done => return None,
                Next::Later(d) => std::thread::sleep(d.min(TASK_POLL)),
            }
        }
    }

    fn poll_next(&self) -> Next {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if self.stopping() {
            return Next::Done;
        }
        if s.in_flight >= self.slots {
            return Next::Later(TASK_POLL);
        }
        if s.claimed.is_empty() {
            let now = Instant::now();
            if let Some(t) = s.next_read.filter(|t| *t > now) {
                return Next::Later(t - now);
            }
            // Only as many as free slots: the rest stay for other workers.
            let want = self.slots - s.in_flight;
            match self.store.claim_fleet_tasks(
                &self.job.job_id,
                &self.shared.worker_id,
                want,
                self.store.lease_ms(),
            ) {
                Ok(tasks) => {
                    if tasks.is_empty() {
                        s.next_read = Some(now + s.backoff);
                        s.backoff = (s.backoff * 2).min(TASK_POLL);
                    } else {
                        s.next_read = None;
                        s.backoff = TASK_POLL_MIN;
                    }
                    if !tasks.is_empty() {
                        s.claimed_at = now;
                    }
                    for t in tasks {
                        match read_task(&self.job.job_id, &t.request, t.seq) {
                            Ok(r) => s.claimed.push_back((t.seq, r)),
                            Err(e) => {
                                tracing::error!("{e}");
                                let err: TaskResult = Err(CallError::InvalidResponse(e));
                                self.write(t.seq, &err);
                            }
                        }
                    }
                }
                Err(e) if is_unreachable(&e) => {
                    // The server stayed away for the store's whole
                    // reconnect wait: the job ends here (its calls in
                    // flight are cancelled; their tasks stay in the store
                    // for a worker that can reach it), and the worker
                    // stops with the store's error.
                    tracing::error!(error = %e, "tasks not claimed: the store failed");
                    *self
                        .shared
                        .store_failed
                        .lock()
                        .unwrap_or_else(|e| e.into_inner()) = Some(e);
                    self.shared.gone.store(true, Ordering::Relaxed);
                    return Next::Done;
                }
                Err(e) => {
                    // A store held by another writer: read again shortly.
                    tracing::warn!(error = %e, "tasks not claimed");
                    s.next_read = Some(now + TASK_POLL);
                }
            }
        }
        if !s.claimed.is_empty() && !self.fresh(s.claimed_at) {
            // Paused (or starved) past the lease: none of these is sent.
            let stale: Vec<u64> = s.claimed.drain(..).map(|(seq, _)| seq).collect();
            tracing::warn!(
                tasks = stale.len(),
                "claimed tasks left unsent: their lease may have lapsed"
            );
            drop(s);
            self.give_back(&stale);
            return Next::Later(TASK_POLL_MIN);
        }
        let Some((seq, task)) = s.claimed.pop_front() else {
            if s.in_flight > 0 {
                let now = Instant::now();
                return Next::Later(
                    s.next_read
                        .map_or(TASK_POLL_MIN, |t| t.saturating_duration_since(now)),
                );
            }
            let since = *s.empty_since.get_or_insert_with(Instant::now);
            return if since.elapsed() >= JOB_IDLE {
                Next::Done
            } else {
                Next::Later(TASK_POLL)
            };
        };
        s.empty_since = None;
        s.in_flight += 1;
        s.sent.insert(seq);
        Next::Request(task)
    }

    fn complete(&self, request: Request, result: Result<Completion, CallError>) {
        let seq = request.index as u64;
        {
            let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
            s.in_flight = s.in_flight.saturating_sub(1);
            s.sent.remove(&seq);
        }
        if matches!(result, Err(CallError::Cancelled)) {
            // Cancelled once handed out, perhaps after it was sent: the
            // coordinator asks again, and pays again, or its job is gone
            // and this changes nothing.
            self.write(seq, &Err(lost_in_flight()));
            return;
        }
        self.write(seq, &result);
    }

    /// Also while the leases were last renewed three quarters of a lease
    /// ago or more (a worker paused, or cut off from the store): the
    /// coordinator may have asked for its calls again, so none is retried
    /// or sent from here until a renewal comes.
    fn is_cancelled(&self) -> bool {
        self.stopping() || !self.fresh(Instant::now() - self.shared.lease)
    }

    fn options(&self) -> &JobOptions {
        &self.options
    }
}

impl WorkerJob<'_> {
    fn write(&self, seq: u64, result: &TaskResult) {
        let text = match serde_json::to_string(result) {
            Ok(t) => t,
            Err(e) => {
                tracing::error!(error = %e, "a result could not be written as JSON");
                return;
            }
        };
        match self
            .store
            .finish_fleet_task(&self.job.job_id, seq, &self.shared.worker_id, &text)
        {
            Ok(true) => {
                self.shared.calls.fetch_add(1, Ordering::Relaxed);
            }
            Ok(false) => {
                self.shared.late.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => tracing::warn!(error = %e, seq, "a result not written; its lease will lapse"),
        }
    }
}
