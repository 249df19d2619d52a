"""The captioning notebook's images: the sample, the three layouts as scraped data comes (mixed
extensions, repeated keys and shard names, nulls, strings, paths), each image prepared or rejected."""

import io
import json
import tarfile

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from helpers import images, models, storage
from helpers.pipeline import REJECT_REASON, ROW_ID
from helpers.parameters import ParameterError


def jpeg(color=(200, 30, 30), size=(120, 80)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, "JPEG")
    return buffer.getvalue()


def write_tar(path, members: dict[str, bytes]):
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w") as tar:
        for name, payload in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))


def write_webdataset(files: dict[str, bytes], path, caption: str | None = None):
    """``files`` as one shard: ``<key>.jpg``, and ``<key>.txt`` with ``caption``."""
    members = {}
    for key, payload in files.items():
        members.update({f"{key}.jpg": payload, **({f"{key}.txt": caption.encode()} if caption is not None else {})})
    write_tar(path, members)
    return path


@pytest.fixture(scope="module")
def sample():
    with tarfile.open(images.sample_path()) as tar:
        return {m.name.removesuffix(".jpg"): tar.extractfile(m).read() for m in tar}


def test_the_sample_has_real_photos_awkward_variants_and_broken_files(sample):
    assert sorted(k for k in sample if k.startswith("broken_")) == [
        "broken_bomb", "broken_empty", "broken_not_an_image", "broken_truncated", "broken_truncated_png",
        "broken_truncated_webp"]
    assert {"astronaut", "coffee_cmyk", "chelsea_exif_rotated", "horse_corrupt_exif", "rocket_transparent_png",
            "camera_16bit_png", "animated_gif"} <= set(sample) and len(sample) == 24


def test_prepare_batch_keeps_every_row_and_gives_reasons(sample):
    batch = pd.DataFrame({ROW_ID: list(sample), images.SOURCE: list(sample), images.IMAGE_BYTES: list(sample.values())})
    out = images.prepare_batch(batch, max_tokens=16)
    assert out[ROW_ID].tolist() == list(sample)
    assert sorted(out[out[REJECT_REASON] != ""][ROW_ID]) == sorted(k for k in sample if k.startswith("broken_"))
    ok = out[out[REJECT_REASON] == ""]
    assert all(img.ndim == 3 and img.shape[2] == 3 and img.dtype == np.uint8 for img in ok[images.IMAGE])
    assert (ok["vision_tokens"] <= 16).all() and (ok["width"] % 28 == 0).all()
    assert images.IMAGE_BYTES not in out.columns  # raw bytes never travel further
    given = pd.DataFrame({ROW_ID: ["x"], images.IMAGE_BYTES: [jpeg()], REJECT_REASON: ["no 'jpg' value in this row"]})
    assert images.prepare_batch(given, max_tokens=16)[REJECT_REASON].tolist() == ["no 'jpg' value in this row"]


def test_the_layout_is_told_from_the_file_names(tmp_path):
    shard = write_webdataset({"a": b"1"}, tmp_path / "w" / "s.tar")
    assert images.detect_format(storage.list_files(str(shard))) == images.detect_format(storage.list_files(str(shard.parent))) == "webdataset"
    (tmp_path / "w" / ".complete.json").write_text("{}")  # hidden files don't count
    assert images.detect_format(storage.list_files(str(shard.parent))) == "webdataset"
    (tmp_path / "p").mkdir()
    pd.DataFrame({"jpg": [b"1"]}).to_parquet(tmp_path / "p" / "x.parquet")
    assert images.detect_format(storage.list_files("file://" + str(tmp_path / "p"))) == "parquet"
    (tmp_path / "i").mkdir()
    (tmp_path / "i" / "a.png").write_bytes(b"1")
    assert images.detect_format(storage.list_files(str(tmp_path / "i"))) == "images"
    (tmp_path / "i" / "b.tar").write_bytes(b"1")
    with pytest.raises(ValueError, match="mixes .tar or .parquet files with others"):
        images.detect_format(storage.list_files(str(tmp_path / "i")))


