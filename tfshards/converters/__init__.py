"""The writer side: pairing, validation, planning and shard writing."""

from tfshards.converters.convert import ConvertResult, ConvertRun, convert, run_conversion
from tfshards.converters.options import ConvertOptions
from tfshards.converters.pairing import Pair, PairingReport, pair_files
from tfshards.converters.synth import synth

__all__ = [
    "ConvertOptions",
    "ConvertResult",
    "ConvertRun",
    "Pair",
    "PairingReport",
    "convert",
    "run_conversion",
    "pair_files",
    "synth",
]
