"""Reading a split's records by index, without TensorFlow: the layer under ``tfshards.read``'s
ordered reader and the random-access sources for other frameworks (``Pairs``: PyTorch's
``DataLoader``, Grain's ``MapDataset.source``)."""

from tfshards.sources.pairs import Pairs, torch_pair
from tfshards.sources.pixel_batches import PairDecodeError
from tfshards.sources.records import SplitRecords

__all__ = ["PairDecodeError", "Pairs", "SplitRecords", "torch_pair"]
