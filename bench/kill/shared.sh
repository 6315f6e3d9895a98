#!/usr/bin/env bash
# Shared-store drill: PROCESSES runs of one spec started at once on one
# fresh store, first on the scripted backend, then on an HTTP backend (an
# OpenAI-compatible judge on loopback that counts every request by unit),
# each run with several slots. Each run is given 300 s: one still running
# then is a hang, and counted as one. Checks that every run ends with exit
# 0, that the units were called once between them, and that the answers
# are equal; prints the counts on its last lines and writes its section of
# docs/benchmarks.md.
#
#   bench/kill/shared.sh [PROCESSES]   (default 4; needs python3 and a release build)
#   REPORT=FILE (default docs/benchmarks.md; empty: none)
set -euo pipefail
procs=${1:-4}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
bin=${FANFOLD_BIN:-$root/target/release/fanfold}
report=${REPORT-$root/docs/benchmarks.md}
work=$(mktemp -d)
server=""
cleanup() { [ -n "$server" ] && kill "$server" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
cd "$work"
units=66
slots=4
python3 - "$units" <<'PY'
import json, sys
n = int(sys.argv[1])
with open("input.jsonl", "w") as f:
    for i in range(n):
        f.write(json.dumps({"id": i, "flag": i % 3 == 0, "delay_ms": 20 + (i % 5) * 10}) + "\n")
PY
python3 "$here/judge_server.py" --counts counts.json > port.txt &
server=$!
for _ in $(seq 1 100); do [ -s port.txt ] && break; sleep 0.1; done
port=$(cat port.txt)
. "$here/common.sh"
write_spec shared 40 "[backends.http]
type = \"openai\"
model = \"m\"
base_url = \"http://127.0.0.1:$port/v1\""
export FANFOLD_LOG=error

# One round: PROCESSES runs at once on a fresh store with backend $1.
# Sets: ended (exit 0), hung, equal (answers equal to the first), calls
# (the certificates' model calls, one per run, comma-separated).
round() {
  local backend=$1 n pids=() code
  rm -rf store.sqlite* out*
  for n in $(seq 1 "$procs"); do
    timeout 300 "$bin" run spec.toml --store store.sqlite --out "out$n" \
      --backend "$backend" --slots "$slots" --json > /dev/null 2> "err$n.log" &
    pids+=($!)
  done
  ended=0 hung=0 equal=0 calls=""
  for n in $(seq 1 "$procs"); do
    code=0
    wait "${pids[$((n - 1))]}" || code=$?
    if [ "$code" -eq 0 ]; then ended=$((ended + 1)); fi
    if [ "$code" -eq 124 ]; then hung=$((hung + 1)); fi
    if [ "$code" -ne 0 ]; then echo "run $n on $backend exited $code: $(tail -3 "err$n.log")" >&2; fi
    if [ -f "out$n/answer.json" ] && [ "$(items "out$n/answer.json")" = "$(items out1/answer.json 2>/dev/null)" ]; then
      equal=$((equal + 1))
    fi
    c=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["stats"]["model_calls"])' "out$n/certificate.json" 2>/dev/null || echo "?")
    calls="${calls:+$calls, }$c"
  done
}

started=$(date -u +%Y-%m-%d)
load=$(cut -d' ' -f1-3 /proc/loadavg)
t0=$(date +%s%N)
round default
s_ended=$ended s_hung=$hung s_equal=$equal s_calls=$calls
s_total=$(python3 -c 'import sys; print(sum(int(x) for x in sys.argv[1].split(", ")))' "$calls" 2>/dev/null || echo "?")
s_ms=$(( ($(date +%s%N) - t0) / 1000000 ))
t0=$(date +%s%N)
round http
h_ms=$(( ($(date +%s%N) - t0) / 1000000 ))
kill "$server"; wait "$server" 2>/dev/null || true; server=""
read -r h_total h_distinct h_repeats < <(python3 -c '
import json
c = json.load(open("counts.json"))
print(sum(c.values()), len(c), sum(1 for v in c.values() if v > 1))')
cpu=$(grep -m1 "model name" /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')

echo "scripted: $procs runs, exit 0: $s_ended, hung: $s_hung, answers equal: $s_equal, model calls: $s_total for $units units ($s_calls), $s_ms ms"
echo "http: $procs runs, exit 0: $ended, hung: $hung, answers equal: $equal, requests at the server: $h_total for $units units ($h_distinct units called, $h_repeats more than once; runs counted $calls), $h_ms ms"
ok=1
[ "$s_ended" -eq "$procs" ] && [ "$s_equal" -eq "$procs" ] && [ "$s_total" = "$units" ] || ok=0
[ "$ended" -eq "$procs" ] && [ "$equal" -eq "$procs" ] && [ "$h_total" -eq "$units" ] && [ "$h_repeats" -eq 0 ] || ok=0

if [ -n "$report" ]; then
  python3 "$root/bench/splice.py" shared "$report" <<MD
## Processes sharing one store (\`bench/kill/shared.sh\`)

Written by \`bench/kill/shared.sh $procs\` on $started (UTC): $(nproc) logical CPUs, $cpu; 1-minute load average $load when it started. $procs runs of one spec start at once on one fresh store, $slots slots each, over $units JSONL records; each run is given 300 s, and one still running then counts as hung. [SIMULATED] judgments on both backends: the scripted judge (40 ms a call), then an OpenAI-compatible judge on loopback (\`bench/kill/judge_server.py\`, 20 to 60 ms a request) that counts every request by unit. The figures are store and scheduling accounting, which a simulated judge does not touch.

| backend | runs | exit 0 | hung | answers equal | model calls, all runs | units | calls per run | wall ms |
|---|---:|---:|---:|---:|---:|---:|---|---:|
| scripted | $procs | $s_ended | $s_hung | $s_equal | $s_total | $units | $s_calls | $s_ms |
| openai (loopback) | $procs | $ended | $hung | $equal | $h_total at the server, $h_repeats units twice | $units | $calls | $h_ms |

Each unit is claimed (a lease in the store) before its call, and a unit another live run holds waits until that run's fact is written; a run waiting so keeps completing its own requests in flight.
MD
fi
[ "$ok" -eq 1 ] || { echo "the drill failed" >&2; exit 1; }
