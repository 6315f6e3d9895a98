//! The group stage: groups as units.
//!
//! The units the stage receives are gathered into groups (an equal key, a
//! time window, or near-duplicate text by MinHash and word-shingle
//! Jaccard), each of at most `max_members`, a larger one split in its own
//! order into even parts. Each group of two or more is judged in ONE
//! context by the stage's judge, through the kit's model turn, and its
//! fact is about the group ("these issues are duplicates of each other").
//! The fact stands for the group's first member and cites every member
//! with its hash; its evidence must quote each member's own fields, and a
//! fact that leaves a member unquoted is an error for the group. The
//! group's other members carry its decision as derived facts; a unit alone
//! in its group is not judged. A group's fact is keyed by its view (every
//! member's id and projected view, the stage's meaning, the model), so a
//! rerun pays nothing and an edit to one member re-judges only its group.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::Path;

use fanfold_core::spec::Spec;
use fanfold_core::spec::group::GroupStageSpec;
use fanfold_core::{
    ContentHash, Cost, FACT_SCHEMA, FactRecord, ModelParams, StableHasher, Status, UnitId,
};
use fanfold_ops::contract::Controller;
use fanfold_ops::group::{Gathered, Gathering, GroupView, gather, group_view, shingles, view_text};
use fanfold_ops::jq::{JqProgram, Site, to_val};
use fanfold_ops::view::Projector;
use fanfold_store::Store;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{PlanError, RunError, project_err};
use crate::kit::{
    BuildContext, CachedCount, Calls, EvidenceView, FactLedger, Origin, Outputs, RunStats, Shape,
    Stage, StageContext, StageOutcome, Turn, UnitTable, Views,
};

/// The key of group stages' reports in the run's stats.
pub const REPORT: &str = "groups";

/// The namespace of the keys of the facts a group stage derives (members
/// past the first, units alone): never stored, named for the file.
const DERIVED_KEYS: fanfold_core::Bucket = fanfold_core::Bucket::Kind("group-derived-v1");

pub struct GroupRunner {
    pub spec: GroupStageSpec,
    judge: Turn,
    by: By,
}

/// How the stage gathers units.
enum By {
    Key(JqProgram),
    Time { program: JqProgram, window: f64 },
    Similar { min_jaccard: f64, words: usize },
}

impl By {
    fn describe(&self) -> String {
        match self {
            By::Key(p) => format!("key `{}`", p.source()),
            By::Time { program, window } => {
                format!(
                    "time `{}`, {window} s from each group's earliest",
                    program.source()
                )
            }
            By::Similar { min_jaccard, words } => format!(
                "near-duplicate text (Jaccard of {words}-word shingles >= {min_jaccard}, candidates by MinHash)"
            ),
        }
    }
}

/// What a group stage did, for the certificate.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GroupReport {
    /// How units are gathered, as `explain` says it.
    pub by: String,
    pub max_members: u64,
    /// Units sent to the stage.
    pub units: u64,
    /// Groups judged (each part of a split group counted).
    pub groups: u64,
    /// Units in them.
    pub grouped: u64,
    /// Members of the largest group judged.
    pub largest: u64,
    /// Units alone in their group: not judged.
    pub alone: u64,
    /// Units with no group (no key, no time, no text).
    pub ungrouped: u64,
    /// Each group over the bound: its first unit, its size and its parts.
    pub split: Vec<String>,
    /// Each group whose fact left a member unquoted: its first unit and
    /// the members left out.
    pub uncited: Vec<String>,
    /// Groups whose fact was reused from the store.
    pub cached: u64,
    /// Model calls the stage made.
    pub calls: u64,
}

