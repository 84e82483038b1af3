"""The disk cache as a tf.data stage: build it during the first pass, read it afterwards.

Each pass (epoch) decides once, when it starts, whether the entry is ready:
ready, it reads the part files (no parsing, no decoding); not ready, it streams
the decoded pairs through and appends them to a private building folder,
published when the pass is complete.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

import tensorflow as tf

from tfshards.readers.cache.entry import DiskCache
from tfshards.readers.cache.layouts import CACHE_PARTS
from tfshards.readers.cache.memory import parts_at_once

_FILE_BUFFER = 2**20
log = logging.getLogger(__name__)  # under "tfshards"; `bench` quiets its INFO lines


class CacheBuilder:
    """Writes the pairs of one pass in record order; publishes the entry when it is whole.

    ``write`` is called through ``tf.py_function`` with each pair's index. Index 0
    starts a new build (abandoning an unfinished one); an index out of sequence (an
    interrupted pass) abandons the build; the last index publishes it.
    """

    def __init__(self, cache: DiskCache, unchanged: Callable[[], None] | None = None) -> None:
        self.cache = cache
        self.unchanged = unchanged  # raises when the dataset changed since the read began
        self.layout = cache.layout
        self._lock = threading.Lock()
        self._folder: Path | None = None
        self._files: list[tuple] = []
        self._next = 0

    def write(self, index, image, mask) -> bool:
        index = int(index)
        with self._lock:
            if index == 0:
                self._abandon()
                self._start()
            elif self._folder is None or index != self._next:
                self._abandon()
                return False
            self.layout.append(self._files[index % CACHE_PARTS], image.numpy(), mask.numpy())
            self._next = index + 1
            if self._next == self.cache.info.records:
                self._publish()
        return True

    def _start(self) -> None:
        self._folder = self.cache.new_building_folder()
        self._folder.mkdir(parents=True)
        self._files = [
            tuple(
                open(self.cache.part(self._folder, k, kind), "wb", buffering=_FILE_BUFFER)  # noqa: SIM115
                for kind in self.layout.kinds
            )
            for k in range(CACHE_PARTS)
        ]
        self._next = 0

    def _close(self, *, sync: bool) -> None:
        for handle in (h for part in self._files for h in part):
            if sync:
                handle.flush()
                os.fsync(handle.fileno())
            handle.close()
        self._files = []

    def _abandon(self) -> None:
        if self._folder is not None:
            self._close(sync=False)
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None

    def _publish(self) -> None:
        if self.unchanged is not None:
            try:
                self.unchanged()  # a pass that overlapped `convert --overwrite` never publishes
            except Exception:
                self._abandon()
                raise
        self._close(sync=True)
        folder, self._folder = self._folder, None
        try:
            os.rename(folder, self.cache.ready)
        except OSError:  # another process published first: its entry holds the same pairs
            shutil.rmtree(folder, ignore_errors=True)
            return
        log.info("disk cache ready: %s", self.cache.ready)


def disk_cached(
    pairs: tf.data.Dataset,
    cache: DiskCache,
    *,
    shuffle: bool,
    seed: int | None,
    deterministic: bool,
    unchanged: Callable[[], None] | None = None,
) -> tf.data.Dataset:
    """uint8 pairs in record order -> the same pairs, from the cache once it is built.

    Shuffled, a cached pass reads the parts in a new order, each from a new random
    record (the shuffle buffer after this stage mixes them further).
    """
    builder = CacheBuilder(cache, unchanged)

    def build_pass() -> tf.data.Dataset:
        def write(index, pair):
            image, mask = pair
            written = tf.py_function(builder.write, [index, image, mask], Tout=tf.bool)
            with tf.control_dependencies([written]):
                return tf.identity(image), tf.identity(mask)

        return pairs.enumerate().map(write)  # sequential: records reach the writer in order

    def cached_pass(epoch_key: tf.Tensor) -> tf.data.Dataset:
        size, layout = cache.entry_bytes(), cache.layout
        at_once = CACHE_PARTS if size is None else parts_at_once(size)
        parts = cache.parts(shuffle=shuffle, epoch_key=epoch_key, rotate=at_once == CACHE_PARTS)
        return layout.pairs(parts, deterministic=deterministic, at_once=at_once)

    def one_pass(epoch_key: tf.Tensor) -> tf.data.Dataset:
        ready = tf.py_function(cache.is_ready, [], Tout=tf.bool)
        return tf.cond(ready, lambda: cached_pass(epoch_key), build_pass)

    # The pass is built anew each epoch inside flat_map; the epoch's key (the parts'
    # order and starting records) is drawn out here, anew each epoch.
    return _epoch_keys(seed).take(1).flat_map(one_pass)


def _epoch_keys(seed: int | None) -> tf.data.Dataset:
    return tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True)
