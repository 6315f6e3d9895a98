//! What `fanfold new` and `fanfold ask` (and the Python package's `ask`)
//! share: from a question and an input file or folder to a spec folder
//! that explains and runs. A file's first bytes say
//! its format (a JSON array, JSON lines, CSV, text lines, an e-mail or an
//! mbox, Markdown) and which field, if any, is a key; a folder's files say
//! whether it holds e-mail, Markdown, code or other text files. The rest
//! is drafted from the question for the user to
//! edit: a rubric, a decision schema with evidence, a cheap first rung
//! (`rung`: a keyword rule from the question's distinctive terms, or an
//! embed stage), the embedded backend, and a [SIMULATED] keyword judge.

mod rung;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::io::Read as _;
use std::path::{Path, PathBuf};

use serde_json::Value;

/// Why a spec folder could not be drafted.
#[derive(Debug, thiserror::Error)]
pub enum DraftError {
    /// A file or folder could not be read or written.
    #[error("{action} {}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    /// A folder's files could not be listed.
    #[error(transparent)]
    Listing(#[from] fanfold_engine::folder::DocumentError),
    /// The input or the folder cannot be drafted from, and why.
    #[error("{0}")]
    Refused(String),
}

type Result<T, E = DraftError> = std::result::Result<T, E>;

/// A failed I/O step on `path`, as the error says it.
fn io(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> DraftError {
    let path = path.to_path_buf();
    move |source| DraftError::Io {
        action,
        path,
        source,
    }
}

/// Returns early with a refusal whose text is formatted like `format!`.
macro_rules! bail {
    ($($arg:tt)*) => {
        return Err(DraftError::Refused(format!($($arg)*)))
    };
}

/// How much of the input is read to guess its shape.
const SAMPLE_BYTES: u64 = 256 << 10;
/// Fields a key is looked for under, in order.
const KEY_NAMES: [&str; 8] = [
    "id",
    "number",
    "key",
    "uuid",
    "message_id",
    "slug",
    "name",
    "path",
];
/// The most fields a context shows by default.
const MOST_FIELDS: usize = 6;

/// What the input looks like.
#[derive(Debug, PartialEq)]
pub struct Shape {
    /// The partition table, as TOML.
    pub partition: String,
    /// Why, in words.
    pub reason: String,
    /// The fields a context shows, most telling first.
    pub fields: Vec<String>,
    /// A field to title answer items by, if one looks like a title.
    pub title: Option<String>,
    /// The fields evidence may quote, when not every shown field: content,
    /// not headers.
    pub evidence: Vec<String>,
    /// Fields shown beside each answer item as the source has them.
    pub show: Vec<String>,
}

/// Reads the input's first bytes (at most [`SAMPLE_BYTES`]) and says what
/// it is.
pub fn inspect(input: &Path) -> Result<Shape> {
    regular_file_or_folder(input)?;
    if input.is_dir() {
        return folder_shape(input);
    }
    let mut head = Vec::new();
    std::fs::File::open(input)
        .map_err(io("opening", input))?
        .take(SAMPLE_BYTES)
        .read_to_end(&mut head)
        .map_err(io("reading", input))?;
    if head.is_empty() {
        bail!(
            "{} is empty: there is nothing to ask about",
            input.display()
        );
    }
    let text = String::from_utf8_lossy(&head);
    if let Some(shape) = document_shape(input, &text) {
        return Ok(shape);
    }
    let trimmed = text.trim_start();
    if trimmed.starts_with('[') {
        let records = array_sample(trimmed);
        if records.is_empty() {
            bail!(
                "{} starts like a JSON array, but no object could be read from its first {} KiB",
                input.display(),
                SAMPLE_BYTES >> 10
            );
        }
        return Ok(json_shape(
            "json_array",
            "a JSON array of objects",
            &records,
        ));
    }
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    // The last line may be cut by the sample.
    let whole = match lines.split_last() {
        Some((_, before)) if head.len() as u64 == SAMPLE_BYTES && !before.is_empty() => before,
        _ => &lines[..],
    };
    let objects: Vec<Value> = whole
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(Value::is_object)
        .collect();
    if !whole.is_empty() && objects.len() == whole.len() {
        return Ok(json_shape("jsonl", "one JSON object a line", &objects));
    }
    let is_csv_name = input
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("csv"));
    if let Some(shape) = csv_shape(whole, is_csv_name) {
        return Ok(shape);
    }
    Ok(Shape {
        partition: "{ type = \"lines\", kind = \"line\" }".into(),
        reason: "text that is not JSON or CSV: one unit a line, its id made from its content"
            .into(),
        fields: vec!["text".into()],
        title: Some("text".into()),
        evidence: Vec::new(),
        show: Vec::new(),
    })
}

/// The input is read twice, to draft the spec and to run it, and a run
/// reads it to its end: a pipe gives its bytes once and may wait forever
/// for a writer, a device may never end. Only a regular file or a folder
/// (each through a link) is taken.
fn regular_file_or_folder(input: &Path) -> Result<()> {
    let meta = std::fs::metadata(input).map_err(io("reading", input))?;
    let kind = meta.file_type();
    if kind.is_file() || kind.is_dir() {
        return Ok(());
    }
    let what = {
        use std::os::unix::fs::FileTypeExt as _;
        if kind.is_fifo() {
            "a named pipe (FIFO)"
        } else if kind.is_char_device() {
            "a character device"
        } else if kind.is_block_device() {
            "a block device"
        } else if kind.is_socket() {
            "a socket"
        } else {
            "not a regular file"
        }
    };
    bail!(
        "{} is {what}, not a regular file or a folder: the input is read once to draft the spec and again to run it, which only a file or a folder allows; save the data to a file first",
        input.display()
    )
}

/// Whether text opens like an e-mail: header lines, with a sender, a
/// subject or a date among them, before the first blank line.
fn looks_like_email(text: &str) -> bool {
    let mut named = 0;
    for line in text.lines().take(40) {
        if line.trim().is_empty() {
            break;
        }
        if line.starts_with([' ', '\t']) {
            continue;
        }
        let Some((name, _)) = line.split_once(':') else {
            return false;
        };
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
            return false;
        }
        let name = name.to_ascii_lowercase();
        if matches!(name.as_str(), "from" | "subject" | "date" | "message-id") {
            named += 1;
        }
    }
    named >= 2
}

