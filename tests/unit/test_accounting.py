"""End-of-run accounting: exact (the default) and as the published DDTree code counts.

A perfect oracle drafter (the target's own greedy tokens, 4 deep, sharp) makes every round's
acceptance known in advance: each round accepts all its drafts plus the bonus, so the
acceptance lengths below are worked out by hand. The two policies must return the same tokens,
the target's greedy ones, and differ only in the last rounds' lengths.
"""

import math

import pytest
import torch

from ddtree import SpeculativeEngine
from ddtree.drafters import OracleDrafter
from ddtree.metrics import ExactAccounting, ReferenceAccounting
from ddtree.models import HFTarget
from ddtree.testing import greedy_reference
from ddtree.trees import BestFirstTreeBuilder, ChainTreeBuilder

PROMPT = torch.tensor([12, 39, 0, 63, 77, 54])  # greedy: 10 23 85 23 89 14 69 58 29 7 ...
EXACT, REFERENCE = ExactAccounting(), ReferenceAccounting()


def _engine(model, tree=None, stop=(), max_length=None, depth=4):
    return SpeculativeEngine(HFTarget(model, max_length=max_length), OracleDrafter(model, depth=depth, sharpness=20),
                             tree or ChainTreeBuilder(), stop_token_ids=stop)


@pytest.mark.parametrize("tree", [ChainTreeBuilder(), BestFirstTreeBuilder(8)], ids=["chain", "best-first"])
def test_the_last_round_is_cut_exactly_and_counted_in_full_by_the_reference(tiny_models, tree):
    model = tiny_models["qwen3"]
    engine = _engine(model, tree)
    # 10 tokens: the prefill's, then 4 drafts + bonus (6), then the last round:
    # exact drafts the 3 still wanted (3 + bonus: 10); the reference drafts 4 and counts 5 (11, cut to 10)
    exact = engine.generate(PROMPT, max_new_tokens=10)
    reference = engine.generate(PROMPT, max_new_tokens=10, accounting=REFERENCE)
    assert exact.tokens == reference.tokens == greedy_reference(model, PROMPT, 10)
    assert (exact.acceptance_lengths, exact.mean_acceptance) == ([5, 4], 4.5)
    assert (reference.acceptance_lengths, reference.mean_acceptance) == ([5, 5], 5.0)
    assert exact.stopped_by == reference.stopped_by == "max_new_tokens"


def test_the_reference_runs_one_round_more_at_exactly_max_new_tokens(tiny_models):
    model = tiny_models["qwen3"]
    engine = _engine(model)
    exact = engine.generate(PROMPT, max_new_tokens=6)  # 1 + (4 + 1): done
    reference = engine.generate(PROMPT, max_new_tokens=6, accounting=REFERENCE)  # its loop goes on while <= 6
    assert exact.tokens == reference.tokens == greedy_reference(model, PROMPT, 6)
    assert (exact.acceptance_lengths, reference.acceptance_lengths) == ([5], [5, 5])


def test_the_reference_counts_accepted_drafts_past_a_stop_token(tiny_models):
    model = tiny_models["qwen3"]
    free = greedy_reference(model, PROMPT, 16)
    eos = free[7]  # the second round accepts tokens 6..9 and the bonus 10
    assert eos not in free[:7]
    engine = _engine(model, stop=[eos])
    exact = engine.generate(PROMPT, max_new_tokens=16)
    reference = engine.generate(PROMPT, max_new_tokens=16, accounting=REFERENCE)
    assert exact.tokens == reference.tokens == free[:8]
    assert exact.stopped_by == reference.stopped_by == "stop_token"
    assert (exact.acceptance_lengths, reference.acceptance_lengths) == ([5, 2], [5, 5])


def test_the_reference_runs_a_round_after_a_first_token_that_stops(tiny_models):
    model = tiny_models["qwen3"]
    eos = greedy_reference(model, PROMPT, 1)[0]
    engine = _engine(model, stop=[eos])
    exact = engine.generate(PROMPT, max_new_tokens=16)
    reference = engine.generate(PROMPT, max_new_tokens=16, accounting=REFERENCE)
    assert exact.tokens == reference.tokens == [eos]
    assert exact.acceptance_lengths == [] and math.isnan(exact.mean_acceptance)
    assert (reference.acceptance_lengths, reference.mean_acceptance) == ([5], 5.0)


def test_full_drafts_never_reach_past_the_targets_context(tiny_models):
    model = tiny_models["qwen3"]
    engine = _engine(model, max_length=16, depth=7)  # 6 prompt tokens + 10 new fill the context
    exact = engine.generate(PROMPT, max_new_tokens=10)
    reference = engine.generate(PROMPT, max_new_tokens=10, accounting=REFERENCE)
    assert exact.tokens == reference.tokens == greedy_reference(model, PROMPT, 10)
    # round 2 starts with 14 tokens in the cache: exact drafts nothing (the bonus is the 10th
    # token), the reference drafts the 1 depth that still fits the 16 positions
    assert (exact.acceptance_lengths, reference.acceptance_lengths) == ([8, 1], [8, 2])
