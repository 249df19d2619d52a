import json
import math
from pathlib import Path

import pandas as pd
import pytest

from helpers import output_dir, outputs, report, run_stats

LABELS = ["A", "B", "C"]


def test_per_label_table_and_confusion_matrix():
    truth = pd.Series(["A", "A", "B", "C"])
    pred = pd.Series(["A", "B", "B", "B"])
    table = report.per_label_table(truth, pred, LABELS)
    assert table.loc["A", "recall"] == 0.5 and table.loc["B", "precision"] == pytest.approx(1 / 3)
    assert math.isnan(table.loc["C", "precision"])
    assert table.loc["all", "correct"] == 2 and table.loc["all", "recall"] == 0.5
    cm = report.confusion_matrix(truth, pred, LABELS)
    assert cm.loc["A", "B"] == 1 and cm.loc["C", "B"] == 1 and int(cm.values.sum()) == 4
    assert list(cm.columns) == LABELS  # a label never predicted still gets its column


def test_charts_are_written(tmp_path):
    cm = report.confusion_matrix(pd.Series(["A", "B"]), pd.Series(["A", "A"]), LABELS)
    report.plot_confusion_matrix(cm, tmp_path / "cm.png")
    report.plot_label_counts(pd.Series(["A", "A"]), LABELS, truth=pd.Series(["A", "B"]), path=tmp_path / "c.png")
    assert (tmp_path / "cm.png").stat().st_size > 1000 and (tmp_path / "c.png").stat().st_size > 1000


def result(answered, errors, read_now, written_before=0):
    from helpers.pipeline import RunResult
    from helpers.run_stats import Throughput

    return RunResult(root=Path("."), answered=answered, errors=errors, rows_entered_now=read_now,
                     rows_written_now=len(answered) + len(errors) - written_before,
                     rows_written_before=written_before,
                     throughput=Throughput(rows=100, seconds=50, steady=9.0, steady_basis="fitted over 9 result files",
                                           answered_rows=100, input_tokens=5000, output_tokens=300))


def test_throughput_end_to_end_and_steady_state():
    t = run_stats.throughput_table(result(pd.DataFrame(), pd.DataFrame(), 0))
    assert t["rows/s, end to end"] == 2 and t["rows/s, steady state"] == 9
    assert t["steady state"] == "fitted over 9 result files"
    assert t["input tokens/row"] == 50 and t["output tokens/row"] == 3 and t["output tokens/s, steady state"] == 27


def test_a_steady_state_not_measured_is_null_in_the_summary_with_its_reason(tmp_path):
    import dataclasses
    import json

    from helpers.run_stats import Throughput

    unmeasured = dataclasses.replace(result(pd.DataFrame(), pd.DataFrame(), 0), root=tmp_path, throughput=Throughput(
        rows=24, seconds=51.4, steady_basis="not measured: 2 result files, fewer than 5"))
    table = run_stats.throughput_table(unmeasured)
    assert math.isnan(table["rows/s, steady state"]) and table["steady state"].startswith("not measured")

    def no_nan(constant):  # Python writes NaN into JSON unless told not to; JSON has no NaN
        raise AssertionError(f"summary.json holds {constant}")

    summary = json.loads(report.save_summary(unmeasured, {}).read_text(), parse_constant=no_nan)
    assert summary["rows/s steady state"] is None
    assert summary["steady state"] == "not measured: 2 result files, fewer than 5"


def test_run_summary_accounts_for_every_row():
    predictions = pd.DataFrame({"row_id": ["1", "2"], "p": ["A", "B"]})
    errors = pd.DataFrame({"row_id": ["3", "4"], "stage": ["rejected before the model", "engine"],
                           "reason": ["empty value", "x"]})
    s = report.run_summary(result(predictions, errors, 4), prediction_column="p", labels=LABELS)
    assert s["all rows accounted for"] and s["every prediction is a label"] and s["engine errors"] == 1
    resumed = report.run_summary(result(predictions, errors, 3, written_before=1), prediction_column="p", labels=LABELS)
    assert resumed["rows read"] == 4 and resumed["all rows accounted for"]
    bad = report.run_summary(result(pd.DataFrame({"row_id": ["9"], "p": ["Z"]}), errors, 5),
                             prediction_column="p", labels=LABELS)
    assert not bad["all rows accounted for"] and bad["predictions outside the labels"] == ["Z"]
    twice = report.run_summary(result(pd.DataFrame({"row_id": ["3", "4"], "p": ["A", "A"]}), errors, 4),
                               prediction_column="p", labels=LABELS)
    assert not twice["all rows accounted for"] and not twice["row ids unique"]
    uncounted = report.run_summary(result(predictions, errors, None), prediction_column="p", labels=LABELS)
    assert not uncounted["all rows accounted for"] and uncounted["rows read"].startswith("not counted")
    assert report.invariants(s) == {"at least one row read": True, "all rows accounted for": True,
                                    "the model answered": True, "every prediction is a label": True}
    assert report.format_summary({"a": 1, "long name": 2}) == "a:         1\nlong name: 2"


