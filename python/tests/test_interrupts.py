"""Stopping a run from Python: the engine runs in a process of its own, so
a runaway jq program raises instead of ending the interpreter; a second
Ctrl-C ends that process and nothing writes the output folder after the
call returned; an interrupt is its own stop reason; and the accessor
refuses rows it could not match answers back to before anything runs."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

import fanfold


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    """Each test in its own folder, so `.fanfold` (store, ask folders) is its own."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FANFOLD_STORE", raising=False)
    return tmp_path


#: One jq evaluation of about half a second (a million additions), under
#: the jq time limit: work the engine cannot stop halfway.
SLOW = "(reduce range(0; 1000000) as $i (0; . + 1)) as $spent"


def spec_folder(tmp_path, n, *, project=None, prefilter=None, wall=None):
    """A spec over n records whose [SIMULATED] judge says yes to all: with
    a `project` expression for its judge, a prefilter rule's `when`, a
    wall budget."""
    folder = tmp_path / "spec"
    folder.mkdir()
    lines = [
        'name = "t"',
        'question = "Which records are flagged?"',
        "",
        "[input]",
        'path = "input.jsonl"',
        'partition = { type = "jsonl", key = "id" }',
        "",
    ]
    if prefilter is not None:
        lines += ["[[prefilter]]", 'name = "spin"', f"when = '{prefilter}'",
                  'action = "exclude"', 'reason = "never"', ""]
    if wall is not None:
        lines += ["[budget]", f"max_wall_secs = {wall}", ""]
    lines += [
        "[[stages]]",
        'name = "judge"',
        'type = "map"',
        "version = 1",
        'rubric = "rubric.md"',
        'output_schema = "schema.json"',
        'decision = { pointer = "/decision", positive = ["yes"], negative = ["no"] }',
    ]
    if project is not None:
        lines.append(f"project = '{project}'")
    lines += [
        "",
        "[backends.default]",
        'type = "scripted"',
        'script = "judge.jq"',
        "",
        "[[fold.reducers]]",
        'name = "flagged"',
        'type = "set"',
        "",
        "[contract]",
        'type = "exhaustive"',
        'answer = "flagged"',
        "",
    ]
    (folder / "spec.toml").write_text("\n".join(lines))
    (folder / "rubric.md").write_text("Say yes when the record is flagged.\n")
    (folder / "schema.json").write_text(
        '{"type": "object", "required": ["decision"], '
        '"properties": {"decision": {"enum": ["yes", "no"]}}}'
    )
    # [SIMULATED] A judge that says yes to every record.
    (folder / "judge.jq").write_text('{decision: "yes"}\n')
    (folder / "input.jsonl").write_text(
        "".join(json.dumps({"id": i, "flag": True}) + "\n" for i in range(n))
    )
    return folder / "spec.toml"


def test_a_runaway_jq_program_raises_and_the_interpreter_lives_on(tmp_path):
    # `def f: f; f` never answers, and jq cannot be stopped halfway: the
    # process it runs in ends at the time limit (the wall budget's 1 s).
    spec = spec_folder(tmp_path, 3, prefilter="def f: f; f", wall=1)
    started = time.monotonic()
    with pytest.raises(fanfold.InputError) as caught:
        fanfold.run(spec, store=tmp_path / "store.sqlite", out=tmp_path / "out", progress=False)
    err = caught.value
    assert "prefilter rule `spin`" in str(err) and "cannot be interrupted" in str(err), str(err)
    assert err.category == "input" and err.exit_code == 5
    assert time.monotonic() - started < 30
    # This interpreter is still here, and the store still serves a run.
    fixed = spec.read_text().replace("def f: f; f", "false")
    spec.write_text(fixed)
    res = fanfold.run(spec, store=tmp_path / "store.sqlite", out=tmp_path / "out", progress=False)
    assert res.complete and len(res.answer) == 3, res.incomplete


