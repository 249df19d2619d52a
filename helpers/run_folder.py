"""``OUTPUT_DIR``'s life: one run at a time, each run's files recorded in its ``run.json`` and moved to
``earlier/<time>/`` by the next (exactly those: nothing else moved, nothing deleted), an interrupted
run resumed only with the same settings, the results published to a bucket.

The lock: on a disk an exclusive ``flock``, released by the system when the process ends; in S3 an
object created only where none is, kept fresh while the run writes and taken over once stale."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from helpers import storage
from helpers.cluster import blind_nodes
from helpers.pipeline import first_rows
from helpers.parameters import Explained, flag, raise_if, text
from helpers.storage import Location

MARKER, RUN_FILE, LOCK = ".llm-batch-kit", "run.json", "run.lock"
PARTS, CHECKPOINT, EARLIER = "parts", "checkpoint", "earlier"
STALE_S, BEAT_S = 120.0, 30.0  # a bucket's lock: refreshed every BEAT_S, a dead run's after STALE_S


class NotTheKitsFolderError(Explained, FileExistsError):
    """``OUTPUT_DIR`` holds files the kit did not write."""


class RunningElsewhereError(Explained, RuntimeError):
    """Another run is writing to this ``OUTPUT_DIR`` now."""


class InterruptedRunError(Explained, RuntimeError):
    """``OUTPUT_DIR`` holds an interrupted run this run would not resume; nothing was changed."""


class ResultsMovedError(Explained, RuntimeError):
    """A later run moved this run's results aside: what is in memory is not what is on disk."""


def _committed(where: Location) -> list[Location]:
    """Ray's committed checkpoint files (ids of finished rows), not a killed write's ``.pending`` ones."""
    return [f for f, _ in (where / CHECKPOINT).files() if not f.name.endswith(".pending.parquet")]


def _record(where: Location, name: str = RUN_FILE) -> dict[str, Any]:
    try:
        return json.loads((where / name).read_text())
    except (OSError, ValueError):
        return {}


_held: dict[str, _Lock] = {}  # the locks this process holds, by folder


def _release_left(where: Location) -> None:  # a run this kernel began whose cell failed before the write
    if (left := _held.get(str(where / LOCK))) is not None and left.record["pid"] == os.getpid():  # not a forked parent's
        left.release()


class _Lock:
    """This run's hold on ``where``: ``flock`` on a disk, a conditional object in a bucket."""

    def __init__(self, where: Location):
        self.folder, self.where, self.file = where, where / LOCK, None
        self.record = {"run": uuid.uuid4().hex, "host": socket.gethostname(), "pid": os.getpid(), "started": time.time(),
                       "pids": os.path.exists(p := "/proc/self/ns/pid") and os.stat(p).st_ino}  # a container's own pids

    def holder(self) -> str:
        """Who holds the lock now, in words ("" when no live run does)."""
        record = _record(self.folder, LOCK)
        if not self.where.remote:
            if self.file is not None:
                return ""
            try:
                with open(self.where.path, "a") as f:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return ""
            except OSError:
                pass
        elif not record or time.time() - float(record.get("heartbeat", 0)) > STALE_S or (
                (record.get("host"), record.get("pids")) == (self.record["host"], self.record["pids"])
                and not psutil.pid_exists(int(record.get("pid", 0)))):
            return ""  # a run that stopped beating, or whose process on this host is gone (a crash, a killed kernel)
        return f"run {str(record.get('run', '?'))[:8]} on {record.get('host')} (process {record.get('pid')})"

    def take(self) -> None:
        _release_left(self.folder)
        _held[str(self.where)] = self
        text = json.dumps({**self.record, "heartbeat": time.time()})
        if not self.where.remote:
            self.file = open(self.where.path, "a+")
            try:
                fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                self.file.close()
                self.file = None
                raise RunningElsewhereError(self._busy(self.holder() or "another process")) from None
            self.file.truncate(0)
            self.file.write(text)
            self.file.flush()
            return
        if not self.where.create(text):
            live, version = self.holder(), self.where.version()
            if live:
                raise RunningElsewhereError(self._busy(live))
            if not self.where.replace(text, version):  # a dead run's, taken over unless another run just did
                raise RunningElsewhereError(self._busy("another run that took it at the same moment"))

    def _busy(self, who: str) -> str:
        return (f"OUTPUT_DIR={str(self.folder)!r} is in use by {who}. Nothing was changed there. Wait "
                f"for it to end, stop it, or choose another OUTPUT_DIR.")

    @contextlib.contextmanager
    def fresh(self) -> Iterator[None]:
        """Keep a bucket's lock fresh while the code inside runs (a disk's needs nothing)."""
        done = threading.Event()

        def beat() -> None:
            while not done.wait(BEAT_S):
                with contextlib.suppress(OSError):
                    self.where.write_text(json.dumps({**self.record, "heartbeat": time.time()}))

        if self.where.remote:
            threading.Thread(target=beat, daemon=True, name="run-lock").start()
        try:
            yield
        finally:
            done.set()

    def release(self) -> None:
        if _held.get(str(self.where)) is self:
            del _held[str(self.where)]
        if self.file is not None:
            self.file.close()  # the flock goes with it
            self.file = None
        elif self.where.remote:
            with contextlib.suppress(OSError, ValueError):
                if json.loads(self.where.read_text()).get("run") == self.record["run"]:
                    self.where.fs.delete_file(self.where.path)


