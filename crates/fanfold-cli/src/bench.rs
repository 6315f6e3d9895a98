//! `fanfold bench`: measurements written as reports.

use std::process::ExitCode;

use clap::Subcommand;

#[derive(Subcommand)]
pub enum BenchCommand {
    /// Partition + prefilter throughput and peak memory on a large JSONL
    /// file, side by side with `jq -c 'select(...)'`.
    Deterministic,
}

pub fn main(cmd: BenchCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        BenchCommand::Deterministic => anyhow::bail!("not built yet"),
    }
}
