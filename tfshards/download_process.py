"""Downloads from object storage in a helper process, for callers on tf.data's threads.

Why a process: fsspec runs every transfer of an async filesystem (s3fs, gcsfs) on one
event-loop thread of its own. A tf.data iterator dropped inside a reference cycle (an
exception's traceback holds one, for instance) is freed by Python's garbage collector on
whichever thread happens to allocate, and freeing it waits for the iterator's calls in
flight. When that thread is fsspec's loop and the calls in flight are downloads waiting
for that loop, neither ever finishes: the reader hangs. A call that waits only for
another process cannot be caught in that cycle.

Each download is one connection to the helper's socket, so no thread of this process
relays replies (a relay thread could be caught the same way). The helper imports only
the storage layer (not TensorFlow), inherits this process's environment (credentials
come from the same places) and exits when this process closes its stdin or dies. Its
start costs about 0.8 s of CPU (Python, fsspec, the S3 client), so the readers of one
process share it while the environment stays the same.
"""

from __future__ import annotations

import contextlib
import hashlib
import multiprocessing
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from multiprocessing.connection import Client, Connection, Listener
from pathlib import Path

from tfshards import storage
from tfshards.errors import StorageError

_KEY_BYTES = 32
# The helper imports this very tfshards: ``python -m tfshards...`` would put the working
# folder first on sys.path, and a tfshards checkout there (another version) would serve.
_PACKAGE_ROOT = os.fspath(Path(__file__).resolve().parents[1])
_BOOT = (
    "import sys; sys.path.insert(0, {root!r}); "
    "from tfshards.download_process import _serve; _serve(sys.argv[1])"
)
_START_SECONDS = 60.0  # to import fsspec and bind the socket, on a loaded machine


class DownloadProcess:
    """``get(url, local)`` run by a helper process shared by this process's readers: it
    writes the object straight into ``local`` and hashes it as it arrives."""

    def __init__(self) -> None:
        self._start = threading.Lock()
        self._helper: _Helper | None = None
        _instances.add(self)

    def prepare(self) -> None:
        """Start the helper now (it boots while TensorFlow builds the pipeline)."""
        with self._start:
            self._helper = _shared_helper()

    def get(
        self,
        location: str,
        local: Path,
        storage_options: storage.StorageOptions = None,
        digest: str = "sha256",
    ) -> tuple[int, str]:
        """Download ``location`` into ``local`` (as ``storage.download_hashed``): its
        ``(size, hex digest)``, or what it raised. ``local`` is written in place: the
        caller gives a temporary name and renames it once the two match what it expects."""
        request = (location, os.fspath(local), storage_options, digest, storage.RETRY_SECONDS)
        with self._connect(location) as connection:
            connection.send(request)
            try:
                reply = connection.recv()
            except (EOFError, OSError) as exc:
                raise StorageError(
                    f"{storage.display(location)}: cannot download (the download process "
                    f"stopped: {type(exc).__name__})"
                ) from exc
        if isinstance(reply, Exception):
            raise reply
        return reply

    def _connect(self, location: str) -> Connection:
        with self._start:
            if self._helper is None or not self._helper.mine() or not self._helper.running():
                self._helper = _shared_helper()
            helper = self._helper
        return helper.connect(location)


_shared_lock = threading.Lock()
_shared: tuple[str, _Helper] | None = None  # this environment's helper, kept for later readers
_instances: weakref.WeakSet[DownloadProcess] = weakref.WeakSet()


def _shared_helper() -> _Helper:
    """The running helper started under this environment, or a new one."""
    global _shared
    key = hashlib.sha256(repr(sorted(os.environ.items())).encode()).hexdigest()
    with _shared_lock:
        if _shared is None or _shared[0] != key or not _shared[1].running():
            _shared = (key, _Helper.start())
        return _shared[1]


