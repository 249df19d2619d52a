"""OUTPUT_DIR in a bucket (moto's S3 server on 127.0.0.1, ``AWS_ENDPOINT_URL``): an interrupted run
resumed there, a changed setting refused with nothing changed, the earlier run's objects moved aside,
the runner's report published beside the results, and a bucket that cannot be used named in seconds.
The notebooks writing to a bucket from two nodes, killed and resumed: test_multinode.py."""

from __future__ import annotations

import io
import json
import socket
import time

import pandas as pd
import pytest

from conftest import BUCKET, load_script, parameterised_notebook
from helpers import pipeline, run_folder
from helpers.presets import PRESETS
from helpers.storage import OutputLocationError


def keys(s3, prefix: str) -> set[str]:
    return {o["Key"][len(prefix):] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])} - {""}


def put(s3, key: str, frame: pd.DataFrame) -> None:
    buffer = io.BytesIO()
    frame.to_parquet(buffer)
    s3.put_object(Bucket=BUCKET, Key=key, Body=buffer.getvalue())


def start(uri: str, model: str = "m", **kwargs):
    fns = pipeline.checked(lambda row: {"messages": []}, lambda row: {"label": ""}, {"x": 1})
    return run_folder.open_folder(uri, **kwargs).start(PRESETS["text-cpu-offline"].override(model_source=model), fns,
                                                        id_column="id", settings={})


def test_an_interrupted_run_in_a_bucket_resumes_and_a_changed_one_changes_nothing(s3):
    uri = f"s3://{BUCKET}/runs/text"
    first = start(uri)
    first.path("summary.json").write_text("{}")
    first.lock.release()
    put(s3, "runs/text/parts/a.parquet", pd.DataFrame({"id": ["1", "2"]}))
    put(s3, "runs/text/checkpoint/a.parquet", pd.DataFrame({"id": ["1", "2"]}))
    put(s3, "runs/text/checkpoint/b.pending.parquet", pd.DataFrame({"id": ["3"]}))  # a write killed before its commit
    resumed = start(uri)
    assert resumed.resuming and resumed.rows_done == 2 and "parts/a.parquet" in keys(s3, "runs/text/")
    resumed.path("label_counts.png").write_bytes(b"png")
    assert resumed.publish() == f"results in {uri}: label_counts.png" and "label_counts.png" in keys(s3, "runs/text/")
    resumed.lock.release()
    before = keys(s3, "runs/text/")
    with pytest.raises(run_folder.InterruptedRunError, match="model: 'm' -> 'other'"):
        start(uri, model="other")
    assert keys(s3, "runs/text/") == before  # nothing changed in the bucket
    fresh = start(uri, model="other", start_over=True)
    assert not any(k.startswith(("parts/", "checkpoint/")) or k in ("summary.json", "label_counts.png")
                   for k in keys(s3, "runs/text/"))
    kept = {k.split("/", 1)[1] for k in keys(s3, "runs/text/earlier/") if "/" in k}
    assert {"parts/a.parquet", "checkpoint/a.parquet", "label_counts.png", "run.json"} <= kept
    fresh.lock.release()
    s3.put_object(Bucket=BUCKET, Key="runs/training/model.ckpt", Body=b"weights")
    with pytest.raises(run_folder.NotTheKitsFolderError, match="model.ckpt"):
        run_folder.open_folder(f"s3://{BUCKET}/runs/training")
    assert keys(s3, "runs/training/") == {"model.ckpt"}


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_bucket_that_cannot_be_used_fails_in_seconds_with_one_message_naming_it(s3, monkeypatch):
    def refused(uri: str, match: str) -> str:
        started = time.monotonic()
        with pytest.raises(Exception, match=match) as caught:
            run_folder.open_folder(uri)
        assert time.monotonic() - started < 20 and f"OUTPUT_DIR={uri!r}" in str(caught.value)
        return str(caught.value)

    refused("s3://no-such-bucket/run", "the bucket 'no-such-bucket' does not exist")
    with monkeypatch.context() as m:
        m.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{closed_port()}")  # nothing answers there
        refused(f"s3://{BUCKET}/unreachable", "cannot be used: .*Could not connect")
    import moto.settings

    with monkeypatch.context() as m:  # moto checks credentials: the test's key is no IAM user's
        m.setattr(moto.settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)
        assert "kit-test-secret" not in refused(f"s3://{BUCKET}/denied", "cannot be used: .*ACCESS_DENIED")
    assert keys(s3, "unreachable/") == set() and keys(s3, "denied/") == set()  # nothing half-written
    assert OutputLocationError