def test_caption_summary_and_its_invariants():
    captions = pd.DataFrame({"row_id": ["1"], "caption": [""]})
    errors = pd.DataFrame({"row_id": ["2", "3"], "stage": ["rejected before the model", "postprocess"],
                           "reason": ["truncated file", "postprocess failed: KeyError: 'x'"]})
    s = report.caption_summary(result(captions, errors, 3))
    assert s["all images accounted for"] and s["postprocess errors"] == 1 and s["empty captions"] == 1
    assert set(report.invariants(s)) == {"at least one image read", "all images accounted for", "the model answered",
                                         "every rejected image has a reason"}


def test_a_run_whose_every_row_failed_in_the_engine_does_not_read_as_success():
    """A dead engine (every usable row an engine error) printed 'all rows accounted for: True' and
    'every prediction is a label: True' in the checked cell, like a good run."""
    errors = pd.DataFrame({"row_id": ["1", "2", "3"], "stage": ["rejected before the model", "engine", "engine"],
                           "reason": ["empty value", "EngineDeadError", "EngineDeadError"]})
    dead = report.run_summary(result(pd.DataFrame({"row_id": [], "p": []}), errors, 3), prediction_column="p",
                              labels=LABELS)
    assert dead["all rows accounted for"] and dead["the model answered"] is False
    assert report.invariants(dead)["the model answered"] is False
    assert report.caption_summary(result(pd.DataFrame({"row_id": [], "caption": []}), errors, 3))[
        "the model answered"] is False
    only_rejects = errors.assign(stage="rejected before the model")
    assert not report.run_summary(result(pd.DataFrame({"row_id": [], "p": []}), only_rejects, 3),
                                  prediction_column="p", labels=LABELS)["the model answered"]  # nothing was answered
    with pytest.raises(report.RunCheckError, match="the model answered"):
        report.require(dead)


def test_the_checked_cell_fails_on_zero_rows_and_on_an_engine_that_died_after_its_first_batch():
    empty = report.run_summary(result(pd.DataFrame({"row_id": [], "p": []}), pd.DataFrame(), 0),
                               prediction_column="p", labels=LABELS)
    assert empty["all rows accounted for"] and not empty["at least one row read"]  # 0 == 0 is not a run
    with pytest.raises(report.RunCheckError, match="at least one row read.*rows read 0"):
        report.require(empty)
    # The first batch of 8 answered, then every row an engine error: each accounted for, most failed.
    answered = pd.DataFrame({"row_id": [str(i) for i in range(8)], "p": ["A"] * 8})
    died = pd.DataFrame({"row_id": [str(i) for i in range(8, 100)], "stage": "engine", "reason": "EngineDeadError"})
    summary = report.run_summary(result(answered, died, 100), prediction_column="p", labels=LABELS)
    assert summary["all rows accounted for"] and summary["the model answered"] is False
    with pytest.raises(report.RunCheckError, match="the model answered.*engine errors 92"):
        report.require(summary)
    # A few engine errors (prompts over max_model_len) in a good run: it passes, and the counts are shown.
    few = report.run_summary(result(answered, died.head(1), 9), prediction_column="p", labels=LABELS)
    assert report.require(few, counts=True) == {
        "rows read": 9, "rejected before the model": 0, "classified": 8, "engine errors": 1,
        "at least one row read": True, "all rows accounted for": True, "the model answered": True,
        "every prediction is a label": True}


