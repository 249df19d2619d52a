"""Image validation, normalisation and resizing for vision-language models.

``prepare_image`` is the one call a pipeline needs: it refuses what would crash or hang a run
(empty files, non-images, unsupported formats, decompression bombs, truncated or corrupt data) with
a short reason, and turns everything else into an RGB image of a size the model's vision encoder
tiles exactly. Unlike a bare ``Image.open`` (which reads only the header), it decodes the image, so
a truncated JPEG is caught here and not in the middle of inference.

Pillow does the work: it is the library vLLM and Hugging Face processors use, so what passes here
is what the engine will accept.
"""

from __future__ import annotations

import contextlib
import io
import math
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from struct import error as struct_error

from PIL import Image, ImageOps, UnidentifiedImageError

#: Formats the kit accepts (Pillow's names). MPO is what many cameras write for JPEGs.
ALLOWED_FORMATS = frozenset({"JPEG", "MPO", "PNG", "WEBP", "GIF", "BMP", "TIFF"})
#: Refuse images above this many pixels before decoding them (a 12 MP photo is 12_000_000).
DEFAULT_MAX_PIXELS = 50_000_000


@dataclass(frozen=True)
class VisionGrid:
    """How a vision encoder tiles an image: ``patch`` pixels per patch, ``merge`` x ``merge``
    patches per token (Qwen2-VL / Qwen2.5-VL: 14 and 2, so one token per 28 x 28 pixels)."""

    patch: int = 14
    merge: int = 2

    @property
    def factor(self) -> int:
        return self.patch * self.merge

    def tokens(self, width: int, height: int) -> int:
        """Vision tokens for an image of this size (already a multiple of ``factor``)."""
        return (width // self.factor) * (height // self.factor)


QWEN2_VL_GRID = VisionGrid(14, 2)


def fit_size(width: int, height: int, max_tokens: int, grid: VisionGrid = QWEN2_VL_GRID,
             keep_aspect: bool = True) -> tuple[int, int]:
    """Target size: multiples of the grid's factor, at most ``max_tokens`` vision tokens, aspect kept.

    With ``keep_aspect=False`` the image becomes the largest square within the budget.
    """
    if width < 1 or height < 1:
        raise ValueError(f"image size must be positive, got {width}x{height}")
    if max_tokens < 1:
        raise ValueError("max_tokens must be >= 1")
    f = grid.factor
    if not keep_aspect:
        side = max(1, math.isqrt(max_tokens))
        return side * f, side * f
    # Largest scale s with round(w*s/f) * round(h*s/f) <= max_tokens, never upscaling past the original.
    scale = min(1.0, math.sqrt(max_tokens * f * f / (width * height)))
    while True:
        cols = max(1, round(width * scale / f))
        rows = max(1, round(height * scale / f))
        if cols * rows <= max_tokens or (cols == 1 and rows == 1):
            return cols * f, rows * f
        scale *= 0.98


class ImageRejected(ValueError):
    """The input cannot be used; ``reason`` says why in a few words."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class PreparedImage:
    image: Image.Image
    source_format: str
    source_mode: str
    source_size: tuple[int, int]
    vision_tokens: int


@contextlib.contextmanager
def _pixel_limit() -> Iterator[None]:
    """Make ``max_pixels`` the one pixel limit for one image.

    Pillow warns above its own ``Image.MAX_IMAGE_PIXELS`` (~89 MP by default) and raises above twice
    that, whatever the caller allows: a 100 MP scan would be refused even with ``MAX_PIXELS`` at
    200,000,000. Pillow checks the size from the header when it opens a file; :func:`open_checked`
    checks the same size against ``max_pixels`` right after, before anything is decoded. So for the
    duration of one image Pillow's limit is lifted, and ours is the only one.
    """
    previous = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = None
    try:
        yield
    finally:
        Image.MAX_IMAGE_PIXELS = previous


def reason_for(exc: BaseException, part: str = "data") -> str:
    """A short, human reason for an exception raised while reading one image."""
    if isinstance(exc, ImageRejected):
        return exc.reason
    if isinstance(exc, (Image.DecompressionBombError, Image.DecompressionBombWarning)):
        return "too many pixels (decompression bomb refused before decoding)"
    if isinstance(exc, MemoryError):
        return "too large to decode in memory"
    message = " ".join(str(exc).split())[:120]
    if "truncated" in message.lower() or isinstance(exc, EOFError):
        return "truncated file"
    return f"corrupt {part} ({type(exc).__name__}: {message})" if message else f"corrupt {part} ({type(exc).__name__})"


def open_checked(data: bytes, max_pixels: int = DEFAULT_MAX_PIXELS) -> Image.Image:
    """Open ``data`` lazily, refusing empty input, non-images, unsupported formats and bombs."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ImageRejected(f"not image bytes (got {type(data).__name__})")
    if not data:
        raise ImageRejected("empty file")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)  # when called outside prepare_image
            image = Image.open(io.BytesIO(bytes(data)))
    except UnidentifiedImageError:
        raise ImageRejected("not an image") from None
    except Exception as exc:  # Pillow raises assorted errors on malformed headers
        raise ImageRejected(reason_for(exc, "header")) from None
    if image.format not in ALLOWED_FORMATS:
        raise ImageRejected(f"unsupported format {image.format}")
    width, height = image.size
    if width * height > max_pixels:
        raise ImageRejected(f"too many pixels ({width}x{height} > {max_pixels:,})")
    if width < 1 or height < 1:
        raise ImageRejected(f"empty image ({width}x{height})")
    return image


