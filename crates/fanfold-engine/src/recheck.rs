//! Re-checking a finished answer from its output folder alone, later or
//! on another machine: every fact's digest, the certificate's counts
//! against the facts, the answer against what its facts give, and, with
//! the source, every cited unit's hash and every quote at its range. It
//! trusts nothing the run kept (no store, no cached fold node): the spec
//! is rebuilt from the certificate and must hash as it did, every fact
//! must have been made by its stage, rubric and model, every unit the
//! source routes must have its fact, and the source is partitioned again.
//! The source is read only from a file or a folder (the one given, or the
//! one the spec names while it hashes as the run read it): a certificate
//! is data, and a command it names is never run.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};

use fanfold_core::{ContentHash, FactRecord, StatusCounts, UnitId};
use fanfold_ops::fold::{FoldValue, NodeCache, fold_tree};
use fanfold_ops::verify::{ReadBack, verify};
use fanfold_ops::view::Projector;
use serde_json::Value;

use crate::kit::UnitTable;
use crate::kit::born::BredLine;
use crate::kit::table::Lineage;
use crate::plan::Plan;
use crate::report::{Answer, Certificate};
use crate::source::Source;

/// Why an output folder could not be read at all.
#[derive(Debug, thiserror::Error)]
pub enum RecheckError {
    #[error("{path}: {detail}")]
    File { path: String, detail: String },
    #[error(transparent)]
    Run(#[from] crate::RunError),
}

/// What re-checking found.
#[derive(Debug, Default)]
pub struct Rechecked {
    /// Each thing that does not hold, in words naming the file, line or
    /// unit; empty when everything holds.
    pub mismatches: Vec<String>,
    pub facts: u64,
    /// Whether the source was read (it was found and hashed).
    pub source_read: bool,
    pub cited_checked: u64,
    pub evidence_checked: u64,
    pub numbers_checked: u64,
    /// What could not be read again, and why (the source came from a
    /// command, standard input, or a file changed or missing here): the
    /// answer is then not re-checked against its source.
    pub unread: Option<String>,
}

impl Rechecked {
    pub fn passed(&self) -> bool {
        self.mismatches.is_empty() && self.unread.is_none()
    }
}

/// A finished run's output folder, read back.
pub struct OutDir {
    pub dir: PathBuf,
    pub answer: Answer,
    pub certificate: Certificate,
    /// facts.jsonl, with the line each fact is on.
    pub facts: Vec<(usize, FactRecord)>,
    /// bred.jsonl: the units observations bore, when any did.
    pub bred: Vec<BredLine>,
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, RecheckError> {
    let text = std::fs::read(path).map_err(|e| RecheckError::File {
        path: path.display().to_string(),
        detail: e.to_string(),
    })?;
    serde_json::from_slice(&text).map_err(|e| RecheckError::File {
        path: path.display().to_string(),
        detail: format!("does not parse as fanfold wrote it: {e}"),
    })
}

impl OutDir {
    pub fn read(dir: &Path) -> Result<OutDir, RecheckError> {
        let answer = read_json(&dir.join("answer.json"))?;
        let certificate = read_json(&dir.join("certificate.json"))?;
        let path = dir.join("facts.jsonl");
        let text = std::fs::read_to_string(&path).map_err(|e| RecheckError::File {
            path: path.display().to_string(),
            detail: e.to_string(),
        })?;
        let mut facts = Vec::new();
        for (at, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let fact: FactRecord = serde_json::from_str(line).map_err(|e| RecheckError::File {
                path: path.display().to_string(),
                detail: format!("line {}: not a fact: {e}", at + 1),
            })?;
            facts.push((at + 1, fact));
        }
        let bred = read_bred(&dir.join("bred.jsonl"))?;
        Ok(OutDir {
            dir: dir.to_owned(),
            answer,
            certificate,
            facts,
            bred,
        })
    }

