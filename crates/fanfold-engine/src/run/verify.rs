//! The verify phase: read every cited unit back from the stored artifact by
//! the byte range its partition recorded, recompute its hash, and check
//! evidence in the same projected view the stage judged it in. Nothing is
//! re-partitioned: read-back costs the chunks the cited units lie in.

use std::collections::{BTreeSet, HashMap};

use fanfold_core::spec::PartitionSpec;
use fanfold_core::{ContentHash, FactRecord, UnitId};
use fanfold_ops::partition::{PartitionOptions, content_hash, csv_header, partition_all, reread};
use fanfold_ops::verify::{ReadBack, VerifyReport, verify};
use fanfold_ops::view::Projector;
use fanfold_store::Store;
use serde_json::Value;

use super::ingest::{Artifact, ArtifactBytes};
use crate::plan::Plan;

struct StoredSource<'a> {
    bytes: ArtifactBytes<'a>,
    store: &'a Store,
    partition: i64,
    spec: &'a PartitionSpec,
    header: Option<Vec<u8>>,
    /// Per stage whose facts carry evidence: its projection, and how its
    /// view is rebuilt from the fact's cited units.
    projectors: EvidenceProjectors,
    /// Fields the run's stages added to units (a tool's observations):
    /// part of the view a later stage judged, so part of its evidence.
    added: HashMap<UnitId, serde_json::Map<String, Value>>,
    /// Units observations bore: their parent and the stage that bore
    /// them, which reads them back from the parent's stored observation.
    born: HashMap<UnitId, (UnitId, String)>,
    stages: &'a [Box<dyn crate::kit::Stage>],
    /// A document format's last document read back (where its line
    /// starts, and its units by id): a document's units are cited
    /// together, so it is split once, not once a unit.
    document: Option<(u64, HashMap<String, Value>)>,
    /// The last record read back whose units lie inside it (`unit_fields`,
    /// `path`), split once: a record holding many cited units is parsed
    /// once, not once a unit.
    record: Option<(u64, HashMap<String, Value>)>,
}

impl StoredSource<'_> {
    /// The unit read back; nothing is kept, so read-back of many thousand
    /// cited units holds one at a time.
    fn value(&mut self, id: &UnitId) -> Option<Value> {
        match self.read_unit(id) {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(unit = %id, error = %e, "read-back failed");
                None
            }
        }
    }

    /// The unit read back, with the fields the run's stages added.
    fn judged(&mut self, id: &UnitId) -> Option<Value> {
        let mut value = self.value(id)?;
        if let Some(added) = self.added.get(id) {
            crate::kit::table::with_fields(&mut value, added);
        }
        Some(value)
    }

    fn read_unit(&mut self, id: &UnitId) -> Result<Option<Value>, Box<dyn std::error::Error>> {
        if let Some((parent_id, by)) = self.born.get(id).cloned() {
            let Some(parent) = self.judged(&parent_id) else {
                return Ok(None);
            };
            let store = self.store;
            return Ok(self
                .stages
                .iter()
                .find(|s| s.name() == by)
                .and_then(|s| s.reread_born(store, &parent_id, &parent, id)));
        }
        let Some((start, end)) = self.store.unit_range(self.partition, id.as_str())? else {
            return Ok(None);
        };
        if let Some((at, units)) = &self.record
            && *at == start
            && let Some(value) = units.get(id.as_str())
        {
            return Ok(Some(value.clone()));
        }
        let documents = self.spec.document_glob().is_some();
        if documents
            && let Some((at, units)) = &self.document
            && *at == start
        {
            return Ok(units.get(id.as_str()).cloned());
        }
        let Some(bytes) = self.bytes.range(start, end)? else {
            return Ok(None);
        };
        if let Some(units) = fanfold_ops::partition::reread_record(self.spec, &bytes)? {
            let value = units.get(id.as_str()).cloned();
            self.record = Some((start, units));
            if value.is_some() {
                return Ok(value);
            }
            // An id with an occurrence suffix: found one by one below.
        }
        if documents {
            // Every unit of the document, numbered as the run numbered it;
            // no size limit, since the run's units passed its own.
            let whole = PartitionOptions {
                max_unit_bytes: u64::MAX,
            };
            let (units, _, _) = partition_all(self.spec, &bytes, whole)?;
            let units: HashMap<String, Value> = units
                .into_iter()
                .map(|u| (u.unit.unit_id.0, u.value))
                .collect();
            let value = units.get(id.as_str()).cloned();
            self.document = Some((start, units));
            return Ok(value);
        }
        let line = match self.spec {
            PartitionSpec::Lines { .. } => self.bytes.line_of(start)?,
            _ => 0,
        };
        Ok(Some(reread(
            self.spec,
            &bytes,
            self.header.as_deref(),
            line,
            id.as_str(),
        )?))
    }
}

impl ReadBack for StoredSource<'_> {
    fn unit_hash(&mut self, id: &UnitId) -> Option<ContentHash> {
        let spec = self.spec;
        self.value(id).map(|v| content_hash(spec, &v))
    }

    fn view(&mut self, fact: &FactRecord) -> Option<Value> {
        let projectors = std::mem::take(&mut self.projectors);
        let view = judged_view(&projectors, fact, |id| self.judged(id));
        self.projectors = projectors;
        view
    }
}

