//! The effect journal: `effects` (one row per effect by its idempotency
//! key, in its latest state) and `effect_journal` (every step of every
//! effect, in order, with the run that took it). A step is written before
//! the act it records (`dispatched` before the request leaves), so a
//! process killed at any instant leaves a journal that says what may have
//! happened, and the next run reads the target back before it acts again.
//!
//! Only the run holding the effect's lease (a row of `claims` under the
//! effect's key, renewed by its heartbeat) may write a step: a process
//! that lost its lease while paused finds its late writes refused.

use serde_json::Value;

use crate::db::{Conn, DbError, params};
use crate::{Store, StoreError, now_ms};

pub(crate) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS effects (
    key TEXT PRIMARY KEY, stage TEXT NOT NULL, unit_id TEXT NOT NULL,
    action TEXT NOT NULL, state TEXT NOT NULL, sends INTEGER NOT NULL,
    receipt TEXT, read_back TEXT, updated_ms INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS effects_by_stage ON effects (stage, unit_id);
CREATE TABLE IF NOT EXISTS effect_journal (
    key TEXT NOT NULL, seq INTEGER NOT NULL, at_ms INTEGER NOT NULL,
    run_id TEXT NOT NULL, state TEXT NOT NULL, detail TEXT NOT NULL,
    PRIMARY KEY (key, seq));
";

/// Where an effect stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EffectState {
    /// Decided, nothing sent.
    Intent,
    /// Sent (or about to be); no answer heard.
    Dispatched,
    /// The target answered that it was done.
    Receipt,
    /// The target refused it (a 4xx): nothing took place.
    Refused,
    /// Read back and seen in place.
    Confirmed,
    /// Read back and not seen, after a receipt or a confirmation.
    Absent,
    /// Sent, and whether it took place could not be read back.
    Unknown,
    /// Sent, then the run was cancelled before an answer: recorded, not
    /// undone; the next run reads it back.
    Cancelled,
}

impl EffectState {
    pub const ALL: [EffectState; 8] = [
        EffectState::Intent,
        EffectState::Dispatched,
        EffectState::Receipt,
        EffectState::Refused,
        EffectState::Confirmed,
        EffectState::Absent,
        EffectState::Unknown,
        EffectState::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            EffectState::Intent => "intent",
            EffectState::Dispatched => "dispatched",
            EffectState::Receipt => "receipt",
            EffectState::Refused => "refused",
            EffectState::Confirmed => "confirmed",
            EffectState::Absent => "absent",
            EffectState::Unknown => "unknown",
            EffectState::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<EffectState> {
        EffectState::ALL.into_iter().find(|x| x.as_str() == s)
    }

    /// Whether the action may have reached the target: before acting
    /// again, it must be read back.
    pub fn may_have_acted(self) -> bool {
        !matches!(self, EffectState::Intent | EffectState::Refused)
    }
}

/// An effect's row.
#[derive(Clone, Debug, PartialEq)]
pub struct EffectRow {
    pub key: String,
    pub stage: String,
    pub unit_id: String,
    pub action: Value,
    pub state: EffectState,
    /// How many times the action was sent, by every run.
    pub sends: u64,
    pub receipt: Option<Value>,
    pub read_back: Option<Value>,
}

/// One step of an effect's journal.
#[derive(Clone, Debug, PartialEq)]
pub struct JournalEntry {
    pub seq: u64,
    pub at_ms: u64,
    pub run_id: String,
    pub state: EffectState,
    pub detail: Value,
}

impl Store {
    /// Records the intent of effect `key` unless it is known, and returns
    /// its row as it stands.
    pub fn effect_intent(
        &self,
        key: &str,
        stage: &str,
        unit_id: &str,
        action: &Value,
        run_id: &str,
    ) -> Result<EffectRow, StoreError> {
        let now = now_ms() as i64;
        let row = self
            .conn()
            .transaction(|tx| {
                let added = tx.execute(
                    "INSERT INTO effects (key, stage, unit_id, action, state, sends, updated_ms)
                     VALUES (?1, ?2, ?3, ?4, 'intent', 0, ?5) ON CONFLICT DO NOTHING",
                    params![key, stage, unit_id, action.to_string(), now],
                )?;
                if added == 1 {
                    tx.execute(
                        "INSERT INTO effect_journal (key, seq, at_ms, run_id, state, detail)
                         VALUES (?1, 1, ?2, ?3, 'intent', ?4)",
                        params![key, now, run_id, action.to_string()],
                    )?;
                }
                read_effect(tx, key)
            })
            .map_err(|e| self.sql(e))?;
        row.ok_or_else(|| StoreError::Decode {
            path: self.location.clone(),
            detail: format!("effect {key} vanished as it was recorded"),
        })
    }

