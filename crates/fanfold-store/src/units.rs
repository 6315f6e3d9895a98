//! Partitions and routing: `partitions`, `units` and `rejections` (each
//! partition's elements), `prefilters`, `routings` and `route_chunks` (the
//! rule that decided each element).

use super::*;

impl Store {
    /// The partition of `source` that `key` names (the source and the
    /// partition's settings), created when new. Returns its id and, when a
    /// run finished it before, its counts.
    pub fn open_partition(
        &self,
        key: &ContentHash,
        source: &ContentHash,
        spec: &str,
    ) -> Result<(i64, Option<PartitionCounts>), StoreError> {
        let mut conn = self.conn();
        conn.execute(
            "INSERT INTO partitions (key, source_hash, spec) VALUES (?1, ?2, ?3) ON CONFLICT DO NOTHING",
            params![key.to_hex(), source.to_hex(), spec],
        )
        .map_err(|e| self.sql(e))?;
        conn.query_one(
            "SELECT id, elements, units, rejected FROM partitions WHERE key = ?1",
            params![key.to_hex()],
            |r| {
                let counts = match (
                    r.get::<Option<i64>>(1)?,
                    r.get::<Option<i64>>(2)?,
                    r.get::<Option<i64>>(3)?,
                ) {
                    (Some(elements), Some(units), Some(rejected)) => Some(PartitionCounts {
                        elements: elements as u64,
                        units: units as u64,
                        rejected: rejected as u64,
                    }),
                    _ => None,
                };
                Ok((r.get(0)?, counts))
            },
        )
        .map_err(|e| self.sql(e))
    }
    /// Marks a partition whole: every element is stored as a unit or a
    /// rejection.
    pub fn finish_partition(&self, id: i64, counts: PartitionCounts) -> Result<(), StoreError> {
        self.conn()
            .execute(
                "UPDATE partitions SET elements = ?2, units = ?3, rejected = ?4 WHERE id = ?1",
                params![
                    id,
                    counts.elements as i64,
                    counts.units as i64,
                    counts.rejected as i64
                ],
            )
            .map_err(|e| self.sql(e))?;
        Ok(())
    }
    /// Writes one batch of a partition's units and rejections, and the
    /// prefilter's decisions for them, in one transaction. Rows stored
    /// before (a resumed or repeated run) are kept as they are.
    pub fn put_partition_batch(&self, batch: &PartitionBatch<'_>) -> Result<(), StoreError> {
        let units: Vec<(i64, &[u8], i64, i64)> = batch
            .units
            .iter()
            .map(|u| {
                (
                    u.ordinal as i64,
                    &u.unit_hash.0[..],
                    u.bytes.start as i64,
                    u.bytes.end as i64,
                )
            })
            .collect();
        let rejections: Vec<(i64, i64, i64)> = batch
            .rejections
            .iter()
            .map(|r| (r.ordinal as i64, r.byte_start as i64, r.byte_end as i64))
            .collect();
        self.conn()
            .transaction(|tx| {
                let rows: Vec<[&dyn Param; 6]> = batch
                    .units
                    .iter()
                    .zip(&units)
                    .map(|(u, (ordinal, hash, start, end))| {
                        [
                            &batch.partition as &dyn Param,
                            &u.unit_id.0,
                            ordinal,
                            hash,
                            start,
                            end,
                        ]
                    })
                    .collect();
                tx.insert_rows(
                    "INSERT INTO units (partition, unit_id, ordinal, unit_hash, byte_start, byte_end)",
                    "ON CONFLICT DO NOTHING",
                    &rows,
                )?;
                let rows: Vec<[&dyn Param; 6]> = batch
                    .rejections
                    .iter()
                    .zip(&rejections)
                    .map(|(r, (ordinal, start, end))| {
                        [
                            &batch.partition as &dyn Param,
                            ordinal,
                            &r.reason,
                            &r.detail,
                            start,
                            end,
                        ]
                    })
                    .collect();
                tx.insert_rows(
                    "INSERT INTO rejections (partition, ordinal, reason, detail, byte_start, byte_end)",
                    "ON CONFLICT DO NOTHING",
                    &rows,
                )?;
                if let Some(prefilter) = batch.prefilter
                    && !batch.rules.is_empty()
                {
                    tx.execute(
                        "INSERT INTO route_chunks (partition, prefilter, first_ordinal, rules)
                         VALUES (?1, ?2, ?3, ?4) ON CONFLICT DO NOTHING",
                        params![
                            batch.partition,
                            prefilter,
                            batch.first_ordinal as i64,
                            batch.rules
                        ],
                    )?;
                }
                Ok(())
            })
            .map_err(|e| self.sql(e))
    }
    /// Whether an element before `ordinal` in the partition has `unit_id`:
    /// the exact check behind a fingerprint hit.
    pub fn unit_id_before(
        &self,
        partition: i64,
        unit_id: &str,
        ordinal: u64,
    ) -> Result<bool, StoreError> {
        self.conn()
            .query_row(
                "SELECT 1 FROM units WHERE partition = ?1 AND unit_id = ?2 AND ordinal < ?3",
                params![partition, unit_id, ordinal as i64],
                |_| Ok(()),
            )
            .map(|r| r.is_some())
            .map_err(|e| self.sql(e))
    }
    /// The unit before `ordinal` in the partition that has `unit_id`: its
    /// ordinal, content hash and first byte, to tell a repeated id's
    /// identical repeat from a conflicting one.
    pub fn unit_before(
        &self,
        partition: i64,
        unit_id: &str,
        ordinal: u64,
    ) -> Result<Option<(u64, ContentHash, u64)>, StoreError> {
        let row = self
            .conn()
            .query_row(
                "SELECT ordinal, unit_hash, byte_start FROM units
                 WHERE partition = ?1 AND unit_id = ?2 AND ordinal < ?3",
                params![partition, unit_id, ordinal as i64],
                |r| Ok((r.get::<i64>(0)?, r.get::<Vec<u8>>(1)?, r.get::<i64>(2)?)),
            )
            .map_err(|e| self.sql(e))?;
        let Some((first, hash, byte)) = row else {
            return Ok(None);
        };
        let hash = hash_of(&hash).ok_or_else(|| StoreError::Decode {
            path: self.location.clone(),
            detail: format!("unit {unit_id} has a content hash of {} bytes", hash.len()),
        })?;
        Ok(Some((first as u64, hash, byte as u64)))
    }
    /// Where unit `unit_id` of a partition lies in its source.
    pub fn unit_range(
        &self,
        partition: i64,
        unit_id: &str,
    ) -> Result<Option<(u64, u64)>, StoreError> {
        self.conn()
            .query_row(
                "SELECT byte_start, byte_end FROM units WHERE partition = ?1 AND unit_id = ?2",
                params![partition, unit_id],
                |r| Ok((r.get::<i64>(0)? as u64, r.get::<i64>(1)? as u64)),
            )
            .map_err(|e| self.sql(e))
    }
    /// The id of a prefilter (its rules, by their hash), created when new.
    pub fn open_prefilter(&self, key: &ContentHash, rules: &str) -> Result<i64, StoreError> {
        let mut conn = self.conn();
        conn.execute(
            "INSERT INTO prefilters (key, rules) VALUES (?1, ?2) ON CONFLICT DO NOTHING",
            params![key.to_hex(), rules],
        )
        .map_err(|e| self.sql(e))?;
        conn.query_one(
            "SELECT id FROM prefilters WHERE key = ?1",
            params![key.to_hex()],
            |r| r.get(0),
        )
        .map_err(|e| self.sql(e))
    }
    /// The rule byte (see [`PartitionBatch::rules`]) of element `ordinal`.
    pub fn route_of(
        &self,
        partition: i64,
        prefilter: i64,
        ordinal: u64,
    ) -> Result<Option<u8>, StoreError> {
        let row: Option<(i64, Vec<u8>)> = self
            .conn()
            .query_row(
                "SELECT first_ordinal, rules FROM route_chunks
                 WHERE partition = ?1 AND prefilter = ?2 AND first_ordinal <= ?3
                 ORDER BY first_ordinal DESC LIMIT 1",
                params![partition, prefilter, ordinal as i64],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .map_err(|e| self.sql(e))?;
        Ok(row.and_then(|(first, rules)| {
            rules
                .get(usize::try_from(ordinal.checked_sub(first as u64)?).ok()?)
                .copied()
        }))
    }
    /// Whether every unit of `partition` has its decision by `prefilter`
    /// stored.
    pub fn routing_done(&self, partition: i64, prefilter: i64) -> Result<bool, StoreError> {
        self.conn()
            .query_row(
                "SELECT 1 FROM routings WHERE partition = ?1 AND prefilter = ?2",
                params![partition, prefilter],
                |_| Ok(()),
            )
            .map(|r| r.is_some())
            .map_err(|e| self.sql(e))
    }
    pub fn finish_routing(&self, partition: i64, prefilter: i64) -> Result<(), StoreError> {
        self.conn()
            .execute(
                "INSERT INTO routings (partition, prefilter) VALUES (?1, ?2) ON CONFLICT DO NOTHING",
                params![partition, prefilter],
            )
            .map_err(|e| self.sql(e))?;
        Ok(())
    }
    /// Units stored for every partition of a source.
    pub fn count_units(&self, source: &ContentHash) -> Result<u64, StoreError> {
        self.conn()
            .query_one(
                "SELECT COUNT(*) FROM units WHERE partition IN
                   (SELECT id FROM partitions WHERE source_hash = ?1)",
                params![source.to_hex()],
                |r| r.get::<i64>(0),
            )
            .map(|n| n.max(0) as u64)
            .map_err(|e| self.sql(e))
    }
    /// Names the partition and prefilter a run read its units through.
    pub fn set_run_routing(
        &self,
        run_id: &str,
        partition: i64,
        prefilter: i64,
    ) -> Result<(), StoreError> {
        self.conn()
            .execute(
                "UPDATE runs SET partition = ?2, prefilter = ?3 WHERE run_id = ?1",
                params![run_id, partition, prefilter],
            )
            .map_err(|e| self.sql(e))?;
        Ok(())
    }
}
