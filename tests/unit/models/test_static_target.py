"""The static-cache target (the fast path's cache) is as exact as the dynamic one."""

import logging

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddtree import SpeculativeEngine
from ddtree.drafters import NullDrafter, OracleDrafter
from ddtree.masks import DenseMaskCompiler
from ddtree.models import HFTarget
from ddtree.models.static_target import StaticTarget
from ddtree.trees import BestFirstTreeBuilder, ChainTreeBuilder
from ddtree.testing import ReplayDrafter, greedy_reference
from ddtree.types import Draft
from ddtree.verifiers import GreedyVerifier


def test_greedy_identity_with_a_static_cache(tiny_models, family):
    model = tiny_models[family]
    prompt = torch.arange(4, 17)
    expected = torch.tensor(greedy_reference(model, prompt, 48))
    target = StaticTarget(model, max_length=256, cuda_graphs=False)
    for drafter, tree in [(NullDrafter(), ChainTreeBuilder()),
                          (OracleDrafter(model, depth=7, swap_prob=0.3, sharpness=10), BestFirstTreeBuilder(32))]:
        engine = SpeculativeEngine(target, drafter, tree, DenseMaskCompiler(), GreedyVerifier())
        for _ in range(2):  # the second prompt reuses the reset buffers
            assert engine.generate(prompt, max_new_tokens=48).tokens == expected.tolist()


def test_fused_kernels_keep_greedy_identity_and_leave_the_model_stock(tiny_models, family, monkeypatch):
    from ddtree.models import fused

    used = []
    monkeypatch.setattr(fused, "compiled", lambda fn: used.append(fn) or fn)  # the plain math: no compiler on CPU
    model = tiny_models[family]
    prompt = torch.arange(4, 17)
    expected = greedy_reference(model, prompt, 32)
    target = StaticTarget(model, max_length=256, cuda_graphs=False, fuse=True)
    engine = SpeculativeEngine(target, OracleDrafter(model, depth=7, swap_prob=0.3, sharpness=10),
                               BestFirstTreeBuilder(32), DenseMaskCompiler(), GreedyVerifier())
    assert engine.generate(prompt, max_new_tokens=32).tokens == expected
    assert fused.rms_norm in used and target.fuse
    assert not [name for name, m in model.named_modules() if "forward" in m.__dict__]


def test_a_failing_compiler_falls_back_to_the_stock_kernels(tiny_models, monkeypatch, caplog):
    from ddtree.models import fused

    def broken(fn):
        def fail(*args, **kwargs):
            raise RuntimeError("no compiler")
        return fail
    monkeypatch.setattr(fused, "compiled", broken)
    model = tiny_models["qwen3"]
    prompt = torch.arange(4, 17)
    target = StaticTarget(model, max_length=256, cuda_graphs=False, fuse=True)
    engine = SpeculativeEngine(target, NullDrafter(), ChainTreeBuilder(), DenseMaskCompiler(), GreedyVerifier())
    with caplog.at_level(logging.WARNING, logger="ddtree.models.static_target"):
        assert engine.generate(prompt, max_new_tokens=16).tokens == greedy_reference(model, prompt, 16)
    assert not target.fuse
    [record] = caplog.records  # said once, with why and what to do
    assert "RuntimeError: no compiler" in record.getMessage() and "fuse=False" in record.getMessage()


def test_an_error_inside_the_forward_propagates_and_keeps_the_fused_kernels(tiny_models, monkeypatch):
    from ddtree.models import fused

    monkeypatch.setattr(fused, "compiled", lambda fn: fn)  # a working "compiler" (the plain math)
    model = tiny_models["qwen3"]
    target = StaticTarget(model, max_length=256, cuda_graphs=False, fuse=True)

    def fail(module, args, output):
        raise RuntimeError("a bug in the forward, not the compiler")
    hook = model.model.layers[1].register_forward_hook(fail)
    try:
        with pytest.raises(RuntimeError, match="a bug in the forward"):
            target.prefill(torch.arange(4, 17))
    finally:
        hook.remove()
    assert target.fuse
    assert not [name for name, m in model.named_modules() if "forward" in m.__dict__] and not fused._PATCHES
    with torch.inference_mode():
        target.prefill(torch.arange(4, 17))  # and the target still works, fused


def test_an_error_of_another_kind_in_the_probe_propagates(tiny_models, monkeypatch):
    from ddtree.models import fused

    def wrong(fn):
        def fail(*args, **kwargs):
            raise TypeError("a bug, not a missing compiler")
        return fail
    monkeypatch.setattr(fused, "compiled", wrong)
    target = StaticTarget(tiny_models["qwen3"], max_length=64, cuda_graphs=False, fuse=True)
    with pytest.raises(TypeError, match="a bug"):
        target.prefill(torch.arange(4, 17))


