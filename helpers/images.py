"""The captioning notebook's images. One image: what would crash or hang a run (empty files,
non-images, unsupported formats, bombs, truncated or corrupt data) refused with a short reason; the
rest decoded (a truncated JPEG is caught here, not mid-inference), oriented, made RGB and resized to
the vision encoder's grid, with Pillow, as vLLM and Hugging Face processors use it. The input: checked
before anything starts, and read from a folder, a bucket or ``hf://`` in one of three layouts
(``INPUT_FORMAT``): ``webdataset`` (``.tar`` shards, as BLIP3o ships), ``parquet`` (image bytes or
the Hugging Face ``{bytes, path}`` struct) and ``images`` (a folder of files: a stray one is rejected,
not skipped); or ``huggingface``, what ``datasets.load_dataset`` streams. Then the results, on a grid."""

from __future__ import annotations

import contextlib
import functools
import io
import math
import posixpath
import re
import tarfile
import textwrap
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from struct import error as struct_error
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.dataset as pads
import pyarrow.parquet as pq
from PIL import Image, ImageOps, UnidentifiedImageError

from helpers import storage
from helpers.parameters import ParameterError, flag, number_in, positive_int, raise_if, text
from helpers.pipeline import REJECT_REASON, ROW_ID, check_ids, first_rows

#: Formats the kit accepts (Pillow's names). MPO is what many cameras write for JPEGs.
ALLOWED_FORMATS = frozenset({"JPEG", "MPO", "PNG", "WEBP", "GIF", "BMP", "TIFF"})
#: Refuse images above this many pixels before decoding them (a 12 MP photo is 12_000_000).
DEFAULT_MAX_PIXELS = 50_000_000
#: Pixels per vision token along each side: Qwen2-VL and Qwen2.5-VL merge 14-pixel patches 2 x 2.
TOKEN_PIXELS = 28


