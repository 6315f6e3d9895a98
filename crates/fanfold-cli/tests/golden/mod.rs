//! Golden cases, after DataFusion's sqllogictest: every folder under
//! `tests/golden/` is a spec with its input, and the text `fanfold explain`
//! and `fanfold run` make of it is compared with the snapshots beside it
//! (`explain.snap`, `answer.md.snap`). `FANFOLD_BLESS=1` writes the
//! snapshots instead; `README.md` there says how to add a case.

use super::*;

/// Set to `1` to write every snapshot from what the binary says now.
const BLESS: &str = "FANFOLD_BLESS";

/// What a case's `explain` and `run` are compared with, in this order.
const SNAPSHOTS: [&str; 2] = ["explain.snap", "answer.md.snap"];

/// Lines of context around each change in a diff.
const CONTEXT: usize = 2;

/// The folder holding the cases.
fn cases_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

/// Every case folder (one holding a `spec.toml`), by name.
fn case_dirs(root: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root)
        .expect("the golden folder lists")
        .map(|e| e.expect("a folder entry").path())
        .filter(|p| p.join("spec.toml").is_file())
        .collect();
    dirs.sort();
    dirs
}

fn case_name(case: &Path) -> String {
    case.file_name().map_or_else(
        || case.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

/// What `explain` and `run` say of the case, masked, keyed by snapshot
/// file. Both run from the case folder, so the paths they print are the
/// spec's own; the store and outputs go to a folder of their own.
fn outputs(case: &Path) -> Vec<(&'static str, String)> {
    let scratch = tempfile::tempdir().expect("tempdir");
    let store = scratch.path().join("store.sqlite");
    let out = scratch.path().join("out");
    let explain = run(bin()
        .current_dir(case)
        .args(["explain", "spec.toml", "--store"])
        .arg(&store));
    let explained = if explain.status.success() {
        stdout(&explain)
    } else {
        failure(&explain)
    };
    // One slot: a run's cancellations and its "most in flight" follow the
    // order units are judged in, which more slots leave to the scheduler.
    let ran = run(bin()
        .current_dir(case)
        .args(["run", "spec.toml", "--slots", "1", "--store"])
        .arg(&store)
        .arg("--out")
        .arg(&out));
    let answer = std::fs::read_to_string(out.join("answer.md")).ok();
    let answered = match (ran.status.success(), answer) {
        (true, Some(answer)) => answer,
        (_, Some(answer)) => format!("{}\nanswer.md:\n{answer}", failure(&ran)),
        (_, None) => failure(&ran),
    };
    let masks = [(scratch.path(), "<scratch>"), (case, "<case>")];
    vec![
        (SNAPSHOTS[0], mask(&explained, &masks)),
        (SNAPSHOTS[1], mask(&answered, &masks)),
    ]
}

/// A command that did not succeed, as its exit code and what it said,
/// less its progress lines: they come at a pace of their own and carry
/// rates.
fn failure(o: &Output) -> String {
    let code = o
        .status
        .code()
        .map_or_else(|| "none (killed by a signal)".to_owned(), |c| c.to_string());
    let said: String = stderr(o)
        .lines()
        .filter(|line| !line.contains(" units decided ("))
        .map(|line| format!("{line}\n"))
        .collect();
    format!("exit code {code}\nstderr:\n{said}")
}

/// `text` with what differs from one run to the next replaced by a
/// placeholder: the given folders, timings, and run ids (a clock reading
/// and a process id).
fn mask(text: &str, folders: &[(&Path, &str)]) -> String {
    let mut text = text.to_owned();
    for (folder, placeholder) in folders {
        // The canonical form too: a temp folder may sit behind a symlink.
        let canonical = folder.canonicalize().ok();
        for form in [Some(folder.to_path_buf()), canonical]
            .into_iter()
            .flatten()
        {
            text = text.replace(&form.display().to_string(), placeholder);
        }
    }
    let text = mask_numbers_before(&text, " ms");
    mask_run_ids(&text)
}

/// Every run of digits directly followed by the word `unit` becomes `<n>`.
fn mask_numbers_before(text: &str, unit: &str) -> String {
    let mut masked = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(unit) {
        let (head, tail) = rest.split_at(at);
        let digits = head.len() - head.trim_end_matches(|c: char| c.is_ascii_digit()).len();
        let whole_word = !tail[unit.len()..].starts_with(|c: char| c.is_alphanumeric());
        if digits > 0 && whole_word {
            masked.push_str(&head[..head.len() - digits]);
            masked.push_str("<n>");
        } else {
            masked.push_str(head);
        }
        masked.push_str(unit);
        rest = &tail[unit.len()..];
    }
    masked.push_str(rest);
    masked
}

/// `run-<millis>-<hash>-<pid>-<n>` becomes `run-<id>`.
fn mask_run_ids(text: &str) -> String {
    let mut masked = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("run-") {
        let (head, tail) = rest.split_at(at);
        masked.push_str(head);
        let id_len = tail["run-".len()..]
            .find(|c: char| !(c.is_ascii_hexdigit() || c == '-'))
            .unwrap_or(tail.len() - "run-".len());
        let id = &tail["run-".len().."run-".len() + id_len];
        if id.split('-').filter(|p| !p.is_empty()).count() >= 4 {
            masked.push_str("run-<id>");
            rest = &tail["run-".len() + id_len..];
        } else {
            masked.push_str("run-");
            rest = &tail["run-".len()..];
        }
    }
    masked.push_str(rest);
    masked
}

/// Compares the case with its snapshots, or writes them when `bless`;
/// every snapshot that is missing or differs, with a diff naming the case
/// and the file.
fn check_case(case: &Path, bless: bool) -> Vec<String> {
    let name = case_name(case);
    let mut problems = Vec::new();
    for (file, now) in outputs(case) {
        let path = case.join(file);
        let before = std::fs::read_to_string(&path).ok();
        if before.as_deref() == Some(now.as_str()) {
            continue;
        }
        if bless {
            std::fs::write(&path, &now).expect("the snapshot is written");
            continue;
        }
        problems.push(match before {
            None => format!(
                "golden case `{name}`: {file} is missing; {BLESS}=1 writes it. It would hold:\n{now}"
            ),
            Some(before) => format!(
                "golden case `{name}`: {file} differs (- snapshot, + now); {BLESS}=1 accepts it\n{}",
                diff(&before, &now)
            ),
        });
    }
    problems
}

/// A line diff of `before` and `now`: changed lines marked `-` and `+`,
/// with a few unchanged lines around each change, under the line number
/// it starts at.
fn diff(before: &str, now: &str) -> String {
    let a: Vec<&str> = before.lines().collect();
    let b: Vec<&str> = now.lines().collect();
    // The longest common subsequence, from the ends backwards.
    let mut common = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            common[i][j] = if a[i] == b[j] {
                common[i + 1][j + 1] + 1
            } else {
                common[i + 1][j].max(common[i][j + 1])
            };
        }
    }
    // Each line with its mark: ' ' kept, '-' only before, '+' only now.
    let mut lines: Vec<(char, usize, &str)> = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            lines.push((' ', i + 1, a[i]));
            i += 1;
            j += 1;
        } else if i < a.len() && (j == b.len() || common[i + 1][j] >= common[i][j + 1]) {
            lines.push(('-', i + 1, a[i]));
            i += 1;
        } else {
            lines.push(('+', i + 1, b[j]));
            j += 1;
        }
    }
    let changed: Vec<usize> = (0..lines.len()).filter(|&n| lines[n].0 != ' ').collect();
    if changed.is_empty() {
        return "  (the texts differ only in their line endings)\n".to_owned();
    }
    let mut shown = String::new();
    let mut last_shown: Option<usize> = None;
    for &n in &changed {
        let from = n.saturating_sub(CONTEXT);
        let to = (n + CONTEXT).min(lines.len() - 1);
        let start = last_shown.map_or(from, |l| from.max(l + 1));
        if last_shown.is_none_or(|l| start > l + 1) {
            shown.push_str(&format!("@@ snapshot line {}\n", lines[start].1));
        }
        for (mark, _, line) in &lines[start..=to] {
            shown.push_str(&format!("{mark} {line}\n"));
        }
        last_shown = Some(to.max(last_shown.unwrap_or(0)));
    }
    shown
}

