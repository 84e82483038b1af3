"""The on-disk format in one place: pixel formats, encodings, compressions, file names.

Everything tfshards writes or reads is named here; writer, reader, verify,
inspect, Beam and TFDS export only call this module. Adding an encoding or a
compression is one entry below (plus tests).

Pixel formats: what a record's ``image/format`` or ``mask/format`` says its
``*/encoded`` bytes are. Each knows how to decode itself with NumPy (checks)
and with TensorFlow (the reader):

- ``png``:  a PNG file (8-bit; grayscale, RGB or RGBA).
- ``jpeg``: a JPEG file (8-bit; grayscale or RGB).
- ``raw``:  the uint8 pixels in row-major height x width x channels order.
- ``deflate``: those raw pixels as one zlib stream (RFC 1950), level 1.

Encodings: what the user asks for; each writes one or two pixel formats:

- ``deflate`` (default): lossless; per record zlib, inflated in parallel by
  ``tf.io.decode_compressed``; on 256x256 RGB data it streams about twice as
  fast as PNG at nearly PNG's size (see benchmarks/README.md).
- ``raw``: the largest shards; the fastest reading when the disk keeps up.
- ``keep``: the source file's own bytes when they already decode to the
  stored pixels (a PNG or JPEG, no EXIF rotation, no resize, no mode change),
  otherwise PNG. The fastest conversion, and the smallest shards for JPEG photos.
- ``png``, ``jpeg``: always re-encoded. ``jpeg`` is lossy and refused for masks.

TensorFlow is imported inside the TF decoders only: conversion workers never load it.
"""

from __future__ import annotations

import gzip
import io
import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
from PIL import Image

from tfshards import storage
from tfshards.errors import OptionsError
from tfshards.storage import Location

JPEG_QUALITY = 95
# zlib level 1 for deflate: measured on 256x256 RGB, level 3 is 0.7% smaller at 1.3x
# the time and level 6 3% smaller at 3.3x; inflating costs the same at every level.
DEFLATE_LEVEL = 1
_MODES = {1: "L", 3: "RGB", 4: "RGBA"}

# ---------------------------------------------------------------- pixel formats


@dataclass(frozen=True)
class PixelFormat:
    """One way pixel bytes are stored, with its decoders.

    batchable: records of one size can be decoded a whole batch at a time
    (``tf_decode_batch``), which the reader prefers to one op per record.
    """

    name: str
    np_decode: Callable[[bytes, int, int, int], np.ndarray]
    tf_decode: Callable  # (encoded, height, width, channels) -> uint8 [H, W, C]
    batchable: bool = False


def _pil_decode(encoded: bytes, height: int, width: int, channels: int) -> np.ndarray:
    with Image.open(io.BytesIO(encoded)) as image:
        image.load()
        mode = _MODES[channels]
        pixels = np.asarray(image if image.mode == mode else image.convert(mode))
    if pixels.shape[:2] != (height, width):
        raise ValueError(
            f"decodes to {pixels.shape[0]}x{pixels.shape[1]}, record says {height}x{width}"
        )
    return pixels.reshape(height, width, channels)


def _raw_decode(encoded: bytes, height: int, width: int, channels: int) -> np.ndarray:
    expected = height * width * channels
    if len(encoded) != expected:
        raise ValueError(f"raw pixels are {len(encoded)} bytes, expected {expected}")
    return np.frombuffer(encoded, np.uint8).reshape(height, width, channels)


def _deflate_decode(encoded: bytes, height: int, width: int, channels: int) -> np.ndarray:
    try:
        pixels = zlib.decompress(encoded)
    except zlib.error as exc:
        raise ValueError(f"deflate stream is corrupt ({exc})") from exc
    return _raw_decode(pixels, height, width, channels)


def _tf_image_decode(encoded, height, width, channels: int):
    """PNG or JPEG (mixed under ``keep``), one record."""
    import tensorflow as tf

    pixels = tf.io.decode_image(encoded, channels=channels, dtype=tf.uint8, expand_animations=False)
    return tf.ensure_shape(pixels, [None, None, channels])


def _tf_raw_decode(encoded, height, width, channels: int):
    """Raw bytes -> uint8; one record (scalar) or a batch ([B], same size) -> [..., H, W, C]."""
    import tensorflow as tf

    pixels = tf.io.decode_raw(encoded, tf.uint8)
    if encoded.shape.rank == 0:
        return tf.reshape(pixels, tf.stack([height, width, channels]))
    return tf.reshape(pixels, (-1, height, width, channels))


def _tf_deflate_decode(encoded, height, width, channels: int):
    import tensorflow as tf

    return _tf_raw_decode(tf.io.decode_compressed(encoded, "ZLIB"), height, width, channels)


