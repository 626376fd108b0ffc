"""Greedy verification (T = 0): the target's argmax at every node."""

from __future__ import annotations

import torch
from torch import Tensor

from ddtree.types import Tree, Verification
from ddtree.verifiers.walk import walk_tree


class GreedyVerifier:
    """Accepts exactly the tokens greedy decoding of the target would produce."""

    temperature = 0.0

    def verify(self, tree: Tree, logits: Tensor, generator: torch.Generator | None = None) -> Verification:
        return walk_tree(tree, logits.argmax(dim=-1))  # logits [n, vocab]
