"""Where bytes live: every file tfshards reads or writes goes through this module.

A location is a local path (``str`` or ``os.PathLike``) or a URL such as
``s3://bucket/prefix``, ``gs://bucket/prefix``, ``az://container/prefix`` or
``memory://x``. Local paths take the plain ``open``/``os`` calls they always
took (no fsspec import, no overhead); URLs go through fsspec
(``fsspec.core.url_to_fs``) with the caller's ``storage_options``, so any
protocol whose fsspec package is installed works (``tfshards[s3]``,
``tfshards[gcs]``).

Credentials come from where the client library finds them (environment,
config files, instance metadata) or from ``storage_options``; they are never
put in a message: locations are shown by :func:`display`, which drops any
``user:password@`` part of a URL, and ``storage_options`` are never shown.

Calls on URLs are retried with exponential backoff on transient errors
(connection reset or refused, timeouts, HTTP 5xx and throttling) for at most
``RETRY_SECONDS`` in all; then a :class:`StorageError` names the URL, the
operation and the last cause.

>>> storage.write_bytes("memory://demo/a.txt", b"hi")  # doctest: +SKIP
>>> storage.walk("memory://demo"), storage.size("memory://demo/a.txt")  # doctest: +SKIP
(['a.txt'], 2)
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import random
import re
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol, TypeVar

import google_crc32c

from tfshards.errors import OptionsError, StorageError

Location = str | os.PathLike
StorageOptions = Mapping[str, Any] | None

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/@]*@")
# The extra of tfshards that installs each protocol's fsspec package.
EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs"}
RETRY_SECONDS = 60.0
_FIRST_DELAY = 0.25
_CHUNK = 4 * 2**20
_T = TypeVar("_T")


@dataclass(frozen=True)
class FileStat:
    """Size in bytes, and a token that changes when the file is rewritten (mtime, ETag...)."""

    size: int
    version: str


def is_url(location: Location) -> bool:
    """True for ``scheme://...``; everything else is a local path."""
    return isinstance(location, str) and _URL.match(location) is not None


def display(location: Location) -> str:
    """The location as shown in messages and manifests: a URL without ``user:secret@``."""
    text = os.fspath(location)
    return _USERINFO.sub(r"\1", text) if is_url(text) else text


def resolved(location: Location) -> str:
    """An absolute local path, or the URL without a trailing slash (for comparisons)."""
    if is_url(location):
        return display(location).rstrip("/")
    return str(Path(location).resolve())


def join(root: Location, *names: str) -> Location:
    """``root/name/...``: a Path under a local root, a string under a URL."""
    if is_url(root):
        return "/".join([root.rstrip("/"), *names])
    return Path(root).joinpath(*names)


def name(location: Location) -> str:
    """The last component: ``s3://b/x/001.png`` -> ``001.png``."""
    return os.fspath(location).rstrip("/").rsplit("/", 1)[-1]


def filesystem(url: str, storage_options: StorageOptions = None):
    """``(fsspec filesystem, path inside it)`` for a URL; a clear error when its package is
    missing. Filesystems are cached by fsspec, one per protocol and options."""
    protocol = url.split("://", 1)[0]
    try:
        import fsspec.core
    except ImportError as exc:
        raise StorageError(
            f"{display(url)}: URLs need fsspec: pip install fsspec (or {_hint(protocol)})"
        ) from exc
    try:
        return fsspec.core.url_to_fs(url, **_with_client_defaults(protocol, storage_options))
    except ImportError as exc:
        raise StorageError(
            f"{display(url)}: the {protocol}:// protocol needs a package that is not "
            f"installed: {_hint(protocol)} ({exc})"
        ) from exc
    except ValueError as exc:
        raise StorageError(f"{display(url)}: {exc}") from exc


