"""The hybrid target over static slabs (fp32, CPU, no graphs): the same logits as ``HybridTarget``
round after round, and after each commit slabs holding exactly ``HybridTarget``'s cache."""

from __future__ import annotations

import pytest
import torch

from ddtree import SpeculativeEngine
from ddtree.drafters import OracleDrafter
from ddtree.masks import DenseMaskCompiler
from ddtree.models import HybridTarget, target_for
from ddtree.models.gdn_tree_layer import read_gdn_state
from ddtree.models.hybrid_static import StaticHybridTarget
from ddtree.testing import conditional_generation_twin, greedy_reference, tiny_hybrid_target, tree_logits
from ddtree.trees import BestFirstTreeBuilder, ChainTreeBuilder
from ddtree.types import Draft
from ddtree.verifiers import GreedyVerifier

PROMPT = torch.randint(0, 90, (9,), generator=torch.Generator().manual_seed(4))


@pytest.fixture(scope="module")
def model():
    return tiny_hybrid_target()


def _tree(vocab: int, seed: int, budget: int):
    g = torch.Generator().manual_seed(seed)
    draft = Draft(torch.log_softmax(2 * torch.randn(5, vocab, generator=g), -1))
    builder = ChainTreeBuilder() if budget == 0 else BestFirstTreeBuilder(budget)
    return builder.build(draft, root_token=int(torch.randint(vocab, (1,), generator=g)))


def _random_root_path(parents: list[int], seed: int) -> list[int]:
    node = int(torch.randint(len(parents), (1,), generator=torch.Generator().manual_seed(seed)))
    path = [node]
    while parents[path[-1]] >= 0:
        path.append(parents[path[-1]])
    return path[::-1]


