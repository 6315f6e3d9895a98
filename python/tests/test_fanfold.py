"""The fanfold package as a user meets it, installed in a fresh virtual
environment: ask and run on a DataFrame with the scripted backend
([SIMULATED] keyword judge), the same answer as the CLI, a rerun that pays
nothing, the engine's errors as exceptions, and an incomplete answer that
says so."""

import json
import os
import subprocess
from pathlib import Path

import pandas as pd
import pytest

import fanfold
from browser import visible_text

REPO = Path(__file__).resolve().parents[2]
CLI = Path(os.environ.get("FANFOLD_BIN", REPO / "target" / "release" / "fanfold"))
QUESTION = "Which tickets mention Raptor?"


def tickets(n=24):
    """n tickets, every fourth naming Raptor (the question's code name)."""
    return pd.DataFrame(
        {
            "id": list(range(1, n + 1)),
            "title": [f"Ticket {i}" for i in range(1, n + 1)],
            "body": [
                "Raptor lost all our data after the upgrade"
                if i % 4 == 0
                else "The settings button is a shade too dark"
                for i in range(1, n + 1)
            ],
        }
    )


RAPTOR_IDS = sorted(str(i) for i in range(4, 25, 4))


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    """Each test in its own folder, so `.fanfold` (store, ask folders) is its own."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FANFOLD_STORE", raising=False)
    return tmp_path


def cli(*args):
    assert CLI.is_file(), f"the fanfold binary is not at {CLI}: build it (cargo build --release -p fanfold-cli) or set FANFOLD_BIN"
    return subprocess.run([str(CLI), *map(str, args)], capture_output=True, text=True)


def test_ask_on_a_dataframe_answers_with_the_units_that_name_the_term(tmp_path):
    res = fanfold.ask(tickets(), QUESTION, backend="scripted")
    assert res.complete and res.verified, res
    assert res.simulated
    assert "[SIMULATED]" in str(res) and "[SIMULATED]" in repr(res)
    answer = res.answer
    assert isinstance(answer, pd.DataFrame)
    assert sorted(answer["id"]) == RAPTOR_IDS
    assert set(answer["decision"]) == {"positive"}
    assert list(answer.columns)[:7] == ["id", "title", "decision", "field", "quote", "start", "end"]
    # Only the six rows the keyword rung keeps reach the judge.
    assert res.model_calls == 6, res.certificate["stats"]
    assert res.quality == "unmeasured"
    facts = res.facts
    assert isinstance(facts, pd.DataFrame)
    assert len(facts[facts["stage"] == "judge"]) == 6
    assert res.certificate["coverage"]["units"] == 24
    # The spec folder is where `fanfold ask` would put it, and the table
    # it read is beside the spec.
    assert res.out == Path(".fanfold/ask/which-tickets-mention-raptor/out")
    assert (res.out.parent / "spec.toml").is_file()
    assert (res.out.parent / "input.jsonl").read_text().count("\n") == 24


def test_the_answer_is_the_one_fanfold_run_gives_on_the_same_input(tmp_path):
    res = fanfold.ask(tickets(), QUESTION, backend="scripted")
    spec = res.out.parent / "spec.toml"
    o = cli(
        "run", spec, "--backend", "scripted",
        "--input", res.out.parent / "input.jsonl",
        "--store", tmp_path / "cli.sqlite",
        "--out", tmp_path / "cli-out",
    )
    assert o.returncode == 0, o.stderr
    assert "[SIMULATED]" in o.stdout
    cli_answer = json.loads((tmp_path / "cli-out" / "answer.json").read_text())
    cli_ids = sorted(i["unit_id"] for i in cli_answer["items"])
    assert cli_ids == sorted(res.answer["id"]) == RAPTOR_IDS
    # run() with a DataFrame as the spec's input gives the same ids.
    again = fanfold.run(spec, input=tickets(), backend="scripted", out="run-out")
    assert sorted(again.answer["id"]) == RAPTOR_IDS


def test_a_rerun_pays_for_no_model_call(tmp_path):
    first = fanfold.ask(tickets(), QUESTION, backend="scripted")
    assert first.model_calls == 6
    # Asked again (a new spec folder, the same store): every fact is cached.
    second = fanfold.ask(tickets(), QUESTION, backend="scripted")
    assert second.out != first.out
    assert second.certificate["stats"]["model_calls"] == 0, second.certificate["stats"]
    assert sorted(second.answer["id"]) == RAPTOR_IDS
    # And from the CLI on the same store.
    o = cli(
        "run", first.out.parent / "spec.toml", "--backend", "scripted",
        "--store", fanfold.DEFAULT_STORE, "--out", tmp_path / "cli-out",
    )
    assert o.returncode == 0, o.stderr
    cert = json.loads((tmp_path / "cli-out" / "certificate.json").read_text())
    assert cert["stats"]["model_calls"] == 0, cert["stats"]


def test_a_spec_error_raises_spec_error_with_the_engines_message(tmp_path):
    spec = tmp_path / "bad.toml"
    spec.write_text('name = "bad"\nquestion = "?"\nstages = "not a list"\n')
    with pytest.raises(fanfold.SpecError) as caught:
        fanfold.run(spec, input=[{"id": 1, "body": "x"}])
    err = caught.value
    assert isinstance(err, fanfold.FanfoldError)
    assert err.category == "spec" and err.exit_code == 2
    o = cli("run", spec, "--store", tmp_path / "cli.sqlite")
    assert o.returncode == 2
    assert str(err) and str(err) in o.stderr, (str(err), o.stderr)


def test_an_input_error_is_an_input_error(tmp_path):
    with pytest.raises(fanfold.InputError) as caught:
        fanfold.ask(tmp_path / "missing.jsonl", QUESTION, backend="scripted")
    assert "missing.jsonl" in str(caught.value)


def test_a_run_cut_short_by_its_budget_is_incomplete_and_says_so(tmp_path):
    res = fanfold.ask(tickets(), QUESTION, backend="scripted", max_model_calls=2)
    assert res.complete is False
    assert res.incomplete
    assert repr(res).startswith("<fanfold.Result INCOMPLETE")
    assert str(res).startswith("INCOMPLETE")
    assert res.model_calls <= 2
    with pytest.raises(fanfold.IncompleteAnswer) as caught:
        fanfold.ask(tickets(), QUESTION, backend="scripted", max_model_calls=0, strict=True,
                    dir="strict", store="other.sqlite")
    assert caught.value.result.complete is False
    assert caught.value.exit_code == 3


def test_a_list_of_dicts_is_an_input_too_and_the_html_is_the_report(tmp_path):
    rows = tickets(8).to_dict("records")
    res = fanfold.ask(rows, QUESTION, backend="scripted")
    assert sorted(res.answer["id"]) == ["4", "8"]
    page = res._repr_html_()
    assert page.lstrip().lower().startswith("<!doctype html") and QUESTION in page


def test_without_pandas_the_tables_are_lists_of_dicts(monkeypatch):
    monkeypatch.setattr(fanfold, "_pandas", lambda: None)
    res = fanfold.ask(tickets(8).to_dict("records"), QUESTION, backend="scripted")
    assert isinstance(res.answer, list) and isinstance(res.facts, list)
    assert sorted(row["id"] for row in res.answer) == ["4", "8"]
    assert {row["stage"] for row in res.facts} == {"judge"}


def test_ids_kept_in_the_index_reach_the_engine_and_a_record_that_is_not_json_is_refused(tmp_path):
    indexed = tickets(8).set_index("id")
    res = fanfold.ask(indexed, QUESTION, backend="scripted")
    assert sorted(res.answer["id"]) == ["4", "8"]
    rows = tickets(3).to_dict("records")
    rows[1]["score"] = float("nan")
    with pytest.raises(fanfold.InputError) as caught:
        fanfold.ask(rows, QUESTION, backend="scripted", dir="nan")
    assert "record 1" in str(caught.value)
    assert not (tmp_path / "nan" / "input.jsonl").exists()


# ---------------------------------------------------------------------------
# The DataFrame accessor: df.fanfold.filter / extract / ask, each row in a
# context of its own, through the same engine call as fanfold.ask.


def test_the_accessor_filters_the_rows_the_judge_keeps_with_their_evidence(tmp_path):
    df = tickets(12)
    kept = df.fanfold.filter(QUESTION, backend="scripted", progress=False)
    # The kept rows, in the frame's order, with their own index.
    assert kept["id"].tolist() == [4, 8, 12]
    assert kept.index.tolist() == [3, 7, 11]
    assert list(kept.columns) == list(df.columns) + [
        "evidence_field", "evidence_quote", "evidence_start", "evidence_end",
    ]
    # The [SIMULATED] judge quotes the start of the body; the engine checked
    # the quote against the row and gave its offsets.
    assert set(kept["evidence_field"]) == {"body"}
    assert kept["evidence_quote"].tolist() == kept["body"].tolist()
    assert set(kept["evidence_start"]) == {0}
    assert kept["evidence_end"].tolist() == [len(b) for b in kept["body"]]
    res = df.fanfold.result
    assert res.simulated and res.complete
    assert sorted(res.answer["id"]) == ["12", "4", "8"]
    assert kept.attrs["fanfold_out"] == str(res.out)


def test_the_accessor_matches_rows_without_an_id_column_by_position(tmp_path):
    df = tickets(8).drop(columns=["id"])
    df.index = [f"row-{i}" for i in range(8)]
    kept = df.fanfold.filter(QUESTION, backend="scripted", progress=False)
    assert kept.index.tolist() == ["row-3", "row-7"]
    assert kept["title"].tolist() == ["Ticket 4", "Ticket 8"]


def test_the_accessor_extracts_a_column_per_schema_field_from_every_row(tmp_path):
    df = tickets(8)
    got = df.fanfold.extract(
        QUESTION, schema={"mentions": "boolean", "hits": int, "verdict": "string"},
        backend="scripted", progress=False,
    )
    assert list(got.columns) == list(df.columns) + ["mentions", "hits", "verdict"]
    raptor = df["body"].str.contains("Raptor")
    # Every row went to the judge (no keyword rung), each in its own context.
    assert df.fanfold.result.model_calls == 8
    assert got["mentions"].tolist() == raptor.tolist()
    assert got["hits"].tolist() == [1 if r else 0 for r in raptor]
    assert got["verdict"].tolist() == ["positive" if r else "negative" for r in raptor]
    with pytest.raises(fanfold.InputError):
        df.fanfold.extract(QUESTION, schema={"body": "string"}, backend="scripted")
    with pytest.raises(fanfold.InputError):
        df.fanfold.extract(QUESTION, schema={"x": "a date"}, backend="scripted")


def test_extract_judges_every_row_when_the_question_names_no_keyword(tmp_path):
    # Without keyword terms the draft puts an embedding rung before the
    # judge; an extraction removes it, as it removes the keyword rule, so
    # no row is left without its fields.
    df = tickets(8)
    got = df.fanfold.extract(
        "Which ones matter most?", schema={"verdict": "string"},
        backend="scripted", progress=False,
    )
    assert df.fanfold.result.model_calls == 8
    assert got["verdict"].notna().all(), got


def test_the_accessor_asks_and_returns_a_result(tmp_path):
    res = tickets().fanfold.ask(QUESTION, backend="scripted", progress=False)
    assert isinstance(res, fanfold.Result)
    assert sorted(res.answer["id"]) == RAPTOR_IDS
    assert res.model_calls == 6


# ---------------------------------------------------------------------------
# Progress, Ctrl-C, and the GIL.


def slow_spec(tmp_path, n, delay_ms):
    """A drafted spec over n tickets that all name Raptor, whose [SIMULATED]
    judge takes delay_ms a call."""
    rows = pd.DataFrame(
        {"id": list(range(1, n + 1)), "body": [f"Raptor lost ticket {i}'s data" for i in range(n)]}
    )
    spec = fanfold._draft(rows, QUESTION, tmp_path / "slow", str(tmp_path / "store.sqlite"))
    text = spec.read_text()
    assert '[backends.scripted]\ntype = "scripted"\n' in text
    spec.write_text(text.replace(
        '[backends.scripted]\ntype = "scripted"\n',
        f'[backends.scripted]\ntype = "scripted"\ndelay_ms = {delay_ms}\n',
    ))
    return spec


def test_progress_hands_on_the_engines_events_and_is_drawn_unless_turned_off(tmp_path, capfd):
    events = []
    res = fanfold.ask(tickets(), QUESTION, backend="scripted", progress=lambda *e: events.append(e))
    assert events[0] == ("stage_started", "judge", 6, 0)
    assert events[-1] == ("stage_finished", "judge")
    finished = [e for e in events if e[0] == "unit_finished"]
    assert len(finished) == 6 and {e[2] for e in finished} == {"positive"}
    calls = [e[1] for e in events if e[0] == "model_calls"]
    assert calls and calls[-1] == res.model_calls == 6
    capfd.readouterr()
    # The default bar (tqdm when installed, else a line on stderr).
    fanfold.ask(tickets(), QUESTION, backend="scripted", dir="again", store="b.sqlite")
    err = capfd.readouterr().err
    assert "judge" in err and "6/6" in err, err
    fanfold.ask(tickets(), QUESTION, backend="scripted", dir="quiet", store="c.sqlite",
                progress=False)
    assert capfd.readouterr().err == ""


def test_a_failing_progress_callback_stops_the_run_and_raises(tmp_path):
    spec = slow_spec(tmp_path, 20, 100)

    def fail(*event):
        if event[0] == "model_calls" and event[1] >= 2:
            raise RuntimeError("the bar broke")

    with pytest.raises(RuntimeError, match="the bar broke"):
        fanfold.run(spec, backend="scripted", store=tmp_path / "store.sqlite", workers=1,
                    out=tmp_path / "out", progress=fail)
    # The engine stopped rather than judging all 20 (2 s at 100 ms a call).
    cert = json.loads((tmp_path / "out" / "certificate.json").read_text())
    assert cert["stats"]["model_calls"] < 20, cert["stats"]


def test_the_engine_runs_with_the_gil_released(tmp_path):
    import threading
    import time

    spec = slow_spec(tmp_path, 8, 100)
    ticks = 0
    stop = threading.Event()

    def tick():
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            time.sleep(0.005)

    thread = threading.Thread(target=tick)
    thread.start()
    started = time.monotonic()
    try:
        res = fanfold.run(spec, backend="scripted", store=tmp_path / "store.sqlite",
                          workers=1, progress=False)
    finally:
        stop.set()
        thread.join()
    took = time.monotonic() - started
    assert res.model_calls == 8 and took >= 0.8
    # Had the run held the GIL, the ticking thread could not have run.
    assert ticks >= took / 0.005 / 4, (ticks, took)


CHILD = r"""
import json, sys, time
import fanfold
calls = 0
def progress(*event):
    global calls
    if event[0] == "model_calls":
        calls = event[1]
        print("calls", calls, flush=True)
