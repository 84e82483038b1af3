"""Checks that need no TensorFlow: verify shards against their manifest, inspect a dataset."""

from tfshards.checks.inspect import dataset_summary
from tfshards.checks.verify import VerifyReport, verify

__all__ = ["VerifyReport", "dataset_summary", "verify"]
