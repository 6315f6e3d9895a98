#!/usr/bin/env bash
# The controlled kernel against API-only: the same model (SmolLM2-135M,
# the same GGUF file) judging the same issues with the same prompts, once
# through fanfold's embedded llama.cpp (shared-prefix KV slots in-process)
# and once through llama-cpp-python's OpenAI-compatible server on loopback,
# which fanfold reaches as any other HTTP endpoint. Two outputs: the
# decision alone, and the decision with one verbatim quote. The embedded
# side runs the decision both generated and read from the scores of its
# values (`decode = "choice"`). Every stage is cold (a fresh store a run).
#
#   bash bench/kernel/setup.sh        # once: builds the server's venv
#   bash bench/kernel/run.sh          # 48 issues
#   bash bench/kernel/run.sh 200      # the first 200 issues
#
# Env (defaults in brackets):
#   FANFOLD       the fanfold binary                    [target/release/fanfold]
#   SERVER_PORT   the model server, started by this script     [8080]
#   PROXY_PORT    usage_proxy.py in front of it                [8081]
#   SLOTS         fanfold --slots on both paths                [2]
#   LCP_PYTHON    python with llama-cpp-python[server]  [/tmp/lcp-venv/bin/python]
#   MODEL         the GGUF both sides load       [`fanfold model path`]
#   N_CTX, N_THREADS   server settings                         [2048, 2]
#   RUN_DIR       where this run's files go    [/tmp/kernel-bench/run-<time>-n<N>]
#   REPORT        the Markdown report spliced  [docs/benchmarks.md]; empty: none
#
# Each side's tokens are its own telemetry: fanfold's certificate for the
# embedded path (prompt tokens evaluated, prefix tokens reused), the
# server's own per-request timings in its log for the HTTP path (tokens it
# evaluated after its prefix-match reuse), beside the usage it reported.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
FIXTURE="$ROOT/examples/issue-triage"

N="${1:-${N:-48}}"
FANFOLD="${FANFOLD:-$ROOT/target/release/fanfold}"
SERVER_PORT="${SERVER_PORT:-8080}"
PROXY_PORT="${PROXY_PORT:-8081}"
SLOTS="${SLOTS:-2}"
LCP_PYTHON="${LCP_PYTHON:-/tmp/lcp-venv/bin/python}"
MODEL="${MODEL:-}"
N_CTX="${N_CTX:-2048}"
N_THREADS="${N_THREADS:-2}"
RUN_DIR="${RUN_DIR:-/tmp/kernel-bench/run-$(date +%Y%m%d-%H%M%S)-n$N}"
REPORT="${REPORT-$ROOT/docs/benchmarks.md}"

[ -x "$FANFOLD" ] || { echo "no fanfold binary at $FANFOLD: cargo build --release" >&2; exit 1; }
[ -x "$LCP_PYTHON" ] || { echo "no server python at $LCP_PYTHON: bash bench/kernel/setup.sh" >&2; exit 1; }
[ -n "$MODEL" ] || MODEL="$("$FANFOLD" model path)"
[ -f "$MODEL" ] || { echo "no model at $MODEL" >&2; exit 1; }

mkdir -p "$RUN_DIR"
echo "run dir: $RUN_DIR"
python3 - "$FIXTURE/issues.json" "$N" "$RUN_DIR/issues.json" <<'PYEOF'
import json, sys
issues = json.load(open(sys.argv[1]))[: int(sys.argv[2])]
json.dump(issues, open(sys.argv[3], "w"))
PYEOF

# The example's rubric: up to its causes for the decision alone; with its
# paragraph on quoting for the decision with a quote.
awk '/^When the answer is `blocker`, name the cause:/ {exit} {print}' "$FIXTURE/rubric.md" \
  >"$RUN_DIR/rubric-decision.md"
{ cat "$RUN_DIR/rubric-decision.md"; awk '/^Quote one short passage/ {on=1} on {print}' "$FIXTURE/rubric.md"; } \
  >"$RUN_DIR/rubric-quote.md"
grep -q "verbatim" "$RUN_DIR/rubric-quote.md" || { echo "rubric.md: the quoting paragraph was not found" >&2; exit 1; }

