"""Image datasets for the captioning notebook: readers for three layouts, and the per-batch
preparation step that turns raw bytes into model-ready images or rejects.

Layouts (``INPUT_FORMAT``):

- ``"webdataset"``: ``.tar`` shards of ``<key>.jpg`` (+ other fields) files, BLIP3o's real format.
- ``"parquet"``: rows whose image column holds ``{"bytes": ...}`` (the Hugging Face datasets layout)
  or plain bytes.
- ``"images"``: a folder of image files; every file is read, so a stray file is rejected, not skipped.

Each reader streams: a 5-million-image dataset is never loaded whole.
"""

from __future__ import annotations

import functools
import posixpath
from pathlib import Path
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from helpers import images
from helpers.data import REJECT_REASON, ROW_HASH, ROW_ID

FORMATS = ("webdataset", "parquet", "images")
SOURCE = "source"
IMAGE_BYTES = "image_bytes"
IMAGE = "image"
#: Webdataset samples: the shard's path under ``INPUT_PATH`` and the sample's key. Keys repeat across
#: shards (each shard may start at 000000), and shard names across folders (``train/000000.tar``,
#: ``val/000000.tar``), so this, not ``__key__``, identifies a sample and keys resuming.
SAMPLE_ID = "sample_id"
#: Fields (webdataset extensions) and parquet columns that hold an image, in the order they are tried:
#: webdataset's own notation for alternatives. Scraped shards mix extensions; the Hugging Face
#: parquet layout calls its column ``image``. Matched without regard to case (``a.JPG`` is a ``JPG`` field).
ANY_IMAGE = "jpg;jpeg;png;webp;gif;bmp;tif;tiff;image"


def image_fields(spec: str) -> tuple[str, ...]:
    """The alternatives in an ``IMAGE_COLUMN`` value: ``"jpg;png"`` -> ``("jpg", "png")``."""
    return tuple(f.strip() for f in spec.split(";") if f.strip())


def detect_format(path: str, fs=None) -> str:
    """Guess the layout from the file names under ``path`` (listed through the filesystem, so
    ``s3://`` and other remote folders work): only ``.tar`` -> webdataset, only ``.parquet`` ->
    parquet, anything else -> images (a folder of image files, or one image)."""
    from helpers import storage

    names = storage.list_files(path, fs)
    suffixes = {Path(n.split("?")[0]).suffix.lower() for n in names}
    if suffixes and suffixes <= {".tar"}:
        return "webdataset"
    if suffixes and suffixes <= {".parquet"}:
        return "parquet"
    if suffixes & {".tar", ".parquet"}:
        raise ValueError(f"{path!r} mixes .tar or .parquet files with others ({sorted(suffixes)}); "
                         f"set INPUT_FORMAT to one of {FORMATS}, or point INPUT_PATH at one kind")
    return "images"


#: What each layout's images are told apart (and resumed) by, when ``ID_COLUMN`` does not apply.
ID_OF = {"webdataset": "its shard and key", "images": "its file path",
         "parquet": "its file and its row in that file"}


def source_id_column(input_format: str, id_column: str | None) -> str:
    """The column that identifies a row in the *source* data, as read (what resuming keys on):
    shard + key in webdatasets, the file path in folders, ``id_column`` in parquet, else Ray's
    :data:`ROW_HASH` of the row's file and position (the same every run over the same files)."""
    return {"webdataset": SAMPLE_ID, "images": "path", "parquet": id_column or ROW_HASH}[input_format]


def relative_shard(url: str, root: str) -> str:
    """The shard's path under ``root`` (``INPUT_PATH``), or its file name when ``root`` is the shard."""
    def bare(path: str) -> str:
        return (path.split("://", 1)[1] if "://" in path else path).strip("/")

    shard, top = bare(url), bare(root)
    if shard == top or not top:
        return shard.rsplit("/", 1)[-1]
    return shard[len(top) + 1:] if shard.startswith(top + "/") else shard


