#!/usr/bin/env bash
# The rubric-breaker drill: the example's judge (examples/issue-triage/
# judged.toml, where the model decides membership and the audit takes its
# second look at what the rungs threw away), guarded by six canaries (three
# true blockers, three hard non-blockers from the fixture's oracle) and a
# breaker that allows one canary wrong in its first ten units, run with the
# example's rubric and with a deliberately inverted one.
#
#   bash bench/drill/run.sh [--backend scripted]
#   FANFOLD_BIN (default target/release/fanfold) is the build measured.
#   REPORT=FILE (default docs/benchmarks.md; empty: none) gets its section.
#
# Prints, per rubric: whether the breaker tripped, after how many model
# calls, and which canaries failed; writes the same as the `drill` section.
# Extra arguments go to `fanfold run`.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
bin=${FANFOLD_BIN:-$root/target/release/fanfold}
report=${REPORT-$root/docs/benchmarks.md}
[ -x "$bin" ] || { echo "no fanfold binary at $bin: cargo build --release -p fanfold-cli" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
started=$(date -u +%Y-%m-%d)
load=$(cut -d' ' -f1-3 /proc/loadavg)
for rubric in right wrong; do
  dir="$work/$rubric"
  cp -r examples/issue-triage "$dir"
  cp bench/drill/canaries.jsonl "$dir/"
  if [ "$rubric" = wrong ]; then cp bench/drill/wrong-rubric.md "$dir/rubric.md"; fi
  python3 - "$dir/judged.toml" <<'PY'
import sys
p = sys.argv[1]
s = open(p).read()
anchor = 'rubric = "rubric.md"\n'
if s.count(anchor) != 1:
    sys.exit(f"{p}: expected one judge rubric line, found {s.count(anchor)}")
s = s.replace(anchor, anchor + 'canaries = "canaries.jsonl"\n'
              'breaker = { window = 10, max_canary_failures = 1 }\n', 1)
open(p, "w").write(s)
PY
  code=0
  start=$(date +%s.%N)
  "$bin" run "$dir/judged.toml" --store "$dir/store.sqlite" --out "$dir/out" --json "$@" \
    > "$dir/run.jsonl" 2> "$dir/stderr.txt" || code=$?
  end=$(date +%s.%N)
  python3 - "$rubric" "$code" "$dir/out/certificate.json" "$start" "$end" "$work/rows.jsonl" <<'PY'
import json, sys
rubric, code, path, start, end, rows = sys.argv[1:7]
c = json.load(open(path))
st = c["stats"]
can = st.get("canaries", {}).get("auth_blocker", {"sent": 0, "failed": []})
stop = c["stop"]
judged = c["statuses_by_stage"].get("auth_blocker", {})
decided = sum(judged.get(k, 0) for k in ("positive", "negative", "abstain", "error"))
audit_calls = sum(a.get("calls", 0) for a in st.get("audits", {}).values())
row = {
    "rubric": rubric, "exit": int(code), "stop": stop["reason"],
    "detail": stop.get("detail") if stop["reason"] != "completed" else None,
    "model_calls": st["model_calls"], "audit_calls": audit_calls,
    "judged": decided, "canaries_sent": can["sent"],
    "canaries_wrong": [f[0] for f in can["failed"]],
    "wall_s": float(end) - float(start),
    "backends": ", ".join(f"{b['kind']} ({b['model_id']})" for b in c.get("backends", [])),
}
open(rows, "a").write(json.dumps(row) + "\n")
print(f"{rubric:5} rubric: exit {code}, stop {stop['reason']}"
      + (f" ({stop.get('detail')})" if stop["reason"] != "completed" else "")
      + f"; model calls {st['model_calls']} (audit {audit_calls}),"
      + f" units judged {decided}, canaries sent {can['sent']}, wrong {len(can['failed'])}"
      + ("".join(f"\n    {i}: expected {e}, got {g}" for i, e, g in can["failed"])))
PY
done
[ -n "$report" ] || exit 0
python3 - "$work/rows.jsonl" "$started" "$load" "$*" > "$work/section.md" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
date, load, extra = sys.argv[2], sys.argv[3], sys.argv[4]
names = {"right": "the example's", "wrong": "inverted (`bench/drill/wrong-rubric.md`)"}
print("## Rubric breaker: a wrong rubric against canaries (`bench/drill/run.sh`)\n")
print(f"Written by `bash bench/drill/run.sh{(' ' + extra) if extra else ''}` on {date} (UTC), 2 cores, "
      f"1-minute load average {load} when it started; backend {rows[0]['backends']}. "
      "`examples/issue-triage/judged.toml` (the model decides membership; the audit `second_look` "
      "judges a seeded sample of what each rung threw away) with six canaries (three true "
      "blockers, three hard non-blockers from the fixture's oracle) and a breaker that allows "
      "one wrong canary in the first ten units, run once with the example's rubric and once "
      "with an inverted one, each in a fresh store.\n")
print("| rubric | exit | stop | model calls | of them the audit's | units judged | canaries sent | canaries wrong | wall s |")
print("|---|---:|---|---:|---:|---:|---:|---|---:|")
for r in rows:
    wrong = f"{len(r['canaries_wrong'])}: {', '.join(r['canaries_wrong'])}" if r["canaries_wrong"] else "0"
    print(f"| {names[r['rubric']]} | {r['exit']} | {r['stop']} | {r['model_calls']} | {r['audit_calls']} "
          f"| {r['judged']} | {r['canaries_sent']} | {wrong} | {r['wall_s']:.1f} |")
print()
for r in rows:
    if r["detail"]:
        print(f"- {names[r['rubric']]} rubric stopped: {r['detail']}")
PY
python3 bench/splice.py drill "$report" < "$work/section.md"
