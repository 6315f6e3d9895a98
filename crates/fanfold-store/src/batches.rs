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
        self.conn()
            .transaction(|tx| {
                tx.execute(
                    "INSERT INTO batches (batch_id, provider, endpoint, state, requests, submitted_ms, closed_ms)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, NULL)
                     ON CONFLICT (batch_id) DO UPDATE SET provider = excluded.provider,
                        endpoint = excluded.endpoint, state = excluded.state,
                        requests = excluded.requests, submitted_ms = excluded.submitted_ms,
                        closed_ms = NULL",
                    params![
                        batch.batch_id,
                        batch.provider,
                        batch.endpoint,
                        batch.state.as_str(),
                        requests.len() as i64,
                        batch.submitted_ms as i64
                    ],
                )?;
                for (key, custom_id) in requests {
                    tx.execute(
                        "INSERT INTO batch_requests (request_key, batch_id, custom_id) VALUES (?1, ?2, ?3)
                         ON CONFLICT (request_key, batch_id) DO UPDATE SET custom_id = excluded.custom_id",
                        params![key, batch.batch_id, custom_id],
                    )?;
                }
                Ok(())
            })
            .map_err(|e| self.sql(e))
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
                params![request_key],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
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
        let rows = self
            .conn()
            .query_map(
                "SELECT batch_id, provider, endpoint, state, requests, submitted_ms, closed_ms FROM batches ORDER BY submitted_ms DESC, batch_id",
                params![],
                |r| {
                let state: String = r.get(3)?;
                Ok((
                    state,
                    BatchRow {
                        batch_id: r.get(0)?,
                        provider: r.get(1)?,
                        endpoint: r.get(2)?,
                        state: BatchState::Open,
                        requests: r.get::<i64>(4)? as u64,
                        submitted_ms: r.get::<i64>(5)? as u64,
                        closed_ms: r.get::<Option<i64>>(6)?.map(|v| v as u64),
                    },
                ))
            },
            )
            .map_err(|e| self.sql(e))?;
        let mut out = Vec::new();
        for (state, mut batch) in rows {
            batch.state = BatchState::parse(&state).ok_or_else(|| StoreError::Decode {
                path: self.location.clone(),
                detail: format!("batch {} has unknown state {state:?}", batch.batch_id),
            })?;
            out.push(batch);
        }
        Ok(out)
    }
}