# Retries happen in one place, :func:`retrying`, which bounds their total time; the
# client's own retry loop (botocore: 5 attempts with backoff) would multiply it (measured
# against a stopped server: 69 s instead of 4). The caller's options win.
_CLIENT_DEFAULTS: dict[str, dict[str, Any]] = {
    "s3": {"config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 10}},
}


def _with_client_defaults(protocol: str, storage_options: StorageOptions) -> dict[str, Any]:
    merged = {**_CLIENT_DEFAULTS.get(EXTRAS.get(protocol, protocol), {})}
    merged.update(storage_options or {})
    return merged


def _hint(protocol: str) -> str:
    extra = EXTRAS.get(protocol)
    if extra:
        return f'pip install "tfshards[{extra}]"'
    return f"install the fsspec implementation of {protocol}:// (see fsspec's documentation)"


def parse_options(items: Sequence[str]) -> dict[str, Any]:
    """``--storage-option KEY=VALUE`` flags as a storage_options dict.

    Values that read as JSON take that type (``anon=true``, ``max_concurrency=8``);
    dotted keys nest (``client_kwargs.region_name=eu-west-1``). Errors name the flag's
    key, never its value (it may be a secret).
    """
    options: dict[str, Any] = {}
    for number, item in enumerate(items, start=1):
        key, sep, text = item.partition("=")
        if not sep or not key.strip():  # nothing of it is shown: it may be a pasted secret
            raise OptionsError(
                f"--storage-option number {number} is not KEY=VALUE "
                "(e.g. --storage-option profile=training)"
            )
        try:
            value = json.loads(text)
        except ValueError:
            value = text
        *parents, last = key.strip().split(".")
        target = options
        for part in parents:
            target = target.setdefault(part, {})
            if not isinstance(target, dict):
                raise OptionsError(f"--storage-option {key!r}: {part} is both a value and a group")
        target[last] = value
    return options


def forget(location: Location, storage_options: StorageOptions = None) -> None:
    """Drop fsspec's cached listings under a URL (other processes may have written there)."""
    if is_url(location):
        fs, path = filesystem(location, storage_options)
        fs.invalidate_cache(path)


# ---------------------------------------------------------------- retries


def _status(exc: BaseException) -> int | None:
    """The HTTP status an exception carries, if any (botocore, aiohttp, gcsfs)."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    for attribute in ("status", "code", "status_code"):
        value = getattr(exc, attribute, None)
        if isinstance(value, int) and 100 <= value < 600:
            return value
    return None


_TRANSIENT_NAMES = frozenset(
    {
        "EndpointConnectionError",
        "ConnectTimeoutError",
        "ReadTimeoutError",
        "ConnectionClosedError",
        "ClientConnectorError",
        "ClientOSError",
        "ServerDisconnectedError",
        "ServerTimeoutError",
        "ClientPayloadError",
        "TransferEncodingError",
        "IncompleteRead",
        "RetryError",
    }
)
_TRANSIENT_ERRNOS = frozenset(
    {errno.ECONNRESET, errno.ECONNREFUSED, errno.ECONNABORTED, errno.ETIMEDOUT, errno.EPIPE}
)
_TRANSIENT_WORDS = ("SlowDown", "Throttl", "RequestTimeout", "InternalError", "ServiceUnavailable")


def transient(exc: BaseException) -> bool:
    """Whether retrying may help: a dropped connection, a timeout, a 5xx or throttling.
    Missing objects and refused credentials are final."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, FileNotFoundError | PermissionError | IsADirectoryError):
            return False
        status = _status(exc)
        if status is not None:
            return status >= 500 or status in (408, 429)
        if isinstance(exc, ConnectionError | TimeoutError):
            return True
        if isinstance(exc, OSError) and exc.errno in _TRANSIENT_ERRNOS:
            return True
        if any(kind.__name__ in _TRANSIENT_NAMES for kind in type(exc).__mro__):
            return True
        if any(word in str(exc) for word in _TRANSIENT_WORDS):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def retrying(
    what: str,
    location: Location,
    call: Callable[[], _T],
    *,
    seconds: float | None = None,
) -> _T:
    """``call()``, retried with exponential backoff and jitter while errors are transient,
    for at most ``seconds`` (default ``RETRY_SECONDS``); then a StorageError naming the
    operation, the URL and the cause."""
    deadline = time.monotonic() + (RETRY_SECONDS if seconds is None else seconds)
    delay = _FIRST_DELAY
    attempts = 0
    while True:
        attempts += 1
        try:
            return call()
        except StorageError:
            raise
        except FileNotFoundError:
            raise
        except Exception as exc:  # noqa: BLE001 - classified, then re-raised with the URL
            left = deadline - time.monotonic()
            if not transient(exc) or left <= 0:
                tried = f" after {attempts} attempts" if attempts > 1 else ""
                raise StorageError(
                    f"{display(location)}: cannot {what}{tried} ({type(exc).__name__}: {exc})"
                ) from exc
            time.sleep(min(delay * (0.5 + random.random()), max(left, 0.0)))
            delay = min(delay * 2, 8.0)


# ---------------------------------------------------------------- operations


def _fresh(location: str, storage_options: StorageOptions):
    """The filesystem and path, with fsspec's cached listings of that path dropped: another
    process or host may have written there since (a stale listing says "missing")."""
    fs, path = filesystem(location, storage_options)
    fs.invalidate_cache(path)
    return fs, path


def exists(location: Location, storage_options: StorageOptions = None) -> bool:
    if not is_url(location):
        return os.path.exists(location)
    fs, path = _fresh(location, storage_options)
    return retrying("check whether it exists", location, lambda: fs.exists(path))


def isdir(location: Location, storage_options: StorageOptions = None) -> bool:
    """A local folder; for a URL, a prefix with at least one object under it (or a bucket)."""
    if not is_url(location):
        return os.path.isdir(location)
    fs, path = _fresh(location, storage_options)
    return retrying("list", location, lambda: fs.isdir(path))


def stat(location: Location, storage_options: StorageOptions = None) -> FileStat:
    """Size and version token; FileNotFoundError when absent."""
    if not is_url(location):
        result = os.stat(location)
        return FileStat(result.st_size, str(result.st_mtime_ns))
    fs, path = _fresh(location, storage_options)
    info = retrying("look up", location, lambda: fs.info(path))
    return FileStat(int(info["size"]), _version(info))


def walk_stats(root: Location, storage_options: StorageOptions = None) -> dict[str, FileStat]:
    """Every file under root (relative name -> size and version) from one listing: no
    request per object for a URL."""
    if not is_url(root):
        return {name: stat(Path(root) / name) for name in walk(root)}
    fs, path = _fresh(root, storage_options)
    found = retrying("list", root, lambda: fs.find(path, detail=True))
    prefix = path.rstrip("/") + "/"
    return {
        key[len(prefix) :]: FileStat(int(info["size"]), _version(info))
        for key, info in found.items()
        if key.startswith(prefix)
    }


def _version(info: Mapping[str, Any]) -> str:
    for key in ("ETag", "etag", "generation", "md5Hash", "LastModified", "mtime", "created"):
        if info.get(key) is not None:
            return str(info[key])
    return ""


def size(location: Location, storage_options: StorageOptions = None) -> int:
    return stat(location, storage_options).size


def open_file(location: Location, mode: str = "rb", storage_options: StorageOptions = None) -> IO:
    """A file object; for a URL opened for writing, the object appears whole on close."""
    if not is_url(location):
        return open(location, mode)  # noqa: SIM115 - the caller closes it
    fs, path = _fresh(location, storage_options)
    return retrying(f"open ({mode})", location, lambda: fs.open(path, mode))


def read_bytes(location: Location, storage_options: StorageOptions = None) -> bytes:
    if not is_url(location):
        return Path(location).read_bytes()
    fs, path = _fresh(location, storage_options)
    return retrying("read", location, lambda: fs.cat_file(path))


def write_bytes(location: Location, data: bytes, storage_options: StorageOptions = None) -> None:
    """Write a whole file atomically: readers see the old content, none, or all of this.

    Local: a temporary name, fsync, rename. URL: one upload (objects appear whole)."""
    if is_url(location):
        fs, path = filesystem(location, storage_options)
        retrying("write", location, lambda: fs.pipe_file(path, data))
        return
    target = Path(location)
    tmp = target.with_name(f".{target.name}.tmp")
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, target)


