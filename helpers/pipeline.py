"""The plumbing both notebooks share, one call per step: start Ray for a run, make any one row's
failure a recorded reason, write everything in one pass, and account for every row.

One pass: rows rejected before the model travel through the processor with it. Ray Data LLM lets a
row that carries an error (its ``__inference_error__`` column, what ``should_continue_on_error``
uses) bypass every stage and the user's ``postprocess``; :func:`guard_preprocess` gives a rejected
row that error instead of a request, so it reaches the one write untouched, and the input is read
once. :func:`finish` then gives every row the same columns and a ``stage`` ("" when answered).
"""

from __future__ import annotations

import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from helpers import engine
from helpers.errors import Explained
from helpers.data import REJECT_REASON
from helpers.location import Location
from helpers.outputs import ENGINE_COLUMNS, ERRORS, RunOutputs, parquet_rows, prepare_output_dir, read_parts, result_row

#: Ray Data LLM's per-row error column: a row with a non-empty value skips every stage.
INFERENCE_ERROR = "__inference_error__"
#: Where a row stopped: "" (answered), or one of the stages below.
STAGE = "stage"
REJECTED = "rejected before the model"
ENGINE = "engine"
POSTPROCESS = "postprocess"
RESULTS = "results"  # the parts folder of the one write
#: Set to 0 or 1 to turn Ray Data's progress reports off or on whatever :func:`interactive` says.
PROGRESS_ENV = "LLM_KIT_PROGRESS"
#: The DataContext entry that records which Ray session a dataset was read in (:meth:`Session.check_ready`).
OWNER_KEY = "llm_batch_kit.owner"


class NotReadyError(Explained, RuntimeError):
    """The run cell cannot start in this kernel's state; the message says which cell to run from."""


def interactive() -> bool:
    """True when a person is stepping through the notebook in Jupyter (or IPython).

    Headless executors (papermill, nbconvert, nbclient, and so a job) run the kernel with
    ``allow_stdin=False``, as the Jupyter protocol lets a client that cannot answer ``input()``
    say; a Jupyter frontend allows it. :data:`PROGRESS_ENV` overrides the guess.
    """
    forced = os.environ.get(PROGRESS_ENV)
    if forced in ("0", "1"):
        return forced == "1"
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    kernel = getattr(shell, "kernel", None)
    if kernel is None:
        return shell is not None  # a terminal IPython
    return bool(getattr(kernel, "_allow_stdin", False))


@dataclass(frozen=True)
class Session:
    """What :func:`start_ray` set up: the cluster's resources, the CPU budget, the engine's
    environment (for the processor's ``runtime_env``) and whether progress is shown."""

    cluster: dict[str, float]
    budget: engine.CpuBudget
    engine_env: dict[str, str]
    threads_bind: str | None
    progress: bool
    #: The processor-config fields that place the engine (:func:`helpers.engine.engine_placement`).
    placement: dict[str, Any] = field(default_factory=dict)
    stage_cpus: float = 0.1  # Ray CPUs each light stage holds (read, prompts, write)
    startup_timeout_s: float | None = 600  # the first results must be written within this (None: no limit)
    address: str | None = None  # the cluster joined (RAY_ADDRESS, or one running here); None: a local Ray
    batch_size: int = 0  # rows per engine batch: the rows of each block that enters the engine (0: as read)
    #: A token of this start, recorded in the datasets read after it (:data:`OWNER_KEY`).
    owner: str = ""
    #: This driver's connection to Ray: its node and job (a Ray started again, or joined again, has
    #: another pair; the driver's worker id stays the same).
    connection: str = ""

    def check_ready(self, ds) -> None:
        """Raise :class:`NotReadyError`, saying which cell to run from, unless Ray is the one this session
        started and ``ds`` was built in it. Called before anything touches the output folder: in
        Jupyter, re-running the run cell after the summary cell (which shuts Ray down) failed only
        after the earlier results were gone, and a dataset of the previous Ray session fails with
        Ray's "owner is unknown"."""
        import ray

        if not ray.is_initialized():
            raise NotReadyError("Ray is not running: the Summary cell shuts it down to free the engine's memory. "
                                "Run the notebook again from the 'Start Ray' cell down. Nothing in OUTPUT_DIR was touched.")
        if _connection() != self.connection:
            raise NotReadyError("Ray was started again after the 'Start Ray' cell ran. Run the notebook again from the "
                                "'Start Ray' cell down. Nothing in OUTPUT_DIR was touched.")
        built_in = ds.context.get_config(OWNER_KEY)
        if built_in != self.owner:
            raise NotReadyError("`ds` was read before Ray was last started, and Ray has forgotten its blocks. Run the "
                                "notebook again from the 'Read the data' cell down. Nothing in OUTPUT_DIR was touched.")

    def prepare_output(self, output_dir: str, ds, *, resume: bool, start_over: bool,
                       settings: Mapping[str, Any]) -> RunOutputs:
        """:meth:`check_ready`, then :func:`helpers.outputs.prepare_output_dir`: the output folder is
        touched only once the run can start."""
        self.check_ready(ds)
        return prepare_output_dir(output_dir, resume=resume, settings=settings, start_over=start_over)

    def describe(self) -> str:
        where = f"joined the Ray cluster at {self.address}" if self.address else "started a local Ray"
        return (f"{where}: {self.cluster.get('CPU', 0):g} CPUs and {self.cluster.get('GPU', 0):g} GPUs; this run "
                f"reserves {self.budget.reserved:g} CPUs for actors; engine cores: {self.threads_bind or 'chosen by vLLM'}; "
                f"progress: {'one line below the run cell, updated in place' if self.progress else 'a line in the log every minute'}"
                f"{_dashboard()}")


