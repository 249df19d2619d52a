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


def filesystem(path: str):
    """The pyarrow filesystem to read ``path`` with, or ``None`` to let Ray choose (the default).

    Only S3 paths with ``AWS_ENDPOINT_URL`` set get one: an S3 filesystem pointed at that endpoint.
    """
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


def resolve(path: str, fs=None):
    """``(filesystem, path within it)`` for a local path, ``file://`` or cloud URI: ``fs`` when given
    (:func:`filesystem`), else the one pyarrow infers from the URI."""
    from pyarrow import fs as pafs

    if fs is None:
        return pafs.FileSystem.from_uri(path if scheme(path) else os.path.abspath(path))
    return fs, path.split("://", 1)[1] if "://" in path else path


def list_files(path: str, fs=None) -> list[str]:
    """The files under ``path`` (itself, if it is a file), hidden ones left out, sorted.

    Local paths, ``file://`` and cloud URIs are listed through pyarrow, like Ray Data lists them;
    an ``http(s)://`` URL cannot be listed and is taken as the one file it names.
    Raises ``FileNotFoundError`` when nothing is there.
    """
    if scheme(path) in ("http", "https"):
        return [path]
    from pyarrow import fs as pafs

    fs, where = resolve(path, fs)
    info = fs.get_file_info(where)
    if info.type == pafs.FileType.NotFound:
        raise FileNotFoundError(f"nothing at {path!r}")
    if info.type == pafs.FileType.File:
        return [path]
    found = fs.get_file_info(pafs.FileSelector(where, recursive=True))
    prefix = path.split("://", 1)[0] + "://" if scheme(path) not in ("", "file") else ""
    return sorted(prefix + f.path for f in found
                  if f.type == pafs.FileType.File and not f.base_name.startswith((".", "_")))
