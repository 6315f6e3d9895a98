//! `fanfold._native`: the engine the `fanfold` command runs, called from
//! Python. Thin on purpose: the options become the engine's `RunOptions`
//! as the CLI builds them, the run goes on a thread of its own while the
//! interpreter is free, and errors become Python exceptions by the engine's
//! exit category. What a run wrote (answer.json, facts.jsonl,
//! certificate.json) is read by the Python half from the output folder.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

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
}

/// How long one jq evaluation may run and hold, as the CLI's defaults.
const JQ_TIMEOUT_SECS: u64 = 10;
const JQ_MEMORY_BYTES: u64 = 1024 << 20;

/// Plans and runs `request` as `fanfold run` does, and says what came of
/// it as JSON for the Python half.
fn execute(request: &Request) -> Result<serde_json::Value, Failure> {
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
    let report = fanfold_engine::run(&plan, &opts, &fanfold_engine::NoProgress)
        .map_err(|e| Failure::from_run(&e))?;
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

/// How often the waiting interpreter looks for a signal (Ctrl-C).
const SIGNAL_POLL: Duration = Duration::from_millis(100);

/// Runs a spec as `fanfold run SPEC` does and returns, as JSON, where its
/// outputs went and whether its answer is complete and verified. The
/// interpreter is released while the engine runs; Ctrl-C raises
/// `KeyboardInterrupt` at once. The engine has no way to be stopped from
/// outside yet, so the run goes on to its end on its own thread: every
/// fact it stores is kept, and a rerun pays only for what is missing.
#[pyfunction]
#[pyo3(signature = (spec, *, store, out=None, input=None, backend=None, slots=4, max_model_calls=None))]
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
) -> PyResult<String> {
    let request = Request {
        spec,
        input,
        store,
        out,
        backend,
        slots,
        max_model_calls,
    };
    let (done, finished) = mpsc::channel();
    std::thread::Builder::new()
        .name("fanfold-run".into())
        .spawn(move || {
            // The receiver is gone only when Python stopped waiting.
            let _ = done.send(execute(&request));
        })
        .map_err(|e| FanfoldError::new_err(format!("starting the run's thread: {e}")))?;
    // Only this thread receives; the lock lets the wait leave the GIL.
    let finished = std::sync::Mutex::new(finished);
    loop {
        let waited = py.detach(|| match finished.lock() {
            Ok(rx) => rx.recv_timeout(SIGNAL_POLL),
            Err(_) => Err(mpsc::RecvTimeoutError::Disconnected),
        });
        match waited {
            Ok(Ok(summary)) => return Ok(summary.to_string()),
            Ok(Err(failure)) => return Err(failure.into_py(py)),
            Err(mpsc::RecvTimeoutError::Timeout) => py.check_signals()?,
            Err(mpsc::RecvTimeoutError::Disconnected) => {
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

/// The native half of the `fanfold` package.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_function(wrap_pyfunction!(run, m)?)?;
    m.add_function(wrap_pyfunction!(draft, m)?)?;
    m.add_function(wrap_pyfunction!(free_folder, m)?)?;
    m.add_function(wrap_pyfunction!(report_html, m)?)?;
    m.add("FanfoldError", py.get_type::<FanfoldError>())?;
    m.add("SpecError", py.get_type::<SpecError>())?;
    m.add("InputError", py.get_type::<InputError>())?;
    m.add("StoreError", py.get_type::<StoreError>())?;
    m.add("BackendError", py.get_type::<BackendError>())?;
    m.add("IncompleteAnswer", py.get_type::<IncompleteAnswer>())?;
    m.add("EXIT_INCOMPLETE", fanfold_engine::EXIT_INCOMPLETE)?;
    Ok(())
}
