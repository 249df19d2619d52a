"""Input data for the notebooks: the bundled sample, column checks, row ids and row-level rejects."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from importlib import resources
from pathlib import Path

import pandas as pd

#: Column the text pipeline adds: the stable id of each input row.
ROW_ID = "row_id"
#: Column the text pipeline adds: why a row was not sent to the model ("" when it was).
REJECT_REASON = "reject_reason"


def sample_customers_path() -> Path:
    """Path of the bundled sample: ~300 real organisations with their true industry."""
    return Path(str(resources.files("helpers") / "sample_data" / "customers.csv"))


def sample_size() -> int:
    """Rows in the bundled sample (whatever it holds now: a copied project may replace it)."""
    return len(pd.read_csv(sample_customers_path()))


def resolve_input_path(path: str | None) -> str:
    """Return what ``ray.data.read_*`` should read.

    ``None`` means the bundled sample; URLs and cloud URIs pass through (see :mod:`helpers.storage`);
    local paths (and ``file://`` URIs) become absolute (Ray workers do not share the notebook's
    working directory) and must exist. A relative path is relative to the working directory: where
    you ran the command (``scripts/run_notebooks.py`` runs notebooks there), or the notebook's
    folder in Jupyter.
    """
    from helpers import storage

    if path is None:
        return str(sample_customers_path())
    if storage.is_remote(path):
        return path
    local = Path(path.removeprefix("file://")).expanduser().resolve()
    if not local.exists():
        raise FileNotFoundError(f"INPUT_PATH={path!r} does not exist (resolved to {local})")
    return str(local)


def require_columns(available: Sequence[str], required: Iterable[str | None], what: str = "input") -> None:
    """Fail fast, naming the columns that do exist, when a required column is missing."""
    missing = [c for c in required if c is not None and c not in available]
    if missing:
        raise ValueError(
            f"The {what} has no column {', '.join(repr(m) for m in missing)}. "
            f"Columns it has: {', '.join(repr(a) for a in available)}."
        )


def _content_id(row: pd.Series) -> str:
    text = "\x1f".join("" if pd.isna(v) else str(v) for v in row.tolist())
    return hashlib.sha1(text.encode("utf-8")).hexdigest()[:16]


def reject_reason(value: object) -> str:
    """Why a text value cannot be sent to the model, or "" when it can."""
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return "missing value"
    if not isinstance(value, str):
        return ""  # numbers and the like are stringified by the prompt builder
    if not value.strip():
        return "empty value" if value == "" else "blank value (only whitespace)"
    return ""


def add_row_ids_and_rejects(batch: pd.DataFrame, text_column: str, id_column: str | None) -> pd.DataFrame:
    """Add ``row_id`` (from ``id_column``, or a hash of the row's content) and ``reject_reason``.

    Used with ``Dataset.map_batches(batch_format="pandas")``. A content hash is stable across
    runs, so checkpointing and joins work on any CSV; exact duplicate rows share an id.
    """
    out = batch.copy()
    if id_column is None:
        out[ROW_ID] = batch.apply(_content_id, axis=1)
    else:
        out[ROW_ID] = batch[id_column].astype(str)
    out[REJECT_REASON] = [reject_reason(v) for v in batch[text_column]]
    return out
