//! The `tool` kind's spec: read-only enrichment through one declared
//! capability.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::KindSpec;

/// Read-only enrichment. For each unit it receives, a typed request is
/// built from the unit by a jq expression and checked against `args`; it
/// is sent through the one capability the stage declares, and what comes
/// back is an observation (`ok`, `not_found`, `denied`, `timeout`,
/// `error`) stored under the request's content key. Later stages see the
/// observation as the unit's field `as`. Identical requests of many
/// units are one call; a stored observation younger than `ttl_s` is used
/// without asking. Nothing a record or a model says can reach anything
/// the capability does not grant: arguments fill declared holes of a
/// fixed template, checked against their schema first.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolStageSpec {
    pub name: String,
    /// Bump when the stage's meaning changes without its settings changing.
    pub version: u32,
    /// A jq expression over the unit that builds the request's arguments,
    /// one object, e.g. `{number}`. `null` sends no request for the unit.
    pub request: String,
    /// The JSON Schema of each argument, by name. Every argument is
    /// required and no other is accepted.
    pub args: BTreeMap<String, serde_json::Value>,
    /// What the stage may reach.
    pub capability: Capability,
    /// The unit's field later stages see the observation under.
    #[serde(rename = "as")]
    pub field: String,
    /// A jq expression over an `ok` observation's body that keeps what
    /// later stages need (e.g. `[.[] | {author: .user.login, body}]`).
    pub extract: Option<String>,
    /// The stage every unit goes on to, observed; when absent, the
    /// observation is the unit's fact.
    pub then: Option<String>,
    #[serde(default)]
    pub quota: QuotaSpec,
    /// Each attempt's limit, in milliseconds.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// Attempts per request, counting the first; a timeout, a 429 or a
    /// 5xx is tried again after a backoff, honouring `Retry-After`.
    #[serde(default = "default_attempts")]
    pub attempts: u32,
    /// The largest body kept; a larger one is an `error` observation.
    #[serde(default = "default_max_bytes")]
    pub max_bytes: u64,
    /// How long a stored observation is used without asking again, in
    /// seconds. After that an HTTP observation with an `ETag` or
    /// `Last-Modified` is revalidated; any other is fetched again.
    #[serde(default = "default_ttl_s")]
    pub ttl_s: u64,
    /// The most requests one run sends through the capability (cached
    /// observations are free); units past it end `not_run`.
    pub max_requests: Option<u64>,
    /// The observation's records (an `ok` observation's extracted value,
    /// when it is an array) re-enter the run as units of their own.
    pub enter: Option<EnterSpec>,
}

/// Records of an observation that become units: each is a unit whose id
/// is its parent's id and the record's key (`12>34`), or its content hash
/// when it has none (`12>c1f0e...`), so a rerun bears the same units. They
/// carry their parent and their depth (the parent's plus one) and go to
/// `stage`, under the budget's `max_depth`, `max_fanout` and `per_level`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EnterSpec {
    /// The stage the records go to, declared after this one.
    pub stage: String,
    /// A record's top-level field that names it (e.g. `number`); a string
    /// or number. Without it, a record is named by its content.
    pub key: Option<String>,
    /// The bred units' kind.
    #[serde(default = "default_enter_kind")]
    pub kind: String,
}

fn default_enter_kind() -> String {
    "record".into()
}

/// Per-resource limits, held by the kernel whatever the records ask.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct QuotaSpec {
    /// Requests in flight at once.
    #[serde(default = "default_concurrency")]
    pub concurrency: usize,
    /// Requests started per second, at most.
    pub per_second: Option<f64>,
}

impl Default for QuotaSpec {
    fn default() -> QuotaSpec {
        QuotaSpec {
            concurrency: default_concurrency(),
            per_second: None,
        }
    }
}

/// What a tool stage may reach: one capability, with the holes its
/// arguments fill written as `{name}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Capability {
    /// An HTTP GET of `url`, e.g.
    /// `https://api.github.com/repos/{owner}/{repo}/issues/{number}/comments`.
    /// Holes fill path segments and query values only, percent-encoded;
    /// the scheme, host and port are fixed, and redirects are not
    /// followed.
    HttpGet {
        url: String,
        /// An environment variable whose value is sent as a bearer token,
        /// to this host only.
        token_env: Option<String>,
    },
    /// A program run with `argv` (no shell), e.g.
    /// `["gh", "api", "repos/{owner}/{repo}/issues/{number}/comments"]`.
    /// The program is fixed; a filled argument may not start with `-`.
    /// Standard output is the body; a non-zero exit is an `error`.
    Argv { argv: Vec<String> },
    /// A file read under `root` (relative to the spec), at `path`, e.g.
    /// `notes/{number}.md`. The resolved file must lie under `root`.
    File { root: String, path: String },
    /// A read-only query on a SQLite database (relative to the spec),
    /// its arguments bound as named parameters (`:number`), never
    /// spliced into the text. The body is the rows, as objects.
    Sqlite { database: String, query: String },
}

impl Capability {
    pub fn type_name(&self) -> &'static str {
        match self {
            Capability::HttpGet { .. } => "http_get",
            Capability::Argv { .. } => "argv",
            Capability::File { .. } => "file",
            Capability::Sqlite { .. } => "sqlite",
        }
    }
}

fn default_concurrency() -> usize {
    4
}
fn default_timeout_ms() -> u64 {
    10_000
}
fn default_attempts() -> u32 {
    3
}
fn default_max_bytes() -> u64 {
    1 << 20
}
fn default_ttl_s() -> u64 {
    3600
}

impl KindSpec for ToolStageSpec {
    fn name(&self) -> &str {
        &self.name
    }
}
