//! The store: one SQLite file per project directory, readable with
//! `sqlite3`, or one PostgreSQL database that processes on many hosts
//! share (`--store postgres://…`): the same tables on both, through
//! [`db`]'s one connection type.
//!
//! Tables: `chunks` (source bytes in content-addressed pieces of at most
//! [`CHUNK_BYTES`]), `artifacts` and `artifact_chunks` (each source by its
//! BLAKE3 hash, as the list of its chunks), `partitions` (one per artifact
//! and partition spec), `units` and `rejections` (each partition's
//! elements), `prefilters` and `route_chunks` (the rule that decided each
//! element, one byte per element in ordinal order), `facts` (decided stage
//! outputs by content key), `fold_nodes` (fold tree nodes by key), `runs`,
//! `run_units` (each unit's outcome in a run), `run_events`, `claims` (which
//! live run is paying for which fact key, with a lease that lapses when its
//! holder stops renewing it), and `batches`
//! with `batch_requests` (provider batches and the content keys of the
//! requests in them, so a run stopped while a batch is pending collects it
//! when run again), and `effects` with `effect_journal` (every action on
//! a target, its steps written ahead of the acts: `effects.rs`).
//!
//! Architecture Invariant: every write is a single statement or one
//! transaction, in WAL mode, so a process killed at any instant leaves a
//! consistent file, and a rerun finds every fact that was written before the
//! kill. Only decided facts (positive, negative, abstain) enter `facts`:
//! a failure is never cached as an answer.

mod batches;
mod db;
mod effects;
mod facts;
mod fleet;
mod runs;
mod sources;
mod units;

pub use db::DbError;
pub use effects::{EffectRow, EffectState, JournalEntry};
pub use fleet::{FleetJob, FleetResults, FleetTask, FleetWatch, JobState, WorkerRow};
pub use runs::CLAIMS_A_STATEMENT;

use db::{Conn, Param, Row, params};

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use fanfold_core::{BatchState, ContentHash, FactRecord, Unit};
use rusqlite::{Connection, OptionalExtension};
use serde::{Deserialize, Serialize};

/// Bumped when the tables change shape; an older file is refused, not
/// silently misread.
pub const SCHEMA_VERSION: &str = "fanfold-store-v4";

/// Earlier schemas, which [`Store::open`] upgrades in place: v3 added the
/// `claims` table and the `pid`, `host` and `heartbeat_ms` of a run; v4
/// adds a live run's `progress`.
const SCHEMA_V2: &str = "fanfold-store-v2";
const SCHEMA_V3: &str = "fanfold-store-v3";

/// The size of a stored source chunk: small enough that reading one unit
/// back costs one chunk, large enough that a gigabyte is a thousand rows.
pub const CHUNK_BYTES: usize = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("store {path}: {source}")]
    Db { path: String, source: DbError },
    #[error(
        "store {path} has schema {found}, this fanfold needs {SCHEMA_VERSION}; move it aside to start fresh"
    )]
    Version { path: String, found: String },
    #[error("cannot open store {path}: {reason}")]
    Open { path: String, reason: String },
    #[error("store {path}: record does not decode: {detail}")]
    Decode { path: String, detail: String },
    #[error(
        "{path} is an SQLite file of another application (it has tables and no fanfold schema); refusing to change it: give --store a new or empty file"
    )]
    Foreign { path: String },
    #[error(
        "store {path}: its copy of source chunk {hash} no longer matches its hash (damaged or edited); the copy was removed, and the next run stores it again from the source"
    )]
    CorruptChunk { path: String, hash: String },
    #[error("refusing to cache a `{status}` fact: only decided answers are cached")]
    NotCacheable { status: String },
    #[error("store {path} stayed locked by another writer for {secs} s{holders}")]
    Busy {
        path: String,
        secs: u64,
        /// The live runs that may hold it, in words (empty when none is
        /// known).
        holders: String,
    },
}

impl StoreError {
    /// For a store that stayed locked, names the live runs that may hold
    /// it (other than `own_run`), read through a fresh read-only
    /// connection: WAL readers are never blocked by the writer.
    pub fn name_holders(self, own_run: Option<&str>) -> StoreError {
        let StoreError::Busy { path, secs, .. } = self else {
            return self;
        };
        let others: Vec<String> = live_runs_at(Path::new(&path), LIVE_MS)
            .unwrap_or_default()
            .into_iter()
            .filter(|r| Some(r.run_id.as_str()) != own_run)
            .map(|r| r.to_string())
            .collect();
        let holders = if others.is_empty() {
            String::new()
        } else {
            format!(
                "; another fanfold is using it: {}. Wait for it to finish, or give this run another --store",
                others.join(", ")
            )
        };
        StoreError::Busy {
            path,
            secs,
            holders,
        }
    }
}

/// A run whose heartbeat is younger than this is alive. Runs beat every
/// [`HEARTBEAT_MS`].
pub const LIVE_MS: u64 = 60_000;
/// How often a running run renews its leases and heartbeat.
pub const HEARTBEAT_MS: u64 = 10_000;

/// The live runs of the SQLite store at `path`, read without opening it
/// for writing.
pub fn live_runs_at(path: &Path, stale_ms: u64) -> Result<Vec<RunInfo>, DbError> {
    let conn = Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    live_runs_on(&mut Conn::Sqlite(conn), stale_ms)
}

fn live_runs_on(conn: &mut Conn, stale_ms: u64) -> Result<Vec<RunInfo>, DbError> {
    let since = now_ms() as i64 - stale_ms as i64;
    conn.query_map(
        "SELECT run_id, spec_name, pid, started_ms, heartbeat_ms FROM runs
         WHERE finished_ms IS NULL AND COALESCE(heartbeat_ms, started_ms) >= ?1
         ORDER BY started_ms",
        params![since],
        run_info,
    )
}

/// This machine's name, as runs record it: a run's process can be looked
/// up only on the host that started it.
pub fn this_host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map(|h| h.trim().to_owned())
        .unwrap_or_default()
}

/// Whether process `pid` exists on this host. Where `/proc` is missing it
/// is taken to exist, and only the heartbeat can tell.
fn process_exists(pid: i64) -> bool {
    if !Path::new("/proc/self").exists() {
        return true;
    }
    pid == i64::from(std::process::id()) || Path::new(&format!("/proc/{pid}")).exists()
}

fn run_info(r: &Row<'_>) -> Result<RunInfo, DbError> {
    Ok(RunInfo {
        run_id: r.get(0)?,
        spec_name: r.get(1)?,
        pid: r.get::<Option<i64>>(2)?.and_then(|p| u32::try_from(p).ok()),
        started_ms: r.get::<i64>(3)?.max(0) as u64,
        heartbeat_ms: r.get::<Option<i64>>(4)?.map(|h| h.max(0) as u64),
    })
}

