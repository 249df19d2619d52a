"""Every parameter checked before anything starts (no model prepared, no Ray started): the values
(:mod:`helpers.params`), then what they point at: the input is there and has the columns named, the
ID column fits the image layout, the text's encoding is known, ``OUTPUT_DIR`` can be claimed. One
:class:`helpers.params.ParameterError` lists every problem at once. The text notebook's check is
:func:`check_text`; the captioning notebook's, :func:`helpers.caption.check_parameters`, builds on
the pieces here."""

from __future__ import annotations

import codecs
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from helpers import params, storage
from helpers.output_dir import output_dir_problem

#: Bytes of the first CSV file read to tell its encoding and columns.
HEAD_BYTES = 1 << 20
#: What a CSV that is not UTF-8 is read as: Windows' Western encoding (Latin-1 plus curly quotes,
#: dashes and the euro sign in 0x80-0x9F), else Latin-1 itself, which decodes any byte.
FALLBACK_ENCODINGS = ("cp1252", "latin-1")


@dataclass(frozen=True)
class Input:
    """What the notebook reads: ``path`` and ``fs`` as Ray takes them, the layout, and for CSV the
    read options (its encoding)."""

    path: str
    fs: Any  # an S3-compatible endpoint's filesystem (AWS_ENDPOINT_URL), the Hub's, or None
    format: str  # csv, webdataset, parquet or images
    encoding: str = "utf8"

    @property
    def shown(self) -> str:
        """The path as it may be printed (a presigned URL's signature removed)."""
        return storage.redact(self.path)

    def csv_read_options(self):
        """pyarrow's CSV read options for ``ray.data.read_csv(read_options=...)``: the encoding."""
        import pyarrow.csv as pacsv

        return pacsv.ReadOptions(encoding=self.encoding)


def detect_encoding(head: bytes) -> str:
    """``"utf8"`` when ``head`` (the start of a file, possibly cut mid-character) is UTF-8, with or
    without a byte-order mark; else the first of :data:`FALLBACK_ENCODINGS` that decodes it."""
    try:
        codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
        return "utf8"
    except UnicodeDecodeError:
        pass
    for encoding in FALLBACK_ENCODINGS:
        try:
            head.decode(encoding)
            return encoding
        except UnicodeDecodeError:
            continue
    return FALLBACK_ENCODINGS[-1]


def encoding_problems(files: list[str], fs, encoding: str) -> list[str]:
    """Each file decoded whole, a MiB at a time, with ``encoding`` (the first file's start's): where one
    does not decode, the file and the byte offset; where ``encoding`` is not UTF-8 and a file is UTF-8
    with text beyond ASCII (which it would silently misread), that file. Ray reads every file with one
    encoding, and a bad byte past the first MiB failed the whole read with Ray's raw error."""
    problems = []
    for name in files:
        if storage.is_compressed(name):
            continue
        strict, utf8 = codecs.getincrementaldecoder(encoding)(), codecs.getincrementaldecoder("utf-8")()
        offset, is_utf8, beyond_ascii = 0, True, False
        try:
            for chunk in storage.read_chunks(name, fs):
                try:
                    strict.decode(chunk)
                except UnicodeDecodeError as exc:
                    other = detect_encoding(chunk[exc.start:exc.start + 4096])
                    bad = chunk[exc.start:exc.end].hex(" ")
                    problems.append(f"{storage.redact(name)} is not {encoding} at byte {offset + exc.start:,} ({bad}; "
                                    f"it reads as {other} there): every file of one run must have one encoding; "
                                    f"convert this one to {encoding}, or run it on its own")
                    break
                if is_utf8 and encoding != "utf8":
                    beyond_ascii = beyond_ascii or not chunk.isascii()
                    try:
                        utf8.decode(chunk)
                    except UnicodeDecodeError:
                        is_utf8 = False
                offset += len(chunk)
        except OSError as exc:
            problems.append(f"{storage.redact(name)} cannot be read: {exc}")
            continue
        if encoding != "utf8" and is_utf8 and beyond_ascii:
            problems.append(f"{storage.redact(name)} is UTF-8, but the first file is {encoding} (as every file "
                            f"would be read): convert it to {encoding}, or run it on its own")
    return problems


def _csv_columns(head: bytes, encoding: str) -> list[str]:
    import io

    import pyarrow.csv as pacsv

    first_line = head.split(b"\n", 1)[0] + b"\n"
    return pacsv.read_csv(io.BytesIO(first_line), read_options=pacsv.ReadOptions(encoding=encoding)).column_names


def missing_columns(columns: list[str], wanted: Mapping[str, str | None], shown: str) -> list[str]:
    return [f"{name}={column!r} is not a column of {shown}; its columns: {', '.join(repr(c) for c in columns)}"
            for name, column in wanted.items() if column is not None and column not in columns]


def resolve(path: str | None, problems: list[str]) -> tuple[str | None, Any]:
    from helpers.data import resolve_input_path

    try:
        resolved = resolve_input_path(path)
        return resolved, storage.filesystem(resolved)
    except (OSError, ValueError) as exc:  # missing files, refused Hub paths, bad endpoints
        problems.append(str(exc))
        return None, None


def check_text(p: Mapping[str, Any]) -> Input:
    """The text notebook's parameters, its CSV input (there, readable, with ``TEXT_COLUMN``,
    ``ID_COLUMN`` and ``LABEL_COLUMN``; encoding detected) and ``OUTPUT_DIR``; raise listing every
    problem, or return what to read."""
    problems = params.text_problems(p)
    path, fs = resolve(p["INPUT_PATH"], problems)
    encoding = "utf8"
    if path is not None:
        try:
            files = storage.list_files(path, fs)  # a URL: the one file it names
            if not files:
                problems.append(f"INPUT_PATH={storage.redact(path)!r} holds no files")
            elif not storage.is_compressed(files[0]):
                head = storage.read_head(files[0], HEAD_BYTES, fs)
                encoding = detect_encoding(head)
                wanted = {n: p[n] for n in ("TEXT_COLUMN", "ID_COLUMN", "LABEL_COLUMN") if isinstance(p[n], str)}
                problems += missing_columns(_csv_columns(head, encoding), wanted, storage.redact(files[0]))
                problems += encoding_problems(files, fs, encoding)
        except (OSError, ValueError) as exc:
            problems.append(f"INPUT_PATH={storage.redact(path)!r} cannot be read: {exc}")
    problems += output_problems(p)
    params.validate(problems)
    return Input(path=path, fs=fs, format="csv", encoding=encoding)  # type: ignore[arg-type]


def parquet_columns(path: str, fs) -> list[str]:
    import pyarrow.parquet as pq

    filesystem, where = storage.resolve(storage.list_files(path, fs)[0], fs)
    with filesystem.open_input_file(where) as f:
        return pq.ParquetFile(f).schema_arrow.names


def output_problems(p: Mapping[str, Any]) -> list[str]:
    if not isinstance(p["OUTPUT_DIR"], str) or not p["OUTPUT_DIR"].strip():
        return []  # params already named it
    problem = output_dir_problem(p["OUTPUT_DIR"])
    return [problem] if problem else []


