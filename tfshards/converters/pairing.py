"""Pair image files with mask files by key, and report every file that does not pair.

Default rule: an image and a mask pair up when their paths relative to the
image and mask folders are equal without the extension (``a/001.jpg`` pairs
with ``a/001.png``). With name patterns such as ``image_{key}.png`` and
``{key}_mask.png`` one folder can hold both; the key is the relative folder
plus the ``{key}`` part of the name.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tfshards import storage
from tfshards.converters.pair_table import Pair, PairTable, Strings, decode_name, encode_name
from tfshards.errors import OptionsError, PairingError
from tfshards.storage import Location, StorageOptions

IMAGE_SUFFIXES = frozenset(
    {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".npy"}
)
SHOWN_PATHS = 5
_CHUNK = 65536  # names gathered in Python lists before they move into a NumPy array
Listed = Callable[[int], None]  # told how many more files were listed

__all__ = ["Pair", "PairTable", "PairingReport", "checked_pairs", "list_names", "pair_files"]


@dataclass(frozen=True)
class PairingReport:
    pairs: PairTable
    unmatched_images: list[Location] = field(default_factory=list)
    unmatched_masks: list[Location] = field(default_factory=list)
    duplicate_keys: dict[str, list[Location]] = field(default_factory=dict)
    ignored_files: int = 0

    @property
    def problems(self) -> list[str]:
        lines = []
        if self.unmatched_images:
            lines.append(_listing("images without a mask", self.unmatched_images))
        if self.unmatched_masks:
            lines.append(_listing("masks without an image", self.unmatched_masks))
        if self.duplicate_keys:
            shown = [
                f"{key!r}: " + ", ".join(str(p) for p in paths)
                for key, paths in list(self.duplicate_keys.items())[:SHOWN_PATHS]
            ]
            lines.append(
                f"{len(self.duplicate_keys)} keys claimed by more than one file: "
                + "; ".join(shown)
                + (" ..." if len(self.duplicate_keys) > SHOWN_PATHS else "")
            )
        return lines


def _listing(what: str, paths: list[Location]) -> str:
    shown = ", ".join(str(p) for p in paths[:SHOWN_PATHS])
    more = " ..." if len(paths) > SHOWN_PATHS else ""
    return f"{len(paths)} {what}: {shown}{more}"


class KeyPattern:
    """A file name pattern holding ``{key}`` once, such as ``image_{key}.png``."""

    def __init__(self, pattern: str) -> None:
        if pattern.count("{key}") != 1 or "/" in pattern:
            raise OptionsError(
                f"name pattern {pattern!r} must contain '{{key}}' exactly once and no '/'; "
                "e.g. 'image_{key}.png' or '{key}_mask.png'"
            )
        prefix, suffix = pattern.split("{key}")
        self.pattern = pattern
        self._regex = re.compile(re.escape(prefix) + "(?P<key>.+)" + re.escape(suffix) + r"\Z")

    def key_of(self, name: str) -> str | None:
        match = self._regex.match(name)
        return match.group("key") if match else None


def list_names(root: Location, storage_options: StorageOptions = None) -> Iterator[str]:
    """Names of the files under a folder, relative to it and '/'-separated, in no order.

    The one place that lists input folders. Hidden folders are skipped. A local folder is
    walked with ``os.scandir`` without following folder links (a link loop cannot hang
    it), and its names stream: a folder of millions of files is never a list. A URL
    (``s3://bucket/images``) is listed through :mod:`tfshards.storage`.
    """
    if storage.is_url(root):
        try:
            yield from storage.walk(root, storage_options, skip_hidden_folders=True)
        except OSError as exc:
            where = exc.filename or storage.display(root)
            raise PairingError(f"{where}: cannot list folder ({exc.strerror or exc})") from exc
        return
    root = os.fspath(root)
    pending = [""]
    while pending:
        prefix = pending.pop()
        folder = os.path.join(root, prefix) if prefix else root
        try:
            entries = os.scandir(folder)
        except OSError as exc:
            raise PairingError(f"{exc.filename}: cannot list folder ({exc.strerror})") from exc
        with entries:
            for entry in entries:
                if not _is_folder(entry):
                    yield prefix + entry.name
                elif not entry.name.startswith(".") and not entry.is_symlink():
                    pending.append(prefix + entry.name + "/")


def _is_folder(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False


@dataclass
class _Keyed:
    """The files of one folder that have a key, sorted by (key, name), as bytes arrays."""

    names: np.ndarray
    keys: np.ndarray
    listed: int
    ignored: int


def _keyed_files(
    root: Location, pattern: KeyPattern | None, listed: Listed | None, store: StorageOptions
) -> _Keyed:
    """Key every file under root; count the files ignored (not images, or no match)."""
    if not storage.isdir(root, store):
        # A path given on the command line that is no folder is bad usage (exit 2).
        raise OptionsError(f"{storage.display(root)}: not a folder; check --images and --masks")
    names: list[np.ndarray] = []
    keys: list[np.ndarray] = []
    chunk_names: list[bytes] = []
    chunk_keys: list[bytes] = []
    total = ignored = 0
    for relative in list_names(root, store):
        total += 1
        key = _key_of(relative, pattern)
        if key is None:
            ignored += 1
        else:
            chunk_names.append(encode_name(relative))
            chunk_keys.append(encode_name(key))
        if len(chunk_names) == _CHUNK or (chunk_names and total % _CHUNK == 0):
            names.append(np.array(chunk_names, dtype=bytes))
            keys.append(np.array(chunk_keys, dtype=bytes))
            chunk_names, chunk_keys = [], []
        if listed is not None and total % _CHUNK == 0:
            listed(_CHUNK)
    if listed is not None:
        listed(total % _CHUNK)
    names.append(np.array(chunk_names or [b""], dtype=bytes)[: len(chunk_names)])
    keys.append(np.array(chunk_keys or [b""], dtype=bytes)[: len(chunk_keys)])
    all_names, all_keys = np.concatenate(names), np.concatenate(keys)
    del names, keys
    order = np.argsort(all_names, kind="stable")
    all_names, all_keys = all_names[order], all_keys[order]
    order = np.argsort(all_keys, kind="stable")
    return _Keyed(all_names[order], all_keys[order], total, ignored)


def _key_of(relative: str, pattern: KeyPattern | None) -> str | None:
    folder, _, name = relative.rpartition("/")
    stem, dot, suffix = name.rpartition(".")
    if name.startswith(".") or not dot or f".{suffix.lower()}" not in IMAGE_SUFFIXES:
        return None
    if pattern is None:
        return relative[: -len(suffix) - 1]
    name_key = pattern.key_of(name)
    if name_key is None:
        return None
    return f"{folder}/{name_key}" if folder else name_key


def pair_files(
    images: str | os.PathLike,
    masks: str | os.PathLike | None = None,
    *,
    image_pattern: str | None = None,
    mask_pattern: str | None = None,
    storage_options: StorageOptions = None,
    listed: Listed | None = None,
) -> PairingReport:
    """List and pair image/mask files; the result is sorted by key and deterministic.

    ``listed`` is told how many files were listed as the listing goes (for progress).

    >>> report = pair_files("data/images", "data/masks")  # doctest: +SKIP
    >>> report.pairs[0].key, report.problems  # doctest: +SKIP
    ('0001', [])
    """
    images_root = _root(images)
    masks_root = _root(masks) if masks is not None else images_root
    same_folder = storage.resolved(images_root) == storage.resolved(masks_root)
    if (image_pattern is None) != (mask_pattern is None):
        raise OptionsError("give both --image-pattern and --mask-pattern, or neither")
    if image_pattern is None and same_folder:
        raise OptionsError(
            f"images and masks are both in {images_root}: give --image-pattern and "
            "--mask-pattern (e.g. 'image_{key}.png' and 'mask_{key}.png') to tell them apart"
        )
    image_files = _keyed_files(
        images_root, KeyPattern(image_pattern) if image_pattern else None, listed, storage_options
    )
    mask_files = _keyed_files(
        masks_root, KeyPattern(mask_pattern) if mask_pattern else None, listed, storage_options
    )
    ignored = image_files.ignored + mask_files.ignored
    if same_folder:
        # One folder listed twice: a file is ignored only if neither pattern matched it.
        matched = np.union1d(image_files.names, mask_files.names)
        ignored = image_files.listed - len(matched)
    return _match(images_root, masks_root, image_files, mask_files, ignored)


def _root(location: str | os.PathLike) -> Location:
    """A URL stays a string (``Path`` would fold ``s3://`` into ``s3:/``); paths become Paths."""
    return location if storage.is_url(location) else Path(location)


def _match(
    images_root: Location, masks_root: Location, images: _Keyed, masks: _Keyed, ignored: int
) -> PairingReport:
    """Pair sorted keys by binary search (no sorted copies: memory stays per-pair small)."""
    image_keys, image_first, image_counts = _runs(images.keys)
    mask_keys, mask_first, mask_counts = _runs(masks.keys)
    in_masks = _positions(mask_keys, image_keys)  # -1: no mask has this key
    duplicated = image_counts > 1
    duplicated[in_masks >= 0] |= mask_counts[in_masks[in_masks >= 0]] > 1
    mask_duplicated = np.zeros(len(mask_keys), bool)
    mask_duplicated[mask_counts > 1] = True
    mask_duplicated[in_masks[duplicated & (in_masks >= 0)]] = True
    paired = (in_masks >= 0) & ~duplicated
    pairs = PairTable(
        images_root,
        masks_root,
        Strings.from_fixed(image_keys[paired]),
        Strings.from_fixed(images.names[image_first[paired]]),
        Strings.from_fixed(masks.names[mask_first[in_masks[paired]]]),
    )
    mask_alone = np.ones(len(mask_keys), bool)
    mask_alone[in_masks[in_masks >= 0]] = False
    dup_keys = np.union1d(image_keys[duplicated], mask_keys[mask_duplicated])
    return PairingReport(
        pairs=pairs,
        unmatched_images=_files_with(images_root, images, image_keys[(in_masks < 0) & ~duplicated]),
        unmatched_masks=_files_with(masks_root, masks, mask_keys[mask_alone & ~mask_duplicated]),
        duplicate_keys={
            decode_name(key): _files_of(images_root, images, key)
            + _files_of(masks_root, masks, key)
            for key in dup_keys
        },
        ignored_files=ignored,
    )


def _runs(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Distinct values of a sorted array, the index of each one's first row, their counts."""
    starts = (
        np.flatnonzero(np.concatenate(([True], keys[1:] != keys[:-1])))
        if len(keys)
        else (np.zeros(0, np.int64))
    )
    counts = np.diff(np.append(starts, len(keys)))
    return keys[starts], starts, counts


def _positions(sorted_keys: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Index of each of ``keys`` in ``sorted_keys`` (distinct, sorted), or -1."""
    if not len(sorted_keys):
        return np.full(len(keys), -1, np.int64)
    found = np.searchsorted(sorted_keys, keys)
    np.minimum(found, len(sorted_keys) - 1, out=found)
    found[sorted_keys[found] != keys] = -1
    return found


def _files_with(root: Location, files: _Keyed, keys: np.ndarray) -> list[Location]:
    return sorted(path for key in keys for path in _files_of(root, files, key))


def _files_of(root: Location, files: _Keyed, key: bytes) -> list[Location]:
    """The files claiming ``key``, in name order (keys are sorted)."""
    start = np.searchsorted(files.keys, key, side="left")
    end = np.searchsorted(files.keys, key, side="right")
    return [storage.join(root, decode_name(name)) for name in files.names[start:end]]


def checked_pairs(report: PairingReport, *, allow_unpaired: bool, where: str) -> PairTable:
    """The pairs to convert, or a PairingError describing why there are none to trust."""
    if not report.pairs:
        detail = "; ".join(report.problems) or f"{report.ignored_files} non-image files ignored"
        raise PairingError(f"no image/mask pairs found in {where} ({detail})")
    if report.problems and not allow_unpaired:
        raise PairingError(
            "images and masks do not pair up:\n  "
            + "\n  ".join(report.problems)
            + "\nfix the file names, or pass --allow-unpaired to convert the "
            f"{len(report.pairs)} matched pairs and report the rest"
        )
    return report.pairs
