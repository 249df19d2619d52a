"""A corpus of awkward and broken files, built here, proves what the image helpers accept and refuse."""

import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from helpers import images
from helpers.images import ImageRejected, fit_size, prepare_image, vision_tokens


def encode(image: Image.Image, fmt: str, **kwargs) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **kwargs)
    return buffer.getvalue()


def gradient(width=640, height=480) -> Image.Image:
    x = np.linspace(0, 255, width, dtype=np.uint8)
    y = np.linspace(0, 255, height, dtype=np.uint8)
    return Image.fromarray(np.dstack([np.tile(x, (height, 1)), np.tile(y[:, None], (1, width)),
                                      np.full((height, width), 90, np.uint8)]))


def png_with_size(width: int, height: int) -> bytes:
    def chunk(kind, payload):
        return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\x00" * 16)) + chunk(b"IEND", b""))


@pytest.mark.parametrize("width, height, budget", [(640, 480, 64), (4000, 3000, 256), (100, 3000, 64),
                                                   (3000, 100, 64), (10, 10, 64), (28, 28, 1)])
def test_fit_size_is_on_the_grid_within_budget_and_keeps_aspect(width, height, budget):
    w, h = fit_size(width, height, budget)
    assert w % 28 == 0 and h % 28 == 0
    assert vision_tokens(w, h) <= budget
    if min(width, height) >= 28 * 4:
        assert abs((w / h) / (width / height) - 1) < 0.2
    assert w <= max(width, 28) and h <= max(height, 28)  # never upscales past the grid minimum


def test_fit_size_square_and_errors():
    assert fit_size(640, 480, 64, keep_aspect=False) == (224, 224)
    with pytest.raises(ValueError):
        fit_size(0, 10, 64)


@pytest.mark.parametrize("mode", ["RGB", "L", "1", "P", "CMYK", "RGBA", "LA", "I;16", "I", "F", "YCbCr"])
def test_every_mode_becomes_rgb(mode):
    source = gradient(200, 120)
    if mode == "I;16":
        image = Image.fromarray((np.asarray(source.convert("L"), dtype=np.uint16) * 257))
    elif mode in ("I", "F"):
        image = source.convert("L").convert(mode)
    else:
        image = source.convert(mode)
    rgb = images.to_rgb(image)
    assert rgb.mode == "RGB" and rgb.size == image.size


def test_16_bit_is_scaled_not_clipped():
    array = np.linspace(0, 65535, 100 * 100).reshape(100, 100).astype(np.uint16)
    rgb = np.asarray(images.to_rgb(Image.fromarray(array)))
    assert rgb.min() == 0 and rgb.max() == 255  # a plain convert() would saturate almost everything


def test_transparency_goes_onto_white():
    clear = Image.new("RGBA", (40, 40), (255, 0, 0, 0))
    assert images.to_rgb(clear).getpixel((5, 5)) == (255, 255, 255)


@pytest.mark.parametrize("fmt, mode", [("JPEG", "RGB"), ("JPEG", "L"), ("JPEG", "CMYK"), ("PNG", "RGBA"),
                                       ("PNG", "P"), ("PNG", "LA"), ("WEBP", "RGB"), ("BMP", "RGB"),
                                       ("TIFF", "RGB"), ("GIF", "P")])
def test_valid_files_are_prepared(fmt, mode):
    data = encode(gradient().convert(mode), fmt)
    prepared = prepare_image(data, max_tokens=64)
    assert prepared.image.mode == "RGB"
    assert prepared.source_format == fmt and prepared.source_size == (640, 480)
    assert prepared.vision_tokens == vision_tokens(*prepared.image.size) <= 64


def test_exif_orientation_is_applied():
    upright = gradient(300, 200)
    exif = Image.Exif()
    exif[0x0112] = 6  # stored rotated; display rotated 90 degrees clockwise
    stored = upright.transpose(Image.Transpose.ROTATE_90)
    prepared = prepare_image(encode(stored, "JPEG", exif=exif.tobytes()), max_tokens=1000)
    assert prepared.image.width > prepared.image.height  # displayed landscape, like the original