/// The shape of a document format, by what its files are.
fn document_format(kind: &str) -> Shape {
    let (partition, reason, fields, title, evidence, show): (
        &str,
        &str,
        &[&str],
        &str,
        &[&str],
        &[&str],
    ) = match kind {
        "email" => (
            "{ type = \"email\" }",
            "e-mail messages: one unit a message, its id the file's path (and Message-ID in an mbox); evidence quotes the body, not the headers",
            &["subject", "from", "date", "body"],
            "subject",
            &["body"],
            &["from", "date"],
        ),
        "markdown" => (
            "{ type = \"markdown\" }",
            "Markdown: one unit a section, its id the file's path and heading path",
            &["heading", "text"],
            "heading",
            &["text"],
            &["path", "line"],
        ),
        "code" => (
            "{ type = \"code\" }",
            "Rust and Python source: one unit a symbol (function, type, method), its id the file's path and symbol path",
            &["symbol", "text"],
            "symbol",
            &["text"],
            &["path", "line"],
        ),
        _ => (
            "{ type = \"files\" }",
            "a folder of text files: one unit a file, its id the relative path; binary and non-UTF-8 files are rejected with their reason",
            &["path", "text"],
            "path",
            &["text"],
            &["modified"],
        ),
    };
    let owned = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    Shape {
        partition: partition.to_owned(),
        reason: reason.to_owned(),
        fields: owned(fields),
        title: Some(title.to_owned()),
        evidence: owned(evidence),
        show: owned(show),
    }
}

