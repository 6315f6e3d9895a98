//! The fleet's work queue: `fleet_jobs` (one row per model job a
//! coordinator hands out: its prefix, how to build its backend, and
//! whether it is still open), `fleet_tasks` (one row per request: the
//! request, the worker holding it and its lease, and once answered the
//! result) and `fleet_workers` (each worker process with its heartbeat).
//!
//! A coordinator writes tasks and reads results; workers claim tasks
//! under a lease (`FOR UPDATE SKIP LOCKED` on PostgreSQL, where many
//! claim at once; SQLite's write lock serializes them anyway), renew it
//! while they work, and write each result once: the first result under a
//! task stands, and a late one (a worker paused past its lease) changes
//! nothing. A task is claimed once: its call may have been sent, and paid
//! for, the moment it was claimed. A task whose worker died or paused
//! past its lease is taken back by the coordinator
//! ([`Store::take_back_lapsed_tasks`]), which asks for it again under a
//! new reservation; a worker gives back only what it never sent.
//! `fleet_refusals` holds why a worker would not take a job, and
//! `fleet_parents` which process started a worker, so a coordinator knows
//! when no worker is left for its job. `fleet_rates` holds the per-minute limits of the endpoints the
//! workers share, as token buckets (in millionths, so integers).

use crate::db::params;
use crate::{Store, StoreError, now_ms, this_host};

pub(crate) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS fleet_jobs (
    job_id TEXT PRIMARY KEY, run_id TEXT NOT NULL, backend TEXT NOT NULL,
    model_id TEXT NOT NULL, prefix TEXT NOT NULL, options TEXT NOT NULL,
    state TEXT NOT NULL, created_ms INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS fleet_tasks (
    job_id TEXT NOT NULL, seq INTEGER NOT NULL, request TEXT NOT NULL,
    worker TEXT, lease_ms INTEGER NOT NULL, result TEXT,
    PRIMARY KEY (job_id, seq));
CREATE INDEX IF NOT EXISTS fleet_tasks_by_worker ON fleet_tasks (worker);
CREATE INDEX IF NOT EXISTS fleet_tasks_unclaimed ON fleet_tasks (job_id, seq)
    WHERE worker IS NULL;
CREATE TABLE IF NOT EXISTS fleet_rates (
    endpoint TEXT PRIMARY KEY, requests_micro INTEGER NOT NULL,
    tokens_micro INTEGER NOT NULL, updated_ms INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS fleet_workers (
    worker_id TEXT PRIMARY KEY, host TEXT NOT NULL, pid INTEGER NOT NULL,
    started_ms INTEGER NOT NULL, heartbeat_ms INTEGER NOT NULL,
    slots INTEGER NOT NULL, calls INTEGER NOT NULL, state TEXT NOT NULL,
    job_id TEXT);
CREATE TABLE IF NOT EXISTS fleet_refusals (
    job_id TEXT NOT NULL, worker_id TEXT NOT NULL, reason TEXT NOT NULL,
    PRIMARY KEY (job_id, worker_id));
CREATE TABLE IF NOT EXISTS fleet_parents (
    worker_id TEXT PRIMARY KEY, host TEXT NOT NULL, pid INTEGER NOT NULL);
";

/// A job as a coordinator opens it and a worker reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FleetJob {
    pub job_id: String,
    pub run_id: String,
    /// How to build the backend (JSON the engine writes and reads).
    pub backend: String,
    /// The identity the job's facts are keyed by; a worker whose backend
    /// answers as another model does not take the job.
    pub model_id: String,
    pub prefix: String,
    /// The job's output schema, decision and mode (JSON).
    pub options: String,
}

/// A task a worker claimed: its number in the job and the request (JSON).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FleetTask {
    pub seq: u64,
    pub request: String,
}

/// What a coordinator's read of its job finds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FleetResults {
    /// Answered tasks: `(seq, result)`.
    pub results: Vec<(u64, String)>,
    /// Tasks no worker has claimed yet: work the workers can take at once.
    pub unclaimed: u64,
}

/// A worker as `fanfold status` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerRow {
    pub worker_id: String,
    pub host: String,
    pub pid: u32,
    pub started_ms: u64,
    pub heartbeat_ms: u64,
    pub slots: u64,
    /// Calls this worker answered.
    pub calls: u64,
    /// `working`, `idle` or `stopped`.
    pub state: String,
    /// The job it works on, if any.
    pub job_id: Option<String>,
    /// Tasks it holds now.
    pub holding: u64,
}

/// Who can still answer a job, as its coordinator sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FleetWatch {
    /// Workers this coordinator started: `(worker_id, pid, gone)`, gone
    /// being stopped, or silent past the liveness window.
    pub started: Vec<(String, u32, bool)>,
    /// Live workers (not stopped, beating within the window), wherever
    /// they were started.
    pub live: Vec<String>,
    /// Live workers that refused the job, with why.
    pub refused: Vec<(String, String)>,
}

