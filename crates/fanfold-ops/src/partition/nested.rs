//! Units inside records: a field of a record as a unit of its own
//! (`unit_fields`), and the elements a path reaches in a record (`path`,
//! `element_key`).
//!
//! Every such unit's byte range is its record's, as a document's units
//! share their document's: [`reread`](super::reread) parses the record
//! again, splits it the same way and finds the unit by id. Ids come from
//! the record's id and the unit's place in the record, never from a
//! position in the whole source, so a record added elsewhere moves none.

use std::collections::HashMap;

use serde_json::{Map, Value};

use super::assign::{Admitted, Assigner, Proposed};
use super::*;

/// The top-level field a unit that is one field of a record names that
/// field in: what its evidence may quote. It is part of the unit's value,
/// so every view of the unit carries it (see [`crate::view`]).
pub const UNIT_FIELD: &str = "_unit_field";

/// The field a unit's evidence is confined to, when it is one field of a
/// record.
pub fn unit_field(view: &Value) -> Option<&str> {
    view.get(UNIT_FIELD).and_then(Value::as_str)
}

/// One step of a unit path.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Step {
    /// `.name`: the field of an object.
    Field(String),
    /// `[]`: each element of an array.
    Each,
}

/// A path into a record, in a restricted jq syntax: `.name` and `[]`
/// steps (`.events[]`, `.items[].comments[]`, `.events[].message`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnitPath {
    steps: Vec<Step>,
    text: String,
}

impl UnitPath {
    pub fn parse(text: &str) -> Result<UnitPath, String> {
        let bad = |why: &str| {
            format!(
                "partition path {text:?} {why}; a path is `.name` and `[]` steps, e.g. `.events[]` or `.events[].message`"
            )
        };
        let mut steps = Vec::new();
        let mut rest = text.trim();
        while !rest.is_empty() {
            if let Some(r) = rest.strip_prefix("[]") {
                steps.push(Step::Each);
                rest = r;
            } else if let Some(r) = rest.strip_prefix('.') {
                if r.starts_with("[]") {
                    // `.[]`, as jq also writes it.
                    rest = r;
                    continue;
                }
                let end = r
                    .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == '-'))
                    .unwrap_or(r.len());
                if end == 0 {
                    return Err(bad("has a `.` without a field name after it"));
                }
                // `end` is a char boundary: `find` returned it.
                let (name, after) = r.split_at(end);
                steps.push(Step::Field(name.to_owned()));
                rest = after;
            } else {
                return Err(bad(&format!("cannot read {rest:?}")));
            }
        }
        if !steps.contains(&Step::Each) {
            return Err(bad("has no `[]`, so it names one value, not elements"));
        }
        Ok(UnitPath {
            steps,
            text: text.trim().to_owned(),
        })
    }

    /// The name an element that is not an object is held under: the last
    /// field the path names after its last `[]`, else `value`.
    fn value_name(&self) -> &str {
        match self.steps.last() {
            Some(Step::Field(name)) => name,
            _ => "value",
        }
    }

    /// Every element the path reaches in `record`, in order, each with its
    /// place (`.events[2].message`); or the first place where the path
    /// finds no field or no array.
    pub fn elements(&self, record: &Value) -> Result<Vec<(String, Value)>, String> {
        let mut at: Vec<(String, &Value)> = vec![(String::new(), record)];
        for step in &self.steps {
            let mut next = Vec::with_capacity(at.len());
            for (place, v) in at {
                match step {
                    Step::Field(name) => match v.get(name.as_str()) {
                        Some(inner) if !inner.is_null() => {
                            next.push((format!("{place}.{name}"), inner))
                        }
                        _ => return Err(format!("no field `{name}` at `{}`", shown(&place))),
                    },
                    Step::Each => match v.as_array() {
                        Some(items) => next.extend(
                            items
                                .iter()
                                .enumerate()
                                .map(|(i, item)| (format!("{place}[{i}]"), item)),
                        ),
                        None => return Err(format!("no array at `{}`", shown(&place))),
                    },
                }
            }
            at = next;
        }
        Ok(at
            .into_iter()
            .map(|(place, v)| {
                let value = match v {
                    Value::Object(_) => v.clone(),
                    other => {
                        let mut m = Map::new();
                        m.insert(self.value_name().to_owned(), other.clone());
                        Value::Object(m)
                    }
                };
                (place, value)
            })
            .collect())
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }
}

/// A place as people read it: the record itself is `.`.
fn shown(place: &str) -> &str {
    if place.is_empty() { "." } else { place }
}

