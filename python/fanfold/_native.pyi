"""Type stubs of the native half (the engine, through PyO3)."""

from typing import Any, Callable, Optional

EXIT_INCOMPLETE: int

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
    is raised."""

def draft(dir: str, question: str, input: str, store: str) -> str:
    """Drafts a spec folder as ``fanfold ask`` does; returns JSON."""

def free_folder(base: str, question: str) -> str:
    """The folder ``fanfold ask`` would write into."""

def report_html(out: str) -> str:
    """The HTML report of the run in ``out``."""
