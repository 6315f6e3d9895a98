//! The `tool` operator: a typed request built from a unit by jq, checked
//! against the stage's argument schema, and filled into the fixed
//! template of the one capability the stage declares. Nothing here
//! reaches outside the process; the engine's runner sends what this
//! builds, and checks again what it resolves to (the URL it parses, the
//! file it opens).
//!
//! A filled value can only ever be one path segment, one query value,
//! one argument or one file name: characters that would change the
//! template's structure are encoded or refused, never passed through.

use std::collections::BTreeMap;

use fanfold_core::spec::tool::{Capability, ToolStageSpec};
use fanfold_core::{Bucket, ContentHash, StableHasher};
use serde_json::Value;

use crate::jq::{JqError, JqProgram, Site, to_val};

/// The namespace of a tool stage's definition.
pub const DEFINITION: Bucket = Bucket::Kind("tool-def-v1");
/// The namespace of a request's identity: capability and arguments.
pub const REQUEST: Bucket = Bucket::Kind("tool-request-v1");

#[derive(Debug, thiserror::Error)]
pub enum ToolSpecError {
    #[error("stage `{stage}`: {detail}")]
    Invalid { stage: String, detail: String },
    #[error("stage `{stage}`: {source}")]
    Jq { stage: String, source: JqError },
}

/// Why a unit's request was not sent.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum Refused {
    #[error("the request expression failed: {0}")]
    Expression(String),
    #[error("the request must be an object of arguments, not {0}")]
    NotObject(String),
    #[error("the arguments break their schema: {0}")]
    Schema(String),
    #[error("argument `{name}` = {value} may not fill `{hole}`: {why}")]
    Value {
        name: String,
        value: String,
        hole: String,
        why: &'static str,
    },
}

/// One piece of a template: literal text or a hole an argument fills.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Piece {
    Text(String),
    Hole(String),
}

/// A template string split at its `{name}` holes.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Template(pub(crate) Vec<Piece>);

impl Template {
    pub(crate) fn parse(text: &str) -> Result<Template, String> {
        let mut pieces = Vec::new();
        let mut rest = text;
        while let Some(open) = rest.find('{') {
            let (before, after) = rest.split_at(open);
            if !before.is_empty() {
                pieces.push(Piece::Text(before.to_owned()));
            }
            let close = after
                .find('}')
                .ok_or_else(|| format!("`{text}` has a `{{` with no `}}`"))?;
            let name = after.get(1..close).unwrap_or_default();
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(format!(
                    "`{text}` has a hole `{{{name}}}` that is not a name"
                ));
            }
            pieces.push(Piece::Hole(name.to_owned()));
            rest = after.get(close + 1..).unwrap_or_default();
        }
        if !rest.is_empty() {
            pieces.push(Piece::Text(rest.to_owned()));
        }
        Ok(Template(pieces))
    }

    pub(crate) fn holes(&self) -> impl Iterator<Item = &str> {
        self.0.iter().filter_map(|p| match p {
            Piece::Hole(h) => Some(h.as_str()),
            Piece::Text(_) => None,
        })
    }

    fn has_holes(&self) -> bool {
        self.holes().next().is_some()
    }

    /// The template with each hole replaced by `fill(name, value)`.
    pub(crate) fn fill(
        &self,
        args: &BTreeMap<String, Value>,
        fill: impl Fn(&str, &str) -> Result<String, &'static str>,
    ) -> Result<String, Refused> {
        let mut out = String::new();
        for piece in &self.0 {
            match piece {
                Piece::Text(t) => out.push_str(t),
                Piece::Hole(name) => {
                    let raw = args.get(name).and_then(scalar);
                    let refuse = |why| Refused::Value {
                        name: name.clone(),
                        value: shown(&raw),
                        hole: name.clone(),
                        why,
                    };
                    let Some(value) = raw.clone() else {
                        return Err(refuse("it is not a string, number or boolean"));
                    };
                    if value.is_empty() {
                        return Err(refuse("it is empty"));
                    }
                    if value.contains('\0') {
                        return Err(refuse("it holds a NUL byte"));
                    }
                    out.push_str(&fill(name, &value).map_err(refuse)?);
                }
            }
        }
        Ok(out)
    }
}

