"""The folded additive masks of a static-cache verify, one buffer per (n, W), rewritten in place.

A verify of n tokens after P committed ones attends over W cache rows, W the live width P + n
rounded up to ``width_step``. Its mask is ``[1, 1, groups * n, W]``: the rows are repeated once per
query head sharing a K/V head, so ``ddtree.models.attention.folded_sdpa`` folds those heads into
the query length and copies no K/V. A CUDA graph reads the mask buffer it was recorded with, so
the buffer of an (n, W) belongs to it for the owner's lifetime; a prefill gets a buffer of its own.
"""

from __future__ import annotations

import torch
from torch import Tensor


class FoldedMasks:
    """The mask buffers of one static target: ``verify(n, tree_part, past)`` and ``prefill(n)``.

    >>> masks = FoldedMasks(groups=2, width_step=8, max_length=32, dtype=torch.float32, device=torch.device("cpu"))
    >>> masks.verify(2, torch.tensor([[True, False], [True, True]]), past=3).shape
    torch.Size([1, 1, 4, 8])
    """

    def __init__(self, groups: int, width_step: int, max_length: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        self.groups, self.width_step, self.max_length = groups, width_step, max_length
        self.dtype, self.device = dtype, device
        self.low = torch.finfo(dtype).min
        self._buffers: dict[tuple[int, int], Tensor] = {}  # (n, W) -> [1, 1, groups * n, W]
        self._past: dict[tuple[int, int], int] = {}  # (n, W) -> the prefix length its buffer was last written for

    def width(self, total: int) -> int:
        """Cache rows an attention reads for ``total`` live rows: rounded up to ``width_step``."""
        return min(self.max_length, -(-total // self.width_step) * self.width_step)

    def prefill(self, n: int) -> Tensor:
        """A folded causal mask for a prompt of n tokens, in a buffer of its own: the verify buffer
        of the same (n, W), if any, belongs to a graph that reads it."""
        width = self.width(n)
        buf = torch.full((1, 1, self.groups * n, width), self.low, dtype=self.dtype, device=self.device)
        causal = torch.tril(torch.ones(n, n, dtype=torch.bool, device=self.device))
        buf.view(self.groups, n, width)[:, :, :n] = torch.where(causal, 0.0, self.low).to(self.dtype)
        return buf

    def verify(self, n: int, tree_part: Tensor, past: int) -> Tensor:
        """The ``[1, 1, groups * n, W]`` mask of a verify, in the (n, W) buffer kept for it: prefix
        visible, the tree part as given (a bool ``[n, n]`` or a MaskCompiler's additive
        ``[1, 1, n, past + n]``), rest hidden."""
        width, low = self.width(past + n), self.low
        key = (n, width)
        buf = self._buffers.get(key)
        if buf is None:
            buf = torch.full((1, 1, self.groups * n, width), low, dtype=self.dtype, device=self.device)
            self._buffers[key], self._past[key] = buf, 0
        if tree_part.dtype == torch.bool:
            block = torch.where(tree_part.to(buf.device), 0.0, low).to(self.dtype)
        else:
            block = tree_part[0, 0, :, past : past + n]
        # Only what changed since this buffer's last use is written. Within a sequence the prefix
        # only grows: the columns it gained (the last block's among them) become 0, the new block
        # covers the rest of the last one, and the tail beyond it was already hidden.
        rows = buf.view(self.groups, n, width)
        last_past = self._past[key]
        if past >= last_past:
            rows[:, :, last_past:past] = 0
        else:  # a new sequence: rewrite the row in full
            rows[:, :, :past] = 0
            rows[:, :, past + n :] = low
        rows[:, :, past : past + n] = block
        self._past[key] = past
        return buf
