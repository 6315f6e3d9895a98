//! Provider batches: `batches` and `batch_requests`, so a run stopped while
//! a batch is pending collects it when run again.

use super::*;

impl Store {
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
                batch.state.as_str(),
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
    pub fn close_batch(&self, batch_id: &str, state: BatchState) -> Result<(), StoreError> {
        self.conn()
            .execute(
                "UPDATE batches SET state = ?2, closed_ms = ?3 WHERE batch_id = ?1",
                params![batch_id, state.as_str(), now_ms() as i64],
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
                let state: String = r.get(3)?;
                Ok((
                    state,
                    BatchRow {
                        batch_id: r.get(0)?,
                        provider: r.get(1)?,
                        endpoint: r.get(2)?,
                        state: BatchState::Open,
                        requests: r.get::<_, i64>(4)? as u64,
                        submitted_ms: r.get::<_, i64>(5)? as u64,
                        closed_ms: r.get::<_, Option<i64>>(6)?.map(|v| v as u64),
                    },
                ))
            })
            .map_err(|e| self.sql(e))?;
        let mut out = Vec::new();
        for row in rows {
            let (state, mut batch) = row.map_err(|e| self.sql(e))?;
            batch.state = BatchState::parse(&state).ok_or_else(|| StoreError::Decode {
                path: self.path.display().to_string(),
                detail: format!("batch {} has unknown state {state:?}", batch.batch_id),
            })?;
            out.push(batch);
        }
        Ok(out)
    }
}