/// An argument as the text a hole takes; `None` for arrays, objects and
/// null, which no hole takes.
pub(crate) fn scalar(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

fn shown(v: &Option<String>) -> String {
    match v {
        Some(s) => serde_json::to_string(s).unwrap_or_default(),
        None => "a value that is not a scalar".into(),
    }
}

/// Percent-encodes everything but RFC 3986's unreserved characters, so a
/// value is one path segment or one query value, whatever it holds.
pub(crate) fn encode_component(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A value that would climb out of its segment once a path is resolved.
pub(crate) fn is_dot_segment(value: &str) -> bool {
    value == "." || value == ".."
}

/// What one unit's request resolves to, ready to send.
#[derive(Clone, Debug, PartialEq)]
pub enum Target {
    /// The filled URL; the runner checks it parses to the template's
    /// scheme, host and port, with the path unchanged.
    Http { url: String },
    /// The program and its filled arguments.
    Argv(Vec<String>),
    /// The filled path, relative to the capability's root.
    File { path: String },
    /// The query's named parameters, `:name` → value.
    Sqlite { params: Vec<(String, Value)> },
}

/// A unit's request: its arguments, their identity and where they go.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    pub args: BTreeMap<String, Value>,
    /// The request's content key: capability and arguments. Units with
    /// the same key share one call.
    pub key: ContentHash,
    pub target: Target,
}

/// How an observation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ObservationStatus {
    Ok,
    NotFound,
    Denied,
    Timeout,
    Error,
}

impl ObservationStatus {
    pub const ALL: [ObservationStatus; 5] = [
        ObservationStatus::Ok,
        ObservationStatus::NotFound,
        ObservationStatus::Denied,
        ObservationStatus::Timeout,
        ObservationStatus::Error,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ObservationStatus::Ok => "ok",
            ObservationStatus::NotFound => "not_found",
            ObservationStatus::Denied => "denied",
            ObservationStatus::Timeout => "timeout",
            ObservationStatus::Error => "error",
        }
    }

    pub fn parse(s: &str) -> Option<ObservationStatus> {
        ObservationStatus::ALL.into_iter().find(|x| x.as_str() == s)
    }

    /// Whether the observation is an answer about the resource (kept in
    /// the store) rather than about the attempt (tried again next run).
    pub fn is_stable(self) -> bool {
        matches!(self, ObservationStatus::Ok | ObservationStatus::NotFound)
    }
}

/// A compiled tool stage.
pub struct ToolStage {
    pub spec: ToolStageSpec,
    request: JqProgram,
    extract: Option<JqProgram>,
    validator: jsonschema::Validator,
    templates: Vec<Template>,
    definition: ContentHash,
    capability: ContentHash,
}

