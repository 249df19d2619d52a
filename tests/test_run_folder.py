"""``OUTPUT_DIR``'s life: one run at a time (taken atomically), exactly the earlier run's files moved
aside, nothing a user put there moved or overwritten, and an interrupted run resumed only with the
same settings, its prompt and postprocess included."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import time

import pytest

from conftest import BUCKET
from helpers import pipeline, run_folder
from helpers.presets import PRESETS
from helpers.run_folder import (EARLIER, InterruptedRunError, NotTheKitsFolderError, ResultsMovedError,
                                RunningElsewhereError)

PLAN = PRESETS["text-cpu-offline"]


def functions(prompt: str = "Classify.", extra: bool = False):
    def pre(row):
        return {"messages": [{"role": "user", "content": f"{prompt} {row['x']}"}], "sampling_params": {"max_tokens": 3}}

    def post(row):
        return {"label": row["generated_text"], **({"chars": len(row["generated_text"])} if extra else {})}

    return pipeline.checked(pre, post, {"x": "example"})


def start(path, resume=True, start_over=False, settings=None, fns=None):
    return run_folder.open_folder(str(path), resume, start_over).start(
        PLAN, fns or functions(), id_column="x", settings=settings or {"input": "a.csv"})


def interrupted(run) -> None:
    """What a run killed after its first checkpoint leaves: parts, and a committed checkpoint file."""
    import pandas as pd

    os.makedirs(os.path.join(run.where.path, "parts"))
    pd.DataFrame({"x": ["1", "2"]}).to_parquet(os.path.join(run.where.path, "parts", "p.parquet"))
    os.makedirs(os.path.join(run.where.path, "checkpoint", "results"))
    pd.DataFrame({"x": ["1", "2"]}).to_parquet(os.path.join(run.where.path, "checkpoint", "results", "c.parquet"))


def test_a_new_run_moves_exactly_the_earlier_runs_files_aside_and_nothing_else(tmp_path):
    """The earlier run's review.parquet and reliability.png stayed beside the new run's files (a
    hand-kept list left them out): now every file a run writes is recorded, and exactly those move."""
    out = tmp_path / "out"
    first = start(out)
    for name in ("predictions.parquet", "review.parquet", "reliability.png"):
        first.path(name).write_text(name)
    first.lock.release()
    (out / "my-notes.txt").write_text("mine")
    second = start(out)
    [earlier] = (out / EARLIER).iterdir()
    assert sorted(p.name for p in earlier.iterdir()) == ["predictions.parquet", "reliability.png", "review.parquet", "run.json"]
    assert (out / "my-notes.txt").read_text() == "mine"  # never the run's: never moved
    assert json.loads((out / "run.json").read_text())["run"] == second.run_id
    second.path("predictions.parquet").write_text("new")
    assert (earlier / "predictions.parquet").read_text() == "predictions.parquet"


def test_a_file_of_a_name_the_run_writes_that_it_did_not_write_is_moved_aside_not_overwritten(tmp_path):
    run = start(tmp_path / "out")
    (tmp_path / "out" / "summary.json").write_text("a user's own")
    run.path("summary.json").write_text("the run's")
    assert [p.read_text() for p in (tmp_path / "out" / EARLIER).rglob("summary.json")] == ["a user's own"]


def test_a_folder_the_kit_did_not_write_is_refused_and_one_of_notebooks_only_keeps_them(tmp_path):
    """A folder holding only notebooks (papermill writes its output first) may be used, but its
    notebooks are not the kit's: they were once moved aside; now they stay, byte for byte."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.csv").write_text("x")
    with pytest.raises(NotTheKitsFolderError, match="holds train.csv"):
        run_folder.open_folder(str(tmp_path / "data"))
    assert os.listdir(tmp_path / "data") == ["train.csv"]
    (tmp_path / "nb").mkdir()
    (tmp_path / "nb" / "analysis.ipynb").write_bytes(b'{"cells": []}')
    first = start(tmp_path / "nb")
    first.path("predictions.parquet").write_text("1")
    first.lock.release()
    start(tmp_path / "nb").lock.release()
    assert (tmp_path / "nb" / "analysis.ipynb").read_bytes() == b'{"cells": []}'
    with pytest.raises(Exception, match="exists and is not a folder"):
        run_folder.open_folder(str(tmp_path / "data" / "train.csv"))


