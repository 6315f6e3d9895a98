#!/usr/bin/env bash
# The Python package against the CLI on the same spec and records
# (bench/scale/spec.toml, a scripted judge [SIMULATED], so the figures
# measure fanfold, not a model): wall time at 10,000 rows, side by side and
# interleaved; what the table's crossing costs (Arrow against pandas's JSON
# writer); and peak memory at 100,000 rows.
#
#   bash bench/python/run.sh
#
# Env: FANFOLD_BIN (default target/release/fanfold); PY_VENV, a venv to
# create or reuse with the package installed (default /tmp/fanfold-bench-venv);
# REPEAT (default 3); REPORT=FILE (default docs/benchmarks.md; empty: none)
# gets the section `python`.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
bin=${FANFOLD_BIN:-$root/target/release/fanfold}
venv=${PY_VENV:-/tmp/fanfold-bench-venv}
report=${REPORT-$root/docs/benchmarks.md}
[ -x "$bin" ] || { echo "no fanfold binary at $bin: cargo build --release -p fanfold-cli" >&2; exit 1; }
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
CARGO_TARGET_DIR="$root/target" "$venv/bin/pip" install --quiet --disable-pip-version-check \
  "$root/python" pandas pyarrow polars
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$bin" fixture jsonl --records 10000 --seed 7 --out "$work/10000.jsonl" >/dev/null
"$bin" fixture jsonl --records 100000 --seed 7 --out "$work/100000.jsonl" >/dev/null
section=$(FANFOLD_BIN="$bin" "$venv/bin/python" "$here/overhead.py" \
  --spec "$root/bench/scale/spec.toml" --work "$work" --repeat "${REPEAT:-3}")
printf '%s\n' "$section"
if [ -n "$report" ]; then
  printf '%s\n' "$section" | FANFOLD_BIN="$bin" python3 "$root/bench/splice.py" python "$report"
fi
