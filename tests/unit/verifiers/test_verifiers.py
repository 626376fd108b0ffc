"""The walk, greedy and sampling verifiers on literal trees."""

import pytest
import torch

from ddtree.types import Tree
from ddtree.verifiers import GreedyVerifier, SamplingVerifier, walk_tree


def _tree():
    # root(7) -> 1:a(3) -> 3:c(5);  root -> 2:b(4)
    t = lambda x: torch.tensor(x)  # noqa: E731
    return Tree(t([7, 3, 4, 5]), t([-1, 0, 0, 1]), t([0, 1, 1, 2]), torch.zeros(4))


def _onehot_logits(choices, vocab=8):
    logits = torch.full((len(choices), vocab), -10.0)
    logits[torch.arange(len(choices)), torch.tensor(choices)] = 10.0
    return logits


def test_walk_follows_children_and_returns_bonus():
    v = walk_tree(_tree(), torch.tensor([3, 5, 0, 6]))
    assert v.path == (0, 1, 3) and v.tokens == (7, 3, 5) and v.bonus == 6 and v.accepted == 2


def test_walk_takes_a_sibling_and_stops_on_a_miss():
    assert walk_tree(_tree(), torch.tensor([4, 0, 1, 0])).path == (0, 2)
    v = walk_tree(_tree(), torch.tensor([6, 5, 0, 0]))
    assert v.path == (0,) and v.bonus == 6


def test_greedy_uses_argmax():
    v = GreedyVerifier().verify(_tree(), _onehot_logits([3, 5, 1, 2]))
    assert v.path == (0, 1, 3) and v.bonus == 2


def test_sampling_is_seeded_and_matches_the_walk_of_its_samples():
    logits = torch.randn(4, 8)
    verifier = SamplingVerifier(temperature=0.7)
    a = verifier.verify(_tree(), logits, torch.Generator().manual_seed(3))
    b = verifier.verify(_tree(), logits, torch.Generator().manual_seed(3))
    assert a == b
    samples = torch.multinomial(torch.softmax(logits / 0.7, -1), 1, generator=torch.Generator().manual_seed(3))
    assert a == walk_tree(_tree(), samples[:, 0])


def test_sampling_at_zero_is_greedy_and_negative_is_refused():
    logits = _onehot_logits([4, 0, 0, 0])
    assert SamplingVerifier(0.0).verify(_tree(), logits).path == (0, 2)
    with pytest.raises(ValueError, match="temperature must be a number >= 0"):
        SamplingVerifier(-0.5)
