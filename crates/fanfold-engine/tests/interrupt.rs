//! `RunOptions::interrupt` (Ctrl-C in the Python package) is seen in every
//! phase that can take long on a large input: while the source is stored
//! (each chunk), while it is routed (each read and element), in an embed
//! stage (each batch) and before every model call; and an interrupt is
//! its own stop reason, `interrupted`, never the wall budget.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::io::Read;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fanfold_engine::queue::BudgetPool;
use fanfold_engine::{ErrorCategory, Plan, Progress, RunError, RunOptions, Source};
use fanfold_ops::contract::StopReason;

/// A spec folder over `input.jsonl` (`{"id", "flag", "text"}` records)
/// whose `stages` come before a scripted judge saying yes to `flag`.
fn spec_dir(stages: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let spec = format!(
        r#"name = "t"
question = "Which records are flagged?"

[input]
path = "input.jsonl"
partition = {{ type = "jsonl", key = "id" }}

{stages}

[[stages]]
name = "judge"
type = "map"
version = 1
rubric = "rubric.md"
output_schema = "schema.json"
decision = {{ pointer = "/decision", positive = ["yes"], negative = ["no"] }}

[backends.default]
type = "scripted"
script = "judge.jq"

[[fold.reducers]]
name = "flagged"
type = "set"

[contract]
type = "exhaustive"
answer = "flagged"
"#
    );
    let write = |name: &str, text: &str| std::fs::write(dir.path().join(name), text).expect(name);
    write("spec.toml", &spec);
    write("rubric.md", "Say yes when the record is flagged.\n");
    write(
        "schema.json",
        r#"{"type": "object", "required": ["decision"], "properties": {"decision": {"enum": ["yes", "no"]}}}"#,
    );
    write(
        "judge.jq",
        r#"{decision: (if .flag then "yes" else "no" end)}"#,
    );
    dir
}

fn records(dir: &Path, n: usize) {
    let mut text = String::new();
    for i in 0..n {
        text.push_str(&format!(
            "{{\"id\": {i}, \"flag\": {}, \"text\": \"record {i}: the disk failed and data was lost\"}}\n",
            i % 2 == 0
        ));
    }
    std::fs::write(dir.join("input.jsonl"), text).expect("input");
}

fn plan(dir: &Path) -> Plan {
    Plan::load(&dir.join("spec.toml")).unwrap_or_else(|e| panic!("plan: {e}"))
}

fn options(dir: &Path, flag: &Arc<AtomicBool>) -> RunOptions {
    let mut opts = RunOptions::new(dir.join("store.sqlite"));
    opts.out_dir = Some(dir.join("out"));
    opts.slots = 2;
    opts.interrupt = Some(Arc::clone(flag));
    opts
}

/// Sets the flag when the stage named `at` starts, as a person pressing
/// Ctrl-C just then would.
struct InterruptWhen {
    at: &'static str,
    flag: Arc<AtomicBool>,
}

impl Progress for InterruptWhen {
    fn stage_started(&self, stage: &str, _units: u64, _cached: u64) {
        if stage == self.at {
            self.flag.store(true, Ordering::Relaxed);
        }
    }
}

