//! A counting reducer's `dedupe`: near-duplicate reports collapsed into
//! the lowest id before they are counted, said in every output, honoured
//! by `count_by`, recomputed by verify, and refused where it means nothing.

use super::*;

/// Twelve reports of which eleven are defects: one crash reported five
/// times in other words, one upload failure three times.
const REPORTS: &[(u64, &str, &str, bool)] = &[
    (
        1,
        "App crashes on startup when the settings file is missing",
        "startup",
        true,
    ),
    (
        2,
        "Dark mode toggle does nothing on the login page",
        "ui",
        false,
    ),
    (
        3,
        "app crashes on startup when the  settings file is missing",
        "startup",
        true,
    ),
    (
        4,
        "App crashes on startup when the settings file is missing!",
        "startup",
        true,
    ),
    (
        5,
        "Upload of files larger than 2 GB fails with a timeout",
        "upload",
        true,
    ),
    (
        7,
        "APP CRASHES ON STARTUP WHEN THE SETTINGS FILE IS MISSING",
        "startup",
        true,
    ),
    (
        8,
        "Upload of files larger than 2 GB fails with a time-out",
        "upload",
        true,
    ),
    (
        9,
        "Search results are empty for queries with an accent",
        "search",
        true,
    ),
    (
        10,
        "App crashes on start-up when the settings file is missing",
        "startup",
        true,
    ),
    (
        11,
        "Upload of files larger than 2 GB fails with a timeout error",
        "upload",
        true,
    ),
    (
        12,
        "Export to CSV drops the last row of every report",
        "export",
        true,
    ),
    (
        13,
        "App freezes on shutdown when the network drive is offline",
        "startup",
        true,
    ),
];

const DEDUPE: &str = r#"dedupe = { method = "minhash", threshold = 0.7, field = "unit:/title" }"#;

/// A spec folder over `rows` (id, title, component, defect) whose fold is
/// `reducers`, answered by the reducer `answer`.
fn reports_spec(
    rows: &[(u64, String, String, bool)],
    reducers: &str,
    answer: &str,
) -> tempfile::TempDir {
    let folder = tempfile::tempdir().expect("tempdir");
    let dir = folder.path();
    let input: Vec<Value> = rows
        .iter()
        .map(|(id, title, component, defect)| {
            serde_json::json!({"id": id, "title": title, "component": component, "defect": defect})
        })
        .collect();
    std::fs::write(dir.join("input.json"), Value::from(input).to_string()).expect("input");
    std::fs::write(
        dir.join("judge.jq"),
        r#"{decision: (if .defect then "yes" else "no" end), component: .component}"#,
    )
    .expect("judge");
    std::fs::write(
        dir.join("schema.json"),
        r#"{"type": "object", "required": ["decision", "component"], "properties": {"decision": {"enum": ["yes", "no"]}, "component": {"type": "string"}}}"#,
    )
    .expect("schema");
    std::fs::write(
        dir.join("rubric.md"),
        "Say yes for a defect; name its component.\n",
    )
    .expect("rubric");
    let spec = format!(
        r#"name = "incidents"
question = "How many distinct defects were reported?"

[input]
path = "input.json"
partition = {{ type = "json_array", key = "id", kind = "row" }}

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

[fold]
fan_in = 4
{reducers}
[contract]
type = "exhaustive"
answer = "{answer}"
"#
    );
    std::fs::write(dir.join("spec.toml"), spec).expect("spec");
    folder
}

fn reports() -> Vec<(u64, String, String, bool)> {
    REPORTS
        .iter()
        .map(|(id, t, c, d)| (*id, (*t).to_owned(), (*c).to_owned(), *d))
        .collect()
}

fn run_spec(dir: &Path) -> Output {
    run(bin().current_dir(dir).args([
        "run",
        "spec.toml",
        "--store",
        "store.sqlite",
        "--out",
        "out",
    ]))
}

fn json_of(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).expect("read")).expect("json")
}

/// The ids collapsed into each kept unit, as answer.json says them.
fn groups_of(answer: &Value, reducer: &str) -> Vec<(String, Vec<String>)> {
    let c = answer["collapsed"]
        .as_array()
        .expect("collapsed")
        .iter()
        .find(|c| c["reducer"] == reducer)
        .unwrap_or_else(|| panic!("no collapse of {reducer}: {answer}"));
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .expect("ids")
            .iter()
            .filter_map(|i| i.as_str().map(str::to_owned))
            .collect()
    };
    c["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .map(|g| {
            (
                g["kept"].as_str().unwrap_or("").to_owned(),
                strings(&g["ids"]),
            )
        })
        .collect()
}

