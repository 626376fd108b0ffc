"""The tree block alone: a bool ``[n, n]`` visibility, with no buffer as wide as the context.

The committed prefix is visible to every node, so a verify's mask carries no information beyond
its ``n x n`` tree block. The fast targets (``StaticTarget``, ``StaticHybridTarget``) take that block
as it is: their folded dense masks and FlexAttention layouts write it into buffers of their own.
The eager targets expand it to the dense additive mask (``additive_tree_mask``) themselves. At long
context this keeps the layout stage O(n^2) in time and memory, where ``DenseMaskCompiler`` keeps an
``[n, past + n]`` buffer.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ddtree.types import Tree, VerifyInputs


class TreeMaskCompiler:
    """Builds the bool ``[n, n]`` visibility of a tree (node i sees j when j is i or an ancestor).

    >>> TreeMaskCompiler().compile(Tree.root(5), past_length=3).attention_mask.tolist()
    [[True]]
    """

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)

    def to(self, device: torch.device | str, dtype: torch.dtype) -> "TreeMaskCompiler":
        """Place the visibility where the target's first layer reads it (a bool mask has no dtype)."""
        self.device = torch.device(device)
        return self

    def compile(self, tree: Tree, past_length: int) -> VerifyInputs:
        return VerifyInputs(
            input_ids=tree.tokens.to(self.device)[None],
            position_ids=(tree.depths + past_length).to(self.device)[None],
            attention_mask=tree.ancestors().to(self.device),
            parents=tree.parents,
            past_length=past_length,
        )


def additive_tree_mask(mask: Tensor | object, past_length: int, dtype: torch.dtype) -> Tensor | object:
    """A verify mask as the dense additive ``[1, 1, n, past + n]`` (0 visible, dtype-min hidden) that an
    eager Transformers forward reads: a bool ``[n, n]`` tree block is expanded (prefix visible),
    anything else is returned as it is.

    >>> additive_tree_mask(torch.tensor([[True, False], [True, True]]), 1, torch.float32)[0, 0]
    tensor([[ 0.0000e+00,  0.0000e+00, -3.4028e+38],
            [ 0.0000e+00,  0.0000e+00,  0.0000e+00]])
    """
    if not (isinstance(mask, Tensor) and mask.dtype == torch.bool and mask.dim() == 2):
        return mask
    n = mask.shape[0]
    dense = torch.zeros(n, past_length + n, dtype=dtype, device=mask.device)
    dense[:, past_length:].masked_fill_(~mask, torch.finfo(dtype).min)
    return dense[None, None]
