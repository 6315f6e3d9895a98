//! The stage kinds. Each is a file here implementing [`Stage`] (the kit,
//! `crate::kit`) and [`Kind`] for its spec; the list of kinds in
//! module is declared here by hand (so `rustfmt` sees it) and registered
//! by the list of kinds in `fanfold_core::stage_kinds!`; the registry
//! names each listed module, so a listed kind without its file does not
//! compile, and a test finds a file the list lacks.
//! `run`, `explain` and the CLI only ever see the trait.

use fanfold_core::spec::StageSpec;

use crate::error::PlanError;
use crate::kit::{BuildContext, Stage};

/// How a kind's spec becomes its stage; implemented in the kind's file.
pub trait Kind {
    fn build(&self, ctx: &mut BuildContext<'_>) -> Result<Box<dyn Stage>, PlanError>;
}

pub mod audit;
pub mod bm25;
pub mod chunk;
pub mod cluster;
pub mod effect;
pub mod embed;
pub mod group;
pub mod map;
pub mod rerank;
pub mod select;
pub mod tool;
pub mod widen;

macro_rules! registry {
    ($($variant:ident($module:ident, $spec:ty) = $tag:literal,)*) => {
        $(#[allow(unused_imports)] use self::$module as _;)*

        /// The module of every listed kind, as the list names it.
        #[cfg(test)]
        const KIND_MODULES: &[&str] = &[$(stringify!($module),)*];

        /// The registry of stage kinds, generated from the list of kinds.
        pub fn build(
            decl: &StageSpec,
            ctx: &mut BuildContext<'_>,
        ) -> Result<Box<dyn Stage>, PlanError> {
            match decl {
                $(StageSpec::$variant(s) => <$spec as Kind>::build(s, ctx),)*
            }
        }
    };
}

fanfold_core::stage_kinds!(registry);

/// The cascade a map stage may declare in front of its model.
pub mod map_cascade;

#[cfg(test)]
mod tests {
    /// Every kind file in this folder is a listed kind (the registry's
    /// `use` lines already refuse a listed kind without a file).
    #[test]
    fn every_kind_file_is_listed() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/stages");
        let mut files: Vec<String> = std::fs::read_dir(&dir)
            .expect("the stages folder is readable")
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                name.strip_suffix(".rs").map(str::to_owned)
            })
            .filter(|m| m != "mod" && m != "map_cascade")
            .collect();
        files.sort();
        let mut listed: Vec<String> = super::KIND_MODULES.iter().map(|m| m.to_string()).collect();
        listed.sort();
        assert_eq!(files, listed);
    }
}
