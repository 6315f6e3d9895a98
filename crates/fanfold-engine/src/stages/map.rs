//! The map stage: one bounded micro-context per unit, through the kit's
//! model turn ([`Turn::run`]); what is the map's own is here: widening,
//! `then`, and a cascade in front of the model (`map_cascade`).

use std::fmt::Write as _;
use std::path::Path;

use std::collections::HashMap;

use fanfold_core::spec::compress::CompressSpec;
use fanfold_core::spec::{BackendSpec, MapStageSpec, Spec};
use fanfold_core::{ContentHash, FactRecord, Status, UnitId};
use fanfold_store::Store;
use serde_json::Value;

use crate::error::PlanError;
use crate::error::RunError;
use crate::kit::UnitTable;
use crate::kit::{
    BuildContext, CachedCount, Calls, Outputs, Shape, Stage, StageContext, StageOutcome, Turn,
    Views,
};

use crate::kit::turn::UnitViews;
pub use crate::kit::turn::{CanaryReport, REPORT};

pub struct MapRunner {
    pub spec: MapStageSpec,
    /// The stage's model turn, compiled once.
    pub turn: Turn,
    /// A declared quality target, met by a cascade in front of the model.
    cascade: Option<super::map_cascade::CascadeRun>,
}

impl MapRunner {
    pub fn build(s: &MapStageSpec, ctx: &mut BuildContext<'_>) -> Result<MapRunner, PlanError> {
        let turn = Turn::build(s, ctx)?;
        if let Some(w) = &s.widen {
            // Any stage after this one that reads units may take them (a
            // widen stage, a tool stage that fetches more context).
            let at = |name: &str| ctx.spec.stages.iter().position(|d| d.name() == name);
            if !matches!((at(&s.name), at(&w.stage)), (Some(me), Some(to)) if to > me) {
                return Err(ctx.invalid(format!(
                    "stage `{}` widens to `{}`, which is not a stage declared after it",
                    s.name, w.stage
                )));
            }
            if let Some(p) = &w.needs
                && !p.starts_with('/')
            {
                return Err(ctx.invalid(format!(
                    "stage `{}` widen.needs `{p}` must be a JSON pointer such as \"/needs\"",
                    s.name
                )));
            }
        }
        if let Some(c) = &s.compress {
            check_compress(s, c, ctx)?;
        }
        let cascade = match &s.cascade {
            Some(c) => {
                // A map stage as the proxy scores the cascade's units
                // through its own model turn.
                let scorer = match ctx.spec.stages.iter().find(|d| d.name() == c.proxy) {
                    Some(fanfold_core::spec::StageSpec::Map(m))
                        if m.name != s.name && m.cascade.is_none() && c.features.is_none() =>
                    {
                        let m = m.clone();
                        Some(Box::new(Turn::build(&m, ctx)?))
                    }
                    _ => None,
                };
                Some(super::map_cascade::CascadeRun::build(s, c, ctx, scorer)?)
            }
            None => None,
        };
        Ok(MapRunner {
            spec: s.clone(),
            turn,
            cascade,
        })
    }

    /// Whether `fact` asks for a wider context than one unit.
    fn asks_to_widen(&self, fact: &FactRecord) -> bool {
        let Some(w) = &self.spec.widen else {
            return false;
        };
        (w.on_abstain && fact.status == Status::Abstain)
            || w.needs.as_deref().is_some_and(|p| {
                fact.status.is_cacheable()
                    && fact
                        .facts
                        .pointer(p)
                        .and_then(Value::as_array)
                        .is_some_and(|a| !a.is_empty())
            })
    }

    /// Runs the stage's model turn over `units`, sending on to the widen
    /// stage the units whose fact asks for a wider context.
    fn run_views(
        &self,
        ctx: &mut StageContext<'_>,
        units: Vec<usize>,
        views: &dyn Views,
    ) -> Result<StageOutcome, RunError> {
        let to_widen: std::sync::Mutex<Vec<usize>> = std::sync::Mutex::new(Vec::new());
        let note = |i: usize, fact: &FactRecord| {
            if self.asks_to_widen(fact) {
                to_widen.lock().unwrap_or_else(|e| e.into_inner()).push(i);
            }
        };
        let stop = self.turn.run(ctx, units, views, &note)?;
        let mut outcome = StageOutcome {
            stop,
            ..StageOutcome::default()
        };
        let mut to_widen = to_widen.into_inner().unwrap_or_else(|e| e.into_inner());
        if let Some(w) = &self.spec.widen
            && !to_widen.is_empty()
        {
            to_widen.sort_unstable();
            to_widen.dedup();
            outcome.escalated.insert(w.stage.clone(), to_widen);
        }
        Ok(outcome)
    }
}

