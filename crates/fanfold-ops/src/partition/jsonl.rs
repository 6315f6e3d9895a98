//! The JSONL path for large inputs.
//!
//! [`partition_reader`] parses each line into a `serde_json::Value`, hashes it
//! through many small hasher updates, and the prefilter then converts the
//! value again into a jq value. On multi-gigabyte sources those steps
//! dominate. This path parses each line once, with serde_json's own parser
//! (so exactly the same lines are accepted, the same errors reported and
//! numbers read identically), into a flat [`Record`] whose buffers are reused
//! from line to line; derives the same canonical unit hash from it; builds a
//! jq value only when a caller asks for one; and can spread the per-line work
//! over worker threads while still emitting elements in source order.
//!
//! Unit semantics are those of [`partition_reader`] with
//! [`PartitionSpec::Jsonl`]: the same ids, hashes, ordinals, byte ranges,
//! rejections and errors (the tests below check this). What differs is the
//! memory used to detect duplicate keys: ids that are decimal integers are
//! kept as runs of consecutive numbers, so sequential ids cost nothing per
//! record; other ids are kept one by one.

use std::collections::BTreeMap;
use std::fmt;
use std::io::{self, Read};
use std::sync::mpsc::{Receiver, sync_channel};
use std::sync::{Arc, Mutex};

use fanfold_core::{ByteRange, ContentHash, Unit};
use jaq_json::{Map, Num, Rc, Val};
use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

use super::assign::{Admitted, Assigner, Proposed};
use super::{
    Coverage, PartitionError, PartitionOptions, Rejection, Repeat, SeenIds, check_utf8,
    too_deep_detail, trim_line,
};

/// The hash bucket of [`super::unit_hash`].
const UNIT_BUCKET: &str = fanfold_core::Bucket::Unit.name();

/// Runtime knobs of the fast path; none of them changes the result.
#[derive(Clone, Copy, Debug)]
pub struct FastOptions {
    pub partition: PartitionOptions,
    /// Worker threads for parsing, hashing and the per-unit function;
    /// 0 or 1 runs everything on the calling thread.
    pub threads: usize,
    /// Bytes read per chunk; a chunk always ends at a line end, so a
    /// longer line makes its chunk longer.
    pub chunk_bytes: usize,
}

impl Default for FastOptions {
    fn default() -> Self {
        FastOptions {
            partition: PartitionOptions::default(),
            threads: std::thread::available_parallelism().map_or(1, usize::from),
            chunk_bytes: 1 << 20,
        }
    }
}

/// One element, in source order.
pub enum FastElement<'a, T> {
    /// A unit, its line as it is in the source, and what the per-unit
    /// function returned for it.
    Unit {
        unit: Unit,
        raw: &'a [u8],
        extra: T,
    },
    Rejected(Rejection),
    Repeated(Repeat),
}

/// One JSON value read into flat buffers that are reused from line to
/// line, so that reading a record allocates nothing once they have grown.
/// It reads exactly what `serde_json::from_slice::<Value>` reads, with
/// the same errors; [`Record::to_val`] equals [`crate::jq::to_val`] of
/// that `Value` and [`Record::unit_hash`] equals [`super::unit_hash`].
#[derive(Default)]
pub struct Record {
    /// The value in document order: a container is followed by its
    /// items (objects: key and value, alternately).
    nodes: Vec<Node>,
    /// The parsed line, then the unescaped text of strings that had
    /// escapes; strings without escapes point into the line.
    text: Vec<u8>,
    /// Where the line being parsed lies in memory, to tell its own
    /// strings from serde's unescaped copies.
    input: (usize, usize),
}

#[derive(Clone, Copy, Debug)]
enum Node {
    Null,
    Bool(bool),
    U64(u64),
    I64(i64),
    F64(f64),
    Str {
        start: usize,
        len: usize,
    },
    /// `end` is the index after the container's last descendant.
    Arr {
        len: usize,
        end: usize,
    },
    Obj {
        len: usize,
        end: usize,
    },
}

/// A value inside a [`Record`].
#[derive(Clone, Copy)]
pub struct ValueRef<'a> {
    record: &'a Record,
    at: usize,
}

/// What a [`ValueRef`] is, with scalars read out.
pub enum Shape<'a> {
    Null,
    Bool(bool),
    Num(Num),
    Str(&'a [u8]),
    Arr,
    Obj,
}

impl Record {
    /// Replaces the content with one JSON text.
    pub fn parse(&mut self, bytes: &[u8]) -> Result<(), serde_json::Error> {
        self.nodes.clear();
        self.text.clear();
        self.text.extend_from_slice(bytes);
        self.input = (bytes.as_ptr() as usize, bytes.len());
        // Checking the whole text once is cheaper than serde checking
        // each string; invalid UTF-8 goes to serde for its own error.
        match std::str::from_utf8(bytes) {
            Ok(text) => {
                let mut de = serde_json::Deserializer::from_str(text);
                NodeSeed(self).deserialize(&mut de)?;
                de.end()
            }
            Err(_) => {
                let mut de = serde_json::Deserializer::from_slice(bytes);
                NodeSeed(self).deserialize(&mut de)?;
                de.end()
            }
        }
    }

    pub fn root(&self) -> ValueRef<'_> {
        ValueRef {
            record: self,
            at: 0,
        }
    }

    /// The record as a jq value.
    pub fn to_val(&self) -> Val {
        self.root().to_val()
    }

    /// The canonical unit hash; `None` only for an empty record.
    pub fn unit_hash(&self) -> Option<ContentHash> {
        self.hash_with(&mut HashScratch::default())
    }
}

