//! `fanfold._native`: the engine the `fanfold` command runs, called from
//! Python. Thin on purpose: the options become the engine's `RunOptions`
//! as the CLI builds them, the run goes on a thread of its own while the
//! interpreter is free (the GIL released), and errors become Python
//! exceptions by the engine's exit category. The waiting thread hands the
//! engine's progress events to a Python callback and, on Ctrl-C, tells
//! the engine to stop and waits for it. What a run wrote (answer.json,
//! facts.jsonl, certificate.json) is read by the Python half from the
//! output folder.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

mod table;

use pyo3::exceptions::PyException;
use pyo3::prelude::*;

/// Counts what each jq evaluation holds, so one cannot fill memory (as in
/// the CLI: the memory limit below needs it).
#[global_allocator]
static ALLOC: fanfold_ops::jq::MeteredAlloc = fanfold_ops::jq::MeteredAlloc;

pyo3::create_exception!(
    _native,
    FanfoldError,
    PyException,
    "A fanfold run failed. `exit_code` is what `fanfold run` would exit with, `category` the engine's name for the kind of failure."
);
pyo3::create_exception!(
    _native,
    SpecError,
    FanfoldError,
    "The spec cannot become a plan (exit code 2)."
);
pyo3::create_exception!(
    _native,
    InputError,
    FanfoldError,
    "The input, or a jq expression of the spec applied to it, is at fault (exit code 5)."
);
pyo3::create_exception!(
    _native,
    StoreError,
    FanfoldError,
    "The store failed; the facts it holds are kept, and a rerun pays only for the rest (exit code 2)."
);
pyo3::create_exception!(
    _native,
    BackendError,
    FanfoldError,
    "A backend or model could not be set up (exit code 6)."
);
pyo3::create_exception!(
    _native,
    IncompleteAnswer,
    FanfoldError,
    "The answer is incomplete (exit code 3); raised only when asked for with `strict=True`."
);

/// Which exception a failure raises.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Spec,
    Input,
    Store,
    Backend,
    Other,
}

/// A failure as it crosses into Python: plain data, so it can leave the
/// engine's thread.
#[derive(Debug)]
struct Failure {
    kind: Kind,
    message: String,
    /// The engine's category, in words.
    category: &'static str,
    /// What `fanfold` would exit with.
    exit_code: u8,
}

impl Failure {
    fn from_plan(e: &fanfold_engine::PlanError) -> Failure {
        Failure {
            kind: Kind::Spec,
            message: fanfold_draft::describe(e),
            category: "spec",
            exit_code: fanfold_engine::error::EXIT_FAILED,
        }
    }

    fn from_run(e: &fanfold_engine::RunError) -> Failure {
        use fanfold_engine::ErrorCategory;
        let category = e.category();
        let (kind, name) = match category {
            ErrorCategory::Input => (Kind::Input, "input"),
            ErrorCategory::Configuration => (Kind::Backend, "configuration"),
            ErrorCategory::Spec => (Kind::Spec, "spec"),
            ErrorCategory::Execution if e.is_store_failure() => (Kind::Store, "execution"),
            ErrorCategory::Execution => (Kind::Other, "execution"),
            ErrorCategory::Interrupted => (Kind::Other, "interrupted"),
        };
        Failure {
            kind,
            message: fanfold_draft::describe(e),
            category: name,
            exit_code: category.exit_code(),
        }
    }

    fn from_draft(e: &fanfold_draft::DraftError) -> Failure {
        // Reading the input is the input's failure; writing the spec
        // folder is not.
        let kind = match e {
            fanfold_draft::DraftError::Io {
                action: "creating" | "writing",
                ..
            } => Kind::Other,
            _ => Kind::Input,
        };
        Failure {
            kind,
            message: fanfold_draft::describe(e),
            category: "input",
            exit_code: fanfold_engine::error::EXIT_FAILED,
        }
    }

    fn other(message: String) -> Failure {
        Failure {
            kind: Kind::Other,
            message,
            category: "execution",
            exit_code: fanfold_engine::error::EXIT_FAILED,
        }
    }