impl MapRunner {
    /// The stage's views with what the model reads compressed: each string
    /// field of each unit not already judged in the store, its least
    /// surprising words dropped by the backend's own per-token surprise.
    fn compressed_views<'a>(
        &self,
        ctx: &mut StageContext<'_>,
        c: &CompressSpec,
        plain: UnitViews<'a>,
        units: &[usize],
    ) -> Result<CompressedViews<'a>, RunError> {
        let mut cached = std::collections::HashSet::new();
        self.turn.count_cached(
            ctx.spec,
            ctx.spec_dir,
            ctx.store,
            units,
            &plain,
            &mut |i, _| {
                cached.insert(i);
            },
        )?;
        // (unit, its view, its string fields), and every string in order.
        let mut asked: Vec<(usize, Value, FieldTexts)> = Vec::new();
        let mut texts: Vec<String> = Vec::new();
        for &i in units.iter().filter(|i| !cached.contains(i)) {
            let view = plain.view(i)?;
            let strings = fanfold_ops::compress::strings(&view);
            texts.extend(strings.iter().map(|(_, s)| s.clone()));
            asked.push((i, view, strings));
        }
        let mut shown = HashMap::new();
        if texts.is_empty() {
            return Ok(CompressedViews { plain, shown });
        }
        let sp = &self.spec;
        let backend = ctx
            .backends
            .get(ctx.spec, ctx.spec_dir, &sp.backend, sp.execution)?;
        let backend_err = |source| RunError::Backend {
            name: sp.backend.clone(),
            source,
        };
        let read = backend
            .token_surprise(&texts)
            .map_err(backend_err)?
            .ok_or_else(|| {
                backend_err(fanfold_model::BackendError::Setup(format!(
                    "stage `{}` compress: the backend scores no tokens",
                    sp.name
                )))
            })?;
        let mut surprises = read.texts.into_iter();
        let (mut words, mut kept) = (0usize, 0usize);
        for (i, view, strings) in asked {
            let mut replaced = Vec::with_capacity(strings.len());
            for (field, text) in strings {
                let tokens: Vec<fanfold_ops::compress::TokenSurprise> = surprises
                    .next()
                    .unwrap_or_default()
                    .into_iter()
                    .map(|t| fanfold_ops::compress::TokenSurprise {
                        start: t.start,
                        end: t.end,
                        nats: t.nats,
                    })
                    .collect();
                let out = fanfold_ops::compress::compress(&text, &tokens, c.keep, c.min_words);
                words += out.words;
                kept += out.kept;
                replaced.push((field, out.text));
            }
            shown.insert(i, fanfold_ops::compress::replace_strings(&view, &replaced));
        }
        // The surprise pass is one forward pass a unit, paid like a call.
        let calls = shown.len() as u64;
        ctx.stats.model_calls += calls;
        ctx.stats.cost.add(&fanfold_core::Cost {
            prompt_tokens: read.usage.prompt_tokens,
            latency_ms: read.usage.latency_ms,
            calls,
            ..fanfold_core::Cost::default()
        });
        tracing::info!(
            stage = %sp.name,
            units = calls,
            words,
            kept,
            tokens = read.usage.prompt_tokens,
            "prompt compression"
        );
        Ok(CompressedViews { plain, shown })
    }
}

/// A view's string fields, by name, in order.
type FieldTexts = Vec<(String, String)>;

/// A map stage's compression settings checked against its backend: only
/// a backend that reads the model's logits can score tokens.
fn check_compress(
    s: &MapStageSpec,
    c: &CompressSpec,
    ctx: &BuildContext<'_>,
) -> Result<(), PlanError> {
    if !(c.keep > 0.0 && c.keep <= 1.0) {
        return Err(ctx.invalid(format!(
            "stage `{}` compress.keep {} is not within (0, 1]",
            s.name, c.keep
        )));
    }
    match ctx.spec.backends.get(&s.backend) {
        Some(BackendSpec::Llama { .. } | BackendSpec::Scripted { .. }) | None => Ok(()),
        Some(other) => Err(ctx.invalid(format!(
            "stage `{}` compress: backend `{}` ({}) cannot score tokens; prompt compression needs the embedded model",
            s.name,
            s.backend,
            other.type_name()
        ))),
    }
}

/// Each unit's view, with what the model reads in place of it where the
/// stage compressed it.
struct CompressedViews<'a> {
    plain: UnitViews<'a>,
    shown: HashMap<usize, Value>,
}

impl Views for CompressedViews<'_> {
    fn view(&self, i: usize) -> Result<Value, RunError> {
        self.plain.view(i)
    }

    fn cites(&self, i: usize) -> (Vec<UnitId>, Vec<ContentHash>) {
        self.plain.cites(i)
    }

    fn shown(&self, i: usize) -> Option<Value> {
        self.shown.get(&i).cloned()
    }
}

impl super::Kind for fanfold_core::spec::MapStageSpec {
    fn build(&self, ctx: &mut BuildContext<'_>) -> Result<Box<dyn Stage>, PlanError> {
        Ok(Box::new(MapRunner::build(self, ctx)?))
    }
}