def test_identical_rows_with_ids_from_content_are_each_answered_and_accounted_for():
    """ID_COLUMN=None hashes each row's content: two identical rows share an id, both are answered,
    and that is no lost row (it read as one: 'all rows accounted for: False')."""
    predictions = pd.DataFrame({"row_id": ["h1", "h1", "h2"], "p": ["A", "A", "B"]})
    s = report.run_summary(result(predictions, pd.DataFrame(), 3), prediction_column="p", labels=LABELS,
                           ids_from_content=True)
    assert s["all rows accounted for"] and not s["row ids unique"]
    assert s["rows identical to another (ids from content)"] == 1
    assert not report.run_summary(result(predictions, pd.DataFrame(), 3), prediction_column="p",
                                  labels=LABELS)["all rows accounted for"]  # ids that must be unique are not
    lost = report.run_summary(result(predictions, pd.DataFrame(), 4), prediction_column="p", labels=LABELS,
                              ids_from_content=True)
    assert not lost["all rows accounted for"]  # the counts still must add up


def test_prepare_output_dir_moves_earlier_results_aside_and_deletes_nothing(tmp_path):
    out = tmp_path / "o"
    output_dir.claim_output_dir(out)  # an earlier run's folder
    (out / outputs.PARTS / "classified").mkdir(parents=True)
    (out / outputs.PARTS / "classified" / "old.parquet").write_text("x")
    (out / outputs.PREDICTIONS).write_text("old")
    (out / "my_notes.txt").write_text("keep me")
    run = output_dir.prepare_output_dir(str(out))
    assert run.root == out.resolve() and not run.resume
    assert run.message.startswith("starting fresh (the earlier results are kept in ")
    (kept,) = (out / outputs.EARLIER).iterdir()
    assert str(kept) in run.message
    assert (kept / outputs.PARTS / "classified" / "old.parquet").read_text() == "x"
    assert (kept / outputs.PREDICTIONS).read_text() == "old"
    assert not (out / outputs.PARTS).exists() and not (out / outputs.PREDICTIONS).exists()
    assert (out / "my_notes.txt").read_text() == "keep me"
    again = output_dir.prepare_output_dir(str(out))  # nothing new to move: the earlier folder stays as it is
    assert again.message == "starting fresh" and len(list((out / outputs.EARLIER).iterdir())) == 1
    (tmp_path / "file").write_text("")
    with pytest.raises(NotADirectoryError):
        output_dir.prepare_output_dir(str(tmp_path / "file"))


def test_a_folder_the_kit_did_not_write_is_refused_and_left_as_it_is(tmp_path):
    """OUTPUT_DIR pointed at a training run's folder deleted its checkpoint/ (removed by name alone)."""
    training = tmp_path / "training"
    (training / "checkpoint").mkdir(parents=True)
    (training / "checkpoint" / "step-1000.pt").write_text("weights")
    (training / "parts").mkdir()
    with pytest.raises(output_dir.NotTheKitsFolderError, match="not empty and was not written by this kit.*checkpoint"):
        output_dir.prepare_output_dir(str(training), settings={"a": 1})
    assert (training / "checkpoint" / "step-1000.pt").read_text() == "weights" and (training / "parts").is_dir()
    assert not (training / outputs.MARKER).exists()
    # New, empty, or holding only papermill's output notebook: the kit's from now on.
    for folder in (tmp_path / "new", tmp_path / "empty", tmp_path / "papermill"):
        folder.mkdir(exist_ok=folder.name != "new")
    (tmp_path / "papermill" / "text_classification.ipynb").write_text("{}")
    for folder in (tmp_path / "new", tmp_path / "empty", tmp_path / "papermill"):
        assert output_dir.prepare_output_dir(str(folder)).root == folder.resolve()
        assert (folder / outputs.MARKER).is_file()
    # Results of a kit version that wrote no marker: its run.json says whose they are.
    legacy = tmp_path / "legacy"
    (legacy / outputs.PARTS).mkdir(parents=True)
    (legacy / outputs.RUN_FILE).write_text('{"fingerprint": "abc", "settings": {}}')
    output_dir.prepare_output_dir(str(legacy))
    assert not (legacy / outputs.PARTS).exists() and len(list((legacy / outputs.EARLIER).glob("*/parts"))) == 1


