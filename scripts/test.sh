#!/usr/bin/env bash
# The tests on a fresh machine: install what is missing, fetch the default
# model (the real-model tests use it), run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo run --quiet -p fanfold-cli -- model fetch
exec cargo nextest run --workspace "$@"
