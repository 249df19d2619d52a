"""Image datasets for the captioning notebook: readers for three layouts, the bundled sample set,
and the per-batch preparation step that turns raw bytes into model-ready images or rejects.

Layouts (``INPUT_FORMAT``):

- ``"webdataset"``: ``.tar`` shards of ``<key>.jpg`` (+ other fields) files, BLIP3o's real format.
- ``"parquet"``: rows whose image column holds ``{"bytes": ...}`` (the Hugging Face datasets layout)
  or plain bytes.
- ``"images"``: a folder of image files; every file is read, so a stray file is rejected, not skipped.

Each reader streams: a 5-million-image dataset is never loaded whole.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from helpers import images
from helpers.data import REJECT_REASON, ROW_ID

FORMATS = ("webdataset", "parquet", "images")
SOURCE = "source"
IMAGE_BYTES = "image_bytes"
IMAGE = "image"


def detect_format(path: str) -> str:
    """Guess the layout from the path: ``.tar`` -> webdataset, ``.parquet`` -> parquet, folders of those too."""
    p = Path(path)
    candidates = [p] if not p.is_dir() else sorted(
        x for x in p.rglob("*") if x.is_file() and not x.name.startswith("."))
    suffixes = {x.suffix.lower() for x in candidates}
    if suffixes and suffixes <= {".tar"}:
        return "webdataset"
    if suffixes and suffixes <= {".parquet"}:
        return "parquet"
    if p.is_dir() or not suffixes & {".tar", ".parquet"}:
        return "images"
    raise ValueError(f"cannot tell the layout of {path!r}; set INPUT_FORMAT to one of {FORMATS}")


def source_id_column(input_format: str, id_column: str | None) -> str | None:
    """The column that identifies a row in the *source* data, as read (what resuming keys on):
    the sample key in webdatasets, the file path in folders, ``id_column`` in parquet (or None)."""
    return {"webdataset": "__key__", "images": "path", "parquet": id_column}[input_format]


def read_images(path: str, input_format: str, *, image_column: str = "jpg", id_column: str | None = None,
                num_cpus: float = 0.1):
    """Read any of the three layouts into rows ``{row_id, source, image_bytes}`` plus the source's
    own id column (see :func:`source_id_column`), kept under its name so results can be matched to
    the source and interrupted runs resumed."""
    import ray

    if input_format not in FORMATS:
        raise ValueError(f"INPUT_FORMAT must be one of {FORMATS} or 'auto', got {input_format!r}")
    if input_format == "webdataset":
        # decoder=None keeps the raw bytes: decoding happens in prepare_batch, where failures are caught.
        ds = ray.data.read_webdataset(path, decoder=None, include_paths=True, num_cpus=num_cpus)
        fn, kwargs = _from_webdataset, {"image_column": image_column}
    elif input_format == "parquet":
        ds = ray.data.read_parquet(path, include_paths=True, num_cpus=num_cpus)
        fn, kwargs = _from_parquet, {"image_column": image_column, "id_column": id_column}
    else:
        ds = ray.data.read_binary_files(path, include_paths=True, num_cpus=num_cpus)
        fn, kwargs = _from_files, {}
    return ds.map_batches(fn, fn_kwargs=kwargs, batch_format="pandas", num_cpus=num_cpus)


def _raw_bytes(value: Any) -> bytes:
    if isinstance(value, dict):
        value = value.get("bytes")
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return b""
    return bytes(value)


def _from_webdataset(batch: pd.DataFrame, image_column: str) -> pd.DataFrame:
    if image_column not in batch:
        columns = [c for c in batch.columns if not c.startswith("__")]
        raise ValueError(f"the webdataset samples have no {image_column!r} field; fields: {columns}")
    sources = [f"{Path(str(p)).name}:{k}" for p, k in zip(batch.get("path", [""] * len(batch)), batch["__key__"])]
    return pd.DataFrame({ROW_ID: sources, SOURCE: sources, "__key__": batch["__key__"].astype(str),
                         IMAGE_BYTES: [_raw_bytes(v) for v in batch[image_column]]})


def _from_parquet(batch: pd.DataFrame, image_column: str, id_column: str | None) -> pd.DataFrame:
    if image_column not in batch:
        raise ValueError(f"the parquet rows have no {image_column!r} column; columns: {list(batch.columns)}")
    raw = [_raw_bytes(v) for v in batch[image_column]]
    if id_column:
        ids = batch[id_column].astype(str).tolist()
    else:  # content hash: stable across runs whatever the order rows arrive in
        ids = [hashlib.sha1(b).hexdigest()[:16] for b in raw]
    out = pd.DataFrame({ROW_ID: ids, SOURCE: [f"{Path(str(p)).name}:{i}" for p, i in zip(batch["path"], ids)],
                        IMAGE_BYTES: raw})
    if id_column:
        out[id_column] = batch[id_column].to_numpy()
    return out


def _from_files(batch: pd.DataFrame) -> pd.DataFrame:
    paths = [str(p) for p in batch["path"]]
    return pd.DataFrame({ROW_ID: paths, SOURCE: [Path(p).name for p in paths], "path": paths,
                         IMAGE_BYTES: [_raw_bytes(b) for b in batch["bytes"]]})


def prepare_batch(batch: pd.DataFrame, *, max_tokens: int, keep_aspect: bool = True,
                  max_pixels: int = images.DEFAULT_MAX_PIXELS) -> pd.DataFrame:
    """Validate and resize every image of a batch; a bad one gets a reason instead of an image.

    Output columns: the input's columns except the raw bytes (dropped here), plus image (uint8
    H x W x 3, None when rejected), width, height, vision_tokens and reject_reason ("" when usable).
    """
    out: dict[str, list] = {IMAGE: [], "width": [], "height": [], "vision_tokens": [], REJECT_REASON: []}
    for raw in batch[IMAGE_BYTES]:
        try:
            prepared = images.prepare_image(raw, max_tokens=max_tokens, keep_aspect=keep_aspect, max_pixels=max_pixels)
        except images.ImageRejected as exc:
            out[IMAGE].append(None)
            out["width"].append(0)
            out["height"].append(0)
            out["vision_tokens"].append(0)
            out[REJECT_REASON].append(exc.reason)
            continue
        out[IMAGE].append(np.asarray(prepared.image))
        out["width"].append(prepared.image.width)
        out["height"].append(prepared.image.height)
        out["vision_tokens"].append(prepared.vision_tokens)
        out[REJECT_REASON].append("")
    return batch.drop(columns=[IMAGE_BYTES]).reset_index(drop=True).assign(**out)


# --- the bundled sample set -------------------------------------------------------------------

#: scikit-image's bundled photos used for the sample (all public domain or CC0, see skimage.data).
SAMPLE_PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "camera", "hubble_deep_field",
                 "immunohistochemistry", "page", "coins", "horse", "retina", "moon")


def _jpeg(array: np.ndarray, **kwargs: Any) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, "JPEG", quality=90, **kwargs)
    return buffer.getvalue()


def sample_files() -> dict[str, bytes]:
    """The sample as ``{key: jpg bytes}``: real photos in awkward variants, plus deliberately broken files."""
    from PIL import Image
    from skimage import data as skdata

    files: dict[str, bytes] = {}
    for name in SAMPLE_PHOTOS:
        array = getattr(skdata, name)()
        if array.dtype == bool:
            array = array.astype(np.uint8) * 255
        if array.dtype != np.uint8:
            array = (255 * (array - array.min()) / max(1e-9, float(array.max() - array.min()))).astype(np.uint8)
        if array.ndim == 3 and array.shape[2] == 4:
            array = array[:, :, :3]
        files[name] = _jpeg(array)
    chelsea = skdata.chelsea()
    # Awkward but valid: a photo stored sideways with an EXIF orientation tag, a CMYK JPEG,
    # a transparent PNG and a 16-bit greyscale PNG (both under a .jpg name, as scraped data often is).
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 degrees clockwise to display"
    files["chelsea_exif_rotated"] = _jpeg(np.rot90(chelsea, k=1).copy(), exif=exif.tobytes())
    buffer = io.BytesIO()
    Image.fromarray(skdata.coffee()).convert("CMYK").save(buffer, "JPEG")
    files["coffee_cmyk"] = buffer.getvalue()
    rgba = np.dstack([skdata.rocket(), np.full(skdata.rocket().shape[:2], 128, np.uint8)])
    buffer = io.BytesIO()
    Image.fromarray(rgba, "RGBA").save(buffer, "PNG")
    files["rocket_transparent_png"] = buffer.getvalue()
    buffer = io.BytesIO()
    Image.fromarray(skdata.camera().astype(np.uint16) * 257).save(buffer, "PNG")  # mode I;16
    files["camera_16bit_png"] = buffer.getvalue()
    # An animated GIF (palette mode, several frames) that ships with scikit-image: the first frame is used.
    from importlib import resources

    files["animated_gif"] = (resources.files("skimage") / "data" / "no_time_for_that_tiny.gif").read_bytes()
    # Broken on purpose: each must end up in the rejects table with its reason.
    files["broken_truncated"] = files["astronaut"][: len(files["astronaut"]) // 3]
    files["broken_empty"] = b""
    files["broken_not_an_image"] = b"<html><body>404 Not Found</body></html>"
    files["broken_bomb"] = _bomb_png()
    return files


def _bomb_png() -> bytes:
    """A tiny PNG that claims to be 100,000 x 100,000 pixels: refused before any decoding."""
    import struct
    import zlib

    def chunk(kind: bytes, payload: bytes) -> bytes:
        return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))

    header = struct.pack(">IIBBBBB", 100_000, 100_000, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + chunk(b"IEND", b"")


def write_webdataset(files: dict[str, bytes], path: Path, caption: str | None = None) -> Path:
    """Write ``files`` as one webdataset shard: ``<key>.jpg`` (and ``<key>.txt`` if ``caption``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w") as tar:
        for key, payload in files.items():
            members = {f"{key}.jpg": payload}
            if caption is not None:
                members[f"{key}.txt"] = caption.encode()
            for name, content in members.items():
                info = tarfile.TarInfo(name)
                info.size = len(content)
                info.mtime = 0
                tar.addfile(info, io.BytesIO(content))
    return path


def prepare_sample_images(cache: Path | None = None) -> Path:
    """Build (once) and return the sample shard, in BLIP3o's webdataset layout."""
    from helpers.models import build_once, cache_root

    def build(out: Path) -> dict:
        files = sample_files()
        write_webdataset(files, out / "sample-000000.tar")
        return {"images": len(files), "broken": sorted(k for k in files if k.startswith("broken_"))}

    return build_once((cache or cache_root()) / "sample-images", build) / "sample-000000.tar"