def test_an_interrupted_run_resumes_only_with_the_same_settings_prompt_and_postprocess(tmp_path):
    out = tmp_path / "out"
    first = start(out)
    first.lock.release()
    folder = run_folder.open_folder(str(out))  # checked before the rows below are written
    interrupted(first)
    again = folder.start(PLAN, functions(), id_column="x", settings={"input": "a.csv"})
    assert again.resuming and again.rows_done == 2 and (out / "parts" / "p.parquet").exists()
    again.lock.release()
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    for changed, message in [({"fns": functions("Sort.")}, "request.messages[0].content"),
                             ({"fns": functions(extra=True)}, "columns"),
                             ({"settings": {"input": "b.csv"}}, "input: 'a.csv' -> 'b.csv'")]:
        with pytest.raises(InterruptedRunError, match="would not resume it") as err:
            start(out, **changed)
        assert message in str(err.value)
        assert sorted(p.relative_to(out) for p in out.rglob("*")) == before  # nothing changed
    with pytest.raises(InterruptedRunError, match="RESUME is False"):
        run_folder.open_folder(str(out), resume=False)  # before anything starts
    over = start(out, start_over=True, fns=functions("Sort."))
    assert not over.resuming and not (out / "parts").exists()
    assert [p.relative_to(out / EARLIER).parts[1:] for p in (out / EARLIER).rglob("p.parquet")] == [("parts", "p.parquet")]


def test_a_request_is_described_the_same_each_time_and_an_image_by_its_pixels():
    """A resumed run is compared by its example request: an image whose pixels a ``preprocess`` changed
    (size and mode the same) described as before would let one run mix two versions."""
    import numpy as np
    from PIL import Image

    from helpers.run_folder import describe

    dark = np.zeros((64, 64, 3), np.uint8)
    brighter = dark.copy()
    brighter[30, 30] = 255
    for image in (lambda a: a, Image.fromarray):
        assert describe({"image": image(dark)}) == describe({"image": image(dark.copy())})
        assert describe({"image": image(dark)}) != describe({"image": image(brighter)})
    assert describe({"a": [1, "x", None]}) == {"a": [1, "x", None]}


def test_results_in_memory_are_refused_once_a_later_run_moved_them(tmp_path):
    first = start(tmp_path / "out")
    first.lock.release()
    start(tmp_path / "out").lock.release()
    with pytest.raises(ResultsMovedError, match="A later run started"):
        first.path("summary.json")


HOLD = """
import sys, time
from helpers import pipeline, run_folder
from helpers.presets import PRESETS
fns = pipeline.checked(lambda r: {"messages": []}, lambda r: {"label": ""}, {"x": 1})
run = run_folder.open_folder(sys.argv[1]).start(PRESETS["text-cpu-offline"], fns, id_column=None, settings={})
print("held", flush=True)
time.sleep(600)
"""


def test_a_second_run_is_refused_before_anything_starts_and_a_dead_ones_lock_is_free(tmp_path, repo):
    """The lock was checked only after Ray had started and the data was read (a second run worked
    120 s before it stopped); now the notebook's first cell refuses it, naming the live run."""
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path / "out")], cwd=repo, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().startswith("output folder") and holder.stdout.readline().strip() == "held"
        started = time.monotonic()
        with pytest.raises(RunningElsewhereError, match=f"in use by run .* \\(process {holder.pid}\\)"):
            run_folder.open_folder(str(tmp_path / "out"))
        assert time.monotonic() - started < 5
    finally:
        holder.kill()
        holder.wait()
    start(tmp_path / "out").lock.release()  # its process gone: the system released its lock


def _take(path, results) -> None:
    try:
        run = run_folder.open_folder(path).start(PLAN, functions(), id_column=None, settings={})
        results.put("took")
        time.sleep(3)
        run.lock.release()
    except RunningElsewhereError:
        results.put("refused")