impl Stage for MapRunner {
    fn name(&self) -> &str {
        self.turn.name()
    }

    fn kind(&self) -> &'static str {
        "map"
    }

    fn definition_hash(&self) -> ContentHash {
        self.turn.definition_hash()
    }

    fn shape(&self) -> Shape<'_> {
        Shape {
            calls: Calls::Model {
                backend: &self.spec.backend,
            },
            sends: self.spec.widen.iter().map(|w| w.stage.as_str()).collect(),
            then: self.spec.then.as_deref(),
            ..Shape::units(Outputs::Stored)
        }
    }

    fn evidence_view(&self) -> Option<crate::kit::EvidenceView> {
        Some(self.turn.evidence_view())
    }

    fn output_schema(&self) -> Option<&serde_json::Value> {
        Some(&self.turn.model.schema)
    }

    fn explain(&self, spec: &Spec, out: &mut String) {
        self.turn.explain(spec, out);
        let sp = &self.spec;
        if let Some(w) = &sp.widen {
            let mut when = Vec::new();
            if w.on_abstain {
                when.push("abstain".to_owned());
            }
            if let Some(p) = &w.needs {
                when.push(format!("{p} not empty"));
            }
            let _ = writeln!(out, "    widens to {} on {}", w.stage, when.join(" or "));
        }
        if let Some(c) = &self.cascade {
            let _ = writeln!(out, "    {}", c.explain(sp));
        }
        if let Some(then) = &sp.then {
            let _ = writeln!(
                out,
                "    positives go on to `{then}` too; their facts here still decide them"
            );
        }
        if let Some(c) = &sp.compress {
            let _ = writeln!(
                out,
                "    compress: the model reads {:.0} % of each text field's words (fields of {}+ words), the least surprising to it dropped (LLMLingua-style); evidence is quoted from and checked against the uncompressed view",
                c.keep * 100.0,
                c.min_words
            );
        }
    }

    fn count_cached(
        &self,
        spec: &Spec,
        spec_dir: &Path,
        store: &Store,
        table: &UnitTable,
        units: &[usize],
    ) -> Result<CachedCount, RunError> {
        let views = self.turn.unit_views(table)?;
        let mut sent: Vec<usize> = Vec::new();
        let mut count =
            self.turn
                .count_cached(spec, spec_dir, store, units, &views, &mut |i, fact| {
                    if self.asks_to_widen(fact) {
                        sent.push(i);
                    }
                })?;
        if let Some(w) = &self.spec.widen
            && !sent.is_empty()
        {
            count.sent.insert(w.stage.clone(), sent);
        }
        Ok(count)
    }

    fn run(&self, ctx: &mut StageContext<'_>, units: Vec<usize>) -> Result<StageOutcome, RunError> {
        let plain = self.turn.unit_views(ctx.table)?;
        let compressed;
        let views: &dyn Views = match &self.spec.compress {
            Some(c) => {
                compressed = self.compressed_views(ctx, c, plain, &units)?;
                &compressed
            }
            None => &plain,
        };
        let passing = self.spec.then.is_some().then(|| units.clone());
        let mut outcome = match &self.cascade {
            Some(c) => c.run(
                &self.turn.model,
                ctx,
                units,
                &|i| views.view(i),
                &|i| views.cites(i),
                &mut |ctx, units| self.run_views(ctx, units, views),
            )?,
            None => self.run_views(ctx, units, views)?,
        };
        // Its positives go on to `then`, however they were decided (the
        // model, a cascade's proxy or its oracle); their facts here stay.
        if let Some(units) = passing {
            outcome.passed.extend(
                units
                    .into_iter()
                    .filter(|&i| ctx.ledger.status(i, self.name()) == Some(Status::Positive)),
            );
        }
        Ok(outcome)
    }

    fn report_key(&self) -> Option<&'static str> {
        Some(REPORT)
    }

    fn quality(&self, stats: &crate::kit::RunStats) -> Option<String> {
        super::map_cascade::quality(stats, self.name())
    }

    fn output_files(&self, _stats: &crate::kit::RunStats) -> Vec<(String, Vec<serde_json::Value>)> {
        // Written whenever a person is the oracle, empty when nothing is
        // wanted, so an earlier run's list never outlives its need.
        match &self.cascade {
            Some(c) if c.asks_a_person() => {
                vec![(super::map_cascade::WANTED_FILE.to_owned(), c.wanted_lines())]
            }
            _ => Vec::new(),
        }
    }

    fn shortfalls(&self, stats: &crate::kit::RunStats) -> Vec<String> {
        super::map_cascade::shortfalls(stats, self.name())
    }

    fn answer_section(&self, stats: &crate::kit::RunStats, _simulated: &str) -> Option<String> {
        super::map_cascade::answer_section(stats, self.name())
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}
