"""How fast a run went: rows per second end to end and in steady state, and Ray Data's own
statistics (rows that entered the processor, each stage's time)."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd


@dataclass(frozen=True)
class Throughput:
    """Rows per second two ways: end to end (engine start included) and in steady state (the rate
    the result files were written at, once they came; what a long run approaches), with how the
    steady state was measured or why it was not (:func:`steady_state`)."""

    rows: int  # rows written in this run (answered or not)
    seconds: float  # the pipeline, engine start included
    steady: float = float("nan")  # rows/s in steady state; NaN: not measured (see steady_basis)
    steady_basis: str = ""  # how the steady state was measured, or why it was not
    answered_rows: int = 0  # rows the model answered in this run
    input_tokens: int = 0  # their prompt tokens
    output_tokens: int = 0  # their generated tokens

    @property
    def end_to_end(self) -> float:
        return self.rows / self.seconds if self.seconds else float("nan")


def rows_entering(table):
    """The rows entering the processor, unchanged. :func:`run` inserts this step right before the
    processor so that Ray's execution statistics count, under this name, every row this run sends
    in: after a ``LIMIT``, and without the rows an interrupted run finished (Ray's checkpoint filter
    drops those after the read). A whole block per call (no re-batching) and zero-copy, fused by Ray
    with the processor's first step: one call per block (its cost was not measured on its own)."""
    return table


def rows_entered(ds) -> int | None:
    """Rows that entered the processor in this run: the output of the operator that holds
    :func:`rows_entering`, from Ray Data's execution statistics (each operator's inputs are in
    ``parents``); the steps fused after it in that operator map row to row. None when Ray gives no
    such count (statistics are a developer API, or that operator also holds the write, whose output
    is a row per file): then the summary claims nothing."""
    marker = f"MapBatches({rows_entering.__name__})"
    try:
        pending = [ds.get_stats_summary()]
        while pending:
            summary = pending.pop()
            for op in summary.operators_stats:
                if marker in op.operator_name:
                    if op.output_num_rows is None or "Write" in op.operator_name:
                        return None
                    return int(op.output_num_rows.sum)
            pending.extend(summary.parents)
        return None
    except Exception:  # statistics never fail a run that finished; without them nothing is claimed
        return None


def stage_stats(ds) -> str:
    try:
        return ds.stats()
    except Exception as exc:  # statistics never fail a run that finished
        return f"(no statistics: {exc})"


#: The steady state is claimed from at least this many result files ...
STEADY_MIN_FILES = 5


#: ... that came over at least this share of the pipeline's time. Ray Data passes an engine task's
#: rows on as one block when the task ends (rows this small never fill a block sooner): when every
#: block is in the engine at once (no more blocks than batches the engine takes at a time), all of
#: them end together and the files come in one burst at the end, which says nothing about the rate
#: (600 images in 4 blocks on a 2-core CPU: 4 files within 1.2 s of an 85 s pipeline).
STEADY_MIN_SHARE = 0.1


def steady_state(files: Sequence[tuple[float, int]], seconds: float) -> tuple[float, str]:
    """Rows per second in steady state from this run's result files (``(written at, rows)`` pairs)
    and the pipeline's ``seconds``, and how it was measured: the slope of the rows written against
    time, fitted (least squares) over the files. Files that come in waves (several blocks ending
    together) are fitted as well as a steady stream. NaN, with the reason, from fewer than
    :data:`STEADY_MIN_FILES` files, or from files that came within :data:`STEADY_MIN_SHARE` of the
    pipeline's time. The reasons are short enough for a table cell; a longer run, or more blocks
    than the engine takes at once, writes more files over more of the run."""
    nan = float("nan")
    if len(files) < STEADY_MIN_FILES:
        return nan, f"not measured: {len(files)} result files, fewer than {STEADY_MIN_FILES}"
    import numpy as np

    times, rows = np.array(sorted(files), dtype=float).T
    span = float(times[-1] - times[0])
    if span <= 0 or span < STEADY_MIN_SHARE * seconds:
        return nan, f"not measured: {len(files)} files came within {span:.1f} s of {seconds:.0f} s"
    slope = np.polyfit(times, np.cumsum(rows), 1)[0]  # rows written so far against time
    return float(slope), f"fitted over {len(files)} result files written in {span:.1f} s"


def throughput_table(result, whole_input=None, gpus: int = 0) -> pd.Series:
    """This run's throughput (a :class:`helpers.pipeline.RunResult`): rows per second end to end
    (engine start included) and in steady state, and the tokens of the rows answered in this run
    (a resumed run counts only its own rows); with ``whole_input`` (:mod:`helpers.sizing`), what
    the whole input would take (:func:`projection`)."""
    t = result.throughput
    rows = t.answered_rows
    projected = projection(result, whole_input, gpus) if whole_input is not None else {}
    return pd.Series({
        "rows written in this run": t.rows,
        "wall time, engine start included (s)": round(t.seconds, 1),
        "rows/s, end to end": round(t.end_to_end, 2),
        "rows/s, steady state": round(t.steady, 2),
        "steady state": t.steady_basis,
        "input tokens/row": round(t.input_tokens / rows, 1) if rows else float("nan"),
        "output tokens/row": round(t.output_tokens / rows, 2) if rows else float("nan"),
        "output tokens/s, steady state": round(t.output_tokens / rows * t.steady, 1) if rows else float("nan"),
        **projected,
    })


def projection(result, whole_input, gpus: int) -> dict:
    """What the whole input (a :class:`helpers.sizing.InputSize`) would take at this run's steady
    rate on the same cluster (engine start not included), and on what basis; or why it is not
    projected. ``gpus``: the GPUs the run held (0 on a CPU)."""
    t = result.throughput
    entries = {"whole input, rows": whole_input.rows, "whole input, size from": whole_input.basis}
    if whole_input.rows is None:
        return {**entries, "whole input, projected hours": "not projected: the input's size is unknown"}
    if math.isnan(t.steady) or t.steady <= 0:
        return {**entries, "whole input, projected hours": f"not projected: no steady rate ({t.steady_basis})"}
    hours = whole_input.rows / t.steady / 3600
    return {**entries, "whole input, projected hours": round(hours, 2),
            "whole input, projected GPU-hours": round(hours * gpus, 2) if gpus else "none: a CPU run",
            "whole input, projected from": f"this run's steady state, {t.steady:.2f} rows/s, on the same cluster"}


def stage_table(stats: str, path: Path | None = None) -> pd.DataFrame:
    """One row per stage of Ray's execution statistics (``RunResult.stats``): its tasks, rows out and
    wall time, slowest first (the stage with the largest wall time is the bottleneck); the full text,
    ~15 lines a stage, goes to ``path``."""
    if path is not None:
        path.write_text(stats)
    rows = []
    for block in re.split(r"\n(?=Operator \d+ )", stats):
        head = re.match(r"Operator \d+ (.+?): (\d+) tasks executed, \d+ blocks produced in ([\d.]+)(ms|s)", block)
        if not head:
            continue
        name, tasks, took, unit = head.groups()
        out = re.search(r"Output num rows per block: .*?, (\d+) total", block)
        rows.append({"stage": name, "tasks": int(tasks), "rows out": int(out.group(1)) if out else None,
                     "wall time (s)": round(float(took) / (1000 if unit == "ms" else 1), 2)})
    table = pd.DataFrame(rows, columns=["stage", "tasks", "rows out", "wall time (s)"])
    return table.sort_values("wall time (s)", ascending=False).set_index("stage")
