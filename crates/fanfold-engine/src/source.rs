//! Reading the source once: a file, standard input, or a command's output.

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// Where the source bytes come from.
#[derive(Clone, Debug, PartialEq)]
pub enum Source {
    File(PathBuf),
    Stdin,
    /// A program and its arguments; run once, its standard output captured.
    Command(Vec<String>),
}

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("reading input file {path}: {source}")]
    File {
        path: String,
        source: std::io::Error,
    },
    #[error("reading standard input: {0}")]
    Stdin(std::io::Error),
    #[error("running input command `{command}`: {source}")]
    Spawn {
        command: String,
        source: std::io::Error,
    },
    #[error("input command `{command}` failed ({status}): {stderr}")]
    Failed {
        command: String,
        status: String,
        stderr: String,
    },
    #[error("the input command is empty")]
    EmptyCommand,
}

impl Source {
    /// A name for reports and error messages.
    pub fn origin(&self) -> String {
        match self {
            Source::File(p) => p.display().to_string(),
            Source::Stdin => "<stdin>".to_owned(),
            Source::Command(c) => format!("$ {}", c.join(" ")),
        }
    }

    pub fn read(&self) -> Result<Vec<u8>, SourceError> {
        match self {
            Source::File(path) => std::fs::read(path).map_err(|source| SourceError::File {
                path: path.display().to_string(),
                source,
            }),
            Source::Stdin => {
                let mut buf = Vec::new();
                std::io::stdin()
                    .read_to_end(&mut buf)
                    .map_err(SourceError::Stdin)?;
                Ok(buf)
            }
            Source::Command(argv) => {
                let (program, args) = argv.split_first().ok_or(SourceError::EmptyCommand)?;
                let command = argv.join(" ");
                let out = Command::new(program)
                    .args(args)
                    .stdin(Stdio::null())
                    .output()
                    .map_err(|source| SourceError::Spawn {
                        command: command.clone(),
                        source,
                    })?;
                if !out.status.success() {
                    return Err(SourceError::Failed {
                        command,
                        status: out.status.to_string(),
                        stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
                    });
                }
                Ok(out.stdout)
            }
        }
    }
}
