"""Where data lives: local paths, buckets (``s3://``, ``gs://``), the web and the Hugging Face Hub
(``hf://``), through pyarrow's filesystems as Ray Data uses them (for an S3-compatible store, pyarrow
is pointed at ``AWS_ENDPOINT_URL``). Every path printed or recorded is :func:`redact`-ed first."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse, urlsplit, urlunsplit

import pyarrow.parquet as pq
from pyarrow import fs as pafs

ENDPOINT_VARIABLE = "AWS_ENDPOINT_URL"
#: Query parameters whose values are secrets (presigned S3/GCS URLs, Azure SAS, tokens, keys).
_SECRET_QUERY = re.compile(r"sig|token|credential|secret|password|passwd|key|auth", re.IGNORECASE)


def scheme(path: str) -> str:
    return urlparse(path).scheme.lower() if "://" in path else ""


def is_remote(path: str) -> bool:
    return scheme(path) not in ("", "file")


def absolute(path: str) -> str:
    """``INPUT_PATH`` as every node reads it: a URL or bucket as it is; a local path absolute (Ray's
    workers do not share the notebook's folder), and there."""
    if is_remote(path):
        return path
    local = Path(path.removeprefix("file://")).expanduser().resolve()
    if not local.exists():
        raise FileNotFoundError(f"INPUT_PATH={path!r} does not exist (resolved to {local})")
    return str(local)


def is_web(path: str) -> bool:
    return scheme(path) in ("http", "https")


def redact(path: str) -> str:
    """``path`` with the secrets in its user-info and query replaced by ``***``."""
    if "://" not in path:
        return path
    parts = urlsplit(path)
    netloc = f"***@{parts.netloc.rsplit('@', 1)[1]}" if "@" in parts.netloc else parts.netloc
    query = "&".join(f"{name}=***" if sep and _SECRET_QUERY.search(name) else f"{name}{sep}{value}"
                     for name, sep, value in (item.partition("=") for item in parts.query.split("&") if item))
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def redact_all(value: Any) -> Any:
    """:func:`redact` every string in ``value`` (and in its lists, tuples and dicts)."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: redact_all(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact_all(v) for v in value)
    return value


def filesystem(path: str):
    """The pyarrow filesystem for ``path``, or None to let Ray choose: the Hub's for ``hf://``, an S3
    filesystem pointed at ``AWS_ENDPOINT_URL`` for ``s3://`` when it is set."""
    if scheme(path) == "hf":
        return hub_filesystem()
    endpoint = os.environ.get(ENDPOINT_VARIABLE)
    if scheme(path) != "s3" or not endpoint:
        return None
    parsed = urlparse(endpoint if "://" in endpoint else f"https://{endpoint}")
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    # Seconds, not minutes, to learn that a store does not answer.
    return pafs.S3FileSystem(endpoint_override=parsed.netloc, scheme=parsed.scheme or "https", region=region,
                             connect_timeout=5, request_timeout=60,
                             retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=3))


def hub_filesystem():
    """The Hub as a pyarrow filesystem, as Ray Data's docs show; ``HF_TOKEN`` comes from each process's
    environment, never passed or stored. A fresh instance: fsspec's cached one keeps old answers."""
    from huggingface_hub import HfFileSystem

    return pafs.PyFileSystem(pafs.FSSpecHandler(HfFileSystem(skip_instance_cache=True)))


class HubPathError(FileNotFoundError):
    """An ``hf://`` path the Hub cannot serve."""


HUB_PROBLEMS = {  # what the Hub said, and what it means
    "repository not found": "no such dataset repository on the Hub, or a private or gated one: set HF_TOKEN in the "
                            "environment (of the cluster, too) to a token that can read it",
    "revision not found": "the repository has no such revision (a branch, tag or commit after '@')",
    "invalid repository id": "not a repository id: write hf://datasets/ORG/NAME[@revision][/folder]"}


def _hub_problem(path: str, exc: BaseException) -> HubPathError:
    why = next((v for k, v in HUB_PROBLEMS.items() if k in str(exc)), f"nothing there ({type(exc).__name__}: {str(exc)[:200]})")
    return HubPathError(f"INPUT_PATH={redact(path)!r}: {why}")


