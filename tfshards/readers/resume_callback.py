"""``ResumeCallback``: Keras's ``BackupAndRestore`` that also restores the data's position.

Keras saves the weights and ``{"epoch", "batch"}`` as two files, one after the other, and
a restarted ``fit`` starts that epoch's data from its first batch. This callback writes
its own backup instead, in the same folder, in an order that makes it one atomic step:

1. the weights, into a new file named by the data step they were trained to
   (``step-<step>.weights.h5``), flushed to the disk;
2. ``tfshards_state.json`` (a few hundred bytes), replaced atomically: the name of that
   weights file, the Keras epoch and the steps of it trained, and the read state there.

The state file is the commit: a kill at any moment leaves it naming complete weights and
the position they were trained to (a weights file it does not name is from a save that
did not finish; the next save deletes it). The data position is a function of Keras's
(epoch, steps): ``_data_step``. On a restart:

* ``repeat=False``: Keras epoch ``k`` reads data epoch ``k``; the epoch that was
  interrupted restarts at its next untrained batch, and ends (``stop_training`` for that
  epoch only) when the batches it has left are done, so later epochs line up again;
* ``repeat=True`` with ``steps_per_epoch``: the stream continues at the next untrained
  batch, and the interrupted Keras epoch runs only the steps it had left.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path

import keras

from tfshards.readers.resume import ReadState, ResumeError, save_durably, state_at, step_of

STATE_FILE = "tfshards_state.json"
# Of STATE_FILE. Version 1 (tfshards before 2026-12-07) kept Keras's own files beside a
# state written after them, a pair a kill could split.
FORMAT_VERSION = 2
WEIGHTS = re.compile(r"step-\d+\.weights\.h5")
KERAS_FILES = ("latest.weights.h5", "training_metadata.json")
log = logging.getLogger("tfshards")


@dataclass(frozen=True)
class Backup:
    """One backup: its weights file and where training stood when they were saved."""

    weights: str  # a file name in the backup folder
    keras_epoch: int
    keras_steps: int  # steps of that Keras epoch trained, runs before a restart included
    read: ReadState  # the data position after those steps

    def __post_init__(self) -> None:
        if not isinstance(self.weights, str) or not WEIGHTS.fullmatch(self.weights):
            raise ResumeError(f"weights={self.weights!r} is not a file this callback writes")
        for name in ("keras_epoch", "keras_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ResumeError(f"{name}={value!r} is not a whole number >= 0")
        if isinstance(self.read, dict):
            object.__setattr__(self, "read", ReadState(**self.read))
        elif not isinstance(self.read, ReadState):
            raise ResumeError(f"read={self.read!r} is not a read state")


def read_backups(path: Path) -> list[Backup]:
    """The backups ``path`` names, the newest first; refuses a damaged or edited file."""
    try:
        body = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ResumeError(f"{path}: cannot be read as a tfshards state ({exc})") from exc
    version = body.get("version") if isinstance(body, dict) else None
    if version != FORMAT_VERSION or isinstance(version, bool):
        raise ResumeError(
            f"{path}: version={version!r}, this tfshards reads version {FORMAT_VERSION} "
            "(a state written by another tfshards, or not a tfshards state): delete the "
            "folder to train from the beginning"
        )
    backups = []
    for key in ("current", "previous"):
        if key == "current" or body.get(key) is not None:
            try:
                backups.append(Backup(**body[key]))
            except ResumeError as exc:
                raise ResumeError(f"{path}: {key}: {exc}") from exc
            except (KeyError, TypeError) as exc:
                raise ResumeError(f"{path}: {key}: damaged or edited ({exc!r})") from exc
    return backups


def weights_name(step: int) -> str:
    """The weights file of the backup at data step ``step``."""
    return f"step-{step}.weights.h5"


def _reader_of(dataset):
    reader = getattr(dataset, "_tfshards_reader", None)
    if reader is None:
        raise ResumeError(
            "ResumeCallback needs the dataset returned by tfshards.read (not a dataset made "
            "from it with .map/.take/...; pass the same object you give to fit), read with "
            "the ordered reader (fixed-size records, local shards)"
        )
    return reader


def _flush(path: Path) -> None:
    """Wait until ``path`` and its name are on the disk: a state naming it must not get
    there first (a preempted VM loses its page cache)."""
    for name in (path, path.parent):
        fd = os.open(name, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class ResumeCallback(keras.callbacks.BackupAndRestore):
    """Backs up weights and the read position; a restarted ``fit`` continues at the very
    batch the interrupted run would have trained on next.

    >>> train = tfshards.read("shards/", batch_size=8, seed=0)  # doctest: +SKIP
    >>> model.fit(train, epochs=5, callbacks=[
    ...     tfshards.ResumeCallback("backup/", train, save_freq=100)])  # doctest: +SKIP
    """

    def __init__(self, backup_dir: str | os.PathLike, dataset, **kwargs) -> None:
        super().__init__(str(backup_dir), **kwargs)
        self.reader = _reader_of(dataset)
        self.folder = Path(backup_dir)
        self.state_path = self.folder / STATE_FILE
        self._first = 0  # repeat=True: the step the read starts at (its start=)
        self._done_before = 0  # steps of the current Keras epoch trained before a restart
        self._steps = 0  # steps of the current Keras epoch trained in this run
        self._resume: tuple[int, int] | None = None  # (Keras epoch, steps of it done)
        self._kept: list[Backup] = []  # the backups the state names, the newest first
        self._cut_short = False
        self._started = False  # whether this run's first epoch has begun

    def _data_step(self, keras_epoch: int, keras_steps: int) -> int:
        """The data step after ``keras_steps`` steps of Keras epoch ``keras_epoch``."""
        if self.reader.cursor.per_iteration is not None:  # data epoch k in Keras epoch k
            return keras_epoch * self.reader.schedule.batches_per_epoch + keras_steps
        # One endless stream: each Keras epoch takes fit's steps_per_epoch from it.
        return self._first + keras_epoch * (self.params.get("steps") or 0) + keras_steps

    def on_train_begin(self, logs=None) -> None:
        # Replaces Keras's: its fallback copies files this callback does not write.
        self._first, self._resume, self._kept = self.reader.cursor.next_start, None, []
        self._started = False
        if self.state_path.exists():
            self._restore()
            return
        foreign = [name for name in KERAS_FILES if (self.folder / name).exists()]
        if foreign:
            raise ResumeError(
                f"{self.folder} holds {', '.join(foreign)} but no {STATE_FILE}: a backup of "
                "keras.callbacks.BackupAndRestore or of an older tfshards, which does not say "
                "where the data stood; delete the folder to train from the beginning"
            )

    def _restore(self) -> None:
        backups = read_backups(self.state_path)
        for backup in backups:
            self._check(backup)
        failures = []
        for backup in backups:
            try:
                self._load_weights(self.folder / backup.weights)
                break
            except (OSError, ValueError) as exc:  # damaged: the previous one, if kept
                failures.append(f"{self.folder / backup.weights}: {exc}")
        else:
            raise ResumeError(f"cannot load the backed-up weights: {'; '.join(failures)}")
        self._kept = [backup]
        epoch, done = backup.keras_epoch, backup.keras_steps
        if done and done == self.params.get("steps"):  # saved after the epoch's last step
            epoch, done = epoch + 1, 0
        self.model._initial_epoch = epoch  # as Keras's own restore does
        self._resume = (epoch, done)
        data_epoch, batch = self.reader.schedule.position(self._data_step(epoch, done))
        log.warning(  # shown by default: whether a run resumed must be visible
            "resuming from %s: Epoch %d after %d of its steps (start=(%d, %d) in the read)",
            self.state_path, epoch + 1, done, data_epoch, batch,
        )  # fmt: skip

    def _check(self, backup: Backup) -> None:
        """Refuses a backup that does not fit this read and fit, or whose fields disagree
        (edited by hand)."""
        state, schedule, where = backup.read, self.reader.schedule, self.state_path
        if state.round_records != schedule.round_records:
            raise ResumeError(
                f"{where}: saved with read.round_records={state.round_records} records per "
                f"step, this read has {schedule.round_records} ({schedule.pipelines} "
                f"pipelines x batch {schedule.batch_size}); Keras counts its epochs in "
                "steps, so resume with the same global batch size"
            )
        try:
            step = step_of(state, self.reader.identity, schedule)
        except ResumeError as exc:
            raise ResumeError(f"{where}: {exc}") from exc
        steps = self.params.get("steps")
        if steps and backup.keras_steps > steps:
            raise ResumeError(
                f"{where}: keras_steps={backup.keras_steps}, more than the {steps} steps of "
                "an epoch of this fit"
            )
        expected = self._data_step(backup.keras_epoch, backup.keras_steps)
        if step != expected:
            raise ResumeError(
                f"{where}: its fields disagree: read.epoch={state.epoch} and "
                f"read.records_done={state.records_done} are data step {step}, but "
                f"keras_epoch={backup.keras_epoch} and keras_steps={backup.keras_steps} are "
                f"data step {expected} (edited, or fit's steps_per_epoch changed)"
            )
        if backup.weights != weights_name(step):
            raise ResumeError(
                f"{where}: weights={backup.weights!r} are not those of data step {step} "
                f"({weights_name(step)}): edited"
            )

    def _load_weights(self, path: Path) -> None:
        if not self.model.built:
            raise ResumeError("ResumeCallback: build the model before fit to restore into it")
        optimizer = self.model.optimizer
        if optimizer is not None and not optimizer.built:  # its variables are in the file
            optimizer.build(self.model.trainable_variables)
        self.model.load_weights(path)

    def on_epoch_begin(self, epoch: int, logs=None) -> None:
        self._current_epoch, self._steps = epoch, 0
        resumed = self._resume is not None and epoch == self._resume[0]
        self._done_before = self._resume[1] if resumed else 0
        # repeat=False: each epoch a new iteration; repeat=True: the run's first epoch
        # begins the one endless iteration.
        if self.reader.cursor.per_iteration is not None or not self._started:
            self.reader.cursor.move_to(self._data_step(epoch, self._done_before))
        self._started = True

    def on_train_batch_end(self, batch: int, logs=None) -> None:
        self._steps = batch + 1
        steps = self.params.get("steps")
        if self._done_before and steps and self._done_before + self._steps >= steps:
            self.model.stop_training = self._cut_short = True  # the epoch's batches are done
        super().on_train_batch_end(batch, logs)

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        self._steps, self._done_before = 0, 0
        if self._cut_short:
            self.model.stop_training = self._cut_short = False
        super().on_epoch_end(epoch, logs)  # sets _current_epoch to epoch + 1, may save

    def _save_model(self) -> None:
        done = self._done_before + self._steps
        step = self._data_step(self._current_epoch, done)
        # Steps only grow from one save to the next, so this name is never a kept file.
        name = weights_name(step)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.model.save_weights(str(self.folder / name), overwrite=True)
        _flush(self.folder / name)
        reader = self.reader
        read = state_at(reader.identity, reader.schedule, step)
        kept = [Backup(name, self._current_epoch, done, read), *self._kept][
            : 2 if self.double_checkpoint else 1
        ]
        body = {
            "version": FORMAT_VERSION,
            "current": asdict(kept[0]),
            "previous": asdict(kept[1]) if len(kept) > 1 else None,
        }
        save_durably(self.state_path, json.dumps(body, indent=1, sort_keys=True))
        self._kept = kept
        names = {backup.weights for backup in kept}
        for path in self.folder.glob("step-*.weights.h5"):
            if path.name not in names:  # older, or from a save a kill interrupted
                path.unlink(missing_ok=True)
