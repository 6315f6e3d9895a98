//! What a new user meets: `fanfold new` and `fanfold ask` from a question
//! and a file fanfold has never seen, in each shape it reads, run on the
//! scripted and the embedded backends.

use std::path::Path;

use serde_json::Value;

use super::{bin, run, stderr, stdout};

const QUESTION: &str = "Which messages report a failed payment?";

/// The same six messages in each shape; two report a failed payment.
fn write_inputs(dir: &Path) -> Vec<(&'static str, std::path::PathBuf)> {
    let rows = [
        (
            1,
            "Invoice 2231",
            "The card payment failed twice this morning.",
        ),
        (2, "Lunch", "Are we still on for Thursday?"),
        (3, "Refund", "Please confirm the refund was sent."),
        (
            4,
            "Card declined",
            "My payment failed at checkout with error 51.",
        ),
        (5, "Newsletter", "Our spring collection is here."),
        (
            6,
            "Meeting notes",
            "Notes from the planning meeting attached.",
        ),
    ];
    let objects: Vec<Value> = rows
        .iter()
        .map(|(id, subject, body)| serde_json::json!({"id": id, "subject": subject, "body": body}))
        .collect();
    let array = dir.join("messages.json");
    std::fs::write(&array, serde_json::to_string_pretty(&objects).unwrap()).unwrap();
    let jsonl = dir.join("messages.jsonl");
    let text: String = objects.iter().map(|o| format!("{o}\n")).collect();
    std::fs::write(&jsonl, text).unwrap();
    let csv = dir.join("messages.csv");
    let mut text = "id,subject,body\n".to_owned();
    for (id, subject, body) in rows {
        text.push_str(&format!("{id},{subject},\"{body}\"\n"));
    }
    std::fs::write(&csv, text).unwrap();
    let log = dir.join("messages.log");
    let text: String = rows
        .iter()
        .map(|(id, subject, body)| format!("2026-12-0{id} 10:00:00 INFO mail {subject}: {body}\n"))
        .collect();
    std::fs::write(&log, text).unwrap();
    let folder = dir.join("messages");
    std::fs::create_dir(&folder).unwrap();
    for (id, subject, body) in rows {
        std::fs::write(
            folder.join(format!("{id}.txt")),
            format!("{subject}\n\n{body}\n"),
        )
        .unwrap();
    }
    vec![
        ("json_array", array),
        ("jsonl", jsonl),
        ("csv", csv),
        ("lines", log),
        ("files", folder),
    ]
}

fn answer(dir: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(dir.join("answer.json")).unwrap()).unwrap()
}

#[test]
fn new_writes_a_spec_that_explains_and_runs_for_each_shape_of_input() {
    let tmp = tempfile::tempdir().unwrap();
    for (shape, input) in write_inputs(tmp.path()) {
        let dir = tmp.path().join(format!("spec-{shape}"));
        let o = run(bin()
            .arg("new")
            .arg(&dir)
            .args(["--question", QUESTION])
            .arg("--input")
            .arg(&input));
        assert!(o.status.success(), "{shape}: {}", stderr(&o));
        let said = stdout(&o);
        // The explain that follows read the input: six units, none rejected.
        assert!(said.contains("6 units, 0 rejected"), "{shape}: {said}");
        let spec = std::fs::read_to_string(dir.join("spec.toml")).unwrap();
        assert!(
            spec.contains(&format!("type = \"{shape}\"")),
            "{shape}: {spec}"
        );
        if !matches!(shape, "lines" | "files") {
            assert!(spec.contains("key = \"id\""), "{shape}: {spec}");
        }
        // A spec folder is not overwritten.
        let again = run(bin()
            .arg("new")
            .arg(&dir)
            .args(["--question", QUESTION])
            .arg("--input")
            .arg(&input));
        assert!(!again.status.success(), "{shape}");
        // It runs, on the keyword judge: the two failed payments.
        let out = dir.join("out");
        let o = run(bin()
            .arg("run")
            .arg(dir.join("spec.toml"))
            .args(["--backend", "scripted", "--json"])
            .arg("--store")
            .arg(dir.join("store.sqlite"))
            .arg("--out")
            .arg(&out));
        assert_eq!(o.status.code(), Some(0), "{shape}: {}", stderr(&o));
        let a = answer(&out);
        assert_eq!(a["items"].as_array().unwrap().len(), 2, "{shape}: {a}");
        let v = run(bin().arg("verify").arg(&out));
        assert_eq!(v.status.code(), Some(0), "{shape}: {}", stdout(&v));
    }
    // A folder with no files is refused, saying so.
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let o = run(bin()
        .arg("new")
        .arg(tmp.path().join("spec-empty"))
        .args(["--question", QUESTION])
        .arg("--input")
        .arg(&empty));
    assert!(!o.status.success());
    assert!(stderr(&o).contains("holds no files"), "{}", stderr(&o));
}

