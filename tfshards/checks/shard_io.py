"""Open a shard for reading in pure Python: hashing, decompression, records, pixels."""

from __future__ import annotations

import gzip
import hashlib
import io
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from PIL import Image

from tfshards.schemas.tfrecord import iter_records, parse_example

_CHUNK = 4 * 2**20


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


class _ZlibReader(io.RawIOBase):
    """A readable stream over a zlib-compressed file."""

    def __init__(self, path: Path) -> None:
        self._file = open(path, "rb")  # noqa: SIM115 - closed in close()
        self._inflate = zlib.decompressobj()
        self._buffer = b""

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        while size < 0 or len(self._buffer) < size:
            chunk = self._file.read(_CHUNK)
            if not chunk:
                self._buffer += self._inflate.flush()
                break
            self._buffer += self._inflate.decompress(chunk)
        if size < 0:
            size = len(self._buffer)
        out, self._buffer = self._buffer[:size], self._buffer[size:]
        return out

    def close(self) -> None:
        self._file.close()
        super().close()


def open_records(path: Path, compression: str):
    """A binary stream of the shard's uncompressed TFRecord bytes."""
    if compression == "gzip":
        return gzip.open(path, "rb")
    if compression == "zlib":
        return _ZlibReader(path)
    return open(path, "rb")  # noqa: SIM115 - the caller closes it


def shard_examples(path: Path, compression: str) -> Iterator[dict[str, bytes | int]]:
    """Every record of a shard as a feature dict; raises on corrupt framing or data."""
    with open_records(path, compression) as stream:
        for data in iter_records(stream):
            yield parse_example(data)


def decode_pixels(encoded: bytes, fmt: str, height: int, width: int, channels: int) -> np.ndarray:
    """uint8 [height, width, channels]; raises ValueError when the bytes disagree."""
    if fmt == "raw":
        expected = height * width * channels
        if len(encoded) != expected:
            raise ValueError(f"raw pixels are {len(encoded)} bytes, expected {expected}")
        return np.frombuffer(encoded, np.uint8).reshape(height, width, channels)
    if fmt not in ("png", "jpeg"):
        raise ValueError(f"unknown pixel format {fmt!r}")
    with Image.open(io.BytesIO(encoded)) as image:
        image.load()
        mode = {1: "L", 3: "RGB", 4: "RGBA"}[channels]
        pixels = np.asarray(image if image.mode == mode else image.convert(mode))
    if pixels.shape[:2] != (height, width):
        raise ValueError(
            f"decodes to {pixels.shape[0]}x{pixels.shape[1]}, record says {height}x{width}"
        )
    return pixels.reshape(height, width, channels)