/// What a worker's heartbeat learns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobState {
    Open,
    /// Closed or cancelled by its coordinator, or its run ended or died.
    Gone,
}

/// The least and the greatest of task numbers `seqs` (an empty range for
/// none), to bound a statement to the key's range.
fn span(seqs: &[u64]) -> (i64, i64) {
    let low = seqs.iter().min().map_or(1, |s| *s as i64);
    let high = seqs.iter().max().map_or(0, |s| *s as i64);
    (low, high)
}

/// What one request or token is in a bucket: millionths, so a bucket is
/// integers and a slow limit (one a minute) still refills exactly enough.
const UNIT: i64 = 1_000_000;

/// A per-minute limit as a bucket: refilled at `limit / 60` a second,
/// holding one second's worth (at least one), in millionths. A cost
/// larger than the bucket is admitted when it is full and drives it
/// negative, so the long-run rate holds.
#[derive(Clone, Copy)]
struct Bucket {
    per_ms: i64,
    capacity: i64,
}

impl Bucket {
    fn per_minute(limit: Option<u64>) -> Option<Bucket> {
        // Past a billion a minute there is no limit worth holding here.
        let limit = i64::try_from(limit?)
            .ok()
            .filter(|l| (1..=1_000_000_000).contains(l))?;
        Some(Bucket {
            per_ms: (limit * UNIT / 60_000).max(1),
            capacity: ((limit + 59) / 60).max(1) * UNIT,
        })
    }

    fn refill(&self, level: i64, elapsed_ms: i64) -> i64 {
        level
            .saturating_add(elapsed_ms.max(0).saturating_mul(self.per_ms))
            .min(self.capacity)
    }

    /// How long until `cost` (thousandths) may be taken from `level`.
    fn wait_ms(&self, level: i64, cost: i64) -> i64 {
        let need = cost.min(self.capacity);
        if level >= need {
            0
        } else {
            ((need - level) / self.per_ms).max(1)
        }
    }
}

impl Store {
    /// Takes one request and `tokens` from `endpoint`'s shared per-minute
    /// limits, or says how long to wait. One transaction, the bucket's row
    /// locked, so processes taking at once never take the same allowance.
    pub fn take_rate(
        &self,
        endpoint: &str,
        rpm: Option<u64>,
        tpm: Option<u64>,
        tokens: u64,
    ) -> Result<Option<std::time::Duration>, StoreError> {
        let (requests, token_bucket) = (Bucket::per_minute(rpm), Bucket::per_minute(tpm));
        if requests.is_none() && token_bucket.is_none() {
            return Ok(None);
        }
        let cost = i64::try_from(tokens)
            .unwrap_or(i64::MAX)
            .saturating_mul(UNIT);
        let now = now_ms() as i64;
        let mut conn = self.conn();
        let select = if conn.is_postgres() {
            "SELECT requests_micro, tokens_micro, updated_ms FROM fleet_rates WHERE endpoint = ?1 FOR UPDATE"
        } else {
            "SELECT requests_micro, tokens_micro, updated_ms FROM fleet_rates WHERE endpoint = ?1"
        };
        let full = |b: Option<Bucket>| b.map_or(0, |b| b.capacity);
        conn.transaction(|tx| {
            tx.execute(
                "INSERT INTO fleet_rates (endpoint, requests_micro, tokens_micro, updated_ms)
                 VALUES (?1, ?2, ?3, ?4) ON CONFLICT (endpoint) DO NOTHING",
                params![endpoint, full(requests), full(token_bucket), now],
            )?;
            let (r, t, at) = tx.query_one(select, params![endpoint], |r| {
                Ok((r.get::<i64>(0)?, r.get::<i64>(1)?, r.get::<i64>(2)?))
            })?;
            let elapsed = now - at;
            let r = requests.map_or(r, |b| b.refill(r, elapsed));
            let t = token_bucket.map_or(t, |b| b.refill(t, elapsed));
            let wait = requests
                .map_or(0, |b| b.wait_ms(r, UNIT))
                .max(token_bucket.map_or(0, |b| b.wait_ms(t, cost)));
            let (r, t) = if wait == 0 {
                (
                    if requests.is_some() { r - UNIT } else { r },
                    if token_bucket.is_some() { t - cost } else { t },
                )
            } else {
                (r, t)
            };
            tx.execute(
                "UPDATE fleet_rates SET requests_micro = ?2, tokens_micro = ?3, updated_ms = ?4
                 WHERE endpoint = ?1",
                params![endpoint, r, t, now.max(at)],
            )?;
            Ok((wait > 0).then(|| std::time::Duration::from_millis(wait as u64)))
        })
        .map_err(|e| self.sql(e))
    }

