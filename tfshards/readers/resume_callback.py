"""``ResumeCallback``: Keras's ``BackupAndRestore`` that also restores the data's position.

Keras saves the weights and ``{"epoch", "batch"}``, but a restarted ``fit`` starts that
epoch's data from its first batch. This callback saves, beside Keras's backup and
atomically, the tfshards read state at the same step (``tfshards_state.json``, a few
hundred bytes), and on restart moves the dataset's cursor there:

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
from dataclasses import asdict
from pathlib import Path

import keras

from tfshards.readers.resume import ReadState, ResumeError, save_durably, state_at, step_of

STATE_FILE = "tfshards_state.json"
log = logging.getLogger("tfshards")


def _reader_of(dataset):
    reader = getattr(dataset, "_tfshards_reader", None)
    if reader is None:
        raise ResumeError(
            "ResumeCallback needs the dataset returned by tfshards.read (not a dataset made "
            "from it with .map/.take/...; pass the same object you give to fit), read with "
            "the ordered reader (fixed-size records, local shards)"
        )
    return reader


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
        self.state_path = Path(backup_dir) / STATE_FILE
        self._epoch_start = 0  # data step where the current Keras epoch's batches began
        self._done_before = 0  # steps of the current Keras epoch trained before a restart
        self._steps = 0  # steps of the current Keras epoch trained in this run
        self._resume: tuple[int, int, int] | None = None  # (Keras epoch, steps done, step)
        self._cut_short = False

    def on_train_begin(self, logs=None) -> None:
        super().on_train_begin(logs)
        initial = getattr(self.model, "_initial_epoch", None) or 0
        self._current_epoch = initial  # Keras's own backups would say epoch 0 otherwise
        if self.state_path.exists():
            self._resume = self._load(initial)
            self.reader.cursor.move_to(self._resume[2])
            epoch, batch = self.reader.schedule.position(self._resume[2])
            log.info(
                "resuming from %s: Keras epoch %d after %d steps, data epoch %d batch %d",
                self.state_path,
                initial,
                self._resume[1],
                epoch,
                batch,
            )
        self._epoch_start = self.reader.cursor.next_start

    def _load(self, keras_epoch: int) -> tuple[int, int, int]:
        try:
            body = json.loads(self.state_path.read_text())
            state = ReadState(**body["read"])
            saved_epoch, done = int(body["keras_epoch"]), int(body["keras_steps"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ResumeError(
                f"{self.state_path}: damaged or not a tfshards state ({exc})"
            ) from exc
        if saved_epoch != keras_epoch:
            raise ResumeError(
                f"{self.state_path}: the data state is for epoch {saved_epoch} but Keras's "
                f"backup restarts epoch {keras_epoch} (a kill during a save?)"
            )
        reader = self.reader
        return saved_epoch, done, step_of(state, reader.identity, reader.schedule)

    def on_epoch_begin(self, epoch: int, logs=None) -> None:
        self._steps, self._done_before = 0, 0
        if self._resume is not None and epoch == self._resume[0]:
            self._done_before = self._resume[1]
            self._epoch_start = self._resume[2]
        elif self.reader.cursor.per_iteration is not None:  # each epoch a new iteration
            self._epoch_start = epoch * self.reader.schedule.batches_per_epoch
        if self.reader.cursor.per_iteration is not None or self._resume is None:
            self.reader.cursor.move_to(self._epoch_start)

    def on_train_batch_end(self, batch: int, logs=None) -> None:
        self._steps = batch + 1
        steps = self.params.get("steps")
        if self._done_before and steps and self._done_before + self._steps >= steps:
            self.model.stop_training = self._cut_short = True  # the epoch's batches are done
        super().on_train_batch_end(batch, logs)

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        self._epoch_start += self._steps
        self._steps, self._done_before = 0, 0
        if self._cut_short:
            self.model.stop_training = self._cut_short = False
        super().on_epoch_end(epoch, logs)

    def _save_model(self) -> None:
        super()._save_model()
        reader = self.reader
        position = self._epoch_start + self._steps
        state = state_at(reader.identity, reader.schedule, position)
        body = {
            "read": asdict(state),
            "keras_epoch": self._current_epoch,
            "keras_steps": self._done_before + self._steps,
        }
        save_durably(self.state_path, json.dumps(body, sort_keys=True))
