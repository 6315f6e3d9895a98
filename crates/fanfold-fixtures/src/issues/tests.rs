use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use super::corpus::{AREAS, AUTH_WORDS, BOT_TITLES, CAUSE_TEXT};
use super::*;

const SEED: u64 = 7;
const COUNT: usize = 1000;

fn by_number(issues: &[Value]) -> BTreeMap<u64, &Value> {
    issues
        .iter()
        .filter_map(|i| i["number"].as_u64().map(|n| (n, i)))
        .collect()
}

fn label_names(issue: &Value) -> Vec<&str> {
    issue["labels"]
        .as_array()
        .map(|a| a.iter().filter_map(|l| l["name"].as_str()).collect())
        .unwrap_or_default()
}

fn body(issue: &Value) -> &str {
    issue["body"].as_str().unwrap_or("")
}

#[test]
fn same_seed_same_bytes() -> serde_json::Result<()> {
    let a = generate(SEED, COUNT);
    let b = generate(SEED, COUNT);
    assert_eq!(a.oracle, b.oracle);
    assert_eq!(
        serde_json::to_string_pretty(&a.issues)?,
        serde_json::to_string_pretty(&b.issues)?
    );
    let c = generate(SEED + 1, COUNT);
    assert_ne!(a.oracle.blocker_ids, c.oracle.blocker_ids);
    Ok(())
}

