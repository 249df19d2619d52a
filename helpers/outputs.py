"""The results write: resumable parts with Ray's checkpoints, each result row's columns, and reading
them back.

Ray writes row-level parts under ``OUTPUT_DIR/parts/<name>/``; they become the tables a person
opens: ``predictions.parquet`` (or ``captions.parquet``) and ``errors.parquet`` (rows rejected
before the model, or that failed in the engine, with the reason); :mod:`helpers.pipeline` writes
and collects them.

Resuming uses Ray Data's own checkpointing: each write records the ids of the rows it wrote under
``OUTPUT_DIR/checkpoint/<name>/``; after a crash, the next run with the same settings skips those
rows at the read and appends the rest. A run that finished deletes its checkpoints, so the next
run starts fresh. No run deletes results: the next one moves them to ``OUTPUT_DIR/earlier/<time>/``,
and an interrupted run that the next would not resume stops it until you choose
(:func:`helpers.output_dir.prepare_output_dir`).
"""

from __future__ import annotations

import hashlib
import json
import re
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from helpers.errors import Explained
from helpers.location import Location

PARTS = "parts"
CHECKPOINT = "checkpoint"
RUN_FILE = "run.json"
#: The file that marks a folder as the kit's: only in such a folder does a run remove anything.
MARKER = ".llm-batch-kit"
MARKER_TEXT = ("Results of the LLM batch inference kit: a new run here moves earlier results to earlier/ "
               "and never deletes them.\n")
PREDICTIONS = "predictions.parquet"
ERRORS = "errors.parquet"
#: A run's reports in ``OUTPUT_DIR`` (the executed notebook and its HTML, ``scripts/run_notebooks.py``):
#: an earlier run's move aside with its results, so no run overwrites another's report.
REPORT_SUFFIXES = (".ipynb", ".html")
#: Derived files a run writes at the end; every run rewrites them.
DERIVED = (PREDICTIONS, ERRORS, "summary.json", "confusion_matrix.png", "label_counts.png",
           "captions.parquet", "captions.png", "ray_stats.txt")


