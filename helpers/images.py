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

import io
import math
import warnings
from dataclasses import dataclass

import numpy as np
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


def open_checked(data: bytes, max_pixels: int = DEFAULT_MAX_PIXELS) -> Image.Image:
    """Open ``data`` lazily, refusing empty input, non-images, unsupported formats and bombs."""
    if not data:
        raise ImageRejected("empty file")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise ImageRejected("too many pixels (decompression bomb refused before decoding)") from None
    except UnidentifiedImageError:
        raise ImageRejected("not an image") from None
    except Exception as exc:  # Pillow raises assorted errors on malformed headers
        raise ImageRejected(f"corrupt header ({type(exc).__name__}: {exc})") from None
    if image.format not in ALLOWED_FORMATS:
        raise ImageRejected(f"unsupported format {image.format}")
    width, height = image.size
    if width * height > max_pixels:
        raise ImageRejected(f"too many pixels ({width}x{height} > {max_pixels:,})")
    if width < 1 or height < 1:
        raise ImageRejected(f"empty image ({width}x{height})")
    return image


def to_rgb(image: Image.Image) -> Image.Image:
    """Convert any Pillow mode to RGB: transparency onto white, 16-bit and float scaled to 8 bits."""
    if image.mode == "RGB":
        return image
    if image.mode in ("I;16", "I;16B", "I;16L", "I", "F"):
        array = np.asarray(image, dtype=np.float64)
        low, high = float(array.min()), float(array.max())
        scaled = np.zeros_like(array) if high <= low else (array - low) * (255.0 / (high - low))
        return Image.fromarray(scaled.round().astype(np.uint8), "L").convert("RGB")
    if image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")
    if image.mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")  # L, 1, P, CMYK, YCbCr, LAB, HSV


def prepare_image(data: bytes, *, max_tokens: int, grid: VisionGrid = QWEN2_VL_GRID, keep_aspect: bool = True,
                  max_pixels: int = DEFAULT_MAX_PIXELS) -> PreparedImage:
    """Validate, decode, orient, convert to RGB and resize ``data`` for a vision-language model.

    Raises :class:`ImageRejected` with a short reason for anything unusable.
    """
    image = open_checked(data, max_pixels)
    source_format, source_mode, source_size = image.format, image.mode, image.size
    oriented_w, oriented_h = source_size
    orientation = image.getexif().get(0x0112, 1)
    if orientation in (5, 6, 7, 8):  # these rotate by 90 degrees: width and height swap
        oriented_w, oriented_h = oriented_h, oriented_w
    target = fit_size(oriented_w, oriented_h, max_tokens, grid, keep_aspect)
    try:
        if getattr(image, "n_frames", 1) > 1:
            image.seek(0)  # animated GIF/WebP/TIFF: the first frame
        if image.format in ("JPEG", "MPO"):
            # Draft mode decodes a JPEG at 1/2, 1/4 or 1/8 scale straight from its DCT
            # coefficients: far less work when the target is much smaller than the photo.
            draft_size = (target[1], target[0]) if oriented_w != source_size[0] else target
            image.draft("RGB", draft_size)
        image.load()
    except Image.DecompressionBombError:
        raise ImageRejected("too many pixels (decompression bomb refused before decoding)") from None
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        message = str(exc)
        reason = "truncated file" if "truncated" in message.lower() else f"corrupt data ({message})"
        raise ImageRejected(reason) from None
    image = ImageOps.exif_transpose(image) or image
    image = to_rgb(image)
    if image.size != target:
        image = image.resize(target, Image.Resampling.BICUBIC, reducing_gap=3.0)
    return PreparedImage(image=image, source_format=source_format, source_mode=source_mode,
                         source_size=source_size, vision_tokens=grid.tokens(*target))
