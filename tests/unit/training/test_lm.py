"""The small target LM: built from a Qwen3 (or Qwen3.5 hybrid) config, trained on windows, best held-out step kept."""

import math

import torch

from ddtree.training.lm import (
    HybridTargetSpec, LMTrainConfig, TargetSpec, build_target, mean_nll, sample_windows, train_target,
)
from ddtree.training.loop import Budget, OptimConfig


def test_default_spec_is_a_10_to_20m_qwen3():
    model = build_target(TargetSpec())
    n = sum(p.numel() for p in model.parameters())
    assert 10e6 < n < 20e6 and model.config.model_type == "qwen3" and model.config.tie_word_embeddings


def test_hybrid_spec_is_a_qwen35_with_qwen36s_three_to_one_pattern():
    model = build_target(HybridTargetSpec(hidden_size=256, intermediate_size=640, num_hidden_layers=8,
                                          num_attention_heads=4, head_dim=64), eos_token_id=2, pad_token_id=0)
    cfg = model.config
    assert type(model).__name__ == "Qwen3_5ForCausalLM" and cfg.model_type == "qwen3_5_text"
    assert cfg.layer_types == ["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3 + ["full_attention"]
    assert cfg.rope_parameters["partial_rotary_factor"] == 0.25 and cfg.eos_token_id == 2 and cfg.tie_word_embeddings
    assert 7e6 < sum(p.numel() for p in model.parameters()) < 9e6  # 16 MB in bf16: room for its drafters in 25 MB


def test_windows_are_contiguous_slices():
    stream = torch.arange(100)
    w = sample_windows(stream, 4, 10, torch.Generator().manual_seed(0))
    assert w.shape == (4, 10) and torch.equal(w[:, 1:] - w[:, :-1], torch.ones(4, 9, dtype=torch.long))


def test_training_lowers_heldout_loss_and_keeps_the_best_step():
    # A learnable stream: a fixed cycle of 17 tokens.
    stream = torch.arange(3, 20).repeat(60)
    model = build_target(TargetSpec.tiny(vocab_size=32))
    before = mean_nll(model, stream, seq_len=32)
    cfg = LMTrainConfig(batch_size=8, seq_len=32, eval_every=10, optim=OptimConfig(lr=3e-3))
    result = train_target(model, stream, stream, cfg, Budget(max_steps=40), log=None)
    after = mean_nll(model, stream, seq_len=32)
    assert after < 0.5 * before and after == min(n for _, n in result.history)
    assert math.isclose(result.best_heldout_nll, after, rel_tol=1e-4)
    assert [s for s, _ in result.history] == [1, 10, 20, 30, 40]
