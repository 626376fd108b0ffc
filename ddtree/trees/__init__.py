"""Tree builders: which continuations of the bonus token the target verifies."""

from ddtree.trees.best_first import BestFirstTreeBuilder
from ddtree.trees.calibrated import CalibratedTreeBuilder
from ddtree.trees.chain import ChainTreeBuilder

__all__ = ["BestFirstTreeBuilder", "CalibratedTreeBuilder", "ChainTreeBuilder"]
