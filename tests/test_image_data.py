import io
import tarfile

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from helpers import image_data
from helpers.data import REJECT_REASON, ROW_ID


@pytest.fixture(scope="module")
def sample():
    return image_data.sample_files()


def jpeg(color=(200, 30, 30), size=(120, 80)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, "JPEG")
    return buffer.getvalue()


def test_sample_has_real_photos_awkward_variants_and_broken_files(sample):
    broken = sorted(k for k in sample if k.startswith("broken_"))
    assert broken == ["broken_bomb", "broken_empty", "broken_not_an_image", "broken_truncated"]
    assert {"astronaut", "coffee", "chelsea", "rocket", "coffee_cmyk", "chelsea_exif_rotated",
            "rocket_transparent_png", "camera_16bit_png", "animated_gif"} <= set(sample)
    assert len(sample) >= 20


def test_prepare_batch_keeps_every_row_and_gives_reasons(sample):
    batch = pd.DataFrame({ROW_ID: list(sample), image_data.SOURCE: list(sample), image_data.IMAGE_BYTES: list(sample.values())})
    out = image_data.prepare_batch(batch, max_tokens=16)
    assert len(out) == len(sample) and out[ROW_ID].tolist() == list(sample)
    rejected = out[out[REJECT_REASON] != ""]
    assert sorted(rejected[ROW_ID]) == sorted(k for k in sample if k.startswith("broken_"))
    ok = out[out[REJECT_REASON] == ""]
    assert all(img.ndim == 3 and img.shape[2] == 3 and img.dtype == np.uint8 for img in ok[image_data.IMAGE])
    assert (ok["vision_tokens"] <= 16).all() and (ok["width"] % 28 == 0).all()
    assert image_data.IMAGE_BYTES not in out.columns  # raw bytes never travel further


def test_write_webdataset_layout(tmp_path):
    path = image_data.write_webdataset({"a": b"123", "b": b"45"}, tmp_path / "s.tar", caption="x")
    with tarfile.open(path) as tar:
        assert tar.getnames() == ["a.jpg", "a.txt", "b.jpg", "b.txt"]


def test_detect_format(tmp_path):
    shard = image_data.write_webdataset({"a": b"1"}, tmp_path / "w" / "s.tar")
    assert image_data.detect_format(str(shard)) == "webdataset"
    assert image_data.detect_format(str(shard.parent)) == "webdataset"
    (tmp_path / "w" / ".complete.json").write_text("{}")  # hidden files don't count
    assert image_data.detect_format(str(shard.parent)) == "webdataset"
    (tmp_path / "p").mkdir()
    pd.DataFrame({"jpg": [b"1"]}).to_parquet(tmp_path / "p" / "x.parquet")
    assert image_data.detect_format(str(tmp_path / "p")) == "parquet"
    (tmp_path / "i").mkdir()
    (tmp_path / "i" / "a.png").write_bytes(b"1")
    assert image_data.detect_format(str(tmp_path / "i")) == "images"


def test_raw_bytes_from_hf_struct_plain_bytes_and_missing():
    assert image_data._raw_bytes({"bytes": b"ab", "path": None}) == b"ab"
    assert image_data._raw_bytes(b"cd") == b"cd"
    assert image_data._raw_bytes(None) == b"" and image_data._raw_bytes({"bytes": None}) == b""


@pytest.fixture(scope="module")
def local_ray():
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.mark.slow
def test_readers_for_all_three_layouts(local_ray, tmp_path):
    files = {"red": jpeg(), "blue": jpeg((0, 0, 200)), "bad": b"not an image"}
    shard = image_data.write_webdataset(files, tmp_path / "wds" / "shard-0.tar")
    (tmp_path / "pq").mkdir()
    pd.DataFrame({"key": list(files), "jpg": [{"bytes": b, "path": None} for b in files.values()]}).to_parquet(
        tmp_path / "pq" / "part-0.parquet")
    (tmp_path / "img").mkdir()
    for name, payload in files.items():
        (tmp_path / "img" / f"{name}.jpg").write_bytes(payload)

    for path, fmt, kwargs in [(str(shard), "webdataset", {}), (str(tmp_path / "pq"), "parquet", {"id_column": "key"}),
                              (str(tmp_path / "img"), "images", {})]:
        rows = image_data.read_images(path, fmt, **kwargs).take_all()
        assert len(rows) == 3, fmt
        assert sorted(len(r[image_data.IMAGE_BYTES]) for r in rows) == sorted(len(b) for b in files.values()), fmt
        assert len({r[ROW_ID] for r in rows}) == 3, fmt
    with pytest.raises(Exception, match="no 'png' column"):
        image_data.read_images(str(tmp_path / "pq"), "parquet", image_column="png").take_all()
    with pytest.raises(ValueError, match="INPUT_FORMAT must be one of"):
        image_data.read_images(str(shard), "zip")
