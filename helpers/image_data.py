"""The captioning notebook's images: the input checked before anything starts, read in any of three
layouts, each image prepared or rejected with a reason, and the results shown on a grid.

Layouts (``INPUT_FORMAT``): ``webdataset`` (``.tar`` shards of ``<key>.jpg`` and other fields, as
BLIP3o ships), ``parquet`` (an image column of bytes, or the Hugging Face ``{bytes, path}`` struct)
and ``images`` (a folder of files: every file is read, so a stray one is rejected, not skipped).
Every reader streams, locally, from a bucket or from ``hf://``."""

from __future__ import annotations

import functools
import io
import posixpath
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from helpers import images, storage
from helpers.pipeline import REJECT_REASON, ROW_ID, check_ids, first_rows
from helpers.parameters import ParameterError, flag, number_in, positive_int, raise_if, text

FORMATS = ("webdataset", "parquet", "images")
SOURCE, IMAGE, IMAGE_BYTES = "source", "image", "image_bytes"
SAMPLE_ID = "sample_id"  # a webdataset sample's shard (its path under INPUT_PATH) and key
ROW_HASH = "row_hash"  # Ray's hash of a parquet row's file and position
ID_OF = {"webdataset": "its shard and key", "images": "its file path", "parquet": "its file and its row in that file"}
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
    id_column: str | None  # ID_COLUMN (parquet only)
    rows: int | None
    rows_basis: str

    @property
    def shown(self) -> str:
        return storage.redact(self.path)

    @property
    def source_id(self) -> str:
        """The column that identifies an image in the source as read: what resuming keys on."""
        return {"webdataset": SAMPLE_ID, "images": "path", "parquet": self.id_column or ROW_HASH}[self.format]

    @property
    def kept(self) -> list[str]:
        return [*KEPT, self.source_id]


def detect_format(path: str, fs=None) -> str:
    suffixes = {Path(n.split("?")[0]).suffix.lower() for n in storage.list_files(path, fs)}
    if suffixes and suffixes <= {".tar"}:
        return "webdataset"
    if suffixes and suffixes <= {".parquet"}:
        return "parquet"
    if suffixes & {".tar", ".parquet"}:
        raise ValueError(f"{storage.redact(path)!r} mixes .tar or .parquet files with others ({sorted(suffixes)}); "
                         f"set INPUT_FORMAT to one of {FORMATS}, or point INPUT_PATH at one kind")
    return "images"


def count_images(path: str, layout: str, fs=None) -> tuple[int | None, str]:
    """Images counted (files, parquet footers) or estimated (the first shard's first 8 MiB)."""
    try:
        files = storage.list_files(path, fs)
        if layout == "images":
            return len(files), f"counted: {len(files)} files"
        filesystem, _ = storage.resolve(path, fs)
        wheres = [storage.resolve(f, fs)[1] for f in files]
        if layout == "parquet":
            import pyarrow.dataset as pads

            return pads.dataset(wheres, filesystem=filesystem, format="parquet").count_rows(), "counted: parquet footers"
        head = storage.read_head(files[0], 8 << 20, fs)
        keys, end = set(), 0
        try:
            with tarfile.open(fileobj=io.BytesIO(head), mode="r|") as tar:
                for member in tar:
                    if member.isfile() and member.offset_data + member.size <= len(head):
                        keys.add(member.name.rsplit(".", 1)[0])
                        end = member.offset_data + member.size
        except (tarfile.ReadError, EOFError):  # the read stopped inside a member
            pass
        sizes = sum(i.size or 0 for i in filesystem.get_file_info(wheres))
        if not keys:
            return None, "no whole sample in the first shard's first 8 MiB"
        if len(files) == 1 and len(head) >= sizes:
            return len(keys), f"counted: {len(keys)} samples"
        return round(sizes * len(keys) / end), f"estimated from the first {end:,} bytes of {len(files)} shards"
    except Exception as exc:  # a size is a nicety, never a reason to stop
        return None, f"could not be sized ({type(exc).__name__})"


