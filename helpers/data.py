"""Input data for the notebooks: the bundled sample, column checks, row ids and row-level rejects."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import pandas as pd

#: Column both pipelines add: the stable id of each input row.
ROW_ID = "row_id"
#: Column both pipelines add: why a row was not sent to the model ("" when it was).
REJECT_REASON = "reject_reason"
#: The column Ray's parquet reader adds with ``include_row_hash``: a hash of the file's path and the
#: row's position, a uint64 (what resuming keys on where a parquet input has no id column).
ROW_HASH = "row_hash"
#: Types the results give carried columns, whatever a stage made of them: Ray's checkpoints compare
#: the written ids with the source's, so they must be of the source's type (see stages.finish).
CARRIED_TYPES = {ROW_HASH: "uint64"}


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


class EmptyInputError(ValueError):
    """The input holds no rows at all (a CSV with a header only, an empty folder of parquet)."""


def require_columns(available: Sequence[str] | None, required: Iterable[str | None], what: str = "input",
                    path: str | None = None) -> None:
    """Fail fast, naming the columns that do exist, when a required column is missing.

    ``available`` is ``None`` when the input has no rows (Ray's ``Dataset.columns()`` of a CSV with
    only a header): that is an :class:`EmptyInputError`, naming ``path``."""
    if available is None:
        where = f" at {path!r}" if path else ""
        raise EmptyInputError(f"The {what}{where} holds no rows (a CSV with only a header, or empty files): "
                              "nothing to run on. Point INPUT_PATH at data with rows.")
    missing = [c for c in required if c is not None and c not in available]
    if missing:
        raise ValueError(
            f"The {what} has no column {', '.join(repr(m) for m in missing)}. "
            f"Columns it has: {', '.join(repr(a) for a in available)}."
        )


def string_columns(*names: str | None):
    """CSV convert options that read ``names`` as text (``read_csv(convert_options=...)``).

    pyarrow infers a CSV column's type from the first block it reads: an id column of digits, or a
    company called ``1-800-Flowers`` after a run of numbers, reads as a number there and fails the
    whole run when a later block holds text. Ids, texts and labels are text: read them as such.
    Names the file does not have are ignored."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    return pacsv.ConvertOptions(column_types={n: pa.string() for n in names if n})


class IdColumnError(ValueError):
    """``ID_COLUMN`` has empty or repeated values: rows could not be told apart (or resumed) by it."""


@dataclass(frozen=True)
class IdReport:
    """What :func:`check_ids` found in an id column."""

    rows: int
    empty: int  # rows whose id is null, "" or only whitespace
    repeated_values: int  # distinct ids that more than one row has
    examples: tuple[tuple[str, int], ...]  # up to 5 of them, with how many rows have each
    sample: list = field(default_factory=list, repr=False)  # the first rows, whole, when asked for

    def problem(self, column: str) -> str:
        """What is wrong with ``column``, and what to do ("" when nothing is)."""
        found = []
        if self.empty:
            found.append(f"{self.empty} of {self.rows} rows have no {column!r} value")
        if self.repeated_values:
            shown = ", ".join(f"{v!r} ({n} rows)" for v, n in self.examples)
            more = "" if self.repeated_values <= len(self.examples) else f" and {self.repeated_values - len(self.examples)} more"
            values = "value is" if self.repeated_values == 1 else "values are"
            found.append(f"{self.repeated_values} {column!r} {values} shared by several rows: {shown}{more}")
        if not found:
            return ""
        return (f"ID_COLUMN={column!r} must give every row an id of its own, but {'; '.join(found)}. Results are "
                f"matched to your rows, and an interrupted run is resumed, by this id: a shared or missing one would "
                f"merge rows or skip them. Give those rows unique ids, or set ID_COLUMN=None to derive each row's id "
                f"from its content (resuming is then off).")


def _id_text(values: pd.Series) -> tuple[pd.Series, pd.Series]:
    """The ids as text and which of them are empty (null, "" or only whitespace)."""
    text = values.astype("string")
    return text, text.isna() | text.str.strip().eq("")


def first_rows(ds, limit: int | None):
    """``ds`` cut to its first ``limit`` rows *in the input's order* (files in sorted path order, rows
    in file order); ``ds`` itself for ``limit`` None.

    Ray's ``limit`` keeps the first rows to *arrive*, and a read's blocks arrive in any order: two
    runs with ``LIMIT=10_000`` could run different rows, and the ids the kit checked could differ
    from the rows it ran. So ``ds`` (and every dataset made from it) keeps the input's order
    (``preserve_order`` on the dataset's own context): the same rows every time, and a resumed run
    completes exactly the rows the first attempt began (:func:`helpers.pipeline.run`)."""
    if not limit:
        return ds
    ds.context.execution_options.preserve_order = True
    return ds.limit(limit)


def check_and_sample(ds, id_column: str | None, sample: int = 200) -> list[dict[str, Any]]:
    """The first ``sample`` rows of ``ds`` (for the prompt checks), and, with an ``id_column``, its
    ids checked in the same pass (:func:`check_ids`): the input is read once for both."""
    if not id_column:
        return ds.limit(sample).take_all()
    return check_ids(ds, id_column, sample=sample).sample


def check_ids(ds, column: str, *, examples: int = 5, batch_size: int = 65_536, sample: int = 0) -> IdReport:
    """Read ``column`` of ``ds`` once and count empty and repeated ids; raise :class:`IdColumnError`
    with the values and the fix if there are any. With ``sample``, the same pass also keeps the
    first ``sample`` rows whole (:attr:`IdReport.sample`).

    One streaming pass: only the id column comes to this process (every column with ``sample``), a
    batch at a time, and each id is kept as an 8-byte hash (``pandas.util.hash_array``; 8 MB per
    million rows). Only when some hash repeats does a second pass collect the ids behind it, to
    name them. (A Ray Data groupby took 25-40 s on a 2-core machine for a few rows: its shuffle
    tasks, not the data.)"""
    import numpy as np

    ids = ds.select_columns([column])
    hashes, rows, empty, kept = [], 0, 0, []
    for batch in (ds if sample else ids).iter_batches(batch_format="pandas", batch_size=batch_size):
        if len(kept) < sample:
            kept += batch.head(sample - len(kept)).to_dict("records")
        text, blank = _id_text(batch[column])
        rows, empty = rows + len(text), empty + int(blank.sum())
        hashes.append(pd.util.hash_array(text[~blank].to_numpy(dtype=object)))
    found = np.concatenate(hashes) if hashes else np.array([], dtype=np.uint64)
    values, counts = np.unique(found, return_counts=True)
    repeated = set(values[counts > 1].tolist())
    shown: tuple[tuple[str, int], ...] = ()
    if repeated:
        named: dict[str, int] = {}
        for batch in ids.iter_batches(batch_format="pandas", batch_size=batch_size):
            text, blank = _id_text(batch[column])
            text = text[~blank]
            for value in text[np.isin(pd.util.hash_array(text.to_numpy(dtype=object)), list(repeated))]:
                named[value] = named.get(value, 0) + 1
        shown = tuple(sorted(named.items(), key=lambda item: (-item[1], item[0]))[:examples])
    report = IdReport(rows=rows, empty=empty, repeated_values=len(repeated), examples=shown, sample=kept)
    if report.problem(column):
        raise IdColumnError(report.problem(column))
    return report


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