def test_the_runner_writes_the_report_to_the_bucket_and_the_next_run_moves_it_aside(s3, tmp_path, monkeypatch):
    import nbformat

    runner = load_script("run_notebooks")
    tiny = parameterised_notebook(
        tmp_path / "tiny.ipynb", "OUTPUT_DIR = None",
        "from helpers import pipeline, run_folder\nfrom helpers.presets import PRESETS\n"
        "fns = pipeline.checked(lambda r: {'messages': []}, lambda r: {'label': ''}, {'x': 1})\n"
        "run = run_folder.open_folder(OUTPUT_DIR).start(PRESETS['text-cpu-offline'], fns, id_column=None, settings={})\n"
        "run.path('summary.json').write_text('{\"rows read\": 0}')\nprint(run.publish())\nrun.lock.release()")
    monkeypatch.setitem(runner.NOTEBOOKS, "tiny", tiny)
    monkeypatch.setattr(runner, "render_report", lambda executed, html: html.write_text("<html></html>") or True)
    assert runner.run("tiny", f"s3://{BUCKET}/reports", {}, cwd=tmp_path) == f"s3://{BUCKET}/reports/tiny"
    assert {"tiny.ipynb", "tiny.html", "summary.json", "run.json", ".llm-batch-kit"} <= keys(s3, "reports/tiny/")
    record = json.loads(s3.get_object(Bucket=BUCKET, Key="reports/tiny/run.json")["Body"].read())
    assert record["files"] == ["summary.json", "tiny.ipynb", "tiny.html"]  # the reports are the run's files
    executed = nbformat.reads(s3.get_object(Bucket=BUCKET, Key="reports/tiny/tiny.ipynb")["Body"].read().decode(), 4)
    assert f"results in s3://{BUCKET}/reports/tiny: summary.json" in executed.cells[-1].outputs[0].text
    assert not (tmp_path / "s3:").exists()
    first = {k: s3.get_object(Bucket=BUCKET, Key=f"reports/tiny/{k}")["Body"].read() for k in ("tiny.ipynb", "tiny.html")}
    runner.run("tiny", f"s3://{BUCKET}/reports", {}, cwd=tmp_path)
    (moved,) = {k.split("/")[0] for k in keys(s3, "reports/tiny/earlier/")}
    assert {k: s3.get_object(Bucket=BUCKET, Key=f"reports/tiny/earlier/{moved}/{k}")["Body"].read() for k in first} == first


@pytest.mark.slow
def test_webdataset_shards_in_a_bucket_are_read_and_prepared_by_rays_workers(s3, local_ray):
    """BLIP3o's layout in a bucket (keys restart in every shard, broken images, a sample with no image),
    read as the captioning notebook reads it, by Ray's workers with the bucket's filesystem: each
    sample once, keyed on shard + key, each broken one with its reason."""
    from conftest import blip_samples, blip_shard_bytes
    from helpers import images

    for shard, data in blip_shard_bytes().items():
        s3.put_object(Bucket=BUCKET, Key=f"blip3o/data/{shard}", Body=data)
    source = images.image_input(f"s3://{BUCKET}/blip3o/", "auto", "jpg", None)
    # The size: estimated from the first shard's first 8 MiB (here the whole shard) and both shards' sizes.
    assert source.format == "webdataset" and abs(source.rows - len(blip_samples())) <= 2, source
    ds = images.read(source, num_blocks=4, num_cpus=0.5)
    ds = ds.map_batches(images.prepare_batch, batch_format="pandas", fn_kwargs={"max_tokens": 64})
    rows = ds.select_columns([images.SAMPLE_ID, "reject_reason"]).take_all()
    shards = blip_samples()
    assert sorted(r[images.SAMPLE_ID] for r in rows) == sorted(shards)
    rejected = {shards[r[images.SAMPLE_ID]]: r["reject_reason"] for r in rows if r["reject_reason"]}
    assert set(rejected) == {n for n in shards.values() if n.startswith("broken_")} | {"no image field"}
    assert rejected["no image field"] == "no 'jpg' value in this row" and rejected["broken_truncated_png"] == "truncated file"
