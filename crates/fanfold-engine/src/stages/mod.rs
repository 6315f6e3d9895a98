//! The stage kinds. Each is a file here implementing [`Stage`] (the kit,
//! `crate::kit`), with one line in [`build`]; `run`, `explain` and the CLI
//! only ever see the trait.

pub mod audit;
pub mod bm25;
pub mod chunk;
pub mod cluster;
pub mod embed;
pub mod map;
pub mod select;
pub mod widen;

use fanfold_core::spec::StageSpec;

use crate::error::PlanError;
use crate::kit::{BuildContext, Stage};

/// The registry of stage kinds: one line per kind.
pub fn build(decl: &StageSpec, ctx: &mut BuildContext<'_>) -> Result<Box<dyn Stage>, PlanError> {
    match decl {
        StageSpec::Map(s) => Ok(Box::new(map::MapRunner::build(s, ctx)?)),
        StageSpec::Embed(s) => Ok(Box::new(embed::EmbedRunner::build(s, ctx)?)),
        StageSpec::Audit(s) => Ok(Box::new(audit::AuditRunner::build(s, ctx)?)),
        StageSpec::Select(s) => Ok(Box::new(select::SelectRunner::build(s, ctx)?)),
        StageSpec::Chunk(s) => Ok(Box::new(chunk::ChunkRunner::build(s, ctx)?)),
        StageSpec::Cluster(s) => Ok(Box::new(cluster::ClusterRunner::build(s, ctx)?)),
        StageSpec::Bm25(s) => Ok(Box::new(bm25::Bm25Runner::build(s, ctx)?)),
        StageSpec::Widen(s) => Ok(Box::new(widen::WidenRunner::build(s, ctx)?)),
    }
}
