"""Checks that need no TensorFlow: verify shards against their manifest, inspect a dataset."""

from tfshards.checks.info import DatasetInfo, class_weights, info
from tfshards.checks.inspect import dataset_summary
from tfshards.checks.verify import VerifyReport, verify

__all__ = ["DatasetInfo", "VerifyReport", "class_weights", "dataset_summary", "info", "verify"]