PIXEL_FORMATS: dict[str, PixelFormat] = {
    "png": PixelFormat("png", _pil_decode, _tf_image_decode),
    "jpeg": PixelFormat("jpeg", _pil_decode, _tf_image_decode),
    "raw": PixelFormat("raw", _raw_decode, _tf_raw_decode, batchable=True),
    "deflate": PixelFormat("deflate", _deflate_decode, _tf_deflate_decode, batchable=True),
}


def decode_pixels(encoded: bytes, fmt: str, height: int, width: int, channels: int) -> np.ndarray:
    """NumPy uint8 [height, width, channels]; ValueError when the bytes disagree."""
    if fmt not in PIXEL_FORMATS:
        raise ValueError(f"unknown pixel format {fmt!r}")
    return PIXEL_FORMATS[fmt].np_decode(encoded, height, width, channels)


# ---------------------------------------------------------------- encodings


@dataclass(frozen=True)
class SourceFile:
    """A source file's bytes and whether they decode to exactly the pixels to store."""

    data: bytes
    format: str  # "png", "jpeg", ... (lower case, as Pillow names it)
    reusable: bool


@dataclass(frozen=True)
class Encoding:
    """A user-facing encoding: how pixels become bytes, and which formats it writes."""

    name: str
    encode: Callable[[np.ndarray, SourceFile], tuple[bytes, str]]
    formats: tuple[str, ...]
    lossless: bool = True
    channels: tuple[int, ...] = (1, 3, 4)
    tfds_tensor: str | None = None  # a TFDS Tensor feature's encoding reads it (else Image)

    @property
    def batchable(self) -> bool:
        return all(PIXEL_FORMATS[name].batchable for name in self.formats)

    def tf_decode(self, encoded, height, width, channels: int):
        """Decode one record (or, when ``batchable``, a same-size batch) with TensorFlow."""
        return PIXEL_FORMATS[self.formats[0]].tf_decode(encoded, height, width, channels)


def _png(pixels: np.ndarray, source: SourceFile) -> tuple[bytes, str]:
    buffer = io.BytesIO()
    Image.fromarray(_squeeze_gray(pixels)).save(buffer, format="PNG")
    return buffer.getvalue(), "png"


def _jpeg(pixels: np.ndarray, source: SourceFile) -> tuple[bytes, str]:
    buffer = io.BytesIO()
    Image.fromarray(_squeeze_gray(pixels)).save(buffer, format="JPEG", quality=JPEG_QUALITY)
    return buffer.getvalue(), "jpeg"


def _raw(pixels: np.ndarray, source: SourceFile) -> tuple[bytes, str]:
    return np.ascontiguousarray(pixels, dtype=np.uint8).tobytes(), "raw"


def _deflate(pixels: np.ndarray, source: SourceFile) -> tuple[bytes, str]:
    return zlib.compress(np.ascontiguousarray(pixels, dtype=np.uint8), DEFLATE_LEVEL), "deflate"


def _keep(pixels: np.ndarray, source: SourceFile) -> tuple[bytes, str]:
    if source.reusable and source.format in ("png", "jpeg"):
        return source.data, source.format
    return _png(pixels, source)


def _squeeze_gray(pixels: np.ndarray) -> np.ndarray:
    return pixels[:, :, 0] if pixels.ndim == 3 and pixels.shape[2] == 1 else pixels


ENCODINGS: dict[str, Encoding] = {
    "deflate": Encoding("deflate", _deflate, ("deflate",), tfds_tensor="ZLIB"),
    "raw": Encoding("raw", _raw, ("raw",), tfds_tensor="BYTES"),
    "keep": Encoding("keep", _keep, ("png", "jpeg")),
    "png": Encoding("png", _png, ("png",)),
    "jpeg": Encoding("jpeg", _jpeg, ("jpeg",), lossless=False, channels=(1, 3)),
}
DEFAULT_ENCODING = "deflate"
# Masks hold class indices: a lossy encoding would invent classes at edges.
MASK_ENCODINGS: dict[str, Encoding] = {n: e for n, e in ENCODINGS.items() if e.lossless}


def image_encoding(name: str) -> Encoding:
    return _lookup(ENCODINGS, name, "image")


def mask_encoding(name: str) -> Encoding:
    if name in ENCODINGS and name not in MASK_ENCODINGS:
        raise OptionsError(
            f"mask encoding {name!r} is refused: it is lossy and would change class indices "
            f"at object edges; use one of {', '.join(sorted(MASK_ENCODINGS))}"
        )
    return _lookup(MASK_ENCODINGS, name, "mask")


def auto_mask_encoding(image_encoding_name: str) -> str:
    """Masks follow batchable images (so the reader decodes whole batches), else ``keep``."""
    return image_encoding_name if ENCODINGS[image_encoding_name].batchable else "keep"