def _assert_same_state(static: StaticHybridTarget, eager: HybridTarget) -> None:
    length = eager.past_length
    assert static.past_length == length
    for slot, layer in enumerate(static.attention_layers):
        torch.testing.assert_close(static.keys[slot, :, :length], eager.cache.layers[layer].keys[0], atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(static.values[slot, :, :length], eager.cache.layers[layer].values[0], atol=1e-6,
                                   rtol=1e-6)
    for slot, layer in enumerate(static.gdn_layers):
        state = read_gdn_state(eager.cache, layer, static.kernel_size)
        torch.testing.assert_close(static.conv[slot], state.conv_window, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(static.recurrent[slot], state.recurrent_state, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("budgets", [[20, 0, 3, 20, 1], [7, 7, 60, 0]])
@pytest.mark.parametrize("attention", ["dense", "flex"])  # flex: FlexAttention's eager reference on the CPU
@torch.no_grad()
def test_logits_taps_and_state_follow_hybrid_target_round_by_round(model, budgets, attention):
    static = StaticHybridTarget(model, max_length=128, cuda_graphs=False, width_step=16, attention=attention)
    eager = HybridTarget(model)
    for target in (static, eager):
        target.set_taps([0, 1, -1])
        target.prefill(PROMPT)
    _assert_same_state(static, eager)
    compiler = DenseMaskCompiler()
    for round_, budget in enumerate(budgets):
        tree = _tree(96, seed=round_, budget=budget)
        outs = [t.forward_tree(compiler.compile(tree, t.past_length)) for t in (static, eager)]
        torch.testing.assert_close(outs[0].logits, outs[1].logits, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(outs[0].taps, outs[1].taps, atol=1e-5, rtol=1e-5)
        path = _random_root_path(tree.parents.tolist(), seed=round_)
        for target in (static, eager):
            target.commit(path)
        _assert_same_state(static, eager)


@torch.no_grad()
def test_the_gdn_layers_read_the_layout_s_visibility_not_a_rebuilt_ancestor_matrix(model, monkeypatch):
    """A verify's GDN layers take the tree's ancestors from the layout's ``[n, n]`` block, which is that
    matrix; the pointer doubling from the parents (``ancestor_matrix``) is not run again, and the logits
    stay the eager ``HybridTarget``'s."""
    from ddtree.models import gdn_tree

    compiler = DenseMaskCompiler()
    tree = _tree(96, seed=3, budget=20)
    eager = HybridTarget(model)
    eager.prefill(PROMPT)
    want = eager.forward_tree(compiler.compile(tree, eager.past_length)).logits
    monkeypatch.setattr(gdn_tree, "ancestor_matrix", lambda parents: pytest.fail("ancestor_matrix rebuilt"))
    for attention in ("dense", "flex"):
        static = StaticHybridTarget(model, max_length=128, cuda_graphs=False, width_step=16, attention=attention)
        static.prefill(PROMPT)
        got = static.forward_tree(compiler.compile(tree, static.past_length)).logits
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_flex_attention_decodes_the_greedy_text(model):
    # attention="flex" on the CPU runs FlexAttention's eager reference through the same layouts.
    target = StaticHybridTarget(model, max_length=160, cuda_graphs=False, attention="flex")
    prompt = torch.randint(0, 90, (21,), generator=torch.Generator().manual_seed(8))
    expected = greedy_reference(model, prompt, 40)
    for budget in (0, 16, 3):
        tree = ChainTreeBuilder() if budget == 0 else BestFirstTreeBuilder(budget)
        engine = SpeculativeEngine(target, OracleDrafter(model, depth=7, swap_prob=0.3, sharpness=10), tree,
                                   DenseMaskCompiler(), GreedyVerifier())
        assert engine.generate(prompt, max_new_tokens=40).tokens == expected, budget
    assert sorted(n for n, _ in target._graphs) == [] and target._layouts  # eager: layouts, no graphs


def test_conditional_generation_checkpoints_are_served(model):
    # Real Qwen3.5/3.6 checkpoints load as Qwen3_5ForConditionalGeneration (text model nested).
    static, eager = StaticHybridTarget(conditional_generation_twin(model), max_length=64, cuda_graphs=False), \
        HybridTarget(model)
    torch.testing.assert_close(*tree_logits((static, eager), PROMPT, _tree(96, seed=5, budget=12)),
                               atol=1e-5, rtol=1e-5)


def test_dispatch_and_refusals(model):
    assert type(target_for(model, fast=True)) is StaticHybridTarget
    assert type(target_for(model)) is HybridTarget  # auto: no CUDA device here
    target = StaticHybridTarget(model, max_length=16, cuda_graphs=False)
    tree = _tree(96, seed=0, budget=4)
    with pytest.raises(RuntimeError, match="before prefill"):
        target.forward_tree(DenseMaskCompiler().compile(tree, 0))
    with pytest.raises(ValueError, match="raise max_length"):
        target.prefill(torch.arange(17))
    target.prefill(PROMPT)
    with pytest.raises(RuntimeError, match="nothing to commit"):
        target.commit([0])
    with pytest.raises(ValueError, match="exceeds the static cache"):
        target.forward_tree(DenseMaskCompiler().compile(_tree(96, seed=0, budget=12), target.past_length))
    target.forward_tree(DenseMaskCompiler().compile(tree, target.past_length))
    with pytest.raises(ValueError, match="not a root path"):
        target.commit([0, 3, 1])
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="one CUDA device"):
            StaticHybridTarget(model, cuda_graphs=True)
    with pytest.raises(ValueError, match="attention='sparse'"):
        StaticHybridTarget(model, attention="sparse")
    with pytest.raises(ValueError, match="Triton tree delta rule needs fuse=True"):  # unfused, or off a CUDA GPU
        StaticHybridTarget(model, cuda_graphs=False, fuse=False, triton=True)
    assert not StaticHybridTarget(model, cuda_graphs=False).triton  # the CPU keeps the torch math


def test_both_static_targets_default_to_auto_attention(model):
    """The loop's targets (``target_for``) read long contexts the way ``experiments/speed.py`` times them:
    dense masks below ``flex_threshold`` live rows and on the CPU, the FlexAttention layouts (split
    attention where it serves) from there on a GPU, for the hybrid target as for the dense one."""
    from ddtree.models.static_target import StaticTarget
    from ddtree.testing import tiny_target

    hybrid = target_for(model, fast=True)
    dense = target_for(tiny_target("qwen3"), fast=True)
    assert isinstance(dense, StaticTarget)
    for target in (hybrid, dense):
        assert target.attention == "auto" and target.flex_threshold == 4096
        assert not target._uses_flex(10**6)  # on the CPU, dense at any length