impl ToolStage {
    pub fn new(spec: ToolStageSpec) -> Result<ToolStage, ToolSpecError> {
        let invalid = |detail: String| ToolSpecError::Invalid {
            stage: spec.name.clone(),
            detail,
        };
        let jq = |source| ToolSpecError::Jq {
            stage: spec.name.clone(),
            source,
        };
        let request = JqProgram::compile(&spec.request).map_err(jq)?;
        let extract = spec
            .extract
            .as_deref()
            .map(JqProgram::compile)
            .transpose()
            .map_err(jq)?;
        if spec.field.is_empty() {
            return Err(invalid("`as` must name a field".into()));
        }
        check_quota(&spec.quota).map_err(&invalid)?;
        if spec.attempts == 0 || spec.timeout_ms == 0 || spec.max_bytes == 0 {
            return Err(invalid(
                "attempts, timeout_ms and max_bytes must each be at least 1".into(),
            ));
        }
        let validator = args_validator(&spec.args).map_err(&invalid)?;
        let templates = templates(&spec.capability).map_err(&invalid)?;
        for t in &templates {
            for hole in t.holes() {
                if !spec.args.contains_key(hole) {
                    return Err(invalid(format!(
                        "the capability's hole `{{{hole}}}` is not one of args [{}]",
                        spec.args.keys().cloned().collect::<Vec<_>>().join(", ")
                    )));
                }
            }
        }
        let cap_json = serde_json::to_value(&spec.capability).unwrap_or(Value::Null);
        let mut h = StableHasher::new(REQUEST);
        h.field("capability", &cap_json);
        let capability = h.finish();
        let mut h = StableHasher::new(DEFINITION);
        h.field("version", &spec.version)
            .field("request", spec.request.as_str())
            .field(
                "args",
                &serde_json::to_value(&spec.args).unwrap_or(Value::Null),
            )
            .field("capability", &capability)
            .field("as", spec.field.as_str())
            .field("extract", spec.extract.as_deref().unwrap_or(""))
            .field("max_bytes", &spec.max_bytes);
        let definition = h.finish();
        Ok(ToolStage {
            spec,
            request,
            extract,
            validator,
            templates,
            definition,
            capability,
        })
    }

    pub fn name(&self) -> &str {
        &self.spec.name
    }

    pub fn definition_hash(&self) -> ContentHash {
        self.definition
    }

    /// The unit's request, `None` when its expression yields `null` (no
    /// request for this unit).
    pub fn request(&self, unit_id: &str, unit: &Value) -> Result<Option<Request>, Refused> {
        let Some(args) = build_args(
            &self.request,
            &self.validator,
            unit,
            Site::new("the tool's request", unit_id),
        )?
        else {
            return Ok(None);
        };
        let target = self.target(&args)?;
        let mut h = StableHasher::new(REQUEST);
        h.field("capability", &self.capability)
            .field("args", &serde_json::to_value(&args).unwrap_or(Value::Null));
        Ok(Some(Request {
            key: h.finish(),
            args,
            target,
        }))
    }

    fn target(&self, args: &BTreeMap<String, Value>) -> Result<Target, Refused> {
        let mut templates = self.templates.iter();
        let mut next = || templates.next().cloned().unwrap_or(Template(Vec::new()));
        Ok(match &self.spec.capability {
            Capability::HttpGet { .. } => Target::Http {
                url: fill_url(&next(), args)?,
            },
            Capability::Argv { .. } => {
                let mut argv = Vec::new();
                for t in &self.templates {
                    argv.push(t.fill(args, |_, v| {
                        if v.starts_with('-') {
                            Err("an argument may not start with `-`, which a program reads as an option")
                        } else if is_dot_segment(v) || v.contains(['/', '\\']) {
                            // `cat data/{name}.txt` must not reach `../../x`:
                            // any argument may be a path to the program.
                            Err("a value may not hold a path separator or be a dot segment, which a program may read as a path")
                        } else {
                            Ok(v.to_owned())
                        }
                    })?);
                }
                Target::Argv(argv)
            }
            Capability::File { .. } => Target::File {
                path: next().fill(args, |_, v| {
                    if is_dot_segment(v) || v.contains(['/', '\\']) {
                        Err("a file name may not hold a path separator or be a dot segment")
                    } else {
                        Ok(v.to_owned())
                    }
                })?,
            },
            Capability::Sqlite { .. } => Target::Sqlite {
                params: args
                    .iter()
                    .map(|(k, v)| (format!(":{k}"), v.clone()))
                    .collect(),
            },
        })
    }

    /// What later stages see of an `ok` observation's body.
    pub fn extract(&self, unit_id: &str, body: &Value) -> Result<Value, JqError> {
        match &self.extract {
            None => Ok(body.clone()),
            Some(p) => Ok(p
                .first_json(to_val(body), Site::new("the tool's extract", unit_id))?
                .unwrap_or(Value::Null)),
        }
    }
}