const MAIL_QUESTION: &str = "Which messages report a production incident first-hand?";

/// `fanfold ask` over the example folder of e-mails, on `backend`.
fn ask_mail(tmp: &Path, backend: &str) -> (std::process::Output, std::path::PathBuf) {
    let mail = super::repo().join("examples/mailbox/mail");
    let o = run(bin()
        .current_dir(tmp)
        .args(["ask", MAIL_QUESTION, "--backend", backend, "--input"])
        .arg(&mail));
    let out = tmp.join(".fanfold/ask/which-messages-report-a-production-incident/out");
    (o, out)
}

#[test]
fn a_folder_of_emails_is_answered_in_one_command_with_sender_and_subject() {
    let tmp = tempfile::tempdir().unwrap();
    let (o, out) = ask_mail(tmp.path(), "scripted");
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let spec = std::fs::read_to_string(out.join("../spec.toml")).unwrap();
    assert!(spec.contains("type = \"email\""), "{spec}");
    let a = answer(&out);
    let items = a["items"].as_array().unwrap();
    assert!(!items.is_empty(), "{a}");
    let md = std::fs::read_to_string(out.join("answer.md")).unwrap();
    // Each item is titled by its subject and shows its sender, read from
    // the message's headers, never from a model.
    let mail = super::repo().join("examples/mailbox/mail");
    for item in items {
        let id = item["unit_id"].as_str().unwrap();
        let raw = std::fs::read_to_string(mail.join(id)).unwrap();
        let header = |name: &str| {
            raw.lines()
                .find_map(|l| l.strip_prefix(name))
                .map(str::trim)
                .unwrap()
                .to_owned()
        };
        assert_eq!(item["title"], header("Subject:"), "{item}");
        let from = header("From:");
        let (name, address) = from.split_once(" <").unwrap();
        let shown = format!("from: {name} \\<{}", address.trim_end_matches('>'));
        let at = md.find(&format!("#{id} {}", header("Subject:"))).expect(id);
        let block = &md[at..];
        let block = &block[..block.find("\n- #").unwrap_or(block.len())];
        assert!(block.contains(&shown), "{shown} not in {block}");
    }
    // The answer re-checks against the folder; an edited message fails it.
    let v = run(bin().arg("verify").arg(&out));
    assert_eq!(v.status.code(), Some(0), "{}", stdout(&v));
    let copy = tmp.path().join("mail");
    std::fs::create_dir(&copy).unwrap();
    for entry in std::fs::read_dir(&mail).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), copy.join(entry.file_name())).unwrap();
    }
    let cited = items[0]["unit_id"].as_str().unwrap();
    let text = std::fs::read_to_string(copy.join(cited)).unwrap();
    std::fs::write(copy.join(cited), format!("{text}Edited since.\n")).unwrap();
    let v = run(bin().arg("verify").arg(&out).arg("--input").arg(&copy));
    assert_eq!(v.status.code(), Some(4), "{}", stdout(&v));
    assert!(stdout(&v).contains(cited), "{}", stdout(&v));
    // `why` tells one message's story.
    let w = run(bin().arg("why").arg(&out).arg(cited));
    assert_eq!(w.status.code(), Some(0), "{}", stderr(&w));
    assert!(stdout(&w).contains("the answer lists it"), "{}", stdout(&w));
}

