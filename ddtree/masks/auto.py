"""The mask each target reads best: the tree block alone where the target takes it as it is, else dense.

The fast targets (``StaticTarget``, ``StaticHybridTarget``) write a verify's ``[n, n]`` tree block into
masks or layouts of their own, so a ``[n, past + n]`` buffer in the loop only costs them: its prefix
columns are zeroed and its block written each round, and it grows with the context. The eager
targets read a dense additive mask, which ``DenseMaskCompiler`` keeps and rewrites only in part,
where the tree block would be expanded to a new one every round.
"""

from __future__ import annotations

import torch

from ddtree.masks.dense import DenseMaskCompiler
from ddtree.masks.tree import TreeMaskCompiler
from ddtree.types import Tree, VerifyInputs


def takes_tree_block(target) -> bool:
    """Whether ``target`` reads the bool ``[n, n]`` tree block as it is (its ``reads_tree_block``)."""
    return bool(getattr(target, "reads_tree_block", False))


class AutoMaskCompiler:
    """``TreeMaskCompiler`` for a target that reads the tree block as it is, ``DenseMaskCompiler``
    for any other; the engine asks ``for_target`` once and keeps the compiler it returns.
    Used on its own, before ``for_target``, it compiles dense masks. Every choice gives the same tokens.

    >>> type(AutoMaskCompiler().for_target(static_target)).__name__    # doctest: +SKIP
    'TreeMaskCompiler'
    """

    def __init__(self) -> None:
        self._dense = DenseMaskCompiler()

    def for_target(self, target) -> DenseMaskCompiler | TreeMaskCompiler:
        return TreeMaskCompiler() if takes_tree_block(target) else DenseMaskCompiler()

    def to(self, device: torch.device | str, dtype: torch.dtype) -> "AutoMaskCompiler":
        self._dense.to(device, dtype)
        return self

    def compile(self, tree: Tree, past_length: int) -> VerifyInputs:
        return self._dense.compile(tree, past_length)