    fn into_py(self, py: Python<'_>) -> PyErr {
        let err = match self.kind {
            Kind::Spec => SpecError::new_err(self.message),
            Kind::Input => InputError::new_err(self.message),
            Kind::Store => StoreError::new_err(self.message),
            Kind::Backend => BackendError::new_err(self.message),
            Kind::Other => FanfoldError::new_err(self.message),
        };
        let value = err.value(py);
        if let Err(e) = value
            .setattr("category", self.category)
            .and_then(|()| value.setattr("exit_code", self.exit_code))
        {
            return e;
        }
        err
    }
}

/// What one run is asked to do: the CLI's `run` arguments that the
/// Python API takes.
struct Request {
    spec: PathBuf,
    input: Option<PathBuf>,
    store: PathBuf,
    out: Option<PathBuf>,
    backend: Option<String>,
    slots: usize,
    max_model_calls: Option<u64>,
    /// Set when Python was interrupted: the engine stops as a spent wall
    /// budget stops it.
    interrupt: Arc<AtomicBool>,
}

/// One progress event of the engine, as the Python callback receives it
/// (a tuple whose first item names the event).
#[derive(Debug)]
enum Event {
    StageStarted {
        stage: String,
        units: u64,
        cached: u64,
    },
    ModelCalls(u64),
    UnitFinished {
        stage: String,
        status: &'static str,
    },
    StageFinished(String),
}

/// The engine's progress, queued by its threads and handed to Python by
/// the waiting thread, so no engine thread ever waits on the GIL.
#[derive(Default)]
struct Events(Mutex<Vec<Event>>);

impl Events {
    fn push(&self, event: Event) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(event);
    }

    fn take(&self) -> Vec<Event> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl fanfold_engine::Progress for Events {
    fn stage_started(&self, stage: &str, units: u64, cached: u64) {
        self.push(Event::StageStarted {
            stage: stage.to_owned(),
            units,
            cached,
        });
    }
    fn model_calls(&self, calls: u64) {
        self.push(Event::ModelCalls(calls));
    }
    fn unit_finished(&self, stage: &str, status: fanfold_core::Status) {
        self.push(Event::UnitFinished {
            stage: stage.to_owned(),
            status: status.as_str(),
        });
    }
    fn stage_finished(&self, stage: &str) {
        self.push(Event::StageFinished(stage.to_owned()));
    }
}

/// Hands `events` to `callback`, one call each, in order.
fn deliver(callback: &Bound<'_, PyAny>, events: Vec<Event>) -> PyResult<()> {
    for event in events {
        match event {
            Event::StageStarted {
                stage,
                units,
                cached,
            } => callback.call1(("stage_started", stage, units, cached))?,
            Event::ModelCalls(calls) => callback.call1(("model_calls", calls))?,
            Event::UnitFinished { stage, status } => {
                callback.call1(("unit_finished", stage, status))?
            }
            Event::StageFinished(stage) => callback.call1(("stage_finished", stage))?,
        };
    }
    Ok(())
}

/// How long one jq evaluation may run and hold, as the CLI's defaults.
const JQ_TIMEOUT_SECS: u64 = 10;
const JQ_MEMORY_BYTES: u64 = 1024 << 20;

/// Plans and runs `request` as `fanfold run` does, and says what came of
/// it as JSON for the Python half.
fn execute(request: &Request, events: &Events) -> Result<serde_json::Value, Failure> {
    let overrides = fanfold_engine::Overrides {
        backend: request.backend.clone(),
        ..fanfold_engine::Overrides::default()
    };
    let plan = fanfold_engine::Plan::load_with(&request.spec, &overrides)
        .map_err(|e| Failure::from_plan(&e))?;
    let limit = plan
        .spec
        .budget
        .max_wall_secs
        .map_or(JQ_TIMEOUT_SECS, |wall| wall.clamp(1, JQ_TIMEOUT_SECS));
    fanfold_ops::jq::set_time_limit(Duration::from_secs(limit));
    fanfold_ops::jq::set_memory_limit(JQ_MEMORY_BYTES);
    let mut opts = fanfold_engine::RunOptions::new(request.store.clone());
    opts.source = request.input.clone().map(fanfold_engine::Source::File);
    opts.slots = request.slots.max(1);
    opts.interrupt = Some(Arc::clone(&request.interrupt));
    if let Some(calls) = request.max_model_calls {
        let mut budget = plan.spec.budget.clone();
        budget.max_model_calls = Some(calls);
        opts.budget = Some(budget);
    }
    let out = request
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from(".fanfold/runs").join(&plan.spec.name));
    opts.out_dir = Some(out.clone());
    let report = fanfold_engine::run(&plan, &opts, events).map_err(|e| Failure::from_run(&e))?;
    let proven = fanfold_engine::output::proven_quality(&report);
    let quality: Vec<String> = proven
        .iter()
        .map(|p| {
            let head = if p.proven {
                "proven quality"
            } else {
                "quality"
            };
            format!("{head}: {}", p.quality)
        })
        .collect();
    Ok(serde_json::json!({
        "out": out.display().to_string(),
        "complete": report.answer.complete,
        "incomplete": report.answer.incomplete,
        "verified": report.certificate.verify.passed,
        "simulated": report.answer.simulated,
        "quality": quality,
        "exit_code": report.exit_code(),
        "markdown": fanfold_engine::output::markdown(&report),
    }))
}

