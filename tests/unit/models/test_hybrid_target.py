"""The hybrid (Gated DeltaNet + attention) target: tree logits, an untouched GDN cache, and an
exact commit, against sequential forwards of the same transformers model (fp32, CPU)."""

from __future__ import annotations

import inspect

import pytest
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicSlidingWindowLayer

import ddtree.models.hybrid as hybrid
from ddtree.masks import DenseMaskCompiler
from ddtree.models import HFTarget, HybridTarget
from ddtree.models import target_for
from ddtree.testing import conditional_generation_twin, tiny_hybrid_target, tiny_target
from ddtree.trees import BestFirstTreeBuilder, ChainTreeBuilder
from ddtree.types import Draft

PROMPT = torch.randint(0, 90, (9,), generator=torch.Generator().manual_seed(4))
K = 4  # linear_conv_kernel_dim of the tiny model




@pytest.fixture(scope="module")
def model():
    return tiny_hybrid_target()


@pytest.fixture(scope="module")
def nested_model(model):
    """The same text weights inside a Qwen3_5ForConditionalGeneration (model.model.language_model)."""
    return conditional_generation_twin(model)


def _tree(vocab, seed, budget=20, depth=5, chain=False):
    g = torch.Generator().manual_seed(seed)
    draft = Draft(torch.log_softmax(2 * torch.randn(depth, vocab, generator=g), -1))
    builder = ChainTreeBuilder() if chain else BestFirstTreeBuilder(budget)
    return builder.build(draft, root_token=int(torch.randint(vocab, (1,), generator=g)))


def _verify(target, tree):
    return target.forward_tree(DenseMaskCompiler().compile(tree, target.past_length))


def _gdn_layers(model):
    return [i for i, kind in enumerate(model.config.get_text_config().layer_types) if kind == "linear_attention"]


def _with_cache(model, ids, cache):
    # The cache argument is ``past_key_values`` in transformers 5.17 and ``cache`` in 5.24.
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    with torch.no_grad():
        return model(ids, use_cache=True, **{name: cache}).logits


def _sequential_cache(model, tokens):
    """Prefill the prompt, then feed the accepted tokens one at a time (the decode path)."""
    cache = DynamicCache(config=model.config)
    _with_cache(model, PROMPT[None], cache)
    for token in tokens:
        _with_cache(model, torch.tensor([[token]]), cache)
    return cache


