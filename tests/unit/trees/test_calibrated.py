"""The calibrated tree: the best-first tree over per-depth tempered draft scores."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ddtree.trees import BestFirstTreeBuilder, CalibratedTreeBuilder
from ddtree.trees.calibrated import temper
from ddtree.types import Draft

# Depth 1 ranks a > b > c, depth 2 likewise; probabilities chosen so that no two prefixes tie.
DRAFT = Draft(torch.tensor([[0.6, 0.35, 0.05], [0.5, 0.4, 0.1]]).log())


def _literal(tree):
    return tree.tokens.tolist(), tree.parents.tolist(), tree.depths.tolist()


def test_plain_best_first_tree_of_the_literal_draft():
    # prefixes by probability: a .60, b .35, aa .30, ab .24, ba .175
    tree = BestFirstTreeBuilder(3).build(DRAFT, root_token=9)
    assert _literal(tree) == ([9, 0, 1, 0], [-1, 0, 0, 1], [0, 1, 1, 2])


@pytest.mark.parametrize("method", ["heap", "beam"])
def test_a_sharper_first_depth_grows_the_tree_deeper(method):
    # T_1 = 0.5: q'_1 = [.36, .1225, .0025] / .485 = [.7423, .2526, .0052]; q'_2 = q_2.
    # prefixes: a .742, aa .371, ab .297, b .253: the budget goes below a instead of to b
    tree = CalibratedTreeBuilder(3, temperatures=[0.5, 1.0], method=method).build(DRAFT, root_token=9)
    assert _literal(tree) == ([9, 0, 0, 1], [-1, 0, 1, 1], [0, 1, 2, 2])
    a = 0.36 / 0.485
    assert tree.scores.tolist() == pytest.approx([0.0, math.log(a), math.log(a * 0.5), math.log(a * 0.4)], abs=1e-6)


def test_a_flatter_first_depth_grows_the_tree_wider():
    # T_1 = 4: q'_1 ~ [.6, .35, .05] ** .25 = [.880, .769, .473] / 2.122 = [.415, .362, .223]
    # prefixes: a .415, b .362, c .223, aa .207
    tree = CalibratedTreeBuilder(3, temperatures=[4.0, 1.0]).build(DRAFT, root_token=9)
    assert _literal(tree) == ([9, 0, 1, 2], [-1, 0, 0, 0], [0, 1, 1, 1])


def test_the_last_temperature_serves_every_deeper_depth():
    q = torch.log_softmax(torch.randn(5, 7, generator=torch.Generator().manual_seed(0)), -1)
    tempered = temper(Draft(q), torch.tensor([0.5, 2.0])).log_probs
    assert torch.allclose(tempered[0], torch.log_softmax(q[0] / 0.5, -1))
    assert torch.allclose(tempered[1:], torch.log_softmax(q[1:] / 2.0, -1))
    assert temper(Draft.empty(7), torch.tensor([0.5])).depth == 0


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), depth=st.integers(1, 6), vocab=st.integers(2, 12), budget=st.integers(0, 40))
def test_unit_temperatures_give_the_plain_best_first_tree(seed, depth, vocab, budget):
    q = torch.log_softmax(3 * torch.randn(depth, vocab, generator=torch.Generator().manual_seed(seed)), -1)
    plain = BestFirstTreeBuilder(budget).build(Draft(q), root_token=1)
    calibrated = CalibratedTreeBuilder(budget, temperatures=[1.0] * depth).build(Draft(q), root_token=1)
    assert _literal(calibrated) == _literal(plain)


@pytest.mark.parametrize("temperatures", [[], [1.0, 0.0], [-1.0]])
def test_bad_temperatures_are_refused(temperatures):
    with pytest.raises(ValueError, match="temperatures"):
        CalibratedTreeBuilder(8, temperatures=temperatures)
