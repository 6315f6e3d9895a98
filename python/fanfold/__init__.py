"""fanfold: ask questions of large, record-shaped data with language models.

One bounded model context per record, typed results folded into an answer
with verbatim evidence, every fact cached in a content-keyed store, and a
certificate of what ran. This package calls the same engine as the
``fanfold`` command (its native half, ``fanfold._native``); nothing of the
engine is reimplemented here.

Tables cross into the engine through Arrow's C stream interface
(``__arrow_c_stream__``): a polars DataFrame, a pyarrow Table or
RecordBatchReader, or a pandas DataFrame when pyarrow is installed, is
written as the JSON Lines the engine reads by the native half, batch by
batch, with no Python loop over rows. A pandas DataFrame without pyarrow
is written in one vectorised ``to_json`` call.

    >>> import fanfold, pandas as pd
    >>> df = pd.DataFrame({"id": [1, 2], "body": ["Raptor lost data", "fine"]})
    >>> res = fanfold.ask(df, "Which tickets mention Raptor?", backend="scripted")
    >>> res.answer["id"].tolist()
    ['1']
"""

from __future__ import annotations

import collections
import hashlib
import html
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

from . import _native
from ._native import (
    BackendError,
    FanfoldError,
    IncompleteAnswer,
    InputError,
    SpecError,
    StoreError,
)

__all__ = [
    "ask",
    "run",
    "Result",
    "FanfoldError",
    "SpecError",
    "InputError",
    "StoreError",
    "BackendError",
    "IncompleteAnswer",
    "DEFAULT_STORE",
    "Progress",
]

# The engine's exceptions are made in the native module; they are this
# package's, and say so when printed.
for _error in (FanfoldError, SpecError, InputError, StoreError, BackendError, IncompleteAnswer):
    _error.__module__ = "fanfold"
del _error

#: The store a run uses when given none and ``FANFOLD_STORE`` is unset:
#: the same file ``fanfold run`` uses, so the CLI and Python share a cache.
DEFAULT_STORE = ".fanfold/store.sqlite"

#: Physical slots (units in flight at once) when ``workers`` is not given,
#: as the CLI's ``--slots`` default.
DEFAULT_WORKERS = 4

PathLike = Union[str, "os.PathLike[str]"]


def _pandas():
    """pandas when it is installed, else None: it is optional."""
    try:
        import pandas  # noqa: PLC0415

        return pandas
    except ImportError:
        return None


def _store_of(store: Optional[PathLike]) -> str:
    """The store to use: the argument, else ``FANFOLD_STORE``, else the default."""
    if store is not None:
        return os.fspath(store)
    return os.environ.get("FANFOLD_STORE") or DEFAULT_STORE


def _is_table(data: Any) -> bool:
    """Whether ``data`` is a DataFrame-like table (pandas or anything with
    the same ``to_json``)."""
    return hasattr(data, "to_json") and hasattr(data, "columns")


def _table_bytes(data: Any) -> bytes:
    """``data`` (a DataFrame or a list of dicts) as JSON Lines."""
    if _is_table(data):
        # Ids a user keeps in the index are part of the record: a default
        # 0..n index is not.
        data = _as_records_frame(data)
        text = data.to_json(
            orient="records",
            lines=True,
            force_ascii=False,
            date_format="iso",
            double_precision=15,
        )
        return text.encode("utf-8")
    if isinstance(data, (list, tuple)):
        if not all(isinstance(row, dict) for row in data):
            raise InputError("a list given as input must hold dicts (one record each)")
        lines = []
        for at, row in enumerate(data):
            try:
                lines.append(json.dumps(row, allow_nan=False))
            except (TypeError, ValueError) as e:
                raise InputError(f"record {at} of the input list is not JSON: {e}") from e
        return "\n".join(lines).encode("utf-8") + b"\n"
    raise InputError(
        f"cannot read {type(data).__name__} as input: give a DataFrame, a list of dicts or a path"
    )


