//! What was decided: `facts` (stage outputs by content key, sealed by
//! their digest), `labels`, `embeddings` and `fold_nodes`.

use super::*;

/// Keys a statement of [`Store::get_facts`] looks up.
const FACTS_A_STATEMENT: usize = 128;

impl Store {
    /// The fact cached under `key`. A row that does not decode as a fact
    /// of this key (a damaged file, a hand edit) is no answer: it is
    /// deleted and counted, so the caller computes the fact again instead
    /// of every later run failing on it.
    pub fn get_fact(&self, key: &ContentHash) -> Result<Option<FactRecord>, StoreError> {
        let text: Option<String> = self
            .conn()
            .query_row(
                "SELECT record FROM facts WHERE key = ?1",
                params![key.to_hex()],
                |r| r.get(0),
            )
            .map_err(|e| self.sql(e))?;
        match text {
            Some(text) => self.checked_fact(key, text),
            None => Ok(None),
        }
    }

    /// The facts cached under any of `keys`, by key: what [`Store::get_fact`]
    /// gives for each, in a statement per [`FACTS_A_STATEMENT`] keys rather
    /// than one a key.
    pub fn get_facts(
        &self,
        keys: &[ContentHash],
    ) -> Result<std::collections::HashMap<ContentHash, FactRecord>, StoreError> {
        let sql = format!(
            "SELECT key, record FROM facts WHERE key IN ({})",
            (1..=FACTS_A_STATEMENT)
                .map(|i| format!("?{i}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let mut found = std::collections::HashMap::new();
        for chunk in keys.chunks(FACTS_A_STATEMENT) {
            // Always the same statement: a short chunk repeats its first
            // key, which `IN` does not mind.
            let mut hex: Vec<String> = chunk.iter().map(ContentHash::to_hex).collect();
            let first = hex.first().cloned().unwrap_or_default();
            hex.resize(FACTS_A_STATEMENT, first);
            let params: Vec<&dyn Param> = hex.iter().map(|h| h as &dyn Param).collect();
            let rows = self
                .conn()
                .query_map(&sql, &params, |r| {
                    Ok((r.get::<String>(0)?, r.get::<String>(1)?))
                })
                .map_err(|e| self.sql(e))?;
            for (hex_key, text) in rows {
                // A row the statement returned has one of the keys asked.
                let Some(key) = hex
                    .iter()
                    .position(|h| *h == hex_key)
                    .and_then(|i| chunk.get(i))
                else {
                    continue;
                };
                if let Some(fact) = self.checked_fact(key, text)? {
                    found.insert(*key, fact);
                }
            }
        }
        Ok(found)
    }

    /// The fact stored under `key` as `text`, if it decodes as that fact
    /// and matches its digest. A row that does not (a damaged file, a hand
    /// edit) is no answer: it is deleted and counted, so the caller
    /// computes the fact again instead of every later run failing on it.
    pub(crate) fn checked_fact(
        &self,
        key: &ContentHash,
        text: String,
    ) -> Result<Option<FactRecord>, StoreError> {
        let why = match serde_json::from_str::<FactRecord>(&text) {
            Ok(fact) if fact.key == *key && fact.is_intact() => return Ok(Some(fact)),
            Ok(fact) if fact.key == *key => {
                "what it says no longer matches its digest: it was changed after it was stored"
                    .to_owned()
            }
            Ok(fact) => format!("it holds the fact of key {}", fact.key.short(16)),
            Err(e) => e.to_string(),
        };
        tracing::warn!(
            key = %key.short(16),
            "stored fact does not decode ({why}); it is dropped and computed again"
        );
        // Only the row read: another process may have stored a good fact
        // under the key meanwhile.
        self.conn()
            .execute(
                "DELETE FROM facts WHERE key = ?1 AND record = ?2",
                params![key.to_hex(), text],
            )
            .map_err(|e| self.sql(e))?;
        self.corrupt_facts
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(None)
    }
    /// Stores a label, replacing an earlier one under the same key.
    pub fn put_label(&self, label: &Label) -> Result<(), StoreError> {
        self.conn()
            .execute(
                "INSERT INTO labels (key, stage, unit_id, decision, labeller, created_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                 ON CONFLICT (key) DO UPDATE SET stage = excluded.stage, unit_id = excluded.unit_id,
                    decision = excluded.decision, labeller = excluded.labeller,
                    created_ms = excluded.created_ms",
                params![
                    label.key.to_hex(),
                    label.stage,
                    label.unit_id,
                    label.decision,
                    label.labeller,
                    now_ms() as i64
                ],
            )
            .map_err(|e| self.sql(e))?;
        Ok(())
    }
    pub fn get_label(&self, key: &ContentHash) -> Result<Option<Label>, StoreError> {
        self.conn()
            .query_row(
                "SELECT stage, unit_id, decision, labeller FROM labels WHERE key = ?1",
                params![key.to_hex()],
                |r| {
                    Ok(Label {
                        key: *key,
                        stage: r.get(0)?,
                        unit_id: r.get(1)?,
                        decision: r.get(2)?,
                        labeller: r.get(3)?,
                    })
                },
            )
            .map_err(|e| self.sql(e))
    }
    /// Takes a label back (an undo); true when there was one.
    pub fn delete_label(&self, key: &ContentHash) -> Result<bool, StoreError> {
        self.conn()
            .execute("DELETE FROM labels WHERE key = ?1", params![key.to_hex()])
            .map(|n| n > 0)
            .map_err(|e| self.sql(e))
    }
    /// How many stored facts [`Store::get_fact`] found damaged and dropped
    /// since the store was opened.
    pub fn corrupt_facts(&self) -> u64 {
        self.corrupt_facts
            .load(std::sync::atomic::Ordering::Relaxed)
    }
    /// Reads the JSON text column of the one row `sql` selects by `key`.
    fn get_json<T: serde::de::DeserializeOwned>(
        &self,
        sql: &str,
        key: &ContentHash,
    ) -> Result<Option<T>, StoreError> {
        let text: Option<String> = self
            .conn()
            .query_row(sql, params![key.to_hex()], |r| r.get(0))
            .map_err(|e| self.sql(e))?;
        text.map(|t| serde_json::from_str(&t).map_err(|e| self.decode(e)))
            .transpose()
    }
    /// Caches a decided fact under its key. The first fact written under a
    /// key stands: a second write (a process that kept working after its
    /// lease lapsed, or two that raced) is a no-op.
    pub fn put_fact(&self, fact: &FactRecord) -> Result<(), StoreError> {
        if !fact.status.is_cacheable() {
            return Err(StoreError::NotCacheable {
                status: fact.status.to_string(),
            });
        }
        // Sealed as stored: a row edited afterwards is refused when read.
        let mut sealed = fact.clone();
        sealed.seal();
        let record = serde_json::to_string(&sealed).map_err(|e| self.decode(e))?;
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
                "INSERT INTO facts (key, unit_id, unit_hash, stage, stage_version, status, record, created_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) ON CONFLICT DO NOTHING",
                params![
                    fact.key.to_hex(),
                    unit,
                    unit_hash,
                    fact.stage,
                    i64::from(fact.stage_version),
                    fact.status.as_str(),
                    record,
                    now_ms() as i64
                ],
            )
            .map_err(|e| self.sql(e))?;
        Ok(())
    }
    /// Caches decided facts as [`Store::put_fact`] does each, in a few
    /// multi-row statements of one transaction rather than a statement a
    /// fact: on a shared store each statement is a round trip. The first
    /// fact written under a key stands; one not cacheable is refused
    /// before anything is written.
    pub fn put_facts(&self, facts: &[FactRecord]) -> Result<(), StoreError> {
        if let Some(f) = facts.iter().find(|f| !f.status.is_cacheable()) {
            return Err(StoreError::NotCacheable {
                status: f.status.to_string(),
            });
        }
        if facts.is_empty() {
            return Ok(());
        }
        // The columns of each row as owned values, then borrowed as
        // parameters.
        let mut owned = Vec::with_capacity(facts.len());
        for fact in facts {
            let mut sealed = fact.clone();
            sealed.seal();
            let record = serde_json::to_string(&sealed).map_err(|e| self.decode(e))?;
            owned.push((
                fact.key.to_hex(),
                fact.source_ids
                    .first()
                    .map(|u| u.0.clone())
                    .unwrap_or_default(),
                fact.source_hashes
                    .first()
                    .map(|h| h.to_hex())
                    .unwrap_or_default(),
                i64::from(fact.stage_version),
                fact.status.as_str(),
                record,
            ));
        }
        let now = now_ms() as i64;
        let rows: Vec<[&dyn Param; 8]> = owned
            .iter()
            .zip(facts)
            .map(|((key, unit, unit_hash, version, status, record), fact)| {
                [
                    key as &dyn Param,
                    unit,
                    unit_hash,
                    &fact.stage,
                    version,
                    status,
                    record,
                    &now,
                ]
            })
            .collect();
        self.conn()
            .transaction(|tx| {
                tx.insert_rows(
                    "INSERT INTO facts (key, unit_id, unit_hash, stage, stage_version, status, record, created_ms)",
                    "ON CONFLICT DO NOTHING",
                    &rows,
                )
            })
            .map_err(|e| self.sql(e))?;
        Ok(())
    }
    /// How many embedding vectors the store holds.
    pub fn count_embeddings(&self) -> Result<u64, StoreError> {
        self.count("SELECT COUNT(*) FROM embeddings")
    }
    pub fn count_facts(&self) -> Result<u64, StoreError> {
        self.count("SELECT COUNT(*) FROM facts")
    }
    /// A cached embedding: little-endian `f32`s, `dim` of them.
    pub fn get_embedding(&self, key: &ContentHash) -> Result<Option<Vec<f32>>, StoreError> {
        let row: Option<(i64, Vec<u8>)> = self
            .conn()
            .query_row(
                "SELECT dim, vector FROM embeddings WHERE key = ?1",
                params![key.to_hex()],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
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
                .as_chunks::<4>()
                .0
                .iter()
                .map(|&c| f32::from_le_bytes(c))
                .collect(),
        ))
    }
    /// Caches embeddings in one transaction.
    pub fn put_embeddings(
        &self,
        model: &str,
        rows: &[(ContentHash, &[f32])],
    ) -> Result<(), StoreError> {
        self.conn()
            .transaction(|tx| {
                for (key, v) in rows {
                    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                    tx.execute(
                        "INSERT INTO embeddings (key, model, dim, vector) VALUES (?1, ?2, ?3, ?4)
                         ON CONFLICT (key) DO UPDATE SET model = excluded.model,
                            dim = excluded.dim, vector = excluded.vector",
                        params![key.to_hex(), model, v.len() as i64, bytes],
                    )?;
                }
                Ok(())
            })
            .map_err(|e| self.sql(e))
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
                "INSERT INTO fold_nodes (key, level, value) VALUES (?1, ?2, ?3)
                 ON CONFLICT (key) DO UPDATE SET level = excluded.level, value = excluded.value",
                params![key.to_hex(), i64::from(level), value.to_string()],
            )
            .map_err(|e| self.sql(e))?;
        Ok(())
    }
}