/// What an observation bears: the records that become units, each with
/// the id it is born under, and those dropped, each with why.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Offspring {
    /// (id, record), in the observation's order.
    pub born: Vec<(String, Value)>,
    /// (id, reason): `repeated_key` for a second record of one id, else
    /// the reason of the limit that cut it.
    pub dropped: Vec<(String, &'static str)>,
}

/// How many records an observation may bear, and the name of the limit
/// that cuts the rest (`max_fanout`, `max_depth`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Room {
    pub most: u64,
    pub cut_by: &'static str,
}

/// The id a record of `parent`'s observation is born under: the parent's
/// id and the record's `key` (a string as written, a number as its JSON
/// text), or `c` and its content hash when the key is absent or not a
/// scalar. The same parent and record give the same id on every run.
pub fn offspring_id(parent: &str, record: &Value, key: Option<&str>) -> String {
    let named = key.and_then(|k| record.get(k)).and_then(|v| match v {
        Value::String(s) if !s.is_empty() => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    });
    match named {
        Some(name) => format!("{parent}>{name}"),
        None => format!(
            "{parent}>c{}",
            crate::partition::unit_hash(record).short(16)
        ),
    }
}

/// The records an extracted observation bears as units: the elements of
/// an array (anything else bears none), in order, a repeated id dropped,
/// at most `room.most` born and the rest dropped under `room.cut_by`.
pub fn offspring(
    parent: &str,
    extracted: &Value,
    key: Option<&str>,
    room: Option<Room>,
) -> Offspring {
    let mut out = Offspring::default();
    let Value::Array(records) = extracted else {
        return out;
    };
    let mut seen = std::collections::HashSet::new();
    for record in records {
        let id = offspring_id(parent, record, key);
        if !seen.insert(id.clone()) {
            out.dropped.push((id, "repeated_key"));
            continue;
        }
        match room {
            Some(r) if out.born.len() as u64 >= r.most => out.dropped.push((id, r.cut_by)),
            _ => out.born.push((id, record.clone())),
        }
    }
    out
}

/// The capability's templates, checked for holes only where a value
/// cannot change what is reached.
/// A quota a stage can keep: at least one in flight, a positive rate.
pub(crate) fn check_quota(quota: &fanfold_core::spec::tool::QuotaSpec) -> Result<(), String> {
    if quota.concurrency == 0 {
        return Err("quota.concurrency must be at least 1".into());
    }
    if quota.per_second.is_some_and(|r| r.is_nan() || r <= 0.0) {
        return Err("quota.per_second must be above 0".into());
    }
    Ok(())
}

/// The validator of an `args` table: an object of exactly those
/// arguments, each under its schema.
pub(crate) fn args_validator(
    args: &BTreeMap<String, Value>,
) -> Result<jsonschema::Validator, String> {
    let schema = serde_json::json!({
        "type": "object",
        "additionalProperties": false,
        "required": args.keys().collect::<Vec<_>>(),
        "properties": args,
    });
    jsonschema::validator_for(&schema).map_err(|e| format!("args is not a JSON Schema: {e}"))
}

/// The arguments `request` builds from `input`, checked against their
/// schema; `None` when it yields `null`.
pub(crate) fn build_args(
    request: &JqProgram,
    validator: &jsonschema::Validator,
    input: &Value,
    at: Site<'_>,
) -> Result<Option<BTreeMap<String, Value>>, Refused> {
    let built = request
        .first_json(to_val(input), at)
        .map_err(|e| Refused::Expression(e.to_string()))?;
    let args = match built {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(map)) => Value::Object(map),
        Some(other) => return Err(Refused::NotObject(kind_of(&other).into())),
    };
    if let Some(e) = validator.iter_errors(&args).next() {
        return Err(Refused::Schema(format!("{e} at {}", e.instance_path())));
    }
    Ok(match args {
        Value::Object(map) => Some(map.into_iter().collect()),
        _ => None,
    })
}

