"""The run both notebooks share: your functions guarded so any one row's failure is a recorded
reason, every row written in one pass, and the result tables that account for every row.

One pass: rows rejected before the model travel through the processor with it. Ray Data LLM lets a
row that carries an error (its ``__inference_error__`` column, what ``should_continue_on_error``
uses) bypass every stage and the user's ``postprocess``; :func:`guard_preprocess` gives a rejected
row that error instead of a request, so it reaches the one write untouched, and the input is read
once. :func:`finish` then gives every row the same columns and a ``stage`` ("" when answered).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from helpers.autoscale import unplaceable
from helpers.cluster import Session
from helpers.data import REJECT_REASON
from helpers.errors import Explained
from helpers.location import Location
from helpers.outputs import ERRORS, RunOutputs, parquet_rows, read_parts, result_row
from helpers.known_lines import without_known_lines
from helpers.progress import (dashboard, first_results_within, heartbeat, heartbeat_seconds, live_progress,
                              log_stream)
from helpers.run_stats import (Throughput, projection, rows_entered, rows_entering, stage_stats, stage_table,
                               steady_state, throughput_table)
from helpers.sizing import InputSize
from helpers.stages import (FIRST_BATCH, INFERENCE_ERROR, POSTPROCESS, REJECTED, STAGE, batches_of, finish,
                            first_batch_out, forget_first_batch)

RESULTS = "results"  # the parts folder of the one write


def _failure(what: str, exc: BaseException) -> str:
    return f"{what} failed: {type(exc).__name__}: {exc}"


def guard_preprocess(preprocess: Callable[[dict[str, Any]], Mapping[str, Any]], example: Mapping[str, Any]):
    """Wrap your ``preprocess`` for the processor so no single row can fail the run.

    - A row with a ``reject_reason`` is not sent to the model: it gets that reason as its error and
      skips every stage (see the module docstring).
    - If your function raises on a row, that row is rejected with the exception as its reason.
    - Rejected rows carry the request your function makes for ``example`` (it is never sent), so
      every row has the same request columns. Ray Data merges blocks column by column: in a batch
      that joins a block of rejected rows only (a run of empty names, a block of broken images)
      with other blocks, a missing request reads as nulls, its integer settings (``max_tokens``)
      become floats, vLLM's engine refuses them in a thread of its own, and the run stalls for
      good. ``example`` is also a first check: your function must handle it, or this raises.

    It stays light on purpose: it runs in short tasks that Ray may spread over many worker
    processes (160 on a 16-core machine with ``CPU_STAGE_CPUS=0.1``). Loading a tokenizer here, to
    apply the chat template in the same task, made each of them import transformers: on an H100
    machine, 131 workers grew to 55 GB and a 20,000-row run stalled. The processor's chat-template
    stage loads it once per engine replica instead.
    """
    try:
        stand_in = dict(preprocess(dict(example)))
    except Exception as exc:
        raise ValueError(f"your preprocess fails on the example row {dict(example)!r}: "
                         f"{type(exc).__name__}: {exc}") from exc

    def wrapped(row: dict[str, Any]) -> dict[str, Any]:
        reason = row.get(REJECT_REASON) or ""
        if reason:
            return {**stand_in, INFERENCE_ERROR: str(reason), STAGE: REJECTED}
        try:
            request = dict(preprocess(row))
            # Every row sets the column: in a block where some rows have an error, a row without
            # it would read as null, and Ray's stages treat anything but "" as an error.
            return {**request, INFERENCE_ERROR: "", STAGE: ""}
        except Exception as exc:  # one row's problem, never the run's
            return {**stand_in, INFERENCE_ERROR: _failure("preprocess", exc), STAGE: REJECTED}

    return wrapped


def guard_postprocess(postprocess: Callable[[dict[str, Any]], Mapping[str, Any]], carry: Sequence[str]):
    """Wrap your ``postprocess``: it returns only its own outputs (``{"caption": ...}``); the
    wrapper adds the ``carry`` columns, the engine's token counts and the request's digest
    (:func:`helpers.outputs.result_row`). If it raises on a row, that row becomes an error with
    stage ``postprocess`` instead of failing the run."""
    keep = list(carry)

    def wrapped(row: dict[str, Any]) -> dict[str, Any]:
        try:
            return {**result_row(row, keep, **dict(postprocess(row))), STAGE: ""}
        except Exception as exc:  # one row's problem, never the run's
            return {**{c: row.get(c) for c in keep}, "error": _failure("postprocess", exc), STAGE: POSTPROCESS}

    return wrapped


@dataclass(frozen=True)
class RunResult:
    """One run's outcome: the tables a person opens and the counts behind the summary."""

    root: Path
    answered: pd.DataFrame  # rows the model answered (predictions or captions)
    errors: pd.DataFrame  # rows rejected before the model or failed in it, with stage and reason
    rows_entered_now: int | None  # rows that entered the processor in this run (None: Ray did not say)
    rows_written_now: int  # rows this run wrote
    rows_written_before: int  # rows an interrupted run had written (resumed runs)
    throughput: Throughput
    files: list[Location] = field(default_factory=list)  # the result files this run wrote
    stats: str = ""  # Ray Data's execution statistics per operator
    run: RunOutputs | None = None  # the output folder it wrote to (its run id guards the saved summary)

    @property
    def rows_read(self) -> int | None:
        """Rows read over the whole run, resumed parts included: what entered the processor now plus
        what an interrupted run had written. None when Ray did not count (then nothing is claimed)."""
        return None if self.rows_entered_now is None else self.rows_written_before + self.rows_entered_now

    def throughput_table(self, whole_input=None, gpus: int = 0) -> pd.DataFrame:
        """Rows and tokens per second, and what the whole input would take
        (:func:`helpers.run_stats.throughput_table`)."""
        return throughput_table(self, whole_input, gpus).to_frame("value")

    def projection(self, whole_input, gpus: int) -> dict:
        """What the whole input would take at this run's steady rate (:func:`helpers.run_stats.projection`)."""
        return projection(self, whole_input, gpus)

    def stage_table(self, path: Path | None = None) -> pd.DataFrame:
        """Ray's stages, slowest first; the full statistics go to ``path`` (:func:`helpers.run_stats.stage_table`)."""
        return stage_table(self.stats, path)


