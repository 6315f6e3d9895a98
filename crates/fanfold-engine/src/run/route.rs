//! The route phase: partition the stored artifact and run the prefilter in
//! one streaming pass, writing units, rejections and each unit's deciding
//! rule to the store in batched transactions. Only the units routed to a
//! stage stay in memory, as compact JSON text; everything else is counted
//! and written out as it goes by.
//!
//! `explain` runs the same pass over the input without writing anything.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::io::Read;
use std::sync::atomic::{AtomicBool, Ordering};

use fanfold_core::spec::PrefilterRule;
use fanfold_core::{ContentHash, StableHash, Unit};
use fanfold_ops::audit::{BottomK, sample_rank};
use fanfold_ops::partition::{
    CompactSeen, ConfirmRepeat, Coverage, PartitionError, PartitionOptions, SeenIds, SeenKeys,
    StreamOptions, Streamed, UnitPlace, UnitView,
};
use fanfold_ops::prefilter::fast::RecordPrefilter;
use fanfold_ops::prefilter::{Outcome, PrefilterError};
use fanfold_store::{
    PartitionBatch, PartitionCounts, RULE_NONE, RULE_REJECTED, RejectionRow, Store,
};
use serde_json::Value;

use crate::error::RunError;
pub use crate::kit::table::UnitTable;
use crate::plan::Plan;

/// Rejections listed in full in a certificate; the counts cover the rest.
pub const MAX_LISTED_REJECTIONS: usize = 20;

/// Units written per store transaction.
const UNITS_PER_WRITE: usize = 20_000;

/// What the route phase found.
pub struct Routed {
    pub table: UnitTable,
    /// Stage name -> table positions of the units the prefilter sent to it,
    /// in source order.
    pub by_stage: BTreeMap<String, Vec<usize>>,
    pub coverage: Coverage,
    pub rejected_by_reason: BTreeMap<String, u64>,
    /// The first rejections in full.
    pub rejections: Vec<String>,
    /// The first identical repeats in full (the coverage counts them all).
    pub repeats: Vec<String>,
    pub excluded_by_reason: BTreeMap<String, u64>,
    /// Seed -> table positions of the prefilter's exclusions sampled for
    /// an audit with that seed, in sample order. Held in the table, but
    /// routed to no stage.
    pub excluded_samples: BTreeMap<u64, Vec<usize>>,
    /// The store's ids of the partition and prefilter, when written.
    pub partition_id: Option<i64>,
    pub prefilter_id: Option<i64>,
}

/// The key of a partition: the source and every setting that shapes units.
pub fn partition_key(plan: &Plan, source: &ContentHash, max_unit_bytes: u64) -> ContentHash {
    let mut h = fanfold_core::StableHasher::new(fanfold_core::Bucket::Partition);
    h.field("source", source);
    h.field(
        "spec",
        &serde_json::to_value(&plan.spec.input.partition).unwrap_or(Value::Null),
    );
    h.field("max_unit_bytes", &max_unit_bytes);
    h.finish()
}

/// The key of a prefilter: its rules, in order.
pub fn prefilter_key(rules: &[PrefilterRule]) -> ContentHash {
    serde_json::to_value(rules)
        .unwrap_or(Value::Null)
        .key_in(fanfold_core::Bucket::Prefilter)
}

/// Where the route phase writes, when it writes.
struct Writer<'a> {
    store: &'a Store,
    partition: i64,
    prefilter: i64,
    /// False when an earlier run stored this partition whole.
    write_units: bool,
    /// False when an earlier run stored every decision of this prefilter.
    write_routes: bool,
    units: Vec<Unit>,
    rejections: Vec<RejectionRow>,
    /// The deciding rule of each element since `first_ordinal`.
    rules: Vec<u8>,
    first_ordinal: u64,
    /// The thread that commits full batches; without it (before the pass
    /// starts one) a batch is written here.
    background: Option<BatchWriter>,
}

