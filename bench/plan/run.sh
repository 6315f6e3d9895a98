#!/usr/bin/env bash
# `fanfold plan` on a real log with human labels: measures every proxy the
# cascade of examples/bgl-alerts/target.toml could use and every whole-run
# strategy (on the embedded model), runs the chosen plan, and scores its
# answer against loghub's labels (the oracle the plan asked, standing in
# for a person). Writes the `plan` section of docs/benchmarks.md.
#
#   cargo build --release && bash bench/plan/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${FANFOLD:-target/release/fanfold}
spec=examples/bgl-alerts/target.toml
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export FANFOLD_LOG=error

start=$(date +%s.%N)
"$bin" plan "$spec" --store "$work/s.sqlite" --out "$work/plans" --write "$work/plan.toml" >"$work/plan.txt"
planned=$(date +%s.%N)
"$bin" run "$spec" --plan "$work/plan.toml" --store "$work/s.sqlite" --out "$work/run" --json >/dev/null
ran=$(date +%s.%N)

python3 - "$work" "$start" "$planned" "$ran" >"$work/section.md" <<'PY'
import json, os, pathlib, sys
work = pathlib.Path(sys.argv[1])
start, planned, ran = map(float, sys.argv[2:5])
cert = json.loads((work / "run/certificate.json").read_text())
answer = json.loads((work / "run/answer.json").read_text())
r = cert["stats"].get("cascades", {}).get("failure_judge")
truth = {
    l["id"]
    for l in map(json.loads, open("examples/bgl-alerts/labels.jsonl"))
    if l["decision"] == "failure"
}
found = {i["unit_id"] for i in answer["items"]}
facts = [json.loads(l) for l in open(work / "run/facts.jsonl")]
judged = [f for f in facts if f.get("stage") == "failure_judge"]
by_proxy = {f["source_ids"][0] for f in judged if f.get("facts", {}).get("decided_by") == "proxy"}
reached = {f["source_ids"][0] for f in judged}

def quality(units):
    t = truth & units
    hit = found & t
    kept = found & units
    recall = len(hit) / len(t) if t else 1.0
    precision = len(hit) / len(kept) if kept else 1.0
    return recall, precision, len(t)

load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
print("## Choosing how a target is met (`fanfold plan`)\n")
# The planner's own runs name the model it measured with; the chosen
# plan's replay may make no model call at all.
kinds = sorted({
    b["kind"]
    for c in (work / "plans").rglob("certificate.json")
    for b in json.loads(c.read_text()).get("backends", [])
})
print(f"`bash bench/plan/run.sh`, {os.cpu_count()} cores, load {load}, planned with {', '.join(kinds) or 'no model'}. Every figure below is measured by the run that wrote it.\n")
print("`fanfold plan examples/bgl-alerts/target.toml`: the failure judge declares recall ≥ 0.9 at δ = 0.1 with a budget of 200 labels, and loghub's own labels (`labels.jsonl`) are the oracle, standing in for a person. The proxies are two scoring rungs, the embedded model's scored choice (`failure_guess`) and a classifier trained on the embeddings; the whole-run strategies run the embedded 135M model on a seeded sample of 200 lines. The planner's tables, as it printed them:\n")
print((work / "plan.txt").read_text().strip())
print(f"\nPlanning took {planned - start:.1f} s; the chosen plan's run {ran - planned:.1f} s.\n")
if r is not None:
    all_r, all_p, all_t = quality(reached)
    ho_r, ho_p, ho_t = quality(by_proxy)
    print("The chosen plan's run (`fanfold run ... --plan`), scored against the same labels over the lines that reached the judge:\n")
    print("| proxy | proven lower bound | labels | oracle calls | without the cascade | recall | precision | lines the proxy decided | their recall | their precision |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    print(f"| {r['proxy']} | {r['lower_bound']:.3f} | {r['labels']} | {r['oracle_calls']} | {r['calls_without']} | {all_r:.3f} ({all_t} alerts) | {all_p:.3f} | {len(by_proxy)} | {ho_r:.3f} ({ho_t} alerts) | {ho_p:.3f} |")
    print("\nThe stated guarantee is on the answer's recall over the lines that reached the judge; the held-out columns score only the lines no label decided.")
else:
    all_r, all_p, all_t = quality(reached or found)
    print("The chosen plan's run (`fanfold run ... --plan`), a whole-run strategy, scored against the same labels:\n")
    print("| model calls | recall | precision |")
    print("|---:|---:|---:|")
    print(f"| {cert['stats']['model_calls']} | {all_r:.3f} ({all_t} alerts) | {all_p:.3f} |")
print("\nThe prefilter (no failure at INFO or WARNING) was written knowing that loghub files every alert of this sample at FATAL, so the figures inherit it.")
PY
python3 bench/splice.py plan docs/benchmarks.md <"$work/section.md"
cat "$work/section.md"
