#!/usr/bin/env bash
# Kill drill: kill -9 a run at random moments (partition, map stage, fold),
# then check the store with SQLite's integrity check, resume, and compare the
# answer with an uninterrupted run. The resume must call the model for
# exactly the units whose facts the killed run had not stored, and must not
# wait for the killed run's leases.
#
#   bench/kill/run.sh [KILLS]    (default 20; needs sqlite3 and a release build)
set -euo pipefail
kills=${1:-20}
here=$(cd "$(dirname "$0")" && pwd)
bin=${FANFOLD_BIN:-$here/../../target/release/fanfold}
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
cat > spec.toml <<'TOML'
name = "kill"
question = "Which records are flagged?"
[input]
path = "input.jsonl"
partition = { type = "jsonl", key = "id", kind = "row" }
[[stages]]
name = "judge"
type = "map"
version = 1
rubric = "rubric.md"
output_schema = "schema.json"
decision = { pointer = "/decision", positive = ["yes"], negative = ["no"] }
[backends.default]
type = "scripted"
script = "judge.jq"
delay_ms = 20
[fold]
fan_in = 4
[[fold.reducers]]
name = "flagged"
type = "set"
[contract]
type = "exhaustive"
answer = "flagged"
TOML
echo "Say yes when flagged." > rubric.md
echo '{"type": "object", "required": ["decision"], "properties": {"decision": {"enum": ["yes", "no"]}}}' > schema.json
echo '{decision: (if .flag then "yes" else "no" end)}' > judge.jq
export FANFOLD_LOG=error
"$bin" run spec.toml --store ref.sqlite --out ref --json > /dev/null
items() { python3 -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))["items"]))' "$1"; }
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