impl Writer<'_> {
    /// Hands the rows gathered so far to be written: to the write thread,
    /// once the batch before has been committed, so at most one batch is
    /// in flight while the next one fills.
    fn flush(&mut self) -> Result<(), RunError> {
        if self.units.is_empty() && self.rejections.is_empty() && self.rules.is_empty() {
            return Ok(());
        }
        let batch = OwnedBatch {
            partition: self.partition,
            prefilter: self.prefilter,
            first_ordinal: self.first_ordinal,
            units: std::mem::take(&mut self.units),
            rejections: std::mem::take(&mut self.rejections),
            rules: std::mem::take(&mut self.rules),
        };
        self.first_ordinal += batch.rules.len() as u64;
        match self.background.as_mut() {
            Some(background) => {
                background.wait()?;
                background.send(batch);
                Ok(())
            }
            None => Ok(self.store.put_partition_batch(&batch.as_batch())?),
        }
    }

    /// Flushes and waits until every batch is committed: before the store
    /// is read for what the pass has written, and at its end.
    fn settle(&mut self) -> Result<(), RunError> {
        self.flush()?;
        match self.background.as_mut() {
            Some(background) => background.wait(),
            None => Ok(()),
        }
    }
}

/// A batch of rows as the write thread receives it.
struct OwnedBatch {
    partition: i64,
    prefilter: i64,
    first_ordinal: u64,
    units: Vec<Unit>,
    rejections: Vec<RejectionRow>,
    rules: Vec<u8>,
}

impl OwnedBatch {
    fn as_batch(&self) -> PartitionBatch<'_> {
        PartitionBatch {
            partition: self.partition,
            units: &self.units,
            rejections: &self.rejections,
            prefilter: Some(self.prefilter),
            first_ordinal: self.first_ordinal,
            rules: &self.rules,
        }
    }
}

/// The route pass's write thread: SQLite commits a batch (tens of
/// milliseconds for 20,000 units) while the pass parses and prefilters
/// the next one, where before the whole pass waited on every commit.
/// Batches are committed in the order sent; the thread ends when this
/// handle is dropped, after the batches already sent.
struct BatchWriter {
    to_write: std::sync::mpsc::SyncSender<OwnedBatch>,
    written: std::sync::mpsc::Receiver<Result<(), fanfold_store::StoreError>>,
    in_flight: usize,
}

impl BatchWriter {
    fn start<'scope>(scope: &'scope std::thread::Scope<'scope, '_>, store: &'scope Store) -> Self {
        let (to_write, batches) = std::sync::mpsc::sync_channel::<OwnedBatch>(1);
        let (report, written) = std::sync::mpsc::channel();
        scope.spawn(move || {
            for batch in batches {
                if report
                    .send(store.put_partition_batch(&batch.as_batch()))
                    .is_err()
                {
                    break;
                }
            }
        });
        BatchWriter {
            to_write,
            written,
            in_flight: 0,
        }
    }

    fn send(&mut self, batch: OwnedBatch) {
        if self.to_write.send(batch).is_err() {
            write_thread_gone();
        }
        self.in_flight += 1;
    }

    /// Waits for every batch sent to be committed; the first failure.
    fn wait(&mut self) -> Result<(), RunError> {
        while self.in_flight > 0 {
            let Ok(result) = self.written.recv() else {
                write_thread_gone();
            };
            self.in_flight -= 1;
            result?;
        }
        Ok(())
    }
}

/// The write thread hangs up only by panicking (a store error is an
/// answer); its panic is what the scope re-raises, this one stops the pass
/// from going on without it.
fn write_thread_gone() -> ! {
    panic!("the route pass's write thread stopped")
}

/// The state the streaming callbacks share on the calling thread.
struct Sink<'a> {
    writer: Option<Writer<'a>>,
    /// What each prefilter rule does, resolved once, so a million units
    /// cost no per-unit allocation to count.
    actions: Vec<Action>,
    /// Where a unit no rule decides goes.
    first_stage: &'a str,
    /// Units each rule excluded, by rule index.
    excluded: Vec<u64>,
    /// Seeded samples of the excluded units, for audits.
    samplers: Vec<(u64, BottomK<SampledUnit>)>,
    routed: Routed,
    /// The first failure; the source stops being read once it is set.
    failed: Option<RunError>,
    /// When set, only units with these ids are held (re-checking a run
    /// needs its facts' units, not the whole input).
    keep: Option<&'a std::collections::HashSet<String>>,
}

/// An excluded unit kept for an audit's sample, with its JSON text.
type SampledUnit = (Unit, Box<[u8]>);

/// What a prefilter rule does with a unit it matches.
enum Action {
    Exclude(String),
    Route(String),
}

/// Settles a repeated id against the units stored so far: a fingerprint
/// hit, and the earlier unit's content for a real repeat.
struct StoreRepeat<'s, 'a>(&'s RefCell<Sink<'a>>);

