"""One side of the LOTUS comparison: filter the reviews with fanfold's
accessor or with LOTUS's sem_filter, against the model at BASE_URL, and
write what it kept and its wall time as JSON.

    python lotus_filter.py fanfold|lotus REVIEWS.jsonl BASE_URL OUT.json
"""

import json
import sys
import time
from pathlib import Path

import pandas as pd

QUESTION = "Which reviews of The Lantern Keeper are positive?"
LOTUS_CLAIM = "{text} is a positive review of The Lantern Keeper"

side, reviews, base_url, out = sys.argv[1:5]
df = pd.read_json(reviews, lines=True, dtype=False)

started = time.perf_counter()
if side == "fanfold":
    import fanfold

    # The spec `df.fanfold.filter` drafts (its first rungs included), with
    # its model the server at base_url instead of the embedded one.
    folder = Path("fanfold-draft")
    spec = fanfold._draft(df, QUESTION, folder, "fanfold-store.sqlite")
    text = spec.read_text()
    embedded = '[backends.default]\ntype = "llama"\n'
    assert embedded in text, "the drafted spec's default backend is not the embedded model"
    text = text.replace(
        embedded,
        '[backends.default]\ntype = "openai"\nmodel = "local"\n'
        f'base_url = "{base_url}"\noutput = "json_object"\nmax_concurrency = 2\n'
        '# (the embedded model\'s settings below are unused)\n[backends.unused]\ntype = "llama"\n',
    )
    spec.write_text(text)
    res = fanfold.run(spec, store="fanfold-store.sqlite", out=folder / "out", progress=False)
    ids = sorted(str(i) for i in res.answer["id"])
    stats = res.certificate["stats"]
    cert = res.certificate
    result = {
        "kept": ids,
        "engine_calls": stats.get("model_calls"),
        "complete": res.complete,
        "excluded": (cert.get("excluded_by_reason") or {}).get("names_no_question_term", 0),
        "embed_dropped": sum(e.get("dropped", 0) for e in (stats.get("embed") or {}).values()),
        "judged": (cert.get("routed_by_stage") or {}).get("judge", 0),
    }
else:
    import lotus
    from lotus.models import LM

    lm = LM(model="openai/local", api_base=base_url, api_key="none", max_tokens=64)
    lotus.settings.configure(lm=lm)
    kept = df.sem_filter(LOTUS_CLAIM)
    ids = sorted(str(i) for i in kept["id"])
    usage = lm.stats.physical_usage
    result = {"kept": ids, "lotus_prompt_tokens": usage.prompt_tokens,
              "lotus_completion_tokens": usage.completion_tokens, "complete": True}
result["wall_s"] = time.perf_counter() - started
result["rows"] = len(df)
Path(out).write_text(json.dumps(result))
