#!/usr/bin/env bash
# The main job on a fresh machine: install what is missing, build, fetch the
# default model (first use only) and answer the issue-triage question on the
# embedded model. Extra arguments go to `fanfold run`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo build --release -p fanfold-cli
exec ./target/release/fanfold run examples/issue-triage/spec.toml "$@"