impl ConfirmRepeat for StoreRepeat<'_, '_> {
    fn earlier(&mut self, id: &str, ordinal: u64) -> Result<Option<UnitPlace>, PartitionError> {
        let io = |e: RunError| PartitionError::Io(std::io::Error::other(e.to_string()));
        let mut sink = self.0.borrow_mut();
        // Only built with a store to ask.
        let Some(w) = sink.writer.as_mut() else {
            return Err(PartitionError::Io(std::io::Error::other(format!(
                "id {id} repeats, and there is no store to look its first unit up in"
            ))));
        };
        // The earlier element may still be waiting in this batch, or be
        // on its way to the store.
        if w.write_units {
            w.settle().map_err(io)?;
        }
        let found = w
            .store
            .unit_before(w.partition, id, ordinal)
            .map_err(|e| io(e.into()))?;
        Ok(found.map(|(ordinal, unit_hash, byte)| UnitPlace {
            ordinal,
            byte,
            unit_hash,
        }))
    }
}

/// A reader that ends with an error once the run has failed, so a failure
/// in a callback stops the read instead of partitioning on, or once the
/// run is interrupted from outside, so a large input stops within a read
/// (the stored artifact hands out at most a chunk, 1 MiB, at a time).
struct Stoppable<'f, R> {
    inner: R,
    stop: &'f AtomicBool,
    interrupt: Option<&'f AtomicBool>,
}

impl<R: Read> Read for Stoppable<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.stop.load(Ordering::Relaxed) || interrupted(self.interrupt) {
            return Err(std::io::Error::other("stopped"));
        }
        self.inner.read(buf)
    }
}

fn interrupted(flag: Option<&AtomicBool>) -> bool {
    flag.is_some_and(|f| f.load(Ordering::Relaxed))
}

/// Partitions and prefilters `reader` (the source named by `source_hash`),
/// writing to `store` when given. `interrupt`, once set, stops the pass at
/// the next read of the source or the next element, whichever comes
/// first, as [`RunError::Interrupted`]: the batches written are kept, the
/// partition is not marked whole, so a rerun partitions it again and
/// finds the units already stored.
pub fn route(
    plan: &Plan,
    source_hash: ContentHash,
    origin: &str,
    reader: impl Read + Send,
    store: Option<&Store>,
    options: StreamOptions,
    interrupt: Option<&AtomicBool>,
) -> Result<Routed, RunError> {
    route_keeping(
        plan,
        source_hash,
        origin,
        reader,
        store,
        options,
        None,
        interrupt,
    )
}