/// Runs every case of `root`, blessing when `bless`; all the problems
/// found, one paragraph each.
fn check_all(root: &Path, bless: bool) -> Vec<String> {
    case_dirs(root)
        .iter()
        .flat_map(|case| check_case(case, bless))
        .collect()
}

#[test]
fn golden_cases_match_their_snapshots() {
    let root = cases_root();
    let cases = case_dirs(&root);
    assert!(cases.len() >= 15, "{} golden cases", cases.len());
    let bless = std::env::var(BLESS).is_ok_and(|v| v == "1");
    let problems = check_all(&root, bless);
    assert!(
        problems.is_empty(),
        "{} of the golden snapshots do not match:\n\n{}",
        problems.len(),
        problems.join("\n")
    );
}

/// A copy of the case `name` in a folder of its own, so a test may alter
/// its snapshots.
fn copy_case(name: &str) -> (tempfile::TempDir, PathBuf) {
    let scratch = tempfile::tempdir().expect("tempdir");
    let from = cases_root().join(name);
    let to = scratch.path().join(name);
    std::fs::create_dir(&to).expect("case folder");
    for entry in std::fs::read_dir(&from).expect("the case lists") {
        let entry = entry.expect("a case file");
        std::fs::copy(entry.path(), to.join(entry.file_name())).expect("copy");
    }
    (scratch, to)
}

