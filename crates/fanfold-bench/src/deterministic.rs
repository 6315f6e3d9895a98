//! `fanfold bench`: measurements written as reports.
//!
//! Every figure in a report is measured by the run that writes it. Each side
//! of a comparison runs as its own child process so that its peak memory is
//! its own: a fanfold side is this binary started again with the hidden
//! `--worker` flag, which does only the work and prints what it measured.

use std::fs::File;
use std::io::{BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Instant, SystemTime};

use anyhow::{Context, Result, bail, ensure};
use clap::{Args, ValueEnum};
use fanfold_core::ContentHash;
use fanfold_core::spec::{PartitionSpec, PrefilterAction, PrefilterRule};
use fanfold_ops::jq::to_val;
use fanfold_ops::partition::jsonl::{self, FastElement, FastOptions, Record};
use fanfold_ops::partition::{self, Element, PartitionOptions};
use fanfold_ops::prefilter::fast::RecordPrefilter;
use fanfold_ops::prefilter::{Outcome, Prefilter};
use serde::{Deserialize, Serialize};

use crate::report::{cpu_model, kernel, load_average, utc_date, write_marked_section};

const DEFAULT_PREDICATE: &str = r#".level == "ERROR" and .latency_ms > 500"#;
const SEED: u64 = 7;
const KEY: &str = "id";
/// GNU time: it reports the peak RSS of the process it runs (`%M`).
const GNU_TIME: &str = "/usr/bin/time";

#[derive(Args)]
pub struct DeterministicArgs {
    /// Records in the generated JSONL input.
    #[arg(long, default_value_t = 1_000_000)]
    records: u64,
    /// Where inputs are generated; an input already there with the expected
    /// size is reused.
    #[arg(long, value_name = "DIR", default_value = "target/bench")]
    work_dir: PathBuf,
    /// The Markdown report; only its deterministic-bench section is replaced.
    #[arg(long, value_name = "PATH", default_value = "docs/benchmarks.md")]
    report: PathBuf,
    /// The jq executable to compare with.
    #[arg(long, value_name = "PATH", default_value = "jq")]
    jq: PathBuf,
    /// The selection, a jq expression over one record.
    #[arg(long, default_value = DEFAULT_PREDICATE)]
    predicate: String,
    /// Timed runs of each side; the report gives the median wall time.
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// fanfold's worker threads; all cores when absent.
    #[arg(long)]
    threads: Option<usize>,
    /// Internal: do one fanfold side's work on FILE and print its
    /// measurements as JSON.
    #[arg(long, value_name = "FILE", hide = true)]
    pub(crate) worker: Option<PathBuf>,
    /// Internal: which fanfold path the worker runs.
    #[arg(long, value_enum, default_value_t = PathKind::Fast, hide = true)]
    path: PathKind,
}

/// The two implementations of the deterministic path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum PathKind {
    /// `partition_reader` into `serde_json::Value`, `to_val`, `decide`.
    Serde,
    /// `jsonl::partition_jsonl` with the prefilter on its workers.
    Fast,
}

