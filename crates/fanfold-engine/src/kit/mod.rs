//! The stage kit: the interface every stage kind implements and what a
//! run hands a stage. It imports nothing from `run`, `plan` or `report`:
//! the run drives stages through it, and a kind is its own file under
//! `stages/` plus one line in the registry (`stages::build`).

pub mod born;
pub mod ledger;
pub mod stats;
pub mod table;
pub mod turn;

use std::any::{Any, TypeId};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use fanfold_core::spec::{Execution, Spec};
use fanfold_core::{ContentHash, FactRecord, UnitId};
use fanfold_model::{BackendInfo, ModelBackend};
use fanfold_ops::contract::StopReason;
use fanfold_sim::RecordingBackend;
use fanfold_store::Store;

use crate::error::{PlanError, RunError};
use crate::queue::BudgetPool;

pub use ledger::{FactLedger, Origin};
pub use stats::{RunStats, StageReports};
pub use table::UnitTable;
pub use turn::{Turn, TurnParts, UnitViews, Views};

/// Receives progress while a run goes. The CLI draws bars or writes lines
/// from it; tests pass [`NoProgress`].
pub trait Progress: Sync {
    fn stage_started(&self, _stage: &str, _units: u64, _cached: u64) {}
    /// The model calls the run has made so far, retries included: said
    /// before each `unit_finished`.
    fn model_calls(&self, _calls: u64) {}
    fn unit_finished(&self, _stage: &str, _status: fanfold_core::Status) {}
    fn stage_finished(&self, _stage: &str) {}
}

pub struct NoProgress;
impl Progress for NoProgress {}

/// What building a stage from its declaration may use.
pub struct BuildContext<'a> {
    pub spec: &'a Spec,
    pub spec_path: &'a Path,
    pub spec_dir: &'a Path,
    /// Files the stage reads, by name; all of them go into the spec hash.
    pub hashed: &'a mut BTreeMap<String, String>,
    /// Every file the spec makes fanfold read, as `explain` lists them.
    pub files: &'a mut std::collections::BTreeSet<String>,
}

impl BuildContext<'_> {
    pub fn path(&self) -> String {
        self.spec_path.display().to_string()
    }

    pub fn invalid(&self, detail: String) -> PlanError {
        PlanError::Invalid {
            path: self.path(),
            detail,
        }
    }

    /// Refuses a stage whose backend no `[backends.NAME]` table declares.
    pub fn require_backend(&self, stage: &str, backend: &str) -> Result<(), PlanError> {
        if self.spec.backends.contains_key(backend) {
            return Ok(());
        }
        Err(self.invalid(format!(
            "stage `{stage}` uses backend `{backend}`, which no [backends.{backend}] table declares"
        )))
    }

    /// Reads a file the spec names, relative to the spec's folder.
    pub fn read(&mut self, what: &'static str, file: &str) -> Result<String, PlanError> {
        let full = self.spec_dir.join(file);
        self.files.insert(full.display().to_string());
        std::fs::read_to_string(&full).map_err(|source| PlanError::File {
            path: self.path(),
            what,
            file: full.display().to_string(),
            source,
        })
    }
}

/// A backend as `explain` names it: its type, and ` [SIMULATED]` when its
/// answers come from a script or a cassette.
pub(crate) fn backend_label(spec: &Spec, name: &str) -> (&'static str, &'static str) {
    let kind = spec.backends.get(name).map_or("?", |b| b.type_name());
    let simulated = if kind == "scripted" || kind == "replay" {
        " [SIMULATED]"
    } else {
        ""
    };
    (kind, simulated)
}

/// The identity of a stage's backend, from the spec alone (no weights are
/// loaded), for counting cached facts; the count to return instead when the
/// backend is not declared or cannot be named.
pub(crate) fn cached_identity(
    spec: &Spec,
    spec_dir: &Path,
    backend: &str,
    execution: Execution,
) -> Result<BackendInfo, CachedCount> {
    let bspec = spec
        .backends
        .get(backend)
        .ok_or_else(CachedCount::default)?;
    crate::backends::identity(bspec, spec_dir, execution).map_err(|e| CachedCount {
        unknown: Some(e.to_string()),
        ..CachedCount::default()
    })
}

/// What a stage's context shows of a unit, as `explain` prints it.
pub(crate) fn sees(project: Option<&str>, fields: &[String]) -> String {
    match project {
        Some(expr) => format!("project=`{expr}`"),
        None => format!("fields=[{}]", fields.join(", ")),
    }
}

