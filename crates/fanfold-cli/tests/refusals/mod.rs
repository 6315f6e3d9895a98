//! Mistakes refused before any call is paid: specs, labels and inputs.

#[allow(unused_imports)]
use super::*;
use serde_json::json;

mod specs;

/// The fixture's spec with `from` replaced by `to` (which must be there).
fn edited(extra: &str, from: &str, to: &str) -> Fixture {
    let f = Fixture::new(JSON_ARRAY, extra);
    f.input(&flagged_rows(6));
    let spec = std::fs::read_to_string(f.path("spec.toml")).expect("spec");
    assert!(spec.contains(from), "the fixture holds {from:?}");
    std::fs::write(f.path("spec.toml"), spec.replacen(from, to, 1)).expect("spec");
    f
}

/// The run exits 2 naming each of `named`, and paid for nothing: no fact
/// is in the store (which is not even made when the plan refuses).
fn assert_refused(f: &Fixture, named: &[&str]) {
    let o = f.run(&[]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    for n in named {
        assert!(err.contains(n), "{n:?} is named in: {err}");
    }
    if f.path("store.sqlite").exists() {
        assert_eq!(f.fact_count(), 0, "no call was paid: {err}");
    }
    assert!(!f.path("out/answer.json").exists(), "no answer: {err}");
}

const DECISION: &str =
    r#"decision = { pointer = "/decision", positive = ["yes"], negative = ["no"] }"#;

#[test]
fn a_decision_value_the_schema_cannot_produce_is_refused() {
    let f = edited("", DECISION, &DECISION.replace("[\"yes\"]", "[\"Yes\"]"));
    assert_refused(
        &f,
        &[
            "stage `judge`",
            "decision.positive",
            "\"Yes\"",
            "did you mean \"yes\"",
        ],
    );
    let f = edited(
        "",
        DECISION,
        r#"decision = { pointer = "/decision", positive = ["yes"], negative = ["no"], abstain = ["unsure"] }"#,
    );
    assert_refused(&f, &["decision.abstain", "\"unsure\""]);
}

#[test]
fn a_decision_with_no_negative_is_refused() {
    let f = edited("", DECISION, &DECISION.replace("[\"no\"]", "[]"));
    assert_refused(&f, &["stage `judge`", "decision.negative names no value"]);
}

#[test]
fn a_prefilter_rule_that_yields_no_boolean_is_refused() {
    // Plain on the plan: a string, or a number, whatever the unit holds.
    // (A program is never run on the plan: one could run away.)
    for when in [r#"'"yes"'"#, "'3'"] {
        let f = Fixture::new(
            JSON_ARRAY,
            &format!("[[prefilter]]\nname = \"odd\"\nwhen = {when}\naction = \"exclude\"\n"),
        );
        f.input(&flagged_rows(6));
        assert_refused(&f, &["prefilter rule `odd`", "not true or false"]);
    }
    // Only the units say: the rule's value on each is checked as it is
    // evaluated, before any stage runs (a jq expression at fault: 5).
    let f = Fixture::new(
        JSON_ARRAY,
        "[[prefilter]]\nname = \"titled\"\nwhen = '.title'\naction = \"exclude\"\n",
    );
    f.input(br#"[{"id": 1, "flag": true}, {"id": 2, "flag": false, "title": "spam"}]"#);
    let o = f.run(&[]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(5), "{err}");
    assert!(
        err.contains("prefilter rule `titled`") && err.contains("unit 1"),
        "{err}"
    );
    assert!(err.contains("not a boolean"), "{err}");
    assert_eq!(f.fact_count(), 0, "{err}");
    // A select's rules are held to the same on the plan.
    let f = edited(
        "[[stages]]\nname = \"route\"\ntype = \"select\"\nversion = 1\nrules = [{ name = \"all\", when = '\"judge\"', choose = \"judge\" }]\notherwise = \"judge\"\nchoices = [{ name = \"judge\", run = \"judge\" }]\n",
        DECISION,
        DECISION,
    );
    assert_refused(&f, &["select `route` rule `all`", "not true or false"]);
    // A rule whose value only a unit gives is checked on the units: `//`
    // yields the number for a unit without the field.
    let f = Fixture::new(
        JSON_ARRAY,
        "[[prefilter]]\nname = \"odd\"\nwhen = '.flag // 3'\naction = \"exclude\"\n",
    );
    f.input(br#"[{"id": 1, "flag": true}, {"id": 2}]"#);
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(5), "{}", stderr(&o));
    assert!(stderr(&o).contains("`odd` on unit 2"), "{}", stderr(&o));
}

#[test]
fn a_confidence_floor_with_nothing_to_compare_is_refused() {
    let remote = "[backends.remote]\ntype = \"openai\"\nmodel = \"m\"\nbase_url = \"http://127.0.0.1:9/v1\"\n";
    let floor = format!("{DECISION}\nbackend = \"remote\"\nmin_confidence = 0.5");
    let f = edited(remote, DECISION, &floor);
    assert_refused(
        &f,
        &[
            "stage `judge` min_confidence = 0.5",
            "`confidence` pointer",
            "logprobs",
        ],
    );
    // With probabilities from the backend, or a pointer, it stands.
    for fix in [format!("{floor}\nconfidence = \"/score\""), floor.clone()] {
        let backend = if fix.contains("/score") {
            remote.to_owned()
        } else {
            format!("{remote}logprobs = true\n")
        };
        let f = edited(&backend, DECISION, &fix);
        let o = run(bin()
            .arg("explain")
            .arg(f.path("spec.toml"))
            .arg("--no-input"));
        assert!(o.status.success(), "{fix}: {}", stderr(&o));
    }
}

#[test]
fn no_output_tokens_and_a_negative_temperature_are_refused() {
    let f = edited("", DECISION, &format!("{DECISION}\nmax_output_tokens = 0"));
    assert_refused(&f, &["stage `judge` max_output_tokens = 0"]);
    let f = edited("", DECISION, &format!("{DECISION}\ntemperature = -0.5"));
    assert_refused(&f, &["stage `judge` temperature = -0.5"]);
    // A select's scorer, under its own table.
    let f = edited(
        "[[stages]]\nname = \"route\"\ntype = \"select\"\nversion = 1\nchoices = [{ name = \"judge\", run = \"judge\" }]\n[stages.model]\nrubric = \"rubric.md\"\ntemperature = -1.0\n",
        DECISION,
        DECISION,
    );
    assert_refused(&f, &["stage `route` model.temperature = -1"]);
}

#[test]
fn project_with_fields_is_refused() {
    let f = edited(
        "",
        DECISION,
        &format!("{DECISION}\nfields = [\"flag\"]\nproject = \"{{flag, id}}\""),
    );
    assert_refused(&f, &["stage `judge`", "both `project` and `fields`"]);
}

#[test]
fn an_output_field_no_unit_has_is_refused() {
    // Records: known once the input is read, before any stage runs.
    let f = edited("", "[fold]", "[output]\ntitle = \"titel\"\n\n[fold]");
    assert_refused(&f, &["output.title names `titel`", "none of the 6 units"]);
    let o = run(bin()
        .arg("explain")
        .arg(f.path("spec.toml"))
        .arg("--store")
        .arg(f.path("none.sqlite")));
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("output.title names `titel`"));
    // Without the input nothing can be known: said, not refused.
    let o = run(bin()
        .arg("explain")
        .arg(f.path("spec.toml"))
        .arg("--no-input"));
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("title `titel`: not checked without the input"),
        "{}",
        stdout(&o)
    );
    // A field some unit has stands.
    let f = edited("", "[fold]", "[output]\nlink = \"flag\"\n\n[fold]");
    assert!(f.run(&[]).status.success());
    // Text lines fix their fields: refused on the plan.
    let f = edited(
        "",
        "[fold]",
        "[output]\nshow = [\"text\", \"level\"]\n\n[fold]",
    );
    let spec = std::fs::read_to_string(f.path("spec.toml")).expect("spec");
    std::fs::write(
        f.path("spec.toml"),
        spec.replace(JSON_ARRAY, "{ type = \"lines\" }"),
    )
    .expect("spec");
    assert_refused(
        &f,
        &[
            "output.show names `level`",
            "`lines` input",
            "`text`, `line`",
        ],
    );
}

