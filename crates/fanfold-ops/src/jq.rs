//! jq expressions (through jaq), as users of `gh --jq` write them.
//!
//! A jq program can run forever (`def f: f; f`, `repeat(false) | select(.)`)
//! and jaq has no point at which an evaluation can be interrupted. Every
//! evaluation is therefore watched: it marks its thread's slot with the time
//! it started and where it runs (which rule, which unit), and one watchdog
//! thread reports any evaluation older than the time limit to the runaway
//! handler. The stuck thread cannot be stopped, so the handler's job is to
//! end the process with an error that names the program and the unit; facts
//! already computed are in the store, as after any kill.
//!
//! Memory is bounded the same way (`[repeat(.)]` fills gigabytes well inside
//! any time limit). A binary that installs [`MeteredAlloc`] as its global
//! allocator counts, per thread, the bytes an evaluation holds; one that
//! passes the memory limit is reported to the same handler, from the
//! allocation that passed it, before the memory is taken.
//!
//! A program does not see the process's environment. jq's `env` and
//! `$ENV` are an object of only the variables a spec declares
//! (`[env] read = [...]`, see [`allow_env`]); with none declared both are
//! `{}`. A program runs on data the model or the input wrote, and what it
//! outputs can reach a fact: the environment holds API keys.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock, Weak};
use std::time::{Duration, Instant};

use jaq_core::load::{Arena, File, Loader};
use jaq_core::{Compiler, Ctx, Vars, data};
use jaq_json::Val;

type Data = data::JustLut<Val>;

/// A compiled jq program. Not `Send`: jaq values are reference-counted, so
/// each thread compiles its own copy.
pub struct JqProgram {
    source: String,
    /// The program as error messages name it, shared with the watchdog.
    shown: Arc<str>,
    filter: jaq_core::compile::Filter<jaq_core::Native<Data>>,
    /// `$ENV`: the declared variables that are set, when compiled. Kept
    /// as strings so the program can be shared between threads; each builds the
    /// jq value once ([`env_val`]).
    env: Arc<[(String, String)]>,
}

#[derive(Debug, thiserror::Error)]
pub enum JqError {
    #[error("jq syntax error in `{expr}`: {detail}")]
    Syntax { expr: String, detail: String },
    #[error("jq error in `{expr}`: {detail}")]
    Runtime { expr: String, detail: String },
}

