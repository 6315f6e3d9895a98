#!/usr/bin/env bash
# Fleet chaos drill: `fanfold run --workers 4` under `max_model_calls` with
# an OpenAI-compatible judge on loopback that counts every request it gets
# (bench/kill/judge_server.py), while a chaos loop, once a second, kills
# (SIGKILL) or pauses (SIGSTOP for 1 to 4 s, past the 3 s lease or not) a
# random worker of the run. Each run is checked: the requests that reached
# the judge never exceed the budget, and the run ends (no hang).
#
#   bash bench/drill/fleet.sh [RUNS]    (default 20; needs python3 and a release build)
#   REPORT=FILE (default docs/fleet.md; empty: none) gets its section.
set -euo pipefail
runs=${1:-20}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
bin=${FANFOLD_BIN:-$root/target/release/fanfold}
report=${REPORT-$root/docs/fleet.md}
budget=100
units=240
workers=4
slots=8
work=$(mktemp -d)
server=""
cleanup() { [ -n "$server" ] && kill "$server" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
cd "$work"
python3 - "$units" <<'PY'
import json, sys
n = int(sys.argv[1])
with open("input.jsonl", "w") as f:
    for i in range(n):
        f.write(json.dumps({"id": i, "flag": i % 3 == 0, "delay_ms": 150 + (i % 7) * 50}) + "\n")
PY
. "$root/bench/kill/common.sh"
export FANFOLD_LOG=error
started_on=$(date -u +%Y-%m-%d)
load=$(cut -d' ' -f1-3 /proc/loadavg)
worst=0 over=0 hung=0 kills_all=0 pauses_all=0 slowest=0 refused=0
rows=""
for r in $(seq 1 "$runs"); do
  rm -rf s.sqlite* out port.txt counts.json
  python3 "$root/bench/kill/judge_server.py" --counts counts.json > port.txt 2> /dev/null &
  server=$!
  for _ in $(seq 1 100); do [ -s port.txt ] && break; sleep 0.1; done
  port=$(cat port.txt)
  write_spec fleet 0 "[backends.http]
type = \"openai\"
model = \"m\"
base_url = \"http://127.0.0.1:$port/v1\"
[budget]
max_model_calls = $budget"
  t0=$(date +%s%N)
  timeout 120 "$bin" run spec.toml --store s.sqlite --out out --backend http --json \
    --workers "$workers" --slots "$slots" --lease-secs 3 > /dev/null 2> err.log &
  run=$!
  kills=0 pauses=0 resumers=()
  sleep 0.5
  while kill -0 "$run" 2>/dev/null; do
    # The run's workers: the children of the coordinator under `timeout`.
    coordinator=$(pgrep -P "$run" | head -1 || true)
    kids=()
    if [ -n "$coordinator" ]; then
      for p in $(pgrep -P "$coordinator" || true); do
        # Not one already dead, waiting to be reaped.
        [ "$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null)" = Z ] || kids+=("$p")
      done
    fi
    if [ "${#kids[@]}" -gt 0 ]; then
      pid=${kids[$((RANDOM % ${#kids[@]}))]}
      if [ $((RANDOM % 2)) -eq 0 ]; then
        kill -KILL "$pid" 2>/dev/null && kills=$((kills + 1))
      else
        if kill -STOP "$pid" 2>/dev/null; then
          pauses=$((pauses + 1))
          ( sleep "$((1 + RANDOM % 4))"; kill -CONT "$pid" 2>/dev/null ) &
          resumers+=($!)
        fi
      fi
    fi
    sleep 1
  done
  code=0
  wait "$run" || code=$?
  took=$(( ($(date +%s%N) - t0) / 1000000 ))
  for p in "${resumers[@]}"; do wait "$p" 2>/dev/null || true; done
  kill "$server"; wait "$server" 2>/dev/null || true; server=""
  calls=$(python3 -c 'import json; print(sum(json.load(open("counts.json")).values()))')
  cert=$(python3 -c 'import json; print(json.load(open("out/certificate.json"))["stats"]["model_calls"])' 2>/dev/null || echo "-")
  [ "$code" -eq 124 ] && hung=$((hung + 1))
  [ "$calls" -gt "$budget" ] && over=$((over + 1))
  [ "$calls" -gt "$worst" ] && worst=$calls
  [ "$took" -gt "$slowest" ] && slowest=$took
  kills_all=$((kills_all + kills)) pauses_all=$((pauses_all + pauses))
  line=$(printf 'run %2d: exit %d, %3d requests at the judge, certificate %3s calls, %d kills, %d pauses, %5d ms' \
    "$r" "$code" "$calls" "$cert" "$kills" "$pauses" "$took")
  echo "$line"
  rows="$rows| $r | $code | $calls | $cert | $kills | $pauses | $took |
"
done
summary="runs: $runs; budget: $budget calls; most requests at the judge in one run: $worst; runs over the budget: $over; hung: $hung; kills: $kills_all; pauses: $pauses_all; slowest run: $slowest ms"
echo "$summary"
if [ -n "$report" ]; then
  cpu=$(grep -m1 "model name" /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
  python3 "$root/bench/splice.py" fleet-chaos "$report" <<MD
## The budget under kills (\`bench/drill/fleet.sh\`)

Written by \`bench/drill/fleet.sh $runs\` on $started_on (UTC): $(nproc) logical CPUs, $cpu; 1-minute load average $load when it started. Each run is \`fanfold run --workers $workers --slots $slots --lease-secs 3\` over $units JSONL records with \`max_model_calls = $budget\`, judged [SIMULATED] by an OpenAI-compatible judge on loopback (\`bench/kill/judge_server.py\`, 150 to 450 ms a request) that counts every request it receives. Once a second a random worker of the run is killed (SIGKILL) or paused (SIGSTOP for 1 to 4 s). A run whose workers all died ends incomplete, saying so.

$summary.

| run | exit | requests at the judge | certificate's model calls | kills | pauses | wall ms |
|---:|---:|---:|---:|---:|---:|---:|
$rows
MD
fi
[ "$over" -eq 0 ] && [ "$hung" -eq 0 ] || { echo "the drill failed" >&2; exit 1; }
