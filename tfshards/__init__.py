"""tfshards: image/mask folders -> pre-shuffled TFRecord shards -> tf.data for Keras.

>>> import tfshards
>>> tfshards.convert("data/images", "data/masks", "shards", val_fraction=0.1)  # doctest: +SKIP
"""

from tfshards.checks import DatasetInfo, VerifyReport, class_weights, dataset_summary, info, verify
from tfshards.checks.exposure import Exposure, exposure
from tfshards.checks.mix_report import MixExposure, mix_exposure
from tfshards.converters import ConvertOptions, convert, pair_files, synth
from tfshards.errors import (
    ManifestError,
    OptionsError,
    OutputError,
    PairError,
    PairingError,
    RecordTableError,
    StitchError,
    TfshardsError,
)
from tfshards.malloc_arenas import cap_malloc_arenas
from tfshards.readers.folds import folds
from tfshards.readers.mixing import Source
from tfshards.readers.sampling import ClassBalanced
from tfshards.schemas import Manifest
from tfshards.schemas.record_table import RecordTable

# Before TensorFlow's threads make their arenas; see malloc_arenas for why and the opt-out.
cap_malloc_arenas()

__version__ = "0.1.0"

# The reader needs TensorFlow, which takes seconds to import; the converter and
# its worker processes do not, so the reader is imported on first use.
_READER_NAMES = (
    "read",
    "ReadOptions",
    "ReadState",
    "RecordTable",
    "RecordTableError",
    "ResumeCallback",
    "list_caches",
    "clear_caches",
)
# Random access by index needs no TensorFlow (PyTorch, Grain), nor does the per-record
# table: imported on first use too.
_SOURCE_NAMES = ("Pairs", "PairDecodeError", "torch_pair")


def __getattr__(name: str):
    if name in _READER_NAMES:
        try:
            from tfshards import readers

            return getattr(readers, name)
        except ModuleNotFoundError as exc:
            if exc.name != "tensorflow":
                raise
            raise ModuleNotFoundError(
                f"tfshards.{name} needs TensorFlow, which is not installed (pip install "
                "tensorflow); without it, tfshards.Pairs reads pairs by index "
                "(docs/frameworks.md)",
                name="tensorflow",
            ) from exc
    if name in _SOURCE_NAMES:
        from tfshards import sources

        return getattr(sources, name)
    if name == "tiles":  # the function; tfshards.sources.tiles is a module
        from tfshards.sources.tiles import tiles

        return tiles
    if name == "Stitcher":
        from tfshards.sources.stitch import Stitcher

        return Stitcher
    if name == "Window":  # what Stitcher.add takes, for tiles cut by the user
        from tfshards.schemas.tiles import Window

        return Window
    if name == "records":  # the function; tfshards.sources.records is a module
        from tfshards.sources.record_tables import records

        return records
    raise AttributeError(f"module 'tfshards' has no attribute {name!r}")


__all__ = [
    "ClassBalanced",
    "ConvertOptions",
    "DatasetInfo",
    "Exposure",
    "Manifest",
    "ManifestError",
    "MixExposure",
    "OptionsError",
    "OutputError",
    "PairDecodeError",
    "PairError",
    "PairingError",
    "Pairs",
    "ReadOptions",
    "ReadState",
    "RecordTable",
    "RecordTableError",
    "ResumeCallback",
    "Source",
    "StitchError",
    "Stitcher",
    "TfshardsError",
    "VerifyReport",
    "Window",
    "class_weights",
    "clear_caches",
    "convert",
    "dataset_summary",
    "exposure",
    "folds",
    "info",
    "list_caches",
    "mix_exposure",
    "pair_files",
    "read",
    "records",
    "synth",
    "tiles",
    "torch_pair",
    "verify",
]