@pytest.mark.parametrize("where", ["disk", "bucket"])
def test_of_runs_that_start_at_the_same_moment_exactly_one_takes_the_folder(where, s3, tmp_path):
    """The lock was written, then read back: two runs could both go on. It is taken in one step now."""
    path = str(tmp_path / "out") if where == "disk" else f"s3://{BUCKET}/lock-race-{time.time_ns()}"
    run_folder.open_folder(path).start(PLAN, functions(), id_column=None, settings={}).lock.release()  # claimed
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    runs = [context.Process(target=_take, args=(path, results)) for _ in range(4)]
    for r in runs:
        r.start()
    for r in runs:
        r.join(60)
    assert sorted(results.get(timeout=10) for _ in runs) == ["refused", "refused", "refused", "took"]


@pytest.mark.parametrize("where", ["disk", "bucket"])
def test_a_run_whose_cell_failed_before_the_write_leaves_the_folder_to_the_kernels_next_run(where, s3, tmp_path):
    """The run cell after the last cell freed the engines begins its run, then fails, saying to run the
    cells again; run all again, in the same kernel: the folder check took the kernel's own lock for
    another run's, and refused it. A kernel runs one cell at a time, so none of its runs is live then."""
    path = str(tmp_path / "out") if where == "disk" else f"s3://{BUCKET}/left-{time.time_ns()}"
    run_folder.open_folder(path).start(PLAN, functions(), id_column=None, settings={})  # its cell fails: no release
    again = run_folder.open_folder(path).start(PLAN, functions(), id_column=None, settings={})
    assert again.lock.record["run"][:8] in run_folder._Lock(again.where).holder()  # held, for any other process
    again.lock.release()


def test_a_buckets_lock_is_kept_fresh_and_a_stale_one_taken_over(s3, monkeypatch):
    path = f"s3://{BUCKET}/stale-{time.time_ns()}"
    run = run_folder.open_folder(path).start(PLAN, functions(), id_column=None, settings={})
    record = json.loads((run.where / "run.lock").read_text())
    dead = subprocess.Popen([sys.executable, "-c", ""])
    dead.wait()
    here = (record["host"], record["pids"])  # this machine's name and process namespace (a container has its own)
    for pid, host in ((dead.pid, here), (os.getpid(), here), (dead.pid, ("another-machine", record["pids"])),
                      (dead.pid, (record["host"], record["pids"] + 1))):  # a container sharing the host's name
        (run.where / "run.lock").write_text(json.dumps({**record, "pid": pid, "host": host[0], "pids": host[1]}))  # fresh
        alive = (pid, host) != (dead.pid, here)  # a crashed run here is free at once, not after STALE_S
        assert bool(run_folder._Lock(run.where).holder()) is alive, (pid, host)
    (run.where / "run.lock").write_text(json.dumps({**record, "heartbeat": time.time() - 600}))  # its run died
    taken = run_folder.open_folder(path).start(PLAN, functions(), id_column=None, settings={})
    assert json.loads((run.where / "run.lock").read_text())["run"] == taken.lock.record["run"]
    taken.lock.release()
    assert not (run.where / "run.lock").exists()


def test_a_run_in_a_bucket_records_and_publishes_its_files(s3):
    path = f"s3://{BUCKET}/runs/text-{time.time_ns()}"
    run = start(path)
    assert run.root.is_dir() and not run.root.as_posix().startswith("s3:")
    run.path("summary.json").write_text("{}")
    assert run.publish() == f"results in {path}: summary.json"
    assert (run.where / "summary.json").read_text() == "{}"
    assert json.loads((run.where / "run.json").read_text())["files"] == ["summary.json"]


@pytest.mark.parametrize("where", ["disk", "bucket"])
def test_a_run_this_kernel_began_and_left_before_its_write_gives_its_lock_to_the_next(where, s3, tmp_path):
    """The run cell begins a run, then the processor stops it (its engines were freed): the cell run again in
    the same kernel takes the folder; another process still may not."""
    path = str(tmp_path / "out") if where == "disk" else f"s3://{BUCKET}/left-{time.time_ns()}"
    folder = run_folder.open_folder(path)  # the check cell
    left = folder.start(PLAN, functions(), id_column=None, settings={})  # the run cell: its lock never released
    again = folder.start(PLAN, functions(), id_column=None, settings={})  # the run cell again
    assert again.lock is not left.lock and left.lock.file is None
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    other = context.Process(target=_take, args=(path, results))
    other.start()
    other.join(60)
    assert results.get(timeout=10) == "refused"
    again.lock.release()
