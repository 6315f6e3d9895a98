//! Ids, duplicates and coverage: every format's elements pass through the
//! one [`Assigner`], so a rejection reads the same whatever the format.

use std::collections::{BTreeMap, HashMap, HashSet};

use fanfold_core::UnitId;

use super::*;

/// The unit an id was given to: where it is and what it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnitPlace {
    pub ordinal: u64,
    /// Where its bytes start in the source.
    pub byte: u64,
    pub unit_hash: ContentHash,
}

/// Remembers the ids given so far, to tell a repeat from a first
/// occurrence, and a repeat's earlier unit, to tell an identical repeat
/// from a conflicting one. The engine's implementation keeps compact
/// fingerprints and asks the store, so it stays exact and small at any
/// size; [`SeenKeys`] keeps everything in memory.
pub trait SeenIds {
    /// Claims `id` for the element at `place`, which is about to become a
    /// unit: `None` when no earlier element holds it (it is now this
    /// one's), else the earlier unit that does.
    fn claim(&mut self, id: &str, place: UnitPlace) -> Result<Option<UnitPlace>, PartitionError>;
}

/// Why a repeated key with other content is rejected, naming both places.
/// Keys compare as text, so a number and the string of its digits are one
/// id, which the message says where it may be the cause.
fn repeat_detail(ordinal: u64, byte: u64, key: &str, id: &str, first: &UnitPlace) -> String {
    let mut detail = format!(
        "element {ordinal} at byte {byte} repeats {key} = {id} of element {} at byte {} with \
         other content; the first occurrence is kept and this element is not judged",
        first.ordinal, first.byte
    );
    if canonical_u64(id).is_some() {
        detail.push_str(&format!(
            " (keys compare as text: {id} and \"{id}\" are one id)"
        ));
    }
    detail
}

/// The id of the `n`-th occurrence (from 1) of a content-derived id: the
/// first keeps it, later ones gain `-n`, which an edit elsewhere in the
/// source cannot shift.
pub(super) fn content_id(
    seen: &mut dyn SeenIds,
    base: String,
    place: UnitPlace,
) -> Result<String, PartitionError> {
    if seen.claim(&base, place)?.is_none() {
        return Ok(base);
    }
    let mut n = 2u64;
    loop {
        let id = format!("{base}-{n}");
        if seen.claim(&id, place)?.is_none() {
            return Ok(id);
        }
        n += 1;
    }
}

/// How an element proposes its id.
pub(super) enum Proposed {
    /// The scalar value of the record's key field, `None` when it has none.
    Key(Option<String>),
    /// An id derived from the element's content or its place (a path, a
    /// heading path): a repeat gains `-n` rather than being rejected.
    Derived(String),
}

