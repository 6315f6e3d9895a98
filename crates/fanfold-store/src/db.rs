//! The store's two engines behind one connection: SQLite (one file, the
//! default) and PostgreSQL (a server that many processes and hosts share).
//!
//! Every statement of the store is written once, in the SQL both engines
//! speak (`INSERT … ON CONFLICT`, `excluded.`, `COALESCE`), with numbered
//! parameters `?1`, `?2`… that PostgreSQL receives as `$1`, `$2`…. Tables
//! are declared once too: [`pg_ddl`] gives PostgreSQL its names for the
//! same types. So the logical schema cannot drift between the engines, and
//! a test of a statement on one engine reads the same text the other runs.

use std::collections::HashMap;

use postgres::types::Type;

/// A value bound to a statement: anything both engines can encode (and
/// share with the thread a PostgreSQL call may run on).
pub(crate) trait Param: rusqlite::ToSql + postgres::types::ToSql + Sync {}
impl<T: rusqlite::ToSql + postgres::types::ToSql + Sync> Param for T {}

/// `params![a, b]`: the parameters of one statement, in order.
macro_rules! params {
    () => { &[] as &[&dyn $crate::db::Param] };
    ($($p:expr),+ $(,)?) => { &[$(&$p as &dyn $crate::db::Param),+] as &[&dyn $crate::db::Param] };
}
pub(crate) use params;

#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error(transparent)]
    Sqlite(#[from] rusqlite::Error),
    #[error("{}", postgres_words(.0))]
    Postgres(#[from] postgres::Error),
    #[error("column {index}: {detail}")]
    Column { index: usize, detail: String },
    #[error("the query returned no row")]
    NoRow,
    /// The address asks for TLS that cannot be set up (a root certificate
    /// file that cannot be read).
    #[error("TLS: {0}")]
    Tls(String),
}

/// PostgreSQL's own message, with its detail and hint when it gives them
/// (the client's `Display` says only "db error").
fn postgres_words(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => {
            let mut s = format!("{} ({})", db.message(), db.code().code());
            if let Some(detail) = db.detail() {
                s.push_str(&format!("; {detail}"));
            }
            if let Some(hint) = db.hint() {
                s.push_str(&format!("; {hint}"));
            }
            s
        }
        None => match std::error::Error::source(e) {
            Some(cause) => format!("{e}: {cause}"),
            None => e.to_string(),
        },
    }
}

impl DbError {
    /// SQLite's "another writer holds the file": wait, or name the holder.
    pub(crate) fn is_busy(&self) -> bool {
        matches!(self, DbError::Sqlite(e) if matches!(
            e.sqlite_error_code(),
            Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
        ))
    }

    /// PostgreSQL aborted the transaction to break a deadlock or a
    /// serialization conflict with another one: running it again is the
    /// documented answer.
    fn is_retryable(&self) -> bool {
        self.is_lost_connection()
            || matches!(self, DbError::Postgres(e) if e.code().is_some_and(|c| {
                *c == postgres::error::SqlState::T_R_DEADLOCK_DETECTED
                    || *c == postgres::error::SqlState::T_R_SERIALIZATION_FAILURE
            }))
    }

    /// The PostgreSQL server dropped the connection (it shut down,
    /// restarted, or the network went): a new connection may succeed.
    /// Returned by a statement, it means the server stayed away for the
    /// whole reconnect wait.
    pub fn is_lost_connection(&self) -> bool {
        use postgres::error::SqlState;
        matches!(self, DbError::Postgres(e) if e.is_closed() || e.code().is_some_and(|c| {
            *c == SqlState::ADMIN_SHUTDOWN
                || *c == SqlState::CRASH_SHUTDOWN
                || *c == SqlState::CANNOT_CONNECT_NOW
        }) || (e.as_db_error().is_none() && std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>())))
    }
}

/// A result row of either engine.
pub(crate) enum Row<'a> {
    Sqlite(&'a rusqlite::Row<'a>),
    Postgres(&'a postgres::Row),
}

impl Row<'_> {
    pub(crate) fn get<T: Column>(&self, index: usize) -> Result<T, DbError> {
        match self {
            Row::Sqlite(r) => T::sqlite(r, index).map_err(DbError::from),
            Row::Postgres(r) => T::postgres(r, index),
        }
    }
}

