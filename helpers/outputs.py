"""Output folders and the final result tables.

Ray writes row-level parts under ``OUTPUT_DIR/parts/``; :func:`collect_results` turns them into
the tables a person opens: ``predictions.parquet`` (rows the model answered) and
``errors.parquet`` (rows rejected before the model, or that failed in the engine, with the reason).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

PARTS = "parts"
PREDICTIONS = "predictions.parquet"
ERRORS = "errors.parquet"
#: Everything a run writes into its output folder; a new run removes exactly these, nothing else.
RUN_ARTEFACTS = (PARTS, PREDICTIONS, ERRORS, "summary.json", "confusion_matrix.png", "label_counts.png",
                 "captions.png")


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


def collect_results(out: Path, processed: str, rejected: str, reason_column: str, drop: tuple[str, ...] = ()) -> Results:
    """Split Ray's parts into ``predictions.parquet`` and ``errors.parquet`` and return both.

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
    errors = pd.concat([f for f in (rejects, failed) if not f.empty], ignore_index=True) if not (rejects.empty and failed.empty) else pd.DataFrame(columns=["stage", "reason"])
    predictions = predictions.drop(columns=[c for c in drop if c in predictions.columns]).reset_index(drop=True)
    errors = errors.drop(columns=[c for c in drop if c in errors.columns]).reset_index(drop=True)
    predictions.to_parquet(out / PREDICTIONS, index=False)
    errors.to_parquet(out / ERRORS, index=False)
    return Results(predictions=predictions, errors=errors)