impl<'a> ValueRef<'a> {
    pub fn shape(&self) -> Shape<'a> {
        match self.record.nodes.get(self.at) {
            None | Some(Node::Null) => Shape::Null,
            Some(Node::Bool(b)) => Shape::Bool(*b),
            Some(Node::U64(n)) => Shape::Num(Num::from_integral(*n)),
            Some(Node::I64(n)) => Shape::Num(Num::from_integral(*n)),
            Some(Node::F64(f)) => Shape::Num(Num::Float(*f)),
            Some(Node::Str { start, len }) => Shape::Str(self.record.bytes(*start, *len)),
            Some(Node::Arr { .. }) => Shape::Arr,
            Some(Node::Obj { .. }) => Shape::Obj,
        }
    }

    /// An object's field. A repeated key yields its last value, as
    /// `Value`'s map keeps it; `None` when absent or not an object.
    pub fn get(&self, key: &[u8]) -> Option<ValueRef<'a>> {
        let r = self.record;
        let Some(Node::Obj { len, .. }) = r.nodes.get(self.at) else {
            return None;
        };
        let mut found = None;
        let mut i = self.at + 1;
        for _ in 0..*len {
            if r.str_at(i) == Some(key) {
                found = Some(i + 1);
            }
            i = r.next(i + 1);
        }
        found.map(|at| ValueRef { record: r, at })
    }

    pub fn to_val(&self) -> Val {
        self.record.val_at(self.at)
    }
}

