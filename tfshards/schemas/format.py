"""The on-disk format in one place: pixel formats, encodings, compressions, file names.

Everything tfshards writes or reads is named here; writer, reader, verify,
inspect, Beam and TFDS export only call this module. Adding an encoding or a
compression is one entry below (plus tests).

Pixel formats: what a record's ``image/format`` or ``mask/format`` says its
``*/encoded`` bytes are. Each knows how to decode itself with NumPy (checks)
and with TensorFlow (the reader):

- ``png``:  a PNG file (8-bit grayscale, RGB or RGBA; or 16-bit grayscale).
- ``jpeg``: a JPEG file (8-bit; grayscale or RGB).
- ``raw``:  the pixels in row-major height x width x channels order, uint8, or
  uint16 little-endian (the manifest's ``image.dtype`` says which; masks are uint8).
- ``deflate``: those raw pixels as one zlib stream (RFC 1950), written by ISA-L
  where installed, else zlib (``schemas/deflate.py``).

Image sample types and channel counts: uint8 or uint16 (:data:`IMAGE_DTYPES`), 1 to
:data:`MAX_CHANNELS` channels. raw and deflate store every one; PNG 1, 3 or 4 channels
of uint8 and 1 of uint16 (Pillow writes no 16-bit colour PNG); JPEG 1 or 3 of uint8.

The TensorFlow decoders deliver an image's bytes: uint8 [H, W, C x itemsize], the
uint16 samples' little-endian bytes side by side, which the reader turns into uint16
(``tf.bitcast``) only when it finishes a batch; so every stage before it (crops,
caches, batching) moves bytes whatever the sample type. (``tf.bitcast`` keeps the
host's byte order: little-endian on every host TensorFlow builds for.)

Encodings: what the user asks for; each writes one or two pixel formats, and
carries its parameters (``level``, ``quality``) and its TFDS form:

- ``deflate`` (default): lossless; a zlib stream per record, inflated by ISA-L (or
  zlib) in the reader's parallel fetch calls; on 256x256 RGB data it streams about
  twice as fast as PNG at nearly PNG's size (see benchmarks/README.md).
- ``raw``: the largest shards; the fastest reading when the disk keeps up.
- ``keep``: the source file's own bytes when they already decode to the
  stored pixels (a PNG or JPEG, no EXIF rotation, no resize, no mode change),
  otherwise PNG. The fastest conversion, and the smallest shards for JPEG photos.
  Masks keep PNG sources only: a JPEG mask becomes a PNG of its decoded labels.
- ``png``, ``jpeg``: always re-encoded. ``jpeg`` is lossy and refused for masks.

Compressions: the whole-shard stream (none, gzip, zlib), each with its levels
and default level, and whether index files can seek in it and TFDS read it.

TensorFlow is imported inside the TF decoders only: conversion workers never load it.
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import BinaryIO

import numpy as np
from PIL import Image

from tfshards import storage
from tfshards.errors import OptionsError
from tfshards.schemas import deflate
from tfshards.storage import Location

AUTO = "auto"  # an option tfshards resolves from the data (mask encoding, compression)
_MODES = {1: "L", 3: "RGB", 4: "RGBA"}
IMAGE_DTYPES = ("uint8", "uint16")  # the sample types images are stored in
MAX_CHANNELS = 64  # a record's image channels: 1..64 (Sentinel-2 has 13 bands)
_PNG_LAYOUTS = frozenset({(1, "uint8"), (3, "uint8"), (4, "uint8"), (1, "uint16")})
_JPEG_LAYOUTS = frozenset({(1, "uint8"), (3, "uint8")})


def itemsize(dtype: str) -> int:
    """Bytes per sample of an image dtype name (``IMAGE_DTYPES``)."""
    return np.dtype(dtype).itemsize


def stored_dtype(dtype: str) -> np.dtype:
    """The NumPy dtype of stored samples: uint8, or little-endian uint16."""
    return np.dtype(dtype).newbyteorder("<")


# ---------------------------------------------------------------- pixel formats


@dataclass(frozen=True)
class PixelFormat:
    """One way pixel bytes are stored, with its decoders.

    batchable: records of one size can be decoded a whole batch at a time
    (``tf_decode_batch``), which the reader prefers to one op per record.
    exact: every decoder gives the same pixels from the bytes (false for JPEG, whose
    decoders may round differently), so masks may be stored in it.
    """

    name: str
    np_decode: Callable[..., np.ndarray]  # (encoded, height, width, channels, dtype)
    tf_decode: Callable  # (encoded, height, width, channels, itemsize) -> uint8 bytes
    batchable: bool = False
    exact: bool = True


def _pil_decode(
    encoded: bytes, height: int, width: int, channels: int, dtype: str = "uint8"
) -> np.ndarray:
    with Image.open(io.BytesIO(encoded)) as image:
        image.load()
        if dtype != "uint8":  # a 16-bit grayscale PNG: Pillow's I;16 (or I) mode
            if image.mode not in ("I;16", "I"):
                raise ValueError(f"a {image.mode} PNG where 16-bit grayscale is expected")
            pixels = np.asarray(image).astype(np.uint16)
        else:
            mode = _MODES[channels]
            pixels = np.asarray(image if image.mode == mode else image.convert(mode))
    if pixels.shape[:2] != (height, width):
        raise ValueError(
            f"decodes to {pixels.shape[0]}x{pixels.shape[1]}, record says {height}x{width}"
        )
    return pixels.reshape(height, width, channels)


def _raw_decode(
    encoded: bytes, height: int, width: int, channels: int, dtype: str = "uint8"
) -> np.ndarray:
    expected = height * width * channels * itemsize(dtype)
    if len(encoded) != expected:
        raise ValueError(f"raw pixels are {len(encoded)} bytes, expected {expected}")
    pixels = np.frombuffer(encoded, stored_dtype(dtype)).reshape(height, width, channels)
    return pixels.astype(dtype, copy=False)  # native order (a copy on big-endian hosts only)


def _deflate_decode(
    encoded: bytes, height: int, width: int, channels: int, dtype: str = "uint8"
) -> np.ndarray:
    return _raw_decode(deflate.decompress(encoded), height, width, channels, dtype)


def _tf_image_decode(encoded, height, width, channels: int, itemsize: int = 1):
    """PNG or JPEG (mixed under ``keep``), one record, to the pixels Pillow decodes.

    JPEG decoders may differ by a few levels: ``tf.io.decode_image`` uses the fast DCT,
    Pillow (conversion, verify, decode_record) libjpeg's accurate integer DCT, which
    ``INTEGER_ACCURATE`` selects, with the same upsampling: equal pixels (tested).
    """
    import tensorflow as tf

    if itemsize == 2:  # 16-bit grayscale PNG -> its little-endian bytes, [H, W, 2]
        samples = tf.io.decode_png(encoded, channels=channels, dtype=tf.uint16)
        pixels = tf.bitcast(samples, tf.uint8)
        return tf.reshape(pixels, tf.concat([tf.shape(samples)[:2], [2 * channels]], 0))

    def png():
        return tf.io.decode_png(encoded, channels=channels)

    def jpeg():
        return tf.io.decode_jpeg(encoded, channels=channels, dct_method="INTEGER_ACCURATE")

    # JPEG holds 1 or 3 channels: an RGBA record is a PNG (jpeg's kernel refuses 4).
    pixels = png() if channels == 4 else tf.cond(tf.io.is_jpeg(encoded), jpeg, png)
    return tf.ensure_shape(pixels, [None, None, channels])


def _tf_raw_decode(encoded, height, width, channels: int, itemsize: int = 1):
    """Raw bytes -> uint8; one record (scalar) or a batch ([B], same size) -> [..., H, W, C]
    (C x itemsize bytes per pixel)."""
    import tensorflow as tf

    channels *= itemsize
    pixels = tf.io.decode_raw(encoded, tf.uint8)
    # A byte count other than height x width x channels would reshape into other images
    # (half-images, or three gray images per RGB record): an error instead.
    size = tf.shape(pixels, tf.int64)[-1]
    expected = tf.cast(height, tf.int64) * tf.cast(width, tf.int64) * channels
    check = tf.debugging.Assert(
        tf.equal(size, expected),
        [tf.strings.format("a record's pixels are {} bytes where its size, {}x{}x{} "
                           "(HxWxC), makes {}", [size, height, width, channels, expected])],
    )  # fmt: skip
    with tf.control_dependencies([check]):
        pixels = tf.identity(pixels)
    if encoded.shape.rank == 0:
        return tf.reshape(pixels, tf.stack([height, width, channels]))
    return tf.reshape(pixels, (-1, height, width, channels))


def _tf_deflate_decode(encoded, height, width, channels: int, itemsize: int = 1):
    import tensorflow as tf

    inflated = tf.io.decode_compressed(encoded, "ZLIB")
    return _tf_raw_decode(inflated, height, width, channels, itemsize)


PIXEL_FORMATS: dict[str, PixelFormat] = {
    "png": PixelFormat("png", _pil_decode, _tf_image_decode),
    "jpeg": PixelFormat("jpeg", _pil_decode, _tf_image_decode, exact=False),
    "raw": PixelFormat("raw", _raw_decode, _tf_raw_decode, batchable=True),
    "deflate": PixelFormat("deflate", _deflate_decode, _tf_deflate_decode, batchable=True),
}


def decode_pixels(
    encoded: bytes, fmt: str, height: int, width: int, channels: int, dtype: str = "uint8"
) -> np.ndarray:
    """NumPy ``dtype`` [height, width, channels]; ValueError when the bytes disagree."""
    if fmt not in PIXEL_FORMATS:
        raise ValueError(f"unknown pixel format {fmt!r}")
    return PIXEL_FORMATS[fmt].np_decode(encoded, height, width, channels, dtype)


# ---------------------------------------------------------------- encodings


@dataclass(frozen=True)
class SourceFile:
    """A source file's bytes and whether they decode to exactly the pixels to store."""

    data: bytes
    format: str  # "png", "jpeg", ... (lower case, as Pillow names it)
    reusable: bool