def test_every_claim_of_a_folder_answers_the_same(tmp_path):
    """claim_output_dir (the run), output_dir_problem (the check before anything starts) and
    claim_location (a bucket, tests/test_bucket_output.py) share one check: the same folders pass."""
    folders = {name: tmp_path / name for name in ("new", "empty", "kits", "legacy", "foreign", "notebook")}
    for name in ("empty", "kits", "legacy", "foreign", "notebook"):
        folders[name].mkdir()
    (folders["kits"] / outputs.MARKER).write_text(outputs.MARKER_TEXT)
    (folders["kits"] / "mine.txt").write_text("")
    (folders["legacy"] / outputs.RUN_FILE).write_text('{"fingerprint": "abc"}')
    (folders["foreign"] / outputs.RUN_FILE).write_text('{"steps": 1000}')  # someone else's run.json
    (folders["notebook"] / "run.ipynb").write_text("{}")
    for name, folder in folders.items():
        problem = output_dir.output_dir_problem(str(folder))
        try:
            output_dir.claim_output_dir(folder)
            claimed = ""
        except output_dir.NotTheKitsFolderError as exc:
            claimed = str(exc)
        assert problem == claimed, name
        assert bool(claimed) == (name == "foreign"), name
        assert (folder / outputs.MARKER).exists() == (name != "foreign")


def test_the_output_folder_check_names_each_node_that_does_not_see_it(tmp_path, monkeypatch):
    """check_every_node_sees asks every node through node_cache.on_each_node, as the cache check does."""
    import ray

    from helpers import node_cache

    nodes = [{"NodeID": f"{n}" * 16, "NodeManagerAddress": f"10.0.0.{n}", "Alive": True} for n in (1, 2)]
    monkeypatch.setattr(ray, "nodes", lambda: nodes + [{"NodeID": "3" * 16, "Alive": False}])
    asked = []

    def on_each_node(fn, args, asked_nodes, timeout_s, runtime_env=None):
        asked.append([n["NodeID"] for n in asked_nodes])
        return [fn(*args), "(FileNotFoundError)"]  # the first node sees the folder, the second does not

    monkeypatch.setattr(node_cache, "on_each_node", on_each_node)
    with pytest.raises(output_dir.NodeLocalOutputError, match=r"1 of the Ray cluster's 2 nodes do not see: 10\.0\.0\.2"):
        output_dir.check_every_node_sees(tmp_path)
    assert asked == [["1" * 16, "2" * 16]] and not list(tmp_path.iterdir())  # the marker is removed
    monkeypatch.setattr(node_cache, "on_each_node", lambda fn, args, *rest, **kw: [fn(*args), fn(*args)])
    assert output_dir.check_every_node_sees(tmp_path) == 2
    lost = ray.exceptions.GetTimeoutError("no answer")
    monkeypatch.setattr(node_cache, "on_each_node", lambda *a, **k: ["", lost])
    with pytest.raises(ray.exceptions.GetTimeoutError):
        output_dir.check_every_node_sees(tmp_path)


def test_every_node_sees_the_folder_before_anything_in_it_moves(tmp_path, monkeypatch):
    """The node check ran in pipeline.run, after prepare_output_dir had moved the earlier results aside:
    a run that then stopped had changed the folder. The notebook's prepare_output checks first."""
    import types

    from helpers import cluster

    out = tmp_path / "o"
    output_dir.prepare_output_dir(str(out), settings={"a": 1})
    (out / outputs.PREDICTIONS).write_text("earlier rows")
    before = _files(out)
    checked = []

    def blind(folder):
        checked.append(Path(folder))
        raise output_dir.NodeLocalOutputError("a node does not see it")

    monkeypatch.setattr(output_dir, "check_every_node_sees", blind)
    session = types.SimpleNamespace(check_ready=lambda ds: None)
    with pytest.raises(output_dir.NodeLocalOutputError):
        cluster.Session.prepare_output(session, str(out), None, resume=True, start_over=False, settings={"a": 2})
    assert checked == [out.resolve()] and _files(out) == before and not (out / outputs.EARLIER).exists()
    output_dir.prepare_output_dir(str(out), settings={"a": 2})  # without Ray (unit use): not checked
    assert checked == [out.resolve()] and (out / outputs.EARLIER).is_dir()


