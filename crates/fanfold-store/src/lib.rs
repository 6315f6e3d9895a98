//! The store: one SQLite file per project directory, readable with `sqlite3`.
//!
//! Tables: `artifacts` (immutable source bytes by BLAKE3 hash), `units` and
//! `rejections` (the partition of each artifact), `facts` (decided stage
//! outputs by content key), `fold_nodes` (fold tree nodes by key), `runs`,
//! `run_units` (each unit's outcome in a run), `run_events`, and `batches`
//! with `batch_requests` (provider batches and the content keys of the
//! requests in them, so a run stopped while a batch is pending collects it
//! when run again).
//!
//! Architecture Invariant: every write is a single statement or one
//! transaction, in WAL mode, so a process killed at any instant leaves a
//! consistent file, and a rerun finds every fact that was written before the
//! kill. Only decided facts (positive, negative, abstain) enter `facts`:
//! a failure is never cached as an answer.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use fanfold_core::{ContentHash, FactRecord, Unit};
use rusqlite::{Connection, OptionalExtension, params};
use serde::{Deserialize, Serialize};

/// Bumped when the tables change shape; an older file is refused, not
/// silently misread.
pub const SCHEMA_VERSION: &str = "fanfold-store-v1";

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("store {path}: {source}")]
    Sqlite {
        path: String,
        source: rusqlite::Error,
    },
    #[error(
        "store {path} has schema {found}, this fanfold needs {SCHEMA_VERSION}; move it aside to start fresh"
    )]
    Version { path: String, found: String },
    #[error("store {path}: record does not decode: {detail}")]
    Decode { path: String, detail: String },
    #[error("refusing to cache a `{status}` fact: only decided answers are cached")]
    NotCacheable { status: String },
}

/// A partition rejection as stored.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RejectionRow {
    pub ordinal: u64,
    pub reason: String,
    pub detail: String,
    pub byte_start: u64,
    pub byte_end: u64,
}

/// One unit's outcome in one run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunUnitRow {
    pub unit_id: String,
    /// The stage, or `prefilter` for an exclusion.
    pub stage: String,
    /// A fact status, or `excluded`.
    pub status: String,
    pub reason: Option<String>,
    pub fact_key: Option<ContentHash>,
}

/// A provider batch as recorded.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BatchRow {
    pub batch_id: String,
    pub provider: String,
    /// The API root (never a credential).
    pub endpoint: String,
    /// `open` until its results were handed back (`consumed`) or it
    /// failed as a whole (`failed`).
    pub state: String,
    pub requests: u64,
    pub submitted_ms: u64,
    pub closed_ms: Option<u64>,
}