TFDS_IMAGE = "image"  # tfds.features.Image reads the PNG/JPEG bytes


@dataclass(frozen=True)
class Encoding:
    """A user-facing encoding: how pixels become bytes, with its parameters.

    tfds_form: how TFDS reads the bytes: ``TFDS_IMAGE`` (a ``tfds.features.Image``), or
    the name of a ``tfds.features.Encoding`` of a ``Tensor`` feature (``"ZLIB"``, ``"BYTES"``).
    level: the zlib level (0-9, see ``schemas/deflate.py``); quality: the JPEG quality.
    """

    name: str
    encoder: Callable[[Encoding, np.ndarray, SourceFile], tuple[bytes, str]]
    formats: tuple[str, ...]
    tfds_form: str
    lossless: bool = True
    layouts: frozenset[tuple[int, str]] | None = _PNG_LAYOUTS  # (channels, dtype); None: all
    level: int | None = None
    quality: int | None = None

    def encode(self, pixels: np.ndarray, source: SourceFile) -> tuple[bytes, str]:
        """(encoded bytes, pixel format name) of one image or mask."""
        return self.encoder(self, pixels, source)

    @property
    def batchable(self) -> bool:
        return all(PIXEL_FORMATS[name].batchable for name in self.formats)

    def tf_decode(self, encoded, height, width, channels: int, itemsize: int = 1):
        """Decode one record (or, when ``batchable``, a same-size batch) with TensorFlow
        into uint8 bytes [..., H, W, channels x itemsize]."""
        fmt = PIXEL_FORMATS[self.formats[0]]
        return fmt.tf_decode(encoded, height, width, channels, itemsize)

    def refuses(self, channels: int, dtype: str) -> str | None:
        """Why this encoding cannot store images of ``channels`` x ``dtype``, or None."""
        if self.layouts is None or (channels, dtype) in self.layouts:
            return None
        held = ", ".join(f"{c} x {d}" for c, d in sorted(self.layouts, key=lambda x: x[::-1]))
        return (
            f"encoding {self.name!r} cannot store {channels} channel(s) of {dtype}; it stores "
            f"{held} (channels x dtype); raw and deflate store every channel count and dtype"
        )


