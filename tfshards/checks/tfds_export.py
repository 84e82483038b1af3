"""Write the metadata that lets TensorFlow Datasets load converted shards with its own reader.

After ``export_tfds("shards/")``, ``tfds.builder_from_directory("shards/")`` loads every
split: features ``key`` (text), ``image`` {``encoded``, ``format``, ``height``, ``width``,
``channels``} and ``mask`` {``encoded``, ``format``, ``channels``}, where ``encoded`` is
decoded by TFDS to uint8 pixels.

TFDS can represent: uncompressed shards (it reads no gzip/zlib TFRecords), records of one
size, and images encoded keep/png/jpeg (a TFDS Image) or raw/deflate with masks in the
same encoding (a TFDS Tensor stored as bytes or ZLIB). Anything else is refused with the
reason.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from tfshards import storage
from tfshards.errors import OptionsError
from tfshards.schemas.format import COMPRESSIONS, ENCODINGS, TFDS_FILES, TFDS_IMAGE
from tfshards.schemas.manifest import Manifest
from tfshards.storage import Location, StorageOptions

TFDS_FILE_TEMPLATE = "{SPLIT}-{SHARD_X_OF_Y}.{FILEFORMAT}"


def tfds_problems(manifest: Manifest) -> list[str]:
    """Why TFDS cannot load this dataset as it is; empty when it can."""
    problems = []
    if not COMPRESSIONS[manifest.compression.type].tfds_readable:
        problems.append(
            f"shards are {manifest.compression.type}-compressed; TFDS reads "
            "uncompressed TFRecords only (convert with --compression none)"
        )
    if manifest.image_shape is None:
        problems.append(
            "records differ in size; TFDS features need one shape (convert with --resize HxW)"
        )
    image, mask = manifest.image.encoding, manifest.mask.encoding
    tensors = [ENCODINGS[name].tfds_form != TFDS_IMAGE for name in (image, mask)]
    if any(tensors) and image != mask:
        problems.append(
            f"images ({image}) and masks ({mask}) must share a raw or deflate encoding, or "
            "both be PNG/JPEG, for TFDS"
        )
    return problems


def export_tfds(
    path: Location, *, name: str = "tfshards_dataset", storage_options: StorageOptions = None
) -> list[Location]:
    """Write dataset_info.json and features.json beside the shards; return their paths.

    For a dataset in a bucket both are written locally (the shards are not read again)
    and uploaded beside the manifest."""
    manifest = Manifest.load(path, storage_options)
    problems = tfds_problems(manifest)
    if problems:
        raise OptionsError("TFDS cannot load this dataset: " + "; ".join(problems))
    try:
        import tensorflow_datasets as tfds
    except ImportError:
        raise OptionsError(
            'TFDS metadata needs tensorflow-datasets: pip install "tfshards[tfds]"'
        ) from None
    if storage.is_url(path):
        with tempfile.TemporaryDirectory(prefix="tfshards-tfds-") as tmp:
            for split in manifest.splits.values():  # TFDS finds shards by name: empty stand-ins
                for shard in split.shards:
                    (Path(tmp) / shard.file).touch()
            _write_metadata(tfds, manifest, Path(tmp), name, check_data=False)
            for file in TFDS_FILES:
                storage.put(Path(tmp) / file, storage.join(path, file), storage_options)
        return [storage.join(path, file) for file in TFDS_FILES]
    root = Path(path).resolve()
    _write_metadata(tfds, manifest, root, name, check_data=True)
    return [root / file for file in TFDS_FILES]


def _write_metadata(tfds, manifest: Manifest, root: Path, name: str, *, check_data: bool) -> None:
    template = tfds.core.ShardedFileTemplate(
        data_dir=root, template=TFDS_FILE_TEMPLATE, dataset_name=name, filetype_suffix="tfrecord"
    )
    split_infos = [
        tfds.core.SplitInfo(
            name=split,
            shard_lengths=[shard.records for shard in info.shards],
            num_bytes=info.bytes,
            filename_template=template.replace(split=split),
        )
        for split, info in manifest.splits.items()
    ]
    tfds.folder_dataset.write_metadata(
        data_dir=root,
        features=_features(tfds, manifest),
        split_infos=split_infos,
        filename_template=template,
        check_data=check_data,
        description="Image/mask pairs converted by tfshards; see tfshards.json.",
    )


def _features(tfds, manifest: Manifest):
    import numpy as np

    height, width, channels = manifest.image_shape
    form = ENCODINGS[manifest.image.encoding].tfds_form

    def pixels(depth: int):
        if form != TFDS_IMAGE:
            return tfds.features.Tensor(
                shape=(height, width, depth),
                dtype=np.uint8,
                encoding=getattr(tfds.features.Encoding, form),
            )
        return tfds.features.Image(shape=(height, width, depth))

    scalar = tfds.features.Scalar(dtype=np.int64)
    return tfds.features.FeaturesDict(
        {
            "key": tfds.features.Text(),
            "image": {
                "encoded": pixels(channels),
                "format": tfds.features.Text(),
                "height": scalar,
                "width": scalar,
                "channels": scalar,
            },
            "mask": {"encoded": pixels(1), "format": tfds.features.Text(), "channels": scalar},
        }
    )
