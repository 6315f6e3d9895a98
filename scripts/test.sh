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
# The Python package as a user installs it: a fresh virtual environment,
# the wheel built by pip (maturin, fetched from PyPI) into the workspace's
# target/, so the engine the tests above built is not built again.
python_env="$(mktemp -d)"
trap 'rm -rf "$python_env"' EXIT
python3 -m venv "$python_env/venv"
CARGO_TARGET_DIR="$PWD/target" "$python_env/venv/bin/pip" install --quiet ./python pytest pandas polars pyarrow nbconvert ipykernel
FANFOLD_BIN="$PWD/target/release/fanfold" "$python_env/venv/bin/python" -m pytest -q -p no:cacheprovider python/tests
cargo fmt --all --check
cargo clippy --release --workspace --all-targets --quiet -- -D warnings