/// One file that is a document: an mbox or a message, or Markdown.
fn document_shape(input: &Path, head: &str) -> Option<Shape> {
    let ext = input
        .extension()
        .map(|e| e.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default();
    if head.starts_with("From ") || looks_like_email(head) || matches!(ext.as_str(), "eml" | "mbox")
    {
        return Some(document_format("email"));
    }
    if matches!(ext.as_str(), "md" | "markdown") {
        return Some(document_format("markdown"));
    }
    None
}

/// A folder: e-mail when most of a sample of its files are messages,
/// Markdown or code when most have those extensions, else files.
fn folder_shape(dir: &Path) -> Result<Shape> {
    // The files the `files` partition would read, so what is sampled is
    // what a run reads (hidden ones skipped, links followed).
    let mut files: Vec<PathBuf> = fanfold_engine::folder::list(dir, "**/*")?
        .into_iter()
        .map(|(path, _)| path)
        .collect();
    files.truncate(200);
    if files.is_empty() {
        bail!("{} holds no files (hidden ones are skipped)", dir.display());
    }
    let ext_share = |exts: &[&str]| {
        let n = files
            .iter()
            .filter(|p| {
                p.extension().is_some_and(|e| {
                    exts.contains(&e.to_string_lossy().to_ascii_lowercase().as_str())
                })
            })
            .count();
        n * 2 > files.len()
    };
    let emails = files
        .iter()
        .take(20)
        .filter(|p| {
            let mut head = Vec::new();
            std::fs::File::open(p)
                .and_then(|f| f.take(4096).read_to_end(&mut head))
                .is_ok()
                && (head.starts_with(b"From ") || looks_like_email(&String::from_utf8_lossy(&head)))
        })
        .count();
    if ext_share(&["csv", "tsv", "json", "jsonl", "ndjson"]) {
        bail!(
            "{} is a folder of data files: fanfold reads records from one file (a JSON array, JSON lines or CSV); give one file with --input, or join them first (e.g. `cat *.jsonl > all.jsonl`)",
            dir.display()
        );
    }
    let kind = if emails * 2 > files.len().min(20) {
        "email"
    } else if ext_share(&["md", "markdown"]) {
        "markdown"
    } else if ext_share(&["rs", "py"]) {
        "code"
    } else {
        "files"
    };
    Ok(document_format(kind))
}

/// The objects of a JSON array's first bytes, as many as parse whole.
fn array_sample(text: &str) -> Vec<Value> {
    let mut rest = text.strip_prefix('[').unwrap_or(text);
    let mut out = Vec::new();
    // One element at a time, past the comma before it.
    while out.len() < 200 {
        rest = rest.trim_start().trim_start_matches(',').trim_start();
        let mut it = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        match it.next() {
            Some(Ok(v)) => {
                let used = it.byte_offset();
                if v.is_object() {
                    out.push(v);
                }
                rest = rest.get(used..).unwrap_or("");
            }
            _ => break,
        }
    }
    out
}

/// A key: the first of [`KEY_NAMES`] every sampled record has as a
/// scalar, all distinct.
fn key_of(records: &[Value]) -> Option<(String, String)> {
    for name in KEY_NAMES {
        let values: Vec<String> = records
            .iter()
            .filter_map(|r| match r.get(name)? {
                Value::String(s) if !s.is_empty() => Some(s.clone()),
                Value::Number(n) => Some(n.to_string()),
                _ => None,
            })
            .collect();
        if values.len() == records.len() && !values.is_empty() {
            let distinct: BTreeSet<&String> = values.iter().collect();
            if distinct.len() == values.len() {
                return Some((
                    name.to_owned(),
                    format!(
                        "`{name}` is present and distinct in all {} records read",
                        records.len()
                    ),
                ));
            }
        }
    }
    None
}

/// The fields worth showing: those holding text, longest on average
/// first, then the rest of the scalars.
fn telling_fields(records: &[Value], skip: Option<&str>) -> (Vec<String>, Option<String>) {
    let mut chars: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for r in records {
        let Some(map) = r.as_object() else { continue };
        for (k, v) in map {
            let n = match v {
                Value::String(s) => s.chars().count(),
                Value::Number(_) | Value::Bool(_) => 1,
                Value::Array(a) if a.iter().all(|x| x.is_string()) => {
                    a.iter().filter_map(Value::as_str).map(str::len).sum()
                }
                _ => continue,
            };
            let e = chars.entry(k.clone()).or_insert((0, 0));
            e.0 += n;
            e.1 += 1;
        }
    }
    let mut ranked: Vec<(String, f64)> = chars
        .into_iter()
        .filter(|(k, _)| Some(k.as_str()) != skip)
        .map(|(k, (n, seen))| (k, n as f64 / seen.max(1) as f64))
        .collect();
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let title = ["title", "subject", "name", "summary"]
        .iter()
        .find(|t| ranked.iter().any(|(k, _)| k == *t))
        .map(|t| (*t).to_owned());
    let fields = ranked
        .into_iter()
        .take(MOST_FIELDS)
        .map(|(k, _)| k)
        .collect();
    (fields, title)
}

fn json_shape(kind: &str, what: &str, records: &[Value]) -> Shape {
    let key = key_of(records);
    let (fields, title) = telling_fields(records, key.as_ref().map(|(k, _)| k.as_str()));
    let (partition, reason) = match key {
        Some((k, why)) => (
            format!("{{ type = \"{kind}\", key = {} }}", toml_str(&k)),
            format!("{what}; {why}, so it is the key"),
        ),
        None => (
            format!("{{ type = \"{kind}\" }}"),
            format!(
                "{what}; no field looks like a key, so ids are made from each record's content"
            ),
        ),
    };
    Shape {
        partition,
        reason,
        fields,
        title,
        evidence: Vec::new(),
        show: Vec::new(),
    }
}

/// CSV: a header and rows with as many fields, by comma count; the file's
/// name ending in `.csv` is enough when there is one column.
fn csv_shape(lines: &[&str], named_csv: bool) -> Option<Shape> {
    let header = lines.first()?;
    let columns = header.split(',').count();
    let consistent = lines.len() > 1
        && lines
            .iter()
            .skip(1)
            .take(50)
            .all(|l| l.split(',').count() >= columns);
    if !(named_csv || (columns > 1 && consistent)) {
        return None;
    }
    let names: Vec<String> = header
        .split(',')
        .map(|c| c.trim().trim_matches('"').to_owned())
        .filter(|c| !c.is_empty())
        .collect();
    let key = KEY_NAMES
        .iter()
        .find(|k| names.iter().any(|n| n == *k))
        .map(|k| (*k).to_owned());
    let fields: Vec<String> = names
        .iter()
        .filter(|n| Some(n.as_str()) != key.as_deref())
        .take(MOST_FIELDS)
        .cloned()
        .collect();
    let title = ["title", "subject", "name", "summary"]
        .iter()
        .find(|t| names.iter().any(|n| n == *t))
        .map(|t| (*t).to_owned());
    let (partition, reason) = match &key {
        Some(k) => (
            format!("{{ type = \"csv\", key = {} }}", toml_str(k)),
            format!(
                "CSV with a header of {} columns; `{k}` is the key",
                names.len()
            ),
        ),
        None => (
            "{ type = \"csv\" }".to_owned(),
            format!(
                "CSV with a header of {} columns; none is named like a key, so ids are made from each row's content",
                names.len()
            ),
        ),
    };
    Some(Shape {
        partition,
        reason,
        fields,
        title,
        evidence: Vec::new(),
        show: Vec::new(),
    })
}

/// The question's words, for the spec's name and the keyword judge when
/// the question names no distinctive term; never a prefilter.
fn keywords(question: &str) -> Vec<String> {
    const STOP: [&str; 24] = [
        "which", "what", "where", "when", "there", "their", "about", "these", "those", "that",
        "this", "have", "does", "with", "from", "into", "they", "them", "were", "been", "being",
        "would", "could", "should",
    ];
    let mut seen = BTreeSet::new();
    question
        .split(|c: char| !c.is_alphanumeric())
        .map(str::to_lowercase)
        .filter(|w| w.chars().count() >= 4 && !STOP.contains(&w.as_str()))
        .filter(|w| seen.insert(w.clone()))
        .take(6)
        .collect()
}

/// A string as a TOML basic string on one line: quotes, backslashes and
/// control characters escaped, so a name such as `it's` or `say "hi"`
/// reads back as written wherever the spec puts it, a commented line
/// included.
pub(crate) fn toml_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04X}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Text for a `#` comment line: a line break in a name would end the
/// comment and leave the rest as TOML.
fn comment_text(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// What [`write`] wrote, and what its first rung did with the input.
pub struct Written {
    pub spec: PathBuf,
    /// Why the partition was chosen.
    pub reason: String,
    /// What the first rung does and kept, in words.
    pub rung: String,
    /// The units the model is expected to judge, when counted.
    pub to_model: Option<u64>,
    /// What the prefilter and the first rung did with the input, for
    /// `explain`.
    pub routing: Option<fanfold_engine::plan::Routing>,
}

/// Writes the spec folder and counts what its first rung keeps of the
/// input. An embed rung keeps the vectors and facts it computed in the
/// store at `store` (in memory when `None`), so a run on it reuses them.
pub fn write(dir: &Path, question: &str, input: &Path, store: Option<&Path>) -> Result<Written> {
    let shape = inspect(input)?;
    std::fs::create_dir_all(dir).map_err(io("creating", dir))?;
    let spec_path = dir.join("spec.toml");
    if spec_path.exists() {
        bail!(
            "{} exists: refusing to overwrite a spec; choose another folder",
            spec_path.display()
        );
    }
    let input_abs = std::path::absolute(input).map_err(io("resolving", input))?;
    let words = keywords(question);
    let first_rung = rung::Rung::for_question(question);
    // The keyword judge looks for what the first rung looks for.
    let pattern = match &first_rung {
        rung::Rung::Keyword { terms } => rung::terms_regex(terms),
        rung::Rung::Embed if words.is_empty() => ".".to_owned(),
        rung::Rung::Embed => words.join("|"),
    };
    let name: String = words.iter().take(3).cloned().collect::<Vec<_>>().join("-");
    let name = if name.is_empty() {
        "question".into()
    } else {
        name
    };
    let fields_toml: Vec<String> = shape.fields.iter().map(|f| toml_str(f)).collect();
    let text_of = shape
        .fields
        .iter()
        .map(|f| format!("(.{} // \"\" | tostring)", jq_field(f)))
        .collect::<Vec<_>>()
        .join(" + \" \" + ");
    let text_of = if text_of.is_empty() {
        "tostring".to_owned()
    } else {
        text_of
    };
    let mut spec = String::new();
    let _ = writeln!(
        spec,
        "# Written by `fanfold new`: edit the rubric, the fields and the rules,\n# then `fanfold explain spec.toml` and `fanfold run spec.toml`.\nname = {}\nquestion = {}\n\n[input]\npath = {}\n# {}\npartition = {}\n",
        toml_str(&name),
        toml_str(question),
        toml_str(&input_abs.display().to_string()),
        comment_text(&shape.reason),
        shape.partition
    );
    // What the embedder reads: the title and the content, not headers.
    let mut embedded: Vec<String> = shape.title.iter().cloned().collect();
    let content = if shape.evidence.is_empty() {
        &shape.fields
    } else {
        &shape.evidence
    };
    for f in content {
        if !embedded.contains(f) {
            embedded.push(f.clone());
        }
    }
    let rung_toml = |counted: Option<&rung::Counted>| {
        first_rung.toml(question, &text_of, &embedded, "judge", counted)
    };
    // A keyword rule is the prefilter; an embed rung is the first stage,
    // just before the judge.
    let uncounted = rung_toml(None);
    if matches!(first_rung, rung::Rung::Keyword { .. }) {
        let _ = writeln!(
            spec,
            "# Rules run before any model; the first that matches decides."
        );
    }
    let _ = writeln!(spec, "{uncounted}");
    let _ = writeln!(
        spec,
        "[[stages]]\nname = \"judge\"\ntype = \"map\"\nversion = 1\nrubric = \"rubric.md\"\noutput_schema = \"decision.schema.json\"\nfields = [{}]\ndecision = {{ pointer = \"/decision\", positive = [\"positive\"], negative = [\"negative\"], abstain = [\"unsure\"] }}\nevidence = \"/evidence\"\nbackend = \"default\"\nmax_attempts = 2\nmax_output_tokens = 200\n",
        fields_toml.join(", ")
    );
    let _ = writeln!(
        spec,
        "# The embedded model; point `model` at a bigger GGUF, or use an\n# `openai` or `anthropic` backend, for answers worth reading.\n[backends.default]\ntype = \"llama\"\nslot_tokens = 1024\n\n# [SIMULATED] A keyword judge for trying the spec: `--backend scripted`.\n[backends.scripted]\ntype = \"scripted\"\nscript = \"scripted.jq\"\n\n[[fold.reducers]]\nname = \"answer\"\ntype = \"set\"\n\n[contract]\ntype = \"exhaustive\"\nanswer = \"answer\"\n"
    );
    if shape.title.is_some() || !shape.show.is_empty() {
        let _ = writeln!(spec, "[output]");
    }
    if let Some(t) = &shape.title {
        let _ = writeln!(spec, "title = {}", toml_str(t));
    }
    if !shape.show.is_empty() {
        let show: Vec<String> = shape.show.iter().map(|f| toml_str(f)).collect();
        let _ = writeln!(spec, "show = [{}]", show.join(", "));
    }
    let rubric = format!(
        "Question: {question}\n\nYou see one record. Answer `positive` when this record, on its own, is part of\nthe answer to the question; `negative` when it is not; `unsure` when the\nrecord does not say enough to tell. Judge only from what the record says.\n\nQuote, verbatim and from the record's content (not its headers or ids), the\nwords that decide it, naming the field they are in.\n"
    );
    let quotable = if shape.evidence.is_empty() {
        &shape.fields
    } else {
        &shape.evidence
    };
    let field_enum: Vec<Value> = quotable.iter().map(|f| Value::String(f.clone())).collect();
    let schema = serde_json::json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "additionalProperties": false,
        "required": ["decision", "evidence"],
        "properties": {
            "decision": {"enum": ["positive", "negative", "unsure"]},
            "evidence": {
                "type": "array",
                "maxItems": 1,
                "items": {
                    "type": "object",
                    "additionalProperties": false,
                    "required": ["field", "quote"],
                    "properties": {
                        "field": {"enum": field_enum},
                        "quote": {"type": "string", "minLength": 4, "maxLength": 200}
                    }
                }
            }
        }
    });
    let script = format!(
        "# [SIMULATED] A keyword judge standing in for a model: positive when the\n# record's text names a word of the question. Not a judgment.\n{{decision: (if (({text_of}) | test({}; \"i\")) then \"positive\" else \"negative\" end), evidence: []}}\n",
        toml_json_str(&pattern)
    );
    let files = [
        (spec_path.clone(), spec),
        (dir.join("rubric.md"), rubric),
        (
            dir.join("decision.schema.json"),
            serde_json::to_string_pretty(&schema).unwrap_or_default() + "\n",
        ),
        (dir.join("scripted.jq"), script),
    ];
    for (path, text) in &files {
        std::fs::write(path, text).map_err(io("writing", path))?;
    }
    let (counted, routing) = count_rung(&spec_path, &first_rung, store);
    let rung = match &counted {
        Ok(c) => {
            // The count goes into the rung's comment; the rung is unchanged,
            // so what was cached under it stays valid.
            let spec = files
                .first()
                .map(|(_, text)| text.replacen(&uncounted, &rung_toml(Some(c)), 1))
                .unwrap_or_default();
            std::fs::write(&spec_path, spec).map_err(io("writing", &spec_path))?;
            format!("{} {}", first_rung.summary(), c.sentence())
        }
        Err(e) => format!("{} It could not be counted: {}", first_rung.summary(), e),
    };
    Ok(Written {
        spec: spec_path,
        reason: shape.reason,
        rung,
        to_model: counted.ok().map(|c| c.expected()),
        routing,
    })
}