impl JqProgram {
    pub fn compile(source: &str) -> Result<JqProgram, JqError> {
        let defs = jaq_core::defs()
            .chain(jaq_std::defs())
            .chain(jaq_json::defs());
        // jaq's own `env` reads the whole environment; this one is
        // `$ENV`, the declared variables only.
        let funs = jaq_core::funs()
            .chain(jaq_std::funs().filter(|(name, _, _)| *name != "env"))
            .chain(jaq_json::funs());
        let defs =
            defs.chain(jaq_core::load::parse("def env: $ENV;", |p| p.defs()).unwrap_or_default());
        let loader = Loader::new(defs);
        let arena = Arena::default();
        let syntax = |detail: String| JqError::Syntax {
            expr: excerpt(source),
            detail,
        };
        let modules = loader
            .load(
                &arena,
                File {
                    code: source,
                    path: (),
                },
            )
            .map_err(|errs| {
                syntax(
                    errs.into_iter()
                        .map(|(_, e)| describe_load_error(source, e))
                        .collect::<Vec<_>>()
                        .join("; "),
                )
            })?;
        let filter = Compiler::default()
            .with_funs(funs)
            .with_global_vars(["$ENV"])
            .compile(modules)
            .map_err(|errs| {
                let names: Vec<String> = errs
                    .into_iter()
                    .flat_map(|(_, es)| {
                        es.into_iter()
                            .map(|(name, undef)| format!("{name} ({undef:?})"))
                    })
                    .collect();
                syntax(format!("undefined: {}", names.join(", ")))
            })?;
        Ok(JqProgram {
            source: source.to_owned(),
            shown: Arc::from(excerpt(source)),
            filter,
            env: declared_env().into(),
        })
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    /// Every output of the program on `input`.
    pub fn run(&self, input: Val, at: Site<'_>) -> Result<Vec<Val>, JqError> {
        let _watch = Watch::start(&self.shown, at);
        let ctx = Ctx::<Data>::new(&self.filter.lut, Vars::new([env_val(&self.env)]));
        let mut out = Vec::new();
        for item in self.filter.id.run((ctx, input)) {
            match item {
                Ok(v) => out.push(v),
                Err(exn) => {
                    let detail = match exn.get_err() {
                        Ok(e) => e.to_string(),
                        Err(_) => "the program halted".to_owned(),
                    };
                    return Err(JqError::Runtime {
                        expr: excerpt(&self.source),
                        detail,
                    });
                }
            }
        }
        Ok(out)
    }

    /// The program's first output, if any. Later outputs are never
    /// computed: a generator such as `repeat(false)` is asked for one value.
    pub fn first(&self, input: Val, at: Site<'_>) -> Result<Option<Val>, JqError> {
        let _watch = Watch::start(&self.shown, at);
        let ctx = Ctx::<Data>::new(&self.filter.lut, Vars::new([env_val(&self.env)]));
        match self.filter.id.run((ctx, input)).next() {
            None => Ok(None),
            Some(Ok(v)) => Ok(Some(v)),
            Some(Err(exn)) => Err(JqError::Runtime {
                expr: excerpt(&self.source),
                detail: match exn.get_err() {
                    Ok(e) => e.to_string(),
                    Err(_) => "the program halted".to_owned(),
                },
            }),
        }
    }

    /// True when the first output is `true`; jq's `select` semantics.
    pub fn test(&self, input: Val, at: Site<'_>) -> Result<bool, JqError> {
        Ok(matches!(self.first(input, at)?, Some(Val::Bool(true))))
    }

    /// The first output, which must be a boolean (no output is `false`): a
    /// rule that yields anything else is a mistake in the rule, said as one
    /// rather than read as `false`.
    pub fn test_bool(&self, input: Val, at: Site<'_>) -> Result<bool, JqError> {
        match self.first(input, at)? {
            None | Some(Val::Bool(false)) => Ok(false),
            Some(Val::Bool(true)) => Ok(true),
            Some(other) => Err(JqError::Runtime {
                expr: excerpt(&self.source),
                detail: format!(
                    "yields {}, not a boolean, for unit `{}`",
                    excerpt(&other.to_string()),
                    at.unit
                ),
            }),
        }
    }

    /// The first output as JSON.
    pub fn first_json(
        &self,
        input: Val,
        at: Site<'_>,
    ) -> Result<Option<serde_json::Value>, JqError> {
        match self.first(input, at)? {
            None => Ok(None),
            Some(v) => {
                serde_json::from_str(&v.to_string())
                    .map(Some)
                    .map_err(|e| JqError::Runtime {
                        expr: self.source.clone(),
                        detail: format!("output is not JSON: {e}"),
                    })
            }
        }
    }
}

static ENV_READ: RwLock<Vec<String>> = RwLock::new(Vec::new());

/// The environment variables jq programs may read through `env` and
/// `$ENV` (none unless a spec declares them). Process-wide, like the
/// limits: it belongs to the run's spec, and a program compiled after
/// this call sees these names only.
pub fn allow_env(names: &[String]) {
    if ENV_DENIED.load(std::sync::atomic::Ordering::SeqCst) {
        return;
    }
    if let Ok(mut read) = ENV_READ.write() {
        *read = names.to_vec();
    }
}

/// Set by [`deny_env`]: no spec may declare variables any more.
static ENV_DENIED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// From now on, in this process, jq programs see no environment, whatever
/// a spec declares: for re-checking a spec someone else wrote (a received
/// certificate), whose `[env] read` would otherwise name this host's
/// variables.
pub fn deny_env() {
    ENV_DENIED.store(true, std::sync::atomic::Ordering::SeqCst);
    if let Ok(mut read) = ENV_READ.write() {
        read.clear();
    }
}

/// The names [`allow_env`] declared.
pub fn allowed_env() -> Vec<String> {
    ENV_READ.read().map(|r| r.clone()).unwrap_or_default()
}

/// The declared variables that are set, read now.
fn declared_env() -> Vec<(String, String)> {
    allowed_env()
        .into_iter()
        .filter_map(|name| {
            let value = std::env::var(&name).ok()?;
            Some((name, value))
        })
        .collect()
}

/// A program's environment and the jq value made of it.
type EnvVal = (Arc<[(String, String)]>, Val);

thread_local! {
    /// The last program environment made a jq value on this thread: a
    /// run's programs share one, so the object is built once per thread.
    static ENV_VAL: std::cell::RefCell<Option<EnvVal>> =
        const { std::cell::RefCell::new(None) };
}

/// `env` as a jq object.
fn env_val(env: &Arc<[(String, String)]>) -> Val {
    let build = || {
        let map: serde_json::Map<String, serde_json::Value> = env
            .iter()
            .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
            .collect();
        to_val(&serde_json::Value::Object(map))
    };
    ENV_VAL
        .try_with(|cell| {
            let mut cached = cell.borrow_mut();
            match &*cached {
                Some((of, val)) if Arc::ptr_eq(of, env) || **of == **env => val.clone(),
                _ => {
                    let val = build();
                    *cached = Some((Arc::clone(env), val.clone()));
                    val
                }
            }
        })
        .unwrap_or_else(|_| build())
}

/// Where an evaluation runs, for the error that names a runaway program:
/// `what` is the rule or expression (`prefilter rule \`bots\``), `unit` the
/// unit id.
#[derive(Debug, Clone, Copy)]
pub struct Site<'a> {
    pub what: &'a str,
    pub unit: &'a str,
}

