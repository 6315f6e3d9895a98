#!/usr/bin/env bash
# fanfold's `df.fanfold.filter` against LOTUS's `sem_filter` on the same
# rows (examples/film-reviews, 120 reviews of several films), the same
# model (SmolLM2-135M-Instruct Q4_1) behind the same llama-cpp-python
# server, through bench/docetl/usage_proxy.py, which counts each side's
# calls and tokens from the server's own `usage`. Quality is not the point
# (a 135M model); calls and tokens are.
#
#   bash bench/kernel/setup.sh       # once: llama-cpp-python[server]
#   bash bench/python/lotus.sh       # prints the section; REPORT=FILE splices it
#
# Env: LOTUS_VENV (default /tmp/lotusenv: `pip install lotus-ai`, with the
# fanfold package installed into it by this script), LCP_PYTHON, MODEL,
# SERVER_PORT, PROXY_PORT, N_CTX, N_THREADS as in bench/docetl/.
set -euo pipefail
HERE_PY=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE_PY/../.." && pwd)
HERE="$ROOT/bench/docetl"
LOTUS_VENV=${LOTUS_VENV:-/tmp/lotusenv}
SERVER_PORT=${SERVER_PORT:-8080}
PROXY_PORT=${PROXY_PORT:-8081}
LCP_PYTHON=${LCP_PYTHON:-/tmp/lcp-venv/bin/python}
MODEL=${MODEL:-/root/.cache/fanfold/models/SmolLM2-135M-Instruct.Q4_1.gguf}
N_CTX=${N_CTX:-2048}
N_THREADS=${N_THREADS:-2}
report=${REPORT:-}
"$LOTUS_VENV/bin/python" -c 'import lotus' 2>/dev/null \
  || { echo "no LOTUS in $LOTUS_VENV: python3 -m venv $LOTUS_VENV && $LOTUS_VENV/bin/pip install lotus-ai" >&2; exit 1; }
CARGO_TARGET_DIR="$ROOT/target" "$LOTUS_VENV/bin/pip" install --quiet --disable-pip-version-check "$ROOT/python"
work=$(mktemp -d)
. "$HERE/common.sh"
start_server "$work/server.log"
for side in fanfold lotus; do
  start_proxy "$work/usage-$side.jsonl" "$work/proxy-$side.log" "$side"
  (cd "$work" && FANFOLD_BIN="$ROOT/target/release/fanfold" "$LOTUS_VENV/bin/python" \
    "$HERE_PY/lotus_filter.py" "$side" "$ROOT/examples/film-reviews/reviews.jsonl" \
    "http://127.0.0.1:$PROXY_PORT/v1" "$work/result-$side.json")
  # The proxy for the next side starts on the same port.
  kill "${STARTED[-1]}"; wait "${STARTED[-1]}" 2>/dev/null || true
  unset 'STARTED[-1]'
done
section=$(python3 "$HERE_PY/lotus_section.py" "$work" "$("$LOTUS_VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("lotus-ai"))')")
printf '%s\n' "$section"
if [ -n "$report" ]; then
  printf '%s\n' "$section" | python3 "$ROOT/bench/splice.py" python-lotus "$report"
fi
rm -rf "$work"