/// Why a store file cannot be opened for writing, in the file system's
/// words, where SQLite says only "unable to open database file" or
/// "attempt to write a readonly database". SQLite keeps its journal
/// (`-wal`, `-shm`) beside the store, so the folder must be writable too.
fn why_not_writable(path: &Path) -> Option<String> {
    if path.is_dir() {
        return Some("it is a folder; give --store a file path".to_owned());
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
        _ => PathBuf::from("."),
    };
    if dir.exists() && !dir.is_dir() {
        return Some(format!("{} is a file, not a folder", dir.display()));
    }
    if !dir.is_dir() {
        return Some(format!(
            "its folder {} does not exist and cannot be made",
            dir.display()
        ));
    }
    if let Err(e) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
    {
        return Some(format!("the file cannot be opened for writing ({e})"));
    }
    let probe = dir.join(format!(".fanfold-probe-{}", std::process::id()));
    match std::fs::File::create(&probe) {
        Ok(_) => {
            let _ = std::fs::remove_file(&probe);
            None
        }
        Err(e) => Some(format!(
            "its folder {} cannot be written ({e}); SQLite keeps its journal (-wal, -shm) beside the store",
            dir.display()
        )),
    }
}

fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

/// Runs `f` again while it fails with SQLite's busy error, for at most
/// [`BUSY_TIMEOUT`]: for the statements SQLite does not retry itself.
fn retry_while_busy<T>(
    mut f: impl FnMut() -> Result<T, rusqlite::Error>,
) -> Result<T, rusqlite::Error> {
    let deadline = std::time::Instant::now() + BUSY_TIMEOUT;
    loop {
        match f() {
            Err(e) if is_busy(&e) && std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            done => return done,
        }
    }
}

/// What [`Store::collect_garbage`] removed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct GcReport {
    pub runs: u64,
    /// Per-unit outcome rows of runs that a later answered run of the same
    /// spec and source superseded (their certificates stay).
    pub superseded_unit_rows: u64,
    pub sources: u64,
    pub chunks: u64,
    pub bytes_before: u64,
    pub bytes_after: u64,
}

/// Deletes a source and everything derived from its bytes alone: its
/// chunk list, partitions, units, rejections and routes (not its chunks,
/// which other sources may share).
fn drop_source(tx: &mut Conn, hash: &str) -> Result<(), DbError> {
    let parts = "SELECT id FROM partitions WHERE source_hash = ?1";
    for table in ["route_chunks", "routings", "units", "rejections"] {
        tx.execute(
            &format!("DELETE FROM {table} WHERE partition IN ({parts})"),
            params![hash],
        )?;
    }
    tx.execute(
        "DELETE FROM partitions WHERE source_hash = ?1",
        params![hash],
    )?;
    tx.execute(
        "DELETE FROM artifact_chunks WHERE artifact = ?1",
        params![hash],
    )?;
    tx.execute("DELETE FROM artifacts WHERE hash = ?1", params![hash])?;
    Ok(())
}

/// Deletes chunks no source lists; how many.
fn delete_orphan_chunks(tx: &mut Conn) -> Result<u64, DbError> {
    tx.execute(
        "DELETE FROM chunks WHERE hash NOT IN (SELECT chunk FROM artifact_chunks)",
        params![],
    )
}

/// Whether a fact key is this run's to pay for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claim {
    /// Claimed (or already held) by this run.
    Mine,
    /// Another live run holds it until `expires_ms`, unless it renews.
    Held { run_id: String, expires_ms: u64 },
}

/// What claiming a key found: its fact, already stored, or the claim.
#[derive(Clone, Debug, PartialEq)]
pub enum ClaimOrFact {
    Fact(Box<FactRecord>),
    Claim(Claim),
}

/// A run as the `runs` table knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunInfo {
    pub run_id: String,
    pub spec_name: String,
    pub pid: Option<u32>,
    pub started_ms: u64,
    pub heartbeat_ms: Option<u64>,
}

/// One run as `fanfold status` shows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunOverview {
    pub run_id: String,
    pub spec_name: String,
    pub started_ms: u64,
    pub finished_ms: Option<u64>,
    pub stop_reason: Option<String>,
    pub pid: Option<u32>,
    pub host: Option<String>,
    pub heartbeat_ms: Option<u64>,
    /// The run's last reported progress (JSON), while it runs.
    pub progress: Option<String>,
    /// Fact keys it holds a lease on now: units it claimed, so other runs
    /// on the store wait for its facts instead of paying for them again.
    pub leases: u64,
    /// A finished run's statuses (JSON), from its certificate.
    pub statuses: Option<String>,
    pub model_calls: Option<u64>,
    pub tokens: Option<u64>,
}

impl RunOverview {
    /// Where the run stands now, in a word: its stop reason once it
    /// finished; `live` while its heartbeat is fresh and its process (on
    /// this host) exists; `gone` when its process on this host has ended
    /// without finishing it; `stale` when its heartbeat is older than
    /// [`LIVE_MS`].
    pub fn state(&self, now_ms: u64) -> String {
        if self.finished_ms.is_some() {
            return self
                .stop_reason
                .clone()
                .unwrap_or_else(|| "finished".into());
        }
        let here = self.host.as_deref() == Some(this_host().as_str());
        if here && self.pid.is_some_and(|p| !process_exists(i64::from(p))) {
            return "gone".into();
        }
        let beat = self.heartbeat_ms.unwrap_or(self.started_ms);
        if now_ms.saturating_sub(beat) > LIVE_MS {
            return "stale".into();
        }
        "live".into()
    }
}

impl std::fmt::Display for RunInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "run {} of spec `{}`", self.run_id, self.spec_name)?;
        if let Some(pid) = self.pid {
            write!(f, " (pid {pid})")?;
        }
        Ok(())
    }
}

/// How long a store write waits for another writer before it fails.
const BUSY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// One stored piece of a source.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkRef {
    pub hash: ContentHash,
    pub len: u64,
    /// Line ends in the chunk, so a byte offset's line number needs no scan
    /// of the chunks before it.
    pub newlines: u64,
}

/// What a finished partition counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartitionCounts {
    pub elements: u64,
    pub units: u64,
    pub rejected: u64,
}

