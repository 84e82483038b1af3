"""Issue 28 point 4: readers that overlap `convert --overwrite` never see a mix.

For a minute, a converter replaces the dataset again and again (A, B, A, ...) while
readers stream it and build and read its disk cache. Every epoch must be one dataset
whole, or stop with tfshards' "replaced while it was being read" (or a manifest error
when a read starts mid-swap); never a mix, never a bare NotFoundError, and no cache
published from a pass whose shards changed.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
import tensorflow as tf
from conftest import write_pairs

import tfshards

SECONDS = 60
CONVERTER = """
import sys, time, tfshards
out, a_images, a_masks, b_images, b_masks, seconds = sys.argv[1:7]
end, turn = time.monotonic() + float(seconds), 0
while time.monotonic() < end:
    images, masks = (b_images, b_masks) if turn % 2 == 0 else (a_images, a_masks)
    tfshards.convert(images, masks, out, options=tfshards.ConvertOptions(num_shards=8),
                     overwrite=True, progress=False)
    turn += 1
print("conversions", turn)
"""


def _digests(dataset) -> list[str]:
    return [
        hashlib.sha1(image.tobytes() + mask.tobytes()).hexdigest()
        for images, masks in dataset
        for image, mask in zip(images.numpy(), masks.numpy(), strict=True)
    ]


def _read(path: Path, cache) -> list[str]:
    return _digests(
        tfshards.read(path, batch_size=25, shuffle=False, image_dtype="uint8", cache=cache)
    )


def _expected_stop(error: Exception) -> bool:
    text = str(error)
    if isinstance(error, tfshards.TfshardsError):
        return True  # e.g. a read that began while the manifest was away
    return isinstance(error, tf.errors.OpError) and (
        "replaced while it was being read" in text or "tfshards" in text
    )


@pytest.mark.timeout(300)
def test_readers_against_repeated_overwrites(tmp_path: Path) -> None:
    a = write_pairs(tmp_path / "a", count=200, size=(16, 16), seed=1)
    b = write_pairs(tmp_path / "b", count=200, size=(16, 16), seed=2)
    live, reference = tmp_path / "live", tmp_path / "reference"
    for out, (images, masks) in ((live, a), (reference, b)):
        tfshards.convert(images, masks, out, options=tfshards.ConvertOptions(num_shards=8))
    a_pairs, b_pairs = set(_read(live, None)), set(_read(reference, None))
    assert len(a_pairs) == 200 and not a_pairs & b_pairs
    args = [str(live), *map(str, (*a, *b)), str(SECONDS)]
    converter = subprocess.Popen([sys.executable, "-c", CONVERTER, *args], text=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    counts = {"whole": 0, "stopped": 0, "mixed": 0, "bare": 0}
    caches = tmp_path / "caches"
    while converter.poll() is None:
        for cache in (None, caches):
            try:
                seen = set(_read(live, cache))
            except Exception as error:  # noqa: BLE001 - classified below
                counts["stopped" if _expected_stop(error) else "bare"] += 1
                if not _expected_stop(error):
                    print(type(error).__name__, str(error)[:300])
                continue
            whole = seen in (a_pairs, b_pairs)
            counts["whole" if whole else "mixed"] += 1
    out, err = converter.communicate()
    assert converter.returncode == 0, err[-2000:]
    print(out.strip(), counts)
    assert counts["mixed"] == 0 and counts["bare"] == 0, counts
    assert counts["whole"] > 0 and int(out.split()[-1]) >= 4, (out, counts)
    # Back to A: no cache built while the shards changed is served as A's.
    tfshards.convert(*a, live, options=tfshards.ConvertOptions(num_shards=8), overwrite=True)
    assert set(_read(live, caches)) == a_pairs
    assert set(_read(live, caches)) == a_pairs  # from its cache
