//! Tables from Python: anything that speaks Arrow's PyCapsule stream
//! interface (`__arrow_c_stream__`: pyarrow, polars, pandas through
//! pyarrow, DuckDB) crosses without a per-row Python loop and is written
//! here as the JSON Lines the engine reads, batch by batch, while the
//! interpreter is free.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use arrow_array::RecordBatchReader;
use arrow_array::ffi_stream::{FFI_ArrowArrayStream, RecordBatchStreamReader};
use arrow_json::WriterBuilder;
use arrow_json::writer::LineDelimited;
use arrow_schema::{DataType, Schema};
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyCapsuleMethods};
use sha2::{Digest, Sha256};

use crate::InputError;

/// The name the Arrow PyCapsule interface gives a stream's capsule.
const STREAM_CAPSULE: &std::ffi::CStr = c"arrow_array_stream";

/// Writes `table` (an object with `__arrow_c_stream__`) to `path` as JSON
/// Lines, one object per row with every column (a null is written as
/// `null`, so each record has the table's fields), and returns the SHA-256
/// of what it wrote, in hex. A column Arrow cannot write as JSON, or a
/// stream that fails, is an `InputError` naming it; `path` is then left
/// to the caller to remove.
#[pyfunction]
pub fn table_jsonl(py: Python<'_>, table: &Bound<'_, PyAny>, path: PathBuf) -> PyResult<String> {
    let exported = table.call_method0("__arrow_c_stream__")?;
    let capsule = exported
        .cast::<PyCapsule>()
        .map_err(|_| InputError::new_err("`__arrow_c_stream__` did not return a PyCapsule"))?;
    let pointer = capsule.pointer_checked(Some(STREAM_CAPSULE))?;
    // SAFETY: the capsule is named `arrow_array_stream`, which the Arrow
    // PyCapsule interface reserves for a pointer to an
    // `ArrowArrayStream`; `from_raw` moves the stream out and leaves a
    // released one behind, so the capsule's destructor frees nothing twice.
    let stream = unsafe { FFI_ArrowArrayStream::from_raw(pointer.cast().as_ptr()) };
    let reader = RecordBatchStreamReader::try_new(stream)
        .map_err(|e| InputError::new_err(format!("reading the table's Arrow stream: {e}")))?;
    check_columns(&reader.schema()).map_err(InputError::new_err)?;
    py.detach(|| write_jsonl(reader, &path))
        .map_err(InputError::new_err)
}

/// Refuses what JSON Lines would not carry faithfully: two columns of one
/// name (a record would hold the key twice, and a reader keeps one), and
/// bytes (the JSON writer spells them in hex, so a model would read hex,
/// not the text).
fn check_columns(schema: &Schema) -> Result<(), String> {
    let mut seen = std::collections::HashSet::new();
    for field in schema.fields() {
        if !seen.insert(field.name().as_str()) {
            return Err(format!(
                "the table has two columns named {:?}; each record needs one of each",
                field.name()
            ));
        }
        if matches!(
            field.data_type(),
            DataType::Binary
                | DataType::LargeBinary
                | DataType::BinaryView
                | DataType::FixedSizeBinary(_)
        ) {
            return Err(format!(
                "column {:?} holds bytes ({}); decode it to text first (JSON carries text, not bytes)",
                field.name(),
                field.data_type()
            ));
        }
    }
    Ok(())
}

/// Every batch of `reader` as JSON Lines into `path`; the SHA-256 of the
/// bytes written, in hex.
fn write_jsonl(reader: RecordBatchStreamReader, path: &Path) -> Result<String, String> {
    let file = File::create(path).map_err(|e| format!("writing {}: {e}", path.display()))?;
    let sink = Hashed {
        inner: BufWriter::with_capacity(1 << 20, file),
        digest: Sha256::new(),
    };
    let mut writer = WriterBuilder::new()
        .with_explicit_nulls(true)
        .build::<_, LineDelimited>(sink);
    for (at, batch) in reader.enumerate() {
        let batch = batch.map_err(|e| format!("reading batch {at} of the table: {e}"))?;
        writer
            .write(&batch)
            .map_err(|e| format!("writing batch {at} of the table as JSON: {e}"))?;
    }
    writer
        .finish()
        .map_err(|e| format!("writing the table as JSON: {e}"))?;
    let mut sink = writer.into_inner();
    sink.inner
        .flush()
        .map_err(|e| format!("writing {}: {e}", path.display()))?;
    sink.inner
        .get_ref()
        .sync_all()
        .map_err(|e| format!("writing {}: {e}", path.display()))?;
    Ok(sink
        .digest
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// A writer that hashes what passes through it.
struct Hashed<W> {
    inner: W,
    digest: Sha256,
}

impl<W: Write> Write for Hashed<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.digest.update(buf.get(..n).unwrap_or(buf));
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}
