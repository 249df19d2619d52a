"""Remote data, read as users read it: a real S3-protocol server on 127.0.0.1.

moto's standalone server speaks the S3 protocol; the kit reaches it the way a MinIO or on-premises
user reaches theirs: ``AWS_ENDPOINT_URL`` plus the usual credential variables (see
``helpers.storage``). Webdataset shards in S3 are read here by Ray's workers. The notebooks' own
runs on remote data are elsewhere: a CSV in S3 (the id check's run in tests/test_notebook_runs.py),
a CSV behind a presigned URL over HTTP (tests/test_autoscaler.py, as a Ray job), a CSV and
webdataset shards on the Hub (tests/test_live_kernel.py).
"""

from __future__ import annotations

import pytest

from conftest import BUCKET, tar_bytes
from helpers import image_data, storage


def test_filesystem_only_for_s3_with_an_endpoint(monkeypatch):
    monkeypatch.delenv(storage.ENDPOINT_VARIABLE, raising=False)
    assert storage.filesystem("s3://bucket/x") is None  # Ray's own choice: AWS
    monkeypatch.setenv(storage.ENDPOINT_VARIABLE, "http://127.0.0.1:9000")
    assert storage.filesystem("/local/x") is None and storage.filesystem("gs://b/x") is None
    fs = storage.filesystem("s3://bucket/x")
    assert fs is not None and fs.type_name == "s3"
    assert storage.is_remote("s3://b/x") and storage.is_remote("https://h/x.csv")
    assert not storage.is_remote("file:///tmp/x") and not storage.is_remote("relative/x.csv")


def test_secrets_in_paths_are_redacted():
    assert storage.redact("s3://AKIAKIT:s3cr3t@bucket/data/") == "s3://***@bucket/data/"
    presigned = ("https://bucket.s3.amazonaws.com/x.csv?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIA%2F2026"
                 "&X-Amz-Date=20261123T000000Z&X-Amz-Expires=3600&X-Amz-Signature=0f1e2d&X-Amz-Security-Token=tok")
    redacted = storage.redact(presigned)
    assert "AKIA" not in redacted and "0f1e2d" not in redacted and "tok" not in redacted.split("Token=")[1]
    assert "X-Amz-Date=20261123T000000Z" in redacted and redacted.startswith("https://bucket.s3.amazonaws.com/x.csv?")
    assert storage.redact("https://h/a?sv=2024&sig=abc%3D") == "https://h/a?sv=2024&sig=***"  # Azure SAS
    for plain in ("/data/x.csv", "https://h/x.csv?raw=true", "s3://bucket/x", "relative/x.csv"):
        assert storage.redact(plain) == plain
    assert storage.redact_all({"input": "s3://k:s@b/x", "n": 3, "l": ["s3://k:s@b/y"]}) == {
        "input": "s3://***@b/x", "n": 3, "l": ["s3://***@b/y"]}


def test_remote_layouts_are_listed_not_guessed(s3):
    # The bug this guards: every remote folder was called "images", so a folder of .tar shards was
    # read as two broken images and the summary still said every image was accounted for.
    s3.put_object(Bucket=BUCKET, Key="layouts/wds/shard-000000.tar", Body=tar_bytes({"a.jpg": b"1"}))
    s3.put_object(Bucket=BUCKET, Key="layouts/wds/shard-000001.tar", Body=tar_bytes({"a.jpg": b"1"}))
    s3.put_object(Bucket=BUCKET, Key="layouts/pq/train-0.parquet", Body=b"PAR1")
    s3.put_object(Bucket=BUCKET, Key="layouts/img/a.png", Body=b"1")
    s3.put_object(Bucket=BUCKET, Key="layouts/img/b.jpg", Body=b"1")
    fs = storage.filesystem(f"s3://{BUCKET}/")
    assert storage.list_files(f"s3://{BUCKET}/layouts/wds/", fs) == [
        f"s3://{BUCKET}/layouts/wds/shard-000000.tar", f"s3://{BUCKET}/layouts/wds/shard-000001.tar"]
    assert image_data.detect_format(f"s3://{BUCKET}/layouts/wds/", fs) == "webdataset"
    assert image_data.detect_format(f"s3://{BUCKET}/layouts/wds/shard-000001.tar", fs) == "webdataset"
    assert image_data.detect_format(f"s3://{BUCKET}/layouts/pq", fs) == "parquet"
    assert image_data.detect_format(f"s3://{BUCKET}/layouts/img/", fs) == "images"
    with pytest.raises(FileNotFoundError):
        image_data.detect_format(f"s3://{BUCKET}/layouts/nothing/", fs)


