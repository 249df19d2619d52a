"""Claiming ``OUTPUT_DIR`` for a run: refusing folders that are not the kit's, moving an earlier
run's results to ``earlier/``, and stopping where an interrupted run would be lost."""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from helpers import run_lock
from helpers.errors import Explained
from helpers.location import Location, check_reachable, write_or_explain
from helpers.outputs import (CHECKPOINT, DERIVED, EARLIER, MARKER, MARKER_TEXT, PARTS, REPORT_SUFFIXES, RUN_FILE,
                             RunOutputs, committed_checkpoints, fingerprint, parquet_rows)


class NotTheKitsFolderError(Explained, FileExistsError):
    """``OUTPUT_DIR`` holds files the kit did not write: a run would remove folders by their names."""


def claim_output_dir(path: str | Path) -> Path:
    """Create ``path`` (if needed) and mark it as the kit's; return it, resolved.

    A run removes its own earlier ``parts/``, ``checkpoint/`` and result files, by name. So it
    works only in a folder that is new, empty, or marked as the kit's by an earlier run
    (:data:`MARKER`; a ``run.json`` of the kit's also counts, as earlier versions wrote no marker).
    Any other non-empty folder is refused, naming what is in it: pointed at a folder that holds a
    training run, a run would otherwise delete that run's ``checkpoint/``. Executed notebooks
    (``.ipynb``) are allowed in it: papermill writes its output notebook before the notebook runs."""
    out = Path(path).expanduser().resolve()
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"OUTPUT_DIR={str(path)!r} exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    _claim(Location.of(out), str(path))
    return out


def claim_location(location: Location) -> None:
    """:func:`claim_output_dir` for a folder in object storage: check that it can be used
    (:func:`helpers.location.check_reachable`, within seconds), refuse one that holds files the kit
    did not write, and mark it as the kit's."""
    _claim(location, str(location))


def output_dir_problem(path: str) -> str:
    """Why ``OUTPUT_DIR`` cannot be claimed (:func:`claim_output_dir`, :func:`claim_location`), or "":
    checked by reading only, before anything starts."""
    import os

    try:
        where = Location.of(path)
        if not where.remote:
            out = Path(where.path)
            if out.exists() and not out.is_dir():
                return f"OUTPUT_DIR={path!r} exists and is not a folder"
            existing = out
            while not existing.exists():
                existing = existing.parent
            if not os.access(existing, os.W_OK):
                return f"OUTPUT_DIR={path!r} is not writable (no write access to {existing})"
        _refuse_if_not_the_kits(where, str(path))
    except (OSError, NotTheKitsFolderError) as exc:
        return str(exc)
    return ""


def _claim(where: Location, shown: str) -> None:
    """The claim both :func:`claim_output_dir` and :func:`claim_location` make: refuse ``where`` if it
    holds files the kit did not write, then mark it as the kit's (the first write: a folder or store
    that refuses writes stops here, naming ``shown``)."""
    _refuse_if_not_the_kits(where, shown)
    if where.remote:
        write_or_explain(where / MARKER, MARKER_TEXT)
        return
    try:
        (where / MARKER).write_text(MARKER_TEXT)
    except OSError as exc:
        raise PermissionError(f"OUTPUT_DIR={shown!r} is not writable: {exc}") from exc


def _refuse_if_not_the_kits(where: Location, shown: str) -> None:
    """Raise :class:`NotTheKitsFolderError` if ``where`` holds files and is not the kit's: no
    :data:`MARKER` and no ``run.json`` of the kit's (earlier versions wrote no marker). Executed
    notebooks aside: papermill writes its output before the notebook runs. A folder in object storage
    is checked within seconds (:func:`helpers.location.check_reachable`); one that does not exist
    yet holds nothing."""
    names = check_reachable(where) if where.remote else where.children()
    others = sorted(n for n in names if not n.endswith(".ipynb"))
    if not others or MARKER in names or (RUN_FILE in names and _kit_run_file(where / RUN_FILE)):
        return
    listed = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
    raise NotTheKitsFolderError(
        f"OUTPUT_DIR={shown!r} is not empty and was not written by this kit (it holds {listed}). A run replaces its "
        "own earlier results there, by name, so it needs a folder of its own: choose a new or empty one.")


def _kit_run_file(path: Path | Location) -> bool:
    try:
        return "fingerprint" in json.loads(Location.of(path).read_text())
    except (OSError, ValueError, TypeError):
        return False


