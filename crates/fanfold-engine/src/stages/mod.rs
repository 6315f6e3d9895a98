//! The stage kinds. Each is a file here implementing [`Stage`] (the kit,
//! `crate::kit`) and [`Kind`] for its spec; the list of kinds in
//! `fanfold_core::stage_kinds!` declares the module and registers it.
//! `run`, `explain` and the CLI only ever see the trait.

use fanfold_core::spec::StageSpec;

use crate::error::PlanError;
use crate::kit::{BuildContext, Stage};

/// How a kind's spec becomes its stage; implemented in the kind's file.
pub trait Kind {
    fn build(&self, ctx: &mut BuildContext<'_>) -> Result<Box<dyn Stage>, PlanError>;
}

macro_rules! registry {
    ($($variant:ident($module:ident, $spec:ty) = $tag:literal,)*) => {
        $(pub mod $module;)*

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
