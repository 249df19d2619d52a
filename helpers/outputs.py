"""Output folders and the final result tables.

Ray writes row-level parts under ``OUTPUT_DIR/parts/``; :func:`collect_results` turns them into
the tables a person opens: ``predictions.parquet`` (rows the model answered) and
``errors.parquet`` (rows rejected before the model, or that failed in the engine, with the reason).
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

PARTS = "parts"
PREDICTIONS = "predictions.parquet"
ERRORS = "errors.parquet"
#: Everything a run writes into its output folder; a new run removes exactly these, nothing else.
RUN_ARTEFACTS = (PARTS, PREDICTIONS, ERRORS, "summary.json", "confusion_matrix.png", "label_counts.png",
                 "captions.parquet", "captions.png")


def prepare_output_dir(path: str) -> Path:
    """Create ``path`` and remove what an earlier run wrote there, so results never pile up.

    Only this kit's own artefacts are removed; other files in the folder are left alone.
    """
    out = Path(path).expanduser().resolve()
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"OUTPUT_DIR={path!r} exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    for name in RUN_ARTEFACTS:
        target = out / name
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()
    probe = out / ".write-test"
    try:
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise PermissionError(f"OUTPUT_DIR={path!r} is not writable: {exc}") from exc
    return out


def read_parts(folder: Path) -> pd.DataFrame:
    """Read a Ray-written parquet folder (empty frame if Ray wrote nothing there)."""
    if not folder.is_dir() or not any(folder.glob("*.parquet")):
        return pd.DataFrame()
    return pd.read_parquet(folder)


@dataclass(frozen=True)
class Results:
    predictions: pd.DataFrame
    errors: pd.DataFrame


def collect_results(out: Path, processed: str, rejected: str, reason_column: str,
                    predictions_name: str = PREDICTIONS) -> Results:
    """Split Ray's parts into ``predictions_name`` and ``errors.parquet`` and return both.

    ``processed`` rows carry an ``error`` column ("" on success); ``rejected`` rows carry
    ``reason_column``. Errors get a ``stage`` ("rejected before the model" or "engine") and a ``reason``.
    """
    done = read_parts(out / PARTS / processed)
    rejects = read_parts(out / PARTS / rejected)
    if done.empty:
        predictions, failed = done, done
    else:
        predictions = done[done["error"] == ""].drop(columns=["error"])
        failed = done[done["error"] != ""].rename(columns={"error": "reason"}).assign(stage="engine")
    if not rejects.empty:
        rejects = rejects.rename(columns={reason_column: "reason"}).assign(stage="rejected before the model")
    frames = [f for f in (rejects, failed) if not f.empty]
    errors = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["stage", "reason"])
    predictions, errors = predictions.reset_index(drop=True), errors.reset_index(drop=True)
    predictions.to_parquet(out / predictions_name, index=False)
    errors.to_parquet(out / ERRORS, index=False)
    return Results(predictions=predictions, errors=errors)


def make_error_row_aligner(keep_columns: Sequence[str], output_defaults: Mapping[str, Any]):
    """Give engine-error rows the columns successful rows have, so both land in one table.

    With ``should_continue_on_error=True``, a row that fails in the engine skips ``postprocess``
    and keeps its raw shape plus ``__inference_error__``. This keeps ``keep_columns``, fills the
    postprocess outputs with ``output_defaults`` and moves the message to ``error``.
    Successful rows (whose ``postprocess`` sets ``error`` to "") pass through.
    """
    keep = list(keep_columns)
    defaults = dict(output_defaults)

    def align(row: dict[str, Any]) -> dict[str, Any]:
        error = row.get("__inference_error__") or ""
        if not error:
            return {k: v for k, v in row.items() if k != "__inference_error__"}
        return {**{c: row.get(c) for c in keep}, **defaults, "error": str(error)}

    return align