cat >"$RUN_DIR/decision.schema.json" <<'JSON'
{"type": "object", "additionalProperties": false, "required": ["decision"],
 "properties": {"decision": {"enum": ["blocker", "not_blocker", "unsure"]}}}
JSON
cat >"$RUN_DIR/quote.schema.json" <<'JSON'
{"type": "object", "additionalProperties": false, "required": ["decision", "evidence"],
 "properties": {
   "decision": {"enum": ["blocker", "not_blocker", "unsure"]},
   "evidence": {"type": "array", "minItems": 1, "maxItems": 1, "items": {
     "type": "object", "additionalProperties": false, "required": ["field", "quote"],
     "properties": {"field": {"enum": ["title", "body"]},
                    "quote": {"type": "string", "minLength": 8, "maxLength": 120}}}}}}
JSON

# spec MODE DECODE: a spec folder judging every issue, no filter in front.
spec() {
  local mode="$1" decode="$2" dir="$RUN_DIR/spec-$1-$2" extra tokens
  if [ "$mode" = quote ]; then extra='evidence = "/evidence"'; tokens=160; else extra=""; tokens=16; fi
  mkdir -p "$dir"
  cp "$RUN_DIR/rubric-$mode.md" "$dir/rubric.md"
  cp "$RUN_DIR/$mode.schema.json" "$dir/schema.json"
  cat >"$dir/spec.toml" <<TOML
name = "kernel-$mode"
question = "Which issues are release blockers caused by the new authentication path?"

[input]
path = "$RUN_DIR/issues.json"
partition = { type = "json_array", key = "number", kind = "issue" }

[[stages]]
name = "judge"
type = "map"
version = 1
rubric = "rubric.md"
project = '{number, title, labels: [(.labels // [])[].name], milestone: .milestone.title, body: ((.body // "") | .[0:1200])}'
output_schema = "schema.json"
backend = "embedded"
decision = { pointer = "/decision", positive = ["blocker"], negative = ["not_blocker"], abstain = ["unsure"] }
$extra
decode = "$decode"
max_attempts = 2
max_output_tokens = $tokens

[backends.embedded]
type = "llama"
model = "$MODEL"
slot_tokens = 1024

[backends.server]
type = "openai"
model = "local"
base_url = "http://127.0.0.1:$PROXY_PORT/v1"
output = "json_object"
max_concurrency = $SLOTS

[fold]
fan_in = 16

[[fold.reducers]]
name = "blockers"
type = "set"
stage = "judge"

[contract]
type = "exhaustive"
answer = "blockers"
TOML
  echo "$dir"
}

# The server and the usage proxy are started as the DocETL comparison
# starts them; common.sh finds usage_proxy.py beside itself through HERE.
HERE="$ROOT/bench/docetl"
. "$HERE/common.sh"
if up "$SERVER_PORT"; then
  echo "a server already answers on :$SERVER_PORT; stop it: its log is this run's telemetry" >&2
  exit 1
fi
start_server "$RUN_DIR/server.log"
start_proxy "$RUN_DIR/usage.jsonl" "$RUN_DIR/proxy.log" fanfold

# run NAME MODE DECODE BACKEND: one cold run; the server log's and the usage
# log's lengths before and after mark its share of each.
: >"$RUN_DIR/runs.tsv"
run() {
  local name="$1" mode="$2" decode="$3" backend="$4" dir rc
  dir="$(spec "$mode" "$decode")"
  local out="$RUN_DIR/$name"
  rm -rf "$out"
  mkdir -p "$out"
  local log0 use0
  log0=$(wc -c <"$RUN_DIR/server.log")
  use0=$(wc -l <"$RUN_DIR/usage.jsonl")
  echo "$name: $mode, decode=$decode, backend $backend"
  set +e
  "$FANFOLD" run "$dir/spec.toml" --backend "$backend" --slots "$SLOTS" \
    --store "$out/store.sqlite" --out "$out/out" --json >"$out/fanfold.json" 2>"$out/fanfold.log"
  rc=$?
  set -e
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$mode" "$decode" "$backend" "$rc" \
    "$log0" "$(wc -c <"$RUN_DIR/server.log")" "$use0" "$(wc -l <"$RUN_DIR/usage.jsonl")" >>"$RUN_DIR/runs.tsv"
}

