"""``target_for`` picks the one target class a model needs (``ddtree.models.dispatch``)."""

import copy

import pytest
from transformers import Qwen3Config, Qwen3MoeConfig

from ddtree.models import HFTarget, HybridTarget, target_for
from ddtree.models.dispatch import STATIC_LENGTH, graphable, is_hybrid
from ddtree.models.hybrid_static import StaticHybridTarget
from ddtree.models.static_target import StaticTarget


def test_target_for_picks_the_fast_path_only_where_it_fits(tiny_models):
    plain, hybrid = tiny_models["qwen3"], tiny_models["qwen35"]
    assert is_hybrid(hybrid) and not is_hybrid(plain)
    assert type(target_for(plain, fast="auto")) is HFTarget  # on a CPU the fast path does not fit
    static = target_for(plain, fast=True)
    assert type(static) is StaticTarget and not static.cuda_graphs and static.max_length == STATIC_LENGTH
    assert static.fused_projections == 0  # fuse_projections=None: on with CUDA graphs, so not on a CPU
    assert type(target_for(plain, max_length=64, fast=True)) is StaticTarget
    assert type(target_for(hybrid, fast="auto")) is HybridTarget
    fast_hybrid = target_for(hybrid, fast=True)  # GDN state in static slabs, no graphs on a CPU
    assert type(fast_hybrid) is StaticHybridTarget and not fast_hybrid.cuda_graphs
    fused = target_for(copy.deepcopy(hybrid), max_length=64, fast=True, fuse_projections=True)
    assert type(fused) is StaticHybridTarget and fused.fused_projections == 2 * hybrid.config.num_hidden_layers
    assert target_for(hybrid, fast=False, fuse_projections=True).__class__ is HybridTarget  # eager: unchanged
    with pytest.raises(ValueError, match="fast must be true, false or auto"):
        target_for(plain, fast="yes")


def test_only_dense_full_attention_models_are_graphable(tiny_models):
    assert graphable(Qwen3Config()) and graphable(tiny_models["llama"].config)
    assert not graphable(Qwen3MoeConfig()) and not graphable(tiny_models["qwen35"].config.get_text_config())

