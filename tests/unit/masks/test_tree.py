"""``TreeMaskCompiler``: the verify's ids, positions and ancestor block, moved in one packed copy."""

import pytest
import torch

from ddtree.masks import TreeMaskCompiler
from ddtree.masks.tree import additive_tree_mask, packed_move
from ddtree.trees import BestFirstTreeBuilder
from ddtree.types import Draft, Tree


@pytest.mark.parametrize("budget", [0, 1, 7, 64])
def test_the_inputs_are_the_tree_s_own_and_the_packed_copy_gives_them_too(budget):
    """On the CPU the compiler hands the tree's tensors on; on CUDA ``packed_move`` moves them in one
    copy (run here with an unpinned buffer: the same packing and views)."""
    compiler = TreeMaskCompiler()
    for seed, past in enumerate([0, 5, 1000, 2**40]):
        q = torch.log_softmax(torch.randn(6, 30, generator=torch.Generator().manual_seed(seed)), -1)
        tree = BestFirstTreeBuilder(budget).build(Draft(q), root_token=seed + 3)
        got = compiler.compile(tree, past_length=past)
        packed = packed_move(tree, past, torch.device("cpu"), pin=False)
        n = tree.size
        assert got.input_ids.shape == got.position_ids.shape == (1, n) and got.attention_mask.shape == (n, n)
        assert got.parents is tree.parents and got.past_length == past
        for ids, positions, visible in [(got.input_ids[0], got.position_ids[0], got.attention_mask), packed]:
            assert ids.dtype == positions.dtype == torch.int64 and visible.dtype == torch.bool
            assert torch.equal(ids, tree.tokens) and torch.equal(positions, tree.depths + past)
            assert torch.equal(visible, tree.ancestors())


def test_the_root_alone_and_its_dense_expansion():
    got = TreeMaskCompiler().compile(Tree.root(9), past_length=3)
    assert got.input_ids.tolist() == [[9]] and got.position_ids.tolist() == [[3]]
    assert additive_tree_mask(got.attention_mask, 3, torch.float32).tolist() == [[[[0.0] * 4]]]
