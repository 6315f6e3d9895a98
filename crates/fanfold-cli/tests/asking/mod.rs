//! `fanfold ask` and `run` on inputs of some size: the cheap first rung a
//! question gets, and what a long run says before and while it works.

use std::io::BufRead as _;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use super::*;

/// The question of a mailbox where a few messages name one of four code
/// names, asked as a person would.
const CODE_NAME_QUESTION: &str = "Which e-mails refer first-hand to one of (Raptor, Condor, Jedi, Kestrel), and who sent each with what subject?";

/// Messages that name a code name: subject, body. Cases, plurals and
/// possessives vary, as in real mail.
const NAMING: [(&str, &str); 12] = [
    (
        "Raptor III unwind",
        "I signed the Raptor III unwind this morning; the hedge is closed as of 09:40.",
    ),
    (
        "Re: quarter-end numbers",
        "The Raptors still carry the merchant positions. I checked the collars myself.",
    ),
    (
        "Call with the auditors",
        "They asked twice about RAPTOR capacity. I walked them through the credit reserve.",
    ),
    (
        "Condor structure",
        "Condor closes Friday. I drafted the share trust terms with legal today.",
    ),
    (
        "FW: board slides",
        "Forwarding what I heard in the hallway about condor; I was not in the meeting.",
    ),
    (
        "Condor's notes",
        "Attached are Condor's notes from the bank. Please do not circulate.",
    ),
    (
        "JEDI II capital call",
        "I wired the JEDI II capital call at noon; confirmation attached.",
    ),
    (
        "Jedi partnership",
        "The Jedi partnership valuation came back lower than I expected.",
    ),
    (
        "Lunch and Jedi",
        "Over lunch Mark said the Jedi deal might be restated. Second-hand, but worth knowing.",
    ),
    (
        "Kestrel timeline",
        "Kestrel signs next week. I reviewed the term sheet line by line.",
    ),
    (
        "Re: Kestrel",
        "I spoke with the Kestrel counterparty and they want an extension.",
    ),
    (
        "Status",
        "Quick update: kestrel is on hold until the ratings call. I am on it.",
    ),
];

/// Ordinary mail. Bodies use the question's common words (e-mails,
/// refer, first, hand, sent, subject) and words that only contain a code
/// name (Jedidiah, condominium, raptorial), none of which names one.
const ORDINARY: [(&str, &str); 12] = [
    (
        "Lunch on Friday",
        "Are we still on for lunch on Friday? Jedidiah is buying this time.",
    ),
    (
        "Q3 budget review",
        "Please refer to the e-mails I sent last week about the Q3 budget review.",
    ),
    (
        "Parking permits",
        "New parking permits are at the front desk; hand in the old ones first.",
    ),
    (
        "Team offsite",
        "A first-hand account of the offsite: good food, long talks, little sleep.",
    ),
    (
        "Expense report",
        "Your expense report is missing the receipts for the condominium rental.",
    ),
    (
        "IT maintenance window",
        "Mail will be down Saturday from 02:00 to 04:00 for maintenance.",
    ),
    (
        "Holiday party",
        "The holiday party is on the 14th. Please reply with the subject line RSVP.",
    ),
    (
        "Training: spreadsheets",
        "The spreadsheet training is full; the next session is in March.",
    ),
    (
        "Travel itinerary",
        "Your flight to Houston leaves at 07:15; the hotel is confirmed.",
    ),
    (
        "Gas desk schedule",
        "Who covers the gas desk on Monday? I can take the first shift.",
    ),
    (
        "Bird walk",
        "The raptorial birds at the reserve were out in force on Sunday.",
    ),
    (
        "Fantasy football",
        "Week 9 standings attached. Second place is still in reach.",
    ),
];

const PEOPLE: [&str; 6] = [
    "Ana Silva",
    "Ben Okafor",
    "Chloe Martin",
    "Dev Patel",
    "Eva Novak",
    "Finn Walsh",
];