/// The prefilter of both fanfold paths: it keeps exactly the records the
/// predicate selects, so kept units are comparable with jq's output lines.
fn rules(predicate: &str) -> Vec<PrefilterRule> {
    vec![PrefilterRule {
        name: "not_selected".into(),
        when: format!("({predicate}) | not"),
        action: PrefilterAction::Exclude,
        reason: None,
        stage: None,
    }]
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Counts {
    elements: u64,
    units: u64,
    rejected: u64,
    kept: u64,
    excluded: u64,
}

impl Counts {
    fn add(&mut self, outcome: &Outcome) {
        match outcome {
            Outcome::Exclude { .. } => self.excluded += 1,
            Outcome::Keep { .. } | Outcome::Route { .. } => self.kept += 1,
        }
    }
}

/// Ids kept as `fanfold run` keeps them: integer runs and fingerprints,
/// nothing per unit. A repeat is settled by the store in a run; this
/// input's ids never repeat, and one that did would fail the measurement.
fn run_like_ids() -> partition::CompactSeen<NoStore> {
    partition::CompactSeen::new(NoStore)
}

struct NoStore;

impl partition::ConfirmRepeat for NoStore {
    fn earlier(
        &mut self,
        id: &str,
        _ordinal: u64,
    ) -> Result<Option<partition::UnitPlace>, partition::PartitionError> {
        Err(partition::PartitionError::Io(std::io::Error::other(
            format!("id {id} repeats: the benchmark's input has none, and no store to settle one"),
        )))
    }
}

fn jsonl_spec() -> PartitionSpec {
    PartitionSpec::Jsonl {
        key: Some(KEY.into()),
        kind: "event".into(),
    }
}

/// The value path: the same scanner, then every unit parsed into a serde
/// value and converted for jq (what `partition_reader` hands its callers).
fn count_serde(
    reader: impl std::io::BufRead + Send,
    source_hash: ContentHash,
    predicate: &str,
) -> Result<Counts> {
    let prefilter = Prefilter::compile(&rules(predicate))?;
    let mut counts = Counts::default();
    let mut failure = None;
    let coverage = partition::partition_reader(
        &jsonl_spec(),
        source_hash,
        reader,
        PartitionOptions::default(),
        &mut run_like_ids(),
        &mut |el| match el {
            Element::Unit(u) => match prefilter.decide(u.unit.unit_id.as_str(), to_val(&u.value)) {
                Ok(outcome) => counts.add(&outcome),
                Err(e) => {
                    failure.get_or_insert(e);
                }
            },
            Element::Rejected(_) | Element::Repeated(_) => {}
        },
    )?;
    if let Some(e) = failure {
        return Err(e.into());
    }
    counts.elements = coverage.elements;
    counts.units = coverage.units;
    counts.rejected = coverage.rejected;
    Ok(counts)
}

/// The fast path: lines parsed once into reusable records, prefilter
/// decisions made on the worker threads, units assigned in order on this one.
fn count_fast(
    reader: impl Read + Send,
    source_hash: ContentHash,
    predicate: &str,
    options: FastOptions,
) -> Result<Counts> {
    let rules = rules(predicate);
    // Compiled here once so a bad predicate fails before any thread starts;
    // each worker compiles its own copy because jq programs stay on a thread.
    RecordPrefilter::compile(&rules)?;
    let mut counts = Counts::default();
    let mut failure = None;
    let coverage = jsonl::partition_jsonl(
        Some(KEY),
        "event",
        source_hash,
        reader,
        options,
        &mut run_like_ids(),
        || {
            let prefilter = RecordPrefilter::compile(&rules).map_err(|e| e.to_string());
            // Only whether the unit is kept crosses threads: outcomes carry
            // strings, and a million of them would cost more than the rule.
            move |id: &str, record: &Record| match &prefilter {
                Ok(p) => p
                    .first_match(id, record)
                    .map(|rule| rule.is_none_or(|r| r.action != PrefilterAction::Exclude))
                    .map_err(|e| e.to_string()),
                Err(e) => Err(e.clone()),
            }
        },
        &mut |el| match el {
            FastElement::Unit { extra, .. } => match extra {
                Ok(true) => counts.kept += 1,
                Ok(false) => counts.excluded += 1,
                Err(e) => {
                    failure.get_or_insert(e);
                }
            },
            FastElement::Rejected(_) | FastElement::Repeated(_) => {}
        },
    )?;
    if let Some(e) = failure {
        bail!("{e}");
    }
    counts.elements = coverage.elements;
    counts.units = coverage.units;
    counts.rejected = coverage.rejected;
    Ok(counts)
}

/// What a worker prints.
#[derive(Debug, Serialize, Deserialize)]
struct WorkerReport {
    path: PathKind,
    threads: usize,
    counts: Counts,
    /// Hashing the whole file first: every unit carries the source's hash.
    source_hash_s: f64,
    partition_s: f64,
    /// The process's peak resident set, from `/proc/self/status`.
    vm_hwm_kib: u64,
}

pub(crate) fn worker(file: &Path, args: &DeterministicArgs) -> Result<ExitCode> {
    let threads = args.threads.unwrap_or_else(default_threads);
    let started = Instant::now();
    let source_hash = hash_file(file, threads)?;
    let source_hash_s = started.elapsed().as_secs_f64();
    let started = Instant::now();
    let open = || File::open(file).with_context(|| format!("opening {}", file.display()));
    let counts = match args.path {
        PathKind::Serde => count_serde(BufReader::new(open()?), source_hash, &args.predicate)?,
        PathKind::Fast => {
            let options = FastOptions {
                threads,
                ..FastOptions::default()
            };
            count_fast(
                BufReader::new(open()?),
                source_hash,
                &args.predicate,
                options,
            )?
        }
    };
    let report = WorkerReport {
        path: args.path,
        threads: if args.path == PathKind::Serde {
            1
        } else {
            threads
        },
        counts,
        source_hash_s,
        partition_s: started.elapsed().as_secs_f64(),
        vm_hwm_kib: vm_hwm_kib()?,
    };
    println!("{}", serde_json::to_string(&report)?);
    Ok(ExitCode::SUCCESS)
}

fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// `ContentHash::of_bytes` of the file, without holding it in memory.
fn hash_file(file: &Path, threads: usize) -> Result<ContentHash> {
    hash_file_in_pieces(file, threads, 1 << 20)
}

/// BLAKE3 is a tree: the file is cut at its subtree boundaries into pieces
/// of at least `min_piece` bytes, a few per thread, whose chaining values
/// are computed in parallel and merged back up the same tree.
fn hash_file_in_pieces(file: &Path, threads: usize, min_piece: u64) -> Result<ContentHash> {
    use blake3::hazmat::{HasherExt, Mode, left_subtree_len, merge_subtrees_non_root};

    enum Tree {
        Piece(usize),
        Parent(Box<Tree>, Box<Tree>),
    }
    fn split(offset: u64, len: u64, piece: u64, pieces: &mut Vec<(u64, u64)>) -> Tree {
        if len <= piece || len <= blake3::CHUNK_LEN as u64 {
            pieces.push((offset, len));
            return Tree::Piece(pieces.len() - 1);
        }
        let left = left_subtree_len(len);
        Tree::Parent(
            Box::new(split(offset, left, piece, pieces)),
            Box::new(split(offset + left, len - left, piece, pieces)),
        )
    }
    fn chaining_value(tree: &Tree, cvs: &[blake3::hazmat::ChainingValue]) -> Option<[u8; 32]> {
        match tree {
            Tree::Piece(i) => cvs.get(*i).copied(),
            Tree::Parent(l, r) => Some(merge_subtrees_non_root(
                &chaining_value(l, cvs)?,
                &chaining_value(r, cvs)?,
                Mode::Hash,
            )),
        }
    }

    let open = || File::open(file).with_context(|| format!("opening {}", file.display()));
    let len = open()?.metadata()?.len();
    let piece = (len / (4 * threads.max(1) as u64)).max(min_piece);
    let mut pieces = Vec::new();
    let tree = split(0, len, piece, &mut pieces);
    let Tree::Parent(left, right) = &tree else {
        let mut hasher = blake3::Hasher::new();
        hasher
            .update_reader(open()?)
            .with_context(|| format!("reading {}", file.display()))?;
        return Ok(ContentHash(*hasher.finalize().as_bytes()));
    };
    let next = std::sync::atomic::AtomicUsize::new(0);
    let hash_pieces = || -> Result<Vec<(usize, [u8; 32])>> {
        use std::os::unix::fs::FileExt;
        let f = open()?;
        // Small enough to stay in cache between the copy and the hash.
        let mut buf = vec![0u8; 128 << 10];
        let mut done = Vec::new();
        loop {
            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let Some(&(offset, len)) = pieces.get(i) else {
                return Ok(done);
            };
            let mut hasher = blake3::Hasher::new();
            hasher.set_input_offset(offset);
            let mut at = 0;
            while at < len {
                let want = (len - at).min(buf.len() as u64) as usize;
                let chunk = buf
                    .get_mut(..want)
                    .context("a read larger than its buffer")?;
                f.read_exact_at(chunk, offset + at)
                    .with_context(|| format!("reading {}", file.display()))?;
                hasher.update(chunk);
                at += want as u64;
            }
            done.push((i, hasher.finalize_non_root()));
        }
    };
    let mut cvs = vec![[0u8; 32]; pieces.len()];
    std::thread::scope(|s| -> Result<()> {
        let workers: Vec<_> = (0..threads.max(1)).map(|_| s.spawn(hash_pieces)).collect();
        for w in workers {
            let done = w
                .join()
                .map_err(|_| anyhow::anyhow!("a hashing thread panicked"))??;
            for (i, cv) in done {
                *cvs.get_mut(i).context("a hashed piece out of range")? = cv;
            }
        }
        Ok(())
    })?;
    let missing = || anyhow::anyhow!("a piece of {} was not hashed", file.display());
    let root = blake3::hazmat::merge_subtrees_root(
        &chaining_value(left, &cvs).ok_or_else(missing)?,
        &chaining_value(right, &cvs).ok_or_else(missing)?,
        Mode::Hash,
    );
    Ok(ContentHash(*root.as_bytes()))
}

fn vm_hwm_kib() -> Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")
        .context("reading /proc/self/status (peak memory is measured on Linux only)")?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("no VmHWM line in /proc/self/status")
}