def vision_tokens(width: int, height: int, factor: int = TOKEN_PIXELS) -> int:
    """Vision tokens for an image of this size (already a multiple of ``factor``)."""
    return (width // factor) * (height // factor)


def fit_size(width: int, height: int, max_tokens: int, keep_aspect: bool = True, factor: int = TOKEN_PIXELS) -> tuple[int, int]:
    """Target size: multiples of ``factor``, at most ``max_tokens`` vision tokens, the aspect kept (else
    the largest square within the budget), never scaled up past the original."""
    if width < 1 or height < 1:
        raise ValueError(f"image size must be positive, got {width}x{height}")
    if max_tokens < 1:
        raise ValueError("max_tokens must be >= 1")
    if not keep_aspect:
        side = max(1, math.isqrt(max_tokens))
        return side * factor, side * factor
    scale = min(1.0, math.sqrt(max_tokens * factor * factor / (width * height)))
    while True:  # the largest scale whose rounded grid fits the budget
        cols, rows = max(1, round(width * scale / factor)), max(1, round(height * scale / factor))
        if cols * rows <= max_tokens or (cols == 1 and rows == 1):
            return cols * factor, rows * factor
        scale *= 0.98


class ImageRejected(ValueError):
    """The input cannot be used; the message says why in a few words."""


@dataclass(frozen=True)
class PreparedImage:
    image: Image.Image
    source_format: str
    source_size: tuple[int, int]
    vision_tokens: int


def reason_for(exc: BaseException, part: str = "data") -> str:
    """A short, human reason for an exception raised while reading one image."""
    if isinstance(exc, ImageRejected):
        return str(exc)
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


def _scaled_to_8_bits(image: Image.Image) -> Image.Image:
    """A 16-bit, 32-bit integer or float greyscale image stretched to 0-255, through one float32 copy
    scaled in place (never float64: a 50-megapixel scan stays at 200 MB)."""
    values = np.asarray(image).astype(np.float32)
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
    if image.mode in ("I", "F") or image.mode.startswith("I;16"):  # I;16, I;16B, I;16L, I;16N
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


def prepare_image(data: Any, *, max_tokens: int, keep_aspect: bool = True, max_pixels: int = DEFAULT_MAX_PIXELS) -> PreparedImage:
    """``data`` validated, decoded, oriented, made RGB and resized; anything unusable (any bytes at all,
    any value that is not bytes) raises :class:`ImageRejected` with a short reason, nothing else."""
    # Pillow refuses images over twice its own limit (~89 MP) whatever MAX_PIXELS allows: for this
    # image, open_checked's check of max_pixels (from the header, before decoding) is the only one.
    previous, Image.MAX_IMAGE_PIXELS = Image.MAX_IMAGE_PIXELS, None
    try:
        return _prepare(data, max_tokens, keep_aspect, max_pixels)
    except ImageRejected:
        raise
    except Exception as exc:  # whatever Pillow or numpy raise for one file: that file's reason
        raise ImageRejected(reason_for(exc)) from None
    finally:
        Image.MAX_IMAGE_PIXELS = previous


def _prepare(data: Any, max_tokens: int, keep_aspect: bool, max_pixels: int) -> PreparedImage:
    image = open_checked(data, max_pixels)
    source_format, source_size = image.format, image.size
    oriented_w, oriented_h = source_size
    orientation = _orientation(image)
    if orientation in (5, 6, 7, 8):  # these rotate by 90 degrees: width and height swap
        oriented_w, oriented_h = oriented_h, oriented_w
    target = fit_size(oriented_w, oriented_h, max_tokens, keep_aspect)
    if getattr(image, "n_frames", 1) > 1:
        image.seek(0)  # animated GIF/WebP/TIFF: the first frame
    if image.format in ("JPEG", "MPO"):
        # Draft mode decodes a JPEG at 1/2, 1/4 or 1/8 scale: far less work for a small target.
        draft_size = (target[1], target[0]) if oriented_w != source_size[0] else target
        image.draft("RGB", draft_size)
    image.load()
    if orientation != 1:
        image = ImageOps.exif_transpose(image) or image
    image = to_rgb(image)
    if image.size != target:
        image = image.resize(target, Image.Resampling.BICUBIC, reducing_gap=3.0)
    return PreparedImage(image, source_format, source_size, vision_tokens(*target))


FORMATS = ("webdataset", "parquet", "images", "huggingface")
SOURCE, IMAGE, IMAGE_BYTES = "source", "image", "image_bytes"
SAMPLE_ID = "sample_id"  # a webdataset sample's shard (its path under INPUT_PATH) and key
ROW_HASH = "row_hash"  # Ray's hash of a parquet row's file and position
ROW_NUMBER = "row_number"  # a datasets row's place in its dataset's order (huggingface, without ID_COLUMN)
#: The columns every result row keeps of its image (never the image itself).
KEPT = (SOURCE, "width", "height", "vision_tokens")


@dataclass(frozen=True)
class ImageInput:
    """What the notebook reads: the path, its layout, the field holding the image, the column each
    image is told apart by (and resumed on), and how many images there are (None: not known)."""

    path: str
    fs: Any
    format: str
    image_column: str
    id_column: str | None  # ID_COLUMN (parquet and huggingface only)
    rows: int | None
    rows_basis: str
    dataset: Any = None  # huggingface: the datasets.Dataset or IterableDataset, its images left undecoded

    @property
    def shown(self) -> str:
        return storage.redact(self.path)

    @property
    def source_id(self) -> str:
        """The column that identifies an image in the source as read: what resuming keys on."""
        if self.format == "huggingface":  # webdataset samples by shard and key, as that layout names them
            shards = {"__key__", "__url__"} <= set(self.dataset.features or {})
            return self.id_column or (SAMPLE_ID if shards else ROW_NUMBER)
        return {"webdataset": SAMPLE_ID, "images": "path", "parquet": self.id_column or ROW_HASH}[self.format]

    @property
    def kept(self) -> list[str]:
        return [*KEPT, self.source_id]


def detect_format(files: list[str]) -> str:
    """The layout ``files`` (as :func:`helpers.storage.list_files` lists them) are in."""
    suffixes = {Path(n.split("?")[0]).suffix.lower() for n in files}
    if suffixes and suffixes <= {".tar"}:
        return "webdataset"
    if suffixes and suffixes <= {".parquet"}:
        return "parquet"
    if suffixes & {".tar", ".parquet"}:
        raise ValueError(f"INPUT_PATH mixes .tar or .parquet files with others ({sorted(suffixes)}); set INPUT_FORMAT "
                         f"to one of {FORMATS}, or point INPUT_PATH at one kind")
    return "images"


def count_images(files: list[str], layout: str, fs=None) -> tuple[int | None, str]:
    """Images counted (files, parquet footers) or estimated (the first shard's first 8 MiB)."""
    try:
        if layout == "images":
            return len(files), f"counted: {len(files)} files"
        filesystem, wheres = storage.resolve(files[0], fs)[0], [storage.resolve(f, fs)[1] for f in files]
        if layout == "parquet":
            return pads.dataset(wheres, filesystem=filesystem, format="parquet").count_rows(), "counted: parquet footers"
        head, keys, end = storage.read_head(files[0], 8 << 20, fs), set(), 0
        with contextlib.suppress(tarfile.ReadError, EOFError), tarfile.open(fileobj=io.BytesIO(head), mode="r|") as tar:
            for member in tar:  # whole samples only: the read may stop inside one
                if member.isfile() and member.offset_data + member.size <= len(head):
                    keys.add(member.name.rsplit(".", 1)[0])
                    end = member.offset_data + member.size
        sizes = sum(i.size or 0 for i in filesystem.get_file_info(wheres))
        if not keys:
            return None, "no whole sample in the first shard's first 8 MiB"
        if len(files) == 1 and len(head) >= sizes:
            return len(keys), f"counted: {len(keys)} samples"
        return round(sizes * len(keys) / end), f"estimated from the first {end:,} bytes of {len(files)} shards"
    except Exception as exc:  # a size is a nicety, never a reason to stop
        return None, f"could not be sized ({type(exc).__name__})"


def huggingface_input(given: Any, image_column: str, id_column: str | None) -> ImageInput:
    """A ``datasets`` dataset, or the "train" split ``datasets.load_dataset`` streams of ``given`` (a Hub id, a
    local folder, or a file: its folder and name), its images left undecoded: the kit decodes each once, and a
    broken one is a reject (``datasets`` raises mid-stream). Counted if in memory, else as its card says."""
    import datasets

    if isinstance(given, (datasets.Dataset, datasets.IterableDataset)):
        named = [given.info.dataset_name or "in memory", *([str(given.split)] if given.split else [])]
        dataset, path = given, f"datasets.{type(given).__name__}({', '.join(named)})"
    elif not isinstance(given, str):
        raise_if([f"INPUT_PATH is a {type(given).__name__}: pass one split of it, such as dataset['train']"])
    else:
        local = Path(given).expanduser().resolve()
        path = str(local) if local.exists() else given
        kwargs = {"path": str(local.parent), "data_files": local.name} if local.is_file() else {"path": path}
        try:
            dataset = datasets.load_dataset(**kwargs, split="train", streaming=True)
        except Exception as exc:  # what datasets could not find or reach
            call = ", ".join(f"{k}={v!r}" for k, v in {**kwargs, "split": "train", "streaming": True}.items())
            raise_if([f"INPUT_PATH={storage.redact(path)!r}: datasets.load_dataset({call}) failed: "
                      f"{type(exc).__name__}: {str(exc)[:500]}"])
    for name, feature in (dataset.features or {}).items():
        if isinstance(feature, datasets.Image):
            dataset = dataset.cast_column(name, datasets.Image(decode=False))
    if id_column is not None and dataset.features and id_column not in dataset.features:
        raise_if([f"ID_COLUMN={id_column!r} is not a column of {path}; its columns: {list(dataset.features)}"])
    if isinstance(dataset, datasets.Dataset):
        rows, basis = len(dataset), f"counted: {len(dataset)} rows"
    else:  # streaming: the size its card gives, if any
        rows = getattr((dataset.info.splits or {}).get(str(dataset.split)), "num_examples", None) or None
        basis = "as its card says" if rows else "streaming: not counted"
    print(f"input: {storage.redact(path)} (huggingface; {basis})")
    return ImageInput(path, None, "huggingface", image_column, id_column, rows, basis, dataset)


def image_input(input_path: Any, input_format: Any, image_column: Any, id_column: Any) -> ImageInput:
    """``INPUT_PATH`` (None: the bundled sample; a ``datasets`` dataset is read as huggingface) checked with
    ``INPUT_FORMAT``, ``IMAGE_COLUMN`` and ``ID_COLUMN`` (parquet and huggingface only, and a column there);
    raise listing every problem."""
    passed = type(input_path).__module__.split(".")[0] == "datasets"
    found = ([] if passed else text("INPUT_PATH", input_path, optional=True)) + text("IMAGE_COLUMN", image_column)
    found += text("ID_COLUMN", id_column, optional=True)
    if input_format not in ("auto", *FORMATS):
        found.append("INPUT_FORMAT must be auto, webdataset, parquet or images, or huggingface (what "
                     f"datasets.load_dataset reads), got {input_format!r}")
    elif passed and input_format not in ("auto", "huggingface"):
        found.append(f"INPUT_PATH is a datasets {type(input_path).__name__}: set INPUT_FORMAT to 'huggingface' or 'auto'")
    raise_if(found)
    if passed or input_format == "huggingface":
        return huggingface_input(str(sample_path()) if input_path is None else input_path, image_column, id_column)
    try:
        path = str(sample_path()) if input_path is None else storage.absolute(input_path)
        fs = storage.filesystem(path)
        files = storage.list_files(path, fs)
        layout = input_format if input_format != "auto" else detect_format(files)
        if id_column is not None and layout != "parquet":
            found.append(f"ID_COLUMN={id_column!r} applies to parquet input only; this input is {layout}, where each "
                         "image's id is its shard and key or its file path: set ID_COLUMN=None")
        elif id_column is not None:
            filesystem, where = storage.resolve(files[0], fs)
            if id_column not in (columns := pq.read_schema(where, filesystem=filesystem).names):
                found.append(f"ID_COLUMN={id_column!r} is not a column of {storage.redact(path)}; its columns: {columns}")
    except (OSError, ValueError) as exc:
        raise ParameterError(f"Invalid parameters:\n  - {exc}") from None
    raise_if(found)
    rows, basis = count_images(files, layout, fs)
    print(f"input: {storage.redact(path)} ({layout}; {basis})")
    return ImageInput(path, fs, layout, image_column, id_column, rows, basis)


def check_prompt(prompt: Any, max_tokens: Any, temperature: Any, image_tokens: Any, keep_aspect: Any, max_pixels: Any) -> None:
    raise_if(text("PROMPT", prompt) + positive_int("MAX_TOKENS", max_tokens) + number_in("TEMPERATURE", temperature, 0, 2)
             + number_in("IMAGE_TOKENS", image_tokens, 1, 16384) + flag("KEEP_ASPECT", keep_aspect) + positive_int("MAX_PIXELS", max_pixels))


def _fields(spec: str) -> tuple[str, ...]:
    """``IMAGE_COLUMN``'s alternatives, webdataset's notation: ``"jpg;png"``."""
    return tuple(f.strip().lower() for f in spec.split(";") if f.strip())


def _present(value: Any) -> bool:
    """A value, not a null; a Hugging Face image struct with its bytes or a path."""
    if isinstance(value, dict):
        return _present(value.get("bytes")) or _present(value.get("path"))
    return value is not None and value is not pd.NA and not (isinstance(value, float) and np.isnan(value))


def image_value(value: Any, field: str, read_path: Callable[[str], tuple[bytes, str]] | None = None) -> tuple[bytes, str]:
    """A row's image bytes and "", or b"" and why there are none. Plain bytes, or the Hugging Face struct
    with its bytes embedded or a ``path`` to read (as ``datasets`` writes a local dataset)."""
    if isinstance(value, dict):
        value, path = value.get("bytes"), value.get("path")
        if not _present(value) and _present(path) and path and read_path is not None:
            return read_path(str(path))
    if not _present(value):
        return b"", f"no {field!r} value in this row"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value), ""
    if isinstance(value, np.ndarray) and value.dtype == np.uint8 and value.ndim == 1:
        return value.tobytes(), ""
    if isinstance(value, Image.Image):  # decoded by a datasets dataset of unknown features: kept lossless
        value.save(buffer := io.BytesIO(), "TIFF", compression="tiff_adobe_deflate")
        return buffer.getvalue(), ""
    return b"", f"not image bytes (the {field!r} value is a {type(value).__name__})"