/// How often the waiting interpreter looks for a signal (Ctrl-C) and
/// hands on progress.
const SIGNAL_POLL: Duration = Duration::from_millis(100);

/// Runs a spec as `fanfold run SPEC` does and returns, as JSON, where its
/// outputs went and whether its answer is complete and verified. The GIL
/// is released while the engine runs, on a thread of its own; this
/// thread wakes every 100 ms to hand `progress` the engine's events and
/// to look for a signal. On Ctrl-C the engine is told to stop (no call is
/// sent after it, calls in flight are cancelled), this thread waits for it
/// to store what it decided and write its outputs, and then raises
/// `KeyboardInterrupt`: every fact stored is kept, and a rerun pays only
/// for what is missing. A second Ctrl-C does not stop the waiting: a run
/// left behind would go on writing its output folder after the call
/// returned. The `fanfold` package runs this in a process of its own,
/// which a second Ctrl-C ends as a kill does.
#[pyfunction]
#[pyo3(signature = (spec, *, store, out=None, input=None, backend=None, slots=4, max_model_calls=None, progress=None))]
#[allow(clippy::too_many_arguments)]
fn run(
    py: Python<'_>,
    spec: PathBuf,
    store: PathBuf,
    out: Option<PathBuf>,
    input: Option<PathBuf>,
    backend: Option<String>,
    slots: usize,
    max_model_calls: Option<u64>,
    progress: Option<Py<PyAny>>,
) -> PyResult<String> {
    let interrupt = Arc::new(AtomicBool::new(false));
    let request = Request {
        spec,
        input,
        store,
        out,
        backend,
        slots,
        max_model_calls,
        interrupt: Arc::clone(&interrupt),
    };
    let events = Arc::new(Events::default());
    let engine_events = Arc::clone(&events);
    let (done, finished) = mpsc::channel();
    std::thread::Builder::new()
        .name("fanfold-run".into())
        .spawn(move || {
            // The receiver is gone only when Python stopped waiting.
            let _ = done.send(execute(&request, &engine_events));
        })
        .map_err(|e| FanfoldError::new_err(format!("starting the run's thread: {e}")))?;
    // Only this thread receives; the lock lets the wait leave the GIL.
    let finished = Mutex::new(finished);
    // The error to raise once the engine has stopped: a signal, or the
    // progress callback's own exception.
    let mut interrupted: Option<PyErr> = None;
    loop {
        let waited = py.detach(|| match finished.lock() {
            Ok(rx) => rx.recv_timeout(SIGNAL_POLL),
            Err(_) => Err(mpsc::RecvTimeoutError::Disconnected),
        });
        if let Some(callback) = &progress
            && interrupted.is_none()
            && let Err(e) = deliver(callback.bind(py), events.take())
        {
            interrupt.store(true, Ordering::Relaxed);
            interrupted = Some(e);
        }
        match waited {
            Ok(result) => {
                if let Some(signal) = interrupted {
                    return Err(signal);
                }
                return match result {
                    Ok(summary) => Ok(summary.to_string()),
                    Err(failure) => Err(failure.into_py(py)),
                };
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                // Interrupted again while the engine winds down: it is
                // already told to stop, and is waited for still, so nothing
                // writes the output folder once this call has returned.
                if let Err(signal) = py.check_signals()
                    && interrupted.is_none()
                {
                    interrupt.store(true, Ordering::Relaxed);
                    interrupted = Some(signal);
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                if let Some(signal) = interrupted {
                    return Err(signal);
                }
                return Err(
                    Failure::other("the run's thread ended without an answer".into()).into_py(py),
                );
            }
        }
    }
}

/// Drafts a spec folder in `dir` for `question` over `input`, as
/// `fanfold ask` does before it runs, and returns as JSON the spec's path,
/// why the input was read as it was, and what the first rung keeps.
#[pyfunction]
#[pyo3(signature = (dir, question, input, store))]
fn draft(
    py: Python<'_>,
    dir: PathBuf,
    question: String,
    input: PathBuf,
    store: PathBuf,
) -> PyResult<String> {
    let written = py
        .detach(|| fanfold_draft::write(&dir, &question, &input, Some(&store)))
        .map_err(|e| Failure::from_draft(&e).into_py(py))?;
    Ok(serde_json::json!({
        "spec": written.spec.display().to_string(),
        "reason": written.reason,
        "rung": written.rung,
        "to_model": written.to_model,
    })
    .to_string())
}

/// The first folder `BASE/NAME` (NAME from the question, numbered past
/// those holding a spec) that `fanfold ask` would write into.
#[pyfunction]
fn free_folder(py: Python<'_>, base: PathBuf, question: &str) -> PyResult<String> {
    fanfold_draft::free_folder(&base, question)
        .map(|p| p.display().to_string())
        .map_err(|e| Failure::from_draft(&e).into_py(py))
}

/// The HTML page `fanfold report run` writes for the run in `out`.
#[pyfunction]
fn report_html(py: Python<'_>, out: PathBuf) -> PyResult<String> {
    let page = py.detach(|| html_of(&out));
    page.map_err(|message| Failure::other(message).into_py(py))
}

fn html_of(out: &Path) -> Result<String, String> {
    let read = fanfold_bench::page::RunOutput::read(out).map_err(|e| format!("{e:#}"))?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    Ok(fanfold_bench::page::run_page(&read, cores).1)
}

/// Makes a runaway jq evaluation (past its time or memory limit) end this
/// process with exit status 5 (bad input, as `fanfold run` exits) and one
/// line on stderr, `fanfold-runaway: ` and what ran away. jaq cannot be
/// stopped inside a process, so the `fanfold` package calls this in the
/// process it runs the engine in, never in the interpreter it serves,
/// and raises `InputError` with that line when the process ends so. The
/// store is left as a kill leaves it: consistent, and a rerun resumes.
#[pyfunction]
fn end_process_on_runaway() {
    fanfold_ops::jq::on_runaway(|r| {
        use std::io::Write as _;
        // Inside an allocation, perhaps: write and end, never panic.
        let _ = writeln!(std::io::stderr(), "{RUNAWAY_MARK}{r}");
        std::process::exit(i32::from(fanfold_engine::error::EXIT_INPUT));
    });
}

/// What starts the line a runaway writes before its process ends.
const RUNAWAY_MARK: &str = "fanfold-runaway: ";

/// The native half of the `fanfold` package.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_function(wrap_pyfunction!(run, m)?)?;
    m.add_function(wrap_pyfunction!(draft, m)?)?;
    m.add_function(wrap_pyfunction!(free_folder, m)?)?;
    m.add_function(wrap_pyfunction!(report_html, m)?)?;
    m.add_function(wrap_pyfunction!(end_process_on_runaway, m)?)?;
    m.add_function(wrap_pyfunction!(table::table_jsonl, m)?)?;
    m.add("RUNAWAY_MARK", RUNAWAY_MARK)?;
    m.add("EXIT_INTERRUPTED", fanfold_engine::EXIT_INTERRUPTED)?;
    m.add("FanfoldError", py.get_type::<FanfoldError>())?;
    m.add("SpecError", py.get_type::<SpecError>())?;
    m.add("InputError", py.get_type::<InputError>())?;
    m.add("StoreError", py.get_type::<StoreError>())?;
    m.add("BackendError", py.get_type::<BackendError>())?;
    m.add("IncompleteAnswer", py.get_type::<IncompleteAnswer>())?;
    m.add("EXIT_INCOMPLETE", fanfold_engine::EXIT_INCOMPLETE)?;
    Ok(())
}
