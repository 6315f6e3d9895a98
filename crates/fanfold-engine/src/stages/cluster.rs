//! The cluster stage: a model reducer over the facts an earlier stage
//! decided. It runs once every unit stage has run, reads facts (never raw
//! units), and builds a tree of contexts level by level on the same queue,
//! budgets and backends as every other stage. Each context's checked
//! answer is stored under a key of everything it showed, so a rerun after
//! one fact changed pays for that fact's context and the ones above it.

use std::fmt::Write as _;
use std::ops::Range;
use std::path::Path;
use std::sync::Mutex;

use fanfold_core::spec::{ClusterStageSpec, Execution, Spec};
use fanfold_core::{ContentHash, Cost, FactRecord, ModelParams, UnitId};
use fanfold_model::ModelBackend;
use fanfold_ops::cluster::{ClusterStage, Item, NodeAnswer, drift, shuffled};
use fanfold_ops::contract::{Controller, StopReason};
use fanfold_ops::view::Projector;
use fanfold_store::Store;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::error::PlanError;
use crate::error::RunError;
use crate::error::project_err;
use crate::kit::UnitTable;
use crate::kit::turn::model_params;
use crate::kit::{
    BuildContext, CachedCount, Calls, Outputs, Reads, RunStats, Shape, Stage, StageContext,
    StageOutcome,
};
use crate::queue::{BudgetPool, Pending, Prompt, StageJob, UnitResult};

pub struct ClusterRunner {
    pub stage: ClusterStage,
}

/// What the stage found, for the certificate, answer.md and verify.
/// The key of cluster stages' reports in the run's stats.
pub const REPORT: &str = "clusters";

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ClusterReport {
    /// The stage whose facts were read.
    pub reads: String,
    /// Facts read.
    pub facts: u64,
    pub fan_in: usize,
    /// Levels of contexts, the facts' own level counted.
    pub levels: u32,
    /// Contexts of the answer's tree, and how many of them were stored.
    pub nodes: u64,
    pub cached_nodes: u64,
    /// Model calls, stress reductions included.
    pub calls: u64,
    /// The themes, the largest first; every count recounted.
    pub themes: Vec<ClusterTheme>,
    /// Facts a context placed in no theme on purpose.
    pub outliers: Vec<UnitId>,
    /// Facts a context neither themed nor called an outlier.
    pub unthemed: Vec<UnitId>,
    /// Facts whose context failed: no theme holds them.
    pub failed: Vec<UnitId>,
    /// Contexts whose answer was refused after every attempt, or that
    /// never ran.
    pub errors: Vec<NodeError>,
    /// The tree stopped narrowing before one context held every theme: the
    /// themes listed were never all compared.
    pub unmerged: bool,
    pub stress: Option<StressReport>,
    /// Why the declared stress was not run, if it was not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stress_skipped: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ClusterTheme {
    pub label: String,
    /// The number of member facts, counted by fanfold.
    pub count: u64,
    pub members: Vec<UnitId>,
    pub exemplars: Vec<UnitId>,
    pub dissent: Vec<UnitId>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeError {
    pub level: u32,
    /// The first and last item the context showed.
    pub first: String,
    pub last: String,
    pub reason: String,
}

/// The themes reduced again in other orders and at other fan-ins.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StressReport {
    /// The bound the spec declares.
    pub max_drift: f64,
    /// The largest drift measured.
    pub drift: f64,
    pub runs: Vec<StressRun>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StressRun {
    /// 0 is the facts' source order; the rest are seeded shuffles.
    pub order: usize,
    pub fan_in: usize,
    pub themes: u64,
    /// Against the answer's themes.
    pub drift: f64,
    /// Contexts that failed in this reduction.
    pub errors: u64,
}

impl ClusterReport {
    /// Why the themes are not the whole answer, if they are not.
    pub fn shortfalls(&self, name: &str) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(e) = self.errors.first() {
            out.push(format!(
                "cluster `{name}`: {} of its contexts failed, so {} facts are in no theme (first: level {}, {}..{}: {})",
                self.errors.len(),
                self.failed.len(),
                e.level,
                e.first,
                e.last,
                e.reason
            ));
        }
        if let Some(s) = &self.stress
            && s.drift > s.max_drift
        {
            out.push(format!(
                "cluster `{name}`: its themes drift {:.2} under reordering and regrouping, above the declared {:.2}",
                s.drift, s.max_drift
            ));
        }
        out
    }

    /// Every unit id the themes cite.
    pub fn cited(&self) -> impl Iterator<Item = &UnitId> {
        self.themes
            .iter()
            .flat_map(|t| t.members.iter().chain(&t.dissent))
    }
}

