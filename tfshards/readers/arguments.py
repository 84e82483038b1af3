"""read()'s arguments, checked at the call: before the plan (types, ranges, the tf.data
service's address) and after it (what needs the split's record count: batches per epoch
and ``start=``). Each refusal is an OptionsError naming the argument.
"""

from __future__ import annotations

import os
import socket
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import tensorflow as tf

from tfshards.arguments import (
    checked_bool,
    checked_int,
    checked_path,
    checked_str,
    is_int,
)
from tfshards.errors import OptionsError
from tfshards.readers.options import CachePlan, read_options
from tfshards.readers.order import BatchSchedule
from tfshards.wording import counted

IMAGE_OUTPUT_DTYPES = ("float32", "uint8", "uint16")
# seed: the order's generator takes any non-negative integer, tf.data's shuffles an int64.
SEED_BOUND = 2**63
# batch_size: TensorFlow's batch dimension and tf.data's counters are int64, but a batch
# beyond 2**31 pairs is a mistake, not a batch.
BATCH_BOUND = 2**31
# start=: steps (epoch x batches per epoch + batch) count up in an int64 of tf.data's;
# beyond 2**62 a repeated read would overflow it.
STEP_BOUND = 2**62
# Seconds to wait for the tf.data service's dispatcher to accept a connection: past it,
# TensorFlow would retry for ever (and ignore Ctrl-C while it does).
SERVICE_TIMEOUT = 5.0


def check_arguments(path: str | os.PathLike, a: dict[str, Any], cache: CachePlan) -> None:
    """read()'s arguments that need no manifest (``a``: read()'s keywords, all given)."""
    checked_path("path", path)
    checked_str("split", a["split"])
    checked_int("batch_size", a["batch_size"], low=1, high=BATCH_BOUND)
    checked_int("seed", a["seed"], low=0, high=SEED_BOUND, none=True)
    checked_bool("shuffle", a["shuffle"], none=True)
    for name in ("one_hot", "drop_remainder", "repeat"):
        checked_bool(name, a[name])
    if a["image_dtype"] not in IMAGE_OUTPUT_DTYPES:
        raise OptionsError(
            f"image_dtype must be one of {', '.join(map(repr, IMAGE_OUTPUT_DTYPES))}, got "
            f"{a['image_dtype']!r}"
        )
    checked_bool("normalize", a["normalize"])
    if a["normalize"] and a["image_dtype"] != "float32":
        raise OptionsError(
            f"normalize=True gives float32 images; image_dtype={a['image_dtype']!r} asks "
            "for another type: leave image_dtype at 'float32', or drop normalize"
        )
    read_options(a["options"])
    _check_augment(a["augment"])
    _check_input_context(a["input_context"], a["batch_size"])
    sampled = [n for n in ("records", "sampling", "epoch_size") if a.get(n) is not None]
    if a["service"] is not None and sampled:
        raise OptionsError(
            f"{'=, '.join(sampled)}= and service cannot be combined: the tf.data service's "
            "workers decide the order of what they read; read the subset or sampling "
            "without service="
        )
    if a["service"] is not None and cache.kind != "none":
        raise OptionsError(
            "cache and service cannot be combined: the tf.data service "
            "workers decode on other machines; pass cache=None"
        )
    check_service(a["service"])


def _check_augment(augment: Any) -> None:
    """A Keras layer (callable too) or a function of (image, mask)."""
    if augment is not None and not callable(augment):
        raise OptionsError(
            "augment must be a Keras layer (or keras.Sequential / keras.layers.Pipeline) or "
            f"a function (image, mask) -> (image, mask); got {augment!r}"
        )


def _check_input_context(context: Any, batch_size: int) -> None:
    if context is None:
        return
    if not isinstance(context, tf.distribute.InputContext):
        raise OptionsError(
            f"input_context must be a tf.distribute.InputContext or None; got {context!r}"
        )
    count = checked_int("input_context.num_input_pipelines", context.num_input_pipelines, low=1)
    checked_int("input_context.input_pipeline_id", context.input_pipeline_id, low=0, high=count)
    replicas = context.num_replicas_in_sync
    if batch_size % replicas:
        raise OptionsError(
            f"batch_size={batch_size} is the global batch, shared by {replicas} replicas "
            "(input_context.num_replicas_in_sync): give a multiple of it"
        )