def _interrupted_with(out: Path, committed, pending=None):
    """``out`` as a run left it: ``committed`` (a table) written and its checkpoint committed, and
    ``pending`` written with its checkpoint still pending (killed in between); then claimed again to
    resume. The run's outputs and its results folder."""
    import pyarrow.parquet as pq

    settings = {"model": "m"}
    run = output_dir.prepare_output_dir(str(out), resume=True, settings=settings)
    parts, checkpoint = Path(run.parts("results").path), Path(run.checkpoint("results").path)
    parts.mkdir(parents=True)
    checkpoint.mkdir(parents=True)
    pq.write_table(committed, parts / "done_000000_000000.parquet")
    pq.write_table(committed, checkpoint / "done.parquet")
    if pending is not None:
        pq.write_table(pending, parts / "killed_000000_000000.parquet")
        pq.write_table(pending, checkpoint / "killed.pending.parquet")
    run = output_dir.prepare_output_dir(str(out), resume=True, settings=settings)
    assert run.message.startswith("resuming")
    return run, parts


def test_a_resume_after_ray_recovered_a_write_killed_before_its_checkpoint_counts_what_survived(local_ray, tmp_path):
    """Killed between a part file and its checkpoint commit, a run leaves that part with a pending
    checkpoint; resuming, Ray deletes the part (its rows are not done) and the kit's count of the
    rows written before read the deleted file (FileNotFoundError at the end of the resumed run)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import ray

    # Rows 0-9: written and committed. Rows 10-14: written, checkpoint still pending (the kill).
    run, parts = _interrupted_with(tmp_path / "o", pa.table({"id": [str(i) for i in range(10)]}),
                                   pa.table({"id": [str(i) for i in range(10, 15)]}))
    pq.write_table(pa.table({"id": [str(i) for i in range(20)]}), tmp_path / "source.parquet")
    ds = ray.data.read_parquet(str(tmp_path / "source.parquet"))  # Ray's checkpoint filter follows a read
    written = run.write(ds, "results", id_column="id", num_cpus=0.5)
    assert not (parts / "killed_000000_000000.parquet").exists()  # Ray's recovery removed it
    assert (written.rows_before, written.rows) == (10, 10)
    ids = pq.read_table(parts).column("id").to_pylist()
    assert sorted(ids, key=int) == [str(i) for i in range(20)]  # each row once


def test_parquet_images_without_an_id_column_resume_on_rays_row_hash(local_ray, tmp_path):
    """Without ID_COLUMN a parquet row is resumed by Ray's row_hash (its file and its position
    there), which the read keeps: the rows an interrupted run committed are skipped at the read, the
    rest are written once, identical images included (two rows, two hashes)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import ray

    from helpers import image_data, sample_images

    files = list(sample_images.sample_files().items())[:5]
    (tmp_path / "pq").mkdir()
    for n in range(2):  # the same five images in two files: ten rows
        pd.DataFrame({"image": [{"bytes": b, "path": f"{k}.jpg"} for k, b in files]}).to_parquet(
            tmp_path / "pq" / f"train-{n}.parquet")
    key = image_data.source_id_column("parquet", None)
    assert key == image_data.ROW_HASH
    hashes = ray.data.read_parquet(str(tmp_path / "pq"), include_row_hash=True).to_pandas()[key]
    assert hashes.nunique() == 10

    # An interrupted run committed 4 rows.
    run, parts = _interrupted_with(tmp_path / "o", pa.table({key: pa.array(hashes[:4].to_numpy())}))
    ds = image_data.read_images(str(tmp_path / "pq"), "parquet", image_column="image")
    written = run.write(ds.select_columns([key, "row_id"]), "results", id_column=key, num_cpus=0.5)
    assert (written.rows_before, written.rows) == (4, 6)
    assert sorted(pq.read_table(parts).column(key).to_pylist()) == sorted(hashes.tolist())  # each row once


def interrupted_run(out, settings):
    output_dir.prepare_output_dir(str(out), resume=True, settings=settings)
    (out / outputs.PARTS / "classified").mkdir(parents=True)
    (out / outputs.PARTS / "classified" / "done.parquet").write_text("rows")
    (out / outputs.CHECKPOINT / "classified").mkdir(parents=True)
    pd.DataFrame({"id": ["a", "b"]}).to_parquet(out / outputs.CHECKPOINT / "classified" / "ids.parquet")
    pd.DataFrame({"id": ["c"]}).to_parquet(out / outputs.CHECKPOINT / "classified" / "x.pending.parquet")
    (out / outputs.CHECKPOINT / "rejected").mkdir(parents=True)  # finished: Ray emptied it
    (out / outputs.ERRORS).write_text("stale")


