//! The run's unit table: every unit that reached a stage, by position.

use fanfold_core::{Unit, UnitId};
use std::collections::HashMap;
use std::sync::Mutex;

use serde_json::{Map, Value};

use crate::error::RunError;

/// Where a bred unit came from.
#[derive(Clone, Debug, PartialEq)]
pub struct Lineage {
    /// The table position of the unit whose observation bore it.
    pub parent: usize,
    /// Its parent's depth plus one.
    pub depth: u32,
    /// The stage whose observation bore it.
    pub stage: String,
}

/// The units that reached a stage: one table, indexed by position, with
/// each unit's value kept as JSON text and parsed when a stage reads it.
#[derive(Default)]
pub struct UnitTable {
    units: Vec<Unit>,
    json: Vec<Box<[u8]>>,
    /// Fields stages added to units (a tool's observations), by position:
    /// later stages read them as part of the unit; the source is unchanged.
    added: Mutex<HashMap<usize, Map<String, Value>>>,
    /// Units bred from observations: their parent and depth, by position.
    /// A unit without an entry is the input's own, at depth 0.
    lineage: HashMap<usize, Lineage>,
}

impl UnitTable {
    pub fn push(&mut self, unit: Unit, json: &[u8]) -> usize {
        self.units.push(unit);
        self.json.push(json.into());
        self.units.len() - 1
    }

    /// Adds a unit an observation bore, after every unit the input holds.
    pub fn push_born(&mut self, unit: Unit, json: &[u8], lineage: Lineage) -> usize {
        let i = self.push(unit, json);
        self.lineage.insert(i, lineage);
        i
    }

    /// The parent and depth of a bred unit; `None` for the input's own.
    pub fn lineage(&self, i: usize) -> Option<&Lineage> {
        self.lineage.get(&i)
    }

    /// How deep unit `i` lies: 0 for the input's own units.
    pub fn depth(&self, i: usize) -> u32 {
        self.lineage.get(&i).map_or(0, |l| l.depth)
    }

    /// Every bred unit's position and lineage, in table order.
    pub fn bred(&self) -> Vec<(usize, &Lineage)> {
        let mut out: Vec<_> = self.lineage.iter().map(|(&i, l)| (i, l)).collect();
        out.sort_unstable_by_key(|(i, _)| *i);
        out
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

    /// The unit's value as it was pushed, without the fields stages added.
    pub fn raw_value(&self, i: usize) -> Value {
        self.json
            .get(i)
            .and_then(|json| serde_json::from_slice(json).ok())
            .unwrap_or(Value::Null)
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
