"""Tiny random-weight models for tests, notebooks and examples (nothing is downloaded)."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

from ddtree.models.dflash import DFlashConfig, DFlashDraftModel

FAMILIES = ("qwen3", "llama")


def tiny_target(family: str = "qwen3", vocab_size: int = 96, num_layers: int = 4, seed: int = 0,
                dtype: torch.dtype = torch.float32, max_positions: int = 1024):
    """A random-weight causal LM of the given family, small enough for CPU tests."""
    torch.manual_seed(seed)
    common = dict(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=num_layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=max_positions,
        tie_word_embeddings=False, attn_implementation="sdpa",
    )
    if family == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(**common))
    elif family == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    else:
        raise ValueError(f"unknown tiny family {family!r}; choose one of {FAMILIES}")
    # Sharper logits than the default init, so greedy text is not a sea of near-ties.
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(4.0)
    return model.to(dtype).eval()


def tiny_dflash(target_model, block_size: int = 8, num_layers: int = 2, seed: int = 0,
                mask_token_id: int | None = None) -> DFlashDraftModel:
    """A random-weight DFlash drafter shaped for ``target_model``."""
    torch.manual_seed(seed)
    cfg = target_model.config
    n = cfg.num_hidden_layers
    layer_ids = tuple(sorted({min(1, n - 1), max(n - 2, 0)}))
    dcfg = DFlashConfig(
        hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size, num_hidden_layers=num_layers,
        num_attention_heads=cfg.num_attention_heads, num_key_value_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim, vocab_size=cfg.vocab_size, num_target_layers=n,
        mask_token_id=cfg.vocab_size - 1 if mask_token_id is None else mask_token_id,
        target_layer_ids=layer_ids, block_size=block_size, max_position_embeddings=cfg.max_position_embeddings,
    )
    return DFlashDraftModel(dcfg).to(target_model.dtype).eval()
