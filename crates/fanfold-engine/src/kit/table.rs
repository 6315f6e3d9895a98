//! The run's unit table: every unit that reached a stage, by position.

use fanfold_core::{Unit, UnitId};
use serde_json::Value;

use crate::error::RunError;

/// The units that reached a stage: one table, indexed by position, with
/// each unit's value kept as JSON text and parsed when a stage reads it.
#[derive(Default)]
pub struct UnitTable {
    units: Vec<Unit>,
    json: Vec<Box<[u8]>>,
}

impl UnitTable {
    pub fn push(&mut self, unit: Unit, json: &[u8]) -> usize {
        self.units.push(unit);
        self.json.push(json.into());
        self.units.len() - 1
    }

    pub fn len(&self) -> usize {
        self.units.len()
    }

    pub fn is_empty(&self) -> bool {
        self.units.is_empty()
    }

    /// The unit at position `i`, one `push` returned.
    pub fn unit(&self, i: usize) -> Result<&Unit, RunError> {
        self.units.get(i).ok_or(RunError::NoUnit { index: i })
    }

    pub fn id(&self, i: usize) -> Result<&UnitId, RunError> {
        Ok(&self.unit(i)?.unit_id)
    }

    /// The units in table order.
    pub fn units(&self) -> &[Unit] {
        &self.units
    }

    /// The unit's value. Its text was parsed once already when the source
    /// was partitioned, so this cannot fail on a unit the table holds; a
    /// position the table does not hold has none.
    pub fn value(&self, i: usize) -> Value {
        self.json
            .get(i)
            .and_then(|json| serde_json::from_slice(json).ok())
            .unwrap_or(Value::Null)
    }

    /// Table positions by unit id.
    pub fn index_by_id(&self) -> std::collections::HashMap<&UnitId, usize> {
        self.units
            .iter()
            .enumerate()
            .map(|(i, u)| (&u.unit_id, i))
            .collect()
    }
}