def _refused(encoding: Encoding, pixels: np.ndarray) -> None:
    reason = encoding.refuses(pixels.shape[2] if pixels.ndim == 3 else 1, pixels.dtype.name)
    if reason is not None:
        raise ValueError(reason)


def _png(encoding: Encoding, pixels: np.ndarray, source: SourceFile) -> tuple[bytes, str]:
    _refused(encoding, pixels)
    buffer = io.BytesIO()
    Image.fromarray(_squeeze_gray(pixels)).save(buffer, format="PNG")
    return buffer.getvalue(), "png"


def _jpeg(encoding: Encoding, pixels: np.ndarray, source: SourceFile) -> tuple[bytes, str]:
    _refused(encoding, pixels)
    buffer = io.BytesIO()
    Image.fromarray(_squeeze_gray(pixels)).save(buffer, format="JPEG", quality=encoding.quality)
    return buffer.getvalue(), "jpeg"


def _stored(pixels: np.ndarray) -> np.ndarray:
    """Contiguous samples in their stored byte order (uint16: little-endian)."""
    if pixels.dtype.name not in IMAGE_DTYPES:
        raise ValueError(f"{pixels.dtype} pixels; tfshards stores {' and '.join(IMAGE_DTYPES)}")
    return np.ascontiguousarray(pixels, dtype=stored_dtype(pixels.dtype.name))