    /// What can be checked from the folder alone: each fact's digest, the
    /// counts, and that every unit the answer lists has a decided fact.
    pub fn check_alone(&self, out: &mut Rechecked) {
        out.facts = self.facts.len() as u64;
        out.mismatches
            .extend(check_folder(&self.answer, &self.certificate, &self.facts));
    }
}

/// What an output folder shows of being changed after its run, from its
/// files alone: a fact that no longer matches its digest (`facts` with
/// their line numbers in facts.jsonl), counts that do not add up, a unit
/// the answer lists that no decided fact is about. Empty when nothing
/// does.
pub fn check_folder(
    answer: &Answer,
    certificate: &Certificate,
    facts: &[(usize, FactRecord)],
) -> Vec<String> {
    let mut out = Vec::new();
    for (line, f) in facts {
        let unit = f.source_ids.first().map_or("?", |u| u.as_str());
        match f.digest {
            None => out.push(format!(
                "facts.jsonl line {line}: the fact of unit `{unit}` at stage `{}` carries no digest",
                f.stage
            )),
            Some(_) if !f.is_intact() => out.push(format!(
                "facts.jsonl line {line}: the fact of unit `{unit}` at stage `{}` was changed after the run (it no longer matches its digest)",
                f.stage
            )),
            Some(_) => {}
        }
    }
    let mut counted = StatusCounts::default();
    for (_, f) in facts {
        counted.add(f.status, 1);
    }
    if counted != certificate.statuses {
        out.push(format!(
            "the certificate counts {} facts by status, facts.jsonl holds {}",
            counts(&certificate.statuses),
            counts(&counted)
        ));
    }
    if answer.statuses != certificate.statuses {
        out.push("answer.json's status counts differ from the certificate's".into());
    }
    let c = &certificate.coverage;
    if !c.is_complete() {
        out.push(format!(
            "the certificate's coverage does not add up: {} units + {} rejected + {} repeated identically != {} elements",
            c.units, c.rejected, c.repeated_identical, c.elements
        ));
    }
    if answer.repeated_identical != c.repeated_identical {
        out.push(format!(
            "answer.json counts {} identical repeats, the certificate's coverage {}",
            answer.repeated_identical, c.repeated_identical
        ));
    }
    let decided: BTreeSet<&UnitId> = facts
        .iter()
        .filter(|(_, f)| f.status.is_cacheable())
        .filter_map(|(_, f)| f.source_ids.first())
        .collect();
    for item in &answer.items {
        if !decided.contains(&item.unit_id) {
            out.push(format!(
                "answer.json lists unit `{}`, which no decided fact in facts.jsonl is about",
                item.unit_id
            ));
        }
    }
    out
}

fn counts(s: &StatusCounts) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

/// Nothing cached: every node is computed.
struct NoNodes;

impl NodeCache for NoNodes {
    fn get(&mut self, _key: &ContentHash) -> Option<FoldValue> {
        None
    }
    fn put(&mut self, _key: &ContentHash, _level: u32, _value: &FoldValue) {}
}

/// The source partitioned again, as verify reads it.
struct Reparsed<'a> {
    table: &'a UnitTable,
    at: HashMap<&'a UnitId, usize>,
    projectors: crate::run::verify::EvidenceProjectors,
    spec: &'a fanfold_core::spec::PartitionSpec,
}

impl ReadBack for Reparsed<'_> {
    fn unit_hash(&mut self, id: &UnitId) -> Option<ContentHash> {
        let i = *self.at.get(id)?;
        let value = self.table.value(i);
        Some(fanfold_ops::partition::content_hash(self.spec, &value))
    }

    fn view(&mut self, fact: &FactRecord) -> Option<Value> {
        let (table, at) = (self.table, &self.at);
        crate::run::verify::judged_view(&self.projectors, fact, |id| {
            Some(table.value(*at.get(id)?))
        })
    }
}

/// The plan of the spec a run ran with, rebuilt from its certificate, or
/// why it cannot be.
fn rebuilt_plan(dir: &Path, cert: &Certificate) -> Result<Result<Plan, String>, RecheckError> {
    let (Some(spec_path), Some(spec)) = (&cert.spec_path, &cert.spec_as_run) else {
        return Ok(Err(
            "the certificate does not carry the spec it ran with (written by an older fanfold): only the folder itself was checked".into(),
        ));
    };
    let spec: fanfold_core::spec::Spec =
        serde_json::from_value(spec.clone()).map_err(|e| RecheckError::File {
            path: dir.join("certificate.json").display().to_string(),
            detail: format!("spec_as_run: {e}"),
        })?;
    Ok(rebuild(spec, Path::new(spec_path)))
}

fn rebuild(spec: fanfold_core::spec::Spec, spec_path: &Path) -> Result<Plan, String> {
    let spec_dir = spec_path
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    // The variables a received spec declares are the sender's to name,
    // never the reader's to give: the programs re-checking it see none.
    fanfold_ops::jq::deny_env();
    Plan::from_spec(spec, spec_path, &spec_dir)
        .map_err(|e| format!("the spec it ran with cannot be rebuilt: {e}"))
}

/// The source as it may be read again, and its hash.
pub struct Reread {
    pub source: Source,
    pub hash: ContentHash,
}

/// The source a finished run may be re-checked against: the file or
/// folder given (`input`), or else the one the run's spec names, when it
/// exists here and hashes as the run read it. Never a command and never
/// standard input: a certificate is data, and what it says to run is not
/// run. `Err` says what could not be read again, and why.
pub fn source_to_reread(
    plan: &Plan,
    cert: &Certificate,
    input: Option<&Path>,
) -> Result<Reread, String> {
    let hashed = |source: Source| -> Result<Reread, String> {
        let source = plan.resolve(source).map_err(|e| e.to_string())?;
        match source_hash(&source) {
            Ok(hash) => Ok(Reread { source, hash }),
            Err(e) => Err(format!("{} cannot be read: {e}", source.origin())),
        }
    };
    if let Some(path) = input {
        return hashed(Source::File(path.to_owned()));
    }
    let spec = &plan.spec.input;
    let Some(path) = &spec.path else {
        return Err(match &spec.command {
            Some(command) => format!(
                "the run read its source from the command `{}`, and verify never runs a program a certificate names: give --input FILE holding what it printed",
                command.join(" ")
            ),
            None => format!(
                "the run read its source from {}, which cannot be read again: give --input FILE",
                cert.source_origin
            ),
        });
    };
    let named = plan.spec_dir.join(path);
    if !named.exists() {
        return Err(format!(
            "the source the spec names, {}, is not here: give --input FILE",
            named.display()
        ));
    }
    // A FIFO or a device would never end its read: only a regular file or
    // a folder is opened on a certificate's word.
    let kind = std::fs::metadata(&named).map(|m| m.file_type());
    if !kind.as_ref().is_ok_and(|k| k.is_file() || k.is_dir()) {
        return Err(format!(
            "the source the spec names, {}, is not a regular file or folder, and is not read on a certificate's word: give --input FILE",
            named.display()
        ));
    }
    let found = hashed(Source::File(named.clone()))?;
    if found.hash != cert.source_hash {
        return Err(format!(
            "the source the spec names, {}, hashes {}, not {} as the run read it: it changed since the run, or is another file; give --input FILE to re-check against it",
            named.display(),
            found.hash.short(16),
            cert.source_hash.short(16)
        ));
    }
    Ok(found)
}

