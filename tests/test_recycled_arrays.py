"""Batch arrays reused once TensorFlow frees the tensors made from them."""

import gc

import numpy as np
import tensorflow as tf

from tfshards.readers.recycled import RecycledArrays


def _tensor(array: np.ndarray) -> tf.Tensor:
    return tf.experimental.dlpack.from_dlpack(array.__dlpack__())


def test_an_array_is_reused_only_after_its_tensor_is_freed():
    pool = RecycledArrays((4, 8, 8, 1), np.int32)
    first = pool.take(4)
    first[:] = 7
    tensor = _tensor(first)
    del first
    gc.collect()
    second = pool.take(4)  # the first is still held by the tensor: a new array
    assert pool.allocated == 2
    assert np.all(tensor.numpy() == 7)
    second[:] = 1
    assert np.all(tensor.numpy() == 7)  # the tensor's memory was not handed out
    del tensor, second
    gc.collect()
    third = pool.take(3)
    assert pool.allocated == 2 and third.shape == (3, 8, 8, 1)


def test_at_most_spare_arrays_are_kept():
    pool = RecycledArrays((2, 4), np.int32, spare=1)
    held = [pool.take(2) for _ in range(3)]
    del held
    gc.collect()
    again = [pool.take(2), pool.take(2)]  # one kept of the three freed, one new
    assert pool.allocated == 4 and len(again) == 2
