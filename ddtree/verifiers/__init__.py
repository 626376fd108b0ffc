"""Verifiers: the target's own decoding rule, walked down the draft tree."""

from ddtree.verifiers.greedy import GreedyVerifier
from ddtree.verifiers.sampling import SamplingVerifier
from ddtree.verifiers.walk import walk_tree

__all__ = ["GreedyVerifier", "SamplingVerifier", "walk_tree"]
