//! A folder (or one file) read as the documents stream: the walk in path
//! order and each file read into one JSON [`Document`] line, carrying its
//! path, size, modification time, a digest of its bytes and its text. The
//! stream is what the store keeps and hashes, so the source hash covers the
//! manifest and the contents: an edited file changes its own line and
//! nothing else. The document formats in `fanfold_ops::partition` split
//! the stream's lines into units and read no files themselves.
//!
//! What is read stays in the folder: a link that leads out of it is not
//! followed unless the run asks ([`set_follow_links`], `--follow-links`),
//! and a FIFO, a device or a socket is never opened. Each is a line of the
//! stream with its reason (`link_outside`, `not_a_file`), so the run names
//! it among its rejections. Every read is bounded by the bytes it takes,
//! not by the size the file claims (a file of `/proc` claims 0).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use fanfold_ops::partition::documents::{Document, Skipped};

/// A UTF-8 byte order mark, dropped from a document's text.
const BOM: &[u8] = b"\xEF\xBB\xBF";

/// A file larger than this is listed with its digest, not read: no
/// document format splits a file that large into units a model can take.
pub const MAX_DOCUMENT_BYTES: u64 = 256 * 1024 * 1024;

/// How much of a file is looked at for a NUL byte, the mark of a binary
/// file (what git and grep look at too).
const BINARY_PROBE: usize = 8000;

static FOLLOW_LINKS: AtomicBool = AtomicBool::new(false);

/// Whether links that lead out of a folder are read (off unless the run
/// says `--follow-links`). Process-wide: the choice is the run's.
pub fn set_follow_links(follow: bool) {
    FOLLOW_LINKS.store(follow, Ordering::Relaxed);
}

pub fn follow_links() -> bool {
    FOLLOW_LINKS.load(Ordering::Relaxed)
}

#[derive(Debug, thiserror::Error)]
pub enum DocumentError {
    #[error("input {path}: {source}")]
    Root {
        path: String,
        source: std::io::Error,
    },
    #[error("glob {glob:?}: {source}")]
    Glob {
        glob: String,
        source: globset::Error,
    },
    #[error("listing {path}: {detail}")]
    Walk { path: String, detail: String },
}

/// The canonical stream of a folder's matching files, or of one file,
/// written as it is read: one file's bytes are held at a time.
pub struct DocumentStream {
    root: PathBuf,
    /// Paths relative to `root` (empty for a single-file root), in order.
    files: std::vec::IntoIter<Entry>,
    line: Vec<u8>,
    at: usize,
}

impl DocumentStream {
    /// Lists the files now; reads each when the stream reaches it.
    pub fn open(root: &Path, glob: &str) -> Result<DocumentStream, DocumentError> {
        let meta = std::fs::metadata(root).map_err(|source| DocumentError::Root {
            path: root.display().to_string(),
            source,
        })?;
        let files = if meta.is_file() {
            let name = root
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| root.display().to_string());
            vec![Entry {
                full: root.to_path_buf(),
                rel: name,
                skipped: None,
            }]
        } else {
            listing(root, glob)?
        };
        Ok(DocumentStream {
            root: root.to_path_buf(),
            files: files.into_iter(),
            line: Vec::new(),
            at: 0,
        })
    }

    /// The folder or file the stream reads.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn next_line(&mut self) -> bool {
        let Some(entry) = self.files.next() else {
            return false;
        };
        let doc = match entry.skipped {
            None => read_document(&entry.full, entry.rel),
            Some(skipped) => Document {
                path: entry.rel,
                size: 0,
                modified: None,
                digest: String::new(),
                text: None,
                bytes: None,
                skipped: Some(skipped),
            },
        };
        self.line.clear();
        // Writing a plain struct to memory cannot fail.
        let _ = serde_json::to_writer(&mut self.line, &doc);
        self.line.push(b'\n');
        self.at = 0;
        true
    }
}

impl Read for DocumentStream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.at >= self.line.len() {
            if !self.next_line() {
                return Ok(0);
            }
        }
        let rest = self.line.get(self.at..).unwrap_or_default();
        let n = rest.len().min(buf.len());
        if let (Some(dst), Some(src)) = (buf.get_mut(..n), rest.get(..n)) {
            dst.copy_from_slice(src);
        }
        self.at += n;
        Ok(n)
    }
}