def start_ray(run_config: Any, *, stage_cpus: float, stage_actors_per_replica: int, kv_cache_gib: float | None,
              startup_timeout_s: int = 600, verbose: bool = False) -> Session:
    """Start (or connect to) Ray for one run and fail fast if the run can never be scheduled.

    The engine holds one CPU per replica and each light actor stage ``stage_cpus`` per replica; a
    local Ray gets enough logical CPUs that short tasks never wait forever behind them
    (:class:`helpers.engine.CpuBudget`). A single local CPU engine computes on every core
    (:func:`helpers.engine.cpu_threads_bind`). Progress reports are on when a person steps through
    the notebook (:func:`interactive`) or with ``verbose``, off in papermill runs and jobs.
    """
    replicas = engine.max_replicas(run_config.concurrency)
    budget = engine.CpuBudget(engine_cpus=1, engine_replicas=replicas, stage_cpus=stage_cpus,
                              stage_actors=stage_actors_per_replica * replicas)
    threads = engine.cpu_threads_bind(run_config.accelerator_type, replicas)
    env = engine.engine_env(kv_cache_gib, threads_bind=threads)
    progress = interactive()  # the kit's one line that updates in place; Ray's own reports only with verbose
    address = engine.cluster_address()
    cluster = engine.start_ray(budget, env, verbose=verbose, progress=verbose)
    engine.check_schedulable(cluster, budget, run_config.accelerator_type, run_config.gpus_per_replica)
    import uuid

    import ray

    owner = uuid.uuid4().hex
    ray.data.DataContext.get_current().set_config(OWNER_KEY, owner)  # datasets read from now on carry it
    return Session(cluster=cluster, budget=budget, engine_env=env, threads_bind=threads, progress=progress,
                   placement=engine.engine_placement(run_config.accelerator_type,
                                                     gpus_per_replica=run_config.gpus_per_replica or 1.0),
                   stage_cpus=stage_cpus, startup_timeout_s=startup_timeout_s, address=address,
                   batch_size=run_config.batch_size, owner=owner, connection=_connection())


def _connection() -> str:
    """This driver's connection to Ray: the node and the job it runs as."""
    import ray

    context = ray.get_runtime_context()
    return f"{context.get_node_id()}:{context.get_job_id()}"


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


