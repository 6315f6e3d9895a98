//! The chunk stage: many units in one model context, the model listing the
//! ids that match. The coarse-grained and long-context baselines run
//! through here, on the same queue, budgets, store and fold as the
//! micro-context map, so a comparison between them measures granularity
//! and nothing else.

use std::fmt::Write as _;
use std::path::Path;

use fanfold_core::spec::{ChunkStageSpec, Execution, Spec};
use fanfold_core::{ContentHash, Cost, FACT_SCHEMA, FactRecord, StableHash, Status, Unit};
use std::sync::OnceLock;

use fanfold_ops::chunk::{ChunkStage, Packing, TokenCount};
use fanfold_ops::view::{INPUT_BUCKET, Projector};
use fanfold_store::Store;
use serde_json::{Value, json};

use crate::batches::StoreLedger;
use crate::error::PlanError;
use crate::error::RunError;
use crate::error::project_err;
use crate::kit::UnitTable;
use crate::kit::ledger::Origin;
use crate::kit::turn::model_params;
use crate::kit::{
    BuildContext, CachedCount, Calls, Outputs, Shape, Stage, StageContext, StageOutcome,
};
use crate::queue::{Pending, Prompt, StageJob, UnitResult};

pub struct ChunkRunner {
    pub stage: ChunkStage,
    /// The embedded model's tokenizer, once its file is at hand: packing
    /// counts with it, so a long context fills its window.
    vocabulary: OnceLock<fanfold_llama::Vocabulary>,
    /// The stage's embedded model file, when its backend is the embedded
    /// model: its tokenizer counts what packing fits in a window.
    model_file: Option<ModelFile>,
}

/// Where an embedded model's file is.
enum ModelFile {
    /// The default model, in the model cache once fetched.
    Default,
    /// A GGUF the spec (or `--model`) names.
    Path(std::path::PathBuf),
}

/// A stage's units laid out in contexts, with each context's key.
struct Layout {
    /// Per unit (in the order given): its projected input's key.
    inputs: Vec<ContentHash>,
    packing: Packing,
    /// Per context: its key.
    keys: Vec<ContentHash>,
}

impl ChunkRunner {
    pub fn build(s: &ChunkStageSpec, ctx: &mut BuildContext<'_>) -> Result<ChunkRunner, PlanError> {
        ctx.require_backend(&s.name, &s.backend)?;
        // The embedded model holds a context in one slot; a slot too small
        // would cut every context, so the plan refuses it.
        if let Some(fanfold_core::spec::BackendSpec::Llama { slot_tokens, .. }) =
            ctx.spec.backends.get(&s.backend)
            && u64::from(*slot_tokens) < s.window_tokens
        {
            return Err(ctx.invalid(format!(
                "stage `{}` packs contexts of {} tokens, but backend `{}` has slot_tokens = {slot_tokens}; raise slot_tokens to at least window_tokens",
                s.name, s.window_tokens, s.backend
            )));
        }
        let rubric = ctx.read("rubric", &s.rubric)?;
        ctx.hashed
            .insert(format!("rubric:{}", s.name), rubric.clone());
        let stage = ChunkStage::new(s.clone(), rubric).map_err(|e| ctx.invalid(e.to_string()))?;
        Ok(ChunkRunner {
            stage,
            vocabulary: OnceLock::new(),
            model_file: match ctx.spec.backends.get(&s.backend) {
                Some(fanfold_core::spec::BackendSpec::Llama { model: Some(m), .. }) => {
                    Some(ModelFile::Path(ctx.spec_dir.join(m)))
                }
                Some(fanfold_core::spec::BackendSpec::Llama { model: None, .. }) => {
                    Some(ModelFile::Default)
                }
                _ => None,
            },
        })
    }

    fn projector(&self) -> Result<Projector, RunError> {
        let sp = &self.stage.spec;
        Projector::compile(sp.name.as_str(), sp.project.as_deref(), &sp.fields).map_err(project_err)
    }