def resolve(path: str, fs=None) -> tuple[Any, str]:
    """``(filesystem, path within it)``: ``fs`` when given, else the one pyarrow infers."""
    if fs is None and scheme(path) == "hf":
        fs = hub_filesystem()
    if fs is None:
        return pafs.FileSystem.from_uri(path if scheme(path) else os.path.abspath(path))
    return fs, path.split("://", 1)[1] if "://" in path else path


def list_files(path: str, fs=None) -> list[str]:
    """The files under ``path`` (itself, if a file; a web URL is one file), hidden ones left out, sorted."""
    if is_web(path):
        return [path]
    if scheme(path) == "hf":
        from huggingface_hub import HfFileSystem, constants

        if constants.HF_HUB_OFFLINE:
            raise HubPathError(f"INPUT_PATH={redact(path)!r} is on the Hugging Face Hub, but HF_HUB_OFFLINE is set "
                               "(`make job` sets it for the offline models): unset it to read from the Hub")
        try:  # the Hub's own answer: pyarrow's wrapper turns every refusal into "not found"
            HfFileSystem(skip_instance_cache=True).resolve_path(path)
        except (FileNotFoundError, ValueError, NotImplementedError) as exc:
            raise _hub_problem(path, exc) from exc
    fs, where = resolve(path, fs)
    info = fs.get_file_info(where)
    if info.type == pafs.FileType.NotFound:
        if scheme(path) == "hf":
            raise _hub_problem(path, FileNotFoundError("nothing at that path in the repository"))
        raise FileNotFoundError(f"nothing at {redact(path)!r}")
    if info.type == pafs.FileType.File:
        return [path]
    prefix = path.split("://", 1)[0] + "://" if is_remote(path) else ""
    return sorted(prefix + f.path for f in fs.get_file_info(pafs.FileSelector(where, recursive=True))
                  if f.type == pafs.FileType.File and not f.base_name.startswith((".", "_")))


def read_chunks(path: str, fs=None, size: int = 1 << 20, limit: int | None = None) -> Iterator[bytes]:
    """The file at ``path``, ``size`` bytes at a time, up to ``limit`` bytes (a ranged GET for a URL)."""
    if is_web(path):
        import urllib.request

        headers = {"Range": f"bytes=0-{limit - 1}"} if limit else {}
        stream = urllib.request.urlopen(urllib.request.Request(path, headers=headers), timeout=60)
    else:
        filesystem, where = resolve(path, fs)
        stream = filesystem.open_input_stream(where)
    read = 0
    with stream:
        while (limit is None or read < limit) and (chunk := stream.read(size if limit is None else min(size, limit - read))):
            read += len(chunk)
            yield chunk


def read_head(path: str, nbytes: int, fs=None) -> bytes:
    return b"".join(read_chunks(path, fs, limit=nbytes))


class OutputLocationError(OSError):
    """A folder in object storage that cannot be used; the message names it and what the store said."""


