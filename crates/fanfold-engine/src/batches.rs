//! The store as the ledger of provider batches.

use fanfold_core::BatchState;
use fanfold_model::{BatchLedger, BatchSlot, LedgerError, SubmittedBatch};
use fanfold_store::{BatchRow, Store, now_ms};

/// Provider batches recorded in the run's store, so that a run stopped
/// while a batch is pending finds it again.
pub struct StoreLedger<'a>(pub &'a Store);

impl BatchLedger for StoreLedger<'_> {
    fn find(&self, request_key: &str) -> Result<Option<BatchSlot>, LedgerError> {
        self.0
            .find_open_batch(request_key)
            .map(|found| {
                found.map(|(batch_id, custom_id)| BatchSlot {
                    batch_id,
                    custom_id,
                })
            })
            .map_err(LedgerError::from)
    }

    fn submitted(&self, batch: &SubmittedBatch) -> Result<(), LedgerError> {
        let row = BatchRow {
            batch_id: batch.batch_id.clone(),
            provider: batch.provider.clone(),
            endpoint: batch.endpoint.clone(),
            state: BatchState::Open,
            requests: batch.requests.len() as u64,
            submitted_ms: now_ms(),
            closed_ms: None,
        };
        self.0
            .put_batch(&row, &batch.requests)
            .map_err(LedgerError::from)
    }

    fn close(&self, batch_id: &str, state: BatchState) -> Result<(), LedgerError> {
        self.0
            .close_batch(batch_id, state)
            .map_err(LedgerError::from)
    }
}
