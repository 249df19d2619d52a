"""How many rows the whole input holds, read cheaply, so a first run (``LIMIT``) can project what
the rest will take (:func:`helpers.run_stats.projection`).

Exact where the files say it (parquet footers, a folder of images, a CSV read to its end), else an
estimate from the first MiB or few of the first file scaled by the files' sizes; ``basis`` says which.
Nothing here raises: an input that cannot be sized gets ``rows=None`` and the reason.
"""

from __future__ import annotations

import io
import tarfile
from dataclasses import dataclass

from helpers import storage

CSV_SAMPLE_BYTES = 1 << 20  # read of the first CSV file
TAR_SAMPLE_BYTES = 8 << 20  # read of the first webdataset shard
PARQUET_FOOTERS = 64  # files whose footers are read; more files: scaled by size


@dataclass(frozen=True)
class InputSize:
    rows: int | None  # None: not known (see basis)
    basis: str  # how the rows were counted or estimated, or why not

    @property
    def estimated(self) -> bool:
        """True where ``rows`` is an estimate (scaled from a sample), not a count."""
        return self.basis.startswith("estimated")


def input_size(path: str, input_format: str, fs=None) -> InputSize:
    """The rows (images, samples) under ``path`` in ``input_format`` ("csv", "parquet",
    "webdataset" or "images")."""
    if storage.is_web(path):
        return InputSize(None, "an http(s) URL does not say how big it is")
    try:
        files = storage.list_files(path, fs)
        filesystem, _ = storage.resolve(path, fs)
        wheres = [storage.resolve(f, fs)[1] for f in files]
        sizes = [i.size or 0 for i in filesystem.get_file_info(wheres)]
        if input_format == "images":
            return InputSize(len(files), f"counted: {len(files)} files")
        if input_format == "parquet":
            return _parquet(filesystem, wheres, sizes)
        if any(storage.is_compressed(w) for w in wheres):
            return InputSize(None, "compressed files: their rows cannot be told from their sizes")
        if input_format == "csv":
            return _sampled(filesystem, wheres, sizes, CSV_SAMPLE_BYTES, _csv_rows, "rows")
        if input_format == "webdataset":
            return _sampled(filesystem, wheres, sizes, TAR_SAMPLE_BYTES, _tar_samples, "samples")
        return InputSize(None, f"no size rule for {input_format!r}")
    except Exception as exc:  # a size is a nicety: never a reason to fail the run
        return InputSize(None, f"could not be sized ({type(exc).__name__}: {exc})")


def _parquet(filesystem, wheres: list[str], sizes: list[int]) -> InputSize:
    import pyarrow.dataset as pads

    counted = wheres[:PARQUET_FOOTERS]
    rows = pads.dataset(counted, filesystem=filesystem, format="parquet").count_rows()
    if len(counted) == len(wheres):
        return InputSize(rows, f"counted: the footers of {len(wheres)} parquet files")
    scaled = round(rows * sum(sizes) / max(1, sum(sizes[:len(counted)])))
    return InputSize(scaled, f"estimated: {rows} rows in the first {len(counted)} of {len(wheres)} parquet files, "
                             f"scaled by size")


def _sampled(filesystem, wheres, sizes, sample_bytes, count, unit) -> InputSize:
    with filesystem.open_input_stream(wheres[0]) as f:
        head = f.read(sample_bytes)
    whole = len(head) >= sizes[0]
    rows, used = count(head, whole)
    if whole and len(wheres) == 1:
        return InputSize(rows, f"counted: {rows} {unit} in the one file")
    if not rows or not used:
        return InputSize(None, f"no {unit} in the first {len(head):,} bytes of {wheres[0]}")
    estimate = round(sum(sizes) * rows / used)
    what = "all" if whole else f"the first {used:,} bytes"
    return InputSize(estimate, f"estimated: {rows} {unit} in {what} of the first of {len(wheres)} files, "
                               f"scaled to their {sum(sizes):,} bytes")


def _csv_rows(head: bytes, whole: bool) -> tuple[int, int]:
    """(rows, bytes they take) in the start of a CSV file, header excluded from neither."""
    import pyarrow.csv as pacsv

    if not whole:
        head = head[:head.rfind(b"\n") + 1]
    if not head.strip():
        return 0, 0
    return pacsv.read_csv(io.BytesIO(head)).num_rows, len(head)


def _tar_samples(head: bytes, whole: bool) -> tuple[int, int]:
    """(webdataset samples, bytes they take) in the start of a tar shard: members grouped by key."""
    keys, end = set(), 0
    try:
        with tarfile.open(fileobj=io.BytesIO(head), mode="r|") as tar:
            for member in tar:
                if not member.isfile():
                    continue
                stop = member.offset_data + member.size
                if stop > len(head):
                    break
                name = member.name.rsplit("/", 1)[-1]
                keys.add(member.name[: len(member.name) - len(name)] + name.split(".", 1)[0])
                end = stop
    except (tarfile.ReadError, EOFError):  # the read stopped inside a member: count what was whole
        pass
    return len(keys), (len(head) if whole else end)