/// A Rust type a column is read as.
pub(crate) trait Column: Sized {
    fn sqlite(row: &rusqlite::Row<'_>, index: usize) -> rusqlite::Result<Self>;
    fn postgres(row: &postgres::Row, index: usize) -> Result<Self, DbError>;
}

macro_rules! same_on_both {
    ($($t:ty),*) => {$(
        impl Column for $t {
            fn sqlite(row: &rusqlite::Row<'_>, index: usize) -> rusqlite::Result<Self> {
                row.get(index)
            }
            fn postgres(row: &postgres::Row, index: usize) -> Result<Self, DbError> {
                row.try_get(index).map_err(DbError::from)
            }
        }
    )*};
}
same_on_both!(String, Option<String>, Vec<u8>, Option<Vec<u8>>, f64);

/// PostgreSQL types an integer literal or `COUNT` by its own width; the
/// store reads every integer as `i64`.
fn pg_int(row: &postgres::Row, index: usize) -> Result<Option<i64>, DbError> {
    let ty = row
        .columns()
        .get(index)
        .map(|c| c.type_().clone())
        .ok_or_else(|| DbError::Column {
            index,
            detail: "no such column".to_owned(),
        })?;
    Ok(match ty {
        Type::INT8 => row.try_get::<_, Option<i64>>(index)?,
        Type::INT4 => row.try_get::<_, Option<i32>>(index)?.map(i64::from),
        Type::INT2 => row.try_get::<_, Option<i16>>(index)?.map(i64::from),
        other => {
            return Err(DbError::Column {
                index,
                detail: format!("{other} is not an integer"),
            });
        }
    })
}

impl Column for i64 {
    fn sqlite(row: &rusqlite::Row<'_>, index: usize) -> rusqlite::Result<Self> {
        row.get(index)
    }
    fn postgres(row: &postgres::Row, index: usize) -> Result<Self, DbError> {
        pg_int(row, index)?.ok_or_else(|| DbError::Column {
            index,
            detail: "NULL where a number was expected".to_owned(),
        })
    }
}

impl Column for Option<i64> {
    fn sqlite(row: &rusqlite::Row<'_>, index: usize) -> rusqlite::Result<Self> {
        row.get(index)
    }
    fn postgres(row: &postgres::Row, index: usize) -> Result<Self, DbError> {
        pg_int(row, index)
    }
}

/// The PostgreSQL text of a statement written for both engines: `?N`
/// parameters become `$N` (no statement of the store has a `?` in a
/// string literal).
fn pg_sql(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '?' && chars.peek().is_some_and(char::is_ascii_digit) {
            out.push('$');
        } else {
            out.push(c);
        }
    }
    out
}

/// The PostgreSQL text of a table declaration written for SQLite: the
/// same columns and keys, in PostgreSQL's names for their types.
pub(crate) fn pg_ddl(sql: &str) -> String {
    sql.replace(
        "INTEGER PRIMARY KEY",
        "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY",
    )
    .replace("INTEGER", "BIGINT")
    .replace("BLOB", "BYTEA")
    .replace(" WITHOUT ROWID", "")
}

/// How long a connection the PostgreSQL server dropped is tried again,
/// unless [`RECONNECT_VAR`] says otherwise.
const RECONNECT_FOR: std::time::Duration = std::time::Duration::from_secs(30);

/// The environment variable that sets [`RECONNECT_FOR`] in whole seconds
/// (a server that takes longer to fail over; a test that shuts one down).
pub(crate) const RECONNECT_VAR: &str = "FANFOLD_STORE_RECONNECT_SECS";

/// How long a dropped connection is tried again: [`RECONNECT_VAR`] when it
/// holds a number of seconds, else [`RECONNECT_FOR`].
fn reconnect_for() -> std::time::Duration {
    static PATIENCE: std::sync::OnceLock<std::time::Duration> = std::sync::OnceLock::new();
    *PATIENCE.get_or_init(|| {
        std::env::var(RECONNECT_VAR)
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map_or(RECONNECT_FOR, std::time::Duration::from_secs)
    })
}

