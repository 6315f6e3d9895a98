//! Units bred from observations: a record of a tool's observation (a page
//! of comments, a list of linked issues) that re-enters the run as a unit
//! of its own, one level deeper than the unit whose observation bore it.
//! A stage hands what it bore back in its outcome; the run adds it to the
//! table and queues it for the named stage. Here are the types they pass,
//! and the tree's shape as the certificate states it.

use std::collections::BTreeMap;

use fanfold_core::spec::BudgetSpec;
use fanfold_core::{ContentHash, FactRecord, Status, Unit};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::table::UnitTable;

/// The prefix of the reason a unit left `not_run` by its level's spend
/// carries; the level follows (`budget_exhausted:level_model_calls:1`).
pub const LEVEL_SPENT: &str = "budget_exhausted:level_model_calls";

/// One unit an observation bore.
#[derive(Clone, Debug)]
pub struct Born {
    pub unit: Unit,
    /// Its value, as JSON text.
    pub json: Vec<u8>,
}

/// What one unit's observation bore, and what the limits dropped.
#[derive(Clone, Debug)]
pub struct Litter {
    /// The table position of the parent.
    pub parent: usize,
    /// The stage its units go to.
    pub to: String,
    pub born: Vec<Born>,
    /// (record id, reason) of every record not born: `max_depth`,
    /// `max_fanout`, `repeated_key`, `taken` (an id the table holds).
    pub dropped: Vec<(String, String)>,
}

/// A record an observation offered that never became a unit.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DroppedRecord {
    pub parent: String,
    pub id: String,
    pub reason: String,
}

/// What one level spent and what its limit left unrun.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LevelSpend {
    pub depth: u32,
    pub units: u64,
    pub model_calls: u64,
    /// Its `budget.per_level` limit, if it has one.
    pub max_model_calls: Option<u64>,
    /// Units the spent limit ended `not_run`.
    pub not_run: u64,
}

/// The shape of the tree of units a run bred: how many units at each
/// depth, how many records each parent's observation offered and bore,
/// and what each limit cut.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TreeShape {
    /// Units at each depth, the input's own first.
    pub units_by_depth: Vec<u64>,
    /// Units whose observation was read for records.
    pub parents: u64,
    /// Records offered per parent, before any limit.
    pub offered_max: u64,
    pub offered_mean: f64,
    /// Units born per parent, after the limits.
    pub fanout_max: u64,
    pub fanout_mean: f64,
    /// Records dropped, by reason (`max_depth`, `max_fanout`, ...), and
    /// units a level's spent budget left unrun (`per_level`).
    pub cut: BTreeMap<String, u64>,
    /// Each level's spend, where a level has a limit or bred units.
    pub levels: Vec<LevelSpend>,
    /// The first dropped records in full (all are counted in `cut`).
    pub dropped: Vec<DroppedRecord>,
    pub limits: TreeLimits,
}

/// The limits the tree grew under.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TreeLimits {
    pub max_depth: Option<u32>,
    pub max_fanout: Option<u64>,
}

/// The most dropped records listed in full.
const DROPPED_LISTED: usize = 100;

/// Counts a run's litters as the run takes them.
#[derive(Default)]
pub struct Nursery {
    parents: u64,
    offered: Vec<u64>,
    fanout: Vec<u64>,
    cut: BTreeMap<String, u64>,
    dropped: Vec<DroppedRecord>,
}

impl Nursery {
    /// Notes one parent's litter (`parent` its id).
    pub fn note(&mut self, parent: &str, litter: &Litter) {
        self.parents += 1;
        let born = litter.born.len() as u64;
        self.offered.push(born + litter.dropped.len() as u64);
        self.fanout.push(born);
        for (id, reason) in &litter.dropped {
            *self.cut.entry(reason.clone()).or_insert(0) += 1;
            if self.dropped.len() < DROPPED_LISTED {
                self.dropped.push(DroppedRecord {
                    parent: parent.to_owned(),
                    id: id.clone(),
                    reason: reason.clone(),
                });
            }
        }
    }

