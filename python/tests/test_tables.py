"""Tables crossing into the engine: polars, pyarrow and pandas through
Arrow's C stream interface (written as JSON Lines by the native half, no
Python loop over rows), pandas without pyarrow through its own JSON
writer, and all of them giving the engine the same records."""

import builtins
import json
from pathlib import Path

import pandas as pd
import polars as pl
import pyarrow as pa
import pytest

import fanfold

QUESTION = "Which tickets mention Raptor?"


def frame(n=12):
    return pd.DataFrame(
        {
            "id": list(range(1, n + 1)),
            "body": [
                "Raptor lost all our data after the upgrade" if i % 4 == 0 else "The button is too dark"
                for i in range(1, n + 1)
            ],
            "score": [float(i) / 2 if i % 3 else None for i in range(1, n + 1)],
            "opened": pd.to_datetime(["2026-01-02T03:04:05"] * n),
            "closed": pd.to_datetime(["2026-01-02T03:04:05"] * n).tz_localize("Europe/Paris"),
        }
    )


KEPT = ["12", "4", "8"]


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FANFOLD_STORE", raising=False)


def records_read(res):
    """The records the engine read, from the input file beside the spec."""
    lines = (res.out.parent / "input.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines]


def test_polars_pyarrow_and_pandas_give_the_engine_the_same_records():
    df = frame()
    answers, inputs = {}, {}
    for name, data in {
        "pandas": df,
        "polars": pl.from_pandas(df),
        "pyarrow": pa.Table.from_pandas(df, preserve_index=False),
        "batches": pa.Table.from_pandas(df, preserve_index=False).to_reader(max_chunksize=5),
    }.items():
        res = fanfold.ask(data, QUESTION, backend="scripted", dir=name, progress=False)
        assert res.complete and res.verified, (name, res)
        answers[name] = sorted(res.answer["id"])
        inputs[name] = records_read(res)
    assert all(a == sorted(KEPT) for a in answers.values()), answers
    first = inputs["pandas"]
    assert len(first) == 12
    # Every record has every column; a missing value is written as null.
    assert first[2] == {"id": 3, "body": "The button is too dark", "score": None,
                        "opened": first[2]["opened"], "closed": first[2]["closed"]}
    assert first[2]["opened"].startswith("2026-01-02T03:04:05")
    # A timestamp in a named zone is written with its offset.
    assert first[2]["closed"] == "2026-01-02T03:04:05+01:00", first[2]["closed"]
    assert first[0]["score"] == 0.5
    for name, records in inputs.items():
        assert records == first, name


def test_the_same_rows_from_pandas_and_polars_share_their_facts():
    fanfold.ask(frame(), QUESTION, backend="scripted", dir="pandas", progress=False)
    again = fanfold.ask(pl.from_pandas(frame()), QUESTION, backend="scripted", dir="polars",
                        progress=False)
    assert again.model_calls == 0, again.certificate["stats"]
    assert sorted(again.answer["id"]) == sorted(KEPT)


def test_pandas_without_pyarrow_writes_the_same_records(monkeypatch):
    with_arrow = fanfold.ask(frame(), QUESTION, backend="scripted", dir="arrow", progress=False)
    real_import = builtins.__import__

    def no_pyarrow(name, *args, **kwargs):
        if name == "pyarrow" or name.startswith("pyarrow."):
            raise ImportError("no pyarrow here")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pyarrow)
    without = fanfold.ask(frame(), QUESTION, backend="scripted", dir="json", progress=False)
    assert sorted(without.answer["id"]) == sorted(with_arrow.answer["id"])
    plain, arrow = records_read(without), records_read(with_arrow)
    # pandas's own writer keeps ids, text and these short floats as Arrow
    # does; it rounds timestamps to milliseconds and spells zones in UTC,
    # so those records are not the same bytes (the README says so).
    assert [(r["id"], r["body"], r["score"]) for r in plain] == [
        (r["id"], r["body"], r["score"]) for r in arrow
    ]


def test_run_takes_a_polars_frame_as_the_specs_input():
    res = fanfold.ask(frame(), QUESTION, backend="scripted", dir="first", progress=False)
    again = fanfold.run(res.out.parent / "spec.toml", input=pl.from_pandas(frame()),
                        backend="scripted", out="run-out", progress=False)
    assert sorted(again.answer["id"]) == sorted(KEPT)
    assert again.model_calls == 0


def test_a_column_json_cannot_hold_is_an_input_error_and_leaves_no_file(tmp_path):
    union = pa.UnionArray.from_sparse(
        pa.array([0, 1, 0], type=pa.int8()),
        [pa.array([1, 2, 3]), pa.array(["a", "b", "c"])],
    )
    table = pa.table({"id": [1, 2, 3], "body": ["Raptor", "x", "y"], "odd": union})
    with pytest.raises(fanfold.InputError) as caught:
        fanfold.ask(table, QUESTION, backend="scripted", dir="odd", progress=False)
    assert "Union" in str(caught.value), caught.value
    assert not (tmp_path / "odd" / "input.jsonl").exists()
    assert not list((tmp_path / "odd").glob("*.part")) if (tmp_path / "odd").exists() else True


def test_repeated_column_names_and_bytes_are_refused_before_anything_runs(tmp_path):
    twice = pa.table([pa.array([1, 2]), pa.array(["Raptor", "x"]), pa.array(["a", "b"])],
                     names=["id", "body", "id"])
    with pytest.raises(fanfold.InputError, match=r"two columns named [\"']id[\"']"):
        fanfold.ask(twice, QUESTION, backend="scripted", dir="twice", progress=False)
    clash = pd.DataFrame([[1, "Raptor", "x"]], columns=[0, "body", "0"])
    with pytest.raises(fanfold.InputError, match="two columns named '0'"):
        fanfold.ask(clash, QUESTION, backend="scripted", dir="clash", progress=False)
    raw = pa.table({"id": [1], "body": pa.array([b"Raptor"], type=pa.binary())})
    with pytest.raises(fanfold.InputError, match="holds bytes"):
        fanfold.ask(raw, QUESTION, backend="scripted", dir="raw", progress=False)
    for name in ("twice", "clash", "raw"):
        assert not (tmp_path / name / "input.jsonl").exists()


def test_a_polars_column_with_only_nulls_crosses_as_nulls():
    df = pl.DataFrame({"id": [1, 2], "body": ["Raptor lost data", "fine"], "note": [None, None]})
    res = fanfold.ask(df, QUESTION, backend="scripted", dir="nulls", progress=False)
    assert sorted(res.answer["id"]) == ["1"]
    assert [r["note"] for r in records_read(res)] == [None, None]
