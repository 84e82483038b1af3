"""The writer side: pairing, validation, planning and shard writing."""

from tfshards.converters.convert import ConvertResult, convert, convert_with_report
from tfshards.converters.options import ConvertOptions
from tfshards.converters.pairing import Pair, PairingReport, pair_files
from tfshards.converters.synth import synth

__all__ = [
    "ConvertOptions",
    "ConvertResult",
    "Pair",
    "PairingReport",
    "convert",
    "convert_with_report",
    "pair_files",
    "synth",
]