def test_the_input_is_checked_counted_and_its_id_column_fits_the_layout(tmp_path):
    sample = images.image_input(None, "auto", images.KEPT[0] and "jpg", None)
    assert (sample.format, sample.rows, sample.source_id) == ("webdataset", 24, "sample_id")
    with pytest.raises(ParameterError, match="ID_COLUMN='key' applies to parquet input only; this input is webdataset"):
        images.image_input(None, "auto", "jpg", "key")
    (tmp_path / "pq").mkdir()
    pd.DataFrame({"key": ["a", "b"], "jpg": [jpeg(), jpeg()]}).to_parquet(tmp_path / "pq" / "x.parquet")
    parquet = images.image_input(str(tmp_path / "pq"), "auto", "jpg", "key")
    assert (parquet.rows, parquet.source_id, parquet.kept[-1]) == (2, "key", "key")
    assert images.image_input(str(tmp_path / "pq"), "auto", "jpg", None).source_id == "row_hash"
    with pytest.raises(ParameterError, match="ID_COLUMN='id' is not a column"):
        images.image_input(str(tmp_path / "pq"), "auto", "jpg", "id")
    big = {f"{i:06d}": jpeg() for i in range(400)}
    write_webdataset(big, tmp_path / "wds" / "a.tar")
    write_webdataset(big, tmp_path / "wds" / "b.tar")
    estimated = images.image_input(str(tmp_path / "wds"), "auto", "jpg", None)
    assert abs(estimated.rows - 800) <= 40 and estimated.rows_basis.startswith("estimated")


def test_image_values_from_hf_structs_plain_bytes_alternatives_missing_and_wrong_types():
    assert images.image_value({"bytes": b"ab", "path": None}, "jpg") == (b"ab", "")
    assert images.image_value(np.frombuffer(b"ef", np.uint8), "jpg") == (b"ef", "")
    for missing in (None, float("nan"), {"bytes": None}):
        assert images.image_value(missing, "jpg") == (b"", "no 'jpg' value in this row")
    assert images.image_value("a path?", "jpg") == (b"", "not image bytes (the 'jpg' value is a str)")
    batch = pd.DataFrame([{"jpg": b"j"}, {"png": b"p"}, {"json": b"{}"}, {"JPEG": b"J"}])
    spec = "jpg;jpeg;png"
    assert images.image_values(batch, spec) == [(b"j", ""), (b"p", ""), (b"", f"no {spec!r} value in this row"), (b"J", "")]


def test_sample_ids_name_the_shards_path_under_the_input():
    assert images.relative_shard("/data/wds/train/000000.tar", "/data/wds/") == "train/000000.tar"
    assert images.relative_shard("bucket/blip3o/000001.tar", "s3://bucket/blip3o/") == "000001.tar"
    assert images.relative_shard("/data/wds/a.tar", "/data/wds/a.tar") == "a.tar"  # one shard given


def read(path, fmt="auto", image_column="jpg;jpeg;png;webp", id_column=None, **kwargs):
    source = images.image_input(str(path), fmt, image_column, id_column)
    return images.read(source, num_blocks=kwargs.pop("num_blocks", 4), num_cpus=0.5, **kwargs)


@pytest.mark.slow
def test_readers_for_all_three_layouts_and_a_layout_wrong_as_a_whole(local_ray, tmp_path):
    files = {"red": jpeg(), "blue": jpeg((0, 0, 200)), "bad": b"not an image"}
    shard = write_webdataset(files, tmp_path / "wds" / "shard-0.tar")
    (tmp_path / "pq").mkdir()
    pd.DataFrame({"key": list(files), "jpg": [{"bytes": b, "path": None} for b in files.values()]}).to_parquet(
        tmp_path / "pq" / "part-0.parquet")
    (tmp_path / "img").mkdir()
    for name, payload in files.items():
        (tmp_path / "img" / f"{name}.jpg").write_bytes(payload)
    for path, id_column in [(shard, None), (tmp_path / "pq", "key"), (tmp_path / "img", None)]:
        rows = read(path, id_column=id_column).take_all()
        assert sorted(len(r[images.IMAGE_BYTES]) for r in rows) == sorted(len(b) for b in files.values())
        assert len({r[ROW_ID] for r in rows}) == 3
    with pytest.raises(ParameterError, match="none of the first 3 parquet rows has a 'png' value"):
        read(tmp_path / "pq", image_column="png")


