//! The engine's error: what stopped a run, with the place at fault.

use fanfold_ops::partition::PartitionError;
use fanfold_store::StoreError;

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
    #[error("the stored source {hash} is missing chunk {seq}; the store is damaged")]
    MissingChunk { hash: String, seq: usize },
    #[error("no unit at position {index} of the run's unit table")]
    NoUnit { index: usize },
    #[error("writing {path}: {source}")]
    Output {
        path: String,
        source: std::io::Error,
    },
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
            | RunError::Bound { .. } => ErrorCategory::Input,
            RunError::Backend { .. } | RunError::Embed { .. } => ErrorCategory::Configuration,
            RunError::Store(_)
            | RunError::MissingChunk { .. }
            | RunError::NoUnit { .. }
            | RunError::Output { .. } => ErrorCategory::Execution,
        }
    }
}

impl ErrorCategory {
    /// The exit code `fanfold run` ends with for a failure of this kind.
    pub fn exit_code(self) -> u8 {
        match self {
            ErrorCategory::Input => crate::report::EXIT_INPUT,
            ErrorCategory::Configuration => crate::report::EXIT_CONFIGURATION,
            ErrorCategory::Execution => crate::report::EXIT_FAILED,
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
}