/// What a run hands a stage.
pub struct StageContext<'a> {
    pub spec: &'a Spec,
    pub spec_dir: &'a Path,
    pub store: &'a Store,
    pub run_id: &'a str,
    pub table: &'a UnitTable,
    pub slots: usize,
    pub budget: &'a BudgetPool,
    pub ledger: &'a FactLedger<'a>,
    pub backends: &'a mut Backends,
    /// What kinds keep for the whole run (loaded models, quotas), one
    /// value per type.
    pub shared: &'a mut Shared,
    pub progress: &'a dyn Progress,
    pub stats: &'a mut RunStats,
    /// What the earlier rungs threw away, for a stage that reads it.
    pub negatives: &'a Negatives,
    /// The answer's facts (table position, fact), for a stage that reads
    /// facts or the answer; empty for every other stage.
    pub facts: &'a [(usize, FactRecord)],
    /// Whether a stage that acts on the answer may act.
    pub act: &'a ActGate,
}

/// What a stage that acts on the answer (an effect) may do in this run.
#[derive(Clone, Debug, Default)]
pub struct ActGate {
    /// Show what would be done; send nothing, lease nothing, journal
    /// nothing.
    pub dry_run: bool,
    /// Why nothing may be done at all (the answer is incomplete or did not
    /// verify), if so.
    pub held: Option<String>,
    /// An effect may be sent to a unit that carries an earlier version of
    /// it (`--allow-new-version`).
    pub allow_new_version: bool,
}

impl StageContext<'_> {
    /// This context for a model turn a stage owns (an audit's judge, a
    /// select's scorer): the same store, table, budget, backends and
    /// stats, with `spec` and a ledger of its own, so its facts are cached
    /// but never reach the answer.
    pub fn for_turn<'b>(
        &'b mut self,
        spec: &'b Spec,
        ledger: &'b FactLedger<'b>,
    ) -> StageContext<'b> {
        StageContext {
            spec,
            spec_dir: self.spec_dir,
            store: self.store,
            run_id: self.run_id,
            table: self.table,
            slots: self.slots,
            budget: self.budget,
            ledger,
            backends: &mut *self.backends,
            shared: &mut *self.shared,
            progress: self.progress,
            stats: &mut *self.stats,
            negatives: self.negatives,
            facts: self.facts,
            act: self.act,
        }
    }
}

/// State a stage kind keeps for the whole run, shared by every stage of
/// the kind (an embedding model loaded once): one value per type, made on
/// first use, so the kit never names what a kind keeps.
#[derive(Default)]
pub struct Shared(HashMap<TypeId, Box<dyn Any + Send>>);

impl Shared {
    /// The run's value of type `T`, made with `T::default()` the first
    /// time. Values are keyed by their type, so this is always `Some`; the
    /// `Option` only spares the kit a panic path.
    pub fn get<T: Default + Send + 'static>(&mut self) -> Option<&mut T> {
        self.0
            .entry(TypeId::of::<T>())
            .or_insert_with(|| Box::new(T::default()))
            .downcast_mut::<T>()
    }
}

/// The score each unit got from the stages that score (BM25, embedding
/// similarity), published for every unit a stage saw, passed on or not:
/// a later stage may use one as a proxy (a cascade) though a passed unit
/// has no fact of the scoring stage.
#[derive(Default)]
pub struct UnitScores(HashMap<String, HashMap<usize, f64>>);

impl UnitScores {
    pub fn put(&mut self, stage: &str, scores: impl IntoIterator<Item = (usize, f64)>) {
        self.0.entry(stage.to_owned()).or_default().extend(scores);
    }

    pub fn of(&self, stage: &str) -> Option<&HashMap<usize, f64>> {
        self.0.get(stage)
    }
}

/// `spec` under no contract: a stage's own model turn decides every unit
/// sent to it, and no bound is asked of it.
pub fn uncontracted(spec: &Spec) -> Spec {
    let mut s = spec.clone();
    s.contract = no_contract();
    s
}

/// The contract of a turn that answers no question of its own: decide
/// everything, stop for nothing but budgets.
pub fn no_contract() -> fanfold_core::spec::ContractSpec {
    fanfold_core::spec::ContractSpec::Exhaustive {
        answer: String::new(),
        themes: None,
        top_themes: 0,
    }
}

/// What the rungs a stage reads threw away, and what the answer holds so
/// far, for a stage that bounds what was missed.
#[derive(Debug, Default)]
pub struct Negatives {
    /// The negatives of each rung read, by rung name.
    pub rungs: BTreeMap<String, RungUnits>,
    /// Units whose answer so far is positive.
    pub found: u64,
    /// Units thrown away by rungs that are not read (the prefilter's
    /// exclusions when it is not one of them), or left undecided.
    pub elsewhere: u64,
}