@pytest.mark.slow
def test_scraped_shards_mixing_extensions_and_folders_with_the_same_shard_names(local_ray, tmp_path):
    """Only the .jpg samples were captioned, and train/000000.tar and val/000000.tar gave the same ids,
    so a resumed run would have skipped the second folder's images."""
    def encoded(fmt):
        buffer = io.BytesIO()
        Image.new("RGB", (8, 8), (200, 10, 10)).save(buffer, fmt)
        return buffer.getvalue()

    for folder in ("train", "val"):
        write_tar(tmp_path / "wds" / folder / "000000.tar", {
            "000000.jpg": jpeg(), "000000.json": b"{}", "000001.png": encoded("PNG"), "000001.json": b"{}",
            "000002.JPEG": encoded("JPEG"), "000003.webp": encoded("WEBP"), "000004.txt": b"no image"})
    rows = read(tmp_path / "wds", image_column="jpg;jpeg;png;webp").map_batches(
        images.prepare_batch, batch_format="pandas", fn_kwargs={"max_tokens": 4}).take_all()
    by_id = {r[images.SAMPLE_ID]: r for r in rows}
    assert sorted(by_id) == sorted(f"{f}/000000.tar/00000{i}" for f in ("train", "val") for i in range(5))
    assert {by_id[f"val/000000.tar/00000{i}"][REJECT_REASON] for i in range(4)} == {""}
    assert by_id["train/000000.tar/000004"][REJECT_REASON] == "no 'jpg;jpeg;png;webp' value in this row"
    assert by_id["val/000000.tar/000001"][images.SOURCE] == "val/000000.tar:000001"


@pytest.mark.slow
def test_parquet_rows_are_told_apart_by_file_and_position_and_bad_values_are_rejects(local_ray, tmp_path):
    (tmp_path / "pq").mkdir()
    pd.DataFrame({"jpg": [jpeg(), None, jpeg()]}).to_parquet(tmp_path / "pq" / "x.parquet")
    pd.DataFrame({"jpg": ["https://example.com/a.jpg"]}).to_parquet(tmp_path / "pq" / "y.parquet")
    rows = read(tmp_path / "pq", image_column="jpg").map_batches(
        images.prepare_batch, batch_format="pandas", fn_kwargs={"max_tokens": 4}).take_all()
    assert len(rows) == 4 and len({r[ROW_ID] for r in rows}) == 4  # the same bytes twice are two rows
    again = read(tmp_path / "pq", image_column="jpg", num_blocks=3).take_all()
    assert {r[ROW_ID] for r in again} == {r[ROW_ID] for r in rows}  # however the rows are split
    assert sorted(r[REJECT_REASON] for r in rows)[:2] == ["", ""]
    (tmp_path / "ids").mkdir()
    pd.DataFrame({"key": ["a", "a", ""], "jpg": [jpeg()] * 3}).to_parquet(tmp_path / "ids" / "x.parquet")
    with pytest.raises(Exception, match="ID_COLUMN='key' must give every row an id of its own"):
        read(tmp_path / "ids", image_column="jpg", id_column="key")


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["hf-bytes", "hf-paths", "plain"])
def test_every_parquet_layout_users_bring_reads_every_good_image_through_rays_reader(local_ray, tmp_path, layout):
    """The layouts of the captioning notebook's parquet run (test_notebook_runs), read as the notebook
    reads them (its default IMAGE_COLUMN), without the engine: every image, each id once."""
    from conftest import good_parquet_images

    count = good_parquet_images(tmp_path / "pq", layout)
    rows = read(tmp_path / "pq", image_column="jpg;jpeg;png;webp;gif;bmp;tif;tiff;image").take_all()
    assert len(rows) == count and all(not r[REJECT_REASON] and r[images.IMAGE_BYTES] for r in rows)
    assert len({r[ROW_ID] for r in rows}) == count