#[test]
fn embedded_ask_answers_a_folder_of_emails_quoting_bodies_not_headers() {
    let tmp = tempfile::tempdir().unwrap();
    let (o, out) = ask_mail(tmp.path(), "default");
    assert!(
        matches!(o.status.code(), Some(0) | Some(3)),
        "{}",
        stderr(&o)
    );
    let cert: Value =
        serde_json::from_slice(&std::fs::read(out.join("certificate.json")).unwrap()).unwrap();
    assert_eq!(cert["coverage"]["units"], 24, "{}", cert["coverage"]);
    assert_eq!(cert["simulated"], false);
    assert_eq!(cert["verify"]["passed"], true, "{}", cert["verify"]);
    // Whatever the small model decided, what it quotes is the body: the
    // field named, and the words found in the message below its headers.
    let mail = super::repo().join("examples/mailbox/mail");
    let facts = std::fs::read_to_string(out.join("facts.jsonl")).unwrap();
    let mut quotes = 0;
    for line in facts.lines() {
        let f: Value = serde_json::from_str(line).unwrap();
        for e in f["evidence"].as_array().into_iter().flatten() {
            assert_eq!(e["field"], "body", "{e}");
            let id = f["source_ids"][0].as_str().unwrap();
            let raw = std::fs::read_to_string(mail.join(id)).unwrap();
            let (_, body) = raw.split_once("\n\n").unwrap();
            let quote = e["quote"].as_str().unwrap();
            let words = |t: &str| t.split_whitespace().collect::<Vec<_>>().join(" ");
            assert!(words(body).contains(&words(quote)), "{id}: {quote}");
            quotes += 1;
        }
    }
    assert!(quotes >= 1, "no quote in {facts}");
    let a = answer(&out);
    let items = a["items"].as_array().unwrap();
    assert!(!items.is_empty(), "no item in {a}");
    for item in items {
        assert!(
            item["title"].as_str().is_some_and(|t| !t.is_empty()),
            "{item}"
        );
        assert!(
            item["shown"].as_array().is_some_and(|s| s[0][0] == "from"),
            "{item}"
        );
    }
    eprintln!("{quotes} quotes, all from bodies");
}

#[test]
fn ask_answers_in_one_command_and_says_where_its_spec_is() {
    let tmp = tempfile::tempdir().unwrap();
    let inputs = write_inputs(tmp.path());
    let (_, jsonl) = &inputs[1];
    let o = run(bin()
        .current_dir(tmp.path())
        .args(["ask", QUESTION, "--backend", "scripted", "--input"])
        .arg(jsonl));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let dir = tmp
        .path()
        .join(".fanfold/ask/which-messages-report-a-failed-payment");
    assert!(
        stderr(&o).contains("the spec is in .fanfold/ask/which-messages-report-a-failed-payment"),
        "{}",
        stderr(&o)
    );
    let a = answer(&dir.join("out"));
    let ids: Vec<&str> = a["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["unit_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["1", "4"]);
    // Asked again, it writes a folder of its own beside the first.
    let o = run(bin()
        .current_dir(tmp.path())
        .args(["ask", QUESTION, "--backend", "scripted", "--input"])
        .arg(jsonl));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        tmp.path()
            .join(".fanfold/ask/which-messages-report-a-failed-payment-2/spec.toml")
            .exists()
    );
}

#[test]
fn embedded_ask_runs_a_new_spec_on_the_embedded_model_for_each_shape() {
    let tmp = tempfile::tempdir().unwrap();
    for (shape, input) in write_inputs(tmp.path()) {
        let dir = tmp.path().join(format!("ask-{shape}"));
        let o = run(bin()
            .args(["ask", QUESTION, "--input"])
            .arg(&input)
            .arg("--dir")
            .arg(&dir));
        // What the 135M model says is not checked; that every message was
        // judged and accounted for, and the answer verified, is.
        assert!(
            matches!(o.status.code(), Some(0) | Some(3)),
            "{shape}: {}",
            stderr(&o)
        );
        let cert: Value =
            serde_json::from_slice(&std::fs::read(dir.join("out/certificate.json")).unwrap())
                .unwrap();
        let s = &cert["statuses"];
        let total: u64 = [
            "positive",
            "negative",
            "abstain",
            "error",
            "cancelled",
            "not_run",
        ]
        .iter()
        .map(|k| s[*k].as_u64().unwrap())
        .sum();
        assert_eq!(total, 6, "{shape}: {s}");
        // Each message the first rung kept was judged by the model.
        let facts = std::fs::read_to_string(dir.join("out/facts.jsonl")).unwrap();
        let judged = facts
            .lines()
            .filter(|l| l.contains("\"stage\":\"judge\""))
            .count() as u64;
        assert!(judged >= 1, "{shape}: {facts}");
        assert!(
            cert["stats"]["model_calls"].as_u64().unwrap() >= judged,
            "{shape}"
        );
        assert_eq!(cert["simulated"], false, "{shape}");
        assert_eq!(
            cert["verify"]["passed"], true,
            "{shape}: {}",
            cert["verify"]
        );
    }
}