/// An interrupt while the judge runs ends the run as `interrupted`: its
/// own stop reason in the certificate and the answer, its own line among
/// the answer's shortfalls, its own exit code (130), and no word of a wall
/// budget the spec never set. A rerun judges every unit.
#[test]
fn an_interrupt_during_a_stage_is_its_own_stop_reason_and_exit_code() {
    let dir = spec_dir("");
    records(dir.path(), 12);
    let flag = Arc::new(AtomicBool::new(false));
    let progress = InterruptWhen {
        at: "judge",
        flag: Arc::clone(&flag),
    };
    let report = fanfold_engine::run(&plan(dir.path()), &options(dir.path(), &flag), &progress)
        .unwrap_or_else(|e| panic!("run: {e}"));
    assert_eq!(report.certificate.stop, StopReason::Interrupted);
    assert_eq!(report.answer.stop, StopReason::Interrupted);
    assert_eq!(report.exit_code(), fanfold_engine::EXIT_INTERRUPTED);
    assert!(!report.answer.complete);
    assert!(
        report
            .answer
            .incomplete
            .iter()
            .any(|why| why.starts_with("interrupted")),
        "{:?}",
        report.answer.incomplete
    );
    assert!(
        !report
            .answer
            .incomplete
            .iter()
            .any(|why| why.contains("wall_secs")),
        "{:?}",
        report.answer.incomplete
    );
    assert_eq!(report.certificate.statuses.not_run, 12);
    let written: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("out/certificate.json")).expect("certificate"),
    )
    .expect("json");
    assert_eq!(
        written["stop"]["reason"], "interrupted",
        "{}",
        written["stop"]
    );
    let facts = std::fs::read_to_string(dir.path().join("out/facts.jsonl")).expect("facts");
    assert!(facts.contains("\"reason\":\"interrupted\""), "{facts}");
    assert!(!facts.contains("wall_secs"), "{facts}");

    let calm = Arc::new(AtomicBool::new(false));
    let again = fanfold_engine::run(
        &plan(dir.path()),
        &options(dir.path(), &calm),
        &fanfold_engine::NoProgress,
    )
    .unwrap_or_else(|e| panic!("rerun: {e}"));
    assert!(again.answer.complete, "{:?}", again.answer.incomplete);
    assert_eq!(again.certificate.stats.model_calls, 12);
}

/// An interrupt means time is up whatever the wall budget: what is left of
/// it is nothing, and the stop is the interrupt's.
#[test]
fn an_interrupted_budget_has_no_wall_time_left() {
    let flag = Arc::new(AtomicBool::new(false));
    let budget = fanfold_core::spec::BudgetSpec {
        max_wall_secs: Some(3_600),
        ..fanfold_core::spec::BudgetSpec::default()
    };
    let pool = BudgetPool::new(budget).interrupted_by(Arc::clone(&flag));
    assert!(
        pool.wall_left()
            .is_some_and(|left| left > Duration::from_secs(3_000))
    );
    assert_eq!(pool.wall_spent(), None);
    flag.store(true, Ordering::Relaxed);
    assert_eq!(pool.wall_left(), Some(Duration::ZERO));
    assert_eq!(pool.wall_spent(), Some(StopReason::Interrupted));
    // Without a wall budget too.
    let pool = BudgetPool::new(fanfold_core::spec::BudgetSpec::default())
        .interrupted_by(Arc::clone(&flag));
    assert_eq!(pool.wall_left(), Some(Duration::ZERO));
    assert_eq!(pool.wall_spent(), Some(StopReason::Interrupted));
}

/// An input that never ends (a command writing forever) is stored a chunk
/// at a time; an interrupt is seen at the next chunk, and the run ends as
/// interrupted (exit 130) instead of reading on.
#[test]
fn an_interrupt_stops_storing_an_input_that_never_ends() {
    let dir = spec_dir("");
    let flag = Arc::new(AtomicBool::new(false));
    let mut opts = options(dir.path(), &flag);
    opts.source = Some(Source::Command(
        vec!["yes".into(), r#"{"id": 1, "flag": true}"#.into()],
        Duration::from_secs(120),
    ));
    let setter = {
        let flag = Arc::clone(&flag);
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            flag.store(true, Ordering::Relaxed);
            Instant::now()
        })
    };
    let result = fanfold_engine::run(&plan(dir.path()), &opts, &fanfold_engine::NoProgress);
    let ended = Instant::now();
    let set_at = setter.join().expect("setter");
    match result {
        Err(e @ RunError::Interrupted { .. }) => {
            assert_eq!(e.category(), ErrorCategory::Interrupted);
            assert_eq!(e.category().exit_code(), fanfold_engine::EXIT_INTERRUPTED);
            assert!(e.to_string().contains("storing the input"), "{e}");
        }
        other => panic!("expected an interrupt, got {:?}", other.map(|r| r.run_id)),
    }
    assert!(
        ended.duration_since(set_at) < Duration::from_secs(5),
        "stopped {:?} after the interrupt",
        ended.duration_since(set_at)
    );
}

