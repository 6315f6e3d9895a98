//! What a run must not hand over: the worker's environment to a jq
//! program, a file outside the granted folder or root, a shell to a
//! record; and what must not hold a run: a FIFO, a device, a program's
//! grandchild.

use std::time::{Duration, Instant};

use super::*;

const SECRET: &str = "sk-trust-test-0123456789abcdef";

/// A spec over `input.data` whose prefilter, `project` and scripted
/// script each write what they see of the environment into the facts.
fn env_spec(f: &Fixture, env: &str) {
    let spec = format!(
        r#"name = "t"
question = "Which records are flagged?"
{env}
[input]
path = "input.data"
partition = {JSON_ARRAY}

[[prefilter]]
name = "leak"
when = '(env | has("FANFOLD_TRUST_SECRET")) or ($ENV | has("PATH"))'
action = "exclude"

[[prefilter]]
name = "declared"
when = '(env.FANFOLD_TRUST_OPEN == "open-value") and ($ENV.FANFOLD_TRUST_OPEN == "open-value") and .id == 1'
action = "exclude"

[[stages]]
name = "judge"
type = "map"
version = 1
rubric = "rubric.md"
output_schema = "schema.json"
project = '{{id, flag, projected: [env, $ENV]}}'
decision = {{ pointer = "/decision", positive = ["yes"], negative = ["no"] }}

[backends.default]
type = "scripted"
script = "judge.jq"

[fold]
fan_in = 4
[[fold.reducers]]
name = "flagged"
type = "set"

[contract]
type = "exhaustive"
answer = "flagged"
"#
    );
    std::fs::write(f.path("spec.toml"), spec).unwrap();
    std::fs::write(
        f.path("judge.jq"),
        r#"{decision: (if .flag then "yes" else "no" end), scripted: [env, $ENV], projected}"#,
    )
    .unwrap();
}

fn run_with_secret(f: &Fixture) -> Output {
    run(bin()
        .arg("run")
        .arg(f.path("spec.toml"))
        .arg("--store")
        .arg(f.path("store.sqlite"))
        .arg("--out")
        .arg(f.path("out"))
        .arg("--json")
        .env("FANFOLD_TRUST_SECRET", SECRET)
        .env("FANFOLD_TRUST_OPEN", "open-value"))
}