/// What the first rung of the spec at `spec_path` keeps of its input, and
/// the routing `explain` shows. The routing is kept even when the rung
/// could not be counted (an embedder that cannot be fetched).
fn count_rung(
    spec_path: &Path,
    first_rung: &rung::Rung,
    store: Option<&Path>,
) -> (
    Result<rung::Counted, String>,
    Option<fanfold_engine::plan::Routing>,
) {
    let max = fanfold_ops::partition::DEFAULT_MAX_UNIT_BYTES;
    let plan = match fanfold_engine::Plan::load(spec_path) {
        Ok(p) => p,
        Err(e) => return (Err(describe(&e)), None),
    };
    let Some(source) = plan.default_source() else {
        return (Err("the spec names no input".to_owned()), None);
    };
    match first_rung {
        rung::Rung::Keyword { .. } => {
            match fanfold_engine::run::explain_routing(&plan, &source, None, max) {
                Ok(r) => {
                    let excluded = r
                        .excluded_by_reason
                        .get(rung::KEYWORD_REASON)
                        .copied()
                        .unwrap_or(0);
                    let counted = rung::Counted {
                        units: r.units,
                        tried: r.units,
                        kept: r.units.saturating_sub(excluded),
                    };
                    (Ok(counted), Some(r))
                }
                Err(e) => (Err(describe(&e)), None),
            }
        }
        rung::Rung::Embed => {
            let store = match store {
                Some(path) => fanfold_store::Store::open(path),
                None => fanfold_store::Store::open(Path::new(":memory:")),
            };
            let store = match store {
                Ok(s) => s,
                Err(e) => return (Err(describe(&e)), None),
            };
            let previewed = fanfold_engine::run::preview_embed(
                &plan,
                rung::EMBED_STAGE,
                &source,
                &store,
                max,
                rung::EMBED_PREVIEW_UNITS,
            );
            let routing = fanfold_engine::run::explain_routing(&plan, &source, Some(&store), max);
            let counted = previewed.map_err(|e| describe(&e)).map(|p| rung::Counted {
                units: p.units,
                tried: p.tried,
                kept: p.kept,
            });
            (counted, routing.ok())
        }
    }
}