def _raw(encoding: Encoding, pixels: np.ndarray, source: SourceFile) -> tuple[bytes, str]:
    return _stored(pixels).tobytes(), "raw"


def _deflate(encoding: Encoding, pixels: np.ndarray, source: SourceFile) -> tuple[bytes, str]:
    return deflate.compress(_stored(pixels), encoding.level), "deflate"


def _keep(encoding: Encoding, pixels: np.ndarray, source: SourceFile) -> tuple[bytes, str]:
    if source.reusable and source.format in encoding.formats:
        return source.data, source.format
    return _png(encoding, pixels, source)


def _squeeze_gray(pixels: np.ndarray) -> np.ndarray:
    return pixels[:, :, 0] if pixels.ndim == 3 and pixels.shape[2] == 1 else pixels


ENCODINGS: dict[str, Encoding] = {
    # zlib level 1: on 256x256 RGB, level 3 was 0.7% smaller at 1.3x the time and level 6
    # 3% smaller at 3.3x (zlib); inflating costs the same at every level. With ISA-L every
    # level 1-9 is its level 3 (schemas/deflate.py), so the level matters for zlib only.
    "deflate": Encoding("deflate", _deflate, ("deflate",), "ZLIB", layouts=None, level=1),
    "raw": Encoding("raw", _raw, ("raw",), "BYTES", layouts=None),
    "keep": Encoding("keep", _keep, ("png", "jpeg"), TFDS_IMAGE),
    "png": Encoding("png", _png, ("png",), TFDS_IMAGE),
    "jpeg": Encoding(
        "jpeg", _jpeg, ("jpeg",), TFDS_IMAGE, lossless=False, layouts=_JPEG_LAYOUTS, quality=95
    ),
}
DEFAULT_ENCODING = "deflate"


def _for_masks(encoding: Encoding) -> Encoding:
    """The encoding as masks use it: ``keep`` reuses PNG sources only; a JPEG mask is
    stored as a PNG of the labels Pillow decoded from it, the ones validated and counted
    (other JPEG decoders may give other labels)."""
    exact = tuple(name for name in encoding.formats if PIXEL_FORMATS[name].exact)
    return encoding if exact == encoding.formats else replace(encoding, formats=exact)


# Masks hold class indices: a lossy encoding would invent classes at edges.
MASK_ENCODINGS: dict[str, Encoding] = {n: _for_masks(e) for n, e in ENCODINGS.items() if e.lossless}


def image_encoding(name: str) -> Encoding:
    return _lookup(ENCODINGS, name, "image")


def mask_encoding(name: str) -> Encoding:
    if name in ENCODINGS and name not in MASK_ENCODINGS:
        raise OptionsError(
            f"mask encoding {name!r} is refused: it is lossy and would change class indices "
            f"at object edges; use one of {', '.join(sorted(MASK_ENCODINGS))}"
        )
    return _lookup(MASK_ENCODINGS, name, "mask")


def resolved_mask_encoding(mask_encoding_name: str, image_encoding_name: str) -> str:
    """``AUTO`` resolved by :func:`auto_mask_encoding`; any other name as given."""
    if mask_encoding_name != AUTO:
        return mask_encoding_name
    return auto_mask_encoding(image_encoding_name)


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
    """A whole-shard compression and what it allows.

    levels / default_level: zlib levels it takes (empty for none); index_seekable: byte
    offsets in index files (``.idx``, for DALI and the tfrecord package) point into the
    file; tfds_readable: TFDS reads such shards; tf_name: ``TFRecordDataset``'s
    ``compression_type``; open: a readable stream of the TFRecord bytes.
    """

    name: str
    suffix: str
    compressed: bool
    tf_name: str
    open: Callable[[Path], BinaryIO]
    levels: range = range(0)
    default_level: int | None = None
    index_seekable: bool = False
    tfds_readable: bool = False
    wbits: int | None = None  # the zlib window bits selecting the container

    def compressor(self, level: int | None = None):
        """A streaming compressor (``compress``, ``flush``), or None when uncompressed."""
        if not self.compressed:
            return None
        return deflate.compressobj(self.default_level if level is None else level, self.wbits)