/// jq's `env` and `$ENV` are `{}` in a prefilter rule, a `project` and a
/// scripted backend's script, with a secret in the process's environment;
/// a variable the spec declares is the one thing they hold, and explain
/// lists it.
#[test]
fn jq_programs_see_only_the_environment_a_spec_declares() {
    let f = Fixture::new(JSON_ARRAY, "");
    f.input(br#"[{"id": 1, "flag": true}, {"id": 2, "flag": false}]"#);
    env_spec(&f, "");
    let o = run_with_secret(&f);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // The prefilter saw no variable, so nothing was excluded.
    assert_eq!(f.answer_ids(), ["1"]);
    let facts = std::fs::read_to_string(f.path("out/facts.jsonl")).unwrap();
    assert!(!facts.contains(SECRET), "{facts}");
    assert!(
        !facts.contains("open-value") && !facts.contains("PATH"),
        "{facts}"
    );
    let judged: Vec<Value> = f.jsonl("out/facts.jsonl");
    for id in ["1", "2"] {
        let fact = judged.iter().find(|x| x["source_ids"][0] == id).unwrap();
        let nothing = serde_json::json!([{}, {}]);
        assert_eq!(fact["facts"]["scripted"], nothing, "{fact}");
        assert_eq!(fact["facts"]["projected"], nothing, "{fact}");
    }

    // Declared: that variable, and only it.
    let f = Fixture::new(JSON_ARRAY, "");
    f.input(br#"[{"id": 1, "flag": true}, {"id": 2, "flag": false}]"#);
    env_spec(&f, "\n[env]\nread = [\"FANFOLD_TRUST_OPEN\"]\n");
    let o = run(bin().arg("explain").arg(f.path("spec.toml")));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let explained = stdout(&o);
    assert!(explained.contains("FANFOLD_TRUST_OPEN"), "{explained}");
    let o = run_with_secret(&f);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let facts = std::fs::read_to_string(f.path("out/facts.jsonl")).unwrap();
    assert!(!facts.contains(SECRET), "{facts}");
    // The rule saw the declared variable and excluded unit 1; the
    // project and the script saw it for unit 2.
    assert!(f.answer_ids().is_empty());
    let judged: Vec<Value> = f.jsonl("out/facts.jsonl");
    let fact = judged
        .iter()
        .find(|x| x["stage"] == "judge" && x["source_ids"][0] == "2")
        .unwrap();
    let open = serde_json::json!([{"FANFOLD_TRUST_OPEN": "open-value"}, {"FANFOLD_TRUST_OPEN": "open-value"}]);
    assert_eq!(fact["facts"]["scripted"], open, "{fact}");
    assert_eq!(fact["facts"]["projected"], open, "{fact}");

    // A name that is not a variable's is refused, naming it.
    env_spec(&f, "\n[env]\nread = [\"A B\"]\n");
    let o = run_with_secret(&f);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("`A B`"), "{}", stderr(&o));
}

/// A spec over the folder `docs` with the `files` partition.
fn folder_fixture() -> Fixture {
    let f = Fixture::new(r#"{ type = "files" }"#, "");
    let spec = std::fs::read_to_string(f.path("spec.toml")).unwrap();
    std::fs::write(
        f.path("spec.toml"),
        spec.replacen("path = \"input.data\"", "path = \"docs\"", 1),
    )
    .unwrap();
    std::fs::write(f.path("judge.jq"), r#"{decision: "yes", text}"#).unwrap();
    std::fs::create_dir_all(f.path("docs/sub")).unwrap();
    std::fs::create_dir_all(f.path("outside")).unwrap();
    std::fs::write(f.path("docs/a.txt"), "inside text").unwrap();
    std::fs::write(f.path("docs/sub/b.txt"), "more inside text").unwrap();
    std::fs::write(f.path("outside/secret.txt"), "outside secret text").unwrap();
    let link = |to: &Path, at: &str| std::os::unix::fs::symlink(to, f.path(at)).unwrap();
    link(&f.path("outside/secret.txt"), "docs/secret.txt");
    link(&f.path("outside"), "docs/elsewhere");
    link(&f.path("docs/a.txt"), "docs/sub/again.txt");
    link(Path::new("/proc/self/pagemap"), "docs/pagemap");
    link(Path::new("/dev/zero"), "docs/zero");
    let fifo = f.path("docs/pipe.txt");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    f
}

/// Links that leave the folder are named and not read (a link to
/// `/proc/self/pagemap` claims size 0 and would read for gigabytes); a FIFO
/// or a device is named, never opened; `--follow-links` reads what links
/// lead to, still never a FIFO or a device, and every read is bounded.
#[test]
fn a_folder_reads_only_its_own_regular_files() {
    let f = folder_fixture();
    let started = Instant::now();
    let o = run_within(f.run_command().arg("--json"), Duration::from_secs(60));
    let err = stderr(&o);
    assert!(o.status.code().is_some(), "{err}");
    let facts = std::fs::read_to_string(f.path("out/facts.jsonl")).unwrap();
    assert!(!facts.contains("outside secret"), "{facts}");
    let mut ids = f.answer_ids();
    ids.sort();
    assert_eq!(ids, ["a.txt", "sub/again.txt", "sub/b.txt"]);
    let c = f.certificate();
    assert_eq!(c["rejected_by_reason"]["link_outside"], 4, "{c}");
    assert_eq!(c["rejected_by_reason"]["not_a_file"], 1, "{c}");
    let shown = format!("{err}{c}");
    for name in ["secret.txt", "elsewhere/", "pagemap", "zero", "pipe.txt"] {
        assert!(shown.contains(name), "{name} is named: {shown}");
    }
    eprintln!("folder run without links: {:?}", started.elapsed());

    // Followed: the linked file and folder are read; the FIFO and the
    // device are still named; pagemap is read to the document limit at most.
    std::fs::remove_file(f.path("docs/pagemap")).unwrap();
    let o = run_within(
        f.run_command().arg("--json").arg("--follow-links"),
        Duration::from_secs(60),
    );
    let err = stderr(&o);
    assert!(o.status.code().is_some(), "{err}");
    let mut ids = f.answer_ids();
    ids.sort();
    assert_eq!(
        ids,
        [
            "a.txt",
            "elsewhere/secret.txt",
            "secret.txt",
            "sub/again.txt",
            "sub/b.txt"
        ]
    );
    let c = f.certificate();
    assert_eq!(c["rejected_by_reason"]["not_a_file"], 2, "{c}");
    assert!(c["rejected_by_reason"].get("link_outside").is_none(), "{c}");
}

/// A tool stage over `input.data` (rows with `q`), its capability `cap`.
fn tool_fixture(cap: &str, extra: &str) -> Fixture {
    let tool = format!(
        r#"[[stages]]
name = "look"
type = "tool"
version = 1
request = '{{q}}'
args = {{ q = {{ type = "string" }} }}
capability = {cap}
as = "out"
{extra}
"#
    );
    Fixture::new(JSON_ARRAY, &tool)
}

fn decision_of(f: &Fixture, id: &str) -> (String, Value) {
    let facts = f.jsonl("out/facts.jsonl");
    let fact = facts
        .iter()
        .find(|x| x["stage"] == "look" && x["source_ids"][0] == id)
        .unwrap_or_else(|| panic!("a fact for {id}: {facts:?}"));
    (
        fact["decision"].as_str().unwrap_or("").to_owned(),
        fact.clone(),
    )
}

/// A value filled into an argument can name no path out of the spec's
/// folder; an interpreter given code with a hole is refused when the spec
/// is checked; a spec named without a folder runs its programs here.
#[test]
fn argv_values_stay_values_and_the_spec_folder_is_where_programs_run() {
    let f = tool_fixture(r#"{ type = "argv", argv = ["cat", "data/{q}.txt"] }"#, "");
    std::fs::create_dir_all(f.path("data")).unwrap();
    std::fs::write(f.path("data/a.txt"), "\"granted\"").unwrap();
    std::fs::write(f.path("outside-secret.txt"), "\"outside\"").unwrap();
    let rows = serde_json::json!([
        {"id": 0, "q": "a"},
        {"id": 1, "q": "../outside-secret"},
        {"id": 2, "q": ".."},
    ]);
    f.input(&serde_json::to_vec(&rows).unwrap());
    // `fanfold run spec.toml` from the spec's folder: no folder part.
    let o = run(bin().current_dir(f.path("")).args([
        "run",
        "spec.toml",
        "--store",
        "store.sqlite",
        "--out",
        "out",
        "--json",
    ]));
    assert!(o.status.code().is_some(), "{}", stderr(&o));
    let (d, fact) = decision_of(&f, "0");
    assert_eq!(d, "ok", "{fact}");
    assert_eq!(fact["facts"]["out"], "granted", "{fact}");
    for id in ["1", "2"] {
        let (d, fact) = decision_of(&f, id);
        assert_eq!(d, "denied", "{fact}");
    }
    let facts = std::fs::read_to_string(f.path("out/facts.jsonl")).unwrap();
    assert!(!facts.contains("\"outside\""), "{facts}");

    for argv in [
        r#"["sh", "-c", "echo {q}"]"#,
        r#"["python3", "-c", "print('{q}')"]"#,
        r#"["perl", "-e", "print '{q}'"]"#,
        r#"["node", "-e", "console.log('{q}')"]"#,
    ] {
        let f = tool_fixture(&format!("{{ type = \"argv\", argv = {argv} }}"), "");
        f.input(br#"[{"id": 0, "q": "x; touch SENTINEL"}]"#);
        let o = f.run(&[]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{argv}: {err}");
        assert!(err.contains("runs its argument as a program"), "{err}");
        assert!(!f.path("SENTINEL").exists());
    }
}

/// A program that leaves a child holding its output ends with that child
/// at the timeout (or when it exits), not when the child is done; a FIFO
/// under a `file` tool's root is refused without waiting on a writer.
#[test]
fn a_tool_never_waits_on_a_grandchild_or_a_fifo() {
    let f = tool_fixture(
        r#"{ type = "argv", argv = ["sh", "lookup.sh", "{q}"] }"#,
        "timeout_ms = 1000\nattempts = 1",
    );
    std::fs::write(
        f.path("lookup.sh"),
        "if [ \"$1\" = quick ]; then sleep 60 & echo '\"done\"'; else sleep 60 & sleep 60; fi\n",
    )
    .unwrap();
    f.input(br#"[{"id": 0, "q": "quick"}, {"id": 1, "q": "hang"}]"#);
    let started = Instant::now();
    let o = run_within(f.run_command().arg("--json"), Duration::from_secs(40));
    let took = started.elapsed();
    assert!(o.status.code().is_some(), "{}", stderr(&o));
    let (d, fact) = decision_of(&f, "0");
    assert_eq!(d, "ok", "{fact}");
    assert_eq!(fact["facts"]["out"], "done", "{fact}");
    let (d, fact) = decision_of(&f, "1");
    assert_eq!(d, "timeout", "{fact}");
    eprintln!("argv run with grandchildren holding the pipe: {took:?}");
    assert!(took < Duration::from_secs(20), "{took:?}");

    let f = tool_fixture(r#"{ type = "file", root = "notes", path = "{q}" }"#, "");
    std::fs::create_dir(f.path("notes")).unwrap();
    std::fs::write(f.path("notes/a.md"), "\"a note\"").unwrap();
    let made = Command::new("mkfifo")
        .arg(f.path("notes/pipe.md"))
        .status()
        .unwrap();
    assert!(made.success());
    f.input(br#"[{"id": 0, "q": "a.md"}, {"id": 1, "q": "pipe.md"}]"#);
    let o = run_within(f.run_command().arg("--json"), Duration::from_secs(30));
    assert!(o.status.code().is_some(), "{}", stderr(&o));
    assert_eq!(decision_of(&f, "0").0, "ok");
    let (d, fact) = decision_of(&f, "1");
    assert_eq!(d, "denied", "{fact}");
    assert!(fact.to_string().contains("FIFO"), "{fact}");
}
