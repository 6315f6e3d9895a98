#!/usr/bin/env bash
# The rubric-breaker drill: the example's judge, guarded by six canaries
# (three true blockers, three hard non-blockers from the fixture's oracle)
# and a breaker that allows one canary wrong in its first ten units, run
# with the example's rubric and with a deliberately inverted one.
#
#   bash bench/drill/run.sh [--backend scripted]
#
# Prints, per rubric: whether the breaker tripped, after how many model
# calls, and which canaries failed. Extra arguments go to `fanfold run`.
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=target/release/fanfold
[ -x "$bin" ] || cargo build --release --quiet -p fanfold-cli
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for rubric in right wrong; do
  dir="$work/$rubric"
  cp -r examples/issue-triage "$dir"
  cp bench/drill/canaries.jsonl "$dir/"
  if [ "$rubric" = wrong ]; then cp bench/drill/wrong-rubric.md "$dir/rubric.md"; fi
  python3 - "$dir/spec.toml" <<'PY'
import sys
p = sys.argv[1]
s = open(p).read()
s = s.replace('rubric = "rubric.md"\n',
              'rubric = "rubric.md"\ncanaries = "canaries.jsonl"\n'
              'breaker = { window = 10, max_canary_failures = 1 }\n', 1)
open(p, "w").write(s)
PY
  code=0
  "$bin" run "$dir/spec.toml" --store "$dir/store.sqlite" --out "$dir/out" --json "$@" \
    > "$dir/run.jsonl" 2> "$dir/stderr.txt" || code=$?
  python3 - "$rubric" "$code" "$dir/out/certificate.json" <<'PY'
import json, sys
rubric, code, path = sys.argv[1], sys.argv[2], sys.argv[3]
c = json.load(open(path))
st = c["stats"]
can = st.get("canaries", {}).get("auth_blocker", {"sent": 0, "failed": []})
stop = c["stop"]
judged = c["statuses_by_stage"].get("auth_blocker", {})
decided = sum(judged.get(k, 0) for k in ("positive", "negative", "abstain", "error"))
print(f"{rubric:5} rubric: exit {code}, stop {stop['reason']}"
      + (f" ({stop.get('detail')})" if stop["reason"] != "completed" else "")
      + f"; model calls {st['model_calls']} (audit {sum(a['calls'] for a in st.get('audits', {}).values())}),"
      + f" units judged {decided}, canaries sent {can['sent']}, wrong {len(can['failed'])}"
      + ("".join(f"\n    {i}: expected {e}, got {g}" for i, e, g in can["failed"])))
PY
done
