//! The interval contract: an estimate of a share, judged in a seeded
//! random order, stopped once the interval is narrow enough, and said to
//! be an estimate everywhere the answer is shown.

use super::*;

/// A copy of an example's files in a folder of its own, so a test may
/// change its spec.
struct Example {
    dir: tempfile::TempDir,
}

impl Example {
    fn copy(example: &str, files: &[&str]) -> Example {
        let dir = tempfile::tempdir().expect("tempdir");
        let from = repo().join("examples").join(example);
        for f in files {
            let to = dir.path().join(f);
            if let Some(parent) = to.parent() {
                std::fs::create_dir_all(parent).expect("folder");
            }
            std::fs::copy(from.join(f), &to).expect("copy");
        }
        Example { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The spec with its `[contract]` table replaced by `contract`, written
    /// as `name`.
    fn with_contract(&self, name: &str, contract: &str) {
        let spec = std::fs::read_to_string(self.path("interval.toml")).expect("spec");
        let at = spec.find("[contract]").expect("a contract");
        let rest = &spec[at..];
        let end = rest[1..].find("\n[").map_or(rest.len(), |e| e + 1);
        let changed = format!("{}{contract}\n{}", &spec[..at], &rest[end..]);
        std::fs::write(self.path(name), changed).expect("spec");
    }

    fn run(&self, spec: &str, store: &str, out: &str) -> Output {
        run(bin()
            .arg("run")
            .arg(self.path(spec))
            .args(["--backend", "scripted", "--store"])
            .arg(self.path(store))
            .arg("--out")
            .arg(self.path(out)))
    }

    fn json(&self, file: &str) -> Value {
        let text = std::fs::read_to_string(self.path(file)).expect("output file");
        serde_json::from_str(&text).expect("json")
    }
}

const TRIAGE: &[&str] = &[
    "interval.toml",
    "issues.json",
    "rubric.md",
    "fact.schema.json",
    "scripted-judge.jq",
];

/// The share the exhaustive contract counts lies in the estimate's
/// interval; the estimate judged far fewer units, cancelled the rest by
/// the contract, says it is an estimate, and a rerun asks nothing.
#[test]
fn an_interval_stops_early_covers_the_count_and_reruns_from_the_cache() {
    let ex = Example::copy("issue-triage", TRIAGE);
    let o = ex.run("interval.toml", "store.sqlite", "out");
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let cert = ex.json("out/certificate.json");
    assert_eq!(cert["contract"], "interval");
    assert_eq!(
        cert["stop"]["reason"], "contract_satisfied",
        "{}",
        cert["stop"]
    );
    assert_eq!(cert["complete"], true, "{}", cert["incomplete"]);
    let routed = cert["routed_by_stage"]["release_blocker"]
        .as_u64()
        .expect("routed");
    let calls = cert["stats"]["model_calls"].as_u64().expect("calls");
    let cancelled = cert["statuses"]["cancelled"].as_u64().expect("cancelled");
    assert!(calls * 2 < routed, "{calls} calls for {routed} units");
    assert!(
        cancelled > 0 && cancelled + calls >= routed,
        "{cancelled} cancelled"
    );

    let answer = ex.json("out/answer.json");
    let est = &answer["estimate"];
    assert_eq!(est["reached"], true, "{est}");
    assert_eq!(est["routed"].as_u64(), Some(routed), "{est}");
    let judged = est["judged"].as_u64().expect("judged");
    assert!(judged <= calls && judged * 2 < routed, "{est}");
    let group = &est["groups"][0];
    let (lower, upper) = (
        group["lower"].as_f64().expect("lower"),
        group["upper"].as_f64().expect("upper"),
    );
    assert!(upper - lower <= 0.1 + 1e-9, "{est}");
    assert_eq!(cert["estimate"], *est);

    // Every unit not judged was cancelled by the contract, and says so.
    let facts: Vec<Value> = std::fs::read_to_string(ex.path("out/facts.jsonl"))
        .expect("facts")
        .lines()
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect();
    let by_contract = facts
        .iter()
        .filter(|f| {
            f["status"] == "cancelled"
                && f["reason"]
                    .as_str()
                    .is_some_and(|r| r.ends_with("contract_satisfied"))
        })
        .count() as u64;
    assert_eq!(by_contract, cancelled);

    let md = std::fs::read_to_string(ex.path("out/answer.md")).expect("answer.md");
    assert!(md.contains("## Answer: an ESTIMATE"), "{md}");
    assert!(
        md.contains(&format!("{judged} of {routed} units judged")),
        "{md}"
    );
    assert!(md.contains("95 % interval"), "{md}");
    assert!(!md.starts_with("# INCOMPLETE"), "{md}");

    // The exhaustive contract's count, every unit judged, is inside.
    ex.with_contract(
        "exhaustive.toml",
        "[contract]\ntype = \"exhaustive\"\nanswer = \"blockers\"\n",
    );
    let o = ex.run("exhaustive.toml", "all.sqlite", "all");
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let all = ex.json("all/certificate.json");
    let all_calls = all["stats"]["model_calls"].as_u64().expect("calls");
    assert_eq!(all_calls, routed);
    let positives = all["statuses_by_stage"]["release_blocker"]["positive"]
        .as_u64()
        .expect("positives");
    let share = positives as f64 / routed as f64;
    assert!(
        lower <= share && share <= upper,
        "{share} outside [{lower}, {upper}]"
    );

    // A rerun is served from the cache: the same units, no call.
    let o = ex.run("interval.toml", "store.sqlite", "again");
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let again = ex.json("again/certificate.json");
    assert_eq!(again["stats"]["model_calls"], 0, "{}", again["stats"]);
    assert_eq!(again["estimate"], cert["estimate"]);
}

/// A budget that ends first leaves the answer incomplete, with the
/// interval it reached so far.
#[test]
fn a_budget_that_ends_first_leaves_an_incomplete_estimate() {
    let ex = Example::copy("issue-triage", TRIAGE);
    let spec = std::fs::read_to_string(ex.path("interval.toml")).expect("spec");
    std::fs::write(
        ex.path("interval.toml"),
        spec.replace("max_model_calls = 5000", "max_model_calls = 30"),
    )
    .expect("spec");
    let o = ex.run("interval.toml", "store.sqlite", "out");
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let answer = ex.json("out/answer.json");
    assert_eq!(answer["complete"], false);
    let est = &answer["estimate"];
    assert_eq!(est["reached"], false, "{est}");
    let judged = est["judged"].as_u64().expect("judged");
    assert!(judged > 0 && judged <= 30, "{est}");
    let md = std::fs::read_to_string(ex.path("out/answer.md")).expect("answer.md");
    assert!(md.starts_with("# INCOMPLETE"), "{md}");
    assert!(
        md.contains("ESTIMATE") && md.contains("did not reach ±5.0 %"),
        "{md}"
    );
}

/// A `count_by`: each group's share, all of them together at the declared
/// confidence, over the groups the fact schema names.
#[test]
fn a_count_by_estimates_every_group_the_schema_names() {
    let ex = Example::copy(
        "bgl-alerts",
        &[
            "interval.toml",
            "data/BGL_2k.log_structured.csv",
            "rubric.md",
            "fact.schema.json",
            "scripted-judge.jq",
        ],
    );
    let o = ex.run("interval.toml", "store.sqlite", "out");
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let est = ex.json("out/answer.json")["estimate"].clone();
    let groups = est["groups"].as_array().expect("groups");
    assert_eq!(groups.len(), 8, "{est}");
    assert!(groups.iter().any(|g| g["key"] == "memory"), "{est}");
    for g in groups {
        assert!(
            g["half_width"].as_f64().expect("width") <= 0.05 + 1e-9,
            "{g}"
        );
    }
    assert!(est["judged"].as_u64().expect("judged") < 2000, "{est}");
    let md = std::fs::read_to_string(ex.path("out/answer.md")).expect("answer.md");
    assert!(md.contains("the 8 groups hold together"), "{md}");

    let o = run(bin()
        .args(["explain", "--no-input"])
        .arg(ex.path("interval.toml")));
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("contract  interval: estimate the share of routed units `kinds` (count_by) counts for each of 8 groups"),
        "{}",
        stdout(&o)
    );
}

/// Reducers an interval cannot estimate are refused when the spec is
/// checked, naming the setting.
#[test]
fn an_interval_over_a_set_or_unnamed_groups_is_refused() {
    let ex = Example::copy("issue-triage", TRIAGE);
    let spec = std::fs::read_to_string(ex.path("interval.toml")).expect("spec");
    let set = spec.replace(
        "name = \"blockers\"\ntype = \"count\"",
        "name = \"blockers\"\ntype = \"set\"",
    );
    std::fs::write(ex.path("set.toml"), set).expect("spec");
    let o = run(bin()
        .args(["explain", "--no-input"])
        .arg(ex.path("set.toml")));
    assert_eq!(o.status.code(), Some(2), "{}", stdout(&o));
    assert!(
        stderr(&o).contains("contract.reducer `blockers` is a `set` reducer; an interval contract estimates a `count` or a `count_by`"),
        "{}",
        stderr(&o)
    );
    let keyed = spec
        .replace("reducer = \"blockers\"", "reducer = \"causes\"")
        .replace("key = \"/cause\"", "key = \"/evidence\"");
    std::fs::write(ex.path("keyed.toml"), keyed).expect("spec");
    let o = run(bin()
        .args(["explain", "--no-input"])
        .arg(ex.path("keyed.toml")));
    assert_eq!(o.status.code(), Some(2), "{}", stdout(&o));
    assert!(
        stderr(&o).contains("must name its groups with an `enum` at `/evidence`"),
        "{}",
        stderr(&o)
    );
    let fine = spec.replace("half_width = 0.05", "half_width = 0.0001");
    std::fs::write(ex.path("fine.toml"), fine).expect("spec");
    let o = run(bin()
        .args(["explain", "--no-input"])
        .arg(ex.path("fine.toml")));
    assert_eq!(o.status.code(), Some(2), "{}", stdout(&o));
    assert!(
        stderr(&o).contains("contract.half_width must be at least 0.001"),
        "{}",
        stderr(&o)
    );
}

/// The run's HTML report states the estimate as answer.md does, as a
/// person sees it in a browser: an estimate with its interval, not the
/// count of the units judged.
#[test]
fn the_run_report_shows_the_estimate_and_its_interval() {
    let browser = chromium();
    let ex = Example::copy("issue-triage", TRIAGE);
    let o = ex.run("interval.toml", "store.sqlite", "out");
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = run(bin().arg("report").arg("run").arg(ex.path("out")));
    assert!(o.status.success(), "{}", stderr(&o));
    let (dom, _) = render(&browser, &ex.path("out/report.html"));
    let answer = ex.json("out/answer.json");
    let group = &answer["estimate"]["groups"][0];
    let pct = |v: &Value| format!("{:.1} %", 100.0 * v.as_f64().expect("a share"));
    assert!(
        dom.contains("<h2>Answer: an ESTIMATE"),
        "no estimate heading"
    );
    let row = format!(
        "<td>counted</td><td>{}</td><td>{} – {}</td>",
        pct(&group["share"]),
        pct(&group["lower"]),
        pct(&group["upper"])
    );
    assert!(dom.contains(&row), "the page does not show {row}");
    let judged = answer["estimate"]["judged"].as_u64().expect("judged");
    assert!(
        dom.contains(&format!("{judged} of ")),
        "the page does not say how many units were judged"
    );
    let md = std::fs::read_to_string(ex.path("out/report.md")).expect("report.md");
    assert!(md.contains("## Answer: an ESTIMATE"));
}
