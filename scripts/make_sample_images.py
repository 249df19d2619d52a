"""Write ``helpers/sample_data/sample-000000.tar``: the bundled sample for the captioning notebook.

One webdataset shard in BLIP3o's layout (``<key>.jpg`` members): scikit-image's public-domain photos,
awkward but valid variants (EXIF-rotated, CMYK, transparent PNG, 16-bit PNG, an animated GIF, corrupt
EXIF) and broken files (truncated, empty, not an image, a decompression bomb), each on its own row.
Every byte is reproducible: a test regenerates the shard and fails if the committed copy drifts.

Run: ``python scripts/make_sample_images.py`` (``--check`` compares instead of writing).
"""

from __future__ import annotations

import argparse
import io
import struct
import sys
import tarfile
import zlib
from importlib import resources
from pathlib import Path

import numpy as np
from PIL import Image
from skimage import data as sk

OUT = Path(__file__).resolve().parents[1] / "helpers" / "sample_data" / "sample-000000.tar"
PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "camera", "hubble_deep_field", "immunohistochemistry",
          "page", "coins", "horse", "retina", "moon")


def _saved(image: Image.Image, fmt: str, **kwargs) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **kwargs)
    return buffer.getvalue()


def _jpeg(array: np.ndarray, **kwargs) -> bytes:
    return _saved(Image.fromarray(array), "JPEG", quality=90, **kwargs)


def _uint8(a: np.ndarray) -> np.ndarray:
    a = a.astype(np.uint8) * 255 if a.dtype == bool else a
    a = (255 * (a - a.min()) / max(1e-9, float(a.max() - a.min()))).astype(np.uint8) if a.dtype != np.uint8 else a
    return a[:, :, :3] if a.ndim == 3 else a


def _png_chunk(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))


def files() -> dict[str, bytes]:
    """The sample as ``{key: bytes}``: real photos, awkward but valid variants, and broken files."""
    out = {name: _jpeg(_uint8(getattr(sk, name)())) for name in PHOTOS}
    exif = Image.Exif()
    exif[0x0112] = 6  # stored sideways: "rotate 90 degrees clockwise to display"
    out["chelsea_exif_rotated"] = _jpeg(np.rot90(sk.chelsea(), k=1).copy(), exif=exif.tobytes())
    out["coffee_cmyk"] = _saved(Image.fromarray(sk.coffee()).convert("CMYK"), "JPEG")
    rgba = np.dstack([sk.rocket(), np.full(sk.rocket().shape[:2], 128, np.uint8)])
    out["rocket_transparent_png"] = _saved(Image.fromarray(rgba, "RGBA"), "PNG")
    out["camera_16bit_png"] = _saved(Image.fromarray(sk.camera().astype(np.uint16) * 257), "PNG")
    out["animated_gif"] = (resources.files("skimage") / "data" / "no_time_for_that_tiny.gif").read_bytes()
    upright = Image.Exif()
    upright[0x0112] = 1
    horse = _jpeg(np.asarray(Image.fromarray(_uint8(sk.horse())).convert("RGB")), exif=upright.tobytes())
    at = horse.find(b"Exif\x00\x00") + 14  # garbage in the EXIF block of a good JPEG (found by fuzzing)
    out["horse_corrupt_exif"] = horse[:at] + b"\xff\x00\x13\x37" * 4 + horse[at + 16:]
    out["broken_truncated"] = out["astronaut"][: len(out["astronaut"]) // 3]
    out["broken_empty"] = b""
    out["broken_not_an_image"] = b"<html><body>404 Not Found</body></html>"
    out["broken_bomb"] = (b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", struct.pack(">IIBBBBB", 100_000, 100_000, 8, 0, 0, 0, 0))
                          + _png_chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + _png_chunk(b"IEND", b""))  # 10^10 pixels claimed
    out["broken_truncated_png"] = out["rocket_transparent_png"][: len(out["rocket_transparent_png"]) // 2]
    webp = _saved(Image.fromarray(sk.coffee()), "WEBP", quality=80)
    out["broken_truncated_webp"] = webp[: len(webp) // 2]
    return out


def shard(members: dict[str, bytes]) -> bytes:
    """``members`` (``{name: bytes}``) as a tar file, the same bytes every time."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, payload in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(payload), 0
            tar.addfile(info, io.BytesIO(payload))
    return buffer.getvalue()


def render() -> bytes:
    return shard({f"{key}.jpg": payload for key, payload in files().items()})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the committed file differs")
    args = parser.parse_args()
    content = render()
    if args.check:
        if not OUT.is_file() or OUT.read_bytes() != content:
            print(f"{OUT} is out of date: run python scripts/make_sample_images.py")
            return 1
        return 0
    OUT.write_bytes(content)
    print(f"wrote {OUT} ({len(content):,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