/// [`route`], holding in the table only the units whose ids `keep` lists
/// (all when `None`).
#[allow(clippy::too_many_arguments)]
pub fn route_keeping(
    plan: &Plan,
    source_hash: ContentHash,
    origin: &str,
    reader: impl Read + Send,
    store: Option<&Store>,
    options: StreamOptions,
    keep: Option<&std::collections::HashSet<String>>,
    interrupt: Option<&AtomicBool>,
) -> Result<Routed, RunError> {
    let prefilter = RecordPrefilter::compile(&plan.spec.prefilter)?;
    let first_stage = plan.first_stage();
    let actions: Vec<Action> = (0..plan.spec.prefilter.len())
        .map(|i| match prefilter.prefilter().outcome_of(Some(i)) {
            Outcome::Exclude { reason, .. } => Action::Exclude(reason),
            o => Action::Route(o.stage(first_stage).unwrap_or(first_stage).to_owned()),
        })
        .collect();
    let writer = match store {
        Some(store) => {
            let key = partition_key(plan, &source_hash, options.partition.max_unit_bytes);
            let spec = serde_json::to_string(&plan.spec.input.partition).unwrap_or_default();
            let (partition, done) = store.open_partition(&key, &source_hash, &spec)?;
            let rules = serde_json::to_string(&plan.spec.prefilter).unwrap_or_default();
            let prefilter = store.open_prefilter(&prefilter_key(&plan.spec.prefilter), &rules)?;
            let write_routes = !store.routing_done(partition, prefilter)?;
            Some(Writer {
                store,
                partition,
                prefilter,
                write_units: done.is_none(),
                write_routes,
                units: Vec::new(),
                rejections: Vec::new(),
                rules: Vec::new(),
                first_ordinal: 0,
                background: None,
            })
        }
        None => None,
    };
    // The batches are committed on a thread of the scope, which ends with
    // the pass: every batch sent is written before `route` returns, also
    // when it returns an error.
    std::thread::scope(|scope| {
        let mut writer = writer;
        if let (Some(w), Some(store)) = (writer.as_mut(), store) {
            w.background = Some(BatchWriter::start(scope, store));
        }
        let ids = writer.as_ref().map(|w| (w.partition, w.prefilter));
        let sink = RefCell::new(Sink {
            writer,
            excluded: vec![0; actions.len()],
            samplers: plan
                .exclusion_samples()
                .into_iter()
                .map(|(seed, k)| (seed, BottomK::new(k)))
                .collect(),
            actions,
            first_stage,
            routed: Routed {
                table: UnitTable::default(),
                by_stage: BTreeMap::new(),
                coverage: Coverage::default(),
                rejected_by_reason: BTreeMap::new(),
                rejections: Vec::new(),
                repeats: Vec::new(),
                excluded_by_reason: BTreeMap::new(),
                excluded_samples: BTreeMap::new(),
                partition_id: ids.map(|(p, _)| p),
                prefilter_id: ids.map(|(_, f)| f),
            },
            failed: None,
            keep,
        });
        let stop = AtomicBool::new(false);
        let rules = &plan.spec.prefilter;
        let result = {
            let mut compact;
            let mut in_memory;
            let seen: &mut dyn SeenIds = if store.is_some() {
                compact = CompactSeen::new(StoreRepeat(&sink));
                &mut compact
            } else {
                in_memory = SeenKeys::default();
                &mut in_memory
            };
            fanfold_ops::partition::stream(
                &plan.spec.input.partition,
                source_hash,
                Stoppable {
                    inner: reader,
                    stop: &stop,
                    interrupt,
                },
                options,
                seen,
                || {
                    // Compiled per worker thread (jq values cannot cross threads);
                    // the plan compiled the same rules already, so this succeeds.
                    let compiled = RecordPrefilter::compile(rules);
                    move |id: &str, view: UnitView<'_>| -> Result<Option<usize>, PrefilterError> {
                        match (&compiled, view) {
                            (Ok(p), UnitView::Record(r)) => p.first_match_index(id, r),
                            (Ok(p), view) => p.prefilter().first_match(id, view.to_val()),
                            (Err(e), _) => Err(PrefilterError::Thread(e.to_string())),
                        }
                    }
                },
                &mut |el| {
                    let mut sink = sink.borrow_mut();
                    if sink.failed.is_some() {
                        return;
                    }
                    if interrupted(interrupt) {
                        sink.failed = Some(RunError::Interrupted {
                            phase: "partitioning and prefiltering the input",
                        });
                        stop.store(true, Ordering::Relaxed);
                        return;
                    }
                    if let Err(e) = sink.take(el) {
                        sink.failed = Some(e);
                        stop.store(true, Ordering::Relaxed);
                    }
                },
            )
        };
        let mut sink = sink.into_inner();
        if let Some(e) = sink.failed.take() {
            return Err(e);
        }
        // Stopped at a read before any element saw the flag.
        if interrupted(interrupt) {
            return Err(RunError::Interrupted {
                phase: "partitioning and prefiltering the input",
            });
        }
        let coverage = result.map_err(|source| match store_failure(source) {
            Ok(store) => RunError::Store(store),
            Err(source) => RunError::Partition {
                origin: origin.to_owned(),
                source,
            },
        })?;
        if let Some(w) = sink.writer.as_mut() {
            w.settle()?;
            if w.write_units {
                w.store.finish_partition(
                    w.partition,
                    PartitionCounts {
                        elements: coverage.elements,
                        units: coverage.units,
                        rejected: coverage.rejected,
                    },
                )?;
            }
            if w.write_routes {
                w.store.finish_routing(w.partition, w.prefilter)?;
            }
        }
        for (action, n) in sink.actions.iter().zip(&sink.excluded) {
            if let Action::Exclude(reason) = action
                && *n > 0
            {
                *sink
                    .routed
                    .excluded_by_reason
                    .entry(reason.clone())
                    .or_insert(0) += n;
            }
        }
        for (seed, sampler) in std::mem::take(&mut sink.samplers) {
            let at: Vec<usize> = sampler
                .into_sorted()
                .into_iter()
                .map(|(unit, json)| sink.routed.table.push(unit, &json))
                .collect();
            sink.routed.excluded_samples.insert(seed, at);
        }
        sink.routed.coverage = coverage;
        Ok(sink.routed)
    })
}

