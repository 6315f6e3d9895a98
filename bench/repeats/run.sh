#!/usr/bin/env bash
# Real-file partition cases, before and after: a CSV of 2,000 rows of which
# 135 repeat an earlier row byte for byte (the same key), the same with one
# more repeat whose content differs, and 100 rows with a quote opened in
# row 10 (or the last row) and never closed. Each runs on the scripted
# backend; the section shows each binary's exit code and answer.md's
# accounting line.
#
#   bench/repeats/run.sh [BEFORE_BIN]   (a fanfold built without the change;
#                                       omitted: only the current build)
#   FANFOLD_BIN (default target/release/fanfold) is the current build.
#   REPORT=FILE (default docs/benchmarks.md; empty: none) gets its section.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
after=${FANFOLD_BIN:-$root/target/release/fanfold}
before=${1:-}
report=${REPORT-$root/docs/benchmarks.md}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
python3 - <<'PY'
import random
random.seed(47)
words = "film plot actor scene score light story pace cast dialogue ending camera".split()
rows = []
for i in range(1, 1866):
    text = " ".join(random.choice(words) for _ in range(random.randint(6, 20)))
    flag = "true" if random.random() < 0.2 else "false"
    rows.append(f'{i},critic {i % 37},"{text}",{flag}')
out = list(rows)
for _ in range(135):
    src = random.randrange(len(rows))
    at = out.index(rows[src]) + 1 + random.randrange(50)
    out.insert(min(at, len(out)), rows[src])
assert len(out) == 2000
open("repeats.csv", "w").write("id,critic,text,flag\n" + "\n".join(out) + "\n")
r7 = rows[6]
other = r7.rsplit(",", 1)[0] + ("," + ("false" if r7.endswith("true") else "true"))
open("conflict.csv", "w").write("id,critic,text,flag\n" + "\n".join(out[:300] + [other] + out[300:]) + "\n")
lines = [f"{i},{'true' if i % 5 == 0 else 'false'},row {i} text" for i in range(1, 101)]
for name, bad in [("quote10.csv", 10), ("quote100.csv", 100)]:
    rows = list(lines)
    rows[bad - 1] = f'{bad},true,"row {bad} text'
    open(name, "w").write("id,flag,text\n" + "\n".join(rows) + "\n")
PY
cat > spec.toml <<'TOML'
name = "repeats"
question = "Which records are flagged?"

[input]
path = "input.data"
partition = { type = "csv", key = "id", kind = "row" }

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

[fold]
fan_in = 4
[[fold.reducers]]
name = "flagged"
type = "set"

[contract]
type = "exhaustive"
answer = "flagged"
TOML
echo "Say yes when the record is flagged." > rubric.md
echo '{"type": "object", "required": ["decision"], "properties": {"decision": {"enum": ["yes", "no"]}}}' > schema.json
echo '{decision: (if .flag == "true" then "yes" else "no" end)}' > judge.jq
export FANFOLD_LOG=error
# One table row: the case, then exit code and accounting line per binary.
measure() {
  local bin=$1 input=$2
  rm -rf out store.sqlite*
  cp "$input" input.data
  set +e
  "$bin" run spec.toml --store store.sqlite --out out --json > /dev/null 2>&1
  local rc=$?
  set -e
  local line
  line=$(grep -m1 ' elements = ' out/answer.md | sed 's/^- source `[0-9a-f]*` ([^)]*): //')
  local reasons
  reasons=$(python3 -c 'import json; c = json.load(open("out/certificate.json")); print(", ".join(f"{k} {v}" for k, v in sorted(c["rejected_by_reason"].items())) or "none")')
  printf '%s | %s (rejected: %s)' "$rc" "$line" "$reasons"
}
table=""
for case in "repeats.csv:2,000 rows, 135 repeated byte for byte" \
            "conflict.csv:the same and one repeat of row 7 with another flag" \
            "quote10.csv:100 rows, a quote opened in row 10 never closed" \
            "quote100.csv:100 rows, a quote opened in the last row never closed"; do
  file=${case%%:*}; what=${case#*:}
  row="| $what | $(measure "$after" "$file")"
  if [ -n "$before" ]; then
    row="| $what | $(measure "$before" "$file") | $(measure "$after" "$file")"
  fi
  table+="$row |"$'\n'
  echo "$row |"
done
if [ -n "$report" ]; then
  if [ -n "$before" ]; then
    head='| input | exit before | accounting before | exit after | accounting after |
|---|---|---|---|---|'
  else
    head='| input | exit | accounting |
|---|---|---|'
  fi
  python3 "$root/bench/splice.py" repeats "$report" <<MD
## Real-file partition cases: repeated rows, an unclosed CSV quote (\`bench/repeats/run.sh\`)

Measured by \`bench/repeats/run.sh\` on $(date -u +%Y-%m-%d) on the scripted backend (the figures are the partition's accounting, not a model's). Exit code and \`answer.md\`'s accounting line for each input$( [ -n "$before" ] && echo ", with fanfold built before identical repeats and runaway quotes were told apart, and after" ).

$head
$table
MD
fi
