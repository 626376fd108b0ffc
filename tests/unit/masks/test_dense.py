"""Literal masks for hand-drawn trees, and incremental writes that equal fresh masks."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ddtree.masks import DenseMaskCompiler, TreeMaskCompiler, additive_tree_mask
from ddtree.types import Tree

NEG = torch.finfo(torch.float32).min


def _tree(tokens, parents):
    depths = [0]
    for p in parents[1:]:
        depths.append(depths[p] + 1)
    t = lambda x: torch.tensor(x, dtype=torch.long)  # noqa: E731
    return Tree(t(tokens), t(parents), t(depths), torch.zeros(len(tokens)))


def test_branching_tree_mask_and_positions():
    #      0
    #     / \
    #    1   2
    #   / \
    #  3   4
    tree = _tree([10, 11, 12, 13, 14], [-1, 0, 0, 1, 1])
    out = DenseMaskCompiler().compile(tree, past_length=2)
    visible = torch.tensor(
        [
            [1, 1, 1, 0, 0, 0, 0],
            [1, 1, 1, 1, 0, 0, 0],
            [1, 1, 1, 0, 1, 0, 0],
            [1, 1, 1, 1, 0, 1, 0],
            [1, 1, 1, 1, 0, 0, 1],
        ],
        dtype=torch.bool,
    )
    expected = torch.where(visible, 0.0, NEG)
    assert out.attention_mask.shape == (1, 1, 5, 7)
    assert torch.equal(out.attention_mask[0, 0], expected)
    assert out.position_ids.tolist() == [[2, 3, 3, 4, 4]]
    assert out.input_ids.tolist() == [[10, 11, 12, 13, 14]]


def test_chain_mask_is_causal():
    tree = _tree([1, 2, 3], [-1, 0, 1])
    out = DenseMaskCompiler().compile(tree, past_length=0)
    assert torch.equal(out.attention_mask[0, 0] == 0, torch.tril(torch.ones(3, 3, dtype=torch.bool)))


def test_buffer_is_reused_and_rows_are_refreshed():
    comp = DenseMaskCompiler()
    big = comp.compile(_tree([1, 2, 3, 4], [-1, 0, 0, 0]), past_length=5).attention_mask
    small = comp.compile(_tree([1, 2], [-1, 0]), past_length=3).attention_mask
    assert small.untyped_storage().data_ptr() == big.untyped_storage().data_ptr()
    assert torch.equal(small[0, 0], torch.tensor([[0, 0, 0, 0, NEG], [0, 0, 0, 0, 0]]))


def test_dtype_and_device_binding():
    comp = DenseMaskCompiler().to("cpu", torch.bfloat16)
    mask = comp.compile(_tree([1, 2], [-1, 0]), past_length=1).attention_mask
    assert mask.dtype == torch.bfloat16 and mask[0, 0, 0, 2] == torch.finfo(torch.bfloat16).min


@settings(max_examples=40, deadline=None)
@given(steps=st.lists(st.tuples(st.integers(1, 9), st.integers(0, 6), st.booleans()), min_size=1, max_size=12))
def test_incremental_writes_equal_a_fresh_mask(steps):
    # Rounds whose prefix grows, and now and then a new sequence (the prefix starts again).
    compiler, past = DenseMaskCompiler(), 0
    for n, grow, restart in steps:
        past = 0 if restart else past + grow
        parents = [-1] + [int(torch.randint(0, i, ()).item()) for i in range(1, n)]
        tree = _tree(list(range(n)), parents)
        got = compiler.compile(tree, past_length=past).attention_mask.clone()
        want = DenseMaskCompiler().compile(tree, past_length=past).attention_mask
        assert torch.equal(got, want)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 12), past=st.integers(0, 20), seed=st.integers(0, 10**6))
def test_the_tree_block_expands_to_the_dense_mask(n, past, seed):
    gen = torch.Generator().manual_seed(seed)
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n)]
    tree = _tree(list(range(n)), parents)
    block = TreeMaskCompiler().compile(tree, past_length=past)
    dense = DenseMaskCompiler().compile(tree, past_length=past)
    assert block.attention_mask.shape == (n, n) and block.attention_mask.dtype == torch.bool
    assert torch.equal(additive_tree_mask(block.attention_mask, past, torch.float32), dense.attention_mask)
    assert torch.equal(block.position_ids, dense.position_ids) and torch.equal(block.input_ids, dense.input_ids)
    assert additive_tree_mask(dense.attention_mask, past, torch.float32) is dense.attention_mask  # dense: as is