impl<'a> Site<'a> {
    pub fn new(what: &'a str, unit: &'a str) -> Site<'a> {
        Site { what, unit }
    }
}

/// An evaluation that ran past the time limit or the memory limit.
#[derive(Debug, Clone)]
pub struct Runaway {
    pub program: String,
    pub what: String,
    pub unit: String,
    pub overrun: Overrun,
}

/// Which limit a runaway passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overrun {
    /// It ran this long without an answer.
    Time(Duration),
    /// It asked for more than this many bytes.
    Memory(u64),
}

impl std::fmt::Display for Runaway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "jq program `{}` ({}) on unit {} ",
            self.program, self.what, self.unit
        )?;
        match self.overrun {
            Overrun::Time(elapsed) => write!(
                f,
                "has run for {:.1} s without an answer",
                elapsed.as_secs_f64()
            )?,
            Overrun::Memory(limit) => {
                write!(f, "holds more than {} MiB (--jq-memory-mib)", limit / MIB)?
            }
        }
        write!(
            f,
            " and cannot be interrupted; the run stops here. Facts already computed \
             are in the store; fix the program and run again to resume"
        )
    }
}

const MIB: u64 = 1 << 20;

type Handler = Box<dyn Fn(&Runaway) + Send + Sync>;

static LIMIT_MS: AtomicU64 = AtomicU64::new(10_000);
static LIMIT_BYTES: AtomicU64 = AtomicU64::new(1024 * MIB);
static HANDLER: OnceLock<Handler> = OnceLock::new();
static SLOTS: Mutex<Vec<Weak<Slot>>> = Mutex::new(Vec::new());
static WATCHDOG: OnceLock<()> = OnceLock::new();