/// A folder of `total` messages, one `.eml` file each, of which those
/// [`NAMING`] a code name are spread through it; returns the file names
/// of the ones that name one.
fn write_mailbox(dir: &Path, total: usize) -> Vec<String> {
    assert!(total >= NAMING.len() * 2);
    std::fs::create_dir_all(dir).unwrap();
    let every = total / NAMING.len();
    let mut naming = Vec::new();
    for i in 0..total {
        let name = format!("{:04}.eml", i + 1);
        let (subject, body) = if i % every == every / 2 && i / every < NAMING.len() {
            naming.push(name.clone());
            NAMING[i / every]
        } else {
            ORDINARY[i % ORDINARY.len()]
        };
        let person = PEOPLE[i % PEOPLE.len()];
        let address = person.to_lowercase().replace(' ', ".");
        let text = format!(
            "From: {person} <{address}@example.org>\nTo: desk@example.org\nSubject: {subject}\nDate: Mon, {:02} Oct 2001 09:{:02}:00 -0500\nMessage-ID: <{i}@example.org>\n\n{body}\n\n{person}\n",
            1 + i % 28,
            i % 60
        );
        std::fs::write(dir.join(&name), text).unwrap();
    }
    assert_eq!(naming.len(), NAMING.len());
    naming
}

/// `fanfold ask` over a mailbox of 120 messages, twelve of which name one
/// of the question's four code names: its first rung, on by default, is a
/// keyword rule of the code names (not of the question's common words);
/// the spec says how many messages it keeps; `explain` shows it; and the
/// model is called for those twelve only.
#[test]
fn ask_keeps_only_the_mail_naming_the_code_names_and_calls_the_model_for_those() {
    let tmp = tempfile::tempdir().unwrap();
    let mail = tmp.path().join("mail");
    let naming = write_mailbox(&mail, 120);
    let dir = tmp.path().join("ask");
    let o = run(bin()
        .args([
            "ask",
            CODE_NAME_QUESTION,
            "--backend",
            "scripted",
            "--input",
        ])
        .arg(&mail)
        .arg("--dir")
        .arg(&dir));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let said = stderr(&o);
    assert!(
        said.contains("keeps the units that name Raptor, Condor, Jedi or Kestrel")
            && said.contains("it keeps 12 of the input's 120 units for the model")
            && said.contains("the model is expected to judge 12 units: 12 model calls"),
        "{said}"
    );

    // The rule is on, built from the code names, and its comment counts.
    let spec = std::fs::read_to_string(dir.join("spec.toml")).unwrap();
    let rule = spec
        .lines()
        .find(|l| l.starts_with("when = "))
        .unwrap_or_else(|| panic!("no active prefilter rule in {spec}"));
    let pattern = rule
        .split("test(")
        .nth(1)
        .unwrap_or_else(|| panic!("no pattern in {rule}"));
    for name in ["Raptor", "Condor", "Jedi", "Kestrel"] {
        assert!(pattern.contains(name), "{rule}");
    }
    for common in ["mails", "refer", "first", "hand", "sent", "subject"] {
        assert!(!pattern.to_lowercase().contains(common), "{rule}");
    }
    assert!(
        spec.contains("[[prefilter]]\nname = \"question_terms\""),
        "{spec}"
    );
    let comment = spec
        .lines()
        .filter_map(|l| l.strip_prefix("# "))
        .collect::<Vec<_>>()
        .join(" ");
    assert!(
        comment.contains("it keeps 12 of the input's 120 units for the model"),
        "{spec}"
    );

    // What ran: twelve calls, the twelve messages, the rest excluded by
    // the rule with its reason.
    let cert: Value =
        serde_json::from_slice(&std::fs::read(dir.join("out/certificate.json")).unwrap()).unwrap();
    assert_eq!(cert["coverage"]["units"], 120, "{}", cert["coverage"]);
    assert_eq!(cert["stats"]["model_calls"], 12, "{}", cert["stats"]);
    assert_eq!(
        cert["excluded_by_reason"]["names_no_question_term"], 108,
        "{}",
        cert["excluded_by_reason"]
    );
    let answer: Value =
        serde_json::from_slice(&std::fs::read(dir.join("out/answer.json")).unwrap()).unwrap();
    let mut listed: Vec<String> = answer["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["unit_id"].as_str().unwrap().to_owned())
        .collect();
    listed.sort();
    assert_eq!(listed, naming);
    let facts = std::fs::read_to_string(dir.join("out/facts.jsonl")).unwrap();
    let judged: Vec<String> = facts
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|f| f["stage"] == "judge")
        .map(|f| f["source_ids"][0].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(judged, naming, "the judge saw other messages");

    // `explain`, before any run, shows the rule and what it keeps.
    let e = run(bin()
        .arg("explain")
        .arg(dir.join("spec.toml"))
        .arg("--store")
        .arg(tmp.path().join("fresh.sqlite")));
    assert_eq!(e.status.code(), Some(0), "{}", stderr(&e));
    let plan = stdout(&e);
    assert!(
        plan.contains("question_terms")
            && plan.contains("exclude(names_no_question_term)")
            && plan.contains("excluded names_no_question_term: 108")
            && plan.contains("stage judge: 12 units"),
        "{plan}"
    );
}

/// A question naming no distinctive term gets an embed rung instead: its
/// threshold and what it kept are in the spec, and what it kept is what
/// the model is sent.
#[test]
fn a_question_without_names_gets_an_embed_rung_whose_stated_count_is_what_the_model_sees() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("messages.jsonl");
    let rows = [
        (
            1,
            "Invoice 2231",
            "The card payment failed twice this morning.",
        ),
        (2, "Lunch", "Are we still on for Thursday?"),
        (
            3,
            "Card declined",
            "My payment failed at checkout with error 51.",
        ),
        (4, "Newsletter", "Our spring collection is here."),
        (5, "Fantasy football", "Week 9 standings attached."),
        (
            6,
            "Bird walk",
            "The birds at the reserve were out on Sunday.",
        ),
    ];
    let text: String = rows
        .iter()
        .map(|(id, subject, body)| {
            format!(
                "{}\n",
                serde_json::json!({"id": id, "subject": subject, "body": body})
            )
        })
        .collect();
    std::fs::write(&input, text).unwrap();
    let dir = tmp.path().join("ask");
    let o = run(bin()
        .args([
            "ask",
            "Which messages report a failed payment?",
            "--backend",
            "scripted",
            "--input",
        ])
        .arg(&input)
        .arg("--dir")
        .arg(&dir));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let spec = std::fs::read_to_string(dir.join("spec.toml")).unwrap();
    assert!(!spec.contains("[[prefilter]]"), "{spec}");
    assert!(
        spec.contains("name = \"near_question\"\ntype = \"embed\"")
            && spec.contains("threshold = 0.08")
            && spec.contains("then = \"judge\""),
        "{spec}"
    );
    let comment = spec
        .lines()
        .filter_map(|l| l.strip_prefix("# "))
        .collect::<Vec<_>>()
        .join(" ");
    let stated: u64 = comment
        .split("it keeps ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count in {comment}"));
    assert!(comment.contains("below the threshold 0.08"), "{comment}");
    // The two failed payments are near the question; something is not.
    assert!((2..6).contains(&stated), "{comment}");
    let cert: Value =
        serde_json::from_slice(&std::fs::read(dir.join("out/certificate.json")).unwrap()).unwrap();
    assert_eq!(cert["stats"]["model_calls"], stated, "{}", cert["stats"]);
    let answer: Value =
        serde_json::from_slice(&std::fs::read(dir.join("out/answer.json")).unwrap()).unwrap();
    let ids: Vec<&str> = answer["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["unit_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["1", "3"], "{answer}");
}