#[test]
fn a_stage_no_unit_reaches_is_refused() {
    // Units are routed, and none to `orphan`: it would never run.
    let orphan = "[[stages]]\nname = \"orphan\"\ntype = \"map\"\nversion = 1\nrubric = \"rubric.md\"\noutput_schema = \"schema.json\"\ndecision = { pointer = \"/decision\", positive = [\"yes\"], negative = [\"no\"] }\n\n[backends.default]";
    let route = |to: &str| {
        format!(
            "[[prefilter]]\nname = \"odd\"\nwhen = '.id % 2 == 1'\naction = \"route\"\nstage = \"{to}\"\n"
        )
    };
    let f = edited(&route("judge"), "[backends.default]", orphan);
    assert_refused(&f, &["stage `orphan` is reached by no unit"]);
    // Routed to by the rule, it runs.
    let f = edited(&route("orphan"), "[backends.default]", orphan);
    let o = f.run(&[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(f.certificate()["routed_by_stage"]["orphan"], 3);
}

#[test]
fn a_numeric_reducer_over_strings_is_refused() {
    let histogram = |value: &str| {
        format!(
            "[[fold.reducers]]\nname = \"spread\"\ntype = \"histogram\"\nstage = \"judge\"\nvalue = \"{value}\"\nedges = [0, 1]\n\n[[fold.reducers]]\nname = \"flagged\""
        )
    };
    let f = edited(
        "",
        "[[fold.reducers]]\nname = \"flagged\"",
        &histogram("/decision"),
    );
    assert_refused(
        &f,
        &[
            "reducer `spread` (histogram) reads `/decision` as a number",
            "\"yes\", \"no\"",
        ],
    );
    let f = edited(
        "",
        "[[fold.reducers]]\nname = \"flagged\"",
        &histogram("/score"),
    );
    let o = f.run(&[]);
    assert!(o.status.success(), "{}", stderr(&o));
}

/// Every example spec still plans and explains under these checks.
#[test]
fn every_example_spec_explains() {
    let mut specs = Vec::new();
    for dir in std::fs::read_dir(repo().join("examples")).expect("examples") {
        let dir = dir.expect("entry").path();
        for file in std::fs::read_dir(&dir).into_iter().flatten() {
            let path = file.expect("entry").path();
            let is_spec = path.extension().is_some_and(|e| e == "toml")
                && std::fs::read_to_string(&path).is_ok_and(|t| t.contains("[[stages]]"));
            if is_spec {
                specs.push(path);
            }
        }
    }
    assert!(specs.len() > 10, "{specs:?}");
    let store = tempfile::tempdir().expect("dir");
    for spec in specs {
        let o = run(bin()
            .current_dir(repo())
            .arg("explain")
            .arg(&spec)
            .arg("--store")
            .arg(store.path().join("none.sqlite")));
        assert!(o.status.success(), "{}: {}", spec.display(), stderr(&o));
    }
}

/// The output of `cmd`, which must end within 60 s: a command that waits
/// forever fails the test instead of hanging it.
fn run_within_a_minute(cmd: &mut Command) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while child.try_wait().expect("wait").is_none() {
        if std::time::Instant::now() > until {
            let _ = child.kill();
            let _ = child.wait();
            panic!("still running after 60 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    child.wait_with_output().expect("output")
}

#[test]
fn a_pipe_or_a_device_as_the_input_of_new_or_ask_is_refused() {
    let tmp = tempfile::tempdir().expect("dir");
    let fifo = tmp.path().join("feed");
    let made = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(made.success());
    let o = run_within_a_minute(
        bin()
            .args(["ask", "Which records are flagged?", "--backend", "scripted"])
            .arg("--input")
            .arg(&fifo)
            .arg("--dir")
            .arg(tmp.path().join("ask")),
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("feed is a named pipe (FIFO)"),
        "{}",
        stderr(&o)
    );
    assert!(!tmp.path().join("ask/spec.toml").exists());
    let o = run_within_a_minute(
        bin()
            .arg("new")
            .arg(tmp.path().join("new"))
            .args(["--question", "Which records are flagged?"])
            .args(["--input", "/dev/zero"]),
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("/dev/zero is a character device, not a regular file or a folder"),
        "{}",
        stderr(&o)
    );
}

/// A run whose cascade asks a person for labels; the ids it wants.
fn labels_wanted() -> (Fixture, Vec<String>) {
    let f = cascade_fixture(
        r#"{ proxy = "lex", target = "recall", at_least = 0.7, delta = 0.1, label_budget = 300, oracle = "person" }"#,
    );
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let ids: Vec<String> = f
        .jsonl("out/labels-wanted.jsonl")
        .iter()
        .map(|w| w["id"].as_str().expect("id").to_owned())
        .collect();
    assert!(ids.len() > 3, "{ids:?}");
    (f, ids)
}

fn import(f: &Fixture, lines: &[Value]) -> Output {
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(f.path("labels.jsonl"), text).expect("labels");
    run(bin()
        .arg("label")
        .arg(f.path("out"))
        .arg("--store")
        .arg(f.path("store.sqlite"))
        .arg("--import")
        .arg(f.path("labels.jsonl")))
}

fn labels_stored(f: &Fixture) -> String {
    sqlite3(&f.path("store.sqlite"), "SELECT COUNT(*) FROM labels;")
        .trim()
        .to_owned()
}

#[test]
fn imported_labels_that_conflict_are_refused_and_unknown_ids_named() {
    let (f, ids) = labels_wanted();
    let (a, b) = (&ids[0], &ids[1]);
    // One unit, two decisions: neither is taken, and nothing is stored.
    let o = import(
        &f,
        &[
            json!({"id": a, "decision": "yes"}),
            json!({"id": b, "decision": "no"}),
            json!({"id": a, "decision": "no"}),
        ],
    );
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!(
            "unit {a:?} is labelled `yes` on line 1 and `no` on line 3"
        )),
        "{err}"
    );
    assert_eq!(labels_stored(&f), "0");
    // Repeating the same decision is no conflict.
    let o = import(
        &f,
        &[
            json!({"id": a, "decision": "yes"}),
            json!({"id": a, "decision": "yes"}),
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(labels_stored(&f), "1");
    // Ids the run did not ask about are named and counted, not stored.
    let o = import(
        &f,
        &[
            json!({"id": b, "decision": "no"}),
            json!({"id": "no-such-unit", "decision": "no"}),
            json!({"id": 999999, "decision": "yes"}),
        ],
    );
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("2 ids in")
            && err.contains("\"no-such-unit\" (line 2)")
            && err.contains("\"999999\" (line 3)"),
        "{err}"
    );
    assert_eq!(labels_stored(&f), "2");
    // A file none of whose ids the run asked about is refused.
    let o = import(&f, &[json!({"id": "x1", "decision": "no"})]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("none of the 1 ids") && err.contains("\"x1\""),
        "{err}"
    );
}

#[test]
fn an_imported_id_written_as_a_whole_float_is_the_unit_and_said_so() {
    let (f, ids) = labels_wanted();
    let numbered: Vec<&String> = ids.iter().filter(|i| i.parse::<u32>().is_ok()).collect();
    let id = numbered.first().expect("a numeric id");
    let float: f64 = id.parse().expect("number");
    let o = import(&f, &[json!({"id": float, "decision": "no"})]);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains(&format!("id {float:.1} was read as unit \"{id}\"")),
        "{err}"
    );
    assert_eq!(
        sqlite3(
            &f.path("store.sqlite"),
            "SELECT unit_id, decision FROM labels;"
        )
        .trim(),
        format!("{id}|no")
    );
    // A float too large to tell integers apart names itself.
    let o = import(
        &f,
        &[json!({"id": 18446744073709551616.0_f64, "decision": "no"})],
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("write the id as a string"),
        "{}",
        stderr(&o)
    );
}

/// Field names a TOML literal string cannot hold (`it's`), or that need
/// escaping (`"`, `\`, a tab), reach the spec `new` writes as they are:
/// it parses, lists them verbatim, its rule reads them in jq, and every
/// line it leaves commented out parses once uncommented.
#[test]
fn new_writes_odd_field_names_as_toml_that_reads_back() {
    let tmp = tempfile::tempdir().expect("dir");
    let input = tmp.path().join("notes.jsonl");
    let odd = ["it's", "say \"hi\"", "back\\slash", "tab\tname"];
    let rows: String = (0..4)
        .map(|i| {
            let mut row = serde_json::Map::new();
            row.insert("id".into(), json!(i));
            for (k, name) in odd.iter().enumerate() {
                let text = if k == 0 && i % 2 == 0 {
                    format!("the Kestrel launch, note {i}")
                } else {
                    format!("routine note {i}")
                };
                row.insert((*name).to_owned(), json!(text));
            }
            format!("{}\n", Value::Object(row))
        })
        .collect();
    std::fs::write(&input, rows).expect("input");
    let dir = tmp.path().join("spec");
    let o = run(bin()
        .arg("new")
        .arg(&dir)
        .args([
            "--question",
            "Which notes mention Kestrel, or say \"it's done\"?",
        ])
        .arg("--input")
        .arg(&input));
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(dir.join("spec.toml")).expect("spec");
    let spec: toml::Table = text.parse().expect("the spec is TOML");
    let fields: Vec<&str> = spec["stages"]
        .as_array()
        .expect("stages")
        .iter()
        .find(|s| s["name"].as_str() == Some("judge"))
        .and_then(|s| s["fields"].as_array())
        .expect("fields")
        .iter()
        .filter_map(toml::Value::as_str)
        .collect();
    for name in odd {
        assert!(fields.contains(&name), "{name:?} in {fields:?}");
    }
    // Commented-out TOML (a table header or a `key = value` line), once
    // uncommented, still parses.
    let looks_like_toml = |l: &str| {
        (l.starts_with('[') && l.ends_with(']') && !l.contains(' '))
            || l.split_once(" = ").is_some_and(|(k, _)| {
                !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            })
    };
    let uncommented: String = text
        .lines()
        .map(|l| match l.strip_prefix("# ") {
            Some(rest) if looks_like_toml(rest) => format!("{rest}\n"),
            _ => format!("{l}\n"),
        })
        .collect();
    let _: toml::Table = uncommented.parse().expect("uncommented lines parse");
    // Uncommented, the prefilter rule reads the names in jq: the two notes
    // naming Kestrel go on to the judge.
    std::fs::write(dir.join("uncommented.toml"), uncommented).expect("spec");
    let o = run(bin()
        .arg("explain")
        .arg(dir.join("uncommented.toml"))
        .arg("--store")
        .arg(tmp.path().join("none.sqlite")));
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("stage judge: 2 units"),
        "{}",
        stdout(&o)
    );
}
