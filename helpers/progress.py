"""What a running pipeline shows: one line that updates in place in Jupyter, a heartbeat line in a
headless run's log, and the watchdog that stops a run whose first results never come."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from helpers.location import Location
from helpers.outputs import parquet_rows


#: Set to 0 or 1 to turn Ray Data's progress reports off or on whatever :func:`interactive` says.
PROGRESS_ENV = "LLM_KIT_PROGRESS"


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


def _of(total: int | None, about: bool) -> str:
    return f" of {'about ' if about else ''}{total:,}" if total else ""


def _progress_line(minutes: float, rows: int, total: int | None, recent: float, window: float,
                   about: bool = False) -> str:
    of = _of(total, about)
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


def _live_line(seconds: float, rows: int, total: int | None, rate: float, done: bool = False,
               about: bool = False) -> str:
    if not rows:
        return f"{seconds:.0f} s: starting the engine and sending the first batches; no rows written yet"
    of = _of(total, about)
    speed = f", {rate:.1f} rows/s" if rate > 0 else ""  # from the second result file on
    left = f", about {(total - rows) / rate / 60:.1f} min left" if total and rate > 0 and rows < total else ""
    return f"{'done in ' if done else ''}{seconds:.0f} s: {rows:,}{of} rows written{speed}{'' if done else left}"


@contextmanager
def live_progress(folder: Path | Location, *, total: int | None = None, about: bool = False, every_s: float = 2.0,
                  display=None) -> Iterator[None]:
    """While the code inside runs, one line in the notebook that updates in place every ``every_s``
    seconds: rows written to ``folder`` of ``total`` ("of about" where ``about``: an estimate), the
    rate since the first rows, and the time left. ``display``: IPython's (the default), or a
    stand-in for tests."""
    if display is None:
        from IPython.display import display
    folder = Location.of(folder)
    written = _counter(folder)
    before, started, done = written(), time.monotonic(), threading.Event()
    handle = display({"text/plain": _live_line(0, 0, total, 0, about=about)}, raw=True, display_id=True)
    first: list[tuple[float, int]] = []

    def show(done: bool = False) -> None:
        rows, now = written() - before, time.monotonic()
        if rows and not first:
            first.append((now, rows))
        rate = (rows - first[0][1]) / (now - first[0][0]) if first and now > first[0][0] else 0.0
        handle.update({"text/plain": _live_line(now - started, rows, total, rate, done, about)}, raw=True)

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
def heartbeat(folder: Path | Location, every_s: float, *, total: int | None = None, about: bool = False,
              stream=None) -> Iterator[None]:
    """While the code inside runs, write a progress line every ``every_s`` seconds: rows written to
    ``folder`` in this run (result files' footers, each read once), the rate over the last interval
    and, with a known ``total`` (``LIMIT`` or the input's size; ``about``: an estimate), the time left
    at that rate.

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
                                  now - last_t, about)
            print(line, file=stream, flush=True)
            last_rows, last_t = rows, now

    threading.Thread(target=beat, daemon=True, name="progress-heartbeat").start()
    try:
        yield
    finally:
        done.set()


def dashboard() -> str:
    """Where the Ray Dashboard shows each operator's progress, if Ray says."""
    try:
        from ray._private.worker import get_dashboard_url

        url = get_dashboard_url()
    except Exception:  # a hint only
        return ""
    return f"; each operator's progress: the Ray Dashboard, http://{url}" if url else ""


class _NoResultsInTime(KeyboardInterrupt):
    """Raised in the main thread by :func:`first_results_within`'s watchdog. A KeyboardInterrupt,
    so that Ray Data stops the run as it does for Ctrl-C."""


class UnplaceableError(RuntimeError):
    """Ray waited a minute to place a task or an actor of the run that no node has room for."""


#: How long a request no node can hold may wait, with no result written, before the run stops.
UNPLACEABLE_S = 60


@contextmanager
def first_results_within(folder: Path | Location, seconds: float | None,
                         unplaceable: Callable[[], str] | None = None,
                         unplaceable_s: float = UNPLACEABLE_S,
                         first_batch: Callable[[], bool] | None = None) -> Iterator[None]:
    """Stop the code inside (with a ``TimeoutError``) if no result file appears in ``folder``
    within ``seconds``: engine replicas that cannot start (too few GPUs on a cluster, an engine stuck
    in its start) would otherwise keep a run waiting forever. The first file comes after the engine
    started and one batch went through, so give big models room. The watchdog sends the process a
    SIGINT (a real signal also wakes blocking waits), handled here while the code runs, whatever the
    process inherited (a background job ignores SIGINT); Ctrl-C and Jupyter's interrupt still
    interrupt. Only on the main thread; ``None`` or 0: no limit.

    ``unplaceable`` (:func:`helpers.autoscale.unplaceable`) is asked every 10 s what Ray waits to place
    that no node has room for: a request that stays so for ``unplaceable_s`` while no result is
    written stops the run at once with an :class:`UnplaceableError` that says what was asked and what
    each node has free, instead of a timeout that blames the engine.

    ``first_batch`` says (asked every 5 s) whether the engine's first batch came out: the watch ends
    there, before the first result file, which waits for up to a file's rows (10,000): a slow model on
    a big input was stopped while it worked."""
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return
    since, done, fired = time.time() - 1, threading.Event(), threading.Event()
    stuck: list[str] = []  # why the watchdog fired, when a request could not be placed

    def on_sigint(signum, frame):
        if fired.is_set():
            raise _NoResultsInTime()
        if callable(previous):
            return previous(signum, frame)
        raise KeyboardInterrupt

    def watch() -> None:
        deadline = time.monotonic() + seconds
        waiting_since, asked, looked = None, 0.0, 0.0
        while not done.wait(1.0):
            now = time.monotonic()
            if _written_since(folder, since):
                return
            if first_batch is not None and now - looked >= 5:
                looked = now
                if first_batch():
                    return
            if unplaceable is not None and now - asked >= 10:
                asked, why = now, unplaceable()
                waiting_since = (waiting_since or now) if why else None
                if why and now - waiting_since >= unplaceable_s:
                    stuck.append(f"{why}, for {now - waiting_since:.0f} s with no result written")
            if (now > deadline or stuck) and not done.is_set():
                fired.set()
                os.kill(os.getpid(), signal.SIGINT)
                return

    previous = signal.signal(signal.SIGINT, on_sigint)
    threading.Thread(target=watch, daemon=True, name="first-results-watchdog").start()
    try:
        yield
    except _NoResultsInTime:
        if stuck:
            raise UnplaceableError(
                f"{stuck[0]}. The run stopped instead of waiting for STARTUP_TIMEOUT_S. Lower CONCURRENCY or "
                "CPU_STAGE_CPUS, or use nodes with more room.") from None
        raise TimeoutError(
            f"no results were written within STARTUP_TIMEOUT_S={seconds:g} s, and no batch came out of the engine: "
            "it did not start, or its first batch took longer. Ray's logs say why (on this machine: /tmp/ray/session_latest/logs); "
            "for a big model, raise STARTUP_TIMEOUT_S.") from None
    finally:
        done.set()
        signal.signal(signal.SIGINT, previous)