def fingerprint(settings: Mapping[str, Any]) -> str:
    """A short hash of the settings that decide a run's results (resume only with the same ones)."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class RunOutputs:
    """The output folder of one run and how it writes (see the module docstring).

    ``root`` is the local folder this process writes the tables, charts and summary to: ``OUTPUT_DIR``
    itself, or, for ``OUTPUT_DIR`` in object storage (``location``), a local staging folder that
    :meth:`publish` copies there at the end. Ray's result parts and checkpoints are written to
    ``OUTPUT_DIR`` directly, from whichever node holds the rows."""

    root: Path
    resume: bool
    message: str
    #: Rows an interrupted run finished (its committed checkpoints' ids), 0 when starting fresh: a
    #: resumed run with a row limit runs only the rest (:func:`helpers.pipeline.run`).
    rows_done: int = 0
    #: Where the results land when that is not ``root`` (a bucket); None: ``root`` itself.
    location: Location | None = None
    #: This run's id, also in ``run.json``: a later run that moves these results aside changes it there.
    run_id: str = ""
    #: This run's lock on ``OUTPUT_DIR`` (:mod:`helpers.run_lock`): kept fresh while the pipeline writes,
    #: released when it ends. None: no lock (a folder prepared outside a run).
    lock: Any = None

    def check_current(self) -> None:
        """Raise :class:`ResultsMovedError` if a later run started in ``OUTPUT_DIR`` since this one (it
        moved these results to ``earlier/``): what is in memory is then no longer what is on disk."""
        try:
            now = json.loads((self.where / RUN_FILE).read_text()).get("run")
        except (OSError, ValueError):
            now = None
        if self.run_id and now != self.run_id:
            raise ResultsMovedError(
                f"The results in memory are not the ones in {self.where} any more: a later run started there (or "
                f"this cell's run did not finish), and earlier results were moved to {EARLIER}/. Run the notebook "
                "from the 'Run the pipeline' cell down to make and save new ones.")

    @property
    def where(self) -> Location:
        """Where the results land: ``OUTPUT_DIR``, local or in object storage."""
        return self.location or Location.of(self.root)

    def parts(self, name: str) -> Location:
        return self.where / PARTS / name

    def checkpoint(self, name: str) -> Location:
        return self.where / CHECKPOINT / name

    def publish(self) -> str:
        """Copy the files this process wrote (tables, charts, summary) to ``OUTPUT_DIR`` when it is in
        object storage; say where the results are."""
        if self.location is None:
            return f"results in {self.root}"
        copied = sorted(f for f in self.root.iterdir() if f.is_file())
        for f in copied:
            (self.location / f.name).upload(f)
        return f"results in {self.location}: {len(copied)} files copied there ({', '.join(f.name for f in copied)})"

    def write(self, ds, name: str, *, id_column: str | None, num_cpus: float,
              rows_per_file: int | None = None) -> "Written":
        """Write ``ds`` to ``parts/<name>``, resumably when possible; say what was written now.

        With ``resume`` on and an ``id_column`` present in the *source* data (Ray's checkpoint
        filter runs right after the read), finished rows are recorded and skipped on a re-run.
        ``rows_per_file``: Ray gathers blocks until a file has at least that many rows (the last may
        have fewer), or until the last file was due :data:`FILE_EVERY_S` ago (:class:`RowsOrTime`);
        None: a file per block.
        """
        from ray.data.checkpoint import CheckpointConfig

        from helpers.checkpointing import AnyBlockCheckpointFilter

        target, checkpoint = self.parts(name), self.checkpoint(name)
        resuming = self.resume and id_column is not None and has_checkpoint(checkpoint)
        if not resuming:
            found = target.files()
            if found or has_checkpoint(checkpoint):  # prepare_output_dir moves such files aside first
                raise FileExistsError(f"{target} holds {len(found)} result files and this write would not resume "
                                      "them: Ray's overwrite would delete them. Start the run with prepare_output_dir "
                                      f"(it moves earlier results to {EARLIER}/), and resume with the id it resumed by.")
            target.remove()  # empty folders, or checkpoints a write killed before its first commit left
            checkpoint.remove()
        before = {f for f, _ in target.files()}
        # Object storage: Ray gets the filesystem the kit resolved (an S3-compatible endpoint's); a
        # local folder: Ray's own, as before.
        fs = target.fs if target.remote else None
        # A dataset keeps the DataContext it was created with (shared by the datasets derived from
        # it), so the checkpoint config goes on the dataset's context, only for this write.
        context = ds.context
        if self.resume and id_column is not None:
            context.checkpoint_config = CheckpointConfig(id_column=id_column, checkpoint_path=checkpoint.uri,
                                                         override_filesystem=fs, delete_checkpoint_on_success=True,
                                                         checkpoint_filter_cls=AnyBlockCheckpointFilter)
        per_file = RowsOrTime(rows_per_file, FILE_EVERY_S) if rows_per_file else None
        try:
            with warnings.catch_warnings():
                # Ray only warns when a plan cannot be checkpointed; a resumable run must not lose that.
                warnings.filterwarnings("error", message=".*doesn't support checkpointing.*")
                ds.write_parquet(target.path if fs else target.uri, filesystem=fs,
                                 mode="append" if resuming else "overwrite", ray_remote_args={"num_cpus": num_cpus},
                                 min_rows_per_file=per_file)
        finally:
            context.checkpoint_config = None
        listed = target.files()
        after = {f for f, _ in listed}
        new = sorted(after - before)
        # Files listed before the write that are gone now were deleted by Ray's recovery: data files of
        # a write killed before its checkpoint committed (their rows are not done, and were run again).
        return Written(rows=sum(parquet_rows(p) for p in new), rows_before=sum(parquet_rows(p) for p in before & after),
                       files=new, written_at={f: t for f, t in listed})


#: A run writes a result file at least this often while rows come out of the engine (:class:`RowsOrTime`).
FILE_EVERY_S = 60.0


class RowsOrTime(int):
    """Ray's ``min_rows_per_file`` that a file also reaches when the last was due ``seconds`` ago.

    Ray 2.60's write gathers the blocks that come out of the run until they hold ``min_rows_per_file``
    rows, and only then writes them as one file: on a 2-core CPU, at the 13-15 rows/s measured there,
    the 3,157 rows a file of a 200,000-row input (:func:`helpers.pipeline.rows_per_file`) are almost
    four minutes of work, all lost to an interrupt. Ray asks, in the driver, each time a block comes
    (``EstimateSize`` in ``ray/data/_internal/execution/bundle_queue/bundler.py``): ``pending_rows >=
    min_rows_per_file``. Python asks an ``int`` subclass on the right of ``>=`` first (its ``__le__``),
    and this one also says yes when the last file was due ``seconds`` ago (the first: since the write
    began). So while the engine works, files are at most ``seconds`` plus one block's wait apart; a
    block (one batch) is never split. Copied, it stays itself; pickled for Ray's write tasks, it is the
    plain number (they only size row groups with it).
    """

    seconds: float
    _last: float

    def __new__(cls, rows: int, seconds: float) -> "RowsOrTime":
        self = super().__new__(cls, rows)
        self.seconds, self._last = seconds, time.monotonic()
        return self

    def __le__(self, rows):  # `rows >= self`, as Ray asks it (and `self <= rows`)
        if isinstance(rows, bool) or not isinstance(rows, int) or rows <= 0:
            return int(self) <= rows
        now = time.monotonic()
        if rows >= int(self) or now - self._last >= self.seconds:
            self._last = now
            return True
        return False

    def __gt__(self, rows):  # `rows < self`: the same question
        return not self.__le__(rows)

    def __copy__(self) -> "RowsOrTime":
        return self

    def __deepcopy__(self, memo) -> "RowsOrTime":
        return self

    def __reduce__(self):
        return int, (int(self),)


@dataclass(frozen=True)
class Written:
    """What one write produced: rows and files of this run, and rows an interrupted run had written."""

    rows: int
    rows_before: int
    files: list[Location]
    written_at: dict[Location, float] = field(default_factory=dict)  # every result file now: when it was written


def has_checkpoint(folder: Path | Location) -> bool:
    """True when ``folder`` holds committed checkpoint files (ids of rows a run finished).

    An empty folder, or one with only ``.pending`` files (a write killed before it committed), has
    nothing to resume from: that write starts over, which also removes its orphaned data files.
    """
    return any(committed_checkpoints(folder))


def committed_checkpoints(folder: Path | Location) -> list[Location]:
    """The checkpoint files in ``folder`` that Ray committed (ids of finished rows), without the
    ``.pending`` ones a write killed before its commit left."""
    folder = Location.of(folder)
    return [folder / name for name in folder.children()
            if name.endswith(".parquet") and not name.endswith(".pending.parquet")]


def parquet_rows(path: Path | Location) -> int:
    return Location.of(path).parquet_rows()


class ResultsMovedError(Explained, RuntimeError):
    """The results a cell holds in memory are no longer in ``OUTPUT_DIR`` (a later run moved them)."""


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def describe_request(request: Any) -> Any:
    """``request`` (what your ``preprocess`` returns) as plain JSON that is the same whenever the
    request is: images (PIL or arrays) become their mode, size and a hash of their pixels, other
    objects their text without memory addresses. Put it in the run's settings, and an edit to
    ``preprocess`` that changes what is sent makes the next run start fresh instead of resuming."""
    if isinstance(request, Mapping):
        return {str(k): describe_request(v) for k, v in request.items()}
    if isinstance(request, (list, tuple)):
        return [describe_request(v) for v in request]
    if request is None or isinstance(request, (str, bool, int, float)):
        return request
    if hasattr(request, "tobytes") and hasattr(request, "size") and hasattr(request, "mode"):  # a PIL image
        digest = hashlib.sha256(request.tobytes()).hexdigest()[:16]
        return f"image {request.mode} {request.size[0]}x{request.size[1]} sha256:{digest}"
    if hasattr(request, "tobytes") and hasattr(request, "shape"):  # a numpy array
        digest = hashlib.sha256(request.tobytes()).hexdigest()[:16]
        return f"array {request.dtype} {tuple(request.shape)} sha256:{digest}"
    return _ADDRESS.sub("", f"{type(request).__name__}: {request}")


#: Where a run moves the results it finds in ``OUTPUT_DIR`` before it starts fresh: a run never
#: deletes rows; ``earlier/<time>/`` keeps them (with the ``run.json`` that says how they were made).
EARLIER = "earlier"


def read_parts(folder: Path | Location) -> pd.DataFrame:
    """Read a Ray-written parquet folder, local or in object storage (empty frame if Ray wrote
    nothing there)."""
    files = Location.of(folder).files()
    return pd.concat([f.read_parquet() for f, _ in files], ignore_index=True) if files else pd.DataFrame()


#: Columns every result row carries from the engine (what :func:`result_row` adds besides the
#: task's own outputs), with the values an engine-error row gets.
ENGINE_COLUMNS: dict[str, Any] = {"num_input_tokens": 0, "num_generated_tokens": 0, "request_digest": ""}

# Fields of vLLM's SamplingParams repr that the engine fills in while it works (which grammar
# backend it picked), not settings of the request: left out of the digest.
_ENGINE_FILLED = re.compile(r", _backend(?:_was_auto)?=[^,)]*")


def request_digest(prompt_token_ids: Sequence[int] | None, params: str) -> str:
    """A short hash of exactly what the engine was asked: the prompt's token ids and the sampling
    parameters (vLLM's ``SamplingParams`` as text). Two rows, or two runs, with the same digest
    sent the engine the same request; a changed prompt, template or setting changes it."""
    ids = [int(t) for t in prompt_token_ids] if prompt_token_ids is not None else []
    payload = json.dumps([ids, _ENGINE_FILLED.sub("", params)])
    return hashlib.sha1(payload.encode()).hexdigest()[:16]


def result_row(row: Mapping[str, Any], keep_columns: Sequence[str], **outputs: Any) -> dict[str, Any]:
    """A successful result row: the kept input columns, the task's outputs, the engine's token
    counts, the request's digest (:func:`request_digest`) and an empty ``error`` (the shape
    ``helpers.stages.finish`` gives failed rows)."""
    return {
        **{c: row.get(c) for c in keep_columns},
        **outputs,
        "num_input_tokens": int(row.get("num_input_tokens") or 0),
        "num_generated_tokens": int(row.get("num_generated_tokens") or 0),
        "request_digest": request_digest(row.get("prompt_token_ids"), str(row.get("params") or "")),
        "error": "",
    }
