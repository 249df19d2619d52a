"""One run per ``OUTPUT_DIR`` at a time: a lock file that the live run keeps fresh and a second run
reads before it touches anything.

Without it, a second run in the same folder (a job retried while the first still ran, a notebook
started twice) moved the live run's parts aside under it, and in a bucket, where a move is a copy
and a delete, lost the objects written in between. The lock names its run, machine and process and
the last time it was seen alive; a lock left by a run that died is taken over: at once where its
process is gone from this machine, else once it has not been refreshed for :data:`STALE_S` seconds
(a live run refreshes it every :data:`BEAT_S` while it writes, and removes it when it ends).
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from helpers.errors import Explained
from helpers.location import Location

#: The lock's file in ``OUTPUT_DIR``.
LOCK = "run.lock"
#: The live run refreshes its lock this often while it writes ...
BEAT_S = 30.0
#: ... and a lock not refreshed for this long is a dead run's.
STALE_S = 120.0


class RunningElsewhereError(Explained, RuntimeError):
    """Another run is writing to this ``OUTPUT_DIR`` now."""


def _alive_here(record: dict[str, Any]) -> bool | None:
    """Whether the lock's process still runs, where it ran on this machine; None: another machine's."""
    if record.get("host") != socket.gethostname():
        return None
    try:
        os.kill(int(record.get("pid", -1)), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError, OverflowError):  # someone else's process, or a record that makes no sense
        return True
    return True


def _read(where: Location) -> dict[str, Any]:
    try:
        return json.loads((where / LOCK).read_text())
    except (OSError, ValueError):
        return {}


def holder(where: Location, now: float | None = None) -> str:
    """Who holds ``where``'s lock, in words, where a live run does ("" when none does): ours (this
    process) counts as none, a re-run in the same kernel takes it over."""
    record = _read(where)
    if not record or (record.get("host") == socket.gethostname() and record.get("pid") == os.getpid()):
        return ""
    age = (now or time.time()) - float(record.get("heartbeat", 0))
    if age > STALE_S or _alive_here(record) is False:
        return ""
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(record.get("started", 0))))
    return (f"run {record.get('run', '?')[:8]}, started {started} on {record.get('host')} (process {record.get('pid')}), "
            f"last seen {age:.0f} s ago")


@dataclass
class RunLock:
    """This run's lock on ``where``: :meth:`keep_fresh` while it writes, :meth:`release` when it ends."""

    where: Location
    record: dict[str, Any] = field(default_factory=dict)

    def beat(self) -> None:
        """Write the lock with the time now (this run is alive)."""
        self.record["heartbeat"] = time.time()
        (self.where / LOCK).write_text(json.dumps(self.record))

    @contextmanager
    def keep_fresh(self, every_s: float = BEAT_S) -> Iterator[None]:
        """Refresh the lock every ``every_s`` seconds while the code inside runs."""
        done = threading.Event()

        def beat() -> None:
            while not done.wait(every_s):
                try:
                    self.beat()
                except OSError:  # a bucket slow to answer: the next beat tries again
                    pass

        threading.Thread(target=beat, daemon=True, name="run-lock").start()
        try:
            yield
        finally:
            done.set()

    def release(self) -> None:
        """Remove the lock, if it is still this run's."""
        if _read(self.where).get("run") == self.record.get("run"):
            (self.where / LOCK).remove()


def refuse_if_held(where: Location) -> None:
    """Stop with :class:`RunningElsewhereError`, naming the live run, where one holds ``where``'s lock."""
    live = holder(where)
    if live:
        raise RunningElsewhereError(
            f"OUTPUT_DIR={str(where)!r} is in use by another run ({live}). Nothing was changed there. Wait for it to "
            f"end, stop it, or choose another OUTPUT_DIR. A run that died leaves its lock ({LOCK}); it is taken over "
            f"once its process is gone from this machine, or {STALE_S:.0f} s after its last sign of life.")


def acquire(where: Location) -> RunLock:
    """Take ``where``'s lock for this run (:func:`refuse_if_held` first). Written, then read back: of
    two runs that start at the same moment, the one whose record is not there stops."""
    refuse_if_held(where)
    now = time.time()
    lock = RunLock(where, {"run": uuid.uuid4().hex, "host": socket.gethostname(), "pid": os.getpid(),
                           "started": now, "heartbeat": now})
    lock.beat()
    if _read(where).get("run") != lock.record["run"]:
        raise RunningElsewhereError(f"OUTPUT_DIR={str(where)!r}: another run took it at the same moment "
                                    f"({holder(where) or 'it did not say who'}). Nothing was changed there.")
    return lock
