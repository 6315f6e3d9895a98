//! Observations that re-enter: a tool's records bred into units of their
//! own, under the budget's depth, fan-out and per-level limits.

use super::*;

/// A tool stage reading `{root}/<id>.json` whose records (`{id, flag}`)
/// re-enter at `to`, then pass the unit on to `then`.
fn bearing_tool(name: &str, root: &str, then: &str, to: &str) -> String {
    format!(
        r#"[[stages]]
name = "{name}"
type = "tool"
version = 1
request = '{{id}}'
args = {{ id = {{ type = "integer", minimum = 0 }} }}
capability = {{ type = "file", root = "{root}", path = "{{id}}.json" }}
as = "{name}_records"
then = "{then}"
enter = {{ stage = "{to}", key = "id", kind = "linked" }}
"#
    )
}

/// Writes `{root}/<parent>.json` holding records of the given ids, each
/// flagged when the id is even.
fn links(f: &Fixture, root: &str, parent: u64, children: &[u64]) {
    std::fs::create_dir_all(f.path(root)).unwrap();
    let records: Vec<Value> = children
        .iter()
        .map(|c| serde_json::json!({"id": c, "flag": c % 2 == 0}))
        .collect();
    std::fs::write(
        f.path(&format!("{root}/{parent}.json")),
        serde_json::to_vec(&records).unwrap(),
    )
    .unwrap();
}

fn rows(ids: &[u64]) -> Vec<u8> {
    let rows: Vec<Value> = ids
        .iter()
        .map(|i| serde_json::json!({"id": i, "flag": false}))
        .collect();
    serde_json::to_vec(&rows).unwrap()
}

fn tree(f: &Fixture) -> Value {
    f.certificate()["stats"]["tree"].clone()
}

fn bred_ids(f: &Fixture) -> Vec<String> {
    f.jsonl("out/bred.jsonl")
        .iter()
        .map(|b| b["id"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn the_links_example_bears_linked_issues_under_a_fanout_of_five_and_a_rerun_reuses_them() {
    let dir = tempfile::tempdir().unwrap();
    let ex = repo().join("examples/issue-links");
    let copy = |from: &Path, to: &Path| {
        for e in std::fs::read_dir(from).unwrap() {
            let e = e.unwrap();
            if e.path().is_file() {
                std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
            }
        }
    };
    copy(&ex, dir.path());
    std::fs::create_dir_all(dir.path().join("links")).unwrap();
    copy(&ex.join("links"), &dir.path().join("links"));
    let go = |out: &str| {
        run(bin()
            .current_dir(dir.path())
            .args(["run", "spec.toml", "--backend", "scripted", "--json"])
            .args(["--store", "store.sqlite", "--out", out]))
    };
    let o = go("out");
    assert!(o.status.success(), "{}", stderr(&o));
    let cert: Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("out/certificate.json")).unwrap())
            .unwrap();
    let tree = &cert["stats"]["tree"];
    // Issue 7 links eight issues: five are born, three are cut and named.
    assert_eq!(tree["fanout_max"], 5, "{tree}");
    assert_eq!(tree["offered_max"], 8, "{tree}");
    assert_eq!(tree["cut"]["max_fanout"], 3, "{tree}");
    let cut: Vec<&str> = tree["dropped"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["reason"] == "max_fanout")
        .map(|d| d["id"].as_str().unwrap())
        .collect();
    assert_eq!(cut, ["7>109", "7>110", "7>111"]);
    // One level deep: every bred unit is at depth 1, none deeper.
    let depths = tree["units_by_depth"].as_array().unwrap();
    assert_eq!(depths.len(), 2, "{tree}");
    let bred: Vec<Value> = std::fs::read_to_string(dir.path().join("out/bred.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(depths[1], bred.len() as u64);
    assert!(bred.iter().all(|b| b["depth"] == 1));
    // A blocker found only through a link is in the answer, and verified.
    let answer: Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("out/answer.json")).unwrap())
            .unwrap();
    let ids: Vec<&str> = answer["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["unit_id"].as_str().unwrap())
        .collect();
    assert!(ids.contains(&"7>104") && ids.contains(&"1>101"), "{ids:?}");
    assert!(!ids.iter().any(|id| id.starts_with("7>109")), "{ids:?}");
    assert_eq!(cert["verify"]["passed"], true);
    let md = std::fs::read_to_string(dir.path().join("out/answer.md")).unwrap();
    assert!(md.contains("bred units: units depth 0"), "{md}");
    let calls = cert["stats"]["model_calls"].as_u64().unwrap();
    assert_eq!(calls, depths[0].as_u64().unwrap() + bred.len() as u64);

    // explain reads the same tree from the stored observations.
    let e = run(bin().current_dir(dir.path()).args([
        "explain",
        "spec.toml",
        "--store",
        "store.sqlite",
    ]));
    assert!(e.status.success(), "{}", stderr(&e));
    let shown = stdout(&e);
    assert!(
        shown.contains("max_depth=1 max_fanout=5; level 0 model_calls=100, level 1 model_calls=50"),
        "{shown}"
    );
    assert!(
        shown.contains(&format!(
            "5 of its stored observations bear {} units (depth 1) for `judge`, at most 5 a unit; the limits drop max_fanout 3, repeated_key 1",
            bred.len()
        )),
        "{shown}"
    );

    // The folder re-checks against its source, but the bred records are
    // what a tool observed, which verify never asks again: it finds no
    // mismatch, and still does not vouch for them.
    let v = run(bin().arg("verify").arg(dir.path().join("out")));
    assert!(!v.status.success(), "{}{}", stdout(&v), stderr(&v));
    assert!(
        stdout(&v).contains("FAILED, 0 mismatches")
            && stdout(&v).contains(&format!(
                "{} units were bred from tool observations",
                bred.len()
            )),
        "{}",
        stdout(&v)
    );

    // A bred line may not take the id of a unit the source holds.
    let path = dir.path().join("out/bred.jsonl");
    let original = std::fs::read_to_string(&path).unwrap();
    let first = original.lines().next().unwrap().to_owned();
    let line: Value = serde_json::from_str(&first).unwrap();
    let mut shadow = line.clone();
    shadow["id"] = line["parent"].clone();
    std::fs::write(&path, format!("{}\n{original}", shadow)).unwrap();
    let v = run(bin().arg("verify").arg(dir.path().join("out")));
    assert!(
        stdout(&v).contains("is already a unit of the source"),
        "{}",
        stdout(&v)
    );
    std::fs::write(&path, &original).unwrap();

    // A rerun bears the same units and pays for none of them.
    let o = go("again");
    assert!(o.status.success(), "{}", stderr(&o));
    let again: Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("again/certificate.json")).unwrap())
            .unwrap();
    assert_eq!(again["stats"]["model_calls"], 0);
    for same in ["units_by_depth", "dropped", "cut", "fanout_mean"] {
        assert_eq!(again["stats"]["tree"][same], tree[same], "{same}");
    }
    let bred_again = std::fs::read_to_string(dir.path().join("again/bred.jsonl")).unwrap();
    assert_eq!(
        bred_again,
        std::fs::read_to_string(dir.path().join("out/bred.jsonl")).unwrap()
    );

    let path = dir.path().join("out/bred.jsonl");
    let edited = std::fs::read_to_string(&path).unwrap().replace(
        "Migrations fail on an empty database",
        "Migrations fail on an empty disk",
    );
    std::fs::write(&path, edited).unwrap();
    let v = run(bin().arg("verify").arg(dir.path().join("out")));
    assert!(!v.status.success(), "{}", stdout(&v));
    assert!(stdout(&v).contains("7>104") || stderr(&v).contains("7>104"));
}