@pytest.mark.slow
def test_webdataset_shards_in_a_bucket_are_read_and_prepared_by_rays_workers(s3):
    """BLIP3o's layout in a bucket (``conftest.blip_shards``: keys restart in every shard, broken images,
    a sample with no image), read and prepared as the captioning notebook does, by Ray's workers with
    the bucket's filesystem: each sample once, keyed on shard + key, each broken one with its reason.
    (The notebook itself runs on the same shards from the Hub, in tests/test_live_kernel.py.)"""
    import ray

    from conftest import blip_samples, blip_shard_bytes
    from helpers.inputs import resolve

    for shard, data in blip_shard_bytes().items():
        s3.put_object(Bucket=BUCKET, Key=f"blip3o/data/{shard}", Body=data)
    problems: list[str] = []
    path, fs = resolve(f"s3://{BUCKET}/blip3o/", problems)
    assert not problems and image_data.detect_format(path, fs) == "webdataset"
    ray.init(address="local", num_cpus=2, log_to_driver=False)
    try:
        ds = image_data.read_images(path, "webdataset", filesystem=fs, num_blocks=4)
        ds = ds.map_batches(image_data.prepare_batch, batch_format="pandas", fn_kwargs={"max_tokens": 64})
        rows = ds.select_columns([image_data.SAMPLE_ID, image_data.REJECT_REASON]).take_all()
    finally:
        ray.shutdown()
    shards = blip_samples()
    assert sorted(r[image_data.SAMPLE_ID] for r in rows) == sorted(shards)
    rejected = {shards[r[image_data.SAMPLE_ID]]: r[image_data.REJECT_REASON] for r in rows if r[image_data.REJECT_REASON]}
    assert set(rejected) == {n for n in shards.values() if n.startswith("broken_")} | {"no image field"}
    assert rejected["no image field"] == f"no {image_data.ANY_IMAGE!r} value in this row"
    assert rejected["broken_truncated_png"] == "truncated file"


def test_a_csv_behind_a_url_has_its_encoding_and_columns_checked_before_anything_runs(http_folder, tmp_path):
    """A presigned URL's CSV was read without a look: a Windows spreadsheet's file then failed in
    Ray's read ("Failed to read CSV file"), and a missing column only after Ray's start."""
    import pandas as pd

    from helpers import inputs

    www, url = http_folder
    pd.DataFrame({"name": ["Nestlé", "Société Générale"]}).to_csv(www / "firms.csv", index=False, encoding="cp1252")
    presigned = f"{url}/firms.csv?X-Amz-Credential=AKIAKIT%2F2026&X-Amz-Signature=0f1e2d"
    base = {"INPUT_PATH": presigned, "TEXT_COLUMN": "name", "ID_COLUMN": None, "LABEL_COLUMN": None,
            "OUTPUT_DIR": str(tmp_path / "out")}
    parameters = {**_text_defaults(), **base}
    assert inputs.check_text(parameters).encoding == "cp1252"
    with pytest.raises(ValueError) as err:
        inputs.check_text({**parameters, "TEXT_COLUMN": "Company"})
    assert "TEXT_COLUMN='Company' is not a column of" in str(err.value) and "'name'" in str(err.value)
    assert "0f1e2d" not in str(err.value) and "AKIAKIT" not in str(err.value)
    with pytest.raises(ValueError) as err:
        inputs.check_text({**parameters, "INPUT_PATH": f"{url}/missing.csv?X-Amz-Signature=0f1e2d"})
    assert "cannot be read: HTTP Error 404" in str(err.value) and "0f1e2d" not in str(err.value)


def _text_defaults() -> dict:
    """The text notebook's parameters as committed."""
    from conftest import load_script

    return load_script("run_notebooks").defaults("text_classification")
