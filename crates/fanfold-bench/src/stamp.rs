//! Which commit a section of `docs/benchmarks.md` was measured at, and
//! whether the code it measures has changed since.
//!
//! Every section a command writes carries one stamp line,
//! `Measured at commit <40 hex> (<YYYY-MM-DD>).`, right under its heading,
//! written by [`Stamp::line`] and read back by [`Stamp::parse`]. The table
//! [`SECTIONS`] names each section, what writes it and the paths whose
//! change alters its figures; [`audit_report`] compares every stamp with
//! the last commit touching those paths.

use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use std::process::Command;

/// A section of the report: its name between the markers, the command that
/// writes it and the paths (files or folders, from the repository's root)
/// whose change alters its figures.
pub struct Section {
    pub name: &'static str,
    pub writer: &'static str,
    pub paths: &'static [&'static str],
}

/// What a ladder's figures measure, on any backend: the ladder, the
/// rungs' code and the example (`$example`'s ladder and spec).
macro_rules! ladder_paths {
    ($example:literal) => {
        &[
            "crates/fanfold-bench/src/ladder.rs",
            "crates/fanfold-ops/src/chunk.rs",
            "crates/fanfold-ops/src/bm25.rs",
            "crates/fanfold-engine/src/stages/chunk.rs",
            "crates/fanfold-engine/src/stages/map.rs",
            "crates/fanfold-engine/src/stages/rerank.rs",
            "crates/fanfold-ops/src/rerank.rs",
            "crates/fanfold-ops/src/compress.rs",
            "crates/fanfold-llama/src",
            concat!($example, "/ladder.toml"),
            concat!($example, "/spec.toml"),
        ]
    };
}
const LADDER_TRIAGE: &[&str] = ladder_paths!("examples/issue-triage");
const LADDER_BGL: &[&str] = ladder_paths!("examples/bgl-alerts");