/// How a JSON array's records become units: whole, split into a record
/// and its unit fields, or replaced by the elements at a path.
#[derive(Clone, Debug)]
pub enum Inner {
    Whole,
    Fields(Vec<String>),
    Path {
        path: UnitPath,
        element_key: Option<String>,
    },
}

impl Inner {
    pub fn of(spec: &PartitionSpec) -> Result<Inner, PartitionError> {
        let PartitionSpec::JsonArray {
            unit_fields,
            path,
            element_key,
            ..
        } = spec
        else {
            return Ok(Inner::Whole);
        };
        match (unit_fields.is_empty(), path) {
            (true, None) if element_key.is_some() => Err(PartitionError::Settings(
                "`element_key` names a field of the elements at `path`, and no `path` is set"
                    .into(),
            )),
            (true, None) => Ok(Inner::Whole),
            (false, Some(_)) => Err(PartitionError::Settings(
                "`unit_fields` and `path` cannot go together: a record is split into its fields or into the elements at a path, not both".into(),
            )),
            (false, None) => {
                for f in unit_fields {
                    if f.is_empty() || f == UNIT_FIELD {
                        return Err(PartitionError::Settings(format!(
                            "`unit_fields` holds {f:?}, which cannot be a unit's field"
                        )));
                    }
                }
                if element_key.is_some() {
                    return Err(PartitionError::Settings(
                        "`element_key` goes with `path`, not with `unit_fields`".into(),
                    ));
                }
                Ok(Inner::Fields(unit_fields.clone()))
            }
            (true, Some(text)) => Ok(Inner::Path {
                path: UnitPath::parse(text).map_err(PartitionError::Settings)?,
                element_key: element_key.clone(),
            }),
        }
    }

    pub fn is_whole(&self) -> bool {
        matches!(self, Inner::Whole)
    }
}

/// A unit inside a record: its id (or how it proposes one) and value.
pub struct Piece {
    pub id: Proposed,
    pub value: Value,
}

/// Splits one record (`record_id`: its key's value or content id; `None`
/// when a declared key is missing) into its units, or says why the record
/// cannot be split.
pub fn pieces(
    inner: &Inner,
    record: &Value,
    record_id: Option<&str>,
    derived: bool,
) -> Result<Vec<Piece>, String> {
    let qualified = |suffix: &str| {
        let id = format!("{}{suffix}", record_id.unwrap_or_default());
        if derived {
            Proposed::Derived(id)
        } else {
            Proposed::Key(record_id.map(|_| id))
        }
    };
    match inner {
        Inner::Whole => Ok(vec![Piece {
            id: qualified(""),
            value: record.clone(),
        }]),
        Inner::Fields(fields) => {
            let Some(obj) = record.as_object() else {
                return Err("is not an object, so it has no fields to split".into());
            };
            let mut rest = obj.clone();
            for f in fields {
                rest.remove(f);
            }
            let mut out = vec![Piece {
                id: qualified(""),
                value: Value::Object(rest.clone()),
            }];
            for f in fields {
                let Some(text) = obj.get(f).filter(|v| !v.is_null()) else {
                    continue;
                };
                let mut unit = rest.clone();
                unit.insert(f.clone(), text.clone());
                unit.insert(UNIT_FIELD.to_owned(), Value::String(f.clone()));
                out.push(Piece {
                    id: qualified(&format!(".{f}")),
                    value: Value::Object(unit),
                });
            }
            Ok(out)
        }
        Inner::Path { path, element_key } => {
            let elements = path.elements(record)?;
            Ok(elements
                .into_iter()
                .map(|(place, value)| {
                    let id = match element_key {
                        Some(k) => Proposed::Key(super::assign::scalar_id(value.get(k.as_str()))),
                        // A top-level object has no id of its own: its
                        // elements are named by their place alone.
                        None if record_id == Some("") => {
                            Proposed::Key(Some(place.trim_start_matches('.').to_owned()))
                        }
                        None => qualified(&place),
                    };
                    Piece { id, value }
                })
                .collect())
        }
    }
}

