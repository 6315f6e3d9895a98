//! Deterministic structural partition: source bytes -> units with stable ids.
//!
//! Coverage is checkable by construction: every element the parser finds is
//! reported as a unit, as a [`Rejection`] with a reason, or as a [`Repeat`]
//! of an earlier unit (the same key and content), and [`Coverage`] counts
//! all three. A malformed source is an error that names the
//! byte offset and line; nothing is dropped silently.

//!
//! One module per format, each feeding elements to the one [`assign`]er,
//! which gives ids, rejects what cannot be a unit and keeps the coverage.

use std::collections::HashMap;
use std::io::BufRead;

use fanfold_core::spec::PartitionSpec;
use fanfold_core::{ByteRange, ContentHash, StableHash, Unit};
use serde::{Deserialize, Serialize};
use serde_json::Value;

mod array;
mod assign;
mod code;
pub mod documents;
mod email;
mod files;
mod json;
pub mod jsonl;
mod lines;
mod markdown;
mod nested;
mod table;
#[cfg(test)]
mod tests;

use array::json_array;
use assign::Assigner;
pub use assign::{CompactSeen, ConfirmRepeat, IntRuns, SeenIds, SeenKeys, UnitPlace, key_flaw};
use lines::lines;
pub use nested::{UNIT_FIELD, UnitPath, unit_field};
pub use table::csv_header;
use table::csv_rows;

/// Largest unit a micro-context is given; larger elements are rejected with
/// reason `too_large` (coverage keeps them) rather than sent to a model.
pub const DEFAULT_MAX_UNIT_BYTES: u64 = 4 * 1024 * 1024;

/// A unit and its parsed value.
#[derive(Clone, Debug)]
pub struct PartUnit {
    pub unit: Unit,
    pub value: Value,
}

/// An element of the source that is deliberately not a unit.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Rejection {
    pub ordinal: u64,
    pub bytes: ByteRange,
    /// `duplicate_key` (a key an earlier unit has, with other content),
    /// `missing_key`, `bad_key`, `repeated_field` (an object holding one
    /// name twice), `too_large`, `too_deep`, `truncated_line` (a last line
    /// cut off), `malformed_line`, `unterminated_quote` (a CSV quote that
    /// runs on past its line and is never closed where a field ends).
    pub reason: String,
    pub detail: String,
}

/// An element that repeats an earlier unit exactly: the same key, and the
/// same content once parsed (the same canonical hash). It is that unit,
/// judged once; counted, and named, but neither a unit nor a rejection of
/// its own, so it leaves nothing unjudged.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Repeat {
    pub ordinal: u64,
    pub bytes: ByteRange,
    /// The id it shares with the unit it repeats.
    pub unit_id: String,
    /// Where that unit is.
    pub first_ordinal: u64,
    pub first_byte: u64,
    pub detail: String,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Coverage {
    pub elements: u64,
    pub units: u64,
    pub rejected: u64,
    /// Elements that repeat an earlier unit exactly ([`Repeat`]).
    #[serde(default)]
    pub repeated_identical: u64,
}

impl Coverage {
    /// Every element is a unit, an explicit rejection or an identical
    /// repeat of a unit.
    pub fn is_complete(&self) -> bool {
        self.units + self.rejected + self.repeated_identical == self.elements
    }
}

/// The UTF-8 byte order mark some tools write before the first byte.
const BOM: &[u8] = b"\xEF\xBB\xBF";

/// The deepest nesting serde_json parses.
const MAX_DEPTH: usize = 128;