def _with_sample_id(sample: dict[str, Any], root: str) -> dict[str, Any]:
    """Webdataset decoder: keep every field's raw bytes (decoding happens in :func:`prepare_batch`,
    where failures are caught) and add :data:`SAMPLE_ID` (the shard's path under ``root`` and the key)."""
    shard = relative_shard(str(sample.get("__url__") or ""), root)
    return {**sample, SAMPLE_ID: f"{shard}/{sample.get('__key__')}"}


def read_images(path: str, input_format: str, *, image_column: str = ANY_IMAGE, id_column: str | None = None,
                num_cpus: float = 0.1, filesystem=None, check_rows: int = 20, num_blocks: int | None = None,
                limit: int | None = None):
    """Read any of the three layouts into rows ``{row_id, source, image_bytes, reject_reason}`` plus
    the source's own id column (see :func:`source_id_column`), kept under its name so results can
    be matched to the source and interrupted runs resumed.

    ``image_column`` names the image's field (webdataset) or column (parquet), or alternatives in
    webdataset's notation (``"jpg;png"``): each row takes the first it has. A row whose image is
    missing, null or not bytes is kept, with a ``reject_reason``. A layout that is wrong as a whole
    (none of the first ``check_rows`` rows has ``image_column``) fails here,
    naming the fields that are there. ``num_blocks`` splits the rows into that many blocks as they
    are read (Ray's ``override_num_blocks``), so engine replicas get work from the first block
    without a repartition that waits for the whole dataset. ``limit``: the first ``limit`` images in
    file order (:func:`helpers.data.first_rows`). With ``id_column`` (parquet), one pass over the ids
    stops the run on empty or repeated ones (:func:`helpers.data.check_ids`).
    """
    import ray

    from helpers.data import check_ids, first_rows

    if input_format not in FORMATS:
        raise ValueError(f"INPUT_FORMAT must be one of {FORMATS} or 'auto', got {input_format!r}")
    common = {"num_cpus": num_cpus, "filesystem": filesystem, "override_num_blocks": num_blocks}
    if input_format == "webdataset":
        decoder = functools.partial(_with_sample_id, root=path)
        ds = ray.data.read_webdataset(path, decoder=decoder, include_paths=True, **common)
        fn, kwargs = webdataset_rows, {"image_column": image_column}
    elif input_format == "parquet":
        # Without ID_COLUMN a row is its file and its position there: Ray's row_hash of the two.
        ds = ray.data.read_parquet(path, include_paths=True, include_row_hash=not id_column, **common)
        fn, kwargs = _from_parquet, {"image_column": image_column, "id_column": id_column, "root": path,
                                     "filesystem": filesystem}
    else:
        ds = ray.data.read_binary_files(path, include_paths=True, **common)
        fn, kwargs = _from_files, {}
    first = ds.take(check_rows)
    if not first:
        from helpers.data import EmptyInputError
        from helpers.storage import redact

        raise EmptyInputError(f"INPUT_PATH={redact(path)!r} holds no {input_format} rows (empty files?): "
                              "nothing to caption.")
    if input_format != "images":
        check_layout(first, image_column, input_format)
    ds = first_rows(ds.map_batches(fn, fn_kwargs=kwargs, batch_format="pandas", num_cpus=num_cpus), limit)
    if id_column:
        check_ids(ds, id_column)
    return ds


def first_images(ds, count: int, captions: dict[str, str]) -> list[tuple[Any, str, str]]:
    """``(image, file name, caption)`` for the first ``count`` images of ``ds`` (after
    :func:`prepare_batch`) that were not rejected, with their caption from ``captions`` (row id ->
    caption), for a grid of pictures."""
    rows = [r for r in ds.limit(2 * count).take_all() if not r[REJECT_REASON]][:count]
    return [(r[IMAGE], r[SOURCE].split(":")[-1], captions.get(r[ROW_ID], "(no caption)")) for r in rows]


