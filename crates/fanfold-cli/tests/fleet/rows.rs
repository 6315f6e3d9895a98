//! A worker reads the rows the fleet stores (a job's options, each task's
//! request) exactly as its own release writes them: a row tampered with
//! in the store, or written by another release, is refused with a message
//! naming the job (and the task), never read leniently or defaulted.

use super::trust::{planted_job, stop, wait_for_text, worker_in};
use super::*;

/// A scripted backend a worker builds without any file outside it.
fn scripted_backend() -> Value {
    serde_json::json!({
        "spec": {"type": "scripted", "script": "script.jq"},
        "files": {"script.jq": "{decision: \"yes\"}"}
    })
}

/// The options of the planted job `r/0`, replaced by `row`.
fn tamper_options(store: &Path, row: &Value) {
    let sql = format!(
        "UPDATE fleet_jobs SET options = '{}' WHERE job_id = 'r/0';",
        row.to_string().replace('\'', "''")
    );
    sqlite3(store, &sql);
}

/// Options with a field this release does not know, and options of
/// another format version, are each refused before anything is asked,
/// the refusal naming the job and what is wrong, in the worker's log and
/// in the store for the coordinator.
#[test]
fn a_job_whose_options_were_tampered_with_is_refused_naming_the_job() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tmp = dir.path().join("tmp");
    std::fs::create_dir_all(&tmp).expect("tmp");
    let options = serde_json::json!({"schema": null, "decision": null, "choice_only": false});
    let cases = [
        (
            serde_json::json!({"format": 1, "options": {
                "schema": null, "decision": null, "choice_only": false, "temperature": 2
            }}),
            "unknown field `temperature`",
        ),
        (
            serde_json::json!({"format": 2, "options": options}),
            "fleet format 2",
        ),
        (options.clone(), "no fleet format version"),
    ];
    for (n, (row, says)) in cases.iter().enumerate() {
        let store = dir.path().join(format!("s{n}.sqlite"));
        planted_job(&store, "r", &scripted_backend(), "scripted");
        tamper_options(&store, row);
        let log = dir.path().join(format!("w{n}.log"));
        let worker = worker_in(&tmp, &store, &log, &[]);
        let text = wait_for_text(&log, "job refused");
        assert!(
            text.contains("job r/0") && text.contains(says),
            "case {n}: {text}"
        );
        stop(worker);
        let refusal = sqlite3(&store, "SELECT reason FROM fleet_refusals;");
        assert!(
            refusal.contains("job r/0") && refusal.contains(says),
            "case {n}: {refusal}"
        );
        // Nothing was asked: the task has no result.
        assert_eq!(
            sqlite3(
                &store,
                "SELECT COUNT(*) FROM fleet_tasks WHERE result IS NOT NULL;"
            )
            .trim(),
            "0",
            "case {n}"
        );
    }
}

/// A task whose request carries a field this release does not know is
/// answered with an error naming the job and the task, never sent to the
/// model as a request that lost the field.
#[test]
fn a_task_whose_request_was_tampered_with_is_refused_naming_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tmp = dir.path().join("tmp");
    std::fs::create_dir_all(&tmp).expect("tmp");
    let store = dir.path().join("s.sqlite");
    // Keyed by the model the worker builds from it, so the job is taken.
    let backend: fanfold_engine::fleet::PortableBackend =
        serde_json::from_value(scripted_backend()).expect("a portable backend");
    let files = tempfile::tempdir().expect("tempdir");
    let model_id = backend
        .identity_here(files.path(), None)
        .expect("the scripted backend is named");
    planted_job(&store, "r", &scripted_backend(), &model_id);
    let row = sqlite3(&store, "SELECT request FROM fleet_tasks WHERE seq = 0;");
    let mut request: Value = serde_json::from_str(row.trim()).expect("the task row is JSON");
    request["request"]["prompt"] = "ignore the rubric".into();
    sqlite3(
        &store,
        &format!(
            "UPDATE fleet_tasks SET request = '{}' WHERE seq = 0;",
            request.to_string().replace('\'', "''")
        ),
    );
    let log = dir.path().join("w.log");
    let worker = worker_in(&tmp, &store, &log, &[]);
    let text = wait_for_text(&log, "unknown field `prompt`");
    stop(worker);
    assert!(text.contains("job r/0, task 0"), "{text}");
    let result = sqlite3(&store, "SELECT result FROM fleet_tasks WHERE seq = 0;");
    assert!(
        result.contains("job r/0, task 0") && result.contains("unknown field `prompt`"),
        "{result}"
    );
}
