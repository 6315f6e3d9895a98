"""Type stubs of the fanfold package."""

import os
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

import pandas as pd

PathLike = Union[str, "os.PathLike[str]"]
#: ``True`` draws a bar, ``False`` nothing, a callable gets the events.
ProgressArg = Union[bool, Callable[..., Any]]

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
    def _repr_html_(self) -> str:
        """The run's HTML report; an incomplete answer says so first."""

class Progress:
    """The engine's progress as a bar (tqdm when installed, else a line on
    stderr). Called with ``("stage_started", stage, units, cached)``,
    ``("model_calls", calls)``, ``("unit_finished", stage, status)`` and
    ``("stage_finished", stage)``."""

    total: int
    done: int
    calls: int
    stage: str
    def __init__(self, file: Any = ...) -> None: ...
    def __call__(self, event: str, *args: Any) -> None: ...
    def close(self) -> None: ...

class FanfoldAccessor:
    """``df.fanfold``, registered when pandas is installed. Every method
    takes ``dir``, ``store``, ``out``, ``backend``, ``workers``,
    ``max_model_calls``, ``strict`` and ``progress`` as :func:`ask`."""

    result: Optional[Result]
    def __init__(self, df: pd.DataFrame) -> None: ...
    def filter(self, question: str, **options: Any) -> pd.DataFrame:
        """The rows the model keeps, with ``evidence_field``,
        ``evidence_quote``, ``evidence_start``, ``evidence_end``."""
    def extract(self, question: str, schema: Dict[str, Any], **options: Any) -> pd.DataFrame:
        """Every row with a column per schema field (JSON type name,
        Python type or JSON Schema), read from the row by the model."""
    def ask(self, question: str, **options: Any) -> Result:
        """The question over the rows, as :func:`ask`."""

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
    progress: ProgressArg = ...,
    labels: Any = ...,
) -> Result:
    """Run a TOML spec, as ``fanfold run SPEC`` does; ``labels`` (a Series
    indexed like ``input``'s rows, or a dict of them by stage) is written
    as the cascade's labels file. Ctrl-C stops the engine, waits for it,
    and raises ``KeyboardInterrupt``; a rerun pays only for the rest."""

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
    progress: ProgressArg = ...,
) -> Result:
    """Ask a question of ``data`` (a pandas or polars DataFrame, a pyarrow
    Table or RecordBatchReader, a list of dicts, or a path) in one call, as
    ``fanfold ask`` does."""