/// Every section a command writes. Paths are kept narrow: the bench's own
/// file, the example or script it runs, and the code its figures are about,
/// not everything a run passes through.
pub const SECTIONS: &[Section] = &[
    Section {
        name: "deterministic",
        writer: "fanfold bench deterministic",
        paths: &[
            "crates/fanfold-bench/src/deterministic.rs",
            "crates/fanfold-ops/src/partition",
            "crates/fanfold-ops/src/prefilter.rs",
            "crates/fanfold-ops/src/jq.rs",
        ],
    },
    Section {
        name: "fabric",
        writer: "fanfold bench fabric",
        paths: &[
            "crates/fanfold-bench/src/fabric.rs",
            "crates/fanfold-llama/src",
        ],
    },
    Section {
        name: "http",
        writer: "fanfold bench http",
        paths: &[
            "crates/fanfold-bench/src/http.rs",
            "crates/fanfold-http/src",
        ],
    },
    Section {
        name: "embed",
        writer: "fanfold bench embed",
        paths: &[
            "crates/fanfold-bench/src/embed.rs",
            "crates/fanfold-embed/src",
        ],
    },
    Section {
        name: "scale",
        writer: "fanfold bench scale",
        paths: &["crates/fanfold-bench/src/scale.rs", "bench/scale"],
    },
    Section {
        name: "kill",
        writer: "bench/kill/run.sh",
        paths: &[
            "bench/kill/run.sh",
            "bench/kill/common.sh",
            "crates/fanfold-store/src",
        ],
    },
    Section {
        name: "shared",
        writer: "bench/kill/shared.sh",
        paths: &[
            "bench/kill/shared.sh",
            "bench/kill/common.sh",
            "bench/kill/judge_server.py",
            "crates/fanfold-store/src",
        ],
    },
    Section {
        name: "select",
        writer: "fanfold bench select",
        paths: &[
            "crates/fanfold-bench/src/select.rs",
            "crates/fanfold-ops/src/select.rs",
            "crates/fanfold-engine/src/stages/select.rs",
            "examples/issue-triage/select.toml",
        ],
    },
    Section {
        name: "ladder",
        writer: "fanfold bench ladder",
        paths: LADDER_TRIAGE,
    },
    Section {
        name: "ladder-local_server",
        writer: "fanfold bench ladder --backend local_server",
        paths: LADDER_TRIAGE,
    },
    Section {
        name: "ladder-bgl",
        writer: "fanfold bench ladder --example examples/bgl-alerts",
        paths: LADDER_BGL,
    },
    Section {
        name: "ladder-bgl-local_server",
        writer: "fanfold bench ladder --example examples/bgl-alerts --backend local_server",
        paths: LADDER_BGL,
    },
    // The scripted backend's ladders ([SIMULATED]): what the tests write
    // into a report of their own, never into docs/benchmarks.md.
    Section {
        name: "ladder-scripted",
        writer: "fanfold bench ladder --backend scripted",
        paths: LADDER_TRIAGE,
    },
    Section {
        name: "ladder-bgl-scripted",
        writer: "fanfold bench ladder --example examples/bgl-alerts --backend scripted",
        paths: LADDER_BGL,
    },
    Section {
        name: "cluster",
        writer: "fanfold bench cluster",
        paths: &[
            "crates/fanfold-bench/src/cluster.rs",
            "crates/fanfold-ops/src/cluster.rs",
            "crates/fanfold-engine/src/stages/cluster.rs",
        ],
    },
    Section {
        name: "relations",
        writer: "fanfold bench relations",
        paths: &[
            "crates/fanfold-bench/src/relations.rs",
            "crates/fanfold-ops/src/widen.rs",
            "crates/fanfold-engine/src/stages/widen.rs",
            "examples/issue-relations",
        ],
    },
    Section {
        name: "incremental",
        writer: "fanfold bench incremental",
        paths: &[
            "crates/fanfold-bench/src/incremental.rs",
            "crates/fanfold-ops/src/fold",
        ],
    },
    Section {
        name: "kernel",
        writer: "bench/kernel/run.sh",
        paths: &["bench/kernel", "crates/fanfold-llama/src"],
    },
    Section {
        name: "tools",
        writer: "fanfold bench tools",
        paths: &[
            "crates/fanfold-bench/src/tools.rs",
            "crates/fanfold-ops/src/tool.rs",
            "crates/fanfold-engine/src/stages/tool.rs",
            "crates/fanfold-engine/src/kit/mod.rs",
            "crates/fanfold-testkit/src/tracker.rs",
            "examples/issue-triage/comments.toml",
        ],
    },
    Section {
        name: "cascade",
        writer: "fanfold bench cascade",
        paths: &[
            "crates/fanfold-bench/src/cascade.rs",
            "crates/fanfold-bench/src/classifier.rs",
            "crates/fanfold-ops/src/cascade.rs",
            "crates/fanfold-ops/src/cascade_accept.rs",
            "crates/fanfold-ops/src/proxy.rs",
        ],
    },
    Section {
        name: "plan",
        writer: "bench/plan/run.sh",
        paths: &["bench/plan/run.sh", "crates/fanfold-engine/src/plan.rs"],
    },
    Section {
        name: "cascade-model-oracle",
        writer: "bench/plan/oracle.sh",
        paths: &[
            "bench/plan/oracle.sh",
            "crates/fanfold-ops/src/cascade.rs",
            "crates/fanfold-engine/src/stages/map_cascade.rs",
        ],
    },
    Section {
        name: "plan-triage",
        writer: "bench/plan/triage.sh",
        paths: &["bench/plan/triage.sh", "crates/fanfold-engine/src/plan.rs"],
    },
    Section {
        name: "pairs",
        writer: "fanfold bench pairs",
        paths: &[
            "crates/fanfold-bench/src/pairs.rs",
            "crates/fanfold-ops/src/fold",
        ],
    },
    Section {
        name: "effects",
        writer: "bench/effects/drill.sh",
        paths: &[
            "bench/effects/drill.sh",
            "crates/fanfold-ops/src/effect.rs",
            "crates/fanfold-engine/src/stages/effect.rs",
            "crates/fanfold-store/src/effects.rs",
        ],
    },
    Section {
        name: "fleet",
        writer: "fanfold bench fleet",
        paths: &[
            "crates/fanfold-bench/src/fleet.rs",
            "crates/fanfold-engine/src/fleet",
            "crates/fanfold-store/src/fleet.rs",
        ],
    },
    Section {
        name: "fleet-chaos",
        writer: "bench/drill/fleet.sh",
        paths: &[
            "bench/drill/fleet.sh",
            "crates/fanfold-engine/src/fleet",
            "crates/fanfold-store/src/fleet.rs",
        ],
    },
    Section {
        name: "repeats",
        writer: "bench/repeats/run.sh",
        paths: &["bench/repeats/run.sh", "crates/fanfold-ops/src/partition"],
    },
    Section {
        name: "drill",
        writer: "bench/drill/run.sh",
        paths: &[
            "bench/drill",
            "examples/issue-triage/judged.toml",
            "crates/fanfold-ops/src/audit.rs",
            "crates/fanfold-engine/src/stages/audit.rs",
            "crates/fanfold-engine/src/queue.rs",
        ],
    },
    Section {
        name: "quotes",
        writer: "fanfold bench quotes",
        paths: &[
            "crates/fanfold-bench/src/quotes.rs",
            "crates/fanfold-ops/src/quotes.rs",
        ],
    },
    Section {
        name: "python",
        writer: "bench/python/run.sh",
        paths: &[
            "bench/python/run.sh",
            "bench/python/overhead.py",
            "python/fanfold",
            "crates/fanfold-py/src",
        ],
    },
    Section {
        name: "python-lotus",
        writer: "bench/python/lotus.sh",
        paths: &[
            "bench/python/lotus.sh",
            "bench/python/lotus_filter.py",
            "bench/python/lotus_section.py",
            "crates/fanfold-draft/src",
            "python/fanfold",
            "crates/fanfold-py/src",
        ],
    },
];