    /// The tokenizer of the stage's embedded model when its file is at
    /// hand (a run has fetched it before packing; `explain` never fetches,
    /// and without the file estimates). HTTP models are estimated.
    fn vocabulary(&self) -> Option<&fanfold_llama::Vocabulary> {
        if let Some(v) = self.vocabulary.get() {
            return Some(v);
        }
        let path = match self.model_file.as_ref()? {
            ModelFile::Path(p) => Some(p.clone()).filter(|p| p.is_file()),
            ModelFile::Default => {
                crate::models::cached(&crate::models::SMOLLM2_135M, &crate::models::cache_dir())
            }
        }?;
        match fanfold_llama::Vocabulary::open(&path) {
            Ok(v) => {
                let _ = self.vocabulary.set(v);
                self.vocabulary.get()
            }
            Err(e) => {
                tracing::warn!(
                    "stage `{}`: packing estimates tokens, the tokenizer of {} did not load: {e}",
                    self.stage.name(),
                    path.display()
                );
                None
            }
        }
    }

    /// Projects every unit once (for its input key and its size in a
    /// context), packs them and keys each context.
    fn layout(
        &self,
        table: &UnitTable,
        units: &[usize],
        model: &fanfold_core::ModelParams,
        count: &TokenCount<'_>,
    ) -> Result<Layout, RunError> {
        let (inputs, packing) = self.pack(table, units, count)?;
        let keys = packing
            .contexts
            .iter()
            .map(|r| {
                let members: Vec<(&str, ContentHash)> = r
                    .clone()
                    .filter_map(|k| {
                        let id = table.id(*units.get(k)?).ok()?;
                        Some((id.as_str(), *inputs.get(k)?))
                    })
                    .collect();
                self.stage.context_key(&members, model)
            })
            .collect();
        Ok(Layout {
            inputs,
            packing,
            keys,
        })
    }

    /// Each unit's input key, and the units packed into contexts.
    fn pack(
        &self,
        table: &UnitTable,
        units: &[usize],
        count: &TokenCount<'_>,
    ) -> Result<(Vec<ContentHash>, Packing), RunError> {
        let projector = self.projector()?;
        let mut inputs = Vec::with_capacity(units.len());
        let mut tokens = Vec::with_capacity(units.len());
        for &i in units {
            let id = table.id(i)?;
            let projected = projector
                .project(id.as_str(), &table.value(i))
                .map_err(project_err)?;
            inputs.push(projected.key_in(INPUT_BUCKET));
            tokens.push(count.tokens(&self.stage.member(id.as_str(), &projected)));
        }
        let room = self.stage.member_tokens_per_context(count);
        Ok((inputs, self.stage.pack(&tokens, room)))
    }

    /// Runs `f` with the stage's token count.
    fn with_count<T>(&self, f: impl FnOnce(&TokenCount<'_>) -> T) -> T {
        match self.vocabulary() {
            Some(v) => {
                let count = |text: &str| v.count(text);
                f(&TokenCount::Tokenizer(&count))
            }
            None => f(&TokenCount::Estimate),
        }
    }
}

impl super::Kind for fanfold_core::spec::ChunkStageSpec {
    fn build(&self, ctx: &mut BuildContext<'_>) -> Result<Box<dyn Stage>, PlanError> {
        Ok(Box::new(ChunkRunner::build(self, ctx)?))
    }
}

impl Stage for ChunkRunner {
    fn name(&self) -> &str {
        self.stage.name()
    }

    fn kind(&self) -> &'static str {
        "chunk"
    }

    fn definition_hash(&self) -> ContentHash {
        self.stage.definition_hash()
    }

