"""What a running pipeline shows: in Jupyter one line updated in place (rows, rate, time left); headless
(papermill, a job) a line in the job's log every minute (engines that never start: ``engines.Engines.ready``)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator

from helpers.storage import Location

PROGRESS_ENV, HEARTBEAT_ENV = "LLM_KIT_PROGRESS", "LLM_KIT_HEARTBEAT_S"  # 0/1; seconds between log lines


def interactive() -> bool:
    """True when a person steps through the notebook: Jupyter lets a kernel ask for input, papermill
    and nbclient do not (``allow_stdin``)."""
    forced = os.environ.get(PROGRESS_ENV)
    if forced in ("0", "1"):
        return forced == "1"
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    kernel = getattr(get_ipython(), "kernel", None)
    parent = kernel.get_parent("shell") if hasattr(kernel, "get_parent") else {}
    return bool((parent or {}).get("content", {}).get("allow_stdin", False))


def log(line: str) -> None:
    """``line`` in the job's log, not the notebook (a kernel's ``sys.stderr.fileno()`` is the log)."""
    try:
        with open(sys.stderr.fileno(), "w", closefd=False) as stream:
            print(f"[llm-batch-kit] {line}", file=stream, flush=True)
    except (AttributeError, OSError, ValueError):  # no descriptor (a test's stream)
        print(f"[llm-batch-kit] {line}", file=sys.__stderr__, flush=True)


def say(line: str) -> None:
    """``line`` below the cell, and in a headless run also in the job's log, where a person looks."""
    print(line, flush=True)
    if not interactive():
        log(line)


def _rows(folder: Location, counted: dict) -> int:
    """Rows in ``folder``'s result files, each file's footer read once."""
    for f, _ in folder.files():
        if f not in counted:
            with contextlib.suppress(Exception):  # a file still being written: counted next time
                counted[f] = f.parquet_rows()
    return sum(counted.values())


def line(seconds: float, rows: int, total: int | None, rate: float, about: bool = False, done: bool = False) -> str:
    if not rows and not done:
        return f"{seconds:.0f} s: sending the first batches; no rows written yet"
    of = f" of {'about ' if about else ''}{total:,}" if total else ""
    left = f", about {(total - rows) / rate / 60:.1f} min left" if total and rate > 0 and rows < total and not done else ""
    return f"{'done in ' if done else ''}{seconds:.0f} s: {rows:,}{of} rows written{f', {rate:.1f} rows/s' if rate > 0 else ''}{left}"


@contextlib.contextmanager
def shown(folder: Location, *, total: int | None, about: bool, every_s: float = 2.0, display=None,
          stall_s: float = 0, stuck: Callable[[], str] = str) -> Iterator[dict]:
    """While the code inside writes to ``folder``: the progress line (Jupyter) or a log line every
    ``LLM_KIT_HEARTBEAT_S`` s (headless). No new row for ``stall_s`` while ``stuck()`` names what the run
    lacks interrupts the code inside (as the stop button does), with that in what it yields (``"stalled"``)."""
    counted: dict = {}
    before, started, done = _rows(folder, counted), time.monotonic(), threading.Event()
    person = interactive()
    beat_s = every_s if person else float(os.environ.get(HEARTBEAT_ENV, 60))
    if person:
        display = display or __import__("IPython.display", fromlist=["display"]).display
        handle = display({"text/plain": line(0, 0, total, 0)}, raw=True, display_id=True)
    elif beat_s:
        log(f"pipeline started: a progress line every {beat_s:g} s here")

    state = {"first": None, "shown": started, "rows": 0, "moved": started, "stalled": ""}

    def show(final: bool = False) -> None:
        rows, now = _rows(folder, counted) - before, time.monotonic()
        if rows != state["rows"]:
            state["rows"], state["moved"] = rows, now
        if rows and state["first"] is None:
            state["first"] = (now, rows)
        if final:  # the whole run's, as the summary counts it (a log samples the first rows only once a minute)
            rate = rows / max(now - started, 1e-9)
        else:  # the rate since the first rows came, not the engine's start
            t0, r0 = state["first"] or (now, rows)
            rate = (rows - r0) / (now - t0) if now > t0 else 0.0
        shown = line(now - started, rows, total, rate, about, final)
        if person:
            handle.update({"text/plain": shown}, raw=True)
        else:
            log(shown)
        state["shown"] = now

    def watch() -> None:
        while not done.wait(1.0):
            late = stall_s and time.monotonic() - state["moved"] >= stall_s
            if late or beat_s and time.monotonic() - state["shown"] >= beat_s:
                show()
            if stall_s and time.monotonic() - state["moved"] >= stall_s and not done.is_set():
                state["stalled"] = stuck()
                if state["stalled"]:
                    signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)  # as Jupyter's stop button
                    return
                state["moved"] = time.monotonic()  # only slow (big files, say): looked at again in stall_s

    threading.Thread(target=watch, daemon=True, name="progress").start()
    ended, deaf = False, signal.getsignal(signal.SIGINT) == signal.SIG_IGN  # a job started in the background ignores
    if ignored := bool(stall_s) and deaf and threading.current_thread() is threading.main_thread():  # Ctrl-C: the stop needs it
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield state
        ended = True
    finally:
        done.set()
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        show(final=ended)  # "done in ..." only for a write that ended