def walk(
    root: Location, storage_options: StorageOptions = None, *, skip_hidden_folders: bool = False
) -> list[str]:
    """Every file under root, as '/'-separated names relative to it, sorted.

    Local folders are walked with ``os.walk`` without following folder links (so a link
    loop cannot hang it); URLs are listed with one recursive ``find``. With
    ``skip_hidden_folders``, nothing under a folder whose name starts with '.' is listed.
    """
    if is_url(root):
        fs, path = _fresh(root, storage_options)
        found = retrying("list", root, lambda: fs.find(path))
        prefix = path.rstrip("/") + "/"
        names = [item[len(prefix) :] for item in found if item.startswith(prefix)]
        if skip_hidden_folders:
            names = [n for n in names if not any(p.startswith(".") for p in n.split("/")[:-1])]
        names.sort()
        return names
    found: list[str] = []

    def on_error(exc: OSError) -> None:
        raise exc

    top = os.fspath(root)
    for folder, subfolders, files in os.walk(top, onerror=on_error):
        if skip_hidden_folders:
            subfolders[:] = [d for d in subfolders if not d.startswith(".")]
        prefix = os.path.relpath(folder, top).replace(os.sep, "/")
        prefix = "" if prefix == "." else prefix + "/"
        found.extend(prefix + entry for entry in files)
    found.sort()
    return found