/// The most rows [`Conn::insert_rows`] puts in one statement: 256 rows of
/// 8 columns stay far below both engines' limits on parameters (SQLite's
/// 32,766, PostgreSQL's 65,535).
const ROWS_A_STATEMENT: usize = 256;

/// `(?1, ?2), (?3, ?4)` for 2 rows of 2 columns: the VALUES list of a
/// multi-row insert. Kept per shape, since a route pass writes thousands
/// of statements of the same few shapes and building the text a
/// placeholder at a time cost as much as SQLite's own work on them.
fn placeholders(columns: usize, rows: usize) -> std::sync::Arc<str> {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex, OnceLock};
    /// Statement texts by (columns, rows).
    type ByShape = HashMap<(usize, usize), Arc<str>>;
    static MADE: OnceLock<Mutex<ByShape>> = OnceLock::new();
    let made = MADE.get_or_init(|| Mutex::new(HashMap::new()));
    let mut made = made.lock().unwrap_or_else(|e| e.into_inner());
    Arc::clone(made.entry((columns, rows)).or_insert_with(|| {
        use std::fmt::Write as _;
        let mut text = String::with_capacity(rows * columns * 8);
        for r in 0..rows {
            text.push_str(if r == 0 { "(" } else { ", (" });
            for c in 0..columns {
                if c > 0 {
                    text.push_str(", ");
                }
                let _ = write!(text, "?{}", r * columns + c + 1);
            }
            text.push(')');
        }
        text.into()
    }))
}

/// The parameters as SQLite binds them.
fn sqlite_args<'a>(params: &'a [&'a dyn Param]) -> Vec<&'a dyn rusqlite::ToSql> {
    params.iter().map(|p| *p as &dyn rusqlite::ToSql).collect()
}

/// One open connection to a store.
pub(crate) enum Conn {
    Sqlite(rusqlite::Connection),
    Postgres(Box<Pg>),
}

pub(crate) struct Pg {
    client: postgres::Client,
    /// The address, to open the connection again when the server dropped
    /// it (a restart, a failover to a standby).
    url: String,
    /// Statements prepared on this connection, by their text: the store
    /// runs a few dozen statements many times each.
    prepared: HashMap<String, postgres::Statement>,
    /// Whether a transaction is open (a panic inside one leaves it so;
    /// the next one rolls it back first).
    in_transaction: bool,
    /// The server stayed away for a whole [`reconnect_for`]: until a
    /// connection opens again, each statement tries once and fails, so a
    /// process ends within one wait rather than one for every statement
    /// it still has to run.
    gave_up: bool,
}

/// A PostgreSQL address as the client takes it, and the TLS it speaks.
///
/// TLS is asked for as libpq users ask: `sslmode=require` (or `verify-ca`,
/// `verify-full`, which mean the same here: the server's certificate is
/// always verified, against Mozilla's roots and the CA certificates in
/// `sslrootcert=FILE`). Without `sslmode`, the connection is plain, as it
/// always was; `sslmode=prefer` takes TLS when the server offers it.
struct Address {
    /// The address without the parameters only this side reads.
    url: String,
    tls: tokio_postgres_rustls::MakeRustlsConnect,
}

impl Address {
    fn parse(url: &str) -> Result<Address, DbError> {
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let mut kept = Vec::new();
        let mut root_cert = None;
        let mut mode = None;
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            match key {
                "sslrootcert" => root_cert = Some(value.to_owned()),
                "sslmode" => mode = Some(value.to_owned()),
                _ => kept.push(pair.to_owned()),
            }
        }
        let mode = match mode.as_deref() {
            None | Some("disable") => "disable",
            Some("prefer" | "allow") => "prefer",
            Some("require" | "verify-ca" | "verify-full") => "require",
            Some(other) => {
                return Err(DbError::Tls(format!(
                    "sslmode={other}: give disable, prefer, require, verify-ca or verify-full"
                )));
            }
        };
        kept.push(format!("sslmode={mode}"));
        Ok(Address {
            url: format!("{base}?{}", kept.join("&")),
            tls: tls(root_cert.as_deref())?,
        })
    }
}