class RunInterrupted(Explained, KeyboardInterrupt):
    """The run was interrupted (Ctrl-C, Jupyter's stop button): one line says what is safe and how to
    go on, instead of a hundred lines of Ray's and the kit's stack."""


def _interrupted_message(out: RunOutputs, id_column: str | None) -> str:
    from helpers.outputs import committed_checkpoints

    if out.resume and id_column is not None:
        done = sum(parquet_rows(f) for f in committed_checkpoints(out.checkpoint(RESULTS)))
        return (f"interrupted: {done:,} rows are safe in OUTPUT_DIR (written and checkpointed). Run this cell again "
                "with the same settings to resume; only the rest is sent to the model.")
    written = sum(parquet_rows(f) for f, _ in out.parts(RESULTS).files())
    return (f"interrupted: {written:,} rows were written, but this run does not resume (RESUME=False or no "
            "ID_COLUMN): running the cell again starts over, and keeps them in OUTPUT_DIR/earlier/.")


#: A run of known size writes about this many result files as its rows come back ...
RESULT_FILES = 64
#: ... of at most this many rows each; of unknown size, this many rows each.
MAX_ROWS_PER_FILE = 10_000
ROWS_PER_FILE_UNKNOWN = 1_024


def rows_per_file(batch_size: int, expected_rows: int | None) -> int:
    """Rows per result file: a run of ``expected_rows`` writes about :data:`RESULT_FILES` files as it
    goes (so results stream out, a resume keeps what was written, and the steady state can be
    measured at a few thousand rows), never fewer rows than a batch and never more than
    :data:`MAX_ROWS_PER_FILE` (5,000,000 images make 500 files, not 300,000 of one batch each)."""
    wanted = math.ceil(expected_rows / RESULT_FILES) if expected_rows else ROWS_PER_FILE_UNKNOWN
    return max(batch_size or 1, min(wanted, MAX_ROWS_PER_FILE))


def rows_planned(limit: int | None, input_size: InputSize | None) -> tuple[int | None, bool]:
    """The rows a run reads: ``LIMIT`` or the whole input's, whichever is fewer (None: not known);
    and whether that number is an estimate (the input's size scaled from a sample), so that its
    progress says "of about"."""
    expected = input_size.rows if input_size else None
    planned = min(filter(None, (limit, expected)), default=None)
    return planned, bool(planned and input_size and input_size.estimated and planned == expected != limit)