/// Re-checks the run in `dir`: against the source at `input`, or else the
/// file its spec names while it is unchanged (see [`source_to_reread`]).
pub fn recheck(dir: &Path, input: Option<&Path>) -> Result<Rechecked, RecheckError> {
    let out_dir = OutDir::read(dir)?;
    let mut out = Rechecked::default();
    out_dir.check_alone(&mut out);
    let cert = &out_dir.certificate;

    // The spec as it ran, rebuilt and hashed with the files it names.
    let plan = match rebuilt_plan(dir, cert)? {
        Ok(p) => p,
        Err(e) => {
            out.mismatches.push(e);
            return Ok(out);
        }
    };
    if plan.spec_hash != cert.spec_hash {
        out.mismatches.push(format!(
            "the spec's files changed since the run (rubric, schema, script...): they hash {}, the run's {}; nothing more can be re-checked against them",
            plan.spec_hash.short(16),
            cert.spec_hash.short(16)
        ));
        return Ok(out);
    }
    if cert.question != plan.spec.question {
        out.mismatches.push(format!(
            "the certificate states the question {:?}; the spec it ran with asks {:?}",
            cert.question, plan.spec.question
        ));
    }
    if out_dir.answer.question != plan.spec.question {
        out.mismatches.push(format!(
            "answer.json states the question {:?}; the spec it ran with asks {:?}",
            out_dir.answer.question, plan.spec.question
        ));
    }
    out.mismatches
        .extend(check_fact_origins(&plan, cert, &out_dir.facts));

    let reread = match source_to_reread(&plan, cert, input) {
        Ok(r) => r,
        Err(why) => {
            out.unread = Some(why);
            return Ok(out);
        }
    };
    let source = reread.source;
    let same = reread.hash == cert.source_hash;
    if !same {
        out.mismatches.push(format!(
            "the source {} changed since the run: it hashes {}, the run read {}",
            cert.source_origin,
            reread.hash.short(16),
            cert.source_hash.short(16)
        ));
    }

    let facts: Vec<&FactRecord> = out_dir.facts.iter().map(|(_, f)| f).collect();
    // Every unit a fact is about, whether the prefilter keeps it now or
    // not: a cited unit edited since may no longer pass it, and is then
    // changed, not missing.
    // Units observations bore are not in the source: bred.jsonl holds
    // them, and they are put back once the source's units are read.
    let bred_ids: HashSet<&str> = out_dir.bred.iter().map(|b| b.id.as_str()).collect();
    let wanted: HashSet<String> = facts
        .iter()
        .flat_map(|f| f.source_ids.iter().map(|id| id.0.clone()))
        .chain(out_dir.answer.items.iter().map(|i| i.unit_id.0.clone()))
        .filter(|id| !bred_ids.contains(id.as_str()))
        .collect();
    let unreadable =
        |e: crate::RunError| format!("the source cannot be read as the run read it: {e}");
    // The same bytes route as the run routed them: every unit the
    // prefilter sends to a stage holds, and every fact is about one such
    // unit (or one an audit sampled from its exclusions). Routed as the
    // run routed, the table holds what the run's did.
    let mut routed = None;
    if same {
        match crate::run::route_source_keeping(&plan, &source, cert.settings.max_unit_bytes, None) {
            Ok(r) => {
                out.mismatches
                    .extend(check_every_unit_has_its_fact(&r, &out_dir.facts));
                routed = Some(r);
            }
            Err(e) => {
                out.mismatches.push(unreadable(e));
                return Ok(out);
            }
        }
    }
    // Units the routed table lacks (a source edited since, a unit a fact
    // names that the source no longer routes): every unit, kept only where
    // a fact or the answer names it.
    let complete = routed.as_ref().is_some_and(|r| {
        let have = r.table.index_by_id();
        wanted
            .iter()
            .all(|id| have.contains_key(&UnitId(id.clone())))
    });
    if !complete {
        let mut every = plan.spec.clone();
        every.prefilter.clear();
        let unfiltered = match rebuild(every, &plan.spec_path) {
            Ok(p) => p,
            Err(e) => {
                out.mismatches.push(e);
                return Ok(out);
            }
        };
        match crate::run::route_source_keeping(
            &unfiltered,
            &source,
            cert.settings.max_unit_bytes,
            Some(&wanted),
        ) {
            Ok(r) => routed = Some(r),
            Err(e) => {
                out.mismatches.push(unreadable(e));
                return Ok(out);
            }
        }
    }
    let Some(mut routed) = routed else {
        return Ok(out);
    };
    out.source_read = true;
    out.mismatches.extend(adopt_bred(
        &plan,
        &mut routed.table,
        &out_dir.bred,
        &out_dir.facts,
    ));
    // A bred unit's record is what a tool observed; verify never runs a
    // tool, so that record rests on the folder alone. Its checks above
    // show only that the folder agrees with itself, which a forger can
    // arrange: the answer is not vouched for as re-read from its source.
    if !out_dir.bred.is_empty() {
        out.unread = Some(format!(
            "{} units were bred from tool observations (bred.jsonl); verify never asks a tool again, so their records rest on this folder alone, checked only against the facts that cite them",
            out_dir.bred.len()
        ));
    }
    // The same bytes partition the same way, whether ids are settled in
    // memory (here) or through the store (the run).
    let c = &routed.coverage;
    if same && *c != cert.coverage {
        let k = &cert.coverage;
        out.mismatches.push(format!(
            "the source read again gives {} elements = {} units + {} rejected + {} repeated identically; the certificate says {} = {} + {} + {}",
            c.elements, c.units, c.rejected, c.repeated_identical,
            k.elements, k.units, k.rejected, k.repeated_identical
        ));
    }
    let table = &routed.table;
    let at = table.index_by_id();
    if same {
        out.mismatches
            .extend(check_fact_keys(&plan, table, &at, &out_dir.facts));
    }
    let positioned: Vec<(usize, FactRecord)> = facts
        .iter()
        .filter_map(|f| Some((*at.get(f.source_ids.first()?)?, (*f).clone())))
        .collect();
    let read = crate::run::unit_pointers(&plan.spec.fold);
    let leaves: Vec<fanfold_ops::fold::Leaf> = positioned
        .iter()
        .map(|(i, f)| {
            let unit = if read.is_empty() {
                Value::Null
            } else {
                crate::run::unit_fields(&read, &table.value(*i))
            };
            crate::run::leaf_of(f, unit)
        })
        .collect();
    let fold = fold_tree(&plan.spec.fold, &leaves, &mut NoNodes);
    let answered = crate::run::answer::answer(&plan.spec, &fold.root, &positioned, table);
    out.numbers_checked = plan.spec.fold.reducers.len() as u64;
    let said: BTreeSet<&UnitId> = out_dir.answer.items.iter().map(|i| &i.unit_id).collect();
    let given: BTreeSet<&UnitId> = answered.items.iter().map(|i| &i.unit_id).collect();
    for id in said.difference(&given) {
        out.mismatches.push(format!(
            "answer.json lists unit `{id}`, which its facts do not put in the answer"
        ));
    }
    for id in given.difference(&said) {
        out.mismatches.push(format!(
            "answer.json leaves out unit `{id}`, which its facts put in the answer"
        ));
    }
    let stated: BTreeMap<&str, &str> = out_dir
        .answer
        .aggregates
        .iter()
        .chain(out_dir.answer.stated.iter())
        .map(|g| (g.name.as_str(), g.stated.statement.as_str()))
        .collect();
    for g in answered.aggregates.iter().chain(answered.stated.iter()) {
        match stated.get(g.name.as_str()) {
            Some(s) if *s == g.stated.statement => {}
            Some(s) => out.mismatches.push(format!(
                "answer.json says `{}` is {s:?}; its facts give {:?}",
                g.name, g.stated.statement
            )),
            None => out.mismatches.push(format!(
                "answer.json does not state `{}`, which its facts give as {:?}",
                g.name, g.stated.statement
            )),
        }
    }

    // Every cited unit and quote, against the source read again.
    let projectors = crate::run::verify::evidence_projectors(&plan);
    let mut reparsed = Reparsed {
        table,
        at,
        projectors,
        spec: &plan.spec.input.partition,
    };
    let cited: BTreeSet<UnitId> = out_dir
        .answer
        .items
        .iter()
        .map(|i| i.unit_id.clone())
        .chain(
            out_dir
                .answer
                .themes
                .iter()
                .flat_map(|t| t.ids.iter().cloned()),
        )
        .collect();
    let decided: Vec<&FactRecord> = facts
        .iter()
        .copied()
        .filter(|f| f.status.is_cacheable())
        .filter(|f| f.source_ids.first().is_some_and(|id| cited.contains(id)))
        .collect();
    let report = verify(&mut reparsed, &decided, &cited, 0, 0);
    out.cited_checked = report.cited_checked;
    out.evidence_checked = report.evidence_checked;
    for id in &report.cited_missing {
        out.mismatches.push(format!(
            "cited unit `{id}` is not in the source as it is partitioned now"
        ));
    }
    for id in &report.hash_mismatches {
        out.mismatches.push(format!(
            "cited unit `{id}` changed in the source since the run (its hash differs)"
        ));
    }
    for e in &report.evidence_failures {
        out.mismatches.push(format!("evidence: {e}"));
    }
    Ok(out)
}