# The two embedded decision runs go twice, in alternation, around the
# server's: on a shared machine the pair's spread is the noise to read
# their difference against.
run decision-embedded-generate decision generate embedded
run decision-embedded-choice decision choice embedded
run decision-server decision generate server
run decision-embedded-generate-again decision generate embedded
run decision-embedded-choice-again decision choice embedded
run quote-embedded quote generate embedded
run quote-server quote generate server

python3 - "$RUN_DIR" "$REPORT" "$SLOTS" "$N_THREADS" "$("$LCP_PYTHON" -c 'import llama_cpp; print(llama_cpp.__version__)')" <<'PYEOF'
import json, os, re, sys, datetime, platform
run_dir, report, slots, threads, lcp = sys.argv[1:6]
server_log = open(os.path.join(run_dir, "server.log"), "rb").read()
usage = open(os.path.join(run_dir, "usage.jsonl")).read().splitlines()
# llama.cpp's own per-request timings, as the server printed them.
prompt_re = re.compile(rb"prompt eval time\s*=\s*([\d.]+) ms /\s*(\d+) tokens")
eval_re = re.compile(rb"\beval time\s*=\s*([\d.]+) ms /\s*(\d+) runs")
rows = []
for line in open(os.path.join(run_dir, "runs.tsv")):
    name, mode, decode, backend, rc, l0, l1, u0, u1 = line.rstrip("\n").split("\t")
    out = os.path.join(run_dir, name, "out")
    cert = json.load(open(os.path.join(out, "certificate.json")))
    stats = cert["stats"]
    cost = stats["cost"]
    phase = dict(stats["phases_ms"]).get("map:judge", 0) / 1000
    facts = [json.loads(l) for l in open(os.path.join(out, "facts.jsonl")) if l.strip()]
    decisions = {f["source_ids"][0]: f.get("decision") for f in facts if f["stage"] == "judge"}
    row = {
        "name": name, "mode": mode, "decode": decode, "backend": backend, "exit": int(rc),
        "units": len(decisions), "statuses": cert["statuses"], "stage_wall_s": phase,
        "calls": cost["calls"], "prompt_tokens": cost["prompt_tokens"],
        "cached_tokens": cost["cached_tokens"], "completion_tokens": cost["completion_tokens"],
        "decisions": decisions,
    }
    if backend == "server":
        seg = server_log[int(l0):int(l1)]
        evaluated = [int(m.group(2)) for m in prompt_re.finditer(seg)]
        generated = [int(m.group(2)) for m in eval_re.finditer(seg)]
        calls = [json.loads(u) for u in usage[int(u0):int(u1)] if u.strip()]
        row["server"] = {
            "requests": len(calls),
            "reported_prompt_tokens": sum(c.get("prompt_tokens") or 0 for c in calls if c.get("status") == 200),
            "reported_completion_tokens": sum(c.get("completion_tokens") or 0 for c in calls if c.get("status") == 200),
            "timed_requests": len(evaluated),
            "evaluated_prompt_tokens": sum(evaluated) if evaluated else None,
            "generated_tokens": sum(generated) if generated else None,
        }
    rows.append(row)
json.dump(rows, open(os.path.join(run_dir, "kernel.json"), "w"), indent=1)

by = {r["name"]: r for r in rows}
def agree(a, b):
    da, db = by[a]["decisions"], by[b]["decisions"]
    both = [k for k in da if da[k] is not None and db.get(k) is not None]
    return sum(da[k] == db[k] for k in both), len(both)