/// What one rung threw away.
#[derive(Debug, Default)]
pub struct RungUnits {
    /// How many units the rung ended as negative.
    pub population: u64,
    /// Table positions of those units: all of a stage's; for the
    /// prefilter, the seeded sample the route phase kept (its exclusions
    /// are not held in memory).
    pub units: Vec<usize>,
    /// How near each unit came to being kept (higher is nearer): its
    /// score at a scoring stage, or one minus its confidence; empty when
    /// the rung has neither.
    pub nearness: HashMap<usize, f64>,
}

/// What a stage reads instead of a queue: the negatives of earlier rungs.
#[derive(Clone, Debug)]
pub struct NegativeReads {
    /// `"prefilter"` or names of earlier stages.
    pub rungs: Vec<String>,
    /// Seeds the sample order.
    pub seed: u64,
    /// The most units sampled from one rung.
    pub most: usize,
}

/// How a stage ended.
#[derive(Default)]
pub struct StageOutcome {
    /// Table positions of the units passed on to the stage's `then`.
    pub passed: Vec<usize>,
    /// Units sent on to other stages by name (a select's choices), each
    /// list in table order.
    pub sent: BTreeMap<String, Vec<usize>>,
    /// Units sent on whose answer is the receiving stage's fact, not this
    /// stage's (a map's undecided units, widened), each list in table
    /// order.
    pub escalated: BTreeMap<String, Vec<usize>>,
    /// Why the stage stopped early, if it did.
    pub stop: Option<StopReason>,
    /// Units the stage's observations bore, each for a later stage: the
    /// run adds them to the table and queues them there.
    pub born: Vec<born::Litter>,
}

/// How the verify phase rebuilds the view a stage's facts were judged in,
/// to find their evidence quotes again.
#[derive(Clone, Debug)]
pub struct EvidenceView {
    pub project: Option<String>,
    pub fields: Vec<String>,
    /// The view is the first cited unit's, widened with the rest as its
    /// related members (a widen stage); else the first cited unit's alone.
    pub widened: bool,
    /// The view is every cited unit's, one field per member and field (a
    /// group stage's, `fanfold_ops::group::group_view`).
    pub grouped: bool,
}

/// What `explain` can tell about a stage from the store, without running it.
#[derive(Default)]
pub struct CachedCount {
    /// Units whose fact is stored.
    pub cached: u64,
    /// Of those, the ones the stage passes on to its `then`.
    pub passed: Vec<usize>,
    /// Of those, the ones it sends on to other stages, by name.
    pub sent: BTreeMap<String, Vec<usize>>,
    /// Why nothing could be counted (the backend's identity is unknown).
    pub unknown: Option<String>,
    /// The model calls the rest would take, where not one per unit.
    pub calls: Option<u64>,
    /// What its stored observations would bear as units, if it bears any.
    pub bred: Option<Box<born::BredPreview>>,
}

