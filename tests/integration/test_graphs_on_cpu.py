"""The graphed fast paths' logic on the CPU: every recording replayed as a graph would replay it.

Under ``fake_cuda_graphs(replay=True)`` a capture records each op with the very tensors it read and
wrote, and a replay runs them again over that memory; what the capture took from Python stays as it
was. Forcing ``cuda_graphs`` on after building each part for the CPU, the loop then decodes through
recorded graphs: the dense and hybrid targets' verifies (and the hybrid's graphed commit), the DFlash
drafter's block and the MTP chain, with dense masks and FlexAttention layouts, one target serving a
sequence of budgets. The tokens must be the target's greedy ones. A graph that reads a length baked
at capture, or a buffer nobody rewrites before a replay, fails here instead of only on a GPU; the
kernels' own numerics still need the GPU suite (``tests/gpu``).
"""

import pytest
import torch

from ddtree import SpeculativeEngine
from ddtree.drafters import DFlashDrafter, NullDrafter
from ddtree.drafters.mtp import MTPDrafter
from ddtree.masks import TreeMaskCompiler
from ddtree.models import MTPHead
from ddtree.models.hybrid_static import StaticHybridTarget
from ddtree.models.static_target import StaticTarget
from ddtree.testing import fake_cuda_graphs, greedy_reference, tiny_dflash, tiny_hybrid_target, tiny_target
from ddtree.trees import BestFirstTreeBuilder, ChainTreeBuilder
from ddtree.verifiers import GreedyVerifier

VOCAB, NEW, BLOCK = 96, 40, 8
LENGTHS = (5, 13, 29)  # 5 = the verify size of budget 4: prefill and verify share a shape
BUDGETS = ["ar", 4, "chain", 16, 2, "mtp", 4]


def test_a_replay_reads_the_memory_again_and_keeps_what_python_baked():
    with fake_cuda_graphs(replay=True):
        x, k = torch.ones(3), 2
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = x * k + torch.arange(3)
        x.fill_(5)
        k = 10
        graph.replay()
    assert y.tolist() == [10, 11, 12]  # x read again; k and the arange as at capture


def test_a_host_sync_inside_a_capture_is_refused():
    with fake_cuda_graphs(replay=True), pytest.raises(RuntimeError, match="host sync"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            torch.ones(2).sum().item()


def _engine(target, budget, dflash, attention: str) -> SpeculativeEngine:
    if budget == "ar":
        drafter, tree = NullDrafter(), ChainTreeBuilder()
    elif budget == "mtp":
        drafter, tree = MTPDrafter(MTPHead.for_target(target.model), target, steps=3, cuda_graphs=True,
                                   attention=attention), ChainTreeBuilder()
        drafter._chain.graphs = True  # built for the CPU, replayed through the fake graphs
    else:
        tree = ChainTreeBuilder() if budget == "chain" else BestFirstTreeBuilder(budget)
        drafter = DFlashDrafter(dflash, target, BLOCK, max_length=256, fuse=False, attention=attention)
        drafter.cuda_graphs = True
    return SpeculativeEngine(target, drafter, tree, TreeMaskCompiler(), GreedyVerifier())


def _check(model, target, attention: str, budgets) -> None:
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(6, VOCAB - 8, (n,), generator=gen) for n in LENGTHS]
    refs = [greedy_reference(model, p, NEW) for p in prompts]
    dflash = tiny_dflash(model, block_size=BLOCK)
    with fake_cuda_graphs(replay=True):
        target.cuda_graphs = True
        for budget in budgets:
            engine = _engine(target, budget, dflash, attention)
            for prompt, ref in zip(prompts, refs):
                assert engine.generate(prompt, max_new_tokens=NEW).tokens == ref, f"budget {budget}, prompt {len(prompt)}"


@pytest.mark.parametrize("attention", ["dense", "flex"])
def test_the_graphed_dense_target_and_drafter_are_greedy(family, attention):
    model = tiny_target(family, vocab_size=VOCAB)
    target = StaticTarget(model, max_length=256, cuda_graphs=False, fuse=False, fuse_projections=False,
                          attention=attention)
    _check(model, target, attention, [b for b in BUDGETS if b != "mtp"])
    assert target._graphs or target._flex_graphs


@pytest.mark.parametrize("attention", ["dense", "flex"])
def test_the_graphed_hybrid_target_and_drafters_are_greedy(attention):
    model = tiny_hybrid_target(vocab_size=VOCAB)
    target = StaticHybridTarget(model, max_length=256, cuda_graphs=False, fuse=False, fuse_projections=False,
                                attention=attention)
    _check(model, target, attention, BUDGETS)
