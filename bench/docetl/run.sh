#!/usr/bin/env bash
# Run DocETL on examples/issue-triage against a local OpenAI-compatible
# server, through usage_proxy.py, and write summary.json.
#
#   bash bench/docetl/setup.sh           # once
#   bash bench/docetl/run.sh             # all 1,000 issues
#   bash bench/docetl/run.sh 20          # the first 20 issues (trial)
#
# Env (defaults in brackets):
#   N              limit to the first N issues of the fixture   [all]
#   RUN_DIR        where this run's files go      [/tmp/docetl-bench/run-<time>-n<N>]
#   DOCETL_VENV    venv from setup.sh                           [/tmp/docetl-venv]
#   TIKTOKEN_CACHE_DIR                                          [$DOCETL_VENV/tiktoken-cache]
#   SERVER_PORT    the model server; reused when it answers, else started [8080]
#   PROXY_PORT     usage_proxy.py, started and stopped by this script     [8081]
#   LCP_PYTHON     python with llama-cpp-python[server]  [/tmp/lcp-venv/bin/python]
#   MODEL          GGUF for a server this script starts
#                  [/root/.cache/fanfold/models/SmolLM2-135M-Instruct.Q4_1.gguf]
#   N_CTX, N_THREADS   server settings                          [2048, 2]
#   MAX_THREADS    DocETL --max-threads (fanfold's local_server uses 2)   [2]
#   LOG_BODIES=1   also log request/response bodies in the proxy log      [0]
#
# Files in RUN_DIR: issues.json (the input), pipeline.yaml, out/blockers.json
# (DocETL's answer with causes), intermediate/ (each operation's output; the
# answer set is intermediate/triage/is_auth_blocker.json), usage.jsonl (one line per model call), docetl.log,
# time.txt (/usr/bin/time -v), summary.json.
#
# Cold runs: pipeline.yaml sets bypass_cache, and DOCETL_HOME_DIR points at
# RUN_DIR/home, so DocETL's LLM cache ($DOCETL_HOME_DIR/.cache/docetl/llm,
# normally ~/.cache/docetl) starts empty and is never shared between runs.
# To clear the default one by hand: `docetl clear-cache` or
# `rm -rf ~/.cache/docetl`.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
FIXTURE="$ROOT/examples/issue-triage"

N="${1:-${N:-}}"
DOCETL_VENV="${DOCETL_VENV:-/tmp/docetl-venv}"
TIKTOKEN_CACHE_DIR="${TIKTOKEN_CACHE_DIR:-$DOCETL_VENV/tiktoken-cache}"
SERVER_PORT="${SERVER_PORT:-8080}"
PROXY_PORT="${PROXY_PORT:-8081}"
LCP_PYTHON="${LCP_PYTHON:-/tmp/lcp-venv/bin/python}"
MODEL="${MODEL:-/root/.cache/fanfold/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
N_CTX="${N_CTX:-2048}"
N_THREADS="${N_THREADS:-2}"
MAX_THREADS="${MAX_THREADS:-2}"
LOG_BODIES="${LOG_BODIES:-0}"
RUN_DIR="${RUN_DIR:-/tmp/docetl-bench/run-$(date +%Y%m%d-%H%M%S)-n${N:-all}}"
PY="$DOCETL_VENV/bin/python"

[ -x "$DOCETL_VENV/bin/docetl" ] || { echo "no DocETL in $DOCETL_VENV: run bench/docetl/setup.sh" >&2; exit 1; }
mkdir -p "$RUN_DIR/out" "$RUN_DIR/home"

# The input: the fixture itself, or its first N issues.
if [ -n "$N" ]; then
  "$PY" -c 'import json,sys; json.dump(json.load(open(sys.argv[1]))[:int(sys.argv[2])], open(sys.argv[3],"w"))' \
    "$FIXTURE/issues.json" "$N" "$RUN_DIR/issues.json"
else
  cp "$FIXTURE/issues.json" "$RUN_DIR/issues.json"
fi
cp "$HERE/pipeline.yaml" "$RUN_DIR/pipeline.yaml"

# Both prompts must still carry rubric.md verbatim.
"$PY" - "$RUN_DIR/pipeline.yaml" "$FIXTURE/rubric.md" <<'PYEOF'
import sys, yaml
cfg = yaml.safe_load(open(sys.argv[1]))
rubric = open(sys.argv[2]).read().strip()
stale = [op["name"] for op in cfg["operations"] if rubric not in op["prompt"]]
if stale:
    sys.exit(f"pipeline.yaml: the prompt of {stale} no longer contains rubric.md verbatim")
PYEOF

. "$HERE/common.sh"
start_server "$RUN_DIR/server.log"
PROXY_EXTRA=()
[ "$LOG_BODIES" = 1 ] && PROXY_EXTRA+=(--log-bodies)
start_proxy "$RUN_DIR/usage.jsonl" "$RUN_DIR/proxy.log" docetl "${PROXY_EXTRA[@]}"