/// How long one evaluation may run before it is a runaway (default 10 s).
/// Process-wide: the limit belongs to the run, not to one program.
pub fn set_time_limit(limit: Duration) {
    let ms = u64::try_from(limit.as_millis()).unwrap_or(u64::MAX).max(1);
    LIMIT_MS.store(ms, Ordering::Relaxed);
}

pub fn time_limit() -> Duration {
    Duration::from_millis(LIMIT_MS.load(Ordering::Relaxed))
}

/// How many bytes one evaluation may hold at once (default 1 GiB). Holds
/// only where [`MeteredAlloc`] is the global allocator.
pub fn set_memory_limit(bytes: u64) {
    LIMIT_BYTES.store(bytes.max(1), Ordering::Relaxed);
}

pub fn memory_limit() -> u64 {
    LIMIT_BYTES.load(Ordering::Relaxed)
}

/// Installs what happens to a runaway (once per process; later calls are
/// ignored). A memory runaway is reported from inside an allocation: the
/// handler must not panic. Without a handler the error is printed and the process exits
/// with status 2.
pub fn on_runaway(handler: impl Fn(&Runaway) + Send + Sync + 'static) {
    let _ = HANDLER.set(Box::new(handler));
}

/// One thread's evaluation in progress: when it started (0: idle), and
/// where. Written by its thread, read by the watchdog.
#[derive(Default)]
struct Slot {
    started_ms: AtomicU64,
    /// Bytes allocated less bytes freed on this thread since the
    /// evaluation started (negative when it frees what came before it).
    held: AtomicI64,
    place: Mutex<Place>,
}

#[derive(Default)]
struct Place {
    program: Option<Arc<str>>,
    what: String,
    unit: String,
}

thread_local! {
    static SLOT: Arc<Slot> = register();
    /// The running evaluation's slot, for the allocator; null when idle.
    /// A raw pointer because the allocator cannot touch `SLOT` (its lazy
    /// initialisation allocates); `Watch` keeps the slot alive meanwhile.
    static METERED: Cell<*const Slot> = const { Cell::new(std::ptr::null()) };
}

fn register() -> Arc<Slot> {
    let slot = Arc::new(Slot::default());
    if let Ok(mut slots) = SLOTS.lock() {
        slots.retain(|w| w.strong_count() > 0);
        slots.push(Arc::downgrade(&slot));
    }
    WATCHDOG.get_or_init(|| {
        // Without the watchdog a runaway hangs the run, which is what it
        // exists to prevent; a failed spawn is left to show as that hang.
        let _ = std::thread::Builder::new()
            .name("jq-watchdog".into())
            .spawn(watch_loop);
    });
    slot
}

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn now_ms() -> u64 {
    // +1 keeps 0 free to mean "idle".
    u64::try_from(epoch().elapsed().as_millis()).unwrap_or(u64::MAX - 1) + 1
}

/// Marks the calling thread busy for as long as it lives.
struct Watch;

impl Watch {
    fn start(program: &Arc<str>, at: Site<'_>) -> Watch {
        SLOT.with(|slot| {
            if let Ok(mut place) = slot.place.lock() {
                place.program = Some(Arc::clone(program));
                place.what.clear();
                place.what.push_str(at.what);
                place.unit.clear();
                place.unit.push_str(at.unit);
            }
            slot.held.store(0, Ordering::Relaxed);
            slot.started_ms.store(now_ms(), Ordering::Release);
            let _ = METERED.try_with(|m| m.set(Arc::as_ptr(slot)));
        });
        Watch
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = METERED.try_with(|m| m.set(std::ptr::null()));
        let _ = SLOT.try_with(|slot| slot.started_ms.store(0, Ordering::Release));
    }
}

/// The system allocator, counting what each jq evaluation holds so that
/// one passing [`memory_limit`] is reported before it takes the memory.
/// Outside an evaluation it costs one thread-local read per call.
pub struct MeteredAlloc;