/// Admits one record's pieces through the assigner, each at the record's
/// byte range; a record the split refuses is one rejection, worded like
/// the others (`missing_path`), and so is one it finds no element in
/// (`empty_path`).
#[allow(clippy::too_many_arguments)]
pub(super) fn admit_record(
    inner: &Inner,
    assigner: &mut Assigner,
    record_key: Option<&str>,
    record: Value,
    record_id: Option<String>,
    derived: bool,
    range: ByteRange,
    line: u64,
    emit: &mut dyn FnMut(Element),
) -> Result<(), PartitionError> {
    if record_id.is_none() && !derived {
        let key = record_key.unwrap_or("id");
        emit(Element::Rejected(assigner.reject(
            range,
            "missing_key",
            |ordinal| {
                format!(
                    "element {ordinal} at byte {} has no scalar `{key}` field",
                    range.start
                )
            },
        )));
        return Ok(());
    }
    let split = pieces(inner, &record, record_id.as_deref(), derived);
    let pieces = match split {
        Ok(p) => p,
        Err(why) => {
            let path = match inner {
                Inner::Path { path, .. } => path.as_str().to_owned(),
                _ => "its unit fields".to_owned(),
            };
            emit(Element::Rejected(assigner.reject(
                range,
                "missing_path",
                |ordinal| {
                    format!(
                        "element {ordinal} at byte {} (line {line}) cannot be split by {path}: {why}",
                        range.start
                    )
                },
            )));
            return Ok(());
        }
    };
    // A record the path reaches no element in (an empty array) holds no
    // unit: said, so that no record of the input goes unaccounted for.
    if pieces.is_empty() {
        let path = match inner {
            Inner::Path { path, .. } => path.as_str().to_owned(),
            _ => "its unit fields".to_owned(),
        };
        emit(Element::Rejected(assigner.reject(
            range,
            "empty_path",
            |ordinal| {
                format!(
                    "element {ordinal} at byte {} (line {line}) has no element at {path}",
                    range.start
                )
            },
        )));
        return Ok(());
    }
    for piece in pieces {
        let size = serde_json::to_string(&piece.value).map_or(0, |s| s.len() as u64);
        let hash = unit_hash(&piece.value);
        let admitted = assigner.admit(range, size, piece.id, hash)?;
        emit(match admitted {
            Admitted::Unit(unit) => Element::Unit(PartUnit {
                unit,
                value: piece.value,
            }),
            other => other.with_value(Value::Null),
        });
    }
    Ok(())
}

/// The ways a record's bytes may have been read, in the order a read-back
/// tries them: as an element of the array; and, for a path, as a
/// top-level object, whose elements are named by their place alone.
fn readings(
    inner: &Inner,
    key: Option<&str>,
    record: &Value,
    bytes: &[u8],
) -> Vec<(Option<String>, bool)> {
    let mut readings = vec![match key {
        Some(k) => (super::json::record_key_id(record, bytes, k), false),
        None => (Some(format!("c{}", unit_hash(record).short(16))), true),
    }];
    if record.is_object() && matches!(inner, Inner::Path { .. }) {
        readings.push((Some(String::new()), false));
    }
    readings
}

/// Every unit of one record by id, as [`reread_piece`] finds each: a
/// read-back of many units of one record parses and splits it once. An id
/// with an occurrence suffix (`-2`) is not among them; [`reread_piece`]
/// finds it.
pub fn record_pieces(
    inner: &Inner,
    key: Option<&str>,
    bytes: &[u8],
) -> Result<HashMap<String, Value>, String> {
    let record: Value = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    let mut out = HashMap::new();
    for (record_id, derived) in readings(inner, key, &record, bytes) {
        let Ok(pieces) = pieces(inner, &record, record_id.as_deref(), derived) else {
            continue;
        };
        for p in pieces {
            let id = match p.id {
                Proposed::Key(Some(s)) | Proposed::Derived(s) => s,
                Proposed::Key(None) => continue,
            };
            out.entry(id).or_insert(p.value);
        }
    }
    Ok(out)
}

/// The unit `id` of the record `bytes` hold, split as the partition split
/// it: the read-back verify does.
pub fn reread_piece(
    inner: &Inner,
    key: Option<&str>,
    bytes: &[u8],
    id: &str,
) -> Result<Value, String> {
    let record: Value = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    let readings = readings(inner, key, &record, bytes);
    // A content-derived id gains `-n` on its n-th occurrence, which the
    // record alone cannot give: an identical record's piece is the same.
    let bare = occurrence_base(id);
    let mut repeat = None;
    for (record_id, derived) in readings {
        let Ok(pieces) = pieces(inner, &record, record_id.as_deref(), derived) else {
            continue;
        };
        for p in pieces {
            let pid = match &p.id {
                Proposed::Key(Some(s)) | Proposed::Derived(s) => s.as_str(),
                Proposed::Key(None) => continue,
            };
            if pid == id {
                return Ok(p.value);
            }
            if derived && Some(pid) == bare {
                repeat.get_or_insert(p.value);
            }
        }
    }
    repeat.ok_or_else(|| format!("no unit `{id}` in the record at these bytes"))
}

/// The id an occurrence suffix (`-2`) was added to, if `id` ends in one.
fn occurrence_base(id: &str) -> Option<&str> {
    let (base, n) = id.rsplit_once('-')?;
    (!n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())).then_some(base)
}
