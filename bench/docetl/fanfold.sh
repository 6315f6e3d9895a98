#!/usr/bin/env bash
# The fanfold side of the DocETL comparison: run examples/issue-triage with
# its `local_server` backend on the same input, against the same server,
# through the same usage proxy, and write fanfold-summary.json and
# comparison.json next to DocETL's summary.json.
#
#   bash bench/docetl/run.sh 200                 # DocETL; prints its RUN_DIR
#   bash bench/docetl/fanfold.sh RUN_DIR         # fanfold on RUN_DIR/issues.json
#
# Env (defaults in brackets):
#   FANFOLD        the fanfold binary          [target/release/fanfold]
#   SERVER_PORT    the model server; reused when it answers, else started [8080]
#   PROXY_PORT     usage_proxy.py, started and stopped by this script     [8081]
#   SLOTS          fanfold --slots (DocETL runs with --max-threads 2)     [2]
#   LCP_PYTHON, MODEL, N_CTX, N_THREADS   as in run.sh
#
# The store is fresh for every run (RUN_DIR/fanfold/store.sqlite is removed
# first), so nothing is served from fanfold's cache. The embedder is the
# local MiniLM (`fanfold model fetch`); its time is in fanfold's wall.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
FIXTURE="$ROOT/examples/issue-triage"

RUN_DIR="${1:?usage: fanfold.sh RUN_DIR (a directory run.sh wrote)}"
RUN_DIR="$(cd "$RUN_DIR" && pwd)"
FANFOLD="${FANFOLD:-$ROOT/target/release/fanfold}"
SERVER_PORT="${SERVER_PORT:-8080}"
PROXY_PORT="${PROXY_PORT:-8081}"
SLOTS="${SLOTS:-2}"
LCP_PYTHON="${LCP_PYTHON:-/tmp/lcp-venv/bin/python}"
MODEL="${MODEL:-/root/.cache/fanfold/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
N_CTX="${N_CTX:-2048}"
N_THREADS="${N_THREADS:-2}"

[ -f "$RUN_DIR/issues.json" ] || { echo "no $RUN_DIR/issues.json: run run.sh first" >&2; exit 1; }
[ -x "$FANFOLD" ] || { echo "no fanfold binary at $FANFOLD: cargo build --release" >&2; exit 1; }

WORK="$RUN_DIR/fanfold"
rm -rf "$WORK"
mkdir -p "$WORK"
# The example as it ships, with the local server reached through the proxy.
cp "$FIXTURE"/{spec.toml,rubric.md,fact.schema.json,scripted-judge.jq} "$WORK/"
sed -i "s#^base_url = \"http://127.0.0.1:8080/v1\"#base_url = \"http://127.0.0.1:$PROXY_PORT/v1\"#" "$WORK/spec.toml"
grep -q "127.0.0.1:$PROXY_PORT/v1" "$WORK/spec.toml" || { echo "spec.toml: local_server base_url not found" >&2; exit 1; }

. "$HERE/common.sh"
start_server "$WORK/server.log"
start_proxy "$WORK/usage.jsonl" "$WORK/proxy.log" fanfold

echo "running fanfold on $RUN_DIR/issues.json"
T0=$(date +%s.%N)
set +e
/usr/bin/time -v -o "$WORK/time.txt" "$FANFOLD" run "$WORK/spec.toml" --input "$RUN_DIR/issues.json" \
  --backend local_server --slots "$SLOTS" --store "$WORK/store.sqlite" --out "$WORK/out" \
  >"$WORK/fanfold.log" 2>&1
RC=$?
set -e
T1=$(date +%s.%N)
# Exit 0 is a complete answer; other codes say why it is not (see the log).
echo "fanfold exited $RC"

python3 - "$RUN_DIR" "$FIXTURE/oracle.json" "$T0" "$T1" "$RC" <<'PYEOF'
import collections, json, os, sys
run, oracle_path, t0, t1, rc = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
work = os.path.join(run, "fanfold")
issues = json.load(open(os.path.join(run, "issues.json")))
numbers = {i["number"] for i in issues}
oracle = json.load(open(oracle_path))
truth = sorted(set(oracle["blocker_ids"]) & numbers)
calls = [json.loads(l) for l in open(os.path.join(work, "usage.jsonl")) if l.strip()]
ok = [c for c in calls if c["status"] == 200]
pt = sum(c.get("prompt_tokens") or 0 for c in ok)
ct = sum(c.get("completion_tokens") or 0 for c in ok)
answer = json.load(open(os.path.join(work, "out", "answer.json")))
cert = json.load(open(os.path.join(work, "out", "certificate.json")))
got = sorted(int(i["unit_id"]) for i in answer["items"])
tp = len(set(got) & set(truth))
causes = collections.Counter(i.get("theme") for i in answer["items"])
wall = t1 - t0
summary = {
    "system": "fanfold",
    "exit_code": rc,
    "issues": len(issues),
    "wall_seconds": round(wall, 2),
    "max_rss_kb": next((int(l.split(":")[1]) for l in open(os.path.join(work, "time.txt")) if "Maximum resident" in l), None),
    "excluded_by_prefilter": sum(cert["excluded_by_reason"].values()),
    "routed_by_stage": cert["routed_by_stage"],
    "statuses": cert["statuses"],
    "requests": len(calls),
    "requests_ok": len(ok),
    "requests_failed": len(calls) - len(ok),
    "prompt_tokens": pt,
    "completion_tokens": ct,
    "blockers": got,
    "oracle_blockers": truth,
    "true_positives": tp,
    "precision": round(tp / len(got), 4) if got else None,
    "recall": round(tp / len(truth), 4) if truth else None,
    "top3_causes": [c for c, _ in causes.most_common(3)],
}
json.dump(summary, open(os.path.join(run, "fanfold-summary.json"), "w"), indent=2)

docetl_path = os.path.join(run, "summary.json")
if os.path.exists(docetl_path):
    d = json.load(open(docetl_path))
    a, b = set(d["blockers"]), set(got)
    ratio = lambda x, y: round(x / y, 2) if y else None
    comparison = {
        "issues": len(issues),
        "wall_seconds": {"docetl": d["wall_seconds"], "fanfold": summary["wall_seconds"],
                          "docetl_over_fanfold": ratio(d["wall_seconds"], summary["wall_seconds"])},
        "requests": {"docetl": d["requests"], "fanfold": summary["requests"],
                     "docetl_over_fanfold": ratio(d["requests"], summary["requests"])},
        "prompt_tokens": {"docetl": d["prompt_tokens"], "fanfold": pt,
                          "docetl_over_fanfold": ratio(d["prompt_tokens"], pt)},
        "completion_tokens": {"docetl": d["completion_tokens"], "fanfold": ct,
                              "docetl_over_fanfold": ratio(d["completion_tokens"], ct)},
        "answers": {
            "docetl": sorted(a), "fanfold": sorted(b), "both": sorted(a & b),
            "jaccard": round(len(a & b) / len(a | b), 4) if a | b else 1.0,
            "docetl_precision": d["precision"], "docetl_recall": d["recall"],
            "fanfold_precision": summary["precision"], "fanfold_recall": summary["recall"],
            "oracle": truth,
        },
    }
    json.dump(comparison, open(os.path.join(run, "comparison.json"), "w"), indent=2)
    print(json.dumps(comparison, indent=1))
else:
    print(json.dumps(summary, indent=1))
PYEOF
