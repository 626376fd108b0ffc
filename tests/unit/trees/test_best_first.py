"""The best-first tree is the optimal tree (both methods), and the chain is its top-1 special case."""

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ddtree.trees import BestFirstTreeBuilder, ChainTreeBuilder
from ddtree.types import Draft


def _draft(seed: int, depth: int, vocab: int) -> Draft:
    g = torch.Generator().manual_seed(seed)
    return Draft(torch.log_softmax(3 * torch.randn(depth, vocab, generator=g, dtype=torch.float64), -1).float())


def _mass(logp: torch.Tensor, prefixes) -> float:
    return sum(math.exp(sum(logp[d, t].item() for d, t in enumerate(p))) for p in prefixes)


def _brute_force_best(logp: torch.Tensor, budget: int) -> float:
    """Max total q over every prefix-closed set of at most ``budget`` prefixes."""
    depth, vocab = logp.shape
    prefixes = [p for n in range(1, depth + 1) for p in itertools.product(range(vocab), repeat=n)]
    best = 0.0
    for size in range(1, min(budget, len(prefixes)) + 1):
        for subset in itertools.combinations(prefixes, size):
            chosen = set(subset)
            if all(p[:-1] in chosen for p in subset if len(p) > 1):
                best = max(best, _mass(logp, subset))
    return best


def _prefixes(tree) -> list[tuple[int, ...]]:
    tokens = tree.tokens.tolist()
    return [tuple(tokens[j] for j in tree.path_to(i)[1:]) for i in range(1, tree.size)]


METHODS = pytest.mark.parametrize("method", ["beam", "heap"])


@METHODS
@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), depth=st.integers(1, 3), vocab=st.integers(2, 3), budget=st.integers(0, 4))
def test_mass_equals_brute_force_optimum(method, seed, depth, vocab, budget):
    draft = _draft(seed, depth, vocab)
    tree = BestFirstTreeBuilder(budget, method=method).build(draft, root_token=0)
    assert tree.size == 1 + min(budget, sum(vocab**d for d in range(1, depth + 1)))
    assert math.isclose(_mass(draft.log_probs, _prefixes(tree)), _brute_force_best(draft.log_probs, budget), rel_tol=1e-5)


@METHODS
@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), depth=st.integers(1, 6), vocab=st.integers(2, 12), budget=st.integers(1, 60))
def test_tree_is_prefix_closed_parents_first_and_scored(method, seed, depth, vocab, budget):
    draft = _draft(seed, depth, vocab)
    tree = BestFirstTreeBuilder(budget, method=method).build(draft, root_token=5)
    parents, depths = tree.parents.tolist(), tree.depths.tolist()
    assert tree.tokens[0] == 5 and parents[0] == -1 and depths[0] == 0
    for i in range(1, tree.size):
        assert 0 <= parents[i] < i and depths[i] == depths[parents[i]] + 1
        score = tree.scores[parents[i]] + draft.log_probs[depths[i] - 1, tree.tokens[i]]
        assert torch.isclose(tree.scores[i], score, atol=1e-5)
    # Pop order is non-increasing in score, and siblings are distinct tokens.
    assert torch.all(tree.scores[1:-1] >= tree.scores[2:] - 1e-6)
    assert len(set(zip(parents, tree.tokens.tolist()))) == tree.size


@METHODS
@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), depth=st.integers(0, 8), vocab=st.integers(2, 20))
def test_chain_equals_best_first_restricted_to_top1(method, seed, depth, vocab):
    draft = _draft(seed, depth, vocab)
    chain = ChainTreeBuilder().build(draft, root_token=1)
    tree = BestFirstTreeBuilder(budget=depth, max_width=1, method=method).build(draft, root_token=1)
    for field in ("tokens", "parents", "depths"):
        assert torch.equal(getattr(chain, field), getattr(tree, field))
    assert torch.allclose(chain.scores, tree.scores, atol=1e-5)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), depth=st.integers(1, 8), vocab=st.integers(2, 40), budget=st.integers(1, 300),
       width=st.sampled_from([None, 1, 3]))
def test_beam_and_heap_build_the_same_tree(seed, depth, vocab, budget, width):
    draft = _draft(seed, depth, vocab)  # continuous scores: no ties, so one optimal tree and one order
    beam = BestFirstTreeBuilder(budget, max_width=width, method="beam").build(draft, root_token=2)
    heap = BestFirstTreeBuilder(budget, max_width=width, method="heap").build(draft, root_token=2)
    for field in ("tokens", "parents", "depths"):
        assert torch.equal(getattr(beam, field), getattr(heap, field))
    assert torch.allclose(beam.scores, heap.scores, atol=1e-6)


@pytest.mark.parametrize("logp", [torch.full((4, 3), -math.log(3.0)),  # every score ties
                                  torch.tensor([[0.0, -math.inf, -math.inf]] * 4)])  # certain draft, -inf rest
def test_beam_tree_with_ties_is_prefix_closed_and_optimal(logp):
    tree = BestFirstTreeBuilder(10, method="beam").build(Draft(logp), root_token=0)
    heap = BestFirstTreeBuilder(10, method="heap").build(Draft(logp), root_token=0)
    parents, depths = tree.parents.tolist(), tree.depths.tolist()
    assert tree.size == heap.size == 11
    for i in range(1, tree.size):
        assert 0 <= parents[i] < i and depths[i] == depths[parents[i]] + 1
    assert len(set(zip(parents, tree.tokens.tolist()))) == tree.size
    assert math.isclose(tree.scores.exp().sum().item(), heap.scores.exp().sum().item(), rel_tol=1e-6)


def test_unknown_method_is_refused_and_auto_picks_by_budget():
    with pytest.raises(ValueError, match="unknown tree method 'bfs'"):
        BestFirstTreeBuilder(4, method="bfs")
    assert BestFirstTreeBuilder(512).method == "heap" and BestFirstTreeBuilder(1024).method == "beam"


@METHODS
def test_literal_small_tree(method):
    # depth 1: a=0.6, b=0.3, c=0.1; depth 2: x=0.9, y=0.1 (same marginal below any depth-1 token)
    logp = torch.tensor([[0.6, 0.3, 0.1], [0.9, 0.1, 1e-9]]).log()
    tree = BestFirstTreeBuilder(budget=4, method=method).build(Draft(logp), root_token=9)
    # 0.6 (a), 0.54 (a x), 0.3 (b), 0.27 (b x)
    assert tree.tokens.tolist() == [9, 0, 0, 1, 0]
    assert tree.parents.tolist() == [-1, 0, 1, 0, 3]
    assert tree.depths.tolist() == [0, 1, 2, 1, 2]


def test_budget_zero_and_empty_draft_give_the_root():
    draft = _draft(0, 4, 10)
    assert BestFirstTreeBuilder(0).build(draft, 3).size == 1
    assert BestFirstTreeBuilder(16).build(draft.truncate(0), 3).size == 1
    assert ChainTreeBuilder().build(draft.truncate(0), 3).size == 1


def test_draft_temperature_below_one_grows_deeper_trees():
    flat = torch.log_softmax(torch.tensor([[1.0, 0.8, 0.6, 0.4]] * 6), -1)
    wide = BestFirstTreeBuilder(6).build(Draft(flat), 0)
    deep = BestFirstTreeBuilder(6, draft_temperature=0.1).build(Draft(flat), 0)
    assert int(wide.depths.max()) < int(deep.depths.max()) == 6
    assert BestFirstTreeBuilder(6, draft_temperature=1.0).build(Draft(flat), 0).tokens.tolist() == wide.tokens.tolist()