impl GroupRunner {
    pub fn build(g: &GroupStageSpec, ctx: &mut BuildContext<'_>) -> Result<GroupRunner, PlanError> {
        let name = &g.name;
        if g.max_members < fanfold_ops::group::MIN_BOUND {
            return Err(ctx.invalid(format!(
                "group `{name}`: max_members must be at least {}, so no part of a split group is left alone",
                fanfold_ops::group::MIN_BOUND
            )));
        }
        if g.judge.canaries.is_some() || g.judge.widen.is_some() {
            return Err(ctx.invalid(format!(
                "group `{name}`: its judge takes no canaries and widens no further"
            )));
        }
        if g.judge.evidence.is_none() {
            return Err(ctx.invalid(format!(
                "group `{name}`: its judge must set `evidence`: a group's fact quotes every member"
            )));
        }
        let b = &g.by;
        let declared = [b.key.is_some(), b.time.is_some(), b.min_jaccard.is_some()];
        if declared.iter().filter(|d| **d).count() != 1 {
            return Err(ctx.invalid(format!(
                "group `{name}`: [stages.by] must set exactly one of key, time or min_jaccard"
            )));
        }
        let compile = |ctx: &BuildContext<'_>, what: &str, expr: &str| {
            JqProgram::compile(expr)
                .map_err(|e| ctx.invalid(format!("group `{name}` by {what}: {e}")))
        };
        let by = if let Some(expr) = &b.key {
            By::Key(compile(ctx, "key", expr)?)
        } else if let Some(expr) = &b.time {
            let window = b.window_secs.filter(|s| *s > 0.0).ok_or_else(|| {
                ctx.invalid(format!(
                    "group `{name}` by time needs window_secs, a number of seconds above 0"
                ))
            })?;
            By::Time {
                program: compile(ctx, "time", expr)?,
                window,
            }
        } else {
            let min_jaccard = b
                .min_jaccard
                .filter(|m| *m > 0.0 && *m <= 1.0)
                .ok_or_else(|| {
                    ctx.invalid(format!(
                        "group `{name}` by min_jaccard needs a similarity within (0, 1]"
                    ))
                })?;
            if b.shingle_words == 0 {
                return Err(
                    ctx.invalid(format!("group `{name}`: shingle_words must be at least 1"))
                );
            }
            By::Similar {
                min_jaccard,
                words: b.shingle_words,
            }
        };
        let mut judge = g.judge.clone();
        judge.name = g.name.clone();
        Ok(GroupRunner {
            spec: g.clone(),
            judge: Turn::build_judge(&judge, ctx)?,
            by,
        })
    }

    fn project(
        &self,
        projector: &Projector,
        table: &UnitTable,
        i: usize,
    ) -> Result<Value, RunError> {
        projector
            .project(table.id(i)?.as_str(), &table.value(i))
            .map_err(project_err)
    }

    /// The groups of `units` (table positions in source order), as indexes
    /// into `units`.
    fn gathered(&self, table: &UnitTable, units: &[usize]) -> Result<Gathered, RunError> {
        let err = |i: usize, detail: String| match table.id(i) {
            Ok(id) => RunError::Project {
                stage: self.spec.name.clone(),
                unit: id.to_string(),
                detail,
            },
            Err(e) => e,
        };
        let eval = |program: &JqProgram, i: usize| -> Result<Option<Value>, RunError> {
            program
                .first_json(
                    to_val(&table.value(i)),
                    Site::new("group by", table.id(i)?.as_str()),
                )
                .map_err(|e| err(i, format!("by `{}`: {e}", program.source())))
        };
        let by = match &self.by {
            By::Key(program) => Gathering::Key(
                units
                    .iter()
                    .map(|&i| {
                        Ok(eval(program, i)?
                            .as_ref()
                            .and_then(fanfold_ops::widen::key_text))
                    })
                    .collect::<Result<_, RunError>>()?,
            ),
            By::Time { program, window } => Gathering::Time {
                at: units
                    .iter()
                    .map(|&i| match eval(program, i)? {
                        None | Some(Value::Null) => Ok(None),
                        Some(Value::Number(n)) => Ok(n.as_f64()),
                        Some(other) => Err(err(
                            i,
                            format!(
                                "the group time must be seconds as a number (`fromdate` reads ISO 8601), not {other}"
                            ),
                        )),
                    })
                    .collect::<Result<_, RunError>>()?,
                window: *window,
            },
            By::Similar { min_jaccard, words } => {
                let projector = self.judge.projector()?;
                Gathering::Similar {
                    sets: units
                        .iter()
                        .map(|&i| {
                            Ok(shingles(
                                &view_text(&self.project(&projector, table, i)?),
                                *words,
                            ))
                        })
                        .collect::<Result<_, RunError>>()?,
                    min_jaccard: *min_jaccard,
                }
            }
        };
        Ok(gather(&by, self.spec.max_members))
    }

    /// Each group's members as table positions, keyed by its first.
    fn members(gathered: &Gathered, units: &[usize]) -> HashMap<usize, Vec<usize>> {
        gathered
            .groups
            .iter()
            .filter_map(|g| {
                let members: Vec<usize> = g
                    .members
                    .iter()
                    .filter_map(|&k| units.get(k).copied())
                    .collect();
                Some((*members.first()?, members))
            })
            .collect()
    }

    /// The groups' first members, in the order they were gathered.
    fn leaders(gathered: &Gathered, units: &[usize]) -> Vec<usize> {
        gathered
            .groups
            .iter()
            .filter_map(|g| units.get(*g.members.first()?).copied())
            .collect()
    }

    fn views<'a>(
        &'a self,
        table: &'a UnitTable,
        members: HashMap<usize, Vec<usize>>,
    ) -> Result<GroupViews<'a>, RunError> {
        Ok(GroupViews {
            stage: &self.spec.name,
            projector: self.judge.projector()?,
            table,
            members,
        })
    }

    /// A fact the stage makes without a model: a member past the group's
    /// first carrying the group's fact, or a unit not judged.
    fn derived(
        &self,
        table: &UnitTable,
        i: usize,
        from: &FactRecord,
    ) -> Result<FactRecord, RunError> {
        let u = table.unit(i)?;
        let mut h = StableHasher::new(DERIVED_KEYS);
        h.field("stage", &self.definition_hash())
            .field("unit", u.unit_id.as_str())
            .field("hash", &u.unit_hash)
            .field("from", &from.key);
        let mut fact = from.clone();
        fact.key = h.finish();
        fact.source_ids = std::iter::once(u.unit_id.clone())
            .chain(from.source_ids.iter().filter(|s| **s != u.unit_id).cloned())
            .collect();
        fact.source_hashes = std::iter::once(u.unit_hash)
            .chain(
                from.source_ids
                    .iter()
                    .zip(&from.source_hashes)
                    .filter(|(s, _)| **s != u.unit_id)
                    .map(|(_, h)| *h),
            )
            .collect();
        // The quotes are the group fact's, found in the group's view in
        // its order; this fact cites the members in another.
        fact.evidence = Vec::new();
        fact.cost = Cost::default();
        fact.attempts = 0;
        fact.digest = None;
        Ok(fact)
    }

    /// The fact of a unit the stage does not judge (alone, or with no
    /// group), negative with the reason.
    fn unjudged(&self, table: &UnitTable, i: usize, reason: &str) -> Result<FactRecord, RunError> {
        let u = table.unit(i)?;
        let mut h = StableHasher::new(DERIVED_KEYS);
        h.field("stage", &self.definition_hash())
            .field("unit", u.unit_id.as_str())
            .field("hash", &u.unit_hash)
            .field("reason", reason);
        let sp = &self.judge.model.spec;
        Ok(FactRecord {
            schema: FACT_SCHEMA.into(),
            key: h.finish(),
            source_ids: vec![u.unit_id.clone()],
            source_hashes: vec![u.unit_hash],
            stage: self.spec.name.clone(),
            stage_version: sp.version,
            rubric_hash: self.judge.model.rubric_hash,
            model: ModelParams {
                backend: "group".into(),
                model_id: "not_judged".into(),
                temperature: 0.0,
                max_output_tokens: 0,
                seed: 0,
                simulated: false,
            },
            status: Status::Negative,
            decision: None,
            facts: Value::Null,
            confidence: None,
            choice_scores: Vec::new(),
            reason: Some(reason.to_owned()),
            evidence: Vec::new(),
            cost: Cost::default(),
            attempts: 0,
            reducer_path: Vec::new(),
            truncated_tokens: 0,
            digest: None,
        })
    }

    fn report(&self, table: &UnitTable, units: &[usize], g: &Gathered) -> GroupReport {
        let id = |k: usize| {
            units
                .get(k)
                .and_then(|&i| table.id(i).ok())
                .map_or_else(|| "?".to_owned(), |id| id.to_string())
        };
        GroupReport {
            by: self.by.describe(),
            max_members: self.spec.max_members as u64,
            units: units.len() as u64,
            groups: g.groups.len() as u64,
            grouped: g.groups.iter().map(|g| g.members.len() as u64).sum(),
            largest: g
                .groups
                .iter()
                .map(|g| g.members.len() as u64)
                .max()
                .unwrap_or(0),
            alone: g.alone.len() as u64,
            ungrouped: g.ungrouped.len() as u64,
            split: g
                .splits
                .iter()
                .map(|s| {
                    let parts: Vec<String> = s.parts.iter().map(usize::to_string).collect();
                    format!(
                        "the group from {}: {} members in {} parts of {}",
                        id(s.first),
                        s.whole,
                        s.parts.len(),
                        parts.join(", ")
                    )
                })
                .collect(),
            ..GroupReport::default()
        }
    }
}

