"""Every CUDA-graph recording keeps the buffers its graph uses, checked on the CPU.

A graph replays raw addresses: a tensor allocated before the capture and used inside it must stay
referenced as long as the graph lives, or the allocator hands its memory to other tensors and each
replay reads and writes theirs. On a GPU that shows only as wrong tokens or an out-of-range index
(a graphed ``StaticTarget`` once lost its row offsets this way). ``fake_cuda_graphs`` runs the
recordings eagerly on the CPU and lists the memory they used, did not allocate, and no longer hold;
each part with its dense masks and with FlexAttention layouts.
"""

import pytest
import torch

from ddtree.drafters import DFlashDrafter
from ddtree.drafters.mtp_static import StaticChain
from ddtree.masks import TreeMaskCompiler
from ddtree.models import MTPHead
from ddtree.models.hybrid_static import StaticHybridTarget
from ddtree.models.static_target import StaticTarget
from ddtree.testing import fake_cuda_graphs, tiny_dflash, tiny_hybrid_target, tiny_target
from ddtree.types import Tree

PROMPT = torch.arange(3, 20)
TREE = Tree(torch.tensor([5, 6, 7, 8]), torch.tensor([-1, 0, 0, 1]), torch.tensor([0, 1, 1, 2]),
            torch.zeros(4))


def _record(store: bool) -> tuple:
    offsets = torch.arange(4)  # allocated before the capture
    kept = offsets if store else None
    with torch.cuda.graph(torch.cuda.CUDAGraph()):
        out = offsets * 2
    return out, kept


def test_the_audit_finds_a_buffer_the_recording_let_go():
    with fake_cuda_graphs() as audit:
        held = _record(store=False)
    assert len(audit.freed()) == 1
    with fake_cuda_graphs() as audit:
        held = _record(store=True)
    assert audit.freed() == {}
    del held


def _graphed(part):
    part.cuda_graphs = True  # built for the CPU, then recorded through the fake graphs
    return part


@pytest.mark.parametrize("attention", ["dense", "flex"])
@torch.inference_mode()
def test_static_target_graphs_keep_their_buffers(family, attention):
    target = StaticTarget(tiny_target(family), max_length=256, cuda_graphs=False, fuse=False, fuse_projections=False,
                          attention=attention)
    target.prefill(PROMPT)
    with fake_cuda_graphs() as audit:
        _graphed(target)
        for tree in (Tree.root(5), TREE):  # the AR step and a tree: a graph each
            target.forward_tree(TreeMaskCompiler().compile(tree, target.past_length))
    assert audit.used and audit.freed() == {}


@pytest.mark.parametrize("attention", ["dense", "flex"])
@torch.inference_mode()
def test_static_hybrid_target_graphs_keep_their_buffers(attention):
    target = StaticHybridTarget(tiny_hybrid_target(), max_length=256, cuda_graphs=False, fuse=False,
                                fuse_projections=False, attention=attention)
    target.prefill(PROMPT)
    with fake_cuda_graphs() as audit:
        _graphed(target)
        target.forward_tree(TreeMaskCompiler().compile(TREE, target.past_length))
        target.commit([0, 2])  # the commit is graphed too
    assert audit.used and audit.freed() == {}


@pytest.mark.parametrize("attention", ["dense", "flex"])
@torch.inference_mode()
def test_dflash_drafter_graph_keeps_its_buffers(attention):
    model = tiny_target("qwen3")
    target = StaticTarget(model, max_length=256, cuda_graphs=False, fuse=False, fuse_projections=False)
    drafter = DFlashDrafter(tiny_dflash(model), target, max_length=128, fuse=False, attention=attention)
    target.set_taps(drafter.hidden_layers)
    drafter.reset(target.prefill(PROMPT))
    with fake_cuda_graphs() as audit:
        _graphed(drafter).draft(7)
    assert audit.used and audit.freed() == {}


@pytest.mark.parametrize("attention", ["dense", "flex"])
@torch.inference_mode()
def test_mtp_chain_graph_keeps_its_buffers(attention):
    model = tiny_hybrid_target()
    head = MTPHead.for_target(model)
    target = StaticHybridTarget(model, max_length=256, cuda_graphs=False, fuse=False, fuse_projections=False)
    chain = StaticChain(head, target, steps=2, max_length=64, graphs=False, attention=attention)
    hidden = torch.randn(6, head.hidden_size)
    chain.absorb(hidden[:5], list(range(3, 8)), 0)
    with fake_cuda_graphs() as audit:
        chain.graphs = True
        chain.draft(hidden[5:], [9], length=5)
    assert audit.used and audit.freed() == {}