/// One tree of contexts over a list of facts.
#[derive(Default)]
struct Reduction {
    themes: Vec<Item>,
    outliers: Vec<String>,
    unthemed: Vec<String>,
    failed: Vec<String>,
    errors: Vec<NodeError>,
    levels: u32,
    nodes: u64,
    cached: u64,
    calls: u64,
    cost: Cost,
    unmerged: bool,
    stop: Option<StopReason>,
}

impl Reduction {
    fn memberships(&self) -> Vec<Vec<String>> {
        self.themes.iter().map(|t| t.leaves.clone()).collect()
    }
}

/// What reducing needs besides the items: where answers are stored and
/// how calls are made.
struct Reducer<'a> {
    stage: &'a ClusterStage,
    store: &'a Store,
    backend: &'a dyn ModelBackend,
    model: &'a ModelParams,
    budget: &'a BudgetPool,
    slots: usize,
}

impl Reducer<'_> {
    fn reduce(&self, mut items: Vec<Item>, fan_in: usize) -> Result<Reduction, RunError> {
        let mut out = Reduction::default();
        let mut level = 0u32;
        while !items.is_empty() {
            // A single theme left has nothing to merge with.
            if level > 0 && items.len() == 1 {
                break;
            }
            out.levels = level + 1;
            let groups = self.stage.contexts(&items, fan_in);
            let answers = self.level(&items, &groups, level, &mut out)?;
            let nodes: Vec<(Range<usize>, ContentHash, Option<NodeAnswer>)> = groups
                .iter()
                .zip(answers)
                .map(|(r, (key, a))| (r.clone(), key, a))
                .collect();
            let next = ClusterStage::next_level(&items, &nodes);
            out.outliers.extend(next.outliers);
            out.unthemed.extend(next.unthemed);
            out.failed.extend(next.failed);
            let narrowed = next.items.len() < items.len();
            items = next.items;
            if groups.len() <= 1 || out.stop.is_some() {
                break;
            }
            if !narrowed {
                out.unmerged = true;
                break;
            }
            level += 1;
        }
        items.sort_by(|a, b| {
            b.leaves
                .len()
                .cmp(&a.leaves.len())
                .then_with(|| a.label.cmp(&b.label))
        });
        out.themes = items.into_iter().filter(|i| i.label.is_some()).collect();
        Ok(out)
    }

    /// One level's contexts: stored answers reused, the rest asked for on
    /// one queue. Returns each context's key and answer (`None` if failed).
    fn level(
        &self,
        items: &[Item],
        groups: &[Range<usize>],
        level: u32,
        out: &mut Reduction,
    ) -> Result<Vec<(ContentHash, Option<NodeAnswer>)>, RunError> {
        let stage = self.stage;
        let shown = |c: usize| -> &[Item] {
            groups
                .get(c)
                .and_then(|r| items.get(r.clone()))
                .unwrap_or_default()
        };
        let mut answers: Vec<(ContentHash, Option<NodeAnswer>)> = Vec::with_capacity(groups.len());
        let mut pending = Vec::new();
        for c in 0..groups.len() {
            let key = stage.node_key(shown(c), self.model);
            // Past the token bound a context is never sent, so it is never
            // cut: it fails as a context whose answer was refused.
            if let Some(reason) = stage.over_bound(shown(c)) {
                let s = shown(c);
                out.nodes += 1;
                out.errors.push(NodeError {
                    level,
                    first: s.first().map(|i| i.id.clone()).unwrap_or_default(),
                    last: s.last().map(|i| i.id.clone()).unwrap_or_default(),
                    reason,
                });
                answers.push((key, None));
                continue;
            }
            let stored = self
                .store
                .get_fold_node(&key)?
                .and_then(|v| serde_json::from_value::<NodeAnswer>(v).ok());
            out.nodes += 1;
            if stored.is_some() {
                out.cached += 1;
            } else {
                let s = shown(c);
                pending.push(Pending {
                    index: c,
                    unit_id: format!(
                        "{}..{}",
                        s.first().map_or("", |i| i.id.as_str()),
                        s.last().map_or("", |i| i.id.as_str())
                    ),
                    attempt: 1,
                    bound: None,
                    prompt: None,
                    not_before: None,
                });
            }
            answers.push((key, stored));
        }
        if pending.is_empty() {
            return Ok(answers);
        }
        let prepare = |c: usize| -> Prompt {
            let s = shown(c);
            Prompt {
                suffix: stage.suffix(s),
                schema: Some(stage.schema_for(s)),
                input: json!({
                    "node": c,
                    "level": level,
                    "items": s.iter().map(|i| json!({
                        "id": i.id,
                        "facts": i.leaves.len(),
                        "theme": i.label,
                        "view": i.view,
                    })).collect::<Vec<_>>(),
                }),
            }
        };
        let interpret = |raw: &str, input: &Value| {
            let c = input
                .get("node")
                .and_then(Value::as_u64)
                .map_or(usize::MAX, |c| c as usize);
            stage.interpret(raw, shown(c))
        };
        let finished: Mutex<Vec<(usize, UnitResult)>> = Mutex::new(Vec::new());
        let finish = |c: usize, r: &UnitResult| {
            finished
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((c, r.clone()));
        };
        // A reducer answers no question of its own: no contract bears on it.
        let controller = Mutex::new(Controller::new(crate::kit::no_contract()));
        let slots = match stage.spec.execution {
            Execution::Online => self.slots,
            Execution::Batch => pending.len(),
        };
        let mut job = StageJob::new(
            &stage.turn,
            slots,
            pending,
            self.budget,
            &controller,
            &finish,
            &prepare,
        );
        job.set_interpreter(&interpret);
        let price = |u: &fanfold_model::Usage| self.backend.cost_usd(u);
        job.set_price(&price);
        self.backend.run(&job).map_err(|source| RunError::Backend {
            name: stage.spec.backend.clone(),
            source,
        })?;
        let (leftovers, _, stop) = job.finish();
        if out.stop.is_none() {
            out.stop = stop;
        }
        let mut results = finished.into_inner().unwrap_or_else(|e| e.into_inner());
        results.extend(leftovers);
        for (c, r) in results {
            out.calls += u64::from(r.attempts);
            out.cost.add(&Cost {
                prompt_tokens: r.usage.prompt_tokens,
                cached_tokens: r.usage.cached_tokens,
                completion_tokens: r.usage.completion_tokens,
                usd: self.backend.cost_usd(&r.usage).unwrap_or(0.0),
                latency_ms: r.usage.latency_ms,
                calls: u64::from(r.attempts),
            });
            let answer = r
                .interpreted
                .as_ref()
                .filter(|_| r.truncated_tokens == 0)
                .and_then(|it| serde_json::from_value::<NodeAnswer>(it.facts.clone()).ok());
            let Some((key, slot)) = answers.get_mut(c) else {
                continue;
            };
            match answer {
                Some(a) => {
                    self.store.put_fold_node(
                        key,
                        level,
                        &serde_json::to_value(&a).unwrap_or(Value::Null),
                    )?;
                    *slot = Some(a);
                }
                None => {
                    let s = shown(c);
                    let reason = if r.truncated_tokens > 0 {
                        format!(
                            "truncated: the backend cut {} tokens of this context",
                            r.truncated_tokens
                        )
                    } else {
                        r.reason.clone().unwrap_or_else(|| r.status.to_string())
                    };
                    out.errors.push(NodeError {
                        level,
                        first: s.first().map(|i| i.id.clone()).unwrap_or_default(),
                        last: s.last().map(|i| i.id.clone()).unwrap_or_default(),
                        reason,
                    });
                }
            }
        }
        Ok(answers)
    }
}