/// The scalar a key field holds, as an id: keys compare as text.
pub(super) fn scalar_id(value: Option<&Value>) -> Option<String> {
    match value? {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// Assigns ids and tracks duplicates and coverage while elements stream
/// by, for every format: each element is counted once, and is either a
/// unit or a [`Rejection`] whose reason and wording do not depend on the
/// format it came from.
pub(super) struct Assigner<'a> {
    pub kind: &'a str,
    pub key: Option<&'a str>,
    pub source_hash: ContentHash,
    pub max_unit_bytes: u64,
    pub seen: &'a mut dyn SeenIds,
    pub coverage: Coverage,
}

impl<'a> Assigner<'a> {
    pub fn new(
        kind: &'a str,
        key: Option<&'a str>,
        source_hash: ContentHash,
        options: PartitionOptions,
        seen: &'a mut dyn SeenIds,
    ) -> Self {
        Assigner {
            kind,
            key,
            source_hash,
            max_unit_bytes: options.max_unit_bytes,
            seen,
            coverage: Coverage::default(),
        }
    }

    /// An element that cannot become a unit, counted and explained;
    /// `detail` is given the element's ordinal.
    pub fn reject(
        &mut self,
        bytes: ByteRange,
        reason: &str,
        detail: impl FnOnce(u64) -> String,
    ) -> Rejection {
        let ordinal = self.coverage.elements;
        self.coverage.elements += 1;
        self.coverage.rejected += 1;
        Rejection {
            ordinal,
            bytes,
            reason: reason.to_owned(),
            detail: detail(ordinal),
        }
    }

    /// An element over the unit limit.
    pub fn too_large(&mut self, bytes: ByteRange, size: u64) -> Rejection {
        let max = self.max_unit_bytes;
        self.reject(bytes, "too_large", |ordinal| {
            format!(
                "element {ordinal} at bytes {}..{} is {size} bytes, over the {max}-byte unit limit; \
                 raise --max-unit-bytes or split the record",
                bytes.start, bytes.end,
            )
        })
    }

    /// A record without a scalar key field.
    pub fn missing_key(&mut self, bytes: ByteRange) -> Rejection {
        let key = self.key.unwrap_or("id");
        self.reject(bytes, "missing_key", |ordinal| {
            format!(
                "element {ordinal} at byte {} has no scalar `{key}` field",
                bytes.start
            )
        })
    }

    /// A record an object of which holds one field name twice: JSON
    /// leaves which value counts undefined, so nobody could say what the
    /// record holds.
    pub fn repeated_field(&mut self, bytes: ByteRange, line: u64, name: &str) -> Rejection {
        self.reject(bytes, "repeated_field", |ordinal| {
            format!(
                "element {ordinal} at byte {} (line {line}) holds the field {name:?} twice in one \
                 object; JSON leaves which value counts undefined (a reader would silently keep \
                 one), so the record is not judged: remove or rename one of them",
                bytes.start
            )
        })
    }

    /// The unit an element of `size` bytes at `bytes` becomes, a repeat of
    /// an earlier unit, or why it cannot become one.
    pub fn admit(
        &mut self,
        bytes: ByteRange,
        size: u64,
        id: Proposed,
        unit_hash: ContentHash,
    ) -> Result<Admitted, PartitionError> {
        if size > self.max_unit_bytes {
            return Ok(Admitted::Rejected(self.too_large(bytes, size)));
        }
        let ordinal = self.coverage.elements;
        let place = UnitPlace {
            ordinal,
            byte: bytes.start,
            unit_hash,
        };
        let key = self.key.unwrap_or("id");
        let id = match id {
            Proposed::Key(None) => return Ok(Admitted::Rejected(self.missing_key(bytes))),
            Proposed::Key(Some(id)) => {
                if let Some(flaw) = key_flaw(&id) {
                    return Ok(Admitted::Rejected(self.reject(
                        bytes,
                        "bad_key",
                        |ordinal| {
                            format!(
                                "element {ordinal} at byte {}: its `{key}` {flaw}",
                                bytes.start
                            )
                        },
                    )));
                }
                match self.seen.claim(&id, place)? {
                    None => id,
                    // The same record again (a file concatenated twice, an
                    // export that repeats rows): the unit it repeats
                    // stands for it, so nothing is left unjudged.
                    Some(first) if first.unit_hash == unit_hash => {
                        return Ok(Admitted::Repeat(self.repeat(bytes, key, id, first)));
                    }
                    Some(first) => {
                        return Ok(Admitted::Rejected(self.reject(
                            bytes,
                            "duplicate_key",
                            |ordinal| repeat_detail(ordinal, bytes.start, key, &id, &first),
                        )));
                    }
                }
            }
            Proposed::Derived(base) => {
                if let Some(flaw) = key_flaw(&base) {
                    return Ok(Admitted::Rejected(self.reject(
                        bytes,
                        "bad_key",
                        |ordinal| {
                            format!("element {ordinal} at byte {}: its id {flaw}", bytes.start)
                        },
                    )));
                }
                content_id(self.seen, base, place)?
            }
        };
        self.coverage.elements += 1;
        self.coverage.units += 1;
        Ok(Admitted::Unit(Unit {
            unit_id: UnitId(id),
            unit_kind: self.kind.to_owned(),
            ordinal,
            source_hash: self.source_hash,
            unit_hash,
            bytes,
        }))
    }

    /// An element that repeats the unit `first` exactly, counted.
    fn repeat(&mut self, bytes: ByteRange, key: &str, id: String, first: UnitPlace) -> Repeat {
        let ordinal = self.coverage.elements;
        self.coverage.elements += 1;
        self.coverage.repeated_identical += 1;
        Repeat {
            ordinal,
            bytes,
            detail: format!(
                "element {ordinal} at byte {} repeats element {} at byte {} exactly ({key} = {id}, \
                 the same content): it is that unit, judged once",
                bytes.start, first.ordinal, first.byte
            ),
            unit_id: id,
            first_ordinal: first.ordinal,
            first_byte: first.byte,
        }
    }

    /// A parsed record: its id is its key field's value, or without a key
    /// derived from its content hash.
    pub fn element(
        &mut self,
        value: Value,
        bytes: ByteRange,
        canonical: ContentHash,
    ) -> Result<Element, PartitionError> {
        let id = match self.key {
            Some(key) => Proposed::Key(scalar_id(value.get(key))),
            None => Proposed::Derived(format!("c{}", canonical.short(16))),
        };
        self.element_with_id(id, value, bytes, canonical)
    }

    /// [`Assigner::element`] with the id already proposed.
    pub fn element_with_id(
        &mut self,
        id: Proposed,
        value: Value,
        bytes: ByteRange,
        canonical: ContentHash,
    ) -> Result<Element, PartitionError> {
        Ok(self
            .admit(bytes, bytes.len(), id, canonical)?
            .with_value(value))
    }
}

/// What [`Assigner::admit`] made of an element.
pub(super) enum Admitted {
    Unit(Unit),
    Rejected(Rejection),
    Repeat(Repeat),
}

impl Admitted {
    /// The element, a unit holding `value`.
    pub fn with_value(self, value: Value) -> Element {
        match self {
            Admitted::Unit(unit) => Element::Unit(PartUnit { unit, value }),
            Admitted::Rejected(r) => Element::Rejected(r),
            Admitted::Repeat(r) => Element::Repeated(r),
        }
    }
}

/// Why a record's key cannot be a unit id, if it cannot: an id is shown
/// to people (answer.md, the report, citations), so it must be visible and
/// read the way it is stored. An empty id cites nothing; a control
/// character (a NUL, a newline) vanishes or breaks a line; a bidirectional
/// control (U+202E and its kin) makes the text around it read in another
/// order than it is.
pub fn key_flaw(id: &str) -> Option<String> {
    if id.is_empty() {
        return Some("is empty".into());
    }
    let (at, c) = id.char_indices().find(|&(_, c)| {
        c.is_control()
            || matches!(c, '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
    })?;
    let what = if c.is_control() {
        "a control character"
    } else {
        "a bidirectional control character"
    };
    Some(format!(
        "holds {what} (U+{:04X}) at byte {at}",
        u32::from(c)
    ))
}

/// Ids seen so far, each with the unit it was given to, all in memory and
/// exact. Decimal-integer ids, the common key, cost their unit's place (56
/// bytes) in a list in claim order, searched by halves while they come in
/// ascending order and through an index built on the first repeat
/// otherwise; other ids cost themselves and their place in a map.
/// (`fanfold run` keeps a [`CompactSeen`] instead, nothing per unit, and
/// asks the store for a repeat's earlier unit.)
pub struct SeenKeys {
    int_runs: IntRuns,
    int_places: Vec<(u64, UnitPlace)>,
    /// Whether `int_places` is sorted by id.
    ascending: bool,
    int_index: Option<HashMap<u64, usize>>,
    others: HashMap<Box<str>, UnitPlace>,
}

impl Default for SeenKeys {
    fn default() -> Self {
        SeenKeys {
            int_runs: IntRuns::default(),
            int_places: Vec::new(),
            ascending: true,
            int_index: None,
            others: HashMap::new(),
        }
    }
}

impl SeenKeys {
    /// The unit integer id `n`, claimed before, was given to.
    fn int_place(&mut self, n: u64) -> Option<UnitPlace> {
        let places = &self.int_places;
        let at = if self.ascending {
            places.binary_search_by_key(&n, |p| p.0).ok()?
        } else {
            let index = self.int_index.get_or_insert_with(|| {
                places
                    .iter()
                    .enumerate()
                    .map(|(i, (id, _))| (*id, i))
                    .collect()
            });
            *index.get(&n)?
        };
        places.get(at).map(|p| p.1)
    }
}

impl SeenIds for SeenKeys {
    fn claim(&mut self, id: &str, place: UnitPlace) -> Result<Option<UnitPlace>, PartitionError> {
        let Some(n) = canonical_u64(id) else {
            let earlier = self.others.entry(id.into()).or_insert(place);
            return Ok((*earlier != place).then_some(*earlier));
        };
        if !self.int_runs.insert(n) {
            return Ok(self.int_place(n));
        }
        if self.int_places.last().is_some_and(|last| last.0 > n) {
            self.ascending = false;
        }
        if let Some(index) = self.int_index.as_mut() {
            index.insert(n, self.int_places.len());
        }
        self.int_places.push((n, place));
        Ok(None)
    }
}

/// Decimal-integer ids seen so far, as runs of consecutive numbers, so a
/// source with sequential ids costs a few bytes in all.
#[derive(Default)]
pub struct IntRuns {
    /// Run start -> run end (inclusive); runs neither overlap nor touch.
    pub(super) runs: BTreeMap<u64, u64>,
}

impl IntRuns {
    /// False when `n` was seen before.
    pub fn insert(&mut self, n: u64) -> bool {
        let before = self.runs.range(..=n).next_back().map(|(&s, &e)| (s, e));
        if let Some((_, end)) = before
            && n <= end
        {
            return false;
        }
        let joins_before = before.filter(|&(_, end)| end + 1 == n).map(|(s, _)| s);
        let after = n
            .checked_add(1)
            .and_then(|next| self.runs.get(&next).map(|&end| (next, end)));
        match (joins_before, after) {
            (Some(start), Some((next, end))) => {
                self.runs.remove(&next);
                self.runs.insert(start, end);
            }
            (Some(start), None) => {
                self.runs.insert(start, n);
            }
            (None, Some((next, end))) => {
                self.runs.remove(&next);
                self.runs.insert(n, end);
            }
            (None, None) => {
                self.runs.insert(n, n);
            }
        }
        true
    }
}

/// The number an id spells, when the id is exactly that number's
/// decimal form (so `7` and `07` stay different ids).
fn canonical_u64(id: &str) -> Option<u64> {
    let b = id.as_bytes();
    if b.is_empty() || (b.len() > 1 && b.starts_with(b"0")) || !b.iter().all(u8::is_ascii_digit) {
        return None;
    }
    id.parse().ok()
}

/// Finds the unit an earlier element was given an id to, for an id whose
/// run or fingerprint was seen before (fingerprints of different ids can
/// collide; a run hit is certain, but only the store knows the content).
pub trait ConfirmRepeat {
    /// The unit before `ordinal` that has `id`, if one does.
    fn earlier(&mut self, id: &str, ordinal: u64) -> Result<Option<UnitPlace>, PartitionError>;
}

/// Ids in little memory, exactly: decimal-integer ids as runs
/// ([`IntRuns`]), every other id as a 64-bit fingerprint. A hit is settled
/// through [`ConfirmRepeat`] (the engine asks the store), so a collision
/// never makes a unit a repeat, and an identical repeat is told from a
/// conflicting one by the earlier unit's stored hash. Memory is 8 bytes and
/// change per non-integer id, not the id itself, and nothing per unit's
/// content: the store is asked only on a hit, which is rare.
pub struct CompactSeen<C> {
    runs: IntRuns,
    fingerprints: HashSet<u64>,
    confirm: C,
}

impl<C: ConfirmRepeat> CompactSeen<C> {
    pub fn new(confirm: C) -> Self {
        CompactSeen {
            runs: IntRuns::default(),
            fingerprints: HashSet::new(),
            confirm,
        }
    }
}

impl<C: ConfirmRepeat> SeenIds for CompactSeen<C> {
    fn claim(&mut self, id: &str, place: UnitPlace) -> Result<Option<UnitPlace>, PartitionError> {
        if let Some(n) = canonical_u64(id) {
            if self.runs.insert(n) {
                return Ok(None);
            }
            // The runs are exact: an earlier unit has this id, and the
            // store must know it.
            return match self.confirm.earlier(id, place.ordinal)? {
                Some(first) => Ok(Some(first)),
                None => Err(PartitionError::Io(std::io::Error::other(format!(
                    "id {id} was given to an earlier element, but the store holds no unit \
                     before element {} with it",
                    place.ordinal
                )))),
            };
        }
        let digest = ContentHash::of_bytes(id.as_bytes());
        let mut fp = [0u8; 8];
        fp.copy_from_slice(&digest.0[..8]);
        if self.fingerprints.insert(u64::from_le_bytes(fp)) {
            return Ok(None);
        }
        self.confirm.earlier(id, place.ordinal)
    }
}