def describe(value: Any) -> Any:
    """``value`` (a request) as stable JSON: objects as their text without addresses, images with a hash of their pixels."""
    return json.loads(json.dumps(value, default=lambda v: re.sub(r" at 0x[0-9a-fA-F]+", "", f"{type(v).__name__}{getattr(v, 'shape', '')}: {v}")
                                 + (f" sha256:{hashlib.sha256(v.tobytes()).hexdigest()[:16]}" if hasattr(v, "tobytes") else "")))


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, Mapping):
        items = [(f"{prefix}.{k}" if prefix else str(k), v) for k, v in value.items()]
    elif isinstance(value, list) and any(isinstance(v, (Mapping, list)) for v in value):
        items = [(f"{prefix}[{i}]", v) for i, v in enumerate(value)]
    else:
        return {prefix: value}
    return {k: v for key, inner in items for k, v in _flat(inner, key).items()}


def changed(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """``"name: old -> new"`` for each setting that differs, nested ones by their dotted path."""
    before, after = _flat(json.loads(json.dumps(old, default=str))), _flat(json.loads(json.dumps(new, default=str)))
    missing = object()

    def shown(v: Any) -> str:
        return "(not set)" if v is missing else repr(v) if len(repr(v)) <= 70 else repr(v)[:67] + "..."

    return [f"{k}: {shown(before.get(k, missing))} -> {shown(after.get(k, missing))}"
            for k in sorted(set(before) | set(after)) if before.get(k, missing) != after.get(k, missing)]


def claim(where: Location) -> None:
    """Mark ``where`` as the kit's: later runs move its files aside, never delete them."""
    (where / MARKER).write_text("Results of the LLM batch inference kit: a new run moves earlier results to earlier/ "
                                "and never deletes them.\n")


def open_folder(output_dir: Any, resume: Any = True, start_over: Any = False) -> RunFolder:
    """``OUTPUT_DIR`` (a folder or a bucket) checked before anything starts: writable, new, empty or the
    kit's (papermill's notebooks aside), held by no live run, and any interrupted run there one this
    run may resume or start over."""
    raise_if(text("OUTPUT_DIR", output_dir) + flag("RESUME", resume) + flag("START_OVER", start_over))
    try:
        where = Location.of(output_dir)
        if where.remote:
            names = storage.check_reachable(where)
        else:
            folder = Path(where.path)
            if folder.exists() and not folder.is_dir():
                raise NotADirectoryError(f"OUTPUT_DIR={output_dir!r} exists and is not a folder")
            existing = next(p for p in [folder, *folder.parents] if p.exists())
            if not os.access(existing, os.W_OK):
                raise PermissionError(f"OUTPUT_DIR={output_dir!r} is not writable (no write access to {existing})")
            names = where.children()
    except OSError as exc:
        raise_if([str(exc)])
    others = [n for n in names if not n.endswith(".ipynb")]
    if others and MARKER not in names and "fingerprint" not in _record(where):
        raise NotTheKitsFolderError(
            f"OUTPUT_DIR={str(output_dir)!r} is not empty and was not written by this kit (it holds "
            f"{', '.join(sorted(others)[:5])}{' and more' if len(others) > 5 else ''}). A run moves its own earlier "
            "results aside there, so it needs a folder of its own: choose a new or empty one.")
    _release_left(where)  # a kernel runs one cell at a time: no run of its own is live now
    live = _Lock(where).holder() if LOCK in names else ""
    if live:
        raise RunningElsewhereError(_Lock(where)._busy(live))
    done = sum(f.parquet_rows() for f in _committed(where)) if CHECKPOINT in names else 0
    if done and not resume and not start_over:
        raise InterruptedRunError(f"OUTPUT_DIR={str(output_dir)!r} holds an interrupted run with {done:,} rows finished "
                                  "and RESUME is False. Nothing was changed there. Set RESUME=True to finish it, or "
                                  f"START_OVER=True to start over (its rows are then kept in {EARLIER}/).")
    return RunFolder(where, resume, start_over)


@dataclass
class RunFolder:
    """``OUTPUT_DIR`` as checked by :func:`open_folder`; :meth:`start` begins a run in it."""

    where: Location
    resume: bool
    start_over: bool

    def start(self, plan: Any, functions: Any, *, id_column: str | None, settings: Mapping[str, Any]) -> Run:
        """Begin a run: every node sees the folder, this run holds its lock, and it resumes the interrupted
        run or moves the earlier run's files to ``earlier/``. It resumes only where ``settings``, the model,
        your ``preprocess``'s request for the example and your ``postprocess``'s code are the same."""
        if not self.where.remote:
            Path(self.where.path).mkdir(parents=True, exist_ok=True)
            every_node_sees(Path(self.where.path))
        lock = _Lock(self.where)
        lock.take()
        try:
            return self._begin(plan, functions, id_column, settings, lock)
        except BaseException:
            lock.release()
            raise

    def _begin(self, plan: Any, functions: Any, id_column: str | None, settings: Mapping[str, Any], lock: _Lock) -> Run:
        settings = storage.redact_all({
            **settings, "model": plan.model_source, "max_model_len": plan.max_model_len, "dtype": plan.dtype,
            "quantization": plan.quantization, "request": describe(functions.request),
            "postprocess": functions.postprocess_code, "columns": list(functions.columns)})
        fingerprint = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:16]
        record = _record(self.where)
        done = _committed(self.where)
        resuming = bool(done and self.resume and id_column and not self.start_over and record.get("fingerprint") == fingerprint)
        if done and not resuming and not self.start_over:
            why = ("ID_COLUMN is None" if not id_column else "it used other settings:\n    "
                   + "\n    ".join(changed(record.get("settings", {}), settings) or ["(its run.json records none)"]))
            raise InterruptedRunError(
                f"OUTPUT_DIR={str(self.where)!r} holds an interrupted run with {sum(f.parquet_rows() for f in done):,} "
                f"rows finished, and this run would not resume it: {why}\nNothing was changed there. Run again with its "
                "settings to finish it, or set START_OVER=True to start over (its rows are then kept in "
                f"{EARLIER}/), or choose another OUTPUT_DIR.")
        claim(self.where)
        stamp, n = time.strftime("%Y-%m-%dT%H-%M-%SZ", time.gmtime()), 1
        earlier = self.where / EARLIER / stamp
        while earlier.exists():
            n += 1
            earlier = self.where / EARLIER / f"{stamp}-{n}"
        previous = [*record.get("files", [])] + ([] if resuming else [PARTS, CHECKPOINT]) + ([RUN_FILE] if record else [])
        moved = [name for name in dict.fromkeys(previous) if (self.where / name).exists()]
        for name in moved:
            (self.where / name).move_to(earlier / name)
        run = Run(self.where, plan, functions, id_column if self.resume else None, resuming,
                  sum(f.parquet_rows() for f in done) if resuming else 0, lock, earlier, fingerprint, settings)
        run.save_record()
        print(f"output folder: {self.where} ({'resuming an interrupted run: rows it finished are skipped' if resuming else 'starting fresh'}"
              f"{f'; the earlier files are kept in {earlier}' if moved else ''})")
        return run


