"""An SDPA attention function for masked verifies over a static cache.

Two costs of stock SDPA attention with a 4-D mask over a preallocated cache are avoidable:
it attends over every row of the cache, even the empty ones, and with a mask it expands the
K/V heads to the query heads (a copy of the whole cache per layer). Here the mask's width says
how many cache rows are live, so keys are sliced to it; and a mask with ``groups * n`` rows
says the query heads sharing a K/V head are folded into the query length, so no K/V copy is
made: query head ``j * groups + i``, token t, becomes row ``i * n + t`` of K/V head j. A ``BlockMask``
in place of the mask (a ``ddtree.models.flex_attention.FlexLayout``'s) runs block-sparse
FlexAttention over the whole cache instead: no mask tensor at all.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from ddtree.models.flex_attention import flex_attention_forward

NAME = "ddtree_sdpa"


def folded_sdpa(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """``query`` [1, Hq, n, d]; ``key``/``value`` [1, Hkv, L, d]; mask [1, 1, rows, W], W <= L, or a BlockMask."""
    if isinstance(attention_mask, BlockMask):
        return flex_attention_forward(module, query, key, value, attention_mask, scaling)
    if attention_mask is None or not isinstance(attention_mask, torch.Tensor):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    width = attention_mask.shape[-1]
    key, value = key[:, :, :width], value[:, :, :width]
    batch, q_heads, n, dim = query.shape
    kv_heads = key.shape[1]
    groups = q_heads // kv_heads
    if attention_mask.shape[-2] != groups * n or groups == 1:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    folded = query.reshape(batch, kv_heads, groups * n, dim)
    out = F.scaled_dot_product_attention(folded, key, value, attn_mask=attention_mask, scale=scaling)
    return out.reshape(batch, q_heads, n, dim).transpose(1, 2).contiguous(), None


def use_folded_sdpa(model) -> None:
    """Switch ``model``'s attention to ``folded_sdpa`` (the same math as SDPA)."""
    AttentionInterface.register(NAME, folded_sdpa)
    model.set_attn_implementation(NAME)