/// Partitions a JSONL source like [`super::partition_reader`] with
/// [`super::PartitionSpec::Jsonl`], and runs `per_unit` on every element
/// that can become a unit, on the worker thread that parsed it.
///
/// `make_per_unit` is called once per worker thread, because jq values
/// and compiled jq programs cannot cross threads. `per_unit` receives
/// the element's id and its record; it runs before duplicates are known,
/// so its result is dropped for an element later rejected as a
/// duplicate, and a content-derived id may still gain its `-N`
/// occurrence suffix: the unit handed to `emit` is authoritative.
///
/// Memory is bounded by a few chunks per thread, independent of the
/// source's size (apart from the duplicate-key set, see the module docs).
// Each input is independent of the others; a struct would only rename
// them at every call.
#[allow(clippy::too_many_arguments)]
pub fn partition_jsonl<T, R, M, F>(
    key: Option<&str>,
    kind: &str,
    source_hash: ContentHash,
    reader: R,
    options: FastOptions,
    seen: &mut dyn SeenIds,
    make_per_unit: M,
    emit: &mut dyn FnMut(FastElement<'_, T>),
) -> Result<Coverage, PartitionError>
where
    T: Send,
    R: Read + Send,
    M: Fn() -> F + Sync,
    F: FnMut(&str, &Record) -> T,
{
    let lines = LineConfig {
        key,
        max_unit_bytes: options.partition.max_unit_bytes,
    };
    let mut assigner = FastAssigner {
        assigner: Assigner::new(kind, key, source_hash, options.partition, seen),
        line_base: 0,
    };
    let chunker = Chunker {
        reader,
        carry: Vec::new(),
        offset: 0,
        chunk_bytes: options.chunk_bytes.max(1),
        eof: false,
    };
    if options.threads <= 1 {
        sequential(chunker, lines, &mut assigner, &make_per_unit, emit)?;
    } else {
        parallel(
            chunker,
            lines,
            &mut assigner,
            &make_per_unit,
            options.threads,
            emit,
        )?;
    }
    if assigner.assigner.coverage.elements == 0 {
        return Err(PartitionError::Empty);
    }
    Ok(assigner.assigner.coverage)
}

fn sequential<T, R: Read, F: FnMut(&str, &Record) -> T>(
    mut chunker: Chunker<R>,
    lines: LineConfig,
    assigner: &mut FastAssigner,
    make_per_unit: &dyn Fn() -> F,
    emit: &mut dyn FnMut(FastElement<'_, T>),
) -> Result<(), PartitionError> {
    let mut lines = LineParser::new(lines);
    let mut per_unit = make_per_unit();
    let mut buf = Vec::new();
    while let Some(base) = chunker.next_into(&mut buf)? {
        let parsed = lines.chunk(&buf, base, &mut per_unit);
        assigner.take(&buf, parsed, emit)?;
    }
    Ok(())
}

type Job = (u64, io::Result<(u64, Vec<u8>)>);
type Done<T> = (u64, io::Result<(Vec<u8>, ParsedChunk<T>)>);

/// A reader thread cuts the source into chunks of whole lines, workers
/// parse them, and the calling thread assigns ids in source order. The
/// chunk buffers circulate through a fixed pool, which is what bounds
/// memory: the reader waits for a free buffer before reading on.
fn parallel<T, R, M, F>(
    mut chunker: Chunker<R>,
    lines: LineConfig,
    assigner: &mut FastAssigner,
    make_per_unit: &M,
    threads: usize,
    emit: &mut dyn FnMut(FastElement<'_, T>),
) -> Result<(), PartitionError>
where
    T: Send,
    R: Read + Send,
    M: Fn() -> F + Sync,
    F: FnMut(&str, &Record) -> T,
{
    let slots = 2 * threads + 2;
    std::thread::scope(|s| {
        let (pool_tx, pool_rx) = sync_channel::<Vec<u8>>(slots);
        for _ in 0..slots {
            // The channel holds `slots` items, so this cannot block.
            let _ = pool_tx.send(Vec::new());
        }
        let (job_tx, job_rx) = sync_channel::<Job>(slots);
        let (done_tx, done_rx) = sync_channel::<Done<T>>(slots);
        s.spawn(move || {
            let mut seq = 0u64;
            while let Ok(mut buf) = pool_rx.recv() {
                let job = match chunker.next_into(&mut buf) {
                    Ok(Some(base)) => Ok((base, buf)),
                    Ok(None) => return,
                    Err(e) => Err(e),
                };
                let failed = job.is_err();
                if job_tx.send((seq, job)).is_err() || failed {
                    return;
                }
                seq += 1;
            }
        });
        // Shared by the workers only: once they all stop, the reader's
        // sends fail and it stops too.
        let job_rx = Arc::new(Mutex::new(job_rx));
        for _ in 0..threads {
            let job_rx = Arc::clone(&job_rx);
            let done_tx = done_tx.clone();
            s.spawn(move || {
                let mut lines = LineParser::new(lines);
                let mut per_unit = make_per_unit();
                while let Some((seq, job)) = next_job(&job_rx) {
                    let done = job.map(|(base, buf)| {
                        let parsed = lines.chunk(&buf, base, &mut per_unit);
                        (buf, parsed)
                    });
                    if done_tx.send((seq, done)).is_err() {
                        return;
                    }
                }
            });
        }
        drop(job_rx);
        drop(done_tx);
        let mut pending = BTreeMap::new();
        let mut next = 0u64;
        for (seq, done) in done_rx.iter() {
            pending.insert(seq, done);
            while let Some(done) = pending.remove(&next) {
                let (buf, parsed) = done?;
                assigner.take(&buf, parsed, emit)?;
                let _ = pool_tx.send(buf);
                next += 1;
            }
        }
        if pending.is_empty() {
            Ok(())
        } else {
            Err(PartitionError::Io(io::Error::other(
                "a partition worker stopped before finishing its chunk",
            )))
        }
    })
}

fn next_job(rx: &Mutex<Receiver<Job>>) -> Option<Job> {
    rx.lock().ok()?.recv().ok()
}

/// Cuts a byte stream into chunks of whole lines.
struct Chunker<R> {
    reader: R,
    /// The start of a line that did not fit in the previous chunk.
    carry: Vec<u8>,
    offset: u64,
    chunk_bytes: usize,
    eof: bool,
}

impl<R: Read> Chunker<R> {
    /// Fills `buf` with the next chunk and returns its source offset, or
    /// `None` at the end. Only the last chunk may end without a newline.
    fn next_into(&mut self, buf: &mut Vec<u8>) -> io::Result<Option<u64>> {
        buf.clear();
        buf.append(&mut self.carry);
        let mut cut = None;
        while !self.eof && cut.is_none() {
            let from = buf.len();
            let want = if from < self.chunk_bytes {
                self.chunk_bytes - from
            } else {
                self.chunk_bytes
            };
            buf.reserve(want);
            // `read_to_end` fills spare capacity without zeroing it first.
            let n = (&mut self.reader).take(want as u64).read_to_end(buf)?;
            if n < want {
                self.eof = true;
            }
            // The carried part holds no newline, so only new bytes can.
            cut = buf
                .get(from..)
                .and_then(|new| memchr::memrchr(b'\n', new))
                .map(|i| from + i + 1);
        }
        if !self.eof
            && let Some(cut) = cut
            && let Some(rest) = buf.get(cut..)
        {
            self.carry.extend_from_slice(rest);
            buf.truncate(cut);
        }
        if buf.is_empty() {
            return Ok(None);
        }
        let at = self.offset;
        self.offset += buf.len() as u64;
        Ok(Some(at))
    }
}

/// What a worker found for one non-blank line.
struct Parsed<T> {
    /// Where the line starts in its chunk.
    at: usize,
    bytes: ByteRange,
    hash: ContentHash,
    candidate: Candidate<T>,
}

/// Whether a line can become a unit, decided without knowing the lines
/// before it; duplicates are left to the assigner.
enum Candidate<T> {
    TooLarge,
    MissingKey,
    /// The input's last line, without a line end, does not parse;
    /// `line` counts from the chunk's start.
    Truncated {
        line: u64,
        detail: String,
    },
    /// A line that does not parse, with more input after it: that one
    /// record is rejected, as in any other bad unit, and the rest
    /// stand. `line` counts from the chunk's start.
    Malformed {
        line: u64,
        offset: u64,
        detail: String,
    },
    /// Valid JSON nested past the parser's depth limit; `line` counts
    /// from the chunk's start.
    TooDeep {
        line: u64,
    },
    /// An object of the record holds `name` twice; `line` counts from the
    /// chunk's start.
    RepeatedField {
        line: u64,
        name: String,
    },
    Ready {
        id: String,
        extra: T,
    },
}

struct ParsedChunk<T> {
    items: Vec<Parsed<T>>,
    lines: u64,
    /// The first bad line ends the chunk and the partition; its line
    /// number counts from the chunk's start.
    error: Option<PartitionError>,
}

#[derive(Clone, Copy)]
struct LineConfig<'a> {
    key: Option<&'a str>,
    max_unit_bytes: u64,
}

/// Per-thread parsing state, reused from line to line.
struct LineParser<'a> {
    key: Option<&'a str>,
    max_unit_bytes: u64,
    record: Record,
    scratch: HashScratch,
}

impl<'a> LineParser<'a> {
    fn new(config: LineConfig<'a>) -> Self {
        LineParser {
            key: config.key,
            max_unit_bytes: config.max_unit_bytes,
            record: Record::default(),
            scratch: HashScratch::default(),
        }
    }

    fn chunk<T, F: FnMut(&str, &Record) -> T>(
        &mut self,
        data: &[u8],
        base: u64,
        per_unit: &mut F,
    ) -> ParsedChunk<T> {
        let mut out = ParsedChunk {
            // Sized for typical log lines, so the vector rarely grows.
            items: Vec::with_capacity(data.len() / 128 + 1),
            lines: 0,
            error: None,
        };
        // `rest` is `data` from `pos` on.
        let mut rest = data;
        let mut pos = 0;
        while !rest.is_empty() {
            let len = memchr::memchr(b'\n', rest).map_or(rest.len(), |i| i + 1);
            let (line, tail) = rest.split_at_checked(len).unwrap_or((rest, &[]));
            rest = tail;
            let mut at = pos;
            pos += line.len();
            let end = pos;
            out.lines += 1;
            let mut body = trim_line(line);
            // A UTF-8 byte order mark before the first line is not data.
            if base == 0
                && at == 0
                && let Some(after) = body.strip_prefix(super::BOM)
            {
                body = after;
                at = super::BOM.len();
            }
            if body.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let start = base + at as u64;
            let bytes = ByteRange {
                start,
                end: start + body.len() as u64,
            };
            match self.line(body, start, out.lines, per_unit) {
                Ok((hash, candidate)) => out.items.push(Parsed {
                    at,
                    bytes,
                    hash,
                    candidate,
                }),
                // A last line with no line end that does not parse was
                // cut off (a killed writer, a full disk): that record
                // is rejected, the rest stand.
                Err(PartitionError::Malformed {
                    detail,
                    line,
                    offset,
                    ..
                }) => {
                    let candidate = if end == data.len() && data.last() != Some(&b'\n') {
                        Candidate::Truncated { line, detail }
                    } else {
                        Candidate::Malformed {
                            line,
                            offset,
                            detail,
                        }
                    };
                    out.items.push(Parsed {
                        at,
                        bytes,
                        hash: ContentHash::of_bytes(body),
                        candidate,
                    });
                }
                Err(e) => {
                    out.error = Some(e);
                    break;
                }
            }
        }
        out
    }

    fn line<T, F: FnMut(&str, &Record) -> T>(
        &mut self,
        body: &[u8],
        start: u64,
        line_no: u64,
        per_unit: &mut F,
    ) -> Result<(ContentHash, Candidate<T>), PartitionError> {
        if let Err(e) = self.record.parse(body) {
            // A line that parses is valid UTF-8, so the UTF-8 check, whose
            // error takes precedence, is only needed on failure.
            check_utf8(body, start, line_no)?;
            // Nested past the parser's limit: that one record is
            // rejected, as in a JSON array, and the rest stand.
            if e.to_string().contains("recursion limit") {
                return Ok((
                    ContentHash::of_bytes(body),
                    Candidate::TooDeep { line: line_no },
                ));
            }
            return Err(PartitionError::Malformed {
                format: "JSON line",
                offset: start + e.column().saturating_sub(1) as u64,
                line: line_no,
                detail: e.to_string(),
            });
        }
        let record = &self.record;
        let hash = record.hash_with(&mut self.scratch);
        let hash = hash.ok_or_else(|| PartitionError::Malformed {
            format: "JSON line",
            offset: start,
            line: line_no,
            detail: "the value has no canonical JSON form".to_owned(),
        })?;
        // Hashing sorts each object's names, so it finds a repeat for
        // free; which name the parser meets first is looked up only then.
        if self.scratch.repeated
            && let Some(name) = record.repeated_field()
        {
            let name = String::from_utf8_lossy(name).into_owned();
            return Ok((
                hash,
                Candidate::RepeatedField {
                    line: line_no,
                    name,
                },
            ));
        }
        if body.len() as u64 > self.max_unit_bytes {
            return Ok((hash, Candidate::TooLarge));
        }
        let id = match self.key {
            Some(key) => match key_id(record, body, key) {
                Some(id) => id,
                None => return Ok((hash, Candidate::MissingKey)),
            },
            None => format!("c{}", hash.short(16)),
        };
        let extra = per_unit(&id, record);
        Ok((hash, Candidate::Ready { id, extra }))
    }
}

impl Record {
    /// The first field name an object of the record holds twice, in the
    /// order serde's map visitor meets it (a field's value is read before
    /// its name is checked), as [`super::json::parse_value`] names it.
    fn repeated_field(&self) -> Option<&[u8]> {
        self.repeated_in(0)
    }

    fn repeated_in(&self, i: usize) -> Option<&[u8]> {
        match self.nodes.get(i)? {
            Node::Arr { len, .. } => {
                let mut j = i + 1;
                for _ in 0..*len {
                    if let Some(name) = self.repeated_in(j) {
                        return Some(name);
                    }
                    j = self.next(j);
                }
                None
            }
            Node::Obj { len, .. } => {
                let mut names: Vec<&[u8]> = Vec::with_capacity(*len);
                let mut j = i + 1;
                for _ in 0..*len {
                    let name = self.str_at(j).unwrap_or_default();
                    if let Some(inner) = self.repeated_in(j + 1) {
                        return Some(inner);
                    }
                    if names.contains(&name) {
                        return Some(name);
                    }
                    names.push(name);
                    j = self.next(j + 1);
                }
                None
            }
            _ => None,
        }
    }

    /// The index after the value at `i` and its descendants.
    fn next(&self, i: usize) -> usize {
        match self.nodes.get(i) {
            Some(Node::Arr { end, .. } | Node::Obj { end, .. }) => *end,
            _ => i + 1,
        }
    }

    /// The text of a string node; nodes only point into `text`.
    fn bytes(&self, start: usize, len: usize) -> &[u8] {
        self.text.get(start..start + len).unwrap_or_default()
    }

    fn str_at(&self, i: usize) -> Option<&[u8]> {
        match self.nodes.get(i) {
            Some(Node::Str { start, len }) => Some(self.bytes(*start, *len)),
            _ => None,
        }
    }

    fn val_at(&self, i: usize) -> Val {
        match self.nodes.get(i) {
            None | Some(Node::Null) => Val::Null,
            Some(Node::Bool(b)) => Val::Bool(*b),
            Some(Node::U64(n)) => Val::Num(Num::from_integral(*n)),
            Some(Node::I64(n)) => Val::Num(Num::from_integral(*n)),
            Some(Node::F64(f)) => Val::Num(Num::Float(*f)),
            Some(Node::Str { start, len }) => Val::utf8_str(self.bytes(*start, *len).to_vec()),
            Some(Node::Arr { len, .. }) => {
                let mut items = Vec::with_capacity(*len);
                let mut j = i + 1;
                for _ in 0..*len {
                    items.push(self.val_at(j));
                    j = self.next(j);
                }
                Val::Arr(Rc::new(items))
            }
            Some(Node::Obj { len, .. }) => {
                let mut map = Map::with_capacity_and_hasher(*len, Default::default());
                let mut j = i + 1;
                for _ in 0..*len {
                    // A repeated key keeps its first position and its
                    // last value, as `Value`'s ordered map does.
                    map.insert(self.val_at(j), self.val_at(j + 1));
                    j = self.next(j + 1);
                }
                Val::obj(map)
            }
        }
    }

    /// Writes the byte stream `StableHasher::new(Bucket::Unit)` followed by
    /// `serde_json::Value::stable_hash` would feed BLAKE3, then hashes it
    /// in one call: one pass over a few hundred contiguous bytes instead
    /// of dozens of tiny hasher updates.
    fn hash_with(&self, scratch: &mut HashScratch) -> Option<ContentHash> {
        if self.nodes.is_empty() {
            return None;
        }
        scratch.bytes.clear();
        scratch.fields.clear();
        scratch.repeated = false;
        put_bytes(&mut scratch.bytes, UNIT_BUCKET.as_bytes());
        self.encode(0, scratch);
        Some(ContentHash::of_bytes(&scratch.bytes))
    }

    fn encode(&self, i: usize, s: &mut HashScratch) {
        let Some(node) = self.nodes.get(i) else {
            return;
        };
        match *node {
            Node::Null => s.bytes.push(b'n'),
            Node::Bool(b) => s.bytes.push(if b { b'T' } else { b'F' }),
            Node::U64(n) => put_number(&mut s.bytes, |buf| write_int(false, n, buf)),
            Node::I64(n) => put_number(&mut s.bytes, |buf| write_int(n < 0, n.unsigned_abs(), buf)),
            Node::F64(f) => match serde_json::Number::from_f64(f) {
                Some(n) => put_number(&mut s.bytes, |buf| {
                    buf.extend_from_slice(n.to_string().as_bytes())
                }),
                // Never read from JSON: `Value` holds such a float as null.
                None => s.bytes.push(b'n'),
            },
            Node::Str { start, len } => {
                s.bytes.push(b's');
                put_bytes(&mut s.bytes, self.bytes(start, len));
            }
            Node::Arr { len, .. } => {
                s.bytes.push(b'[');
                put_u64(&mut s.bytes, len as u64);
                let mut j = i + 1;
                for _ in 0..len {
                    self.encode(j, s);
                    j = self.next(j);
                }
            }
            Node::Obj { len, .. } => {
                // The fields go on a stack shared with nested objects,
                // so no object needs a buffer of its own.
                let base = s.fields.len();
                let mut j = i + 1;
                for _ in 0..len {
                    let key = match self.nodes.get(j) {
                        Some(Node::Str { start, len }) => (*start, *len),
                        _ => (0, 0),
                    };
                    s.fields.push((key, j + 1));
                    j = self.next(j + 1);
                }
                let key = |f: &((usize, usize), usize)| self.bytes(f.0.0, f.0.1);
                if i == 0 {
                    self.sort_root_fields(s);
                } else if let Some(fields) = s.fields.get_mut(base..) {
                    // Stable, so a repeated key's occurrences stay in
                    // order and the last one (the value `Value` keeps)
                    // is found.
                    fields.sort_by(|a, b| key(a).cmp(key(b)));
                }
                let top = s.fields.len();
                // The field at `k` is kept unless the next one repeats
                // its key.
                let kept = |s: &HashScratch, k: usize| {
                    k + 1 == top
                        || match s.fields.get(k..k + 2) {
                            Some([a, b]) => key(a) != key(b),
                            _ => true,
                        }
                };
                let distinct = (base..top).filter(|&k| kept(s, k)).count();
                s.repeated |= distinct != top - base;
                s.bytes.push(b'o');
                put_u64(&mut s.bytes, distinct as u64);
                for k in base..top {
                    if !kept(s, k) {
                        continue;
                    }
                    let Some(&field) = s.fields.get(k) else {
                        continue;
                    };
                    s.bytes.push(b's');
                    put_bytes(&mut s.bytes, key(&field));
                    self.encode(field.1, s);
                }
                s.fields.truncate(base);
            }
        }
    }
}

impl Record {
    /// Sorts the root object's fields (all of `s.fields`) by key, stably.
    /// Lines of one source mostly repeat the previous line's keys in the
    /// same order, so the order found for those keys is reused.
    fn sort_root_fields(&self, s: &mut HashScratch) {
        let key = |f: &((usize, usize), usize)| self.bytes(f.0.0, f.0.1);
        s.keys.clear();
        for f in &s.fields {
            put_bytes(&mut s.keys, key(f));
        }
        if s.keys != s.root_keys || s.root_order.len() != s.fields.len() {
            s.root_order.clear();
            s.root_order.extend(0..s.fields.len());
            let fields = &s.fields;
            s.root_order
                .sort_by(|&a, &b| fields.get(a).map(key).cmp(&fields.get(b).map(key)));
            std::mem::swap(&mut s.keys, &mut s.root_keys);
        }
        s.sorted.clear();
        s.sorted.extend(
            s.root_order
                .iter()
                .filter_map(|&k| s.fields.get(k).copied()),
        );
        s.fields.clear();
        s.fields.append(&mut s.sorted);
    }
}

/// Buffers of the hash encoding, reused from record to record.
#[derive(Default)]
struct HashScratch {
    /// The root object's keys, length-prefixed, in document order.
    keys: Vec<u8>,
    /// The same for the record whose order is in `root_order`.
    root_keys: Vec<u8>,
    root_order: Vec<usize>,
    sorted: Vec<((usize, usize), usize)>,
    bytes: Vec<u8>,
    /// ((key start, key length) in the text, value index) of the
    /// fields of the objects being encoded.
    fields: Vec<((usize, usize), usize)>,
    /// Whether an object of the record last hashed repeats a name.
    repeated: bool,
}

/// The id a declared key gives, as the JSON array path derives it: an
/// integer too large for 64 bits keeps the digits `line` has.
fn key_id(record: &Record, line: &[u8], key: &str) -> Option<String> {
    let value = record.root().get(key.as_bytes())?;
    let mut text = Vec::new();
    match record.nodes.get(value.at)? {
        Node::Str { start, len } => text.extend_from_slice(record.bytes(*start, *len)),
        Node::U64(n) => write_int(false, *n, &mut text),
        Node::I64(n) => write_int(*n < 0, n.unsigned_abs(), &mut text),
        Node::F64(f) => match super::json::integer_key_text(line, key) {
            Some(digits) => return Some(digits),
            None => text = serde_json::Number::from_f64(*f)?.to_string().into_bytes(),
        },
        Node::Bool(b) => text.extend_from_slice(if *b { b"true" } else { b"false" }),
        _ => return None,
    }
    String::from_utf8(text).ok()
}

fn put_u64(buf: &mut Vec<u8>, v: u64) {
    buf.extend_from_slice(&v.to_le_bytes());
}

fn put_bytes(buf: &mut Vec<u8>, bytes: &[u8]) {
    put_u64(buf, bytes.len() as u64);
    buf.extend_from_slice(bytes);
}

/// A number's text, length first, as `serde_json::Number` displays it.
fn put_number(buf: &mut Vec<u8>, text: impl FnOnce(&mut Vec<u8>)) {
    buf.push(b'#');
    let at = buf.len();
    put_u64(buf, 0);
    text(buf);
    let len = (buf.len() - at - 8) as u64;
    if let Some(slot) = buf.get_mut(at..at + 8) {
        slot.copy_from_slice(&len.to_le_bytes());
    }
}

/// Decimal digits, as `itoa` (which `serde_json::Number` uses) writes
/// them; u64 arithmetic, as 128-bit division showed in profiles.
fn write_int(negative: bool, mut m: u64, buf: &mut Vec<u8>) {
    // u64::MAX has 20 digits.
    let mut digits = [0u8; 20];
    let mut used = 0;
    for d in digits.iter_mut().rev() {
        *d = b'0' + (m % 10) as u8;
        m /= 10;
        used += 1;
        if m == 0 {
            break;
        }
    }
    if negative {
        buf.push(b'-');
    }
    buf.extend_from_slice(digits.get(digits.len() - used..).unwrap_or_default());
}

/// Appends one value to a record.
struct NodeSeed<'r>(&'r mut Record);

