"""Real object-store servers on 127.0.0.1 for tests: moto's S3 server, a GCS emulator.

``s3_server`` (session scope) starts ``moto_server`` on a free port and stops it at the
end; ``s3_bucket`` points the AWS environment at it (fake credentials, endpoint) and
creates a fresh bucket for one test, returning ``s3://<bucket>``. Nothing is mocked:
s3fs and botocore talk HTTP to the server.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

FAKE_KEY_ID = "testing-key-id"
FAKE_SECRET = "testing-secret-key"
_START_SECONDS = 30


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _program(name: str) -> str | None:
    beside_python = Path(sys.executable).parent / name
    return str(beside_python) if beside_python.exists() else shutil.which(name)


def _wait_until_up(url: str, process: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + _START_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with code {process.returncode} at start")
        try:
            urllib.request.urlopen(url, timeout=1).close()
            return
        except urllib.error.HTTPError:  # it answers: up
            return
        except OSError:
            time.sleep(0.05)
    process.kill()
    raise RuntimeError(f"{what} did not answer on {url} within {_START_SECONDS} s")


@dataclass
class Server:
    endpoint: str
    process: subprocess.Popen

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def start_moto(port: int | None = None, *, log: Path | None = None) -> Server:
    """moto's S3 server; with ``log``, its request log (one line per HTTP request) goes
    there, so tests can count the requests a reader made."""
    program = _program("moto_server")
    if program is None:
        pytest.skip('moto_server is not installed (pip install "tfshards[test]")')
    port = port or free_port()
    sink = open(log, "ab") if log is not None else subprocess.DEVNULL  # noqa: SIM115
    process = subprocess.Popen(
        [program, "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=sink,
    )
    if log is not None:
        sink.close()  # the child holds its own descriptor
    endpoint = f"http://127.0.0.1:{port}"
    _wait_until_up(f"{endpoint}/moto-api/", process, "moto_server")
    return Server(endpoint, process)


def s3_environment(endpoint: str) -> dict[str, str]:
    """What a child process (CLI, Beam worker) needs to reach the test server."""
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": FAKE_KEY_ID,
        "AWS_SECRET_ACCESS_KEY": FAKE_SECRET,
        "AWS_DEFAULT_REGION": "us-east-1",
    }


@pytest.fixture(scope="session")
def s3_server() -> Iterator[Server]:
    server = start_moto()
    yield server
    server.stop()


@pytest.fixture
def s3_bucket(s3_server: Server, monkeypatch: pytest.MonkeyPatch) -> str:
    """``s3://<fresh bucket>`` on the session's server, with the environment pointing at it."""
    for name, value in s3_environment(s3_server.endpoint).items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_CONFIG_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    import s3fs

    bucket = f"tfshards-{uuid.uuid4().hex[:12]}"
    s3fs.S3FileSystem.clear_instance_cache()
    s3fs.S3FileSystem().mkdir(bucket)
    return f"s3://{bucket}"


def s3_objects(url: str) -> dict[str, bytes]:
    """Every object under ``url`` by name relative to it, read with s3fs (no tfshards)."""
    import s3fs

    fs = s3fs.S3FileSystem()
    fs.invalidate_cache()
    root = url.removeprefix("s3://").rstrip("/")
    return {name[len(root) + 1 :]: fs.cat_file(name) for name in fs.find(root)}


def upload_folder(local: Path, url: str) -> None:
    import s3fs

    fs = s3fs.S3FileSystem()
    for path in sorted(local.rglob("*")):
        if path.is_file():
            fs.put_file(str(path), f"{url.removeprefix('s3://')}/{path.relative_to(local)}")


def start_gcs(monkeypatch: pytest.MonkeyPatch, *, bucket: str) -> Server:
    """gcp-storage-emulator (in memory) with one bucket; gcsfs pointed at it.

    gcsfs's experimental bucket-type probe speaks gRPC, which the emulator lacks: it is
    switched off (GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false, read when gcsfs is imported;
    if something imported gcsfs before, gs:// is pointed back at the plain GCSFileSystem).
    """
    program = _program("gcp-storage-emulator")
    if program is None:
        pytest.skip("gcp-storage-emulator is not installed")
    monkeypatch.setenv("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    import fsspec
    import gcsfs.core

    if fsspec.get_filesystem_class("gs") is not gcsfs.core.GCSFileSystem:
        fsspec.register_implementation("gs", gcsfs.core.GCSFileSystem, clobber=True)
    port = free_port()
    process = subprocess.Popen(
        [program, "start", "--host", "127.0.0.1", "--port", str(port), "--in-memory"]
        + ["--default-bucket", bucket],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    _wait_until_up(endpoint, process, "gcp-storage-emulator")
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", endpoint)
    return Server(endpoint, process)