_SIXTEEN_BIT = ("I;16", "I;16B", "I;16L", "I;16N")


def _scaled_to_8_bits(image: Image.Image) -> Image.Image:
    """Stretch a 16-bit, 32-bit integer or float greyscale image to 0-255, in bounded memory.

    16-bit images go through a 65,536-entry lookup table (no copy larger than the 8-bit result);
    32-bit and float images through one float32 copy, scaled in place (never float64).
    """
    array = np.asarray(image)
    if image.mode in _SIXTEEN_BIT:
        array = array.astype(np.uint16, copy=False)
        low, high = int(array.min()), int(array.max())
        levels = np.arange(65536, dtype=np.float32)
        lut = np.zeros(65536, np.uint8) if high <= low else np.clip((levels - low) * (255.0 / (high - low)), 0, 255)
        return Image.fromarray(lut.round().astype(np.uint8)[array], "L")
    values = array.astype(np.float32)
    finite = np.isfinite(values)
    values[~finite] = 0
    low, high = (float(values[finite].min()), float(values[finite].max())) if finite.any() else (0.0, 0.0)
    if high <= low:
        return Image.fromarray(np.zeros(values.shape, np.uint8), "L")
    values -= low
    values *= 255.0 / (high - low)
    return Image.fromarray(np.rint(values, out=values).astype(np.uint8), "L")


def to_rgb(image: Image.Image) -> Image.Image:
    """Convert any Pillow mode to RGB: transparency onto white, 16-bit and float scaled to 8 bits."""
    if image.mode == "RGB":
        return image
    if image.mode in (*_SIXTEEN_BIT, "I", "F"):
        return _scaled_to_8_bits(image).convert("RGB")
    if image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")
    if image.mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")  # L, 1, P, CMYK, YCbCr, LAB, HSV


def _orientation(image: Image.Image) -> int:
    """The EXIF orientation tag (1 when absent or unreadable). Pillow's PNG ``getexif`` loads the
    whole image, so a truncated PNG fails here: that is a reject, raised as such by the caller."""
    try:
        value = image.getexif().get(0x0112, 1)
    except (SyntaxError, ValueError, KeyError, TypeError, struct_error):  # a corrupt EXIF block alone
        return 1
    return value if isinstance(value, int) and 1 <= value <= 8 else 1


def prepare_image(data: Any, *, max_tokens: int, grid: VisionGrid = QWEN2_VL_GRID, keep_aspect: bool = True,
                  max_pixels: int = DEFAULT_MAX_PIXELS) -> PreparedImage:
    """Validate, decode, orient, convert to RGB and resize ``data`` for a vision-language model.

    Raises :class:`ImageRejected` with a short reason for anything unusable: any bytes at all, and
    any value that is not bytes, end as a prepared image or a reason, never another exception.
    """
    with _pixel_limit():
        try:
            return _prepare(data, max_tokens, grid, keep_aspect, max_pixels)
        except ImageRejected:
            raise
        except Exception as exc:  # whatever Pillow or numpy raise for one file: that file's reason
            raise ImageRejected(reason_for(exc)) from None


def _prepare(data: Any, max_tokens: int, grid: VisionGrid, keep_aspect: bool, max_pixels: int) -> PreparedImage:
    image = open_checked(data, max_pixels)
    source_format, source_mode, source_size = image.format, image.mode, image.size
    oriented_w, oriented_h = source_size
    orientation = _orientation(image)
    if orientation in (5, 6, 7, 8):  # these rotate by 90 degrees: width and height swap
        oriented_w, oriented_h = oriented_h, oriented_w
    target = fit_size(oriented_w, oriented_h, max_tokens, grid, keep_aspect)
    if getattr(image, "n_frames", 1) > 1:
        image.seek(0)  # animated GIF/WebP/TIFF: the first frame
    if image.format in ("JPEG", "MPO"):
        # Draft mode decodes a JPEG at 1/2, 1/4 or 1/8 scale straight from its DCT
        # coefficients: far less work when the target is much smaller than the photo.
        draft_size = (target[1], target[0]) if oriented_w != source_size[0] else target
        image.draft("RGB", draft_size)
    image.load()
    if orientation != 1:
        image = ImageOps.exif_transpose(image) or image
    image = to_rgb(image)
    if image.size != target:
        image = image.resize(target, Image.Resampling.BICUBIC, reducing_gap=3.0)
    return PreparedImage(image=image, source_format=source_format, source_mode=source_mode,
                         source_size=source_size, vision_tokens=grid.tokens(*target))