/// A spec over `units` JSON lines judged by a scripted model taking
/// `delay_ms` a call.
fn slow_spec(dir: &Path, units: usize, delay_ms: u64) -> PathBuf {
    let text: String = (0..units)
        .map(|i| format!("{{\"id\": {i}, \"flag\": {}}}\n", i % 7 == 0))
        .collect();
    std::fs::write(dir.join("input.jsonl"), text).unwrap();
    std::fs::write(
        dir.join("rubric.md"),
        "Say yes when the record is flagged.\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("schema.json"),
        r#"{"type": "object", "required": ["decision"], "properties": {"decision": {"enum": ["yes", "no"]}}}"#,
    )
    .unwrap();
    std::fs::write(
        dir.join("judge.jq"),
        r#"{decision: (if .flag then "yes" else "no" end)}"#,
    )
    .unwrap();
    let spec = dir.join("spec.toml");
    std::fs::write(
        &spec,
        format!(
            r#"name = "slow"
question = "Which records are flagged?"

[input]
path = "input.jsonl"
partition = {{ type = "jsonl", key = "id" }}

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
delay_ms = {delay_ms}

[[fold.reducers]]
name = "flagged"
type = "set"

[contract]
type = "exhaustive"
answer = "flagged"
"#
        ),
    )
    .unwrap();
    spec
}