/// The error and its causes, skipping causes whose text the message above
/// them already contains (errors often quote their source).
pub fn describe(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !msg.contains(&text) {
            msg.push_str(": ");
            msg.push_str(&text);
        }
        cause = c.source();
    }
    msg
}

/// `BASE/NAME`, NAME from the question, numbered past folders that hold a
/// spec already: where `ask` writes when given no folder.
pub fn free_folder(base: &Path, question: &str) -> Result<PathBuf> {
    let slug: String = question
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect::<String>()
        .split('-')
        .filter(|w| !w.is_empty())
        .take(6)
        .collect::<Vec<_>>()
        .join("-");
    let slug = if slug.is_empty() {
        "question".to_owned()
    } else {
        slug
    };
    for n in 1..1000 {
        let dir = if n == 1 {
            base.join(&slug)
        } else {
            base.join(format!("{slug}-{n}"))
        };
        if !dir.join("spec.toml").exists() {
            return Ok(dir);
        }
    }
    bail!("{}: no free folder for this question", base.display())
}

/// A field name as jq reads it: `.name`, or `.["odd name"]`.
fn jq_field(f: &str) -> String {
    if f.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && f.chars().next().is_some_and(|c| !c.is_ascii_digit())
    {
        f.to_owned()
    } else {
        format!("[{}]", toml_json_str(f))
    }
}

