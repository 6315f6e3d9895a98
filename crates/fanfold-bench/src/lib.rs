//! Measurements of fanfold, written as reports, and the self-check that
//! proves the spine's claims on the example fixture.
//!
//! This crate is the application side of `fanfold bench` and `fanfold
//! selfcheck`: it drives the engine, the embedded model and the HTTP
//! backends, and every figure it writes is measured by the run that writes
//! it. Its errors go straight to the person running the command, so it
//! reports them with `anyhow` context like the binary does.

mod cascade;
mod classifier;
mod cluster;
mod deterministic;
mod embed;
mod fabric;
mod fleet;
mod http;
mod incremental;
pub mod ladder;
pub mod page;
mod pairs;
mod population;
pub mod provider;
mod quotes;
mod relations;
pub mod report;
mod scale;
mod select;
pub mod selfcheck;
pub mod stamp;
mod tools;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};

pub use deterministic::DeterministicArgs;

#[derive(Subcommand)]
pub enum BenchCommand {
    /// Partition + prefilter throughput and peak memory on a large JSONL
    /// file, side by side with `jq -c 'select(...)'`.
    Deterministic(DeterministicArgs),
    /// The execution fabric on the embedded model: shared prefix + N slots
    /// vs naive vs one slot, prefix and slot sweeps, and the llama.cpp
    /// throughput limit, side by side in one run.
    Fabric(FabricCliArgs),
    /// The example's embed stage against the fixture's oracle: encoder
    /// throughput and where the threshold falls among each kind of issue.
    Embed(EmbedCliArgs),
    /// The HTTP backend's scheduler against an in-process mock endpoint
    /// with a fixed latency: wall time against the ideal schedule.
    Http(http::HttpArgs),
    /// `fanfold run` processes sharing a PostgreSQL store (a throwaway
    /// server) against a loopback judge: throughput of 1 to 8 processes
    /// against linear, the store's cost per unit on SQLite and PostgreSQL,
    /// and processes killed with SIGKILL one at a time.
    Fleet(fleet::FleetArgs),
    /// `fanfold run` at 10k, 100k and 1M records: wall per phase, peak
    /// memory, store size, jq on the same file, and a rerun after 1 % of
    /// the records change.
    Scale(scale::ScaleArgs),
    /// A select in front of the judge on the example: no routing, rules
    /// only, and the model scoring the catalog, side by side against the
    /// fixture's oracle.
    Select(SelectCliArgs),
    /// Every strategy on the example's question (jq rules, the embedding
    /// rung, coarse chunks, one long context, micro-contexts, the adaptive
    /// ladder), side by side against the fixture's oracle on a development
    /// and a held-out split, with the Pareto frontier of quality against
    /// tokens and wall time.
    Ladder(LadderCliArgs),
    /// The example's model reducer: its themes against the fixture's
    /// causes, and their drift over input orders and fan-ins.
    Cluster(SelectCliArgs),
    /// Reruns of the example after 1 %, 10 % and 100 % of its issues are
    /// edited, 1 % inserted and 1 % deleted: model calls, vectors and fold
    /// nodes recomputed against what changed.
    Incremental(IncrementalCliArgs),
    /// The relations example record-level and widened: what widening
    /// recovers of an answer one record cannot give, against its oracle.
    Relations(RelationsCliArgs),
    /// "Pairs of reviews of one film with opposite sentiment": per-unit
    /// facts folded into pairs, against a pairwise judge (one context a
    /// candidate pair), on the same model and reviews, side by side.
    Pairs(PairsCliArgs),
    /// Evidence quotes on text whose punctuation is HTML entities, on the
    /// embedded model: the former sentence-only offer against today's
    /// spans, side by side on the same reviews.
    Quotes(QuotesCliArgs),
    /// Read-only enrichment on the example's comment fetch, against the
    /// local tracker with injected latency, 429s and hangs: calls against
    /// units, what deduplication, the observation cache and a contract's
    /// cancellation save, the quota as the tracker saw it, and wall time
    /// against fetching everything first.
    Tools(ToolsCliArgs),
    /// Whether a cascade keeps its stated guarantee (synthetic scores with
    /// known truth, over seeded trials) and what it saves on an example
    /// with human labels as the oracle.
    Cascade(CascadeCliArgs),
    /// The trained proxy fitted on labels chosen where it is unsure and
    /// deciding under an accuracy target through the cascade, against a
    /// plain logistic regression on as many random labels: F1 on the
    /// units never labelled, over seeded trials. Printed, not written:
    /// `fanfold bench cascade` writes the same table into its section.
    Classifier(ClassifierCliArgs),
    /// Writes the section NAME of the report from stdin, stamped with the
    /// commit it was measured at: what the scripts under `bench/` write
    /// their sections with (through `bench/splice.py`).
    Splice(SpliceCliArgs),
    /// Stamps the section NAME as measured at COMMIT, leaving its figures
    /// as they are; marks it older than the code when a later commit
    /// changed the paths it measures.
    Restamp(RestampCliArgs),
    /// Every section of the report with the commit it was measured at,
    /// against the last commit changing the code it measures; exits 1
    /// when a section claims to be current and is not.
    Stamps(StampsCliArgs),
}

