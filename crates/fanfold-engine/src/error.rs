//! The engine's error: what stopped a run, with the place at fault.

use fanfold_ops::partition::PartitionError;
use fanfold_store::StoreError;

use fanfold_ops::embed::EmbedSpecError;
use fanfold_ops::map::MapSpecError;
use fanfold_ops::prefilter::PrefilterError;

use crate::source::SourceError;

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error("{origin}: {source}")]
    Partition {
        origin: String,
        source: PartitionError,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Prefilter(#[from] fanfold_ops::prefilter::PrefilterError),
    #[error("backend `{name}`: {source}")]
    Backend {
        name: String,
        source: fanfold_model::BackendError,
    },
    #[error(
        "the spec names no input: give --input FILE, --input - (stdin) or --input-command, or set input.path"
    )]
    NoInput,
    #[error("stage `{stage}` project on unit {unit}: {detail}")]
    Project {
        stage: String,
        unit: String,
        detail: String,
    },
    #[error("stage `{stage}`: {source}")]
    Embed {
        stage: String,
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
    #[error("select `{stage}` on unit {unit}: {source}")]
    SelectRule {
        stage: String,
        unit: String,
        source: fanfold_ops::jq::JqError,
    },
    #[error("widen `{stage}` on unit {unit}: {detail}")]
    Group {
        stage: String,
        unit: String,
        detail: String,
    },
    #[error("contract bound on unit {unit}: {detail}")]
    Bound { unit: String, detail: String },
    #[error("stage `{stage}` cascade, unit {unit}: {detail}")]
    Cascade {
        stage: String,
        unit: String,
        detail: String,
    },
    #[error("the stored source {hash} is missing chunk {seq}; the store is damaged")]
    MissingChunk { hash: String, seq: usize },
    #[error("no unit at position {index} of the run's unit table")]
    NoUnit { index: usize },
    #[error("writing {path}: {source}")]
    Output {
        path: String,
        source: std::io::Error,
    },
    /// A spec mistake that shows once the input is read, before any stage
    /// runs (a field no unit has).
    #[error("spec {path}: {detail}")]
    Spec { path: String, detail: String },
    /// Stopped from outside (Ctrl-C) before any stage ran, while the input
    /// was stored or routed: what was written is kept, and a rerun goes on
    /// from it.
    #[error("interrupted while {phase}; what was stored is kept, and a rerun resumes from it")]
    Interrupted { phase: &'static str },
}

impl RunError {
    /// What kind of failure this is, for the exit code and for scripts:
    /// the user's input or configuration, or the run itself.
    pub fn category(&self) -> ErrorCategory {
        match self {
            RunError::Source(_)
            | RunError::Partition { .. }
            | RunError::Prefilter(_)
            | RunError::NoInput
            | RunError::Project { .. }
            | RunError::SelectRule { .. }
            | RunError::Group { .. }
            | RunError::Bound { .. }
            | RunError::Cascade { .. } => ErrorCategory::Input,
            // A fleet's queue is the store: its failure is the store's.
            RunError::Backend {
                source: fanfold_model::BackendError::Store(_),
                ..
            } => ErrorCategory::Execution,
            RunError::Backend { .. } | RunError::Embed { .. } => ErrorCategory::Configuration,
            RunError::Spec { .. } => ErrorCategory::Spec,
            RunError::Store(_)
            | RunError::MissingChunk { .. }
            | RunError::NoUnit { .. }
            | RunError::Output { .. } => ErrorCategory::Execution,
            RunError::Interrupted { .. } => ErrorCategory::Interrupted,
        }
    }

    /// Whether the store failed (a server that stayed away, a full disk):
    /// the facts it holds are kept, and a rerun once it answers pays only
    /// for the units without one.
    pub fn is_store_failure(&self) -> bool {
        matches!(
            self,
            RunError::Store(_)
                | RunError::Backend {
                    source: fanfold_model::BackendError::Store(_),
                    ..
                }
        )
    }
}

impl ErrorCategory {
    /// The exit code `fanfold run` ends with for a failure of this kind.
    pub fn exit_code(self) -> u8 {
        match self {
            ErrorCategory::Input => EXIT_INPUT,
            ErrorCategory::Configuration => EXIT_CONFIGURATION,
            ErrorCategory::Execution | ErrorCategory::Spec => EXIT_FAILED,
            ErrorCategory::Interrupted => EXIT_INTERRUPTED,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorCategory {
    /// The input or the spec's expressions are at fault.
    Input,
    /// A backend or model could not be set up.
    Configuration,
    /// The store or the output folder failed.
    Execution,
    /// The spec is at fault, as a plan it cannot become is (exit 2), found
    /// once the input was read.
    Spec,
    /// Stopped from outside (Ctrl-C), not a failure of anything.
    Interrupted,
}

/// `fanfold run` exits with this when the input or a jq expression is at
/// fault.
pub const EXIT_INPUT: u8 = 5;
/// `fanfold run` exits with this when a backend or model could not be set
/// up.
pub const EXIT_CONFIGURATION: u8 = 6;
/// `fanfold run` exits with this for any other failure (store, outputs).
pub const EXIT_FAILED: u8 = 2;
/// `fanfold run` exits with this when the answer is incomplete.
pub const EXIT_INCOMPLETE: u8 = 3;
/// `fanfold run` exits with this when verification failed.
pub const EXIT_VERIFY_FAILED: u8 = 4;
/// A run stopped from outside (Ctrl-C) ends with this, as a shell reports
/// a command SIGINT ended (128 + 2), whether it stopped before any stage
/// ran (an error) or during them (an incomplete answer).
pub const EXIT_INTERRUPTED: u8 = 130;

/// A spec that cannot become a plan, with the file and the name at fault.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("reading spec {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("spec {path}: {detail}")]
    Parse { path: String, detail: String },
    #[error("spec {path}: {detail}")]
    Invalid { path: String, detail: String },
    #[error("spec {path}: reading {what} {file}: {source}")]
    File {
        path: String,
        what: &'static str,
        file: String,
        source: std::io::Error,
    },
    #[error("spec {path}: {file} is not JSON: {detail}")]
    Json {
        path: String,
        file: String,
        detail: String,
    },
    #[error("spec {path}: {source}")]
    Map { path: String, source: MapSpecError },
    #[error("spec {path}: {source}")]
    Embed {
        path: String,
        source: EmbedSpecError,
    },
    #[error("spec {path}: {source}")]
    Prefilter {
        path: String,
        source: Box<PrefilterError>,
    },
}

/// A projection's failure as the run reports it: the stage, the unit
/// (`-` when the program did not compile) and what went wrong.
pub(crate) fn project_err(e: fanfold_ops::view::ProjectError) -> RunError {
    match e {
        fanfold_ops::view::ProjectError::Compile { stage, detail } => RunError::Project {
            stage,
            unit: "-".into(),
            detail,
        },
        fanfold_ops::view::ProjectError::Eval {
            stage,
            unit,
            detail,
        } => RunError::Project {
            stage,
            unit,
            detail,
        },
    }
}