/// A string as a JSON (and jq) literal.
fn toml_json_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_array_with_a_distinct_number_is_keyed_by_it() {
        let dir = tempfile::tempdir().expect("dir");
        let p = dir.path().join("a.json");
        std::fs::write(
            &p,
            r#"[{"number": 1, "title": "Login fails", "body": "After the upgrade users cannot log in at all."},
                {"number": 2, "title": "Typo", "body": "A typo on the about page."}]"#,
        )
        .expect("write");
        let s = inspect(&p).expect("shape");
        assert_eq!(s.partition, r#"{ type = "json_array", key = "number" }"#);
        assert_eq!(s.fields.first().map(String::as_str), Some("body"));
        assert_eq!(s.title.as_deref(), Some("title"));
    }

    #[test]
    fn lines_csv_and_folders_are_told_apart() {
        let dir = tempfile::tempdir().expect("dir");
        let log = dir.path().join("app.log");
        std::fs::write(
            &log,
            "2026-01-01 ERROR disk full\n2026-01-01 INFO started\n",
        )
        .expect("w");
        assert!(inspect(&log).expect("log").partition.contains("lines"));
        let csv = dir.path().join("t.csv");
        std::fs::write(&csv, "id,text\n1,hello\n2,world\n").expect("w");
        let s = inspect(&csv).expect("csv");
        assert_eq!(s.partition, r#"{ type = "csv", key = "id" }"#);
        let mail = dir.path().join("mail");
        std::fs::create_dir(&mail).expect("dir");
        for n in 0..3 {
            std::fs::write(
                mail.join(format!("{n}.txt")),
                "From: a@example.org\nSubject: hello\nDate: Tue, 03 Nov 2026 02:41:07 +0000\n\nbody\n",
            )
            .expect("w");
        }
        assert!(inspect(&mail).expect("mail").partition.contains("email"));
        let notes = dir.path().join("notes");
        std::fs::create_dir(&notes).expect("dir");
        std::fs::write(notes.join("a.txt"), "plain words\n").expect("w");
        std::fs::write(notes.join("b.md"), "# Title\ntext\n").expect("w");
        assert!(inspect(&notes).expect("notes").partition.contains("files"));
        let data = dir.path().join("data");
        std::fs::create_dir(&data).expect("dir");
        std::fs::write(data.join("a.csv"), "id,x\n1,2\n").expect("w");
        std::fs::write(data.join("b.csv"), "id,x\n3,4\n").expect("w");
        let refused = inspect(&data).expect_err("a folder of data files");
        assert!(refused.to_string().contains("data files"), "{refused}");
        let boxes = dir.path().join("boxes");
        std::fs::create_dir(&boxes).expect("dir");
        std::fs::write(
            boxes.join("2026.mbox"),
            "From a@x Tue Nov  3 02:41:07 2026\nFrom: a@x\nSubject: s\n\nbody\n",
        )
        .expect("w");
        assert!(inspect(&boxes).expect("mbox").partition.contains("email"));
    }

    #[test]
    fn names_become_one_line_toml_strings_that_read_back() {
        for name in [
            "it's",
            "say \"hi\"",
            "back\\slash",
            "'''",
            "line\nbreak\ttab\u{7f}\u{1}",
            "naïve",
        ] {
            let written = toml_str(name);
            assert_eq!(written.lines().count(), 1, "{written}");
            let line = format!("x = {written}");
            let table: toml::Table = line.parse().expect("parses");
            assert_eq!(table.get("x").and_then(toml::Value::as_str), Some(name));
            // Commented out and in again, it is the same line.
            let commented = format!("# {line}");
            let back: toml::Table = commented
                .strip_prefix("# ")
                .unwrap_or_default()
                .parse()
                .expect("uncommented");
            assert_eq!(back, table);
        }
        assert_eq!(comment_text("a\nb"), "a b");
    }

    #[test]
    fn a_pipe_or_a_device_is_refused_before_a_byte_is_read() {
        let o = inspect(Path::new("/dev/zero")).expect_err("a device");
        assert!(
            o.to_string()
                .contains("/dev/zero is a character device, not a regular file or a folder"),
            "{o}"
        );
        let missing = inspect(Path::new("/nonexistent/input.jsonl")).expect_err("missing");
        assert!(
            format!("{missing:#}").contains("/nonexistent/input.jsonl"),
            "{missing}"
        );
    }

    #[test]
    fn the_question_gives_the_keywords() {
        assert_eq!(
            keywords("Which e-mails discuss the merger first-hand?"),
            vec!["mails", "discuss", "merger", "first", "hand"]
        );
    }
}