/// One entry of a folder's listing: a file to read, or one that is named
/// and not read.
struct Entry {
    full: PathBuf,
    rel: String,
    skipped: Option<Skipped>,
}

/// The files under `root` whose relative paths match `glob`, in path
/// order; hidden entries (a name starting with `.`) are skipped, and so
/// are links out of the folder (unless [`follow_links`]) and files that
/// are not regular files.
pub fn list(root: &Path, glob: &str) -> Result<Vec<(PathBuf, String)>, DocumentError> {
    Ok(listing(root, glob)?
        .into_iter()
        .filter(|e| e.skipped.is_none())
        .map(|e| (e.full, e.rel))
        .collect())
}

/// What a file that is not a regular file is, in words.
fn kind_of_special(ft: std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt as _;
        if ft.is_fifo() {
            return "a FIFO";
        }
        if ft.is_char_device() {
            return "a character device";
        }
        if ft.is_block_device() {
            return "a block device";
        }
        if ft.is_socket() {
            return "a socket";
        }
    }
    let _ = ft;
    "another kind of file"
}

fn listing(root: &Path, glob: &str) -> Result<Vec<Entry>, DocumentError> {
    let matcher = globset::GlobBuilder::new(glob)
        .literal_separator(true)
        // `README.MD` is Markdown too.
        .case_insensitive(true)
        .build()
        .map_err(|source| DocumentError::Glob {
            glob: glob.to_owned(),
            source,
        })?
        .compile_matcher();
    let follow = follow_links();
    let home = root.canonicalize().map_err(|source| DocumentError::Root {
        path: root.display().to_string(),
        source,
    })?;
    let relative = |path: &Path| {
        path.strip_prefix(root).ok().map(|rel| {
            rel.components()
                .map(|c| c.as_os_str().to_string_lossy())
                .collect::<Vec<_>>()
                .join("/")
        })
    };
    // A link that leads out of the folder, named and not read, unless the
    // run follows links. One inside the folder is read as what it points
    // to (a link that loops is an error naming it).
    let leaves = |path: &Path| -> Option<Skipped> {
        if follow {
            return None;
        }
        // A dangling link reads nothing: it fails as `unreadable`.
        let inside = path.canonicalize().map_or(true, |t| t.starts_with(&home));
        if inside {
            return None;
        }
        let target = std::fs::read_link(path)
            .map(|t| t.display().to_string())
            .unwrap_or_else(|_| "a place".to_owned());
        Some(Skipped {
            reason: "link_outside".to_owned(),
            detail: format!(
                "a link to {target}, outside the folder, not followed (--follow-links reads it)"
            ),
        })
    };
    let outside = std::cell::RefCell::new(Vec::new());
    let mut files = Vec::new();
    let walk = walkdir::WalkDir::new(root)
        .follow_links(true)
        .sort_by_file_name()
        .into_iter()
        .filter_entry(|e| {
            if e.depth() == 0 {
                return true;
            }
            if e.file_name().to_string_lossy().starts_with('.') {
                return false;
            }
            // A linked folder that leaves is not walked: named once.
            if e.path_is_symlink()
                && e.file_type().is_dir()
                && let Some(skipped) = leaves(e.path())
            {
                if let Some(rel) = relative(e.path()) {
                    outside.borrow_mut().push(Entry {
                        full: e.path().to_path_buf(),
                        rel: format!("{rel}/"),
                        skipped: Some(skipped),
                    });
                }
                return false;
            }
            true
        });
    for entry in walk {
        let entry = match entry {
            Ok(entry) => entry,
            // A dangling link, a loop or an entry that cannot be listed:
            // the file it names, if the glob wants it, is read (and fails
            // as `unreadable`, with why); the rest of the folder stands.
            Err(e) => {
                // A link out of the folder that loops back above it.
                if e.depth() > 0
                    && let Some(path) = e.path()
                    && let Some(rel) = relative(path)
                    && std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink())
                    && let Some(skipped) = leaves(path)
                {
                    let rel = if path.is_dir() {
                        format!("{rel}/")
                    } else {
                        rel
                    };
                    files.push(Entry {
                        full: path.to_path_buf(),
                        rel,
                        skipped: Some(skipped),
                    });
                    continue;
                }
                if let Some(path) = e.path()
                    && let Some(rel) = relative(path)
                    && matcher.is_match(&rel)
                {
                    files.push(Entry {
                        full: path.to_path_buf(),
                        rel,
                        skipped: None,
                    });
                    continue;
                }
                if e.depth() == 0 {
                    return Err(DocumentError::Walk {
                        path: root.display().to_string(),
                        detail: e.to_string(),
                    });
                }
                continue;
            }
        };
        if entry.file_type().is_dir() {
            continue;
        }
        let Some(rel) = relative(entry.path()) else {
            continue;
        };
        if !matcher.is_match(&rel) {
            continue;
        }
        let skipped = if entry.path_is_symlink() {
            leaves(entry.path())
        } else {
            None
        }
        .or_else(|| {
            (!entry.file_type().is_file()).then(|| Skipped {
                reason: "not_a_file".to_owned(),
                detail: format!("{}, not read", kind_of_special(entry.file_type())),
            })
        });
        files.push(Entry {
            full: entry.path().to_path_buf(),
            rel,
            skipped,
        });
    }
    files.extend(outside.into_inner());
    // Walking sorts each folder's entries; the stream's order is the
    // paths' own, so `a/b` and `a.txt` sort the same on every system.
    files.sort_by(|a, b| a.rel.cmp(&b.rel));
    Ok(files)
}

