//! `fanfold ask` and `run` on inputs of some size: the cheap first rung a
//! question gets, and what a long run says before and while it works.

#[allow(unused_imports)]
use super::*;
