//! A local issue tracker over HTTP: a `gh issue list --json` export and
//! its comments, served in the GitHub REST shapes `gh api` reads, so a
//! spec pointed at it works against `api.github.com` by changing the host.
//! Latency, 429s and hangs can be injected, and the server counts what it
//! saw (requests, the most in flight at once) for a bench to check the
//! client's quota against.
//!
//! It also takes effects as GitHub does: labels added to an issue
//! (`POST .../issues/N/labels`), removed (`DELETE .../labels/NAME`) and
//! comments posted (`POST .../issues/N/comments`), read back through
//! `GET .../labels` and `GET .../comments`. It counts every effect it
//! applied and every one that repeated an earlier one (a label already on
//! the issue, a comment with the body of one already posted), so a test
//! can prove exactly-once; `/_effects` shows them. A request carrying an
//! `Idempotency-Key` it has seen is answered as before, with
//! `Idempotent-Replayed: true`, and applies nothing. A slow commit
//! ([`SlowCommit`]) applies an effect only after the client has given up
//! waiting, as a target that finishes a write late.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get};
use serde_json::{Value, json};

/// What the tracker serves.
#[derive(Debug, Default)]
pub struct TrackerData {
    pub owner: String,
    pub repo: String,
    /// Issues in the REST shape, by number.
    pub issues: BTreeMap<u64, Value>,
    /// Comments in the REST shape, by issue number.
    pub comments: BTreeMap<u64, Vec<Value>>,
    /// The milestones the issues name, by number.
    pub milestones: BTreeMap<u64, Value>,
}

impl TrackerData {
    /// Reads a `gh issue list --json` export (an array) and a comments
    /// file (`{"<number>": [comment, ...]}`, REST shape). The repository
    /// is taken from the first issue's `url`.
    pub fn from_export(issues: &Value, comments: &Value) -> Result<TrackerData, String> {
        let list = issues
            .as_array()
            .ok_or("the issues file must be a JSON array, as `gh issue list --json` writes")?;
        let mut data = TrackerData::default();
        for (at, issue) in list.iter().enumerate() {
            let number = issue
                .get("number")
                .and_then(Value::as_u64)
                .ok_or_else(|| format!("issue at index {at} has no numeric `number`"))?;
            if data.owner.is_empty()
                && let Some(url) = issue.get("url").and_then(Value::as_str)
            {
                let parts: Vec<&str> = url.trim_start_matches("https://").split('/').collect();
                if let [_, owner, repo, ..] = parts.as_slice() {
                    data.owner = (*owner).to_owned();
                    data.repo = (*repo).to_owned();
                }
            }
            if let Some(m) = issue.get("milestone").filter(|m| m.is_object())
                && let Some(n) = m.get("number").and_then(Value::as_u64)
            {
                data.milestones.insert(
                    n,
                    json!({"number": n, "title": m.get("title"), "description": m.get("description"), "due_on": m.get("dueOn")}),
                );
            }
            data.issues.insert(number, rest_issue(issue));
        }
        if let Some(map) = comments.as_object() {
            for (k, v) in map {
                let n: u64 = k
                    .parse()
                    .map_err(|_| format!("comments key `{k}` is not an issue number"))?;
                let list = v
                    .as_array()
                    .ok_or_else(|| format!("comments of issue {k} must be an array"))?;
                data.comments.insert(n, list.clone());
            }
        }
        for (n, issue) in data.issues.iter_mut() {
            let count = data.comments.get(n).map_or(0, Vec::len);
            if let Some(obj) = issue.as_object_mut() {
                obj.insert("comments".into(), json!(count));
            }
        }
        Ok(data)
    }

    pub fn comment_count(&self) -> usize {
        self.comments.values().map(Vec::len).sum()
    }
}

/// A `gh --json` issue in the REST API's shape.
fn rest_issue(gh: &Value) -> Value {
    let labels: Vec<Value> = gh
        .get("labels")
        .and_then(Value::as_array)
        .map(|ls| {
            ls.iter()
                .map(|l| json!({"name": l.get("name"), "color": l.get("color"), "description": l.get("description")}))
                .collect()
        })
        .unwrap_or_default();
    json!({
        "number": gh.get("number"),
        "title": gh.get("title"),
        "body": gh.get("body"),
        "state": gh.get("state").and_then(Value::as_str).map(str::to_lowercase),
        "labels": labels,
        "user": {"login": gh.pointer("/author/login")},
        "milestone": gh.get("milestone").map(|m| json!({"title": m.get("title")})),
        "created_at": gh.get("createdAt"),
        "updated_at": gh.get("updatedAt"),
        "html_url": gh.get("url"),
    })
}