/// The table's entry for a section, or an error naming the table.
pub fn section(name: &str) -> Result<&'static Section> {
    SECTIONS.iter().find(|s| s.name == name).with_context(|| {
        format!(
            "the report's section `{name}` has no entry in fanfold-bench's table of measured paths (stamp.rs `SECTIONS`); add one naming the code its figures measure"
        )
    })
}

const PREFIX: &str = "Measured at commit ";
const DIRTY: &str = ", with uncommitted changes under its measured paths";
const OLDER: &str = " Older than the code: code changed at ";

/// The commit a section was measured at, the day, whether the measured
/// paths had uncommitted changes, and, for a section kept after its code
/// changed, the commit that changed it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stamp {
    pub commit: String,
    pub date: String,
    pub dirty: bool,
    pub older_than: Option<(String, String)>,
}

impl Stamp {
    /// The one line every section carries, e.g.
    /// `Measured at commit 0123…cdef (2026-12-06).`
    pub fn line(&self) -> String {
        let mut s = format!("{PREFIX}{} ({})", self.commit, self.date);
        if self.dirty {
            s.push_str(DIRTY);
        }
        s.push('.');
        if let Some((code, date)) = &self.older_than {
            s.push_str(&format!("{OLDER}{code} ({date})."));
        }
        s
    }

    /// Reads a line written by [`Stamp::line`]; `None` when it is not one.
    pub fn parse(line: &str) -> Option<Stamp> {
        let rest = line.trim_end().strip_prefix(PREFIX)?;
        let (commit, rest) = take_commit(rest)?;
        let (date, mut rest) = take_date(rest)?;
        let dirty = match rest.strip_prefix(DIRTY) {
            Some(r) => {
                rest = r;
                true
            }
            None => false,
        };
        let rest = rest.strip_prefix('.')?;
        let older_than = if rest.is_empty() {
            None
        } else {
            let rest = rest.strip_prefix(OLDER)?;
            let (code, rest) = take_commit(rest)?;
            let (code_date, rest) = take_date(rest)?;
            if rest != "." {
                return None;
            }
            Some((code, code_date))
        };
        Some(Stamp {
            commit,
            date,
            dirty,
            older_than,
        })
    }
}