impl<'de> DeserializeSeed<'de> for NodeSeed<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

/// Receives the same calls `Value`'s visitor would and records what
/// `Value` would keep.
impl<'de> Visitor<'de> for NodeSeed<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any valid JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<(), E> {
        self.0.nodes.push(Node::Bool(v));
        Ok(())
    }

    fn visit_i64<E>(self, v: i64) -> Result<(), E> {
        self.0.nodes.push(if v < 0 {
            Node::I64(v)
        } else {
            Node::U64(v as u64)
        });
        Ok(())
    }

    fn visit_u64<E>(self, v: u64) -> Result<(), E> {
        self.0.nodes.push(Node::U64(v));
        Ok(())
    }

    fn visit_f64<E>(self, v: f64) -> Result<(), E> {
        // `Value` turns a float it cannot hold into null.
        self.0.nodes.push(if v.is_finite() {
            Node::F64(v)
        } else {
            Node::Null
        });
        Ok(())
    }

    fn visit_borrowed_str<E: serde::de::Error>(self, v: &'de str) -> Result<(), E> {
        let (base, len) = self.0.input;
        match (v.as_ptr() as usize).checked_sub(base) {
            Some(start) if start + v.len() <= len => {
                self.0.nodes.push(Node::Str {
                    start,
                    len: v.len(),
                });
                Ok(())
            }
            _ => self.visit_str(v),
        }
    }

    fn visit_str<E>(self, v: &str) -> Result<(), E> {
        let start = self.0.text.len();
        self.0.text.extend_from_slice(v.as_bytes());
        self.0.nodes.push(Node::Str {
            start,
            len: v.len(),
        });
        Ok(())
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        self.0.nodes.push(Node::Null);
        Ok(())
    }

    fn visit_none<E>(self) -> Result<(), E> {
        self.0.nodes.push(Node::Null);
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let at = self.0.nodes.len();
        self.0.nodes.push(Node::Null);
        let mut len = 0;
        while seq.next_element_seed(NodeSeed(&mut *self.0))?.is_some() {
            len += 1;
        }
        let end = self.0.nodes.len();
        if let Some(node) = self.0.nodes.get_mut(at) {
            *node = Node::Arr { len, end };
        }
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<(), A::Error> {
        let at = self.0.nodes.len();
        self.0.nodes.push(Node::Null);
        let mut len = 0;
        while access.next_key_seed(NodeSeed(&mut *self.0))?.is_some() {
            access.next_value_seed(NodeSeed(&mut *self.0))?;
            len += 1;
        }
        let end = self.0.nodes.len();
        if let Some(node) = self.0.nodes.get_mut(at) {
            *node = Node::Obj { len, end };
        }
        Ok(())
    }
}