/// One timed run of one side.
#[derive(Debug)]
struct Sample {
    wall_s: f64,
    /// User plus system time.
    cpu_s: f64,
    peak_kib: u64,
    matched: u64,
    worker: Option<WorkerReport>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    Jq,
    Fanfold { path: PathKind, threads: usize },
}

impl Side {
    fn label(&self, jq_version: &str) -> String {
        match self {
            Side::Jq => format!("{jq_version} `-c 'select(P)'`"),
            Side::Fanfold {
                path: PathKind::Fast,
                threads,
            } => format!(
                "fanfold, fast path, {threads} thread{}",
                if *threads == 1 { "" } else { "s" }
            ),
            Side::Fanfold {
                path: PathKind::Serde,
                ..
            } => "fanfold, value path (`partition_reader`), 1 thread".to_owned(),
        }
    }
}

struct Measured {
    side: Side,
    samples: Vec<Sample>,
}

impl Measured {
    fn median_wall(&self) -> f64 {
        let mut walls: Vec<f64> = self.samples.iter().map(|s| s.wall_s).collect();
        walls.sort_by(f64::total_cmp);
        walls.get(walls.len() / 2).copied().unwrap_or(f64::NAN)
    }

    fn median_cpu(&self) -> f64 {
        let mut cpus: Vec<f64> = self.samples.iter().map(|s| s.cpu_s).collect();
        cpus.sort_by(f64::total_cmp);
        cpus.get(cpus.len() / 2).copied().unwrap_or(f64::NAN)
    }