fn take_commit(s: &str) -> Option<(String, &str)> {
    let hex = s.get(..40)?;
    hex.bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        .then(|| (hex.to_owned(), &s[40..]))
}

/// ` (YYYY-MM-DD)` and what follows it.
fn take_date(s: &str) -> Option<(String, &str)> {
    let inner = s.strip_prefix(" (")?;
    let date = inner.get(..10)?;
    let well_formed = date.bytes().enumerate().all(|(i, b)| {
        if i == 4 || i == 7 {
            b == b'-'
        } else {
            b.is_ascii_digit()
        }
    });
    let rest = inner[10..].strip_prefix(')')?;
    well_formed.then(|| (date.to_owned(), rest))
}

/// `git -C DIR ARGS...`: its trimmed output, or `None` when git fails
/// (no git, not a work tree, an unknown commit).
fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Whether git exits 0 (for `merge-base --is-ancestor` and `cat-file -e`).
fn git_ok(dir: &Path, args: &[&str]) -> bool {
    Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The root of the git work tree holding `path` (a file that may not exist
/// yet, or a folder), falling back to the current directory's.
pub fn work_tree_of(path: &Path) -> Option<PathBuf> {
    let mut dir = if path.is_dir() {
        path.to_path_buf()
    } else {
        path.parent().map(Path::to_path_buf).unwrap_or_default()
    };
    if dir.as_os_str().is_empty() || !dir.is_dir() {
        dir = PathBuf::from(".");
    }
    git(&dir, &["rev-parse", "--show-toplevel"])
        .or_else(|| git(Path::new("."), &["rev-parse", "--show-toplevel"]))
        .map(PathBuf::from)
}

/// The last commit touching any of `paths`, with its day.
fn last_change(root: &Path, paths: &[&str]) -> Option<(String, String)> {
    let mut args = vec!["log", "-1", "--format=%H %cs", "--"];
    args.extend_from_slice(paths);
    let out = git(root, &args)?;
    let (commit, date) = out.split_once(' ')?;
    Some((commit.to_owned(), date.to_owned()))
}

/// Whether `a` is `b` or one of its ancestors.
fn is_ancestor(root: &Path, a: &str, b: &str) -> bool {
    a == b || git_ok(root, &["merge-base", "--is-ancestor", a, b])
}

/// The stamp of a section measured now: HEAD of the work tree holding the
/// report, `today` (`YYYY-MM-DD`), and whether the section's paths hold
/// uncommitted changes.
pub fn stamp_now(root: &Path, name: &str, today: &str) -> Result<Stamp> {
    let section = section(name)?;
    let commit = git(root, &["rev-parse", "HEAD"])
        .with_context(|| format!("reading HEAD of {}", root.display()))?;
    let mut args = vec!["status", "--porcelain", "--"];
    args.extend_from_slice(section.paths);
    let status =
        git(root, &args).with_context(|| format!("reading git status of {}", root.display()))?;
    Ok(Stamp {
        commit,
        date: today.to_owned(),
        dirty: !status.is_empty(),
        older_than: None,
    })
}

/// The stamp of figures measured at `commit` and kept as they are: marked
/// older than the code when a later commit changed the section's paths.
pub fn stamp_at(root: &Path, name: &str, commit: &str) -> Result<Stamp> {
    let section = section(name)?;
    let full = git(
        root,
        &["rev-parse", "--verify", &format!("{commit}^{{commit}}")],
    )
    .with_context(|| format!("`{commit}` is no commit of {}", root.display()))?;
    let date = git(root, &["show", "-s", "--format=%cs", &full])
        .with_context(|| format!("reading the date of {full}"))?;
    let older_than =
        last_change(root, section.paths).filter(|(code, _)| !is_ancestor(root, code, &full));
    Ok(Stamp {
        commit: full,
        date,
        dirty: false,
        older_than,
    })
}

/// A section's body with `stamp` as its only stamp line, right under its
/// heading (or first, when it has none).
pub fn apply(body: &str, stamp: &Stamp) -> String {
    let mut lines: Vec<&str> = Vec::new();
    let mut skip_blank = false;
    for line in body.lines() {
        if Stamp::parse(line).is_some() || line.starts_with(PREFIX) {
            skip_blank = true;
            continue;
        }
        if skip_blank && line.is_empty() {
            skip_blank = false;
            continue;
        }
        skip_blank = false;
        lines.push(line);
    }
    let stamp = stamp.line();
    let mut out = String::new();
    match lines.split_first() {
        Some((head, rest)) if head.starts_with('#') => {
            out.push_str(head);
            out.push_str("\n\n");
            out.push_str(&stamp);
            out.push('\n');
            if rest.first().is_some_and(|l| !l.is_empty()) {
                out.push('\n');
            }
            for l in rest {
                out.push_str(l);
                out.push('\n');
            }
        }
        _ => {
            out.push_str(&stamp);
            out.push_str("\n\n");
            for l in &lines {
                out.push_str(l);
                out.push('\n');
            }
        }
    }
    out
}

/// What the check says of one section.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// No commit touching its paths is newer than its stamp.
    Current { commit: String },
    /// Measured with uncommitted changes, written in the same commit as
    /// the last change to its paths.
    CurrentWithItsCode { commit: String, written_in: String },
    /// Marked older than the code, and it is.
    MarkedOlder { commit: String, code: String },
    /// Says it is current, but a later commit changed its paths.
    Stale { commit: String, code: String },
    /// Marked older than the code, but its commit is not before it.
    FalselyMarkedOlder { commit: String, code: String },
    /// The section says it is transcribed by hand: exempt.
    ByHand,
    /// The checkout cannot tell: no history, or not the stamp's commit.
    Unchecked { stamp: Stamp, why: String },
    /// No stamp line, or no entry in [`SECTIONS`].
    Malformed { why: String },
}

impl Verdict {
    pub fn is_failure(&self) -> bool {
        matches!(
            self,
            Verdict::Stale { .. } | Verdict::FalselyMarkedOlder { .. } | Verdict::Malformed { .. }
        )
    }
}

/// Every marked section of a report, in order: name and body. A marker
/// opens its line; one quoted inside prose is not a marker.
pub fn marked_sections(text: &str) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    let mut rest = text;
    let opener = |r: &str| {
        r.match_indices("<!-- bench:").map(|(i, _)| i).find(|&i| {
            r.get(..i)
                .is_some_and(|head| head.is_empty() || head.ends_with('\n'))
        })
    };
    while let Some(at) = opener(rest) {
        let after = &rest[at + "<!-- bench:".len()..];
        let Some(close) = after.find(" -->") else {
            bail!("an unclosed `<!-- bench:` marker");
        };
        let tag = &after[..close];
        let Some(name) = tag.strip_suffix(":start") else {
            bail!("`<!-- bench:{tag} -->` without its start marker");
        };
        let body_start = &after[close + " -->".len()..];
        let end = format!("<!-- bench:{name}:end -->");
        let Some(stop) = body_start.find(&end) else {
            bail!("section `{name}` has no end marker");
        };
        out.push((name.to_owned(), body_start[..stop].to_owned()));
        rest = &body_start[stop + end.len()..];
    }
    Ok(out)
}

