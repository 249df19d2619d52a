"""Around Ray Data LLM's processor (``build_processor``, the kit's or Ray's): your ``preprocess`` and
``postprocess`` checked on an example and guarded, so one row's failure is that row's reason, never the
run's; then one write of every row, answered or not, as it comes (resumably, with Ray Data's
checkpoints), and how fast it went.

A row rejected before the model travels through the processor with Ray Data LLM's own error column
set: every stage and your ``postprocess`` pass it by, and it reaches the write untouched."""

from __future__ import annotations

import inspect
import math
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from helpers import progress
from helpers.parameters import Explained

ROW_ID = "row_id"  # every result row's id: ID_COLUMN's value, or a hash of the row's content
REJECT_REASON = "reject_reason"  # why a row is not sent to the model ("" when it is)
INFERENCE_ERROR = "__inference_error__"  # Ray Data LLM's: a row with a value skips every stage
STAGE, ERROR = "stage", "error"  # where a row stopped ("" when answered), and why
REJECTED, ENGINE, POSTPROCESS = "rejected before the model", "engine", "postprocess"
TOKENS = ("num_input_tokens", "num_generated_tokens")
KIT_COLUMNS = (ROW_ID, *TOKENS, ERROR, STAGE)
INPUT = "__input__"  # your columns travel as INPUT + name: a stage's field (prompt, an id) never replaces one


def _fails(what: str, exc: BaseException) -> str:
    return f"{what} failed: {type(exc).__name__}: {exc}"


def _unstorable(values: Mapping[str, Any]) -> list[str]:
    """The keys whose values no table column can hold (what Arrow cannot type)."""
    bad = []
    for key, value in values.items():
        try:
            pa.array([value])
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError):
            bad.append(key)
    return bad


@dataclass(frozen=True)
class Functions:
    """Your functions as the processor gets them, and what they were found to do on the example."""

    preprocess: Callable[[dict], dict]
    postprocess: Callable[[dict], dict]
    request: dict  # what your preprocess sends for the example (never sent; rejected rows carry it)
    columns: tuple[str, ...]  # every result row's columns, in order
    kept: tuple[str, ...]  # the input's columns among them
    postprocess_code: str