    fn peak_kib(&self) -> u64 {
        self.samples.iter().map(|s| s.peak_kib).max().unwrap_or(0)
    }

    fn matched(&self) -> u64 {
        self.samples.first().map_or(0, |s| s.matched)
    }

    fn median_source_hash_s(&self) -> Option<f64> {
        let mut v: Vec<f64> = self
            .samples
            .iter()
            .filter_map(|s| s.worker.as_ref().map(|w| w.source_hash_s))
            .collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied()
    }
}

struct Input {
    path: PathBuf,
    records: u64,
    bytes: u64,
}

/// Writes the seeded input unless a file of exactly the size the generator
/// produces is already there.
fn ensure_input(dir: &Path, records: u64) -> Result<Input> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(format!("events-seed{SEED}-{records}.jsonl"));
    let expected = fanfold_fixtures::jsonl::write_records(&mut std::io::sink(), SEED, records)?;
    let present = std::fs::metadata(&path).map(|m| m.len()).ok();
    if present != Some(expected) {
        eprintln!("generating {} ({records} records)", path.display());
        let partial = path.with_extension("jsonl.partial");
        let file =
            File::create(&partial).with_context(|| format!("creating {}", partial.display()))?;
        let mut w = std::io::BufWriter::new(file);
        fanfold_fixtures::jsonl::write_records(&mut w, SEED, records)?;
        w.flush()?;
        drop(w);
        std::fs::rename(&partial, &path)
            .with_context(|| format!("renaming {} into place", partial.display()))?;
    }
    Ok(Input {
        path,
        records,
        bytes: expected,
    })
}