/// The check of one section's body against the history of `root` (a git
/// work tree, or `None` when there is none). `report` is the report's
/// path from `root`, where the commit that wrote a stamp is looked up.
pub fn verdict(root: Option<&Path>, report: &str, name: &str, body: &str) -> Verdict {
    if body.contains("*Transcribed by hand*") {
        return Verdict::ByHand;
    }
    let section = match section(name) {
        Ok(s) => s,
        Err(e) => {
            return Verdict::Malformed {
                why: format!("{e:#}"),
            };
        }
    };
    let stamps: Vec<Stamp> = body.lines().filter_map(Stamp::parse).collect();
    let stamp = match stamps.as_slice() {
        [one] => one.clone(),
        [] => {
            return Verdict::Malformed {
                why: format!("no `{PREFIX}<40 hex> (YYYY-MM-DD).` line"),
            };
        }
        _ => {
            return Verdict::Malformed {
                why: format!("{} stamp lines, not one", stamps.len()),
            };
        }
    };
    let Some(root) = root else {
        return Verdict::Unchecked {
            stamp,
            why: "not a git work tree".to_owned(),
        };
    };
    if !git_ok(
        root,
        &["cat-file", "-e", &format!("{}^{{commit}}", stamp.commit)],
    ) {
        return Verdict::Unchecked {
            why: format!(
                "this checkout lacks commit {} (a shallow clone?)",
                stamp.commit
            ),
            stamp,
        };
    }
    let Some((code, _)) = last_change(root, section.paths) else {
        return Verdict::Unchecked {
            why: format!("no commit touches {}", section.paths.join(", ")),
            stamp,
        };
    };
    let current = is_ancestor(root, &code, &stamp.commit);
    match (&stamp.older_than, current) {
        (Some(_), false) => Verdict::MarkedOlder {
            commit: stamp.commit,
            code,
        },
        (Some(_), true) => Verdict::FalselyMarkedOlder {
            commit: stamp.commit,
            code,
        },
        (None, true) => Verdict::Current {
            commit: stamp.commit,
        },
        (None, false) => {
            // Figures measured on uncommitted code and committed together
            // with that code: the commit that wrote the stamp line is the
            // last one touching the paths.
            let written_in = stamp
                .dirty
                .then(|| {
                    git(
                        root,
                        &["log", "--format=%H", "-S", &stamp.line(), "--", report],
                    )
                })
                .flatten()
                .and_then(|log| log.lines().last().map(str::to_owned));
            match written_in {
                Some(w) if w == code => Verdict::CurrentWithItsCode {
                    commit: stamp.commit,
                    written_in: w,
                },
                _ => Verdict::Stale {
                    commit: stamp.commit,
                    code,
                },
            }
        }
    }
}

