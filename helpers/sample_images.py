"""The bundled sample images: scikit-image's public-domain photos, in awkward but valid variants and
deliberately broken files, written once as a webdataset shard in the kit's cache."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any

import numpy as np


#: scikit-image's bundled photos used for the sample (all public domain or CC0, see skimage.data).
SAMPLE_PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "camera", "hubble_deep_field",
                 "immunohistochemistry", "page", "coins", "horse", "retina", "moon")


def files_array(array: np.ndarray) -> np.ndarray:
    """A scikit-image sample as 8-bit greyscale or RGB (its samples are bool, float or RGBA too)."""
    if array.dtype == bool:
        array = array.astype(np.uint8) * 255
    if array.dtype != np.uint8:
        array = (255 * (array - array.min()) / max(1e-9, float(array.max() - array.min()))).astype(np.uint8)
    if array.ndim == 3 and array.shape[2] == 4:
        array = array[:, :, :3]
    return array


def _jpeg(array: np.ndarray, **kwargs: Any) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, "JPEG", quality=90, **kwargs)
    return buffer.getvalue()


def sample_size() -> int:
    """Images in the bundled sample corpus, broken ones included (builds it: about a second)."""
    return len(sample_files())


def sample_files() -> dict[str, bytes]:
    """The sample as ``{key: jpg bytes}``: real photos in awkward variants, plus deliberately broken files."""
    from PIL import Image
    from skimage import data as skdata

    files: dict[str, bytes] = {}
    for name in SAMPLE_PHOTOS:
        files[name] = _jpeg(files_array(getattr(skdata, name)()))
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
    # Garbage in the EXIF block of an otherwise good JPEG (found by the fuzz tests): the photo is
    # used, the unreadable orientation ignored.
    horse_exif = Image.Exif()
    horse_exif[0x0112] = 1
    horse = _jpeg(np.asarray(Image.fromarray(files_array(skdata.horse())).convert("RGB")), exif=horse_exif.tobytes())
    at = horse.find(b"Exif\x00\x00") + 14
    files["horse_corrupt_exif"] = horse[:at] + b"\xff\x00\x13\x37" * 4 + horse[at + 16:]
    # Broken on purpose: each must end up in the rejects table with its reason.
    files["broken_truncated"] = files["astronaut"][: len(files["astronaut"]) // 3]
    files["broken_empty"] = b""
    files["broken_not_an_image"] = b"<html><body>404 Not Found</body></html>"
    files["broken_bomb"] = _bomb_png()
    # Found by the fuzz tests: Pillow reads a PNG's EXIF by loading the image, so a truncated PNG
    # failed outside the reject path and killed whole runs; a truncated WebP fails in the decoder.
    files["broken_truncated_png"] = files["rocket_transparent_png"][: len(files["rocket_transparent_png"]) // 2]
    buffer = io.BytesIO()
    Image.fromarray(skdata.coffee()).save(buffer, "WEBP", quality=80)
    files["broken_truncated_webp"] = buffer.getvalue()[: buffer.tell() // 2]
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
    from helpers.node_cache import record

    def build(out: Path) -> dict:
        files = sample_files()
        write_webdataset(files, out / "sample-000000.tar")
        return {"images": len(files), "broken": sorted(k for k in files if k.startswith("broken_"))}

    shard = build_once((cache or cache_root()) / "sample-images", build) / "sample-000000.tar"
    record(prepare_sample_images, cache or cache_root(), "the bundled sample images")
    return shard