@dataclass(frozen=True, order=True)
class Location:
    """A folder or file on a disk or in object storage (``uri``; ``fs`` and ``path`` as pyarrow takes
    them), with the few operations results need."""

    uri: str
    fs: Any = field(compare=False, repr=False)
    path: str = field(compare=False)

    @classmethod
    def of(cls, where: str | Path | Location) -> Location:
        if isinstance(where, Location):
            return where
        text = str(where)
        if is_remote(text):
            if is_web(text):
                raise OutputLocationError(f"{redact(text)!r} is a web address: results cannot be written there; "
                                          "use a local folder or a bucket (s3://, gs://)")
            fs, path = resolve(text.rstrip("/"), filesystem(text))
            return cls(text.rstrip("/"), fs, path.rstrip("/"))
        local = os.path.abspath(os.path.expanduser(text.removeprefix("file://")))
        return cls(local, pafs.LocalFileSystem(), local)

    @property
    def remote(self) -> bool:
        return is_remote(self.uri)

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]

    def __truediv__(self, name: str) -> Location:
        return Location(f"{self.uri}/{name}", self.fs, f"{self.path}/{name}")

    def __str__(self) -> str:
        return redact(self.uri)

    def _type(self) -> str:
        return self.fs.get_file_info(self.path).type.name  # NotFound, File or Directory

    def exists(self) -> bool:
        return self._type() != "NotFound"

    def is_file(self) -> bool:
        return self._type() == "File"

    def children(self) -> list[str]:
        return sorted(f.base_name for f in self.fs.get_file_info(pafs.FileSelector(self.path, allow_not_found=True)))

    def files(self, suffix: str = ".parquet") -> list[tuple[Location, float]]:
        """``(file, modified at)`` for every file under this folder whose name ends with ``suffix``."""
        found = self.fs.get_file_info(pafs.FileSelector(self.path, recursive=True, allow_not_found=True))
        prefix = self.uri[: len(self.uri) - len(self.path)]
        return sorted((Location(prefix + f.path, self.fs, f.path), f.mtime.timestamp() if f.mtime else 0.0)
                      for f in found if f.type == pafs.FileType.File and f.base_name.endswith(suffix))

    def read_text(self) -> str:
        with self.fs.open_input_stream(self.path) as f:
            return f.read().decode()

    def write_text(self, text: str) -> None:
        with self.fs.open_output_stream(self.path) as f:
            f.write(text.encode())

    def create(self, text: str) -> bool:
        """Write ``text`` only if the file does not exist, in one step where the store allows it (an
        exclusive create on a disk, a conditional write in S3); False where it exists. Other stores
        (gs://, ...) check, then write: two writers at the same moment can both succeed there."""
        if not self.remote:
            try:
                with open(self.path, "x") as f:  # O_CREAT | O_EXCL
                    f.write(text)
            except FileExistsError:
                return False
            return True
        if scheme(self.uri) == "s3":
            return self._put_if(text, IfNoneMatch="*")
        if self.exists():
            return False
        self.write_text(text)
        return True

    def version(self) -> str:
        """What :meth:`replace` compares: an S3 object's ETag, else the file's text."""
        if scheme(self.uri) == "s3":
            bucket, key = self.path.split("/", 1)
            return _s3().head_object(Bucket=bucket, Key=key)["ETag"]
        return self.read_text()

    def replace(self, text: str, version: str) -> bool:
        """Write ``text`` only if the file is still at ``version``: in one step in S3 (a conditional
        write); elsewhere checked, then written."""
        if scheme(self.uri) == "s3":
            return self._put_if(text, IfMatch=version)
        if not self.exists() or self.read_text() != version:
            return False
        self.write_text(text)
        return True

    def _put_if(self, text: str, **condition: str) -> bool:
        bucket, key = self.path.split("/", 1)
        try:
            _s3().put_object(Bucket=bucket, Key=key, Body=text.encode(), **condition)
        except Exception as exc:  # botocore's ClientError: 412 when the condition fails
            if "PreconditionFailed" in str(exc) or "412" in str(exc):
                return False
            raise
        return True

    def move_to(self, target: Location) -> None:
        """A rename on a disk; in object storage each object copied, then the originals deleted."""
        kind = self._type()
        if kind == "NotFound":
            return
        if not self.remote:
            os.makedirs(os.path.dirname(target.path), exist_ok=True)
            os.replace(self.path, target.path)
        elif kind == "File":
            self.fs.copy_file(self.path, target.path)
            self.fs.delete_file(self.path)
        else:
            for info in self.fs.get_file_info(pafs.FileSelector(self.path, recursive=True)):
                if info.type == pafs.FileType.File:
                    self.fs.copy_file(info.path, target.path + info.path[len(self.path):])
            self.fs.delete_dir(self.path)

    def upload(self, local: Path) -> None:
        pafs.copy_files(str(local), self.path, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=self.fs)

    def parquet_rows(self) -> int:
        with self.fs.open_input_file(self.path) as f:
            return pq.ParquetFile(f).metadata.num_rows


def _s3():
    import boto3  # reads AWS_ENDPOINT_URL and the credentials as the S3 filesystem does

    return boto3.client("s3")


def check_reachable(location: Location, what: str = "OUTPUT_DIR") -> list[str]:
    """The names the folder holds; within seconds, an error naming a missing bucket, a store that does
    not answer or refused credentials."""
    bucket = location.path.split("/", 1)[0]
    try:
        if location.fs.get_file_info(bucket).type == pafs.FileType.NotFound:
            raise OutputLocationError(f"{what}={str(location)!r}: the bucket {bucket!r} does not exist (or these "
                                      "credentials cannot see it); create it, or choose one you can write to")
        return location.children()
    except OutputLocationError:
        raise
    except OSError as exc:
        raise OutputLocationError(f"{what}={str(location)!r} cannot be used: {' '.join(str(exc).split())[:400]}") from exc
