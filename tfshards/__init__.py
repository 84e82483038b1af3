"""tfshards: image/mask folders -> pre-shuffled TFRecord shards -> tf.data for Keras.

>>> import tfshards
>>> tfshards.convert("data/images", "data/masks", "shards", val_fraction=0.1)  # doctest: +SKIP
"""

from tfshards.converters import ConvertOptions, convert, pair_files, synth
from tfshards.errors import (
    ManifestError,
    OptionsError,
    OutputError,
    PairError,
    PairingError,
    TfshardsError,
)
from tfshards.schemas import Manifest

__version__ = "0.1.0"

__all__ = [
    "ConvertOptions",
    "Manifest",
    "ManifestError",
    "OptionsError",
    "OutputError",
    "PairError",
    "PairingError",
    "TfshardsError",
    "convert",
    "pair_files",
    "synth",
]