def test_static_commit_matches_dynamic_commit(tiny_models):
    model = tiny_models["qwen3"]
    static, dynamic = StaticTarget(model, max_length=64, cuda_graphs=False), HFTarget(model)
    prompt = torch.arange(2, 12)
    for t in (static, dynamic):
        t.prefill(prompt)
    draft = Draft(torch.log_softmax(torch.randn(4, 96, generator=torch.Generator().manual_seed(0)), -1))
    tree = BestFirstTreeBuilder(10).build(draft, root_token=7)
    path = tree.path_to(tree.size - 1)
    outs = []
    for t in (static, dynamic):
        outs.append(t.forward_tree(DenseMaskCompiler().compile(tree, t.past_length)).logits)
        t.commit(path)
    torch.testing.assert_close(outs[0], outs[1], atol=1e-5, rtol=1e-5)
    length = prompt.numel() + len(path)
    for slot, d_layer in enumerate(dynamic.cache.layers):  # one slab, a slot per layer
        torch.testing.assert_close(static.kv.keys[slot, :, :length][None], d_layer.keys, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(static.kv.values[slot, :, :length][None], d_layer.values, atol=1e-5, rtol=1e-5)
    assert static.kv.length == length == static.cache.get_seq_length()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.tuples(st.sampled_from([1, 3, 7]), st.integers(0, 40), st.booleans()), min_size=1, max_size=10))
def test_folded_mask_written_incrementally_equals_a_fresh_one(tiny_models, steps):
    # Each round writes only what changed in its (n, W) buffer; the result must be the full mask.
    target, past = StaticTarget(tiny_models["qwen3"], max_length=128, cuda_graphs=False, width_step=16), 0
    low = torch.finfo(target.dtype).min
    for n, grow, restart in steps:
        past = 0 if restart else min(past + grow, 128 - n)
        block = torch.rand(n, n, generator=torch.Generator().manual_seed(n + past)) < 0.5
        mask = target.masks.verify(n, block, past)
        width = mask.shape[-1]
        want = torch.full((n, width), low)
        want[:, :past] = 0
        want[:, past : past + n] = torch.where(block, 0.0, low)
        assert torch.equal(mask.view(target.groups, n, width), want.expand(target.groups, n, width))


def test_a_prefill_as_long_as_a_verify_leaves_that_verify_buffer_alone(tiny_models):
    # A graph reads the (n, W) buffer it was recorded with: a prefill of n tokens must neither
    # rewrite nor drop it (it once did both, and a graphed verify then read freed memory).
    target = StaticTarget(tiny_models["qwen3"], max_length=128, cuda_graphs=False, width_step=16)
    prompt = torch.arange(4, 10)
    drafter = ReplayDrafter([prompt.tolist() + greedy_reference(tiny_models["qwen3"], prompt, 16)], 96, depth=4)
    engine = SpeculativeEngine(target, drafter, BestFirstTreeBuilder(4), DenseMaskCompiler(), GreedyVerifier())
    engine.generate(prompt, max_new_tokens=8)  # the first verify: 5 tokens after 6, a (5, 16) buffer
    buffers = dict(target.masks._buffers)
    contents = {key: buf.clone() for key, buf in buffers.items()}
    with torch.inference_mode():
        target.prefill(torch.arange(5, 10))  # 5 tokens: the verify size of budget 4
    assert (5, 16) in buffers and target.masks._buffers.keys() == buffers.keys()
    for key, buf in buffers.items():
        assert target.masks._buffers[key] is buf and torch.equal(buf, contents[key])


def test_a_model_over_several_devices_is_refused_with_the_way_out():
    """One K/V slab lives on one device: a model split over devices is refused, naming them and HFTarget."""
    from ddtree.testing import tiny_target

    model = tiny_target("qwen3")
    model.model.layers[1].to("meta")  # a second device, as a device map would place a layer
    with pytest.raises(ValueError, match=r"spans \['cpu', 'meta'\]\. Use HFTarget"):
        StaticTarget(model, max_length=64, cuda_graphs=False)


def test_sliding_window_layers_are_refused():
    """A static slab holds plain K/V rows of full-attention layers; a sliding-window model is refused."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=8, layer_types=["full_attention", "sliding_attention"],
                      sliding_window=8, use_sliding_window=True)
    with pytest.raises(NotImplementedError, match="full attention only"):
        StaticTarget(Qwen3ForCausalLM(cfg).eval(), max_length=64, cuda_graphs=False)
