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