@dataclass
class Run:
    """One run in ``OUTPUT_DIR``: where it writes, the files it has written (its ``run.json``), its lock."""

    PARTS, CHECKPOINT = PARTS, CHECKPOINT  # its results as Ray writes them, and Ray's record of the rows done

    where: Location
    plan: Any
    functions: Any
    id_column: str | None  # what Ray's checkpoints key on; None: not resumable
    resuming: bool
    rows_done: int  # rows the interrupted run finished: resuming skips them as they are read
    lock: _Lock
    earlier: Location
    fingerprint: str
    settings: dict[str, Any]
    files: list[str] = field(default_factory=list)
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex)

    @property
    def root(self) -> Path:
        """Where this process writes tables and charts: ``OUTPUT_DIR``, or for a bucket a staging folder
        that :meth:`publish` copies there."""
        if not self.where.remote:
            return Path(self.where.path)
        staging = Path(os.environ.get("TMPDIR", "/tmp")) / f"llm-batch-kit-{self.run_id}"
        staging.mkdir(parents=True, exist_ok=True)
        return staging

    def save_record(self) -> None:
        (self.where / RUN_FILE).write_text(json.dumps({"run": self.run_id, "fingerprint": self.fingerprint,
                                                      "settings": self.settings, "files": self.files}, indent=2, default=str))

    def unfinished(self, ds: Any, limit: int | None) -> Any:
        """``ds`` for this run: resuming, Ray skips the rows the interrupted run finished as it reads them,
        so ``limit`` counts only the rest (the same first rows in file order, see ``pipeline.first_rows``)."""
        return first_rows(ds, limit, self.rows_done)

    def path(self, name: str) -> Path:
        """Where this run writes ``name``: recorded in ``run.json`` (the next run moves it aside); a file
        of that name this run did not write goes to ``earlier/`` first."""
        self.check_current()
        if name not in self.files:
            if (self.where / name).exists():
                (self.where / name).move_to(self.earlier / name)
            self.files.append(name)
            self.save_record()
        return self.root / name

    def check_current(self) -> None:
        if _record(self.where).get("run") != self.run_id:
            raise ResultsMovedError(f"A later run started in {self.where} (or this cell's run did not finish): its files "
                                    f"moved this run's to {EARLIER}/. Run the notebook from the run cell down again.")

    def publish(self) -> str:
        """Copy what this process wrote to ``OUTPUT_DIR`` in a bucket; say where the results are."""
        if not self.where.remote:
            return f"results in {self.where}"
        for name in self.files:
            if (self.root / name).is_file():
                (self.where / name).upload(self.root / name)
        return f"results in {self.where}: {', '.join(self.files)}"