@pytest.mark.parametrize(
    "kind, seed", [("causal_lm", 0), ("causal_lm", 1), ("causal_lm", 2), ("conditional_generation", 0)]
)
def test_tree_logits_and_taps_equal_each_root_path_run_sequentially(model, nested_model, kind, seed):
    lm = model if kind == "causal_lm" else nested_model
    target = HybridTarget(lm)
    target.set_taps([0, 1, 2, -1])  # GDN, attention, GDN after attention, the final norm
    target.prefill(PROMPT)
    tree = _tree(target.vocab_size, seed, chain=seed == 2)  # seed 2: a chain (MTP/DFlash)
    out = _verify(target, tree)
    for node in range(tree.size):
        ids = torch.tensor([PROMPT.tolist() + tree.tokens[tree.path_to(node)].tolist()])
        with torch.no_grad():
            ref = lm(ids, output_hidden_states=True)
        hs = ref.hidden_states
        taps = torch.cat([hs[1][0, -1], hs[2][0, -1], hs[3][0, -1], hs[-1][0, -1]])  # hs[-1]: after the norm
        torch.testing.assert_close(out.logits[node], ref.logits[0, -1], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(out.taps[node], taps, atol=1e-4, rtol=1e-4)


def test_forward_tree_leaves_the_gdn_cache_untouched(model):
    target = HybridTarget(model)
    target.prefill(PROMPT)
    layers = [target.cache.layers[i] for i in _gdn_layers(model)]
    before = [(l.conv_states[0], l.conv_states[0].clone(), l.recurrent_states[0].clone()) for l in layers]
    tree = _tree(target.vocab_size, seed=3, budget=30)
    _verify(target, tree)
    for layer, (conv_obj, conv, recurrent) in zip(layers, before):
        assert layer.conv_states[0] is conv_obj  # not even reassigned
        assert torch.equal(layer.conv_states[0], conv) and torch.equal(layer.recurrent_states[0], recurrent)
    # The attention layers hold the prefix plus every node until the commit, as in HFTarget.
    assert all(l.keys.shape[-2] == PROMPT.numel() + tree.size for l in target._kv_layers())
    assert all("forward" not in m.__dict__ for m in target.gdn_modules.values())  # verify mode switched off


def _paths(tree, seed):
    """Root only, the deepest node, the last node, and random nodes' root paths."""
    g = torch.Generator().manual_seed(seed)
    nodes = {0, int(tree.depths.argmax()), tree.size - 1, *torch.randint(tree.size, (3,), generator=g).tolist()}
    return [tree.path_to(node) for node in sorted(nodes)]


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_commit_equals_the_cache_of_feeding_the_path_sequentially(model, seed):
    """Tolerance 1e-5: the closed-form GDN commit vs transformers' own one-token decode steps."""
    tree = _tree(model.config.vocab_size, seed, budget=24, depth=6)
    for path in _paths(tree, seed):
        target = HybridTarget(model)
        target.prefill(PROMPT)
        _verify(target, tree)
        target.commit(path)
        assert target.past_length == PROMPT.numel() + len(path)
        ref = _sequential_cache(model, tree.tokens[path].tolist())
        for i, (got, want) in enumerate(zip(target.cache.layers, ref.layers)):
            if i in target.gdn_modules:
                torch.testing.assert_close(got.recurrent_states[0], want.recurrent_states[0], atol=1e-5, rtol=1e-5)
                window, ref_window = got.conv_states[0][..., -K:], want.conv_states[0][..., -K:]
                torch.testing.assert_close(window, ref_window, atol=1e-5, rtol=0)
                assert got.recurrent_states[0].dtype == torch.float32 and got.has_previous_state[0]
            else:
                torch.testing.assert_close(got.keys, want.keys, atol=1e-5, rtol=1e-5)
                torch.testing.assert_close(got.values, want.values, atol=1e-5, rtol=1e-5)
        # The committed cache decodes on exactly like the sequential one (the in-place decode path).
        nxt = torch.tensor([[7]])
        got, want = _with_cache(model, nxt, target.cache), _with_cache(model, nxt, ref)
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_nested_text_model_commit_is_exact(model, nested_model):
    target = HybridTarget(nested_model)
    assert target.decoder is nested_model.model.language_model
    target.prefill(PROMPT)
    tree = _tree(target.vocab_size, seed=5)
    _verify(target, tree)
    path = tree.path_to(int(tree.depths.argmax()))
    target.commit(path)
    ref = _sequential_cache(model, tree.tokens[path].tolist())
    for i in target.gdn_modules:
        torch.testing.assert_close(target.cache.layers[i].recurrent_states[0], ref.layers[i].recurrent_states[0],
                                   atol=1e-5, rtol=1e-5)


def test_several_rounds_match_a_plain_forward(model):
    """Three verify/commit rounds in a row: the last tree's logits still equal a plain forward."""
    target = HybridTarget(model)
    target.prefill(PROMPT)
    committed = PROMPT.tolist()
    for seed in range(3):
        tree = _tree(target.vocab_size, seed + 10)
        out = _verify(target, tree)
        path = tree.path_to(tree.size - 1)
        with torch.no_grad():
            ref = model(torch.tensor([committed + tree.tokens[path].tolist()])).logits[0, -1]
        torch.testing.assert_close(out.logits[tree.size - 1], ref, atol=1e-4, rtol=1e-4)
        target.commit(path)
        committed += tree.tokens[path].tolist()


# ---------------------------------------------------------------- clear errors


def test_forward_tree_twice_without_commit_is_refused(model):
    target = HybridTarget(model)
    target.prefill(PROMPT)
    tree = _tree(target.vocab_size, 0)
    with pytest.raises(RuntimeError, match="before prefill"):
        HybridTarget(model).forward_tree(DenseMaskCompiler().compile(tree, 0))
    inputs = DenseMaskCompiler().compile(tree, target.past_length)
    target.forward_tree(inputs)
    with pytest.raises(RuntimeError, match="twice without commit"):
        target.forward_tree(inputs)
    with pytest.raises(ValueError, match="not a root path"):
        target.commit([0, 2] if tree.parents[2] != 0 else [1])
    target.commit([0])
    with pytest.raises(RuntimeError, match="commit without a pending forward_tree"):
        target.commit([0])
    with pytest.raises(ValueError, match="laid out after"):
        target.forward_tree(inputs)


def test_unhandled_cache_layer_is_refused(model):
    target = HybridTarget(model)
    target.prefill(PROMPT)
    target.cache.layers[1] = DynamicSlidingWindowLayer(sliding_window=8)
    with pytest.raises(NotImplementedError, match="cache layer 1 .* DynamicSlidingWindowLayer"):
        _verify(target, _tree(target.vocab_size, 0))


def test_a_failing_tree_forward_restores_everything(model, monkeypatch):
    target = HybridTarget(model)
    target.prefill(PROMPT)
    tree = _tree(target.vocab_size, 1)
    calls = []
    real = hybrid.gdn_tree_forward

    def flaky(*args):
        calls.append(1)
        if len(calls) == 2:  # the second GDN layer, after an attention layer appended its rows
            raise FloatingPointError("boom")
        return real(*args)

    monkeypatch.setattr(hybrid, "gdn_tree_forward", flaky)
    with pytest.raises(FloatingPointError):
        _verify(target, tree)
    monkeypatch.setattr(hybrid, "gdn_tree_forward", real)
    assert all("forward" not in m.__dict__ for m in target.gdn_modules.values())
    assert all(l.keys.shape[-2] == PROMPT.numel() for l in target._kv_layers())
    out = _verify(target, tree)  # and the target is usable again
    with torch.no_grad():
        ref = model(torch.cat([PROMPT, tree.tokens[:1]])[None]).logits[0, -1]
    torch.testing.assert_close(out.logits[0], ref, atol=1e-4, rtol=1e-4)


def test_target_for_and_the_refusals(model):
    plain = tiny_target("qwen3")
    assert type(target_for(model)) is HybridTarget and type(target_for(plain)) is HFTarget
    with pytest.raises(NotImplementedError, match="HybridTarget"):
        HFTarget(model).prefill(PROMPT)
    with pytest.raises(ValueError, match="no Gated DeltaNet layers"):
        HybridTarget(plain)


def test_a_gdn_layer_that_bypasses_verify_mode_is_caught(model, monkeypatch):
    """If the model ever routed around linear_attn.forward, its real forward would commit the tree."""
    import contextlib

    target = HybridTarget(model)
    target.prefill(PROMPT)
    monkeypatch.setattr(hybrid, "gdn_verify_mode", lambda *args: contextlib.nullcontext())
    with pytest.raises(RuntimeError, match="did not run in verify mode"):
        _verify(target, _tree(target.vocab_size, 0))
    with pytest.raises(RuntimeError, match="before prefill"):  # the suspect cache is gone
        _verify(target, _tree(target.vocab_size, 0))
