"""How big the whole input is (helpers.sizing), and what it would take (run_stats.projection)."""

import pandas as pd
import pytest

from helpers import run_stats, sample_images, sizing
from helpers.pipeline import RunResult
from helpers.run_stats import Throughput


def companies(n: int) -> pd.DataFrame:
    return pd.DataFrame({"Customer Id": [f"id{i:07d}" for i in range(n)],
                         "Company": [f"Company number {i}, \"quoted\"\nand two lines" if i % 7 == 0 else f"Co {i}"
                                     for i in range(n)]})


def test_a_small_csv_is_counted_and_a_big_one_estimated_within_a_few_percent(tmp_path):
    companies(500).to_csv(tmp_path / "small.csv", index=False)
    assert sizing.input_size(str(tmp_path / "small.csv"), "csv") == sizing.InputSize(500, "counted: 500 rows in the one file")
    folder = tmp_path / "big"
    folder.mkdir()
    for part in range(3):
        companies(60_000).to_csv(folder / f"part{part}.csv", index=False)  # ~1.5 MB each: read in part
    size = sizing.input_size(str(folder), "csv")
    assert abs(size.rows - 180_000) / 180_000 < 0.05, size
    assert size.basis.startswith("estimated:") and "of the first of 3 files" in size.basis


def test_parquet_is_counted_from_footers_and_images_by_files(tmp_path):
    for part in range(3):
        companies(1000 + part).to_parquet(tmp_path / f"p{part}.parquet")
    assert sizing.input_size(str(tmp_path), "parquet").rows == 3003
    images = tmp_path / "images"
    images.mkdir()
    for name in ("a.jpg", "b.png", "notes.txt"):
        (images / name).write_bytes(b"x")
    assert sizing.input_size(str(images), "images") == sizing.InputSize(3, "counted: 3 files")


def test_webdataset_samples_are_estimated_from_the_first_shard(tmp_path, monkeypatch):
    files = sample_images.sample_files()  # 24 samples, each a key with one image member
    one = sample_images.write_webdataset(files, tmp_path / "one" / "shard-000.tar")
    assert sizing.input_size(str(one), "webdataset").rows == len(files)
    for i in range(4):
        sample_images.write_webdataset(files, tmp_path / "four" / f"shard-{i:03d}.tar")
    monkeypatch.setattr(sizing, "TAR_SAMPLE_BYTES", one.stat().st_size // 2)  # read half a shard
    size = sizing.input_size(str(tmp_path / "four"), "webdataset")
    assert abs(size.rows - 4 * len(files)) <= 0.35 * 4 * len(files), size  # image sizes vary a lot
    assert "estimated" in size.basis


@pytest.mark.parametrize("name, content, why", [
    ("rows.csv.gz", b"\x1f\x8b", "compressed"),
    ("empty.csv", b"", "no rows"),
])
def test_what_cannot_be_sized_says_why_and_never_raises(tmp_path, name, content, why):
    (tmp_path / name).write_bytes(content)
    (tmp_path / "second.csv").write_bytes(b"a\n1\n")  # several files: an estimate is needed
    size = sizing.input_size(str(tmp_path), "csv")
    assert size.rows is None and why in size.basis
    assert sizing.input_size(str(tmp_path / "missing"), "csv").basis.startswith("could not be sized (FileNotFoundError")
    assert sizing.input_size("https://example.com/x.csv", "csv").rows is None


def run(steady: float, basis: str = "fitted over 9 result files"):
    return RunResult(root=".", answered=pd.DataFrame(), errors=pd.DataFrame(), rows_entered_now=100,
                     rows_written_now=100, rows_written_before=0,
                     throughput=Throughput(rows=100, seconds=50, steady=steady, steady_basis=basis))


def test_projection_from_the_steady_rate_or_why_not():
    whole = sizing.InputSize(2_000_000, "counted: the footers of 4 parquet files")
    p = run_stats.projection(run(steady=500.0), whole, gpus=4)
    assert p["whole input, projected hours"] == round(2_000_000 / 500 / 3600, 2)
    assert p["whole input, projected GPU-hours"] == round(4 * 2_000_000 / 500 / 3600, 2)
    assert p["whole input, size from"] == whole.basis and "500.00 rows/s" in p["whole input, projected from"]
    assert run_stats.projection(run(500.0), whole, gpus=0)["whole input, projected GPU-hours"] == "none: a CPU run"
    unmeasured = run_stats.projection(run(float("nan"), "too few result files (2)"), whole, gpus=1)
    assert unmeasured["whole input, projected hours"] == "not projected: no steady rate (too few result files (2))"
    unknown = run_stats.projection(run(500.0), sizing.InputSize(None, "compressed files"), gpus=1)
    assert unknown["whole input, projected hours"] == "not projected: the input's size is unknown"
    table = run_stats.throughput_table(run(500.0), whole, gpus=4)
    assert table["whole input, rows"] == 2_000_000 and "whole input, projected GPU-hours" in table
