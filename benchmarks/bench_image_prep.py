"""Image preparation speed: the kit's helpers vs Ray's captioning tutorial's approach, per core.

Ray's captioning tutorial opens each image and resizes it to 225x225 with BICUBIC (``Image.open(...).convert("RGB")
.resize((225, 225), BICUBIC)``). The kit validates, decodes (JPEG in draft mode when shrinking),
applies EXIF orientation, converts to RGB and resizes to the model's grid
(``helpers.images.prepare_image`` with a 64-token budget, about the same pixel count as 225x225).

Both run in one process on the same in-memory corpus of mixed sizes (0.3 to 12 megapixels) and
formats, in the same run, so the ratio is meaningful on a shared, noisy machine; absolute rates are
printed for context only. Run: ``python benchmarks/bench_image_prep.py`` (``--images``, ``--repeats``).
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np
from PIL import Image

from helpers.images import prepare_image

SIZES = [(640, 480), (1280, 960), (2048, 1536), (3000, 2000), (4000, 3000)]  # 0.3 to 12 megapixels
FORMATS = ["JPEG", "JPEG", "JPEG", "PNG", "WEBP"]  # mostly JPEG, as in web-scraped image sets


def corpus(n: int, seed: int = 0) -> list[tuple[str, tuple[int, int], bytes]]:
    """``n`` photo-like images (smooth gradients plus noise), cycling through sizes and formats."""
    rng = np.random.default_rng(seed)
    items = []
    for i in range(n):
        width, height = SIZES[i % len(SIZES)]
        fmt = FORMATS[(i // len(SIZES)) % len(FORMATS)]
        x = np.linspace(0, 255, width)[None, :, None]
        y = np.linspace(0, 255, height)[:, None, None]
        base = (x * [1.0, 0.3, 0.6] + y * [0.2, 0.9, 0.4]) / 1.3
        noise = rng.normal(0, 12, (height, width, 3))
        array = np.clip(base + noise, 0, 255).astype(np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(array).save(buffer, fmt, **({"quality": 90} if fmt in ("JPEG", "WEBP") else {}))
        items.append((fmt, (width, height), buffer.getvalue()))
    return items


def tutorial_approach(data: bytes) -> Image.Image:
    return Image.open(io.BytesIO(data)).convert("RGB").resize((225, 225), Image.Resampling.BICUBIC)


def kit_approach(data: bytes) -> Image.Image:
    return prepare_image(data, max_tokens=64).image


def rate(fn: Callable[[bytes], Image.Image], items: list[bytes], repeats: int) -> float:
    """Best-of-``repeats`` images per second for ``fn`` over ``items``, in this one process."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        for data in items:
            fn(data)
        times.append(time.perf_counter() - started)
    return len(items) / min(times)


def machine() -> str:
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    return f"{platform.machine()}, {os.cpu_count()} cores, {model or 'unknown CPU'}, Python {platform.python_version()}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=50, help="corpus size (default 50)")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes; the best counts (default 3)")
    args = parser.parse_args(argv)
    items = corpus(args.images)
    print(f"machine: {machine()}")
    megapixels = [w * h / 1e6 for _, (w, h), _ in items]
    print(f"corpus: {len(items)} images, {min(megapixels):.1f}-{max(megapixels):.1f} MP "
          f"(median {statistics.median(megapixels):.1f}), formats {sorted(set(f for f, _, _ in items))}")
    rows = [("all", [d for _, _, d in items])]
    rows += [(fmt, [d for f, _, d in items if f == fmt]) for fmt in sorted({f for f, _, _ in items})]
    print(f"{'subset':<8} {'images':>6} {'tutorial img/s':>11} {'kit img/s':>10} {'kit/tutorial':>9}")
    for name, subset in rows:
        tutorial_rate, kit_rate = rate(tutorial_approach, subset, args.repeats), rate(kit_approach, subset, args.repeats)
        print(f"{name:<8} {len(subset):>6} {tutorial_rate:>11.1f} {kit_rate:>10.1f} {kit_rate / tutorial_rate:>8.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