/// A TLS client that verifies the server against Mozilla's roots and the
/// certificates in `root_cert` (a PEM file), on rustls with ring.
fn tls(root_cert: Option<&str>) -> Result<tokio_postgres_rustls::MakeRustlsConnect, DbError> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Some(path) = root_cert {
        let pem =
            std::fs::read(path).map_err(|e| DbError::Tls(format!("sslrootcert {path}: {e}")))?;
        let mut added = 0;
        for cert in CertificateDer::pem_slice_iter(&pem) {
            let cert = cert.map_err(|e| DbError::Tls(format!("sslrootcert {path}: {e}")))?;
            roots
                .add(cert)
                .map_err(|e| DbError::Tls(format!("sslrootcert {path}: {e}")))?;
            added += 1;
        }
        if added == 0 {
            return Err(DbError::Tls(format!(
                "sslrootcert {path}: no PEM certificate in it"
            )));
        }
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| DbError::Tls(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(tokio_postgres_rustls::MakeRustlsConnect::new(config))
}

impl Pg {
    pub(crate) fn connect(url: &str) -> Result<Pg, DbError> {
        let address = Address::parse(url)?;
        Ok(Pg {
            client: postgres::Client::connect(&address.url, address.tls.clone())?,
            url: url.to_owned(),
            prepared: HashMap::new(),
            in_transaction: false,
            gave_up: false,
        })
    }

    /// Whether this connection speaks TLS, as the server sees it.
    pub(crate) fn encrypted(&mut self) -> Result<bool, DbError> {
        self.blocking(|pg| {
            let row = pg.client.query_one(
                "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
                &[],
            )?;
            Ok(row.try_get::<_, bool>(0)?)
        })
    }

    /// Opens the connection again after the server dropped it, trying for
    /// up to [`reconnect_for`] (30 s unless [`RECONNECT_VAR`] says): a
    /// server that restarts or fails over to a standby is back within it,
    /// and the run goes on. Once that wait ran out, one try only.
    fn reopen(&mut self) -> Result<(), DbError> {
        let deadline = std::time::Instant::now() + reconnect_for();
        let mut wait = std::time::Duration::from_millis(100);
        loop {
            let address = Address::parse(&self.url)?;
            match postgres::Client::connect(&address.url, address.tls) {
                Ok(client) => {
                    self.client = client;
                    self.prepared.clear();
                    self.in_transaction = false;
                    self.gave_up = false;
                    tracing::warn!("the store's connection was lost and is open again");
                    return Ok(());
                }
                Err(_) if !self.gave_up && std::time::Instant::now() < deadline => {
                    std::thread::sleep(wait);
                    wait = (wait * 2).min(std::time::Duration::from_secs(2));
                }
                Err(e) => {
                    self.gave_up = true;
                    return Err(e.into());
                }
            }
        }
    }

    /// Runs `f` with the client where the client can block. The blocking
    /// PostgreSQL client drives its connection on a runtime of its own,
    /// which cannot start on a thread that is driving another runtime's
    /// tasks (an HTTP backend's, whose requests end in store writes):
    /// there `f` runs on a short-lived thread of its own.
    fn blocking<T: Send>(&mut self, f: impl FnOnce(&mut Pg) -> T + Send) -> T {
        if tokio::runtime::Handle::try_current().is_err() {
            return f(self);
        }
        std::thread::scope(|s| match s.spawn(|| f(self)).join() {
            Ok(value) => value,
            Err(panic) => std::panic::resume_unwind(panic),
        })
    }

    fn statement(&mut self, sql: &str) -> Result<postgres::Statement, DbError> {
        if let Some(st) = self.prepared.get(sql) {
            return Ok(st.clone());
        }
        let st = self.client.prepare(&pg_sql(sql))?;
        self.prepared.insert(sql.to_owned(), st.clone());
        Ok(st)
    }

    /// Runs one statement: its rows, and how many rows it changed.
    fn run(
        &mut self,
        sql: &str,
        params: &[&dyn Param],
    ) -> Result<(Vec<postgres::Row>, u64), DbError> {
        let once = |pg: &mut Pg| -> Result<(Vec<postgres::Row>, u64), DbError> {
            let st = pg.statement(sql)?;
            let args = params.iter().map(|p| *p as &dyn postgres::types::ToSql);
            let mut out = Vec::new();
            let mut it = pg.client.query_raw(&st, args)?;
            while let Some(row) = postgres::fallible_iterator::FallibleIterator::next(&mut it)? {
                out.push(row);
            }
            let changed = it.rows_affected().unwrap_or(0);
            Ok((out, changed))
        };
        self.blocking(|pg| match once(pg) {
            // A statement on its own is run again on a new connection: the
            // store's claims, upserts and first-write-wins inserts may run
            // twice. One in a transaction fails, and the transaction,
            // which cannot have committed, is run again whole.
            Err(e) if e.is_lost_connection() && !pg.in_transaction => {
                pg.reopen()?;
                once(pg)
            }
            done => done,
        })
    }

    fn rows(&mut self, sql: &str, params: &[&dyn Param]) -> Result<Vec<postgres::Row>, DbError> {
        self.run(sql, params).map(|(rows, _)| rows)
    }

    fn batch(&mut self, sql: &str) -> Result<(), DbError> {
        self.blocking(|pg| pg.client.batch_execute(sql).map_err(DbError::from))
    }
}

impl Conn {
    pub(crate) fn is_postgres(&self) -> bool {
        matches!(self, Conn::Postgres(_))
    }

    /// Runs one statement; how many rows it changed.
    pub(crate) fn execute(&mut self, sql: &str, params: &[&dyn Param]) -> Result<u64, DbError> {
        match self {
            Conn::Sqlite(c) => Ok(c
                .prepare_cached(sql)?
                .execute(sqlite_args(params).as_slice())? as u64),
            Conn::Postgres(pg) => pg.run(sql, params).map(|(_, changed)| changed),
        }
    }

    /// Every row `sql` selects, each read by `f`.
    pub(crate) fn query_map<T>(
        &mut self,
        sql: &str,
        params: &[&dyn Param],
        mut f: impl FnMut(&Row<'_>) -> Result<T, DbError>,
    ) -> Result<Vec<T>, DbError> {
        match self {
            Conn::Sqlite(c) => {
                let mut st = c.prepare_cached(sql)?;
                let mut rows = st.query(sqlite_args(params).as_slice())?;
                let mut out = Vec::new();
                while let Some(r) = rows.next()? {
                    out.push(f(&Row::Sqlite(r))?);
                }
                Ok(out)
            }
            Conn::Postgres(pg) => pg
                .rows(sql, params)?
                .iter()
                .map(|r| f(&Row::Postgres(r)))
                .collect(),
        }
    }

    /// The first row `sql` selects, read by `f`; `None` when there is none.
    pub(crate) fn query_row<T>(
        &mut self,
        sql: &str,
        params: &[&dyn Param],
        f: impl FnOnce(&Row<'_>) -> Result<T, DbError>,
    ) -> Result<Option<T>, DbError> {
        match self {
            Conn::Sqlite(c) => {
                let mut st = c.prepare_cached(sql)?;
                let mut rows = st.query(sqlite_args(params).as_slice())?;
                match rows.next()? {
                    Some(r) => f(&Row::Sqlite(r)).map(Some),
                    None => Ok(None),
                }
            }
            Conn::Postgres(pg) => match pg.rows(sql, params)?.first() {
                Some(r) => f(&Row::Postgres(r)).map(Some),
                None => Ok(None),
            },
        }
    }

    /// The one row `sql` always selects (a count, a row just written).
    pub(crate) fn query_one<T>(
        &mut self,
        sql: &str,
        params: &[&dyn Param],
        f: impl FnOnce(&Row<'_>) -> Result<T, DbError>,
    ) -> Result<T, DbError> {
        self.query_row(sql, params, f)?.ok_or(DbError::NoRow)
    }

    /// Inserts `rows` as `{head} VALUES (…), (…) {tail}`: many rows a
    /// statement, so a batch costs PostgreSQL a few round trips rather
    /// than one a row. Statements hold a power of two of rows (at most
    /// [`ROWS_A_STATEMENT`]), so each table has a handful of statement
    /// texts to prepare. How many rows were written.
    pub(crate) fn insert_rows<const N: usize>(
        &mut self,
        head: &str,
        tail: &str,
        rows: &[[&dyn Param; N]],
    ) -> Result<u64, DbError> {
        let mut written = 0;
        let mut rest = rows;
        while !rest.is_empty() {
            let take = ROWS_A_STATEMENT.min(1 << rest.len().ilog2());
            let (now, later) = rest.split_at(take);
            let sql = format!("{head} VALUES {} {tail}", placeholders(N, take));
            let params: Vec<&dyn Param> = now.iter().flatten().copied().collect();
            written += self.execute(&sql, &params)?;
            rest = later;
        }
        Ok(written)
    }

    /// Statements without parameters, separated by `;` (table
    /// declarations).
    pub(crate) fn batch(&mut self, sql: &str) -> Result<(), DbError> {
        match self {
            Conn::Sqlite(c) => c.execute_batch(sql).map_err(DbError::from),
            Conn::Postgres(pg) => pg.batch(sql),
        }
    }

    /// Runs `f` in one transaction: all of its writes or none. SQLite
    /// takes the write lock at the start (`BEGIN IMMEDIATE`: in WAL mode a
    /// deferred transaction that reads and then writes fails at once when
    /// another process committed in between). PostgreSQL runs `f` again
    /// when it aborted the transaction to break a deadlock.
    pub(crate) fn transaction<T>(
        &mut self,
        mut f: impl FnMut(&mut Conn) -> Result<T, DbError>,
    ) -> Result<T, DbError> {
        let mut attempts = 0;
        loop {
            attempts += 1;
            match self.begin() {
                Ok(()) => {}
                // A connection found lost at BEGIN is opened again by the
                // next BEGIN.
                Err(e) if e.is_retryable() && attempts < 5 => continue,
                Err(e) => return Err(e),
            }
            let result = f(self);
            match result {
                Ok(value) => match self.end("COMMIT") {
                    Ok(()) => return Ok(value),
                    // A COMMIT whose connection was lost may have taken
                    // place: running the transaction again could apply it
                    // twice, so that is the caller's error.
                    Err(e) if e.is_retryable() && !e.is_lost_connection() && attempts < 5 => {
                        continue;
                    }
                    Err(e) => return Err(e),
                },
                Err(e) => {
                    // The transaction's own error is the one to report.
                    let _ = self.end("ROLLBACK");
                    if e.is_retryable() && attempts < 5 {
                        continue;
                    }
                    return Err(e);
                }
            }
        }
    }

    fn begin(&mut self) -> Result<(), DbError> {
        match self {
            Conn::Sqlite(c) => {
                if !c.is_autocommit() {
                    c.execute_batch("ROLLBACK")?;
                }
                c.execute_batch("BEGIN IMMEDIATE")?;
            }
            Conn::Postgres(pg) => {
                if pg.client.is_closed() {
                    pg.blocking(Pg::reopen)?;
                }
                if pg.in_transaction {
                    pg.batch("ROLLBACK")?;
                }
                pg.batch("BEGIN")?;
                pg.in_transaction = true;
            }
        }
        Ok(())
    }

    fn end(&mut self, how: &str) -> Result<(), DbError> {
        match self {
            Conn::Sqlite(c) => c.execute_batch(how)?,
            Conn::Postgres(pg) => {
                pg.in_transaction = false;
                pg.batch(how)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_are_numbered_for_postgres() {
        assert_eq!(
            pg_sql("SELECT a FROM t WHERE b = ?1 AND c < ?12 AND d = '?'"),
            "SELECT a FROM t WHERE b = $1 AND c < $12 AND d = '?'"
        );
    }

    #[test]
    fn a_multi_row_insert_numbers_its_parameters_row_after_row() {
        assert_eq!(&*placeholders(2, 3), "(?1, ?2), (?3, ?4), (?5, ?6)");
        assert_eq!(&*placeholders(3, 1), "(?1, ?2, ?3)");
        // Kept per shape: the same text comes back for the same shape.
        assert!(std::sync::Arc::ptr_eq(
            &placeholders(2, 3),
            &placeholders(2, 3)
        ));
    }

    #[test]
    fn tables_get_postgres_type_names() {
        assert_eq!(
            pg_ddl("CREATE TABLE t (id INTEGER PRIMARY KEY, n INTEGER, b BLOB) WITHOUT ROWID;"),
            "CREATE TABLE t (id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, n BIGINT, b BYTEA);"
        );
    }
}