def test_resume_keeps_an_interrupted_runs_parts_with_the_same_settings(tmp_path):
    out = tmp_path / "o"
    interrupted_run(out, {"model": "a"})
    run = output_dir.prepare_output_dir(str(out), resume=True, settings={"model": "a"})
    assert run.resume and run.message.startswith("resuming an interrupted run")
    assert run.rows_done == 2  # committed ids only: a pending checkpoint's rows are not done
    assert (out / outputs.PARTS / "classified" / "done.parquet").exists()
    assert (out / outputs.CHECKPOINT / "classified" / "ids.parquet").exists()
    assert not (out / outputs.ERRORS).exists()  # derived tables are always rebuilt


def _files(folder):
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_an_interrupted_run_that_would_not_resume_stops_the_run_and_is_left_byte_for_byte(tmp_path):
    out = tmp_path / "o"
    interrupted_run(out, {"model": "a", "limit": 30, "request": {"messages": [{"content": "Classify."}]}})
    before = _files(out)
    changed = {"model": "b", "limit": 40, "request": {"messages": [{"content": "Classify, briefly."}]}}
    with pytest.raises(output_dir.InterruptedRunError) as stopped:
        output_dir.prepare_output_dir(str(out), resume=True, settings=changed)
    message = str(stopped.value)
    assert "2 rows finished" in message and "START_OVER=True" in message and "RESUME=True" in message
    assert "model: 'a' -> 'b'" in message and "limit: 30 -> 40" in message
    assert "request.messages[0].content: 'Classify.' -> 'Classify, briefly.'" in message
    assert _files(out) == before  # nothing touched, not even run.json
    with pytest.raises(output_dir.InterruptedRunError, match="RESUME is False"):
        output_dir.prepare_output_dir(str(out), resume=False, settings={"model": "a"})
    assert _files(out) == before
    # Your explicit choice: start over; the interrupted run's files are kept, byte for byte.
    run = output_dir.prepare_output_dir(str(out), resume=True, settings=changed, start_over=True)
    assert run.message.startswith("starting fresh (the earlier results are kept in") and run.rows_done == 0
    (kept,) = (out / outputs.EARLIER).iterdir()
    assert {k: v for k, v in before.items() if k.startswith((outputs.PARTS, outputs.CHECKPOINT))} == \
        {k: v for k, v in _files(kept).items() if k.startswith((outputs.PARTS, outputs.CHECKPOINT))}
    assert json.loads((kept / outputs.RUN_FILE).read_text())["settings"]["model"] == "a"  # how they were made
    assert not (out / outputs.PARTS).exists() and not (out / outputs.CHECKPOINT).exists()


def test_start_over_starts_over_also_where_the_settings_match(tmp_path):
    """START_OVER=True was ignored when the settings matched: the interrupted run was resumed."""
    out = tmp_path / "o"
    interrupted_run(out, {"model": "a"})
    before = _files(out)
    run = output_dir.prepare_output_dir(str(out), resume=True, settings={"model": "a"}, start_over=True)
    assert run.message.startswith("starting fresh (the earlier results are kept in") and run.rows_done == 0
    (kept,) = (out / outputs.EARLIER).iterdir()
    assert {k: v for k, v in before.items() if k.startswith((outputs.PARTS, outputs.CHECKPOINT))} == \
        {k: v for k, v in _files(kept).items() if k.startswith((outputs.PARTS, outputs.CHECKPOINT))}
    assert not (out / outputs.PARTS).exists() and not (out / outputs.CHECKPOINT).exists()


def test_results_in_memory_are_refused_once_a_later_run_moved_them(tmp_path):
    out = tmp_path / "o"
    first = output_dir.prepare_output_dir(str(out), settings={"a": 1})
    first.check_current()
    (out / outputs.PREDICTIONS).write_text("rows")
    output_dir.prepare_output_dir(str(out), settings={"a": 1})
    with pytest.raises(outputs.ResultsMovedError, match="Run the notebook from the 'Run the pipeline' cell down"):
        first.check_current()


