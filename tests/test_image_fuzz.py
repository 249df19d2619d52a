"""Property-based tests: no bytes, and no value, can make image preparation raise.

Hypothesis generates truncations at arbitrary offsets and random corruptions of small valid files
in every supported format, corrupt EXIF blocks, and values that are not bytes at all. Every case
must end as a usable image or a reject with a reason; nothing may escape into Ray (one exception in
a map task fails the whole job). Each test runs a fixed, reproducible set of cases
(``derandomize``); set ``KIT_FUZZ_EXAMPLES`` to run more. What these tests found went into the
corpus of broken files in ``scripts/make_sample_images.py`` and ``tests/test_images.py``.
"""

from __future__ import annotations

import io
import math
import os

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from helpers import images

EXAMPLES = int(os.environ.get("KIT_FUZZ_EXAMPLES", "300"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _photo(width: int = 48, height: int = 36) -> Image.Image:
    rng = np.random.default_rng(7)
    base = np.linspace(0, 255, width * height * 3).reshape(height, width, 3)
    return Image.fromarray((base + rng.integers(0, 40, base.shape)).clip(0, 255).astype(np.uint8))


def _encode(image: Image.Image, fmt: str, **kwargs) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **kwargs)
    return buffer.getvalue()


def _seeds() -> dict[str, bytes]:
    photo = _photo()
    exif = Image.Exif()
    exif[0x0112] = 6
    frames = [_photo().rotate(a) for a in (0, 90)]
    gif = io.BytesIO()
    frames[0].convert("P").save(gif, "GIF", save_all=True, append_images=[f.convert("P") for f in frames[1:]])
    return {
        "jpeg": _encode(photo, "JPEG", quality=80),
        "jpeg_exif": _encode(photo, "JPEG", exif=exif.tobytes()),
        "png": _encode(photo, "PNG"),
        "png_16bit": _encode(Image.fromarray((np.asarray(photo.convert("L"), np.uint16) * 257)), "PNG"),
        "png_rgba": _encode(photo.convert("RGBA"), "PNG"),
        "png_exif": _encode(photo, "PNG", exif=exif.tobytes()),
        "gif": gif.getvalue(),
        "webp": _encode(photo, "WEBP", quality=80),
        "webp_exif": _encode(photo, "WEBP", exif=exif.tobytes()),
        "tiff": _encode(photo, "TIFF"),
        "tiff_exif": _encode(photo, "TIFF", exif=exif.tobytes()),
        "bmp": _encode(photo, "BMP"),
        "cmyk_jpeg": _encode(photo.convert("CMYK"), "JPEG"),
    }


SEEDS = _seeds()
NAMES = sorted(SEEDS)


def _ends_usable_or_rejected(values: list) -> pd.DataFrame:
    """Run ``prepare_batch`` on ``values`` as one batch; it must return, one row per value, each
    either an image with no reason or no image with a reason."""
    for value in values:  # prepare_image itself raises only ImageRejected, with a reason
        try:
            images.prepare_image(value, max_tokens=16)
        except images.ImageRejected as exc:
            assert str(exc)
    batch = pd.DataFrame({"row_id": [str(i) for i in range(len(values))], images.IMAGE_BYTES: values,
                          images.REJECT_REASON: [""] * len(values)})
    out = images.prepare_batch(batch, max_tokens=16)
    assert len(out) == len(values)
    for image, reason in zip(out[images.IMAGE], out[images.REJECT_REASON]):
        if reason:
            assert image is None and isinstance(reason, str) and len(reason) < 200
        else:
            assert image is not None and image.ndim == 3 and image.shape[2] == 3 and image.dtype == np.uint8
    return out


def test_every_seed_file_is_usable():
    out = _ends_usable_or_rejected([SEEDS[n] for n in NAMES])
    assert list(out[images.REJECT_REASON]) == [""] * len(NAMES)


@FUZZ
@given(name=st.sampled_from(NAMES), cut=st.floats(0, 1, exclude_max=True))
def test_truncated_at_any_offset(name, cut):
    data = SEEDS[name]
    _ends_usable_or_rejected([data[: math.floor(cut * len(data))]])


@FUZZ
@given(name=st.sampled_from(NAMES), edits=st.lists(st.tuples(st.floats(0, 1, exclude_max=True),
                                                             st.integers(0, 255)), min_size=1, max_size=12))
def test_random_byte_corruption(name, edits):
    data = bytearray(SEEDS[name])
    for where, value in edits:
        data[math.floor(where * len(data))] = value
    _ends_usable_or_rejected([bytes(data)])


@FUZZ
@given(name=st.sampled_from(["jpeg_exif", "png_exif", "webp_exif", "tiff_exif"]),
       garbage=st.binary(min_size=1, max_size=64), offset=st.integers(0, 40))
def test_corrupt_exif_blocks(name, garbage, offset):
    data = bytearray(SEEDS[name])
    start = data.find(b"Exif\x00\x00")
    start = start + 6 if start >= 0 else max(0, data.find(b"MM\x00*") if b"MM\x00*" in data else data.find(b"II*\x00"))
    at = min(len(data) - 1, start + offset)
    data[at:at + len(garbage)] = garbage
    _ends_usable_or_rejected([bytes(data)])


NOT_BYTES = st.one_of(st.none(), st.text(max_size=20), st.floats(allow_nan=True), st.integers(),
                      st.lists(st.integers(0, 255), max_size=5), st.just(float("nan")),
                      st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


@FUZZ
@given(values=st.lists(st.one_of(NOT_BYTES, st.binary(max_size=64), st.sampled_from(list(SEEDS.values()))),
                       min_size=1, max_size=6))
def test_mixed_batches_of_anything(values):
    out = _ends_usable_or_rejected(values)
    for value, reason in zip(values, out[images.REJECT_REASON]):
        if not isinstance(value, (bytes, bytearray)):
            assert reason.startswith("not image bytes")


@pytest.mark.parametrize("size", [(1, 1), (1, 5000), (5000, 1)])
def test_extreme_shapes_are_usable(size):
    out = _ends_usable_or_rejected([_encode(Image.new("RGB", size, (10, 20, 30)), "PNG")])
    assert out[images.REJECT_REASON].iloc[0] == ""