def check_layout(rows: list[dict[str, Any]], image_column: str, input_format: str) -> None:
    """Fail fast when none of ``rows`` (the first rows read) has a value in ``image_column`` (or in
    any of its alternatives)."""
    if not rows or any(_present(_first_value(r, image_column)[0]) for r in rows):
        return
    fields = sorted({k for r in rows for k, v in r.items() if _present(v) and not k.startswith("__")}
                    - {"path", SAMPLE_ID, ROW_HASH})
    what = "fields" if input_format == "webdataset" else "columns"
    raise ValueError(f"none of the first {len(rows)} {input_format} rows has a {image_column!r} value; "
                     f"{what} they have: {fields}. Set IMAGE_COLUMN to the one that holds the image bytes "
                     f"(alternatives separated by ';').")


def _first_value(row: dict[str, Any], spec: str) -> tuple[Any, str]:
    """The value of the first field of ``spec`` (see :func:`image_fields`) that ``row`` has, matched
    without regard to case, and its name; ``(None, "")`` when it has none."""
    by_case = {}
    for name in row:
        by_case.setdefault(str(name).lower(), []).append(name)
    for field in image_fields(spec):
        for name in by_case.get(field.lower(), []):
            value = row[name]
            if _present(value) and not (isinstance(value, dict) and not _present(value.get("bytes"))
                                        and not _present(value.get("path"))):
                return value, name
    return None, ""


def _present(value: Any) -> bool:
    """False for None, NaN and pandas' NA (what a null becomes in a batch)."""
    return value is not None and value is not pd.NA and not (isinstance(value, float) and np.isnan(value))


def image_value(value: Any, field: str, read_path: Callable[[str], tuple[bytes, str]] | None = None) -> tuple[bytes, str]:
    """The image bytes in one row's ``field`` and a reason if there are none: ``(bytes, "")`` when
    usable, ``(b"", reason)`` for a missing value, a null, or a value that is not bytes. Accepts
    plain bytes and the Hugging Face ``{"bytes": ..., "path": ...}`` struct, both ways it comes:
    the bytes embedded (as on the Hub), or ``bytes`` null and a ``path`` to the image file (as
    ``datasets`` writes a local dataset), read with ``read_path``."""
    if isinstance(value, dict):
        path = value.get("path")
        value = value.get("bytes")
        if not _present(value) and _present(path) and path and read_path is not None:
            return read_path(str(path))
    if not _present(value):
        return b"", f"no {field!r} value in this row"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value), ""
    if isinstance(value, np.ndarray) and value.dtype == np.uint8 and value.ndim == 1:
        return value.tobytes(), ""
    return b"", f"not image bytes (the {field!r} value is a {type(value).__name__})"


def image_values(batch: pd.DataFrame, spec: str, readers: Sequence[Callable[[str], tuple[bytes, str]] | None] | None = None,
                 ) -> list[tuple[bytes, str]]:
    """:func:`image_value` for every row of ``batch``: its first field of ``spec`` that holds a value
    (a batch without any of them: all missing); ``readers``, one per row, read a struct's ``path``."""
    readers = readers if readers is not None else [None] * len(batch)
    fields = image_fields(spec)
    if len(fields) == 1 and fields[0] in batch:  # the common case, without a per-row search
        return [image_value(v, spec, r) for v, r in zip(batch[fields[0]], readers)]
    wanted = {f.lower() for f in fields}
    columns = [c for c in batch.columns if str(c).lower() in wanted]
    rows = batch[columns].to_dict("records") if columns else [{}] * len(batch)
    out = []
    for row, reader in zip(rows, readers):
        value, name = _first_value(row, spec)
        out.append(image_value(value, spec, reader) if name == "" else image_value(value, name, reader))
    return out


def path_reader(parquet_file: str, filesystem) -> Callable[[str], tuple[bytes, str]]:
    """Reads an image file a parquet row names by ``path``: relative to that parquet file's folder,
    or absolute, on the parquet file's filesystem; a file that cannot be read is the row's reason."""

    def read(image_path: str) -> tuple[bytes, str]:
        where = image_path if image_path.startswith("/") else posixpath.join(posixpath.dirname(parquet_file), image_path)
        try:
            with filesystem.open_input_stream(where) as f:
                return f.read(), ""
        except Exception as exc:  # one row's problem: its reason, never the run's
            return b"", f"the image file {image_path!r} this row names could not be read ({type(exc).__name__})"

    return read