def image_input(input_path: Any, input_format: Any, image_column: Any, id_column: Any) -> ImageInput:
    """``INPUT_PATH`` (None: the bundled sample) checked with ``INPUT_FORMAT``,
    ``IMAGE_COLUMN`` and ``ID_COLUMN`` (parquet only, and a column there); raise listing every problem."""
    found = text("INPUT_PATH", input_path, optional=True) + text("IMAGE_COLUMN", image_column)
    found += text("ID_COLUMN", id_column, optional=True)
    if input_format not in ("auto", *FORMATS):
        found.append(f"INPUT_FORMAT must be auto, webdataset, parquet or images, got {input_format!r}")
    raise_if(found)
    try:
        path = str(sample_path()) if input_path is None else storage.absolute(input_path)
        fs = storage.filesystem(path)
        layout = input_format if input_format != "auto" else detect_format(path, fs)
        if id_column is not None and layout != "parquet":
            found.append(f"ID_COLUMN={id_column!r} applies to parquet input only; this input is {layout}, where each "
                         f"image's id is {ID_OF[layout]}: set ID_COLUMN=None")
        elif id_column is not None:
            import pyarrow.parquet as pq

            filesystem, where = storage.resolve(storage.list_files(path, fs)[0], fs)
            with filesystem.open_input_file(where) as f:
                columns = pq.ParquetFile(f).schema_arrow.names
            if id_column not in columns:
                found.append(f"ID_COLUMN={id_column!r} is not a column of {storage.redact(path)}; its columns: {columns}")
    except (OSError, ValueError) as exc:
        raise ParameterError(f"Invalid parameters:\n  - {exc}") from None
    raise_if(found)
    rows, basis = count_images(path, layout, fs)
    print(f"input: {storage.redact(path)} ({layout}; {basis})")
    return ImageInput(path, fs, layout, image_column, id_column, rows, basis)


def check_prompt(prompt: Any, max_tokens: Any, temperature: Any, image_tokens: Any, keep_aspect: Any, max_pixels: Any) -> None:
    found = text("PROMPT", prompt) + positive_int("MAX_TOKENS", max_tokens) + number_in("TEMPERATURE", temperature, 0, 2)
    found += number_in("IMAGE_TOKENS", image_tokens, 1, 16384) + flag("KEEP_ASPECT", keep_aspect)
    found += positive_int("MAX_PIXELS", max_pixels)
    raise_if(found)


def _fields(spec: str) -> tuple[str, ...]:
    """``IMAGE_COLUMN``'s alternatives, webdataset's notation: ``"jpg;png"``."""
    return tuple(f.strip().lower() for f in spec.split(";") if f.strip())


def _present(value: Any) -> bool:
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
    return b"", f"not image bytes (the {field!r} value is a {type(value).__name__})"


def image_values(batch: pd.DataFrame, spec: str, readers: list | None = None) -> list[tuple[bytes, str]]:
    """:func:`image_value` of each row's first field of ``spec`` that holds one (case ignored)."""
    wanted = _fields(spec)
    columns = sorted((c for c in batch.columns if str(c).lower() in wanted), key=lambda c: wanted.index(str(c).lower()))
    out = []
    for i, row in enumerate(batch[columns].to_dict("records") if columns else [{}] * len(batch)):
        name = next((c for c in columns if _present(row[c]) and not (isinstance(row[c], dict) and not _present(row[c].get("bytes"))
                                                                      and not _present(row[c].get("path")))), None)
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
    else:
        ds = ray.data.read_binary_files(source.path, include_paths=True, **common)
        fn, kwargs = _from_files, {}
    first = ds.take(check_rows)
    if not first:
        raise ParameterError(f"INPUT_PATH={source.path!r} holds no {source.format} rows: nothing to caption.")
    wanted = _fields(source.image_column)
    if source.format != "images" and not any(_present(v) for r in first for k, v in r.items() if str(k).lower() in wanted):
        there = sorted({k for r in first for k, v in r.items() if _present(v) and not k.startswith("__")} - {"path", SAMPLE_ID, ROW_HASH})
        raise ParameterError(f"none of the first {len(first)} {source.format} rows has a {source.image_column!r} value; "
                             f"they have: {there}. Set IMAGE_COLUMN to the field that holds the image bytes (alternatives "
                             "separated by ';').")
    ds = first_rows(ds.map_batches(fn, fn_kwargs=kwargs, batch_format="pandas", num_cpus=num_cpus), limit)
    if source.id_column:
        check_ids(ds, source.id_column)
    return ds


