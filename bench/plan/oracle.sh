#!/usr/bin/env bash
# A cascade whose oracle is a model: examples/bgl-alerts/target.toml with
# its labels file taken out, so the failure judge's own backend labels the
# draws and decides what the proof leaves to it. Run from empty stores on
# the embedded default, then on llama-cpp-python's server through the
# OpenAI-compatible path (the same GGUF), and scored against loghub's
# labels, which neither run reads. Writes the `cascade-model-oracle`
# section of docs/benchmarks.md.
#
#   cargo build --release && bash bench/kernel/setup.sh && bash bench/plan/oracle.sh
#
# Env: SERVER_PORT (8080), LCP_PYTHON (/tmp/lcp-venv/bin/python),
# N_THREADS (2), N_CTX (2048), MODEL (`fanfold model path`).
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${FANFOLD:-target/release/fanfold}
HERE=bench/docetl
SERVER_PORT="${SERVER_PORT:-8080}"
PROXY_PORT="${PROXY_PORT:-8089}"
LCP_PYTHON="${LCP_PYTHON:-/tmp/lcp-venv/bin/python}"
N_CTX="${N_CTX:-2048}"
N_THREADS="${N_THREADS:-2}"
MODEL="${MODEL:-$("$bin" model path)}"
[ -x "$LCP_PYTHON" ] || { echo "no llama-cpp-python at $LCP_PYTHON: bash bench/kernel/setup.sh" >&2; exit 1; }
. "$HERE/common.sh"
work=$(mktemp -d)
spec=examples/bgl-alerts/.model-oracle.toml
cleanup_all() { rm -rf "$work" "$spec"; cleanup; }
trap cleanup_all EXIT
export FANFOLD_LOG=error

# The example's target with the judge's backend as its oracle, and the
# server as a second backend.
sed -e 's/, labels = "labels.jsonl"//' -e 's/proxy = "failure_words"/proxy = "failure_similarity"/' \
  examples/bgl-alerts/target.toml >"$spec"
grep -q 'proxy = "failure_similarity"' "$spec" || { echo "target.toml's cascade was not found" >&2; exit 1; }
grep -q 'labels = "labels.jsonl"' "$spec" && { echo "the labels file is still the oracle" >&2; exit 1; }
cat >>"$spec" <<TOML

[backends.local_server]
type = "openai"
model = "local"
base_url = "http://127.0.0.1:$SERVER_PORT/v1"
output = "json_object"
max_concurrency = 2
TOML

run() { # NAME [ARGS...]
  local name="$1"
  shift
  local t0 t1
  t0=$(date +%s.%N)
  "$bin" run "$spec" --store "$work/$name.sqlite" --out "$work/$name" --json "$@" >/dev/null || true
  t1=$(date +%s.%N)
  echo "$name $t0 $t1" >>"$work/times"
}

run embedded
start_server "$work/server.log"
run server --backend local_server

python3 - "$work" "$("$LCP_PYTHON" -c 'import llama_cpp; print(llama_cpp.__version__)')" >"$work/section.md" <<'PY'
import json, os, pathlib, sys
work = pathlib.Path(sys.argv[1])
lcp = sys.argv[2]
times = {l.split()[0]: float(l.split()[2]) - float(l.split()[1]) for l in open(work / "times")}
truth = {
    l["id"]
    for l in map(json.loads, open("examples/bgl-alerts/labels.jsonl"))
    if l["decision"] == "failure"
}
load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
print("## A cascade with a model as its oracle\n")
print(f"`bash bench/plan/oracle.sh`, {os.cpu_count()} cores, load {load}. Every figure below is measured by the run that wrote it.\n")
print("`examples/bgl-alerts/target.toml` with its labels file taken out: the failure judge's own backend is the oracle. It labels the draws that set the threshold of the embed margin (`failure_similarity`, the proxy `fanfold plan` chose), and decides the lines the proof leaves to it; recall ≥ 0.9 with probability ≥ 0.9, at most 200 labels. Each run starts from an empty store. **Embedded**: fanfold's llama.cpp in-process. **Server**: llama-cpp-python[server] " + lcp + " on loopback with the same GGUF (SmolLM2-135M-Instruct Q4_1), reached through the OpenAI-compatible path (`--backend local_server`).\n")
print("| oracle | met | proven lower bound | estimate | labels | oracle calls | without the cascade | lines the proxy decided | model calls | errors | wall s | recall vs loghub | precision vs loghub |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for name, label in [("embedded", "embedded"), ("server", "llama-cpp-python server")]:
    cert_path = work / name / "certificate.json"
    if not cert_path.exists():
        print(f"| {label} | the run wrote no certificate | | | | | | | | | {times.get(name, 0):.0f} | | |")
        continue
    cert = json.loads(cert_path.read_text())
    answer = json.loads((work / name / "answer.json").read_text())
    r = cert["stats"]["cascades"]["failure_judge"]
    facts = [json.loads(l) for l in open(work / name / "facts.jsonl")]
    judged = [f for f in facts if f.get("stage") == "failure_judge"]
    reached = {f["source_ids"][0] for f in judged}
    errors = sum(1 for f in judged if f.get("status") == "error")
    found = {i["unit_id"] for i in answer["items"]}
    t = truth & reached
    hit = found & t
    recall = len(hit) / len(t) if t else 1.0
    precision = len(hit) / len(found) if found else 1.0
    print(f"| {label} | {'yes' if r['met'] else 'no'} | {r['lower_bound']:.3f} | {r['estimate']:.3f} | {r['labels']} | {r['oracle_calls']} | {r['calls_without']} | {r['proxy_decided']} | {cert['stats']['model_calls']} | {errors} | {times[name]:.0f} | {recall:.3f} ({len(t)} alerts) | {precision:.3f} |")
print("\nThe guarantee is against the oracle, here the 135M model's own answers, not against loghub's labels: these rows show the mechanics on a real model and a real HTTP endpoint, and the last two columns show what the model's answers are worth (which no guarantee can lift). A line whose judgement failed (an error) is not a label and counts against the proof.")
PY
python3 bench/splice.py cascade-model-oracle docs/benchmarks.md <"$work/section.md"
cat "$work/section.md"
