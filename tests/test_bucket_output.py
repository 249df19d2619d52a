"""OUTPUT_DIR in a bucket: Ray's parts and checkpoints, run.json and the published tables, charts and
reports all land there, on a real S3-protocol server (moto on 127.0.0.1, ``AWS_ENDPOINT_URL``).

The multi-node runs that write to the bucket from two nodes, and resume there after a kill, are in
``test_multinode.py``.
"""

from __future__ import annotations

import json
import socket
import time

import pandas as pd
import pytest

from conftest import BUCKET, load_script, parameterised_notebook
from helpers import output_dir, outputs
from helpers.location import Location, OutputLocationError


def keys(s3, prefix: str) -> set[str]:
    found = s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])
    return {o["Key"][len(prefix):] for o in found}


def test_a_location_in_a_bucket_reads_writes_lists_and_removes(s3):
    folder = Location.of(f"s3://{BUCKET}/loc/")
    assert folder.remote and folder.uri == f"s3://{BUCKET}/loc" and str(folder) == folder.uri
    (folder / "a" / "x.parquet").write_bytes(pd.DataFrame({"id": [1, 2]}).to_parquet())
    (folder / "b.txt").write_text("hello")
    assert (folder / "b.txt").read_text() == "hello" and (folder / "b.txt").is_file()
    assert folder.children() == ["a", "b.txt"]
    [(part, modified)] = folder.files()
    assert part == folder / "a" / "x.parquet" and part.parquet_rows() == 2 and abs(modified - time.time()) < 120
    assert outputs.read_parts(folder)["id"].tolist() == [1, 2]
    folder.remove()
    assert not folder.exists() and keys(s3, "loc/") == set() and folder.children() == []
    with pytest.raises(OutputLocationError, match="web address"):
        Location.of("https://example.com/results")


