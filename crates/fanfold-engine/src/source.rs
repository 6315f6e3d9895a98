//! Reading the source once: a file, standard input, or a command's output,
//! as a stream, so a source larger than memory is never held whole.

use std::io::Read;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

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

    /// The source as a stream. Call [`SourceReader::finish`] after reading
    /// to the end: a command's failure is only known once it exits.
    pub fn open(&self) -> Result<SourceReader, SourceError> {
        match self {
            Source::File(path) => {
                let file = std::fs::File::open(path).map_err(|source| SourceError::File {
                    path: path.display().to_string(),
                    source,
                })?;
                Ok(SourceReader::File(file))
            }
            Source::Stdin => Ok(SourceReader::Stdin(std::io::stdin())),
            Source::Command(argv) => {
                let (program, args) = argv.split_first().ok_or(SourceError::EmptyCommand)?;
                let command = argv.join(" ");
                let mut child = Command::new(program)
                    .args(args)
                    .stdin(Stdio::null())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .map_err(|source| SourceError::Spawn {
                        command: command.clone(),
                        source,
                    })?;
                // Drain stderr beside stdout, so a chatty command never
                // blocks on a full pipe.
                let stderr = child.stderr.take().map(|mut err| {
                    std::thread::spawn(move || {
                        let mut text = String::new();
                        let _ = err.read_to_string(&mut text);
                        text
                    })
                });
                Ok(SourceReader::Command {
                    child,
                    command,
                    stderr,
                })
            }
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

/// An open source; see [`Source::open`].
pub enum SourceReader {
    File(std::fs::File),
    Stdin(std::io::Stdin),
    Command {
        child: Child,
        command: String,
        stderr: Option<std::thread::JoinHandle<String>>,
    },
}

impl Read for SourceReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            SourceReader::File(f) => f.read(buf),
            SourceReader::Stdin(s) => s.read(buf),
            SourceReader::Command { child, .. } => match child.stdout.as_mut() {
                Some(out) => out.read(buf),
                None => Ok(0),
            },
        }
    }
}

impl SourceReader {
    /// Ends the stream: for a command, waits for it and fails when it did.
    pub fn finish(self) -> Result<(), SourceError> {
        let SourceReader::Command {
            mut child,
            command,
            stderr,
        } = self
        else {
            return Ok(());
        };
        drop(child.stdout.take());
        let status = child.wait().map_err(|source| SourceError::Spawn {
            command: command.clone(),
            source,
        })?;
        let stderr = stderr.and_then(|h| h.join().ok()).unwrap_or_default();
        if !status.success() {
            return Err(SourceError::Failed {
                command,
                status: status.to_string(),
                stderr: stderr.trim().to_owned(),
            });
        }
        Ok(())
    }

    /// The error a read failed with, named by the source.
    pub fn read_error(&self, origin: &str, source: std::io::Error) -> SourceError {
        match self {
            SourceReader::Stdin(_) => SourceError::Stdin(source),
            _ => SourceError::File {
                path: origin.to_owned(),
                source,
            },
        }
    }
}