def test_animated_gif_uses_first_frame():
    frames = [Image.new("RGB", (56, 56), c) for c in [(255, 0, 0), (0, 0, 255)]]
    buffer = io.BytesIO()
    frames[0].save(buffer, "GIF", save_all=True, append_images=frames[1:], duration=100)
    prepared = prepare_image(buffer.getvalue(), max_tokens=4)
    r, g, b = prepared.image.getpixel((10, 10))
    assert r > 200 and b < 50


def test_large_jpeg_uses_draft_decoding(monkeypatch):
    from PIL import JpegImagePlugin

    decoded_sizes = []
    real_draft = JpegImagePlugin.JpegImageFile.draft

    def spy(self, mode, size):
        result = real_draft(self, mode, size)
        decoded_sizes.append(self.size)  # the size Pillow will decode at, after draft
        return result

    monkeypatch.setattr(JpegImagePlugin.JpegImageFile, "draft", spy)
    data = encode(gradient(4000, 3000), "JPEG")
    prepared = prepare_image(data, max_tokens=64)
    assert prepared.image.size == fit_size(4000, 3000, 64)
    # prepare_image asked for a draft, and the JPEG was decoded at a fraction of its 4000 x 3000.
    assert decoded_sizes and decoded_sizes[0][0] <= 1000 and decoded_sizes[0][1] <= 750


@pytest.mark.parametrize("data, reason", [
    (b"", "empty file"),
    (b"<html>404</html>", "not an image"),
    (b"\xff\xd8\xff\xe0" + b"\x00" * 20, "not an image"),
    (png_with_size(100_000, 100_000), "too many pixels"),
], ids=["empty", "html", "jpeg-header-only", "bomb"])
def test_broken_files_are_refused_with_a_reason(data, reason):
    with pytest.raises(ImageRejected) as err:
        prepare_image(data, max_tokens=64)
    assert reason in str(err.value)


def test_truncated_jpeg_is_caught_by_decoding_not_just_opening():
    data = encode(gradient(), "JPEG")[:5000]
    Image.open(io.BytesIO(data))  # the seed's check: the header opens fine
    with pytest.raises(ImageRejected, match="truncated"):
        prepare_image(data, max_tokens=64)


def test_pixel_limit_is_ours_to_set():
    data = encode(gradient(640, 480), "PNG")
    with pytest.raises(ImageRejected, match=r"too many pixels \(640x480 > 100,000\)"):
        prepare_image(data, max_tokens=64, max_pixels=100_000)


def test_unsupported_format_is_refused():
    data = encode(gradient(64, 64), "PPM")
    with pytest.raises(ImageRejected, match="unsupported format PPM"):
        prepare_image(data, max_tokens=64)


def test_max_pixels_wins_over_pillows_own_bomb_limit(monkeypatch):
    # Pillow's default limit (~89 MP) would refuse a big scan that MAX_PIXELS allows; lowered here
    # so that a small image stands in for the big one.
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    prepared = prepare_image(encode(gradient(640, 480), "PNG"), max_tokens=16, max_pixels=1_000_000)
    assert prepared.source_size == (640, 480)
    assert Image.MAX_IMAGE_PIXELS == 1000  # Pillow's setting is put back after the image


def test_truncated_png_is_a_reject_not_a_crash():
    # Pillow's PNG getexif() loads the image: a truncated PNG raised OSError outside the reject path.
    data = encode(gradient(), "PNG")
    with pytest.raises(ImageRejected, match="truncated"):
        prepare_image(data[: len(data) // 2], max_tokens=64)


@pytest.mark.parametrize("value", ["a string", None, float("nan"), [1, 2], 42, {"bytes": None}])
def test_values_that_are_not_bytes_are_refused(value):
    with pytest.raises(ImageRejected, match="not image bytes"):
        prepare_image(value, max_tokens=64)


def test_16_bit_scaling_makes_no_float64_copy(monkeypatch):
    big = Image.fromarray((np.arange(200 * 300, dtype=np.uint16).reshape(200, 300) * 1).astype(np.uint16))
    real_asarray = np.asarray

    def guarded(a, dtype=None, **kw):
        assert dtype is not np.float64, "no float64 copy of a 16-bit image"
        return real_asarray(a, dtype=dtype, **kw)

    monkeypatch.setattr(images.np, "asarray", guarded)
    rgb = images.to_rgb(big)
    assert rgb.mode == "RGB" and real_asarray(rgb)[..., 0].max() == 255 and real_asarray(rgb)[..., 0].min() == 0