spec, store, out = sys.argv[1:4]
try:
    fanfold.run(spec, backend="scripted", store=store, out=out, workers=1, progress=progress)
    print(json.dumps({"interrupted": False}), flush=True)
except KeyboardInterrupt:
    print(json.dumps({"interrupted": True, "at": time.monotonic()}), flush=True)
"""


def test_ctrl_c_stops_the_engine_and_a_rerun_pays_only_for_the_rest(tmp_path):
    import signal
    import sys
    import time

    n = 40
    spec = slow_spec(tmp_path, n, 150)
    store = tmp_path / "store.sqlite"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(spec), str(store), str(tmp_path / "cut")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    for line in child.stdout:
        if line.startswith("calls") and int(line.split()[1]) >= 4:
            break
    sent = time.monotonic()
    child.send_signal(signal.SIGINT)
    rest, err = child.communicate(timeout=60)
    said = json.loads(rest.strip().splitlines()[-1])
    assert said["interrupted"] is True, (rest, err)
    # The engine stopped within a call or two of the signal, far sooner
    # than the 6 s the remaining 36 calls take at 150 ms each.
    assert said["at"] - sent < 2.0, said["at"] - sent
    assert child.returncode == 0, err
    cut = json.loads((tmp_path / "cut" / "certificate.json").read_text())
    done = cut["stats"]["model_calls"]
    assert 4 <= done < n, cut["stats"]
    # A rerun on the same store pays for the units the first did not
    # reach, and nothing twice.
    again = fanfold.run(spec, backend="scripted", store=store, out=tmp_path / "again",
                        workers=8, progress=False)
    assert again.complete, again.incomplete
    assert again.model_calls == n - done, (again.model_calls, done)
    assert len(again.answer) == n


# ---------------------------------------------------------------------------
# Labels for a cascade's oracle from a column.

CASCADE_SPEC = """name = "flagged"
question = "Which records are flagged?"

