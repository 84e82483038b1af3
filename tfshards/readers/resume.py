"""Resuming mid-epoch: the state of an ordered read, and the Keras callback that keeps it.

A state is a few numbers: the data position (epoch, and records of that epoch already
trained on by all pipelines together) and what the order depends on, so a state from
another dataset, seed, split, batch size or read option is refused, never fed.
"""

from __future__ import annotations

import json
import numbers
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np

from tfshards.errors import OptionsError, TfshardsError
from tfshards.readers.order import BatchSchedule
from tfshards.readers.shard_cache import shard_cache_key

STATE_VERSION = 1
# What the order of an epoch depends on; a state must match a read on each of them.
ORDER_FIELDS = ("dataset", "split", "records", "seed", "shuffle", "group_shards", "sampling")
LOWEST = {"records": 0, "group_shards": 1, "round_records": 1, "epoch": 0, "records_done": 0}


class ResumeError(TfshardsError):
    """A saved read state does not fit the read it is given to, or cannot be read."""


@dataclass(frozen=True)
class ReadState:
    """Where a read stands: ``records_done`` records of epoch ``epoch`` are behind it."""

    dataset: str  # the shards' identity (names and sha256s)
    split: str
    records: int
    seed: int
    shuffle: bool
    group_shards: int
    round_records: int  # records per step over all pipelines (the global batch)
    drop_remainder: bool
    epoch: int
    records_done: int
    version: int = STATE_VERSION
    sampling: str = ""  # digest of records=, sampling=, epoch_size= ("": every record once)

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if field.type == "int":
                object.__setattr__(self, field.name, _whole(field.name, value))
            elif field.type == "bool" and isinstance(value, bool | np.bool_):
                object.__setattr__(self, field.name, bool(value))  # read(shuffle=np.True_)
            elif not isinstance(value, str) or field.type != "str":
                raise ResumeError(f"ReadState: {field.name}={value!r} is not a {field.type}")
        for name, low in LOWEST.items():
            if getattr(self, name) < low:
                raise ResumeError(f"ReadState: {name}={getattr(self, name)} is below {low}")
        if self.records_done > self.records:
            raise ResumeError(
                f"ReadState: records_done={self.records_done} is more than the "
                f"{self.records} records of an epoch"
            )
        if self.version != STATE_VERSION:
            raise ResumeError(
                f"ReadState: version={self.version}, this tfshards reads version {STATE_VERSION}"
            )

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str, where: str = "state") -> ReadState:
        try:
            return cls(**json.loads(text))
        except ResumeError as exc:
            raise ResumeError(f"{where}: {exc}") from exc
        except (ValueError, TypeError) as exc:
            raise ResumeError(f"{where}: not a tfshards read state ({exc}); it is damaged") from exc

    def save(self, path: Path) -> None:
        save_durably(path, self.to_json())

    @classmethod
    def load(cls, path: Path) -> ReadState:
        try:
            text = path.read_text()
        except OSError as exc:
            raise ResumeError(f"{path}: cannot read the saved state ({exc})") from exc
        return cls.from_json(text, str(path))


def _whole(name: str, value) -> int:
    """``value`` as a Python int; a bool or a float (1.0 included) is refused: a state is
    written by tfshards, so anything else was edited or damaged."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ResumeError(f"ReadState: {name}={value!r} is not a whole number")
    return int(value)


def save_durably(path: Path, text: str) -> None:
    """Write, fsync, then rename over ``path``: a crash, even of the machine, leaves the
    previous file or this one, never a mix (a preempted VM loses its page cache)."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as out:
        out.write(text)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)


def read_identity(plan, schedule: BatchSchedule) -> dict:
    """The fields a state of this read must match (see ORDER_FIELDS)."""
    return {
        "dataset": shard_cache_key(plan.shards.manifest),
        "split": plan.shards.split,
        "records": plan.epoch_records,
        "seed": plan.order_seed,
        "shuffle": plan.order.shuffle,
        "group_shards": plan.group_shards,
        "round_records": schedule.round_records,
        "drop_remainder": schedule.drop_remainder,
        "sampling": plan.selection.digest if plan.selection is not None else "",
    }


def state_at(identity: dict, schedule: BatchSchedule, step: int) -> ReadState:
    """The state after ``step`` batches of this pipeline, counted from epoch 0."""
    epoch, batch = schedule.position(step)
    return ReadState(**identity, epoch=epoch, records_done=batch * schedule.round_records)


def step_of(state: ReadState, identity: dict, schedule: BatchSchedule) -> int:
    """The step a read with ``identity`` resumes ``state`` at; refuses what does not fit."""
    from tfshards.readers.mixing import mix_difference

    if state.sampling != identity["sampling"]:  # another mix: say which argument differs
        difference = mix_difference(state.sampling, identity["sampling"])
        if difference is not None:
            raise ResumeError(f"{difference}; resume with the same datasets and read options")
    for name in ORDER_FIELDS + ("drop_remainder",):
        saved, here = getattr(state, name), identity[name]
        if saved != here:
            what = f"{name}={{!r}}"
            if name == "sampling":  # a digest: say what it stands for
                what = "sampling={!r} (a digest of records=, sampling= and epoch_size=)"
            raise ResumeError(
                f"the saved state was made with {what.format(saved)} but this read has "
                f"{what.format(here)}; resume with the same dataset and read options"
            )
    if state.records_done % schedule.round_records:
        raise ResumeError(
            f"the saved state is {state.records_done} records into epoch {state.epoch}, "
            f"which is not a whole number of steps of {schedule.round_records} records "
            f"({schedule.pipelines} pipelines x batch {schedule.batch_size}; it was saved "
            f"with {state.round_records} records per step): resume with a global batch "
            "that divides it"
        )
    batch = state.records_done // schedule.round_records
    if batch > schedule.batches_per_epoch or state.records_done > state.records:
        raise ResumeError(f"the saved state is past the end of epoch {state.epoch}")
    return state.epoch * schedule.batches_per_epoch + batch


def start_step(start, identity: dict, schedule: BatchSchedule) -> int:
    """read()'s ``start``: None, ``(epoch, batch)`` or a ``ReadState`` -> a step."""
    if start is None:
        return 0
    if isinstance(start, ReadState):
        return step_of(start, identity, schedule)
    try:
        epoch, batch = (int(v) for v in start)
        exact = tuple(start) == (epoch, batch)
    except (TypeError, ValueError):
        exact = False
    if not exact or epoch < 0 or not 0 <= batch < schedule.batches_per_epoch:
        raise OptionsError(
            f"start must be (epoch, batch) with epoch >= 0 and 0 <= batch < "
            f"{schedule.batches_per_epoch} (this read's batches per epoch), or a ReadState; "
            f"got {start!r}"
        )
    return epoch * schedule.batches_per_epoch + batch
