//! Runs and who pays for what: `runs` (with pid, host and heartbeat),
//! `claims` (leases on fact keys), `run_units` and `run_events`.

use super::*;

/// Keys a statement of [`Store::claim_or_fact_many`] claims.
pub const CLAIMS_A_STATEMENT: usize = 64;

impl Store {
    pub fn begin_run(
        &self,
        run_id: &str,
        spec_name: &str,
        spec_hash: &ContentHash,
        source: &ContentHash,
    ) -> Result<(), StoreError> {
        let now = now_ms() as i64;
        self.conn()
            .execute(
                "INSERT INTO runs (run_id, spec_name, spec_hash, source_hash, started_ms, pid, host, heartbeat_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?5)",
                params![run_id, spec_name, spec_hash.to_hex(), source.to_hex(), now, i64::from(std::process::id()), this_host()],
            )
            .map_err(|e| self.sql(e))?;
        Ok(())
    }
    /// Claims `key` for `run_id` for `lease_ms`, unless another run holds a
    /// lease on it that has not lapsed. One statement: two processes
    /// claiming at once cannot both win.
    pub fn claim(
        &self,
        key: &ContentHash,
        run_id: &str,
        lease_ms: u64,
    ) -> Result<Claim, StoreError> {
        let now = now_ms() as i64;
        let mut conn = self.conn();
        let won = conn
            .execute(
                "INSERT INTO claims (key, run_id, expires_ms) VALUES (?1, ?2, ?3)
                 ON CONFLICT (key) DO UPDATE SET run_id = excluded.run_id, expires_ms = excluded.expires_ms
                 WHERE claims.run_id = excluded.run_id OR claims.expires_ms < ?4",
                params![key.to_hex(), run_id, now + lease_ms as i64, now],
            )
            .map_err(|e| self.sql(e))?;
        if won == 1 {
            return Ok(Claim::Mine);
        }
        let held = conn
            .query_row(
                "SELECT run_id, expires_ms FROM claims WHERE key = ?1",
                params![key.to_hex()],
                |r| Ok((r.get::<String>(0)?, r.get::<i64>(1)?)),
            )
            .map_err(|e| self.sql(e))?;
        Ok(match held {
            Some((holder, expires)) if holder != run_id => Claim::Held {
                run_id: holder,
                expires_ms: expires.max(0) as u64,
            },
            _ => Claim::Mine,
        })
    }
    /// [`Store::claim`], and the fact stored under `key` read at the same
    /// time: a fact found is taken whoever holds the key (a run keeps its
    /// leases until it ends, and may have written it). One statement on
    /// PostgreSQL, where each is a round trip; the two on SQLite.
    pub fn claim_or_fact(
        &self,
        key: &ContentHash,
        run_id: &str,
        lease_ms: u64,
    ) -> Result<ClaimOrFact, StoreError> {
        let shared = self.conn().is_postgres();
        if !shared {
            let claim = self.claim(key, run_id, lease_ms)?;
            return Ok(match self.get_fact(key)? {
                Some(fact) => ClaimOrFact::Fact(Box::new(fact)),
                None => ClaimOrFact::Claim(claim),
            });
        }
        let now = now_ms() as i64;
        // The outer reads see the rows as they were before the insert, so
        // a claim lost names the run that holds the key.
        let (won, record, holder, expires) = self
            .conn()
            .query_one(
                "WITH won AS (
                    INSERT INTO claims (key, run_id, expires_ms) VALUES (?1, ?2, ?3)
                    ON CONFLICT (key) DO UPDATE SET run_id = excluded.run_id, expires_ms = excluded.expires_ms
                    WHERE claims.run_id = excluded.run_id OR claims.expires_ms < ?4
                    RETURNING 1)
                 SELECT (SELECT COUNT(*) FROM won),
                        (SELECT record FROM facts WHERE key = ?1),
                        (SELECT run_id FROM claims WHERE key = ?1),
                        (SELECT expires_ms FROM claims WHERE key = ?1)",
                params![key.to_hex(), run_id, now + lease_ms as i64, now],
                |r| {
                    Ok((
                        r.get::<i64>(0)?,
                        r.get::<Option<String>>(1)?,
                        r.get::<Option<String>>(2)?,
                        r.get::<Option<i64>>(3)?,
                    ))
                },
            )
            .map_err(|e| self.sql(e))?;
        if let Some(text) = record
            && let Some(fact) = self.checked_fact(key, text)?
        {
            return Ok(ClaimOrFact::Fact(Box::new(fact)));
        }
        // A claim not won is another run's, even when the snapshot shows
        // no holder: a claim committed while this statement waited on the
        // row is not in the snapshot the outer reads see.
        Ok(ClaimOrFact::Claim(if won > 0 {
            Claim::Mine
        } else {
            Claim::Held {
                run_id: holder.unwrap_or_else(|| "another run".to_owned()),
                expires_ms: expires.map_or(now + 1_000, |e| e.max(now)).max(0) as u64,
            }
        }))
    }

    /// [`Store::claim_or_fact`] for each of `keys`, in order: on
    /// PostgreSQL one statement for up to [`CLAIMS_A_STATEMENT`] keys, so a
    /// run claiming the units it is about to open pays one round trip for
    /// them, not one a unit. Keys are claimed in their sorted order, so
    /// two runs claiming overlapping sets at once wait on each other's
    /// rows in the same order and never deadlock. On SQLite, one key at a
    /// time.
    pub fn claim_or_fact_many(
        &self,
        keys: &[ContentHash],
        run_id: &str,
        lease_ms: u64,
    ) -> Result<Vec<ClaimOrFact>, StoreError> {
        if !self.conn().is_postgres() {
            return keys
                .iter()
                .map(|k| self.claim_or_fact(k, run_id, lease_ms))
                .collect();
        }
        let mut found: std::collections::HashMap<ContentHash, ClaimOrFact> =
            std::collections::HashMap::new();
        let mut distinct: Vec<ContentHash> = keys.to_vec();
        distinct.sort_unstable_by_key(ContentHash::to_hex);
        distinct.dedup();
        for chunk in distinct.chunks(CLAIMS_A_STATEMENT) {
            let now = now_ms() as i64;
            let hex: Vec<String> = chunk.iter().map(ContentHash::to_hex).collect();
            let list = serde_json::to_string(&hex).map_err(|e| self.decode(e))?;
            // As in `claim_or_fact`: the outer reads see the rows as they
            // were before the insert, so a claim lost names its holder.
            let rows = self
                .conn()
                .query_map(
                    "WITH asked AS (
                        SELECT value AS key FROM json_array_elements_text(CAST(?1 AS TEXT)::json)),
                     won AS (
                        INSERT INTO claims (key, run_id, expires_ms)
                        SELECT key, CAST(?2 AS TEXT), CAST(?3 AS BIGINT) FROM asked ORDER BY key
                        ON CONFLICT (key) DO UPDATE SET run_id = excluded.run_id, expires_ms = excluded.expires_ms
                        WHERE claims.run_id = excluded.run_id OR claims.expires_ms < ?4
                        RETURNING key)
                     SELECT a.key, (SELECT COUNT(*) FROM won w WHERE w.key = a.key),
                            (SELECT record FROM facts WHERE key = a.key),
                            (SELECT run_id FROM claims WHERE key = a.key),
                            (SELECT expires_ms FROM claims WHERE key = a.key)
                     FROM asked a",
                    params![list, run_id, now + lease_ms as i64, now],
                    |r| {
                        Ok((
                            r.get::<String>(0)?,
                            r.get::<i64>(1)? > 0,
                            r.get::<Option<String>>(2)?,
                            r.get::<Option<String>>(3)?,
                            r.get::<Option<i64>>(4)?,
                        ))
                    },
                )
                .map_err(|e| self.sql(e))?;
            for (hex_key, won, record, holder, expires) in rows {
                let Some(key) = hex
                    .iter()
                    .position(|h| *h == hex_key)
                    .and_then(|i| chunk.get(i))
                else {
                    continue;
                };
                if let Some(text) = record
                    && let Some(fact) = self.checked_fact(key, text)?
                {
                    found.insert(*key, ClaimOrFact::Fact(Box::new(fact)));
                    continue;
                }
                let claim = if won {
                    Claim::Mine
                } else {
                    Claim::Held {
                        run_id: holder.unwrap_or_else(|| "another run".to_owned()),
                        expires_ms: expires.map_or(now + 1_000, |e| e.max(now)).max(0) as u64,
                    }
                };
                found.insert(*key, ClaimOrFact::Claim(claim));
            }
        }
        keys.iter()
            .map(|k| {
                found.get(k).cloned().ok_or_else(|| {
                    self.decode(format!("no claim came back for key {}", k.short(16)))
                })
            })
            .collect()
    }

    /// Gives up `run_id`'s lease on `key` (its unit ended without a fact
    /// to share: another run may try it).
    pub fn release_claim(&self, key: &ContentHash, run_id: &str) -> Result<(), StoreError> {
        self.conn()
            .execute(
                "DELETE FROM claims WHERE key = ?1 AND run_id = ?2",
                params![key.to_hex(), run_id],
            )
            .map_err(|e| self.sql(e))?;
        Ok(())
    }
    /// Renews every lease `run_id` holds and marks the run alive.
    /// With `progress`, also records how far the run has got (JSON), for
    /// `fanfold status`.
    pub fn heartbeat(
        &self,
        run_id: &str,
        lease_ms: u64,
        progress: Option<&str>,
    ) -> Result<(), StoreError> {
        let now = now_ms() as i64;
        self.conn()
            .transaction(|tx| {
                // A key whose fact is stored needs no lease: whoever asks
                // for it takes the fact. Dropped once, those leases are not
                // rewritten at every beat (a long run holds thousands).
                tx.execute(
                    "DELETE FROM claims WHERE run_id = ?1
                       AND EXISTS (SELECT 1 FROM facts f WHERE f.key = claims.key)",
                    params![run_id],
                )?;
                tx.execute(
                    "UPDATE claims SET expires_ms = ?2 WHERE run_id = ?1",
                    params![run_id, now + lease_ms as i64],
                )?;
                tx.execute(
                    "UPDATE runs SET heartbeat_ms = ?2, progress = COALESCE(?3, progress) WHERE run_id = ?1",
                    params![run_id, now, progress],
                )?;
                Ok(())
            })
            .map_err(|e| self.sql(e))
    }

    /// The latest runs, newest first, as `fanfold status` shows them: each
    /// with its process, heartbeat, the leases it holds, its last progress
    /// and, once finished, its stop reason and statuses.
    pub fn run_overview(&self, limit: usize) -> Result<Vec<RunOverview>, StoreError> {
        let rows = self
            .conn()
            .query_map(
                "SELECT r.run_id, r.spec_name, r.started_ms, r.finished_ms, r.stop_reason,
                        r.pid, r.host, r.heartbeat_ms, r.progress,
                        (SELECT COUNT(*) FROM claims c WHERE c.run_id = r.run_id),
                        r.certificate
                 FROM runs r ORDER BY r.started_ms DESC LIMIT ?1",
                params![limit as i64],
                |r| {
                    let ms = |v: Option<i64>| v.map(|x| x.max(0) as u64);
                    let overview = RunOverview {
                        run_id: r.get(0)?,
                        spec_name: r.get(1)?,
                        started_ms: r.get::<i64>(2)?.max(0) as u64,
                        finished_ms: ms(r.get(3)?),
                        stop_reason: r.get(4)?,
                        pid: r.get::<Option<i64>>(5)?.and_then(|p| u32::try_from(p).ok()),
                        host: r.get(6)?,
                        heartbeat_ms: ms(r.get(7)?),
                        progress: r.get(8)?,
                        leases: r.get::<i64>(9)?.max(0) as u64,
                        statuses: None,
                        model_calls: None,
                        tokens: None,
                    };
                    Ok((overview, r.get::<Option<String>>(10)?))
                },
            )
            .map_err(|e| self.sql(e))?;
        Ok(rows
            .into_iter()
            .map(|(mut overview, certificate)| {
                // The certificate's own words, read here rather than by a
                // JSON function each engine spells differently.
                let cert: Option<serde_json::Value> =
                    certificate.and_then(|c| serde_json::from_str(&c).ok());
                let at = |path: &str| cert.as_ref().and_then(|c| c.pointer(path));
                overview.statuses = at("/statuses").map(|v| v.to_string());
                overview.model_calls = at("/stats/model_calls").and_then(serde_json::Value::as_u64);
                overview.tokens = match (
                    at("/stats/cost/prompt_tokens").and_then(serde_json::Value::as_u64),
                    at("/stats/cost/completion_tokens").and_then(serde_json::Value::as_u64),
                ) {
                    (Some(p), Some(c)) => Some(p + c),
                    _ => None,
                };
                overview
            })
            .collect())
    }
    /// Runs that never finished and whose process is gone are marked
    /// `abandoned`, and their leases dropped: a run of this host whose
    /// process no longer exists, or any run whose last heartbeat is older
    /// than `stale_ms`. Returns how many.
    pub fn close_abandoned_runs(&self, stale_ms: u64) -> Result<usize, StoreError> {
        let now = now_ms() as i64;
        let host = this_host();
        self.conn()
            .transaction(|tx| {
                let rows = tx.query_map(
                    "SELECT run_id, pid FROM runs WHERE finished_ms IS NULL AND host = ?1",
                    params![host],
                    |r| Ok((r.get::<String>(0)?, r.get::<Option<i64>>(1)?)),
                )?;
                let gone = rows
                    .into_iter()
                    .filter(|(_, pid)| pid.is_some_and(|p| !process_exists(p)))
                    .map(|(run_id, _)| run_id);
                let mut n = 0;
                for run_id in gone {
                    n += tx.execute(
                        "UPDATE runs SET finished_ms = ?1, stop_reason = 'abandoned' WHERE run_id = ?2",
                        params![now, run_id],
                    )?;
                }
                n += tx.execute(
                    "UPDATE runs SET finished_ms = ?1, stop_reason = 'abandoned'
                     WHERE finished_ms IS NULL AND COALESCE(heartbeat_ms, started_ms) < ?2",
                    params![now, now - stale_ms as i64],
                )?;
                tx.execute(
                    "DELETE FROM claims WHERE run_id IN (SELECT run_id FROM runs WHERE stop_reason = 'abandoned')",
                    params![],
                )?;
                Ok(n as usize)
            })
            .map_err(|e| self.sql(e))
    }
    /// Unfinished runs whose heartbeat is at most `stale_ms` old.
    pub fn live_runs(&self, stale_ms: u64) -> Result<Vec<RunInfo>, StoreError> {
        let mut conn = self.conn();
        if !conn.is_postgres() {
            // Through a read-only connection of its own: WAL readers are
            // never blocked by a writer, this connection's or another's.
            drop(conn);
            return live_runs_at(&self.path, stale_ms).map_err(|e| self.sql(e));
        }
        live_runs_on(&mut conn, stale_ms).map_err(|e| self.sql(e))
    }
    /// Records the outcome of many units in one transaction.
    pub fn put_run_units(&self, run_id: &str, rows: &[RunUnitRow]) -> Result<(), StoreError> {
        // One row per unit and stage, the last given: one statement may
        // not update a row twice.
        let mut last = std::collections::HashMap::new();
        for (i, r) in rows.iter().enumerate() {
            last.insert((r.unit_id.as_str(), r.stage.as_str()), i);
        }
        let rows: Vec<&RunUnitRow> = rows
            .iter()
            .enumerate()
            .filter(|(i, r)| last.get(&(r.unit_id.as_str(), r.stage.as_str())) == Some(i))
            .map(|(_, r)| r)
            .collect();
        let keys: Vec<Option<String>> = rows
            .iter()
            .map(|r| r.fact_key.map(|k| k.to_hex()))
            .collect();
        self.conn()
            .transaction(|tx| {
                let rows: Vec<[&dyn Param; 6]> = rows
                    .iter()
                    .zip(&keys)
                    .map(|(r, key)| {
                        [
                            &run_id as &dyn Param,
                            &r.unit_id,
                            &r.stage,
                            &r.status,
                            &r.reason,
                            key,
                        ]
                    })
                    .collect();
                tx.insert_rows(
                    "INSERT INTO run_units (run_id, unit_id, stage, status, reason, fact_key)",
                    "ON CONFLICT (run_id, unit_id, stage) DO UPDATE SET status = excluded.status,
                        reason = excluded.reason, fact_key = excluded.fact_key",
                    &rows,
                )?;
                Ok(())
            })
            .map_err(|e| self.sql(e))
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
    /// Records the run's end and drops its leases.
    pub fn finish_run(
        &self,
        run_id: &str,
        stop_reason: &str,
        certificate_json: &str,
    ) -> Result<(), StoreError> {
        self.conn()
            .transaction(|tx| {
                tx.execute(
                    "UPDATE runs SET finished_ms = ?2, stop_reason = ?3, certificate = ?4 WHERE run_id = ?1",
                    params![run_id, now_ms() as i64, stop_reason, certificate_json],
                )?;
                tx.execute("DELETE FROM claims WHERE run_id = ?1", params![run_id])?;
                Ok(())
            })
            .map_err(|e| self.sql(e))
    }
    /// Ends a run that failed: `failed`, with its leases dropped. When
    /// `forget_source` is set (its input did not parse) and no other run
    /// read the same source, the source goes too: a file that was refused
    /// does not stay in the store.
    pub fn fail_run(&self, run_id: &str, forget_source: bool) -> Result<(), StoreError> {
        self.conn()
            .transaction(|tx| {
                tx.execute(
                    "UPDATE runs SET finished_ms = ?2, stop_reason = 'failed' WHERE run_id = ?1",
                    params![run_id, now_ms() as i64],
                )?;
                tx.execute("DELETE FROM claims WHERE run_id = ?1", params![run_id])?;
                if !forget_source {
                    return Ok(());
                }
                let source: Option<String> = tx.query_row(
                    "SELECT source_hash FROM runs WHERE run_id = ?1
                     AND NOT EXISTS (SELECT 1 FROM runs o WHERE o.source_hash = runs.source_hash
                                     AND o.run_id != ?1)",
                    params![run_id],
                    |r| r.get(0),
                )?;
                if let Some(source) = source {
                    drop_source(tx, &source)?;
                    for table in ["run_units", "run_events", "runs"] {
                        tx.execute(
                            &format!("DELETE FROM {table} WHERE run_id = ?1"),
                            params![run_id],
                        )?;
                    }
                    delete_orphan_chunks(tx)?;
                }
                Ok(())
            })
            .map_err(|e| self.sql(e))
    }
    /// Runs that began and never finished (killed processes).
    pub fn unfinished_runs(&self) -> Result<Vec<String>, StoreError> {
        self.conn()
            .query_map(
                "SELECT run_id FROM runs WHERE finished_ms IS NULL ORDER BY started_ms",
                params![],
                |r| r.get(0),
            )
            .map_err(|e| self.sql(e))
    }
}