/// What a stage reads.
#[derive(Clone, Copy, Debug)]
pub enum Reads<'a> {
    /// The units sent to it: from the prefilter, or passed on by a stage
    /// in front of it.
    Units,
    /// The answer's facts of the named stage (a model reducer): it is
    /// sent no units and runs once every unit stage has run, with the
    /// facts in [`StageContext::facts`].
    Facts { of: &'a str },
    /// The negatives of earlier rungs (an audit): it runs once, after
    /// every stage before it, and may pass units back to an earlier stage.
    Negatives(&'a NegativeReads),
    /// The units the answer selected (an effect): it runs once the answer
    /// is folded and verified, over the answer's items, with their facts
    /// in [`StageContext::facts`].
    Answer,
}

/// What a stage calls to decide a unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Calls<'a> {
    /// Nothing outside the process: rules, lexical scores, local vectors.
    Nothing,
    /// A model, through the named backend.
    Model { backend: &'a str },
    /// A read-only tool; `sends_to` is what leaves the machine (a URL
    /// template, a program), `None` for a local read (a file, SQLite).
    Tool { sends_to: Option<&'a str> },
    /// An action on a target outside (`acts_on`: the method and URL
    /// template), carried out once and read back.
    Effect { acts_on: &'a str },
}

/// Whether a stage's facts are stored under their content keys (a rerun
/// reads them back) or made again by every run from what it reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outputs {
    Stored,
    Derived,
}

/// A stage's declared properties.
#[derive(Clone, Debug)]
pub struct Shape<'a> {
    pub reads: Reads<'a>,
    pub calls: Calls<'a>,
    pub outputs: Outputs,
    /// The stage the units it passes go to, if any.
    pub then: Option<&'a str>,
    /// Other stages it may send units to by name (a select's choices, a
    /// map's undecided units sent to be widened).
    pub sends: Vec<&'a str>,
}

impl<'a> Shape<'a> {
    /// A stage that reads the units sent to it and calls nothing.
    pub fn units(outputs: Outputs) -> Shape<'a> {
        Shape {
            reads: Reads::Units,
            calls: Calls::Nothing,
            outputs,
            then: None,
            sends: Vec::new(),
        }
    }

    /// Every stage it may send units to; the plan checks each is declared
    /// after it (or, for a stage that reads negatives, before it).
    pub fn targets(&self) -> Vec<&'a str> {
        self.then
            .into_iter()
            .chain(self.sends.iter().copied())
            .collect()
    }

    pub fn reads_facts(&self) -> Option<&'a str> {
        match self.reads {
            Reads::Facts { of } => Some(of),
            _ => None,
        }
    }

    pub fn reads_negatives(&self) -> Option<&'a NegativeReads> {
        match self.reads {
            Reads::Negatives(r) => Some(r),
            _ => None,
        }
    }

    /// The backend it calls, if it calls a model.
    pub fn backend(&self) -> Option<&'a str> {
        match self.calls {
            Calls::Model { backend } => Some(backend),
            Calls::Nothing | Calls::Tool { .. } | Calls::Effect { .. } => None,
        }
    }

    /// Whether it acts on the answer once it is verified (an effect).
    pub fn reads_answer(&self) -> bool {
        matches!(self.reads, Reads::Answer)
    }
}

/// One operator of the plan.
pub trait Stage: Send + Sync {
    fn name(&self) -> &str;
    /// The kind, as the spec names it (`map`, `embed`, `audit`, `select`,
    /// `chunk`, `cluster`, `bm25`, `widen`).
    fn kind(&self) -> &'static str;
    /// The hash of what the stage means; part of every key of its facts.
    fn definition_hash(&self) -> ContentHash;
    /// What the stage reads, calls, keeps and sends on: declared, so the
    /// plan can check the graph and the run needs nothing else to drive
    /// it.
    fn shape(&self) -> Shape<'_>;
    /// How its facts' evidence is found again, for a stage whose facts
    /// quote what their context showed.
    fn evidence_view(&self) -> Option<EvidenceView> {
        None
    }
    /// The JSON Schema its facts' `facts` satisfy, if it declares one: the
    /// plan checks reducers' pointers into them.
    fn output_schema(&self) -> Option<&serde_json::Value> {
        None
    }
    /// Its lines in `fanfold explain`.
    fn explain(&self, spec: &Spec, out: &mut String);
    /// Counts the cached facts of `units` without loading a model.
    fn count_cached(
        &self,
        spec: &Spec,
        spec_dir: &Path,
        store: &Store,
        table: &UnitTable,
        units: &[usize],
    ) -> Result<CachedCount, RunError>;
    /// The model calls `units` would take before any cache is consulted,
    /// where that is not one per unit (a chunk stage: one per context).
    fn planned_calls(&self, _table: &UnitTable, _units: &[usize]) -> Result<Option<u64>, RunError> {
        Ok(None)
    }
    /// Runs the stage over `units` (table positions, in source order),
    /// recording every fact that ends a unit here in the ledger.
    fn run(&self, ctx: &mut StageContext<'_>, units: Vec<usize>) -> Result<StageOutcome, RunError>;
    /// Once every stage has run: looks at the answer's facts (table
    /// position, fact) to measure what the stage did, e.g. a select's
    /// choices against what the stages it chose said.
    fn review(&self, _facts: &[(usize, FactRecord)], _stats: &mut RunStats) {}
    /// The key its kind's report sits under in the run's stats; the run
    /// declares it, so the certificate shows the key even when the stage
    /// reported nothing.
    fn report_key(&self) -> Option<&'static str> {
        None
    }
    /// Why the answer is not whole, by the stage's own report (an audit's
    /// unproven rungs, a cluster's lost facts).
    fn shortfalls(&self, _stats: &RunStats) -> Vec<String> {
        Vec::new()
    }
    /// Units the stage's report cites, which verify reads back with the
    /// answer's own.
    fn cited(&self, _stats: &RunStats) -> Vec<UnitId> {
        Vec::new()
    }
    /// What the stage proved of the answer's quality (a declared target,
    /// its estimate, whether it holds), if it declares a target. A run in
    /// which no stage does says its quality is unmeasured.
    fn quality(&self, _stats: &RunStats) -> Option<String> {
        None
    }
    /// The stage's section of answer.md, if it adds one; `simulated` is
    /// the label to put beside its heading.
    fn answer_section(&self, _stats: &RunStats, _simulated: &str) -> Option<String> {
        None
    }
    /// The stage's line under answer.md's Accounting, if it adds one.
    fn accounting(&self, _stats: &RunStats) -> Option<String> {
        None
    }
    /// Files the stage adds beside the answer: (file name, JSON lines).
    fn output_files(&self, _stats: &RunStats) -> Vec<(String, Vec<serde_json::Value>)> {
        Vec::new()
    }
    /// A unit this stage's observation bore, read back for verify from
    /// what the store holds (the stored observation of `parent`, whose
    /// value is read back the same way), never from the run's memory.
    /// `None` when the stage bears no units or the record is gone.
    fn reread_born(
        &self,
        _store: &Store,
        _parent_id: &UnitId,
        _parent: &serde_json::Value,
        _id: &UnitId,
    ) -> Option<serde_json::Value> {
        None
    }
    /// The id a record of `parent`'s observation is bred under here, if
    /// the stage breeds units: `fanfold verify` checks a bred unit's id
    /// against it.
    fn bred_id(&self, _parent: &UnitId, _record: &serde_json::Value) -> Option<UnitId> {
        None
    }
    /// The concrete stage, for tools that drive one kind directly.
    fn as_any(&self) -> &dyn std::any::Any;
}

