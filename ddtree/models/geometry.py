"""Named model geometries with random weights, for speed work without downloads.

Random weights make acceptance meaningless but leave every shape, and so every cost, as in
the real model: verify and draft times measured on them are the real ones.
"""

from __future__ import annotations

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from ddtree.models.dflash import DFlashConfig, DFlashDraftModel

QWEN3 = {
    # name: (hidden, intermediate, layers, heads, kv heads), head_dim 128, vocab 151936
    "qwen3-4b": (2560, 9728, 36, 32, 8),
    "qwen3-8b": (4096, 12288, 36, 32, 8),
}


def random_qwen3(name: str, device: str = "cuda", dtype: torch.dtype = torch.bfloat16, max_positions: int = 40960):
    """A Qwen3 causal LM of a named geometry with random weights, built directly on ``device``."""
    if name not in QWEN3:
        raise ValueError(f"unknown geometry {name!r}; known: {sorted(QWEN3)}")
    hidden, inter, layers, heads, kv = QWEN3[name]
    config = Qwen3Config(
        vocab_size=151936, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv, head_dim=128, max_position_embeddings=max_positions,
        rope_theta=1_000_000.0, tie_word_embeddings=name == "qwen3-4b", attn_implementation="sdpa",
    )
    with torch.device(device):
        model = Qwen3ForCausalLM(config).to(dtype)
    return model.eval()


def random_dflash_for(model, num_layers: int = 5, block_size: int = 16, device: str = "cuda",
                      dtype: torch.dtype = torch.bfloat16) -> DFlashDraftModel:
    """A DFlash drafter shaped like the z-lab ones for ``model`` (5 layers, 5 target features)."""
    cfg = model.config
    n = cfg.num_hidden_layers
    layer_ids = tuple(round(1 + i * (n - 4) / 4) for i in range(5))  # [1, 9, 17, 25, 33] for 36 layers
    dcfg = DFlashConfig(
        hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size, num_hidden_layers=num_layers,
        num_attention_heads=cfg.num_attention_heads, num_key_value_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim, vocab_size=cfg.vocab_size, num_target_layers=n, mask_token_id=cfg.vocab_size - 1,
        target_layer_ids=layer_ids, block_size=block_size,
    )
    with torch.device(device):
        drafter = DFlashDraftModel(dcfg)
        for p in drafter.parameters():
            if p.ndim > 1:
                torch.nn.init.normal_(p, std=0.02)
    return drafter.to(dtype).eval()
