//! End-to-end tests of the `fanfold` binary: one integration-test binary
//! (each file directly in `tests/` would be another binary to link), one
//! module folder per feature, the helpers they share in `common`, and the
//! golden cases under `golden/`.

// A failed step should fail the test loudly, right there.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

mod common;
use common::*;

mod asking;
mod audit;
mod backends;
mod basics;
mod cascade;
mod chunk;
mod cluster;
mod compress;
mod effects;
mod embedded;
mod fleet;
mod golden;
mod group;
mod inputs;
mod interval;
mod ladder;
mod newuser;
mod planner;
mod quotes;
mod realdata;
mod recheck;
mod reducers;
mod reentry;
mod refusals;
mod report;
mod rerank;
mod safety;
mod scorers;
mod select;
mod store;
mod tools;
mod trust;
mod widen;