def makedirs(location: Location) -> None:
    """Create a local folder; object stores have no folders to create."""
    if not is_url(location):
        os.makedirs(location, exist_ok=True)


def put(local: Location, location: Location, storage_options: StorageOptions = None) -> None:
    """Copy a local file to ``location`` whole (one object upload for a URL)."""
    if not is_url(location):
        target = Path(location)
        tmp = target.with_name(f".{target.name}.tmp")
        shutil.copyfile(local, tmp)
        os.replace(tmp, target)
        return
    fs, path = filesystem(location, storage_options)
    retrying("upload", location, lambda: fs.put_file(os.fspath(local), path))


def get(location: Location, local: Location, storage_options: StorageOptions = None) -> None:
    """Copy ``location`` to a local file, under a temporary name renamed when complete."""
    target = Path(local)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        if is_url(location):
            fs, path = _fresh(location, storage_options)
            retrying("download", location, lambda: fs.get_file(path, os.fspath(tmp)))
        else:
            shutil.copyfile(location, tmp)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


class RunningDigest(Protocol):
    """What a download is hashed with: hashlib's interface."""

    def update(self, data: bytes, /) -> None: ...

    def hexdigest(self) -> str: ...


class Crc32cDigest(google_crc32c.Checksum):
    """CRC-32C with hashlib's interface (``update``, ``hexdigest`` as str): a whole-file
    check at 15-20x sha256's speed here (google-crc32c's hardware CRC: 21 GB/s against
    1.4, benchmarks/studies/download_costs.py). It tells a corrupt, truncated or stale
    object from the right one; it is no defence against someone who may write to the
    bucket (they may write the manifest too)."""

    def hexdigest(self) -> str:
        return super().hexdigest().decode()


DIGESTS: dict[str, Callable[[], RunningDigest]] = {"sha256": hashlib.sha256, "crc32c": Crc32cDigest}
# google-crc32c's pure-Python fallback is far slower than sha256: downloads then use sha256.
NATIVE_CRC32C = google_crc32c.implementation == "c"


def download_hashed(
    location: Location,
    local: Location,
    storage_options: StorageOptions = None,
    digest: str = "sha256",
) -> tuple[int, str]:
    """Copy ``location`` into the local file ``local`` (created or truncated; the caller
    owns the name and renames it once it has checked it) and return its ``(size, hex
    digest)`` (``digest``: a name in ``DIGESTS``), hashed as the bytes arrive, so the
    copy is never read back to check it.

    From S3, the object's body is streamed ``_CHUNK`` at a time into the file with
    botocore's own response checksum off (the caller's digest comparison replaces it;
    measured: its CRC cost a quarter of the download's CPU). Other URLs are read in
    ``_CHUNK`` blocks through fsspec. A transient failure restarts the whole copy.
    """
    new_digest = DIGESTS[digest]
    if not is_url(location):
        with open(location, "rb") as source:
            return _copy_hashed(lambda: source.read(_CHUNK), local, new_digest())
    fs, path = _fresh(location, _download_options(location, storage_options))
    # s3fs's public calls either write in 64 KiB pieces (get_file) or hold the whole
    # object (cat_file); its _call_s3 gives the streaming body. Without it: fsspec blocks.
    if hasattr(fs, "_call_s3") and hasattr(fs, "split_path"):

        def call() -> tuple[int, str]:
            from fsspec.asyn import sync

            return sync(fs.loop, _s3_body_hashed, fs, path, local, new_digest())

    else:

        def call() -> tuple[int, str]:
            with fs.open(path, "rb", block_size=_CHUNK, cache_type="none") as source:
                return _copy_hashed(lambda: source.read(_CHUNK), local, new_digest())

    return retrying("download", location, call)