/// Backends built for a run, one per (name, execution), and the identity
/// each reported.
#[derive(Default)]
pub struct Backends {
    built: HashMap<(String, Execution), Box<dyn ModelBackend>>,
    pub infos: Vec<BackendInfo>,
    /// Append every call to this replay cassette.
    pub record: Option<PathBuf>,
    /// Hand online calls to workers through this store instead of making
    /// them here.
    pub fleet: Option<crate::fleet::FleetLink>,
}

impl Backends {
    pub fn new(record: Option<PathBuf>) -> Backends {
        Backends {
            record,
            ..Backends::default()
        }
    }

    pub fn get(
        &mut self,
        spec: &Spec,
        spec_dir: &Path,
        name: &str,
        execution: Execution,
    ) -> Result<&dyn ModelBackend, RunError> {
        let key = (name.to_owned(), execution);
        if !self.built.contains_key(&key) {
            let err = |source| RunError::Backend {
                name: name.to_owned(),
                source,
            };
            let bspec = spec
                .backends
                .get(name)
                .ok_or_else(|| err(fanfold_model::BackendError::Setup("not declared".into())))?;
            let mut b = match &self.fleet {
                // Provider batches are submitted by the coordinator itself.
                Some(link) if execution == Execution::Online => {
                    Box::new(crate::fleet::FleetBackend::new(link, bspec, spec_dir).map_err(err)?)
                }
                _ => crate::backends::build(bspec, spec_dir, execution).map_err(err)?,
            };
            if let Some(path) = &self.record {
                b = Box::new(RecordingBackend::create(b, path).map_err(err)?);
            }
            let info = b.info();
            if !self.infos.contains(&info) {
                self.infos.push(info);
            }
            self.built.insert(key.clone(), b);
        }
        self.built
            .get(&key)
            .map(|b| b.as_ref())
            .ok_or_else(|| RunError::Backend {
                name: name.to_owned(),
                source: fanfold_model::BackendError::Setup("not built".into()),
            })
    }
}

/// Requests started per second, at most: each caller waits for its turn.
/// Shared by the stages that reach outside under a declared `per_second`
/// quota (tools, effects).
pub struct Pace {
    per_second: Option<f64>,
    next_start: std::sync::Mutex<std::time::Instant>,
}

impl Pace {
    pub fn new(per_second: Option<f64>) -> Pace {
        Pace {
            per_second,
            next_start: std::sync::Mutex::new(std::time::Instant::now()),
        }
    }

    /// Sleeps until this caller's start is due.
    pub fn wait(&self) {
        let Some(rate) = self.per_second else {
            return;
        };
        let wait = {
            let mut next = self.next_start.lock().unwrap_or_else(|e| e.into_inner());
            let now = std::time::Instant::now();
            let start = (*next).max(now);
            *next = start + std::time::Duration::from_secs_f64(1.0 / rate);
            start - now
        };
        std::thread::sleep(wait);
    }
}