/// Why a file was not opened: it is not a regular file (a FIFO, a device,
/// a socket), which a read could wait on or never finish.
#[derive(Debug)]
pub struct NotRegular(&'static str);

impl std::fmt::Display for NotRegular {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}, not a regular file", self.0)
    }
}

impl std::error::Error for NotRegular {}

/// Whether `e` is [`open_regular`]'s refusal of a file that is not a
/// regular one.
pub fn is_not_regular(e: &std::io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<NotRegular>())
}

/// Opens `path` for reading only if it is a regular file: a FIFO, a
/// device or a socket is refused without waiting on it (it is opened
/// without blocking and its type checked on the open file).
pub fn open_regular(path: &Path) -> std::io::Result<std::fs::File> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        options.custom_flags(libc::O_NONBLOCK);
    }
    let file = options.open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(std::io::Error::other(NotRegular(kind_of_special(
            meta.file_type(),
        ))));
    }
    Ok(file)
}

/// At most `limit + 1` bytes of `path`, a regular file: more than `limit`
/// says the file is over it, whatever size it claims. Read in whole
/// 64 KiB chunks (a file of `/proc` may refuse a read of an odd size).
pub fn read_bounded(path: &Path, limit: u64) -> std::io::Result<Vec<u8>> {
    let mut file = open_regular(path)?;
    let keep = usize::try_from(limit.saturating_add(1)).unwrap_or(usize::MAX);
    let mut bytes = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    while bytes.len() < keep {
        let n = match file.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        bytes.extend_from_slice(chunk.get(..n).unwrap_or_default());
    }
    bytes.truncate(keep);
    Ok(bytes)
}