def _download_options(location: str, storage_options: StorageOptions) -> StorageOptions:
    """For S3, the caller's options with botocore's response checksum validation only
    where S3 requires it (the download's own digest replaces it), unless the caller set it."""
    if EXTRAS.get(location.split("://", 1)[0]) != "s3":
        return storage_options
    options = dict(_with_client_defaults("s3", storage_options))
    config = dict(options.get("config_kwargs") or {})
    config.setdefault("response_checksum_validation", "when_required")
    options["config_kwargs"] = config
    return options


async def _s3_body_hashed(
    fs: Any, path: str, local: Location, digest: RunningDigest
) -> tuple[int, str]:
    """One GET of an S3 object, its body streamed into ``local`` and hashed on the way."""
    bucket, key, version = fs.split_path(path)
    extra = {"VersionId": version} if version else {}
    response = await fs._call_s3("get_object", Bucket=bucket, Key=key, **extra)
    body = response["Body"]
    try:
        size = 0
        with open(local, "wb") as target:
            while chunk := await body.read(_CHUNK):
                digest.update(chunk)
                target.write(chunk)
                size += len(chunk)
        return size, digest.hexdigest()
    finally:
        body.close()


def _copy_hashed(
    read: Callable[[], bytes], local: Location, digest: RunningDigest
) -> tuple[int, str]:
    size = 0
    with open(local, "wb") as target:
        while chunk := read():
            digest.update(chunk)
            target.write(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def remove(
    location: Location, storage_options: StorageOptions = None, *, recursive: bool = False
) -> None:
    """Remove a file (or, with ``recursive``, everything under a folder/prefix); a missing
    one is no error."""
    if not is_url(location):
        if recursive and os.path.isdir(location):
            shutil.rmtree(location, ignore_errors=True)
        else:
            Path(location).unlink(missing_ok=True)
        return
    fs, path = filesystem(location, storage_options)

    def call() -> None:
        with contextlib.suppress(FileNotFoundError):
            fs.rm(path, recursive=recursive)

    retrying("remove", location, call)


def get_tree(
    root: Location,
    local: Path,
    storage_options: StorageOptions = None,
    *,
    on_file: Callable[[int], None] | None = None,
    workers: int = 8,
) -> int:
    """Copy every file under ``root`` (a URL or a folder) into the folder ``local``,
    keeping their relative names, ``workers`` at a time (object stores answer each GET
    slowly but many at once). Returns the bytes copied; ``on_file(size)`` follows each
    file. OptionsError when root holds no file."""
    from concurrent.futures import ThreadPoolExecutor

    files = walk_stats(root, storage_options)
    if not files:
        raise OptionsError(f"{display(root)}: not a folder, or an empty one")

    def copy(name: str) -> int:
        target = local / name
        target.parent.mkdir(parents=True, exist_ok=True)
        get(join(root, name), target, storage_options)
        return files[name].size

    with ThreadPoolExecutor(workers, thread_name_prefix="tfshards-get") as pool:
        for size in pool.map(copy, sorted(files)):
            if on_file is not None:
                on_file(size)
    return sum(stat.size for stat in files.values())


def file_digests(local: Location, digests: Sequence[str] = ("sha256",)) -> dict[str, str]:
    """The hex digests (names in ``DIGESTS``) of a local file, in one read of 4 MiB chunks."""
    running = {name: DIGESTS[name]() for name in digests}
    with open(local, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            for digest in running.values():
                digest.update(chunk)
    return {name: digest.hexdigest() for name, digest in running.items()}
