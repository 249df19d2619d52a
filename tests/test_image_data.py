import io
import tarfile

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from helpers import hf_images, image_data, sample_images
from helpers.data import REJECT_REASON, ROW_ID


@pytest.fixture(scope="module")
def sample():
    return sample_images.sample_files()


def jpeg(color=(200, 30, 30), size=(120, 80)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, "JPEG")
    return buffer.getvalue()


def test_sample_has_real_photos_awkward_variants_and_broken_files(sample):
    broken = sorted(k for k in sample if k.startswith("broken_"))
    assert broken == ["broken_bomb", "broken_empty", "broken_not_an_image", "broken_truncated",
                      "broken_truncated_png", "broken_truncated_webp"]
    assert {"astronaut", "coffee", "chelsea", "rocket", "coffee_cmyk", "chelsea_exif_rotated", "horse_corrupt_exif",
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
    path = sample_images.write_webdataset({"a": b"123", "b": b"45"}, tmp_path / "s.tar", caption="x")
    with tarfile.open(path) as tar:
        assert tar.getnames() == ["a.jpg", "a.txt", "b.jpg", "b.txt"]


def test_detect_format(tmp_path):
    shard = sample_images.write_webdataset({"a": b"1"}, tmp_path / "w" / "s.tar")
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
    assert image_data.detect_format("file://" + str(tmp_path / "p")) == "parquet"
    (tmp_path / "i" / "b.tar").write_bytes(b"1")
    with pytest.raises(ValueError, match="mixes .tar or .parquet files with others"):
        image_data.detect_format(str(tmp_path / "i"))
    with pytest.raises(FileNotFoundError):
        image_data.detect_format(str(tmp_path / "nothing-here"))


def test_image_value_from_hf_struct_plain_bytes_missing_and_wrong_types():
    assert image_data.image_value({"bytes": b"ab", "path": None}, "jpg") == (b"ab", "")
    assert image_data.image_value(b"cd", "jpg") == (b"cd", "")
    assert image_data.image_value(np.frombuffer(b"ef", np.uint8), "jpg") == (b"ef", "")
    for missing in (None, float("nan"), {"bytes": None}):
        assert image_data.image_value(missing, "jpg") == (b"", "no 'jpg' value in this row")
    assert image_data.image_value("a path?", "jpg") == (b"", "not image bytes (the 'jpg' value is a str)")
    assert image_data.image_value([1, 2], "jpg")[1].startswith("not image bytes")


def test_prepare_batch_keeps_reasons_the_reader_gave():
    batch = pd.DataFrame({ROW_ID: ["x"], image_data.IMAGE_BYTES: [jpeg()], REJECT_REASON: ["no 'jpg' value in this row"]})
    out = image_data.prepare_batch(batch, max_tokens=16)
    assert out[REJECT_REASON].tolist() == ["no 'jpg' value in this row"] and out[image_data.IMAGE].tolist() == [None]


def test_layout_check_fails_fast_naming_what_is_there():
    rows = [{"__key__": "1", "png": b"x", "txt": b"y", "jpg": None}, {"__key__": "2", "png": b"z"}]
    with pytest.raises(ValueError, match=r"none of the first 2 webdataset rows has a 'jpg' value; fields they have: \['png', 'txt'\]"):
        image_data.check_layout(rows, "jpg", "webdataset")
    image_data.check_layout([*rows, {"jpg": b"1"}], "jpg", "webdataset")  # one sample with it is enough


def test_image_field_alternatives_in_webdatasets_notation():
    assert image_data.image_fields(" jpg; png ;;webp") == ("jpg", "png", "webp")
    row = {"__key__": "k", "json": b"{}", "PNG": b"png-bytes", "jpg": None, "webp": b"w"}
    assert image_data._first_value(row, "jpg;png;webp") == (b"png-bytes", "PNG")  # case-insensitive, in order
    assert image_data._first_value(row, "gif") == (None, "")
    assert image_data._first_value({"image": {"bytes": None, "path": None}, "png": b"p"}, "image;png") == (b"p", "png")
    by_path = {"bytes": None, "path": "x.png"}  # datasets' local layout: the image is at the path
    assert image_data._first_value({"image": by_path, "png": b"p"}, "image;png") == (by_path, "image")
    batch = pd.DataFrame([{"jpg": b"j"}, {"png": b"p"}, {"json": b"{}"}, {"JPEG": b"J"}])
    assert image_data.image_values(batch, image_data.ANY_IMAGE) == [
        (b"j", ""), (b"p", ""), (b"", f"no {image_data.ANY_IMAGE!r} value in this row"), (b"J", "")]
    assert image_data.image_values(batch, "jpg")[1] == (b"", "no 'jpg' value in this row")
    with pytest.raises(ValueError, match="alternatives separated by ';'"):
        image_data.check_layout([{"txt": b"x"}], "jpg;png", "webdataset")
    image_data.check_layout([{"txt": b"x"}, {"Png": b"x"}], "jpg;png", "webdataset")


def test_sample_ids_name_the_shards_path_under_the_input():
    assert image_data.relative_shard("/data/wds/train/000000.tar", "/data/wds") == "train/000000.tar"
    assert image_data.relative_shard("/data/wds/train/000000.tar", "/data/wds/") == "train/000000.tar"
    assert image_data.relative_shard("bucket/blip3o/000001.tar", "s3://bucket/blip3o/") == "000001.tar"
    assert image_data.relative_shard("/data/wds/a.tar", "/data/wds/a.tar") == "a.tar"  # one shard given


@pytest.fixture(scope="module")
def local_ray():
    import ray

    from helpers import cluster

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    cluster.parquet_reads_without_footer_actors()  # as the notebooks' start_ray sets it
    yield
    ray.shutdown()


@pytest.mark.slow
def test_readers_for_all_three_layouts(local_ray, tmp_path):
    files = {"red": jpeg(), "blue": jpeg((0, 0, 200)), "bad": b"not an image"}
    shard = sample_images.write_webdataset(files, tmp_path / "wds" / "shard-0.tar")
    (tmp_path / "pq").mkdir()
    pd.DataFrame({"key": list(files), "jpg": [{"bytes": b, "path": None} for b in files.values()]}).to_parquet(
        tmp_path / "pq" / "part-0.parquet")
    (tmp_path / "img").mkdir()
    for name, payload in files.items():
        (tmp_path / "img" / f"{name}.jpg").write_bytes(payload)

    for path, fmt, kwargs in [(str(shard), "webdataset", {}), (str(tmp_path / "pq"), "parquet", {"id_column": "key"}),
                              (str(tmp_path / "img"), "images", {})]:
        ds = image_data.read_images(path, fmt, **kwargs)
        rows = ds.take_all()
        assert len(rows) == 3, fmt
        # Parquet through Ray Data's first reader: no ListFiles step, whose 32 footer actors took
        # 16-26 s of a notebook's read cell on 2 cores (helpers.cluster.parquet_reads_without_footer_actors).
        assert "ListFiles" not in logical_operators(ds), (fmt, logical_operators(ds))
        assert sorted(len(r[image_data.IMAGE_BYTES]) for r in rows) == sorted(len(b) for b in files.values()), fmt
        assert len({r[ROW_ID] for r in rows}) == 3, fmt
    with pytest.raises(ValueError, match="none of the first 3 parquet rows has a 'png' value; columns they have"):
        image_data.read_images(str(tmp_path / "pq"), "parquet", image_column="png")
    with pytest.raises(ValueError, match="INPUT_FORMAT must be one of"):
        image_data.read_images(str(shard), "zip")


def logical_operators(ds) -> list[str]:
    """The names of the operators in a dataset's logical plan, from its last to its read."""
    names, op = [], ds._logical_plan.dag
    while op is not None:
        names.append(type(op).__name__)
        op = op.input_dependencies[0] if op.input_dependencies else None
    return names


def _write_tar(path, members: dict[str, bytes]):
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w") as tar:
        for name, payload in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))