def checked(preprocess: Callable, postprocess: Callable, example: Mapping[str, Any], keep: Sequence[str] = ()) -> Functions:
    """``preprocess`` and ``postprocess`` tried on ``example`` (and an empty answer) before anything runs,
    then wrapped for ``build_processor``. A result row holds its id, the input's ``keep`` columns, all
    that your ``postprocess`` returns, the token counts, ``error`` and ``stage``; a row whose function
    raises, or returns what a column cannot hold, is an error row."""
    try:
        request = dict(preprocess(dict(example)))
    except Exception as exc:
        raise ValueError(f"your preprocess fails on the example row {dict(example)!r}: {type(exc).__name__}: {exc}") from exc
    answer = {**example, **request, "generated_text": "", "generated_tokens": [], "logprobs": None, ROW_ID: "example",
              **dict.fromkeys(TOKENS, 0)}
    try:
        yours = dict(postprocess(answer))
    except Exception as exc:
        raise ValueError(f"your postprocess fails on an empty answer to the example: {type(exc).__name__}: {exc}") from exc
    if bad := _unstorable(yours):
        raise TypeError(f"your postprocess returns values no table column can hold for {bad}: return text, numbers, "
                        "booleans, or lists and dicts of them")
    if taken := sorted(set(yours) & set(KIT_COLUMNS)):
        raise ValueError(f"your postprocess returns {taken}, which the kit sets on every row: name them otherwise")
    kept = [c for c in keep if c not in yours and c not in KIT_COLUMNS]
    columns = (ROW_ID, *kept, *yours, *TOKENS, ERROR, STAGE)

    def _preprocess(row: dict[str, Any]) -> dict[str, Any]:
        # Rejected rows carry the example's request: Ray merges blocks column by column, and a block of
        # rejects without one reads as nulls (integer settings become floats, which vLLM refuses).
        saved = {INPUT + c: row.get(c) for c in (ROW_ID, *kept)}
        if row.get(REJECT_REASON):
            return {**request, **saved, INFERENCE_ERROR: str(row[REJECT_REASON]), STAGE: REJECTED}
        try:
            return {**dict(preprocess(row)), **saved, INFERENCE_ERROR: "", STAGE: ""}
        except Exception as exc:  # one row's problem, never the run's
            return {**request, **saved, INFERENCE_ERROR: _fails("preprocess", exc), STAGE: REJECTED}

    def _postprocess(row: dict[str, Any]) -> dict[str, Any]:
        base = {INPUT + c: row.get(INPUT + c) for c in (ROW_ID, *kept)}
        if row.get(INFERENCE_ERROR):  # rejected, or failed in the engines: passed by, as Ray Data LLM does
            return {**base, INFERENCE_ERROR: row[INFERENCE_ERROR], STAGE: row.get(STAGE, "")}  # "": finish says engine
        try:
            out = dict(postprocess(row))
            if other := sorted(set(out) - set(yours)):
                raise ValueError(f"it returned columns it did not return for the example ({other}): return the same "
                                 "columns for every row")
            if bad := _unstorable(out):
                raise TypeError(f"no table column can hold its values for {bad}")
            return {**base, **out, **{t: int(row.get(t) or 0) for t in TOKENS}, ERROR: "", STAGE: ""}
        except Exception as exc:  # one row's problem, never the run's
            return {**base, ERROR: _fails("postprocess", exc), STAGE: POSTPROCESS}

    try:
        code = inspect.getsource(postprocess)
    except (OSError, TypeError):
        code = getattr(getattr(postprocess, "__code__", None), "co_code", b"").hex()
    return Functions(_preprocess, _postprocess, request, columns, tuple(kept), code)


def finish(table, *, columns: Sequence[str], kept: Sequence[str] = ()):
    """An Arrow batch in ``columns``: rows that skipped or failed the engine get their ``stage`` and ``error``,
    keep the id and ``kept`` (as they entered: ``INPUT`` + name) and have nulls for yours. Columns Ray pickled
    (mixed types) are typed again (as Arrow infers, else text); Ray's ``row_hash`` as uint64, as resuming compares it."""
    n, names = table.num_rows, set(table.column_names)

    def text(name: str):
        return pc.fill_null(table.column(name).cast(pa.string()), "") if name in names else pa.array([""] * n, pa.string())

    failed = pc.not_equal(text(INFERENCE_ERROR), "")
    out = {}
    for name in columns:
        travelled = INPUT + name if name in (ROW_ID, *kept) else name
        column = table.column(travelled) if travelled in names else pa.nulls(n)
        if isinstance(column.type, pa.ExtensionType) and column.type.extension_name == "ray.data.arrow_pickled_object":
            values = column.to_pylist()
            try:
                column = pa.array(values)
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
                column = pa.array([None if v is None else str(v) for v in values], pa.string())
        if name == "row_hash" and not pa.types.is_null(column.type):
            column = column.cast(pa.uint64())
        out[name] = column if name in (ROW_ID, STAGE, ERROR, *kept) else pc.if_else(failed, pa.nulls(n, column.type), column)
    out[ERROR] = pc.if_else(failed, text(INFERENCE_ERROR), text(ERROR))
    out[STAGE] = pc.if_else(failed, pc.if_else(pc.equal(text(STAGE), ""), ENGINE, text(STAGE)), text(STAGE))
    for name in TOKENS:
        out[name] = pc.fill_null(out[name].cast(pa.int64()), 0)
    return pa.table(out)


class RunInterrupted(Explained, KeyboardInterrupt):
    """The run was interrupted (Jupyter's stop button, Ctrl-C): one line says what is safe."""


