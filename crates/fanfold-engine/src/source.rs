//! Reading the source once: a file, standard input, or a command's output,
//! as a stream, so a source larger than memory is never held whole.

use std::io::Read;
use std::path::PathBuf;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use crate::folder::DocumentStream;
use fanfold_core::spec::PartitionSpec;

/// How long an input command may run before it is killed: long enough for
/// `gh` to page through thousands of issues, short enough that a command
/// waiting on a prompt or a dead network does not hang a run for ever.
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(600);

/// Where the source bytes come from.
#[derive(Clone, Debug, PartialEq)]
pub enum Source {
    File(PathBuf),
    Stdin,
    /// A program and its arguments; run once, its standard output captured.
    /// A program and its arguments (never run through a shell), and how
    /// long it may run.
    Command(Vec<String>, Duration),
    /// A folder's files matching a glob (or one file), read as the
    /// canonical document stream the document formats partition.
    Documents {
        root: PathBuf,
        glob: String,
    },
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
    #[error(transparent)]
    Documents(#[from] crate::folder::DocumentError),
    #[error(
        "input {path} is a folder; a folder is read by the `files`, `email`, `markdown` or `code` partition (`[input.partition] type = \"files\"`)"
    )]
    Folder { path: String },
    #[error("the `{format}` partition reads a file or a folder (`--input PATH`), not a stream")]
    NotDocuments { format: String },
    #[error("the input command is empty")]
    EmptyCommand,
    #[error(
        "input command `{command}` ran past its {secs} s limit and was stopped; raise --input-timeout-secs if it needs longer"
    )]
    TimedOut { command: String, secs: u64 },
}

impl Source {
    /// The source a path is for `partition`: a document format reads a
    /// folder or a file as documents; every other format reads the file.
    pub fn at(partition: &PartitionSpec, path: PathBuf) -> Source {
        match partition.document_glob() {
            Some(glob) => Source::Documents {
                root: path,
                glob: glob.to_owned(),
            },
            None => Source::File(path),
        }
    }

    /// Whether the source can be read again to the same bytes (a file or
    /// a folder, not a stream).
    pub fn rereadable(&self) -> bool {
        matches!(self, Source::File(_) | Source::Documents { .. })
    }

    /// A name for reports and error messages.
    pub fn origin(&self) -> String {
        match self {
            Source::File(p) => p.display().to_string(),
            Source::Stdin => "<stdin>".to_owned(),
            Source::Command(c, _) => format!("$ {}", c.join(" ")),
            Source::Documents { root, glob } => format!("{} ({glob})", root.display()),
        }
    }

    /// The source as a stream. Call [`SourceReader::finish`] after reading
    /// to the end: a command's failure is only known once it exits.
    pub fn open(&self) -> Result<SourceReader, SourceError> {
        match self {
            Source::File(path) => {
                if path.is_dir() {
                    return Err(SourceError::Folder {
                        path: path.display().to_string(),
                    });
                }
                let file = std::fs::File::open(path).map_err(|source| SourceError::File {
                    path: path.display().to_string(),
                    source,
                })?;
                Ok(SourceReader::File(file))
            }
            Source::Documents { root, glob } => Ok(SourceReader::Documents(Box::new(
                DocumentStream::open(root, glob)?,
            ))),
            Source::Stdin => Ok(SourceReader::Stdin(std::io::stdin())),
            Source::Command(argv, timeout) => {
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
                let stderr = child.stderr.take().map(|mut err| {
                    std::thread::spawn(move || {
                        let mut text = String::new();
                        let _ = err.read_to_string(&mut text);
                        text
                    })
                });
                let stdout = child.stdout.take();
                let child = Arc::new(Mutex::new(child));
                // The watchdog kills the command at its limit; finishing
                // first releases it.
                let (done, wait) = mpsc::channel::<()>();
                let timed_out = Arc::new(AtomicBool::new(false));
                {
                    let child = Arc::clone(&child);
                    let timed_out = Arc::clone(&timed_out);
                    let timeout = *timeout;
                    std::thread::spawn(move || {
                        if let Err(mpsc::RecvTimeoutError::Timeout) = wait.recv_timeout(timeout) {
                            timed_out.store(true, Ordering::Relaxed);
                            let _ = child.lock().unwrap_or_else(|e| e.into_inner()).kill();
                        }
                    });
                }
                Ok(SourceReader::Command {
                    child,
                    stdout,
                    command,
                    stderr,
                    done,
                    timed_out,
                    timeout: *timeout,
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
            Source::Command(..) | Source::Documents { .. } => {
                let mut reader = self.open()?;
                let mut buf = Vec::new();
                let read = reader.read_to_end(&mut buf);
                // A command that failed or timed out says so before a read
                // error on its closed pipe would.
                reader.finish()?;
                read.map_err(|source| SourceError::File {
                    path: self.origin(),
                    source,
                })?;
                Ok(buf)
            }
        }
    }
}

pub enum SourceReader {
    File(std::fs::File),
    Documents(Box<DocumentStream>),
    Stdin(std::io::Stdin),
    Command {
        child: Arc<Mutex<Child>>,
        stdout: Option<ChildStdout>,
        command: String,
        stderr: Option<std::thread::JoinHandle<String>>,
        /// Tells the watchdog the command finished.
        done: mpsc::Sender<()>,
        timed_out: Arc<AtomicBool>,
        timeout: Duration,
    },
}

impl Read for SourceReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            SourceReader::File(f) => f.read(buf),
            SourceReader::Documents(d) => d.read(buf),
            SourceReader::Stdin(s) => s.read(buf),
            SourceReader::Command { stdout, .. } => match stdout.as_mut() {
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
            child,
            stdout,
            command,
            stderr,
            done,
            timed_out,
            timeout,
        } = self
        else {
            return Ok(());
        };
        drop(stdout);
        let status = child
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .wait()
            .map_err(|source| SourceError::Spawn {
                command: command.clone(),
                source,
            })?;
        let _ = done.send(());
        let stderr = stderr.and_then(|h| h.join().ok()).unwrap_or_default();
        if timed_out.load(Ordering::Relaxed) {
            return Err(SourceError::TimedOut {
                command,
                secs: timeout.as_secs(),
            });
        }
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