def test_hugging_face_parquet_images_come_embedded_or_by_a_path_relative_to_the_parquet_file(tmp_path, sample):
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "moon.jpg").write_bytes(sample["moon"])
    (tmp_path / "abs.jpg").write_bytes(sample["coins"])
    batch = pd.DataFrame({
        "image": [{"bytes": sample["astronaut"], "path": "astronaut.jpg"}, {"bytes": None, "path": "images/moon.jpg"},
                  {"bytes": None, "path": str(tmp_path / "abs.jpg")}, {"bytes": None, "path": "images/missing.jpg"},
                  {"bytes": None, "path": None}],
        "path": [str(tmp_path / "train-00000.parquet")] * 5, images.ROW_HASH: [11, 12, 13, 14, 15]})
    out = images._from_parquet(batch, "image", None, root=str(tmp_path), filesystem=None)
    assert out[ROW_ID].tolist() == [f"{h:016x}" for h in (11, 12, 13, 14, 15)]
    assert out[images.ROW_HASH].tolist() == [11, 12, 13, 14, 15]  # kept: resuming keys on it
    assert out[images.IMAGE_BYTES].tolist()[:3] == [sample["astronaut"], sample["moon"], sample["coins"]]
    assert out[REJECT_REASON][3] == "the image file 'images/missing.jpg' this row names could not be read (FileNotFoundError)"
    assert out[REJECT_REASON][4] == "no 'image' value in this row"


def test_the_example_is_the_largest_image_the_budget_allows_and_the_grid_draws_any_caption(local_ray, tmp_path):
    example = images.example(64)
    assert example["vision_tokens"] <= 64 and example["image"].shape == (example["height"], example["width"], 3)
    assert images.example(64, keep_aspect=False)["width"] == images.example(64, keep_aspect=False)["height"]
    image = np.zeros((28, 28, 3), np.uint8)
    rows = [{ROW_ID: "a", images.SOURCE: "s.tar:a$b$", images.IMAGE: image, REJECT_REASON: ""},
            {ROW_ID: "b", images.SOURCE: "s.tar:b", images.IMAGE: image, REJECT_REASON: ""}]
    fig = images.plot_captions(local_ray.data.from_items(rows), {"a": "x\ufffd\U000e0001" * 30}, tmp_path / "g.png", columns=2)
    assert (tmp_path / "g.png").stat().st_size > 0
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert texts[0].startswith("x··x··") and texts[1] == "(no caption)"


def test_the_tiny_vlm_is_a_qwen2_vl_with_its_special_tokens_and_a_template_for_images():
    from transformers import AutoProcessor, AutoTokenizer

    folder = models.tiny_vlm()
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["Qwen2VLForConditionalGeneration"]
    tokenizer = AutoTokenizer.from_pretrained(folder)
    special = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>")
    assert [tokenizer.convert_tokens_to_ids(t) for t in special] == list(range(len(special)))
    text = AutoProcessor.from_pretrained(folder).apply_chat_template(
        [{"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image_pil", "image_pil": None}]}],
        tokenize=False, add_generation_prompt=True)
    assert "<|vision_start|><|image_pad|><|vision_end|>" in text and text.endswith("<|im_start|>assistant\n")


# --- INPUT_FORMAT="huggingface": what datasets.load_dataset reads, streaming, or a datasets object --------


@pytest.fixture
def datasets_cache(monkeypatch, tmp_path):
    """datasets' locks and caches in the test's folder, not the user's."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets-cache")


def decoded(rows) -> dict[str, tuple | str]:
    """Each row's id: the size Pillow reads from its image bytes, or why there is none."""
    def size(row):
        try:
            return Image.open(io.BytesIO(row[images.IMAGE_BYTES])).size
        except Exception:
            return row[REJECT_REASON] or "not an image"
    return {r[ROW_ID]: size(r) for r in rows}