/// With standard error piped (not a terminal), a run writes a progress
/// line at every 5 % of a stage's units: units decided, model calls, rate
/// and time left. A run this fast says nothing of a long wait.
#[test]
fn a_run_off_a_terminal_writes_a_progress_line_every_five_percent() {
    let tmp = tempfile::tempdir().unwrap();
    let spec = slow_spec(tmp.path(), 400, 0);
    let o = run(bin()
        .arg("run")
        .arg(&spec)
        .arg("--store")
        .arg(tmp.path().join("store.sqlite"))
        .arg("--out")
        .arg(tmp.path().join("out"))
        .stderr(Stdio::piped()));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let said = stderr(&o);
    let lines: Vec<&str> = said
        .lines()
        .filter(|l| l.starts_with("judge: ") && l.contains(" units decided "))
        .collect();
    // One a step of 5 %, at 20, 40, … 400 units.
    assert!(lines.len() >= 20, "{said}");
    let first = lines
        .iter()
        .find(|l| l.starts_with("judge: 20 of 400 units decided (5 %); "))
        .unwrap_or_else(|| panic!("no line at 5 %: {said}"));
    // `N model calls; R units/s; about T left`: at least one call a unit
    // decided, and a rate and a time left to read.
    let calls: u64 = first
        .split("; ")
        .nth(1)
        .and_then(|p| p.strip_suffix(" model calls"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no calls in {first}"));
    assert!(calls >= 20, "{first}");
    assert!(first.contains(" units/"), "{first}");
    assert!(
        first.contains("; about ") && first.ends_with(" left"),
        "{first}"
    );
    assert!(
        said.contains("judge: done, 400 units decided in "),
        "{said}"
    );
    assert!(!said.contains("units left to decide"), "{said}");
}

/// A run expected to take more than a minute says, once its first units
/// are decided, how many are left, the model calls they take and the time
/// at the rate measured; the run is stopped once it has said so.
#[test]
fn a_long_run_says_the_calls_and_the_time_it_expects() {
    let tmp = tempfile::tempdir().unwrap();
    // 400 units at 250 ms a call, one at a time: about 100 s.
    let spec = slow_spec(tmp.path(), 400, 250);
    let mut child = bin()
        .arg("run")
        .arg(&spec)
        .args(["--slots", "1"])
        .arg("--store")
        .arg(tmp.path().join("store.sqlite"))
        .arg("--out")
        .arg(tmp.path().join("out"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let err = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(err).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = Vec::new();
    let notice = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) if line.contains("units left to decide") => break Some(line),
            Ok(line) => seen.push(line),
            Err(_) => break None,
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    let notice = notice.unwrap_or_else(|| panic!("no notice; stderr so far: {seen:?}"));
    // `judge: 392 units left to decide (392 model calls, more with
    // retries; 8 made so far): about 2 min at 4.00 units/s, measured over
    // its last 8 units. …`
    let left: u64 = notice
        .strip_prefix("judge: ")
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{notice}"));
    assert!((300..400).contains(&left), "{notice}");
    assert!(
        notice.contains(&format!("({left} model calls, more with retries;")),
        "{notice}"
    );
    assert!(
        notice.contains(": about ") && notice.contains(" min at "),
        "{notice}"
    );
    assert!(
        notice.contains(" units/s, measured over its last "),
        "{notice}"
    );
    assert!(
        notice.contains("a rerun pays only for the units not yet decided"),
        "{notice}"
    );
}

/// Writes the code-name mailbox the test above uses, 250 messages, for the
/// figures in docs/benchmarks.md.
#[test]
#[ignore = "writes files; run on demand with FANFOLD_MAILBOX_OUT set"]
fn write_the_code_name_mailbox() {
    let out = std::env::var_os("FANFOLD_MAILBOX_OUT").expect("FANFOLD_MAILBOX_OUT");
    let naming = write_mailbox(Path::new(&out), 250);
    eprintln!("wrote 250 messages to {out:?}; naming a code name: {naming:?}");
}