/// A URL template whose scheme, host and port are fixed, and its
/// authority (`host:port`), which no hole may touch.
pub(crate) fn url_template(url: &str) -> Result<(Template, String), String> {
    let t = Template::parse(url)?;
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| format!("`{url}` is not an http or https URL"))?;
    if scheme != "http" && scheme != "https" {
        return Err(format!("`{url}` is not an http or https URL"));
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if authority.contains('{') || authority.is_empty() {
        return Err(format!(
            "`{url}`: the host is fixed, a hole may fill only the path or the query"
        ));
    }
    if rest.contains('#') {
        return Err(format!("`{url}` may not carry a fragment"));
    }
    Ok((t, format!("{scheme}://{authority}")))
}

/// Fills a URL template: each value one path segment or query value.
pub(crate) fn fill_url(t: &Template, args: &BTreeMap<String, Value>) -> Result<String, Refused> {
    t.fill(args, |_, v| {
        if is_dot_segment(v) {
            Err("a dot segment would climb the path")
        } else {
            Ok(encode_component(v))
        }
    })
}

fn templates(cap: &Capability) -> Result<Vec<Template>, String> {
    match cap {
        Capability::HttpGet { url, .. } => Ok(vec![url_template(url)?.0]),
        Capability::Argv { argv } => {
            let templates = argv
                .iter()
                .map(|a| Template::parse(a))
                .collect::<Result<Vec<_>, _>>()?;
            match templates.first() {
                None => Err("argv names no program".into()),
                Some(t) if t.has_holes() => {
                    Err("argv's program is fixed: its first element may hold no hole".into())
                }
                Some(_) => {
                    refuse_code_from_values(argv, &templates)?;
                    Ok(templates)
                }
            }
        }
        Capability::File { path, .. } => {
            let t = Template::parse(path)?;
            if path.starts_with('/') || path.split('/').any(|s| s == "..") {
                return Err(format!("`{path}` must be relative and stay under the root"));
            }
            Ok(vec![t])
        }
        Capability::Sqlite { query, .. } => {
            if query.contains('{') {
                return Err(
                    "a query takes its arguments as named parameters (`:name`), never spliced in"
                        .into(),
                );
            }
            Ok(Vec::new())
        }
    }
}

/// An interpreter told to run its argument as a program (`sh -c`,
/// `python -c`, `perl -e`, `node -e` ...) in a command whose holes a
/// record fills: the record would write the code. Refused when the spec
/// is checked; no quoting makes a value safe inside a program's text.
fn refuse_code_from_values(argv: &[String], templates: &[Template]) -> Result<(), String> {
    if !templates.iter().any(Template::has_holes) {
        return Ok(());
    }
    let mut interpreter: Option<(&str, &str)> = None;
    for (arg, t) in argv.iter().zip(templates) {
        if t.has_holes() {
            // Code attached to its flag (`-cimport os; {x}`,
            // `--eval={x}`): the flag is the text before the first hole.
            let flag = arg.split('{').next().unwrap_or_default();
            if let Some((name, shown)) = interpreter
                && flag.starts_with('-')
                && runs_code_flag(name, flag)
            {
                return Err(format!(
                    "`{shown} {arg}` runs its argument as a program, and a hole would let a \
                     record write that program; put the code in a script file the spec names, \
                     and pass values as its own arguments"
                ));
            }
            continue;
        }
        if let Some((name, _)) = interpreter
            && runs_code_flag(name, arg)
        {
            return Err(format!(
                "`{} {arg}` runs its argument as a program, and a hole would let a record \
                 write that program; put the code in a script file the spec names, and pass \
                 values as its own arguments",
                interpreter.map_or(name, |(_, shown)| shown)
            ));
        }
        if let Some(name) = interpreter_name(arg) {
            interpreter = Some((name, arg.as_str()));
        }
    }
    Ok(())
}