def _forget_after_fork() -> None:
    """A forked child (a DataLoader worker, say) starts a helper of its own when it
    downloads: the parent's is the parent's (its socket and pipe are not shared). Its
    locks are new: one held by another thread of the parent at the fork (starting the
    helper) would stay held here for ever."""
    global _shared, _shared_lock
    _shared_lock = threading.Lock()
    for instance in list(_instances):
        instance._start = threading.Lock()
    if _shared is not None:
        with contextlib.suppress(OSError):
            _shared[1].process.stdin.close()  # this copy of the pipe: the helper still
            # sees its end when the parent closes or dies
        _shared = None


os.register_at_fork(after_in_child=_forget_after_fork)


class _Helper:
    """One started helper process: its socket, key and pipe."""

    def __init__(self, process: subprocess.Popen, folder: str, key: bytes) -> None:
        self.process = process
        self.address = os.path.join(folder, "socket")
        self.key = key
        self.owner = os.getpid()
        # Closing stdin tells the helper to exit; the folder (mode 0700) goes with it. Only
        # the process that started it stops it: a forked child's copy never does.
        weakref.finalize(self, _stop, process, folder, os.getpid())

    @classmethod
    def start(cls) -> _Helper:
        folder = tempfile.mkdtemp(prefix="tfshards-downloads-")
        key = secrets.token_bytes(_KEY_BYTES)
        process = subprocess.Popen(
            [sys.executable, "-c", _BOOT.format(root=_PACKAGE_ROOT), folder],
            stdin=subprocess.PIPE,
            close_fds=True,
        )
        process.stdin.write(key)  # never on the command line
        process.stdin.flush()
        return cls(process, folder, key)

    def mine(self) -> bool:
        """Started by this process (not inherited through a fork)."""
        return self.owner == os.getpid()

    def running(self) -> bool:
        return self.process.poll() is None

    def connect(self, location: str) -> Connection:
        deadline = time.monotonic() + _START_SECONDS
        while True:
            try:
                return Client(self.address, family="AF_UNIX", authkey=self.key)
            except (FileNotFoundError, ConnectionRefusedError):
                if not self.running() or time.monotonic() > deadline:
                    raise StorageError(
                        f"{storage.display(location)}: cannot download (the download "
                        f"process did not start; exit code {self.process.poll()})"
                    ) from None
                time.sleep(0.02)


def _stop(process: subprocess.Popen, folder: str, owner: int) -> None:
    if os.getpid() != owner:
        return
    try:
        process.stdin.close()
        process.wait(timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        process.kill()
    shutil.rmtree(folder, ignore_errors=True)


# ---------------------------------------------------------------- the helper's side


def _serve(folder: str) -> None:
    key = sys.stdin.buffer.read(_KEY_BYTES)
    listener = Listener(os.path.join(folder, "socket"), family="AF_UNIX", authkey=key)
    threading.Thread(target=_exit_with_parent, args=(folder,), daemon=True).start()
    while True:
        try:
            connection = listener.accept()
        except (OSError, EOFError, multiprocessing.AuthenticationError):
            continue  # a client that failed the key check or hung up: refused, served on
        threading.Thread(target=_download, args=(connection,), daemon=True).start()


def _exit_with_parent(folder: str) -> None:
    sys.stdin.buffer.read()  # returns at end of file: the parent closed it or died
    shutil.rmtree(folder, ignore_errors=True)  # a killed parent cannot remove it
    os._exit(0)


def _download(connection: Connection) -> None:
    with connection:
        location, local, storage_options, digest, retry_seconds = connection.recv()
        storage.RETRY_SECONDS = retry_seconds  # the parent's setting; one parent, one value
        try:
            reply: tuple[int, str] | Exception = storage.download_hashed(
                location, local, storage_options, digest
            )
        except Exception as exc:  # noqa: BLE001 - sent back and raised in the caller
            reply = _portable(exc, location)
        connection.send(reply)


def _portable(exc: Exception, location: str) -> Exception:
    """``exc`` if it survives pickling, else a StorageError saying the same."""
    import pickle

    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001 - any failure to pickle
        return StorageError(
            f"{storage.display(location)}: cannot download ({type(exc).__name__}: {exc})"
        )


if __name__ == "__main__":
    _serve(sys.argv[1])