#[test]
fn max_depth_cuts_the_second_level_and_records_what_it_cut() {
    let extra = |depth: u32| {
        format!(
            "{}\n{}\n[budget]\nmax_depth = {depth}\n",
            bearing_tool("first", "links", "second", "second"),
            bearing_tool("second", "deeper", "judge", "judge"),
        )
    };
    let f = Fixture::new(JSON_ARRAY, &extra(1));
    f.input(&rows(&[1, 2, 3]));
    links(&f, "links", 1, &[10, 11]);
    links(&f, "links", 2, &[20]);
    // What the first level's units would bear at depth 2.
    links(&f, "deeper", 10, &[100, 101, 102]);
    links(&f, "deeper", 20, &[200]);
    let o = f.run(&[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let t = tree(&f);
    assert_eq!(t["units_by_depth"], serde_json::json!([3, 3]), "{t}");
    assert_eq!(t["cut"]["max_depth"], 4, "{t}");
    let cut: Vec<&str> = t["dropped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["id"].as_str().unwrap())
        .collect();
    assert_eq!(cut, ["1>10>100", "1>10>101", "1>10>102", "2>20>200"]);
    assert!(f.answer_ids().iter().all(|id| id.matches('>').count() < 2));

    // Allowed one level more, the same records are born and judged.
    std::fs::write(
        f.path("spec.toml"),
        std::fs::read_to_string(f.path("spec.toml"))
            .unwrap()
            .replace("max_depth = 1", "max_depth = 2"),
    )
    .unwrap();
    let o = f.run(&[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let t = tree(&f);
    assert_eq!(t["units_by_depth"], serde_json::json!([3, 3, 4]), "{t}");
    assert!(t["cut"].get("max_depth").is_none(), "{t}");
    let mut got = f.answer_ids();
    got.sort();
    assert_eq!(got, ["1>10", "1>10>100", "1>10>102", "2>20", "2>20>200"]);
}

#[test]
fn fanout_cuts_children_past_the_limit_and_lists_each() {
    let f = Fixture::new(
        JSON_ARRAY,
        &format!(
            "{}\n[budget]\nmax_fanout = 5\n",
            bearing_tool("linked", "links", "judge", "judge")
        ),
    );
    f.input(&rows(&[1, 2]));
    links(&f, "links", 1, &[10, 11, 12, 13, 14, 15, 16, 17]);
    links(&f, "links", 2, &[20, 21]);
    let o = f.run(&[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let t = tree(&f);
    assert_eq!(t["units_by_depth"], serde_json::json!([2, 7]), "{t}");
    assert_eq!(t["cut"]["max_fanout"], 3, "{t}");
    assert_eq!(t["fanout_max"], 5);
    assert_eq!(t["offered_max"], 8);
    assert_eq!(t["fanout_mean"], 3.5);
    let dropped: Vec<(&str, &str)> = t["dropped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| (d["id"].as_str().unwrap(), d["reason"].as_str().unwrap()))
        .collect();
    assert_eq!(
        dropped,
        [
            ("1>15", "max_fanout"),
            ("1>16", "max_fanout"),
            ("1>17", "max_fanout")
        ]
    );
    assert_eq!(
        bred_ids(&f),
        ["1>10", "1>11", "1>12", "1>13", "1>14", "2>20", "2>21"]
    );
    let r = &f.certificate()["stats"]["tools"]["linked"];
    assert_eq!(r["bore"], 7, "{r}");
    assert_eq!(r["dropped"]["max_fanout"], 3, "{r}");
}

#[test]
fn a_spent_level_ends_its_units_not_run_and_the_run_exits_incomplete() {
    let f = Fixture::new(
        JSON_ARRAY,
        &format!(
            "{}\n[budget]\nper_level = [{{}}, {{ max_model_calls = 2 }}]\n",
            bearing_tool("linked", "links", "judge", "judge")
        ),
    );
    f.input(&rows(&[1, 2, 3]));
    for p in 1..=3u64 {
        links(
            &f,
            "links",
            p,
            &[p * 10, p * 10 + 1, p * 10 + 2, p * 10 + 3],
        );
    }
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let md = std::fs::read_to_string(f.path("out/answer.md")).unwrap();
    assert!(md.starts_with("# INCOMPLETE"), "{md}");
    assert!(md.contains("level_model_calls"), "{md}");
    let t = tree(&f);
    let levels = t["levels"].as_array().unwrap();
    // Level 0 spent what it needed; level 1 two calls, its other ten unrun.
    assert_eq!(levels[0]["model_calls"], 3, "{t}");
    assert_eq!(levels[0]["not_run"], 0, "{t}");
    assert_eq!(levels[1]["model_calls"], 2, "{t}");
    assert_eq!(levels[1]["max_model_calls"], 2, "{t}");
    assert_eq!(levels[1]["not_run"], 10, "{t}");
    assert_eq!(t["cut"]["per_level"], 10, "{t}");
    let facts = f.jsonl("out/facts.jsonl");
    let unrun: Vec<&Value> = facts.iter().filter(|f| f["status"] == "not_run").collect();
    assert_eq!(unrun.len(), 10);
    assert!(unrun.iter().all(|f| {
        f["reason"] == "budget_exhausted:level_model_calls:1"
            && f["source_ids"][0].as_str().unwrap().contains('>')
    }));
    let cert = f.certificate();
    assert_eq!(cert["complete"], false);
    assert_eq!(cert["stats"]["model_calls"], 5);
}

#[test]
fn bred_ids_are_stable_across_runs_and_a_rerun_makes_no_new_call() {
    let f = Fixture::new(
        JSON_ARRAY,
        &bearing_tool("linked", "links", "judge", "judge"),
    );
    f.input(&rows(&[1, 2]));
    links(&f, "links", 1, &[10, 11]);
    // A record without its key is named by its content.
    std::fs::write(
        f.path("links/2.json"),
        r#"[{"flag": true, "note": "no id"}, {"id": 21, "flag": false}]"#,
    )
    .unwrap();
    let o = f.run(&[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let first = bred_ids(&f);
    assert_eq!(first.len(), 4);
    assert!(
        first[2].starts_with("2>c") && first[2].len() == "2>c".len() + 16,
        "{first:?}"
    );
    let calls = f.certificate()["stats"]["model_calls"].as_u64().unwrap();
    assert_eq!(calls, 6);
    // A fresh store reads the same files: the same ids.
    std::fs::remove_file(f.path("store.sqlite")).unwrap();
    let o = f.run(&[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(bred_ids(&f), first);
    // The same store: every bred unit's fact is reused.
    let o = f.run(&[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(bred_ids(&f), first);
    let cert = f.certificate();
    assert_eq!(cert["stats"]["model_calls"], 0);
    assert_eq!(cert["stats"]["cache_hits"], 6);
    let mut ids = f.answer_ids();
    ids.sort();
    assert_eq!(ids, ["1>10", first[2].as_str()]);
}