def finish(table, *, carry: Sequence[str], outputs: Mapping[str, Any]):
    """Give every row of a batch the same columns, in order: ``carry``, the task's ``outputs``
    (their defaults on rows without an answer), the engine's columns, ``error`` and ``stage``.

    Rows that skipped the engine or failed in it come out of the processor in their raw shape with
    ``__inference_error__``; they get ``stage`` "rejected before the model" or "engine" and the
    message as ``error``. Works on Arrow batches (``map_batches(batch_format="pyarrow")``): the
    columns left behind (images, messages) are never converted.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    n = table.num_rows
    names = set(table.column_names)

    def text(name: str):
        if name not in names:
            return pa.array([""] * n, pa.string())
        return pc.fill_null(table.column(name).cast(pa.string()), "")

    failed = pc.not_equal(text(INFERENCE_ERROR), "")
    stage = pc.if_else(failed, pc.if_else(pc.equal(text(STAGE), ""), ENGINE, text(STAGE)), text(STAGE))
    error = pc.if_else(failed, text(INFERENCE_ERROR), text("error"))
    columns: dict[str, Any] = {c: table.column(c) if c in names else pa.nulls(n) for c in carry}
    for name, default in {**outputs, **ENGINE_COLUMNS}.items():
        value = pa.scalar(default)
        if name not in names or pa.types.is_null(table.column(name).type):
            columns[name] = pa.array([default] * n, value.type)
            continue
        column = table.column(name).cast(value.type)
        columns[name] = pc.if_else(failed, value, pc.fill_null(column, value))
    columns["error"], columns[STAGE] = error, stage
    return pa.table(columns)


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


def rows_entering(table):
    """The rows entering the processor, unchanged. :func:`run` inserts this step right before the
    processor so that Ray's execution statistics count, under this name, every row this run sends
    in: after a ``LIMIT``, and without the rows an interrupted run finished (Ray's checkpoint filter
    drops those after the read). A whole block per call (no re-batching) and zero-copy, fused by Ray
    into the step before it: one function call per block (its cost was not measured on its own)."""
    return table


def _rows_entering(ds) -> int | None:
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


def _stats(ds) -> str:
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


def _written_since(folder: Path | Location, since: float) -> bool:
    return any(mtime >= since for _, mtime in Location.of(folder).files())


#: Seconds between the progress lines of a headless run (papermill, a job); 0 turns them off.
HEARTBEAT_ENV = "LLM_KIT_HEARTBEAT_S"
HEARTBEAT_S = 60


def heartbeat_seconds() -> float:
    """:data:`HEARTBEAT_ENV` if set, else :data:`HEARTBEAT_S`."""
    try:
        return float(os.environ.get(HEARTBEAT_ENV, HEARTBEAT_S))
    except ValueError:
        return HEARTBEAT_S


def _progress_line(minutes: float, rows: int, total: int | None, recent: float, window: float) -> str:
    of = f" of {total:,}" if total else ""
    left = ""
    if total and recent > 0 and rows < total:
        left = f"; about {(total - rows) / recent / 60:.0f} min left at that rate"
    return (f"[llm-batch-kit] {minutes:.1f} min: {rows:,}{of} rows written, {recent:.1f} rows/s over the last "
            f"{window:.0f} s{left}")


def log_stream():
    """A text stream to the process's own standard error, never into a notebook's output.

    In a kernel, ``sys.stderr`` forwards to the notebook, and ipykernel also captures file
    descriptor 2 (so ``sys.__stderr__`` reaches the notebook too); ``sys.stderr.fileno()`` is the
    copy of the original stream it keeps: the terminal or job log that started the kernel."""
    try:
        return open(sys.stderr.fileno(), "w", buffering=1, closefd=False)
    except (AttributeError, OSError, ValueError):  # no file descriptor (a test's stream): as it is
        return sys.__stderr__


def _counter(folder: Location) -> Callable[[], int]:
    """A function that counts the rows in ``folder``'s result files, reading each file's footer once."""
    counted: dict[Location, int] = {}

    def written() -> int:
        for f, _ in folder.files():
            if f not in counted:
                try:
                    counted[f] = parquet_rows(f)
                except Exception:  # a file still being written: counted at the next look
                    continue
        return sum(counted.values())

    return written


def _live_line(seconds: float, rows: int, total: int | None, rate: float, done: bool = False) -> str:
    if not rows:
        return f"{seconds:.0f} s: starting the engine and sending the first batches; no rows written yet"
    of = f" of {total:,}" if total else ""
    speed = f", {rate:.1f} rows/s" if rate > 0 else ""  # from the second result file on
    left = f", about {(total - rows) / rate / 60:.1f} min left" if total and rate > 0 and rows < total else ""
    return f"{'done in ' if done else ''}{seconds:.0f} s: {rows:,}{of} rows written{speed}{'' if done else left}"


@contextmanager
def live_progress(folder: Path | Location, *, total: int | None = None, every_s: float = 2.0,
                  display=None) -> Iterator[None]:
    """While the code inside runs, one line in the notebook that updates in place every ``every_s``
    seconds: rows written to ``folder`` of ``total``, the rate since the first rows, and the time left.
    ``display``: IPython's (the default), or a stand-in for tests."""
    if display is None:
        from IPython.display import display
    folder = Location.of(folder)
    written = _counter(folder)
    before, started, done = written(), time.monotonic(), threading.Event()
    handle = display({"text/plain": _live_line(0, 0, total, 0)}, raw=True, display_id=True)
    first: list[tuple[float, int]] = []

    def show(done: bool = False) -> None:
        rows, now = written() - before, time.monotonic()
        if rows and not first:
            first.append((now, rows))
        rate = (rows - first[0][1]) / (now - first[0][0]) if first and now > first[0][0] else 0.0
        handle.update({"text/plain": _live_line(now - started, rows, total, rate, done)}, raw=True)

    def tick() -> None:
        while not done.wait(every_s):
            show()

    threading.Thread(target=tick, daemon=True, name="live-progress").start()
    try:
        yield
    finally:
        done.set()
        show(done=True)