#[test]
fn written_files_are_deterministic_and_parse_back() -> std::io::Result<()> {
    let dir = std::env::temp_dir().join(format!("fanfold-fixtures-test-{}", std::process::id()));
    let (a, b) = (dir.join("a"), dir.join("b"));
    write_issue_triage(&a, SEED, 200)?;
    write_issue_triage(&b, SEED, 200)?;
    for name in ["issues.json", "oracle.json"] {
        let x = std::fs::read(a.join(name))?;
        let y = std::fs::read(b.join(name))?;
        assert_eq!(x, y, "{name} differs between runs");
        assert!(x.ends_with(b"]\n") || x.ends_with(b"}\n"));
        assert!(x.starts_with(b"[\n  {") || x.starts_with(b"{\n  \""));
    }
    let oracle: Oracle = serde_json::from_slice(&std::fs::read(a.join("oracle.json"))?)?;
    assert_eq!(oracle, generate(SEED, 200).oracle);
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

#[test]
fn numbers_are_unique_complete_and_descending() {
    let g = generate(SEED, COUNT);
    assert_eq!(g.issues.len(), COUNT);
    let numbers: Vec<u64> = g
        .issues
        .iter()
        .filter_map(|i| i["number"].as_u64())
        .collect();
    assert_eq!(numbers.len(), COUNT);
    let expected: Vec<u64> = (1..=COUNT as u64).rev().collect();
    assert_eq!(numbers, expected);
}

#[test]
fn shape_is_exactly_gh_issue_list() {
    let g = generate(SEED, COUNT);
    let top = [
        "author",
        "body",
        "createdAt",
        "labels",
        "milestone",
        "number",
        "state",
        "title",
        "updatedAt",
        "url",
    ];
    let vocabulary: BTreeSet<&str> = LABELS.iter().map(|(n, _, _)| *n).collect();
    let mut last_created = String::from("9999");
    for issue in &g.issues {
        let obj = issue.as_object().expect("issue is an object");
        let keys: Vec<&str> = obj.keys().map(String::as_str).collect();
        assert_eq!(keys, top);

        let author = issue["author"].as_object().expect("author object");
        let keys: Vec<&str> = author.keys().map(String::as_str).collect();
        assert_eq!(keys, ["id", "is_bot", "login", "name"]);
        assert!(issue["author"]["is_bot"].is_boolean());
        assert!(
            issue["author"]["id"]
                .as_str()
                .is_some_and(|s| s.starts_with("MD"))
        );

        for label in issue["labels"].as_array().expect("labels array") {
            let keys: Vec<&str> = label
                .as_object()
                .expect("label object")
                .keys()
                .map(String::as_str)
                .collect();
            assert_eq!(keys, ["id", "name", "description", "color"]);
            assert!(vocabulary.contains(label["name"].as_str().unwrap_or("")));
            let color = label["color"].as_str().unwrap_or("");
            assert!(color.len() == 6 && color.chars().all(|c| c.is_ascii_hexdigit()));
            assert!(
                label["id"]
                    .as_str()
                    .is_some_and(|s| s.starts_with("LA_kwDO"))
            );
        }

        match &issue["milestone"] {
            Value::Null => {}
            Value::Object(m) => {
                let keys: Vec<&str> = m.keys().map(String::as_str).collect();
                assert_eq!(keys, ["number", "title", "description", "dueOn"]);
            }
            other => panic!("milestone {other}"),
        }

        let state = issue["state"].as_str().unwrap_or("");
        assert!(state == "OPEN" || state == "CLOSED");
        let created = issue["createdAt"].as_str().unwrap_or("");
        let updated = issue["updatedAt"].as_str().unwrap_or("");
        for ts in [created, updated] {
            assert_eq!(ts.len(), 20, "{ts}");
            assert!(ts.ends_with('Z') && &ts[10..11] == "T");
        }
        assert!(updated >= created, "{updated} < {created}");
        assert!(
            created < last_created.as_str(),
            "creation order follows numbers"
        );
        last_created = created.to_string();
        let n = issue["number"].as_u64().unwrap_or(0);
        assert_eq!(
            issue["url"].as_str(),
            Some(format!("https://github.com/acme-corp/widget/issues/{n}").as_str())
        );
        assert!(issue["title"].as_str().is_some_and(|t| !t.is_empty()));
        assert!(issue["body"].is_string());
    }
}

#[test]
fn blockers_are_open_and_state_their_cause() {
    let g = generate(SEED, COUNT);
    let plan = plan(SEED, COUNT);
    let issues = by_number(&g.issues);
    let n = g.oracle.blocker_ids.len();
    assert!((40..=60).contains(&n), "{n} blockers");
    assert!(g.oracle.blocker_ids.windows(2).all(|w| w[0] < w[1]));
    for id in &g.oracle.blocker_ids {
        assert_eq!(issues[id]["state"], "OPEN", "#{id}");
    }
    for slot in &plan.slots {
        if let Kind::Blocker(cause) = slot.kind {
            let text = body(issues[&slot.number]);
            assert!(
                CAUSE_TEXT[cause].sentences.iter().any(|s| text.contains(s)),
                "#{} has no quotable cause",
                slot.number
            );
            assert!(g.oracle.blocker_ids.contains(&slot.number));
        }
    }
}

#[test]
fn oracle_causes_are_the_top_three_by_frequency() {
    let g = generate(SEED, COUNT);
    let plan = plan(SEED, COUNT);
    let mut counts = [0usize; 6];
    for slot in &plan.slots {
        if let Kind::Blocker(c) = slot.kind {
            counts[c] += 1;
        }
    }
    let names: Vec<&str> = g.oracle.causes.iter().map(|c| c.cause.as_str()).collect();
    assert_eq!(names, &CAUSES[..3]);
    let sizes: Vec<usize> = g.oracle.causes.iter().map(|c| c.ids.len()).collect();
    assert_eq!(sizes, &counts[..3]);
    assert!(sizes[0] > sizes[1] && sizes[1] > sizes[2]);
    assert!(
        counts[3..]
            .iter()
            .all(|&m| (1..=3).contains(&m) && m < sizes[2])
    );
    let all: BTreeSet<u64> = g.oracle.causes.iter().flat_map(|c| c.ids.clone()).collect();
    assert!(all.iter().all(|id| g.oracle.blocker_ids.contains(id)));
}

#[test]
fn every_decoy_category_is_present_and_non_empty() {
    let g = generate(SEED, COUNT);
    let keys: BTreeSet<&str> = g.oracle.decoys.keys().map(String::as_str).collect();
    let expected: BTreeSet<&str> = DECOY_CATEGORIES.iter().copied().collect();
    assert_eq!(keys, expected);
    for (name, ids) in &g.oracle.decoys {
        assert!(!ids.is_empty(), "{name} is empty");
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "{name} not sorted");
    }
    let issues = by_number(&g.issues);
    let blockers: BTreeSet<u64> = g.oracle.blocker_ids.iter().copied().collect();
    let decoy = |name: &str| g.oracle.decoys.get(name).cloned().unwrap_or_default();

    for id in decoy("closed_auth_blockers") {
        assert_eq!(issues[&id]["state"], "CLOSED");
        assert!(!blockers.contains(&id));
    }
    for id in decoy("near_duplicates") {
        assert!(blockers.contains(&id));
        let text = body(issues[&id]);
        let pos = text.find('#').expect("near-duplicate references an issue");
        let digits: String = text[pos + 1..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        let original: u64 = digits.parse().expect("issue number");
        assert!(original < id && blockers.contains(&original));
    }
    let noisy = decoy("noisy_labels");
    assert!(noisy.iter().any(|id| blockers.contains(id)));
    assert!(noisy.iter().any(|id| !blockers.contains(id)));
    for id in noisy {
        let has_label = label_names(issues[&id]).contains(&"release-blocker");
        assert_eq!(has_label, !blockers.contains(&id), "#{id}");
    }
    for name in [
        "open_auth_not_blocker",
        "blocker_other_area",
        "auth_in_passing",
        "legacy_auth",
    ] {
        for id in decoy(name) {
            assert!(!blockers.contains(&id), "{name} #{id}");
        }
    }
    // Label noise on true blockers: the `area/auth` label is not reliable.
    assert!(
        g.oracle
            .blocker_ids
            .iter()
            .any(|id| !label_names(issues[id]).contains(&"area/auth"))
    );
}

#[test]
fn top_causes_have_enough_phrasings() {
    for (i, text) in CAUSE_TEXT.iter().enumerate().take(3) {
        assert!(text.sentences.len() >= 6, "{}", CAUSES[i]);
    }
    assert_eq!(CAUSE_TEXT.len(), CAUSES.len());
}

fn mentions_auth(text: &str) -> Option<&'static str> {
    let lower = text.to_lowercase();
    AUTH_WORDS.iter().copied().find(|w| {
        lower.match_indices(w).any(|(i, _)| {
            i == 0
                || !lower[..i]
                    .chars()
                    .next_back()
                    .is_some_and(char::is_alphanumeric)
        })
    })
}