def image_rows(ids: list[str], sources: list[str], pairs: list[tuple[bytes, str]]) -> pd.DataFrame:
    """The rows every reader gives: id, source, the image's bytes and its reject reason ("" if none)."""
    return pd.DataFrame({ROW_ID: ids, SOURCE: sources, IMAGE_BYTES: [b for b, _ in pairs],
                         REJECT_REASON: [r for _, r in pairs]})


def webdataset_rows(batch: pd.DataFrame, image_column: str) -> pd.DataFrame:
    """:func:`image_rows` of a batch of webdataset samples (a shard's ``__key__`` and the sample id)."""
    ids = batch[SAMPLE_ID].astype(str).tolist()
    keys = batch["__key__"].astype(str).tolist()
    pairs = image_values(batch, image_column)
    sources = [f"{i[: -len(k) - 1]}:{k}" for i, k in zip(ids, keys)]  # shard path:key
    return image_rows(ids, sources, pairs).assign(**{SAMPLE_ID: ids})


def _from_parquet(batch: pd.DataFrame, image_column: str, id_column: str | None, root: str = "",
                  filesystem=None) -> pd.DataFrame:
    from helpers import storage

    fs = storage.resolve(root, filesystem)[0] if root else None
    pairs = image_values(batch, image_column, [path_reader(str(p), fs) for p in batch["path"]] if fs else None)
    if id_column:
        ids = batch[id_column].astype(str).tolist()
    else:  # Ray's row_hash (the file's path and the row's position in it): one per row, the same every run
        ids = [f"{int(h):016x}" for h in batch[ROW_HASH]]
    sources = [f"{Path(str(p)).name}:{i}" for p, i in zip(batch["path"], ids)]
    out = image_rows(ids, sources, pairs)
    kept = id_column or ROW_HASH  # the source's id, as read: what resuming keys on
    out[kept] = batch[kept].to_numpy()
    return out


def _from_files(batch: pd.DataFrame) -> pd.DataFrame:
    paths = [str(p) for p in batch["path"]]
    return image_rows(paths, [Path(p).name for p in paths], image_values(batch, "bytes")).assign(path=paths)


def prepare_batch(batch: pd.DataFrame, *, max_tokens: int, keep_aspect: bool = True,
                  max_pixels: int = images.DEFAULT_MAX_PIXELS) -> pd.DataFrame:
    """Validate and resize every image of a batch; a bad one gets a reason instead of an image.

    Rows that arrive with a ``reject_reason`` (the reader found no image bytes) keep it. No
    exception leaves this function for a single row: Ray fails the whole job on one errored task.
    Output columns: the input's columns except the raw bytes (dropped here), plus image (uint8
    H x W x 3, None when rejected), width, height, vision_tokens and reject_reason ("" when usable).
    """
    out: dict[str, list] = {IMAGE: [], "width": [], "height": [], "vision_tokens": [], REJECT_REASON: []}
    earlier = batch[REJECT_REASON] if REJECT_REASON in batch else [""] * len(batch)
    for raw, reason in zip(batch[IMAGE_BYTES], earlier):
        prepared = None
        if not reason:
            try:
                prepared = images.prepare_image(raw, max_tokens=max_tokens, keep_aspect=keep_aspect,
                                                max_pixels=max_pixels)
            except Exception as exc:  # prepare_image raises only ImageRejected; anything else is one row's too
                reason = images.reason_for(exc)
        if prepared is None:
            out[IMAGE].append(None)
            out["width"].append(0)
            out["height"].append(0)
            out["vision_tokens"].append(0)
            out[REJECT_REASON].append(reason or "not an image")
            continue
        out[IMAGE].append(np.asarray(prepared.image))
        out["width"].append(prepared.image.width)
        out["height"].append(prepared.image.height)
        out["vision_tokens"].append(prepared.vision_tokens)
        out[REJECT_REASON].append("")
    return batch.drop(columns=[IMAGE_BYTES, REJECT_REASON], errors="ignore").reset_index(drop=True).assign(**out)


# --- the bundled sample set -------------------------------------------------------------------