    /// The effect's row, if it is known.
    pub fn effect(&self, key: &str) -> Result<Option<EffectRow>, StoreError> {
        read_effect(&mut self.conn(), key).map_err(|e| self.sql(e))
    }

    /// Moves effect `key` to `state` and journals the step, in one
    /// transaction, if `run_id` holds the effect's lease; `false` (and
    /// nothing written) if it does not. A `dispatched` step counts a send;
    /// a `receipt` or `refused` step keeps `detail` as the receipt; a read
    /// back (`confirmed`, `absent`) keeps it as the read-back.
    pub fn effect_step(
        &self,
        key: &str,
        run_id: &str,
        state: EffectState,
        detail: &Value,
    ) -> Result<bool, StoreError> {
        let now = now_ms() as i64;
        let text = detail.to_string();
        let (sends, receipt, read_back): (i64, _, _) = match state {
            EffectState::Dispatched => (1, None, None),
            EffectState::Receipt | EffectState::Refused => (0, Some(&text), None),
            EffectState::Confirmed | EffectState::Absent => (0, None, Some(&text)),
            _ => (0, None, None),
        };
        self.conn()
            .transaction(|tx| {
                let holds = tx.query_row(
                    "SELECT 1 FROM claims WHERE key = ?1 AND run_id = ?2 AND expires_ms >= ?3",
                    params![key, run_id, now],
                    |_| Ok(()),
                )?;
                if holds.is_none() {
                    return Ok(false);
                }
                let changed = tx.execute(
                    "UPDATE effects SET state = ?2, sends = sends + ?3,
                        receipt = COALESCE(?4, receipt), read_back = COALESCE(?5, read_back),
                        updated_ms = ?6
                     WHERE key = ?1",
                    params![key, state.as_str(), sends, receipt, read_back, now],
                )?;
                if changed == 0 {
                    return Ok(false);
                }
                tx.execute(
                    "INSERT INTO effect_journal (key, seq, at_ms, run_id, state, detail)
                     VALUES (?1, (SELECT COALESCE(MAX(seq), 0) + 1 FROM effect_journal WHERE key = ?1),
                             ?2, ?3, ?4, ?5)",
                    params![key, now, run_id, state.as_str(), text],
                )?;
                Ok(true)
            })
            .map_err(|e| self.sql(e))
    }

    /// Every step of effect `key`, in order.
    pub fn effect_journal(&self, key: &str) -> Result<Vec<JournalEntry>, StoreError> {
        let rows = self
            .conn()
            .query_map(
                "SELECT seq, at_ms, run_id, state, detail FROM effect_journal
                 WHERE key = ?1 ORDER BY seq",
                params![key],
                |r| {
                    Ok((
                        r.get::<i64>(0)?,
                        r.get::<i64>(1)?,
                        r.get::<String>(2)?,
                        r.get::<String>(3)?,
                        r.get::<String>(4)?,
                    ))
                },
            )
            .map_err(|e| self.sql(e))?;
        let mut out = Vec::new();
        for (seq, at, run_id, state, detail) in rows {
            out.push(JournalEntry {
                seq: seq.max(0) as u64,
                at_ms: at.max(0) as u64,
                run_id,
                state: EffectState::parse(&state).unwrap_or(EffectState::Unknown),
                detail: serde_json::from_str(&detail).unwrap_or(Value::String(detail)),
            });
        }
        Ok(out)
    }