/// Each group as its context shows it, keyed by its first member.
struct GroupViews<'a> {
    stage: &'a str,
    projector: Projector,
    table: &'a UnitTable,
    members: HashMap<usize, Vec<usize>>,
}

impl GroupViews<'_> {
    fn members(&self, i: usize) -> &[usize] {
        self.members.get(&i).map(Vec::as_slice).unwrap_or_default()
    }

    fn group(&self, i: usize) -> Result<GroupView, RunError> {
        let members = self
            .members(i)
            .iter()
            .map(|&m| {
                let id = self.table.id(m)?.as_str();
                let view = self
                    .projector
                    .project(id, &self.table.value(m))
                    .map_err(project_err)?;
                Ok((id.to_owned(), view))
            })
            .collect::<Result<Vec<_>, RunError>>()?;
        group_view(members).map_err(|e| RunError::Project {
            stage: self.stage.to_owned(),
            unit: self
                .table
                .id(i)
                .map_or_else(|_| "?".into(), |id| id.to_string()),
            detail: e.to_string(),
        })
    }
}

impl Views for GroupViews<'_> {
    fn view(&self, i: usize) -> Result<Value, RunError> {
        Ok(self.group(i)?.view)
    }

    fn cites(&self, i: usize) -> (Vec<UnitId>, Vec<ContentHash>) {
        self.members(i)
            .iter()
            .filter_map(|&m| self.table.unit(m).ok())
            .map(|u| (u.unit_id.clone(), u.unit_hash))
            .unzip()
    }
}

