"""The example notebook as a user runs it: executed by `jupyter nbconvert
--execute` on the embedded local model (the default backend, a real model),
rendered to HTML, and that page read as Chromium shows it."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from browser import visible_text

REPO = Path(__file__).resolve().parents[2]
NOTEBOOK = REPO / "examples" / "notebook" / "ask.ipynb"
QUESTION = "Which tickets report data loss?"


def test_the_example_notebook_runs_on_the_embedded_model_and_shows_its_report(tmp_path):
    work = tmp_path / "nb"
    work.mkdir()
    shutil.copy(NOTEBOOK, work / "ask.ipynb")
    env = {k: v for k, v in os.environ.items() if k != "FANFOLD_STORE"}
    run = subprocess.run(
        [sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute",
         "--ExecutePreprocessor.timeout=900", "--output", "executed.ipynb", "ask.ipynb"],
        cwd=work, env=env, capture_output=True, text=True, timeout=1800,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    executed = json.loads((work / "executed.ipynb").read_text(encoding="utf-8"))

    def stream_of(cell):
        return "".join(
            "".join(o.get("text", "")) for o in cell.get("outputs", []) if o.get("output_type") == "stream"
        )

    code = [c for c in executed["cells"] if c["cell_type"] == "code"]
    assert all(
        o.get("output_type") != "error" for c in code for o in c.get("outputs", [])
    ), "a cell raised"
    # complete, verified, model calls, quality: a real model was called.
    first = stream_of(code[1]).split()
    assert first[:2] == ["True", "True"], first
    calls = int(first[2])
    assert calls >= 1, first
    assert stream_of(code[4]).strip() == "model calls on the second ask: 0"

    page = subprocess.run(
        [sys.executable, "-m", "jupyter", "nbconvert", "--to", "html", "--output", "executed.html",
         "executed.ipynb"],
        cwd=work, env=env, capture_output=True, text=True, timeout=300,
    )
    assert page.returncode == 0, page.stderr[-4000:]
    text = visible_text((work / "executed.html").read_text(encoding="utf-8"), tmp_path / "page")

    # The report as the notebook shows it: its headline, the backend it ran
    # on, and every unit the answer kept with its verbatim quote.
    report = text[text.index("Out[4]:"):]
    assert report.startswith(f"Out[4]: {QUESTION}"), report[:300]
    assert "Complete: every unit the contract needs was decided, and verify passed." in report
    assert "SmolLM2" in report and "[SIMULATED]" not in text
    answer = next(o for o in code[2]["outputs"] if o.get("output_type") == "execute_result")
    kept = re.findall(r"^\d+\s+(\d+)\s+body", "".join(answer["data"]["text/plain"]), flags=re.M)
    # The notebook is there to show an answer: a run that keeps nothing
    # shows none.
    assert kept, answer["data"]["text/plain"]
    assert f"Answer: {len(kept)} item" in report
    cited = report[report.index("Cited units"):] if kept else ""
    for unit in kept:
        assert f"{unit} judge" in cited, (unit, cited[:800])