def current_run(where: Location) -> str:
    """The id of the run ``where``'s ``run.json`` records ("" for none)."""
    return str(_record(where).get("run", ""))


def add_file(where: Location, local: Path, name: str) -> None:
    """Copy ``local`` into ``where`` as ``name``, a file of the run ``run.json`` records (the job runner's
    report); a file of that name the run did not write goes to ``earlier/`` first."""
    record = _record(where)
    if name not in record.get("files", []):
        if (where / name).exists():
            (where / name).move_to(where / EARLIER / f"{name}-{uuid.uuid4().hex[:8]}")
        record["files"] = [*record.get("files", []), name]
        (where / RUN_FILE).write_text(json.dumps(record, indent=2, default=str))
    (where / name).upload(local)


def every_node_sees(folder: Path) -> None:
    """On several nodes, a marker written here must read back on each: Ray writes results on the node
    that holds them, and a folder only this machine sees would lose rows."""
    token = uuid.uuid4().hex
    marker = folder / f".node-check-{token}"
    marker.write_text(token)
    try:
        blind = blind_nodes(str(marker), token)
    finally:
        marker.unlink(missing_ok=True)
    if blind:
        raise NodeLocalOutputError(
            f"OUTPUT_DIR={str(folder)!r} is a folder that {len(blind)} of the Ray cluster's nodes do not see: "
            f"{', '.join(blind)}. Ray Data writes each block's results on the node that holds it, so their rows and "
            "checkpoints would be lost. Point OUTPUT_DIR at a bucket (s3://..., gs://...) or at a folder every node "
            "mounts (NFS, /mnt/cluster_storage on Anyscale).")


class NodeLocalOutputError(Explained, RuntimeError):
    """``OUTPUT_DIR`` is a folder some of the cluster's nodes do not see."""