def image_values(batch: pd.DataFrame, spec: str, readers: list | None = None) -> list[tuple[bytes, str]]:
    """:func:`image_value` of each row's first field of ``spec`` that holds one (case ignored)."""
    wanted = _fields(spec)
    columns = sorted((c for c in batch.columns if str(c).lower() in wanted), key=lambda c: wanted.index(str(c).lower()))
    out = []
    for i, row in enumerate(batch[columns].to_dict("records") if columns else [{}] * len(batch)):
        name = next((c for c in columns if _present(row[c])), None)
        out.append(image_value(row[name] if name else None, name or spec, readers[i] if readers else None))
    return out


def _rows(ids: list[str], sources: list[str], pairs: list[tuple[bytes, str]]) -> pd.DataFrame:
    return pd.DataFrame({ROW_ID: ids, SOURCE: sources, IMAGE_BYTES: [b for b, _ in pairs], REJECT_REASON: [r for _, r in pairs]})


def relative_shard(url: str, root: str) -> str:
    """The shard's path under ``root`` (``INPUT_PATH``), or its name when ``root`` is the shard. Keys
    repeat across shards and shard names across folders, so this and the key identify a sample."""
    shard, top = (p.split("://", 1)[-1].strip("/") for p in (url, root))
    if shard == top or not top:
        return shard.rsplit("/", 1)[-1]
    return shard[len(top) + 1:] if shard.startswith(top + "/") else shard


