"""Paths and folders on a disk and in a bucket: a real S3-protocol server on 127.0.0.1 (moto), reached
as a MinIO user reaches theirs, through ``AWS_ENDPOINT_URL``."""

from __future__ import annotations

import multiprocessing
import time

import pandas as pd
import pytest

from conftest import BUCKET, tar_bytes
from helpers import images, storage
from helpers.storage import Location, OutputLocationError


def keys(s3, prefix: str) -> set[str]:
    return {o["Key"][len(prefix):] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])}


def test_filesystem_only_for_s3_with_an_endpoint(monkeypatch):
    monkeypatch.delenv(storage.ENDPOINT_VARIABLE, raising=False)
    assert storage.filesystem("s3://bucket/x") is None  # Ray's own choice: AWS
    monkeypatch.setenv(storage.ENDPOINT_VARIABLE, "http://127.0.0.1:9000")
    assert storage.filesystem("/local/x") is None and storage.filesystem("gs://b/x") is None
    assert storage.filesystem("s3://bucket/x").type_name == "s3"
    assert storage.is_remote("s3://b/x") and storage.is_remote("https://h/x.csv")
    assert not storage.is_remote("file:///tmp/x") and not storage.is_remote("relative/x.csv")


def test_secrets_in_paths_are_redacted():
    assert storage.redact("s3://AKIAKIT:s3cr3t@bucket/data/") == "s3://***@bucket/data/"
    presigned = ("https://bucket.s3.amazonaws.com/x.csv?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIA%2F2026"
                 "&X-Amz-Date=20261123T000000Z&X-Amz-Expires=3600&X-Amz-Signature=0f1e2d&X-Amz-Security-Token=tok")
    redacted = storage.redact(presigned)
    assert "AKIA" not in redacted and "0f1e2d" not in redacted and "tok" not in redacted.split("Token=")[1]
    assert "X-Amz-Date=20261123T000000Z" in redacted
    assert storage.redact("https://h/a?sv=2024&sig=abc%3D") == "https://h/a?sv=2024&sig=***"  # Azure SAS
    for plain in ("/data/x.csv", "https://h/x.csv?raw=true", "s3://bucket/x", "relative/x.csv"):
        assert storage.redact(plain) == plain
    assert storage.redact_all({"input": "s3://k:s@b/x", "n": 3, "l": ["s3://k:s@b/y"]}) == {
        "input": "s3://***@b/x", "n": 3, "l": ["s3://***@b/y"]}


def test_remote_layouts_are_listed_not_guessed(s3):
    # A folder of .tar shards in a bucket was once read as two broken images.
    s3.put_object(Bucket=BUCKET, Key="layouts/wds/shard-000000.tar", Body=tar_bytes({"a.jpg": b"1"}))
    s3.put_object(Bucket=BUCKET, Key="layouts/wds/shard-000001.tar", Body=tar_bytes({"a.jpg": b"1"}))
    s3.put_object(Bucket=BUCKET, Key="layouts/pq/train-0.parquet", Body=b"PAR1")
    s3.put_object(Bucket=BUCKET, Key="layouts/img/a.png", Body=b"1")
    fs = storage.filesystem(f"s3://{BUCKET}/")
    assert storage.list_files(f"s3://{BUCKET}/layouts/wds/", fs) == [
        f"s3://{BUCKET}/layouts/wds/shard-000000.tar", f"s3://{BUCKET}/layouts/wds/shard-000001.tar"]
    assert images.detect_format(storage.list_files(f"s3://{BUCKET}/layouts/wds/", fs)) == "webdataset"
    assert images.detect_format(storage.list_files(f"s3://{BUCKET}/layouts/pq", fs)) == "parquet"
    assert images.detect_format(storage.list_files(f"s3://{BUCKET}/layouts/img/", fs)) == "images"
    with pytest.raises(FileNotFoundError):
        storage.list_files(f"s3://{BUCKET}/layouts/nothing/", fs)


def test_a_location_in_a_bucket_reads_writes_lists_moves_and_removes(s3):
    folder = Location.of(f"s3://{BUCKET}/loc/")
    assert folder.remote and folder.uri == f"s3://{BUCKET}/loc" and str(folder) == folder.uri
    part = folder / "a" / "x.parquet"
    with part.fs.open_output_stream(part.path) as f:
        f.write(pd.DataFrame({"id": [1, 2]}).to_parquet())
    (folder / "b.txt").write_text("hello")
    assert (folder / "b.txt").read_text() == "hello" and (folder / "b.txt").is_file()
    assert folder.children() == ["a", "b.txt"]
    [(found, modified)] = folder.files()
    assert found == part and found.parquet_rows() == 2 and abs(modified - time.time()) < 120
    (folder / "a").move_to(folder / "earlier" / "a")
    assert keys(s3, "loc/") - {""} == {"earlier/a/x.parquet", "b.txt"}  # "": a folder marker pyarrow leaves
    folder.fs.delete_dir(folder.path)
    assert not folder.exists() and keys(s3, "loc/") - {""} == set()
    with pytest.raises(OutputLocationError, match="web address"):
        Location.of("https://example.com/results")


def test_a_bucket_that_cannot_be_used_fails_in_seconds_naming_it(s3):
    started = time.monotonic()
    with pytest.raises(OutputLocationError, match="the bucket 'no-such-bucket' does not exist"):
        storage.check_reachable(Location.of("s3://no-such-bucket/run"))
    assert time.monotonic() - started < 30


def _create(path: str, text: str, results) -> None:
    results.put((text, Location.of(path).create(text)))


@pytest.mark.parametrize("where", ["disk", "bucket"])
def test_of_many_writers_that_create_a_file_at_once_exactly_one_wins(where, s3, tmp_path):
    """What the run lock stands on: an exclusive create on a disk, a conditional write in S3."""
    path = str(tmp_path / "lock") if where == "disk" else f"s3://{BUCKET}/race/{time.time_ns()}/lock"
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    writers = [context.Process(target=_create, args=(path, f"writer {i}", results)) for i in range(6)]
    for w in writers:
        w.start()
    for w in writers:
        w.join(60)
    said = dict(results.get(timeout=10) for _ in writers)
    winners = [text for text, won in said.items() if won]
    assert len(winners) == 1 and Location.of(path).read_text() == winners[0]
    version = Location.of(path).version()
    assert Location.of(path).replace("taken over", version) and not Location.of(path).replace("again", version)
    assert Location.of(path).read_text() == "taken over"