impl ClusterRunner {
    pub fn build(
        s: &ClusterStageSpec,
        ctx: &mut BuildContext<'_>,
    ) -> Result<ClusterRunner, PlanError> {
        ctx.require_backend(&s.name, &s.backend)?;
        let rubric = ctx.read("rubric", &s.rubric)?;
        ctx.hashed
            .insert(format!("rubric:{}", s.name), rubric.clone());
        let stage = ClusterStage::new(s.clone(), rubric).map_err(|e| ctx.invalid(e.to_string()))?;
        // The projection is compiled now, so a typo is a plan error.
        projector(&stage.spec).map_err(|e| ctx.invalid(e.to_string()))?;
        Ok(ClusterRunner { stage })
    }

    /// The facts read, in source order, as level 0 shows them.
    fn items(
        &self,
        facts: &[(usize, FactRecord)],
        table: &UnitTable,
    ) -> Result<Vec<Item>, RunError> {
        let projector = projector(&self.stage.spec).map_err(project_err)?;
        // Facts arrive as their calls finish; the tree is built in source
        // order, so the same facts always make the same contexts.
        let mut read: Vec<(u64, &FactRecord)> = facts
            .iter()
            .map(|(i, f)| Ok((table.unit(*i)?.ordinal, f)))
            .collect::<Result<_, RunError>>()?;
        read.sort_by_key(|&(ordinal, _)| ordinal);
        let mut items = Vec::new();
        for (_, f) in read {
            if f.stage != self.stage.spec.reads || !self.stage.reads_status(f.status) {
                continue;
            }
            let Some(id) = f.source_ids.first() else {
                continue;
            };
            let fact = json!({
                "id": id.as_str(),
                "decision": f.decision,
                "facts": f.facts,
                "evidence": f.evidence,
            });
            let view = projector.project(id.as_str(), &fact).map_err(project_err)?;
            items.push(ClusterStage::fact_item(id.as_str(), view));
        }
        Ok(items)
    }
}