#[test]
fn filler_never_talks_about_authentication() {
    for area in AREAS {
        for t in area
            .bug_titles
            .iter()
            .chain(area.feature_titles)
            .chain(area.details)
            .chain(area.logs)
        {
            assert_eq!(mentions_auth(t), None, "{t}");
        }
    }
    for t in BOT_TITLES {
        assert_eq!(mentions_auth(t), None, "{t}");
    }
    let g = generate(SEED, COUNT);
    let issues = by_number(&g.issues);
    for slot in plan(SEED, COUNT).slots {
        if slot.kind == Kind::Filler {
            let issue = issues[&slot.number];
            let text = format!("{} {}", issue["title"], body(issue));
            assert_eq!(mentions_auth(&text), None, "#{}", slot.number);
        }
    }
}

#[test]
fn bodies_vary_like_a_real_tracker() {
    let g = generate(SEED, COUNT);
    let bodies: Vec<&str> = g.issues.iter().map(body).collect();
    let long = bodies.iter().filter(|b| b.len() >= 5_000).count();
    assert!(long >= 20, "{long} long bodies");
    assert!(bodies.iter().all(|b| b.len() <= 20_480));
    assert!(bodies.iter().any(|b| b.is_empty()));
    assert!(bodies.iter().filter(|b| !b.is_ascii()).count() >= 20);
    let titles: BTreeSet<&str> = g
        .issues
        .iter()
        .filter_map(|i| i["title"].as_str())
        .collect();
    assert!(
        titles.len() > COUNT * 7 / 10,
        "{} distinct titles",
        titles.len()
    );
    assert!(g.issues.iter().any(|i| i["author"]["is_bot"] == true));
}

#[test]
fn small_and_odd_counts_do_not_panic() {
    for count in [0, 1, 2, 5, 17, 50, 150, 333] {
        let g = generate(3, count);
        assert_eq!(g.issues.len(), count);
        assert_eq!(g.oracle.count, count);
        assert!(g.oracle.causes.len() <= 3);
        let issues = by_number(&g.issues);
        for id in &g.oracle.blocker_ids {
            assert_eq!(issues[id]["state"], "OPEN");
        }
    }
}

/// Regenerates the committed example. Run with
/// `FANFOLD_FIXTURE_OUT=examples/issue-triage cargo test -p fanfold-fixtures -- --ignored regenerate_example`.
#[test]
#[ignore = "writes files; run on demand with FANFOLD_FIXTURE_OUT set"]
fn regenerate_example() -> std::io::Result<()> {
    match std::env::var_os("FANFOLD_FIXTURE_OUT") {
        Some(dir) => write_issue_triage(std::path::Path::new(&dir), 7, 1000),
        None => Ok(()),
    }
}

/// The labels file committed beside the example is the fixture's own
/// truth, exactly as `write_issue_triage` writes it: `blocker` for every
/// true blocker and nothing else.
#[test]
fn committed_truth_labels_are_the_fixtures_truth() {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/issue-triage");
    let committed =
        std::fs::read_to_string(example.join(TRUTH_LABELS)).expect("the committed labels file");
    let oracle = generate(SEED, COUNT).oracle;
    assert_eq!(committed, truth_labels(&oracle));
    let blockers: BTreeSet<String> = committed
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["decision"] == "blocker")
        .filter_map(|v| v["id"].as_str().map(str::to_owned))
        .collect();
    let truth: BTreeSet<String> = oracle.blocker_ids.iter().map(u64::to_string).collect();
    assert_eq!(blockers, truth);
    assert_eq!(committed.lines().count(), COUNT);
}