/// One batch of a streamed partition, written in one transaction.
pub struct PartitionBatch<'a> {
    pub partition: i64,
    pub units: &'a [Unit],
    pub rejections: &'a [RejectionRow],
    /// The prefilter whose decisions `rules` holds.
    pub prefilter: Option<i64>,
    /// The ordinal of the first element `rules` covers.
    pub first_ordinal: u64,
    /// One byte per element from `first_ordinal` on: the index of the rule
    /// that decided it, [`RULE_NONE`] when no rule matched (kept for the
    /// first stage), [`RULE_REJECTED`] for an element that is not a unit.
    pub rules: &'a [u8],
}

/// In a route chunk: no rule matched.
pub const RULE_NONE: u8 = 0xFE;
/// In a route chunk: the element was rejected by the partition.
pub const RULE_REJECTED: u8 = 0xFF;
/// Most prefilter rules a route chunk can name.
pub const MAX_RULES: usize = 0xFE;

fn hash_of(bytes: &[u8]) -> Option<ContentHash> {
    let array: [u8; 32] = bytes.try_into().ok()?;
    Some(ContentHash(array))
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

/// A person's (or another trusted oracle's) decision for what a unit
/// shows under a stage's question, keyed by both: an edited unit is a new
/// key, asked again.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Label {
    pub key: ContentHash,
    pub stage: String,
    pub unit_id: String,
    pub decision: String,
    /// Who gave it (`person:NAME`).
    pub labeller: String,
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
    pub state: BatchState,
    pub requests: u64,
    pub submitted_ms: u64,
    pub closed_ms: Option<u64>,
}

pub struct Store {
    conn: Mutex<Conn>,
    /// The SQLite file, or the PostgreSQL address as given.
    path: PathBuf,
    /// Where the store is, in words fit for an error or a log: the file,
    /// or the PostgreSQL address without its password.
    location: String,
    /// Stored facts that did not decode, dropped so they are computed
    /// again (see [`Store::get_fact`]).
    corrupt_facts: std::sync::atomic::AtomicU64,
    /// How long this process's leases last unless renewed: what another
    /// process waits, at most, for a unit this one held when it died.
    lease_ms: std::sync::atomic::AtomicU64,
}

