#!/usr/bin/env bash
# The tests on a fresh machine: install what is missing (with Chromium, for
# the report pages), fetch the default model (the real-model tests use it),
# run every test, then the house rules: rustfmt and clippy with warnings as
# errors.
#
# Everything builds in the release profile, the same one the main job
# builds in, so llama.cpp and the matrix crates are compiled once for both
# commands (and real-model tests run at full speed).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh browser
cargo run --release --quiet -p fanfold-cli -- model fetch
cargo nextest run --workspace --cargo-profile release "$@"
cargo fmt --all --check
cargo clippy --release --workspace --all-targets --quiet -- -D warnings