/// Every marked section of the report at `report` with its verdict.
pub fn audit_report(report: &Path) -> Result<Vec<(String, Verdict)>> {
    let text =
        std::fs::read_to_string(report).with_context(|| format!("reading {}", report.display()))?;
    let root = work_tree_of(report);
    let relative = match (&root, std::fs::canonicalize(report)) {
        (Some(r), Ok(abs)) => abs
            .strip_prefix(std::fs::canonicalize(r).unwrap_or_else(|_| r.clone()))
            .map(|p| p.display().to_string())
            .unwrap_or_else(|_| report.display().to_string()),
        _ => report.display().to_string(),
    };
    Ok(marked_sections(&text)?
        .into_iter()
        .map(|(name, body)| {
            let v = verdict(root.as_deref(), &relative, &name, &body);
            (name, v)
        })
        .collect())
}

/// One line a person reads for a verdict.
pub fn describe(name: &str, v: &Verdict) -> String {
    match v {
        Verdict::Current { commit } => format!("{name}: current, measured at {commit}"),
        Verdict::CurrentWithItsCode { commit, written_in } => format!(
            "{name}: current, measured on uncommitted changes over {commit} and written with them in {written_in}"
        ),
        Verdict::MarkedOlder { commit, code } => format!(
            "{name}: older than the code, and says so: measured at {commit}, code changed at {code}"
        ),
        Verdict::Stale { commit, code } => format!(
            "{name}: STALE: its stamp says current, but it was measured at {commit} and its code changed at {code}; rerun `{}` or mark it older",
            section(name).map_or("its command", |s| s.writer)
        ),
        Verdict::FalselyMarkedOlder { commit, code } => format!(
            "{name}: marked older than the code, but its code last changed at {code}, not after {commit}"
        ),
        Verdict::ByHand => format!("{name}: transcribed by hand, exempt"),
        Verdict::Unchecked { stamp, why } => format!(
            "{name}: stamp well formed (commit {}), history not checked: {why}",
            stamp.commit
        ),
        Verdict::Malformed { why } => format!("{name}: MALFORMED: {why}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "0123456789abcdef0123456789abcdef01234567";
    const B: &str = "89abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn stamp_lines_read_back() {
        for s in [
            Stamp {
                commit: A.into(),
                date: "2026-12-06".into(),
                dirty: false,
                older_than: None,
            },
            Stamp {
                commit: A.into(),
                date: "2026-12-06".into(),
                dirty: true,
                older_than: None,
            },
            Stamp {
                commit: A.into(),
                date: "2026-12-01".into(),
                dirty: false,
                older_than: Some((B.into(), "2026-12-04".into())),
            },
        ] {
            assert_eq!(Stamp::parse(&s.line()), Some(s.clone()), "{}", s.line());
        }
        assert_eq!(
            Stamp::parse(&format!("Measured at commit {A} (2026-12-06).")).map(|s| s.dirty),
            Some(false)
        );
        for bad in [
            format!("Measured at commit {} (2026-12-06).", &A[..39]),
            format!("Measured at commit {A} (2026-1-06)."),
            format!("Measured at commit {A} (2026-12-06)"),
            format!("Measured at commit {} (2026-12-06).", A.to_uppercase()),
            format!("Measured at commit {A} (2026-12-06). Older than the code: soon."),
        ] {
            assert_eq!(Stamp::parse(&bad), None, "{bad}");
        }
    }

    #[test]
    fn apply_puts_one_stamp_under_the_heading() {
        let old = Stamp {
            commit: A.into(),
            date: "2026-12-01".into(),
            dirty: false,
            older_than: None,
        };
        let new = Stamp {
            commit: B.into(),
            ..old.clone()
        };
        let body = "## Title\n\nText.\n\n| a |\n";
        let once = apply(body, &old);
        assert_eq!(
            once,
            format!("## Title\n\n{}\n\nText.\n\n| a |\n", old.line())
        );
        let twice = apply(&once, &new);
        assert_eq!(
            twice,
            format!("## Title\n\n{}\n\nText.\n\n| a |\n", new.line())
        );
        assert_eq!(apply("Text.\n", &old), format!("{}\n\nText.\n", old.line()));
    }

    #[test]
    fn sections_are_found_between_markers() -> Result<()> {
        let text = "# R\n<!-- bench:a:start -->\nA\n<!-- bench:a:end -->\nx\n<!-- bench:b:start -->\nB\n<!-- bench:b:end -->\n";
        assert_eq!(
            marked_sections(text)?,
            vec![("a".into(), "\nA\n".into()), ("b".into(), "\nB\n".into())]
        );
        assert!(marked_sections("<!-- bench:a:start -->\nA\n").is_err());
        assert!(marked_sections("<!-- bench:a:end -->").is_err());
        assert!(marked_sections("quoted `<!-- bench:NAME -->` in prose\n")?.is_empty());
        Ok(())
    }

    #[test]
    fn every_section_is_named_once_with_paths() {
        for (i, s) in SECTIONS.iter().enumerate() {
            assert!(!s.paths.is_empty() && s.paths.iter().all(|p| !p.is_empty()));
            assert!(
                SECTIONS[..i].iter().all(|o| o.name != s.name),
                "{} twice",
                s.name
            );
        }
        assert!(section("no-such-section").is_err());
    }

    /// A throwaway repository with `code.rs` and a report, committed.
    fn repo() -> Result<tempfile::TempDir> {
        let dir = tempfile::tempdir()?;
        let run = |args: &[&str]| -> Result<()> {
            let ok = Command::new("git")
                .arg("-C")
                .arg(dir.path())
                .args([
                    "-c",
                    "user.name=t",
                    "-c",
                    "user.email=t@t",
                    "-c",
                    "commit.gpgsign=false",
                ])
                .args(args)
                .output()?
                .status
                .success();
            anyhow::ensure!(ok, "git {args:?} failed");
            Ok(())
        };
        run(&["init", "-q"])?;
        std::fs::create_dir_all(dir.path().join("bench/kernel"))?;
        std::fs::write(dir.path().join("bench/kernel/run.sh"), "one\n")?;
        run(&["add", "."])?;
        run(&["commit", "-q", "-m", "one"])?;
        Ok(dir)
    }

    fn commit_change(dir: &Path, text: &str) -> Result<String> {
        std::fs::write(dir.join("bench/kernel/run.sh"), text)?;
        for args in [
            vec!["add", "."],
            vec![
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@t",
                "-c",
                "commit.gpgsign=false",
                "commit",
                "-q",
                "-m",
                text,
            ],
        ] {
            let ok = Command::new("git")
                .arg("-C")
                .arg(dir)
                .args(&args)
                .output()?
                .status
                .success();
            anyhow::ensure!(ok, "git {args:?} failed");
        }
        git(dir, &["rev-parse", "HEAD"]).context("HEAD")
    }

    #[test]
    fn a_stamp_older_than_its_code_fails_unless_marked() -> Result<()> {
        if git(Path::new("."), &["--version"]).is_none() {
            eprintln!("no git on this machine: history checks not exercised");
            return Ok(());
        }
        let dir = repo()?;
        let root = dir.path();
        let measured = stamp_now(root, "kernel", "2026-12-06")?;
        assert!(!measured.dirty);
        let body = apply("## Kernel\n\nfigures\n", &measured);
        assert!(matches!(
            verdict(Some(root), "r.md", "kernel", &body),
            Verdict::Current { .. }
        ));
        std::fs::write(root.join("bench/kernel/run.sh"), "edited\n")?;
        assert!(stamp_now(root, "kernel", "2026-12-06")?.dirty);
        let code = commit_change(root, "two\n")?;
        assert_eq!(
            verdict(Some(root), "r.md", "kernel", &body),
            Verdict::Stale {
                commit: measured.commit.clone(),
                code: code.clone()
            }
        );
        let kept = apply(&body, &stamp_at(root, "kernel", &measured.commit)?);
        assert!(kept.contains("Older than the code: code changed at"));
        assert_eq!(
            verdict(Some(root), "r.md", "kernel", &kept),
            Verdict::MarkedOlder {
                commit: measured.commit.clone(),
                code: code.clone()
            }
        );
        // Marked older at the commit that is the code's last change: false.
        let mut wrong = stamp_at(root, "kernel", &code)?;
        assert_eq!(wrong.older_than, None);
        wrong.older_than = Some((measured.commit.clone(), "2026-12-01".into()));
        assert!(matches!(
            verdict(Some(root), "r.md", "kernel", &apply(&body, &wrong)),
            Verdict::FalselyMarkedOlder { .. }
        ));
        // Without history only the form is checked.
        assert!(matches!(
            verdict(None, "r.md", "kernel", &body),
            Verdict::Unchecked { .. }
        ));
        let unknown = apply(
            "## K\n",
            &Stamp {
                commit: A.into(),
                ..measured.clone()
            },
        );
        assert!(matches!(
            verdict(Some(root), "r.md", "kernel", &unknown),
            Verdict::Unchecked { .. }
        ));
        assert!(verdict(Some(root), "r.md", "kernel", "## K\n\nno stamp\n").is_failure());
        assert!(verdict(Some(root), "r.md", "unknown", &body).is_failure());
        assert_eq!(
            verdict(Some(root), "r.md", "kernel", "*Transcribed by hand* from x"),
            Verdict::ByHand
        );
        Ok(())
    }
}