impl Sink<'_> {
    fn take(
        &mut self,
        el: Streamed<'_, Result<Option<usize>, PrefilterError>>,
    ) -> Result<(), RunError> {
        match el {
            Streamed::Rejected(r) => {
                tracing::warn!(reason = %r.reason, "{}", r.detail);
                *self
                    .routed
                    .rejected_by_reason
                    .entry(r.reason.clone())
                    .or_insert(0) += 1;
                if self.routed.rejections.len() < MAX_LISTED_REJECTIONS {
                    self.routed
                        .rejections
                        .push(format!("{}: {}", r.reason, r.detail));
                }
                if let Some(w) = self.writer.as_mut()
                    && w.write_routes
                {
                    w.rules.push(RULE_REJECTED);
                }
                if let Some(w) = self.writer.as_mut().filter(|w| w.write_units) {
                    w.rejections.push(RejectionRow {
                        ordinal: r.ordinal,
                        reason: r.reason,
                        detail: r.detail,
                        byte_start: r.bytes.start,
                        byte_end: r.bytes.end,
                    });
                }
            }
            Streamed::Repeated(r) => {
                tracing::info!("{}", r.detail);
                if self.routed.repeats.len() < MAX_LISTED_REJECTIONS {
                    self.routed.repeats.push(r.detail);
                }
                // Not a unit: its element is accounted for like a
                // rejection's in the route chunk, so ordinals line up.
                if let Some(w) = self.writer.as_mut()
                    && w.write_routes
                {
                    w.rules.push(RULE_REJECTED);
                }
            }
            Streamed::Unit { unit, json, extra } => {
                let rule = extra?;
                if let Some(w) = self.writer.as_mut()
                    && w.write_routes
                {
                    w.rules.push(match rule {
                        Some(r) => u8::try_from(r).unwrap_or(RULE_NONE),
                        None => RULE_NONE,
                    });
                }
                let stage = match rule.and_then(|r| self.actions.get(r)) {
                    Some(Action::Exclude(_)) => None,
                    Some(Action::Route(stage)) => Some(stage.as_str()),
                    None => Some(self.first_stage),
                };
                // The unit moves to where it is kept; only a routed unit
                // that is also written is copied.
                let held = self.keep.is_none_or(|k| k.contains(unit.unit_id.as_str()));
                let stored = match stage {
                    Some(_) if !held => Some(unit),
                    Some(stage) => {
                        let copy = self
                            .writer
                            .as_ref()
                            .filter(|w| w.write_units)
                            .map(|_| unit.clone());
                        let at = self.routed.table.push(unit, json);
                        self.routed
                            .by_stage
                            .entry(stage.to_owned())
                            .or_default()
                            .push(at);
                        copy
                    }
                    None => {
                        if let Some(n) = rule.and_then(|r| self.excluded.get_mut(r)) {
                            *n += 1;
                        }
                        for (seed, sampler) in &mut self.samplers {
                            let rank = sample_rank(*seed, &unit.unit_hash);
                            if sampler.would_keep(rank, unit.ordinal) {
                                sampler.offer(rank, unit.ordinal, (unit.clone(), json.into()));
                            }
                        }
                        Some(unit)
                    }
                };
                let mut full = false;
                if let Some(w) = self.writer.as_mut() {
                    if w.write_units
                        && let Some(u) = stored
                    {
                        w.units.push(u);
                    }
                    full = w.units.len() >= UNITS_PER_WRITE || w.rules.len() >= UNITS_PER_WRITE;
                }
                if full && let Some(w) = self.writer.as_mut() {
                    w.flush()?;
                }
            }
        }
        Ok(())
    }
}

/// The options a run partitions with.
pub fn stream_options(max_unit_bytes: u64, threads: usize) -> StreamOptions {
    StreamOptions {
        partition: PartitionOptions { max_unit_bytes },
        threads,
    }
}

/// The store's own failure, when a partition stopped because reading the
/// stored source failed (a damaged chunk, a lost server): the store's
/// error, not the input's.
fn store_failure(source: PartitionError) -> Result<fanfold_store::StoreError, PartitionError> {
    match source {
        PartitionError::Io(io)
            if io
                .get_ref()
                .is_some_and(|e| e.is::<fanfold_store::StoreError>()) =>
        {
            let kind = io.kind();
            match io
                .into_inner()
                .map(|e| e.downcast::<fanfold_store::StoreError>())
            {
                Some(Ok(store)) => Ok(*store),
                Some(Err(other)) => Err(PartitionError::Io(std::io::Error::new(kind, other))),
                None => Err(PartitionError::Io(std::io::Error::from(kind))),
            }
        }
        other => Err(other),
    }
}