#[derive(Debug, thiserror::Error)]
pub enum PartitionError {
    #[error(
        "the input is empty: there is nothing to partition (check the file or the command's output)"
    )]
    Empty,
    #[error("malformed {format} at byte {offset} (line {line}): {detail}")]
    Malformed {
        format: &'static str,
        offset: u64,
        line: u64,
        detail: String,
    },
    #[error(
        "invalid UTF-8 at byte {offset} (line {line}): the input must be UTF-8 text; convert it first (e.g. `iconv -f latin1 -t utf-8`)"
    )]
    NotUtf8 { offset: u64, line: u64 },
    #[error(
        "no file matches the glob {glob:?} (hidden files and folders are skipped); check the folder and the partition's `glob`"
    )]
    NoFiles { glob: String },
    #[error("invalid record_start regex: {0}")]
    Regex(#[from] regex::Error),
    #[error("csv delimiter must be one byte, got {0:?}")]
    Delimiter(String),
    #[error("reading the input: {0}")]
    Io(#[from] std::io::Error),
    /// Partition settings that cannot go together or cannot be read.
    #[error("partition: {0}")]
    Settings(String),
}

/// Options that are runtime knobs, not meaning.
#[derive(Clone, Copy, Debug)]
pub struct PartitionOptions {
    pub max_unit_bytes: u64,
}

impl Default for PartitionOptions {
    fn default() -> Self {
        PartitionOptions {
            max_unit_bytes: DEFAULT_MAX_UNIT_BYTES,
        }
    }
}

/// One element of the source, as the partitioner emits it.
pub enum Element {
    Unit(PartUnit),
    Rejected(Rejection),
    Repeated(Repeat),
}

/// The canonical hash of a unit's content.
pub fn unit_hash(value: &Value) -> ContentHash {
    value.key_in(fanfold_core::Bucket::Unit)
}

/// The content hash a unit of `spec`'s format has, from its value: the
/// canonical JSON hash, or for log lines the hash of the text itself.
pub fn content_hash(spec: &PartitionSpec, value: &Value) -> ContentHash {
    match (spec, value.get("text")) {
        (PartitionSpec::Lines { .. }, Some(Value::String(text))) => {
            ContentHash::of_bytes(text.as_bytes())
        }
        (PartitionSpec::Files { .. }, _) => files::hash(value),
        _ => unit_hash(value),
    }
}

/// Partitions `source` into elements, calling `emit` for each in source
/// order, with every id remembered in memory. Returns the coverage.
pub fn partition(
    spec: &PartitionSpec,
    source: &[u8],
    options: PartitionOptions,
    mut emit: impl FnMut(Element),
) -> Result<Coverage, PartitionError> {
    let source_hash = ContentHash::of_bytes(source);
    partition_reader(
        spec,
        source_hash,
        source,
        options,
        &mut SeenKeys::default(),
        &mut emit,
    )
}

/// The streaming form: reads `reader` once and holds one element at a time
/// (plus a read-ahead window of about a megabyte). JSONL goes through
/// [`jsonl`] on the calling thread, the one JSONL parser there is.
pub fn partition_reader(
    spec: &PartitionSpec,
    source_hash: ContentHash,
    reader: impl BufRead + Send,
    options: PartitionOptions,
    seen: &mut dyn SeenIds,
    emit: &mut dyn FnMut(Element),
) -> Result<Coverage, PartitionError> {
    if let PartitionSpec::Jsonl { key, kind } = spec {
        let fast = jsonl::FastOptions {
            partition: options,
            threads: 1,
            chunk_bytes: 1 << 20,
        };
        let mut failed = None;
        let coverage = jsonl::partition_jsonl(
            key.as_deref(),
            kind,
            source_hash,
            reader,
            fast,
            seen,
            || |_: &str, _: &jsonl::Record| (),
            &mut |el| match el {
                jsonl::FastElement::Unit { unit, raw, .. } => {
                    // The line parsed once already; this cannot fail.
                    match serde_json::from_slice(raw) {
                        Ok(value) => emit(Element::Unit(PartUnit { unit, value })),
                        Err(e) => {
                            failed.get_or_insert(PartitionError::Malformed {
                                format: "JSON line",
                                offset: unit.bytes.start,
                                line: 0,
                                detail: e.to_string(),
                            });
                        }
                    }
                }
                jsonl::FastElement::Rejected(r) => emit(Element::Rejected(r)),
                jsonl::FastElement::Repeated(r) => emit(Element::Repeated(r)),
            },
        )?;
        return match failed {
            Some(e) => Err(e),
            None => Ok(coverage),
        };
    }
    let inner = nested::Inner::of(spec)?;
    let (key, kind) = match spec {
        // The elements at a path are keyed by their own field; a record's
        // key only names them when they have none.
        PartitionSpec::JsonArray {
            element_key: Some(element_key),
            kind,
            ..
        } => (Some(element_key.as_str()), kind.as_str()),
        PartitionSpec::JsonArray { key, kind, .. }
        | PartitionSpec::Jsonl { key, kind }
        | PartitionSpec::Csv { key, kind, .. } => (key.as_deref(), kind.as_str()),
        PartitionSpec::Lines { kind, .. }
        | PartitionSpec::Files { kind, .. }
        | PartitionSpec::Email { kind, .. }
        | PartitionSpec::Markdown { kind, .. }
        | PartitionSpec::Code { kind, .. } => (None, kind.as_str()),
    };
    let mut assigner = Assigner::new(kind, key, source_hash, options, seen);
    match spec {
        PartitionSpec::JsonArray {
            key: record_key, ..
        } => json_array(reader, &inner, record_key.as_deref(), &mut assigner, emit)?,
        PartitionSpec::Jsonl { .. } => {}
        PartitionSpec::Csv { delimiter, .. } => {
            csv_rows(reader, delimiter.as_deref(), &mut assigner, emit)?
        }
        PartitionSpec::Lines { record_start, .. } => {
            let start = record_start.as_deref().map(regex::Regex::new).transpose()?;
            lines(reader, start.as_ref(), &mut assigner, emit)?
        }
        PartitionSpec::Files { .. }
        | PartitionSpec::Email { .. }
        | PartitionSpec::Markdown { .. }
        | PartitionSpec::Code { .. } => {
            let format = spec.type_name();
            let hash = |value: &Value| content_hash(spec, value);
            let takes_bytes = matches!(spec, PartitionSpec::Email { .. });
            documents::each_piece(
                reader,
                format,
                takes_bytes,
                &hash,
                &mut assigner,
                emit,
                &mut splitter(spec),
            )?
        }
    }
    // An empty array is an answer (`gh` found nothing); an input with no
    // records at all is more likely a mistake.
    if assigner.coverage.elements == 0 {
        if let Some(glob) = spec.document_glob() {
            return Err(PartitionError::NoFiles {
                glob: glob.to_owned(),
            });
        }
        if !matches!(spec, PartitionSpec::JsonArray { .. }) {
            return Err(PartitionError::Empty);
        }
    }
    Ok(assigner.coverage)
}

fn line_of(bytes: &[u8], offset: usize) -> u64 {
    memchr::memchr_iter(b'\n', bytes.get(..offset).unwrap_or(bytes)).count() as u64 + 1
}

fn check_utf8(bytes: &[u8], base: u64, line_base: u64) -> Result<(), PartitionError> {
    if let Err(e) = std::str::from_utf8(bytes) {
        let at = e.valid_up_to();
        return Err(PartitionError::NotUtf8 {
            offset: base + at as u64,
            line: line_base + line_of(bytes, at) - 1,
        });
    }
    Ok(())
}

/// Why a record nested past the parser's depth limit is rejected.
fn too_deep_detail(ordinal: u64, bytes: ByteRange, line: u64) -> String {
    format!(
        "element {ordinal} at bytes {}..{} (line {line}) is nested more than {MAX_DEPTH} levels deep",
        bytes.start, bytes.end
    )
}

fn trim_line(mut line: &[u8]) -> &[u8] {
    while let [rest @ .., b'\n' | b'\r'] = line {
        line = rest;
    }
    line
}

/// What a per-unit function sees of a unit while the source streams by:
/// the JSONL fast path's flat record, or a parsed value for other formats.
pub enum UnitView<'a> {
    Record(&'a jsonl::Record),
    Value(&'a Value),
}

impl UnitView<'_> {
    /// The unit as a jq value.
    pub fn to_val(&self) -> jaq_json::Val {
        match self {
            UnitView::Record(r) => r.to_val(),
            UnitView::Value(v) => crate::jq::to_val(v),
        }
    }
}

/// One element of a streamed partition.
pub enum Streamed<'a, T> {
    /// A unit, its value as JSON text (the line itself for JSONL), and what
    /// the per-unit function returned for it.
    Unit {
        unit: Unit,
        json: &'a [u8],
        extra: T,
    },
    Rejected(Rejection),
    Repeated(Repeat),
}