    /// Gives back the tokens a request reserved and did not use.
    pub fn settle_rate(
        &self,
        endpoint: &str,
        tpm: Option<u64>,
        reserved: u64,
        used: u64,
    ) -> Result<(), StoreError> {
        let Some(bucket) = Bucket::per_minute(tpm) else {
            return Ok(());
        };
        let back = (i64::try_from(reserved).unwrap_or(0) - i64::try_from(used).unwrap_or(0))
            .saturating_mul(UNIT);
        self.conn()
            .execute(
                "UPDATE fleet_rates SET tokens_micro = CASE WHEN tokens_micro + ?2 > ?3
                     THEN ?3 ELSE tokens_micro + ?2 END
                 WHERE endpoint = ?1",
                params![endpoint, back, bucket.capacity],
            )
            .map_err(|e| self.sql(e))?;
        Ok(())
    }

    /// Opens a job for workers to take tasks of.
    pub fn open_fleet_job(&self, job: &FleetJob) -> Result<(), StoreError> {
        self.conn()
            .execute(
                "INSERT INTO fleet_jobs (job_id, run_id, backend, model_id, prefix, options, state, created_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'open', ?7)",
                params![
                    job.job_id,
                    job.run_id,
                    job.backend,
                    job.model_id,
                    job.prefix,
                    job.options,
                    now_ms() as i64
                ],
            )
            .map_err(|e| self.sql(e))?;
        Ok(())
    }

    /// Ends a job (`closed` or `cancelled`) and drops its tasks: a worker
    /// still holding one finds it gone, and its late result is a no-op.
    pub fn close_fleet_job(&self, job_id: &str, state: &str) -> Result<(), StoreError> {
        self.conn()
            .transaction(|tx| {
                tx.execute(
                    "UPDATE fleet_jobs SET state = ?2 WHERE job_id = ?1",
                    params![job_id, state],
                )?;
                tx.execute("DELETE FROM fleet_tasks WHERE job_id = ?1", params![job_id])?;
                Ok(())
            })
            .map_err(|e| self.sql(e))
    }

    /// Queues requests `(seq, request)` for workers.
    pub fn put_fleet_tasks(&self, job_id: &str, tasks: &[(u64, String)]) -> Result<(), StoreError> {
        let seqs: Vec<i64> = tasks.iter().map(|(s, _)| *s as i64).collect();
        let rows: Vec<[&dyn crate::db::Param; 4]> = tasks
            .iter()
            .zip(&seqs)
            .map(|((_, request), seq)| [&job_id as _, seq as _, request as _, &0_i64 as _])
            .collect();
        let insert = |tx: &mut crate::db::Conn| {
            tx.insert_rows(
                "INSERT INTO fleet_tasks (job_id, seq, request, lease_ms)",
                "ON CONFLICT (job_id, seq) DO NOTHING",
                &rows,
            )
        };
        let mut conn = self.conn();
        // On PostgreSQL each statement is a round trip, and each insert
        // stands alone (a task written twice is one task), so no
        // transaction is wrapped around them; SQLite commits them at once.
        if conn.is_postgres() {
            insert(&mut conn)
        } else {
            conn.transaction(insert)
        }
        .map_err(|e| self.sql(e))?;
        Ok(())
    }

    /// The answered tasks of a job: `(seq, result)`. Reading does not
    /// remove them (a read whose answer is lost can be made again);
    /// [`Store::forget_fleet_tasks`] does, once they are handled.
    pub fn fleet_results(&self, job_id: &str) -> Result<Vec<(u64, String)>, StoreError> {
        self.conn()
            .query_map(
                "SELECT seq, result FROM fleet_tasks WHERE job_id = ?1 AND result IS NOT NULL",
                params![job_id],
                |r| Ok((r.get::<i64>(0)?.max(0) as u64, r.get::<String>(1)?)),
            )
            .map_err(|e| self.sql(e))
    }

