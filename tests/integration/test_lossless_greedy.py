"""T = 0: every strategy returns exactly the target's own greedy tokens.

Two drafters cover two risks: a random-weight DFlash drafter exercises the real module and its
cache (acceptance is low), and an oracle drafter with deliberate mistakes makes multi-token
acceptances and sibling hits happen, so the commit path is exercised for real.
"""

import pytest
import torch

from ddtree import SpeculativeEngine
from ddtree.drafters import DFlashDrafter, NullDrafter, OracleDrafter
from ddtree.masks import DenseMaskCompiler, TreeMaskCompiler
from ddtree.models import HFTarget, target_for
from ddtree.models.static_target import StaticTarget
from ddtree.models.hybrid_static import StaticHybridTarget
from ddtree.testing import greedy_reference, tiny_dflash
from ddtree.trees import BestFirstTreeBuilder, CalibratedTreeBuilder, ChainTreeBuilder
from ddtree.verifiers import GreedyVerifier

NEW_TOKENS = 64
PROMPT_LENGTHS = (1, 7, 23)
ORACLE_BUDGETS = (1, 2, 7, 16, 64, 256)


def _prompt(length: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 90, (length,), generator=torch.Generator().manual_seed(seed))


def _greedy_reference(model, prompt, new_tokens=NEW_TOKENS, eos=None):
    return greedy_reference(model, prompt, new_tokens, eos)


def _strategies(model, target):
    dflash = tiny_dflash(model)
    yield "ar", NullDrafter(), ChainTreeBuilder()
    yield "dflash-random", DFlashDrafter(dflash, target), ChainTreeBuilder()
    for budget in (16, 256):
        yield f"ddtree{budget}-random", DFlashDrafter(dflash, target), BestFirstTreeBuilder(budget)
    yield "dflash-oracle", OracleDrafter(model, depth=7, swap_prob=0.3, sharpness=10), ChainTreeBuilder()
    for budget in ORACLE_BUDGETS:
        yield f"ddtree{budget}-oracle", OracleDrafter(model, depth=7, swap_prob=0.3, sharpness=10), BestFirstTreeBuilder(budget)
    # The tensor beam builds the same optimal trees as the heap (method="auto" picks it above 512).
    yield "ddtree256-random-beam", DFlashDrafter(dflash, target), BestFirstTreeBuilder(256, method="beam")
    yield "ddtree64-oracle-beam", OracleDrafter(model, depth=7, swap_prob=0.3, sharpness=10), \
        BestFirstTreeBuilder(64, method="beam")
    # Per-depth tempered scores change which candidates are verified, never what is accepted.
    yield "calibrated16-random", DFlashDrafter(dflash, target), CalibratedTreeBuilder(16, [0.5, 0.8, 2.0])
    yield "calibrated64-oracle", OracleDrafter(model, depth=7, swap_prob=0.3, sharpness=10), \
        CalibratedTreeBuilder(64, [0.7, 1.5, 3.0])


# The tree block alone (TreeMaskCompiler, a bool [n, n]): the eager targets expand it, the static
# ones (StaticTarget on the CPU runs its graphed buffers eagerly) write it into their own masks.
@pytest.mark.parametrize("family", ["qwen3", "qwen3-static", "qwen35", "qwen35-static"])
def test_the_tree_block_mask_gives_the_same_greedy_tokens(tiny_models, family):
    model = tiny_models[family.removesuffix("-static")]
    prompt = _prompt(7, seed=7)
    expected = _greedy_reference(model, prompt)
    if family == "qwen35-static":
        target = StaticHybridTarget(model, max_length=512, cuda_graphs=False, width_step=16)
    elif family == "qwen3-static":
        target = StaticTarget(model, max_length=512, cuda_graphs=False, width_step=16)
    else:
        target = target_for(model)
    for name, drafter, tree in _strategies(model, target):
        engine = SpeculativeEngine(target, drafter, tree, TreeMaskCompiler(), GreedyVerifier())
        assert engine.generate(prompt, max_new_tokens=NEW_TOKENS).tokens == expected, f"{family} {name}"


@pytest.mark.parametrize("length", PROMPT_LENGTHS)
# qwen35: the Gated DeltaNet hybrid (HybridTarget); qwen35-static: the same over static slabs
# (StaticHybridTarget, the hybrid fast path without graphs).
@pytest.mark.parametrize("family", ["qwen3", "llama", "qwen35", "qwen35-static"])
def test_every_strategy_equals_target_greedy(tiny_models, family, length):
    model = tiny_models[family.removesuffix("-static")]
    prompt = _prompt(length, seed=length)
    expected = _greedy_reference(model, prompt)
    if family.endswith("-static"):
        target = StaticHybridTarget(model, max_length=512, cuda_graphs=False, width_step=16)
    else:
        target = target_for(model)  # HybridTarget for the hybrid, HFTarget otherwise
    taus = {}
    for name, drafter, tree in _strategies(model, target):
        engine = SpeculativeEngine(target, drafter, tree, DenseMaskCompiler(), GreedyVerifier())
        result = engine.generate(prompt, max_new_tokens=NEW_TOKENS)
        assert result.tokens == expected, f"{family} {name}: differs from greedy"
        assert sum(result.acceptance_lengths) + 1 == NEW_TOKENS  # the first token comes from prefill
        taus[name] = result.mean_acceptance
    assert taus["ar"] == 1.0
    for name, tau in taus.items():
        if name.endswith("oracle") and name not in ("ddtree1-oracle", "ddtree2-oracle"):
            assert tau > 1.5, f"{name}: tau {tau:.2f}, the test needs real multi-token acceptances"
    # A tree with siblings recovers from the oracle's swapped tokens where the chain cannot.
    assert taus["ddtree64-oracle"] > taus["dflash-oracle"]


