//! The widen stage: a unit read with its related units.
//!
//! A map stage that cannot decide a unit alone (it abstained, or its output
//! names context it needs) sends it here. Each unit is judged again by the
//! stage's own judge, in a context that shows the unit and its nearest
//! group members (same key, near in time, or near-duplicates by an embed
//! stage's vectors) under a token bound. The fact cites the unit first and
//! every member after it, with their hashes, and is keyed by the widened
//! view: an edit to any member shown recomputes the units it was shown
//! with, and nothing else. Members are found among the units the run
//! routed to a stage.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::Path;

use fanfold_core::spec::{Spec, StageSpec, WidenStageSpec};
use fanfold_core::{ContentHash, UnitId};
use fanfold_ops::jq::{JqProgram, Site, to_val};
use fanfold_ops::widen::{Grouping, Groups, key_text, widened_view, within_bound};
use fanfold_store::Store;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::embed::{EmbedRunner, Embedders, unit_vectors};
use crate::error::PlanError;
use crate::error::RunError;
use crate::kit::UnitTable;
use crate::kit::{
    BuildContext, CachedCount, Calls, EvidenceView, Outputs, RunStats, Shape, Stage, StageContext,
    StageOutcome, Turn, Views,
};

/// Bytes of compact JSON counted as one token, as a chunk stage counts.
const BYTES_PER_TOKEN: u64 = fanfold_ops::chunk::BYTES_PER_TOKEN;

pub struct WidenRunner {
    pub spec: WidenStageSpec,
    judge: Turn,
    relate: Relate,
}

/// How the stage finds a unit's group.
enum Relate {
    Key(JqProgram),
    Time { program: JqProgram, within: f64 },
    Near { embed: Box<EmbedRunner>, min: f64 },
}

impl Relate {
    fn describe(&self) -> String {
        match self {
            Relate::Key(p) => format!("key `{}`", p.source()),
            Relate::Time { program, within } => {
                format!("time `{}` within {within} s", program.source())
            }
            Relate::Near { embed, min } => {
                format!(
                    "near-duplicates by `{}` at similarity >= {min}",
                    embed.stage.name()
                )
            }
        }
    }
}

/// What a widen stage did, for the certificate.
/// The key of widen stages' reports in the run's stats.
pub const REPORT: &str = "widens";