/// Reads the file once so every side starts with it in the page cache.
fn warm(path: &Path) -> Result<()> {
    let mut f = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    std::io::copy(&mut f, &mut std::io::sink())?;
    Ok(())
}

/// What GNU time saw of one child process.
struct Timed {
    wall_s: f64,
    peak_kib: u64,
    cpu_s: f64,
}

/// Runs `program args` under GNU time, handing its standard output to
/// `on_stdout` as it arrives. Wall time is measured here, spawn to exit.
fn timed(
    program: &Path,
    args: &[&std::ffi::OsStr],
    scratch: &Path,
    mut on_stdout: impl FnMut(&[u8]),
) -> Result<Timed> {
    let time_out = scratch.join("gnu-time.txt");
    let started = Instant::now();
    let mut child = Command::new(GNU_TIME)
        .arg("-o")
        .arg(&time_out)
        .args(["-f", "%M %U %S"])
        .arg(program)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("starting {GNU_TIME} {}", program.display()))?;
    let mut stdout = child
        .stdout
        .take()
        .context("the standard output was not captured")?;
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = stdout.read(&mut buf)?;
        if n == 0 {
            break;
        }
        on_stdout(buf.get(..n).context("a read larger than its buffer")?);
    }
    let status = child.wait()?;
    let wall_s = started.elapsed().as_secs_f64();
    ensure!(status.success(), "{} failed: {status}", program.display());
    let text = std::fs::read_to_string(&time_out)
        .with_context(|| format!("reading {}", time_out.display()))?;
    // The figures are on the last line; a signal note may precede them.
    let fields: Vec<f64> = text
        .lines()
        .next_back()
        .unwrap_or("")
        .split_whitespace()
        .filter_map(|f| f.parse().ok())
        .collect();
    let &[peak_kib, user_s, sys_s] = fields.as_slice() else {
        bail!("unexpected output of GNU time: {text:?}");
    };
    Ok(Timed {
        wall_s,
        peak_kib: peak_kib as u64,
        cpu_s: user_s + sys_s,
    })
}

fn run_fanfold(
    input: &Path,
    path: PathKind,
    threads: usize,
    predicate: &str,
    scratch: &Path,
) -> Result<Sample> {
    let exe = std::env::current_exe().context("locating the fanfold executable")?;
    let path_arg = match path {
        PathKind::Serde => "serde",
        PathKind::Fast => "fast",
    };
    let threads = threads.to_string();
    let mut args: Vec<&std::ffi::OsStr> = vec![
        "bench".as_ref(),
        "deterministic".as_ref(),
        "--worker".as_ref(),
        input.as_os_str(),
    ];
    for a in [
        "--path",
        path_arg,
        "--threads",
        &threads,
        "--predicate",
        predicate,
    ] {
        args.push(a.as_ref());
    }
    let mut stdout = Vec::new();
    let t = timed(&exe, &args, scratch, |b| stdout.extend_from_slice(b))
        .with_context(|| format!("the fanfold worker ({path_arg})"))?;
    let report: WorkerReport =
        serde_json::from_slice(&stdout).context("reading the fanfold worker's measurements")?;
    Ok(Sample {
        wall_s: t.wall_s,
        cpu_s: t.cpu_s,
        // The worker's own high-water mark; GNU time's agrees with it.
        peak_kib: report.vm_hwm_kib,
        matched: report.counts.kept,
        worker: Some(report),
    })
}

