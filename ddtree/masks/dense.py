"""Dense additive 4-D masks, usable by SDPA and eager attention alike.

Node i sees the whole committed prefix, itself and its ancestors; its position id is
``past_length + depth(i)``, so every root path is laid out exactly as a plain sequence.
"""

from __future__ import annotations

import torch

from ddtree.types import Tree, VerifyInputs


class DenseMaskCompiler:
    """Builds ``[1, 1, n, past + n]`` additive masks (0 visible, dtype-min hidden).

    One buffer is kept and grown as needed, so a run allocates a mask a handful of times
    rather than every round. The returned mask is a view of that buffer: it is valid until
    the next ``compile``. Nor is the prefix part rewritten every round: the buffer's first
    ``_clean`` columns are known to be 0 in every row, so a round zeroes only the columns the
    prefix gained since the last one and writes the n x n tree block, O(n (n + new tokens))
    instead of O(n x past).

    >>> c = DenseMaskCompiler()
    >>> c.compile(Tree.root(5), past_length=3).attention_mask.shape
    torch.Size([1, 1, 1, 4])
    """

    def __init__(self, dtype: torch.dtype | str = torch.float32, device: torch.device | str = "cpu") -> None:
        self.dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        self.device = torch.device(device)
        self._buffer = torch.empty(0, 0, dtype=self.dtype, device=self.device)
        self._clean = 0  # columns [0, _clean) of the buffer are 0 in every row

    def to(self, device: torch.device | str, dtype: torch.dtype) -> "DenseMaskCompiler":
        """Place the masks where the target's first layer reads them."""
        self.device, self.dtype = torch.device(device), dtype
        self._buffer = torch.empty(0, 0, dtype=dtype, device=self.device)
        self._clean = 0
        return self

    def _rows(self, n: int, total: int) -> torch.Tensor:
        rows, cols = self._buffer.shape
        if rows < n or cols < total:
            self._buffer = torch.zeros(
                max(n, rows), max(total, cols, 2 * cols), dtype=self.dtype, device=self.device
            )
            self._clean = self._buffer.shape[1]
        return self._buffer[:n, :total]

    def compile(self, tree: Tree, past_length: int) -> VerifyInputs:
        n = tree.size
        mask = self._rows(n, past_length + n)  # [n, past + n]
        if past_length > self._clean:  # the prefix grew: zero only its new columns, in every row
            self._buffer[:, self._clean : past_length] = 0
        hidden = ~tree.ancestors().to(self.device)  # [n, n]
        mask[:, past_length:] = hidden.to(self.dtype) * torch.finfo(self.dtype).min
        self._clean = past_length  # the block's columns are no longer all 0
        return VerifyInputs(
            input_ids=tree.tokens.to(self.device)[None],
            position_ids=(tree.depths + past_length).to(self.device)[None],
            attention_mask=mask[None, None],
            parents=tree.parents,
            past_length=past_length,
        )