/// The sequential half of the partitioner: ordinals, duplicates and
/// coverage, through the one [`Assigner`] every format shares, and the
/// line count that makes a chunk's lines absolute.
struct FastAssigner<'a> {
    assigner: Assigner<'a>,
    /// Lines in the chunks taken so far.
    line_base: u64,
}

impl FastAssigner<'_> {
    fn take<T>(
        &mut self,
        data: &[u8],
        parsed: ParsedChunk<T>,
        emit: &mut dyn FnMut(FastElement<'_, T>),
    ) -> Result<(), PartitionError> {
        for p in parsed.items {
            let Some(raw) = data.get(p.at..p.at + p.bytes.len() as usize) else {
                return Err(PartitionError::Io(io::Error::other(format!(
                    "bytes {}..{} lie outside the chunk that was read",
                    p.bytes.start, p.bytes.end
                ))));
            };
            emit(self.element(p, raw)?);
        }
        if let Some(mut e) = parsed.error {
            if let PartitionError::Malformed { line, .. } | PartitionError::NotUtf8 { line, .. } =
                &mut e
            {
                *line += self.line_base;
            }
            return Err(e);
        }
        self.line_base += parsed.lines;
        Ok(())
    }

    fn element<'r, T>(
        &mut self,
        p: Parsed<T>,
        raw: &'r [u8],
    ) -> Result<FastElement<'r, T>, PartitionError> {
        let bytes = p.bytes;
        let a = &mut self.assigner;
        let line_base = self.line_base;
        let rejected = match p.candidate {
            Candidate::TooLarge => a.too_large(bytes, bytes.len()),
            Candidate::Truncated { line, detail } => a.reject(bytes, "truncated_line", |ordinal| {
                format!(
                    "element {ordinal} at bytes {}..{}, the last line, has no line end and does \
                     not parse (line {}: {detail}); it was cut off",
                    bytes.start,
                    bytes.end,
                    line_base + line
                )
            }),
            Candidate::Malformed {
                line,
                offset,
                detail,
            } => a.reject(bytes, "malformed_line", |ordinal| {
                format!(
                    "element {ordinal} at bytes {}..{} (line {}) is not JSON: {detail} at byte {offset}",
                    bytes.start,
                    bytes.end,
                    line_base + line
                )
            }),
            Candidate::TooDeep { line } => a.reject(bytes, "too_deep", |ordinal| {
                too_deep_detail(ordinal, bytes, line_base + line)
            }),
            Candidate::RepeatedField { line, name } => {
                a.repeated_field(bytes, line_base + line, &name)
            }
            Candidate::MissingKey => a.missing_key(bytes),
            Candidate::Ready { id, extra } => {
                let id = match a.key {
                    Some(_) => Proposed::Key(Some(id)),
                    None => Proposed::Derived(id),
                };
                return Ok(match a.admit(bytes, bytes.len(), id, p.hash)? {
                    Admitted::Unit(unit) => FastElement::Unit { unit, raw, extra },
                    Admitted::Rejected(r) => FastElement::Rejected(r),
                    Admitted::Repeat(r) => FastElement::Repeated(r),
                });
            }
        };
        Ok(FastElement::Rejected(rejected))
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Element, PartitionSpec, partition_all};
    use super::*;
    use crate::jq::to_val;
    use crate::prefilter::{Outcome, Prefilter};
    use fanfold_core::spec::{PrefilterAction, PrefilterRule};

    /// Lines that exercise every kind of value, duplicate and missing
    /// keys, blank lines, CRLF and a missing final newline.
    const SOURCE: &str = concat!(
        "{\"id\": 3, \"level\": \"ERROR\", \"latency_ms\": 900, \"user\": {\"b\": 1, \"a\": [1, 2.5, -3, null, true]}}\n",
        "\n",
        "{\"id\": \"x-1\", \"level\": \"INFO\", \"latency_ms\": 12, \"msg\": \"caf\\u00e9 \\\"q\\\" \\n\"}\r\n",
        "{\"id\": 4, \"level\": \"ERROR\", \"latency_ms\": 1e3, \"big\": 18446744073709551615, \"neg\": -9223372036854775808}\n",
        "   \n",
        "{\"id\": 3, \"level\": \"WARN\"}\n",
        "{\"level\": \"ERROR\", \"latency_ms\": 501}\n",
        "{\"id\": true, \"x\": 0.1, \"y\": -0.0, \"z\": 123456789012345678901234567890}\n",
        "{\"id\": 5, \"dup\": 1, \"dup\": 2, \"e\": {}, \"f\": []}\n",
        "{\"id\": \"5\"}\n",
        "{\"id\": 6, \"pad\": \"0123456789012345678901234567890123456789\"}\n",
        "{\"id\": 7, \"level\": \"ERROR\", \"latency_ms\": 501}"
    );

    fn rules() -> Vec<PrefilterRule> {
        vec![PrefilterRule {
            name: "quiet".into(),
            when: r#"(.level == "ERROR" and .latency_ms > 500) | not"#.into(),
            action: PrefilterAction::Exclude,
            reason: None,
            stage: None,
        }]
    }

    /// An element that is no unit.
    #[derive(Debug, PartialEq)]
    enum NotUnit {
        Rejected(Rejection),
        Repeated(Repeat),
    }

    type Row = (Result<(Unit, Outcome), NotUnit>, Vec<u8>);

    fn serde_path(key: Option<&str>, max: u64) -> Vec<Row> {
        let spec = PartitionSpec::Jsonl {
            key: key.map(str::to_owned),
            kind: "event".into(),
        };
        let pf = Prefilter::compile(&rules()).expect("compiles");
        let mut rows = Vec::new();
        super::super::partition(
            &spec,
            SOURCE.as_bytes(),
            PartitionOptions {
                max_unit_bytes: max,
            },
            |el| match el {
                Element::Unit(u) => {
                    let raw = SOURCE.as_bytes()
                        [u.unit.bytes.start as usize..u.unit.bytes.end as usize]
                        .to_vec();
                    let outcome = pf
                        .decide(u.unit.unit_id.as_str(), to_val(&u.value))
                        .expect("decides");
                    rows.push((Ok((u.unit, outcome)), raw));
                }
                Element::Rejected(r) => rows.push((Err(NotUnit::Rejected(r)), Vec::new())),
                Element::Repeated(r) => rows.push((Err(NotUnit::Repeated(r)), Vec::new())),
            },
        )
        .expect("partitions");
        rows
    }

    fn fast_path(key: Option<&str>, max: u64, threads: usize, chunk: usize) -> Vec<Row> {
        let options = FastOptions {
            partition: PartitionOptions {
                max_unit_bytes: max,
            },
            threads,
            chunk_bytes: chunk,
        };
        let mut rows = Vec::new();
        partition_jsonl(
            key,
            "event",
            ContentHash::of_bytes(SOURCE.as_bytes()),
            SOURCE.as_bytes(),
            options,
            &mut crate::partition::SeenKeys::default(),
            || {
                let pf = Prefilter::compile(&rules()).expect("compiles");
                move |id: &str, r: &Record| pf.decide(id, r.to_val()).expect("decides")
            },
            &mut |el| match el {
                FastElement::Unit { unit, raw, extra } => {
                    rows.push((Ok((unit, extra)), raw.to_vec()))
                }
                FastElement::Rejected(r) => rows.push((Err(NotUnit::Rejected(r)), Vec::new())),
                FastElement::Repeated(r) => rows.push((Err(NotUnit::Repeated(r)), Vec::new())),
            },
        )
        .expect("partitions");
        rows
    }

    #[test]
    fn same_units_hashes_and_decisions_as_the_serde_path() {
        for (key, max) in [(Some("id"), 1 << 20), (None, 1 << 20), (Some("id"), 60)] {
            let want = serde_path(key, max);
            assert!(want.iter().any(|r| r.0.is_ok()));
            for (threads, chunk) in [(1, 1 << 20), (1, 7), (2, 1), (3, 50)] {
                let got = fast_path(key, max, threads, chunk);
                assert_eq!(got, want, "key {key:?}, threads {threads}, chunk {chunk}");
            }
        }
        let keyed = serde_path(Some("id"), 1 << 20);
        let reasons: Vec<&str> = keyed
            .iter()
            .filter_map(|r| match &r.0 {
                Err(NotUnit::Rejected(r)) => Some(r.reason.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(reasons, ["duplicate_key", "missing_key", "repeated_field"]);
    }

    #[test]
    fn content_ids_count_repeats() {
        let src = "{\"a\": 1}\n{\"a\": 1}\n{\"a\": 2}\n";
        let mut ids = Vec::new();
        partition_jsonl(
            None,
            "row",
            ContentHash::of_bytes(src.as_bytes()),
            src.as_bytes(),
            FastOptions::default(),
            &mut crate::partition::SeenKeys::default(),
            || |_: &str, _: &Record| (),
            &mut |el| {
                if let FastElement::Unit { unit, .. } = el {
                    ids.push(unit.unit_id.0)
                }
            },
        )
        .expect("partitions");
        assert_eq!(ids[1], format!("{}-2", ids[0]));
        assert_ne!(ids[2], ids[0]);
    }

    #[test]
    fn errors_match_the_serde_path() {
        let spec = PartitionSpec::Jsonl {
            key: Some("id".into()),
            kind: "event".into(),
        };
        let cases: [&[u8]; 2] = [b"{\"id\": 1}\n{\"id\": 2, \"t\": \"caf\xe9\"}\n", b"\n  \n"];
        for src in cases {
            let want = partition_all(&spec, src, PartitionOptions::default())
                .map(|(_, _, coverage)| coverage)
                .expect_err("fails")
                .to_string();
            for (threads, chunk) in [(1, 1 << 20), (2, 3)] {
                let options = FastOptions {
                    threads,
                    chunk_bytes: chunk,
                    ..FastOptions::default()
                };
                let got = partition_jsonl(
                    Some("id"),
                    "event",
                    ContentHash::of_bytes(src),
                    src,
                    options,
                    &mut crate::partition::SeenKeys::default(),
                    || |_: &str, _: &Record| (),
                    &mut |_| {},
                )
                .expect_err("fails")
                .to_string();
                assert_eq!(got, want);
            }
        }
    }

    /// A line that is not JSON is rejected alike however the input is
    /// cut into chunks and threads.
    #[test]
    fn malformed_lines_are_rejected_alike_at_any_chunking() {
        for src in [
            &b"{\"id\": 1}\n{\"id\": 2}\n\n{\"id\": }\n{\"id\": 4}\n"[..],
            b"{\"id\": 1} x\n{\"id\": 2}\n",
        ] {
            let spec = PartitionSpec::Jsonl {
                key: Some("id".into()),
                kind: "event".into(),
            };
            let (_, want, _) =
                partition_all(&spec, src, PartitionOptions::default()).expect("partitions");
            assert_eq!(want.len(), 1);
            assert_eq!(want[0].reason, "malformed_line");
            for (threads, chunk) in [(1, 1 << 20), (2, 3)] {
                let options = FastOptions {
                    threads,
                    chunk_bytes: chunk,
                    ..FastOptions::default()
                };
                let mut got = Vec::new();
                partition_jsonl(
                    Some("id"),
                    "event",
                    ContentHash::of_bytes(src),
                    src,
                    options,
                    &mut crate::partition::SeenKeys::default(),
                    || |_: &str, _: &Record| (),
                    &mut |e| {
                        if let FastElement::Rejected(r) = e {
                            got.push(r);
                        }
                    },
                )
                .expect("partitions");
                assert_eq!(got, want, "threads {threads}, chunk {chunk}");
            }
        }
    }

    #[test]
    fn hashes_match_for_odd_values() {
        for text in [
            "[]",
            "{}",
            "\"\"",
            "1.5e300",
            "-1",
            "[{\"b\": {\"d\": 1, \"c\": [[]]}, \"a\": null}]",
            "{\"\\u00e9\": 1, \"e\": 2, \"z\": 3}",
        ] {
            let value: serde_json::Value = serde_json::from_str(text).expect("json");
            let mut record = Record::default();
            record.parse(text.as_bytes()).expect("parses");
            assert_eq!(record.unit_hash(), Some(super::super::unit_hash(&value)));
            assert_eq!(record.to_val(), to_val(&value), "{text}");
        }
    }

    #[test]
    fn hashes_stay_right_when_key_orders_repeat() {
        let mut record = Record::default();
        let mut scratch = HashScratch::default();
        for text in [
            r#"{"b": 1, "a": 2}"#,
            r#"{"b": 3, "a": {"y": 1, "x": 2}}"#,
            r#"{"a": 1, "b": 2}"#,
            r#"{"b": 5, "a": 6, "b": 7}"#,
            r#"{"b": 5, "a": 6, "b": 8}"#,
            r#"{"b": 1, "a": 2}"#,
            r#"{"b": 1, "aa": 2}"#,
            r#"{"bb": 1, "a": 2}"#,
        ] {
            let value: serde_json::Value = serde_json::from_str(text).expect("json");
            record.parse(text.as_bytes()).expect("parses");
            assert_eq!(
                record.hash_with(&mut scratch),
                Some(super::super::unit_hash(&value)),
                "{text}"
            );
        }
    }

    #[test]
    fn integer_runs_detect_repeats_exactly() {
        let mut runs = crate::partition::IntRuns::default();
        for n in [5, 7, 6, 4, 8, 10, 0, u64::MAX] {
            assert!(runs.insert(n), "{n}");
        }
        assert_eq!(runs.runs.len(), 4);
        for n in [4, 5, 6, 7, 8, 10, 0, u64::MAX] {
            assert!(!runs.insert(n), "{n}");
        }
        assert!(runs.insert(9));
        assert_eq!(runs.runs.len(), 3);
    }

    /// Ids compare as text: `7` and `07` differ, and an integer past 64
    /// bits is an id of its own; the earlier unit comes back on a repeat.
    #[test]
    fn ids_in_memory_return_their_first_unit() {
        use crate::partition::{SeenIds, SeenKeys, UnitPlace};
        let mut seen = SeenKeys::default();
        let place = |ordinal: u64| UnitPlace {
            ordinal,
            byte: ordinal * 10,
            unit_hash: ContentHash::of_bytes(&ordinal.to_le_bytes()),
        };
        // Integers first ascending, then not: found by halves, then
        // through an index built on the first repeat and kept up after.
        let ids = [
            "7",
            "9",
            "007",
            "18446744073709551616",
            "x",
            "3",
            "18446744073709551615",
        ];
        for (n, id) in ids.iter().enumerate() {
            assert_eq!(
                seen.claim(id, place(n as u64)).expect("claims"),
                None,
                "{id}"
            );
        }
        for (n, id) in ids.iter().enumerate() {
            assert_eq!(
                seen.claim(id, place(99)).expect("claims"),
                Some(place(n as u64)),
                "{id}"
            );
        }
        assert_eq!(seen.claim("8", place(100)).expect("claims"), None);
        assert_eq!(
            seen.claim("8", place(101)).expect("claims"),
            Some(place(100))
        );
    }
}
