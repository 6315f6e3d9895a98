//! The run's unit table: every unit that reached a stage, by position.

use fanfold_core::{Unit, UnitId};
use std::collections::HashMap;
use std::sync::Mutex;

use serde_json::{Map, Value};

use crate::error::RunError;

/// The units that reached a stage: one table, indexed by position, with
/// each unit's value kept as JSON text and parsed when a stage reads it.
#[derive(Default)]
pub struct UnitTable {
    units: Vec<Unit>,
    json: Vec<Box<[u8]>>,
    /// Fields stages added to units (a tool's observations), by position:
    /// later stages read them as part of the unit; the source is unchanged.
    added: Mutex<HashMap<usize, Map<String, Value>>>,
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
        let mut value = self
            .json
            .get(i)
            .and_then(|json| serde_json::from_slice(json).ok())
            .unwrap_or(Value::Null);
        if let Some(added) = self.lock_added().get(&i) {
            with_fields(&mut value, added);
        }
        value
    }

    fn lock_added(&self) -> std::sync::MutexGuard<'_, HashMap<usize, Map<String, Value>>> {
        self.added.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds `field` to unit `i` as every later stage reads it.
    pub fn add_field(&self, i: usize, field: &str, value: Value) {
        self.lock_added()
            .entry(i)
            .or_default()
            .insert(field.to_owned(), value);
    }

    /// The fields stages added, by unit id, for verify to read evidence in
    /// the view that was judged.
    pub fn added_fields(&self) -> HashMap<UnitId, Map<String, Value>> {
        self.lock_added()
            .iter()
            .filter_map(|(&i, m)| Some((self.units.get(i)?.unit_id.clone(), m.clone())))
            .collect()
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

/// `value` with `added` set on it; a unit that is not an object is
/// wrapped as `{"value": ...}` first, so its fields have a place.
pub fn with_fields(value: &mut Value, added: &Map<String, Value>) {
    if !value.is_object() {
        let inner = value.take();
        *value = serde_json::json!({ "value": inner });
    }
    if let Value::Object(obj) = value {
        for (k, v) in added {
            obj.insert(k.clone(), v.clone());
        }
    }
}