/// SQLite's application id of a fanfold store ("fanf"), so `file` and a
/// later `open` can tell it from another application's database.
pub const APPLICATION_ID: i64 = 0x6661_6E66;

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS chunks (hash BLOB PRIMARY KEY, bytes BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS artifacts (
    hash TEXT PRIMARY KEY, len INTEGER NOT NULL, origin TEXT NOT NULL,
    created_ms INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS artifact_chunks (
    artifact TEXT NOT NULL, seq INTEGER NOT NULL, chunk BLOB NOT NULL,
    len INTEGER NOT NULL, newlines INTEGER NOT NULL,
    PRIMARY KEY (artifact, seq)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS partitions (
    id INTEGER PRIMARY KEY, key TEXT NOT NULL UNIQUE, source_hash TEXT NOT NULL,
    spec TEXT NOT NULL, elements INTEGER, units INTEGER, rejected INTEGER);
CREATE TABLE IF NOT EXISTS units (
    partition INTEGER NOT NULL, unit_id TEXT NOT NULL, ordinal INTEGER NOT NULL,
    unit_hash BLOB NOT NULL, byte_start INTEGER NOT NULL, byte_end INTEGER NOT NULL,
    PRIMARY KEY (partition, unit_id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS rejections (
    partition INTEGER NOT NULL, ordinal INTEGER NOT NULL, reason TEXT NOT NULL,
    detail TEXT NOT NULL, byte_start INTEGER NOT NULL, byte_end INTEGER NOT NULL,
    PRIMARY KEY (partition, ordinal));
CREATE TABLE IF NOT EXISTS prefilters (
    id INTEGER PRIMARY KEY, key TEXT NOT NULL UNIQUE, rules TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS routings (
    partition INTEGER NOT NULL, prefilter INTEGER NOT NULL,
    PRIMARY KEY (partition, prefilter));
CREATE TABLE IF NOT EXISTS route_chunks (
    partition INTEGER NOT NULL, prefilter INTEGER NOT NULL,
    first_ordinal INTEGER NOT NULL, rules BLOB NOT NULL,
    PRIMARY KEY (partition, prefilter, first_ordinal));
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
CREATE TABLE IF NOT EXISTS labels (
    key TEXT PRIMARY KEY, stage TEXT NOT NULL, unit_id TEXT NOT NULL,
    decision TEXT NOT NULL, labeller TEXT NOT NULL, created_ms INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY, spec_name TEXT NOT NULL, spec_hash TEXT NOT NULL,
    source_hash TEXT NOT NULL, started_ms INTEGER NOT NULL, finished_ms INTEGER,
    partition INTEGER, prefilter INTEGER, stop_reason TEXT, certificate TEXT,
    pid INTEGER, host TEXT, heartbeat_ms INTEGER, progress TEXT);
CREATE TABLE IF NOT EXISTS claims (
    key TEXT PRIMARY KEY, run_id TEXT NOT NULL, expires_ms INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS claims_by_run ON claims (run_id);
CREATE TABLE IF NOT EXISTS run_units (
    run_id TEXT NOT NULL, unit_id TEXT NOT NULL, stage TEXT NOT NULL,
    status TEXT NOT NULL, reason TEXT, fact_key TEXT,
    PRIMARY KEY (run_id, unit_id, stage));
CREATE TABLE IF NOT EXISTS run_events (
    run_id TEXT NOT NULL, seq INTEGER NOT NULL, at_ms INTEGER NOT NULL,
    kind TEXT NOT NULL, payload TEXT NOT NULL, PRIMARY KEY (run_id, seq));
";

/// The PostgreSQL address `path` holds, if it is one (`postgres://…` or
/// `postgresql://…`).
pub fn postgres_url(path: &Path) -> Option<&str> {
    path.to_str()
        .filter(|s| s.starts_with("postgres://") || s.starts_with("postgresql://"))
}

/// A PostgreSQL address without its password, for messages and logs.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, tail) = match rest.find(['/', '?']) {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let Some((userinfo, host)) = authority.rsplit_once('@') else {
        return url.to_owned();
    };
    let user = match userinfo.split_once(':') {
        Some((user, _)) => format!("{user}:***"),
        None => userinfo.to_owned(),
    };
    // A password may also ride in the query (`?password=`).
    let tail = match tail.find("password=") {
        Some(i) => {
            let end = tail[i..].find('&').map_or(tail.len(), |j| i + j);
            format!("{}password=***{}", &tail[..i], &tail[end..])
        }
        None => tail.to_owned(),
    };
    format!("{scheme}://{user}@{host}{tail}")
}

impl Store {
    /// Opens the store at `path`: an SQLite file (created when new), or,
    /// when `path` is a `postgres://` address, a PostgreSQL database that
    /// many processes and hosts can share. Either way the tables are
    /// declared when missing, and a store of a newer schema is refused.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        match postgres_url(path) {
            Some(url) => Store::open_postgres(url),
            None => Store::open_sqlite(path),
        }
    }

    fn open_postgres(url: &str) -> Result<Store, StoreError> {
        let location = redact_url(url);
        let pg = db::Pg::connect(url).map_err(|e| StoreError::Open {
            path: location.clone(),
            reason: e.to_string(),
        })?;
        let mut conn = Conn::Postgres(Box::new(pg));
        let opened = conn
            .transaction(|tx| {
                // One opener at a time declares the tables: two concurrent
                // `CREATE TABLE IF NOT EXISTS` of one table can both try
                // and one fail. The lock ends with the transaction.
                tx.query_one(
                    "SELECT pg_advisory_xact_lock(?1)",
                    params![APPLICATION_ID],
                    |_| Ok(()),
                )?;
                let has_meta = tx.query_one(
                    "SELECT COUNT(*) FROM information_schema.tables
                     WHERE table_schema = current_schema() AND table_name = 'meta'",
                    params![],
                    |r| r.get::<i64>(0),
                )? > 0;
                let found: Option<String> = if has_meta {
                    tx.query_row(
                        "SELECT value FROM meta WHERE key = 'schema'",
                        params![],
                        |r| r.get(0),
                    )?
                } else {
                    None
                };
                match found {
                    None if has_meta => Ok(Err(StoreError::Foreign {
                        path: location.clone(),
                    })),
                    None => {
                        tx.batch(&db::pg_ddl(SCHEMA))?;
                        tx.batch(&db::pg_ddl(effects::SCHEMA))?;
                        tx.batch(&db::pg_ddl(fleet::SCHEMA))?;
                        tx.execute(
                            "INSERT INTO meta (key, value) VALUES ('schema', ?1)",
                            params![SCHEMA_VERSION],
                        )?;
                        Ok(Ok(()))
                    }
                    Some(v) if v == SCHEMA_VERSION => {
                        // Tables added within a version are declared on open.
                        tx.batch(&db::pg_ddl(fleet::SCHEMA))?;
                        Ok(Ok(()))
                    }
                    Some(v) if !v.starts_with("fanfold-store") => Ok(Err(StoreError::Foreign {
                        path: location.clone(),
                    })),
                    Some(v) => Ok(Err(StoreError::Version {
                        path: location.clone(),
                        found: v,
                    })),
                }
            })
            .map_err(|source| StoreError::Db {
                path: location.clone(),
                source,
            })?;
        opened?;
        Ok(Store {
            conn: Mutex::new(conn),
            path: PathBuf::from(url),
            location,
            corrupt_facts: std::sync::atomic::AtomicU64::new(0),
            lease_ms: std::sync::atomic::AtomicU64::new(LIVE_MS),
        })
    }

    fn open_sqlite(path: &Path) -> Result<Store, StoreError> {
        let p = path.display().to_string();
        let sql = |source: rusqlite::Error| {
            if is_busy(&source) {
                return StoreError::Busy {
                    path: p.clone(),
                    secs: BUSY_TIMEOUT.as_secs(),
                    holders: String::new(),
                };
            }
            if let rusqlite::Error::SqliteFailure(f, _) = &source
                && matches!(
                    f.code,
                    rusqlite::ErrorCode::CannotOpen | rusqlite::ErrorCode::ReadOnly
                )
                && let Some(reason) = why_not_writable(path)
            {
                return StoreError::Open {
                    path: p.clone(),
                    reason,
                };
            }
            StoreError::Db {
                path: p.clone(),
                source: source.into(),
            }
        };
        if let Some(dir) = path.parent()
            && !dir.as_os_str().is_empty()
        {
            // A missing folder surfaces as SQLite's "unable to open" below.
            let _ = std::fs::create_dir_all(dir);
        }
        let mut conn = Connection::open(path).map_err(sql)?;
        // First: every statement below may meet another process opening
        // the same file, and must wait for it rather than fail.
        conn.busy_timeout(BUSY_TIMEOUT).map_err(sql)?;
        // Every transaction here writes. A deferred one reads first and
        // asks for the write lock later; in WAL mode, when another process
        // committed in between, SQLite fails it at once with
        // SQLITE_BUSY_SNAPSHOT and never calls the busy handler. Taking the
        // write lock at BEGIN makes it wait its turn instead.
        conn.set_transaction_behavior(rusqlite::TransactionBehavior::Immediate);
        // Every statement runs prepared from the cache (`db.rs`): room for
        // all of the store's, so none is prepared again as others evict it.
        conn.set_prepared_statement_cache_capacity(128);
        // Another application's database is left exactly as it was: no
        // WAL switch, no tables. An empty file, or one of ours, goes on.
        let app: i64 = conn
            .pragma_query_value(None, "application_id", |r| r.get(0))
            .map_err(sql)?;
        if app != APPLICATION_ID {
            let tables: i64 = conn
                .query_row("SELECT COUNT(*) FROM sqlite_master", [], |r| r.get(0))
                .map_err(sql)?;
            let ours = tables == 0
                || conn
                    .query_row("SELECT value FROM meta WHERE key = 'schema'", [], |r| {
                        r.get::<_, String>(0)
                    })
                    .is_ok_and(|v| v.starts_with("fanfold-store"));
            if !ours {
                return Err(StoreError::Foreign { path: p });
            }
        }
        // Switching a new file to WAL takes an exclusive lock, and SQLite
        // answers a second process doing the same at the same instant with
        // SQLITE_BUSY at once, without its busy handler: wait here instead.
        retry_while_busy(|| conn.pragma_update(None, "journal_mode", "WAL")).map_err(sql)?;
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(sql)?;
        // Tables, application id and schema row in one transaction: another
        // process opening the same new file sees none of them or all.
        let tx = conn.transaction().map_err(sql)?;
        tx.execute_batch(SCHEMA).map_err(sql)?;
        tx.execute_batch(effects::SCHEMA).map_err(sql)?;
        tx.execute_batch(fleet::SCHEMA).map_err(sql)?;
        if app != APPLICATION_ID {
            tx.pragma_update(None, "application_id", APPLICATION_ID)
                .map_err(sql)?;
        }
        let found: Option<String> = tx
            .query_row("SELECT value FROM meta WHERE key = 'schema'", [], |r| {
                r.get(0)
            })
            .optional()
            .map_err(sql)?;
        match found {
            None => {
                tx.execute(
                    "INSERT INTO meta (key, value) VALUES ('schema', ?1)",
                    [SCHEMA_VERSION],
                )
                .map_err(sql)?;
            }
            Some(v) if v == SCHEMA_VERSION => {}
            Some(v) if v == SCHEMA_V2 || v == SCHEMA_V3 => {
                if v == SCHEMA_V2 {
                    tx.execute_batch(
                        "ALTER TABLE runs ADD COLUMN pid INTEGER;
                         ALTER TABLE runs ADD COLUMN host TEXT;
                         ALTER TABLE runs ADD COLUMN heartbeat_ms INTEGER;",
                    )
                    .map_err(sql)?;
                }
                tx.execute_batch("ALTER TABLE runs ADD COLUMN progress TEXT;")
                    .map_err(sql)?;
                tx.execute(
                    "UPDATE meta SET value = ?1 WHERE key = 'schema'",
                    [SCHEMA_VERSION],
                )
                .map_err(sql)?;
            }
            Some(v) => return Err(StoreError::Version { path: p, found: v }),
        }
        tx.commit().map_err(sql)?;
        Ok(Store {
            conn: Mutex::new(Conn::Sqlite(conn)),
            path: path.to_owned(),
            location: p,
            corrupt_facts: std::sync::atomic::AtomicU64::new(0),
            lease_ms: std::sync::atomic::AtomicU64::new(LIVE_MS),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Sets how long this process's leases last unless renewed (at least a
    /// second; [`LIVE_MS`] until set). The heartbeat renews them at a third
    /// of it (see [`Store::renew_every`]).
    pub fn set_lease_ms(&self, ms: u64) {
        self.lease_ms
            .store(ms.max(1_000), std::sync::atomic::Ordering::Relaxed);
    }

    /// How long a lease of this process lasts unless renewed.
    pub fn lease_ms(&self) -> u64 {
        self.lease_ms.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How often a run renews its leases and heartbeat: every
    /// [`HEARTBEAT_MS`], or a third of a shorter lease, so two renewals
    /// can be late before the lease lapses.
    pub fn renew_every(&self) -> std::time::Duration {
        std::time::Duration::from_millis(HEARTBEAT_MS.min(self.lease_ms() / 3))
    }

    /// Where the store is, for messages: the file, or the PostgreSQL
    /// address without its password.
    pub fn location(&self) -> &str {
        &self.location
    }

    /// Whether the store is a PostgreSQL database (shared by hosts)
    /// rather than an SQLite file.
    pub fn is_shared(&self) -> bool {
        self.conn().is_postgres()
    }

    /// Whether the connection to the store is encrypted (TLS to a
    /// PostgreSQL server); an SQLite file is local, and false.
    pub fn encrypted(&self) -> Result<bool, StoreError> {
        match &mut *self.conn() {
            Conn::Postgres(pg) => pg.encrypted().map_err(|source| StoreError::Db {
                path: self.location.clone(),
                source,
            }),
            Conn::Sqlite(_) => Ok(false),
        }
    }

    fn conn(&self) -> MutexGuard<'_, Conn> {
        // A panic while holding the lock cannot leave SQLite inconsistent:
        // statements are atomic on their own.
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn sql(&self, source: DbError) -> StoreError {
        if source.is_busy() {
            // The holder is named by the caller, who can read the store
            // without the lock this connection may be holding.
            return StoreError::Busy {
                path: self.location.clone(),
                secs: BUSY_TIMEOUT.as_secs(),
                holders: String::new(),
            };
        }
        StoreError::Db {
            path: self.location.clone(),
            source,
        }
    }

    /// The one number `sql` counts.
    fn count(&self, sql: &str) -> Result<u64, StoreError> {
        self.conn()
            .query_one(sql, params![], |r| r.get::<i64>(0))
            .map(|n| n.max(0) as u64)
            .map_err(|e| self.sql(e))
    }

    fn decode(&self, detail: impl ToString) -> StoreError {
        StoreError::Decode {
            path: self.location.clone(),
            detail: detail.to_string(),
        }
    }

    /// Caps the store's file at about `bytes`: a write past it fails with
    /// SQLite's "database or disk is full", as on a full disk. The cap
    /// never shrinks what is already stored.
    pub fn set_max_bytes(&self, bytes: u64) -> Result<(), StoreError> {
        let mut conn = self.conn();
        let Conn::Sqlite(conn) = &mut *conn else {
            return Err(StoreError::Open {
                path: self.location.clone(),
                reason:
                    "a size cap is for an SQLite file; a PostgreSQL database is sized by its server"
                        .to_owned(),
            });
        };
        let page: i64 = conn
            .pragma_query_value(None, "page_size", |r| r.get(0))
            .map_err(|e| self.sql(e.into()))?;
        let pages = (bytes / page.max(1) as u64).max(1);
        conn.pragma_update(None, "max_page_count", pages as i64)
            .map_err(|e| self.sql(e.into()))
    }

    /// Removes what no answer refers to: runs that never finished with a
    /// certificate (failed, abandoned), and sources (with their partitions
    /// and routes) that no remaining run read. Facts, vectors and fold
    /// nodes are the cache and stay. Refused while another run is live.
    pub fn collect_garbage(&self) -> Result<GcReport, StoreError> {
        self.close_abandoned_runs(LIVE_MS)?;
        let live = self.live_runs(LIVE_MS)?;
        if !live.is_empty() {
            let names: Vec<String> = live.iter().map(ToString::to_string).collect();
            return Err(StoreError::Busy {
                path: self.path.display().to_string(),
                secs: 0,
                holders: format!("; runs are live on it: {}", names.join(", ")),
            });
        }
        let before = self.file_bytes();
        let mut conn = self.conn();
        let report = conn
            .transaction(|tx| {
                let mut report = GcReport::default();
                let dead = "SELECT run_id FROM runs WHERE certificate IS NULL";
                tx.execute(
                    &format!("DELETE FROM run_units WHERE run_id IN ({dead})"),
                    params![],
                )?;
                tx.execute(
                    &format!("DELETE FROM run_events WHERE run_id IN ({dead})"),
                    params![],
                )?;
                report.runs =
                    tx.execute("DELETE FROM runs WHERE certificate IS NULL", params![])?;
                // A run's per-unit rows are its outcome unit by unit, which
                // the next answered run of the same spec over the same source
                // states again: without this, every rerun adds a row per unit
                // for good.
                report.superseded_unit_rows = tx.execute(
                    "DELETE FROM run_units WHERE run_id IN (
                         SELECT old.run_id FROM runs old
                         WHERE old.certificate IS NOT NULL AND EXISTS (
                             SELECT 1 FROM runs new
                             WHERE new.certificate IS NOT NULL
                               AND new.spec_hash = old.spec_hash
                               AND new.source_hash = old.source_hash
                               AND new.started_ms > old.started_ms))",
                    params![],
                )?;
                let unread: Vec<String> = tx.query_map(
                    "SELECT hash FROM artifacts
                     WHERE hash NOT IN (SELECT source_hash FROM runs)",
                    params![],
                    |r| r.get(0),
                )?;
                for hash in &unread {
                    drop_source(tx, hash)?;
                }
                report.sources = unread.len() as u64;
                report.chunks = delete_orphan_chunks(tx)?;
                Ok(report)
            })
            .map_err(|e| self.sql(e))?;
        // Give the freed pages back. In WAL mode VACUUM writes the new copy
        // into the log: a second checkpoint folds it back, so the file
        // shrinks and the log is empty again. PostgreSQL's VACUUM makes the
        // space reusable (only VACUUM FULL, which locks every table, would
        // shrink the files).
        let reclaim = if conn.is_postgres() {
            "VACUUM"
        } else {
            "PRAGMA wal_checkpoint(TRUNCATE); VACUUM; PRAGMA wal_checkpoint(TRUNCATE);"
        };
        conn.batch(reclaim).map_err(|e| self.sql(e))?;
        drop(conn);
        let mut report = report;
        report.bytes_before = before;
        report.bytes_after = self.file_bytes();
        Ok(report)
    }

    /// The store's size on disk: the SQLite file and its log, or the
    /// PostgreSQL database.
    fn file_bytes(&self) -> u64 {
        {
            let mut conn = self.conn();
            if conn.is_postgres() {
                return conn
                    .query_one(
                        "SELECT pg_database_size(current_database())",
                        params![],
                        |r| r.get::<i64>(0),
                    )
                    .map_or(0, |n| n.max(0) as u64);
            }
        }
        let wal = PathBuf::from(format!("{}-wal", self.path.display()));
        [&self.path, &wal]
            .iter()
            .filter_map(|p| std::fs::metadata(p).ok())
            .map(|m| m.len())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fanfold_core::{Cost, FACT_SCHEMA, ModelParams, Status, UnitId};

    #[test]
    fn labels_are_kept_replaced_and_taken_back_by_key() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("s.sqlite")).unwrap();
        let key = ContentHash::of_bytes(b"question and view");
        assert_eq!(store.get_label(&key).unwrap(), None);
        let mut label = Label {
            key,
            stage: "judge".into(),
            unit_id: "7".into(),
            decision: "yes".into(),
            labeller: "person:ann".into(),
        };
        store.put_label(&label).unwrap();
        assert_eq!(store.get_label(&key).unwrap(), Some(label.clone()));
        label.decision = "no".into();
        store.put_label(&label).unwrap();
        assert_eq!(store.get_label(&key).unwrap(), Some(label));
        assert!(store.delete_label(&key).unwrap());
        assert!(!store.delete_label(&key).unwrap());
        assert_eq!(store.get_label(&key).unwrap(), None);
    }

    /// Where SQLite says only "unable to open database file", the error
    /// says what is wrong with the path.
    #[test]
    fn a_store_that_cannot_be_opened_says_why() {
        let dir = tempfile::tempdir().unwrap();
        let err = Store::open(dir.path()).err().expect("a folder is refused");
        assert!(err.to_string().contains("it is a folder"), "{err}");
        let file = dir.path().join("plain");
        std::fs::write(&file, b"x").unwrap();
        let err = Store::open(&file.join("s.sqlite"))
            .err()
            .expect("a path under a file is refused");
        let shown = err.to_string();
        assert!(shown.starts_with("cannot open store "), "{shown}");
        assert!(shown.contains("is a file, not a folder"), "{shown}");
    }

    #[test]
    fn another_applications_database_is_refused_and_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notes.sqlite");
        {
            let c = Connection::open(&path).unwrap();
            c.execute_batch("CREATE TABLE meta (key TEXT, value TEXT); CREATE TABLE notes (x);")
                .unwrap();
        }
        let before = std::fs::read(&path).unwrap();
        let err = Store::open(&path).err().expect("refused");
        assert!(matches!(err, StoreError::Foreign { .. }), "{err}");
        assert!(err.to_string().contains("another application"), "{err}");
        assert_eq!(
            std::fs::read(&path).unwrap(),
            before,
            "not one byte changed"
        );
        assert!(
            !dir.path().join("notes.sqlite-wal").exists(),
            "no switch to WAL"
        );

        // An empty file becomes a store, and a store opens again.
        let empty = dir.path().join("empty.sqlite");
        std::fs::write(&empty, b"").unwrap();
        drop(Store::open(&empty).unwrap());
        drop(Store::open(&empty).unwrap());
        let c = Connection::open(&empty).unwrap();
        let id: i64 = c
            .pragma_query_value(None, "application_id", |r| r.get(0))
            .unwrap();
        assert_eq!(id, APPLICATION_ID);
    }

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
            choice_scores: Vec::new(),
            reason: None,
            evidence: vec![],
            cost: Cost::default(),
            attempts: 1,
            reducer_path: vec![],
            truncated_tokens: 0,
            digest: None,
        }
    }

    #[test]
    fn facts_round_trip_and_failures_are_never_cached() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(&dir.path().join("s.sqlite")).expect("open");
        let f = fact(Status::Negative);
        store.put_fact(&f).expect("put");
        // Stored sealed: what comes back is the fact with its digest.
        let mut sealed = f.clone();
        sealed.seal();
        assert_eq!(store.get_fact(&f.key).expect("get"), Some(sealed));
        for st in [Status::Error, Status::Cancelled, Status::NotRun] {
            assert!(matches!(
                store.put_fact(&fact(st)),
                Err(StoreError::NotCacheable { .. })
            ));
        }
        assert_eq!(store.count_facts().expect("count"), 1);
        // A row whose status was edited no longer matches its digest: it
        // is refused, dropped and counted, and computed again by its run.
        store
            .conn()
            .execute(
                "UPDATE facts SET record = replace(record, '\"negative\"', '\"positive\"')",
                params![],
            )
            .expect("edit");
        assert_eq!(store.get_fact(&f.key).expect("get"), None);
        assert_eq!(store.corrupt_facts(), 1);
        assert_eq!(store.count_facts().expect("count"), 0);
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
        let h = ContentHash::of_bytes(b"abc\ndef");
        let (a, b) = (
            ContentHash::of_bytes(b"abc\n"),
            ContentHash::of_bytes(b"def"),
        );
        let chunks = [
            ChunkRef {
                hash: a,
                len: 4,
                newlines: 1,
            },
            ChunkRef {
                hash: b,
                len: 3,
                newlines: 0,
            },
        ];
        {
            let store = Store::open(&path).expect("open");
            store
                .put_chunks(&[(a, b"abc\n"), (b, b"def")])
                .expect("chunks");
            assert!(store.put_artifact(&h, "test", &chunks).expect("put"));
            assert!(
                !store
                    .put_artifact(&h, "test", &chunks[..1])
                    .expect("put again")
            );
            store.begin_run("r1", "spec", &h, &h).expect("run");
        }
        let store = Store::open(&path).expect("reopen");
        assert_eq!(
            store.artifact_chunks(&h).expect("get").as_deref(),
            Some(&chunks[..])
        );
        assert_eq!(
            store.get_chunk(&b).expect("chunk").as_deref(),
            Some(&b"def"[..])
        );
        assert_eq!(store.unfinished_runs().expect("runs"), ["r1"]);
    }

    #[test]
    fn a_damaged_chunk_is_never_handed_out_and_is_stored_again() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(&dir.path().join("s.sqlite")).expect("open");
        let bytes = b"the disk failed hard\n";
        let hash = ContentHash::of_bytes(bytes);
        store.put_chunks(&[(hash, bytes)]).expect("put");
        store
            .conn()
            .execute(
                "UPDATE chunks SET bytes = ?2 WHERE hash = ?1",
                params![&hash.0[..], &b"the disk FAILED hard\n"[..]],
            )
            .expect("damage it");
        match store.get_chunk(&hash) {
            Err(e @ StoreError::CorruptChunk { .. }) => {
                assert!(e.to_string().contains(&hash.to_hex()), "{e}");
            }
            other => panic!("a damaged chunk was read: {other:?}"),
        }
        // Gone, so the next ingest of the source stores it again.
        assert!(!store.has_chunk(&hash).expect("has"));
        store.put_chunks(&[(hash, bytes)]).expect("put again");
        assert_eq!(
            store.get_chunk(&hash).expect("get").as_deref(),
            Some(&bytes[..])
        );
    }

    #[test]
    fn partitions_are_written_in_batches_and_found_again() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(&dir.path().join("s.sqlite")).expect("open");
        let src = ContentHash::of_bytes(b"source");
        let key = ContentHash::of_bytes(b"partition");
        let (id, done) = store.open_partition(&key, &src, "{}").expect("open");
        assert_eq!(done, None);
        let unit = |id: &str, ordinal: u64| Unit {
            unit_id: fanfold_core::UnitId(id.into()),
            unit_kind: "row".into(),
            ordinal,
            source_hash: src,
            unit_hash: ContentHash::of_bytes(id.as_bytes()),
            bytes: fanfold_core::ByteRange {
                start: ordinal * 10,
                end: ordinal * 10 + 5,
            },
        };
        let units = [unit("a", 0), unit("b", 1)];
        let prefilter = store
            .open_prefilter(&ContentHash::of_bytes(b"rules"), "[]")
            .expect("prefilter");
        let rules = [0u8, RULE_NONE];
        let batch = PartitionBatch {
            partition: id,
            units: &units,
            rejections: &[],
            prefilter: Some(prefilter),
            first_ordinal: 0,
            rules: &rules,
        };
        store.put_partition_batch(&batch).expect("batch");
        // A repeated batch (a resumed run) changes nothing.
        store.put_partition_batch(&batch).expect("batch again");
        assert!(store.unit_id_before(id, "a", 5).expect("query"));
        assert!(!store.unit_id_before(id, "a", 0).expect("query"));
        assert!(!store.unit_id_before(id, "zzz", 9).expect("query"));
        assert_eq!(
            store.unit_before(id, "b", 5).expect("query"),
            Some((1, ContentHash::of_bytes(b"b"), 10))
        );
        assert_eq!(store.unit_before(id, "b", 1).expect("query"), None);
        assert_eq!(store.unit_range(id, "b").expect("range"), Some((10, 15)));
        assert_eq!(
            store.route_of(id, prefilter, 1).expect("route"),
            Some(RULE_NONE)
        );
        assert_eq!(store.route_of(id, prefilter, 2).expect("route"), None);
        assert_eq!(store.count_units(&src).expect("count"), 2);
        let counts = PartitionCounts {
            elements: 2,
            units: 2,
            rejected: 0,
        };
        store.finish_partition(id, counts).expect("finish");
        assert!(!store.routing_done(id, prefilter).expect("routing"));
        store.finish_routing(id, prefilter).expect("finish routing");
        assert!(store.routing_done(id, prefilter).expect("routing"));
        let (again, done) = store.open_partition(&key, &src, "{}").expect("reopen");
        assert_eq!((again, done), (id, Some(counts)));
    }

    #[test]
    fn open_batches_are_found_by_request_key_until_closed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(&dir.path().join("s.sqlite")).expect("open");
        let row = |id: &str, at: u64| BatchRow {
            batch_id: id.into(),
            provider: "openai".into(),
            endpoint: "https://api.example/v1".into(),
            state: BatchState::Open,
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
        store
            .close_batch("b2", BatchState::Consumed)
            .expect("close");
        assert_eq!(found("k2"), Some(("b1".into(), "r1".into())));
        store.close_batch("b1", BatchState::Failed).expect("close");
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

    #[test]
    fn a_key_is_claimed_by_one_run_until_its_lease_lapses() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s.sqlite");
        let a = Store::open(&path).expect("open");
        let b = Store::open(&path).expect("open");
        let key = ContentHash::of_bytes(b"unit 1");
        let h = ContentHash::of_bytes(b"x");
        a.begin_run("run-a", "spec", &h, &h).expect("run");
        b.begin_run("run-b", "spec", &h, &h).expect("run");
        assert_eq!(a.claim(&key, "run-a", 60_000).expect("claim"), Claim::Mine);
        // Claiming again is renewing, for the holder.
        assert_eq!(a.claim(&key, "run-a", 60_000).expect("claim"), Claim::Mine);
        match b.claim(&key, "run-b", 60_000).expect("claim") {
            Claim::Held { run_id, expires_ms } => {
                assert_eq!(run_id, "run-a");
                assert!(expires_ms > now_ms());
            }
            Claim::Mine => panic!("two runs hold one key"),
        }
        // A holder that stops renewing loses the key once the lease lapses.
        let other = ContentHash::of_bytes(b"unit 2");
        assert_eq!(a.claim(&other, "run-a", 0).expect("claim"), Claim::Mine);
        std::thread::sleep(std::time::Duration::from_millis(5));
        assert_eq!(
            b.claim(&other, "run-b", 60_000).expect("claim"),
            Claim::Mine
        );
        // A heartbeat renews every lease the run holds.
        a.heartbeat("run-a", 120_000, None).expect("beat");
        assert!(matches!(
            b.claim(&key, "run-b", 60_000).expect("claim"),
            Claim::Held { .. }
        ));
        // Finishing drops the run's leases.
        a.finish_run("run-a", "completed", "{}").expect("finish");
        assert_eq!(b.claim(&key, "run-b", 60_000).expect("claim"), Claim::Mine);
        let live: Vec<String> = b
            .live_runs(LIVE_MS)
            .expect("live")
            .into_iter()
            .map(|r| r.run_id)
            .collect();
        assert_eq!(live, ["run-b"]);
    }

    #[test]
    fn killed_runs_end_abandoned_and_drop_their_leases() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(&dir.path().join("s.sqlite")).expect("open");
        let h = ContentHash::of_bytes(b"x");
        store.begin_run("dead", "spec", &h, &h).expect("run");
        store.begin_run("alive", "spec", &h, &h).expect("run");
        let key = ContentHash::of_bytes(b"unit");
        assert_eq!(
            store.claim(&key, "dead", 600_000).expect("claim"),
            Claim::Mine
        );
        // The dead run's last sign of life was long ago.
        store
            .conn()
            .execute(
                "UPDATE runs SET heartbeat_ms = 1 WHERE run_id = 'dead'",
                params![],
            )
            .expect("age");
        assert_eq!(store.close_abandoned_runs(LIVE_MS).expect("close"), 1);
        assert_eq!(store.unfinished_runs().expect("runs"), ["alive"]);
        let reason: String = store
            .conn()
            .query_row(
                "SELECT stop_reason FROM runs WHERE run_id = 'dead'",
                params![],
                |r| r.get(0),
            )
            .expect("row")
            .expect("the run");
        assert_eq!(reason, "abandoned");
        assert_eq!(
            store.claim(&key, "alive", 60_000).expect("claim"),
            Claim::Mine
        );
        // A run of this host whose process has exited is abandoned at
        // once, whatever its heartbeat says; a live process's run is not.
        let mut child = std::process::Command::new("true").spawn().expect("spawn");
        let exited = child.id();
        child.wait().expect("wait");
        store.begin_run("exited", "spec", &h, &h).expect("run");
        store
            .conn()
            .execute(
                "UPDATE runs SET pid = ?1 WHERE run_id = 'exited'",
                params![i64::from(exited)],
            )
            .expect("pid");
        assert_eq!(store.close_abandoned_runs(LIVE_MS).expect("close"), 1);
        assert_eq!(store.unfinished_runs().expect("runs"), ["alive"]);
    }

    #[test]
    fn a_locked_store_names_the_run_holding_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s.sqlite");
        let holder = Store::open(&path).expect("open");
        let h = ContentHash::of_bytes(b"x");
        holder
            .begin_run("run-holder", "triage", &h, &h)
            .expect("run");
        let err = StoreError::Busy {
            path: path.display().to_string(),
            secs: 10,
            holders: String::new(),
        }
        .name_holders(Some("run-me"));
        let text = err.to_string();
        assert!(text.contains("run run-holder of spec `triage`"), "{text}");
        assert!(
            text.contains(&format!("pid {}", std::process::id())),
            "{text}"
        );
        assert!(text.contains("another --store"), "{text}");
        // SQLite's own busy error becomes this error.
        let c = Connection::open(&path).expect("conn");
        c.execute_batch("BEGIN IMMEDIATE").expect("lock");
        {
            let guard = holder.conn();
            let Conn::Sqlite(held) = &*guard else {
                panic!("an SQLite store");
            };
            held.busy_timeout(std::time::Duration::from_millis(50))
                .expect("timeout");
        }
        let busy = holder
            .put_fold_node(&h, 0, &serde_json::json!(1))
            .expect_err("locked");
        assert!(matches!(busy, StoreError::Busy { .. }), "{busy}");
    }

    /// Two processes that open one new store at the same instant both get
    /// it: neither sees the other's switch to WAL as a lock it gives up on.
    #[test]
    fn a_new_store_opened_twice_at_once_opens_for_both() {
        for _ in 0..40 {
            let dir = tempfile::tempdir().expect("tempdir");
            let path = dir.path().join("s.sqlite");
            let gate = std::sync::Barrier::new(2);
            std::thread::scope(|s| {
                let opens: Vec<_> = (0..2)
                    .map(|_| {
                        s.spawn(|| {
                            gate.wait();
                            Store::open(&path).map(drop)
                        })
                    })
                    .collect();
                for open in opens {
                    let opened = open.join().expect("thread");
                    assert!(opened.is_ok(), "{opened:?}");
                }
            });
        }
    }

    #[test]
    fn v2_and_v3_stores_are_upgraded_in_place() {
        let current = "    pid INTEGER, host TEXT, heartbeat_ms INTEGER, progress TEXT);";
        for (version, runs_end) in [
            ("fanfold-store-v2", ");"),
            (
                "fanfold-store-v3",
                ",\n    pid INTEGER, host TEXT, heartbeat_ms INTEGER);",
            ),
        ] {
            let dir = tempfile::tempdir().expect("tempdir");
            let path = dir.path().join("s.sqlite");
            {
                let c = Connection::open(&path).expect("conn");
                let old = SCHEMA.replace(&format!(",\n{current}"), runs_end);
                assert!(!old.contains("progress"), "the old runs table");
                c.execute_batch(&old).expect("old tables");
                c.execute(
                    "INSERT INTO meta (key, value) VALUES ('schema', ?1)",
                    [version],
                )
                .expect("meta");
                c.pragma_update(None, "application_id", APPLICATION_ID)
                    .expect("app id");
                c.execute(
                    "INSERT INTO runs (run_id, spec_name, spec_hash, source_hash, started_ms) VALUES ('old', 's', 'h', 'h', 1)",
                    [],
                )
                .expect("old run");
            }
            let store = Store::open(&path).expect("upgraded");
            let h = ContentHash::of_bytes(b"x");
            store.begin_run("new", "s", &h, &h).expect("run");
            store
                .heartbeat("new", 1_000, Some(r#"{"units": 3}"#))
                .expect("beat");
            assert_eq!(store.unfinished_runs().expect("runs"), ["old", "new"]);
            let runs = store.run_overview(10).expect("overview");
            assert_eq!(
                runs[0].progress.as_deref(),
                Some(r#"{"units": 3}"#),
                "{version}"
            );
            drop(store);
            drop(Store::open(&path).expect("opens as v4"));
        }
    }
}