#[derive(Args)]
pub struct SpliceCliArgs {
    /// The section's name, as in `<!-- bench:NAME:start -->`.
    name: String,
    #[arg(long, value_name = "PATH", default_value = "docs/benchmarks.md")]
    report: PathBuf,
}

#[derive(Args)]
pub struct RestampCliArgs {
    /// The section's name, as in `<!-- bench:NAME:start -->`.
    name: String,
    /// The commit its figures were measured at.
    #[arg(long, value_name = "COMMIT")]
    at: String,
    #[arg(long, value_name = "PATH", default_value = "docs/benchmarks.md")]
    report: PathBuf,
}

#[derive(Args)]
pub struct StampsCliArgs {
    #[arg(long, value_name = "PATH", default_value = "docs/benchmarks.md")]
    report: PathBuf,
}

#[derive(Args)]
pub struct ClassifierCliArgs {
    /// An example folder with a `ladder.toml` naming its oracle and embed
    /// stage.
    #[arg(long, default_value = "examples/bgl-alerts")]
    example: PathBuf,
    /// Seeded trials per population, method and proof budget.
    #[arg(long, default_value_t = 50)]
    trials: u64,
}

#[derive(Args)]
pub struct CascadeCliArgs {
    /// An example folder with a `ladder.toml` naming its oracle, embed
    /// stage, judge and BM25 query.
    #[arg(long, default_value = "examples/bgl-alerts")]
    example: PathBuf,
    #[arg(long, value_name = "PATH", default_value = "docs/benchmarks.md")]
    report: PathBuf,
    /// Synthetic trials per target and sampling.
    #[arg(long, default_value_t = 200)]
    trials: u64,
    /// Seeds per proxy and label budget on the example.
    #[arg(long, default_value_t = 50)]
    seeds: u64,
}

#[derive(Args)]
pub struct ToolsCliArgs {
    /// The issue-triage example folder (its `comments.toml`, issues,
    /// comments and oracle).
    #[arg(long, default_value = "examples/issue-triage")]
    example: PathBuf,
    #[arg(long, value_name = "PATH", default_value = "docs/benchmarks.md")]
    report: PathBuf,
    /// The judge's backend, one the spec declares.
    #[arg(long, default_value = "scripted")]
    backend: String,
    #[arg(long, default_value_t = 4)]
    slots: usize,
    /// The tracker's latency on every answer.
    #[arg(long, default_value_t = 25)]
    latency_ms: u64,
    /// The tracker answers every N-th request 429.
    #[arg(long, default_value_t = 9)]
    every_429: u64,
    /// The tracker hangs every N-th request past the stage's timeout.
    #[arg(long, default_value_t = 23)]
    every_hang: u64,
    #[arg(long, default_value_t = 8_000)]
    hang_ms: u64,
    /// The threshold contract's count in the cancellation run.
    #[arg(long, default_value_t = 12)]
    threshold: u64,
}

#[derive(Args)]
pub struct IncrementalCliArgs {
    /// The issue-triage example folder.
    #[arg(long, default_value = "examples/issue-triage")]
    example: PathBuf,
    #[arg(long, value_name = "PATH", default_value = "docs/benchmarks.md")]
    report: PathBuf,
    /// The backend of the spec to judge with; the accounting is the
    /// engine's on any backend.
    #[arg(long, default_value = "scripted")]
    backend: String,
    #[arg(long, default_value_t = 4)]
    slots: usize,
    /// Seeds which issues are touched.
    #[arg(long, default_value_t = 7)]
    seed: u64,
}

#[derive(Args)]
pub struct PairsCliArgs {
    /// The film-reviews example folder (its specs, reviews and oracle).
    #[arg(long, default_value = "examples/film-reviews")]
    example: PathBuf,
    #[arg(long, value_name = "PATH", default_value = "docs/benchmarks.md")]
    report: PathBuf,
    /// Reviews of each film taken, the first by id: the pairwise judge
    /// makes one call per pair of them.
    #[arg(long, default_value_t = 6)]
    per_film: usize,
    #[arg(long, default_value_t = 4)]
    slots: usize,
    /// Run every model turn on this backend of the spec (e.g. `scripted`).
    #[arg(long)]
    backend: Option<String>,
}