/// bred.jsonl, one unit a line; none when the file is absent (no unit
/// was bred).
fn read_bred(path: &Path) -> Result<Vec<BredLine>, RecheckError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => {
            return Err(RecheckError::File {
                path: path.display().to_string(),
                detail: e.to_string(),
            });
        }
    };
    let mut out = Vec::new();
    for (at, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        out.push(serde_json::from_str(line).map_err(|e| RecheckError::File {
            path: path.display().to_string(),
            detail: format!("line {}: not a bred unit: {e}", at + 1),
        })?);
    }
    Ok(out)
}

/// Puts the units observations bore back in the table, after the
/// source's own, each checked first: its parent is a unit read before it,
/// its depth is its parent's plus one and within `budget.max_depth`, its
/// parent bore no more than `budget.max_fanout`, its stage bears units and
/// gives its record this id, its record hashes as the line says, and it
/// has a fact. The record is what the tool observed, which verify never
/// asks again; the facts, sealed, cite its hash, so an edited record no
/// longer matches them.
fn adopt_bred(
    plan: &Plan,
    table: &mut UnitTable,
    bred: &[BredLine],
    facts: &[(usize, FactRecord)],
) -> Vec<String> {
    let mut out = Vec::new();
    let mut at: HashMap<String, usize> = table
        .units()
        .iter()
        .enumerate()
        .map(|(i, u)| (u.unit_id.0.clone(), i))
        .collect();
    let with_fact: HashSet<&str> = facts
        .iter()
        .filter_map(|(_, f)| f.source_ids.first().map(UnitId::as_str))
        .collect();
    let mut children: HashMap<&str, u64> = HashMap::new();
    let budget = &plan.spec.budget;
    for b in bred {
        if at.contains_key(&b.id) {
            out.push(format!(
                "bred.jsonl: unit `{}` is already a unit of the source or an earlier line",
                b.id
            ));
            continue;
        }
        let Some(&parent) = at.get(&b.parent) else {
            out.push(format!(
                "bred.jsonl: unit `{}` names the parent `{}`, which neither the source nor an earlier line holds",
                b.id, b.parent
            ));
            continue;
        };
        let depth = table.depth(parent) + 1;
        if b.depth != depth || budget.max_depth.is_some_and(|max| depth > max) {
            out.push(format!(
                "bred.jsonl: unit `{}` says depth {}; its parent's depth gives {depth}, and the budget allows {}",
                b.id,
                b.depth,
                budget
                    .max_depth
                    .map_or("any".to_owned(), |d| d.to_string())
            ));
        }
        let n = children.entry(b.parent.as_str()).or_insert(0);
        *n += 1;
        if budget.max_fanout.is_some_and(|most| *n > most) {
            out.push(format!(
                "bred.jsonl: unit `{}` is child {n} of `{}`; the budget's max_fanout allows {}",
                b.id,
                b.parent,
                budget.max_fanout.unwrap_or_default()
            ));
        }
        let parent_id = UnitId(b.parent.clone());
        let by = plan.stages.iter().find(|s| s.name() == b.stage);
        match by.and_then(|s| s.bred_id(&parent_id, &b.record)) {
            Some(id) if id.0 == b.id => {}
            Some(id) => out.push(format!(
                "bred.jsonl: unit `{}`: stage `{}` gives its record the id `{id}`",
                b.id, b.stage
            )),
            None => out.push(format!(
                "bred.jsonl: unit `{}` names stage `{}`, which bears no units",
                b.id, b.stage
            )),
        }
        let hash = fanfold_ops::partition::content_hash(&plan.spec.input.partition, &b.record);
        if hash != b.unit_hash {
            out.push(format!(
                "bred.jsonl: unit `{}`'s record hashes {}, the line says {}",
                b.id,
                hash.short(16),
                b.unit_hash.short(16)
            ));
        }
        if !with_fact.contains(b.id.as_str()) {
            out.push(format!(
                "bred.jsonl: unit `{}` has no fact in facts.jsonl",
                b.id
            ));
        }
        let ordinal = table.unit(parent).map_or(0, |u| u.ordinal);
        let unit = fanfold_core::Unit {
            unit_id: UnitId(b.id.clone()),
            unit_kind: b.kind.clone(),
            ordinal,
            source_hash: b.observation,
            unit_hash: hash,
            bytes: fanfold_core::ByteRange { start: 0, end: 0 },
        };
        let json = serde_json::to_vec(&b.record).unwrap_or_default();
        let i = table.push_born(
            unit,
            &json,
            Lineage {
                parent,
                depth,
                stage: b.stage.clone(),
            },
        );
        at.insert(b.id.clone(), i);
    }
    out
}