cores = os.cpu_count()
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.machine())
load = " / ".join(open("/proc/loadavg").read().split()[:3])
n = by["decision-server"]["units"]
md = []
md.append("## The controlled kernel against API-only (`bench/kernel/run.sh`)\n")
md.append(f"The same model file (SmolLM2-135M-Instruct Q4_1) judging the same {n} issues of the issue-triage example with the same prompts, every issue judged (no filter in front), measured one after the other in one run of `bash bench/kernel/run.sh {n}` on {cores} cores ({cpu}), load {load}, {datetime.date.today()}. **Embedded**: fanfold's llama.cpp in-process, the shared prefix evaluated once and forked into {slots} KV slots. **Server**: llama-cpp-python[server] {lcp} (`python -m llama_cpp.server --n_threads {threads}`, as `bench/docetl/` starts it) on loopback, which fanfold reaches as an OpenAI-compatible endpoint (`json_object` with the schema, {slots} in flight). Every run starts from an empty store. Tokens are each side's own telemetry: fanfold's count of what its kernel evaluated for the embedded path; for the server, the usage it reported and the tokens llama.cpp's timings say it evaluated after reusing the previous request's matching prefix. Quality is not the point here (the 135M model cannot judge these issues); the decisions are compared for sameness only.\n")
md.append("| output | path | units | model-stage wall s | s per unit | model calls | prompt tokens evaluated | prompt tokens reused | generated tokens | errors | same decision as the server (both decided) |")
md.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for r in rows:
    label = {"decision-embedded-generate": "embedded, generated", "decision-embedded-choice": "embedded, scored (`decode = \"choice\"`)",
             "decision-server": "server", "quote-embedded": "embedded", "quote-server": "server"}[r["name"].removesuffix("-again")]
    if r["name"].endswith("-again"):
        label += ", again"
    if r["backend"] == "server":
        s = r["server"]
        ev = s["evaluated_prompt_tokens"]
        evaluated = f"{ev}" if ev is not None else "not reported"
        reused = f"{s['reported_prompt_tokens'] - ev}" if ev is not None else "not reported"
        gen = s["generated_tokens"] if s["generated_tokens"] is not None else s["reported_completion_tokens"]
        same = "n/a"
        calls = s["requests"]
    else:
        calls = r["calls"]
        evaluated, reused, gen = r["prompt_tokens"], r["cached_tokens"], r["completion_tokens"]
        a, b = agree(r["name"], f"{r['mode']}-server")
        same = f"{a} of {b}"
    per = r["stage_wall_s"] / max(r["units"], 1)
    md.append(f"| {r['mode']} | {label} | {r['units']} | {r['stage_wall_s']:.1f} | {per:.2f} | {calls} | {evaluated} | {reused} | {gen} | {r['statuses']['error']} | {same} |")
wall = lambda name: sum(by[n]["stage_wall_s"] for n in (name, name + "-again") if n in by) / sum(1 for n in (name, name + "-again") if n in by)
ratio = lambda a, b: wall(a) / wall(b) if wall(b) else float("nan")
md.append("")
md.append(f"Per unit of work, the server path took **{ratio('decision-server', 'decision-embedded-generate'):.2f}x** the embedded path's model-stage wall time for the decision generated, **{ratio('decision-server', 'decision-embedded-choice'):.2f}x** against the decision scored, and **{ratio('quote-server', 'quote-embedded'):.2f}x** for the decision with a quote (a ratio above 1 means the embedded path is faster; an embedded decision's wall is the mean of its two runs). Scored against generated on the embedded path, in the two alternating pairs: **{by['decision-embedded-choice']['stage_wall_s'] / by['decision-embedded-generate']['stage_wall_s']:.2f}x** and **{by['decision-embedded-choice-again']['stage_wall_s'] / by['decision-embedded-generate-again']['stage_wall_s']:.2f}x** the wall time. Errors are units whose every attempt failed the stage's checks (a quote not verbatim in the unit, a schema violation): the embedded path decodes under a grammar made from the schema with quotes limited to the unit's own sentences, the server only under `json_object`.\n")
text = "\n".join(md) + "\n"
open(os.path.join(run_dir, "kernel.md"), "w").write(text)
print(text)
if report:
    start, end = "<!-- bench:kernel:start -->", "<!-- bench:kernel:end -->"
    old = open(report).read() if os.path.exists(report) else ""
    section = f"{start}\n{text}{end}"
    if start in old and end in old:
        new = old[: old.index(start)] + section + old[old.index(end) + len(end):]
    else:
        new = old.rstrip("\n") + "\n\n" + section + "\n"
    open(report, "w").write(new)
    print(f"wrote {report}")
PYEOF
