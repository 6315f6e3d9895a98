"""Type stubs of the fanfold package."""

import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

PathLike = Union[str, "os.PathLike[str]"]

DEFAULT_STORE: str
DEFAULT_WORKERS: int

class FanfoldError(Exception):
    """A fanfold run failed; ``category`` and ``exit_code`` as the engine says."""

    category: str
    exit_code: int

class SpecError(FanfoldError):
    """The spec cannot become a plan."""

class InputError(FanfoldError):
    """The input, or a jq expression applied to it, is at fault."""

class StoreError(FanfoldError):
    """The store failed; what it holds is kept."""

class BackendError(FanfoldError):
    """A backend or model could not be set up."""

class IncompleteAnswer(FanfoldError):
    """The answer is incomplete (raised with ``strict=True`` only)."""

    result: "Result"

class Result:
    """What a run answered, read from its output folder."""

    out: Path
    complete: bool
    incomplete: List[str]
    verified: bool
    simulated: bool
    quality: str
    markdown: str
    exit_code: int
    certificate: Dict[str, Any]
    @property
    def question(self) -> str: ...
    @property
    def model_calls(self) -> int: ...
    @property
    def answer(self) -> Any:
        """A pandas DataFrame (else a list of dicts): id, title, decision,
        field, quote, start, end, evidence."""
    @property
    def facts(self) -> Any:
        """Every fact, as a pandas DataFrame (else a list of dicts)."""
    def _repr_html_(self) -> str: ...

def run(
    spec: PathLike,
    input: Any = ...,
    *,
    store: Optional[PathLike] = ...,
    out: Optional[PathLike] = ...,
    backend: Optional[str] = ...,
    workers: Optional[int] = ...,
    max_model_calls: Optional[int] = ...,
    strict: bool = ...,
) -> Result:
    """Run a TOML spec, as ``fanfold run SPEC`` does."""

def ask(
    data: Any,
    question: str,
    *,
    dir: Optional[PathLike] = ...,
    store: Optional[PathLike] = ...,
    out: Optional[PathLike] = ...,
    backend: Optional[str] = ...,
    workers: Optional[int] = ...,
    max_model_calls: Optional[int] = ...,
    strict: bool = ...,
) -> Result:
    """Ask a question of ``data`` in one call, as ``fanfold ask`` does."""
