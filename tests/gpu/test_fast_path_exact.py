"""The fast path on a GPU, in fp32: every strategy, budget order and fast-path combination gives
the target's own greedy tokens (run with ``pytest -m gpu`` on a machine with CUDA).

One ``StaticTarget`` serves every engine of a sequence, as in the benchmarks and notebooks.
The prompts include one as long as a verify (prefill and verify share an (n, W) shape) and one
that crosses a mask-width bucket during generation; the budget sequences revisit sizes after
others. ``ReplayDrafter`` drafts the known greedy text with swaps, so paths are long and often
not a prefix of the tree (the commit moves rows), at no drafting cost.
"""

import copy

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddtree.models.static_target import StaticTarget
from ddtree.testing import check_budget_sequence, fp32_cuda_pair

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

VOCAB, NEW, BLOCK = 128, 96, 8
LENGTHS = (5, 13, 29, 200)  # 5 = the verify size of budget 4; 200 + 96 crosses the 256-row bucket
SEQUENCES = {
    "sizes-revisited": [4, 2, 3, 5, 6, 7, 8, 4],
    "chain-between": [4, "chain", 4, 16, 4],
    "all-strategies": ["ar", "chain", 1, 4, 16, 64, 4],
}


@pytest.fixture(scope="module")
def setup():
    return fp32_cuda_pair(LENGTHS, NEW, BLOCK, VOCAB, seed=1)


def _check_sequence(setup, target, drafter_kind: str, budgets) -> None:
    model, prompts, refs, dflash = setup
    check_budget_sequence(target, budgets, drafter_kind, prompts, refs, dflash, NEW, VOCAB, BLOCK)


@pytest.mark.parametrize("sequence", sorted(SEQUENCES))
@pytest.mark.parametrize("drafter_kind", ["replay", "dflash-graph", "dflash-eager"])
@pytest.mark.parametrize("graphs,fuse", [(True, False), (True, True), (False, False)], ids=["graphs", "graphs-fused", "eager"])
def test_budget_sequences_on_one_target_are_greedy(setup, sequence, drafter_kind, graphs, fuse):
    target = StaticTarget(setup[0], max_length=512, cuda_graphs=graphs, fuse=fuse, fuse_projections=False)
    _check_sequence(setup, target, drafter_kind, SEQUENCES[sequence])


@pytest.mark.parametrize("sequence", sorted(SEQUENCES))
@pytest.mark.parametrize("drafter_kind", ["replay", "dflash-graph"])
def test_fused_projections_on_the_graphed_target_are_greedy(setup, sequence, drafter_kind):
    """``fuse_projections=True`` (MLP gate and up, attention q, k and v as one GEMM each) on the default
    fast path, on a copy of the model: fusing turns its weights into views of one tensor a group."""
    model = copy.deepcopy(setup[0])
    target = StaticTarget(model, max_length=512, fuse_projections=True)
    assert target.fused_projections == 2 * model.config.num_hidden_layers
    _check_sequence((model, *setup[1:]), target, drafter_kind, SEQUENCES[sequence])


@pytest.mark.parametrize("drafter_kind", ["replay", "dflash-graph"])
def test_the_tree_block_mask_on_the_graphed_target_is_greedy(setup, drafter_kind):
    """``mask=tree``: the loop hands on only the bool ``[n, n]`` tree block (``TreeMaskCompiler``),
    which the graphed target writes into its own mask."""
    model, prompts, refs, dflash = setup
    check_budget_sequence(StaticTarget(model, max_length=512, fuse_projections=False), SEQUENCES["all-strategies"],
                          drafter_kind, prompts, refs, dflash, NEW, VOCAB, BLOCK, mask="tree")


def test_llama_sizes_revisited_fused(setup):
    llama = fp32_cuda_pair(LENGTHS, NEW, BLOCK, VOCAB, seed=2, family="llama")
    _check_sequence(llama, StaticTarget(llama[0], max_length=512), "replay", [4, 2, 5, 4, "ar", 4])


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.sampled_from(["ar", "chain", 1, 2, 4, 7, 16, 64]), min_size=2, max_size=6))
def test_any_budget_order_is_greedy(setup, steps):
    model = copy.deepcopy(setup[0])  # the default fast path (graphs, fused kernels, fused projections) on a copy
    target = StaticTarget(model, max_length=512)
    assert target.fused_projections == 2 * model.config.num_hidden_layers
    _check_sequence((model, *setup[1:]), target, "replay", steps)