    fn shape(&self) -> Shape<'_> {
        Shape {
            calls: Calls::Model {
                backend: &self.stage.spec.backend,
            },
            ..Shape::units(Outputs::Stored)
        }
    }

    fn explain(&self, spec: &Spec, out: &mut String) {
        let sp = &self.stage.spec;
        let (backend, simulated) = crate::kit::backend_label(spec, &sp.backend);
        let size = sp
            .size
            .map_or("as many as fit".to_owned(), |n| n.to_string());
        let contexts = sp
            .max_contexts
            .map_or("any number of".to_owned(), |n| format!("at most {n}"));
        let _ = writeln!(
            out,
            "  {} chunk v{} backend={}({}){simulated} attempts={} max_output_tokens={}\n    sees {}",
            sp.name,
            sp.version,
            sp.backend,
            backend,
            sp.max_attempts,
            sp.max_output_tokens,
            crate::kit::sees(sp.project.as_deref(), &sp.fields)
        );
        let (room, how) = self.with_count(|count| {
            (
                self.stage.member_tokens_per_context(count),
                count.describe(),
            )
        });
        let _ = writeln!(
            out,
            "    {size} units a context, {contexts} contexts of {} tokens ({room} tokens of records each, {how}); the model lists the matching ids",
            sp.window_tokens,
        );
        let _ = writeln!(
            out,
            "    shared prefix {} bytes (rubric {})",
            self.stage.turn.prefix().len(),
            sp.rubric
        );
    }

    fn count_cached(
        &self,
        spec: &Spec,
        spec_dir: &Path,
        store: &Store,
        table: &UnitTable,
        units: &[usize],
    ) -> Result<CachedCount, RunError> {
        let sp = &self.stage.spec;
        let info = match crate::kit::cached_identity(spec, spec_dir, &sp.backend, sp.execution) {
            Ok(info) => info,
            Err(count) => return Ok(count),
        };
        let model = model_params(&info, &self.stage.turn);
        let layout = self.with_count(|count| self.layout(table, units, &model, count))?;
        let mut count = CachedCount {
            calls: Some(0),
            ..CachedCount::default()
        };
        for (range, key) in layout.packing.contexts.iter().zip(&layout.keys) {
            let mut stored = 0;
            for k in range.clone() {
                let Some(&i) = units.get(k) else { continue };
                let unit_key = ChunkStage::unit_key(key, table.id(i)?.as_str());
                if store.get_fact(&unit_key)?.is_some() {
                    stored += 1;
                }
            }
            // A context is reused only whole.
            if stored == range.len() as u64 {
                count.cached += stored;
            } else {
                count.calls = count.calls.map(|c| c + 1);
            }
        }
        Ok(count)
    }

    fn planned_calls(&self, table: &UnitTable, units: &[usize]) -> Result<Option<u64>, RunError> {
        let packed = self.with_count(|count| self.pack(table, units, count))?;
        Ok(Some(packed.1.contexts.len() as u64))
    }

    fn run(&self, ctx: &mut StageContext<'_>, units: Vec<usize>) -> Result<StageOutcome, RunError> {
        let stage = &self.stage;
        let turn = &stage.turn;
        let execution = stage.spec.execution;
        let backend = ctx
            .backends
            .get(ctx.spec, ctx.spec_dir, &stage.spec.backend, execution)?;
        let info = backend.info();
        let model = model_params(&info, turn);
        let table = ctx.table;
        let (layout, room) = self.with_count(|count| {
            let layout = self.layout(table, &units, &model, count)?;
            Ok::<_, RunError>((
                layout,
                (stage.member_tokens_per_context(count), count.describe()),
            ))
        })?;
        let projector = self.projector()?;
        let ledger = ctx.ledger;
        let progress = ctx.progress;

        let fact = |u: &Unit, key: ContentHash, status: Status| -> FactRecord {
            FactRecord {
                schema: FACT_SCHEMA.into(),
                key,
                source_ids: vec![u.unit_id.clone()],
                source_hashes: vec![u.unit_hash],
                stage: stage.name().to_owned(),
                stage_version: stage.spec.version,
                rubric_hash: turn.rubric_hash,
                model: model.clone(),
                status,
                decision: None,
                facts: Value::Null,
                confidence: None,
                choice_scores: Vec::new(),
                reason: None,
                evidence: Vec::new(),
                cost: Cost::default(),
                attempts: 0,
                reducer_path: Vec::new(),
                truncated_tokens: 0,
                digest: None,
            }
        };
        // (table position, unit) of the `k`th unit routed here; `layout`
        // looked every one up already.
        let table_index = |k: usize| {
            let i = *units.get(k)?;
            Some((i, table.unit(i).ok()?))
        };

        // Units no context can hold end here, said plainly: never negative.
        let (room, how) = room;
        let mut left_out = 0u64;
        for (&k, reason) in layout
            .packing
            .too_large
            .iter()
            .map(|k| {
                (
                    k,
                    format!(
                        "too_large: larger than one context's {room} tokens of records ({how})"
                    ),
                )
            })
            .chain(layout.packing.outside.iter().map(|k| {
                (
                    k,
                    format!(
                        "outside_window: past the last of the stage's {} contexts",
                        stage.spec.max_contexts.unwrap_or(0)
                    ),
                )
            }))
        {
            let (Some((i, u)), Some(input)) = (table_index(k), layout.inputs.get(k)) else {
                continue;
            };
            let mut f = fact(u, *input, Status::NotRun);
            f.reason = Some(reason);
            ledger.record(i, f, Origin::Derived);
            left_out += 1;
        }

        // Contexts whose every member's fact is stored are reused whole.
        let mut pending = Vec::new();
        let mut cached = 0u64;
        for (c, (range, key)) in layout.packing.contexts.iter().zip(&layout.keys).enumerate() {
            let members: Vec<(usize, &Unit)> = range.clone().filter_map(table_index).collect();
            let mut stored = Vec::with_capacity(members.len());
            for &(i, u) in &members {
                match ctx
                    .store
                    .get_fact(&ChunkStage::unit_key(key, u.unit_id.as_str()))?
                {
                    Some(f) => stored.push((i, u, f)),
                    None => break,
                }
            }
            if stored.len() == members.len() {
                for (i, u, mut f) in stored {
                    f.source_ids = vec![u.unit_id.clone()];
                    f.source_hashes = vec![u.unit_hash];
                    ledger.record(i, f, Origin::Cached);
                    cached += 1;
                    ctx.stats.cache_hits += 1;
                }
                continue;
            }
            ctx.stats.cache_misses += members.len() as u64;
            let first = members.first().map_or("", |(_, u)| u.unit_id.as_str());
            let last = members.last().map_or("", |(_, u)| u.unit_id.as_str());
            pending.push(Pending {
                index: c,
                unit_id: format!("{first}..{last}"),
                attempt: 1,
                bound: None,
                prompt: None,
                not_before: None,
            });
        }
        ctx.progress
            .stage_started(stage.name(), units.len() as u64, cached + left_out);

        let members_of = |c: usize| -> Vec<(usize, &Unit)> {
            layout
                .packing
                .contexts
                .get(c)
                .map(|r| r.clone().filter_map(table_index).collect())
                .unwrap_or_default()
        };
        // A context's prompt is built as it opens: the queue holds context
        // numbers. The projections succeeded above, so they succeed again.
        let prepare = |c: usize| -> Prompt {
            let mut blocks = Vec::new();
            let mut records = Vec::new();
            let mut ids = Vec::new();
            for (i, u) in members_of(c) {
                let id = u.unit_id.as_str();
                let projected = projector
                    .project(id, &table.value(i))
                    .unwrap_or(Value::Null);
                blocks.push(stage.member(id, &projected));
                ids.push(id);
                records.push(json!({"id": id, "record": projected}));
            }
            Prompt {
                suffix: stage.suffix(&blocks),
                schema: Some(stage.schema_for(&ids)),
                input: json!({ "records": records }),
            }
        };
        let interpret = |raw: &str, input: &Value| {
            let ids: Vec<&str> = input
                .get("records")
                .and_then(Value::as_array)
                .map(|rs| {
                    rs.iter()
                        .filter_map(|r| r.get("id").and_then(Value::as_str))
                        .collect()
                })
                .unwrap_or_default();
            stage.interpret(raw, &ids)
        };
        // One fact per member: listed or not, or the context's failure.
        // The call's cost is the first member's, so sums stay exact.
        let finish = |c: usize, r: &UnitResult| {
            let Some(key) = layout.keys.get(c) else {
                return;
            };
            let matched: Vec<&str> = r
                .interpreted
                .as_ref()
                .and_then(|it| it.facts.get("matches"))
                .and_then(Value::as_array)
                .map(|l| l.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            for (n, (i, u)) in members_of(c).into_iter().enumerate() {
                if ledger.has(i, stage.name()) {
                    continue;
                }
                let id = u.unit_id.as_str();
                let mut f = fact(u, ChunkStage::unit_key(key, id), r.status);
                if r.truncated_tokens > 0 {
                    // The backend cut the context: the records at its end
                    // were never read, so no member's answer is trusted.
                    f.status = Status::Error;
                    f.reason = Some(format!(
                        "truncated: the backend cut {} tokens of this context to fit its window",
                        r.truncated_tokens
                    ));
                } else if r.interpreted.is_some() {
                    let listed = matched.contains(&id);
                    f.status = if listed {
                        Status::Positive
                    } else {
                        Status::Negative
                    };
                    let decision = if listed { "match" } else { "no_match" };
                    f.decision = Some(decision.into());
                    f.facts = json!({"decision": decision, "context": key.short(12)});
                } else {
                    f.reason = r.reason.clone();
                }
                f.attempts = r.attempts;
                f.truncated_tokens = r.truncated_tokens;
                if n == 0 {
                    f.cost = Cost {
                        prompt_tokens: r.usage.prompt_tokens,
                        cached_tokens: r.usage.cached_tokens,
                        completion_tokens: r.usage.completion_tokens,
                        usd: backend.cost_usd(&r.usage).unwrap_or(0.0),
                        latency_ms: r.usage.latency_ms,
                        calls: u64::from(r.attempts),
                    };
                }
                let status = f.status;
                ledger.record(i, f, Origin::Fresh);
                progress.unit_finished(stage.name(), status);
            }
        };
        let slots = match execution {
            Execution::Online => ctx.slots,
            Execution::Batch => pending.len(),
        };
        let batch_ledger = StoreLedger(ctx.store);
        let mut job = StageJob::new(
            turn,
            slots,
            pending,
            ctx.budget,
            ledger.controller(),
            &finish,
            &prepare,
        );
        job.set_interpreter(&interpret);
        job.set_batch_ledger(&batch_ledger);
        job.set_halt(ledger.failed_flag());
        let price = |u: &fanfold_model::Usage| backend.cost_usd(u);
        job.set_price(&price);
        backend.run(&job).map_err(|source| RunError::Backend {
            name: stage.spec.backend.clone(),
            source,
        })?;
        let (results, max_in_flight, stop) = job.finish();
        for (c, r) in &results {
            finish(*c, r);
        }
        if let Some(e) = ledger.take_store_error() {
            return Err(e.into());
        }
        ctx.progress.stage_finished(stage.name());
        ctx.stats.max_in_flight = ctx.stats.max_in_flight.max(max_in_flight);
        let packing = &layout.packing;
        ctx.stats
            .reports
            .update(REPORT, stage.name(), |chunks: &mut ChunkReport| {
                chunks.contexts = packing.contexts.len() as u64;
                chunks.too_large = packing.too_large.len() as u64;
                chunks.outside_window = packing.outside.len() as u64;
                chunks.room_tokens = room;
                chunks.counted = how.to_owned();
                chunks.largest = packing
                    .contexts
                    .iter()
                    .map(|r| r.len() as u64)
                    .max()
                    .unwrap_or(0);
            });
        Ok(StageOutcome {
            stop,
            ..StageOutcome::default()
        })
    }

    fn report_key(&self) -> Option<&'static str> {
        Some(REPORT)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// The key of chunk stages' reports in the run's stats.
pub const REPORT: &str = "chunks";

/// How a chunk stage laid its units out, for the certificate.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ChunkReport {
    /// Contexts the units were packed into.
    pub contexts: u64,
    /// Members of the largest context.
    pub largest: u64,
    /// Units larger than a context (ended `not_run`).
    pub too_large: u64,
    /// Units past the last context allowed (ended `not_run`).
    pub outside_window: u64,
    /// Tokens of records one context holds.
    #[serde(default)]
    pub room_tokens: u64,
    /// How they were counted: by the model's tokenizer, or estimated.
    #[serde(default)]
    pub counted: String,
}