def _write_atomically(path: Path, body: bytes) -> None:
    """Writes ``body`` to ``path`` through a temporary file beside it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".part")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(body)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _arrow_source(data: Any) -> Any:
    """What of ``data`` crosses through Arrow's C stream interface, or
    None when it cannot: a pandas DataFrame becomes a pyarrow Table (its
    index reset into the records as ``_as_records_frame`` does) when
    pyarrow is installed and can type every column; anything else that
    has ``__arrow_c_stream__`` (polars, pyarrow, DuckDB) crosses as it is."""
    pd = _pandas()
    if pd is not None and isinstance(data, pd.DataFrame):
        try:
            import pyarrow  # noqa: PLC0415
        except ImportError:
            return None
        try:
            return pyarrow.Table.from_pandas(_as_records_frame(data), preserve_index=False)
        except (pyarrow.ArrowException, ValueError, TypeError):
            # A column pyarrow cannot type (mixed objects, say) goes
            # through pandas's own JSON writer instead.
            return None
    if hasattr(data, "__arrow_c_stream__") and not isinstance(data, (str, bytes, os.PathLike)):
        if type(data).__module__.split(".")[0] == "polars" and hasattr(data, "with_columns"):
            import polars  # noqa: PLC0415

            # polars exports an all-null column as Arrow's Null type with a
            # buffer Arrow's importer refuses: as text it is null all the same.
            data = data.with_columns(polars.col(polars.Null).cast(polars.String))
        return data
    return None


def _write_table(data: Any, path: Path) -> str:
    """Writes the table ``data`` to ``path`` as JSON Lines, through a
    temporary file beside it, and returns the SHA-256 of what it wrote (hex).
    Through Arrow when ``data`` can cross so, else as ``_table_bytes``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pd = _pandas()
    if pd is not None and isinstance(data, pd.DataFrame):
        # Column names become JSON keys, as text: 0 and "0" would be one key
        # twice. (Arrow's tables are checked by the native half.)
        names = [str(c) for c in _as_records_frame(data).columns]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise InputError(
                f"the table has two columns named {twice[0]!r}; each record needs one of each"
            )
    table = _arrow_source(data)
    if table is None:
        body = _table_bytes(data)
        _write_atomically(path, body)
        return hashlib.sha256(body).hexdigest()
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".part")
    os.close(fd)
    try:
        digest = _native.table_jsonl(table, tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return digest


def _input_path(data: Any, folder: Path) -> str:
    """A path the engine reads ``data`` from. A path is taken as it is; a
    table is written as JSON Lines under ``folder``, named by its content,
    so the same rows give the same file and the file stays for ``fanfold
    verify`` to read back."""
    if isinstance(data, (str, os.PathLike)):
        return os.fspath(data)
    fd, incoming = tempfile.mkstemp(dir=_made(folder), prefix=".table-", suffix=".jsonl")
    os.close(fd)
    try:
        digest = _write_table(data, Path(incoming))
        path = folder / f"{digest[:16]}.jsonl"
        if path.exists():
            os.unlink(incoming)
        else:
            os.replace(incoming, path)
    except BaseException:
        if os.path.exists(incoming):
            os.unlink(incoming)
        raise
    return str(path)


def _made(folder: Path) -> Path:
    """``folder``, made if it is missing."""
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _inputs_folder(store: str) -> Path:
    """Where tables given as input are written: beside a store file, else
    under ``.fanfold``."""
    if "://" in store:
        return Path(".fanfold/inputs")
    return Path(store).parent / "inputs"


def _records(rows: List[Dict[str, Any]], columns: Sequence[str]):
    """Rows as a DataFrame when pandas is installed, else the list itself."""
    pd = _pandas()
    if pd is None:
        return rows
    return pd.DataFrame(rows, columns=list(columns))


def _read_toml(path: PathLike) -> Dict[str, Any]:
    """A spec file as a dict (``tomllib``, or ``tomli`` before Python 3.11)."""
    try:
        import tomllib as toml  # noqa: PLC0415
    except ImportError:  # pragma: no cover - Python < 3.11
        try:
            import tomli as toml  # type: ignore[no-redef]  # noqa: PLC0415
        except ImportError as e:
            raise FanfoldError(
                "reading a spec from Python needs tomllib (Python 3.11+) or tomli installed"
            ) from e
    with open(path, "rb") as f:
        return toml.load(f)


class Progress:
    """The engine's progress as a bar: ``tqdm`` when it is installed, else
    one line on stderr rewritten in place. Called with the engine's events,
    in order, by the thread that waits for the run:

    - ``("stage_started", stage, units, cached)``: a stage receives
      ``units``, of which ``cached`` are answered from the store;
    - ``("model_calls", calls)``: the model calls made so far;
    - ``("unit_finished", stage, status)``: one unit decided;
    - ``("stage_finished", stage)``.
    """

    #: How often the plain line is rewritten, at most.
    LINE_EVERY = 0.2

    def __init__(self, file=None):
        self.file = file if file is not None else sys.stderr
        self.total = 0
        self.done = 0
        self.calls = 0
        self.stage = ""
        self._bar = None
        self._drawn = 0.0
        self._line = False
        try:
            from tqdm.auto import tqdm  # noqa: PLC0415

            self._bar = tqdm(total=0, unit="unit", file=self.file, leave=True)
        except ImportError:
            self._bar = None

    def __call__(self, event: str, *args: Any) -> None:
        if event == "stage_started":
            stage, units, cached = args
            self.stage = stage
            self.total += int(units)
            self.done += int(cached)
        elif event == "model_calls":
            self.calls = int(args[0])
        elif event == "unit_finished":
            self.done += 1
        self._draw(force=event in ("stage_started", "stage_finished"))

    def _draw(self, force: bool) -> None:
        if self._bar is not None:
            self._bar.total = self.total
            self._bar.n = self.done
            self._bar.set_description(self.stage, refresh=False)
            self._bar.set_postfix_str(f"{self.calls} model calls", refresh=False)
            self._bar.refresh()
            return
        now = time.monotonic()
        if not force and now - self._drawn < self.LINE_EVERY:
            return
        self._drawn = now
        self._line = True
        self.file.write(
            f"\rfanfold: {self.stage} {self.done}/{self.total} units, {self.calls} model calls"
        )
        self.file.flush()

    def close(self) -> None:
        """Ends the bar (the plain line with a newline)."""
        if self._bar is not None:
            self._bar.close()
        elif self._line:
            self._draw(force=True)
            self.file.write("\n")
            self.file.flush()


ProgressArg = Union[bool, Callable[..., Any]]


def _call_engine(spec: str, progress: ProgressArg, **options: Any) -> str:
    """The engine's run of ``spec`` with ``progress``: ``True`` draws a
    :class:`Progress` bar, ``False`` nothing, a callable receives the
    events itself. The engine runs in a process of its own
    (:func:`_run_isolated`)."""
    if progress is True:
        bar = Progress()
        try:
            return _run_isolated(spec, bar, options)
        finally:
            bar.close()
    return _run_isolated(spec, progress or None, options)


#: The engine's process: imports nothing from the working folder (``-c``
#: would put it first on the path), stops as Ctrl-C stops it if the
#: caller's process goes away, loads the native module from its file (not
#: the package, so pandas is not imported again), makes a runaway jq
#: program end this process rather than the caller's interpreter, runs the
#: request read from stdin (never the command line, which every local user
#: can read: a store's address may hold a password), and says what
#: happened as JSON lines on the descriptor that was stdout (stdout itself
#: then goes to stderr, so nothing else can mix in).
_ENGINE_PROCESS = r"""
import sys
sys.path[:] = [p for p in sys.path if p not in ("", ".")]
import importlib.util, json, os, signal, threading, time
parent = int(sys.argv[2])
def watch_parent():
    while os.getppid() == parent:
        time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGINT)
threading.Thread(target=watch_parent, daemon=True).start()
request = json.loads(sys.stdin.read())
channel = os.fdopen(os.dup(1), "w", encoding="utf-8")
os.dup2(2, 1)
def say(message):
    channel.write(json.dumps(message) + "\n")
    channel.flush()
try:
    found = importlib.util.spec_from_file_location("fanfold._native", sys.argv[1])
    native = importlib.util.module_from_spec(found)
    found.loader.exec_module(native)
    native.end_process_on_runaway()
    progress = (lambda *event: say({"event": list(event)})) if request["progress"] else None
    summary = native.run(request["spec"], progress=progress, **request["options"])
    say({"summary": summary})
except KeyboardInterrupt:
    say({"interrupted": True})
except BaseException as e:
    say({"error": {"class": type(e).__name__, "message": str(e),
                   "category": getattr(e, "category", None),
                   "exit_code": getattr(e, "exit_code", None)}})
"""

#: The exceptions the engine's process may report, by class name.
_ERRORS = {
    cls.__name__: cls
    for cls in (FanfoldError, SpecError, InputError, StoreError, BackendError, IncompleteAnswer)
}


def _relay(stream, tail: "collections.deque[str]") -> None:
    """Copies the engine process's stderr to this one's, keeping its last
    lines for the message of a process that ended without an answer."""
    for raw in iter(stream.readline, b""):
        line = raw.decode("utf-8", errors="replace")
        tail.append(line)
        try:
            sys.stderr.write(line)
            sys.stderr.flush()
        except (OSError, ValueError):
            pass


def _run_isolated(spec: str, progress: Optional[Callable[..., Any]], options: Dict[str, Any]) -> str:
    """Runs the engine on ``spec`` in a process of its own and returns its
    JSON summary, handing ``progress`` each of its events.

    jaq cannot stop an evaluation inside a process, so a jq program that
    runs away (past its time or memory limit) ends the process it runs
    in: here that is the engine's process, never this interpreter, and
    :class:`InputError` names the program. Ctrl-C tells the engine to stop
    (SIGINT to its process: no call is sent after it, calls in flight are
    cancelled) and waits for it to store what it decided and write its
    outputs, then raises ``KeyboardInterrupt``. A second Ctrl-C ends the
    engine's process at once, as a kill does (the store stays consistent,
    and a rerun resumes), and waits for it to be gone, so nothing writes
    the output folder after this returns. An exception from ``progress``
    stops the engine the same way and is raised once it has ended."""
    if os.name != "posix" or not sys.executable:
        # No process group to signal: the engine runs in this process.
        return _native.run(spec, progress=progress, **options)
    request = json.dumps({"spec": spec, "options": options, "progress": progress is not None})
    child = subprocess.Popen(
        # -I: no PYTHON* variable, user site or working folder reaches it;
        # -S: no site-packages either (it needs the standard library only),
        # and it starts sooner.
        [sys.executable, "-I", "-S", "-c", _ENGINE_PROCESS, _native.__file__, str(os.getpid())],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        # Its own session: a terminal's Ctrl-C reaches this process only,
        # which tells the engine once.
        start_new_session=True,
    )
    try:
        child.stdin.write(request.encode("utf-8"))
        child.stdin.close()
    except OSError:
        # The process ended before reading it: what it said tells why.
        pass
    tail: "collections.deque[str]" = collections.deque(maxlen=200)
    relay = threading.Thread(target=_relay, args=(child.stderr, tail), daemon=True)
    relay.start()
    outcome: Optional[Dict[str, Any]] = None
    # What to raise once the engine has ended: a signal, or the progress
    # callback's own exception.
    pending: Optional[BaseException] = None
    interrupted = False
    try:
        while True:
            try:
                line = child.stdout.readline()
                if not line:
                    break
                try:
                    message = json.loads(line)
                except ValueError:
                    continue
                if "event" not in message:
                    outcome = message
                elif progress is not None and pending is None:
                    try:
                        progress(*message["event"])
                    except Exception as e:  # noqa: BLE001 - raised once the engine stopped
                        pending = e
                        _tell_to_stop(child)
            except KeyboardInterrupt as interrupt:
                if interrupted:
                    # Ctrl-C again: end the engine now, and be sure it is
                    # gone before returning.
                    child.kill()
                    child.wait()
                    raise
                interrupted = True
                pending = pending or interrupt
                _tell_to_stop(child)
        code = child.wait()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        relay.join(timeout=5)
        child.stdout.close()
    if pending is not None:
        raise pending
    if outcome is not None and "summary" in outcome:
        return outcome["summary"]
    if outcome is not None and outcome.get("interrupted"):
        raise KeyboardInterrupt
    if outcome is not None and "error" in outcome:
        said = outcome["error"]
        cls = _ERRORS.get(said.get("class"), FanfoldError)
        if said.get("class") == "KeyboardInterrupt":
            raise KeyboardInterrupt
        err = cls(said.get("message", ""))
        err.category = said.get("category") or "execution"
        err.exit_code = said.get("exit_code") or 2
        raise err
    mark = _native.RUNAWAY_MARK
    runaway = [line[len(mark):].strip() for line in tail if line.startswith(mark)]
    if runaway:
        err = InputError(runaway[-1])
        err.category = "input"
        err.exit_code = code
        raise err
    err = FanfoldError(
        f"the engine's process ended with status {code} and no answer: "
        + "".join(tail).strip()[-2000:]
    )
    err.category = "execution"
    err.exit_code = 2
    raise err


def _tell_to_stop(child: "subprocess.Popen[bytes]") -> None:
    """Asks the engine's process to stop, as Ctrl-C does in a terminal."""
    try:
        child.send_signal(signal.SIGINT)
    except ProcessLookupError:
        pass


def _as_records_frame(data: Any) -> Any:
    """The table as it crosses into the engine: a named or non-default
    index is reset into the records (so ids kept there reach it)."""
    index = getattr(data, "index", None)
    plain = index is None or (
        all(name is None for name in getattr(index, "names", [None]))
        and type(index).__name__ == "RangeIndex"
        and getattr(index, "start", 0) == 0
        and getattr(index, "step", 1) == 1
    )
    if not plain and hasattr(data, "reset_index"):
        return data.reset_index()
    return data


def _label_files(spec: Dict[str, Any], spec_dir: Path) -> Dict[str, Path]:
    """Each cascade stage's labels file, by stage, as the engine reads it
    (relative to the spec's folder)."""
    files = {}
    folder = spec_dir.resolve()
    inputs = {
        (folder / str(spec.get("input", {}).get("path", ""))).resolve(),
    }
    for stage in spec.get("stages", []):
        cascade = stage.get("cascade") if isinstance(stage, dict) else None
        if isinstance(cascade, dict) and cascade.get("labels"):
            name = stage.get("name", "")
            path = (folder / str(cascade["labels"])).resolve()
            # Labels are written only where the spec's own folder holds
            # them, never over the input or a file outside it: a shared
            # spec is data, not a grant to write anywhere.
            if folder not in path.parents:
                raise SpecError(
                    f"stage {name}: cascade.labels {cascade['labels']!r} is outside the "
                    f"spec's folder {folder}; labels from Python are written only inside it"
                )
            if path in inputs or path.suffix == ".toml":
                raise SpecError(
                    f"stage {name}: cascade.labels {cascade['labels']!r} names the input or a "
                    "spec; labels from Python are written only to a labels file of their own"
                )
            files[name] = path
    return files


def _write_labels(spec_path: PathLike, labels: Any, table: Any) -> List[Path]:
    """Writes ``labels`` where the spec's cascades read their labels files:
    one JSON line ``{"id": ..., "decision": ...}`` per labelled row, the id
    read from the row's key field. ``labels`` is a Series indexed like
    ``table``'s rows (the one cascade with a labels file), or a dict of
    them by stage. A row whose label is missing is left out (the oracle
    has no label for it). Returns the files written."""
    spec_path = Path(spec_path)
    spec = _read_toml(spec_path)
    files = _label_files(spec, spec_path.parent)
    if not files:
        raise SpecError(f"{spec_path}: no stage has a cascade with a labels file to write labels to")
    if isinstance(labels, dict):
        by_stage = labels
        unknown = sorted(set(by_stage) - set(files))
        if unknown:
            raise SpecError(
                f"{spec_path}: no cascade with a labels file in stage(s) {', '.join(unknown)}; "
                f"those with one: {', '.join(sorted(files))}"
            )
    elif len(files) == 1:
        by_stage = {next(iter(files)): labels}
    else:
        raise SpecError(
            f"{spec_path}: stages {', '.join(sorted(files))} each read a labels file: "
            "give labels as a dict by stage"
        )
    key = (spec.get("input", {}).get("partition") or {}).get("key")
    records = None if table is None else _as_records_frame(table)
    written = []
    for stage, series in by_stage.items():
        if not hasattr(series, "items"):
            raise InputError(f"labels for {stage} must be a Series (or a dict of id -> label)")
        lines = []
        for at, value in series.items():
            if value is None or (isinstance(value, float) and value != value):
                continue
            if records is None:
                unit = at
            else:
                if key is None:
                    raise SpecError(
                        f"{spec_path}: the partition declares no `key`, so rows cannot be "
                        "matched to labels"
                    )
                if key not in records.columns:
                    raise InputError(f"the input has no `{key}` column, the spec's key")
                try:
                    position = table.index.get_loc(at)
                except KeyError as e:
                    raise InputError(f"label for row {at!r}: the input has no such row") from e
                if not isinstance(position, int):
                    raise InputError(f"label for row {at!r}: the input's index repeats it")
                unit = records[key].iloc[position]
            if hasattr(unit, "item"):
                unit = unit.item()
            lines.append(json.dumps({"id": str(unit), "decision": str(value)}))
        path = files[stage]
        _write_atomically(path, ("\n".join(lines) + "\n").encode("utf-8"))
        written.append(path)
    return written


ANSWER_COLUMNS = ("id", "title", "decision", "field", "quote", "start", "end", "evidence")


class Result:
    """What a run answered, read from its output folder.

    Attributes:
        out: the output folder (answer.json, answer.md, facts.jsonl,
            certificate.json).
        complete: whether every unit the answer needs was decided.
        incomplete: why not, when it is not.
        verified: whether the run's own verification passed.
        simulated: whether the answers came from a scripted or replayed
            backend rather than a model ([SIMULATED]).
        quality: the proven quality lines, or ``"unmeasured"``.
        certificate: certificate.json as a dict.
        markdown: answer.md as the engine wrote it.
    """

    def __init__(self, summary: Dict[str, Any]):
        self.out = Path(summary["out"])
        self.complete: bool = bool(summary["complete"])
        self.incomplete: List[str] = list(summary["incomplete"])
        self.verified: bool = bool(summary["verified"])
        self.simulated: bool = bool(summary["simulated"])
        lines = summary["quality"]
        self.quality: str = "\n".join(lines) if lines else "unmeasured"
        self.markdown: str = summary["markdown"]
        self.exit_code: int = int(summary["exit_code"])
        with open(self.out / "answer.json", encoding="utf-8") as f:
            self._answer: Dict[str, Any] = json.load(f)
        with open(self.out / "certificate.json", encoding="utf-8") as f:
            self.certificate: Dict[str, Any] = json.load(f)
        self._facts: Optional[List[Dict[str, Any]]] = None

    def _fact_rows(self) -> List[Dict[str, Any]]:
        if self._facts is None:
            with open(self.out / "facts.jsonl", encoding="utf-8") as f:
                self._facts = [json.loads(line) for line in f if line.strip()]
        return self._facts

    @property
    def question(self) -> str:
        """The question the answer is to."""
        return self._answer.get("question", "")

    @property
    def model_calls(self) -> int:
        """The model calls this run paid for (cache hits are not calls)."""
        return int(self.certificate.get("stats", {}).get("model_calls", 0))

    @property
    def answer(self):
        """The answer's units, one row each, as answer.json holds them:
        ``id``, ``title``, ``decision`` (the deciding fact's), the first
        evidence quote's ``field``, ``quote``, ``start`` and ``end``, and
        every quote under ``evidence``. A DataFrame when pandas is
        installed, else a list of dicts."""
        decisions: Dict[str, Any] = {}
        for fact in self._fact_rows():
            ids = fact.get("source_ids") or []
            if len(ids) == 1 and fact.get("status") == "positive":
                decisions.setdefault(ids[0], fact.get("decision"))
        rows = []
        for item in self._answer.get("items", []):
            unit = item["unit_id"]
            evidence = item.get("evidence") or []
            first = evidence[0] if evidence else {}
            rows.append(
                {
                    "id": unit,
                    "title": item.get("title"),
                    "decision": item.get("fields", {}).get("decision", decisions.get(unit)),
                    "field": first.get("field"),
                    "quote": first.get("quote"),
                    "start": first.get("start"),
                    "end": first.get("end"),
                    "evidence": evidence,
                }
            )
        return _records(rows, ANSWER_COLUMNS)

    @property
    def facts(self):
        """Every fact of the run (facts.jsonl), one row each: a DataFrame
        when pandas is installed, else a list of dicts."""
        rows = self._fact_rows()
        columns: List[str] = []
        for row in rows:
            for key in row:
                if key not in columns:
                    columns.append(key)
        return _records(list(rows), columns)

    def _headline(self) -> str:
        sim = " [SIMULATED]" if self.simulated else ""
        n = len(self._answer.get("items", []))
        head = f"{n} units answer {self.question!r}{sim}; quality: {self.quality}; {self.out}"
        if not self.verified:
            head = "VERIFICATION FAILED: " + head
        if not self.complete:
            head = "INCOMPLETE (" + "; ".join(self.incomplete) + "): " + head
        return head

    def __repr__(self) -> str:
        return f"<fanfold.Result {self._headline()}>"

    def __str__(self) -> str:
        if self.complete:
            return self.markdown
        return "INCOMPLETE: " + "; ".join(self.incomplete) + "\n\n" + self.markdown

    def _incomplete_banner(self) -> str:
        """What is said before anything else when the answer is not whole."""
        if self.complete:
            return ""
        why = html.escape("; ".join(self.incomplete) or "not every unit was decided")
        return (
            '<div role="alert" style="border:2px solid #b00;padding:.5em;margin:.5em 0;'
            'color:#b00;font-weight:bold">'
            f"INCOMPLETE: this answer is not whole ({why}).</div>"
        )

    def _repr_html_(self) -> str:
        """The run's HTML report, as ``fanfold report run`` writes it, so
        Jupyter shows it; an incomplete answer says so first, above the
        report. A small table when the report cannot be made."""
        banner = self._incomplete_banner()
        try:
            page = _native.report_html(str(self.out))
        except FanfoldError:
            page = None
        if page is not None:
            if not banner:
                return page
            body = re.search(r"<body[^>]*>", page, flags=re.IGNORECASE)
            if body is None:
                return banner + page
            return page[: body.end()] + banner + page[body.end() :]
        head = html.escape(self._headline())
        cells = "".join(
            "<tr><td>{}</td><td>{}</td><td>{}</td></tr>".format(
                html.escape(str(i.get("unit_id"))),
                html.escape(str(i.get("title") or "")),
                html.escape(" | ".join(e.get("quote", "") for e in i.get("evidence") or [])),
            )
            for i in self._answer.get("items", [])
        )
        return (
            f"{banner}<p>{head}</p><table><tr><th>id</th><th>title</th><th>evidence</th></tr>"
            f"{cells}</table>"
        )


def _finish(summary_json: str, strict: bool) -> Result:
    result = Result(json.loads(summary_json))
    if strict and not result.complete:
        err = IncompleteAnswer("the answer is INCOMPLETE: " + "; ".join(result.incomplete))
        err.category = "incomplete"
        err.exit_code = _native.EXIT_INCOMPLETE
        err.result = result
        raise err
    return result


def run(
    spec: PathLike,
    input: Any = None,
    *,
    store: Optional[PathLike] = None,
    out: Optional[PathLike] = None,
    backend: Optional[str] = None,
    workers: Optional[int] = None,
    max_model_calls: Optional[int] = None,
    strict: bool = False,
    progress: ProgressArg = True,
    labels: Any = None,
) -> Result:
    """Run a TOML spec, as ``fanfold run SPEC`` does.

    Args:
        spec: the spec file.
        input: overrides the spec's input: a path, a pandas DataFrame or a
            list of dicts (written as JSON Lines, so the spec's partition
            must read ``jsonl``).
        store: the store (an SQLite file or a ``postgres://`` address);
            ``FANFOLD_STORE``, else ``.fanfold/store.sqlite``, as the CLI.
        out: the output folder; ``.fanfold/runs/<spec name>`` by default.
        backend: send every stage to this backend of the spec.
        workers: units in flight at once (the CLI's ``--slots``; 4 by
            default). The engine runs in this process.
        max_model_calls: overrides the spec's budget of model calls.
        strict: raise :class:`IncompleteAnswer` when the answer is
            incomplete, rather than returning it with ``complete`` False.
        progress: ``True`` (the default) draws a bar of the units decided
            (:class:`Progress`: tqdm when installed, else a line on
            stderr); ``False`` draws nothing; a callable receives the
            engine's events itself.
        labels: a cascade's oracle labels: a Series indexed like
            ``input``'s rows (a label per row, missing for a row not
            labelled), or a dict of them by stage. Written, one JSON line
            ``{"id", "decision"}`` per row, over the labels file the
            spec's cascade names, the id read from the row's key field.
            When ``input`` is not a DataFrame, the Series' index holds
            the unit ids themselves.

    Returns:
        The :class:`Result`.

    Raises:
        SpecError, InputError, StoreError, BackendError, FanfoldError: with
        the engine's message, ``category`` and ``exit_code``.
        KeyboardInterrupt: on Ctrl-C. The engine is told to stop (no model
        call is sent after it, calls in flight are cancelled; it is seen
        while the input is stored and routed too, and between embedding
        batches) and waited for, so what it decided is stored: a rerun on
        the same store pays only for the rest. A second Ctrl-C ends the
        engine's process at once, as a kill does, and returns once it is
        gone: nothing writes the output folder afterwards.

    The engine runs in a process of its own, so a jq program of the spec
    that runs away (past its time or memory limit; jq cannot be stopped
    inside a process) ends that process, never this interpreter, and
    raises :class:`InputError` naming the program.
    """
    store_path = _store_of(store)
    if labels is not None:
        _write_labels(spec, labels, input if _is_table(input) else None)
    source = None if input is None else _input_path(input, _inputs_folder(store_path))
    summary = _call_engine(
        os.fspath(spec),
        progress,
        store=store_path,
        out=None if out is None else os.fspath(out),
        input=source,
        backend=backend,
        slots=DEFAULT_WORKERS if workers is None else int(workers),
        max_model_calls=max_model_calls,
    )
    return _finish(summary, strict)


def _draft(data: Any, question: str, dir: Optional[PathLike], store_path: str) -> Path:
    """Drafts the spec folder ``fanfold ask`` would (``data`` written
    beside it when it is a table) and returns the spec's path."""
    folder = Path(_native.free_folder(".fanfold/ask", question) if dir is None else dir)
    if isinstance(data, (str, os.PathLike)):
        source = os.fspath(data)
    else:
        source = str(folder / "input.jsonl")
        for taken in ("spec.toml", "input.jsonl"):
            if (folder / taken).exists():
                raise InputError(
                    f"{folder / taken} exists: refusing to overwrite it; choose another folder"
                )
        _write_table(data, Path(source))
    try:
        written = json.loads(_native.draft(str(folder), question, source, store_path))
    except BaseException:
        # The input written for a draft that failed is removed with it, so
        # the same question can be asked again in the same folder.
        if not isinstance(data, (str, os.PathLike)):
            Path(source).unlink(missing_ok=True)
        raise
    return Path(written["spec"])


def _run_drafted(
    spec: Path,
    *,
    store_path: str,
    out: Optional[PathLike],
    backend: Optional[str],
    workers: Optional[int],
    max_model_calls: Optional[int],
    strict: bool,
    progress: ProgressArg,
) -> Result:
    """Runs a drafted spec as ``fanfold ask`` does (its out folder beside it)."""
    summary = _call_engine(
        str(spec),
        progress,
        store=store_path,
        out=os.fspath(out) if out is not None else str(spec.parent / "out"),
        input=None,
        backend=backend or "default",
        slots=DEFAULT_WORKERS if workers is None else int(workers),
        max_model_calls=max_model_calls,
    )
    return _finish(summary, strict)


def ask(
    data: Any,
    question: str,
    *,
    dir: Optional[PathLike] = None,
    store: Optional[PathLike] = None,
    out: Optional[PathLike] = None,
    backend: Optional[str] = None,
    workers: Optional[int] = None,
    max_model_calls: Optional[int] = None,
    strict: bool = False,
    progress: ProgressArg = True,
) -> Result:
    """Ask a question of ``data`` in one call, as ``fanfold ask`` does:
    draft a spec folder from the question and the data (a rubric, a
    decision schema with evidence, a cheap first rung), then run it.

    Args:
        data: a pandas or polars DataFrame, a pyarrow Table or
            RecordBatchReader (anything with ``__arrow_c_stream__``), a list
            of dicts, or a path (a JSON array, JSON lines, CSV, text,
            e-mail, Markdown, or a folder of them).
        question: the question, in words.
        dir: where the spec folder goes; ``.fanfold/ask/<name>`` by default
            (numbered past folders that hold a spec). Edit its spec and
            ``fanfold run`` it to refine.
        store, out, workers, max_model_calls, strict, progress: as
            :func:`run`; ``out`` is ``<dir>/out`` by default.
        backend: the spec's backend to run on: ``"default"`` (the embedded
            model, the default) or ``"scripted"`` (a [SIMULATED] keyword
            judge).

    Returns:
        The :class:`Result`; its ``out`` folder's parent holds the spec.
    """
    store_path = _store_of(store)
    spec = _draft(data, question, dir, store_path)
    return _run_drafted(
        spec,
        store_path=store_path,
        out=out,
        backend=backend,
        workers=workers,
        max_model_calls=max_model_calls,
        strict=strict,
        progress=progress,
    )


# The DataFrame accessor (``df.fanfold``), registered when pandas is
# installed.
if _pandas() is not None:
    from . import _accessor  # noqa: E402,F401