impl MeteredAlloc {
    fn meter(grow: i64) {
        let Ok(slot) = METERED.try_with(Cell::get) else {
            return;
        };
        if slot.is_null() {
            return;
        }
        // SAFETY: `METERED` is non-null only while a `Watch` on this thread
        // lives, and the thread's `SLOT` (which owns the slot) outlives it.
        let slot = unsafe { &*slot };
        let held = slot.held.fetch_add(grow, Ordering::Relaxed) + grow;
        let limit = LIMIT_BYTES.load(Ordering::Relaxed);
        if grow > 0 && u64::try_from(held).is_ok_and(|h| h > limit) {
            // Stop metering first: reporting allocates, and the evaluation
            // is reported once.
            let _ = METERED.try_with(|m| m.set(std::ptr::null()));
            report(slot, Overrun::Memory(limit));
        }
    }
}

fn signed(bytes: usize) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

// SAFETY: every call is passed unchanged to `System`; metering only reads
// and writes this thread's counters.
unsafe impl GlobalAlloc for MeteredAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        Self::meter(signed(layout.size()));
        // SAFETY: the caller's contract is `System`'s.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        Self::meter(signed(layout.size()));
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        Self::meter(-signed(layout.size()));
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        Self::meter(signed(new_size) - signed(layout.size()));
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Hands a runaway to the handler (or, without one, ends the process).
fn report(slot: &Slot, overrun: Overrun) {
    let runaway = match slot.place.lock() {
        Ok(place) => Runaway {
            program: place.program.as_deref().unwrap_or("").to_owned(),
            what: place.what.clone(),
            unit: place.unit.clone(),
            overrun,
        },
        Err(_) => return,
    };
    match HANDLER.get() {
        Some(handler) => handler(&runaway),
        None => {
            use std::io::Write as _;
            let _ = writeln!(std::io::stderr(), "error: {runaway}");
            std::process::exit(2);
        }
    }
}

fn watch_loop() {
    loop {
        let limit = LIMIT_MS.load(Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis((limit / 4).clamp(10, 250)));
        let slots: Vec<Arc<Slot>> = match SLOTS.lock() {
            Ok(s) => s.iter().filter_map(Weak::upgrade).collect(),
            Err(_) => continue,
        };
        let now = now_ms();
        for slot in slots {
            let started = slot.started_ms.load(Ordering::Acquire);
            if started == 0 || now.saturating_sub(started) <= limit {
                continue;
            }
            // Reported once: the slot stays busy while its thread is stuck.
            slot.started_ms.store(0, Ordering::Release);
            report(
                &slot,
                Overrun::Time(Duration::from_millis(now.saturating_sub(started))),
            );
        }
    }
}

/// Where `at` (a slice of `source`) starts, as a person counts: line and
/// column, or "the end".
fn position(source: &str, at: &str) -> String {
    let offset = (at.as_ptr() as usize).wrapping_sub(source.as_ptr() as usize);
    if offset >= source.len() {
        return "the end".to_owned();
    }
    let before = &source[..offset];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    format!("line {line}, column {column}")
}

/// A jq load error in words, with where it happened.
fn describe_load_error(source: &str, e: jaq_core::load::Error<&str>) -> String {
    use jaq_core::load::{Error, lex};
    let mut out = Vec::new();
    match e {
        Error::Io(v) => out.extend(v.into_iter().map(|(path, msg)| format!("{path}: {msg}"))),
        Error::Lex(v) => {
            for (expect, at) in v {
                out.push(match expect {
                    lex::Expect::Delim(open) => {
                        format!("`{open}` at {} is never closed", position(source, open))
                    }
                    other => format!("expected {} at {}", other.as_str(), position(source, at)),
                });
            }
        }
        Error::Parse(v) => {
            for (expect, found) in v {
                let at = position(source, found);
                let shown: String = found.chars().take(20).collect();
                let got = if shown.is_empty() {
                    "nothing".to_owned()
                } else {
                    format!("`{shown}`")
                };
                out.push(format!("expected {} at {at}, found {got}", expect.as_str()));
            }
        }
    }
    out.join("; ")
}

