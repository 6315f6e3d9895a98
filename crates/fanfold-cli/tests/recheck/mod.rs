//! Answers anyone can re-check: `fanfold verify OUT_DIR` driven to fail by
//! every kind of change made after a run, `fanfold why`, and a report of
//! a changed folder.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::{bin, chromium, render, repo, run, sqlite3, stderr, stdout};

/// The triage example run by the scripted judge in a folder of its own
/// (spec, rubric, schema and input copied, so the input can be changed).
struct Ran {
    dir: tempfile::TempDir,
}

impl Ran {
    fn new() -> Ran {
        let ex = repo().join("examples/issue-triage");
        let dir = tempfile::tempdir().unwrap();
        for entry in std::fs::read_dir(&ex).unwrap() {
            let path = entry.unwrap().path();
            if path.is_file() {
                std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
            }
        }
        let r = Ran { dir };
        let o = r.run();
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        r
    }

    fn run(&self) -> std::process::Output {
        run(bin()
            .current_dir(self.dir.path())
            .args(["run", "spec.toml", "--backend", "scripted", "--json"])
            .args(["--store", "store.sqlite", "--out", "out"]))
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn verify(&self) -> (Option<i32>, String) {
        let o = run(bin().arg("verify").arg(self.path("out")));
        (o.status.code(), stdout(&o) + &stderr(&o))
    }

    fn answer(&self) -> Value {
        read_json(&self.path("out/answer.json"))
    }

    /// facts.jsonl, one value a line.
    fn facts(&self) -> Vec<Value> {
        std::fs::read_to_string(self.path("out/facts.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    fn write_facts(&self, facts: &[Value]) {
        let text: String = facts.iter().map(|f| format!("{f}\n")).collect();
        std::fs::write(self.path("out/facts.jsonl"), text).unwrap();
    }

    /// The first positive fact with an evidence quote, and its line.
    fn quoted(&self) -> (usize, Value) {
        self.facts()
            .into_iter()
            .enumerate()
            .find(|(_, f)| {
                f["status"] == "positive" && f["evidence"].as_array().is_some_and(|e| !e.is_empty())
            })
            .expect("a quoted positive fact")
    }
}

fn read_json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

#[test]
fn verify_passes_on_a_finished_run_and_why_tells_a_units_story() {
    let r = Ran::new();
    let (code, text) = r.verify();
    assert_eq!(code, Some(0), "{text}");
    let n = r.answer()["items"].as_array().unwrap().len();
    assert!(text.contains(&format!("{n} cited units")), "{text}");
    let (_, fact) = r.quoted();
    let unit = fact["source_ids"][0].as_str().unwrap().to_owned();
    let o = run(bin().arg("why").arg(r.path("out")).arg(&unit));
    assert!(o.status.success(), "{}", stderr(&o));
    let why = stdout(&o);
    assert!(why.contains("the answer lists it"), "{why}");
    assert!(why.contains("stage `auth_blocker`"), "{why}");
    let quote = fact["evidence"][0]["quote"].as_str().unwrap();
    assert!(why.contains(&format!("{quote:?}")), "{why}");
    assert!(why.contains("folded through"), "{why}");
    // A unit the prefilter excluded is said to be so.
    let facts = r.facts();
    let decided: Vec<&str> = facts
        .iter()
        .map(|f| f["source_ids"][0].as_str().unwrap())
        .collect();
    let excluded = (1..=1000)
        .map(|n| n.to_string())
        .find(|id| !decided.contains(&id.as_str()))
        .unwrap();
    let o = run(bin().arg("why").arg(r.path("out")).arg(&excluded));
    assert!(stdout(&o).contains("no stage decided it"), "{}", stdout(&o));
}

#[test]
fn verify_fails_on_a_source_changed_since_the_run() {
    let r = Ran::new();
    let (_, fact) = r.quoted();
    let unit = fact["source_ids"][0].as_str().unwrap().to_owned();
    let mut issues = read_json(&r.path("issues.json"));
    let issue = issues
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|i| i["number"].as_u64().map(|n| n.to_string()).as_deref() == Some(unit.as_str()))
        .unwrap();
    issue["body"] = Value::String("Rewritten after the run.".into());
    std::fs::write(r.path("issues.json"), issues.to_string()).unwrap();
    let (code, text) = r.verify();
    assert_eq!(code, Some(4), "{text}");
    assert!(text.contains("the source"), "{text}");
    assert!(
        text.contains(&format!("cited unit `{unit}` changed in the source")),
        "{text}"
    );
}

#[test]
fn verify_fails_on_an_edited_quote_or_a_flipped_decision_in_facts_jsonl() {
    let r = Ran::new();
    let (line, fact) = r.quoted();
    let mut facts = r.facts();
    facts[line]["evidence"][0]["quote"] = Value::String("words nobody wrote".into());
    r.write_facts(&facts);
    let (code, text) = r.verify();
    assert_eq!(code, Some(4), "{text}");
    assert!(
        text.contains(&format!("facts.jsonl line {}", line + 1)),
        "{text}"
    );

    // The quote put back, the decision flipped instead.
    let mut facts = r.facts();
    facts[line] = fact.clone();
    r.write_facts(&facts);
    assert_eq!(r.verify().0, Some(0));
    facts[line]["status"] = Value::String("negative".into());
    facts[line]["decision"] = Value::String("not_blocker".into());
    r.write_facts(&facts);
    let (code, text) = r.verify();
    assert_eq!(code, Some(4), "{text}");
    assert!(text.contains("was changed after the run"), "{text}");
}

#[test]
fn a_fact_flipped_in_the_store_is_refused_and_judged_again() {
    let r = Ran::new();
    let before: Vec<Value> = r.answer()["items"].as_array().unwrap().clone();
    let (_, fact) = r.quoted();
    let key = fact["key"].as_str().unwrap();
    sqlite3(
        &r.path("store.sqlite"),
        &format!(
            "UPDATE facts SET record = replace(replace(record, '\"status\":\"positive\"', '\"status\":\"negative\"'), '\"decision\":\"blocker\"', '\"decision\":\"not_blocker\"') WHERE key = '{key}'"
        ),
    );
    let changed = sqlite3(
        &r.path("store.sqlite"),
        &format!(
            "SELECT status, instr(record, '\"status\":\"negative\"') > 0 FROM facts WHERE key = '{key}'"
        ),
    );
    assert!(changed.trim().ends_with("|1"), "{changed}");
    let o = r.run();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let cert = read_json(&r.path("out/certificate.json"));
    assert_eq!(cert["stats"]["corrupt_facts"], 1, "{}", cert["stats"]);
    assert_eq!(cert["stats"]["model_calls"], 1);
    assert_eq!(r.answer()["items"].as_array().unwrap(), &before);
    assert_eq!(r.verify().0, Some(0));
}

#[test]
fn verify_fails_on_an_invented_citation_and_counts_that_do_not_add_up() {
    let r = Ran::new();
    let mut answer = r.answer();
    let mut fake = answer["items"][0].clone();
    fake["unit_id"] = Value::String("99999".into());
    answer["items"].as_array_mut().unwrap().push(fake);
    std::fs::write(r.path("out/answer.json"), answer.to_string()).unwrap();
    let (code, text) = r.verify();
    assert_eq!(code, Some(4), "{text}");
    assert!(
        text.contains("cited unit `99999` is not in the source"),
        "{text}"
    );

    // A report of the changed folder says so where a reader looks first,
    // and in its exit code.
    let o = run(bin().arg("report").arg("run").arg(r.path("out")));
    assert_eq!(o.status.code(), Some(4), "{}", stderr(&o));
    let md = std::fs::read_to_string(r.path("out/report.md")).unwrap();
    assert!(md.contains("**NOT VERIFIED"), "{md}");
    let (dom, _) = render(&chromium(), &r.path("out/report.html"));
    let banner = dom
        .split("id=\"changed\"")
        .nth(1)
        .expect("the page shows the changed-folder banner");
    assert!(banner.contains("NOT VERIFIED"), "{banner}");
    assert!(banner.contains("99999"), "{banner}");
    assert!(
        !dom.contains("verify passed"),
        "a changed folder is never shown as verified"
    );

    // The answer put back; the certificate's counts edited.
    let mut answer = r.answer();
    answer["items"].as_array_mut().unwrap().pop();
    std::fs::write(r.path("out/answer.json"), answer.to_string()).unwrap();
    assert_eq!(r.verify().0, Some(0));
    let mut cert = read_json(&r.path("out/certificate.json"));
    cert["statuses"]["positive"] = Value::from(cert["statuses"]["positive"].as_u64().unwrap() + 1);
    std::fs::write(r.path("out/certificate.json"), cert.to_string()).unwrap();
    let (code, text) = r.verify();
    assert_eq!(code, Some(4), "{text}");
    assert!(text.contains("facts by status"), "{text}");
}