    /// Removes the tasks `handled` of a job and reads its other answered
    /// tasks numbered `from` or more, `(seq, result)`, and how many of its
    /// tasks no worker has claimed: what [`Store::forget_fleet_tasks`] and
    /// then [`Store::fleet_results`] do, in one statement on PostgreSQL.
    /// Run again after a lost answer, it removes nothing more and reads
    /// the same results, so none is lost. `from`, the oldest task still
    /// waited for, keeps the read off the rows of tasks handled long ago,
    /// which the server keeps (dead) until it vacuums the table.
    pub fn next_fleet_results(
        &self,
        job_id: &str,
        handled: &[u64],
        from: u64,
    ) -> Result<FleetResults, StoreError> {
        let mut conn = self.conn();
        let list = serde_json::to_string(handled).unwrap_or_else(|_| "[]".into());
        let mut read = FleetResults::default();
        // The count of unclaimed tasks comes as a row numbered -1 (no
        // task's number), its count in the result's column.
        let mut row = |r: &crate::db::Row<'_>| {
            let seq = r.get::<i64>(0)?;
            let text = r.get::<String>(1)?;
            match u64::try_from(seq) {
                Ok(seq) => read.results.push((seq, text)),
                Err(_) => read.unclaimed = text.parse().unwrap_or(0),
            }
            Ok(())
        };
        if !conn.is_postgres() || handled.is_empty() {
            drop(conn);
            self.forget_fleet_tasks(job_id, handled)?;
            self.conn()
                .query_map(
                    "SELECT seq, result FROM fleet_tasks
                     WHERE job_id = ?1 AND seq >= ?2 AND result IS NOT NULL
                     UNION ALL
                     SELECT -1, CAST(COUNT(*) AS TEXT) FROM fleet_tasks
                     WHERE job_id = ?1 AND seq >= ?2 AND worker IS NULL",
                    params![job_id, from as i64],
                    &mut row,
                )
                .map_err(|e| self.sql(e))?;
            return Ok(read);
        }
        let (low, high) = span(handled);
        // The select sees the rows as they were before the delete: the
        // handled ones are left out by number. Both find their rows in
        // the key's range, whatever the server guesses of the table.
        conn.query_map(
            "WITH handled AS (
                SELECT ARRAY(SELECT value::bigint
                             FROM json_array_elements_text(CAST(?2 AS TEXT)::json)) AS seqs),
             gone AS (
                DELETE FROM fleet_tasks WHERE job_id = ?1 AND seq >= ?4 AND seq <= ?5
                  AND seq = ANY ((SELECT seqs FROM handled)::bigint[]))
             SELECT seq, result FROM fleet_tasks
             WHERE job_id = ?1 AND seq >= ?3 AND result IS NOT NULL
               AND NOT (seq = ANY ((SELECT seqs FROM handled)::bigint[]))
             UNION ALL
             SELECT -1, CAST(COUNT(*) AS TEXT) FROM fleet_tasks
             WHERE job_id = ?1 AND seq >= ?3 AND worker IS NULL",
            params![job_id, list, from as i64, low, high],
            &mut row,
        )
        .map_err(|e| self.sql(e))?;
        Ok(read)
    }

    /// Removes the tasks `seqs` of a job, in one statement.
    pub fn forget_fleet_tasks(&self, job_id: &str, seqs: &[u64]) -> Result<(), StoreError> {
        if seqs.is_empty() {
            return Ok(());
        }
        let list = serde_json::to_string(seqs).unwrap_or_else(|_| "[]".into());
        let (low, high) = span(seqs);
        let mut conn = self.conn();
        // The rows are found in the key's range, not by a scan of the
        // job's tasks (the server keeps deleted ones until it vacuums).
        let sql = if conn.is_postgres() {
            "DELETE FROM fleet_tasks WHERE job_id = ?1 AND seq >= ?3 AND seq <= ?4
             AND seq = ANY (ARRAY(SELECT value::bigint
                                  FROM json_array_elements_text(CAST(?2 AS TEXT)::json)))"
        } else {
            "DELETE FROM fleet_tasks WHERE job_id = ?1 AND seq >= ?3 AND seq <= ?4
             AND seq IN (SELECT value FROM json_each(?2))"
        };
        conn.execute(sql, params![job_id, list, low, high])
            .map_err(|e| self.sql(e))?;
        Ok(())
    }

    /// Open jobs of live runs with a task no worker holds, oldest first;
    /// only `run_id`'s when it is not empty. A run is live while its
    /// heartbeat is younger than `live_ms`.
    pub fn claimable_fleet_jobs(
        &self,
        run_id: &str,
        live_ms: u64,
    ) -> Result<Vec<FleetJob>, StoreError> {
        let now = now_ms() as i64;
        self.conn()
            .query_map(
                "SELECT j.job_id, j.run_id, j.backend, j.model_id, j.prefix, j.options
                 FROM fleet_jobs j JOIN runs r ON r.run_id = j.run_id
                 WHERE j.state = 'open' AND r.finished_ms IS NULL AND r.heartbeat_ms >= ?1
                   AND (?2 = '' OR j.run_id = ?2)
                   AND EXISTS (SELECT 1 FROM fleet_tasks t WHERE t.job_id = j.job_id
                               AND t.result IS NULL AND t.worker IS NULL)
                 ORDER BY j.created_ms LIMIT 16",
                params![now - live_ms as i64, run_id],
                |r| {
                    Ok(FleetJob {
                        job_id: r.get(0)?,
                        run_id: r.get(1)?,
                        backend: r.get(2)?,
                        model_id: r.get(3)?,
                        prefix: r.get(4)?,
                        options: r.get(5)?,
                    })
                },
            )
            .map_err(|e| self.sql(e))
    }

    /// Claims at most `n` of a job's unanswered tasks that no worker
    /// holds (never claimed, or given back unsent) for `worker` until
    /// `lease_ms` from now. Concurrent claims never take one task twice,
    /// and a task whose holder's lease lapsed is not taken here: its call
    /// may have been sent, so only its coordinator, under a new
    /// reservation, asks for it again.
    pub fn claim_fleet_tasks(
        &self,
        job_id: &str,
        worker: &str,
        n: usize,
        lease_ms: u64,
    ) -> Result<Vec<FleetTask>, StoreError> {
        if n == 0 {
            return Ok(Vec::new());
        }
        let now = now_ms() as i64;
        let mut conn = self.conn();
        let sql = if conn.is_postgres() {
            "UPDATE fleet_tasks SET worker = ?2, lease_ms = ?3
             WHERE job_id = ?1 AND seq IN (
                SELECT seq FROM fleet_tasks WHERE job_id = ?1 AND result IS NULL AND worker IS NULL
                ORDER BY seq LIMIT ?4 FOR UPDATE SKIP LOCKED)
             RETURNING seq, request"
        } else {
            "UPDATE fleet_tasks SET worker = ?2, lease_ms = ?3
             WHERE job_id = ?1 AND seq IN (
                SELECT seq FROM fleet_tasks WHERE job_id = ?1 AND result IS NULL AND worker IS NULL
                ORDER BY seq LIMIT ?4)
             RETURNING seq, request"
        };
        let mut tasks = conn
            .query_map(
                sql,
                params![job_id, worker, now + lease_ms as i64, n as i64],
                |r| {
                    Ok(FleetTask {
                        seq: r.get::<i64>(0)?.max(0) as u64,
                        request: r.get(1)?,
                    })
                },
            )
            .map_err(|e| self.sql(e))?;
        tasks.sort_by_key(|t| t.seq);
        Ok(tasks)
    }

    /// Writes a task's result unless it has one (or is gone): true when
    /// this write is the one that stands.
    pub fn finish_fleet_task(
        &self,
        job_id: &str,
        seq: u64,
        worker: &str,
        result: &str,
    ) -> Result<bool, StoreError> {
        let changed = self
            .conn()
            .execute(
                "UPDATE fleet_tasks SET result = ?3, worker = ?4
                 WHERE job_id = ?1 AND seq = ?2 AND result IS NULL",
                params![job_id, seq as i64, result, worker],
            )
            .map_err(|e| self.sql(e))?;
        Ok(changed == 1)
    }

    /// Takes back a job's unanswered tasks whose holder's lease lapsed
    /// (a worker killed or paused with them): they are removed, so no
    /// worker sends them and a late answer changes nothing, and their
    /// numbers are returned for the coordinator to ask again.
    pub fn take_back_lapsed_tasks(&self, job_id: &str) -> Result<Vec<u64>, StoreError> {
        let mut seqs = self
            .conn()
            .query_map(
                "DELETE FROM fleet_tasks WHERE job_id = ?1 AND result IS NULL
                   AND worker IS NOT NULL AND lease_ms < ?2
                 RETURNING seq",
                params![job_id, now_ms() as i64],
                |r| Ok(r.get::<i64>(0)?.max(0) as u64),
            )
            .map_err(|e| self.sql(e))?;
        seqs.sort_unstable();
        Ok(seqs)
    }

    /// Gives back tasks `seqs` of a job that `worker` claimed and never
    /// sent, for others to take at once.
    pub fn give_back_fleet_tasks(
        &self,
        job_id: &str,
        worker: &str,
        seqs: &[u64],
    ) -> Result<(), StoreError> {
        if seqs.is_empty() {
            return Ok(());
        }
        let list = serde_json::to_string(seqs).unwrap_or_else(|_| "[]".into());
        let mut conn = self.conn();
        let sql = if conn.is_postgres() {
            "UPDATE fleet_tasks SET worker = NULL, lease_ms = 0
             WHERE job_id = ?1 AND worker = ?2 AND result IS NULL
               AND seq = ANY (ARRAY(SELECT value::bigint
                                    FROM json_array_elements_text(CAST(?3 AS TEXT)::json)))"
        } else {
            "UPDATE fleet_tasks SET worker = NULL, lease_ms = 0
             WHERE job_id = ?1 AND worker = ?2 AND result IS NULL
               AND seq IN (SELECT value FROM json_each(?3))"
        };
        conn.execute(sql, params![job_id, worker, list])
            .map_err(|e| self.sql(e))?;
        Ok(())
    }

    /// Records that `worker` will not take `job_id`, and why.
    pub fn refuse_fleet_job(
        &self,
        job_id: &str,
        worker: &str,
        reason: &str,
    ) -> Result<(), StoreError> {
        self.conn()
            .execute(
                "INSERT INTO fleet_refusals (job_id, worker_id, reason) VALUES (?1, ?2, ?3)
                 ON CONFLICT (job_id, worker_id) DO UPDATE SET reason = excluded.reason",
                params![job_id, worker, reason],
            )
            .map_err(|e| self.sql(e))?;
        Ok(())
    }

    /// Who can still answer `job_id`: the workers process `pid` on `host`
    /// started at `since_ms` or later (earlier ones had a parent that used
    /// the pid before), the live workers, and which of them refused the
    /// job. A worker is live while it is not stopped and beat within
    /// `live_ms`.
    pub fn fleet_watch(
        &self,
        job_id: &str,
        host: &str,
        pid: u32,
        since_ms: u64,
        live_ms: u64,
    ) -> Result<FleetWatch, StoreError> {
        let since = now_ms() as i64 - live_ms as i64;
        let mut conn = self.conn();
        let started = conn
            .query_map(
                "SELECT w.worker_id, w.pid, w.state, w.heartbeat_ms FROM fleet_workers w
                 JOIN fleet_parents p ON p.worker_id = w.worker_id
                 WHERE p.host = ?1 AND p.pid = ?2 AND w.started_ms >= ?3",
                params![host, i64::from(pid), since_ms as i64],
                |r| {
                    let state: String = r.get(2)?;
                    let beat: i64 = r.get(3)?;
                    Ok((
                        r.get::<String>(0)?,
                        u32::try_from(r.get::<i64>(1)?).unwrap_or_default(),
                        state == "stopped" || beat < since,
                    ))
                },
            )
            .map_err(|e| self.sql(e))?;
        let live = conn
            .query_map(
                "SELECT worker_id FROM fleet_workers WHERE state <> 'stopped' AND heartbeat_ms >= ?1",
                params![since],
                |r| r.get::<String>(0),
            )
            .map_err(|e| self.sql(e))?;
        let refused = conn
            .query_map(
                "SELECT f.worker_id, f.reason FROM fleet_refusals f
                 JOIN fleet_workers w ON w.worker_id = f.worker_id
                 WHERE f.job_id = ?1 AND w.state <> 'stopped' AND w.heartbeat_ms >= ?2
                 ORDER BY f.worker_id",
                params![job_id, since],
                |r| Ok((r.get::<String>(0)?, r.get::<String>(1)?)),
            )
            .map_err(|e| self.sql(e))?;
        Ok(FleetWatch {
            started,
            live,
            refused,
        })
    }

    /// Records a worker process as it starts, and the process on this
    /// host that started it, if one did.
    pub fn register_worker(
        &self,
        worker: &str,
        slots: usize,
        parent: Option<u32>,
    ) -> Result<(), StoreError> {
        let now = now_ms() as i64;
        self.conn()
            .transaction(|tx| {
                tx.execute(
                    "INSERT INTO fleet_workers (worker_id, host, pid, started_ms, heartbeat_ms, slots, calls, state)
                     VALUES (?1, ?2, ?3, ?4, ?4, ?5, 0, 'idle')",
                    params![worker, this_host(), i64::from(std::process::id()), now, slots as i64],
                )?;
                if let Some(parent) = parent {
                    tx.execute(
                        "INSERT INTO fleet_parents (worker_id, host, pid) VALUES (?1, ?2, ?3)",
                        params![worker, this_host(), i64::from(parent)],
                    )?;
                }
                Ok(())
            })
            .map_err(|e| self.sql(e))?;
        Ok(())
    }

    /// A worker's heartbeat: renews the leases on the tasks it holds,
    /// records its state, and says whether its job is still open (a job
    /// closed or cancelled, or whose run ended or stopped beating for
    /// `live_ms`, is gone).
    pub fn worker_heartbeat(
        &self,
        worker: &str,
        job_id: Option<&str>,
        calls: u64,
        lease_ms: u64,
        live_ms: u64,
    ) -> Result<JobState, StoreError> {
        let now = now_ms() as i64;
        let state = if job_id.is_some() { "working" } else { "idle" };
        self.conn()
            .transaction(|tx| {
                tx.execute(
                    "UPDATE fleet_tasks SET lease_ms = ?2 WHERE worker = ?1 AND result IS NULL",
                    params![worker, now + lease_ms as i64],
                )?;
                tx.execute(
                    "UPDATE fleet_workers SET heartbeat_ms = ?2, calls = ?3, state = ?4, job_id = ?5
                     WHERE worker_id = ?1",
                    params![worker, now, calls as i64, state, job_id],
                )?;
                let Some(job_id) = job_id else {
                    return Ok(JobState::Open);
                };
                let open = tx.query_row(
                    "SELECT 1 FROM fleet_jobs j JOIN runs r ON r.run_id = j.run_id
                     WHERE j.job_id = ?1 AND j.state = 'open' AND r.finished_ms IS NULL
                       AND r.heartbeat_ms >= ?2",
                    params![job_id, now - live_ms as i64],
                    |_| Ok(()),
                )?;
                Ok(if open.is_some() {
                    JobState::Open
                } else {
                    JobState::Gone
                })
            })
            .map_err(|e| self.sql(e))
    }

    /// Marks a worker stopped. What it still holds is not given back: a
    /// worker gives back what it never sent before it stops, and a task
    /// still held may have been sent, so its coordinator takes it back
    /// once its lease lapses and asks again under a new reservation.
    pub fn worker_stopped(&self, worker: &str, calls: u64) -> Result<(), StoreError> {
        self.conn()
            .execute(
                "UPDATE fleet_workers SET state = 'stopped', calls = ?2, job_id = NULL,
                        heartbeat_ms = ?3 WHERE worker_id = ?1",
                params![worker, calls as i64, now_ms() as i64],
            )
            .map_err(|e| self.sql(e))?;
        Ok(())
    }

    /// Workers that beat within `recent_ms`, newest first, with the tasks
    /// each holds.
    pub fn workers(&self, recent_ms: u64) -> Result<Vec<WorkerRow>, StoreError> {
        let since = now_ms() as i64 - recent_ms as i64;
        self.conn()
            .query_map(
                "SELECT w.worker_id, w.host, w.pid, w.started_ms, w.heartbeat_ms, w.slots, w.calls,
                        w.state, w.job_id,
                        (SELECT COUNT(*) FROM fleet_tasks t WHERE t.worker = w.worker_id
                         AND t.result IS NULL)
                 FROM fleet_workers w
                 WHERE w.heartbeat_ms >= ?1
                 ORDER BY w.started_ms DESC LIMIT 100",
                params![since],
                |r| {
                    let n = |v: i64| v.max(0) as u64;
                    Ok(WorkerRow {
                        worker_id: r.get(0)?,
                        host: r.get(1)?,
                        pid: u32::try_from(r.get::<i64>(2)?).unwrap_or_default(),
                        started_ms: n(r.get(3)?),
                        heartbeat_ms: n(r.get(4)?),
                        slots: n(r.get(5)?),
                        calls: n(r.get(6)?),
                        state: r.get(7)?,
                        job_id: r.get(8)?,
                        holding: n(r.get(9)?),
                    })
                },
            )
            .map_err(|e| self.sql(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(&dir.path().join("s.db")).expect("open");
        (dir, store)
    }

    fn job(store: &Store, run: &str) -> FleetJob {
        let h = fanfold_core::ContentHash::of_bytes(b"x");
        store.begin_run(run, "spec", &h, &h).expect("run");
        let job = FleetJob {
            job_id: format!("{run}/1"),
            run_id: run.into(),
            backend: "{}".into(),
            model_id: "m".into(),
            prefix: "p".into(),
            options: "{}".into(),
        };
        store.open_fleet_job(&job).expect("job");
        job
    }

    #[test]
    fn tasks_are_claimed_once_answered_once_and_taken_back_when_a_lease_lapses() {
        let (_d, store) = store();
        let job = job(&store, "r1");
        let tasks: Vec<(u64, String)> = (0..5).map(|i| (i, format!("req{i}"))).collect();
        store.put_fleet_tasks(&job.job_id, &tasks).expect("put");
        assert_eq!(
            store.claimable_fleet_jobs("", 60_000).expect("jobs").len(),
            1
        );
        let a = store
            .claim_fleet_tasks(&job.job_id, "wa", 3, 60_000)
            .expect("a");
        let b = store
            .claim_fleet_tasks(&job.job_id, "wb", 3, 60_000)
            .expect("b");
        assert_eq!(a.iter().map(|t| t.seq).collect::<Vec<_>>(), [0, 1, 2]);
        assert_eq!(b.iter().map(|t| t.seq).collect::<Vec<_>>(), [3, 4]);
        assert_eq!(b[0].request, "req3");
        assert!(
            store
                .claimable_fleet_jobs("", 60_000)
                .expect("jobs")
                .is_empty()
        );
        assert!(
            store
                .finish_fleet_task(&job.job_id, 0, "wa", "r0")
                .expect("fin")
        );
        // A second result for the same task changes nothing.
        assert!(
            !store
                .finish_fleet_task(&job.job_id, 0, "wb", "late")
                .expect("late")
        );
        assert_eq!(
            store.fleet_results(&job.job_id).expect("results"),
            [(0, "r0".to_owned())]
        );
        // Worker b dies: its lease lapses. No worker takes its tasks (their
        // calls may have been sent); its coordinator takes them back.
        store
            .worker_heartbeat("wb", Some(&job.job_id), 0, 0, 60_000)
            .expect("beat");
        std::thread::sleep(std::time::Duration::from_millis(5));
        assert!(
            store
                .claim_fleet_tasks(&job.job_id, "wa", 10, 60_000)
                .expect("again")
                .is_empty()
        );
        assert!(
            store
                .claimable_fleet_jobs("", 60_000)
                .expect("jobs")
                .is_empty()
        );
        assert_eq!(
            store.take_back_lapsed_tasks(&job.job_id).expect("back"),
            [3, 4]
        );
        // Taken back once, and a late answer to one changes nothing.
        assert!(
            store
                .take_back_lapsed_tasks(&job.job_id)
                .expect("back")
                .is_empty()
        );
        assert!(
            !store
                .finish_fleet_task(&job.job_id, 3, "wb", "late")
                .expect("late")
        );
        // Tasks given back unsent are claimed again at once; a live
        // holder's are not taken back.
        store
            .give_back_fleet_tasks(&job.job_id, "wa", &[1, 2])
            .expect("give back");
        let again = store
            .claim_fleet_tasks(&job.job_id, "wc", 10, 60_000)
            .expect("again");
        assert_eq!(again.iter().map(|t| t.seq).collect::<Vec<_>>(), [1, 2]);
        assert!(
            store
                .take_back_lapsed_tasks(&job.job_id)
                .expect("back")
                .is_empty()
        );
        store.forget_fleet_tasks(&job.job_id, &[0]).expect("forget");
        assert!(
            store
                .fleet_results(&job.job_id)
                .expect("results")
                .is_empty()
        );
        store.close_fleet_job(&job.job_id, "closed").expect("close");
        assert!(
            !store
                .finish_fleet_task(&job.job_id, 1, "wa", "r1")
                .expect("gone")
        );
    }

    #[test]
    fn a_coordinator_sees_the_workers_it_started_and_who_refused_its_job() {
        let (_d, store) = store();
        let job = job(&store, "r3");
        let me = std::process::id();
        store
            .register_worker("mine", 2, Some(me))
            .expect("register");
        store
            .register_worker("elsewhere", 2, None)
            .expect("register");
        let watch = store
            .fleet_watch(&job.job_id, &this_host(), me, 0, 60_000)
            .expect("watch");
        assert_eq!(watch.started, [("mine".to_owned(), me, false)]);
        assert_eq!(watch.live.len(), 2);
        assert!(watch.refused.is_empty());
        store
            .refuse_fleet_job(
                &job.job_id,
                "elsewhere",
                "its backend sends to endpoint `x`",
            )
            .expect("refuse");
        store.worker_stopped("mine", 0).expect("stop");
        let watch = store
            .fleet_watch(&job.job_id, &this_host(), me, 0, 60_000)
            .expect("watch");
        assert_eq!(watch.started, [("mine".to_owned(), me, true)]);
        assert_eq!(watch.live, ["elsewhere"]);
        assert_eq!(
            watch.refused,
            [(
                "elsewhere".to_owned(),
                "its backend sends to endpoint `x`".to_owned()
            )]
        );
        // A worker registered before this process started was another's
        // that had the same pid.
        assert!(
            store
                .fleet_watch(&job.job_id, &this_host(), me, now_ms() + 60_000, 60_000)
                .expect("watch")
                .started
                .is_empty()
        );
        // Another process started no worker.
        assert!(
            store
                .fleet_watch(&job.job_id, &this_host(), me + 1, 0, 60_000)
                .expect("watch")
                .started
                .is_empty()
        );
    }

    #[test]
    fn shared_rates_admit_one_second_of_the_limit_then_make_callers_wait() {
        let (_d, store) = store();
        // 120 a minute: a bucket of 2 requests, refilled at 2 a second.
        for _ in 0..2 {
            assert_eq!(
                store.take_rate("e", Some(120), None, 10).expect("take"),
                None
            );
        }
        let wait = store
            .take_rate("e", Some(120), None, 10)
            .expect("take")
            .expect("a wait");
        assert!(wait <= std::time::Duration::from_millis(500), "{wait:?}");
        std::thread::sleep(wait + std::time::Duration::from_millis(5));
        assert_eq!(
            store.take_rate("e", Some(120), None, 10).expect("take"),
            None
        );
        // Tokens: 6,000 a minute is 100 a second; a call reserving 100
        // takes the bucket, and what it did not use comes back.
        assert_eq!(
            store.take_rate("t", None, Some(6_000), 100).expect("take"),
            None
        );
        assert!(
            store
                .take_rate("t", None, Some(6_000), 100)
                .expect("take")
                .is_some()
        );
        store
            .settle_rate("t", Some(6_000), 100, 10)
            .expect("settle");
        assert_eq!(
            store.take_rate("t", None, Some(6_000), 50).expect("take"),
            None
        );
        // No limits: nothing to take.
        assert_eq!(store.take_rate("free", None, None, 1).expect("take"), None);
    }

    #[test]
    fn a_worker_learns_its_job_is_gone_when_the_job_closes_or_its_run_ends() {
        let (_d, store) = store();
        let job = job(&store, "r2");
        store.register_worker("w", 4, None).expect("register");
        let beat = |s: &Store| {
            s.worker_heartbeat("w", Some(&job.job_id), 3, 60_000, 60_000)
                .expect("beat")
        };
        assert_eq!(beat(&store), JobState::Open);
        store
            .close_fleet_job(&job.job_id, "cancelled")
            .expect("close");
        assert_eq!(beat(&store), JobState::Gone);
        let w = store.workers(60_000).expect("workers");
        assert_eq!(w.len(), 1);
        assert_eq!((w[0].calls, w[0].state.as_str()), (3, "working"));
        store.worker_stopped("w", 5).expect("stop");
        assert_eq!(store.workers(60_000).expect("workers")[0].state, "stopped");
    }
}
