//! Spec mistakes refused before anything runs, naming the setting.

use crate::*;

#[test]
fn bad_specs_name_the_problem() {
    let cases = [
        (
            "[[prefilter]]\nname = \"r\"\nwhen = \".x\"\naction = \"route\"\nstage = \"nope\"\n",
            "routes to unknown stage `nope`",
        ),
        (
            "[[prefilter]]\nname = \"r\"\nwhen = \".x ==\"\naction = \"exclude\"\n",
            "prefilter rule `r`: jq syntax error",
        ),
        (
            "[[prefilter]]\nname = \"r\"\nwhen = \"nosuch(1)\"\naction = \"exclude\"\n",
            "undefined: nosuch",
        ),
        ("surprise = 1\n", "unknown field `surprise`"),
        (
            "[[stages]]\nname = \"near\"\ntype = \"embed\"\nversion = 1\npositive = [\"x\"]\nthreshold = 0.1\nthen = \"nope\"\n",
            "passes units on to `nope`, which is not a stage declared after it",
        ),
        (
            "[[stages]]\nname = \"near\"\ntype = \"embed\"\nversion = 1\nnegative = [\"x\"]\nthreshold = 0.1\n",
            "stage `near`: needs at least one positive text",
        ),
        (
            "[backends.http]\ntype = \"openai\"\nmodel = \"m\"\n",
            "backend `http`: give either base_url or a non-empty endpoints list",
        ),
    ];
    for (extra, expect) in cases {
        let f = Fixture::new(JSON_ARRAY, extra);
        f.input(br#"[{"id": 1}]"#);
        let o = f.run(&[]);
        assert_eq!(o.status.code(), Some(2));
        let err = stderr(&o);
        assert!(
            err.contains(expect) && err.contains("spec.toml"),
            "expected {expect:?} in {err}"
        );
    }
}

#[test]
fn spec_mistakes_that_would_answer_wrongly_are_refused() {
    let cases = [
        (
            "positive = [\"yes\"], negative = [\"no\"]",
            "positive = [\"yes\"], negative = [\"no\", \"yes\"]",
            "both positive and negative",
        ),
        (
            "rubric = \"rubric.md\"",
            "rubric = \"rubric.md\"\nmin_confidence = 2.0",
            "min_confidence 2 must be within [0, 1]",
        ),
        (
            "type = \"set\"",
            "type = \"set\"\nvalue = \"decision\"",
            "write `/decision`",
        ),
        (
            "type = \"set\"",
            "type = \"set\"\nvaleu = \"/decision\"",
            "reducer `flagged` (type `set`): unknown field `valeu`",
        ),
    ];
    for (from, to, expect) in cases {
        let f = Fixture::new(JSON_ARRAY, "");
        f.input(&flagged_rows(3));
        let spec = std::fs::read_to_string(f.path("spec.toml")).expect("spec");
        assert!(spec.contains(from), "{from}");
        std::fs::write(f.path("spec.toml"), spec.replacen(from, to, 1)).expect("spec");
        let o = f.run(&[]);
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        assert!(stderr(&o).contains(expect), "{expect}: {}", stderr(&o));
    }
}

/// Spec mistakes that used to run to a quiet, wrong answer are refused
/// before anything runs, naming the setting.
#[test]
fn spec_mistakes_are_refused_before_anything_runs() {
    let judge = "decision = { pointer = \"/decision\", positive = [\"yes\"], negative = [\"no\"] }";
    let edit = |f: &Fixture, from: &str, to: &str| {
        let spec = std::fs::read_to_string(f.path("spec.toml")).unwrap();
        assert!(spec.contains(from), "{from}");
        std::fs::write(f.path("spec.toml"), spec.replacen(from, to, 1)).unwrap();
    };
    let reducer = "[[fold.reducers]]\nname = \"flagged\"\ntype = \"set\"\n";
    let cases: Vec<(&str, String, &str)> = vec![
        (
            judge,
            format!("{judge}\nconfidence = \"/nope\""),
            "confidence `/nope`",
        ),
        (
            judge,
            format!("{judge}\nevidence = \"/nope\""),
            "evidence `/nope`",
        ),
        (
            reducer,
            format!("{reducer}stage = \"judge\"\nvalue = \"/nope\"\n"),
            "output schema declares no `nope`",
        ),
        (
            reducer,
            format!(
                "{reducer}\n[[fold.reducers]]\nname = \"h\"\ntype = \"histogram\"\nvalue = \"/score\"\nedges = [3.0, 1.0]\n"
            ),
            "strictly ascending",
        ),
    ];
    for (from, to, says) in &cases {
        let f = Fixture::new(JSON_ARRAY, "");
        // A closed schema: a property it does not list can never be there.
        std::fs::write(
            f.path("schema.json"),
            r#"{"type": "object", "additionalProperties": false, "required": ["decision"], "properties": {"decision": {"enum": ["yes", "no"]}, "score": {"type": "number"}}}"#,
        )
        .unwrap();
        edit(&f, from, to);
        let explained = run(bin().arg("explain").arg(f.path("spec.toml")));
        for o in [explained, f.run(&[])] {
            assert_eq!(o.status.code(), Some(2), "{says}: {}", stderr(&o));
            assert!(stderr(&o).contains(says), "{says}: {}", stderr(&o));
        }
        assert!(!f.path("out/answer.md").exists(), "{says}");
    }

    // A scripted judge that does not parse is refused by explain.
    let f = Fixture::new(JSON_ARRAY, "");
    std::fs::write(f.path("judge.jq"), "{decision: \"yes\"").unwrap();
    let o = run(bin()
        .arg("explain")
        .arg(f.path("spec.toml"))
        .arg("--no-input"));
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("script judge.jq"), "{}", stderr(&o));

    // An embed stage that would embed nothing, a stress test of 100,000
    // orders.
    let f = Fixture::new(
        JSON_ARRAY,
        "[[stages]]\nname = \"near\"\ntype = \"embed\"\nversion = 1\npositive = [\"x\"]\nthreshold = 0.1\nmax_tokens = 0\nthen = \"judge\"\n",
    );
    let o = run(bin()
        .arg("explain")
        .arg(f.path("spec.toml"))
        .arg("--no-input"));
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("max_tokens must be at least 1"),
        "{}",
        stderr(&o)
    );
    let f = cluster_fixture(
        "[stages.stress]\norders = 100000\nmax_drift = 0.5",
        "{themes: [], assign: {}}",
        6,
    );
    let o = run(bin()
        .arg("explain")
        .arg(f.path("spec.toml"))
        .arg("--no-input"));
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("stress.orders 100000"),
        "{}",
        stderr(&o)
    );

    // A select rule that yields no boolean ends the run naming the rule,
    // instead of reading as false.
    let f = select_fixture();
    edit(&f, "when = '.kind == \"docs\"'", "when = '.kind'");
    f.input(br#"[{"id": 1, "kind": "docs", "text": "a", "flag": true}]"#);
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(5), "{}", stderr(&o));
    assert!(stderr(&o).contains("not a boolean"), "{}", stderr(&o));

    // A field no unit has is a warning where a reader looks first.
    let f = Fixture::new(JSON_ARRAY, "");
    edit(
        &f,
        judge,
        &format!("{judge}\nfields = [\"flag\", \"nope\"]"),
    );
    f.input(&flagged_rows(6));
    let o = f.run(&[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let md = std::fs::read_to_string(f.path("out/answer.md")).unwrap();
    let warning = md.find("**Warning:** stage").expect(&md);
    assert!(
        md[warning..].lines().next().unwrap().contains("nope"),
        "{md}"
    );
    assert!(warning < md.find("## Answer").unwrap(), "{md}");
}
