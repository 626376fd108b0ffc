"""One rule for tau: a response with no round has no acceptance length (NaN), and the mean over
responses leaves it out."""

import math

import torch

from ddtree import SpeculativeEngine
from ddtree.masks import DenseMaskCompiler
from ddtree.metrics import mean_of_means, pooled_histogram
from ddtree.models import HFTarget
from ddtree.testing import oracle_drafter
from ddtree.trees import ChainTreeBuilder
from ddtree.verifiers import GreedyVerifier


def test_tau_is_the_mean_of_per_response_means_over_responses_with_rounds():
    assert mean_of_means([[1, 1, 1, 5], [4]]) == 3.0  # not the pooled 2.4
    assert mean_of_means([[1, 1, 1, 5], [4], []]) == 3.0
    assert math.isnan(mean_of_means([[], []])) and math.isnan(mean_of_means([]))
    assert pooled_histogram([[1, 2], [], [2]]) == {1: 1 / 3, 2: 2 / 3}


def test_a_response_without_a_round_has_no_acceptance_length(tiny_models):
    target = HFTarget(tiny_models["qwen3"])
    engine = SpeculativeEngine(target, oracle_drafter(target, depth=3), ChainTreeBuilder(), DenseMaskCompiler(),
                               GreedyVerifier())
    prompt = torch.arange(4, 17)
    short, full = engine.generate(prompt, max_new_tokens=1), engine.generate(prompt, max_new_tokens=12)
    assert short.acceptance_lengths == [] and math.isnan(short.mean_acceptance)  # the prefill's token only
    assert full.mean_acceptance >= 1.0
    results = [short, full]
    assert mean_of_means(r.acceptance_lengths for r in results) == full.mean_acceptance
    stop = SpeculativeEngine(target, oracle_drafter(target, depth=3), ChainTreeBuilder(), DenseMaskCompiler(),
                             GreedyVerifier(), stop_token_ids=[short.tokens[0]]).generate(prompt, max_new_tokens=12)
    assert stop.stopped_by == "stop_token" and math.isnan(stop.mean_acceptance)