/// The interpreter family `program` belongs to (its file name, less a
/// version: `/usr/bin/python3.12` is `python`), if it runs code given on
/// its command line.
fn interpreter_name(program: &str) -> Option<&'static str> {
    let file = program.rsplit('/').next().unwrap_or(program);
    let base = file.trim_end_matches(|c: char| c.is_ascii_digit() || c == '.');
    let base = base.strip_suffix(".exe").unwrap_or(base);
    const KNOWN: &[&str] = &[
        "sh",
        "bash",
        "zsh",
        "dash",
        "ksh",
        "mksh",
        "ash",
        "fish",
        "busybox",
        // `env -S 'sh -c ...'` splits its argument into a command line.
        "env",
        "python",
        "pypy",
        "perl",
        "ruby",
        "node",
        "nodejs",
        "deno",
        "bun",
        "php",
        "lua",
        "luajit",
        "osascript",
        "pwsh",
        "powershell",
        "Rscript",
        "julia",
        "cmd",
    ];
    KNOWN.iter().copied().find(|k| *k == base)
}

/// Whether `flag` makes interpreter `name` run the next argument (or a
/// later one) as code.
fn runs_code_flag(name: &str, flag: &str) -> bool {
    let short = |letters: &[char]| {
        flag.strip_prefix('-')
            .filter(|rest| !rest.starts_with('-') && !rest.is_empty())
            .is_some_and(|rest| rest.chars().any(|c| letters.contains(&c)))
    };
    let long = |names: &[&str]| {
        names
            .iter()
            .any(|n| flag == *n || flag.starts_with(&format!("{n}=")))
    };
    match name {
        "sh" | "bash" | "zsh" | "dash" | "ksh" | "mksh" | "ash" | "fish" => {
            short(&['c']) || long(&["--command"])
        }
        // `busybox sh -c`: the applet's flag is the shell's.
        "busybox" => short(&['c']),
        "env" => short(&['S']) || long(&["--split-string"]),
        "python" | "pypy" => short(&['c']),
        "perl" | "ruby" | "lua" | "luajit" | "julia" | "osascript" | "Rscript" => {
            short(&['e', 'E'])
        }
        "node" | "nodejs" | "bun" => short(&['e', 'p']) || long(&["--eval", "--print"]),
        "deno" => flag == "eval",
        "php" => short(&['r']) || long(&["--run"]),
        "pwsh" | "powershell" => {
            let f = flag.to_ascii_lowercase();
            f.starts_with("-c") || f.starts_with("-e") || f.starts_with("/c")
        }
        "cmd" => flag.eq_ignore_ascii_case("/c") || flag.eq_ignore_ascii_case("/k"),
        _ => false,
    }
}