/// A short form of a program for error messages: long scripts are named by
/// their first line.
fn excerpt(source: &str) -> String {
    let first = source
        .lines()
        .find(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        .unwrap_or("");
    if first.len() < source.trim().len() {
        format!("{} ...", first.chars().take(80).collect::<String>())
    } else {
        source.to_owned()
    }
}

/// A serde_json value as a jq value.
pub fn to_val(value: &serde_json::Value) -> Val {
    use serde::Deserialize;
    Val::deserialize(value).unwrap_or_default()
}

/// Raw JSON bytes as a jq value, without building a serde value first.
pub fn parse_val(bytes: &[u8]) -> Result<Val, String> {
    jaq_json::read::parse_single(bytes).map_err(|e| format!("{e:?}"))
}

/// The unit tests run under the metered allocator, as `fanfold` does.
#[cfg(test)]
#[global_allocator]
static TEST_ALLOC: MeteredAlloc = MeteredAlloc;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const AT: Site<'static> = Site {
        what: "a test",
        unit: "u1",
    };

    #[test]
    fn syntax_errors_say_where() {
        let err = JqProgram::compile(".x == (1 +")
            .err()
            .expect("fails")
            .to_string();
        assert!(
            err.contains("`(` at line 1, column 7 is never closed"),
            "{err}"
        );
        let err = JqProgram::compile(".a |\n  if . then 1")
            .err()
            .expect("fails")
            .to_string();
        assert!(err.contains("expected else or end at the end"), "{err}");
        let err = JqProgram::compile(".a |\n  .b ]")
            .err()
            .expect("fails")
            .to_string();
        assert!(err.contains("line 2, column 6"), "{err}");
        assert!(!err.contains("Parse(") && !err.contains("Lex("), "{err}");
    }

    #[test]
    fn only_the_first_output_is_computed() {
        // Both generate without end; only their first value is asked for.
        for expr in ["repeat(false)", "limit(1e12; repeat(.))"] {
            let p = JqProgram::compile(expr).expect("compiles");
            assert!(!p.test(to_val(&json!(false)), AT).expect("runs"));
        }
        let p = JqProgram::compile("range(1e12)").expect("compiles");
        assert_eq!(
            p.first_json(to_val(&json!(null)), AT).expect("runs"),
            Some(json!(0))
        );
    }

    #[test]
    fn env_holds_only_declared_variables() {
        // SAFETY: set before any thread of this test reads the
        // environment; no other test reads these names.
        unsafe {
            std::env::set_var("FANFOLD_JQ_TEST_SECRET", "sk-hidden-value");
            std::env::set_var("FANFOLD_JQ_TEST_OPEN", "visible");
        }
        let all = JqProgram::compile("[env, $ENV]").expect("compiles");
        let shown = |p: &JqProgram| {
            p.first_json(to_val(&json!(null)), AT)
                .expect("runs")
                .expect("an output")
        };
        let seen = shown(&all);
        assert!(!seen.to_string().contains("sk-hidden-value"), "{seen}");
        assert!(!seen.to_string().contains("PATH"), "{seen}");
        allow_env(&[
            "FANFOLD_JQ_TEST_OPEN".to_owned(),
            "FANFOLD_JQ_UNSET".to_owned(),
        ]);
        let declared = JqProgram::compile("[env, $ENV]").expect("compiles");
        allow_env(&[]);
        let seen = shown(&declared);
        assert_eq!(
            seen,
            json!([{"FANFOLD_JQ_TEST_OPEN": "visible"}, {"FANFOLD_JQ_TEST_OPEN": "visible"}])
        );
    }

    #[test]
    fn runs_gh_style_expressions() {
        let p = JqProgram::compile(r#".state == "OPEN" and any(.labels[]; .name == "bug")"#)
            .expect("compiles");
        let issue = json!({"state": "OPEN", "labels": [{"name": "bug"}]});
        assert!(p.test(to_val(&issue), AT).expect("runs"));
        let closed = json!({"state": "CLOSED", "labels": []});
        assert!(!p.test(to_val(&closed), AT).expect("runs"));
    }

    #[test]
    fn regex_functions_are_available() {
        let p = JqProgram::compile(r#".body | test("refresh token"; "i")"#).expect("compiles");
        assert!(
            p.test(to_val(&json!({"body": "The Refresh Token rotates"})), AT)
                .expect("runs")
        );
    }

    #[test]
    fn syntax_errors_name_the_expression() {
        let err = JqProgram::compile(".state ==").err().expect("fails");
        assert!(err.to_string().contains(".state =="), "{err}");
        let err = JqProgram::compile("nosuchfn(1)").err().expect("fails");
        assert!(err.to_string().contains("nosuchfn"), "{err}");
    }

    #[test]
    fn first_json_round_trips() {
        let p = JqProgram::compile(r#"{decision: (if .n > 2 then "yes" else "no" end), n}"#)
            .expect("compiles");
        let out = p.first_json(to_val(&json!({"n": 3})), AT).expect("runs");
        assert_eq!(out, Some(json!({"decision": "yes", "n": 3})));
    }

    #[test]
    fn runaways_in_time_and_in_memory_are_reported_with_their_place() {
        let (tx, rx) = std::sync::mpsc::channel();
        let tx = Mutex::new(tx);
        on_runaway(move |r| {
            if let Ok(tx) = tx.lock() {
                let _ = tx.send(r.clone());
            }
        });
        set_time_limit(Duration::from_millis(200));
        // A quick program under the watch is never reported.
        let quick = JqProgram::compile(".a").expect("compiles");
        assert!(
            quick
                .first(to_val(&json!({"a": 1})), Site::new("quick", "u0"))
                .is_ok()
        );
        std::thread::spawn(|| {
            let p = JqProgram::compile("def f: f; f").expect("compiles");
            let _ = p.first(
                to_val(&json!(null)),
                Site::new("prefilter rule `loop`", "u7"),
            );
        });
        let r = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the watchdog reports the runaway");
        assert_eq!(r.program, "def f: f; f");
        assert_eq!(r.what, "prefilter rule `loop`");
        assert_eq!(r.unit, "u7");
        assert!(matches!(r.overrun, Overrun::Time(t) if t >= Duration::from_millis(200)));
        let shown = r.to_string();
        assert!(
            shown.contains("u7") && shown.contains("def f: f; f"),
            "{shown}"
        );
        // Reported once, not on every watchdog tick.
        assert!(rx.recv_timeout(Duration::from_millis(600)).is_err());

        // Memory: a program that fills memory quickly is reported by the
        // allocation that passes the limit, well before the time limit.
        set_time_limit(Duration::from_secs(600));
        set_memory_limit(8 * MIB);
        std::thread::spawn(|| {
            let p = JqProgram::compile("[limit(2000000; repeat(\"abcdefgh\"))] | length")
                .expect("compiles");
            let _ = p.first(to_val(&json!(null)), Site::new("`project`", "u9"));
        });
        let r = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the allocator reports the runaway");
        assert_eq!(r.unit, "u9");
        assert_eq!(r.overrun, Overrun::Memory(8 * MIB));
        assert!(r.to_string().contains("more than 8 MiB"), "{r}");
        // A program that stays under the limit is never reported.
        let small = JqProgram::compile("[range(1000)] | length").expect("compiles");
        assert!(
            small
                .first(to_val(&json!(null)), Site::new("small", "u1"))
                .is_ok()
        );
        assert!(rx.recv_timeout(Duration::from_millis(300)).is_err());
        set_memory_limit(1024 * MIB);
    }
}
