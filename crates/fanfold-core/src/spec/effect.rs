//! The `effect` kind's spec: an action on the units the answer selected,
//! carried out once, after verify, and read back.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::KindSpec;
use super::tool::QuotaSpec;

/// The name of the hole every template may use for the effect's
/// idempotency key (hex), e.g. a marker in a comment's body.
pub const KEY_HOLE: &str = "effect_key";

/// An action (add a label, post a comment) on each unit the answer
/// selected. It runs once the answer is whole and verified, never on a
/// guess. Before each action a lease on it is taken in the store, and its
/// journal (intent, dispatched, receipt, read back) is written ahead of
/// each step, so a process killed between sending and hearing back is
/// resolved by reading the target back before anything is sent again. An
/// effect is never answered from a cache: what the answer reports of it is
/// what its read-back saw in this run. The arguments come from a jq
/// expression, are checked against `args`, and fill declared holes of a
/// fixed template: nothing a record or a model says can choose another
/// target or another action.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EffectStageSpec {
    pub name: String,
    /// Bump when the action's meaning changes without its settings
    /// changing; a new version is a new effect for every unit.
    pub version: u32,
    /// A jq expression over `{unit, fact}` (the unit's record and the
    /// answer's fact about it) that builds the action's arguments, one
    /// object, e.g. `{number: .unit.number}`. `null` takes no action on
    /// the unit.
    pub request: String,
    /// The JSON Schema of each argument, by name. Every argument is
    /// required and no other is accepted.
    pub args: BTreeMap<String, serde_json::Value>,
    /// What is done.
    pub action: EffectAction,
    /// How the action is seen to have taken place.
    pub read_back: ReadBack,
    #[serde(default)]
    pub quota: QuotaSpec,
    /// Each attempt's limit, in milliseconds.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// Sends per effect, counting the first. An answer that is lost (a
    /// timeout, a 5xx, a 429, a reset) is followed by a read-back, and the
    /// action is sent again only when the read-back shows it did not take
    /// place.
    #[serde(default = "default_attempts")]
    pub attempts: u32,
    /// The most actions one run sends (read-backs are free); effects past
    /// it end `not_run`.
    pub max_actions: Option<u64>,
    /// A JSON pointer to a string of the action's body (a comment's text,
    /// `/body`) that gets the effect's marker appended,
    /// `<!-- fanfold:effect NAME KEY -->`: the idempotency key, visible at
    /// the target. Every read-back looks for it: the effect's own key is in
    /// place (once; twice is said), and another key of the same effect
    /// name is an earlier version on that unit.
    pub marker: Option<String>,
    /// How long to wait, in milliseconds, after an answer is lost and a
    /// read-back does not see the action, before reading back again and
    /// only then sending it again: a target may complete a write after the
    /// client gave up. Absent: `timeout_ms`.
    pub settle_ms: Option<u64>,
    /// Send to units whose read-back shows an earlier version of this
    /// effect (its marker with another key, as after the template
    /// changed). Without it (or `--allow-new-version`) such units are held.
    #[serde(default)]
    pub allow_new_version: bool,
}

/// An HTTP request whose URL and body are templates: `{name}` holes in
/// the URL's path and query (percent-encoded, one segment or value each),
/// and in the body's strings. A body string that is exactly one hole takes
/// the argument's JSON value; within other text, its text.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum EffectAction {
    Http {
        #[serde(default)]
        method: Method,
        url: String,
        body: Option<serde_json::Value>,
        /// An environment variable whose value is sent as a bearer token,
        /// to this host only.
        token_env: Option<String>,
        /// The header that carries the effect's idempotency key, for
        /// servers that accept one. Absent: `Idempotency-Key`; `""` sends
        /// none. The key is journaled either way.
        idempotency_header: Option<String>,
    },
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "UPPERCASE")]
pub enum Method {
    #[default]
    Post,
    Put,
    Patch,
    Delete,
}

impl Method {
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Post => "POST",
            Method::Put => "PUT",
            Method::Patch => "PATCH",
            Method::Delete => "DELETE",
        }
    }
}

/// An HTTP GET of `url` (a template like the action's, on the action's
/// origin), and a jq predicate over `{status, body, args, key}` that is
/// true when the action has taken place, e.g.
/// `any(.body[]; .name == "release-blocker")`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadBack {
    pub url: String,
    pub holds: String,
}

fn default_timeout_ms() -> u64 {
    10_000
}
fn default_attempts() -> u32 {
    3
}

impl KindSpec for EffectStageSpec {
    fn name(&self) -> &str {
        &self.name
    }
}
