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
from collections import defaultdict
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from tfshards import storage
from tfshards.errors import OptionsError, PairingError
from tfshards.storage import Location, StorageOptions

IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp"})
SHOWN_PATHS = 5


@dataclass(frozen=True)
class Pair:
    key: str
    image: Location  # a Path, or a URL string for inputs in a bucket
    mask: Location


@dataclass(frozen=True)
class PairingReport:
    pairs: list[Pair]
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


def _walk_files(root: Location, storage_options: StorageOptions = None) -> list[str]:
    """Paths of all files under root relative to it ('/'-separated), sorted.

    Strings, not Path objects: listing and sorting a million files stays fast.
    Local folders: directory links are not followed, so a link loop cannot hang the walk.
    URLs (``s3://bucket/images``) are listed through :mod:`tfshards.storage`.
    """
    if not storage.isdir(root, storage_options):
        # A path given on the command line that is no folder is bad usage (exit 2).
        raise OptionsError(f"{storage.display(root)}: not a folder; check --images and --masks")
    try:
        return storage.walk(root, storage_options, skip_hidden_folders=True)
    except OSError as exc:
        where = exc.filename or storage.display(root)
        raise PairingError(f"{where}: cannot list folder ({exc.strerror or exc})") from exc


def _keyed_files(
    root: Location, pattern: KeyPattern | None, storage_options: StorageOptions = None
) -> tuple[dict[str, list[Location]], int]:
    """Map key -> files under root that match; also count the files ignored."""
    keyed: dict[str, list[Location]] = defaultdict(list)
    ignored = 0
    join = partial(storage.join, root) if storage.is_url(root) else Path(root).joinpath
    for relative in _walk_files(root, storage_options):
        folder, _, name = relative.rpartition("/")
        stem, dot, suffix = name.rpartition(".")
        if name.startswith(".") or not dot or f".{suffix.lower()}" not in IMAGE_SUFFIXES:
            ignored += 1
            continue
        if pattern is None:
            key = relative[: -len(suffix) - 1]
        else:
            name_key = pattern.key_of(name)
            if name_key is None:
                ignored += 1
                continue
            key = f"{folder}/{name_key}" if folder else name_key
        keyed[key].append(join(relative))
    return keyed, ignored


def pair_files(
    images: str | os.PathLike,
    masks: str | os.PathLike | None = None,
    *,
    image_pattern: str | None = None,
    mask_pattern: str | None = None,
    storage_options: StorageOptions = None,
) -> PairingReport:
    """List and pair image/mask files; the result is sorted by key and deterministic.

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
    image_keys, ignored_images = _keyed_files(
        images_root, KeyPattern(image_pattern) if image_pattern else None, storage_options
    )
    mask_keys, ignored_masks = _keyed_files(
        masks_root, KeyPattern(mask_pattern) if mask_pattern else None, storage_options
    )
    ignored = ignored_images + ignored_masks
    if same_folder:
        # One folder walked twice: a file is ignored only if neither pattern matched it.
        matched = {p for ps in image_keys.values() for p in ps} | {
            p for ps in mask_keys.values() for p in ps
        }
        join = (
            partial(storage.join, images_root)
            if storage.is_url(images_root)
            else Path(images_root).joinpath
        )
        ignored = sum(
            1 for p in _walk_files(images_root, storage_options) if join(p) not in matched
        )
    return _match(image_keys, mask_keys, ignored)


def _root(location: str | os.PathLike) -> Location:
    """A URL stays a string (``Path`` would fold ``s3://`` into ``s3:/``); paths become Paths."""
    return location if storage.is_url(location) else Path(location)


def _match(
    image_keys: dict[str, list[Location]], mask_keys: dict[str, list[Location]], ignored: int
) -> PairingReport:
    duplicates = {
        key: image_keys.get(key, []) + mask_keys.get(key, [])
        for key in sorted(image_keys.keys() | mask_keys.keys())
        if len(image_keys.get(key, [])) > 1 or len(mask_keys.get(key, [])) > 1
    }
    pairs = [
        Pair(key, image_keys[key][0], mask_keys[key][0])
        for key in sorted(image_keys.keys() & mask_keys.keys())
        if key not in duplicates
    ]
    return PairingReport(
        pairs=pairs,
        unmatched_images=sorted(
            p
            for k, ps in image_keys.items()
            if k not in mask_keys and k not in duplicates
            for p in ps
        ),
        unmatched_masks=sorted(
            p
            for k, ps in mask_keys.items()
            if k not in image_keys and k not in duplicates
            for p in ps
        ),
        duplicate_keys=duplicates,
        ignored_files=ignored,
    )


def checked_pairs(report: PairingReport, *, allow_unpaired: bool, where: str) -> list[Pair]:
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
