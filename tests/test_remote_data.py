"""Remote data, read as users read it: a real S3-protocol server and an HTTP server on 127.0.0.1.

moto's standalone server speaks the S3 protocol; the notebooks reach it the way a MinIO or
on-premises user reaches theirs: ``AWS_ENDPOINT_URL`` plus the usual credential variables (see
``helpers.storage``). The notebook kernels and Ray's workers inherit them from this process.
"""

from __future__ import annotations

import functools
import http.server
import io
import json
import os
import tarfile
import threading

import pandas as pd
import pytest

from conftest import load_script
from helpers import image_data, sample_images, storage

from conftest import BUCKET


@pytest.fixture(scope="module")
def runner():
    return load_script("run_notebooks")


def _tar(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, payload in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    return buffer.getvalue()


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
    s3.put_object(Bucket=BUCKET, Key="layouts/wds/shard-000000.tar", Body=_tar({"a.jpg": b"1"}))
    s3.put_object(Bucket=BUCKET, Key="layouts/wds/shard-000001.tar", Body=_tar({"a.jpg": b"1"}))
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
def test_captioning_notebook_on_webdataset_shards_in_s3(s3, runner, tmp_path):
    # BLIP3o's layout: .tar shards of <key>.jpg + <key>.txt, keys restarting in every shard. The
    # kit's corpus of awkward and broken files, split over two shards, plus a sample with no image.
    corpus = list(sample_images.sample_files().items())
    half = len(corpus) // 2
    expected = {}
    for shard, part in (("shard-000000.tar", corpus[:half]), ("shard-000001.tar", corpus[half:])):
        members = {}
        for i, (name, data) in enumerate(part):
            members.update({f"{i:06d}.jpg": data, f"{i:06d}.txt": b"a caption"})
            expected[f"{shard}/{i:06d}"] = name
        if shard.endswith("1.tar"):
            members[f"{len(part):06d}.txt"] = b"a caption whose image is missing"
            expected[f"{shard}/{len(part):06d}"] = "no image field"
        s3.put_object(Bucket=BUCKET, Key=f"blip3o-shards/{shard}", Body=_tar(members))

    out = runner.run("vlm_captioning", tmp_path / "results", {
        "INPUT_PATH": f"s3://{BUCKET}/blip3o-shards/", "IMAGE_TOKENS": 16, "MAX_TOKENS": 8, "RESUME": False})
    summary = json.loads((out / "summary.json").read_text())
    assert summary["images read"] == len(expected) and summary["all images accounted for"]
    captions = pd.read_parquet(out / "captions.parquet")
    errors = pd.read_parquet(out / "errors.parquet")
    ids = pd.concat([captions[image_data.SAMPLE_ID], errors[image_data.SAMPLE_ID]])
    assert ids.is_unique and set(ids) == set(expected)  # every sample once, none merged across shards
    rejected = {expected[i]: r for i, r in zip(errors[image_data.SAMPLE_ID], errors["reason"])}
    assert set(rejected) == {n for n in expected.values() if n.startswith("broken_")} | {"no image field"}
    assert rejected["no image field"] == f"no {image_data.ANY_IMAGE!r} value in this row"
    assert rejected["broken_truncated_png"] == "truncated file"
    assert all(rejected.values())  # each with a reason
    assert "horse_corrupt_exif" in {expected[i] for i in captions[image_data.SAMPLE_ID]}


@pytest.fixture
def http_folder(tmp_path):
    """A plain HTTP server on 127.0.0.1 serving ``tmp_path / "www"``."""
    root = tmp_path / "www"
    root.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield root, f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


@pytest.mark.slow
def test_text_notebook_reads_a_csv_from_s3_and_over_http(s3, runner, tmp_path, http_folder):
    frame = pd.DataFrame({"Customer Id": [f"c{i}" for i in range(8)],
                          "Company": ["Walmart", "Pfizer", "", "Goldman Sachs", "Kirkland & Ellis", "Zillow",
                                      "Siemens", "Accenture"]})
    s3.put_object(Bucket=BUCKET, Key="customers/part-0.csv", Body=frame.to_csv(index=False).encode())
    root, url = http_folder
    frame.to_csv(root / "customers.csv", index=False)
    # A presigned URL, as a bucket hands out: its signature must never be written or printed.
    secret = "0f1e2d3c4b5a-kit-signature"
    presigned = f"{url}/customers.csv?X-Amz-Credential=AKIAKIT%2F2026&X-Amz-Signature={secret}"
    for name, path in (("s3", f"s3://{BUCKET}/customers/"), ("http", presigned)):
        out = runner.run("text_classification", tmp_path / name, {
            "INPUT_PATH": path, "LABEL_COLUMN": None, "RESUME": False})
        for written in out.iterdir():
            if written.suffix in (".json", ".ipynb", ".html"):
                assert secret not in written.read_text() and "AKIAKIT" not in written.read_text(), written
        summary = json.loads((out / "summary.json").read_text())
        assert summary["rows read"] == 8 and summary["classified"] == 7, name
        assert summary["rejected before the model"] == 1 and summary["all rows accounted for"], name
        predictions = pd.read_parquet(out / "predictions.parquet")
        assert sorted(predictions["Customer Id"]) == ["c0", "c1", "c3", "c4", "c5", "c6", "c7"], name