/// The source's hash, for a file or a folder; a stream read again may not
/// be what the run read, and a command is never run.
fn source_hash(source: &Source) -> Result<ContentHash, String> {
    if !source.rereadable() {
        return Err(format!("{} is not a file or a folder", source.origin()));
    }
    let mut hasher = blake3::Hasher::new();
    let mut reader = source.open().map_err(|e| e.to_string())?;
    std::io::copy(&mut reader, &mut hasher).map_err(|e| e.to_string())?;
    reader.finish().map_err(|e| e.to_string())?;
    Ok(ContentHash(*hasher.finalize().as_bytes()))
}

/// Each routed unit's fact: every unit the prefilter sends to a stage has
/// a fact (a fact line deleted, with its item and counts, leaves one
/// without), and no unit has two at one stage.
fn check_every_unit_has_its_fact(
    routed: &crate::run::route::Routed,
    facts: &[(usize, FactRecord)],
) -> Vec<String> {
    let mut out = Vec::new();
    let mut lines: HashMap<(&str, &str), Vec<usize>> = HashMap::new();
    for (line, f) in facts {
        if let Some(id) = f.source_ids.first() {
            lines
                .entry((id.as_str(), f.stage.as_str()))
                .or_default()
                .push(*line);
        }
    }
    let mut twice: Vec<(&(&str, &str), &Vec<usize>)> =
        lines.iter().filter(|(_, l)| l.len() > 1).collect();
    twice.sort();
    for ((unit, stage), at) in twice {
        let at: Vec<String> = at.iter().map(ToString::to_string).collect();
        out.push(format!(
            "facts.jsonl holds {} facts of unit `{unit}` at stage `{stage}` (lines {}); a run records one",
            at.len(),
            at.join(", ")
        ));
    }
    let with_fact: HashSet<&str> = lines.keys().map(|(unit, _)| *unit).collect();
    let mut missing: Vec<(&str, &str)> = Vec::new();
    for (stage, units) in &routed.by_stage {
        for &i in units {
            let Ok(id) = routed.table.id(i) else {
                continue;
            };
            if !with_fact.contains(id.as_str()) {
                missing.push((id.as_str(), stage.as_str()));
            }
        }
    }
    if !missing.is_empty() {
        const NAMED: usize = 10;
        let named: Vec<String> = missing
            .iter()
            .take(NAMED)
            .map(|(unit, stage)| format!("`{unit}` (routed to `{stage}`)"))
            .collect();
        out.push(format!(
            "{} units the source routes to a stage have no fact in facts.jsonl: {}{}",
            missing.len(),
            named.join(", "),
            if missing.len() > NAMED { ", ..." } else { "" }
        ));
    }
    out
}

