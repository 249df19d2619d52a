"""The text notebook's input: a CSV (file, folder, URL, bucket or ``hf://``) checked before anything
starts (there, its columns, one encoding for every file, its rows counted or estimated), then each
row's id and why it cannot be sent to the model."""

from __future__ import annotations

import codecs
import contextlib
import dataclasses
import hashlib
import io
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv

from helpers import storage
from helpers.parameters import ParameterError, raise_if, text
from helpers.pipeline import REJECT_REASON, ROW_ID

#: What a CSV that is not UTF-8 is read as: Windows' Western encoding, else Latin-1 (any byte).
FALLBACK_ENCODINGS = ("cp1252", "latin-1")
HEAD_BYTES = 1 << 20
COMPRESSED = (".gz", ".bz2", ".zst", ".xz", ".zip", ".lz4")


def sample_path() -> Path:
    """The bundled sample: ~300 real organisations with their industry (and 3 broken rows)."""
    return Path(str(resources.files("helpers") / "sample_data" / "customers.csv"))


@dataclass(frozen=True)
class CsvInput:
    """What the notebook reads: ``path`` and ``fs`` as Ray takes them, the encoding, the columns and
    the rows (None: not known), with how they were counted."""

    path: str
    fs: Any
    encoding: str
    columns: list[str]
    rows: int | None
    rows_basis: str
    text_columns: tuple[str | None, ...] = ()  # TEXT_COLUMN, ID_COLUMN, LABEL_COLUMN
    sample: tuple[dict[str, Any], ...] = ()  # the first rows with a text to send, to measure your requests on

    @property
    def shown(self) -> str:
        return storage.redact(self.path)

    @property
    def read_options(self):
        return pacsv.ReadOptions(encoding=self.encoding)

    @property
    def convert_options(self):
        """Texts, ids and labels read as text: an id of digits, or ``1-800-Flowers`` after a run of
        numbers, would be typed as a number by the first block and fail the read at a later one."""
        return pacsv.ConvertOptions(column_types={n: pa.string() for n in self.text_columns if n})


def is_compressed(path: str) -> bool:
    return (urlparse(path).path if storage.is_web(path) else path).lower().endswith(COMPRESSED)


def detect_encoding(head: bytes) -> str:
    for encoding in ("utf8", *FALLBACK_ENCODINGS[:-1]):  # a character cut at the head's end is no error
        with contextlib.suppress(UnicodeDecodeError):
            codecs.getincrementaldecoder(encoding)().decode(head, final=False)
            return encoding
    return FALLBACK_ENCODINGS[-1]


def encoding_problems(files: list[str], fs, encoding: str) -> list[str]:
    """Every file decoded whole with the first one's encoding (Ray reads all with one): where one does
    not decode, the file and the byte; a UTF-8 file beyond ASCII among cp1252 ones, which it would misread."""
    found = []
    for name in files:
        if is_compressed(name):
            continue
        strict, utf8 = codecs.getincrementaldecoder(encoding)(), codecs.getincrementaldecoder("utf-8")()
        offset, is_utf8, beyond_ascii = 0, True, False
        try:
            for chunk in storage.read_chunks(name, fs):
                try:
                    strict.decode(chunk)
                except UnicodeDecodeError as exc:
                    found.append(f"{storage.redact(name)} is not {encoding} at byte {offset + exc.start:,} "
                                 f"({chunk[exc.start:exc.end].hex(' ')}; it reads as "
                                 f"{detect_encoding(chunk[exc.start:exc.start + 4096])} there): every file of one run "
                                 f"must have one encoding; convert this one to {encoding}, or run it on its own")
                    break
                if is_utf8 and encoding != "utf8":
                    beyond_ascii = beyond_ascii or not chunk.isascii()
                    try:
                        utf8.decode(chunk)
                    except UnicodeDecodeError:
                        is_utf8 = False
                offset += len(chunk)
        except OSError as exc:
            found.append(f"{storage.redact(name)} cannot be read: {exc}")
            continue
        if encoding != "utf8" and is_utf8 and beyond_ascii:
            found.append(f"{storage.redact(name)} is UTF-8, but the first file is {encoding} (as every file would be "
                         f"read): convert it to {encoding}, or run it on its own")
    return found


