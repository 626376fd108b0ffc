"""Timing and acceptance statistics."""

from ddtree.metrics.accounting import Accounting, ExactAccounting, ReferenceAccounting
from ddtree.metrics.acceptance import mean_of_means, pooled_histogram
from ddtree.metrics.timer import StageTimer

__all__ = ["Accounting", "ExactAccounting", "ReferenceAccounting", "StageTimer", "mean_of_means", "pooled_histogram"]