#[derive(Args)]
pub struct QuotesCliArgs {
    /// The film-reviews example folder (its `count-by-film.toml`).
    #[arg(long, default_value = "examples/film-reviews")]
    example: PathBuf,
    #[arg(long, value_name = "PATH", default_value = "docs/benchmarks.md")]
    report: PathBuf,
    /// Reviews of each of the fixture's six films.
    #[arg(long, default_value_t = 20)]
    per_film: usize,
    #[arg(long, default_value_t = 5)]
    seed: u64,
    #[arg(long, default_value_t = 4)]
    slots: usize,
}

#[derive(Args)]
pub struct RelationsCliArgs {
    /// The issue-relations example folder (its `spec.toml` and oracle).
    #[arg(long, default_value = "examples/issue-relations")]
    example: PathBuf,
    #[arg(long, value_name = "PATH", default_value = "docs/benchmarks.md")]
    report: PathBuf,
    #[arg(long, default_value_t = 4)]
    slots: usize,
    /// Run every model turn on this backend of the spec (e.g. `scripted`).
    #[arg(long)]
    backend: Option<String>,
}

#[derive(Args)]
pub struct LadderCliArgs {
    /// The example folder: its `spec.toml`, `ladder.toml` (stages, BM25
    /// query, rule candidates, oracle) and `chunk.md`.
    #[arg(long, default_value = "examples/issue-triage")]
    example: PathBuf,
    #[arg(long, value_name = "PATH", default_value = "docs/benchmarks.md")]
    report: PathBuf,
    /// Where the measured rows go, for `fanfold report ladder`
    /// [default: docs/NAME.json, NAME from `ladder.toml`, or
    /// docs/NAME-BACKEND.json with `--backend`].
    #[arg(long, value_name = "PATH")]
    json: Option<PathBuf>,
    #[arg(long, default_value_t = 4)]
    slots: usize,
    /// Run only these strategies (comma-separated): deterministic, bm25, embed,
    /// embed-top-k, embed-top-k-judge,
    /// chunk-10, chunk-50, chunk-200, long, micro, batch, adaptive.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Run every model strategy on this backend of the spec (e.g.
    /// `scripted`, `local_server`) instead of the embedded default.
    #[arg(long)]
    backend: Option<String>,
    /// Seeds the development / held-out split of the records.
    #[arg(long, default_value_t = 7)]
    split_seed: u64,
    /// The input file, in place of the spec's: data kept outside the
    /// project, e.g. loghub's BGL sample for `examples/bgl-alerts`.
    #[arg(long, value_name = "FILE")]
    input: Option<PathBuf>,
    /// Run on the first N records of the input only (a JSON array or JSON
    /// lines), the oracle cut to them: a data set sized so the `long`
    /// rung's one context holds everything the prefilter keeps.
    #[arg(long, value_name = "N")]
    first: Option<usize>,
}

#[derive(Args)]
pub struct SelectCliArgs {
    /// The issue-triage example folder (its `select.toml` and oracle).
    #[arg(long, default_value = "examples/issue-triage")]
    example: PathBuf,
    #[arg(long, value_name = "PATH", default_value = "docs/benchmarks.md")]
    report: PathBuf,
    #[arg(long, default_value_t = 4)]
    slots: usize,
}

#[derive(Args)]
pub struct EmbedCliArgs {
    /// The issue-triage example folder.
    #[arg(long, default_value = "examples/issue-triage")]
    example: PathBuf,
    #[arg(long, value_name = "PATH", default_value = "docs/benchmarks.md")]
    report: PathBuf,
}

#[derive(Args)]
pub struct FabricCliArgs {
    /// The issue-triage example folder.
    #[arg(long, default_value = "examples/issue-triage")]
    example: PathBuf,
    /// Units measured (the first the example's prefilter routes).
    #[arg(long, default_value_t = 16)]
    units: usize,
    /// Slots of the shared and naive configurations.
    #[arg(long, default_value_t = 4)]
    slots: usize,
    #[arg(long, value_name = "PATH", default_value = "docs/benchmarks.md")]
    report: PathBuf,
    /// Where the SVG plots go.
    #[arg(long, value_name = "DIR", default_value = "docs")]
    plots: PathBuf,
    /// Measure the side-by-side configurations only, not the prefix and
    /// slot sweeps.
    #[arg(long)]
    no_sweeps: bool,
}