pub(crate) fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn stage(capability: Capability) -> ToolStage {
        ToolStage::new(ToolStageSpec {
            name: "t".into(),
            version: 1,
            request: "{owner: \"acme\", repo: \"widget\", number}".into(),
            args: BTreeMap::from([
                ("owner".into(), json!({"type": "string"})),
                ("repo".into(), json!({"type": "string"})),
                ("number".into(), json!({"type": ["integer", "string"]})),
            ]),
            capability,
            field: "comments".into(),
            extract: None,
            then: None,
            quota: Default::default(),
            timeout_ms: 1000,
            attempts: 1,
            max_bytes: 1000,
            ttl_s: 60,
            max_requests: None,
            enter: None,
        })
        .expect("valid")
    }

    #[test]
    fn offspring_ids_are_the_parent_and_the_key_and_limits_drop_in_order() {
        let linked = json!([
            {"number": 34, "title": "a"},
            {"number": "x-1"},
            {"number": 34, "title": "again"},
            {"title": "no key"},
            {"number": 35},
        ]);
        let all = offspring("12", &linked, Some("number"), None);
        let ids: Vec<&str> = all.born.iter().map(|(id, _)| id.as_str()).collect();
        let keyless = offspring_id("12", &json!({"title": "no key"}), Some("number"));
        assert!(keyless.starts_with("12>c") && keyless.len() == "12>c".len() + 16);
        assert_eq!(ids, ["12>34", "12>x-1", keyless.as_str(), "12>35"]);
        assert_eq!(all.dropped, vec![("12>34".to_owned(), "repeated_key")]);
        // The same record under the same parent is the same id; another
        // parent gives another.
        assert_eq!(offspring("12", &linked, Some("number"), None), all);
        assert_eq!(
            offspring_id("13", &json!({"number": 34}), Some("number")),
            "13>34"
        );

        let cut = offspring(
            "12",
            &linked,
            Some("number"),
            Some(Room {
                most: 2,
                cut_by: "max_fanout",
            }),
        );
        assert_eq!(cut.born.len(), 2);
        assert_eq!(cut.born[0].0, "12>34");
        assert_eq!(cut.born[1].0, "12>x-1");
        let reasons: Vec<&str> = cut.dropped.iter().map(|(_, r)| *r).collect();
        assert_eq!(reasons, ["repeated_key", "max_fanout", "max_fanout"]);
        // Not an array: nothing is born.
        assert_eq!(
            offspring("12", &json!({"number": 1}), Some("number"), None),
            Offspring::default()
        );
    }

    fn http() -> Capability {
        Capability::HttpGet {
            url: "http://127.0.0.1:9/repos/{owner}/{repo}/issues/{number}/comments".into(),
            token_env: None,
        }
    }

    #[test]
    fn fills_path_segments_encoded() {
        let s = stage(http());
        let r = s
            .request("1", &json!({"number": 7}))
            .expect("ok")
            .expect("some");
        assert_eq!(
            r.target,
            Target::Http {
                url: "http://127.0.0.1:9/repos/acme/widget/issues/7/comments".into()
            }
        );
        let r = s
            .request("1", &json!({"number": "7/../../admin?x=1#y"}))
            .expect("ok")
            .expect("some");
        assert_eq!(
            r.target,
            Target::Http {
                url: "http://127.0.0.1:9/repos/acme/widget/issues/7%2F..%2F..%2Fadmin%3Fx%3D1%23y/comments"
                    .into()
            }
        );
        assert!(matches!(
            s.request("1", &json!({"number": ".."})),
            Err(Refused::Value { .. })
        ));
    }

    #[test]
    fn identical_requests_share_a_key() {
        let s = stage(http());
        let a = s
            .request("1", &json!({"number": 7, "x": 1}))
            .expect("ok")
            .expect("some");
        let b = s
            .request("2", &json!({"number": 7, "x": 2}))
            .expect("ok")
            .expect("some");
        let c = s
            .request("3", &json!({"number": 8}))
            .expect("ok")
            .expect("some");
        assert_eq!(a.key, b.key);
        assert_ne!(a.key, c.key);
    }

    #[test]
    fn refuses_what_the_schema_does_not_allow() {
        let s = stage(http());
        assert!(matches!(
            s.request("1", &json!({"number": [1]})),
            Err(Refused::Schema(_))
        ));
        assert!(matches!(
            s.request("1", &json!({})),
            Err(Refused::Schema(_))
        ));
        let mut spec = s.spec.clone();
        spec.request =
            "if .number > 5 then {owner: \"a\", repo: \"b\", number} else null end".into();
        let s = ToolStage::new(spec).expect("valid");
        assert_eq!(s.request("1", &json!({"number": 1})).expect("ok"), None);
    }

    #[test]
    fn refuses_templates_that_a_value_could_redirect() {
        let mut spec = stage(http()).spec;
        spec.capability = Capability::HttpGet {
            url: "http://{owner}.example/x".into(),
            token_env: None,
        };
        assert!(ToolStage::new(spec.clone()).is_err());
        spec.capability = Capability::Argv {
            argv: vec!["{owner}".into()],
        };
        assert!(ToolStage::new(spec.clone()).is_err());
        spec.capability = Capability::Sqlite {
            database: "x.db".into(),
            query: "select * from t where n = {number}".into(),
        };
        assert!(ToolStage::new(spec.clone()).is_err());
        spec.capability = Capability::File {
            root: "docs".into(),
            path: "../{number}.md".into(),
        };
        assert!(ToolStage::new(spec.clone()).is_err());
        spec.capability = Capability::HttpGet {
            url: "http://h/{nope}".into(),
            token_env: None,
        };
        assert!(ToolStage::new(spec).is_err());
    }

    #[test]
    fn argv_and_file_values_stay_in_their_place() {
        let s = stage(Capability::Argv {
            argv: vec![
                "gh".into(),
                "api".into(),
                "repos/{owner}/{repo}/issues/{number}".into(),
            ],
        });
        let r = s
            .request("1", &json!({"number": 3}))
            .expect("ok")
            .expect("some");
        assert_eq!(
            r.target,
            Target::Argv(vec![
                "gh".into(),
                "api".into(),
                "repos/acme/widget/issues/3".into()
            ])
        );
        let s = stage(Capability::Argv {
            argv: vec!["gh".into(), "{number}".into()],
        });
        assert!(
            s.request("1", &json!({"number": "--hostname=evil"}))
                .is_err()
        );
        let s = stage(Capability::File {
            root: "notes".into(),
            path: "{number}.md".into(),
        });
        assert!(
            s.request("1", &json!({"number": "../../etc/passwd"}))
                .is_err()
        );
        let r = s
            .request("1", &json!({"number": 3}))
            .expect("ok")
            .expect("some");
        assert_eq!(
            r.target,
            Target::File {
                path: "3.md".into()
            }
        );
    }

    #[test]
    fn an_argv_value_is_never_a_path_out() {
        let s = stage(Capability::Argv {
            argv: vec!["cat".into(), "data/{number}.txt".into()],
        });
        for climb in [
            "../../outside-secret",
            "..",
            "/etc/passwd",
            "a\\..\\b",
            "sub/x",
        ] {
            assert!(
                matches!(
                    s.request("1", &json!({"number": climb})),
                    Err(Refused::Value { .. })
                ),
                "{climb}"
            );
        }
        let r = s
            .request("1", &json!({"number": "notes..v2"}))
            .expect("ok")
            .expect("some");
        assert_eq!(
            r.target,
            Target::Argv(vec!["cat".into(), "data/notes..v2.txt".into()])
        );
    }

    #[test]
    fn an_interpreter_running_a_filled_argument_is_refused() {
        let refused = |argv: &[&str]| {
            let mut spec = stage(http()).spec;
            spec.capability = Capability::Argv {
                argv: argv.iter().map(|a| (*a).to_owned()).collect(),
            };
            ToolStage::new(spec).err().map(|e| e.to_string())
        };
        for argv in [
            &["sh", "-c", "echo {number}"][..],
            &["/bin/bash", "-ec", "gh issue view {number}"],
            &["env", "zsh", "-c", "x", "{number}"],
            &["dash", "-c", "echo $1", "sh", "{number}"],
            &["python3.12", "-c", "print({number})"],
            &["perl", "-ne", "print if /{number}/"],
            &["node", "--eval", "{number}"],
            &["ruby", "-e", "p {number}"],
            // Code attached to its flag, and a command line `env` splits.
            &["python3", "-cimport os; os.system(\"{number}\")"],
            &["perl", "-esystem(q({number}))"],
            &[
                "node",
                "--eval=require(\"child_process\").execSync(\"{number}\")",
            ],
            &["env", "-S", "sh -c \"echo {number}\""],
            &["env", "-Ssh -c \"echo {number}\""],
        ] {
            let err = refused(argv).unwrap_or_else(|| panic!("{argv:?} is refused"));
            assert!(err.contains("runs its argument as a program"), "{err}");
        }
        // The same programs with no hole, or running a file the spec
        // names with values as its arguments, are allowed.
        assert_eq!(refused(&["sh", "-c", "date"]), None);
        assert_eq!(refused(&["sh", "scripts/lookup.sh", "{number}"]), None);
        assert_eq!(refused(&["python3", "-u", "lookup.py", "{number}"]), None);
        assert_eq!(refused(&["gh", "issue", "view", "-c", "{number}"]), None);
        assert_eq!(refused(&["perl", "lookup.pl", "-n{number}"]), None);
        assert_eq!(
            refused(&["env", "LANG=C", "gh", "issue", "view", "{number}"]),
            None
        );
    }
}
