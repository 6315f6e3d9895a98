//! Evidence quotes on real text: every field with text offers quotable
//! spans, whatever its punctuation.

#[allow(unused_imports)]
use super::*;

/// Reviews as a public table stores them: every full stop `&#46;`, every
/// comma `&#44;`, apostrophes `&#8217;`, some on two lines, some with a dash
/// and accented letters. No sentence of them ends in a bare `.`, and most
/// are longer than the stage's 120-byte quotes.
fn entity_reviews(dir: &std::path::Path, per_film: usize) -> PathBuf {
    let o = run(bin()
        .args(["fixture", "film-reviews", "--entities", "--per-film"])
        .arg(per_film.to_string())
        .arg("--out")
        .arg(dir));
    assert!(o.status.success(), "{}", stderr(&o));
    dir.join("reviews.jsonl")
}

#[test]
fn embedded_quotes_on_entity_punctuated_reviews_are_all_verbatim() {
    let tmp = tempfile::tempdir().unwrap();
    let input = entity_reviews(&tmp.path().join("reviews"), 3);
    let texts: std::collections::BTreeMap<String, String> = std::fs::read_to_string(&input)
        .unwrap()
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            (
                v["id"].as_str().unwrap().to_owned(),
                v["text"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(texts.len(), 18);
    let long = texts.values().filter(|t| t.len() > 120).count();
    assert!(long >= 9, "most reviews are longer than a quote: {long}");
    assert!(
        texts
            .values()
            .all(|t| t.contains("&#46;") && !t.contains('.'))
    );
    let out = tmp.path().join("out");
    let o = run(bin()
        .arg("run")
        .arg(repo().join("examples/film-reviews/count-by-film.toml"))
        .arg("--input")
        .arg(&input)
        .arg("--store")
        .arg(tmp.path().join("store.sqlite"))
        .arg("--out")
        .arg(&out));
    assert_eq!(o.status.code(), Some(0), "{}\n{}", stdout(&o), stderr(&o));
    let facts = std::fs::read_to_string(out.join("facts.jsonl")).unwrap();
    let mut quoted = 0;
    let mut seen = 0;
    for line in facts.lines() {
        let f: Value = serde_json::from_str(line).unwrap();
        let id = f["source_ids"][0].as_str().unwrap();
        let text = &texts[id];
        seen += 1;
        assert!(
            matches!(f["status"].as_str(), Some("positive" | "negative")),
            "{id}: {f}"
        );
        for e in f["evidence"].as_array().into_iter().flatten() {
            let quote = e["quote"].as_str().unwrap();
            assert!(text.contains(quote), "{id}: {quote:?} is not in {text:?}");
            quoted += 1;
        }
    }
    assert_eq!(seen, 18, "{facts}");
    assert!(quoted > 0, "the model quoted nothing: {facts}");
}