def test_a_run_in_a_bucket_claims_the_folder_resumes_from_its_checkpoints_and_publishes(s3, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    uri = f"s3://{BUCKET}/runs/text"
    run = output_dir.prepare_output_dir(uri, resume=True, settings={"model": "m"})
    assert run.location == Location.of(uri) and run.where.remote and run.message == "starting fresh"
    assert run.root.is_dir() and not (tmp_path / "s3:").exists()  # nothing lands in a folder called "s3:"
    assert {outputs.MARKER, outputs.RUN_FILE} <= keys(s3, "runs/text/")
    assert json.loads(s3.get_object(Bucket=BUCKET, Key="runs/text/run.json")["Body"].read())["settings"] == {"model": "m"}
    # An interrupted run: a part and its committed checkpoint, and one write killed before its commit.
    (run.parts("results") / "a.parquet").write_bytes(pd.DataFrame({"id": ["1", "2"]}).to_parquet())
    (run.checkpoint("results") / "a.parquet").write_bytes(pd.DataFrame({"id": ["1", "2"]}).to_parquet())
    (run.checkpoint("results") / "b.pending.parquet").write_bytes(pd.DataFrame({"id": ["3"]}).to_parquet())
    resumed = output_dir.prepare_output_dir(uri, resume=True, settings={"model": "m"})
    assert resumed.message.startswith("resuming") and resumed.rows_done == 2
    (resumed.root / "summary.json").write_text("{}")
    (resumed.root / "label_counts.png").write_bytes(b"png")
    message = resumed.publish()
    assert message.startswith(f"results in {uri}: 2 files") and {"summary.json", "label_counts.png"} <= keys(s3, "runs/text/")
    before = keys(s3, "runs/text/")
    with pytest.raises(output_dir.InterruptedRunError, match="model: 'm' -> 'other'"):
        output_dir.prepare_output_dir(uri, resume=True, settings={"model": "other"})
    assert keys(s3, "runs/text/") == before  # nothing changed in the bucket
    fresh = output_dir.prepare_output_dir(uri, resume=True, settings={"model": "other"}, start_over=True)
    assert fresh.message.startswith(f"starting fresh (the earlier results are kept in {uri}/earlier/")
    assert not any(k.startswith(("parts/", "checkpoint/")) for k in keys(s3, "runs/text/"))
    assert "summary.json" not in keys(s3, "runs/text/")  # an earlier run's derived files never pass for this run's
    kept = {k.split("/", 2)[2] for k in keys(s3, "runs/text/") if k.startswith("earlier/") and k.count("/") >= 2}
    assert {"parts/results/a.parquet", "checkpoint/results/a.parquet", "summary.json", "run.json"} <= kept
    s3.put_object(Bucket=BUCKET, Key="runs/training/model.ckpt", Body=b"weights")
    with pytest.raises(output_dir.NotTheKitsFolderError, match="model.ckpt"):
        output_dir.prepare_output_dir(f"s3://{BUCKET}/runs/training")
    assert keys(s3, "runs/training/") == {"model.ckpt"}


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_bucket_that_cannot_be_used_fails_in_seconds_with_one_message_naming_it(s3, monkeypatch):
    def refused(uri: str, match: str) -> str:
        started = time.monotonic()
        with pytest.raises(OutputLocationError, match=match) as caught:
            output_dir.prepare_output_dir(uri, resume=True, settings={})
        assert time.monotonic() - started < 20
        assert f"OUTPUT_DIR={uri!r}" in str(caught.value)
        return str(caught.value)

    refused("s3://no-such-bucket/run", "the bucket 'no-such-bucket' does not exist")
    with monkeypatch.context() as m:
        m.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{closed_port()}")  # nothing answers there
        refused(f"s3://{BUCKET}/unreachable", "cannot be used: .*Could not connect")
    import moto.settings

    with monkeypatch.context() as m:  # moto checks credentials: the test's key is no IAM user's
        m.setattr(moto.settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)
        text = refused(f"s3://{BUCKET}/denied", "cannot be used: .*ACCESS_DENIED")
        assert "kit-test-secret" not in text
    assert keys(s3, "unreachable/") == set() and keys(s3, "denied/") == set()  # nothing half-written


def test_the_runner_writes_the_report_to_the_bucket_too(s3, tmp_path, monkeypatch):
    """``--out s3://...``: the executed notebook and its HTML are copied next to the results."""
    import nbformat

    runner = load_script("run_notebooks")
    tiny = parameterised_notebook(tmp_path / "tiny.ipynb", "OUTPUT_DIR = None", "from helpers import output_dir\n"
                                  "out = output_dir.prepare_output_dir(OUTPUT_DIR, settings={})\n"
                                  "(out.root / 'summary.json').write_text('{\"rows read\": 0}')\n"
                                  "print(out.publish())")
    monkeypatch.setitem(runner.NOTEBOOKS, "tiny", tiny)
    monkeypatch.setattr(runner, "render_report", lambda executed, html: html.write_text("<html></html>") or True)
    where = runner.run("tiny", f"s3://{BUCKET}/reports", {}, cwd=tmp_path)
    assert where == f"s3://{BUCKET}/reports/tiny"
    assert {"tiny.ipynb", "tiny.html", "summary.json", outputs.RUN_FILE, outputs.MARKER} <= keys(s3, "reports/tiny/")
    executed = nbformat.reads(s3.get_object(Bucket=BUCKET, Key="reports/tiny/tiny.ipynb")["Body"].read().decode(), 4)
    assert f"results in s3://{BUCKET}/reports/tiny: 1 files" in executed.cells[-1].outputs[0].text
    assert not (tmp_path / "s3:").exists()
    # A second run moves the first one's report aside with its results, byte for byte.
    first = {k: s3.get_object(Bucket=BUCKET, Key=f"reports/tiny/{k}")["Body"].read() for k in ("tiny.ipynb", "tiny.html")}
    runner.run("tiny", f"s3://{BUCKET}/reports", {}, cwd=tmp_path)
    (moved,) = {k.split("/")[0] for k in keys(s3, "reports/tiny/earlier/") if "/" in k}
    assert {k: s3.get_object(Bucket=BUCKET, Key=f"reports/tiny/earlier/{moved}/{k}")["Body"].read()
            for k in first} == first


def test_two_runs_to_one_bucket_on_one_machine_stage_in_folders_of_their_own(s3):
    """The staging folder was /tmp/llm-batch-kit-staging/<hash of the URI>, emptied at each start: a
    second run to the same bucket folder removed the first one's tables before it published them."""
    uri = f"s3://{BUCKET}/runs/shared"
    first = output_dir.prepare_output_dir(uri, settings={"model": "m"})
    (first.root / "summary.json").write_text("{}")
    second = output_dir.prepare_output_dir(uri, settings={"model": "m"})
    assert first.root != second.root and (first.root / "summary.json").read_text() == "{}"


def test_a_second_run_to_the_same_bucket_stops_while_the_first_writes(s3):
    """One run per OUTPUT_DIR in a bucket too: there a move is a copy and a delete, and objects the live
    run wrote in between were lost (helpers.run_lock)."""
    from test_run_lock import second_run

    live = output_dir.prepare_output_dir(f"s3://{BUCKET}/runs/same")
    found = second_run(f"s3://{BUCKET}/runs/same")
    assert "refused" in found and "is in use by another run" in found["refused"], found
    live.lock.release()
    assert "ran" in second_run(f"s3://{BUCKET}/runs/same")
