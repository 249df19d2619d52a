"""What a run's summary says: every row accounted for, and the checks a run must pass whatever its
data and model."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import pandas as pd

from helpers.parameters import Explained
from helpers.pipeline import ENGINE, POSTPROCESS, REJECTED


MAX_ENGINE_ERRORS = 0.1  # "the model answered" holds while at most this share of the rows sent (or one) failed there
#: Entries that hold whatever the data, labels or model: what the checked cell prints.
INVARIANTS = ("at least one row read", "at least one image read", "all rows accounted for", "all images accounted for",
              "every error has a reason", "the model answered", "every prediction is a label")
COUNTS = ("rows read", "images read", "rejected before the model", "classified", "captioned", "engine errors",
          "postprocess errors")


def summary(written: Any, *, ids_from_content: bool = False, checks: Mapping[str, Any] | None = None) -> dict:
    """Every row read (Ray's count where rows enter the processor, resumed rows added) answered, rejected
    or failed exactly once, each error with its reason, and your ``checks`` (:func:`helpers.labels.checks`).
    Identical rows share an id where ids come from content (``ids_from_content``)."""
    what = "rows" if written.run.plan.task == "text" else "images"
    answered, errors = written.answered, written.errors
    stages = errors["stage"].value_counts() if "stage" in errors else pd.Series(dtype=int)
    rejected, engine, post = (int(stages.get(s, 0)) for s in (REJECTED, ENGINE, POSTPROCESS))
    ids = pd.concat([answered.get("row_id", pd.Series(dtype=str)), errors.get("row_id", pd.Series(dtype=str))])
    read = written.rows_read
    sent = (read or 0) - rejected
    return {f"{what} read": read if read is not None else "not counted (Ray gave no count of the rows entering)",
            "rejected before the model": rejected, "classified" if what == "rows" else "captioned": len(answered),
            "engine errors": engine, **({"postprocess errors": post} if post else {}),
            f"at least one {what[:-1]} read": bool(read),
            f"all {what} accounted for": read is not None and len(answered) + rejected + engine + post == read
            and (bool(ids.is_unique) or ids_from_content),
            "row ids unique": bool(ids.is_unique),
            **({f"{what} identical to another (ids from content)": int(ids.duplicated().sum())}
               if ids_from_content and not ids.is_unique else {}),
            "every error has a reason": bool(errors["reason"].astype(str).str.len().gt(0).all()) if len(errors) else True,
            "the model answered": len(answered) > 0 and engine <= max(1, MAX_ENGINE_ERRORS * sent), **(checks or {})}


def save(written: Any, *, whole_input: int | None = None, **how: Any) -> dict:
    """:func:`summary` written to ``summary.json`` with the timings and the projection, printed and
    returned; the results copied to ``OUTPUT_DIR`` where it is a bucket."""
    summary_ = summary(written, **how)
    table = written.throughput(whole_input)[0]["value"]
    record = {**summary_, "run": "resuming an interrupted run" if written.run.resuming else "starting fresh",
              "rows entering the pipeline in this run (Ray's count)": written.rows_entered,
              "rows written in this run": written.rows_written, "pipeline seconds": round(written.seconds, 2),
              "rows/s end to end": round(written.rows_written / written.seconds, 3) if written.seconds else None,
              "rows/s steady state": None if math.isnan(written.steady) else round(written.steady, 3),
              "steady state": written.steady_basis,
              **{k: v for k, v in table.items() if k.startswith("whole input")}}
    written.run.path("summary.json").write_text(json.dumps(record, indent=2, default=str))
    print(format_summary({k: v for k, v in summary_.items() if not isinstance(v, dict)}))
    print(written.run.publish())
    return summary_


class RunCheckError(Explained, AssertionError):
    """A finished run broke what must hold for any data and model."""


def require(summary: dict, *, counts: bool = False) -> str:
    """The invariants (and with ``counts`` the row counts, for known data), one a line; raise naming
    each one that failed."""
    checks = {k: v for k, v in summary.items() if k in INVARIANTS}
    failed = [k for k, v in checks.items() if v is not True]
    if failed:
        numbers = ", ".join(f"{k} {summary[k]}" for k in COUNTS if k in summary)
        raise RunCheckError(f"this run failed its checks: {', '.join(failed)} ({numbers}). The errors table says why rows "
                            f"failed; at most {MAX_ENGINE_ERRORS:.0%} of the rows sent (or one) may be engine errors.")
    return format_summary({**({k: summary[k] for k in COUNTS if k in summary} if counts else {}), **checks})


def format_summary(summary: dict) -> str:
    width = max(len(k) for k in summary)
    return "\n".join(f"{k + ':':<{width + 1}} {v}" for k, v in summary.items())
