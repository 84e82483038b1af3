"""TFDS loads converted shards with its own reader, pixel-equal to tfshards.read.

JPEG: TFDS's Image feature decodes with TensorFlow's fast DCT, tfshards.read with libjpeg's
accurate integer DCT (Pillow's pixels, the ones conversion checked); given a decoder that
does the same, TFDS gives the same pixels.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import convert_args, write_pairs

import tfshards
from tfshards import OptionsError, convert
from tfshards.converters.tfds_metadata import export_tfds

tfds = pytest.importorskip("tensorflow_datasets")


@tfds.decode.make_decoder()
def exact_jpeg(serialized, feature):
    import tensorflow as tf

    channels = feature.shape[-1]
    return tf.io.decode_jpeg(serialized, channels=channels, dct_method="INTEGER_ACCURATE")


@pytest.mark.parametrize("encoding", ["png", "keep", "raw", "deflate"])
def test_tfds_loads_every_split_pixel_equal(tmp_path, encoding):
    images, masks = write_pairs(
        tmp_path / "data", 20, size=(12, 16), image_format="jpeg" if encoding == "keep" else "png"
    )
    out = tmp_path / "out"
    manifest = convert(
        images,
        masks,
        out,
        encoding=encoding,
        compression="none",
        val_fraction=0.3,
        num_shards=2,
        workers=1,
        progress=False,
    )
    export_tfds(out)
    builder = tfds.builder_from_directory(str(out))
    # keep holds the JPEG sources as they are: decoded as tfshards.read decodes them.
    decoders = {"image/encoded": exact_jpeg()} if encoding == "keep" else None
    for split, info in manifest.splits.items():
        ours = tfshards.read(
            out, split=split, batch_size=info.records, shuffle=False, image_dtype="uint8"
        )
        our_images, our_masks = (t.numpy() for t in next(iter(ours)))
        theirs = builder.as_dataset(split=split, shuffle_files=False, decoders=decoders)
        theirs = list(tfds.as_numpy(theirs))
        assert len(theirs) == info.records
        for index, example in enumerate(theirs):
            assert np.array_equal(example["image/encoded"], our_images[index])
            assert np.array_equal(example["mask/encoded"], our_masks[index])
            assert example["image/height"] == 12
        pairs = builder.as_dataset(
            split=split, shuffle_files=False, as_supervised=True, decoders=decoders
        )
        for index, (image, mask) in enumerate(tfds.as_numpy(pairs)):
            assert np.array_equal(image, our_images[index])
            assert np.array_equal(mask, our_masks[index])
    mask_feature = builder.info.features["mask/encoded"]
    if encoding in ("png", "keep"):
        assert mask_feature.num_classes == 3
    else:
        assert "3 classes" in mask_feature.doc.desc and mask_feature._maximum == 2
    assert builder.info.supervised_keys == ("image/encoded", "mask/encoded")


def test_tfds_refuses_what_it_cannot_represent(tmp_path):
    images, masks = write_pairs(tmp_path / "data", 4)
    convert(images, masks, tmp_path / "gz", compression="gzip", workers=1, progress=False)
    with pytest.raises(OptionsError, match="TFDS reads uncompressed TFRecords only"):
        export_tfds(tmp_path / "gz")


def test_cli_convert_with_tfds_metadata(tmp_path, capsys):
    from tfshards.cli import main

    images, masks = write_pairs(tmp_path / "data", 6)
    assert (
        main([*convert_args(images, masks, tmp_path / "out"), "--tfds-metadata", "--workers", "1"])
        == 0
    )
    assert "wrote TFDS metadata" in capsys.readouterr().out
    builder = tfds.builder_from_directory(tmp_path / "out")
    assert builder.info.splits["train"].num_examples == 6
    assert (
        main(
            [
                *convert_args(images, masks, tmp_path / "gz"),
                "--compression",
                "gzip",
                "--workers",
                "1",
            ]
        )
        == 0
    )
    capsys.readouterr()
    assert main(["-q", "export-tfds", str(tmp_path / "gz")]) == 2
    assert "uncompressed TFRecords only" in capsys.readouterr().err


def test_tfds_features_are_the_record_schema_and_class_names_are_kept(tmp_path):
    from tfshards.schemas.record import FIELDS

    images, masks = write_pairs(tmp_path / "data", 6)
    out = tmp_path / "out"
    convert(images, masks, out, encoding="png", num_classes=3, workers=1, progress=False)
    export_tfds(out, class_names=["sky", "road", "car"])
    features = tfds.builder_from_directory(str(out)).info.features
    assert sorted(features.keys()) == sorted(field.name for field in FIELDS if field.required)
    assert features["mask/encoded"].names == ["sky", "road", "car"]
    with pytest.raises(OptionsError, match="2 class names for 3 classes"):
        export_tfds(out, class_names=["sky", "road"])
