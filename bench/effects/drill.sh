#!/usr/bin/env bash
# Effect-safety drill: examples/issue-triage/effects.toml labels and
# comments on the issues its answer selects, against the local tracker
# (`fanfold fixture serve`, a process of its own that outlives every kill).
# Each round is a new effect (its own label and comment text):
#
#   rounds 1..N   kill -9 the run at a random moment, then resume it;
#   round N+1     two processes on one store at once;
#   round N+2     a cancel mid-stage (a 1 s wall budget), then resume;
#   S rounds      two runs at once on two different stores;
#   S rounds      a slow-committing target (a second tracker writing every
#                 5th effect 7 s after it arrives, against timeout_ms =
#                 5000, sending no key header: only the settle and a
#                 second read-back keep a resend away);
#   S rounds      two stores at once against a target that honours no key
#                 header (measured and reported, not required).
#
# A round's comment text is new, so it is a new version of the comment
# effect on issues that carry an earlier round's: every run allows it
# (--allow-new-version).
#
# The tracker counts every effect it applies and every repeat. The last
# three lines printed are the drill's result: duplicate effects, lost
# effects, and effects read back by the run that finished each round.
#
#   bench/effects/drill.sh [N] [S]  (defaults 20 and N; needs curl, sqlite3 and a release build)
#   REPORT=FILE (default docs/benchmarks.md; empty: none) gets its section.
set -euo pipefail
rounds=${1:-20}
srounds=${2:-$rounds}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
bin=${FANFOLD_BIN:-$root/target/release/fanfold}
report=${REPORT-$root/docs/benchmarks.md}
measured_on=$(date -u +%Y-%m-%d)
load=$(cut -d' ' -f1-3 /proc/loadavg)
latency_ms=40
work=$(mktemp -d)
tracker_pid=
slow_pid=
cleanup() {
  [ -n "$tracker_pid" ] && kill "$tracker_pid" 2>/dev/null || true
  [ -n "$slow_pid" ] && kill "$slow_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
cd "$work"
ex=$root/examples/issue-triage
cp "$ex"/{issues.json,comments.json,rubric.md,fact.schema.json,scripted-judge.jq} .
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$bin" fixture serve --dir . --port "$port" --latency-ms "$latency_ms" 2>tracker.log &
tracker_pid=$!
for _ in $(seq 1 100); do
  curl -sf "http://127.0.0.1:$port/_stats" >/dev/null && break
  sleep 0.1
done
export FANFOLD_LOG=error

# spec ROUND [EXTRA_TOML]: round.toml, whose effects are this round's own,
# against the tracker at $target (the main one unless set).
spec() {
  sed -e "s/127.0.0.1:8787/127.0.0.1:${target:-$port}/g" \
      -e "s/release-blocker-auth/drill-r$1/g" \
      -e "s/Triage: release blocker/Round $1. Triage: release blocker/" \
      "$ex/effects.toml" > round.toml
  # NOKEY=1: a target that honours no key, so none is sent.
  [ -n "${NOKEY:-}" ] && sed -i 's/type = "http", method = "POST",/type = "http", method = "POST", idempotency_header = "",/' round.toml
  [ -n "${2:-}" ] && printf '\n%s\n' "$2" >> round.toml
  return 0
}
run() { "$bin" run round.toml --backend scripted --store store.sqlite --json --allow-new-version "$@" > /dev/null 2>>runs.log; }

# journal ROUND: this round's effects by state, as the store holds them.
journal() {
  sqlite3 store.sqlite "SELECT state || ' ' || COUNT(*) FROM effects
    WHERE action LIKE '%drill-r$1\"%' OR action LIKE '%Round $1. %' GROUP BY state" 2>/dev/null | tr '\n' ' '
}

# How long a whole round takes, to spread the kills over it: a round of
# its own (round 0), not killed.
spec 0
started=$(date +%s%N)
run --out out-0
span_ms=$(( ($(date +%s%N) - started) / 1000000 ))
echo "round 0 (not killed): $span_ms ms"
finished=(0)
in_flight=0

for r in $(seq 1 "$rounds"); do
  spec "$r"
  ms=$(( (RANDOM * 32768 + RANDOM) % span_ms + 50 ))
  "$bin" run round.toml --backend scripted --store store.sqlite --json --allow-new-version --out "out-$r-killed" > /dev/null 2>>runs.log &
  pid=$!
  sleep "$(printf '%d.%03d' $((ms / 1000)) $((ms % 1000)))"
  kill -9 "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  at_kill=$(journal "$r")
  in_flight=$(( in_flight + $(echo "$at_kill" | grep -o 'dispatched [0-9]*' | grep -o '[0-9]*' || echo 0) ))
  run --out "out-$r"
  finished+=("$r")
  printf 'round %2d: killed at %4d ms; journal at the kill: %s\n' "$r" "$ms" "${at_kill:-no effects yet}"
done

# Two processes on one store.
r=$((rounds + 1))
spec "$r"
"$bin" run round.toml --backend scripted --store store.sqlite --json --allow-new-version --out "out-$r-b" > /dev/null 2>>runs.log &
other=$!
run --out "out-$r"
wait "$other"
finished+=("$r" "$r-b")
echo "round $r: two processes on one store; journal: $(journal "$r")"

# A cancel mid-stage: the wall budget ends the run during its effects.
r=$((rounds + 2))
spec "$r" $'[budget]\nmax_wall_secs = 1'
code=0
run --out "out-$r-cancelled" || code=$?
at_cancel=$(journal "$r")
spec "$r"
run --out "out-$r"
finished+=("$r")
echo "round $r: cancelled by a 1 s wall budget (exit $code); journal then: $at_cancel"

curl -sf "http://127.0.0.1:$port/_effects" > effects.json

# check TRACKER_PORT OUT_DIR...: each effect of the finished runs' answers
# applied exactly once at that tracker; prints
# "duplicates lost effects done already resolved_after_settle".
check() {
  local tport=$1; shift
  curl -sf "http://127.0.0.1:$tport/_effects" > check.json
  python3 - "$@" <<'PY'
import json, sys
log = json.load(open("check.json"))
times = {(e["issue"], e["kind"], e["what"]): e["times"] for e in log["effects"]}
dup = lost = n = done = already = settled = 0
seen = set()
for out in sys.argv[1:]:
    cert = json.load(open(f"{out}/certificate.json"))
    for stage, kind in (("label_blockers", "label"), ("comment_cause", "comment")):
        for line in cert["stats"]["effects"][stage]["effects"]:
            done += line["outcome"] == "done"
            already += line["outcome"] == "already"
            settled += "ms settle: in place" in (line.get("detail") or "")
            body = line["action"]["body"]
            what = body["labels"][0] if kind == "label" else body["body"]
            k = (int(line["unit_id"]), kind, what)
            if k in seen:
                continue
            seen.add(k)
            n += 1
            t = times.get(k, 0)
            lost += t == 0
            dup += max(t - 1, 0)
print(dup, lost, n, done, already, settled)
PY
}

# Two runs at once on two different stores, each round a new effect.
pair_rounds() {
  local tag=$1 extra=$2
  local dups=0 lost=0 n=0 done=0 already=0 bad=0 base=$3
  for i in $(seq 1 "$srounds"); do
    r=$((base + i))
    spec "$r" "$extra"
    "$bin" run round.toml --backend scripted --store "store-$tag-a.sqlite" --json --allow-new-version --out "out-$r-a" > /dev/null 2>>runs.log &
    local a=$!
    "$bin" run round.toml --backend scripted --store "store-$tag-b.sqlite" --json --allow-new-version --out "out-$r-b" > /dev/null 2>>runs.log &
    local b=$!
    wait "$a" || true
    wait "$b" || true
    read -r d l e dn al _ < <(check "$port" "out-$r-a" "out-$r-b")
    dups=$((dups + d)); lost=$((lost + l)); n=$((n + e)); done=$((done + dn)); already=$((already + al))
    [ "$d" -gt 0 ] && bad=$((bad + 1))
    printf 'two stores (%s) round %2d: %d effects, %d duplicates, %d lost; done %d, already %d\n' "$tag" "$i" "$e" "$d" "$l" "$dn" "$al"
  done
  echo "$dups $lost $n $done $already $bad" > "pair-$tag.txt"
}
pair_rounds key "" 1000
NOKEY=1 pair_rounds nokey "" 2000

# A slow-committing target: a second tracker writes every 5th effect 7 s
# after it arrives; the spec's timeout_ms is 5000, its settle the same.
sport=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$bin" fixture serve --dir . --port "$sport" --latency-ms "$latency_ms" --slow-commit-every 5 --slow-commit-ms 7000 2>slow.log &
slow_pid=$!
for _ in $(seq 1 100); do
  curl -sf "http://127.0.0.1:$sport/_stats" >/dev/null && break
  sleep 0.1
done
sdups=0; slost=0; sn=0; sdone=0; ssettled=0; sbad=0
for i in $(seq 1 "$srounds"); do
  r=$((3000 + i))
  target=$sport NOKEY=1 spec "$r"
  "$bin" run round.toml --backend scripted --store store-slow.sqlite --json --allow-new-version --out "out-$r" > /dev/null 2>>runs.log || true
  read -r d l e dn _ st < <(check "$sport" "out-$r")
  sdups=$((sdups + d)); slost=$((slost + l)); sn=$((sn + e)); sdone=$((sdone + dn)); ssettled=$((ssettled + st))
  [ "$d" -gt 0 ] && sbad=$((sbad + 1))
  printf 'slow commit round %2d: %d effects, %d duplicates, %d lost; resolved after the settle %d\n' "$i" "$e" "$d" "$l" "$st"
done
slow_commits=$(curl -sf "http://127.0.0.1:$sport/_effects" | python3 -c 'import json,sys; print(json.load(sys.stdin)["slow_commits"])')
read -r pdups plost pn pdone palready pbad < pair-key.txt
read -r qdups qlost qn qdone qalready qbad < pair-nokey.txt

python3 - "$rounds" "$latency_ms" "$span_ms" "${finished[@]}" > result.txt <<'PY'

import json, sys
rounds, latency, span = map(int, sys.argv[1:4])
finished = sys.argv[4:]
log = json.load(open("effects.json"))
times = {}
for e in log["effects"]:
    times[(e["issue"], e["kind"], e["what"])] = e["times"]
expected = 0
read_back = 0
lost = 0
resolved = 0
for name in finished:
    cert = json.load(open(f"out-{name}/certificate.json"))
    r = name.split("-")[0]
    for stage, kind in (("label_blockers", "label"), ("comment_cause", "comment")):
        rep = cert["stats"]["effects"][stage]
        for line in rep["effects"]:
            if line["read_back"] and line["read_back"].get("holds") is True:
                read_back += 1
            if "resolved by read-back" in (line.get("detail") or "") and name.isdigit() and 1 <= int(name) <= rounds:
                resolved += 1
        if name.endswith("-b"):
            continue
        for line in rep["effects"]:
            expected += 1
            body = line["action"]["body"]
            what = body["labels"][0] if kind == "label" else body["body"]
            if times.get((int(line["unit_id"]), kind, what), 0) == 0:
                lost += 1
checked = sum(len(json.load(open(f"out-{n}/certificate.json"))["stats"]["effects"][s]["effects"])
              for n in finished for s in ("label_blockers", "comment_cause"))
print(json.dumps({
    "effects": expected, "applied": log["applied"], "duplicates": log["duplicates"],
    "lost": lost, "read_back": read_back, "checked": checked, "resolved": resolved,
    "requests": log["requests"],
}))
PY
result=$(cat result.txt)
field() { python3 -c "import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])" "$result" "$1"; }
effects=$(field effects); duplicates=$(field duplicates); lost=$(field lost)
read_back=$(field read_back); checked=$(field checked); resolved=$(field resolved)
applied=$(field applied); requests=$(field requests)
if [ -n "$report" ]; then
  cpu=$(grep -m1 "model name" /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
  python3 "$root/bench/splice.py" effects "$report" <<MD
## Effects under kills, two processes, a cancel, two stores and a slow target (\`bench/effects/drill.sh\`)

Written by \`bench/effects/drill.sh $rounds $srounds\` on $measured_on (UTC): $(nproc) logical CPUs, $cpu; 1-minute load average $load when it started. \`examples/issue-triage/effects.toml\` with the scripted judge ([SIMULATED] judgments; the figures are effect accounting, which a simulated judge does not touch) labels and comments on each issue its answer selects, against the local tracker (\`fanfold fixture serve\`, $latency_ms ms an answer, a process of its own). Every round is a new effect (its own label and comment text). Rounds 1 to $rounds kill \`fanfold run\` with \`kill -9\` at a random moment within the length of an unkilled round ($span_ms ms), then resume it; round $((rounds + 1)) runs two processes on one store at once; round $((rounds + 2)) is cancelled by a 1 s wall budget, then resumed. The tracker counts each effect it applies and each repeat of one.

| effects wanted | applied at the tracker | duplicates | lost | read back in place by the finishing runs | journaled \`dispatched\` with no receipt at a kill | found in place by the resume's read-back, not sent again | effect requests the tracker received |
|---:|---:|---:|---:|---:|---:|---:|---:|
| $effects | $applied | $duplicates | $lost | $read_back of $checked | $in_flight | $resolved | $requests |

The tracker applies an effect when it receives it and answers $latency_ms ms later, so a run killed in between has acted without hearing so: its resume reads the effect back, finds it, and sends nothing. A send journaled just before a kill that never left is read back, not found, and sent once (the difference of the two middle columns). The read-backs count the second process of round $((rounds + 1)) too, which read every effect back.

Then $srounds rounds each of two runs started together on two different stores (no shared lease: only the target keeps them apart), and $srounds rounds against a second tracker that writes every 5th effect 7 s after it arrives, past the spec's \`timeout_ms = 5000\` (its settle defaults to the same 5 s), sending no key header. Every round is a new version of the comment effect, sent with \`--allow-new-version\`. An effect counts once per round however many runs reported it.

| scenario | rounds | effects | duplicates | rounds with a duplicate | lost | outcomes |
|---|---:|---:|---:|---:|---:|---|
| two stores at once, key sent as \`Idempotency-Key\` (the default) | $srounds | $pn | $pdups | $pbad | $plost | $pdone done, $palready already (both runs) |
| slow-committing target, no key header | $srounds | $sn | $sdups | $sbad | $slost | $sdone done, $ssettled of them seen by the read-back after the settle; $slow_commits writes late |
| two stores at once, target honouring no key header (not a guarantee: measured) | $srounds | $qn | $qdups | $qbad | $qlost | $qdone done, $qalready already (both runs) |

Two runs on different stores are kept apart by the target: each takes its effects in an order of its own, so the other usually finds the marker (\`<!-- fanfold:effect NAME KEY -->\`) or the label by its read-back and records \`already\`; one reaching an effect at the same moment is answered from the key (\`Idempotent-Replayed\`) and also records \`already\`. A target that honours no key has only the read-back, which cannot see a send still in flight: the last row is what that leaves, and a read-back showing a marker twice makes the effect \`duplicated\`, an incomplete answer, never a silent \`done\`.
MD
fi
echo "two stores at once: $pdups duplicates, $plost lost of $pn effects over $srounds rounds"
echo "slow-committing target: $sdups duplicates, $slost lost of $sn effects over $srounds rounds ($slow_commits late writes)"
echo "two stores, no key header: $qdups duplicates in $qbad of $srounds rounds, $qlost lost of $qn effects (measured, not required)"
echo "duplicate effects: $duplicates"
echo "lost effects: $lost"
echo "read back: $read_back of $checked"
[ "$duplicates" -eq 0 ] && [ "$lost" -eq 0 ] && [ "$read_back" -eq "$checked" ] \
  && [ "$pdups" -eq 0 ] && [ "$plost" -eq 0 ] && [ "$sdups" -eq 0 ] && [ "$slost" -eq 0 ] \
  || { echo "the drill failed" >&2; exit 1; }
