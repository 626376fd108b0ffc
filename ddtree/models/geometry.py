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


def random_qwen3(name: str, device: str = "cuda", dtype: torch.dtype = torch.bfloat16, max_positions: int = 40960,
                 **sizes):
    """A Qwen3 causal LM of a named geometry with random weights, built directly on ``device``;
    ``sizes`` override its config fields (``num_hidden_layers`` for a shrunk stack)."""
    if name not in QWEN3:
        raise ValueError(f"unknown geometry {name!r}; known: {sorted(QWEN3)}")
    hidden, inter, layers, heads, kv = QWEN3[name]
    config = Qwen3Config(**{
        **dict(vocab_size=151936, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
               num_attention_heads=heads, num_key_value_heads=kv, head_dim=128, max_position_embeddings=max_positions,
               rope_theta=1_000_000.0, tie_word_embeddings=name == "qwen3-4b", attn_implementation="sdpa"),
        **sizes,
    })
    with torch.device(device):
        model = Qwen3ForCausalLM(config).to(dtype)
    return model.eval()


# Qwen3.6-27B: 64 layers, every 4th full attention (gated, partial rotary), the rest Gated DeltaNet.
HYBRID = {
    "qwen3.6-27b": dict(
        vocab_size=248320, hidden_size=5120, intermediate_size=17408, num_hidden_layers=64,
        num_attention_heads=24, num_key_value_heads=4, head_dim=256, linear_num_key_heads=16,
        linear_num_value_heads=48, linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
    ),
}


def hybrid_config(num_hidden_layers: int, **geometry):
    """A ``Qwen3_5TextConfig`` of the given sizes, with Qwen3.6's layer pattern and rotary."""
    from transformers import Qwen3_5TextConfig

    return Qwen3_5TextConfig(
        num_hidden_layers=num_hidden_layers, max_position_embeddings=262144, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                         "mrope_section": [11, 11, 10], "mrope_interleaved": True},
        layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(num_hidden_layers)],
        attn_implementation="sdpa", **geometry,
    )


def random_hybrid(name: str | None = None, device: str = "cuda", dtype: torch.dtype = torch.bfloat16, seed: int = 0,
                  **sizes):
    """A Qwen3.5-layout hybrid causal LM with random weights, allocated directly on ``device``.

    ``name`` picks a geometry of ``HYBRID``; ``sizes`` override its fields (``num_hidden_layers``
    for a shrunk stack). The slow Transformers init is skipped for one in-place fill per tensor
    (``fill_random_``): seconds for 55 GB on a GPU.
    """
    from transformers import Qwen3_5ForCausalLM
    from transformers.initialization import no_init_weights

    if name is not None and name not in HYBRID:
        raise ValueError(f"unknown hybrid geometry {name!r}; known: {sorted(HYBRID)}")
    geometry = {**(HYBRID[name] if name else {}), **sizes}
    config = hybrid_config(**geometry)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device), no_init_weights():
            model = Qwen3_5ForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    fill_random_(model, seed)
    return model.eval()


@torch.no_grad()
def fill_random_(model, seed: int) -> None:
    """A finite random init that keeps GDN layers alive (moderate decays, O(1) conv)."""
    gen = torch.Generator(device=model.device).manual_seed(seed)
    for name, param in model.named_parameters():
        if name.endswith("A_log"):
            param.uniform_(-3.0, 0.0, generator=gen)  # decays e^-0.05 .. e^-1 per token
        elif name.endswith("dt_bias"):
            param.normal_(0.0, 1.0, generator=gen)
        elif name.endswith("conv1d.weight"):
            param.normal_(0.0, 0.5, generator=gen)
        elif param.ndim == 1:  # norms: linear_attn.norm is a plain w (ones), the others 1 + w (zeros)
            param.fill_(1.0 if name.endswith("linear_attn.norm.weight") else 0.0)
        else:
            param.normal_(0.0, 0.02, generator=gen)


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