#[test]
fn near_duplicate_reports_are_counted_once_and_every_output_says_which() {
    let reducers = format!(
        r#"
[[fold.reducers]]
name = "incidents"
type = "count"
stage = "judge"
{DEDUPE}

[[fold.reducers]]
name = "by_component"
type = "count_by"
key = "/component"
stage = "judge"
{DEDUPE}

[[fold.reducers]]
name = "reports"
type = "count"
stage = "judge"
"#
    );
    let folder = reports_spec(&reports(), &reducers, "incidents");
    let dir = folder.path();
    let o = run(bin().current_dir(dir).args(["explain", "spec.toml"]));
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("dedupe minhash threshold=0.7 on unit:/title (5-character shingles, seed 0): near-duplicates collapsed into the lowest id before counting"),
        "{}",
        stdout(&o)
    );

    let o = run_spec(dir);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let answer = json_of(&dir.join("out/answer.json"));
    // Eleven defects: the crash five times over, the upload three times.
    assert_eq!(
        answer["stated"]["statement"],
        "5 facts, after 6 near-duplicates collapsed into 2 kept units (minhash, similarity at least 0.7 on `unit:/title`)",
        "{answer}"
    );
    let strs = |v: &[&str]| -> Vec<String> { v.iter().map(|s| (*s).to_owned()).collect() };
    assert_eq!(
        groups_of(&answer, "incidents"),
        [
            ("1".to_owned(), strs(&["10", "3", "4", "7"])),
            ("5".to_owned(), strs(&["11", "8"])),
        ]
    );
    // The count without a dedupe is the raw count.
    let reports = answer["aggregates"]
        .as_array()
        .expect("aggregates")
        .iter()
        .find(|a| a["name"] == "reports")
        .expect("reports");
    assert_eq!(reports["statement"], "11 facts", "{reports}");
    // `count_by` counts what survived: two startup incidents, not six.
    let by = answer["aggregates"]
        .as_array()
        .expect("aggregates")
        .iter()
        .find(|a| a["name"] == "by_component")
        .expect("by_component");
    let statement = by["statement"].as_str().expect("statement");
    assert!(
        statement.starts_with("startup 2, export 1, search 1, upload 1, after 6 near-duplicates"),
        "{statement}"
    );
    let md = std::fs::read_to_string(dir.join("out/answer.md")).expect("answer.md");
    assert!(
        md.contains("## Near-duplicates collapsed [SIMULATED]"),
        "{md}"
    );
    assert!(
        md.contains("  - #1 kept, 4 collapsed into it: #10, #3, #4, #7"),
        "{md}"
    );
    assert!(
        md.contains("  - #5 kept, 2 collapsed into it: #11, #8"),
        "{md}"
    );
    let c = json_of(&dir.join("out/certificate.json"));
    assert_eq!(c["verify"]["passed"], true, "{}", c["verify"]);
    let computed = c["stats"]["fold_nodes_computed"].as_u64().expect("n");
    assert!(computed > 0);

    // A rerun collapses the same units and reuses every fold node.
    let o = run_spec(dir);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let again = json_of(&dir.join("out/answer.json"));
    assert_eq!(again["collapsed"], answer["collapsed"]);
    let c = json_of(&dir.join("out/certificate.json"));
    assert_eq!(c["stats"]["fold_nodes_computed"], 0, "{}", c["stats"]);
    assert_eq!(c["stats"]["fold_nodes_reused"], computed, "{}", c["stats"]);

    // Verify from the folder alone recomputes the collapse from the facts.
    let o = run(bin().current_dir(dir).arg("verify").arg("out"));
    assert!(o.status.success(), "{}\n{}", stdout(&o), stderr(&o));

    // The report page shows each kept unit with what was collapsed into it.
    let o = run(bin().current_dir(dir).args(["report", "run", "out"]));
    assert!(o.status.success(), "{}", stderr(&o));
    let (dom, _) = render(&chromium(), &dir.join("out/report.html"));
    let section = dom
        .split("<div id=\"collapsed\">")
        .nth(1)
        .and_then(|s| s.split("</div>").next())
        .unwrap_or_else(|| panic!("no collapse section: {dom}"));
    assert!(section.contains("<h3>incidents</h3>"), "{section}");
    assert!(
        section.contains("<td>#1</td><td class=\"n\">4</td><td>#10, #3, #4, #7</td>"),
        "{section}"
    );
    assert!(
        dom.contains("5 facts, after 6 near-duplicates collapsed into 2 kept units"),
        "the answer's statement says it counted after collapsing"
    );
}