class RunStalledError(Explained, RuntimeError):
    """No row was written for ``stall_timeout_s``: the run stopped, saying what the cluster lacks."""


class NotReadyError(Explained, RuntimeError):
    """Ray is not running: the cells from 'Start Ray and the engines' down must run again."""


def rows_per_file(plan: Any, rows: int | None) -> int:
    """Ray's ``min_rows_per_file``: a CPU writes each batch as it comes; a GPU run about 64 files of a
    batch to 10,000 rows each (5,000,000 images make 500 files, not 300,000)."""
    if not plan.accelerator_type:
        return plan.batch_size
    return max(plan.batch_size, min(math.ceil(rows / 64) if rows else 1024, 10_000))


@dataclass(frozen=True)
class Written:
    """What a run wrote: the tables a person opens, and the counts and times behind its summary."""

    answered: pd.DataFrame  # rows the model answered (predictions, captions)
    errors: pd.DataFrame  # rows rejected before the model or failed in it, with stage and reason
    this_run: pd.DataFrame  # every row this run wrote (a resumed run's earlier rows aside)
    rows_entered: int | None  # rows that entered the processor in this run (None: Ray did not count)
    rows_before: int  # rows an interrupted run had written (a resumed run)
    seconds: float  # the pipeline, the engines' start included
    steady: float  # rows/s once results flowed; NaN: not measured (see steady_basis)
    steady_basis: str
    stats: str  # Ray Data's statistics per stage
    stages: list[dict[str, Any]]  # each stage's rows out and seconds
    run: Any

    @property
    def rows_written(self) -> int:
        return len(self.this_run)

    @property
    def rows_read(self) -> int | None:
        return None if self.rows_entered is None else self.rows_before + self.rows_entered

    def throughput(self, whole_input: int | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
        """Rows and tokens per second and what the whole input would take at this rate; and Ray's stages,
        slowest first (the bottleneck; the full statistics go to ``ray_stats.txt``)."""
        rate = self.rows_written / self.seconds if self.seconds else float("nan")
        answered = self.this_run[self.this_run[STAGE] == ""].reindex(columns=TOKENS, fill_value=0)
        per = len(answered) or float("nan")
        hours = whole_input / self.steady / 3600 if whole_input and self.steady > 0 else None
        gpus = self.run.plan.gpus
        table = pd.Series({
            "rows written in this run": self.rows_written, "wall time (s)": round(self.seconds, 1),
            "rows/s, end to end": round(rate, 2), "rows/s, steady state": round(self.steady, 2),
            "steady state": self.steady_basis, "input tokens/row": round(answered[TOKENS[0]].sum() / per, 1),
            "output tokens/row": round(answered[TOKENS[1]].sum() / per, 2),
            "whole input, rows": whole_input,
            "whole input, projected hours": round(hours, 2) if hours is not None else "not projected: size or rate unknown",
            "whole input, projected GPU-hours": round(hours * gpus, 2) if hours is not None and gpus else "-",
        }).to_frame("value")
        self.run.path("ray_stats.txt").write_text(self.stats)
        return table, pd.DataFrame(self.stages, columns=["stage", "rows out", "wall time (s)"]).sort_values(
            "wall time (s)", ascending=False).set_index("stage")


def steady_state(files: Sequence[tuple[float, int]], seconds: float) -> tuple[float, str]:
    """Rows per second once results flow: the slope of rows written over time, fitted over this run's
    result files; not claimed from fewer than 5, or ones that came within a tenth of the run."""
    if len(files) < 5:
        return float("nan"), f"not measured: {len(files)} result files, fewer than 5"
    times, rows = np.array(sorted(files), dtype=float).T
    span = float(times[-1] - times[0])
    if span <= 0 or span < 0.1 * seconds:
        return float("nan"), f"not measured: {len(files)} files came within {span:.1f} s of {seconds:.0f} s"
    return float(np.polyfit(times, np.cumsum(rows), 1)[0]), f"fitted over {len(files)} result files written in {span:.1f} s"


def counted(ds, entered: str) -> tuple[int | None, list[dict[str, Any]]]:
    """Ray Data's own counts (its statistics summary, a developer API): the rows out of the stage that runs
    the function named ``entered`` (your wrapped ``preprocess``: the rows that entered the processor; None
    where Ray does not say, or the stage holds the write); and each stage's rows out and seconds."""
    try:
        summaries, stages = [ds.get_stats_summary()], []
        while summaries:
            summary = summaries.pop()
            summaries.extend(summary.parents)
            stages += [{"stage": op.operator_name, "rows out": int(op.output_num_rows.sum) if op.output_num_rows else None,
                        "wall time (s)": round(op.time_total_s, 2), "entered": entered in op.operator_name
                        and "Write" not in op.operator_name} for op in summary.operators_stats]
    except Exception:  # statistics never fail a run that finished; without them nothing is claimed
        return None, []
    rows = [s["rows out"] for s in stages if s.pop("entered")]
    return (rows[0] if len(rows) == 1 else None), stages


def _table(files: Sequence[Any]) -> pd.DataFrame:
    tables = [pq.read_table(f.path, filesystem=f.fs) for f in files]
    return pa.concat_tables(tables, promote_options="permissive").to_pandas() if tables else pd.DataFrame(columns=[STAGE, ERROR])


def write(run: Any, results, answered_name: str) -> Written:
    """``results`` (``processor(ds)``) written to ``OUTPUT_DIR/parts`` as rows come back, resumably where
    the run has an id column, with progress shown; then split into ``answered_name`` and
    ``errors.parquet``. Interrupted, it says how many rows are safe."""
    import ray
    from ray.data.checkpoint import CheckpointConfig

    from helpers import cluster

    if not ray.is_initialized():
        raise NotReadyError("Ray is not running. Run the notebook again from the 'Start Ray and the engines' cell down.")
    plan, parts, checkpoint = run.plan, run.where / run.PARTS, run.where / run.CHECKPOINT
    before, rows = {f for f, _ in parts.files()}, plan.rows
    finished = results.map_batches(finish, batch_format="pyarrow", fn_kwargs={"columns": run.functions.columns, "kept": run.functions.kept},
                                   num_cpus=plan.stage_cpus)
    context, fs = finished.context, parts.fs if parts.remote else None
    if run.id_column:  # on the dataset's own context, for this write only
        context.checkpoint_config = CheckpointConfig(id_column=run.id_column, checkpoint_path=checkpoint.uri,
                                                     override_filesystem=fs, delete_checkpoint_on_success=True,
                                                     checkpoint_filter_cls=cluster.checkpoint_filter())
    started, watched = time.perf_counter(), {}
    try:
        with warnings.catch_warnings(), run.lock.fresh(), progress.shown(
                parts, total=max(rows - run.rows_done, 0) if rows else None, about=plan.rows_estimated,
                stall_s=plan.stall_timeout_s, stuck=lambda: cluster.shortfall(plan.stage_cpus)) as watched:
            warnings.filterwarnings("error", message=".*doesn't support checkpointing.*")  # resumable or nothing
            finished.write_parquet(parts.path if fs else parts.uri, filesystem=fs, mode="append" if run.resuming else "overwrite",
                                   min_rows_per_file=rows_per_file(plan, rows), ray_remote_args={"num_cpus": plan.stage_cpus})
    except KeyboardInterrupt:
        safe = sum(f.parquet_rows() for f, _ in checkpoint.files() if not f.name.endswith(".pending.parquet"))
        if watched.get("stalled"):
            raise RunStalledError(f"No row was written for {plan.stall_timeout_s} s (ENGINE['stall_timeout_s']) and the run "
                                  f"cannot go on: {watched['stalled']}. It stopped: {safe:,} rows are safe in OUTPUT_DIR. Run "
                                  "this cell again once the cluster has room (a node back, or fewer engines: "
                                  "ENGINE['concurrency']).") from None
        raise RunInterrupted(f"interrupted: {safe:,} rows are safe in OUTPUT_DIR; run this cell again with the same "
                             "settings to resume: only the rest is sent to the model." if run.id_column else
                             "interrupted: this run does not resume (RESUME=False or no id column): running the cell "
                             "again starts over, and keeps what it wrote in OUTPUT_DIR/earlier/.") from None
    finally:
        context.checkpoint_config = None
        run.lock.release()
    seconds = time.perf_counter() - started
    listed = parts.files()
    new = [(f, t) for f, t in listed if f not in before]
    everything, now = _table([f for f, _ in listed]), _table([f for f, _ in new])
    is_error = everything[STAGE] != ""
    answered = everything[~is_error].drop(columns=[ERROR, STAGE]).reset_index(drop=True)
    errors = everything[is_error].rename(columns={ERROR: "reason"}).reset_index(drop=True)
    answered.to_parquet(run.path(answered_name), index=False)
    errors.to_parquet(run.path("errors.parquet"), index=False)
    steady, basis = steady_state([(t, f.parquet_rows()) for f, t in new], seconds)
    try:
        stats = finished.stats()
    except Exception as exc:  # statistics never fail a run that finished
        stats = f"(no statistics: {exc})"
    entered, stages = counted(finished, run.functions.preprocess.__name__)
    return Written(answered, errors, now, entered, len(everything) - len(now), seconds, steady, basis, stats, stages, run)


def first_rows(ds, limit: int | None, done: int = 0):
    """The first ``limit`` rows in the input's order (files by name, rows in file order), the same rows
    every run (Ray's ``limit`` alone keeps the first to arrive). ``done``: the rows an interrupted run
    finished (``run.rows_done``). Resuming drops them as they are read, so the limit counts the rest."""
    if not limit:
        return ds
    ds.context.execution_options.preserve_order = True
    return ds.limit(max(limit - done, 0))


class IdColumnError(Explained, ValueError):
    """``ID_COLUMN`` has empty or repeated values."""


class EmptyInputError(Explained, ValueError):
    """The input holds no rows."""


def check_ids(ds, column: str | None, limit: int | None = None, sample: int = 200) -> list[dict[str, Any]]:
    """The first ``sample`` rows of the first ``limit``; with ``column``, every id read in the same pass,
    and an error naming the empty and repeated ones and the fix."""
    ds, kept, ids = first_rows(ds, limit), [], []
    for batch in ds.iter_batches(batch_format="pandas", batch_size=65_536) if column else [pd.DataFrame(ds.take(sample))]:
        kept += batch.head(sample - len(kept)).to_dict("records")
        ids += [batch[column].astype("string")] if column else []
    if not kept:
        raise EmptyInputError("The input holds no rows to run on (after LIMIT and the rows already done).")
    if not column:
        return kept
    ids = pd.concat(ids)
    blank = ids.isna() | ids.str.strip().eq("")
    empty, counts = int(blank.sum()), ids[~blank].value_counts()
    repeated = counts[counts > 1]
    if empty or len(repeated):
        said = ([f"{empty} of {len(ids)} rows have no {column!r} value"] if empty else []) + (
            [f"{len(repeated)} values are shared by several rows: " + ", ".join(f"{v!r} ({n} rows)" for v, n in repeated.head(5).items())]
            if len(repeated) else [])
        raise IdColumnError(f"ID_COLUMN={column!r} must give every row an id of its own, but {'; '.join(said)}. Results "
                            "are matched to your rows, and an interrupted run resumed, by this id. Give those rows unique "
                            "ids, or set ID_COLUMN=None to derive each row's id from its content (resuming is then off).")
    return kept