fn run_jq(jq: &Path, input: &Path, predicate: &str, scratch: &Path) -> Result<Sample> {
    let program = format!("select({predicate})");
    let args: Vec<&std::ffi::OsStr> = vec!["-c".as_ref(), program.as_ref(), input.as_os_str()];
    // Counting lines instead of discarding them lets the matches be compared.
    let mut matched = 0u64;
    let t = timed(jq, &args, scratch, |b| {
        matched += b.iter().filter(|&&c| c == b'\n').count() as u64;
    })?;
    Ok(Sample {
        wall_s: t.wall_s,
        cpu_s: t.cpu_s,
        peak_kib: t.peak_kib,
        matched,
        worker: None,
    })
}

fn tool_version(program: &Path, arg: &str) -> Result<String> {
    let out = Command::new(program)
        .arg(arg)
        .output()
        .with_context(|| format!("running {} {arg}", program.display()))?;
    ensure!(
        out.status.success(),
        "{} {arg} failed: {}",
        program.display(),
        out.status
    );
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text.lines().next().unwrap_or("").trim().to_owned())
}

pub(crate) fn deterministic(args: &DeterministicArgs) -> Result<ExitCode> {
    ensure!(args.records > 0, "--records must be at least 1");
    ensure!(args.repeat > 0, "--repeat must be at least 1");
    let threads = args.threads.unwrap_or_else(default_threads);
    let jq_version = tool_version(&args.jq, "--version")
        .with_context(|| format!("jq is needed as the baseline (--jq {})", args.jq.display()))?;
    tool_version(Path::new(GNU_TIME), "--version").context(
        "GNU time measures jq's peak memory; install it (e.g. `apt-get install -y time`)",
    )?;
    // Checked up front so a bad predicate is not reported as a failed side.
    Prefilter::compile(&rules(&args.predicate))?;

    let load = load_average();
    let big = ensure_input(&args.work_dir, args.records)?;
    let small = ensure_input(&args.work_dir, (args.records / 10).max(1))?;

    let mut sides = vec![
        Side::Jq,
        Side::Fanfold {
            path: PathKind::Fast,
            threads,
        },
    ];
    if threads != 1 {
        sides.push(Side::Fanfold {
            path: PathKind::Fast,
            threads: 1,
        });
    }
    sides.push(Side::Fanfold {
        path: PathKind::Serde,
        threads: 1,
    });

    let run = |side: Side, input: &Input| -> Result<Sample> {
        match side {
            Side::Jq => run_jq(&args.jq, &input.path, &args.predicate, &args.work_dir),
            Side::Fanfold { path, threads } => {
                run_fanfold(&input.path, path, threads, &args.predicate, &args.work_dir)
            }
        }
    };

    warm(&big.path)?;
    let mut measured: Vec<Measured> = sides
        .iter()
        .map(|&side| Measured {
            side,
            samples: Vec::new(),
        })
        .collect();
    // Rounds interleave the sides, so a slow spell of the machine is shared.
    for round in 0..args.repeat {
        for m in &mut measured {
            eprintln!(
                "round {}/{}: {}",
                round + 1,
                args.repeat,
                m.side.label(&jq_version)
            );
            m.samples.push(run(m.side, &big)?);
        }
    }
    let reference = measured.first().context("no sides to measure")?;
    for m in &measured {
        for s in &m.samples {
            ensure!(
                s.matched == reference.matched(),
                "{} selected {} records but {} selected {}: the sides disagree",
                m.side.label(&jq_version),
                s.matched,
                reference.side.label(&jq_version),
                reference.matched()
            );
            if let Some(w) = &s.worker {
                ensure!(
                    w.counts.units == big.records && w.counts.rejected == 0,
                    "{}: {} units and {} rejections from {} records",
                    m.side.label(&jq_version),
                    w.counts.units,
                    w.counts.rejected,
                    big.records
                );
            }
        }
    }

    // Memory growth: the same fanfold paths on a tenth of the input.
    warm(&small.path)?;
    let mut growth = Vec::new();
    for m in &measured {
        if matches!(m.side, Side::Fanfold { .. }) {
            let sample = run(m.side, &small)?;
            growth.push((m.side, sample.peak_kib, m.peak_kib()));
        }
    }

    let section = render(&load, args, &jq_version, &big, &small, &measured, &growth);
    write_marked_section(&args.report, "deterministic", &section)?;
    print!("{section}");
    eprintln!("wrote the report section to {}", args.report.display());
    Ok(ExitCode::SUCCESS)
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn render(
    load: &str,
    args: &DeterministicArgs,
    jq_version: &str,
    big: &Input,
    small: &Input,
    measured: &[Measured],
    growth: &[(Side, u64, u64)],
) -> String {
    let mut s = String::new();
    let mut line = |text: String| {
        s.push_str(&text);
        s.push('\n');
    };
    line("## Deterministic path: partition + prefilter against jq".to_owned());
    line(String::new());
    line(format!(
        "Measured by `fanfold bench deterministic --records {} --repeat {}` on {} (UTC); every figure below comes from that run.",
        big.records,
        args.repeat,
        utc_date(SystemTime::now())
    ));
    line(String::new());
    line(format!(
        "- Machine: {} logical CPUs, {}, Linux {}; 1-minute load average {} when the run started, all sides run at nice {} (other work on the machine slows the sides that overlap it).",
        default_threads(),
        cpu_model(),
        kernel(),
        load,
        crate::report::nice()
    ));
    line(format!(
        "- Input: {} records, {} bytes ({:.1} MB), written by `fanfold_fixtures::jsonl::write_records` with seed {SEED}; read from the page cache.",
        big.records,
        big.bytes,
        big.bytes as f64 / 1e6
    ));
    line(format!("- Predicate P: `{}`", args.predicate));
    line(format!(
        "- jq ({jq_version}) runs `jq -c 'select(P)' FILE`; its output lines are counted."
    ));
    line(format!(
        "- fanfold partitions the file as JSONL keyed by `{KEY}` and runs a prefilter with one rule, `exclude when (P) | not`, counting kept and excluded units without keeping units in memory. It first hashes the whole file, because every unit carries the source's hash; that pass is included in its wall time."
    ));
    line("- The value path is `partition::partition_reader` (the one JSONL scanner, on the calling thread, handing each unit over as a `serde_json::Value`) followed by `jq::to_val` and `Prefilter::decide`, what a caller that needs values pays. The fast path is `partition::jsonl::partition_jsonl` with `prefilter::fast::RecordPrefilter` deciding on the worker threads, the path `fanfold run` takes.".to_owned());
    line(String::new());
    line("| side | wall s | records/s | MB/s | peak RSS MiB | matched | CPU s |".to_owned());
    line("|---|---:|---:|---:|---:|---:|---:|".to_owned());
    for m in measured {
        let wall = m.median_wall();
        line(format!(
            "| {} | {:.2} | {:.0} | {:.1} | {:.1} | {} | {:.2} |",
            m.side.label(jq_version),
            wall,
            big.records as f64 / wall,
            big.bytes as f64 / 1e6 / wall,
            mib(m.peak_kib()),
            m.matched(),
            m.median_cpu()
        ));
    }
    line(String::new());
    let jq_wall = measured
        .iter()
        .find(|m| m.side == Side::Jq)
        .map(Measured::median_wall);
    let ratio = |side: &Side| {
        let wall = measured
            .iter()
            .find(|m| m.side == *side)
            .map(Measured::median_wall);
        match (jq_wall, wall) {
            (Some(j), Some(w)) if w > 0.0 => Some(j / w),
            _ => None,
        }
    };
    for m in measured.iter().filter(|m| m.side != Side::Jq) {
        if let Some(r) = ratio(&m.side) {
            let hash = m
                .median_source_hash_s()
                .map(|h| format!(" (of its wall time, {h:.2} s is the source hash)"))
                .unwrap_or_default();
            line(format!(
                "- {} / jq throughput: **{r:.2}x**{hash}",
                m.side.label(jq_version)
            ));
        }
    }
    line(String::new());
    line(format!(
        "All sides selected the same {} records. Wall time is the median of {} interleaved runs, measured by the parent from spawn to exit; each side is its own process. Peak RSS is the highest of those runs: fanfold workers read `VmHWM` from `/proc/self/status` before exiting, jq's is GNU time's `%M` (the kernel's `ru_maxrss`, the same high-water mark). CPU s is user plus system time from GNU time (median), which other load on the machine disturbs less than wall time.",
        measured.first().map_or(0, Measured::matched),
        args.repeat
    ));
    line(String::new());
    line("Memory growth, peak RSS in MiB of the fanfold paths on a tenth of the input and on all of it:".to_owned());
    line(String::new());
    line(format!(
        "| side | {} records | {} records |",
        small.records, big.records
    ));
    line("|---|---:|---:|".to_owned());
    for (side, small_kib, big_kib) in growth {
        line(format!(
            "| {} | {:.1} | {:.1} |",
            side.label(jq_version),
            mib(*small_kib),
            mib(*big_kib)
        ));
    }
    line(String::new());
    line("Both paths remember ids as `fanfold run` does (`CompactSeen`): decimal-integer ids as runs of consecutive numbers, others as 64-bit fingerprints, a hit settled by the store (this input has none). With this input's sequential ids the runs stay a single run, so memory is the bounded chunk pool.".to_owned());
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn records(n: u64) -> Result<Vec<u8>> {
        let mut buf = Vec::new();
        fanfold_fixtures::jsonl::write_records(&mut buf, SEED, n)?;
        Ok(buf)
    }

    /// The same selection written out by hand over serde values.
    fn expected(bytes: &[u8]) -> Result<u64> {
        let mut n = 0;
        for line in bytes.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
            let v: serde_json::Value = serde_json::from_slice(line)?;
            if v["level"] == "ERROR" && v["latency_ms"].as_u64().is_some_and(|l| l > 500) {
                n += 1;
            }
        }
        Ok(n)
    }

    #[test]
    fn both_paths_count_what_a_plain_filter_counts() -> Result<()> {
        let bytes = records(1_000)?;
        let want = expected(&bytes)?;
        assert!(want > 10, "{want}");
        let hash = ContentHash::of_bytes(&bytes);
        let serde = count_serde(&bytes[..], hash, DEFAULT_PREDICATE)?;
        assert_eq!(
            serde,
            Counts {
                elements: 1_000,
                units: 1_000,
                rejected: 0,
                kept: want,
                excluded: 1_000 - want,
            }
        );
        for threads in [1, 2] {
            let options = FastOptions {
                threads,
                chunk_bytes: 4096,
                ..FastOptions::default()
            };
            assert_eq!(
                count_fast(&bytes[..], hash, DEFAULT_PREDICATE, options)?,
                serde
            );
        }
        Ok(())
    }

    #[test]
    fn predicate_errors_fail_the_count() -> Result<()> {
        let bytes = records(10)?;
        let hash = ContentHash::of_bytes(&bytes);
        let options = FastOptions::default();
        assert!(count_fast(&bytes[..], hash, r#".level - 1 > 0"#, options).is_err());
        assert!(count_serde(&bytes[..], hash, r#".level - 1 > 0"#).is_err());
        Ok(())
    }

    #[test]
    fn file_hash_in_pieces_is_the_plain_hash() -> Result<()> {
        let dir = tempfile::tempdir()?;
        for len in [0usize, 1, 1024, 1025, 70_001, 300_000] {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
            let path = dir.path().join(format!("f{len}"));
            std::fs::write(&path, &bytes)?;
            for threads in [1, 3] {
                assert_eq!(
                    hash_file_in_pieces(&path, threads, 1024)?,
                    ContentHash::of_bytes(&bytes),
                    "{len} bytes, {threads} threads"
                );
            }
        }
        Ok(())
    }
}
