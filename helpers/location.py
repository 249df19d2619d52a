"""A folder on the local disk or in object storage, through pyarrow's filesystems.

``OUTPUT_DIR`` may be a local path or a URI (``s3://bucket/run``, with ``AWS_ENDPOINT_URL`` for an
S3-compatible store; ``gs://``; any scheme pyarrow resolves). :class:`Location` gives the output
code the few operations it needs (list, read, write, remove) the same way for both, so Ray's
writes, the checkpoints and the files the driver writes all land in one place that every node of
a cluster sees. pyarrow (already what Ray Data reads and writes with) rather than fsspec: one
filesystem layer, the one Ray uses, and no further package to install.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from helpers import storage


class OutputLocationError(OSError):
    """``OUTPUT_DIR`` in object storage cannot be used (no such bucket, unreachable, no access);
    the message names the path and what the store answered."""


@dataclass(frozen=True, order=True)
class Location:
    """A folder or file: ``uri`` as a person reads it, ``fs`` and ``path`` as pyarrow takes them.
    Two locations are equal when their URIs are."""

    uri: str
    fs: Any = field(compare=False, repr=False)
    path: str = field(compare=False)

    @classmethod
    def of(cls, where: str | Path | Location) -> Location:
        """The location of a local path (made absolute), ``file://`` URI or object-storage URI."""
        if isinstance(where, Location):
            return where
        text = str(where)
        if storage.is_remote(text):
            if storage.is_web(text):
                raise OutputLocationError(f"{storage.redact(text)!r} is a web address: results cannot be written there; "
                                          "use a local folder or a bucket URI (s3://, gs://)")
            uri = text.rstrip("/")
            fs, path = storage.resolve(uri, storage.filesystem(uri))
            return cls(uri, fs, path.rstrip("/"))
        from pyarrow import fs as pafs

        local = os.path.abspath(os.path.expanduser(text.removeprefix("file://")))
        return cls(local, pafs.LocalFileSystem(), local)

    @property
    def remote(self) -> bool:
        return storage.is_remote(self.uri)

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]

    def __truediv__(self, name: str) -> Location:
        return Location(f"{self.uri}/{name}", self.fs, f"{self.path}/{name}")

    def __str__(self) -> str:
        return storage.redact(self.uri)

    def _type(self):
        return self.fs.get_file_info(self.path).type

    def exists(self) -> bool:
        from pyarrow import fs as pafs

        return self._type() != pafs.FileType.NotFound

    def is_file(self) -> bool:
        from pyarrow import fs as pafs

        return self._type() == pafs.FileType.File

    def children(self) -> list[str]:
        """Names directly in this folder (none if it does not exist)."""
        from pyarrow import fs as pafs

        found = self.fs.get_file_info(pafs.FileSelector(self.path, allow_not_found=True))
        return sorted(f.base_name for f in found)

    def files(self, suffix: str = ".parquet") -> list[tuple[Location, float]]:
        """``(file, modified at)`` for every file under this folder whose name ends with ``suffix``."""
        from pyarrow import fs as pafs

        found = self.fs.get_file_info(pafs.FileSelector(self.path, recursive=True, allow_not_found=True))
        prefix = self.uri[: len(self.uri) - len(self.path)] if self.uri.endswith(self.path) else ""
        return sorted((Location(prefix + f.path, self.fs, f.path), f.mtime.timestamp() if f.mtime else 0.0)
                      for f in found if f.type == pafs.FileType.File and f.base_name.endswith(suffix))

    def read_text(self) -> str:
        with self.fs.open_input_stream(self.path) as f:
            return f.read().decode()

    def write_bytes(self, data: bytes) -> None:
        with self.fs.open_output_stream(self.path) as f:
            f.write(data)

    def write_text(self, text: str) -> None:
        self.write_bytes(text.encode())

    def mkdir(self) -> None:
        self.fs.create_dir(self.path, recursive=True)

    def remove(self) -> None:
        """Delete this file or folder (with everything in it); nothing if it does not exist."""
        from pyarrow import fs as pafs

        kind = self._type()
        if kind == pafs.FileType.Directory:
            self.fs.delete_dir(self.path)
        elif kind == pafs.FileType.File:
            self.fs.delete_file(self.path)

    def move_to(self, target: Location) -> None:
        """Move this file or folder (with everything in it) to ``target`` on the same storage: a rename
        on a local disk; in object storage, each object copied, then the originals deleted."""
        from pyarrow import fs as pafs

        kind = self._type()
        if kind == pafs.FileType.NotFound:
            return
        if not self.remote:
            os.makedirs(os.path.dirname(target.path), exist_ok=True)
            os.replace(self.path, target.path)
            return
        if kind == pafs.FileType.File:
            self.fs.copy_file(self.path, target.path)
            self.fs.delete_file(self.path)
            return
        for info in self.fs.get_file_info(pafs.FileSelector(self.path, recursive=True)):
            if info.type == pafs.FileType.File:
                self.fs.copy_file(info.path, target.path + info.path[len(self.path):])
        self.fs.delete_dir(self.path)

    def parquet_rows(self) -> int:
        import pyarrow.parquet as pq

        with self.fs.open_input_file(self.path) as f:
            return pq.ParquetFile(f).metadata.num_rows

    def read_parquet(self):
        import pyarrow.parquet as pq

        return pq.read_table(self.path, filesystem=self.fs).to_pandas()

    def upload(self, local: Path) -> None:
        """Copy the local file ``local`` to this location."""
        from pyarrow import fs as pafs

        pafs.copy_files(str(local), self.path, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=self.fs)


def check_reachable(location: Location, what: str = "OUTPUT_DIR") -> list[str]:
    """Fail within seconds, naming the path, if ``location`` in object storage cannot be used: a
    bucket that does not exist, a store that does not answer, credentials it refuses. Reads only
    (the bucket, then a listing of the folder); returns the names the folder holds."""
    from pyarrow import fs as pafs

    bucket = location.path.split("/", 1)[0]
    try:
        if location.fs.get_file_info(bucket).type == pafs.FileType.NotFound:
            raise OutputLocationError(f"{what}={str(location)!r}: the bucket {bucket!r} does not exist (or these "
                                      "credentials cannot see it); create it, or choose one you can write to")
        return location.children()
    except OutputLocationError:
        raise
    except OSError as exc:
        raise OutputLocationError(f"{what}={str(location)!r} cannot be used: {_first_line(exc)}") from exc


def write_or_explain(location: Location, text: str, what: str = "OUTPUT_DIR") -> None:
    """Write ``text`` to the file ``location``; a store that refuses says so, naming the path."""
    try:
        location.write_text(text)
    except OSError as exc:
        raise OutputLocationError(f"{what}={str(location)!r} is not writable: {_first_line(exc)}") from exc


def _first_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:400]
