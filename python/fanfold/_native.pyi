"""Type stubs of the native half (the engine, through PyO3)."""

from typing import Optional

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
) -> str:
    """Runs a spec; returns a JSON summary (out, complete, incomplete,
    verified, simulated, quality, exit_code, markdown)."""

def draft(dir: str, question: str, input: str, store: str) -> str:
    """Drafts a spec folder as ``fanfold ask`` does; returns JSON."""

def free_folder(base: str, question: str) -> str:
    """The folder ``fanfold ask`` would write into."""

def report_html(out: str) -> str:
    """The HTML report of the run in ``out``."""