/// A reader of JSON lines that never ends, setting `flag` once it has
/// handed out `interrupt_after` bytes and counting what it hands out.
struct EndlessRecords {
    line: u64,
    pending: Vec<u8>,
    handed: Arc<AtomicU64>,
    interrupt_after: u64,
    flag: Arc<AtomicBool>,
}

impl Read for EndlessRecords {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.pending.len() < buf.len() {
            self.pending.extend_from_slice(
                format!(
                    "{{\"id\": {}, \"flag\": false, \"text\": \"line {}\"}}\n",
                    self.line, self.line
                )
                .as_bytes(),
            );
            self.line += 1;
        }
        let n = buf.len();
        buf.copy_from_slice(&self.pending[..n]);
        self.pending.drain(..n);
        let handed = self.handed.fetch_add(n as u64, Ordering::Relaxed) + n as u64;
        if handed >= self.interrupt_after {
            self.flag.store(true, Ordering::Relaxed);
        }
        Ok(n)
    }
}

/// The route pass (partition and prefilter) over an input that never ends
/// stops at the read after the interrupt, as interrupted, having asked the
/// source for nothing more.
#[test]
fn an_interrupt_stops_the_route_pass_at_its_next_read() {
    let dir = spec_dir("");
    let flag = Arc::new(AtomicBool::new(false));
    let handed = Arc::new(AtomicU64::new(0));
    let after = 4 << 20;
    let reader = EndlessRecords {
        line: 0,
        pending: Vec::new(),
        handed: Arc::clone(&handed),
        interrupt_after: after,
        flag: Arc::clone(&flag),
    };
    let plan = plan(dir.path());
    let options = fanfold_engine::run::route::stream_options(1 << 20, 2);
    let result = fanfold_engine::run::route::route(
        &plan,
        fanfold_core::ContentHash::of_bytes(b"endless"),
        "endless",
        reader,
        None,
        options,
        Some(&flag),
    );
    match result {
        Err(RunError::Interrupted { phase }) => assert!(phase.contains("partitioning"), "{phase}"),
        Err(e) => panic!("expected an interrupt, got {e}"),
        Ok(_) => panic!("expected an interrupt, the pass ended"),
    }
    let read = handed.load(Ordering::Relaxed);
    assert!(read >= after, "{read}");
    // The read that crossed the mark was the last one: at most one buffer
    // (a chunk, as the store hands them out) past it.
    assert!(read < after + (2 << 20), "read {read} bytes");
}

/// An interrupt as an embed stage starts: no batch is embedded, its units
/// end `not_run` (never negative, never stored), the judge after it sends
/// nothing, and the run is interrupted; a rerun embeds and judges them
/// all.
#[test]
fn embedded_an_interrupt_stops_an_embed_stage_between_batches() {
    let dir = spec_dir(
        r#"[[stages]]
name = "near"
type = "embed"
version = 1
fields = ["text"]
positive = ["the disk failed and data was lost"]
threshold = -1.0
then = "judge"
"#,
    );
    records(dir.path(), 40);
    let flag = Arc::new(AtomicBool::new(false));
    let progress = InterruptWhen {
        at: "near",
        flag: Arc::clone(&flag),
    };
    let report = fanfold_engine::run(&plan(dir.path()), &options(dir.path(), &flag), &progress)
        .unwrap_or_else(|e| panic!("run: {e}"));
    assert_eq!(report.certificate.stop, StopReason::Interrupted);
    assert_eq!(report.exit_code(), fanfold_engine::EXIT_INTERRUPTED);
    assert_eq!(report.certificate.statuses.not_run, 40);
    assert_eq!(report.certificate.stats.model_calls, 0);
    let certificate = serde_json::to_value(&report.certificate).expect("certificate");
    let near = &certificate["stats"]["embed"]["near"];
    assert_eq!(near["vectors_computed"], 0, "{near}");

    let calm = Arc::new(AtomicBool::new(false));
    let again = fanfold_engine::run(
        &plan(dir.path()),
        &options(dir.path(), &calm),
        &fanfold_engine::NoProgress,
    )
    .unwrap_or_else(|e| panic!("rerun: {e}"));
    assert!(again.answer.complete, "{:?}", again.answer.incomplete);
    assert_eq!(again.certificate.stats.model_calls, 40);
}