def test_the_hybrid_fast_path_with_fused_projections_equals_target_greedy():
    """``StaticHybridTarget(fuse_projections=True)`` (each GDN layer's four input projections as one
    GEMM): every strategy gives the target's greedy tokens, on a model of its own (fusing re-points
    the model's weights)."""
    from ddtree.testing import tiny_hybrid_target

    model = tiny_hybrid_target()
    prompt = _prompt(7, seed=3)
    expected = _greedy_reference(model, prompt)
    target = StaticHybridTarget(model, max_length=512, cuda_graphs=False, width_step=16, fuse_projections=True)
    assert target.fused_projections == 2 * model.config.num_hidden_layers
    for name, drafter, tree in _strategies(model, target):
        engine = SpeculativeEngine(target, drafter, tree, DenseMaskCompiler(), GreedyVerifier())
        assert engine.generate(prompt, max_new_tokens=NEW_TOKENS).tokens == expected, name


def test_stop_token_ends_like_generate(tiny_models, family):
    model = tiny_models[family]
    prompt = _prompt(5, seed=11)
    free = _greedy_reference(model, prompt)
    eos = free[20]  # a token the greedy text really produces
    expected = _greedy_reference(model, prompt, eos=eos)
    assert expected[-1] == eos and len(expected) < NEW_TOKENS
    target = HFTarget(model)
    for drafter, tree in [(NullDrafter(), ChainTreeBuilder()), (OracleDrafter(model, depth=7), BestFirstTreeBuilder(32))]:
        engine = SpeculativeEngine(target, drafter, tree, DenseMaskCompiler(), GreedyVerifier(), stop_token_ids=[eos])
        result = engine.generate(prompt, max_new_tokens=NEW_TOKENS)
        assert result.tokens == expected and result.stopped_by == "stop_token"


@pytest.mark.parametrize("max_new", [1, 2, 9])
def test_max_new_tokens_is_exact(tiny_models, max_new):
    model = tiny_models["qwen3"]
    prompt = _prompt(6, seed=3)
    target = HFTarget(model)
    engine = SpeculativeEngine(target, OracleDrafter(model, depth=7), BestFirstTreeBuilder(16), DenseMaskCompiler(), GreedyVerifier())
    assert engine.generate(prompt, max_new_tokens=max_new).tokens == _greedy_reference(model, prompt, max_new)


def test_engines_sharing_a_target_keep_their_own_taps(tiny_models):
    """A DFlash engine built before an MTP-less AR engine still gets its taps when it runs."""
    model = tiny_models["qwen3"]
    prompt = _prompt(6, seed=4)
    target = HFTarget(model)
    dflash = SpeculativeEngine(target, DFlashDrafter(tiny_dflash(model), target), BestFirstTreeBuilder(8),
                               DenseMaskCompiler(), GreedyVerifier())
    ar = SpeculativeEngine(target, NullDrafter(), ChainTreeBuilder(), DenseMaskCompiler(), GreedyVerifier())
    expected = _greedy_reference(model, prompt, 16)
    assert ar.generate(prompt, max_new_tokens=16).tokens == expected
    assert dflash.generate(prompt, max_new_tokens=16).tokens == expected


@pytest.mark.parametrize("max_new", [1, 2, 9, 30])
@pytest.mark.parametrize("family", ["qwen3", "qwen35"])
def test_reference_accounting_returns_the_same_tokens(tiny_models, family, max_new):
    """Full drafts to the end and rounds until past max_new_tokens: the response is still the
    first max_new_tokens greedy tokens."""
    from ddtree.metrics import ReferenceAccounting

    model = tiny_models[family]
    prompt = _prompt(7, seed=max_new)
    target = target_for(model)
    for drafter, tree in [(DFlashDrafter(tiny_dflash(model), target), BestFirstTreeBuilder(16)),
                          (OracleDrafter(model, depth=7, swap_prob=0.3, sharpness=10), BestFirstTreeBuilder(64))]:
        engine = SpeculativeEngine(target, drafter, tree, DenseMaskCompiler(), GreedyVerifier())
        result = engine.generate(prompt, max_new_tokens=max_new, accounting=ReferenceAccounting())
        assert result.tokens == _greedy_reference(model, prompt, max_new)
        assert 1 + sum(result.acceptance_lengths) > max_new  # its rounds run until they pass max_new_tokens