#[test]
fn the_mailbox_report_shows_each_messages_sender_in_a_browser() {
    let browser = super::chromium();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    let o = run(bin()
        .arg("run")
        .arg(super::repo().join("examples/mailbox/spec.toml"))
        .args(["--backend", "scripted"])
        .arg("--store")
        .arg(tmp.path().join("store.sqlite"))
        .arg("--out")
        .arg(&out));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = run(bin().arg("report").arg("run").arg(&out));
    assert!(o.status.success(), "{}", stderr(&o));
    let (dom, _) = super::render(&browser, &out.join("report.html"));
    let a = answer(&out);
    let items = a["items"].as_array().unwrap();
    assert!(!items.is_empty());
    for item in items {
        let from = item["shown"][0][1].as_str().unwrap();
        let escaped = from.replace('<', "&lt;").replace('>', "&gt;");
        assert!(
            dom.contains(&format!("<span class=\"meta\">from:</span> {escaped}")),
            "the page does not show the sender {from}"
        );
        assert!(dom.contains(item["title"].as_str().unwrap()));
    }
}

/// `fanfold spec-schema | head` closes the pipe early: the command ends
/// quietly with a closed pipe's status, not a panic.
#[test]
fn a_reader_that_stops_early_gets_no_panic() {
    use std::io::Read;
    let mut child = bin()
        .arg("spec-schema")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 16];
    child.stdout.take().unwrap().read_exact(&mut first).unwrap();
    // The read end is closed here, long before the schema is written.
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(o.status.code(), Some(141), "{err}");
}

/// A folder given to a record format, or a stream given to a document
/// format, is refused with what reads it.
#[test]
fn folders_and_streams_go_to_the_partitions_that_read_them() {
    let tmp = tempfile::tempdir().unwrap();
    let inputs = write_inputs(tmp.path());
    let (_, jsonl) = &inputs[1];
    let dir = tmp.path().join("spec");
    let o = run(bin()
        .arg("new")
        .arg(&dir)
        .args(["--question", QUESTION])
        .arg("--input")
        .arg(jsonl));
    assert!(o.status.success(), "{}", stderr(&o));
    let o = run(bin()
        .arg("run")
        .arg(dir.join("spec.toml"))
        .args(["--backend", "scripted", "--input"])
        .arg(tmp.path().join("messages"))
        .arg("--store")
        .arg(tmp.path().join("s.sqlite")));
    // An input error: exit 5.
    assert_eq!(o.status.code(), Some(5), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("is a folder") && stderr(&o).contains("type = \"files\""),
        "{}",
        stderr(&o)
    );
    let mail = super::repo().join("examples/mailbox/spec.toml");
    let o = run(bin()
        .arg("run")
        .arg(&mail)
        .args(["--backend", "scripted", "--input", "-"])
        .arg("--store")
        .arg(tmp.path().join("s.sqlite")));
    // An input error: exit 5.
    assert_eq!(o.status.code(), Some(5), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("the `email` partition reads a file or a folder"),
        "{}",
        stderr(&o)
    );
}

/// A file of the folder that cannot be read is named in answer.md, with
/// why, and the answer says it is incomplete.
#[test]
fn a_folder_file_that_cannot_be_read_is_named_in_the_answer() {
    let tmp = tempfile::tempdir().unwrap();
    let mail = super::repo().join("examples/mailbox/mail");
    let copy = tmp.path().join("mail");
    std::fs::create_dir(&copy).unwrap();
    for entry in std::fs::read_dir(&mail).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), copy.join(entry.file_name())).unwrap();
    }
    std::fs::write(copy.join("logo.png"), b"\x89PNG\r\n\x1a\n\x00\x00\x00").unwrap();
    let out = tmp.path().join("out");
    let o = run(bin()
        .arg("run")
        .arg(super::repo().join("examples/mailbox/spec.toml"))
        .args(["--backend", "scripted", "--input"])
        .arg(&copy)
        .arg("--store")
        .arg(tmp.path().join("s.sqlite"))
        .arg("--out")
        .arg(&out));
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let md = std::fs::read_to_string(out.join("answer.md")).unwrap();
    assert!(md.contains("## Not read: 1 elements"), "{md}");
    assert!(
        md.contains("binary: element 24: file logo.png: a binary file"),
        "{md}"
    );
    assert!(md.contains("This answer is incomplete"), "{md}");
}