@pytest.mark.slow
def test_scraped_shards_mixing_extensions_and_folders_with_the_same_shard_names(local_ray, tmp_path):
    """Only the .jpg samples were captioned (the rest: "no 'jpg' value"), and train/000000.tar and
    val/000000.tar gave the same ids, so a resumed run would have skipped the second folder's images."""
    import PIL.Image

    def encoded(fmt):
        buffer = io.BytesIO()
        PIL.Image.new("RGB", (8, 8), (200, 10, 10)).save(buffer, fmt)
        return buffer.getvalue()

    for folder in ("train", "val"):
        _write_tar(tmp_path / "wds" / folder / "000000.tar", {
            "000000.jpg": jpeg(), "000000.json": b"{}", "000001.png": encoded("PNG"), "000001.json": b"{}",
            "000002.JPEG": encoded("JPEG"), "000003.webp": encoded("WEBP"), "000004.txt": b"no image"})
    rows = image_data.read_images(str(tmp_path / "wds"), "webdataset")
    rows = rows.map_batches(image_data.prepare_batch, batch_format="pandas", fn_kwargs={"max_tokens": 4}).take_all()
    by_id = {r[image_data.SAMPLE_ID]: r for r in rows}
    assert sorted(by_id) == sorted(f"{f}/000000.tar/00000{i}" for f in ("train", "val") for i in range(5))
    assert {by_id[f"val/000000.tar/00000{i}"][REJECT_REASON] for i in range(4)} == {""}
    assert by_id["train/000000.tar/000004"][REJECT_REASON] == f"no {image_data.ANY_IMAGE!r} value in this row"
    assert by_id["val/000000.tar/000001"][image_data.SOURCE] == "val/000000.tar:000001"