@contextmanager
def heartbeat(folder: Path | Location, every_s: float, *, total: int | None = None, stream=None) -> Iterator[None]:
    """While the code inside runs, write a progress line every ``every_s`` seconds: rows written to
    ``folder`` in this run (result files' footers, each read once), the rate over the last interval
    and, with a known ``total`` (``LIMIT``), the time left at that rate.

    The lines go to the process's own standard error (:func:`log_stream`): in a notebook kernel that
    is the terminal or job log that started papermill, not the executed notebook, so the report
    stays clean while a long headless run is never silent. ``every_s`` 0: nothing."""
    if not every_s:
        yield
        return
    stream = stream or log_stream()
    written = _counter(Location.of(folder))
    before, started, done = written(), time.monotonic(), threading.Event()

    def beat() -> None:
        last_rows, last_t = 0, started
        while not done.wait(every_s):
            rows, now = written() - before, time.monotonic()
            line = _progress_line((now - started) / 60, rows, total, (rows - last_rows) / max(now - last_t, 1e-9),
                                  now - last_t)
            print(line, file=stream, flush=True)
            last_rows, last_t = rows, now

    threading.Thread(target=beat, daemon=True, name="progress-heartbeat").start()
    try:
        yield
    finally:
        done.set()


#: Ray logs one error-level line per process as Ray Data's actor stages start (core_worker.cc, "has
#: constructor arguments in the object store and max_restarts > 0"). It cannot be quieted alone, and it
#: needs no action here: Ray Data holds those arguments for the whole run. Headless runs say so first.
ACTOR_ARGUMENTS_NOTE = ("Ray may now log an 'E ... core_worker.cc' line that an actor 'has constructor arguments "
                        "in the object store': expected with Ray Data's actor stages, nothing to do (Ray Data "
                        "keeps those arguments for the whole run; ray-project/ray#53727).")


def _dashboard() -> str:
    """Where the Ray Dashboard shows each operator's progress, if Ray says."""
    try:
        from ray._private.worker import get_dashboard_url

        url = get_dashboard_url()
    except Exception:  # a hint only
        return ""
    return f"; each operator's progress: the Ray Dashboard, http://{url}" if url else ""


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


class _NoResultsInTime(KeyboardInterrupt):
    """Raised in the main thread by :func:`first_results_within`'s watchdog. A KeyboardInterrupt,
    so that Ray Data stops the run as it does for Ctrl-C."""


@contextmanager
def first_results_within(folder: Path | Location, seconds: float | None) -> Iterator[None]:
    """Stop the code inside (with a ``TimeoutError``) if no result file appears in ``folder``
    within ``seconds``: engine replicas that cannot start (too few GPUs on a cluster, an engine stuck
    in its start) would otherwise keep a run waiting forever. The first file comes after the engine
    started and one batch went through, so give big models room. The watchdog sends the process a
    SIGINT (a real signal also wakes blocking waits), handled here while the code runs, whatever the
    process inherited (a background job ignores SIGINT); Ctrl-C and Jupyter's interrupt still
    interrupt. Only on the main thread; ``None`` or 0: no limit."""
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return
    since, done, fired = time.time() - 1, threading.Event(), threading.Event()

    def on_sigint(signum, frame):
        if fired.is_set():
            raise _NoResultsInTime()
        if callable(previous):
            return previous(signum, frame)
        raise KeyboardInterrupt

    def watch() -> None:
        deadline = time.monotonic() + seconds
        while not done.wait(1.0):
            if _written_since(folder, since):
                return
            if time.monotonic() > deadline and not done.is_set():
                fired.set()
                os.kill(os.getpid(), signal.SIGINT)
                return

    previous = signal.signal(signal.SIGINT, on_sigint)
    threading.Thread(target=watch, daemon=True, name="first-results-watchdog").start()
    try:
        yield
    except _NoResultsInTime:
        raise TimeoutError(
            f"no results were written within STARTUP_TIMEOUT_S={seconds:g} s: the engine did not start, or "
            "its first batch took longer. Ray's logs say why (on this machine: /tmp/ray/session_latest/logs); "
            "for a big model, raise STARTUP_TIMEOUT_S.") from None
    finally:
        done.set()
        signal.signal(signal.SIGINT, previous)


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