def run(processor: Callable, ds, out: RunOutputs, session: Session, *, carry: Sequence[str],
        outputs: Mapping[str, Any], id_column: str | None, answered_name: str, limit: int | None = None,
        input_size: InputSize | None = None) -> RunResult:
    """Run ``processor`` over ``ds`` once: every row, answered or not, is written in one pass to
    ``OUTPUT_DIR/parts/results`` (resumably, see :meth:`RunOutputs.write`); then split into
    ``answered_name`` (rows with an answer) and ``errors.parquet`` (rows with a stage and a reason).

    Rows enter the engine in blocks of one batch (``session.batch_size``; Ray's streaming
    repartition): a read block larger than a batch would make one engine task of several batches,
    whose rows all come back when the last does (with 2,000 images in 64 blocks, every block ended
    in the same 4 s). Results are written as they come, :func:`rows_per_file` rows a file, from
    ``input_size`` (the whole input's rows, counted or estimated: the plan's; progress says "about"
    for an estimate).

    ``limit`` is the run's ``LIMIT`` (``ds`` already holds at most that many rows). Resuming, Ray's
    checkpoint filter drops the rows an interrupted run finished right after the read, so a limit
    after it would count that many *new* rows: the run then takes only the ``limit`` minus the rows
    done, and a retried job with ``LIMIT`` ends with ``LIMIT`` rows, each once.

    On a cluster of several nodes, every node must see ``OUTPUT_DIR``: checked when ``out`` was
    prepared (:meth:`helpers.cluster.Session.prepare_output`), before anything there was moved aside.
    Ray Data starts every stage's actors at once (the engine's start overlaps the light stages'); if no
    batch comes out of the engine within ``session.startup_timeout_s``, or Ray cannot place what the
    run asks for, the run stops instead of waiting forever (:func:`first_results_within`).
    """
    stage_cpus = session.stage_cpus
    started = time.perf_counter()
    if limit and out.rows_done:
        ds = ds.limit(max(limit - out.rows_done, 0))
    if session.batch_size:
        ds = batches_of(ds, session.batch_size, stage_cpus)
    entering = ds.map_batches(rows_entering, batch_format="pyarrow", zero_copy_batch=True, num_cpus=stage_cpus)
    import uuid

    marker = f"{FIRST_BATCH}{uuid.uuid4().hex}"
    finished = processor(entering).map_batches(finish, batch_format="pyarrow", num_cpus=stage_cpus, fn_kwargs={
        "carry": list(carry), "outputs": dict(outputs), "marker": marker})
    planned, about = rows_planned(limit, input_size)
    total = max(planned - out.rows_done, 0) if planned else None  # this run's, after a resumed one's
    if session.progress:  # a person in Jupyter: one line that updates in place
        progress = live_progress(out.parts(RESULTS), total=total, about=about)
    else:  # headless: a line in the log every minute, never in the report
        beat_s = heartbeat_seconds()
        if beat_s:
            print(f"[llm-batch-kit] pipeline started: a progress line every {beat_s:g} s here{dashboard()}.",
                  file=log_stream(), flush=True)
        progress = heartbeat(out.parts(RESULTS), beat_s, total=total, about=about)
    fresh = out.lock.keep_fresh() if out.lock else contextlib.nullcontext()  # no other run moves what this writes
    watch = first_results_within(out.parts(RESULTS), session.startup_timeout_s, unplaceable,
                                 first_batch=lambda: first_batch_out(marker))
    try:  # without the one red line Ray logs as its actor stages start (helpers.known_lines); every other comes
        with fresh, without_known_lines(), watch, progress:
            written = out.write(finished, RESULTS, id_column=id_column, num_cpus=stage_cpus,
                                rows_per_file=rows_per_file(session.batch_size, planned))
    except KeyboardInterrupt:
        raise RunInterrupted(_interrupted_message(out, id_column)) from None
    finally:
        forget_first_batch(marker)
        if out.lock:
            out.lock.release()
    seconds = time.perf_counter() - started
    # Each result file is read once: all of them make the tables, this run's make its throughput.
    parts = {f: f.read_parquet() for f in sorted(written.written_at)}  # every result file, as the write listed them
    answered, errors = collect(out.root, answered_name, pd.concat(parts.values()) if parts else pd.DataFrame())
    steady, steady_basis = steady_state([(written.written_at[f], len(parts[f])) for f in written.files], seconds)
    now = pd.concat([parts[f] for f in written.files]) if written.files else pd.DataFrame(columns=[STAGE])
    now = now[now[STAGE] == ""]
    throughput = Throughput(written.rows, seconds, steady, steady_basis, answered_rows=len(now),
                            input_tokens=int(now.get("num_input_tokens", pd.Series(dtype=int)).sum()),
                            output_tokens=int(now.get("num_generated_tokens", pd.Series(dtype=int)).sum()))
    return RunResult(
        root=out.root, answered=answered, errors=errors, rows_entered_now=rows_entered(finished),
        rows_written_now=written.rows, rows_written_before=written.rows_before,
        throughput=throughput, files=written.files, stats=stage_stats(finished), run=out,
    )


def collect(root: Path, answered_name: str, rows: pd.DataFrame | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Split the written rows (``rows``, or read from the results folder) into answered rows and
    errors; write both tables; return them."""
    if rows is None:
        rows = read_parts(root / "parts" / RESULTS)
    if rows.empty:
        rows = pd.DataFrame(columns=["error", STAGE])
    is_error = rows[STAGE] != ""
    answered = rows[~is_error].drop(columns=["error", STAGE]).reset_index(drop=True)
    errors = rows[is_error].rename(columns={"error": "reason"}).reset_index(drop=True)
    answered.to_parquet(root / answered_name, index=False)
    errors.to_parquet(root / ERRORS, index=False)
    return answered, errors