def test_huggingface_input_is_loaded_checked_and_counted_before_anything_starts(tmp_path, datasets_cache):
    import datasets

    shard = images.image_input(str(images.sample_path()), "huggingface", "jpg", None)
    assert (shard.format, shard.source_id, shard.rows, shard.kept[-1]) == ("huggingface", "sample_id", None, "sample_id")
    assert shard.rows_basis == "streaming: not counted" and shard.dataset.features["jpg"].decode is False  # the kit decodes
    (tmp_path / "carded").mkdir()  # a folder with a dataset card that counts its rows, as on the Hub
    (tmp_path / "carded" / "s.tar").write_bytes(images.sample_path().read_bytes())
    (tmp_path / "carded" / "README.md").write_text(
        "---\ndataset_info:\n  splits:\n  - name: train\n    num_bytes: 1\n    num_examples: 24\n---\n")
    assert images.image_input(str(tmp_path / "carded"), "huggingface", "jpg", None).rows == 24
    photos = datasets.Dataset.from_dict({"image": [Image.new("RGB", (60, 40))], "key": ["a"]})
    passed = images.image_input(photos, "auto", "image", None)  # an object: auto reads it through datasets
    assert (passed.format, passed.rows, passed.source_id, passed.shown) == ("huggingface", 1, "row_number",
                                                                            "datasets.Dataset(in memory)")
    assert images.image_input(photos.to_iterable_dataset(), "auto", "image", "key").source_id == "key"
    with pytest.raises(ParameterError, match="ID_COLUMN='id' is not a column of datasets.Dataset"):
        images.image_input(photos, "auto", "image", "id")
    with pytest.raises(ParameterError, match="INPUT_PATH is a datasets Dataset: set INPUT_FORMAT to 'huggingface'"):
        images.image_input(photos, "parquet", "image", None)
    with pytest.raises(ParameterError, match=r"INPUT_PATH is a DatasetDict: pass one split of it, such as dataset\['train'\]"):
        images.image_input(datasets.DatasetDict(train=photos), "auto", "image", None)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ParameterError, match=r"datasets.load_dataset\(path='.*empty', split='train', streaming=True\) "
                                             r"failed: EmptyDatasetError"):
        images.image_input(str(tmp_path / "empty"), "huggingface", "jpg", None)


def test_webdataset_samples_through_datasets_are_named_by_shard_and_key_a_hub_shard_whatever_the_revision():
    def ids(url, root):
        batch = pd.DataFrame({"__url__": [url], "__key__": ["k"], "jpg": [{"bytes": b"x", "path": "k.jpg"}]})
        out = images._from_huggingface(batch, "jpg", images.SAMPLE_ID, root)
        return out[ROW_ID][0], out[images.SOURCE][0], out[images.IMAGE_BYTES][0]

    repo = "BLIP3o/BLIP3o-Pretrain-Short-Caption"
    assert ids(f"hf://datasets/{repo}@0123abcd/data/00001.tar", repo) == ("data/00001.tar/k", "data/00001.tar:k", b"x")
    assert ids(f"hf://datasets/{repo}/00001.tar", repo)[0] == "00001.tar/k"
    assert ids("/data/wds/train/000000.tar", "/data/wds")[0] == "train/000000.tar/k"
    assert ids("/data/wds/train/000000.tar", "datasets.Dataset(in memory)")[0] == "data/wds/train/000000.tar/k"


def test_a_pillow_image_from_datasets_becomes_lossless_bytes():
    image = Image.new("CMYK", (30, 20), (0, 200, 30, 5))
    data, reason = images.image_value(image, "image")
    assert reason == "" and np.array_equal(np.asarray(Image.open(io.BytesIO(data))), np.asarray(image))


