"""Write the metadata that lets TensorFlow Datasets load converted shards with its own reader.

After ``export_tfds("shards/")``, ``tfds.builder_from_directory("shards/")`` loads every
split. The features are the record schema's fields, one each under the same names
(``key``, ``image/encoded``, ``image/format``, ..., ``mask/encoded``); the two pixel
fields are decoded by TFDS to the stored pixels (images uint8 or uint16, of any channel
count in raw/deflate; masks uint8), and ``supervised_keys`` makes
``as_dataset(split, as_supervised=True)`` yield ``(image, mask)`` pairs. The mask feature
carries the class count (``tfshards.info``) and the class names when given.

TFDS can represent: uncompressed shards (it reads no gzip/zlib TFRecords), records of one
size, and images encoded keep/png/jpeg (a TFDS Image; masks a LabeledImage) or raw/deflate
with masks in the same encoding (a TFDS Tensor stored as bytes or ZLIB). Anything else
is refused with the reason.

JPEG images: TFDS's Image feature decodes them with TensorFlow's fast DCT, a few levels
off the pixels conversion checked (Pillow's, libjpeg's accurate integer DCT), which
``tfshards.read`` gives. For those, pass ``as_dataset(..., decoders={"image/encoded": d})``
with ``d`` a ``tfds.decode.make_decoder()`` function calling
``tf.io.decode_jpeg(data, channels=..., dct_method="INTEGER_ACCURATE")``.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path

from tfshards import storage
from tfshards.checks.info import DatasetInfo, info
from tfshards.errors import OptionsError
from tfshards.schemas.format import COMPRESSIONS, ENCODINGS, TFDS_FILES, TFDS_IMAGE
from tfshards.schemas.manifest import Manifest
from tfshards.schemas.record import FIELDS, Field
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
    path: Location,
    *,
    name: str = "tfshards_dataset",
    class_names: Sequence[str] | None = None,
    storage_options: StorageOptions = None,
) -> list[Location]:
    """Write dataset_info.json and features.json beside the shards; return their paths.

    For a dataset in a bucket both are written locally (the shards are not read again)
    and uploaded beside the manifest."""
    dataset = info(path, storage_options=storage_options)
    problems = tfds_problems(dataset.manifest)
    if class_names is not None and len(class_names) != dataset.num_classes:
        problems.append(
            f"{len(class_names)} class names for {dataset.num_classes} classes "
            f"(declared: {not dataset.num_classes_inferred})"
        )
    if problems:
        raise OptionsError("TFDS cannot load this dataset: " + "; ".join(problems))
    try:
        import tensorflow_datasets as tfds
    except ImportError:
        raise OptionsError(
            'TFDS metadata needs tensorflow-datasets: pip install "tfshards[tfds]"'
        ) from None
    features = _features(tfds, dataset, class_names)
    if storage.is_url(path):
        with tempfile.TemporaryDirectory(prefix="tfshards-tfds-") as tmp:
            for split in dataset.manifest.splits.values():  # TFDS finds shards by name
                for shard in split.shards:  # empty stand-ins
                    (Path(tmp) / shard.file).touch()
            _write_metadata(tfds, dataset.manifest, features, Path(tmp), name, check_data=False)
            for file in TFDS_FILES:
                storage.put(Path(tmp) / file, storage.join(path, file), storage_options)
        return [storage.join(path, file) for file in TFDS_FILES]
    root = Path(path).resolve()
    _write_metadata(tfds, dataset.manifest, features, root, name, check_data=True)
    return [root / file for file in TFDS_FILES]


def _write_metadata(
    tfds, manifest: Manifest, features, root: Path, name: str, *, check_data: bool
) -> None:
    template = tfds.core.ShardedFileTemplate(
        data_dir=root, template=TFDS_FILE_TEMPLATE, dataset_name=name, filetype_suffix="tfrecord"
    )
    split_infos = [
        tfds.core.SplitInfo(
            name=split,
            shard_lengths=[shard.records for shard in split_info.shards],
            num_bytes=split_info.bytes,
            filename_template=template.replace(split=split),
        )
        for split, split_info in manifest.splits.items()
    ]
    tfds.folder_dataset.write_metadata(
        data_dir=root,
        features=features,
        split_infos=split_infos,
        filename_template=template,
        check_data=check_data,
        supervised_keys=SUPERVISED_KEYS,
        description="Image/mask pairs converted by tfshards; see tfshards.json.",
    )


# (input, label) for as_supervised=True: the fields holding the image and the mask pixels.
SUPERVISED_KEYS = tuple(
    next(f.name for f in FIELDS if f.pixels == part) for part in ("image", "mask")
)


def _features(tfds, dataset: DatasetInfo, class_names: Sequence[str] | None):
    """The TFDS features: one per field of the record schema, under the field's name."""
    import numpy as np

    height, width, channels = dataset.manifest.image_shape
    form = ENCODINGS[dataset.manifest.image.encoding].tfds_form
    classes = dataset.num_classes
    described = f"class indices 0..{classes - 1} ({classes} classes"
    described += f": {', '.join(class_names)})" if class_names else ")"
    if dataset.num_classes_inferred:
        described += ", inferred from the values found"

    def pixels(part: str):
        shape = (height, width, channels if part == "image" else 1)
        mask = part == "mask"
        dtype = np.uint8 if mask else np.dtype(dataset.manifest.image.dtype)  # uint8, uint16
        if form == TFDS_IMAGE:
            if mask:
                return tfds.features.LabeledImage(
                    labels=list(class_names) if class_names else classes,
                    shape=shape,
                    doc=tfds.features.Documentation(desc=described),
                )
            return tfds.features.Image(shape=shape, dtype=dtype)
        return tfds.features.Tensor(
            shape=shape,
            dtype=dtype,
            encoding=getattr(tfds.features.Encoding, form),
            doc=tfds.features.Documentation(desc=described) if mask else None,
            minimum=0 if mask else None,
            maximum=classes - 1 if mask else None,
        )

    def feature(field: Field):
        if field.pixels is not None:
            return pixels(field.pixels)
        return tfds.features.Text() if field.kind == "bytes" else tfds.features.Scalar(np.int64)

    # A tile's source/ features are left out: TFDS reads the features every record holds.
    return tfds.features.FeaturesDict(
        {field.name: feature(field) for field in FIELDS if field.required}
    )