/// A generated set with planted near-duplicates, end to end: the groups
/// answer.json states hold the planted pairs (recall) and little else
/// (precision), at the declared threshold.
#[test]
fn planted_near_duplicates_are_collapsed_with_bounded_misses() {
    // Titles of twenty words from a vocabulary of made-up words; every
    // third one planted again with one word replaced or one dropped.
    let mut state = 7u64;
    let mut next = || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 33) as usize
    };
    let vocabulary: Vec<String> = (0..500)
        .map(|i| format!("w{}{}", i, ["ra", "ko", "mel", "tis", "vand"][i % 5]))
        .collect();
    let mut rows: Vec<(u64, String, String, bool)> = Vec::new();
    let mut planted: Vec<(u64, u64)> = Vec::new();
    let mut id = 100u64;
    for n in 0..150 {
        let words: Vec<String> = (0..20)
            .map(|_| vocabulary[next() % vocabulary.len()].clone())
            .collect();
        let original = id;
        rows.push((id, words.join(" "), "c".into(), true));
        id += 1;
        if n % 3 == 0 {
            let mut copy = words.clone();
            if n % 2 == 0 {
                let at = next() % copy.len();
                copy[at] = vocabulary[next() % vocabulary.len()].clone();
            } else {
                copy.pop();
            }
            rows.push((id, copy.join(" "), "c".into(), true));
            planted.push((original, id));
            id += 1;
        }
    }
    let reducers = format!(
        "\n[[fold.reducers]]\nname = \"incidents\"\ntype = \"count\"\nstage = \"judge\"\n{}\n",
        DEDUPE.replace("0.7", "0.75")
    );
    let folder = reports_spec(&rows, &reducers, "incidents");
    let dir = folder.path();
    let o = run_spec(dir);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let answer = json_of(&dir.join("out/answer.json"));
    let mut found = std::collections::BTreeSet::new();
    for (kept, ids) in groups_of(&answer, "incidents") {
        let mut group: Vec<u64> = ids.iter().filter_map(|i| i.parse().ok()).collect();
        group.push(kept.parse().expect("an id"));
        for a in &group {
            for b in &group {
                if a < b {
                    found.insert((*a, *b));
                }
            }
        }
    }
    let planted: std::collections::BTreeSet<(u64, u64)> = planted.into_iter().collect();
    let hits = found.intersection(&planted).count();
    let recall = hits as f64 / planted.len() as f64;
    let precision = hits as f64 / found.len().max(1) as f64;
    eprintln!(
        "{} planted pairs in {} reports: recall {recall:.3}, precision {precision:.3}",
        planted.len(),
        rows.len()
    );
    assert!(recall >= 0.9, "recall {recall}: {found:?}");
    assert!(precision >= 0.95, "precision {precision}: {found:?}");
}

#[test]
fn a_dedupe_on_a_reducer_that_does_not_count_is_refused_naming_it() {
    let cases = [
        (
            format!(
                "\n[[fold.reducers]]\nname = \"total\"\ntype = \"sum\"\nvalue = \"/n\"\nstage = \"judge\"\n{DEDUPE}\n"
            ),
            "reducer `total`: `dedupe` collapses near-duplicates before they are counted, which a `sum` does not do: it applies to `count`, `count_by` and `group_by`",
        ),
        (
            format!(
                "\n[[fold.reducers]]\nname = \"total\"\ntype = \"count\"\n{}\n",
                DEDUPE.replace("0.7", "1.5")
            ),
            "reducer `total`: dedupe.threshold 1.5 must be within (0, 1]",
        ),
        (
            format!(
                "\n[[fold.reducers]]\nname = \"total\"\ntype = \"count\"\n{}\n",
                DEDUPE.replace("minhash", "embedding")
            ),
            "unknown variant `embedding`, expected `minhash`",
        ),
        (
            format!(
                "\n[[fold.reducers]]\nname = \"total\"\ntype = \"count\"\n{}\n",
                DEDUPE.replace("unit:/title", "unit:title")
            ),
            "reducer `total` reads `unit:title`, whose unit path is not a JSON pointer: write `unit:/title`",
        ),
    ];
    for (reducers, said) in cases {
        let folder = reports_spec(&reports(), &reducers, "total");
        let dir = folder.path();
        let o = run(bin().current_dir(dir).args(["explain", "spec.toml"]));
        assert!(!o.status.success(), "{reducers}");
        assert!(stderr(&o).contains(said), "{reducers}\n{}", stderr(&o));
    }
}