@pytest.mark.slow
def test_the_sample_shard_through_datasets_gives_the_webdataset_layouts_rows(local_ray, datasets_cache):
    """datasets decodes a webdataset's images itself and raises at the first broken one; its Arrow
    batches put each shard's last sample's columns in another order; Ray's from_huggingface asks the
    Hub first. Read as the kit reads it, the shard gives the rows the webdataset layout gives."""
    through_datasets = read(images.sample_path(), "huggingface", "jpg").take_all()
    as_webdataset = read(images.sample_path(), "webdataset", "jpg").take_all()
    assert len(through_datasets) == len(as_webdataset) == 24
    by_id = {r[ROW_ID]: r for r in as_webdataset}
    assert {r[ROW_ID]: r[images.IMAGE_BYTES] for r in through_datasets} == {i: r[images.IMAGE_BYTES] for i, r in by_id.items()}
    assert all(r[images.SOURCE] == by_id[r[ROW_ID]][images.SOURCE] for r in through_datasets)
    assert all(r[images.SAMPLE_ID] == r[ROW_ID] for r in through_datasets)
    prepared = images.prepare_batch(pd.DataFrame(through_datasets), max_tokens=16)
    expected = images.prepare_batch(pd.DataFrame(as_webdataset), max_tokens=16)
    assert sorted(zip(prepared[ROW_ID], prepared[REJECT_REASON], prepared["width"])) == sorted(
        zip(expected[ROW_ID], expected[REJECT_REASON], expected["width"]))
    assert sorted(prepared[prepared[REJECT_REASON] != ""][ROW_ID]) == sorted(
        f"sample-000000.tar/{k}" for k in ("broken_bomb", "broken_empty", "broken_not_an_image", "broken_truncated",
                                           "broken_truncated_png", "broken_truncated_webp"))
    again = read(images.sample_path(), "huggingface", "jpg", num_blocks=2).take_all()
    assert sorted(r[ROW_ID] for r in again) == sorted(r[ROW_ID] for r in through_datasets)  # resume keys on them


@pytest.mark.slow
def test_a_folder_of_image_files_through_datasets_is_read_from_the_paths_it_names(local_ray, tmp_path, datasets_cache):
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "a.jpg").write_bytes(jpeg(size=(16, 10)))
    (tmp_path / "folder" / "b.png").write_bytes(b"not an image")
    rows = read(tmp_path / "folder", "huggingface", "image").take_all()  # datasets' imagefolder: {bytes: None, path}
    assert decoded(rows) == {"0": (16, 10), "1": "not an image"}


@pytest.mark.slow
def test_a_datasets_dataset_passed_in_memory_or_streaming_gives_one_row_per_image(local_ray, datasets_cache):
    """The same picture twice is two rows, numbered in the dataset's order, the same numbers every read;
    bytes, Hugging Face image structs and images datasets decoded itself are all read."""
    import datasets

    red, blue = Image.new("RGB", (60, 40), (200, 0, 0)), Image.new("RGB", (30, 50), (0, 0, 200))
    photos = datasets.Dataset.from_dict({"image": [red, blue, red]})
    for given in (photos, photos.to_iterable_dataset(), photos.to_iterable_dataset()):  # streamed twice: the same ids
        rows = images.read(images.image_input(given, "auto", "image;jpg", None), num_blocks=2, num_cpus=0.5).take_all()
        assert decoded(rows) == {"0": (60, 40), "1": (30, 50), "2": (60, 40)}
        assert sorted(r[images.ROW_NUMBER] for r in rows) == [0, 1, 2]
    coded = datasets.Dataset.from_dict({"key": ["a", "b"], "png": [jpeg(size=(12, 8)), b"not an image"]})
    rows = images.read(images.image_input(coded.to_iterable_dataset(), "auto", "jpg;png", "key"), num_blocks=2,
                       num_cpus=0.5).take_all()
    assert decoded(rows) == {"a": (12, 8), "b": "not an image"} and sorted(r["key"] for r in rows) == ["a", "b"]
    prepared = images.prepare_batch(pd.DataFrame(rows).sort_values(ROW_ID), max_tokens=4)
    assert prepared[REJECT_REASON].tolist() == ["", "not an image"]
    unknown = datasets.IterableDataset.from_generator(pil_rows)  # no features: datasets yields Pillow images
    rows = images.read(images.image_input(unknown, "auto", "image", None), num_blocks=1, num_cpus=0.5).take_all()
    assert decoded(rows) == {"0": (9, 7)}
    with pytest.raises(ParameterError, match=r"none of the first 3 huggingface rows has a 'png' value; they have: \['image'\]"):
        images.read(images.image_input(photos, "auto", "png", None), num_blocks=1, num_cpus=0.5)


def pil_rows():
    yield {"image": Image.new("RGB", (9, 7), (10, 200, 10))}