    /// How many effects of `stage` stand in each state.
    pub fn effect_counts(
        &self,
        stage: &str,
    ) -> Result<std::collections::BTreeMap<String, u64>, StoreError> {
        let rows = self
            .conn()
            .query_map(
                "SELECT state, COUNT(*) FROM effects WHERE stage = ?1 GROUP BY state",
                params![stage],
                |r| Ok((r.get::<String>(0)?, r.get::<i64>(1)?)),
            )
            .map_err(|e| self.sql(e))?;
        Ok(rows
            .into_iter()
            .map(|(state, n)| (state, n.max(0) as u64))
            .collect())
    }
}

fn read_effect(conn: &mut Conn, key: &str) -> Result<Option<EffectRow>, DbError> {
    conn.query_row(
        "SELECT key, stage, unit_id, action, state, sends, receipt, read_back
         FROM effects WHERE key = ?1",
        params![key],
        |r| {
            let json =
                |s: Option<String>| s.map(|t| serde_json::from_str(&t).unwrap_or(Value::String(t)));
            Ok(EffectRow {
                key: r.get(0)?,
                stage: r.get(1)?,
                unit_id: r.get(2)?,
                action: json(r.get(3)?).unwrap_or(Value::Null),
                state: EffectState::parse(&r.get::<String>(4)?).unwrap_or(EffectState::Unknown),
                sends: r.get::<i64>(5)?.max(0) as u64,
                receipt: json(r.get(6)?),
                read_back: json(r.get(7)?),
            })
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn key() -> fanfold_core::ContentHash {
        fanfold_core::ContentHash::of_bytes(b"effect")
    }

    #[test]
    fn a_step_is_journaled_only_by_the_lease_holder() {
        let dir = tempfile::tempdir().expect("dir");
        let store = Store::open(&dir.path().join("s.sqlite")).expect("open");
        let k = key();
        let hex = k.to_hex();
        let row = store
            .effect_intent(&hex, "label", "7", &json!({"url": "u"}), "run-a")
            .expect("intent");
        assert_eq!(row.state, EffectState::Intent);
        // No lease, no step.
        assert!(
            !store
                .effect_step(&hex, "run-a", EffectState::Dispatched, &json!({}))
                .expect("step")
        );
        assert_eq!(
            store.claim(&k, "run-a", 60_000).expect("claim"),
            crate::Claim::Mine
        );
        assert!(
            store
                .effect_step(&hex, "run-a", EffectState::Dispatched, &json!({"send": 1}))
                .expect("step")
        );
        // Another run cannot write while the lease holds.
        assert!(
            !store
                .effect_step(&hex, "run-b", EffectState::Dispatched, &json!({}))
                .expect("step")
        );
        assert!(
            store
                .effect_step(&hex, "run-a", EffectState::Receipt, &json!({"status": 201}))
                .expect("step")
        );
        assert!(
            store
                .effect_step(
                    &hex,
                    "run-a",
                    EffectState::Confirmed,
                    &json!({"holds": true})
                )
                .expect("step")
        );
        // A second intent changes nothing.
        let row = store
            .effect_intent(&hex, "label", "7", &json!({"url": "u"}), "run-b")
            .expect("intent");
        assert_eq!(row.state, EffectState::Confirmed);
        assert_eq!(row.sends, 1);
        assert_eq!(row.receipt, Some(json!({"status": 201})));
        let steps: Vec<EffectState> = store
            .effect_journal(&hex)
            .expect("journal")
            .into_iter()
            .map(|e| e.state)
            .collect();
        assert_eq!(
            steps,
            [
                EffectState::Intent,
                EffectState::Dispatched,
                EffectState::Receipt,
                EffectState::Confirmed
            ]
        );
        assert_eq!(
            store.effect_counts("label").expect("counts")["confirmed"],
            1
        );
    }
}
