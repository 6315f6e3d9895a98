//! Reducers and stated answers: top-k pruning, sums, means, ratios,
//! groups and pairs, and the film-review examples against their oracle.

use super::*;

mod bounded_cluster;
mod dedupe;

#[test]
fn top_k_cancels_only_what_cannot_enter() {
    let extra = "[contract]\ntype = \"top_k\"\nk = 3\nscore = \"/score\"\nbound = \".score\"\n";
    let f = Fixture::new(r#"{ type = "jsonl", key = "id", kind = "row" }"#, extra);
    let mut input = String::new();
    for i in 0..40 {
        input.push_str(&format!(
            "{{\"id\": {i}, \"flag\": {}, \"score\": {}}}\n",
            i % 2 == 0,
            (i * 7) % 40
        ));
    }
    f.input(input.as_bytes());
    let o = f.run(&["--slots", "1"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let c = f.certificate();
    assert_eq!(c["stop"]["reason"], "contract_satisfied");
    let cancelled = c["statuses"]["cancelled"].as_u64().expect("n");
    let calls = c["stats"]["model_calls"].as_u64().expect("n");
    assert_eq!(cancelled + calls, 40);
    assert!(cancelled > 20, "cancelled {cancelled}");
    // The same answer as judging everything.
    let mut expected: Vec<(u64, u64)> = (0..40u64)
        .filter(|i| i % 2 == 0)
        .map(|i| ((i * 7) % 40, i))
        .collect();
    expected.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.to_string().cmp(&b.1.to_string())));
    let want: Vec<String> = expected
        .iter()
        .take(3)
        .map(|(_, i)| i.to_string())
        .collect();
    assert_eq!(f.answer_ids(), want);
}

/// A bound that is not an upper bound voids the pruning proof: the run says
/// so and stops pruning, so a unit that lied about its bound still wins.
#[test]
fn top_k_with_a_broken_bound_stops_pruning_and_says_so() {
    // Unit 5 claims the highest bound (30) and opens first, but scores 99;
    // unit 7 claims 10 and scores 200. Trusting the bounds would prune
    // everything after unit 5 and answer 5.
    let extra = "[contract]\ntype = \"top_k\"\nk = 1\nscore = \"/score\"\nbound = \"if .id == 5 then 30 else 10 end\"\n";
    let f = Fixture::new(r#"{ type = "jsonl", key = "id", kind = "row" }"#, extra);
    let mut input = String::new();
    for i in 0..20 {
        let score = match i {
            5 => 99,
            7 => 200,
            _ => i % 10,
        };
        input.push_str(&format!(
            "{{\"id\": {i}, \"flag\": true, \"score\": {score}}}\n"
        ));
    }
    f.input(input.as_bytes());
    let o = f.run(&["--slots", "1"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let c = f.certificate();
    let notes = c["notes"].to_string();
    assert!(notes.contains("unit 5 scored 99"), "{notes}");
    assert_eq!(c["statuses"]["cancelled"].as_u64(), Some(0));
    assert_eq!(f.answer_ids(), ["7"]);
}

#[test]
fn a_reducer_path_that_matches_nothing_is_said() {
    let f = Fixture::new(JSON_ARRAY, "");
    let spec = std::fs::read_to_string(f.path("spec.toml")).expect("spec");
    std::fs::write(
        f.path("spec.toml"),
        spec.replacen(
            "type = \"set\"",
            "type = \"set\"\n\n[[fold.reducers]]\nname = \"kinds\"\ntype = \"count_by\"\nkey = \"/kind\"",
            1,
        ),
    )
    .expect("spec");
    f.input(&flagged_rows(6));
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let notes = f.certificate()["notes"].to_string();
    assert!(
        notes.contains("reducer `kinds` read 2 facts and its path `/kind` matched none"),
        "{notes}"
    );
    let md = std::fs::read_to_string(f.path("out/answer.md")).expect("answer.md");
    assert!(md.contains("matched none"), "{md}");
}

/// Sums, means, ratios, grouped rows and pairs are folded from per-unit
/// facts and stated in answer.json and answer.md: reviews of three films,
/// each judged once, the numbers following from the facts.
#[test]
fn grouped_means_ratios_and_pairs_are_stated_from_the_facts() {
    let reducers = r#"
[[fold.reducers]]
name = "liked"
type = "set"

[[fold.reducers]]
name = "total"
type = "sum"
value = "/score"
statuses = ["positive", "negative"]

[[fold.reducers]]
name = "average"
type = "mean"
value = "/score"
statuses = ["positive", "negative"]

[[fold.reducers]]
name = "positive_share"
type = "ratio"
pointer = "/sentiment"
numerator = ["pos"]
denominator = ["neg"]
statuses = ["positive", "negative"]

[[fold.reducers]]
name = "best_films"
type = "group_by"
key = "/film"
reduce = { type = "mean", value = "/score" }
limit = 2
statuses = ["positive", "negative"]

[[fold.reducers]]
name = "disagreements"
type = "pairs"
key = "/film"
value = "/sentiment"
relation = "different"
statuses = ["positive", "negative"]

[contract]
type = "exhaustive"
answer = "liked"
"#;
    let f = Fixture::new(JSON_ARRAY, "");
    let spec = std::fs::read_to_string(f.path("spec.toml")).expect("spec");
    let spec = spec.replace(
        "[[fold.reducers]]\nname = \"flagged\"\ntype = \"set\"\n",
        reducers,
    );
    let spec = spec
        .split("\n[contract]\ntype = \"exhaustive\"\nanswer = \"flagged\"\n")
        .collect::<String>();
    std::fs::write(f.path("spec.toml"), spec).expect("spec");
    std::fs::write(
        f.path("schema.json"),
        r#"{"type": "object", "additionalProperties": false, "required": ["decision", "score", "film", "sentiment"], "properties": {"decision": {"enum": ["yes", "no"]}, "score": {"type": "number"}, "film": {"type": "string"}, "sentiment": {"enum": ["pos", "neg"]}}}"#,
    )
    .expect("schema");
    std::fs::write(
        f.path("judge.jq"),
        r#"{decision: (if .stars >= 3 then "yes" else "no" end), score: .stars, film: .film, sentiment: (if .stars >= 3 then "pos" else "neg" end)}"#,
    )
    .expect("judge");
    let rows = serde_json::json!([
        {"id": 1, "film": "alien", "stars": 5},
        {"id": 2, "film": "alien", "stars": 1},
        {"id": 3, "film": "brazil", "stars": 4},
        {"id": 4, "film": "brazil", "stars": 4},
        {"id": 5, "film": "cube", "stars": 2},
        {"id": 6, "film": "alien", "stars": 4}
    ]);
    f.input(rows.to_string().as_bytes());
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let answer: Value =
        serde_json::from_str(&std::fs::read_to_string(f.path("out/answer.json")).expect("answer"))
            .expect("json");
    let agg = |name: &str| {
        answer["aggregates"]
            .as_array()
            .expect("aggregates")
            .iter()
            .find(|a| a["name"] == name)
            .unwrap_or_else(|| panic!("no {name}: {answer}"))
            .clone()
    };
    assert_eq!(
        agg("total")["statement"],
        "sum 20 over 6 facts: #1, #2, #3, #4, #5 and 1 more"
    );
    assert!(
        agg("average")["statement"]
            .as_str()
            .unwrap()
            .starts_with("mean 3.3333 ± "),
        "{answer}"
    );
    assert!(
        agg("positive_share")["statement"]
            .as_str()
            .unwrap()
            .starts_with("0.6667 (4 of 6; 95 % Wilson interval 0.3"),
        "{answer}"
    );
    let films = agg("best_films");
    assert_eq!(films["rows"][0][0], "brazil", "{films}");
    assert_eq!(films["rows"][0][1], "4", "{films}");
    assert_eq!(films["rows"][1][0], "alien", "{films}");
    assert_eq!(films["rows"].as_array().unwrap().len(), 2, "limited to 2");
    let pairs = agg("disagreements");
    assert_eq!(pairs["statement"], "2 pairs", "{pairs}");
    assert_eq!(
        pairs["rows"],
        serde_json::json!([
            ["alien", "#1", "pos", "#2", "neg"],
            ["alien", "#2", "neg", "#6", "pos"]
        ])
    );
    // The set that is the answer is shown as the answer, not again.
    assert!(
        answer["aggregates"]
            .as_array()
            .unwrap()
            .iter()
            .all(|a| a["name"] != "liked")
    );
    let md = std::fs::read_to_string(f.path("out/answer.md")).expect("answer.md");
    assert!(md.contains("## Aggregates [SIMULATED]"), "{md}");
    assert!(
        md.contains("  | brazil | 4 | mean 4 ± 0 (standard error) over 2 facts: #3, #4 |"),
        "{md}"
    );
    assert!(md.contains("  | alien | #1 | pos | #2 | neg |"), "{md}");

    // A pointer the stage's output schema cannot hold is refused at plan
    // time, naming it.
    let spec = std::fs::read_to_string(f.path("spec.toml")).expect("spec");
    std::fs::write(
        f.path("spec.toml"),
        spec.replace(
            "name = \"best_films\"\ntype = \"group_by\"\n",
            "name = \"best_films\"\ntype = \"group_by\"\nstage = \"judge\"\n",
        )
        .replace(
            "reduce = { type = \"mean\", value = \"/score\" }",
            "reduce = { type = \"mean\", value = \"/rating\" }",
        ),
    )
    .expect("spec");
    let o = run(bin()
        .arg("explain")
        .arg(f.path("spec.toml"))
        .arg("--no-input"));
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("reducer `best_films` reads `/rating`, but stage `judge`'s output schema declares no `rating`"),
        "{}",
        stderr(&o)
    );
}

/// A contract may name any reducer as its answer: here each film's mean
/// score, keyed by a field of the unit that no fact holds, stated first in
/// answer.md and answer.json and citing the units it rests on. Verify
/// recomputes the numbers from the facts, so a fold node altered in the
/// store fails the run.
#[test]
fn a_grouped_mean_keyed_by_a_unit_field_is_the_answer_and_verify_recomputes_it() {
    let reducers = r#"
[[fold.reducers]]
name = "by_film"
type = "group_by"
key = "unit:/film"
reduce = { type = "mean", value = "/score" }
statuses = ["positive", "negative"]

[[fold.reducers]]
name = "far_apart"
type = "pairs"
key = "unit:/film"
value = "/score"
relation = { jq = "(.a - .b) | fabs >= 3" }
statuses = ["positive", "negative"]

[[fold.reducers]]
name = "best_two"
type = "set"
order_by = "/score"
limit = 2
statuses = ["positive", "negative"]

[contract]
type = "exhaustive"
answer = "by_film"
"#;
    let f = Fixture::new(JSON_ARRAY, "");
    let spec = std::fs::read_to_string(f.path("spec.toml")).expect("spec");
    let spec = spec
        .replace(
            "[[fold.reducers]]\nname = \"flagged\"\ntype = \"set\"\n",
            reducers,
        )
        .split("\n[contract]\ntype = \"exhaustive\"\nanswer = \"flagged\"\n")
        .collect::<String>();
    std::fs::write(f.path("spec.toml"), spec).expect("spec");
    std::fs::write(
        f.path("judge.jq"),
        r#"{decision: (if .stars >= 3 then "yes" else "no" end), score: .stars}"#,
    )
    .expect("judge");
    let rows = serde_json::json!([
        {"id": 1, "film": "alien", "stars": 5},
        {"id": 2, "film": "alien", "stars": 1},
        {"id": 3, "film": "brazil", "stars": 4},
        {"id": 4, "film": "brazil", "stars": 4},
        {"id": 5, "film": "cube", "stars": 2},
        {"id": 6, "film": "alien", "stars": 3}
    ]);
    f.input(rows.to_string().as_bytes());
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let answer: Value =
        serde_json::from_str(&std::fs::read_to_string(f.path("out/answer.json")).expect("answer"))
            .expect("json");
    let stated = &answer["stated"];
    assert_eq!(stated["name"], "by_film", "{answer}");
    assert_eq!(
        stated["statement"], "3 of 3 groups, by mean (largest first)",
        "{stated}"
    );
    let firsts: Vec<(&str, &str)> = stated["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .map(|r| (r[0].as_str().unwrap_or(""), r[1].as_str().unwrap_or("")))
        .collect();
    assert_eq!(firsts, [("brazil", "4"), ("alien", "3"), ("cube", "2")]);
    // The items are the units the statement rests on: every review.
    let items: Vec<&str> = answer["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|i| i["unit_id"].as_str())
        .collect();
    assert_eq!(items, ["1", "2", "3", "4", "5", "6"]);
    let agg = |name: &str| {
        answer["aggregates"]
            .as_array()
            .expect("aggregates")
            .iter()
            .find(|a| a["name"] == name)
            .unwrap_or_else(|| panic!("no {name}: {answer}"))
            .clone()
    };
    // Alien's 5 against its 1: the only scores three apart in one film.
    assert_eq!(
        agg("far_apart")["rows"],
        serde_json::json!([["alien", "#1", "5", "#2", "1"]])
    );
    let best = agg("best_two");
    assert_eq!(best["statement"], "2 units (the first 2)", "{best}");
    assert_eq!(best["rows"][0][1], "#1", "{best}");
    assert_eq!(
        best["rows"][1][1], "#3",
        "the tie at 4 goes to the smaller id"
    );
    let md = std::fs::read_to_string(f.path("out/answer.md")).expect("answer.md");
    assert!(
        md.contains("## Answer: 3 of 3 groups, by mean (largest first) [SIMULATED]"),
        "{md}"
    );
    assert!(md.contains("### Cited: 6 units"), "{md}");
    let c = f.certificate();
    assert_eq!(c["verify"]["passed"], true);
    assert_eq!(c["verify"]["numbers_checked"], 3, "{}", c["verify"]);

    // Alter the stored root so it states another mean: the rerun reuses
    // the node, and verify, recomputing from the facts, refuses it.
    let root: fanfold_core::ContentHash = c["fold_root"]
        .as_str()
        .expect("fold_root")
        .parse()
        .expect("hash");
    let store = fanfold_store::Store::open(&f.path("store.sqlite")).expect("store");
    let mut node = store
        .get_fold_node(&root)
        .expect("read")
        .expect("the root is stored");
    let sum = &mut node["reducers"]["by_film"]["groups"]["cube"]["sum"];
    let altered: i128 = sum
        .as_str()
        .and_then(|t| t.parse().ok())
        .expect("a fixed-point sum, as text");
    *sum = (altered + 7_000_000_000).to_string().into();
    store.put_fold_node(&root, 9, &node).expect("write");
    drop(store);
    let o = f.run(&[]);
    assert_ne!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stderr(&o).contains("verification failed"), "{}", stderr(&o));
    let c = f.certificate();
    let mismatches = c["verify"]["number_mismatches"].to_string();
    assert!(
        mismatches.contains("reducer `by_film`") && mismatches.contains("cube"),
        "{mismatches}"
    );
}

/// The film-reviews example's five specs, on the scripted judge, against
/// the fixture's oracle: every number and pair is derived here from
/// oracle.json, which no run reads.
#[test]
fn film_review_specs_answer_against_their_oracle() {
    let dir = tempfile::tempdir().expect("tempdir");
    let example = repo().join("examples/film-reviews");
    let oracle: Value = serde_json::from_str(
        &std::fs::read_to_string(example.join("oracle.json")).expect("oracle"),
    )
    .expect("json");
    let truth = oracle["reviews"].as_object().expect("reviews");
    let title = |film: &Value| oracle["films"][film.as_str().unwrap_or("")].clone();
    let answer_of = |spec: &str| -> Value {
        let o = run(bin()
            .current_dir(&example)
            .args(["run", &format!("{spec}.toml"), "--backend", "scripted"])
            .arg("--store")
            .arg(dir.path().join("s.sqlite"))
            .arg("--out")
            .arg(dir.path().join(spec)));
        assert_eq!(o.status.code(), Some(0), "{spec}: {}", stderr(&o));
        let text =
            std::fs::read_to_string(dir.path().join(spec).join("answer.json")).expect("answer");
        serde_json::from_str(&text).expect("json")
    };

    // The share of Quiet Harbor's reviews that are positive.
    let harbor: Vec<&Value> = truth
        .values()
        .filter(|t| t["film"] == "quiet-harbor")
        .collect();
    let liked = harbor
        .iter()
        .filter(|t| t["sentiment"] == "positive")
        .count();
    let a = answer_of("ratio");
    let statement = a["stated"]["statement"].as_str().unwrap_or("");
    assert!(
        statement.contains(&format!("({liked} of {}; 95 % Wilson", harbor.len())),
        "{statement}"
    );

    // Positive and negative reviews per film.
    let a = answer_of("count-by-film");
    let rows = a["stated"]["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 6);
    for row in rows {
        let film = &row[0];
        let mut counts = std::collections::BTreeMap::<&str, usize>::new();
        for t in truth.values().filter(|t| title(&t["film"]) == *film) {
            *counts
                .entry(t["sentiment"].as_str().unwrap_or(""))
                .or_default() += 1;
        }
        let stated = row[2].as_str().unwrap_or("");
        for (sentiment, n) in counts {
            assert!(
                stated.contains(&format!("{sentiment} {n}")),
                "{film}: {stated}"
            );
        }
    }

    // The films ranked by mean score.
    let mut means: Vec<(f64, String)> = oracle["films"]
        .as_object()
        .expect("films")
        .iter()
        .map(|(id, name)| {
            let scores: Vec<f64> = truth
                .values()
                .filter(|t| t["film"] == id.as_str())
                .filter_map(|t| t["score"].as_f64())
                .collect();
            (
                scores.iter().sum::<f64>() / scores.len() as f64,
                name.as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    means.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    let a = answer_of("mean-by-film");
    let ranked: Vec<(String, String)> = a["stated"]["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .map(|r| {
            (
                r[0].as_str().unwrap_or("").into(),
                r[1].as_str().unwrap_or("").into(),
            )
        })
        .collect();
    let expected: Vec<(String, String)> = means
        .iter()
        .map(|(m, name)| (name.clone(), format!("{}", (m * 1e4).round() / 1e4)))
        .collect();
    assert_eq!(ranked, expected);

    // Pairs: of one film, agreeing or not, ten of them, spread over units.
    for (spec, same) in [("same-pairs", true), ("opposite-pairs", false)] {
        let a = answer_of(spec);
        let rows = a["stated"]["rows"].as_array().expect("rows");
        assert_eq!(rows.len(), 10, "{spec}");
        let mut units = std::collections::BTreeSet::new();
        for r in rows {
            let id = |c: &Value| c.as_str().unwrap_or("").trim_start_matches('#').to_owned();
            let (x, y) = (&truth[&id(&r[1])], &truth[&id(&r[3])]);
            assert_eq!(x["film"], y["film"], "{spec}: {r:?}");
            assert_eq!(title(&x["film"]), r[0], "{spec}: {r:?}");
            assert_eq!(x["sentiment"] == y["sentiment"], same, "{spec}: {r:?}");
            units.insert(id(&r[1]));
            units.insert(id(&r[3]));
        }
        assert!(
            units.len() >= 18,
            "{spec}: pairs spread over units: {units:?}"
        );
        // Each pair cites both units, read back by verify.
        let cited: Vec<&str> = a["items"]
            .as_array()
            .expect("items")
            .iter()
            .filter_map(|i| i["unit_id"].as_str())
            .collect();
        assert_eq!(cited.len(), units.len(), "{spec}");
    }
}

/// The same five specs on the embedded model, over four reviews of each
/// film: they run, verify passes, and the specs after the first reuse its
/// facts (one fact a review serves every question).
#[test]
fn film_review_specs_run_on_the_embedded_model_and_share_their_facts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let example = repo().join("examples/film-reviews");
    let all = std::fs::read_to_string(example.join("reviews.jsonl")).expect("reviews");
    let few: String = all
        .lines()
        .filter(|l| {
            let v: Value = serde_json::from_str(l).expect("json");
            let n: u64 = v["id"].as_str().unwrap_or("r0")[1..].parse().unwrap_or(0);
            (n - 1) % 20 < 4
        })
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(few.lines().count(), 24);
    let input = dir.path().join("few.jsonl");
    std::fs::write(&input, few).expect("write");
    let mut calls = Vec::new();
    for spec in [
        "mean-by-film",
        "count-by-film",
        "same-pairs",
        "opposite-pairs",
        "ratio",
    ] {
        let o = run(bin()
            .current_dir(&example)
            .args(["run", &format!("{spec}.toml"), "--json", "--slots", "2"])
            .arg("--input")
            .arg(&input)
            .arg("--store")
            .arg(dir.path().join("s.sqlite"))
            .arg("--out")
            .arg(dir.path().join(spec)));
        // Exit 3 is an incomplete answer (a review the small model could
        // not answer in the schema); anything else is a failure.
        assert!(
            matches!(o.status.code(), Some(0 | 3)),
            "{spec}: {}",
            stderr(&o)
        );
        let lines: Vec<Value> = stdout(&o)
            .lines()
            .map(|l| serde_json::from_str(l).expect("jsonl"))
            .collect();
        let c = &lines[1]["data"];
        assert_eq!(c["simulated"], false, "{spec}");
        assert_eq!(c["verify"]["passed"], true, "{spec}: {}", c["verify"]);
        calls.push(c["stats"]["model_calls"].as_u64().unwrap_or(u64::MAX));
        let answer = &lines[0]["data"];
        assert!(
            answer["stated"]["statement"].is_string(),
            "{spec}: {answer}"
        );
    }
    assert!(calls[0] >= 24, "one call a review at least: {calls:?}");
    assert_eq!(&calls[1..], [0, 0, 0, 0], "later specs reuse the facts");
}

/// `fanfold bench pairs` on the scripted judge: one call a review against
/// one a candidate pair, both scored against the oracle in one table.
#[test]
fn bench_pairs_sets_per_unit_facts_beside_a_pairwise_judge() {
    let dir = tempfile::tempdir().expect("tempdir");
    let report = dir.path().join("report.md");
    let o = run(bin()
        .current_dir(repo())
        .args(["bench", "pairs", "--backend", "scripted", "--per-film", "4"])
        .arg("--report")
        .arg(&report));
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(&report).expect("report");
    assert!(text.contains("[SIMULATED]"), "{text}");
    // Six films of four reviews: 24 reviews, 6 × 6 candidate pairs.
    assert!(text.contains("24 reviews, 36 candidate pairs"), "{text}");
    let row = |way: &str| -> Vec<String> {
        text.lines()
            .find(|l| l.starts_with(&format!("| {way}")))
            .unwrap_or_else(|| panic!("no row {way}: {text}"))
            .split('|')
            .map(|c| c.trim().to_owned())
            .collect()
    };
    let (unit, pair) = (row("per-unit"), row("pairwise"));
    assert_eq!(unit[2], "24", "one call a review: {unit:?}");
    assert_eq!(pair[2], "36", "one call a pair: {pair:?}");
    // The scripted judges follow the fixture's phrasing: both agree with
    // the oracle, so the comparison is of cost alone.
    assert_eq!((unit[7].as_str(), unit[8].as_str()), ("1.000", "1.000"));
    assert_eq!((pair[7].as_str(), pair[8].as_str()), ("1.000", "1.000"));
}

/// An answer that is a reducer's table (pairs of reviews) renders in a
/// browser as a table whose unit cells link to the cited units' sections.
#[test]
fn a_stated_answer_renders_as_a_table_with_linked_units() {
    let browser = chromium();
    let out = tempfile::tempdir().expect("out");
    let o = run(bin()
        .current_dir(repo().join("examples/film-reviews"))
        .args([
            "run",
            "opposite-pairs.toml",
            "--backend",
            "scripted",
            "--json",
        ])
        .arg("--store")
        .arg(out.path().join("store.sqlite"))
        .arg("--out")
        .arg(out.path().join("run")));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = run(bin().arg("report").arg("run").arg(out.path().join("run")));
    assert!(o.status.success(), "{}", stderr(&o));
    let (dom, _) = render(&browser, &out.path().join("run/report.html"));
    assert!(
        dom.contains("<h2>Answer: 10 pairs (the first 10)</h2>"),
        "the answer's statement heads the page"
    );
    let table = dom
        .split("<div id=\"stated\">")
        .nth(1)
        .and_then(|t| t.split("</table>").next())
        .expect("the stated answer's table");
    // Ten rows of two units each, every unit a link to its section.
    assert_eq!(table.matches("<tr>").count(), 11, "{table}");
    assert_eq!(table.matches("class=\"cite\"").count(), 20, "{table}");
    let (links, dangling) = dangling_links(&dom);
    assert!(links >= 20);
    assert!(dangling.is_empty(), "links to nothing: {dangling:?}");
}