[input]
path = "input.jsonl"
partition = { type = "jsonl", key = "id" }

[[stages]]
name = "lex"
type = "bm25"
version = 1
query = "disk failure crash"
threshold = -1
then = "judge"

[[stages]]
name = "judge"
type = "map"
version = 1
rubric = "rubric.md"
output_schema = "schema.json"
decision = { pointer = "/decision", positive = ["yes"], negative = ["no"] }
cascade = { proxy = "lex", target = "recall", at_least = 0.9, delta = 0.1, label_budget = 60, labels = "labels.jsonl" }

[backends.default]
type = "scripted"
script = "judge.jq"

[[fold.reducers]]
name = "flagged"
type = "set"

[contract]
type = "exhaustive"
answer = "flagged"
"""


def cascade_folder(tmp_path):
    folder = tmp_path / "cascade"
    folder.mkdir()
    (folder / "spec.toml").write_text(CASCADE_SPEC)
    (folder / "rubric.md").write_text("Say yes when the record is flagged.\n")
    (folder / "schema.json").write_text(
        '{"type": "object", "required": ["decision"], '
        '"properties": {"decision": {"enum": ["yes", "no"]}}}'
    )
    # [SIMULATED] The judge never says yes: what the answer holds beyond the
    # proxy's own comes from the labels.
    (folder / "judge.jq").write_text('{decision: "no"}\n')
    return folder


def test_labels_from_a_column_are_the_cascades_oracle(tmp_path):
    folder = cascade_folder(tmp_path)
    n = 30
    df = pd.DataFrame({
        "id": [100 + i for i in range(n)],
        "title": [f"disk failure crash on node {i}" if i % 3 == 0 else f"all quiet on node {i}"
                  for i in range(n)],
    })
    df.index = [f"r{i}" for i in range(n)]
    df["label"] = ["yes" if i % 3 == 0 else "no" for i in range(n)]
    labels = df["label"].copy()
    labels.iloc[1] = None  # a row nobody labelled
    res = fanfold.run(folder / "spec.toml", input=df, labels=labels, backend="default",
                      store=tmp_path / "store.sqlite", out=tmp_path / "out", progress=False)
    written = [json.loads(line) for line in (folder / "labels.jsonl").read_text().splitlines()]
    assert len(written) == n - 1
    assert written[0] == {"id": "100", "decision": "yes"}
    assert {"id": "101", "decision": "no"} not in written
    assert {"id": "102", "decision": "no"} in written
    # The oracle read them: every flagged record is in the answer, though
    # the judge said no to all.
    assert res.complete, res.incomplete
    flagged = sorted(str(100 + i) for i in range(0, n, 3))
    assert sorted(res.answer["id"]) == flagged, res.markdown
    assert res.model_calls == 0, res.certificate["stats"]
    with pytest.raises(fanfold.SpecError):
        fanfold.run(folder / "spec.toml", input=df, labels={"lex": labels},
                    store=tmp_path / "store.sqlite", progress=False)


def test_labels_are_never_written_outside_the_specs_folder_or_over_its_input(tmp_path):
    folder = cascade_folder(tmp_path)
    df = pd.DataFrame({"id": [1, 2], "title": ["disk failure crash", "quiet"]})
    labels = pd.Series(["yes", "no"])
    outside = tmp_path / "elsewhere.jsonl"
    outside.write_text("kept\n")
    for target in ["../elsewhere.jsonl", str(outside), "input.jsonl", "spec.toml"]:
        (folder / "spec.toml").write_text(
            CASCADE_SPEC.replace('labels = "labels.jsonl"', f"labels = {json.dumps(target)}")
        )
        with pytest.raises(fanfold.SpecError):
            fanfold.run(folder / "spec.toml", input=df, labels=labels,
                        store=tmp_path / "store.sqlite", progress=False)
    assert outside.read_text() == "kept\n"
    assert not (folder / "labels.jsonl").exists()


# ---------------------------------------------------------------------------
# The report in Jupyter, as a person sees it.


def test_the_html_report_says_first_that_an_incomplete_answer_is_incomplete(tmp_path):
    cut = fanfold.ask(tickets(), QUESTION, backend="scripted", max_model_calls=2, progress=False)
    assert not cut.complete
    text = visible_text(cut._repr_html_(), tmp_path / "cut")
    assert text.startswith("INCOMPLETE: this answer is not whole"), text[:300]
    assert cut.incomplete[0] in text[:400]
    assert QUESTION in text
    whole = fanfold.ask(tickets(), QUESTION, backend="scripted", dir="whole", progress=False)
    text = visible_text(whole._repr_html_(), tmp_path / "whole")
    assert QUESTION in text and "INCOMPLETE" not in text, text[:300]
    for unit in RAPTOR_IDS:
        assert unit in text