def _lookup(registry: dict[str, Encoding], name: str, what: str) -> Encoding:
    try:
        return registry[name]
    except KeyError:
        raise OptionsError(
            f"unknown {what} encoding {name!r}; valid encodings: {', '.join(sorted(registry))}"
        ) from None


# ---------------------------------------------------------------- compressions


@dataclass(frozen=True)
class Compression:
    """A whole-shard compression: its file suffix, zlib window, TF name and Python opener."""

    name: str
    suffix: str
    zlib_wbits: int | None  # None: uncompressed
    tf_name: str  # compression_type of tf.data.TFRecordDataset
    open: Callable[[Path], BinaryIO]

    @property
    def compressed(self) -> bool:
        return self.zlib_wbits is not None

    def compressor(self, level: int):
        """A zlib compressobj for this format, or None when uncompressed."""
        if self.zlib_wbits is None:
            return None
        return zlib.compressobj(level, zlib.DEFLATED, self.zlib_wbits)


class _ZlibReader(io.RawIOBase):
    """A readable stream over a zlib-compressed file."""

    _CHUNK = 4 * 2**20

    def __init__(self, path: Path) -> None:
        self._file = open(path, "rb")  # noqa: SIM115 - closed in close()
        self._inflate = zlib.decompressobj()
        self._buffer = b""

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        while size < 0 or len(self._buffer) < size:
            chunk = self._file.read(self._CHUNK)
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


def _open_plain(path: Path) -> BinaryIO:
    return open(path, "rb")  # noqa: SIM115 - the caller closes it


def _open_gzip(path: Path) -> BinaryIO:
    return gzip.open(path, "rb")  # noqa: SIM115 - the caller closes it


COMPRESSIONS: dict[str, Compression] = {
    "none": Compression("none", "", None, "", _open_plain),
    "gzip": Compression("gzip", ".gz", 16 + zlib.MAX_WBITS, "GZIP", _open_gzip),
    "zlib": Compression("zlib", ".zz", zlib.MAX_WBITS, "ZLIB", _ZlibReader),
}
AUTO_COMPRESSION = "auto"


def compression(name: str) -> Compression:
    try:
        return COMPRESSIONS[name]
    except KeyError:
        raise OptionsError(
            f"unknown compression {name!r}; valid compressions: {', '.join(COMPRESSIONS)}"
        ) from None


# ---------------------------------------------------------------- file names

MANIFEST_NAME = "tfshards.json"
LOCK_NAME = ".tfshards.lock"  # flock()ed by a running convert
WORK_NAME = ".tfshards-work"  # the resume journal of a running convert
JOURNAL_JOB = "job.json"  # in WORK_NAME: the job's fingerprint
JOURNAL_DONE = "done"  # in WORK_NAME: one JSON per completed shard
CACHE_DIR_NAME = ".tfshards-cache"  # disk caches beside the shards
INDEX_SUFFIX = ".idx"
TFDS_FILES = ("dataset_info.json", "features.json")  # written by export-tfds
TMP_SUFFIX = ".tmp"
SPLITS = ("train", "val", "test")
_SUFFIXES = "|".join(re.escape(c.suffix) for c in COMPRESSIONS.values() if c.suffix)
# What verify reports as a stray shard when the manifest does not list it.
SHARD_LIKE = re.compile(rf"\.tfrecord({_SUFFIXES})?$|-of-\d{{5}}")
# Anything tfshards writes beside the manifest: shards, index files, their temporary names.
OWN_FILE = re.compile(
    rf"^\.?({'|'.join(SPLITS)})-\d{{5}}-of-\d{{5}}\.tfrecord({_SUFFIXES})?"
    rf"({re.escape(INDEX_SUFFIX)})?({re.escape(TMP_SUFFIX)})?$"
)
OWN_NAMES = frozenset({MANIFEST_NAME, LOCK_NAME, WORK_NAME, CACHE_DIR_NAME})


def shard_file_name(split: str, index: int, count: int, compression_name: str) -> str:
    """``train-00003-of-00016.tfrecord.gz``: split, index, count, compression suffix."""
    return f"{split}-{index:05d}-of-{count:05d}.tfrecord{COMPRESSIONS[compression_name].suffix}"


def temporary_path(path: Path) -> Path:
    """The name a file is written under before it is renamed into place."""
    return path.with_name(f".{path.name}{TMP_SUFFIX}")


def index_path(shard: Path) -> Path:
    return shard.with_name(shard.name + INDEX_SUFFIX)


def journal_entry(out: Location, shard_file: str) -> Location:
    return storage.join(out, WORK_NAME, JOURNAL_DONE, f"{shard_file}.json")