def _decode(sample: dict[str, Any], root: str) -> dict[str, Any]:
    """Webdataset decoder: every field's bytes as they are (decoding happens in :func:`prepare_batch`,
    where a failure is a reason), and the sample's id."""
    return {**sample, SAMPLE_ID: f"{relative_shard(str(sample.get('__url__') or ''), root)}/{sample.get('__key__')}"}


def _from_webdataset(batch: pd.DataFrame, image_column: str) -> pd.DataFrame:
    ids, keys = batch[SAMPLE_ID].astype(str).tolist(), batch["__key__"].astype(str).tolist()
    sources = [f"{i[: -len(k) - 1]}:{k}" for i, k in zip(ids, keys)]
    return _rows(ids, sources, image_values(batch, image_column)).assign(**{SAMPLE_ID: ids})


def _reader(parquet_file: str, filesystem) -> Callable[[str], tuple[bytes, str]]:
    def read(image_path: str) -> tuple[bytes, str]:
        where = image_path if image_path.startswith("/") else posixpath.join(posixpath.dirname(parquet_file), image_path)
        try:
            with filesystem.open_input_stream(where) as f:
                return f.read(), ""
        except Exception as exc:  # that row's reason, never the run's
            return b"", f"the image file {image_path!r} this row names could not be read ({type(exc).__name__})"
    return read