def count_rows(files: list[str], fs, head: bytes, encoding: str) -> tuple[int | None, str]:
    """The CSV's rows: counted in a file of at most a MiB, else the first MiB's (``head``, already read)
    scaled by the files' sizes."""
    if storage.is_web(files[0]) or any(is_compressed(f) for f in files):
        return None, "a URL or compressed files do not say how many rows they hold"
    try:
        filesystem, _ = storage.resolve(files[0], fs)
        sizes = [i.size or 0 for i in filesystem.get_file_info([storage.resolve(f, fs)[1] for f in files])]
        whole = len(head) >= sizes[0]
        used = head if whole else head[:head.rfind(b"\n") + 1]
        rows = pacsv.read_csv(io.BytesIO(used), read_options=pacsv.ReadOptions(encoding=encoding)).num_rows if used.strip() else 0
    except Exception as exc:  # a size is a nicety, never a reason to stop
        return None, f"could not be sized ({type(exc).__name__})"
    if whole and len(files) == 1:
        return rows, f"counted: {rows} rows"
    if not rows:
        return None, "no whole row in the first MiB"
    return round(sum(sizes) * rows / len(used)), f"estimated from the first {len(used):,} bytes of {len(files)} files"


def csv_input(input_path: str | None, text_column: Any, id_column: Any, label_column: Any) -> CsvInput:
    """``INPUT_PATH`` checked with ``TEXT_COLUMN``, ``ID_COLUMN`` and ``LABEL_COLUMN``: there, readable,
    holding those columns and rows, every file of one encoding; raise listing every problem."""
    found = text("INPUT_PATH", input_path, optional=True) + text("TEXT_COLUMN", text_column)
    found += text("ID_COLUMN", id_column, optional=True) + text("LABEL_COLUMN", label_column, optional=True)
    raise_if(found)
    try:
        path = storage.absolute(input_path) if input_path is not None else str(sample_path())
        fs = storage.filesystem(path)
        files = storage.list_files(path, fs)
        if not files:
            raise FileNotFoundError(f"INPUT_PATH={storage.redact(path)!r} holds no files")
        head = b"" if is_compressed(files[0]) else storage.read_head(files[0], HEAD_BYTES, fs)
    except (OSError, ValueError) as exc:
        raise ParameterError(f"Invalid parameters:\n  - {exc}") from None
    encoding = detect_encoding(head)
    columns: list[str] = []
    if head:
        columns = pacsv.read_csv(io.BytesIO(head.split(b"\n", 1)[0] + b"\n"),
                                 read_options=pacsv.ReadOptions(encoding=encoding)).column_names
        wanted = {"TEXT_COLUMN": text_column, "ID_COLUMN": id_column, "LABEL_COLUMN": label_column}
        found += [f"{name}={column!r} is not a column of {storage.redact(files[0])}; its columns: "
                  f"{', '.join(map(repr, columns))}" for name, column in wanted.items() if column and column not in columns]
        found += encoding_problems(files, fs, encoding)
    rows, basis = count_rows(files, fs, head, encoding)
    if rows == 0:
        found.append(f"INPUT_PATH={storage.redact(path)!r} holds no rows (a header only?): nothing to run on")
    raise_if(found)
    print(f"input: {storage.redact(path)} ({encoding}; {basis})")
    source = CsvInput(path, fs, encoding, columns, rows, basis, (text_column, id_column, label_column))
    with contextlib.suppress(Exception):  # no rows apart (compressed; a line break in quotes cut): the preset's context
        first = pacsv.read_csv(io.BytesIO(head[:head.rfind(b"\n") + 1]), read_options=source.read_options,
                               convert_options=source.convert_options).slice(0, 1000).to_pylist()
        source = dataclasses.replace(source, sample=tuple(r for r in first if not reject_reason(r[text_column]))[:200])
    return source


def reject_reason(value: object) -> str:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return "missing value"
    if isinstance(value, str) and not value.strip():
        return "empty value" if value == "" else "blank value (only whitespace)"
    return ""


def add_row_ids(batch: pd.DataFrame, text_column: str, id_column: str | None) -> pd.DataFrame:
    """``row_id`` (``id_column``'s value, or a hash of the row's content: identical rows share one) and
    ``reject_reason`` for each row; for ``map_batches(batch_format="pandas")``."""
    out = batch.copy()
    if id_column is None:
        joined = batch.astype(object).where(batch.notna(), "").astype(str).agg("\x1f".join, axis=1)
        out[ROW_ID] = [hashlib.sha1(t.encode()).hexdigest()[:16] for t in joined]
    else:
        out[ROW_ID] = batch[id_column].astype(str)
    out[REJECT_REASON] = [reject_reason(v) for v in batch[text_column]]
    return out
