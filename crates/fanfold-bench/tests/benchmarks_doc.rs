//! `docs/benchmarks.md` as committed: every section a command writes names
//! the commit it was measured at, and none claims to be current when a
//! later commit changed the code it measures.

use std::path::PathBuf;

use fanfold_bench::stamp::{Verdict, audit_report, describe};

#[test]
fn every_benchmark_section_names_a_commit_no_older_than_its_code() -> anyhow::Result<()> {
    let report = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/benchmarks.md");
    let verdicts = audit_report(&report)?;
    assert!(
        verdicts.len() >= 20,
        "only {} marked sections found in {}",
        verdicts.len(),
        report.display()
    );
    let mut failures = Vec::new();
    for (name, verdict) in &verdicts {
        let line = describe(name, verdict);
        // Shown on every run, so a checkout without history says so.
        eprintln!("{line}");
        if verdict.is_failure() {
            failures.push(line);
        }
    }
    let unchecked = verdicts
        .iter()
        .filter(|(_, v)| matches!(v, Verdict::Unchecked { .. }))
        .count();
    if unchecked > 0 {
        eprintln!(
            "{unchecked} of {} sections checked for a well-formed stamp only: this checkout cannot tell their commit's age",
            verdicts.len()
        );
    }
    assert!(
        failures.is_empty(),
        "sections of docs/benchmarks.md:\n{}",
        failures.join("\n")
    );
    Ok(())
}
