# Shared by the kill and shared-store drills (sourced, in the work folder).

# write_spec NAME DELAY_MS [EXTRA_TOML]: spec.toml judging input.jsonl
# with the scripted judge (DELAY_MS a call), its rubric, schema and jq
# script; EXTRA_TOML (more backends) goes after the default backend.
write_spec() {
  cat > spec.toml <<TOML
name = "$1"
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
delay_ms = $2
${3:-}
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
}

# items ANSWER_JSON: the answer's items, as one line of JSON.
items() { python3 -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))["items"]))' "$1"; }
