"""``TreeMaskCompiler``: the verify's ids, positions and ancestor block, the tree's own."""

import pytest
import torch

from ddtree.masks import TreeMaskCompiler
from ddtree.masks.tree import additive_tree_mask
from ddtree.trees import BestFirstTreeBuilder
from ddtree.types import Draft, Tree


@pytest.mark.parametrize("budget", [0, 1, 7, 64])
def test_the_inputs_are_the_tree_s_own(budget):
    compiler = TreeMaskCompiler()
    for seed, past in enumerate([0, 5, 1000, 2**40]):
        q = torch.log_softmax(torch.randn(6, 30, generator=torch.Generator().manual_seed(seed)), -1)
        tree = BestFirstTreeBuilder(budget).build(Draft(q), root_token=seed + 3)
        got = compiler.compile(tree, past_length=past)
        n = tree.size
        assert got.input_ids.shape == got.position_ids.shape == (1, n) and got.attention_mask.shape == (n, n)
        assert got.parents is tree.parents and got.past_length == past
        assert got.input_ids.dtype == got.position_ids.dtype == torch.int64 and got.attention_mask.dtype == torch.bool
        assert torch.equal(got.input_ids[0], tree.tokens) and torch.equal(got.position_ids[0], tree.depths + past)
        assert torch.equal(got.attention_mask, tree.ancestors())


def test_the_root_alone_and_its_dense_expansion():
    got = TreeMaskCompiler().compile(Tree.root(9), past_length=3)
    assert got.input_ids.tolist() == [[9]] and got.position_ids.tolist() == [[3]]
    assert additive_tree_mask(got.attention_mask, 3, torch.float32).tolist() == [[[[0.0] * 4]]]
