"""Reading a split's records by index, without TensorFlow: the layer under ``tfshards.read``'s
ordered reader and the random-access sources for other frameworks."""

from tfshards.sources.records import SplitRecords

__all__ = ["SplitRecords"]
