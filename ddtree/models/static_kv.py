"""Preallocated attention K/V as the cache object a Transformers attention module updates.

A fixed-shape stand-in for transformers' caches, shared by the static hybrid target (all its
attention layers in one slab) and the graphed MTP drafter (its head's one layer): a forward
writes its K/V at the rows named by a device tensor and reads the first ``width`` rows, so a
CUDA graph replays it for any committed length. The caller's mask hides the rows a query must
not see.
"""

from __future__ import annotations

import torch
from torch import Tensor


class StaticKV:
    """K/V of ``layers`` attention layers in ``keys``/``values`` ``[layers, kv_heads, max_length, head_dim]``.

    Layer ``layer_idx`` lives in slot ``slots[layer_idx]`` (without ``slots``: one slot, whatever
    the index). ``at(rows, width)`` sets where the next forward writes and how many rows it reads.

    >>> kv = StaticKV(1, 2, 8, 4, torch.float32, torch.device("cpu"))
    >>> k, v = kv.at(torch.tensor([0, 1]), width=4).update(torch.ones(1, 2, 2, 4), torch.ones(1, 2, 2, 4), 0)
    >>> k.shape, int(kv.keys.sum())
    (torch.Size([1, 2, 4, 4]), 16)
    """

    def __init__(self, layers: int, kv_heads: int, max_length: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device, slots: dict[int, int] | None = None) -> None:
        shape = (layers, kv_heads, max_length, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.slots, self.max_length = slots, max_length
        self.rows: Tensor | None = None  # [n] where the next forward's K/V go
        self.width = max_length  # rows the next forward reads
        self.length = 0  # committed rows, for callers that ask the cache (``get_seq_length``)

    def at(self, rows: Tensor, width: int | None = None) -> "StaticKV":
        """The next forward writes rows ``rows`` ``[n]`` and reads rows ``0..width-1`` (all by default)."""
        self.rows, self.width = rows, self.max_length if width is None else width
        return self

    def update(self, key: Tensor, value: Tensor, layer_idx: int, *_, **__) -> tuple[Tensor, Tensor]:
        """``Cache.update`` as a decoder layer calls it (its cache kwargs are not needed here):
        ``key``/``value`` ``[1, kv_heads, n, head_dim]`` in, that layer's first ``width`` rows out."""
        slot = 0 if self.slots is None else self.slots[layer_idx]
        self.keys[slot].index_copy_(1, self.rows, key[0])
        self.values[slot].index_copy_(1, self.rows, value[0])
        return self.keys[slot, :, : self.width][None], self.values[slot, :, : self.width][None]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.length