/// Faults to inject, counted over every request the tracker receives.
#[derive(Clone, Copy, Debug, Default)]
pub struct Faults {
    /// Added to every answer.
    pub latency_ms: u64,
    /// Every n-th request is answered 429 with `Retry-After: 0`.
    pub every_429: u64,
    /// Every n-th request hangs for `hang_ms` before it is answered.
    pub every_hang: u64,
    pub hang_ms: u64,
    /// The n-th request (from 1) hangs for `hang_ms`, once.
    pub hang_once_at: u64,
    /// Every n-th effect is applied and then answered 502, as when the
    /// answer is lost on its way back.
    pub lose_every: u64,
}

/// Every n-th effect request (from 1) is written only after `ms`: the
/// request is held that long, then applied and answered, whether or not
/// the client still waits. A key it carries is known only once applied.
#[derive(Clone, Copy, Debug, Default)]
pub struct SlowCommit {
    pub every: u64,
    pub ms: u64,
}

/// What the tracker saw.
#[derive(Debug, Default)]
pub struct TrackerStats {
    pub requests: AtomicU64,
    pub in_flight: AtomicU64,
    pub max_in_flight: AtomicU64,
    pub rate_limited: AtomicU64,
    pub hung: AtomicU64,
    pub not_modified: AtomicU64,
    pub not_found: AtomicU64,
    pub effects: Mutex<EffectLog>,
}

/// The effects the tracker took.
#[derive(Debug, Default)]
pub struct EffectLog {
    /// Effect requests received, answered or not.
    pub requests: u64,
    /// Effects that changed something.
    pub applied: u64,
    /// Effects that repeated one already applied.
    pub duplicates: u64,
    /// Requests answered from an `Idempotency-Key` already seen.
    pub replayed: u64,
    /// Answers dropped by the `lose_every` fault after applying.
    pub lost_answers: u64,
    /// Effects written late by the slow-commit fault.
    pub slow_commits: u64,
    /// Labels added by effects and still on, by issue.
    pub labels: BTreeMap<u64, BTreeSet<String>>,
    /// Labels removed by effects, by issue (base labels taken off).
    pub removed: BTreeMap<u64, BTreeSet<String>>,
    /// Comments posted, by issue.
    pub comments: BTreeMap<u64, Vec<Value>>,
    /// How many times each (issue, kind, what) was applied or repeated.
    pub times: BTreeMap<(u64, String, String), u64>,
    keys: HashMap<String, (u16, Value)>,
}

impl EffectLog {
    pub fn json(&self) -> Value {
        let times: Vec<Value> = self
            .times
            .iter()
            .map(|((issue, kind, what), n)| json!({"issue": issue, "kind": kind, "what": what, "times": n}))
            .collect();
        json!({
            "requests": self.requests,
            "applied": self.applied,
            "duplicates": self.duplicates,
            "replayed": self.replayed,
            "lost_answers": self.lost_answers,
            "slow_commits": self.slow_commits,
            "effects": times,
        })
    }

    /// One more effect of `kind` on `issue`; a repeat when it was seen.
    fn count(&mut self, issue: u64, kind: &str, what: &str) {
        let n = self
            .times
            .entry((issue, kind.to_owned(), what.to_owned()))
            .or_insert(0);
        *n += 1;
        if *n == 1 {
            self.applied += 1;
        } else {
            self.duplicates += 1;
        }
    }
}

impl TrackerStats {
    pub fn json(&self) -> Value {
        let g = |a: &AtomicU64| a.load(Ordering::SeqCst);
        json!({
            "requests": g(&self.requests),
            "max_in_flight": g(&self.max_in_flight),
            "rate_limited": g(&self.rate_limited),
            "hung": g(&self.hung),
            "not_modified": g(&self.not_modified),
            "not_found": g(&self.not_found),
            "effects": self.effect_log().json(),
        })
    }
}

