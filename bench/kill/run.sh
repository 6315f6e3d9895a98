#!/usr/bin/env bash
# Kill drill: kill -9 a run at random moments (partition, map stage, fold),
# then check the store with SQLite's integrity check, resume, and compare the
# answer with an uninterrupted run. The resume must call the model for
# exactly the units whose facts the killed run had not stored, and must not
# wait for the killed run's leases.
#
#   bench/kill/run.sh [KILLS]    (default 20; needs sqlite3 and a release build)
#   REPORT=FILE (default docs/benchmarks.md; empty: none) gets its section.
set -euo pipefail
kills=${1:-20}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
bin=${FANFOLD_BIN:-$root/target/release/fanfold}
report=${REPORT-$root/docs/benchmarks.md}
measured_on=$(date -u +%Y-%m-%d)
load=$(cut -d' ' -f1-3 /proc/loadavg)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
units=400
python3 - "$units" <<'PY'
import json, sys
n = int(sys.argv[1])
with open("input.jsonl", "w") as f:
    for i in range(n):
        f.write(json.dumps({"id": i, "flag": i % 3 == 0, "text": "x" * (i % 50)}) + "\n")
PY
. "$here/common.sh"
write_spec kill 20
export FANFOLD_LOG=error
"$bin" run spec.toml --store ref.sqlite --out ref --json > /dev/null
ref=$(items ref/answer.json)
ok=0 same=0 resumed=0 exact=0 slowest=0
for k in $(seq 1 "$kills"); do
  rm -f s.sqlite*
  ms=$(( (RANDOM % 2600) + 50 ))
  "$bin" run spec.toml --store s.sqlite --out o --json > /dev/null 2>&1 &
  pid=$!
  sleep "$(printf '0.%03d' $((ms % 1000)))"; sleep $((ms / 1000))
  kill -9 "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  [ "$(sqlite3 s.sqlite 'PRAGMA integrity_check' 2>/dev/null)" = ok ] && ok=$((ok + 1))
  kept=$(sqlite3 s.sqlite 'SELECT COUNT(*) FROM facts' 2>/dev/null || echo 0)
  started=$(date +%s%N)
  if "$bin" run spec.toml --store s.sqlite --out o --json > /dev/null 2>&1; then
    resumed=$((resumed + 1))
  fi
  took=$(( ($(date +%s%N) - started) / 1000000 ))
  [ "$(items o/answer.json)" = "$ref" ] && same=$((same + 1))
  calls=$(python3 -c 'import json; print(json.load(open("o/certificate.json"))["stats"]["model_calls"])')
  [ "$calls" -eq $((units - kept)) ] && exact=$((exact + 1))
  slowest=$(( took > slowest ? took : slowest ))
  printf 'kill %2d at %4d ms: %3d facts kept, resume made %3d calls in %5d ms\n' "$k" "$ms" "$kept" "$calls" "$took"
done
echo "kills: $kills; integrity ok: $ok; resumed with exit 0: $resumed; answer equal to the uninterrupted run: $same; resume paid exactly the units not stored: $exact; slowest resume: $slowest ms"
if [ -n "$report" ]; then
  cpu=$(grep -m1 "model name" /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
  python3 "$root/bench/splice.py" kill "$report" <<MD
## Kills (\`bench/kill/run.sh\`)

Written by \`bench/kill/run.sh $kills\` on $measured_on (UTC): $(nproc) logical CPUs, $cpu; 1-minute load average $load when it started. The scripted backend (20 ms a call, the default 4 slots) judges $units JSONL records; [SIMULATED] judgments, and the figures are store and scheduling accounting, which a simulated judge does not touch. Each round kills \`fanfold run\` with \`kill -9\` at a random moment between 50 ms and 2.65 s (partition, map stage or fold), checks the store with \`PRAGMA integrity_check\`, resumes, and compares the answer with an uninterrupted run.

| kills | integrity ok | resumed with exit 0 | answer equal | resume called exactly the units without a stored fact | slowest resume |
|---:|---:|---:|---:|---:|---:|
| $kills | $ok | $resumed | $same | $exact | $slowest ms |

A killed run's leases do not hold up its resume: the process that held them no longer exists on this host, so the new run closes it as \`abandoned\` first, without waiting for the lease to run out.
MD
fi
[ "$ok" -eq "$kills" ] && [ "$resumed" -eq "$kills" ] && [ "$same" -eq "$kills" ] && [ "$exact" -eq "$kills" ] || { echo "the drill failed" >&2; exit 1; }