USER = r"""
import json, sys, time
from pathlib import Path
import fanfold
spec, store, out = sys.argv[1:4]
print("started", flush=True)
try:
    fanfold.run(spec, store=store, out=out, workers=1, progress=False)
    print(json.dumps({"interrupted": False}), flush=True)
except KeyboardInterrupt:
    print(json.dumps({"interrupted": True, "at": time.monotonic()}), flush=True)
# A notebook's interpreter lives on after the call: anything the run left
# behind would have time to write.
time.sleep(8)
print(json.dumps({"files": sorted(p.name for p in Path(out).glob("*"))}), flush=True)
"""


def test_a_second_ctrl_c_ends_the_engine_and_nothing_writes_the_out_folder_after(tmp_path):
    # The judge's `project` takes half a second a record and runs for all
    # ten before the first call: a stretch the first Ctrl-C cannot cut.
    spec = spec_folder(tmp_path, 10, project=SLOW + " | {id, flag}")
    out = tmp_path / "out"
    user = subprocess.Popen(
        [sys.executable, "-c", USER, str(spec), str(tmp_path / "store.sqlite"), str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    assert user.stdout.readline().strip() == "started"
    time.sleep(1.5)
    user.send_signal(signal.SIGINT)
    time.sleep(0.4)
    second = time.monotonic()
    user.send_signal(signal.SIGINT)
    rest, err = user.communicate(timeout=60)
    said = [json.loads(line) for line in rest.strip().splitlines()]
    assert said[0]["interrupted"] is True, (rest, err)
    # The second Ctrl-C returned at once, not when the engine was done.
    assert said[0]["at"] - second < 2.0, said[0]["at"] - second
    # Eight seconds later, the engine (which needed about five more) has
    # written nothing: it was ended, not left behind.
    assert said[1]["files"] == [], (said, err)
    assert user.returncode == 0, err


def test_an_interrupt_is_its_own_reason_in_the_certificate(tmp_path):
    spec = spec_folder(tmp_path, 12)
    spec.with_name("judge.jq").write_text('{decision: "yes"}\n')
    text = spec.read_text().replace(
        '[backends.default]\ntype = "scripted"\n',
        '[backends.default]\ntype = "scripted"\ndelay_ms = 150\n',
    )
    spec.write_text(text)
    calls = []

    def stop_at_the_second_call(event, *args):
        if event == "model_calls":
            calls.append(args[0])
            if args[0] >= 2:
                raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        fanfold.run(spec, store=tmp_path / "store.sqlite", out=tmp_path / "out", workers=1,
                    progress=stop_at_the_second_call)
    cert = json.loads((tmp_path / "out" / "certificate.json").read_text())
    assert cert["stop"] == {"reason": "interrupted"}, cert["stop"]
    assert any(why.startswith("interrupted") for why in cert["incomplete"]), cert["incomplete"]
    assert not any("wall_secs" in why for why in cert["incomplete"]), cert["incomplete"]
    answer = json.loads((tmp_path / "out" / "answer.json").read_text())
    assert answer["stop"] == {"reason": "interrupted"}


def test_the_accessor_refuses_rows_sharing_a_key_before_anything_runs(tmp_path):
    # The draft picks `id` from the first 256 KiB of the rows; the repeat
    # lies past them, so only a check over every row finds it.
    n = 8000
    ids = list(range(n))
    ids[-1] = 0
    df = pd.DataFrame({"id": ids, "body": [f"Raptor lost ticket {i} after the upgrade" for i in ids]})
    with pytest.raises(fanfold.InputError) as caught:
        df.fanfold.filter("Which tickets mention Raptor?", backend="scripted",
                          dir="asked", store="store.sqlite", progress=False)
    assert f"rows 0 and {n - 1} share the `id` '0'" in str(caught.value), str(caught.value)
    # Nothing ran: no output folder, no result.
    assert not Path("asked/out").exists()
    assert df.fanfold.result is None
    # A repeat the draft sees leaves it no key: refused before the run too.
    small = pd.DataFrame({"id": [1, 1, 2], "body": ["Raptor lost data"] * 3})
    with pytest.raises(fanfold.InputError, match="found no key"):
        small.fanfold.filter("Which tickets mention Raptor?", backend="scripted",
                             dir="small", store="store.sqlite", progress=False)
    assert not Path("small/out").exists()
