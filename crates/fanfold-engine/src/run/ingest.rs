//! The source phase: stream the input once into the store as
//! content-addressed chunks while hashing it, so the artifact every later
//! phase reads is immutable, named by its hash, and never held whole in
//! memory.

use std::io::Read;
use std::sync::atomic::{AtomicBool, Ordering};

use fanfold_core::ContentHash;
use fanfold_store::{CHUNK_BYTES, ChunkRef, Store};

use crate::error::RunError;
use crate::source::Source;

/// A source as stored.
#[derive(Clone, Debug)]
pub struct Artifact {
    pub hash: ContentHash,
    pub len: u64,
    pub origin: String,
    pub chunks: Vec<ChunkRef>,
}

/// Chunks written per store transaction (and held in memory until then).
const CHUNKS_PER_WRITE: usize = 4;

/// Reads `source` to its end into the store. `interrupt`, once set, is
/// seen at the next chunk (1 MiB): the chunks read so far are stored,
/// so a rerun over the same input writes only the rest, and the run ends
/// as [`RunError::Interrupted`].
pub fn ingest(
    source: &Source,
    store: &Store,
    interrupt: Option<&AtomicBool>,
) -> Result<Artifact, RunError> {
    let origin = source.origin();
    let mut reader = source.open()?;
    let mut hasher = blake3::Hasher::new();
    let mut chunks = Vec::new();
    let mut pending: Vec<(ContentHash, Vec<u8>)> = Vec::new();
    let flush = |pending: &mut Vec<(ContentHash, Vec<u8>)>| -> Result<(), RunError> {
        let rows: Vec<(ContentHash, &[u8])> =
            pending.iter().map(|(h, b)| (*h, b.as_slice())).collect();
        store.put_chunks(&rows)?;
        pending.clear();
        Ok(())
    };
    loop {
        if interrupt.is_some_and(|flag| flag.load(Ordering::Relaxed)) {
            flush(&mut pending)?;
            return Err(RunError::Interrupted {
                phase: "storing the input",
            });
        }
        let mut buf = Vec::with_capacity(CHUNK_BYTES);
        let n = (&mut reader)
            .take(CHUNK_BYTES as u64)
            .read_to_end(&mut buf)
            .map_err(|e| reader.read_error(&origin, e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf);
        let hash = ContentHash::of_bytes(&buf);
        chunks.push(ChunkRef {
            hash,
            len: buf.len() as u64,
            newlines: memchr::memchr_iter(b'\n', &buf).count() as u64,
        });
        // A chunk stored by an earlier run is not written again.
        if !store.has_chunk(&hash)? {
            pending.push((hash, buf));
        }
        if pending.len() >= CHUNKS_PER_WRITE {
            flush(&mut pending)?;
        }
    }
    reader.finish()?;
    flush(&mut pending)?;
    let hash = ContentHash(*hasher.finalize().as_bytes());
    store.put_artifact(&hash, &origin, &chunks)?;
    Ok(Artifact {
        len: chunks.iter().map(|c| c.len).sum(),
        hash,
        origin,
        chunks,
    })
}

/// Reads a stored artifact back as one stream, a chunk at a time.
pub struct ArtifactReader<'a> {
    store: &'a Store,
    hash: ContentHash,
    chunks: &'a [ChunkRef],
    next: usize,
    current: Vec<u8>,
    at: usize,
}

impl<'a> ArtifactReader<'a> {
    pub fn new(store: &'a Store, artifact: &'a Artifact) -> Self {
        ArtifactReader {
            store,
            hash: artifact.hash,
            chunks: &artifact.chunks,
            next: 0,
            current: Vec::new(),
            at: 0,
        }
    }
}

impl Read for ArtifactReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.at == self.current.len() {
            let Some(c) = self.chunks.get(self.next) else {
                return Ok(0);
            };
            self.current = self
                .store
                .get_chunk(&c.hash)
                .map_err(std::io::Error::other)?
                .ok_or_else(|| {
                    std::io::Error::other(RunError::MissingChunk {
                        hash: self.hash.to_hex(),
                        seq: self.next,
                    })
                })?;
            self.next += 1;
            self.at = 0;
        }
        let mut rest = self.current.get(self.at..).unwrap_or_default();
        let n = rest.read(buf)?;
        self.at += n;
        Ok(n)
    }
}

/// Random access to a stored artifact's bytes by range, for read-back:
/// only the chunks a range touches are loaded, the last one kept.
pub struct ArtifactBytes<'a> {
    store: &'a Store,
    artifact: &'a Artifact,
    /// Start offset of each chunk.
    starts: Vec<u64>,
    /// Line ends before each chunk.
    lines_before: Vec<u64>,
    cached: Option<(usize, Vec<u8>)>,
}

impl<'a> ArtifactBytes<'a> {
    pub fn new(store: &'a Store, artifact: &'a Artifact) -> Self {
        let mut starts = Vec::with_capacity(artifact.chunks.len());
        let mut lines_before = Vec::with_capacity(artifact.chunks.len());
        let (mut at, mut lines) = (0u64, 0u64);
        for c in &artifact.chunks {
            starts.push(at);
            lines_before.push(lines);
            at += c.len;
            lines += c.newlines;
        }
        ArtifactBytes {
            store,
            artifact,
            starts,
            lines_before,
            cached: None,
        }
    }

    fn chunk_of(&self, offset: u64) -> usize {
        self.starts
            .partition_point(|&s| s <= offset)
            .saturating_sub(1)
    }

    fn load(&mut self, seq: usize) -> Result<&[u8], RunError> {
        if self.cached.as_ref().map(|(s, _)| *s) != Some(seq) {
            let c = self
                .artifact
                .chunks
                .get(seq)
                .ok_or(RunError::MissingChunk {
                    hash: self.artifact.hash.to_hex(),
                    seq,
                })?;
            let bytes = self
                .store
                .get_chunk(&c.hash)?
                .ok_or(RunError::MissingChunk {
                    hash: self.artifact.hash.to_hex(),
                    seq,
                })?;
            self.cached = Some((seq, bytes));
        }
        Ok(self
            .cached
            .as_ref()
            .map(|(_, b)| b.as_slice())
            .unwrap_or_default())
    }

    /// The bytes `[start, end)`; `None` when the range lies outside.
    pub fn range(&mut self, start: u64, end: u64) -> Result<Option<Vec<u8>>, RunError> {
        if end > self.artifact.len || start > end {
            return Ok(None);
        }
        let mut out = Vec::with_capacity((end - start) as usize);
        let mut at = start;
        while at < end {
            let seq = self.chunk_of(at);
            let base = self.starts.get(seq).copied().unwrap_or(0);
            let chunk = self.load(seq)?;
            let from = (at - base) as usize;
            let to = ((end - base) as usize).min(chunk.len());
            let Some(part) = chunk.get(from..to) else {
                return Ok(None);
            };
            if part.is_empty() {
                return Ok(None);
            }
            out.extend_from_slice(part);
            at += part.len() as u64;
        }
        Ok(Some(out))
    }

    /// The 1-based line number of the byte at `offset`.
    pub fn line_of(&mut self, offset: u64) -> Result<u64, RunError> {
        let seq = self.chunk_of(offset);
        let base = self.starts.get(seq).copied().unwrap_or(0);
        let before = self.lines_before.get(seq).copied().unwrap_or(0);
        let chunk = self.load(seq)?;
        let within = chunk.get(..(offset - base) as usize).unwrap_or(chunk);
        Ok(before + memchr::memchr_iter(b'\n', within).count() as u64 + 1)
    }
}
