"""The section of the LOTUS comparison, from what lotus.sh's run wrote."""

import json
import sys
from pathlib import Path

work, lotus_version = Path(sys.argv[1]), sys.argv[2]


def usage(side):
    lines = (work / f"usage-{side}.jsonl").read_text().splitlines()
    calls = [json.loads(line) for line in lines if line.strip()]
    return {
        "calls": len(calls),
        "prompt": sum(c.get("prompt_tokens") or 0 for c in calls),
        "completion": sum(c.get("completion_tokens") or 0 for c in calls),
        "errors": sum(1 for c in calls if c.get("status") != 200),
    }


result = {s: json.loads((work / f"result-{s}.json").read_text()) for s in ("fanfold", "lotus")}
seen = {s: usage(s) for s in result}
rows = result["fanfold"]["rows"]
out = [
    "## Python: `df.fanfold.filter` against LOTUS's `sem_filter` (`bench/python/lotus.sh`)\n",
    "Every figure below comes from one run.\n",
    f"- Rows: the {rows} reviews of `examples/film-reviews/reviews.jsonl` (several films). "
    "fanfold: the spec `df.fanfold.filter(\"Which reviews of The Lantern Keeper are positive?\")` "
    "drafts, its model pointed at the server. LOTUS "
    f"{lotus_version}: `df.sem_filter(\"{{text}} is a positive review of The Lantern Keeper\")`.",
    "- Both sides reach the same model (SmolLM2-135M-Instruct Q4_1) behind one llama-cpp-python "
    "server through a counting proxy; calls and tokens are the server's own `usage`, counted by "
    "the proxy. Each side starts with an empty cache. The decisions of a 135M model are not the "
    "point; what each side sends is.\n",
    "| side | calls | prompt tokens | completion tokens | failed calls | rows kept | wall s |",
    "|---|---:|---:|---:|---:|---:|---:|",
]
for side, name in (("fanfold", "fanfold `filter`"), ("lotus", "LOTUS `sem_filter`")):
    u, r = seen[side], result[side]
    out.append(
        f"| {name} | {u['calls']} | {u['prompt']} | {u['completion']} | {u['errors']} | "
        f"{len(r['kept'])} | {r['wall_s']:.1f} |"
    )
f, l = seen["fanfold"], seen["lotus"]
r = result["fanfold"]
out.append("")
out.append(
    f"fanfold sent **{f['calls'] / max(1, l['calls']):.2f}x** LOTUS's calls and "
    f"**{(f['prompt'] + f['completion']) / max(1, l['prompt'] + l['completion']):.2f}x** its "
    f"tokens. Of the {rows} rows, the drafted spec's rule (no term the question names: "
    f"`names_no_question_term`) excluded {r['excluded']} and its embedding rung dropped "
    f"{r['embed_dropped']} before any model call; the model judged {r['judged']} rows in "
    f"{f['calls']} calls (an answer that breaks the schema or quotes nothing verbatim is asked "
    f"again). LOTUS made {l['calls']} calls for {rows} rows. Prompt tokens a call: fanfold "
    f"{f['prompt'] / max(1, f['calls']):.0f}, LOTUS {l['prompt'] / max(1, l['calls']):.0f}."
)
print("\n".join(out))
