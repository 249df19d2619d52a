"""Where input data lives: local paths, ``file://``, ``s3://``, ``gs://`` and ``http(s)://``.

Ray Data reads all of these through pyarrow (or fsspec for HTTP). Two things need help:

- **S3-compatible storage** (MinIO, an on-premises store, a local test server) is reached through an
  endpoint of its own. pyarrow does not read ``AWS_ENDPOINT_URL`` (boto3 and the AWS CLI do), so
  :func:`filesystem` builds the S3 filesystem with that endpoint when the variable is set, and the
  notebooks pass it to every read. Credentials and region come from the usual variables
  (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION`` / ``AWS_DEFAULT_REGION``).
- **Listing** a remote folder, to tell its layout (``.tar`` shards, ``.parquet`` files or images),
  goes through the same filesystem as the read: :func:`list_files`. A local ``Path`` check would
  call every remote folder a file.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from urllib.parse import urlparse, urlsplit, urlunsplit

#: Set this to your S3-compatible store's address, e.g. ``http://minio.internal:9000``.
ENDPOINT_VARIABLE = "AWS_ENDPOINT_URL"


def scheme(path: str) -> str:
    """``"s3"``, ``"gs"``, ``"http"``, ``"https"``, ``"file"``, or ``""`` for a plain local path."""
    return urlparse(path).scheme.lower() if "://" in path else ""


#: Query parameters whose values are secrets: presigned S3 and GCS URLs (``X-Amz-Signature``,
#: ``X-Amz-Credential``, ``X-Amz-Security-Token``, ``X-Goog-Signature``), Azure SAS (``sig``), tokens and keys.
_SECRET_QUERY = re.compile(r"sig|token|credential|secret|password|passwd|key|auth", re.IGNORECASE)
REDACTED = "***"


def redact(path: str) -> str:
    """``path`` with its secrets replaced by ``***``: the user-info of a URL (``s3://KEY:SECRET@bucket/``)
    and the values of query parameters that carry credentials or signatures (a presigned URL's
    ``X-Amz-Signature``, ``sig``, ``token``, ...). Everything the kit writes or prints about a path
    (``run.json``, the report, its logs) goes through this; the data is read with the path as given."""
    if "://" not in path:
        return path
    parts = urlsplit(path)
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{REDACTED}@{netloc.rsplit('@', 1)[1]}"
    query = "&".join(
        f"{name}={REDACTED}" if sep and _SECRET_QUERY.search(name) else f"{name}{sep}{value}"
        for name, sep, value in (item.partition("=") for item in parts.query.split("&") if item))
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def redact_all(value):
    """:func:`redact` every string in ``value`` (strings, and lists, tuples and dicts of them)."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: redact_all(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact_all(v) for v in value)
    return value


def is_remote(path: str) -> bool:
    """True for URLs and cloud URIs (``https://``, ``s3://``, ``gs://`` ...), not ``file://``."""
    return scheme(path) not in ("", "file")


def is_web(path: str) -> bool:
    """True for ``http://`` and ``https://`` URLs: one file each, which cannot be listed or written."""
    return scheme(path) in ("http", "https")


#: Endings of compressed files, whose rows and encoding cannot be told from their first bytes.
COMPRESSED = (".gz", ".bz2", ".zst", ".xz", ".zip", ".lz4")


def is_compressed(path: str) -> bool:
    """True when the file at ``path`` ends like a compressed one (a URL's query left out)."""
    return (urlparse(path).path if is_web(path) else path).lower().endswith(COMPRESSED)


def read_head(path: str, nbytes: int, fs=None) -> bytes:
    """The first ``nbytes`` of the file at ``path``: through ``fs`` (:func:`resolve`), or for a URL
    a ranged GET (a presigned URL's signature covers the request, not its Range; errors name no URL)."""
    if is_web(path):
        import urllib.request

        request = urllib.request.Request(path, headers={"Range": f"bytes=0-{nbytes - 1}"})
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.read(nbytes)
    filesystem, where = resolve(path, fs)
    with filesystem.open_input_stream(where) as f:
        return f.read(nbytes)


def read_chunks(path: str, fs=None, size: int = 1 << 20) -> Iterator[bytes]:
    """The file at ``path``, ``size`` bytes at a time (as :func:`read_head` reads its start)."""
    if is_web(path):
        import urllib.request

        with urllib.request.urlopen(path, timeout=60) as response:
            while chunk := response.read(size):
                yield chunk
        return
    filesystem, where = resolve(path, fs)
    with filesystem.open_input_stream(where) as f:
        while chunk := f.read(size):
            yield chunk


def filesystem(path: str):
    """The pyarrow filesystem to read ``path`` with, or ``None`` to let Ray choose (the default).

    S3 paths with ``AWS_ENDPOINT_URL`` set get an S3 filesystem pointed at that endpoint; ``hf://``
    paths get the Hugging Face Hub's (:func:`hub_filesystem`).
    """
    if scheme(path) == "hf":
        return hub_filesystem()
    endpoint = os.environ.get(ENDPOINT_VARIABLE)
    if scheme(path) != "s3" or not endpoint:
        return None
    from pyarrow import fs

    parsed = urlparse(endpoint if "://" in endpoint else f"https://{endpoint}")
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    # Seconds, not minutes, to learn that a store does not answer (a wrong endpoint, a stopped server).
    return fs.S3FileSystem(endpoint_override=parsed.netloc, scheme=parsed.scheme or "https", region=region,
                           connect_timeout=5, request_timeout=60,
                           retry_strategy=fs.AwsStandardS3RetryStrategy(max_attempts=3))


def hub_filesystem():
    """The Hugging Face Hub as a pyarrow filesystem: ``huggingface_hub.HfFileSystem`` wrapped with
    pyarrow's ``FSSpecHandler``, as Ray Data's docs show, so that listing and Ray's parallel reads
    go through it (``hf://datasets/ORG/NAME[@revision]/folder``). It reads ``HF_TOKEN`` and
    ``HF_ENDPOINT`` from each process's environment: the token is never passed, printed or stored."""
    from huggingface_hub import HfFileSystem
    from pyarrow.fs import FSSpecHandler, PyFileSystem

    # A fresh instance: fsspec would hand back a cached one, with the Hub's earlier answers (a
    # repository not found before HF_TOKEN was set) and the token it was made with.
    return PyFileSystem(FSSpecHandler(HfFileSystem(skip_instance_cache=True)))


class HubPathError(FileNotFoundError):
    """An ``hf://`` path the Hub cannot serve: no such repository (or a private one without a
    token), no such revision, or nothing at that path."""


def _hub_problem(path: str, exc: BaseException) -> HubPathError:
    text = str(exc)
    if "repository not found" in text:
        why = ("no such dataset repository on the Hub, or a private or gated one: set HF_TOKEN in the environment "
               "(of the cluster, too) to a token that can read it")
    elif "revision not found" in text:
        why = "the repository has no such revision (a branch, tag or commit after '@')"
    elif "invalid repository id" in text:
        why = "not a repository id: write hf://datasets/ORG/NAME[@revision][/folder]"
    else:
        why = f"nothing there ({type(exc).__name__}: {text[:200]})"
    return HubPathError(f"INPUT_PATH={redact(path)!r}: {why}")


def resolve(path: str, fs=None):
    """``(filesystem, path within it)`` for a local path, ``file://`` or cloud URI: ``fs`` when given
    (:func:`filesystem`), else the one pyarrow infers from the URI."""
    from pyarrow import fs as pafs

    if fs is None and scheme(path) == "hf":  # pyarrow has no hf:// scheme of its own
        fs = hub_filesystem()
    if fs is None:
        return pafs.FileSystem.from_uri(path if scheme(path) else os.path.abspath(path))
    return fs, path.split("://", 1)[1] if "://" in path else path


def list_files(path: str, fs=None) -> list[str]:
    """The files under ``path`` (itself, if it is a file), hidden ones left out, sorted.

    Local paths, ``file://`` and cloud URIs are listed through pyarrow, like Ray Data lists them;
    an ``http(s)://`` URL cannot be listed and is taken as the one file it names.
    Raises ``FileNotFoundError`` when nothing is there.
    """
    if is_web(path):
        return [path]
    from pyarrow import fs as pafs

    if scheme(path) == "hf":
        from huggingface_hub import HfFileSystem, constants

        if constants.HF_HUB_OFFLINE:
            raise HubPathError(f"INPUT_PATH={redact(path)!r} is on the Hugging Face Hub, but HF_HUB_OFFLINE is set "
                               "(`make job` sets it for the offline models): unset it to read from the Hub")
        try:  # the Hub's own answer first: pyarrow's wrapper turns every refusal into "not found"
            HfFileSystem(skip_instance_cache=True).resolve_path(path)
        except (FileNotFoundError, ValueError, NotImplementedError) as exc:
            raise _hub_problem(path, exc) from exc
    fs, where = resolve(path, fs)  # hf:// without a filesystem gets the Hub's (resolve)
    info = fs.get_file_info(where)
    if info.type == pafs.FileType.NotFound:
        if scheme(path) == "hf":
            raise _hub_problem(path, FileNotFoundError("nothing at that path in the repository"))
        raise FileNotFoundError(f"nothing at {path!r}")
    if info.type == pafs.FileType.File:
        return [path]
    found = fs.get_file_info(pafs.FileSelector(where, recursive=True))
    prefix = path.split("://", 1)[0] + "://" if scheme(path) not in ("", "file") else ""
    return sorted(prefix + f.path for f in found
                  if f.type == pafs.FileType.File and not f.base_name.startswith((".", "_")))
