"""``df.fanfold``: the engine on a pandas DataFrame, one micro-context per
row, with evidence, through the same engine call as :func:`fanfold.ask`.

    >>> df.fanfold.filter("Which tickets mention Raptor?", backend="scripted")
    >>> df.fanfold.extract("What do the tickets say?", schema={"urgent": "boolean"})
    >>> df.fanfold.ask("Which tickets mention Raptor?")   # a fanfold.Result

Each call drafts a spec folder as ``fanfold ask`` does (under
``.fanfold/ask`` unless ``dir`` is given) and runs it; the rows go to the
engine as JSON Lines, matched back by the key the draft chose (``id`` when
the rows have none: their position).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pandas as pd

import fanfold
from fanfold import FanfoldError, InputError, PathLike, ProgressArg, Result

#: The columns ``filter`` adds: the first evidence quote of the fact that
#: kept the row, its field and its character offsets in that field.
EVIDENCE_COLUMNS = ("evidence_field", "evidence_quote", "evidence_start", "evidence_end")

#: JSON types a field of ``extract``'s schema may be named by.
JSON_TYPES = ("string", "number", "integer", "boolean")


def _keyed(df: pd.DataFrame) -> Tuple[pd.DataFrame, bool]:
    """The rows as they go to the engine, and whether an ``id`` column
    (the row's position) was added so answers can be matched back."""
    records = fanfold._as_records_frame(df)
    if "id" in records.columns:
        return records, False
    keyed = records.copy()
    keyed.insert(0, "id", range(len(keyed)))
    return keyed, True


def _spec_key(spec: Path) -> str:
    key = (fanfold._read_toml(spec).get("input", {}).get("partition") or {}).get("key")
    if not key:
        raise InputError(
            f"{spec}: the draft found no key for the rows (an `id` column holding one "
            "distinct value per row), so answers cannot be matched back to them"
        )
    return key


def _check_key_column(records: pd.DataFrame, key: str) -> None:
    """Refuses rows whose ``key`` column is missing, holds an empty value,
    or holds one value twice (as the engine writes ids: as text), naming
    the first repeat: answers could not be matched back to the rows."""
    if key not in records.columns:
        raise InputError(f"the rows have no `{key}` column, the key answers are matched back by")
    seen: Dict[str, int] = {}
    for at, value in enumerate(records[key].tolist()):
        if value is None or (isinstance(value, float) and value != value):
            raise InputError(
                f"row {at} has no `{key}`: every row needs one, distinct, to match answers "
                "back to it"
            )
        text = str(value)
        if text in seen:
            raise InputError(
                f"rows {seen[text]} and {at} share the `{key}` {text!r}: each row needs its "
                "own, to match answers back to it; nothing was run"
            )
        seen[text] = at


def _row_positions(records: pd.DataFrame, key: str) -> Dict[str, int]:
    """Each unit id (the key's value as the engine writes it) -> row position."""
    positions: Dict[str, int] = {}
    for at, value in enumerate(records[key].tolist()):
        positions[str(value)] = at
    return positions


def _judge_facts(result: Result, stage: str = "judge") -> Dict[str, Dict[str, Any]]:
    """The judge's fact for each unit it decided, by unit id."""
    facts: Dict[str, Dict[str, Any]] = {}
    for fact in result._fact_rows():
        ids = fact.get("source_ids") or []
        if fact.get("stage") == stage and len(ids) == 1:
            facts[ids[0]] = fact
    return facts


def _evidence_of(item: Dict[str, Any]) -> Dict[str, Any]:
    evidence = item.get("evidence") or []
    first = evidence[0] if evidence else {}
    return {
        "evidence_field": first.get("field"),
        "evidence_quote": first.get("quote"),
        "evidence_start": first.get("start"),
        "evidence_end": first.get("end"),
    }


def _quoting_script(folder: Path) -> None:
    """Makes the draft's [SIMULATED] keyword judge quote evidence as a
    model would: a kept row's first evidence field, its first 200
    characters (the engine checks the quote against the row, verbatim)."""
    script = folder / "scripted.jq"
    schema = json.loads((folder / "decision.schema.json").read_text(encoding="utf-8"))
    try:
        fields = schema["properties"]["evidence"]["items"]["properties"]["field"]["enum"]
    except (KeyError, TypeError):
        return
    judge = _judge_expression(script)
    quotes = " // ".join(
        f"(.[{json.dumps(f, ensure_ascii=False)}] | select(type == \"string\" and length >= 4)"
        f" | {{field: {json.dumps(f, ensure_ascii=False)}, quote: .[0:200]}})"
        for f in fields
    )
    script.write_text(
        "# [SIMULATED] The keyword judge, quoting the start of the first text\n"
        "# field of a kept row as its evidence. Not a judgment.\n"
        f". as $row | ({judge}) as $a | $a + {{evidence: (if $a.decision == \"positive\" "
        f"then [$row | ({quotes} // empty)] else [] end)}}\n",
        encoding="utf-8",
    )


def _judge_expression(script: Path) -> str:
    """The draft's scripted judge: its last line, one jq object."""
    lines = [
        line
        for line in script.read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    if not lines:
        raise FanfoldError(f"{script}: the drafted scripted judge is empty")
    return lines[-1]


def _field_schema(name: str, kind: Any) -> Dict[str, Any]:
    if isinstance(kind, dict):
        return kind
    if kind in JSON_TYPES:
        return {"type": kind}
    if kind in (str, int, float, bool):
        return {"type": {str: "string", int: "integer", float: "number", bool: "boolean"}[kind]}
    raise InputError(
        f"schema field {name!r}: give a JSON type ({', '.join(JSON_TYPES)}), "
        f"a Python type (str, int, float, bool) or a JSON Schema dict, not {kind!r}"
    )


def _simulated_value(schema: Dict[str, Any]) -> str:
    """What the [SIMULATED] judge puts in a field of this schema: whether
    it kept the row (true/false, 1/0, or its decision word)."""
    kind = schema.get("type")
    if kind == "boolean":
        return '($a.decision == "positive")'
    if kind in ("integer", "number"):
        return '(if $a.decision == "positive" then 1 else 0 end)'
    return "$a.decision"


def _extracting_spec(folder: Path, question: str, fields: Dict[str, Dict[str, Any]]) -> None:
    """Turns the drafted spec into an extraction: every row to the judge
    (no keyword rung), the schema's fields required in its answer, the
    rubric asking for them, and the [SIMULATED] judge filling them."""
    spec = folder / "spec.toml"
    text = spec.read_text(encoding="utf-8")
    text = re.sub(r"\[\[prefilter\]\]\n(?:[^\n]+\n)*", "", text)
    # A question without keyword terms is drafted with an embedding rung
    # in front of the judge instead: it would leave rows undecided too.
    text = re.sub(r'\[\[stages\]\]\nname = "near_question"\n(?:[^\n]+\n)*', "", text)
    spec.write_text(text, encoding="utf-8")
    schema_path = folder / "decision.schema.json"
    schema = json.loads(schema_path.read_text(encoding="utf-8"))
    clash = sorted(set(fields) & set(schema.get("properties", {})))
    if clash:
        raise InputError(f"schema fields {', '.join(clash)} are the judge's own: rename them")
    schema.setdefault("properties", {}).update(fields)
    schema.setdefault("required", []).extend(fields)
    schema_path.write_text(json.dumps(schema, indent=2) + "\n", encoding="utf-8")
    rubric = folder / "rubric.md"
    asks = "\n".join(f"- `{name}`: {json.dumps(s, ensure_ascii=False)}" for name, s in fields.items())
    rubric.write_text(
        rubric.read_text(encoding="utf-8")
        + f"\n\nFor every record, also give these fields, read from the record, for: {question}\n"
        + asks
        + "\n",
        encoding="utf-8",
    )
    script = folder / "scripted.jq"
    judge = _judge_expression(script)
    values = ", ".join(f"{json.dumps(n, ensure_ascii=False)}: {_simulated_value(s)}" for n, s in fields.items())
    script.write_text(
        "# [SIMULATED] The keyword judge, filling each field with whether it\n"
        "# kept the record. Not an extraction.\n"
        f"({judge}) as $a | $a + {{{values}}}\n",
        encoding="utf-8",
    )


#: Where the last call's Result is kept on the frame.
_LAST_RESULT = "_fanfold_last_result"


@pd.api.extensions.register_dataframe_accessor("fanfold")
class FanfoldAccessor:
    """``df.fanfold``: ``filter``, ``extract`` and ``ask`` on the rows.

    Every method takes the keyword arguments of :func:`fanfold.ask`:
    ``dir``, ``store``, ``out``, ``backend``, ``workers``,
    ``max_model_calls``, ``strict``, ``progress``.
    """

    def __init__(self, df: pd.DataFrame):
        self._df = df

    @property
    def result(self) -> Optional[Result]:
        """The :class:`fanfold.Result` of the last call on this frame."""
        return getattr(self._df, _LAST_RESULT, None)

    def _run(
        self,
        question: str,
        prepare,
        *,
        dir: Optional[PathLike] = None,
        store: Optional[PathLike] = None,
        out: Optional[PathLike] = None,
        backend: Optional[str] = None,
        workers: Optional[int] = None,
        max_model_calls: Optional[int] = None,
        strict: bool = False,
        progress: ProgressArg = True,
    ) -> Tuple[Result, pd.DataFrame, Dict[str, int]]:
        records, _ = _keyed(self._df)
        store_path = fanfold._store_of(store)
        spec = fanfold._draft(records, question, dir, store_path)
        # The draft's key (chosen from a sample of the rows) is the one
        # answers come back by: checked over every row before the run.
        key = _spec_key(spec)
        _check_key_column(records, key)
        positions = _row_positions(records, key)
        prepare(spec.parent)
        result = fanfold._run_drafted(
            spec,
            store_path=store_path,
            out=out,
            backend=backend,
            workers=workers,
            max_model_calls=max_model_calls,
            strict=strict,
            progress=progress,
        )
        # pandas makes a new accessor at every `df.fanfold`: the result is
        # kept on the frame itself (not in `attrs`, which pandas copies on).
        object.__setattr__(self._df, _LAST_RESULT, result)
        return result, records, positions

    def ask(self, question: str, **options: Any) -> Result:
        """The question over the rows, as :func:`fanfold.ask`: a
        :class:`fanfold.Result`."""
        result, _, _ = self._run(question, lambda folder: None, **options)
        return result

    def filter(self, question: str, **options: Any) -> pd.DataFrame:
        """The rows the model keeps for ``question``, in their order and
        with their index, plus the first evidence quote of each:
        ``evidence_field``, ``evidence_quote``, ``evidence_start``,
        ``evidence_end`` (character offsets in that field, checked
        verbatim by the engine). The :class:`fanfold.Result` is
        ``df.fanfold.result``; an incomplete answer raises with
        ``strict=True``, else is said in ``attrs["fanfold_incomplete"]``."""
        result, _, positions = self._run(question, _quoting_script, **options)
        kept: List[Tuple[int, Dict[str, Any]]] = []
        for item in result._answer.get("items", []):
            at = positions.get(str(item["unit_id"]))
            if at is None:
                raise FanfoldError(f"the answer names unit {item['unit_id']!r}, which no row holds")
            kept.append((at, _evidence_of(item)))
        kept.sort(key=lambda pair: pair[0])
        rows = self._df.iloc[[at for at, _ in kept]].copy()
        for column in EVIDENCE_COLUMNS:
            rows[column] = [evidence[column] for _, evidence in kept]
        rows.attrs["fanfold_out"] = str(result.out)
        rows.attrs["fanfold_incomplete"] = list(result.incomplete)
        return rows

    def extract(self, question: str, schema: Dict[str, Any], **options: Any) -> pd.DataFrame:
        """Every row with a column per field of ``schema`` (a dict of field
        name -> JSON type name, Python type or JSON Schema), each row read
        by the model in its own context: missing where the row was not
        decided (an error, a spent budget). The :class:`fanfold.Result` is
        ``df.fanfold.result``."""
        if not schema:
            raise InputError("extract needs a schema of at least one field")
        fields = {name: _field_schema(name, kind) for name, kind in schema.items()}
        clash = sorted(set(fields) & set(self._df.columns))
        if clash:
            raise InputError(f"schema fields {', '.join(map(str, clash))} are columns already")
        result, _, positions = self._run(
            question, lambda folder: _extracting_spec(folder, question, fields), **options
        )
        values: Dict[str, List[Any]] = {name: [None] * len(self._df) for name in fields}
        for unit, fact in _judge_facts(result).items():
            at = positions.get(str(unit))
            if at is None or fact.get("status") in ("error", "cancelled", "not_run"):
                continue
            said = fact.get("facts") or {}
            for name in fields:
                values[name][at] = said.get(name)
        rows = self._df.copy()
        for name, column in values.items():
            rows[name] = column
        rows.attrs["fanfold_out"] = str(result.out)
        rows.attrs["fanfold_incomplete"] = list(result.incomplete)
        return rows
