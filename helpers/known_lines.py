"""Ray's one known error-level line kept out of the run cell; every other line of the process's
standard error let through unchanged.

As Ray Data starts its first actor stage, Ray's driver logs from C++, once per process, straight to
file descriptor 2 (one line; here cut)::

    [2026-11-27 07:58:51,620 E 11778 11778] core_worker.cc:2465: Actor with class name:
    'MapWorker(MapBatches(ChatTemplateUDF))' and ID: '...' has constructor arguments in the object
    store and max_restarts > 0. If the arguments in the object store go out of scope or are lost, the
    actor restart will fail. See https://github.com/ray-project/ray/issues/53727 for more details.

ipykernel forwards that descriptor into the notebook: a red block under the run cell, and a line in
a headless run's report. The kit cannot stop it at its source. Ray Data puts each actor stage's code
and its ``DataContext`` in the object store itself (``ray.put`` in ``MapOperator._map_transformer_ref``
and ``_data_context_ref``), passes them to the actors' constructors, and starts its actors with
``max_restarts=-1``, so that an engine lost with its node starts again (the two-node test relies on
it). Ray 2.60's ``CoreWorker::CreateActor`` logs the line for every actor with an argument passed by
reference and restarts on (ray-project/ray#53727: such arguments' lineage is not kept; Ray Data holds
them for the whole run). Only ``max_restarts=0`` avoids it, or a log level that would also hide every
other error Ray's C++ code logs.

So while the pipeline runs, :func:`without_known_lines` puts a pipe on descriptor 2, and a thread
forwards every line, unchanged, to where descriptor 2 went before, except that one.
"""

from __future__ import annotations

import os
import re
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

#: The lines left out: Ray's C++ log line above, and only it.
KNOWN_LINES = (re.compile(rb"\] core_worker\.cc:\d+: Actor .*has constructor arguments in the object store "
                          rb"and max_restarts > 0"),)
#: A partial line is held for its end only while it could be one of them: Ray's C++ log lines start
#: with "[" (their time); anything else, or a line longer than this, goes out as it comes.
_HOLD = 64 * 1024


def _write_all(fd: int, data: bytes) -> None:
    while data:
        try:
            data = data[os.write(fd, data):]
        except InterruptedError:
            continue
        except OSError:  # where stderr went is gone: nothing more can be shown
            return


def _forward(source: int, target: int, known: Sequence[re.Pattern], dropped: list[bytes]) -> None:
    """Copy ``source`` to ``target`` line by line, without the lines that match ``known``, until every
    writer of ``source`` has closed it; then close both."""
    pending = b""
    try:
        while chunk := os.read(source, 65536):
            *lines, pending = (pending + chunk).split(b"\n")
            out = []
            for line in lines:
                if any(p.search(line) for p in known):
                    dropped.append(line)
                else:
                    out.append(line + b"\n")
            if pending and (not pending.startswith(b"[") or len(pending) > _HOLD):
                out.append(pending)
                pending = b""
            _write_all(target, b"".join(out))
        if pending and not any(p.search(pending) for p in known):
            _write_all(target, pending)
    finally:
        os.close(source)
        os.close(target)


@contextmanager
def without_known_lines(fd: int = 2, known: Sequence[re.Pattern] = KNOWN_LINES) -> Iterator[list[bytes]]:
    """While the code inside runs, file descriptor ``fd`` (the process's standard error) writes through
    a pipe: a thread forwards every line, unchanged and in order, to where ``fd`` went before, except
    the lines that match ``known`` (:data:`KNOWN_LINES`). Yields the list of lines left out.

    Only what is written to the descriptor itself passes through here (C and C++ code, such as Ray's
    core worker); a kernel's ``sys.stderr`` writes into the notebook without it. When it ends, ``fd``
    is what it was, and the thread forwards what is left in the pipe (also what a process started
    meanwhile still writes there) before it stops."""
    dropped: list[bytes] = []
    try:
        target = os.dup(fd)
    except OSError:  # no such descriptor: nothing to filter
        yield dropped
        return
    read_end, write_end = os.pipe()
    _flush()
    os.dup2(write_end, fd)
    os.close(write_end)
    thread = threading.Thread(target=_forward, args=(read_end, target, known, dropped), daemon=True,
                              name="known-lines-filter")
    thread.start()
    try:
        yield dropped
    finally:
        _flush()
        # ``fd`` still holds the pipe, so the thread has not closed ``target`` (it does when the pipe ends).
        os.dup2(target, fd)
        thread.join(timeout=5)


def _flush() -> None:
    """Python's own buffered writes to the descriptor go out before it is switched."""
    for stream in (sys.stderr, sys.__stderr__):
        try:
            stream.flush()
        except Exception:  # a closed or odd stream: nothing buffered to lose
            pass