/// Units every widen stage of a run judged again.
pub fn widened_units(stats: &RunStats) -> u64 {
    stats
        .reports
        .all::<WidenReport>(REPORT)
        .values()
        .map(|w| w.units)
        .sum()
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WidenReport {
    /// How units are related, as `explain` says it.
    pub group: String,
    /// Units sent to the stage.
    pub units: u64,
    /// Of those, the ones shown with at least one member.
    pub widened: u64,
    /// Units no group member was found for: judged with an empty list.
    pub alone: u64,
    /// Members shown, over all contexts.
    pub members_shown: u64,
    /// Group members among the nearest `k` left out by the token bound.
    pub left_out: u64,
    /// Units whose widened fact was reused from the store.
    pub cached: u64,
}

impl WidenRunner {
    pub fn build(w: &WidenStageSpec, ctx: &mut BuildContext<'_>) -> Result<WidenRunner, PlanError> {
        let name = &w.name;
        if w.k == 0 || w.max_related_tokens == 0 {
            return Err(ctx.invalid(format!(
                "widen `{name}`: k and max_related_tokens must be at least 1"
            )));
        }
        if w.judge.canaries.is_some() || w.judge.widen.is_some() {
            return Err(ctx.invalid(format!(
                "widen `{name}`: its judge takes no canaries and widens no further"
            )));
        }
        let g = &w.group;
        let declared = [g.key.is_some(), g.time.is_some(), g.near.is_some()];
        if declared.iter().filter(|d| **d).count() != 1 {
            return Err(ctx.invalid(format!(
                "widen `{name}`: [stages.group] must set exactly one of key, time or near"
            )));
        }
        let compile = |ctx: &BuildContext<'_>, what: &str, expr: &str| {
            JqProgram::compile(expr)
                .map_err(|e| ctx.invalid(format!("widen `{name}` group {what}: {e}")))
        };
        let relate = if let Some(expr) = &g.key {
            Relate::Key(compile(ctx, "key", expr)?)
        } else if let Some(expr) = &g.time {
            let within = g.within_secs.filter(|s| *s > 0.0).ok_or_else(|| {
                ctx.invalid(format!(
                    "widen `{name}` group time needs within_secs, a number of seconds above 0"
                ))
            })?;
            Relate::Time {
                program: compile(ctx, "time", expr)?,
                within,
            }
        } else {
            let near = g.near.as_deref().unwrap_or_default();
            let min = g
                .min_similarity
                .filter(|m| (-1.0..=1.0).contains(m))
                .ok_or_else(|| {
                    ctx.invalid(format!(
                        "widen `{name}` group near needs min_similarity, a cosine within [-1, 1]"
                    ))
                })?;
            let embed = ctx.spec.stages.iter().find_map(|s| match s {
                StageSpec::Embed(e) if e.name == near => Some(e.clone()),
                _ => None,
            });
            let Some(embed) = embed else {
                return Err(ctx.invalid(format!(
                    "widen `{name}` group near names `{near}`, which is not an embed stage of this spec"
                )));
            };
            Relate::Near {
                embed: Box::new(EmbedRunner::build(&embed, ctx)?),
                min,
            }
        };
        let mut judge = w.judge.clone();
        judge.name = w.name.clone();
        Ok(WidenRunner {
            spec: w.clone(),
            judge: Turn::build_judge(&judge, ctx)?,
            relate,
        })
    }

    /// How the table's units are related. Near-duplicates need vectors:
    /// computed (and stored) with `embedders`, read from the store alone
    /// without; the count of units left without one is returned.
    fn grouping(
        &self,
        table: &UnitTable,
        store: &Store,
        embedders: Option<&mut Embedders>,
    ) -> Result<(Grouping, usize), RunError> {
        let all: Vec<usize> = (0..table.len()).collect();
        let err = |i: usize, detail: String| match table.id(i) {
            Ok(id) => RunError::Group {
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
                    Site::new("widen group", table.id(i)?.as_str()),
                )
                .map_err(|e| err(i, e.to_string()))
        };
        Ok(match &self.relate {
            Relate::Key(program) => {
                let keys = all
                    .iter()
                    .map(|&i| Ok(eval(program, i)?.as_ref().and_then(key_text)))
                    .collect::<Result<_, RunError>>()?;
                (Grouping::Key(keys), 0)
            }
            Relate::Time { program, within } => {
                let at = all
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
                    .collect::<Result<_, RunError>>()?;
                (
                    Grouping::Time {
                        at,
                        within: *within,
                    },
                    0,
                )
            }
            Relate::Near { embed, min } => {
                let vectors = unit_vectors(embed, table, &all, store, embedders)?;
                let missing = vectors.iter().filter(|v| v.is_none()).count();
                (
                    Grouping::Near {
                        vectors,
                        min_similarity: *min,
                    },
                    missing,
                )
            }
        })
    }

    /// The members each of `units` is shown with, and the report's counts.
    fn members(
        &self,
        table: &UnitTable,
        grouping: &Grouping,
        units: &[usize],
    ) -> Result<(HashMap<usize, Vec<usize>>, WidenReport), RunError> {
        let projector = self.judge.projector()?;
        let ordinals: Vec<u64> = table.units().iter().map(|u| u.ordinal).collect();
        let groups = Groups::new(grouping, &ordinals);
        let mut report = WidenReport {
            group: self.relate.describe(),
            units: units.len() as u64,
            ..WidenReport::default()
        };
        let mut sizes: HashMap<usize, u64> = HashMap::new();
        let mut out = HashMap::with_capacity(units.len());
        for &i in units {
            let candidates = groups.candidates(i);
            let (kept, left_out) = within_bound(
                &candidates,
                self.spec.k,
                self.spec.max_related_tokens,
                |m| -> Result<u64, RunError> {
                    if let Some(&t) = sizes.get(&m) {
                        return Ok(t);
                    }
                    let id = table.id(m)?.as_str();
                    let view = projector
                        .project(id, &table.value(m))
                        .map_err(crate::error::project_err)?;
                    let bytes = view.to_string().len() + id.len() + 24;
                    let t = (bytes as u64).div_ceil(BYTES_PER_TOKEN);
                    sizes.insert(m, t);
                    Ok(t)
                },
            )?;
            report.left_out += left_out;
            report.members_shown += kept.len() as u64;
            if kept.is_empty() {
                report.alone += 1;
            } else {
                report.widened += 1;
            }
            out.insert(i, kept);
        }
        Ok((out, report))
    }
}

