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
    // The file the spec names no longer hashes as the run read it: it is
    // not taken for the run's source.
    let (code, text) = r.verify();
    assert_eq!(code, Some(4), "{text}");
    assert!(
        text.contains("could not re-read the source") && text.contains("changed since the run"),
        "{text}"
    );
    // Given as the source, it is read, and the edited unit named.
    let o = run(bin()
        .arg("verify")
        .arg(r.path("out"))
        .arg("--input")
        .arg(r.path("issues.json")));
    let text = stdout(&o);
    assert_eq!(o.status.code(), Some(4), "{text}");
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

/// The triage example's files copied into a folder of its own, its spec
/// edited by `edit`, not yet run.
fn triage_copy(edit: impl Fn(String) -> String) -> tempfile::TempDir {
    let ex = repo().join("examples/issue-triage");
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(&ex).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
        }
    }
    let spec = dir.path().join("spec.toml");
    let text = std::fs::read_to_string(&spec).unwrap();
    std::fs::write(&spec, edit(text)).unwrap();
    dir
}

fn scripted_run(dir: &Path, out: &str, extra: &[&str]) -> std::process::Output {
    run(bin()
        .current_dir(dir)
        .args(["run", "spec.toml", "--backend", "scripted", "--json"])
        .args(["--store", "store.sqlite", "--out", out])
        .args(extra))
}