/// Runtime knobs of [`stream`]; none of them changes the result.
#[derive(Clone, Copy, Debug)]
pub struct StreamOptions {
    pub partition: PartitionOptions,
    /// Worker threads for JSONL (other formats parse on the calling thread).
    pub threads: usize,
}

/// The one partition entry point for large sources: every format, read once
/// from `reader`, with `per_unit` run on each element that can become a unit
/// (on JSONL's worker threads; `make_per_unit` is called once per thread).
/// Memory is bounded by a few chunks per thread plus what `seen` keeps; a
/// JSON array is read whole first.
pub fn stream<T, R, M, F>(
    spec: &PartitionSpec,
    source_hash: ContentHash,
    reader: R,
    options: StreamOptions,
    seen: &mut dyn SeenIds,
    make_per_unit: M,
    emit: &mut dyn FnMut(Streamed<'_, T>),
) -> Result<Coverage, PartitionError>
where
    T: Send,
    R: std::io::Read + Send,
    M: Fn() -> F + Sync,
    F: FnMut(&str, UnitView<'_>) -> T,
{
    if let PartitionSpec::Jsonl { key, kind } = spec {
        let fast = jsonl::FastOptions {
            partition: options.partition,
            threads: options.threads,
            chunk_bytes: 1 << 20,
        };
        return jsonl::partition_jsonl(
            key.as_deref(),
            kind,
            source_hash,
            reader,
            fast,
            seen,
            || {
                let mut f = make_per_unit();
                move |id: &str, r: &jsonl::Record| f(id, UnitView::Record(r))
            },
            &mut |el| match el {
                jsonl::FastElement::Unit { unit, raw, extra } => emit(Streamed::Unit {
                    unit,
                    json: raw,
                    extra,
                }),
                jsonl::FastElement::Rejected(r) => emit(Streamed::Rejected(r)),
                jsonl::FastElement::Repeated(r) => emit(Streamed::Repeated(r)),
            },
        );
    }
    let mut per_unit = make_per_unit();
    let mut json = Vec::new();
    partition_reader(
        spec,
        source_hash,
        std::io::BufReader::with_capacity(1 << 20, reader),
        options.partition,
        seen,
        &mut |el| match el {
            Element::Unit(u) => {
                let extra = per_unit(u.unit.unit_id.as_str(), UnitView::Value(&u.value));
                json.clear();
                // Writing a `Value` to memory cannot fail.
                let _ = serde_json::to_writer(&mut json, &u.value);
                emit(Streamed::Unit {
                    unit: u.unit,
                    json: &json,
                    extra,
                });
            }
            Element::Rejected(r) => emit(Streamed::Rejected(r)),
            Element::Repeated(r) => emit(Streamed::Repeated(r)),
        },
    )
}

/// Every unit inside the record at `bytes`, by id, for a partition whose
/// units lie inside records (`unit_fields`, `path`); `None` for any other,
/// whose units are read back one by one with [`reread`].
pub fn reread_record(
    spec: &PartitionSpec,
    bytes: &[u8],
) -> Result<Option<HashMap<String, Value>>, PartitionError> {
    let inner = nested::Inner::of(spec)?;
    match spec {
        PartitionSpec::JsonArray { key, .. } if !inner.is_whole() => {
            nested::record_pieces(&inner, key.as_deref(), bytes)
                .map(Some)
                .map_err(|detail| PartitionError::Malformed {
                    format: spec.type_name(),
                    offset: 0,
                    line: 0,
                    detail,
                })
        }
        _ => Ok(None),
    }
}

/// Reads one unit's value back from its own bytes in the source: the
/// independent read-back `verify` does. `header` is a CSV source's header
/// row; `first_line` is a log unit's line number.
pub fn reread(
    spec: &PartitionSpec,
    bytes: &[u8],
    header: Option<&[u8]>,
    first_line: u64,
    id: &str,
) -> Result<Value, PartitionError> {
    let malformed = |detail: String| PartitionError::Malformed {
        format: spec.type_name(),
        offset: 0,
        line: first_line,
        detail,
    };
    let inner = nested::Inner::of(spec)?;
    match spec {
        // A unit inside a record: the record is split again and the unit
        // found by its id.
        PartitionSpec::JsonArray { key, .. } if !inner.is_whole() => {
            nested::reread_piece(&inner, key.as_deref(), bytes, id).map_err(malformed)
        }
        PartitionSpec::JsonArray { .. } | PartitionSpec::Jsonl { .. } => {
            serde_json::from_slice(bytes).map_err(|e| malformed(e.to_string()))
        }
        PartitionSpec::Csv { delimiter, .. } => {
            table::reread_row(bytes, header, delimiter.as_deref()).map_err(malformed)
        }
        PartitionSpec::Lines { .. } => lines::reread_record(bytes, first_line).map_err(malformed),
        PartitionSpec::Files { .. }
        | PartitionSpec::Email { .. }
        | PartitionSpec::Markdown { .. }
        | PartitionSpec::Code { .. } => documents::pieces_of(
            bytes,
            matches!(spec, PartitionSpec::Email { .. }),
            &mut splitter(spec),
        )
        .map_err(malformed)?
        .into_iter()
        .find(|p| p.id == id)
        .map(|p| p.value)
        .ok_or_else(|| malformed(format!("no unit `{id}` in the document at these bytes"))),
    }
}

/// The document format's split, for a format that reads documents.
fn splitter(spec: &PartitionSpec) -> Box<documents::Split<'static>> {
    match spec {
        PartitionSpec::Email { .. } => Box::new(email::split),
        PartitionSpec::Markdown { .. } => Box::new(markdown::split),
        PartitionSpec::Code { .. } => Box::new(code::split),
        _ => Box::new(files::split),
    }
}

/// Collects all elements into memory: convenient for the engine and tests.
/// Identical repeats are only counted, in the coverage ([`partition_parts`]
/// keeps them too).
pub fn partition_all(
    spec: &PartitionSpec,
    source: &[u8],
    options: PartitionOptions,
) -> Result<(Vec<PartUnit>, Vec<Rejection>, Coverage), PartitionError> {
    let parts = partition_parts(spec, source, options)?;
    Ok((parts.units, parts.rejections, parts.coverage))
}

/// Every element of a source, by what it became.
#[derive(Debug, Default)]
pub struct Parts {
    pub units: Vec<PartUnit>,
    pub rejections: Vec<Rejection>,
    pub repeats: Vec<Repeat>,
    pub coverage: Coverage,
}

/// Collects all elements into memory, identical repeats included.
pub fn partition_parts(
    spec: &PartitionSpec,
    source: &[u8],
    options: PartitionOptions,
) -> Result<Parts, PartitionError> {
    let (mut units, mut rejections, mut repeats) = (Vec::new(), Vec::new(), Vec::new());
    let coverage = partition(spec, source, options, |el| match el {
        Element::Unit(u) => units.push(u),
        Element::Rejected(r) => rejections.push(r),
        Element::Repeated(r) => repeats.push(r),
    })?;
    Ok(Parts {
        units,
        rejections,
        repeats,
        coverage,
    })
}
