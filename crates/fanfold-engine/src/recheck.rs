//! Re-checking a finished answer from its output folder alone, later or
//! on another machine: every fact's digest, the certificate's counts
//! against the facts, the answer against what its facts give, and, with
//! the source, every cited unit's hash and every quote at its range. It
//! trusts nothing the run kept (no store, no cached fold node): the spec
//! is rebuilt from the certificate and must hash as it did, and the source
//! is partitioned again.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use fanfold_core::{ContentHash, FactRecord, StatusCounts, UnitId};
use fanfold_ops::fold::{FoldValue, NodeCache, fold_tree};
use fanfold_ops::verify::{ReadBack, verify};
use fanfold_ops::view::Projector;
use serde_json::Value;

use crate::kit::UnitTable;
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
}

impl Rechecked {
    pub fn passed(&self) -> bool {
        self.mismatches.is_empty()
    }
}

/// A finished run's output folder, read back.
pub struct OutDir {
    pub dir: PathBuf,
    pub answer: Answer,
    pub certificate: Certificate,
    /// facts.jsonl, with the line each fact is on.
    pub facts: Vec<(usize, FactRecord)>,
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
        Ok(OutDir {
            dir: dir.to_owned(),
            answer,
            certificate,
            facts,
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
    projectors: HashMap<String, (Projector, bool)>,
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

/// Re-checks the run in `dir`: `input` overrides where the source is read
/// from (else the spec's own input).
pub fn recheck(dir: &Path, input: Option<Source>) -> Result<Rechecked, RecheckError> {
    let out_dir = OutDir::read(dir)?;
    let mut out = Rechecked::default();
    out_dir.check_alone(&mut out);
    let cert = &out_dir.certificate;

    // The spec as it ran, rebuilt and hashed with the files it names.
    let (Some(spec_path), Some(spec)) = (&cert.spec_path, &cert.spec_as_run) else {
        out.mismatches.push(
            "the certificate does not carry the spec it ran with (written by an older fanfold): only the folder itself was checked".into(),
        );
        return Ok(out);
    };
    let spec: fanfold_core::spec::Spec =
        serde_json::from_value(spec.clone()).map_err(|e| RecheckError::File {
            path: dir.join("certificate.json").display().to_string(),
            detail: format!("spec_as_run: {e}"),
        })?;
    let spec_path = PathBuf::from(spec_path);
    let spec_dir = spec_path
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let rebuild = |spec| {
        Plan::from_spec(spec, &spec_path, &spec_dir)
            .map_err(|e| format!("the spec it ran with cannot be rebuilt: {e}"))
    };
    let plan = match rebuild(spec) {
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

    // The facts give the answer: folded flat, with no cached node.
    let facts: Vec<&FactRecord> = out_dir.facts.iter().map(|(_, f)| f).collect();
    let Some(source) = input.or_else(|| plan.default_source()) else {
        out.mismatches
            .push("no source to read: give --input".into());
        return Ok(out);
    };
    let source = plan.resolve(source).map_err(crate::RunError::from)?;
    // Every unit a fact is about, whether the prefilter keeps it now or
    // not: a cited unit edited since may no longer pass it, and is then
    // changed, not missing. Only those units are held.
    let wanted: std::collections::HashSet<String> = facts
        .iter()
        .flat_map(|f| f.source_ids.iter().map(|id| id.0.clone()))
        .chain(out_dir.answer.items.iter().map(|i| i.unit_id.0.clone()))
        .collect();
    let mut every = plan.spec.clone();
    every.prefilter.clear();
    let unfiltered = match rebuild(every) {
        Ok(p) => p,
        Err(e) => {
            out.mismatches.push(e);
            return Ok(out);
        }
    };
    let routed = match crate::run::route_source_keeping(
        &unfiltered,
        &source,
        cert.settings.max_unit_bytes,
        Some(&wanted),
    ) {
        Ok(r) => r,
        Err(e) => {
            out.mismatches
                .push(format!("the source cannot be read as the run read it: {e}"));
            return Ok(out);
        }
    };
    out.source_read = true;
    let hash = source_hash(&source);
    if let Some(h) = hash
        && h != cert.source_hash
    {
        out.mismatches.push(format!(
            "the source {} changed since the run: it hashes {}, the run read {}",
            cert.source_origin,
            h.short(16),
            cert.source_hash.short(16)
        ));
    }
    // The same bytes partition the same way, whether ids are settled in
    // memory (here) or through the store (the run).
    let c = &routed.coverage;
    if hash == Some(cert.source_hash) && *c != cert.coverage {
        let k = &cert.coverage;
        out.mismatches.push(format!(
            "the source read again gives {} elements = {} units + {} rejected + {} repeated identically; the certificate says {} = {} + {} + {}",
            c.elements, c.units, c.rejected, c.repeated_identical,
            k.elements, k.units, k.rejected, k.repeated_identical
        ));
    }
    let table = &routed.table;
    let at = table.index_by_id();
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

/// The source's hash, for a file; a stream read again may not be what the
/// run read, so it is not hashed.
fn source_hash(source: &Source) -> Option<ContentHash> {
    if !source.rereadable() {
        return None;
    }
    let mut hasher = blake3::Hasher::new();
    let mut reader = source.open().ok()?;
    std::io::copy(&mut reader, &mut hasher).ok()?;
    Some(ContentHash(*hasher.finalize().as_bytes()))
}

/// What each stage said of one unit of a finished run, and why, in words:
/// its facts (status, decision, confidence, reason, evidence, the fold
/// path up to the answer), whether the answer holds it, the select's
/// choice and the effects taken on it.
pub fn why(dir: &Path, unit: &str) -> Result<String, RecheckError> {
    use std::fmt::Write as _;
    let out_dir = OutDir::read(dir)?;
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
    Ok(s)
}