    /// The tree's shape, once every stage ran: `depths` the depth of each
    /// unit in the table, `facts` the run's facts by table position,
    /// `level_calls` the model calls each level made. `None` when nothing
    /// was bred and no level limit was declared.
    pub fn shape(
        self,
        budget: &BudgetSpec,
        depths: &[u32],
        facts: &[(usize, FactRecord)],
        level_calls: &[u64],
    ) -> Option<TreeShape> {
        if self.parents == 0 && budget.per_level.is_empty() && budget.max_depth.is_none() {
            return None;
        }
        let mut units_by_depth = Vec::new();
        for &d in depths {
            let d = d as usize;
            if units_by_depth.len() <= d {
                units_by_depth.resize(d + 1, 0);
            }
            if let Some(n) = units_by_depth.get_mut(d) {
                *n += 1;
            }
        }
        let mut cut = self.cut;
        let mut unrun_by_level: BTreeMap<u32, u64> = BTreeMap::new();
        for (i, f) in facts {
            if f.status == Status::NotRun
                && f.reason
                    .as_deref()
                    .is_some_and(|r| r.starts_with(LEVEL_SPENT))
            {
                let depth = depths.get(*i).copied().unwrap_or(0);
                *unrun_by_level.entry(depth).or_insert(0) += 1;
            }
        }
        let unrun: u64 = unrun_by_level.values().sum();
        if unrun > 0 {
            cut.insert("per_level".into(), unrun);
        }
        let deepest = units_by_depth
            .len()
            .max(budget.per_level.len())
            .max(level_calls.len());
        let levels = (0..deepest)
            .map(|d| LevelSpend {
                depth: d as u32,
                units: units_by_depth.get(d).copied().unwrap_or(0),
                model_calls: level_calls.get(d).copied().unwrap_or(0),
                max_model_calls: budget.per_level.get(d).and_then(|l| l.max_model_calls),
                not_run: unrun_by_level.get(&(d as u32)).copied().unwrap_or(0),
            })
            .collect();
        let mean = |v: &[u64]| {
            if v.is_empty() {
                0.0
            } else {
                v.iter().sum::<u64>() as f64 / v.len() as f64
            }
        };
        Some(TreeShape {
            units_by_depth,
            parents: self.parents,
            offered_max: self.offered.iter().copied().max().unwrap_or(0),
            offered_mean: mean(&self.offered),
            fanout_max: self.fanout.iter().copied().max().unwrap_or(0),
            fanout_mean: mean(&self.fanout),
            cut,
            levels,
            dropped: self.dropped,
            limits: TreeLimits {
                max_depth: budget.max_depth,
                max_fanout: budget.max_fanout,
            },
        })
    }
}

impl TreeShape {
    /// One line for answer.md and `fanfold explain` after a run: units
    /// per depth, fan-out observed, what each limit cut.
    pub fn line(&self) -> String {
        let depths: Vec<String> = self
            .units_by_depth
            .iter()
            .enumerate()
            .map(|(d, n)| format!("depth {d}: {n}"))
            .collect();
        let cut = if self.cut.is_empty() {
            "nothing cut".to_owned()
        } else {
            let parts: Vec<String> = self.cut.iter().map(|(k, n)| format!("{k} {n}")).collect();
            format!("cut: {}", parts.join(", "))
        };
        format!(
            "units {}; {} parents offered at most {} records (mean {:.2}) and bore at most {} (mean {:.2}); {cut}",
            depths.join(", "),
            self.parents,
            self.offered_max,
            self.offered_mean,
            self.fanout_max,
            self.fanout_mean,
        )
    }
}

/// One bred unit as `bred.jsonl` holds it: what `fanfold verify` needs to
/// put it back beside the source's units (the record itself, since the
/// tool is never asked again) and to check it (its id derives from its
/// parent and record, its hash from its record, its depth from its
/// parent's).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BredLine {
    pub id: String,
    pub parent: String,
    pub depth: u32,
    /// The stage whose observation bore it.
    pub stage: String,
    pub kind: String,
    pub unit_hash: ContentHash,
    /// The stored observation it came from.
    pub observation: ContentHash,
    pub record: Value,
}

/// The table's bred units, in table order (a parent before its children).
pub fn bred_lines(table: &UnitTable) -> Vec<BredLine> {
    table
        .bred()
        .into_iter()
        .filter_map(|(i, l)| {
            let unit = table.unit(i).ok()?;
            Some(BredLine {
                id: unit.unit_id.0.clone(),
                parent: table.id(l.parent).ok()?.0.clone(),
                depth: l.depth,
                stage: l.stage.clone(),
                kind: unit.unit_kind.clone(),
                unit_hash: unit.unit_hash,
                observation: unit.source_hash,
                record: table.raw_value(i),
            })
        })
        .collect()
}

/// What a stage's stored observations would bear, as `fanfold explain`
/// tells it before a run: the input's own units only (what their bred
/// units bear in turn is known once they are read).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BredPreview {
    /// The stage the bred units go to.
    pub to: String,
    /// Units whose observation is stored and was read for records.
    pub parents: u64,
    pub born: u64,
    /// The most one parent bears.
    pub most: u64,
    /// Records the limits would drop, by reason.
    pub cut: BTreeMap<String, u64>,
}

impl BredPreview {
    /// Counts one parent's litter.
    pub fn note(&mut self, litter: &Litter) {
        self.parents += 1;
        let born = litter.born.len() as u64;
        self.born += born;
        self.most = self.most.max(born);
        for (_, why) in &litter.dropped {
            *self.cut.entry(why.clone()).or_insert(0) += 1;
        }
    }

    /// `explain`'s line under the stage.
    pub fn line(&self) -> String {
        let cut = if self.cut.is_empty() {
            String::new()
        } else {
            let parts: Vec<String> = self.cut.iter().map(|(k, n)| format!("{k} {n}")).collect();
            format!("; the limits drop {}", parts.join(", "))
        };
        format!(
            "{} of its stored observations bear {} units (depth 1) for `{}`, at most {} a unit{cut}",
            self.parents, self.born, self.to, self.most
        )
    }
}