export OPENAI_API_BASE="http://127.0.0.1:$PROXY_PORT/v1"
export OPENAI_API_KEY="sk-local"
export LITELLM_LOCAL_MODEL_COST_MAP=True      # litellm: no price-map download
export TIKTOKEN_CACHE_DIR CUSTOM_TIKTOKEN_CACHE_DIR="$TIKTOKEN_CACHE_DIR"  # litellm overrides the first unless the second is set
export DOCETL_HOME_DIR="$RUN_DIR/home"        # a fresh, empty DocETL cache
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export NO_COLOR=1 COLUMNS=160

echo "running DocETL on $(cd "$RUN_DIR" && "$PY" -c 'import json; print(len(json.load(open("issues.json"))))') issues in $RUN_DIR"
T0=$(date +%s.%N)
set +e
(cd "$RUN_DIR" && /usr/bin/time -v -o "$RUN_DIR/time.txt" \
  "$DOCETL_VENV/bin/docetl" run pipeline.yaml --max-threads "$MAX_THREADS") >"$RUN_DIR/docetl.log" 2>&1
RC=$?
set -e
T1=$(date +%s.%N)
[ $RC = 0 ] || echo "docetl exited $RC; see $RUN_DIR/docetl.log" >&2

"$PY" - "$RUN_DIR" "$FIXTURE/oracle.json" "$T0" "$T1" "$RC" "$MAX_THREADS" <<'PYEOF'
import collections, json, os, sys
run, oracle_path, t0, t1, rc, threads = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
issues = json.load(open(os.path.join(run, "issues.json")))
numbers = {i["number"] for i in issues}
oracle = json.load(open(oracle_path))
truth = sorted(set(oracle["blocker_ids"]) & numbers)

calls = [json.loads(l) for l in open(os.path.join(run, "usage.jsonl")) if l.strip()]
ok = [c for c in calls if c["status"] == 200]
pt = sum(c.get("prompt_tokens") or 0 for c in ok)
ct = sum(c.get("completion_tokens") or 0 for c in ok)
busy = sum(c["seconds"] for c in calls)

def load(*parts):
    p = os.path.join(run, *parts)
    return json.load(open(p)) if os.path.exists(p) else None
# The answer set is what the filter kept; the map adds a cause to each (and
# skips an issue whose reply it cannot parse).
answer = load("out", "blockers.json") or []
kept = load("intermediate", "triage", "is_auth_blocker.json")
got = sorted({r["number"] for r in (kept if kept is not None else answer)})
tp = len(set(got) & set(truth))
causes = collections.Counter(r.get("cause") for r in answer)
truth_causes = {c["cause"]: sorted(set(c["ids"]) & numbers) for c in oracle["causes"]}

wall = t1 - t0
summary = {
    "system": "docetl",
    "exit_code": rc,
    "issues": len(issues),
    "max_threads": threads,
    "wall_seconds": round(wall, 2),
    # DocETL's start-up (imports, parsing) before its first model call.
    "startup_seconds": round(min(c["t_start"] for c in calls) - t0, 2) if calls else None,
    "model_seconds": round(max(c["t_end"] for c in calls) - min(c["t_start"] for c in calls), 2) if calls else None,
    "max_rss_kb": next((int(l.split(":")[1]) for l in open(os.path.join(run, "time.txt")) if "Maximum resident" in l), None),
    "requests": len(calls),
    "requests_ok": len(ok),
    "requests_failed": len(calls) - len(ok),
    "prompt_tokens": pt,
    "completion_tokens": ct,
    "per_request": {
        # mean time one call spent at the proxy (queueing in the server included)
        "latency_seconds": round(busy / len(calls), 3) if calls else None,
        # first call start to last call end, divided by calls: the server's pace
        "model_seconds": round((max(c["t_end"] for c in calls) - min(c["t_start"] for c in calls)) / len(calls), 3) if calls else None,
        "wall_seconds": round(wall / len(calls), 3) if calls else None,
        "prompt_tokens": round(pt / len(ok), 1) if ok else None,
        "completion_tokens": round(ct / len(ok), 1) if ok else None,
    },
    "blockers": got,
    "blockers_without_cause": sorted(set(got) - {r["number"] for r in answer}),
    "oracle_blockers": truth,
    "true_positives": tp,
    "precision": round(tp / len(got), 4) if got else None,
    "recall": round(tp / len(truth), 4) if truth else None,
    "causes": dict(causes.most_common()),
    "top3_causes": [c for c, _ in causes.most_common(3)],
    "oracle_causes": {c: len(ids) for c, ids in truth_causes.items()},
    "cause_accuracy_on_true_positives": (
        round(sum(1 for r in answer if r["number"] in truth_causes.get(r.get("cause"), [])) / tp, 4) if tp else None
    ),
}
json.dump(summary, open(os.path.join(run, "summary.json"), "w"), indent=2)
print(json.dumps(summary, indent=1))
print("summary:", os.path.join(run, "summary.json"))
PYEOF
exit $RC