/// Each fact against the spec it ran with, from the folder alone: its
/// stage is one of the spec's; a map stage's facts (but a cascade's) name
/// one of the run's backends and carry the stage's rubric, version and
/// sampling, and were all made with the same rubric, version and model (a
/// sealed fact spliced in from another run differs).
fn check_fact_origins(
    plan: &Plan,
    cert: &Certificate,
    facts: &[(usize, FactRecord)],
) -> Vec<String> {
    let mut out = Vec::new();
    let fact_at = |line: &usize, f: &FactRecord| {
        format!(
            "facts.jsonl line {line}: the fact of unit `{}` at stage `{}`",
            f.source_ids.first().map_or("?", |u| u.as_str()),
            f.stage
        )
    };
    let backends: HashSet<(&str, &str, bool)> = cert
        .backends
        .iter()
        .map(|b| (b.kind.as_str(), b.model_id.as_str(), b.simulated))
        .collect();
    // Per stage: how many of its facts share each (rubric, version, model).
    type Origin = (ContentHash, u32, String);
    let origin = |f: &FactRecord| -> Origin {
        (
            f.rubric_hash,
            f.stage_version,
            serde_json::to_string(&f.model).unwrap_or_default(),
        )
    };
    let mut by_stage: HashMap<&str, HashMap<Origin, usize>> = HashMap::new();
    let mut reported: HashSet<usize> = HashSet::new();
    for (line, f) in facts {
        if plan.stage(&f.stage).is_none() {
            out.push(format!(
                "{}: the spec it ran with has no such stage",
                fact_at(line, f)
            ));
            reported.insert(*line);
            continue;
        }
        // A map stage's facts all come from its model; other kinds (and
        // a cascade's derived facts) record who decided in their own ways.
        let Some(map) = plan
            .map_runner(&f.stage)
            .filter(|m| m.spec.cascade.is_none())
            .map(|m| &m.turn.model)
        else {
            continue;
        };
        *by_stage
            .entry(f.stage.as_str())
            .or_default()
            .entry(origin(f))
            .or_default() += 1;
        let m = &f.model;
        if !backends.contains(&(m.backend.as_str(), m.model_id.as_str(), m.simulated)) {
            out.push(format!(
                "{}: made by model `{}` of a `{}` backend, which this run did not use",
                fact_at(line, f),
                m.model_id,
                m.backend
            ));
            reported.insert(*line);
            continue;
        }
        if f.rubric_hash != map.rubric_hash {
            out.push(format!(
                "{}: made with another rubric (it hashes {}, this run's {})",
                fact_at(line, f),
                f.rubric_hash.short(16),
                map.rubric_hash.short(16)
            ));
        } else if f.stage_version != map.spec.version {
            out.push(format!(
                "{}: made by version {} of the stage, this run's is {}",
                fact_at(line, f),
                f.stage_version,
                map.spec.version
            ));
        } else if m.temperature != map.spec.temperature
            || m.max_output_tokens != map.spec.max_output_tokens
            || m.seed != map.spec.seed
        {
            out.push(format!(
                "{}: made with other sampling (temperature {}, max_output_tokens {}, seed {}) than the stage's",
                fact_at(line, f),
                m.temperature,
                m.max_output_tokens,
                m.seed
            ));
        } else {
            continue;
        }
        reported.insert(*line);
    }
    // A fact of a stage whose others were all made otherwise.
    for (line, f) in facts {
        if reported.contains(line) {
            continue;
        }
        let Some(origins) = by_stage.get(f.stage.as_str()) else {
            continue;
        };
        let Some((most, n)) = origins.iter().max_by_key(|(o, n)| (**n, (*o).clone())) else {
            continue;
        };
        if origins.len() > 1 && *n > 1 && origin(f) != *most {
            out.push(format!(
                "{}: made with another rubric, version or model than the stage's other {n} facts",
                fact_at(line, f)
            ));
        }
    }
    out
}