/// One file as a stream line: never an error, since a file that cannot be
/// read is a rejection with its reason, and the rest of the folder stands.
fn read_document(full: &Path, path: String) -> Document {
    let meta = std::fs::metadata(full).ok();
    let size = meta.as_ref().map_or(0, |m| m.len());
    let modified = meta
        .and_then(|m| m.modified().ok())
        .and_then(|t| jiff::Timestamp::try_from(t).ok())
        .and_then(|t| jiff::Timestamp::from_second(t.as_second()).ok())
        .map(|t| t.to_string());
    let skipped = |reason: &str, detail: String, digest: String| Document {
        path: path.clone(),
        size,
        modified: modified.clone(),
        digest,
        text: None,
        bytes: None,
        skipped: Some(Skipped {
            reason: reason.to_owned(),
            detail,
        }),
    };
    if size > MAX_DOCUMENT_BYTES {
        return skipped(
            "too_large",
            format!("{size} bytes, over the {MAX_DOCUMENT_BYTES}-byte document limit"),
            String::new(),
        );
    }
    let bytes = match read_bounded(full, MAX_DOCUMENT_BYTES) {
        Ok(b) if b.len() as u64 > MAX_DOCUMENT_BYTES => {
            return skipped(
                "too_large",
                format!(
                    "over the {MAX_DOCUMENT_BYTES}-byte document limit (its size reads {size})"
                ),
                String::new(),
            );
        }
        Ok(b) => b,
        Err(e) if is_not_regular(&e) => {
            return skipped("not_a_file", e.to_string(), String::new());
        }
        Err(e) => return skipped("unreadable", e.to_string(), String::new()),
    };
    // The size is what was read: a file of `/proc` claims 0.
    let size = bytes.len() as u64;
    let digest = blake3::hash(&bytes).to_hex().to_string();
    let probe = bytes.get(..BINARY_PROBE).unwrap_or(&bytes);
    if let Some(at) = memchr::memchr(0, probe) {
        let mut doc = skipped(
            "binary",
            format!("a binary file (a NUL byte at offset {at})"),
            digest,
        );
        doc.size = size;
        return doc;
    }
    let body = bytes.strip_prefix(BOM).unwrap_or(&bytes);
    match std::str::from_utf8(body) {
        Ok(text) => Document {
            path,
            size,
            modified,
            digest,
            text: Some(text.to_owned()),
            bytes: None,
            skipped: None,
        },
        Err(e) => {
            let at = e.valid_up_to() + (bytes.len() - body.len());
            let mut doc = skipped(
                "not_utf8",
                format!(
                    "invalid UTF-8 at byte {at}; convert it first (e.g. `iconv -f latin1 -t utf-8`)"
                ),
                digest,
            );
            doc.size = size;
            use base64::Engine as _;
            doc.bytes = Some(base64::engine::general_purpose::STANDARD.encode(&bytes));
            doc
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn a_read_is_bounded_by_the_bytes_read_not_the_size_claimed() {
        // `/proc/self/pagemap` claims 0 bytes and holds gigabytes.
        let path = Path::new("/proc/self/pagemap");
        // Linux, where fanfold is built and tested, always has it: a test
        // that cannot make its check fails rather than passes.
        assert!(path.exists(), "{} is needed by this test", path.display());
        assert_eq!(std::fs::metadata(path).unwrap().len(), 0);
        let bytes = read_bounded(path, 4096).unwrap();
        assert_eq!(bytes.len(), 4097);
        // A regular file under the limit is read whole.
        let dir = tempfile::tempdir().unwrap();
        let small = dir.path().join("small");
        std::fs::write(&small, b"12345").unwrap();
        assert_eq!(read_bounded(&small, 5).unwrap(), b"12345");
        assert_eq!(read_bounded(&small, 4).unwrap(), b"12345");
        assert_eq!(read_bounded(&small, 2).unwrap(), b"123");
    }

    #[test]
    fn a_fifo_or_a_device_is_refused_without_waiting() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("pipe");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        // No writer ever opens it: a blocking open would wait forever.
        let err = read_bounded(&fifo, 10).unwrap_err();
        assert!(is_not_regular(&err), "{err}");
        assert!(err.to_string().contains("a FIFO"), "{err}");
        let err = read_bounded(Path::new("/dev/zero"), 10).unwrap_err();
        assert!(err.to_string().contains("a character device"), "{err}");
    }

    #[test]
    fn links_out_of_the_folder_are_named_and_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("docs");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(root.join("a.txt"), "a").unwrap();
        std::fs::write(dir.path().join("secret.txt"), "secret").unwrap();
        std::os::unix::fs::symlink(dir.path().join("secret.txt"), root.join("s.txt")).unwrap();
        std::os::unix::fs::symlink(dir.path(), root.join("up")).unwrap();
        std::os::unix::fs::symlink(root.join("a.txt"), root.join("sub/a.txt")).unwrap();
        let listed = listing(&root, "**/*").unwrap();
        let shown: Vec<(&str, Option<&str>)> = listed
            .iter()
            .map(|e| {
                (
                    e.rel.as_str(),
                    e.skipped.as_ref().map(|s| s.reason.as_str()),
                )
            })
            .collect();
        assert_eq!(
            shown,
            [
                ("a.txt", None),
                ("s.txt", Some("link_outside")),
                ("sub/a.txt", None),
                ("up/", Some("link_outside")),
            ]
        );
        assert_eq!(
            list(&root, "**/*")
                .unwrap()
                .into_iter()
                .map(|(_, rel)| rel)
                .collect::<Vec<_>>(),
            ["a.txt", "sub/a.txt"]
        );
        let mut stream = String::new();
        DocumentStream::open(&root, "**/*")
            .unwrap()
            .read_to_string(&mut stream)
            .unwrap();
        assert!(!stream.contains("\"secret\""), "{stream}");
        assert!(stream.contains("--follow-links"), "{stream}");
    }
}
