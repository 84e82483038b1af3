"""k folds of a split stratified by class presence, from its per-record table alone."""

from __future__ import annotations

import numpy as np

from tfshards.arguments import checked_int
from tfshards.errors import OptionsError
from tfshards.schemas.record_table import RecordTable


def folds(table: RecordTable, k: int, *, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """``k`` (train, validation) pairs of record indices, for ``read(records=...)``.

    Every record is in exactly one validation fold. Records are grouped by their rarest
    class (the class present in the fewest records; records without a class form one
    group), and each group is dealt over the folds in a random order drawn from ``seed``,
    so a class held by a handful of records reaches as many folds as it can.

    >>> table = tfshards.records("shards/")  # doctest: +SKIP
    >>> for train, val in tfshards.folds(table, 5):  # doctest: +SKIP
    ...     model.fit(tfshards.read("shards/", records=train), ...)
    """
    if not isinstance(table, RecordTable):
        raise OptionsError(
            f"folds() takes a split's table, tfshards.records(path, split); got "
            f"{type(table).__name__}"
        )
    k = checked_int("k", k, low=2)
    checked_int("seed", seed, low=0)
    if k > len(table):
        raise OptionsError(f"k={k} folds need at least {k} records; the table has {len(table)}")
    fold_of = np.empty(len(table), np.int64)
    rng = np.random.Generator(np.random.PCG64(seed))
    dealt = 0
    for members in _strata(table):
        members = members[rng.permutation(len(members))]
        fold_of[members] = (dealt + np.arange(len(members))) % k
        dealt += len(members)
    everything = np.arange(len(table))
    return [(everything[fold_of != f], everything[fold_of == f]) for f in range(k)]


def _strata(table: RecordTable) -> list[np.ndarray]:
    """Records grouped by their rarest class, rarest groups first."""
    holders = {c: table.records_with(c) for c in range(table.num_classes)}
    holders = {c: r for c, r in holders.items() if r.size}
    stratum = np.full(len(table), -1, np.int64)
    for klass in sorted(holders, key=lambda c: -len(holders[c])):  # rarest written last
        stratum[holders[klass]] = klass
    order = sorted(set(stratum.tolist()), key=lambda c: len(holders.get(c, ())) or len(table))
    return [np.flatnonzero(stratum == c) for c in order]