/// Each map fact's key derived again, from the unit read back, the stage's
/// meaning and rubric, and its model: a fact that is not this run's (about
/// other content, or made for another spec) does not derive. A fact the
/// run keyed by more than its unit's own view (a widened context, a
/// cascade's derived facts, a view holding a tool's observations) is left
/// to the checks above.
fn check_fact_keys(
    plan: &Plan,
    table: &UnitTable,
    at: &HashMap<&UnitId, usize>,
    facts: &[(usize, FactRecord)],
) -> Vec<String> {
    use fanfold_core::StableHash as _;
    let mut out = Vec::new();
    if plan.stages.iter().any(|s| s.kind() == "tool") {
        return out;
    }
    let mut projectors: HashMap<&str, Option<Projector>> = HashMap::new();
    for (line, f) in facts {
        let [id] = f.source_ids.as_slice() else {
            continue;
        };
        let Some(runner) = plan.map_runner(&f.stage) else {
            continue;
        };
        let map = &runner.turn.model;
        if runner.spec.cascade.is_some() || map.rubric_hash != f.rubric_hash {
            continue;
        }
        let Some(&i) = at.get(id) else {
            continue;
        };
        let projector = projectors.entry(f.stage.as_str()).or_insert_with(|| {
            Projector::compile(
                map.spec.name.as_str(),
                map.spec.project.as_deref(),
                &map.spec.fields,
            )
            .ok()
        });
        let Some(projector) = projector else {
            continue;
        };
        let Ok(view) = projector.project(id.as_str(), &table.value(i)) else {
            continue;
        };
        let key = map.cache_key(view.key_in(fanfold_ops::view::INPUT_BUCKET), &f.model);
        if key != f.key {
            out.push(format!(
                "facts.jsonl line {line}: the fact of unit `{id}` at stage `{}` is keyed {}, but this run's stage, rubric and model give {} for that unit: it is not this run's fact",
                f.stage,
                f.key.short(16),
                key.short(16)
            ));
        }
    }
    out
}

/// What each stage said of one unit of a finished run, and why, in words:
/// its facts (status, decision, confidence, reason, evidence, the fold
/// path up to the answer), whether the answer holds it, the select's
/// choice and the effects taken on it; then the unit read back from the
/// source, when it can be read again (see [`source_to_reread`]).
pub fn why(dir: &Path, unit: &str, input: Option<&Path>) -> Result<Why, RecheckError> {
    let out_dir = OutDir::read(dir)?;
    let mut text = story(&out_dir, dir, unit);
    let (line, read_back) = read_unit_back(&out_dir, dir, unit, input)?;
    text.push_str(&line);
    Ok(Why { text, read_back })
}

/// What `why` tells of one unit.
pub struct Why {
    pub text: String,
    /// Whether the unit was read back from its source and is as the run
    /// judged it (or, with no fact about it, whether the source was read).
    pub read_back: bool,
}