def test_only_committed_checkpoints_count(tmp_path):
    folder = tmp_path / "ck"
    assert not outputs.has_checkpoint(folder)
    folder.mkdir()
    assert not outputs.has_checkpoint(folder)  # emptied after a finished run
    (folder / "abc.pending.parquet").write_text("")
    assert not outputs.has_checkpoint(folder)  # killed before the first commit
    (folder / "abc.parquet").write_text("")
    assert outputs.has_checkpoint(folder)


def test_an_emptied_checkpoint_folder_means_a_fresh_start(tmp_path):
    out = tmp_path / "o"
    output_dir.prepare_output_dir(str(out), resume=True, settings={"a": 1})
    (out / outputs.CHECKPOINT / "classified").mkdir(parents=True)
    (out / outputs.PARTS / "classified").mkdir(parents=True)
    run = output_dir.prepare_output_dir(str(out), resume=True, settings={"a": 1})
    assert run.message.startswith("starting fresh (the earlier results are kept in") and not (out / outputs.PARTS).exists()


def test_fingerprint_is_order_independent():
    assert outputs.fingerprint({"a": 1, "b": [1, 2]}) == outputs.fingerprint({"b": [1, 2], "a": 1})
    assert outputs.fingerprint({"a": 1}) != outputs.fingerprint({"a": 2})


def test_checkpoint_filter_accepts_pandas_and_arrow_blocks(local_ray):
    import numpy as np
    import pyarrow as pa
    import ray
    from ray.data.checkpoint import CheckpointConfig

    from helpers.checkpointing import AnyBlockCheckpointFilter

    ref = ray.put(np.array(["a", "c"], dtype=object))
    f = AnyBlockCheckpointFilter(CheckpointConfig(id_column="k", checkpoint_path="/tmp/unused"), ref)
    kept = f.filter_rows_for_block(pd.DataFrame({"k": ["a", "b", "c", "d"], "v": [1, 2, 3, 4]}))
    assert kept.column("k").to_pylist() == ["b", "d"]
    kept = f.filter_rows_for_block(pa.table({"k": ["a", "e"]}))
    assert kept.column("k").to_pylist() == ["e"]


def test_request_digest_changes_with_the_prompt_or_a_setting_and_ignores_engine_filled_fields():
    import numpy as np

    params = ("SamplingParams(n=1, temperature=0.0, max_tokens=15, structured_outputs=StructuredOutputsParams("
              "choice=['A', 'B'], _backend=None, _backend_was_auto=False), extra_args=None)")
    base = outputs.request_digest([1, 2, 3], params)
    assert outputs.request_digest(np.array([1, 2, 3]), params) == base  # Arrow hands back arrays
    assert outputs.request_digest([1, 2, 3], params.replace("_backend=None", "_backend='xgrammar'")
                                  .replace("_backend_was_auto=False", "_backend_was_auto=True")) == base
    assert outputs.request_digest([1, 2, 4], params) != base
    assert outputs.request_digest([1, 2, 3], params.replace("max_tokens=15", "max_tokens=16")) != base
    assert outputs.request_digest([1, 2, 3], params.replace("'B'", "'C'")) != base


def test_result_rows_carry_the_engine_columns():
    row = {"id": 1, "generated_text": "x", "num_input_tokens": 5, "num_generated_tokens": 2,
           "prompt_token_ids": [7, 8], "params": "SamplingParams(temperature=0.0)"}
    ok = outputs.result_row(row, ["id"], answer="x")
    assert set(ok) == {"id", "answer", *outputs.ENGINE_COLUMNS, "error"}
    assert ok["request_digest"] == outputs.request_digest([7, 8], row["params"]) and ok["error"] == ""


def test_image_grid_shows_any_caption_as_written(tmp_path):
    # An untrained model wrote "sofild s b\x00$$0": matplotlib read "$...$" as math and failed the run.
    import numpy as np

    image = np.zeros((8, 8, 3), dtype=np.uint8)
    captions = ["sofild s b\x00$$0", "$x^$", "a \\frac{ b", "", "plain words " * 20]
    fig = report.plot_image_grid([(image, f"img_$_{i}$", c) for i, c in enumerate(captions)],
                                 tmp_path / "grid.png", columns=3)
    assert (tmp_path / "grid.png").stat().st_size > 1000
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert "$x^$" in texts and "(empty)" in texts


