//! The run report as a person sees it, in a browser.

use super::*;

#[test]
fn a_run_report_renders_in_a_browser_with_every_citation_resolving() {
    let browser = chromium();
    let out = tempfile::tempdir().expect("out");
    let o = run(bin()
        .arg("run")
        .arg(repo().join("examples/issue-triage/judged.toml"))
        .args(["--backend", "scripted", "--json"])
        .arg("--store")
        .arg(out.path().join("store.sqlite"))
        .arg("--out")
        .arg(out.path().join("run")));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = run(bin().arg("report").arg("run").arg(out.path().join("run")));
    assert!(o.status.success(), "{}", stderr(&o));
    let page = out.path().join("run/report.html");
    let html = std::fs::read_to_string(&page).expect("page");
    // Self-contained: no stylesheet, script or image is fetched.
    for asset in ["<link", "<script", "src="] {
        assert!(!html.contains(asset), "the page loads {asset}");
    }
    let (dom, png) = render(&browser, &page);
    assert!(dom.contains("[SIMULATED]"), "a simulated run says so");
    assert!(
        dom.contains("<svg id=\"statuses\""),
        "the outcomes chart is drawn"
    );
    assert_eq!(dom.matches("class=\"bar\"").count(), 8);
    let answer: Value = serde_json::from_str(
        &std::fs::read_to_string(out.path().join("run/answer.json")).expect("answer"),
    )
    .expect("json");
    let items = answer["items"].as_array().expect("items").len();
    assert!(items > 0);
    let (links, dangling) = dangling_links(&dom);
    assert!(links >= items, "{links} citation links for {items} items");
    assert!(dangling.is_empty(), "links to nothing: {dangling:?}");
    // Each item shows what its fact extracted beside the decision: the
    // cause the judge named, once: as the item's theme when it is that,
    // else as a field.
    let mut as_field = 0;
    for item in answer["items"].as_array().expect("items") {
        let cause = item["fields"]["cause"]
            .as_str()
            .expect("an extracted cause");
        let field = format!("<span class=\"meta\">cause:</span> {cause}</div>");
        if item["theme"].as_str() == Some(cause) {
            continue;
        }
        as_field += 1;
        assert!(
            dom.contains(&field),
            "the page does not show the extracted cause {cause}"
        );
    }
    let md_answer = std::fs::read_to_string(out.path().join("run/answer.md")).expect("answer.md");
    let mut as_theme = 0;
    for item in answer["items"].as_array().expect("items") {
        let (Some(theme), Some(cause)) = (item["theme"].as_str(), item["fields"]["cause"].as_str())
        else {
            continue;
        };
        if theme != cause {
            continue;
        }
        as_theme += 1;
        let id = item["unit_id"].as_str().expect("id");
        let at = md_answer
            .find(&format!("#{id}]"))
            .expect("the item in answer.md");
        let block = &md_answer[at..];
        let block = &block[..block.find("\n- ").unwrap_or(block.len())];
        assert!(
            block.contains(&format!("*{}*", theme.replace('_', "\\_")))
                && !block.contains("\n  cause: "),
            "answer.md shows the theme {theme} twice: {block}"
        );
    }
    assert!(as_theme + as_field > 0);
    assert!(png.len() > 10_000, "a screenshot of {} bytes", png.len());
    let md = std::fs::read_to_string(out.path().join("run/report.md")).expect("markdown");
    assert!(md.contains(&format!("## Answer: {items} items")));
    // No target is declared, but the example's audit bounds its recall
    // against the audit's judge: the page says that beside the banner that
    // says the answer is complete, as a bound, not a verdict.
    assert!(
        dom.contains("<div class=\"banner warn quality\">Quality: audit second_look: recall against its judge is at least"),
        "the page does not state the audit's recall bound"
    );
    assert!(!dom.contains("Quality: unmeasured"));
}

/// A record that carries markup and a `javascript:` URL cannot make the
/// run report run anything or fetch anything: report.md escapes what
/// records say as answer.md does, and report.html links only web
/// addresses.
#[test]
fn a_hostile_record_cannot_spoof_the_run_report() {
    let browser = chromium();
    let f = Fixture::new(JSON_ARRAY, "[output]\ntitle = \"title\"\nlink = \"url\"\n");
    let rows = serde_json::json!([
        {"id": 1, "flag": true, "title": "<script>document.title='pwned'</script><img src=http://127.0.0.1:9/x onerror=alert(1)>",
         "url": "javascript:alert(document.cookie)"},
        {"id": 2, "flag": true, "title": "[click](javascript:alert(2)) ![p](http://127.0.0.1:9/pixel.png)",
         "url": "https://github.com/o/r/issues/2"},
        {"id": 3, "flag": false, "title": "fine", "url": "data:text/html,hi"}
    ]);
    f.input(serde_json::to_string(&rows).expect("rows").as_bytes());
    let o = f.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = run(bin().arg("report").arg("run").arg(f.path("out")));
    assert!(o.status.success(), "{}", stderr(&o));
    let md = std::fs::read_to_string(f.path("out/report.md")).expect("report.md");
    // Escaped as answer.md escapes: a backslash before every character
    // that could start markup, so none of it is markup any more.
    let unescaped = md.replace("\\<", "").replace("\\]", "").replace("\\[", "");
    for raw in ["<script", "<img", "](javascript:", "![p]("] {
        assert!(!unescaped.contains(raw), "report.md carries {raw}: {md}");
    }
    assert!(md.contains("\\<script\\>"), "{md}");
    let page = f.path("out/report.html");
    let html = std::fs::read_to_string(&page).expect("report.html");
    assert!(!html.contains("href=\"javascript:"), "{html}");
    assert!(!html.contains("href=\"data:"), "{html}");
    assert!(
        html.contains("href=\"https://github.com/o/r/issues/2\""),
        "{html}"
    );
    let (dom, _) = render(&browser, &page);
    // The record's words are on the page as text, and none of it ran.
    assert!(dom.contains("&lt;script&gt;document.title"), "{dom}");
    assert!(!dom.contains("<title>pwned</title>"), "{dom}");
    assert!(!dom.contains("<img"), "{dom}");
    assert!(!dom.contains("<script"), "{dom}");
}