@pytest.mark.slow
def test_readers_keep_bad_rows_as_rejects_and_ids_unique(local_ray, tmp_path):
    # Two shards whose keys repeat (each starts at 000000), one sample without the image field.
    sample_images.write_webdataset({"000000": jpeg(), "000001": jpeg((0, 90, 0))}, tmp_path / "wds" / "a.tar")
    with tarfile.open(tmp_path / "wds" / "b.tar", "w") as tar:
        for name, payload in {"000000.jpg": jpeg((9, 9, 9)), "000001.txt": b"a caption, no image"}.items():
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    rows = image_data.read_images(str(tmp_path / "wds"), "webdataset", image_column="jpg").take_all()
    by_id = {r[image_data.SAMPLE_ID]: r for r in rows}
    assert sorted(by_id) == ["a.tar/000000", "a.tar/000001", "b.tar/000000", "b.tar/000001"]
    assert len({r[ROW_ID] for r in rows}) == 4
    assert by_id["b.tar/000001"][REJECT_REASON] == "no 'jpg' value in this row"
    assert [r[REJECT_REASON] for r in rows].count("") == 3
    # Parquet: a null and the same bytes twice in the image column; a file whose column holds strings.
    (tmp_path / "pq").mkdir()
    pd.DataFrame({"jpg": [jpeg(), None, jpeg()]}).to_parquet(tmp_path / "pq" / "x.parquet")
    pd.DataFrame({"jpg": ["https://example.com/a.jpg"]}).to_parquet(tmp_path / "pq" / "y.parquet")
    read = image_data.read_images(str(tmp_path / "pq"), "parquet", image_column="jpg")
    rows = read.map_batches(image_data.prepare_batch, batch_format="pandas", fn_kwargs={"max_tokens": 4}).take_all()
    assert len(rows) == 4 and len({r[ROW_ID] for r in rows}) == 4  # each row its file and position, not its bytes
    again = image_data.read_images(str(tmp_path / "pq"), "parquet", image_column="jpg", num_blocks=3).take_all()
    assert {r[ROW_ID] for r in again} == {r[ROW_ID] for r in rows}  # the same ids however the rows are split
    reasons = sorted(r[REJECT_REASON] for r in rows)
    # Ray unifies the two files' schemas (the strings may arrive as bytes): either way, a reason.
    assert reasons[:2] == ["", ""] and reasons[2:] in (["no 'jpg' value in this row", "not an image"],
                                                       ["no 'jpg' value in this row", "not image bytes (the 'jpg' value is a str)"])


def test_hugging_face_parquet_images_come_embedded_or_by_a_path_relative_to_the_parquet_file(tmp_path):
    """``{bytes, path}`` with the bytes embedded (the Hub), or bytes null and a path (``datasets``
    writing a local dataset): read from the path, relative to the parquet file; a path that cannot be
    read is that row's reason, naming it."""
    files = sample_images.sample_files()
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "moon.jpg").write_bytes(files["moon"])
    (tmp_path / "abs.jpg").write_bytes(files["coins"])
    batch = pd.DataFrame({
        "image": [{"bytes": files["astronaut"], "path": "astronaut.jpg"},
                  {"bytes": None, "path": "images/moon.jpg"},
                  {"bytes": None, "path": str(tmp_path / "abs.jpg")},
                  {"bytes": None, "path": "images/missing.jpg"},
                  {"bytes": None, "path": None}],
        "path": [str(tmp_path / "train-00000.parquet")] * 5,
        image_data.ROW_HASH: [11, 12, 13, 14, 15],  # as Ray's reader adds it without ID_COLUMN
    })
    out = image_data._from_parquet(batch, "image", None, root=str(tmp_path))
    assert out[ROW_ID].tolist() == [f"{h:016x}" for h in (11, 12, 13, 14, 15)]
    assert out[image_data.ROW_HASH].tolist() == [11, 12, 13, 14, 15]  # kept: resuming keys on it
    assert out[image_data.IMAGE_BYTES].tolist()[:3] == [files["astronaut"], files["moon"], files["coins"]]
    assert out[REJECT_REASON].tolist()[:3] == ["", "", ""]
    assert out[REJECT_REASON][3] == "the image file 'images/missing.jpg' this row names could not be read (FileNotFoundError)"
    assert out[REJECT_REASON][4] == "no 'image' value in this row"