pub struct Store {
    conn: Mutex<Connection>,
    path: PathBuf,
}

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS artifacts (
    hash TEXT PRIMARY KEY, len INTEGER NOT NULL, origin TEXT NOT NULL,
    created_ms INTEGER NOT NULL, bytes BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS units (
    source_hash TEXT NOT NULL, unit_id TEXT NOT NULL, ordinal INTEGER NOT NULL,
    unit_kind TEXT NOT NULL, unit_hash TEXT NOT NULL,
    byte_start INTEGER NOT NULL, byte_end INTEGER NOT NULL,
    PRIMARY KEY (source_hash, unit_id));
CREATE TABLE IF NOT EXISTS rejections (
    source_hash TEXT NOT NULL, ordinal INTEGER NOT NULL, reason TEXT NOT NULL,
    detail TEXT NOT NULL, byte_start INTEGER NOT NULL, byte_end INTEGER NOT NULL,
    PRIMARY KEY (source_hash, ordinal));
CREATE TABLE IF NOT EXISTS facts (
    key TEXT PRIMARY KEY, unit_id TEXT NOT NULL, unit_hash TEXT NOT NULL,
    stage TEXT NOT NULL, stage_version INTEGER NOT NULL, status TEXT NOT NULL,
    record TEXT NOT NULL, created_ms INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS facts_by_unit ON facts (unit_id, stage);
CREATE TABLE IF NOT EXISTS embeddings (
    key TEXT PRIMARY KEY, model TEXT NOT NULL, dim INTEGER NOT NULL,
    vector BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS batches (
    batch_id TEXT PRIMARY KEY, provider TEXT NOT NULL, endpoint TEXT NOT NULL,
    state TEXT NOT NULL, requests INTEGER NOT NULL,
    submitted_ms INTEGER NOT NULL, closed_ms INTEGER);
CREATE TABLE IF NOT EXISTS batch_requests (
    request_key TEXT NOT NULL, batch_id TEXT NOT NULL, custom_id TEXT NOT NULL,
    PRIMARY KEY (request_key, batch_id));
CREATE TABLE IF NOT EXISTS fold_nodes (
    key TEXT PRIMARY KEY, level INTEGER NOT NULL, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY, spec_name TEXT NOT NULL, spec_hash TEXT NOT NULL,
    source_hash TEXT NOT NULL, started_ms INTEGER NOT NULL, finished_ms INTEGER,
    stop_reason TEXT, certificate TEXT);
CREATE TABLE IF NOT EXISTS run_units (
    run_id TEXT NOT NULL, unit_id TEXT NOT NULL, stage TEXT NOT NULL,
    status TEXT NOT NULL, reason TEXT, fact_key TEXT,
    PRIMARY KEY (run_id, unit_id, stage));
CREATE TABLE IF NOT EXISTS run_events (
    run_id TEXT NOT NULL, seq INTEGER NOT NULL, at_ms INTEGER NOT NULL,
    kind TEXT NOT NULL, payload TEXT NOT NULL, PRIMARY KEY (run_id, seq));
";

impl Store {
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        let p = path.display().to_string();
        let sql = |source| StoreError::Sqlite {
            path: p.clone(),
            source,
        };
        if let Some(dir) = path.parent()
            && !dir.as_os_str().is_empty()
        {
            // A missing folder surfaces as SQLite's "unable to open" below.
            let _ = std::fs::create_dir_all(dir);
        }
        let conn = Connection::open(path).map_err(sql)?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(sql)?;
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(sql)?;
        conn.busy_timeout(std::time::Duration::from_secs(10))
            .map_err(sql)?;
        conn.execute_batch(SCHEMA).map_err(sql)?;
        let found: Option<String> = conn
            .query_row("SELECT value FROM meta WHERE key = 'schema'", [], |r| {
                r.get(0)
            })
            .optional()
            .map_err(sql)?;
        match found {
            None => {
                conn.execute(
                    "INSERT INTO meta (key, value) VALUES ('schema', ?1)",
                    [SCHEMA_VERSION],
                )
                .map_err(sql)?;
            }
            Some(v) if v == SCHEMA_VERSION => {}
            Some(v) => return Err(StoreError::Version { path: p, found: v }),
        }
        Ok(Store {
            conn: Mutex::new(conn),
            path: path.to_owned(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn conn(&self) -> MutexGuard<'_, Connection> {
        // A panic while holding the lock cannot leave SQLite inconsistent:
        // statements are atomic on their own.
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn sql(&self, source: rusqlite::Error) -> StoreError {
        StoreError::Sqlite {
            path: self.path.display().to_string(),
            source,
        }
    }

    fn decode(&self, detail: impl ToString) -> StoreError {
        StoreError::Decode {
            path: self.path.display().to_string(),
            detail: detail.to_string(),
        }
    }

    /// Stores source bytes under their hash; storing the same bytes twice is
    /// a no-op, and stored bytes are never rewritten.
    pub fn put_artifact(
        &self,
        hash: &ContentHash,
        bytes: &[u8],
        origin: &str,
    ) -> Result<bool, StoreError> {
        let n = self
            .conn()
            .execute(
                "INSERT OR IGNORE INTO artifacts (hash, len, origin, created_ms, bytes) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![hash.to_hex(), bytes.len() as i64, origin, now_ms() as i64, bytes],
            )
            .map_err(|e| self.sql(e))?;
        Ok(n == 1)
    }

    pub fn get_artifact(&self, hash: &ContentHash) -> Result<Option<Vec<u8>>, StoreError> {
        self.conn()
            .query_row(
                "SELECT bytes FROM artifacts WHERE hash = ?1",
                [hash.to_hex()],
                |r| r.get(0),
            )
            .optional()
            .map_err(|e| self.sql(e))
    }

    /// Records an artifact's partition in one transaction.
    pub fn put_partition(
        &self,
        source: &ContentHash,
        units: &[&Unit],
        rejections: &[RejectionRow],
    ) -> Result<(), StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction().map_err(|e| self.sql(e))?;
        {
            let mut ins = tx
                .prepare_cached(
                    "INSERT OR REPLACE INTO units (source_hash, unit_id, ordinal, unit_kind, unit_hash, byte_start, byte_end)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                )
                .map_err(|e| self.sql(e))?;
            let src = source.to_hex();
            for u in units {
                ins.execute(params![
                    src,
                    u.unit_id.as_str(),
                    u.ordinal as i64,
                    u.unit_kind,
                    u.unit_hash.to_hex(),
                    u.bytes.start as i64,
                    u.bytes.end as i64
                ])
                .map_err(|e| self.sql(e))?;
            }
            let mut rej = tx
                .prepare_cached(
                    "INSERT OR REPLACE INTO rejections (source_hash, ordinal, reason, detail, byte_start, byte_end)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                )
                .map_err(|e| self.sql(e))?;
            for r in rejections {
                rej.execute(params![
                    src,
                    r.ordinal as i64,
                    r.reason,
                    r.detail,
                    r.byte_start as i64,
                    r.byte_end as i64
                ])
                .map_err(|e| self.sql(e))?;
            }
        }
        tx.commit().map_err(|e| self.sql(e))
    }

    pub fn count_units(&self, source: &ContentHash) -> Result<u64, StoreError> {
        self.conn()
            .query_row(
                "SELECT COUNT(*) FROM units WHERE source_hash = ?1",
                [source.to_hex()],
                |r| r.get::<_, i64>(0),
            )
            .map(|n| n as u64)
            .map_err(|e| self.sql(e))
    }

    pub fn get_fact(&self, key: &ContentHash) -> Result<Option<FactRecord>, StoreError> {
        self.get_json("SELECT record FROM facts WHERE key = ?1", key)
    }

    /// Reads the JSON text column of the one row `sql` selects by `key`.
    fn get_json<T: serde::de::DeserializeOwned>(
        &self,
        sql: &str,
        key: &ContentHash,
    ) -> Result<Option<T>, StoreError> {
        let text: Option<String> = self
            .conn()
            .query_row(sql, [key.to_hex()], |r| r.get(0))
            .optional()
            .map_err(|e| self.sql(e))?;
        text.map(|t| serde_json::from_str(&t).map_err(|e| self.decode(e)))
            .transpose()
    }

    /// Caches a decided fact under its key.
    pub fn put_fact(&self, fact: &FactRecord) -> Result<(), StoreError> {
        if !fact.status.is_cacheable() {
            return Err(StoreError::NotCacheable {
                status: fact.status.to_string(),
            });
        }
        let record = serde_json::to_string(fact).map_err(|e| self.decode(e))?;
        let unit = fact
            .source_ids
            .first()
            .map(|u| u.0.clone())
            .unwrap_or_default();
        let unit_hash = fact
            .source_hashes
            .first()
            .map(|h| h.to_hex())
            .unwrap_or_default();
        self.conn()
            .execute(
                "INSERT OR REPLACE INTO facts (key, unit_id, unit_hash, stage, stage_version, status, record, created_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                params![
                    fact.key.to_hex(),
                    unit,
                    unit_hash,
                    fact.stage,
                    fact.stage_version,
                    fact.status.as_str(),
                    record,
                    now_ms() as i64
                ],
            )
            .map_err(|e| self.sql(e))?;
        Ok(())
    }

    pub fn count_facts(&self) -> Result<u64, StoreError> {
        self.conn()
            .query_row("SELECT COUNT(*) FROM facts", [], |r| r.get::<_, i64>(0))
            .map(|n| n as u64)
            .map_err(|e| self.sql(e))
    }

    /// A cached embedding: little-endian `f32`s, `dim` of them.
    pub fn get_embedding(&self, key: &ContentHash) -> Result<Option<Vec<f32>>, StoreError> {
        let row: Option<(i64, Vec<u8>)> = self
            .conn()
            .query_row(
                "SELECT dim, vector FROM embeddings WHERE key = ?1",
                [key.to_hex()],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()
            .map_err(|e| self.sql(e))?;
        let Some((dim, bytes)) = row else {
            return Ok(None);
        };
        if bytes.len() != dim as usize * 4 {
            return Err(self.decode(format!(
                "embedding {} holds {} bytes, not {dim} floats",
                key.short(12),
                bytes.len()
            )));
        }
        Ok(Some(
            bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        ))
    }

    /// Caches embeddings in one transaction.
    pub fn put_embeddings(
        &self,
        model: &str,
        rows: &[(ContentHash, &[f32])],
    ) -> Result<(), StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction().map_err(|e| self.sql(e))?;
        {
            let mut stmt = tx
                .prepare(
                    "INSERT OR REPLACE INTO embeddings (key, model, dim, vector) VALUES (?1, ?2, ?3, ?4)",
                )
                .map_err(|e| self.sql(e))?;
            for (key, v) in rows {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                stmt.execute(params![key.to_hex(), model, v.len() as i64, bytes])
                    .map_err(|e| self.sql(e))?;
            }
        }
        tx.commit().map_err(|e| self.sql(e))
    }

    /// Records a submitted provider batch and its requests in one
    /// transaction, as `open`.
    pub fn put_batch(
        &self,
        batch: &BatchRow,
        requests: &[(String, String)],
    ) -> Result<(), StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction().map_err(|e| self.sql(e))?;
        tx.execute(
            "INSERT OR REPLACE INTO batches (batch_id, provider, endpoint, state, requests, submitted_ms, closed_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, NULL)",
            params![
                batch.batch_id,
                batch.provider,
                batch.endpoint,
                batch.state,
                requests.len() as i64,
                batch.submitted_ms as i64
            ],
        )
        .map_err(|e| self.sql(e))?;
        {
            let mut stmt = tx
                .prepare(
                    "INSERT OR REPLACE INTO batch_requests (request_key, batch_id, custom_id) VALUES (?1, ?2, ?3)",
                )
                .map_err(|e| self.sql(e))?;
            for (key, custom_id) in requests {
                stmt.execute(params![key, batch.batch_id, custom_id])
                    .map_err(|e| self.sql(e))?;
            }
        }
        tx.commit().map_err(|e| self.sql(e))
    }

    /// The open batch holding the request with this content key, and the
    /// request's id inside it; the newest when several do.
    pub fn find_open_batch(
        &self,
        request_key: &str,
    ) -> Result<Option<(String, String)>, StoreError> {
        self.conn()
            .query_row(
                "SELECT r.batch_id, r.custom_id FROM batch_requests r JOIN batches b ON b.batch_id = r.batch_id WHERE r.request_key = ?1 AND b.state = 'open' ORDER BY b.submitted_ms DESC LIMIT 1",
                [request_key],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()
            .map_err(|e| self.sql(e))
    }

    /// Closes a batch (`consumed`, `failed`): its requests are no longer
    /// found, so a rerun asks again for any unit that did not decide.
    pub fn close_batch(&self, batch_id: &str, state: &str) -> Result<(), StoreError> {
        self.conn()
            .execute(
                "UPDATE batches SET state = ?2, closed_ms = ?3 WHERE batch_id = ?1",
                params![batch_id, state, now_ms() as i64],
            )
            .map_err(|e| self.sql(e))?;
        Ok(())
    }

    /// Every recorded batch, newest first.
    pub fn batches(&self) -> Result<Vec<BatchRow>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare(
                "SELECT batch_id, provider, endpoint, state, requests, submitted_ms, closed_ms FROM batches ORDER BY submitted_ms DESC, batch_id",
            )
            .map_err(|e| self.sql(e))?;
        let rows = stmt
            .query_map([], |r| {
                Ok(BatchRow {
                    batch_id: r.get(0)?,
                    provider: r.get(1)?,
                    endpoint: r.get(2)?,
                    state: r.get(3)?,
                    requests: r.get::<_, i64>(4)? as u64,
                    submitted_ms: r.get::<_, i64>(5)? as u64,
                    closed_ms: r.get::<_, Option<i64>>(6)?.map(|v| v as u64),
                })
            })
            .map_err(|e| self.sql(e))?;
        rows.collect::<Result<Vec<_>, _>>().map_err(|e| self.sql(e))
    }

    pub fn get_fold_node(
        &self,
        key: &ContentHash,
    ) -> Result<Option<serde_json::Value>, StoreError> {
        self.get_json("SELECT value FROM fold_nodes WHERE key = ?1", key)
    }

    pub fn put_fold_node(
        &self,
        key: &ContentHash,
        level: u32,
        value: &serde_json::Value,
    ) -> Result<(), StoreError> {
        self.conn()
            .execute(
                "INSERT OR REPLACE INTO fold_nodes (key, level, value) VALUES (?1, ?2, ?3)",
                params![key.to_hex(), level, value.to_string()],
            )
            .map_err(|e| self.sql(e))?;
        Ok(())
    }

    pub fn begin_run(
        &self,
        run_id: &str,
        spec_name: &str,
        spec_hash: &ContentHash,
        source: &ContentHash,
    ) -> Result<(), StoreError> {
        self.conn()
            .execute(
                "INSERT INTO runs (run_id, spec_name, spec_hash, source_hash, started_ms) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![run_id, spec_name, spec_hash.to_hex(), source.to_hex(), now_ms() as i64],
            )
            .map_err(|e| self.sql(e))?;
        Ok(())
    }

    /// Records the outcome of many units in one transaction.
    pub fn put_run_units(&self, run_id: &str, rows: &[RunUnitRow]) -> Result<(), StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction().map_err(|e| self.sql(e))?;
        {
            let mut ins = tx
                .prepare_cached(
                    "INSERT OR REPLACE INTO run_units (run_id, unit_id, stage, status, reason, fact_key)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                )
                .map_err(|e| self.sql(e))?;
            for r in rows {
                ins.execute(params![
                    run_id,
                    r.unit_id,
                    r.stage,
                    r.status,
                    r.reason,
                    r.fact_key.map(|k| k.to_hex())
                ])
                .map_err(|e| self.sql(e))?;
            }
        }
        tx.commit().map_err(|e| self.sql(e))
    }

    pub fn event(
        &self,
        run_id: &str,
        kind: &str,
        payload: &serde_json::Value,
    ) -> Result<(), StoreError> {
        self.conn()
            .execute(
                "INSERT INTO run_events (run_id, seq, at_ms, kind, payload)
                 VALUES (?1, (SELECT COALESCE(MAX(seq), 0) + 1 FROM run_events WHERE run_id = ?1), ?2, ?3, ?4)",
                params![run_id, now_ms() as i64, kind, payload.to_string()],
            )
            .map_err(|e| self.sql(e))?;
        Ok(())
    }

    pub fn finish_run(
        &self,
        run_id: &str,
        stop_reason: &str,
        certificate: &serde_json::Value,
    ) -> Result<(), StoreError> {
        self.conn()
            .execute(
                "UPDATE runs SET finished_ms = ?2, stop_reason = ?3, certificate = ?4 WHERE run_id = ?1",
                params![run_id, now_ms() as i64, stop_reason, certificate.to_string()],
            )
            .map_err(|e| self.sql(e))?;
        Ok(())
    }

    /// Runs that began and never finished (killed processes).
    pub fn unfinished_runs(&self) -> Result<Vec<String>, StoreError> {
        let conn = self.conn();
        let mut st = conn
            .prepare("SELECT run_id FROM runs WHERE finished_ms IS NULL ORDER BY started_ms")
            .map_err(|e| self.sql(e))?;
        let rows = st.query_map([], |r| r.get(0)).map_err(|e| self.sql(e))?;
        rows.collect::<Result<Vec<String>, _>>()
            .map_err(|e| self.sql(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fanfold_core::{Cost, FACT_SCHEMA, ModelParams, Status, UnitId};

    fn fact(status: Status) -> FactRecord {
        FactRecord {
            schema: FACT_SCHEMA.into(),
            key: ContentHash::of_bytes(status.as_str().as_bytes()),
            source_ids: vec![UnitId("1".into())],
            source_hashes: vec![ContentHash::of_bytes(b"u")],
            stage: "s".into(),
            stage_version: 1,
            rubric_hash: ContentHash::of_bytes(b"r"),
            model: ModelParams {
                backend: "scripted".into(),
                model_id: "m".into(),
                temperature: 0.0,
                max_output_tokens: 8,
                seed: 0,
                simulated: true,
            },
            status,
            decision: None,
            facts: serde_json::Value::Null,
            confidence: None,
            reason: None,
            evidence: vec![],
            cost: Cost::default(),
            attempts: 1,
            reducer_path: vec![],
        }
    }

    #[test]
    fn facts_round_trip_and_failures_are_never_cached() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(&dir.path().join("s.sqlite")).expect("open");
        let f = fact(Status::Negative);
        store.put_fact(&f).expect("put");
        assert_eq!(store.get_fact(&f.key).expect("get"), Some(f));
        for st in [Status::Error, Status::Cancelled, Status::NotRun] {
            assert!(matches!(
                store.put_fact(&fact(st)),
                Err(StoreError::NotCacheable { .. })
            ));
        }
        assert_eq!(store.count_facts().expect("count"), 1);
    }

    #[test]
    fn embeddings_round_trip_bit_exactly() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(&dir.path().join("s.sqlite")).expect("open");
        let a = ContentHash::of_bytes(b"a");
        let b = ContentHash::of_bytes(b"b");
        let va = [0.25f32, -1.5, f32::MIN_POSITIVE, 3.0e-8];
        let vb = [1.0f32];
        store
            .put_embeddings("m", &[(a, &va[..]), (b, &vb[..])])
            .expect("put");
        assert_eq!(store.get_embedding(&a).expect("get"), Some(va.to_vec()));
        assert_eq!(store.get_embedding(&b).expect("get"), Some(vb.to_vec()));
        assert_eq!(
            store
                .get_embedding(&ContentHash::of_bytes(b"c"))
                .expect("get"),
            None
        );
    }

    #[test]
    fn artifacts_are_immutable_and_reopen_keeps_everything() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s.sqlite");
        let h = ContentHash::of_bytes(b"abc");
        {
            let store = Store::open(&path).expect("open");
            assert!(store.put_artifact(&h, b"abc", "test").expect("put"));
            assert!(!store.put_artifact(&h, b"abc", "test").expect("put again"));
            store.begin_run("r1", "spec", &h, &h).expect("run");
        }
        let store = Store::open(&path).expect("reopen");
        assert_eq!(
            store.get_artifact(&h).expect("get").as_deref(),
            Some(&b"abc"[..])
        );
        assert_eq!(store.unfinished_runs().expect("runs"), ["r1"]);
    }

    #[test]
    fn open_batches_are_found_by_request_key_until_closed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(&dir.path().join("s.sqlite")).expect("open");
        let row = |id: &str, at: u64| BatchRow {
            batch_id: id.into(),
            provider: "openai".into(),
            endpoint: "https://api.example/v1".into(),
            state: "open".into(),
            requests: 0,
            submitted_ms: at,
            closed_ms: None,
        };
        let keys = |k: &[(&str, &str)]| -> Vec<(String, String)> {
            k.iter().map(|(a, b)| ((*a).into(), (*b).into())).collect()
        };
        store
            .put_batch(&row("b1", 1), &keys(&[("k1", "r0"), ("k2", "r1")]))
            .expect("b1");
        store
            .put_batch(&row("b2", 2), &keys(&[("k2", "r0")]))
            .expect("b2");
        let found = |k: &str| store.find_open_batch(k).expect("find");
        assert_eq!(found("k1"), Some(("b1".into(), "r0".into())));
        // The newest open batch wins when a request is in two.
        assert_eq!(found("k2"), Some(("b2".into(), "r0".into())));
        assert_eq!(found("k3"), None);
        store.close_batch("b2", "consumed").expect("close");
        assert_eq!(found("k2"), Some(("b1".into(), "r1".into())));
        store.close_batch("b1", "failed").expect("close");
        assert_eq!((found("k1"), found("k2")), (None, None));
        let listed = store.batches().expect("list");
        assert_eq!(
            listed
                .iter()
                .map(|b| (b.batch_id.as_str(), b.state.as_str(), b.requests))
                .collect::<Vec<_>>(),
            [("b2", "consumed", 1), ("b1", "failed", 2)]
        );
        assert!(listed.iter().all(|b| b.closed_ms.is_some()));
    }

    #[test]
    fn a_newer_schema_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s.sqlite");
        drop(Store::open(&path).expect("open"));
        let conn = Connection::open(&path).expect("raw");
        conn.execute(
            "UPDATE meta SET value = 'fanfold-store-v99' WHERE key = 'schema'",
            [],
        )
        .expect("edit");
        drop(conn);
        assert!(matches!(
            Store::open(&path),
            Err(StoreError::Version { .. })
        ));
    }
}