class _ZlibReader(io.RawIOBase):
    """A readable stream over a zlib-compressed file."""

    _CHUNK = 4 * 2**20

    def __init__(self, path: Path) -> None:
        self._file = open(path, "rb")  # noqa: SIM115 - closed in close()
        self._inflate = deflate.decompressobj(deflate.ZLIB_WBITS)
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


# Level 1 for shards: several times faster than 6 for a few % more bytes (zlib; ISA-L
# writes every level 1-9 alike, see schemas/deflate.py).
_SHARD_LEVEL = 1
NO_COMPRESSION = "none"
_ZLIB_LEVELS = {"levels": deflate.LEVELS, "default_level": _SHARD_LEVEL}
COMPRESSIONS: dict[str, Compression] = {
    NO_COMPRESSION: Compression(
        NO_COMPRESSION, "", False, "", _open_plain, index_seekable=True, tfds_readable=True
    ),
    "gzip": Compression(
        "gzip", ".gz", True, "GZIP", deflate.open_gzip, wbits=deflate.GZIP_WBITS, **_ZLIB_LEVELS
    ),
    "zlib": Compression(
        "zlib", ".zz", True, "ZLIB", _ZlibReader, wbits=deflate.ZLIB_WBITS, **_ZLIB_LEVELS
    ),
}
COMPRESSION_LEVELS = deflate.LEVELS  # what compression_level accepts, whatever the compression
DEFAULT_COMPRESSION_LEVEL = _SHARD_LEVEL


def resolved_compression(name: str) -> str:
    """``AUTO`` is none: deflate and PNG/JPEG bytes are compressed already."""
    return NO_COMPRESSION if name == AUTO else name


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
NEXT_NAME = "next"  # in WORK_NAME: the new dataset --overwrite builds beside a complete one
CACHE_DIR_NAME = ".tfshards-cache"  # disk caches beside the shards
INDEX_SUFFIX = ".idx"
RECORDS_SUFFIX = ".records"  # a split's per-record table: ``train.records`` (record_table.py)
TFDS_FILES = ("dataset_info.json", "features.json")  # written by export-tfds
TMP_SUFFIX = ".tmp"
SPLITS = ("train", "val", "test")
_SUFFIXES = "|".join(re.escape(c.suffix) for c in COMPRESSIONS.values() if c.suffix)
# What verify reports as a stray shard when the manifest does not list it.
SHARD_LIKE = re.compile(rf"\.tfrecord({_SUFFIXES})?$|-of-\d{{5}}")
# Anything tfshards writes beside the manifest: shards, index files, per-record tables, their
# temporary names.
OWN_FILE = re.compile(
    rf"^\.?({'|'.join(SPLITS)})-\d{{5}}-of-\d{{5}}\.tfrecord({_SUFFIXES})?"
    rf"({re.escape(INDEX_SUFFIX)})?({re.escape(TMP_SUFFIX)})?$"
    rf"|^\.?({'|'.join(SPLITS)}){re.escape(RECORDS_SUFFIX)}({re.escape(TMP_SUFFIX)})?$"
)
OWN_NAMES = frozenset({MANIFEST_NAME, LOCK_NAME, WORK_NAME, CACHE_DIR_NAME})


def shard_file_name(split: str, index: int, count: int, compression_name: str) -> str:
    """``train-00003-of-00016.tfrecord.gz``: split, index, count, compression suffix."""
    return f"{split}-{index:05d}-of-{count:05d}.tfrecord{COMPRESSIONS[compression_name].suffix}"


def record_table_name(split: str) -> str:
    """``train.records``: the per-record table of a split, beside its shards."""
    return f"{split}{RECORDS_SUFFIX}"


def temporary_path(path: Path) -> Path:
    """The name a file is written under before it is renamed into place."""
    return path.with_name(f".{path.name}{TMP_SUFFIX}")


def index_path(shard: Path) -> Path:
    return shard.with_name(shard.name + INDEX_SUFFIX)


def journal_entry(out: Location, shard_file: str) -> Location:
    return storage.join(out, WORK_NAME, JOURNAL_DONE, f"{shard_file}.json")