fn projector(spec: &ClusterStageSpec) -> Result<Projector, fanfold_ops::view::ProjectError> {
    Projector::compile(
        &spec.name,
        Some(spec.project.as_deref().unwrap_or(".facts")),
        &[],
    )
}

impl super::Kind for fanfold_core::spec::ClusterStageSpec {
    fn build(&self, ctx: &mut BuildContext<'_>) -> Result<Box<dyn Stage>, PlanError> {
        Ok(Box::new(ClusterRunner::build(self, ctx)?))
    }
}

impl Stage for ClusterRunner {
    fn name(&self) -> &str {
        self.stage.name()
    }

    fn kind(&self) -> &'static str {
        "cluster"
    }

    fn definition_hash(&self) -> ContentHash {
        self.stage.definition_hash()
    }

    fn shape(&self) -> Shape<'_> {
        Shape {
            reads: Reads::Facts {
                of: &self.stage.spec.reads,
            },
            calls: Calls::Model {
                backend: &self.stage.spec.backend,
            },
            outputs: Outputs::Stored,
            then: None,
            sends: Vec::new(),
        }
    }

    fn explain(&self, spec: &Spec, out: &mut String) {
        let sp = &self.stage.spec;
        let (backend, simulated) = crate::kit::backend_label(spec, &sp.backend);
        let _ = writeln!(
            out,
            "  {} cluster v{} backend={}({}){simulated} attempts={} max_output_tokens={}\n    reads the {} facts of `{}`, each as `{}`",
            sp.name,
            sp.version,
            sp.backend,
            backend,
            sp.max_attempts,
            sp.max_output_tokens,
            sp.statuses.join("|"),
            sp.reads,
            sp.project.as_deref().unwrap_or(".facts"),
        );
        let _ = writeln!(
            out,
            "    {} facts or themes a context, at most {} themes each, merged until one context holds them all; ids and counts checked",
            sp.fan_in, sp.max_themes
        );
        if let Some(bound) = sp.max_context_tokens {
            let _ = writeln!(
                out,
                "    at most {bound} tokens of items a context (estimated at 2 bytes a token): a context closes early, an item past it alone is refused, never cut"
            );
        }
        if let Some(s) = &sp.stress {
            let fan_ins = if s.fan_ins.is_empty() {
                sp.fan_in.to_string()
            } else {
                s.fan_ins
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let _ = writeln!(
                out,
                "    reorder stress: {} orders x fan-in {fan_ins}, drift at most {}",
                s.orders, s.max_drift
            );
        }
    }

    fn count_cached(
        &self,
        _spec: &Spec,
        _spec_dir: &Path,
        _store: &Store,
        _table: &UnitTable,
        _units: &[usize],
    ) -> Result<CachedCount, RunError> {
        // It reads facts, not units: nothing is routed to it.
        Ok(CachedCount::default())
    }

    fn run(
        &self,
        ctx: &mut StageContext<'_>,
        _units: Vec<usize>,
    ) -> Result<StageOutcome, RunError> {
        let stage = &self.stage;
        let sp = &stage.spec;
        let items = self.items(ctx.facts, ctx.table)?;
        let backend = ctx
            .backends
            .get(ctx.spec, ctx.spec_dir, &sp.backend, sp.execution)?;
        let model = model_params(&backend.info(), &stage.turn);
        let reducer = Reducer {
            stage,
            store: ctx.store,
            backend,
            model: &model,
            budget: ctx.budget,
            slots: ctx.slots,
        };
        ctx.progress
            .stage_started(stage.name(), items.len() as u64, 0);
        let main = reducer.reduce(items.clone(), sp.fan_in)?;
        let mut calls = main.calls;
        let mut cost = main.cost;
        let mut stop = main.stop.clone();
        // Drift from a tree some of whose contexts failed would measure the
        // failures, not the reducer: the stress is then not paid for.
        let stress_skipped = match (&sp.stress, &stop) {
            (Some(_), Some(_)) => Some("the run stopped before it".to_owned()),
            (Some(_), None) if !main.errors.is_empty() => Some(format!(
                "{} contexts of the answer's own reduction failed",
                main.errors.len()
            )),
            _ => None,
        };
        let stress = match (&sp.stress, &stress_skipped) {
            (Some(s), None) => {
                let fan_ins = if s.fan_ins.is_empty() {
                    vec![sp.fan_in]
                } else {
                    s.fan_ins.clone()
                };
                let baseline = main.memberships();
                let mut runs = Vec::new();
                for order in 0..s.orders {
                    for &fan_in in &fan_ins {
                        if order == 0 && fan_in == sp.fan_in {
                            continue;
                        }
                        let input = shuffled(&items, |i| i.id.as_str(), s.seed, order);
                        let r = reducer.reduce(input, fan_in)?;
                        calls += r.calls;
                        cost.add(&r.cost);
                        runs.push(StressRun {
                            order,
                            fan_in,
                            themes: r.themes.len() as u64,
                            drift: drift(&baseline, &r.memberships()),
                            errors: r.errors.len() as u64,
                        });
                        if r.stop.is_some() {
                            stop = r.stop;
                            break;
                        }
                    }
                    if stop.is_some() {
                        break;
                    }
                }
                Some(StressReport {
                    max_drift: s.max_drift,
                    drift: runs.iter().map(|r| r.drift).fold(0.0, f64::max),
                    runs,
                })
            }
            _ => None,
        };
        let ids = |v: &[String]| -> Vec<UnitId> { v.iter().cloned().map(UnitId).collect() };
        let report = ClusterReport {
            reads: sp.reads.clone(),
            facts: items.len() as u64,
            fan_in: sp.fan_in,
            levels: main.levels,
            nodes: main.nodes,
            cached_nodes: main.cached,
            calls,
            themes: main
                .themes
                .iter()
                .map(|t| ClusterTheme {
                    label: t.label.clone().unwrap_or_default(),
                    count: t.leaves.len() as u64,
                    members: ids(&t.leaves),
                    exemplars: ids(&t.exemplars),
                    dissent: ids(&t.dissent),
                })
                .collect(),
            outliers: ids(&main.outliers),
            unthemed: ids(&main.unthemed),
            failed: ids(&main.failed),
            errors: main.errors,
            unmerged: main.unmerged,
            stress,
            stress_skipped,
        };
        ctx.stats.model_calls += calls;
        ctx.stats.cost.add(&cost);
        ctx.stats.reports.put(REPORT, stage.name(), &report);
        ctx.progress.stage_finished(stage.name());
        Ok(StageOutcome {
            stop,
            ..StageOutcome::default()
        })
    }

    fn report_key(&self) -> Option<&'static str> {
        Some(REPORT)
    }

    fn shortfalls(&self, stats: &RunStats) -> Vec<String> {
        stats
            .reports
            .get::<ClusterReport>(REPORT, self.name())
            .map(|r| r.shortfalls(self.name()))
            .unwrap_or_default()
    }

    fn cited(&self, stats: &RunStats) -> Vec<UnitId> {
        stats
            .reports
            .get::<ClusterReport>(REPORT, self.name())
            .map(|r| r.cited().cloned().collect())
            .unwrap_or_default()
    }

    fn answer_section(&self, stats: &RunStats, simulated: &str) -> Option<String> {
        let r = stats.reports.get::<ClusterReport>(REPORT, self.name())?;
        Some(cluster_section(self.name(), &r, simulated))
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// A cluster stage's themes as answer.md shows them: each theme with its
/// recounted size and every member cited, then what fits no theme, the
/// contexts that failed and the reorder stress.
fn cluster_section(name: &str, c: &ClusterReport, sim: &str) -> String {
    let ids = |v: &[fanfold_core::UnitId]| -> String {
        v.iter()
            .map(|i| format!("#{}", crate::markdown::md_text(&i.0)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n## Themes: cluster `{name}`{sim}\n\nProposed by the model from the {} facts of `{}`, {} at a time over {} levels ({} contexts, {} reused). Counts are fanfold's own, from the members.\n",
        c.facts, c.reads, c.fan_in, c.levels, c.nodes, c.cached_nodes
    );
    for (n, t) in c.themes.iter().enumerate() {
        let _ = writeln!(
            out,
            "{}. **{}** — {} {}: {}",
            n + 1,
            crate::markdown::md_text(&t.label),
            t.count,
            if t.count == 1 { "fact" } else { "facts" },
            ids(&t.members)
        );
        if !t.exemplars.is_empty() {
            let _ = writeln!(out, "   - exemplars: {}", ids(&t.exemplars));
        }
        if !t.dissent.is_empty() {
            let _ = writeln!(out, "   - dissent: {}", ids(&t.dissent));
        }
    }
    if c.themes.is_empty() {
        let _ = writeln!(out, "No theme was found.");
    }
    for (what, list) in [
        ("Outliers (fit no theme)", &c.outliers),
        ("Placed in no theme", &c.unthemed),
        ("**In no theme: their context failed**", &c.failed),
    ] {
        if !list.is_empty() {
            let _ = writeln!(out, "\n{what}: {}", ids(list));
        }
    }
    for e in &c.errors {
        let _ = writeln!(
            out,
            "- context at level {} ({}..{}) failed: {}",
            e.level,
            crate::markdown::md_text(&e.first),
            crate::markdown::md_text(&e.last),
            crate::markdown::md_text(&e.reason)
        );
    }
    if c.unmerged {
        let _ = writeln!(
            out,
            "\nThe merge stopped narrowing: the themes above were never all compared in one context."
        );
    }
    if let Some(why) = &c.stress_skipped {
        let _ = writeln!(
            out,
            "\nReorder stress not run: {}.",
            crate::markdown::md_text(why)
        );
    }
    if let Some(s) = &c.stress {
        let verdict = if s.drift <= s.max_drift {
            "within"
        } else {
            "**above**"
        };
        let _ = writeln!(
            out,
            "\nReorder stress: the largest drift over {} reductions is {:.2}, {verdict} the declared {:.2}.\n\n| order | fan-in | themes | drift | failed contexts |\n|---:|---:|---:|---:|---:|",
            s.runs.len(),
            s.drift,
            s.max_drift
        );
        for r in &s.runs {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {:.2} | {} |",
                r.order, r.fan_in, r.themes, r.drift, r.errors
            );
        }
    }
    out
}
