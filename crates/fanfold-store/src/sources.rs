//! Source bytes: `chunks` (content-addressed pieces) and `artifacts` with
//! `artifact_chunks` (each source as the list of its chunks).

use super::*;

impl Store {
    /// Stores source chunks by their hash in one transaction; a chunk
    /// stored before is left as it is.
    pub fn put_chunks(&self, chunks: &[(ContentHash, &[u8])]) -> Result<(), StoreError> {
        self.conn()
            .transaction(|tx| {
                for (hash, bytes) in chunks {
                    tx.execute(
                        "INSERT INTO chunks (hash, bytes) VALUES (?1, ?2) ON CONFLICT DO NOTHING",
                        params![&hash.0[..], bytes],
                    )?;
                }
                Ok(())
            })
            .map_err(|e| self.sql(e))
    }
    /// Whether a chunk is stored already.
    pub fn has_chunk(&self, hash: &ContentHash) -> Result<bool, StoreError> {
        self.conn()
            .query_row(
                "SELECT 1 FROM chunks WHERE hash = ?1",
                params![&hash.0[..]],
                |_| Ok(()),
            )
            .map(|r| r.is_some())
            .map_err(|e| self.sql(e))
    }
    /// A stored chunk, checked against its hash. A copy that no longer
    /// matches (a damaged disk, a hand edit) is never handed out: it is
    /// removed, so the next run that reads the source stores it again, and
    /// the read fails with [`StoreError::CorruptChunk`].
    pub fn get_chunk(&self, hash: &ContentHash) -> Result<Option<Vec<u8>>, StoreError> {
        let bytes: Option<Vec<u8>> = self
            .conn()
            .query_row(
                "SELECT bytes FROM chunks WHERE hash = ?1",
                params![&hash.0[..]],
                |r| r.get(0),
            )
            .map_err(|e| self.sql(e))?;
        if let Some(b) = &bytes
            && ContentHash::of_bytes(b) != *hash
        {
            self.conn()
                .execute("DELETE FROM chunks WHERE hash = ?1", params![&hash.0[..]])
                .map_err(|e| self.sql(e))?;
            return Err(StoreError::CorruptChunk {
                path: self.path().display().to_string(),
                hash: hash.to_hex(),
            });
        }
        Ok(bytes)
    }
    /// Records a source as the list of its (already stored) chunks, in one
    /// transaction. Recording the same source twice is a no-op; a recorded
    /// source is never rewritten. Returns whether it was new.
    pub fn put_artifact(
        &self,
        hash: &ContentHash,
        origin: &str,
        chunks: &[ChunkRef],
    ) -> Result<bool, StoreError> {
        let len: u64 = chunks.iter().map(|c| c.len).sum();
        let hex = hash.to_hex();
        self.conn()
            .transaction(|tx| {
                let n = tx.execute(
                    "INSERT INTO artifacts (hash, len, origin, created_ms) VALUES (?1, ?2, ?3, ?4)
                     ON CONFLICT DO NOTHING",
                    params![hex, len as i64, origin, now_ms() as i64],
                )?;
                if n == 1 {
                    for (seq, c) in chunks.iter().enumerate() {
                        tx.execute(
                            "INSERT INTO artifact_chunks (artifact, seq, chunk, len, newlines) VALUES (?1, ?2, ?3, ?4, ?5)",
                            params![hex, seq as i64, &c.hash.0[..], c.len as i64, c.newlines as i64],
                        )?;
                    }
                }
                Ok(n == 1)
            })
            .map_err(|e| self.sql(e))
    }
    /// A stored source's chunks, in order; `None` when it is not stored.
    pub fn artifact_chunks(&self, hash: &ContentHash) -> Result<Option<Vec<ChunkRef>>, StoreError> {
        let mut conn = self.conn();
        let known = conn
            .query_row(
                "SELECT 1 FROM artifacts WHERE hash = ?1",
                params![hash.to_hex()],
                |_| Ok(()),
            )
            .map_err(|e| self.sql(e))?;
        if known.is_none() {
            return Ok(None);
        }
        let rows = conn
            .query_map(
                "SELECT chunk, len, newlines FROM artifact_chunks WHERE artifact = ?1 ORDER BY seq",
                params![hash.to_hex()],
                |r| Ok((r.get::<Vec<u8>>(0)?, r.get::<i64>(1)?, r.get::<i64>(2)?)),
            )
            .map_err(|e| self.sql(e))?;
        let mut out = Vec::with_capacity(rows.len());
        for (h, len, newlines) in rows {
            out.push(ChunkRef {
                hash: hash_of(&h).ok_or_else(|| self.decode("chunk hash is not 32 bytes"))?,
                len: len as u64,
                newlines: newlines as u64,
            });
        }
        Ok(Some(out))
    }
    /// How many sources the store holds.
    pub fn count_sources(&self) -> Result<u64, StoreError> {
        self.count("SELECT COUNT(*) FROM artifacts")
    }
}
