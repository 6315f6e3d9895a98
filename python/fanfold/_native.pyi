"""Type stubs of the native half (the engine, through PyO3)."""

from typing import Any, Callable, Optional

EXIT_INCOMPLETE: int
EXIT_INTERRUPTED: int
RUNAWAY_MARK: str

class FanfoldError(Exception):
    category: str
    exit_code: int

class SpecError(FanfoldError): ...
class InputError(FanfoldError): ...
class StoreError(FanfoldError): ...
class BackendError(FanfoldError): ...
class IncompleteAnswer(FanfoldError): ...

def run(
    spec: str,
    *,
    store: str,
    out: Optional[str] = ...,
    input: Optional[str] = ...,
    backend: Optional[str] = ...,
    slots: int = ...,
    max_model_calls: Optional[int] = ...,
    progress: Optional[Callable[..., Any]] = ...,
) -> str:
    """Runs a spec with the GIL released; returns a JSON summary (out,
    complete, incomplete, verified, simulated, quality, exit_code,
    markdown). ``progress`` is called, on the calling thread, with each
    engine event as positional arguments. On Ctrl-C (or when ``progress``
    raises) the engine is told to stop and waited for, then the exception
    is raised; a second Ctrl-C waits still, so nothing writes the output
    folder once this has returned."""

def draft(dir: str, question: str, input: str, store: str) -> str:
    """Drafts a spec folder as ``fanfold ask`` does; returns JSON."""

def free_folder(base: str, question: str) -> str:
    """The folder ``fanfold ask`` would write into."""

def report_html(out: str) -> str:
    """The HTML report of the run in ``out``."""

def end_process_on_runaway() -> None:
    """Makes a runaway jq evaluation end this process (exit status 5, one
    line on stderr starting with ``RUNAWAY_MARK``): for the process the
    package runs the engine in, never the caller's interpreter."""

def table_jsonl(table: Any, path: str) -> str:
    """Writes ``table`` (any object with ``__arrow_c_stream__``: pyarrow,
    polars, DuckDB) to ``path`` as JSON Lines, batch by batch with the GIL
    released, a null written as ``null``; returns the SHA-256 (hex) of the
    bytes written. A column JSON cannot hold is an ``InputError``."""
