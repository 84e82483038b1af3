"""A training script for the resume tests: fit with ResumeCallback, optionally SIGKILLed.

usage: resume_training.py DATASET BACKUP LOG CACHE KILL_AT [REPEAT]
Validation data runs after every epoch. Each trained batch's digest is appended to LOG
(from inside train_step), "SAVE" after each backup, and the final weights' digest as
"WEIGHTS <hex>" at the end. KILL_AT > 0 SIGKILLs the process after that many steps of
this run; the environment's KILL_IN_SAVE=N SIGKILLs it inside this run's N-th backup, once
the weights are written and before the state naming them is.
"""

import hashlib
import os
import signal
import sys

import keras
import numpy as np
import tensorflow as tf

import tfshards
from tfshards.readers import resume_callback

dataset, backup, log, cache, kill_at = sys.argv[1:6]
repeat = len(sys.argv) > 6 and sys.argv[6] == "repeat"
keras.utils.set_random_seed(0)
tf.config.experimental.enable_op_determinism()
train = tfshards.read(
    dataset, batch_size=4, seed=7, cache=None if cache == "none" else cache, repeat=repeat
)
steps_per_epoch = train.element_spec and (10 if repeat else None)
out = open(log, "a", buffering=1)  # noqa: SIM115


def note(images, masks):
    digest = hashlib.sha1(images.numpy().tobytes() + masks.numpy().tobytes()).hexdigest()
    out.write(digest[:16] + "\n")
    return np.int32(0)


class Logged(keras.Model):
    def train_step(self, data):
        images, masks = data
        done = tf.py_function(note, [images, masks], tf.int32)
        with tf.control_dependencies([done]):
            images = tf.identity(images)
        return super().train_step((images, masks))


class Killer(keras.callbacks.Callback):
    steps = 0

    def on_train_batch_end(self, batch, logs=None):
        Killer.steps += 1
        if int(kill_at) and Killer.steps == int(kill_at):
            out.flush()
            os.kill(os.getpid(), signal.SIGKILL)


def kill_in_save(write_state, at: int):
    writes = 0

    def write(path, text):
        nonlocal writes
        writes += 1
        if writes == at:
            out.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        write_state(path, text)

    return write


if int(os.environ.get("KILL_IN_SAVE", "0")):
    resume_callback.save_durably = kill_in_save(
        resume_callback.save_durably, int(os.environ["KILL_IN_SAVE"])
    )


class Saved(tfshards.ResumeCallback):
    def _save_model(self):
        super()._save_model()
        out.write("SAVE\n")


inputs = keras.Input(train.element_spec[0].shape[1:])
x = keras.layers.Conv2D(4, 3, padding="same", activation="relu")(inputs)
outputs = keras.layers.Conv2D(3, 1)(x)
model = Logged(inputs, outputs)
model.compile(
    optimizer=keras.optimizers.Adam(1e-2),
    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
)
validation = tfshards.read(dataset, batch_size=8, shuffle=False)  # from its start each time
model.fit(
    train,
    validation_data=validation,
    epochs=3,
    steps_per_epoch=steps_per_epoch,
    shuffle=False,
    verbose=0,
    callbacks=[Saved(backup, train, save_freq=3, delete_checkpoint=False), Killer()],
)
weights = b"".join(np.asarray(w).tobytes() for w in model.get_weights())
out.write(f"WEIGHTS {hashlib.sha1(weights).hexdigest()}\n")