def _from_parquet(batch: pd.DataFrame, image_column: str, id_column: str | None, root: str, filesystem) -> pd.DataFrame:
    fs = storage.resolve(root, filesystem)[0]
    pairs = image_values(batch, image_column, [_reader(str(p), fs) for p in batch["path"]])
    ids = batch[id_column].astype(str).tolist() if id_column else [f"{int(h):016x}" for h in batch[ROW_HASH]]
    out = _rows(ids, [f"{Path(str(p)).name}:{i}" for p, i in zip(batch["path"], ids)], pairs)
    kept = id_column or ROW_HASH
    out[kept] = batch[kept].to_numpy()
    return out


def _from_huggingface(batch: pd.DataFrame, image_column: str, source_id: str, root: str) -> pd.DataFrame:
    if source_id == SAMPLE_ID:  # the webdataset layout's ids; a Hub shard by its path in the repository
        urls = [re.sub(r"^hf://datasets/[^/]+/[^/@]+(@[^/]+)?/", "", str(u)) for u in batch["__url__"]]
        ids = [f"{relative_shard(u, root)}/{k}" for u, k in zip(urls, batch["__key__"])]
        return _from_webdataset(batch.assign(**{SAMPLE_ID: ids}), image_column)
    ids, local = batch[source_id].astype(str).tolist(), _reader("/", storage.resolve("/")[0])  # ID_COLUMN or number
    pairs = image_values(batch, image_column, [local] * len(batch))  # a path without bytes: imagefolder's files
    return _rows(ids, [f"row:{i}" for i in ids], pairs).assign(**{source_id: batch[source_id].to_numpy()})