impl TrackerStats {
    pub fn effect_log(&self) -> std::sync::MutexGuard<'_, EffectLog> {
        self.effects.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[derive(Clone)]
struct Shared {
    data: Arc<TrackerData>,
    faults: Faults,
    slow: SlowCommit,
    stats: Arc<TrackerStats>,
}

/// Leaves the in-flight count however the request ends.
struct InFlight(Arc<TrackerStats>);

impl InFlight {
    fn enter(stats: &Arc<TrackerStats>) -> InFlight {
        let now = stats.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        stats.max_in_flight.fetch_max(now, Ordering::SeqCst);
        InFlight(stats.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The tracker's routes: an issue, its comments, the issue list, and
/// `/_stats` (what the tracker saw, not counted as a request).
pub fn app(data: Arc<TrackerData>, faults: Faults, stats: Arc<TrackerStats>) -> Router {
    app_with(data, faults, SlowCommit::default(), stats)
}

/// [`app`], with effects that commit late.
pub fn app_with(
    data: Arc<TrackerData>,
    faults: Faults,
    slow: SlowCommit,
    stats: Arc<TrackerStats>,
) -> Router {
    let shared = Shared {
        data,
        faults,
        slow,
        stats,
    };
    Router::new()
        .route("/repos/{owner}/{repo}/issues", get(list))
        .route("/repos/{owner}/{repo}/issues/{number}", get(issue))
        .route(
            "/repos/{owner}/{repo}/issues/{number}/comments",
            get(comments).post(post_comment),
        )
        .route(
            "/repos/{owner}/{repo}/issues/{number}/labels",
            get(labels).post(add_labels),
        )
        .route(
            "/repos/{owner}/{repo}/issues/{number}/labels/{name}",
            delete(remove_label),
        )
        .route(
            "/_effects",
            get(|State(s): State<Shared>| async move { axum::Json(s.stats.effect_log().json()) }),
        )
        .route("/repos/{owner}/{repo}/milestones/{number}", get(milestone))
        .route(
            "/_stats",
            get(|State(s): State<Shared>| async move { axum::Json(s.stats.json()) }),
        )
        .with_state(shared)
}

/// Counts the request and applies the faults; `Some` answer when a fault
/// decides it.
async fn admit(s: &Shared) -> Option<Response> {
    admit_after(s, true).await
}

/// `admit`, with the latency first or, for an effect, left to the caller
/// to add after the effect is applied: a client that gives up (or is
/// killed) while waiting for the answer has acted all the same.
async fn admit_after(s: &Shared, latency_first: bool) -> Option<Response> {
    let n = s.stats.requests.fetch_add(1, Ordering::SeqCst) + 1;
    if latency_first && s.faults.latency_ms > 0 {
        tokio::time::sleep(Duration::from_millis(s.faults.latency_ms)).await;
    }
    let hang = (s.faults.every_hang > 0 && n.is_multiple_of(s.faults.every_hang))
        || (s.faults.hang_once_at > 0 && n == s.faults.hang_once_at);
    if hang {
        s.stats.hung.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(s.faults.hang_ms)).await;
    }
    if s.faults.every_429 > 0 && n.is_multiple_of(s.faults.every_429) {
        s.stats.rate_limited.fetch_add(1, Ordering::SeqCst);
        let mut r = error(StatusCode::TOO_MANY_REQUESTS, "API rate limit exceeded");
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("0"));
        return Some(r);
    }
    None
}

fn error(status: StatusCode, message: &str) -> Response {
    (
        status,
        axum::Json(
            json!({"message": message, "documentation_url": "https://docs.github.com/rest"}),
        ),
    )
        .into_response()
}

/// A JSON answer with an `ETag`, or 304 when the client holds it.
fn tagged(s: &Shared, headers: &HeaderMap, body: &Value) -> Response {
    let text = body.to_string();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut h);
    let etag = format!("\"{:016x}\"", h.finish());
    let held = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        == Some(etag.as_str());
    let mut r = if held {
        s.stats.not_modified.fetch_add(1, Ordering::SeqCst);
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        (
            [(header::CONTENT_TYPE, "application/json; charset=utf-8")],
            text,
        )
            .into_response()
    };
    if let Ok(v) = HeaderValue::from_str(&etag) {
        r.headers_mut().insert(header::ETAG, v);
    }
    r
}

fn repo_matches(s: &Shared, owner: &str, repo: &str) -> bool {
    s.data.owner.eq_ignore_ascii_case(owner) && s.data.repo.eq_ignore_ascii_case(repo)
}

fn not_found(s: &Shared) -> Response {
    s.stats.not_found.fetch_add(1, Ordering::SeqCst);
    error(StatusCode::NOT_FOUND, "Not Found")
}

async fn issue(
    State(s): State<Shared>,
    Path((owner, repo, number)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> Response {
    let _flight = InFlight::enter(&s.stats);
    if let Some(r) = admit(&s).await {
        return r;
    }
    let found = number
        .parse::<u64>()
        .ok()
        .filter(|_| repo_matches(&s, &owner, &repo))
        .and_then(|n| s.data.issues.get(&n));
    match found {
        Some(issue) => tagged(&s, &headers, issue),
        None => not_found(&s),
    }
}

async fn milestone(
    State(s): State<Shared>,
    Path((owner, repo, number)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> Response {
    let _flight = InFlight::enter(&s.stats);
    if let Some(r) = admit(&s).await {
        return r;
    }
    let found = number
        .parse::<u64>()
        .ok()
        .filter(|_| repo_matches(&s, &owner, &repo))
        .and_then(|n| s.data.milestones.get(&n));
    match found {
        Some(m) => tagged(&s, &headers, m),
        None => not_found(&s),
    }
}

async fn comments(
    State(s): State<Shared>,
    Path((owner, repo, number)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> Response {
    let _flight = InFlight::enter(&s.stats);
    if let Some(r) = admit(&s).await {
        return r;
    }
    let Some(n) = number
        .parse::<u64>()
        .ok()
        .filter(|n| repo_matches(&s, &owner, &repo) && s.data.issues.contains_key(n))
    else {
        return not_found(&s);
    };
    let mut list = s.data.comments.get(&n).cloned().unwrap_or_default();
    list.extend(
        s.stats
            .effect_log()
            .comments
            .get(&n)
            .cloned()
            .unwrap_or_default(),
    );
    tagged(&s, &headers, &Value::Array(list))
}

/// The issue's number, if the repository and the issue exist.
fn known_issue(s: &Shared, owner: &str, repo: &str, number: &str) -> Option<u64> {
    number
        .parse::<u64>()
        .ok()
        .filter(|n| repo_matches(s, owner, repo) && s.data.issues.contains_key(n))
}

/// The issue's labels now: its own, less those removed, with those added.
fn labels_now(s: &Shared, log: &EffectLog, n: u64) -> Vec<String> {
    let mut names: BTreeSet<String> = s
        .data
        .issues
        .get(&n)
        .and_then(|i| i.get("labels"))
        .and_then(Value::as_array)
        .map(|ls| {
            ls.iter()
                .filter_map(|l| l.get("name").and_then(Value::as_str).map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    if let Some(gone) = log.removed.get(&n) {
        names.retain(|l| !gone.contains(l));
    }
    names.extend(log.labels.get(&n).cloned().unwrap_or_default());
    names.into_iter().collect()
}

fn label_list(names: &[String]) -> Value {
    Value::Array(names.iter().map(|n| json!({"name": n})).collect())
}

async fn labels(
    State(s): State<Shared>,
    Path((owner, repo, number)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> Response {
    let _flight = InFlight::enter(&s.stats);
    if let Some(r) = admit(&s).await {
        return r;
    }
    let Some(n) = known_issue(&s, &owner, &repo, &number) else {
        return not_found(&s);
    };
    let names = labels_now(&s, &s.stats.effect_log(), n);
    tagged(&s, &headers, &label_list(&names))
}

/// An effect request: counted, faults applied, an `Idempotency-Key` seen
/// before answered as it was. `apply` changes the log and gives the
/// answer, which waits out the latency after the change is made.
async fn effect(
    s: &Shared,
    headers: &HeaderMap,
    apply: impl FnOnce(&mut EffectLog) -> (StatusCode, Value) + Send + 'static,
) -> Response {
    let _flight = InFlight::enter(&s.stats);
    let n = {
        let mut log = s.stats.effect_log();
        log.requests += 1;
        log.requests
    };
    if let Some(r) = admit_after(s, false).await {
        return r;
    }
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    if s.slow.every > 0 && n.is_multiple_of(s.slow.every) {
        // Written late, on a task of its own: a client that gave up
        // waiting does not stop the write.
        let (shared, ms) = (s.clone(), s.slow.ms);
        let late = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            shared.stats.effect_log().slow_commits += 1;
            commit(&shared, key, n, apply)
        });
        return match late.await {
            Ok(Ok((status, body, _))) => (status, axum::Json(body)).into_response(),
            Ok(Err((status, body))) => replayed(status, body),
            Err(_) => error(StatusCode::INTERNAL_SERVER_ERROR, "the write failed"),
        };
    }
    let applied = commit(s, key, n, apply);
    let (status, body, lost) = match applied {
        Ok(done) => done,
        Err((status, body)) => return replayed(status, body),
    };
    if s.faults.latency_ms > 0 {
        tokio::time::sleep(Duration::from_millis(s.faults.latency_ms)).await;
    }
    if lost {
        return error(StatusCode::BAD_GATEWAY, "upstream connection lost");
    }
    (status, axum::Json(body)).into_response()
}

/// An answer given again from its idempotency key.
fn replayed(status: u16, body: Value) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
    let mut r = (status, axum::Json(body)).into_response();
    r.headers_mut()
        .insert("idempotent-replayed", HeaderValue::from_static("true"));
    r
}

/// Applies effect request `n` unless its key was seen: the answer and
/// whether the `lose_every` fault drops it, or the earlier answer.
#[allow(clippy::type_complexity)]
fn commit(
    s: &Shared,
    key: Option<String>,
    n: u64,
    apply: impl FnOnce(&mut EffectLog) -> (StatusCode, Value),
) -> Result<(StatusCode, Value, bool), (u16, Value)> {
    // The log's lock is let go before the answer waits.
    {
        let mut log = s.stats.effect_log();
        match key.as_ref().and_then(|k| log.keys.get(k).cloned()) {
            Some(seen) => {
                log.replayed += 1;
                Err(seen)
            }
            None => {
                let (status, body) = apply(&mut log);
                if let Some(k) = key
                    && status.is_success()
                {
                    log.keys.insert(k, (status.as_u16(), body.clone()));
                }
                let lost = s.faults.lose_every > 0 && n.is_multiple_of(s.faults.lose_every);
                if lost {
                    log.lost_answers += 1;
                }
                Ok((status, body, lost))
            }
        }
    }
}

async fn add_labels(
    State(s): State<Shared>,
    Path((owner, repo, number)): Path<(String, String, String)>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let Some(n) = known_issue(&s, &owner, &repo, &number) else {
        return not_found(&s);
    };
    let wanted: Option<Vec<String>> = serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|v| v.get("labels").cloned())
        .and_then(|v| serde_json::from_value(v).ok());
    let Some(wanted) = wanted else {
        return error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "labels must be a list of names",
        );
    };
    let shared = s.clone();
    effect(&s, &headers, move |log| {
        for name in &wanted {
            log.count(n, "label", name);
            if let Some(gone) = log.removed.get_mut(&n) {
                gone.remove(name);
            }
            log.labels.entry(n).or_default().insert(name.clone());
        }
        (StatusCode::OK, label_list(&labels_now(&shared, log, n)))
    })
    .await
}

async fn remove_label(
    State(s): State<Shared>,
    Path((owner, repo, number, name)): Path<(String, String, String, String)>,
    headers: HeaderMap,
) -> Response {
    let Some(n) = known_issue(&s, &owner, &repo, &number) else {
        return not_found(&s);
    };
    let shared = s.clone();
    effect(&s, &headers, move |log| {
        if let Some(added) = log.labels.get_mut(&n) {
            added.remove(&name);
        }
        log.removed.entry(n).or_default().insert(name);
        (StatusCode::OK, label_list(&labels_now(&shared, log, n)))
    })
    .await
}

async fn post_comment(
    State(s): State<Shared>,
    Path((owner, repo, number)): Path<(String, String, String)>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let Some(n) = known_issue(&s, &owner, &repo, &number) else {
        return not_found(&s);
    };
    let text = serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|v| v.get("body").and_then(Value::as_str).map(str::to_owned));
    let Some(text) = text else {
        return error(StatusCode::UNPROCESSABLE_ENTITY, "body must be a string");
    };
    effect(&s, &headers, move |log| {
        log.count(n, "comment", &text);
        let id = 1_000_000 + log.comments.values().map(Vec::len).sum::<usize>() as u64;
        let comment = json!({"id": id, "body": text, "user": {"login": "fanfold"}});
        log.comments.entry(n).or_default().push(comment.clone());
        (StatusCode::CREATED, comment)
    })
    .await
}

async fn list(
    State(s): State<Shared>,
    Path((owner, repo)): Path<(String, String)>,
    axum::extract::Query(q): axum::extract::Query<BTreeMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    let _flight = InFlight::enter(&s.stats);
    if let Some(r) = admit(&s).await {
        return r;
    }
    if !repo_matches(&s, &owner, &repo) {
        return not_found(&s);
    }
    let per_page: usize = q
        .get("per_page")
        .and_then(|v| v.parse().ok())
        .unwrap_or(30)
        .clamp(1, 100);
    let page: usize = q
        .get("page")
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
        .max(1);
    let state = q.get("state").map_or("open", String::as_str);
    let page_items: Vec<Value> = s
        .data
        .issues
        .values()
        .rev()
        .filter(|i| state == "all" || i.get("state").and_then(Value::as_str) == Some(state))
        .skip((page - 1) * per_page)
        .take(per_page)
        .cloned()
        .collect();
    tagged(&s, &headers, &Value::Array(page_items))
}
