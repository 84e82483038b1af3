"""Our pure-Python TFRecord/Example writer is read by TensorFlow's own reader."""

from __future__ import annotations

import pytest

from tfshards.converters.writer import ShardWriter
from tfshards.schemas.tfrecord import serialize_example


@pytest.mark.parametrize("compression,tf_name", [("none", ""), ("gzip", "GZIP"), ("zlib", "ZLIB")])
def test_tensorflow_reads_what_we_write(tmp_path, compression, tf_name):
    import tensorflow as tf

    records = [
        serialize_example({"key": f"k{i}".encode(), "n": i * 1000, "blob": bytes(range(i % 256))})
        for i in range(300)
    ]
    path = tmp_path / "shard.tfrecord"
    with ShardWriter(path, compression=compression) as writer:
        for record in records:
            writer.write(record)
    assert path.stat().st_size == writer.bytes
    read = [r.numpy() for r in tf.data.TFRecordDataset(str(path), compression_type=tf_name)]
    assert read == records
    example = tf.train.Example.FromString(read[7])
    assert example.features.feature["key"].bytes_list.value == [b"k7"]
    assert example.features.feature["n"].int64_list.value == [7000]
    assert example.features.feature["blob"].bytes_list.value == [bytes(range(7))]


def test_serialization_matches_protobuf_for_equal_content():
    import tensorflow as tf

    ours = serialize_example({"a": b"x" * 300, "b": 2**40})
    parsed = tf.train.Example.FromString(ours)
    assert parsed.features.feature["a"].bytes_list.value == [b"x" * 300]
    assert parsed.features.feature["b"].int64_list.value == [2**40]


def test_failed_shard_leaves_no_file(tmp_path):
    path = tmp_path / "train-00000-of-00001.tfrecord"
    with pytest.raises(RuntimeError), ShardWriter(path) as writer:
        writer.write(b"abc")
        raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_negative_int_feature_is_refused():
    with pytest.raises(ValueError, match="negative"):
        serialize_example({"n": -1})


def test_our_parser_reads_what_protobuf_writes_including_packed_and_long_varints():
    import tensorflow as tf

    from tfshards.schemas.tfrecord import example_fields, parse_example

    example = tf.train.Example()
    feature = example.features.feature
    feature["blob"].bytes_list.value.append(bytes(range(256)) * 3)  # a 2-byte length
    feature["big"].int64_list.value.append(2**40)  # written packed by protobuf
    feature["small"].int64_list.value.append(5)
    feature["floats"].float_list.value.append(1.5)  # a kind tfshards never writes
    data = example.SerializeToString()
    parsed = parse_example(memoryview(data))
    assert bytes(parsed["blob"]) == bytes(range(256)) * 3
    assert (parsed["big"], parsed["small"], parsed["floats"]) == (2**40, 5, None)
    start, stop = example_fields(data)["blob"]
    assert data[start:stop] == bytes(range(256)) * 3
    assert parse_example(data) == {
        k: bytes(v) if isinstance(v, memoryview) else v for k, v in parsed.items()
    }


def test_a_truncated_example_is_a_record_error():
    from tfshards.schemas.tfrecord import RecordError, parse_example

    data = serialize_example({"key": b"k" * 200, "n": 7})
    for cut in (1, 2, 10, len(data) - 1):
        with pytest.raises(RecordError, match="truncated"):
            parse_example(data[:cut])