class InterruptedRunError(Explained, RuntimeError):
    """``OUTPUT_DIR`` holds an interrupted run that this run would not resume (other settings, or
    ``RESUME=False``): the message names what changed and the two ways on. Nothing was changed."""


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """``{"request": {"messages": [{"content": "x"}]}}`` -> ``{"request.messages[0].content": "x"}``."""
    if isinstance(value, Mapping):
        items = [(f"{prefix}.{k}" if prefix else str(k), v) for k, v in value.items()]
    elif isinstance(value, (list, tuple)) and value and any(isinstance(v, (Mapping, list, tuple)) for v in value):
        items = [(f"{prefix}[{i}]", v) for i, v in enumerate(value)]
    else:
        return {prefix: value}
    flat: dict[str, Any] = {}
    for key, inner in items:
        flat.update(_flatten(inner, key))
    return flat


def _shown(value: Any, width: int = 70) -> str:
    text = "(not set)" if value is _MISSING else repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


_MISSING = object()


def changed_settings(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """``"name: old -> new"`` for each setting that differs (nested ones by their dotted path)."""
    before, after = _flatten(json.loads(json.dumps(old, default=str))), _flatten(json.loads(json.dumps(new, default=str)))
    return [f"{key}: {_shown(before.get(key, _MISSING))} -> {_shown(after.get(key, _MISSING))}"
            for key in sorted(set(before) | set(after)) if before.get(key, _MISSING) != after.get(key, _MISSING)]


def _move_aside(where: Location, names: Sequence[str]) -> Location:
    """Move ``names`` (files or folders in ``where``) into a new ``earlier/<UTC time>/``; return it."""
    import time

    stamp = time.strftime("%Y-%m-%dT%H-%M-%SZ", time.gmtime())
    target, n = where / EARLIER / stamp, 1
    while target.exists():
        n += 1
        target = where / EARLIER / f"{stamp}-{n}"
    target.mkdir()
    for name in names:
        (where / name).move_to(target / name)
    return target


def prepare_output_dir(path: str, *, resume: bool = False, settings: Mapping[str, Any] | None = None,
                       start_over: bool = False, check_nodes: bool = False) -> RunOutputs:
    """Create the output folder and decide whether this run resumes an interrupted one. It never
    deletes results:

    - an interrupted run (committed checkpoints) with the same ``settings`` and ``resume`` on: resumed,
      unless ``start_over`` (the user's ``START_OVER=True``: this run starts over whatever the settings);
    - an interrupted run that this run would not resume (other ``settings``, or ``resume`` off):
      :class:`InterruptedRunError`, naming each setting that changed (old -> new), unless
      ``start_over`` (the user's ``START_OVER=True``); then, as below, its rows are moved aside;
    - anything else an earlier run wrote (finished results, files of a run killed before its first
      checkpoint, its report): moved to ``OUTPUT_DIR/earlier/<time>/`` with its ``run.json``, and this
      run starts fresh. ``message`` says which happened and where the earlier results are.

    An earlier run's report (``<notebook>.ipynb`` and ``.html`` in ``OUTPUT_DIR``) moves aside too,
    also when this run resumes that run's rows: the runner writes this run's report in its place.

    A folder that is not the kit's is refused (:func:`claim_output_dir`). ``check_nodes`` (a run on
    Ray): a local folder that some of the cluster's nodes do not see stops the run
    (:func:`check_every_node_sees`) before anything in it is moved. So does a folder another run is
    writing to now (:func:`helpers.run_lock.acquire`); this run's lock is released when its pipeline ends.
    """
    from helpers.storage import redact_all

    where = Location.of(path)
    if where.remote:
        claim_location(where)
        root = staging_folder(where)
    else:
        root = claim_output_dir(path)
        if check_nodes:
            check_every_node_sees(root)  # before anything moves: a node that does not see it would lose rows
        where = Location.of(root)
    run_lock.refuse_if_held(where)  # a live run's files stay where it writes them
    run_file = where / RUN_FILE
    # Secrets in a path (a presigned URL's signature) are never written; a re-signed URL still resumes.
    settings = redact_all(dict(settings or {}))
    current = fingerprint(settings)
    record = json.loads(run_file.read_text()) if run_file.is_file() else {}
    checkpoints = [where / CHECKPOINT / name for name in (where / CHECKPOINT).children()]
    done = [f for folder in checkpoints for f in committed_checkpoints(folder)]
    finished = sum(parquet_rows(f) for f in done)  # rows the interrupted run finished (0: none)
    rows_done = 0
    reports = [name for name in where.children() if name.endswith(REPORT_SUFFIXES)]
    resuming = bool(done and resume and not start_over and record.get("fingerprint") == current)
    if done and not resuming and not start_over:
        why = ("RESUME is False" if resume is False else
               "it used other settings:\n    " + "\n    ".join(changed_settings(record.get("settings", {}), settings)
                                                  or ["(its run.json records none)"]))
        raise InterruptedRunError(
            f"OUTPUT_DIR={str(where)!r} holds an interrupted run with {finished:,} rows finished, and this run "
            f"would not resume it: {why}\nNothing was changed there. Either run again with that run's settings "
            "(and RESUME=True) to finish it, or set START_OVER=True to start over with these settings (its rows "
            f"are then kept in {EARLIER}/), or choose another OUTPUT_DIR.")
    lock = run_lock.acquire(where)  # from here on this run changes the folder
    if resuming:
        message = "resuming an interrupted run: rows it finished are skipped"
        rows_done = finished
        for name in DERIVED:  # tables and charts made from parts/, which stays: rebuilt at the end
            (where / name).remove()
        if reports:
            message += f" (its report is kept in {_move_aside(where, reports)})"
    else:
        found = [name for name in (PARTS, CHECKPOINT, *DERIVED) if (where / name).exists()] + reports
        message = "starting fresh"
        if found:
            kept = _move_aside(where, [*found, *([RUN_FILE] if run_file.is_file() else [])])
            message += f" (the earlier results are kept in {kept}; delete that folder when you no longer need them)"
    run_file.write_text(json.dumps({"fingerprint": current, "run": uuid.uuid4().hex, "settings": settings},
                                   indent=2, default=str))
    return RunOutputs(root=root, resume=resume, message=message, rows_done=rows_done,
                      location=where if where.remote else None, run_id=json.loads(run_file.read_text())["run"],
                      lock=lock)


def staging_folder(location: Location) -> Path:
    """A new, empty local folder of this run's own for what this process writes before
    :meth:`RunOutputs.publish` copies it to ``location`` in object storage (two runs to one bucket on
    one machine each get their own)."""
    import tempfile

    digest = hashlib.sha256(location.uri.encode()).hexdigest()[:12]
    return Path(tempfile.mkdtemp(prefix=f"llm-batch-kit-staging-{digest}-"))


class NodeLocalOutputError(RuntimeError):
    """``OUTPUT_DIR`` is a folder some of the cluster's nodes do not see: their results would be lost."""


def check_every_node_sees(folder, timeout_s: float = 120) -> int:
    """On a cluster of several nodes, check that every alive node sees ``folder`` (a local path), the
    way Ray Data's writes will use it; return how many nodes were checked.

    Ray Data's write tasks run on whichever node holds each block and write to *that node's* disk.
    With a folder on one machine's disk, the results (and the checkpoints resuming relies on) end up
    scattered over the nodes, and the driver finds only its own share: rows lost without an error.
    So the driver writes a marker with a fresh token into ``folder``, a zero-CPU task on each node
    reads it back, and any node that reads something else stops the run with
    :class:`NodeLocalOutputError`, naming the nodes. A single node is not checked."""
    import uuid
    from pathlib import Path

    import ray

    from helpers.node_cache import on_each_node

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    if len(nodes) <= 1:
        return len(nodes)
    token = uuid.uuid4().hex
    marker = Path(folder) / f".node-check-{token}"
    marker.write_text(token)

    def read_marker(path: str) -> str:
        try:
            return Path(path).read_text()
        except OSError as exc:
            return f"({type(exc).__name__})"

    try:
        answers = on_each_node(read_marker, [str(marker)], nodes, timeout_s)
    finally:
        marker.unlink(missing_ok=True)
    for answer in answers:
        if isinstance(answer, BaseException):
            raise answer
    seen = {n["NodeID"]: answer for n, answer in zip(nodes, answers)}
    blind = [n for n in nodes if seen[n["NodeID"]] != token]
    if blind:
        names = ", ".join(f"{n['NodeManagerAddress']} ({n['NodeID'][:8]})" for n in blind)
        raise NodeLocalOutputError(
            f"OUTPUT_DIR={str(folder)!r} is a folder that {len(blind)} of the Ray cluster's {len(nodes)} nodes do not "
            f"see: {names}. Ray Data writes each block's results on the node that holds it, so those nodes' results, "
            "and the checkpoints that resuming needs, would land on their own disks and be missing here. Point "
            "OUTPUT_DIR at a bucket (s3://bucket/run, gs://...; AWS_ENDPOINT_URL for S3-compatible stores) or at a "
            "folder every node mounts (a shared file system: NFS, /mnt/cluster_storage on Anyscale).")
    return len(nodes)