def _stream(_: Any, dataset: Any) -> Iterator[pd.DataFrame]:
    """A ``datasets`` dataset's rows, numbered in its order, in one task, as Ray reads a streaming one; but not
    with ``ray.data.from_huggingface``: that asks the Hub for parquet files first, local data too (offline it
    raises), and reads Arrow batches, which ``datasets`` 5.2 gives a webdataset shard's last sample in another
    column order (ArrowInvalid)."""
    done = 0
    for batch in dataset.iter(batch_size=256):
        yield (frame := pd.DataFrame(batch)).assign(**{ROW_NUMBER: range(done, done + len(frame))})
        done += len(frame)


def _from_files(batch: pd.DataFrame) -> pd.DataFrame:
    paths = [str(p) for p in batch["path"]]
    return _rows(paths, [Path(p).name for p in paths], image_values(batch, "bytes")).assign(path=paths)


def read(source: ImageInput, *, num_blocks: int, num_cpus: float, limit: int | None = None, check_rows: int = 20):
    """Rows ``{row_id, source, image_bytes, reject_reason, <source id>}`` of ``source``, the first
    ``limit`` in file order; a layout wrong as a whole (none of the first rows has the image field) and
    empty or repeated ``ID_COLUMN`` values stop here."""
    import ray

    common = {"num_cpus": num_cpus, "filesystem": source.fs, "override_num_blocks": num_blocks}
    if source.format == "webdataset":
        ds = ray.data.read_webdataset(source.path, decoder=functools.partial(_decode, root=source.path), include_paths=True, **common)
        fn, kwargs = _from_webdataset, {"image_column": source.image_column}
    elif source.format == "parquet":
        ds = ray.data.read_parquet(source.path, include_paths=True, include_row_hash=not source.id_column, **common)
        fn, kwargs = _from_parquet, {"image_column": source.image_column, "id_column": source.id_column,
                                     "root": source.path, "filesystem": source.fs}
    elif source.format == "huggingface":
        ds = ray.data.from_items([0]).map_batches(_stream, fn_kwargs={"dataset": source.dataset}, num_cpus=num_cpus)
        fn, kwargs = _from_huggingface, {"image_column": source.image_column, "source_id": source.source_id,
                                         "root": source.path}
    else:
        ds = ray.data.read_binary_files(source.path, include_paths=True, **common)
        fn, kwargs = _from_files, {}
    first = ds.take(check_rows)
    if not first:
        raise ParameterError(f"INPUT_PATH={source.shown!r} holds no {source.format} rows: nothing to caption.")
    wanted = _fields(source.image_column)
    if source.format != "images" and not any(_present(v) for r in first for k, v in r.items() if str(k).lower() in wanted):
        there = sorted({k for r in first for k, v in r.items() if _present(v) and not k.startswith("__")}
                       - {"path", SAMPLE_ID, ROW_HASH, ROW_NUMBER})
        raise ParameterError(f"none of the first {len(first)} {source.format} rows has a {source.image_column!r} value; "
                             f"they have: {there}. Set IMAGE_COLUMN to the field that holds the image bytes (alternatives "
                             "separated by ';').")
    ds = first_rows(ds.map_batches(fn, fn_kwargs=kwargs, batch_format="pandas", num_cpus=num_cpus), limit)
    if source.id_column:
        check_ids(ds, source.id_column)
    return ds