/// The unit read back from the run's source, in one line, and whether it
/// is as the run judged it.
fn read_unit_back(
    out_dir: &OutDir,
    dir: &Path,
    unit: &str,
    input: Option<&Path>,
) -> Result<(String, bool), RecheckError> {
    let cert = &out_dir.certificate;
    let plan = match rebuilt_plan(dir, cert)? {
        Ok(p) => p,
        Err(e) => return Ok((format!("  not read back from the source: {e}\n"), false)),
    };
    let reread = match source_to_reread(&plan, cert, input) {
        Ok(r) => r,
        Err(e) => return Ok((format!("  not read back from the source: {e}\n"), false)),
    };
    let origin = reread.source.origin();
    let mut every = plan.spec.clone();
    every.prefilter.clear();
    let unfiltered = match rebuild(every, &plan.spec_path) {
        Ok(p) => p,
        Err(e) => return Ok((format!("  not read back from the source: {e}\n"), false)),
    };
    let keep: HashSet<String> = HashSet::from([unit.to_owned()]);
    let routed = match crate::run::route_source_keeping(
        &unfiltered,
        &reread.source,
        cert.settings.max_unit_bytes,
        Some(&keep),
    ) {
        Ok(r) => r,
        Err(e) => {
            return Ok((
                format!(
                    "  not read back from the source: {origin} cannot be read as the run read it: {e}\n"
                ),
                false,
            ));
        }
    };
    let id = UnitId(unit.to_owned());
    let found = routed.table.index_by_id().get(&id).map(|&i| {
        fanfold_ops::partition::content_hash(&plan.spec.input.partition, &routed.table.value(i))
    });
    let judged: Option<&ContentHash> = out_dir.facts.iter().find_map(|(_, f)| {
        f.source_ids
            .iter()
            .zip(&f.source_hashes)
            .find(|(u, _)| u.as_str() == unit)
            .map(|(_, h)| h)
    });
    Ok(match (found, judged) {
        (None, Some(_)) => (
            format!("  read back: {origin} has no unit `{unit}` now\n"),
            false,
        ),
        (None, None) => (
            format!("  read back: {origin} has no unit `{unit}`\n"),
            true,
        ),
        (Some(h), Some(j)) if h != *j => (
            format!("  read back: the unit changed in {origin} since the run (its hash differs)\n"),
            false,
        ),
        (Some(_), Some(_)) => (
            format!("  read back from {origin}: as the run judged it\n"),
            true,
        ),
        (Some(_), None) => (format!("  read back from {origin}: it is there\n"), true),
    })
}

/// The facts' and the answer's story of one unit, from the folder alone.
fn story(out_dir: &OutDir, dir: &Path, unit: &str) -> String {
    use std::fmt::Write as _;
    let (a, c) = (&out_dir.answer, &out_dir.certificate);
    let mut s = String::new();
    let _ = writeln!(s, "unit `{unit}` in run {} of spec `{}`", c.run_id, c.spec);
    let at = a.items.iter().position(|i| i.unit_id.as_str() == unit);
    let _ = match at {
        Some(n) => writeln!(
            s,
            "  the answer lists it (item {} of {})",
            n + 1,
            a.items.len()
        ),
        None => writeln!(s, "  the answer does not list it"),
    };
    let facts: Vec<&(usize, FactRecord)> = out_dir
        .facts
        .iter()
        .filter(|(_, f)| f.source_ids.iter().any(|id| id.as_str() == unit))
        .collect();
    if facts.is_empty() {
        let excluded: Vec<String> = c
            .excluded_by_reason
            .iter()
            .map(|(r, n)| format!("{r}: {n}"))
            .collect();
        let _ = writeln!(
            s,
            "  no stage decided it: the prefilter excluded it ({}), or the source has no such unit; `fanfold explain SPEC` shows the routing",
            if excluded.is_empty() {
                "it excluded nothing in this run".to_owned()
            } else {
                excluded.join(", ")
            }
        );
    }
    for (line, f) in facts {
        let first = f.source_ids.first().is_some_and(|id| id.as_str() == unit);
        let _ = writeln!(
            s,
            "  stage `{}` (facts.jsonl line {line}){}: {}{}{}",
            f.stage,
            if first {
                String::new()
            } else {
                format!(
                    ", as a related member of unit `{}`'s context",
                    f.source_ids.first().map_or("?", |u| u.as_str())
                )
            },
            f.status.as_str(),
            f.decision
                .as_deref()
                .map(|d| format!(", decision `{d}`"))
                .unwrap_or_default(),
            f.confidence
                .map(|p| format!(", confidence {p:.2}"))
                .unwrap_or_default()
        );
        if let Some(r) = &f.reason {
            let _ = writeln!(s, "    why: {r}");
        }
        for e in &f.evidence {
            let _ = writeln!(
                s,
                "    evidence: {} {}..{} {:?}",
                e.field, e.start, e.end, e.quote
            );
        }
        if !f.is_intact() {
            let _ = writeln!(
                s,
                "    this fact was changed after the run: it does not match its digest"
            );
        }
        if !f.reducer_path.is_empty() {
            let _ = writeln!(s, "    folded through {}", f.reducer_path.join(" -> "));
        }
    }
    for (file, what) in [("selections.jsonl", "chose"), ("effects.jsonl", "effect")] {
        let Ok(text) = std::fs::read_to_string(dir.join(file)) else {
            continue;
        };
        for line in text.lines() {
            let Ok(v) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            let id = v
                .get("unit_id")
                .or_else(|| v.get("unit"))
                .and_then(Value::as_str);
            if id != Some(unit) {
                continue;
            }
            let get = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("");
            let _ = match what {
                "effect" => writeln!(
                    s,
                    "  effect `{}`: {}{}",
                    get("stage"),
                    get("outcome"),
                    match get("detail") {
                        "" => String::new(),
                        d => format!(" ({d})"),
                    }
                ),
                _ => writeln!(s, "  select: {}", line),
            };
        }
    }
    s
}