def prepare_batch(batch: pd.DataFrame, *, max_tokens: int, keep_aspect: bool = True,
                  max_pixels: int = images.DEFAULT_MAX_PIXELS) -> pd.DataFrame:
    """Each image decoded, checked, oriented, made RGB and resized to at most ``max_tokens`` vision tokens;
    one that cannot be gets a ``reject_reason`` instead. Nothing raises for one row; the raw bytes go."""
    out: dict[str, list] = {IMAGE: [], "width": [], "height": [], "vision_tokens": [], REJECT_REASON: []}
    earlier = batch[REJECT_REASON] if REJECT_REASON in batch else [""] * len(batch)
    for raw, reason in zip(batch[IMAGE_BYTES], earlier):
        prepared = None
        if not reason:
            try:
                prepared = images.prepare_image(raw, max_tokens=max_tokens, keep_aspect=keep_aspect, max_pixels=max_pixels)
            except Exception as exc:  # prepare_image raises only ImageRejected; anything else is one row's too
                reason = images.reason_for(exc)
        out[IMAGE].append(np.asarray(prepared.image) if prepared else None)
        out["width"].append(prepared.image.width if prepared else 0)
        out["height"].append(prepared.image.height if prepared else 0)
        out["vision_tokens"].append(prepared.vision_tokens if prepared else 0)
        out[REJECT_REASON].append("" if prepared else reason or "not an image")
    return batch.drop(columns=[IMAGE_BYTES, REJECT_REASON], errors="ignore").reset_index(drop=True).assign(**out)


def example(image_tokens: int, keep_aspect: bool = True) -> dict[str, Any]:
    """A prepared row holding the largest image the budget allows (black): the longest request."""
    width, height = images.fit_size(4000, 3000, image_tokens, keep_aspect=keep_aspect)
    return {IMAGE: np.zeros((height, width, 3), dtype=np.uint8), "width": width, "height": height,
            "vision_tokens": images.QWEN2_VL_GRID.tokens(width, height)}


def first_images(ds, count: int, captions: dict[str, str]) -> list[tuple[Any, str, str]]:
    """``(image, file name, caption)`` of the first ``count`` prepared images, for a grid."""
    rows = [r for r in ds.limit(2 * count).take_all() if not r[REJECT_REASON]][:count]
    return [(r[IMAGE], r[SOURCE].split(":")[-1], captions.get(r[ROW_ID], "(no caption)")) for r in rows]


def readable(caption: str, drawable: Callable[[str], bool]) -> str:
    """``caption`` as the chart's font can draw it: an untrained model emits characters no font has
    (boxes that read as an encoding bug); they become a middle dot, and a caption of mostly those a note."""
    shown = "".join(ch if ch != "\ufffd" and drawable(ch) else "·" for ch in caption)
    if caption and shown.count("·") > len(caption) / 2:
        return f"({len(caption)} characters, most without a glyph in the chart's font: see the captions table)"
    return shown


def plot_image_grid(items: list[tuple[Any, str, str]], path=None, columns: int = 4, wrap: int = 32):
    """A grid of ``(image, title, caption)``: each image with its title in bold and its caption below."""
    import functools
    import textwrap

    import matplotlib.pyplot as plt
    from matplotlib import font_manager
    from matplotlib.ft2font import FT2Font

    font = FT2Font(font_manager.findfont(font_manager.FontProperties()))
    drawable = functools.lru_cache(maxsize=None)(lambda ch: ch.isprintable() and font.get_char_index(ord(ch)) != 0)
    rows = max(1, -(-len(items) // columns))
    fig, axes = plt.subplots(rows, columns, figsize=(3.2 * columns, 4.0 * rows), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for ax, (image, title, caption) in zip(axes.flat, items):
        ax.imshow(np.asarray(image))
        caption = readable(caption, drawable)
        short = caption if len(caption) <= 4 * wrap else caption[: 4 * wrap - 1] + "…"
        ax.set_title(title, fontsize=9, fontweight="bold", parse_math=False)  # "$...$" is text, not math
        ax.text(0.5, -0.04, "\n".join(textwrap.wrap(short, wrap)) or "(empty)", transform=ax.transAxes,
                ha="center", va="top", fontsize=8, parse_math=False)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=110)
    return fig


def sample_path() -> Path:
    """The bundled sample: one webdataset shard of photos, awkward variants and broken files
    (``scripts/make_sample_images.py`` made it)."""
    return Path(str(resources.files("helpers") / "sample_data" / "sample-000000.tar"))