/// How a stage's view is rebuilt from a fact's cited units.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Rebuild {
    /// The first cited unit's projection alone.
    Alone,
    /// The first's, widened with the rest as its related members.
    Widened,
    /// Every cited unit's, one field per member and field (a group's).
    Grouped,
}

/// Per stage whose facts carry evidence: its projection and how its view
/// is rebuilt.
pub(crate) type EvidenceProjectors = HashMap<String, (Projector, Rebuild)>;

/// Each stage whose facts quote what their context showed: its projection,
/// and how its view is rebuilt from the fact's cited units.
pub(crate) fn evidence_projectors(plan: &Plan) -> EvidenceProjectors {
    plan.stages
        .iter()
        .filter_map(|s| {
            let v = s.evidence_view()?;
            let p = Projector::compile(s.name(), v.project.as_deref(), &v.fields).ok()?;
            let rebuild = match (v.grouped, v.widened) {
                (true, _) => Rebuild::Grouped,
                (false, true) => Rebuild::Widened,
                (false, false) => Rebuild::Alone,
            };
            Some((s.name().to_owned(), (p, rebuild)))
        })
        .collect()
}

/// The view `fact` was judged in, rebuilt from its cited units as `unit`
/// reads them back: the first unit's projection, widened with the rest's
/// where its stage widens; every unit's, in order, where its stage groups.
pub(crate) fn judged_view(
    projectors: &EvidenceProjectors,
    fact: &FactRecord,
    mut unit: impl FnMut(&UnitId) -> Option<Value>,
) -> Option<Value> {
    let (first, members) = fact.source_ids.split_first()?;
    let (projector, rebuild) = projectors.get(&fact.stage)?;
    if *rebuild == Rebuild::Grouped {
        let mut shown = Vec::with_capacity(fact.source_ids.len());
        for id in &fact.source_ids {
            shown.push((
                id.0.clone(),
                projector.project(id.as_str(), &unit(id)?).ok()?,
            ));
        }
        return fanfold_ops::group::group_view(shown).ok().map(|g| g.view);
    }
    let view = projector.project(first.as_str(), &unit(first)?).ok()?;
    if *rebuild == Rebuild::Alone {
        return Some(view);
    }
    let mut related = Vec::with_capacity(members.len());
    for id in members {
        let member = projector.project(id.as_str(), &unit(id)?).ok()?;
        related.push((id.0.clone(), member));
    }
    fanfold_ops::widen::widened_view(view, related).ok()
}

/// What verify reads back and re-checks: the stored source, the decided
/// facts and the units the answer cites, and the fold the answer states.
pub struct Checked<'a> {
    pub artifact: &'a Artifact,
    pub partition: i64,
    /// Every fact of the answer, in the fold's order.
    pub facts: &'a [&'a FactRecord],
    pub cited: &'a BTreeSet<UnitId>,
    pub added: HashMap<UnitId, serde_json::Map<String, Value>>,
    /// Units observations bore (`born_of`).
    pub born: HashMap<UnitId, (UnitId, String)>,
    pub root: &'a fanfold_ops::fold::FoldValue,
}

/// Each bred unit's parent and the stage whose observation bore it: where
/// verify reads it back from.
pub fn born_of(table: &crate::kit::UnitTable) -> HashMap<UnitId, (UnitId, String)> {
    table
        .bred()
        .into_iter()
        .filter_map(|(i, l)| {
            Some((
                table.id(i).ok()?.clone(),
                (table.id(l.parent).ok()?.clone(), l.stage.clone()),
            ))
        })
        .collect()
}

pub fn verify_stored(plan: &Plan, store: &Store, checked: Checked<'_>) -> VerifyReport {
    let Checked {
        artifact,
        partition,
        facts,
        cited,
        added,
        born,
        root,
    } = checked;
    let mut bytes = ArtifactBytes::new(store, artifact);
    let spec = &plan.spec.input.partition;
    let header = match spec {
        PartitionSpec::Csv { delimiter, .. } => {
            let start = bytes
                .range(0, artifact.len.min(1 << 16))
                .ok()
                .flatten()
                .unwrap_or_default();
            csv_header(&start, delimiter.as_deref()).map(<[u8]>::to_vec)
        }
        _ => None,
    };
    let projectors = evidence_projectors(plan);
    let mut source = StoredSource {
        bytes,
        store,
        partition,
        spec,
        header,
        projectors,
        added,
        born,
        stages: &plan.stages,
        document: None,
        record: None,
    };
    let decided: Vec<&FactRecord> = facts
        .iter()
        .copied()
        .filter(|f| f.status.is_cacheable())
        .collect();
    let mut report = verify(
        &mut source,
        &decided,
        cited,
        plan.spec.verify.negative_sample,
        plan.spec.verify.seed,
    );
    // The numbers, from the facts alone; a unit field a reducer reads is
    // read back from the source too, one unit at a time.
    let read = super::unit_pointers(&plan.spec.fold);
    let leaves = facts.iter().map(|f| {
        let unit = match f.source_ids.first() {
            Some(id) if !read.is_empty() => source
                .judged(id)
                .map_or(Value::Null, |v| super::unit_fields(&read, &v)),
            _ => Value::Null,
        };
        super::leaf_of(f, unit)
    });
    fanfold_ops::verify::recheck_numbers(&plan.spec.fold, root, leaves, &mut report);
    report
}