impl super::Kind for GroupStageSpec {
    fn build(&self, ctx: &mut BuildContext<'_>) -> Result<Box<dyn Stage>, PlanError> {
        Ok(Box::new(GroupRunner::build(self, ctx)?))
    }
}

impl Stage for GroupRunner {
    fn name(&self) -> &str {
        &self.spec.name
    }

    fn kind(&self) -> &'static str {
        "group"
    }

    fn definition_hash(&self) -> ContentHash {
        let mut h = StableHasher::new(fanfold_core::Bucket::Kind("group-stage-v1"));
        h.field("judge", &self.judge.definition_hash())
            .field("by", self.by.describe().as_str())
            .field("max_members", &self.spec.max_members);
        h.finish()
    }

    fn shape(&self) -> Shape<'_> {
        Shape {
            calls: Calls::Model {
                backend: &self.spec.judge.backend,
            },
            ..Shape::units(Outputs::Stored)
        }
    }

    fn evidence_view(&self) -> Option<EvidenceView> {
        Some(EvidenceView {
            grouped: true,
            ..self.judge.evidence_view()
        })
    }

    fn explain(&self, spec: &Spec, out: &mut String) {
        let _ = writeln!(
            out,
            "  {} group: by {}; at most {} members a context (a larger group is split in its order into even parts, said in the report); a unit alone is not judged; each group's fact must quote every member; judged by",
            self.spec.name,
            self.by.describe(),
            self.spec.max_members,
        );
        self.judge.explain(spec, out);
    }

    fn count_cached(
        &self,
        spec: &Spec,
        spec_dir: &Path,
        store: &Store,
        table: &UnitTable,
        units: &[usize],
    ) -> Result<CachedCount, RunError> {
        if units.is_empty() {
            return Ok(CachedCount::default());
        }
        let gathered = self.gathered(table, units)?;
        let leaders = Self::leaders(&gathered, units);
        let views = self.views(table, Self::members(&gathered, units))?;
        let mut found: Vec<usize> = Vec::new();
        let mut count =
            self.judge
                .count_cached(spec, spec_dir, store, &leaders, &views, &mut |i, _| {
                    found.push(i)
                })?;
        if count.unknown.is_some() {
            return Ok(count);
        }
        // Units not judged cost nothing; a stored group's members are all
        // answered by it.
        count.cached = (gathered.alone.len() + gathered.ungrouped.len()) as u64
            + found
                .iter()
                .map(|&i| views.members(i).len() as u64)
                .sum::<u64>();
        count.calls = Some(leaders.len().saturating_sub(found.len()) as u64);
        Ok(count)
    }

    fn planned_calls(&self, table: &UnitTable, units: &[usize]) -> Result<Option<u64>, RunError> {
        Ok(Some(self.gathered(table, units)?.groups.len() as u64))
    }

    fn run(&self, ctx: &mut StageContext<'_>, units: Vec<usize>) -> Result<StageOutcome, RunError> {
        let table = ctx.table;
        let gathered = self.gathered(table, &units)?;
        let mut report = self.report(table, &units, &gathered);
        let leaders = Self::leaders(&gathered, &units);
        let views = self.views(table, Self::members(&gathered, &units))?;

        // The judge's facts go to a ledger of their own, so each is checked
        // for a quote of every member before it answers for its group.
        let mut stop = None;
        let mut judged: HashMap<usize, FactRecord> = HashMap::new();
        if !leaders.is_empty() {
            let inner_spec = crate::kit::uncontracted(ctx.spec);
            let verdicts = FactLedger::new(
                ctx.store,
                Controller::new(inner_spec.contract.clone()),
                None,
            );
            let hits = ctx.stats.cache_hits;
            let mut inner = ctx.for_turn(&inner_spec, &verdicts);
            stop = self
                .judge
                .run(&mut inner, leaders.clone(), &views, &|_, _| {})?;
            report.cached = ctx.stats.cache_hits - hits;
            if let Some(e) = verdicts.take_store_error() {
                return Err(e.into());
            }
            let (facts, totals) = verdicts.into_parts();
            report.calls = totals.calls;
            ctx.stats.model_calls += totals.calls;
            ctx.stats.cost.add(&totals.cost);
            judged.extend(facts);
        }

        let mut ended: Vec<(usize, FactRecord)> = Vec::new();
        for &leader in &leaders {
            let Some(mut fact) = judged.remove(&leader) else {
                continue;
            };
            if fact.status.is_cacheable() {
                let uncited = views
                    .group(leader)?
                    .uncited(fact.evidence.iter().map(|e| e.field.as_str()));
                if !uncited.is_empty() {
                    let first = table.id(leader)?.to_string();
                    report
                        .uncited
                        .push(format!("{first}: no quote of {}", uncited.join(", ")));
                    fact.status = Status::Error;
                    fact.reason = Some(format!(
                        "uncited_member: the group's fact quotes no field of {}",
                        uncited.join(", ")
                    ));
                }
            }
            for &m in views.members(leader).get(1..).unwrap_or_default() {
                ended.push((m, self.derived(table, m, &fact)?));
            }
            ended.push((leader, fact));
        }
        for (list, reason) in [
            (
                &gathered.alone,
                "alone: no other unit the stage received is in its group",
            ),
            (
                &gathered.ungrouped,
                "ungrouped: it has no group key, time or text",
            ),
        ] {
            for &k in list {
                if let Some(&i) = units.get(k) {
                    ended.push((i, self.unjudged(table, i, reason)?));
                }
            }
        }
        ended.sort_by_key(|(i, _)| *i);
        for (i, fact) in ended {
            ctx.ledger.record(i, fact, Origin::Derived);
        }
        ctx.stats.reports.put(REPORT, &self.spec.name, &report);
        Ok(StageOutcome {
            stop,
            ..StageOutcome::default()
        })
    }

    fn report_key(&self) -> Option<&'static str> {
        Some(REPORT)
    }

    fn accounting(&self, stats: &RunStats) -> Option<String> {
        let g = stats.reports.get::<GroupReport>(REPORT, &self.spec.name)?;
        let mut line = format!(
            "group `{}` (by {}): {} units, {} groups of {} units judged (the largest {}, at most {}), {} alone and {} ungrouped not judged; {} groups reused, {} calls",
            self.spec.name,
            crate::markdown::md_text(&g.by),
            g.units,
            g.groups,
            g.grouped,
            g.largest,
            g.max_members,
            g.alone,
            g.ungrouped,
            g.cached,
            g.calls
        );
        for s in &g.split {
            let _ = write!(line, "; split {}", crate::markdown::md_text(s));
        }
        for u in &g.uncited {
            let _ = write!(
                line,
                "; an error for the group of {}",
                crate::markdown::md_text(u)
            );
        }
        Some(line)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}