#[test]
fn verify_why_and_report_never_run_the_command_a_certificate_names() {
    let marker_dir = tempfile::tempdir().unwrap();
    let marker = marker_dir.path().join("MARKER");
    let dir = triage_copy(|spec| {
        let issues = "issues.json";
        spec.replacen(
            &format!("path = \"{issues}\""),
            &format!(
                "command = [\"sh\", \"-c\", \"touch '{}' && cat {issues}\"]",
                marker.display()
            ),
            1,
        )
    });
    let o = scripted_run(dir.path(), "out", &[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        marker.exists(),
        "the run itself reads its input by the command"
    );
    std::fs::remove_file(&marker).unwrap();
    let out = dir.path().join("out");
    let facts = std::fs::read_to_string(out.join("facts.jsonl")).unwrap();
    let first: Value = serde_json::from_str(facts.lines().next().unwrap()).unwrap();
    let unit = first["source_ids"][0].as_str().unwrap().to_owned();

    let o = run(bin().current_dir(dir.path()).arg("verify").arg(&out));
    let text = stdout(&o) + &stderr(&o);
    assert_eq!(o.status.code(), Some(4), "{text}");
    assert!(text.contains("could not re-read the source"), "{text}");
    assert!(text.contains("never runs"), "{text}");
    assert!(!text.contains("passed"), "{text}");
    assert!(!marker.exists(), "verify ran the certificate's command");

    let o = run(bin()
        .current_dir(dir.path())
        .arg("why")
        .arg(&out)
        .arg(&unit));
    assert_eq!(o.status.code(), Some(4), "{}", stdout(&o));
    assert!(
        stdout(&o).contains("not read back from the source"),
        "{}",
        stdout(&o)
    );
    assert!(!marker.exists(), "why ran the certificate's command");

    let o = run(bin()
        .current_dir(dir.path())
        .args(["report", "run"])
        .arg(&out));
    assert_eq!(o.status.code(), Some(4), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("could not re-read the source"),
        "{}",
        stderr(&o)
    );
    assert!(!marker.exists(), "report ran the certificate's command");

    // Given the bytes the command printed, it re-checks them.
    let o = run(bin()
        .current_dir(dir.path())
        .arg("verify")
        .arg(&out)
        .arg("--input")
        .arg(dir.path().join("issues.json")));
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    assert!(!marker.exists());
}

#[test]
fn verify_fails_on_a_unit_deleted_consistently_from_the_folder() {
    let r = Ran::new();
    // The same spec run over the issues less one it judged: a folder
    // consistent in itself, its certificate then given the full source's
    // hash and coverage, as if that unit never was.
    let facts = r.facts();
    let gone = facts
        .iter()
        .find(|f| f["status"] == "negative")
        .expect("a negative fact")["source_ids"][0]
        .as_str()
        .unwrap()
        .to_owned();
    let mut issues = read_json(&r.path("issues.json"));
    issues
        .as_array_mut()
        .unwrap()
        .retain(|i| i["number"].as_u64().map(|n| n.to_string()).as_deref() != Some(gone.as_str()));
    std::fs::write(r.path("fewer.json"), issues.to_string()).unwrap();
    let o = scripted_run(r.dir.path(), "fewer", &["--input", "fewer.json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let full = read_json(&r.path("out/certificate.json"));
    let mut cert = read_json(&r.path("fewer/certificate.json"));
    for k in ["source_hash", "source_bytes", "source_origin", "coverage"] {
        cert[k] = full[k].clone();
    }
    std::fs::write(r.path("fewer/certificate.json"), cert.to_string()).unwrap();
    let o = run(bin()
        .current_dir(r.dir.path())
        .arg("verify")
        .arg(r.path("fewer")));
    let text = stdout(&o);
    assert_eq!(o.status.code(), Some(4), "{text}");
    assert!(
        text.contains("1 units the source routes to a stage have no fact")
            && text.contains(&format!("`{gone}`")),
        "{text}"
    );
}

#[test]
fn verify_fails_on_a_sealed_fact_spliced_in_from_another_run() {
    let r = Ran::new();
    // Another run of the spec, its rubric worded otherwise: the scripted
    // judge decides the same, so only the fact's making differs.
    let rubric = std::fs::read_to_string(r.path("rubric.md")).unwrap();
    std::fs::write(r.path("rubric.md"), format!("{rubric}\nBe brief.\n")).unwrap();
    let o = scripted_run(r.dir.path(), "other", &[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    std::fs::write(r.path("rubric.md"), rubric).unwrap();
    let (line, fact) = r.quoted();
    let other: Vec<Value> = std::fs::read_to_string(r.path("other/facts.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let spliced = other
        .into_iter()
        .find(|f| f["source_ids"] == fact["source_ids"] && f["stage"] == fact["stage"])
        .expect("the other run's fact of the unit");
    assert_ne!(spliced["key"], fact["key"]);
    assert_eq!(spliced["status"], fact["status"]);
    let mut facts = r.facts();
    facts[line] = spliced;
    r.write_facts(&facts);
    let (code, text) = r.verify();
    assert_eq!(code, Some(4), "{text}");
    assert!(
        text.contains(&format!("facts.jsonl line {}", line + 1)) && text.contains("another rubric"),
        "{text}"
    );
}

#[test]
fn verify_fails_on_a_changed_question() {
    let r = Ran::new();
    for file in ["out/certificate.json", "out/answer.json"] {
        let mut v = read_json(&r.path(file));
        v["question"] = Value::String("Which issues are the easiest to close?".into());
        std::fs::write(r.path(file), v.to_string()).unwrap();
    }
    let (code, text) = r.verify();
    assert_eq!(code, Some(4), "{text}");
    assert!(
        text.contains("the certificate states the question")
            && text.contains("answer.json states the question"),
        "{text}"
    );
}

/// 20,000 sections under one heading and 20,000 messages of one
/// Message-ID: each numbered in one pass, and the run's read-back and
/// `verify` split each document once, not once a unit.
#[test]
fn slow_twenty_thousand_repeated_ids_are_numbered_and_verified() {
    const N: usize = 20_000;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir(d.join("notes")).unwrap();
    let doc: String = "## Notes\n\nI saw the outage myself.\n\n".repeat(N);
    std::fs::write(d.join("notes/notes.md"), doc).unwrap();
    std::fs::write(d.join("rubric.md"), "Is this a first-hand report?\n").unwrap();
    std::fs::write(
        d.join("fact.schema.json"),
        r#"{"type": "object", "required": ["decision", "evidence"], "properties": {
            "decision": {"enum": ["first_hand", "unrelated"]},
            "evidence": {"type": "array", "items": {"type": "object",
              "required": ["field", "quote"],
              "properties": {"field": {"enum": ["text"]}, "quote": {"type": "string"}}}}}}"#,
    )
    .unwrap();
    std::fs::write(
        d.join("judge.jq"),
        r#"{decision: "first_hand", evidence: [{field: "text", quote: "I saw the outage myself."}]}"#,
    )
    .unwrap();
    std::fs::write(
        d.join("spec.toml"),
        r#"name = "notes"
question = "Which notes report an outage first-hand?"

[input]
path = "notes"
partition = { type = "markdown" }

[[stages]]
name = "judge"
type = "map"
version = 1
rubric = "rubric.md"
output_schema = "fact.schema.json"
fields = ["text"]
decision = { pointer = "/decision", positive = ["first_hand"], negative = ["unrelated"] }
evidence = "/evidence"
backend = "scripted"

[backends.scripted]
type = "scripted"
script = "judge.jq"

[[fold.reducers]]
name = "reports"
type = "set"

[contract]
type = "exhaustive"
answer = "reports"
"#,
    )
    .unwrap();
    let o = run(bin().current_dir(d).args([
        "run",
        "spec.toml",
        "--json",
        "--store",
        "store.sqlite",
        "--out",
        "out",
    ]));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let answer = read_json(&d.join("out/answer.json"));
    let items = answer["items"].as_array().unwrap();
    assert_eq!(items.len(), N);
    assert!(
        items
            .iter()
            .any(|i| i["unit_id"] == format!("notes.md#Notes-{N}")),
        "the last repeat is numbered {N}"
    );
    let o = run(bin().arg("verify").arg(d.join("out")));
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    assert!(
        stdout(&o).contains(&format!("{N} cited units")),
        "{}",
        stdout(&o)
    );

    // An mbox whose messages all carry one Message-ID.
    let message = "From ops@example.org Mon Jan  1 00:00:00 2024\nFrom: ops@example.org\nTo: team@example.org\nSubject: DB down\nMessage-ID: <same@example.org>\n\nI was paged for the database.\n\n";
    std::fs::write(d.join("box.mbox"), message.repeat(N)).unwrap();
    let mailbox = repo().join("examples/mailbox/spec.toml");
    let o = run(bin()
        .current_dir(d)
        .arg("run")
        .arg(&mailbox)
        .args(["--backend", "scripted", "--json", "--input", "box.mbox"])
        .args(["--store", "mail.sqlite", "--out", "mail"]));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let answer = read_json(&d.join("mail/answer.json"));
    assert_eq!(answer["items"].as_array().unwrap().len(), N);
    let o = run(bin()
        .arg("verify")
        .arg(d.join("mail"))
        .arg("--input")
        .arg(d.join("box.mbox")));
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
}

#[test]
fn verify_passes_on_a_run_whose_select_records_who_decided() {
    let dir = triage_copy(|spec| spec);
    let o = run(bin()
        .current_dir(dir.path())
        .args(["run", "select.toml", "--backend", "scripted"])
        .args(["--store", "store.sqlite", "--out", "out"]));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let facts = std::fs::read_to_string(dir.path().join("out/facts.jsonl")).unwrap();
    assert!(
        facts
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .any(|f| f["model"]["backend"] == "select"),
        "the select decided some unit itself"
    );
    let o = run(bin().arg("verify").arg(dir.path().join("out")));
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
}

/// A received spec's `[env] read` names variables of the sender's choice:
/// re-checking it on another host gives its programs none of them.
#[test]
fn verify_gives_a_received_specs_programs_none_of_the_readers_environment() {
    let var = "FANFOLD_TEST_RECHECK_SECRET";
    let dir = triage_copy(|spec| {
        spec.replacen(
            "when = '.state != \"OPEN\"'",
            &format!(
                "when = 'if (env.{var} // null) != null then error(\"LEAK:\" + env.{var}) else .state != \"OPEN\" end'"
            ),
            1,
        ) + &format!("\n[env]\nread = [\"{var}\"]\n")
    });
    let o = run(bin()
        .current_dir(dir.path())
        .env_remove(var)
        .args(["run", "spec.toml", "--backend", "scripted", "--json"])
        .args(["--store", "store.sqlite", "--out", "out"]));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = dir.path().join("out");
    for args in [&["verify"][..], &["report", "run"]] {
        let o = run(bin()
            .current_dir(dir.path())
            .env(var, "reader-secret-4711")
            .args(args)
            .arg(&out));
        let mut text = stdout(&o) + &stderr(&o);
        for page in ["report.md", "report.html"] {
            text += &std::fs::read_to_string(out.join(page)).unwrap_or_default();
        }
        assert!(!text.contains("reader-secret-4711"), "{args:?}: {text}");
        assert_eq!(o.status.code(), Some(0), "{args:?}: {text}");
    }
}

/// The file a certificate's spec names is read again only when it is a
/// regular file (or a folder): a FIFO in its place is named, not waited on.
#[test]
fn verify_names_a_fifo_where_the_source_was_and_never_waits_on_it() {
    let dir = triage_copy(|spec| spec);
    let o = scripted_run(dir.path(), "out", &[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let source = dir.path().join("issues.json");
    std::fs::remove_file(&source).unwrap();
    let made = std::process::Command::new("mkfifo")
        .arg(&source)
        .status()
        .expect("mkfifo");
    assert!(made.success());
    let mut child = bin()
        .current_dir(dir.path())
        .arg("verify")
        .arg(dir.path().join("out"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while child.try_wait().expect("wait").is_none() {
        if std::time::Instant::now() > deadline {
            child.kill().expect("kill");
            panic!("verify waited on the FIFO");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let o = child.wait_with_output().expect("output");
    let text = stdout(&o) + &stderr(&o);
    assert_eq!(o.status.code(), Some(4), "{text}");
    assert!(text.contains("not a regular file or folder"), "{text}");
}