/// The harness itself: a snapshot altered by one line fails with a diff
/// naming the case, the file and both lines, and blessing puts it back.
#[test]
fn a_wrong_snapshot_fails_with_a_diff_naming_the_case_and_file() {
    let (_scratch, case) = copy_case("reducer_count");
    assert!(check_case(&case, false).is_empty(), "the copy matches");
    let snapshot = case.join("answer.md.snap");
    let right = std::fs::read_to_string(&snapshot).expect("snapshot");
    let altered = right.replacen("positive 4,", "positive 7,", 1);
    assert_ne!(altered, right, "the snapshot states the positives");
    std::fs::write(&snapshot, &altered).expect("altered");

    let problems = check_case(&case, false);
    assert_eq!(problems.len(), 1, "{problems:?}");
    let report = &problems[0];
    assert!(
        report.starts_with("golden case `reducer_count`: answer.md.snap differs"),
        "{report}"
    );
    assert!(
        report.contains("\n- ") && report.contains("positive 7,"),
        "{report}"
    );
    assert!(
        report.contains("\n+ ") && report.contains("positive 4,"),
        "{report}"
    );
    assert!(report.contains("@@ snapshot line "), "{report}");

    assert!(
        check_case(&case, true).is_empty(),
        "blessing reports nothing"
    );
    assert_eq!(std::fs::read_to_string(&snapshot).expect("snapshot"), right);
}

/// A case without a snapshot fails naming what is missing; blessing
/// writes it, and the case then matches.
#[test]
fn a_missing_snapshot_fails_and_blessing_writes_it() {
    let (_scratch, case) = copy_case("reducer_count");
    std::fs::remove_file(case.join("explain.snap")).expect("removed");
    let problems = check_case(&case, false);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].starts_with("golden case `reducer_count`: explain.snap is missing"),
        "{}",
        problems[0]
    );
    assert!(check_case(&case, true).is_empty());
    assert!(case.join("explain.snap").is_file());
    assert!(
        check_case(&case, false).is_empty(),
        "the written snapshot matches"
    );
}

/// What varies between runs is masked and nothing else is.
#[test]
fn masking_hides_folders_timings_and_run_ids_only() {
    let folder = Path::new("/tmp/.tmpAbC123");
    let text = "wrote /tmp/.tmpAbC123/out/answer.md\n- wall 19 ms: source 0 ms, route 15 ms\nRun `run-1796575008212-0a2fb12d-14718-0`.\nrun-level 3 units, 12 ms budget of 40 msgs\n";
    assert_eq!(
        mask(text, &[(folder, "<scratch>")]),
        "wrote <scratch>/out/answer.md\n- wall <n> ms: source <n> ms, route <n> ms\nRun `run-<id>`.\nrun-level 3 units, <n> ms budget of 40 msgs\n"
    );
}

/// The diff shows only the changed lines and their context.
#[test]
fn the_diff_marks_changed_lines_with_their_context() {
    let before = "a\nb\nc\nd\ne\nf\ng\nh\n";
    let now = "a\nb\nc\nd\nE\nf\ng\nh\n";
    assert_eq!(
        diff(before, now),
        "@@ snapshot line 3\n  c\n  d\n- e\n+ E\n  f\n  g\n"
    );
}