def prepare_batch(batch: pd.DataFrame, *, max_tokens: int, keep_aspect: bool = True,
                  max_pixels: int = DEFAULT_MAX_PIXELS) -> pd.DataFrame:
    """Each image decoded, checked, oriented, made RGB and resized to at most ``max_tokens`` vision tokens;
    one that cannot be gets a ``reject_reason`` instead. Nothing raises for one row; the raw bytes go."""
    rows = []
    for raw, reason in zip(batch[IMAGE_BYTES], batch[REJECT_REASON] if REJECT_REASON in batch else [""] * len(batch)):
        try:
            if reason:
                raise ImageRejected(reason)
            p = prepare_image(raw, max_tokens=max_tokens, keep_aspect=keep_aspect, max_pixels=max_pixels)
            rows.append((np.asarray(p.image), p.image.width, p.image.height, p.vision_tokens, ""))
        except Exception as exc:  # prepare_image raises only ImageRejected; anything else is one row's too
            rows.append((None, 0, 0, 0, reason_for(exc) or "not an image"))
    out = pd.DataFrame(rows, columns=[IMAGE, "width", "height", "vision_tokens", REJECT_REASON])
    return pd.concat([batch.drop(columns=[IMAGE_BYTES, REJECT_REASON], errors="ignore").reset_index(drop=True), out], axis=1)


def example(image_tokens: int, keep_aspect: bool = True) -> dict[str, Any]:
    """A prepared row holding the largest image the budget allows (black): the longest request."""
    width, height = fit_size(4000, 3000, image_tokens, keep_aspect)
    return {IMAGE: np.zeros((height, width, 3), dtype=np.uint8), "width": width, "height": height,
            "vision_tokens": vision_tokens(width, height)}


def plot_captions(ds, captions: dict[str, str], path, count: int = 20, columns: int = 5, wrap: int = 32):
    """The first ``count`` prepared images, read again as the model saw them, each with its file name and
    its caption (``captions``: by row id). Characters the chart's font cannot draw (an untrained model
    emits them) show as a middle dot, not as boxes that read as an encoding bug."""
    import matplotlib.pyplot as plt
    from matplotlib import font_manager
    from matplotlib.ft2font import FT2Font

    font = FT2Font(font_manager.findfont(font_manager.FontProperties()))
    rows = [r for r in ds.limit(2 * count).take_all() if not r[REJECT_REASON]][:count]
    lines = max(1, -(-len(rows) // columns))
    fig, axes = plt.subplots(lines, columns, figsize=(3.2 * columns, 4.0 * lines), squeeze=False, layout="tight")
    for ax in axes.flat:
        ax.axis("off")
    for ax, row in zip(axes.flat, rows):
        caption = "".join(ch if ch.isprintable() and ch != "\ufffd" and font.get_char_index(ord(ch)) else "·"
                          for ch in captions.get(row[ROW_ID], "(no caption)"))
        ax.imshow(np.asarray(row[IMAGE]))
        ax.set_title(row[SOURCE].split(":")[-1], fontsize=9, fontweight="bold", parse_math=False)  # "$" is text, not math
        ax.text(0.5, -0.04, textwrap.fill(textwrap.shorten(caption, 4 * wrap, placeholder="…"), wrap) or "(empty)",
                transform=ax.transAxes, ha="center", va="top", fontsize=8, parse_math=False)
    fig.savefig(path, dpi=110)
    return fig


def sample_path() -> Path:
    """The bundled sample: one webdataset shard of photos, awkward variants and broken files
    (``scripts/make_sample_images.py`` made it)."""
    return Path(str(resources.files("helpers") / "sample_data" / "sample-000000.tar"))