/// Runs one bench and writes its section of the report.
pub fn run(cmd: BenchCommand) -> Result<ExitCode> {
    match cmd {
        BenchCommand::Deterministic(args) => match &args.worker {
            Some(file) => deterministic::worker(file, &args),
            None => deterministic::deterministic(&args),
        },
        BenchCommand::Fabric(a) => {
            fabric::main(fabric::FabricArgs {
                example: a.example,
                units: a.units,
                slots: a.slots,
                report: a.report,
                plot_dir: a.plots,
                no_sweeps: a.no_sweeps,
            })?;
            Ok(ExitCode::SUCCESS)
        }
        BenchCommand::Embed(a) => {
            embed::main(embed::EmbedArgs {
                example: a.example,
                report: a.report,
            })?;
            Ok(ExitCode::SUCCESS)
        }
        BenchCommand::Http(a) => {
            http::main(&a)?;
            Ok(ExitCode::SUCCESS)
        }
        BenchCommand::Cascade(a) => {
            cascade::main(&cascade::CascadeArgs {
                example: a.example,
                report: a.report,
                trials: a.trials,
                seeds: a.seeds,
            })?;
            Ok(ExitCode::SUCCESS)
        }
        BenchCommand::Classifier(a) => {
            classifier::main(&classifier::ClassifierArgs {
                example: a.example,
                trials: a.trials,
            })?;
            Ok(ExitCode::SUCCESS)
        }
        BenchCommand::Tools(a) => {
            tools::main(&tools::ToolsArgs {
                example: a.example,
                report: a.report,
                backend: a.backend,
                slots: a.slots,
                faults: fanfold_testkit::tracker::Faults {
                    latency_ms: a.latency_ms,
                    every_429: a.every_429,
                    every_hang: a.every_hang,
                    hang_ms: a.hang_ms,
                    lose_every: 0,
                    hang_once_at: 0,
                },
                threshold: a.threshold,
            })?;
            Ok(ExitCode::SUCCESS)
        }
        BenchCommand::Select(a) => {
            select::main(&select::SelectArgs {
                example: a.example,
                report: a.report,
                slots: a.slots,
            })?;
            Ok(ExitCode::SUCCESS)
        }
        BenchCommand::Ladder(a) => {
            ladder::main(&ladder::LadderArgs {
                example: a.example,
                report: a.report,
                json: a.json,
                slots: a.slots,
                only: a.only,
                backend: a.backend,
                split_seed: a.split_seed,
                input: a.input,
                first: a.first,
            })?;
            Ok(ExitCode::SUCCESS)
        }
        BenchCommand::Incremental(a) => {
            incremental::main(&incremental::IncrementalArgs {
                example: a.example,
                report: a.report,
                backend: a.backend,
                slots: a.slots,
                seed: a.seed,
            })?;
            Ok(ExitCode::SUCCESS)
        }
        BenchCommand::Quotes(a) => {
            quotes::main(&quotes::QuotesArgs {
                example: a.example,
                per_film: a.per_film,
                seed: a.seed,
                slots: a.slots,
                report: a.report,
            })?;
            Ok(ExitCode::SUCCESS)
        }
        BenchCommand::Pairs(a) => {
            pairs::main(&pairs::PairsArgs {
                example: a.example,
                report: a.report,
                per_film: a.per_film,
                slots: a.slots,
                backend: a.backend,
            })?;
            Ok(ExitCode::SUCCESS)
        }
        BenchCommand::Relations(a) => {
            relations::main(&relations::RelationsArgs {
                example: a.example,
                report: a.report,
                slots: a.slots,
                backend: a.backend,
            })?;
            Ok(ExitCode::SUCCESS)
        }
        BenchCommand::Cluster(a) => {
            cluster::main(&cluster::ClusterArgs {
                example: a.example,
                report: a.report,
                slots: a.slots,
            })?;
            Ok(ExitCode::SUCCESS)
        }
        BenchCommand::Scale(a) => {
            scale::main(&a)?;
            Ok(ExitCode::SUCCESS)
        }
        BenchCommand::Fleet(a) => {
            fleet::main(&a)?;
            Ok(ExitCode::SUCCESS)
        }
        BenchCommand::Splice(a) => {
            let mut body = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut body)
                .context("reading the section from stdin")?;
            let body = format!("{}\n", body.trim_matches('\n'));
            report::write_marked_section(&a.report, &a.name, &body)?;
            Ok(ExitCode::SUCCESS)
        }
        BenchCommand::Restamp(a) => {
            report::restamp(&a.report, &a.name, &a.at)?;
            Ok(ExitCode::SUCCESS)
        }
        BenchCommand::Stamps(a) => {
            let verdicts = stamp::audit_report(&a.report)?;
            for (name, v) in &verdicts {
                println!("{}", stamp::describe(name, v));
            }
            Ok(if verdicts.iter().any(|(_, v)| v.is_failure()) {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            })
        }
    }
}