/// A unit with the members it is shown with.
struct WidenedViews<'a> {
    stage: &'a str,
    projector: fanfold_ops::view::Projector,
    table: &'a UnitTable,
    members: HashMap<usize, Vec<usize>>,
}

impl WidenedViews<'_> {
    fn members(&self, i: usize) -> &[usize] {
        self.members.get(&i).map(Vec::as_slice).unwrap_or_default()
    }

    fn project(&self, i: usize) -> Result<Value, RunError> {
        self.projector
            .project(self.table.id(i)?.as_str(), &self.table.value(i))
            .map_err(crate::error::project_err)
    }
}

impl Views for WidenedViews<'_> {
    fn view(&self, i: usize) -> Result<Value, RunError> {
        let members = self
            .members(i)
            .iter()
            .map(|&m| Ok((self.table.id(m)?.to_string(), self.project(m)?)))
            .collect::<Result<Vec<_>, RunError>>()?;
        let id = self.table.id(i)?;
        widened_view(self.project(i)?, members).map_err(|e| RunError::Group {
            stage: self.stage.to_owned(),
            unit: id.to_string(),
            detail: e.to_string(),
        })
    }

    fn cites(&self, i: usize) -> (Vec<UnitId>, Vec<ContentHash>) {
        std::iter::once(i)
            .chain(self.members(i).iter().copied())
            .filter_map(|m| self.table.unit(m).ok())
            .map(|u| (u.unit_id.clone(), u.unit_hash))
            .unzip()
    }
}

impl super::Kind for fanfold_core::spec::WidenStageSpec {
    fn build(&self, ctx: &mut BuildContext<'_>) -> Result<Box<dyn Stage>, PlanError> {
        Ok(Box::new(WidenRunner::build(self, ctx)?))
    }
}

impl Stage for WidenRunner {
    fn name(&self) -> &str {
        &self.spec.name
    }

    fn kind(&self) -> &'static str {
        "widen"
    }

    fn definition_hash(&self) -> ContentHash {
        self.judge.definition_hash()
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
            widened: true,
            ..self.judge.evidence_view()
        })
    }

    fn explain(&self, spec: &Spec, out: &mut String) {
        let _ = writeln!(
            out,
            "  {} widen: group {}, up to {} members in {} tokens; judged by",
            self.spec.name,
            self.relate.describe(),
            self.spec.k,
            self.spec.max_related_tokens
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
        let (grouping, missing) = self.grouping(table, store, None)?;
        let (members, _) = self.members(table, &grouping, units)?;
        let views = WidenedViews {
            stage: &self.spec.name,
            projector: self.judge.projector()?,
            table,
            members,
        };
        let mut count =
            self.judge
                .count_cached(spec, spec_dir, store, units, &views, &mut |_, _| {})?;
        if missing > 0 && count.unknown.is_none() {
            count.unknown = Some(format!(
                "{missing} units have no stored vector yet, so their near-duplicates are not known before the run"
            ));
        }
        Ok(count)
    }

    fn run(&self, ctx: &mut StageContext<'_>, units: Vec<usize>) -> Result<StageOutcome, RunError> {
        let table = ctx.table;
        let (grouping, _) = self.grouping(table, ctx.store, ctx.shared.get::<Embedders>())?;
        let (members, mut report) = self.members(table, &grouping, &units)?;
        let views = WidenedViews {
            stage: &self.spec.name,
            projector: self.judge.projector()?,
            table,
            members,
        };
        let hits_before = ctx.stats.cache_hits;
        let outcome = StageOutcome {
            stop: self.judge.run(ctx, units, &views, &|_, _| {})?,
            ..StageOutcome::default()
        };
        report.cached = ctx.stats.cache_hits.saturating_sub(hits_before);
        ctx.stats.reports.put(REPORT, &self.spec.name, &report);
        Ok(outcome)
    }

    fn report_key(&self) -> Option<&'static str> {
        Some(REPORT)
    }

    fn accounting(&self, stats: &RunStats) -> Option<String> {
        let w = stats.reports.get::<WidenReport>(REPORT, &self.spec.name)?;
        Some(format!(
            "widen `{}` ({}): {} units judged again, {} with related units ({} shown, {} left out by the token bound), {} with none found; {} reused",
            self.spec.name,
            crate::markdown::md_sentence(&w.group),
            w.units,
            w.widened,
            w.members_shown,
            w.left_out,
            w.alone,
            w.cached
        ))
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}