def test_an_edited_preprocess_starts_fresh_not_a_mix_of_old_and_new_answers(tmp_path):
    """Resume is keyed on the request an example row produces, so an edit anywhere in
    ``preprocess`` (not only in TASK or the template) is a new run; images compare by pixels."""
    import numpy as np
    from PIL import Image

    def preprocess(row, extra=""):
        image = Image.fromarray(np.full((28, 28, 3), row["v"], dtype=np.uint8))
        return {"messages": [{"role": "user", "content": [{"type": "text", "text": "Describe." + extra},
                                                          {"type": "image_pil", "image_pil": image}]}],
                "sampling_params": {"max_tokens": 8}}

    first = outputs.describe_request(preprocess({"v": 0}))
    assert first == outputs.describe_request(preprocess({"v": 0}))  # a new PIL object, same request
    assert "0x" not in json.dumps(first) and "image RGB 28x28 sha256:" in json.dumps(first)
    assert first != outputs.describe_request(preprocess({"v": 1}))  # other pixels
    out = tmp_path / "o"
    interrupted_run(out, {"model": "a", "request": first})
    same = output_dir.prepare_output_dir(str(out), resume=True, settings={"model": "a", "request": first})
    assert same.message.startswith("resuming")
    other = tmp_path / "other"
    interrupted_run(other, {"model": "a", "request": first})
    edited = outputs.describe_request(preprocess({"v": 0}, extra=" Be brief."))
    with pytest.raises(output_dir.InterruptedRunError, match=r"request\.messages\[0\]\.content\[0\]\.text: 'Describe\.' -> 'Describe\. Be brief\.'"):
        output_dir.prepare_output_dir(str(other), resume=True, settings={"model": "a", "request": edited})
    output_dir.prepare_output_dir(str(other), resume=True, settings={"model": "a", "request": edited}, start_over=True)
    assert json.loads((other / outputs.RUN_FILE).read_text())["settings"]["request"] == edited  # readable in run.json


STATS = """Operator 1 ReadCSV->SplitBlocks(8): 1 tasks executed, 8 blocks produced in 4.09s
* Remote wall time: 197.99us min, 249.66ms max, 32.41ms mean, 259.25ms total
* Output num rows per block: 38 min, 39 max, 38 mean, 309 total

Operator 2 MapBatches(vLLMEngineStageUDF): 4 tasks executed, 5 blocks produced in 18.18s
* Output num rows per block: 38 min, 39 max, 38 mean, 307 total

Operator 3 MapBatches(ChatTemplateUDF): 4 tasks executed, 4 blocks produced in 240.5ms
"""


def test_the_throughput_section_shows_one_row_per_stage_slowest_first_and_keeps_rays_text(tmp_path):
    table = run_stats.stage_table(STATS, tmp_path / "ray_stats.txt")
    assert list(table.index) == ["MapBatches(vLLMEngineStageUDF)", "ReadCSV->SplitBlocks(8)", "MapBatches(ChatTemplateUDF)"]
    assert table.loc["MapBatches(vLLMEngineStageUDF)", "rows out"] == 307
    assert table.loc["MapBatches(ChatTemplateUDF)", "wall time (s)"] == 0.24
    assert (tmp_path / "ray_stats.txt").read_text() == STATS
    assert run_stats.stage_table("(no statistics: ...)").empty


def test_captions_draw_without_tofu():
    assert report.readable_caption("Bjørn’s café, 10 €") == "Bjørn’s café, 10 €"
    assert report.readable_caption("a dog\ufffd") == "a dog·"  # a broken byte is not drawn as a box
    noise = report.readable_caption("\U0001d400\ufffd\U000e0001\ufffd x")
    assert noise.startswith("(6 characters, most without a glyph")


def test_a_write_never_overwrites_result_files_it_would_not_resume(tmp_path):
    """Ray's write with mode="overwrite" deletes what the folder holds: a write that does not resume
    refuses a folder with result files (prepare_output_dir has moved an earlier run's aside)."""
    out = output_dir.prepare_output_dir(str(tmp_path / "o"), resume=True, settings={})
    parts = Path(out.parts("results").path)
    parts.mkdir(parents=True)
    pd.DataFrame({"id": ["1"]}).to_parquet(parts / "done.parquet")
    with pytest.raises(FileExistsError, match="1 result files and this write would not resume them"):
        out.write(None, "results", id_column=None, num_cpus=0.1)
    assert (parts / "done.parquet").is_file()
