"""The tree block alone: a bool ``[n, n]`` visibility, with no buffer as wide as the context.

The committed prefix is visible to every node, so a verify's mask carries no information beyond
its ``n x n`` tree block. The fast targets (``StaticTarget``, ``StaticHybridTarget``) take that block
as it is: their folded dense masks and FlexAttention layouts write it into buffers of their own.
The eager targets expand it to the dense additive mask (``additive_tree_mask``) themselves. At long
context this keeps the layout stage O(n^2) in time and memory, where ``DenseMaskCompiler`` keeps an
``[n, past + n]`` buffer.
"""

from __future__ import annotations

import numpy as np
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
        if self.device.type == "cuda":
            ids, positions, visible = packed_move(tree, past_length, self.device, pin=True)
        else:
            ids, positions, visible = tree.tokens, tree.depths + past_length, tree.ancestors()
        return VerifyInputs(input_ids=ids[None], position_ids=positions[None], attention_mask=visible,
                            parents=tree.parents, past_length=past_length)


def packed_move(tree: Tree, past_length: int, device: torch.device, pin: bool = True) -> tuple[Tensor, Tensor, Tensor]:
    """The tree's ids ``[n]``, positions ``[n]`` (``past_length`` + depth) and ancestor block ``[n, n]`` on
    ``device``, written into one host buffer (with numpy: a few microseconds) and moved in one copy,
    pinned and asynchronous where ``pin``: on CUDA three copies from pageable memory each waited.

    >>> ids, positions, visible = packed_move(Tree.root(7), 4, torch.device("cpu"), pin=False)
    >>> ids.tolist(), positions.tolist(), visible.tolist()
    ([7], [4], [[True]])
    """
    n = tree.size
    staging = torch.empty(n * (16 + n), dtype=torch.uint8, pin_memory=pin)
    host = staging.numpy()
    host[: 8 * n].view(np.int64)[:] = tree.tokens.cpu().numpy()
    np.add(tree.depths.cpu().numpy(), past_length, out=host[8 * n : 16 * n].view(np.int64))
    host[16 * n :].view(np.bool_)[:] = tree.ancestors().numpy().reshape(-1)
    moved = staging.to(device, non_blocking=pin)
    return (moved[: 8 * n].view(torch.int64), moved[8 * n : 16 * n].view(torch.int64),
            moved[16 * n :].view(torch.bool).view(n, n))


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