def check_service(service: Any) -> None:
    """A dispatcher address ``[protocol://]host:port`` that accepts a TCP connection within
    SERVICE_TIMEOUT seconds (TensorFlow itself would retry for ever)."""
    if service is None:
        return
    if not isinstance(service, str):
        raise OptionsError(f"service must be a dispatcher address string or None; got {service!r}")
    host, port = service_address(service)
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        with socket.create_connection((host, port), timeout=SERVICE_TIMEOUT):
            pass
    except OSError as exc:
        cause = "no answer" if isinstance(exc, TimeoutError) else exc.strerror or str(exc)
        raise OptionsError(
            f"service={service!r}: no tf.data service dispatcher answers at {where} "
            f"({cause}, within {SERVICE_TIMEOUT:g} s); start a "
            "tf.data.experimental.service.DispatchServer there, or pass its address "
            "(dispatcher.target)"
        ) from None


def service_address(service: str) -> tuple[str, int]:
    """(host, port) of ``[protocol://]host:port``; IPv6 hosts in brackets."""
    rest = service if "://" in service else f"grpc://{service}"
    try:
        parts = urlsplit(rest)
        host, port = parts.hostname, parts.port
    except ValueError:
        host = port = None
    if not host or port is None or parts.path not in ("", "/"):
        raise OptionsError(
            f"service={service!r} is not a dispatcher address: expected "
            "[protocol://]host:port, e.g. grpc://localhost:5050"
        )
    return host, port


def batches_per_epoch(plan) -> int:
    """Batches each input pipeline reads per epoch (the ordered path's schedule, or the
    tf.data service's per-pair batching)."""
    if not plan.ordered:
        return plan.batching.count
    index, count = plan.pipeline
    batching = plan.batching
    schedule = BatchSchedule(
        plan.epoch_records, batching.size, count, index, batching.drop_remainder
    )
    return schedule.batches_per_epoch


def check_batches(plan) -> None:
    """An epoch of no batch trains nothing (``fit`` ends at once; repeated, it divides by
    zero inside the iterator): refused when the split is smaller than one batch."""
    if batches_per_epoch(plan) > 0:
        return
    records, size = plan.epoch_records, plan.batching.size
    split = f"split {plan.shards.split!r} of {plan.shards.root}"
    if plan.mix is not None:  # not the first dataset's: the mix's epoch
        names = ", ".join(repr(part.name) for part in plan.mix.parts)
        split = f"epoch of the datasets {names} mixed (epoch_size=)"
    elif plan.selection is not None:
        split = f"epoch of {split} (records=, sampling=, epoch_size=)"
    index, count = plan.pipeline
    if count > 1 and plan.ordered:
        raise OptionsError(
            f"batch_size gives no batch per epoch: the {split} holds "
            f"{counted(records, 'record')}, fewer than one batch of {size} on each of "
            f"{count} input pipelines ({size * count} records); pass a smaller batch_size"
        )
    where = f" (input pipeline {index} of {count})" if count > 1 else ""
    raise OptionsError(
        f"batch_size={size} with drop_remainder=True gives no batch per epoch: the {split}"
        f"{where} holds {counted(records, 'record')}; pass a batch_size of at most "
        f"{records}, or drop_remainder=False to keep the short batch"
    )


def check_start(start: Any, plan) -> None:
    """``start=(epoch, batch)``: non-negative integers, the batch within an epoch, the step
    within tf.data's counter. A ReadState checks itself against the read (resume.py)."""
    from tfshards.readers.resume import ReadState

    if start is None or isinstance(start, ReadState):
        return
    per_epoch = batches_per_epoch(plan)
    if isinstance(start, np.ndarray) and start.ndim == 1:
        start = tuple(start.tolist())
    pair = isinstance(start, tuple | list) and len(start) == 2 and all(map(is_int, start))
    if not pair or start[0] < 0 or not 0 <= start[1] < per_epoch:
        raise OptionsError(
            f"start must be (epoch, batch), integers with epoch >= 0 and 0 <= batch < "
            f"{per_epoch} (this read's batches per epoch), or a ReadState; got {start!r}"
        )
    epoch, batch = int(start[0]), int(start[1])
    if epoch * per_epoch + batch >= STEP_BOUND:
        raise OptionsError(
            f"start={start!r} is past the last step tf.data can count: epoch x "
            f"{per_epoch} batches per epoch + batch must stay below 2**62"
        )