def run(processor: Callable, ds, out: RunOutputs, session: Session, *, carry: Sequence[str],
        outputs: Mapping[str, Any], id_column: str | None, answered_name: str, limit: int | None = None,
        expected_rows: int | None = None) -> RunResult:
    """Run ``processor`` over ``ds`` once: every row, answered or not, is written in one pass to
    ``OUTPUT_DIR/parts/results`` (resumably, see :meth:`RunOutputs.write`); then split into
    ``answered_name`` (rows with an answer) and ``errors.parquet`` (rows with a stage and a reason).

    Rows enter the engine in blocks of one batch (``session.batch_size``; Ray's streaming
    repartition): a read block larger than a batch would make one engine task of several batches,
    whose rows all come back when the last does (with 2,000 images in 64 blocks, every block ended
    in the same 4 s). Results are written as they come, :func:`rows_per_file` rows a file, from
    ``expected_rows`` (the input's size, when known).

    ``limit`` is the run's ``LIMIT`` (``ds`` already holds at most that many rows). Resuming, Ray's
    checkpoint filter drops the rows an interrupted run finished right after the read, so a limit
    after it would count that many *new* rows: the run then takes only the ``limit`` minus the rows
    done, and a retried job with ``LIMIT`` ends with ``LIMIT`` rows, each once.

    On a cluster of several nodes, every node must see ``OUTPUT_DIR`` (checked first:
    :func:`helpers.engine.check_every_node_sees`). Ray Data starts every stage's actors at once (the
    engine's start overlaps the light stages');
    if no result is written within ``session.startup_timeout_s``, the run stops with a
    ``TimeoutError`` instead of waiting forever (:func:`first_results_within`).
    """
    stage_cpus = session.stage_cpus
    if not out.where.remote:  # a bucket is one place for every node; a local path may not be
        engine.check_every_node_sees(out.root)  # several nodes: each must see OUTPUT_DIR, or rows are lost
    started = time.perf_counter()
    if limit and out.rows_done:
        ds = ds.limit(max(limit - out.rows_done, 0))
    if session.batch_size:
        ds = ds.repartition(target_num_rows_per_block=session.batch_size)
    entering = ds.map_batches(rows_entering, batch_format="pyarrow", zero_copy_batch=True, num_cpus=stage_cpus)
    finished = processor(entering).map_batches(finish, batch_format="pyarrow", num_cpus=stage_cpus,
                                               fn_kwargs={"carry": list(carry), "outputs": dict(outputs)})
    known = min(filter(None, (limit, expected_rows)), default=None)
    total = max(known - out.rows_done, 0) if known else None
    if session.progress:  # a person in Jupyter: one line that updates in place
        print(ACTOR_ARGUMENTS_NOTE, flush=True)
        progress = live_progress(out.parts(RESULTS), total=total)
    else:  # headless: a line in the log every minute, never in the report
        beat_s = heartbeat_seconds()
        if beat_s:
            print(f"[llm-batch-kit] pipeline started: a progress line every {beat_s:g} s here{_dashboard()}.\n"
                  f"[llm-batch-kit] {ACTOR_ARGUMENTS_NOTE}", file=log_stream(), flush=True)
        progress = heartbeat(out.parts(RESULTS), beat_s, total=total)
    try:
        with first_results_within(out.parts(RESULTS), session.startup_timeout_s), progress:
            written = out.write(finished, RESULTS, id_column=id_column, num_cpus=stage_cpus,
                                rows_per_file=rows_per_file(session.batch_size, known))
    except KeyboardInterrupt:
        raise RunInterrupted(_interrupted_message(out, id_column)) from None
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
        root=out.root, answered=answered, errors=errors, rows_entered_now=_rows_entering(finished),
        rows_written_now=written.rows, rows_written_before=written.rows_before,
        throughput=throughput, files=written.files, stats=_stats(finished), run=out,
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