@pytest.mark.slow
def test_a_datasets_dataset_gives_the_rows_that_reading_the_same_shards_gives(local_ray, tmp_path, monkeypatch):
    """Ray's captioning tutorial loads its shards with ``datasets``; ``from_datasets`` turns such a
    dataset, in memory or streaming, into the same rows, ids and rejects as ``read_images`` on the files
    (broken images too: ``datasets`` does not decode them, the kit does, later). Without asking the Hub:
    Ray's ``from_huggingface`` first calls ``load_dataset("webdataset")`` (a glob of the current folder,
    200 s in the kit's) or the Hub's API (``ConnectionError`` offline) for the same dataset's files."""
    import datasets
    import requests

    files = sample_images.sample_files()
    names = sorted(files)
    shards = tmp_path / "shards"
    for shard, chunk in enumerate((names[:12], names[12:])):  # keys repeat across shards, as in BLIP3o
        sample_images.write_webdataset({f"{i:06d}": files[n] for i, n in enumerate(chunk)},
                                    shards / f"shard-{shard:03d}.tar", caption="a caption")
    data_files = {"train": sorted(map(str, shards.glob("*.tar")))}
    loaded = datasets.load_dataset("webdataset", data_files=data_files, split="train", cache_dir=str(tmp_path / "cache"))
    streamed = datasets.load_dataset("webdataset", data_files=data_files, split="train", streaming=True)

    def no_hub(*args, **kwargs):
        raise AssertionError("from_datasets asked the Hub or loaded a dataset by name")

    monkeypatch.setattr(datasets, "load_dataset", no_hub)
    monkeypatch.setattr(requests, "get", no_hub)
    via_datasets = hf_images.from_datasets(loaded, root=str(shards)).take_all()
    via_stream = hf_images.from_datasets(streamed, root=str(shards)).take_all()
    via_files = image_data.read_images(str(shards), "webdataset").take_all()

    def rows(found):
        return sorted((r[ROW_ID], r[image_data.SOURCE], r[REJECT_REASON], r[image_data.IMAGE_BYTES]) for r in found)

    assert len(via_files) == 24 and rows(via_datasets) == rows(via_files) == rows(via_stream)
    assert {r[image_data.SAMPLE_ID] for r in via_datasets} == {r[image_data.SAMPLE_ID] for r in via_files}
    with pytest.raises(TypeError, match="one split"):
        hf_images.from_datasets(datasets.DatasetDict({"train": loaded}))


def test_a_datasets_dataset_without_ids_numbers_its_rows_identical_images_too(local_ray):
    """Rows of a ``datasets`` dataset with no id column (not webdataset): each row's number in the
    dataset, in memory or streaming, so the same image twice is two rows with two ids."""
    import datasets

    files = sample_images.sample_files()
    images = [files["astronaut"], files["moon"], files["astronaut"], files["broken_truncated"]]
    loaded = datasets.Dataset.from_dict({"image": [{"bytes": b, "path": None} for b in images],
                                         "caption": ["a", "b", "c", "d"]})
    for dataset in (loaded, loaded.to_iterable_dataset()):
        rows = sorted(hf_images.from_datasets(dataset).take_all(), key=lambda r: int(r[ROW_ID]))
        assert [r[ROW_ID] for r in rows] == ["0", "1", "2", "3"], type(dataset)
        assert [r[image_data.IMAGE_BYTES] for r in rows] == images
        assert [r[image_data.SOURCE] for r in rows] == ["row:0", "row:1", "row:2", "row:3"]
        assert hf_images.ROW_NUMBER not in rows[0]
