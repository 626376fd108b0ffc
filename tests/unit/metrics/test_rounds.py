"""Round analysis: literal values on hand-built rounds, the prefix property it rests on, and the
budget estimate against actually building the smaller tree on the same round inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ddtree import SpeculativeEngine
from ddtree.engine import RoundRecord
from ddtree.masks import DenseMaskCompiler
from ddtree.metrics.rounds import (RoundTrace, branch_gain, calibration, depth_rank, estimate_budget, estimate_chain,
                                   recorded, round_traces, traces_of)
from ddtree.models import HFTarget
from ddtree.testing import oracle_drafter
from ddtree.trees import BestFirstTreeBuilder, ChainTreeBuilder
from ddtree.types import Draft, Verification
from ddtree.verifiers import GreedyVerifier

LN = math.log


def trace(parents, depths, ranks, tokens, q, path, bonus, length, top=(10, 20, 30), stop=False) -> RoundTrace:
    return RoundTrace(tuple(parents), tuple(depths), tuple(ranks), tuple(tokens), tuple(LN(p) for p in q),
                      tuple(top), tuple(path), bonus, length, stop)


# The target took the depth-1 sibling (rank 1), then the top-1 below it: the chain accepts nothing.
#   node:     0   1(10) 2(20) 3(11) 4(20) 5(30)
OFF_CHAIN = trace(parents=[-1, 0, 1, 0, 3, 2], depths=[0, 1, 2, 1, 2, 3], ranks=[0, 0, 0, 1, 0, 0],
                  tokens=[5, 10, 20, 11, 20, 30], q=[1, 0.6, 0.55, 0.3, 0.55, 0.4], path=[0, 3, 4], bonus=30,
                  length=3)
# Budget 2 holds two depth-1 siblings; the target took the top-1 and then wanted the chain's depth-2
# token, which the tree does not hold: the chain would accept it too.
CHAIN_BEYOND = trace(parents=[-1, 0, 0], depths=[0, 1, 1], ranks=[0, 0, 1], tokens=[5, 10, 12], q=[1, 0.6, 0.2],
                     path=[0, 1], bonus=20, length=2)


def test_budget_estimates_are_the_deepest_kept_node_on_the_path() -> None:
    assert [estimate_budget([[OFF_CHAIN]], b).lengths for b in (1, 2, 3, 4, 5)] == \
        [((1,),), ((1,),), ((2,),), ((3,),), ((3,),)]
    both = estimate_budget([[OFF_CHAIN], [CHAIN_BEYOND]], 1)
    assert both.lengths == ((1,), (2,)) and both.tau == 1.5 and both.rounds == 2
    with pytest.raises(ValueError, match="above the recorded"):
        estimate_budget([[CHAIN_BEYOND]], 3)


def test_a_stop_token_cuts_the_estimate_where_it_cut_the_round() -> None:
    cut = RoundTrace(**{**vars(OFF_CHAIN), "length": 2, "stop": True})  # the stop token was node 4's
    assert estimate_budget([[cut]], 5).lengths == ((2,),)
    assert estimate_budget([[cut]], 3).lengths == ((2,),)


def test_the_chain_estimate_and_its_lower_bounds() -> None:
    chain = estimate_chain([[OFF_CHAIN], [CHAIN_BEYOND]])
    assert chain.lengths == ((1,), (3,)) and chain.censored == 1 and chain.tau == 2.0
    stopped = RoundTrace(**{**vars(CHAIN_BEYOND), "stop": True})  # the bonus was a stop token: no more
    assert estimate_chain([[stopped]]).lengths == ((2,),) and estimate_chain([[stopped]]).censored == 0
    assert recorded([[OFF_CHAIN], [CHAIN_BEYOND]]).tau == 2.5


def test_acceptance_per_depth_and_rank() -> None:
    table = depth_rank([[OFF_CHAIN], [CHAIN_BEYOND]], max_rank=2)
    assert table.tested.tolist() == [[2, 2], [1, 0], [0, 0]]
    assert table.accepted.tolist() == [[1, 1], [1, 0], [0, 0]]
    np.testing.assert_array_equal(table.rate[:2], [[0.5, 0.5], [1.0, np.nan]])
    np.testing.assert_array_equal(table.per_round[0], [0.5, 0.5])
    # OFF_CHAIN's path leaves the chain at depth 1, rank 1 and gains 3 - 1 tokens; over 2 rounds.
    assert branch_gain([[OFF_CHAIN], [CHAIN_BEYOND]], max_rank=2).tolist() == [[0.0, 1.0], [0.0, 0.0], [0.0, 0.0]]


def test_calibration_bins_stated_probability_against_hits() -> None:
    # Tested nodes: q 0.6 miss, 0.3 hit, 0.55 hit (OFF_CHAIN); 0.6 hit, 0.2 miss (CHAIN_BEYOND).
    cal = calibration([[OFF_CHAIN], [CHAIN_BEYOND]], bins=2)
    assert cal.count.tolist() == [2, 3]
    np.testing.assert_allclose(cal.stated, [0.25, (0.6 + 0.55 + 0.6) / 3])
    np.testing.assert_allclose(cal.hit_rate, [0.5, 2 / 3])
    assert cal.error == pytest.approx((2 * 0.25 + 3 * abs(1.75 / 3 - 2 / 3)) / 5)
    top1 = calibration([[OFF_CHAIN], [CHAIN_BEYOND]], bins=2, depths=[1], ranks=[0])
    assert top1.count.tolist() == [0, 2] and top1.hit_rate[1] == 0.5 and math.isnan(top1.stated[0])


def test_traces_round_trip_through_json_and_old_records_have_none() -> None:
    assert RoundTrace.from_json(OFF_CHAIN.to_json()) == OFF_CHAIN
    assert "stop" not in OFF_CHAIN.to_json() and traces_of({"key": "0:0", "tokens": [1]}) == []
    assert traces_of({"rounds": [CHAIN_BEYOND.to_json()]}) == [CHAIN_BEYOND]


def _tie_free_draft(seed: int, depth: int, vocab: int) -> Draft:
    g = torch.Generator().manual_seed(seed)
    return Draft(torch.log_softmax(3 * torch.randn(depth, vocab, generator=g, dtype=torch.float64), -1).float())


@pytest.mark.parametrize("method", ["beam", "heap"])
@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), depth=st.integers(1, 6), vocab=st.integers(2, 20), budget=st.integers(1, 48))
def test_a_smaller_budget_tree_is_the_first_nodes_of_a_larger_one(method, seed, depth, vocab, budget):
    """What the budget estimate rests on, for drafts without tied log-probs."""
    draft = _tie_free_draft(seed, depth, vocab)
    big = BestFirstTreeBuilder(64, method=method).build(draft, root_token=0)
    small = BestFirstTreeBuilder(budget, method=method).build(draft, root_token=0)
    n = small.size
    assert torch.equal(small.tokens, big.tokens[:n]) and torch.equal(small.parents, big.parents[:n])


def test_tied_draft_log_probs_are_flagged() -> None:
    """torch.topk orders ties differently for different k, so with ties a smaller tree may take
    another of the tied tokens: such rounds are flagged and counted, not silently trusted."""
    flat = Draft(torch.log_softmax(torch.zeros(1, 32), -1))
    assert BestFirstTreeBuilder(2).build(flat, 0).tokens[1] != BestFirstTreeBuilder(16).build(flat, 0).tokens[1]
    tree = BestFirstTreeBuilder(4).build(flat, 0)
    t = RoundTrace.from_round(RoundRecord(flat, tree, Verification((0,), (0,), 3)), length=1)
    assert t.tie and t.ranks == (0, 0, 0, 0, 0) and estimate_budget([[t]], 2).ties == 1


def test_budget_estimate_equals_building_the_smaller_tree(tiny_models) -> None:
    """One recorded B = 24 run; every round replayed: the target prefilled with what was committed
    before it, the budget-b tree built from the round's own draft, verified; the accepted length
    must be the estimate's, round by round."""
    target = HFTarget(tiny_models["qwen3"], max_length=256)
    drafter = oracle_drafter(target, depth=5, swap_prob=0.4, sharpness=3.0, seed=2)
    engine = SpeculativeEngine(target, drafter, BestFirstTreeBuilder(24), DenseMaskCompiler(), GreedyVerifier())
    prompt = torch.tensor([3, 17, 42, 8, 61, 5, 29, 77])
    result = engine.generate(prompt, max_new_tokens=40, record=True)
    traces = round_traces(result)
    assert len(traces) >= 8 and not any(t.tie for t in traces)
    starts = np.cumsum([1, *result.acceptance_lengths[:-1]])  # committed tokens when each round began
    replay = HFTarget(tiny_models["qwen3"], max_length=256)
    masks, verifier = DenseMaskCompiler(), GreedyVerifier()
    for builder, estimate in [(BestFirstTreeBuilder(b), estimate_budget([traces], b)) for b in (1, 3, 8, 16)] + \
                             [(ChainTreeBuilder(), estimate_chain([traces]))]:
        for i, (record, start) in enumerate(zip(result.rounds, starts)):
            replay.prefill(torch.cat([prompt, torch.tensor(result.tokens[: start - 1], dtype=torch.long)]))
            tree = builder.build(record.draft, result.tokens[start - 1])
            out = replay.forward_tree(masks.compile(tree, replay.past_length))
            length = verifier.verify(tree, out.logits, None).accepted + 1
            bound = estimate.censored and _censored(traces[i])
            assert (length >= estimate.lengths[0][i]) if bound else (length == estimate.lengths[0][i]), (builder, i)
    assert any(a != b for a, b in zip(estimate_budget([traces], 1).lengths[0], result.acceptance_lengths))


def _censored(t: RoundTrace) -> bool:
    return estimate_chain([[t]]).censored == 1
