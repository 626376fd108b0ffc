"""Per-depth draft temperatures: labelled rounds from a run, the on-chain mask, and the fit."""

import pytest
import torch

from ddtree import SpeculativeEngine
from ddtree.drafters import OracleDrafter
from ddtree.models import HFTarget
from ddtree.testing import greedy_reference
from ddtree.training.calibration import NO_LABEL, chain_mask, depth_nll, fit_depth_temperatures, round_examples
from ddtree.trees import BestFirstTreeBuilder


def test_rounds_are_labelled_with_the_tokens_the_run_returned(tiny_models):
    model = tiny_models["qwen3"]
    prompt = torch.tensor([12, 39, 0, 63, 77, 54])
    engine = SpeculativeEngine(HFTarget(model), OracleDrafter(model, depth=4, swap_prob=0.5, sharpness=3),
                               BestFirstTreeBuilder(6))
    result = engine.generate(prompt, max_new_tokens=20, record=True)
    log_probs, labels = round_examples([result])
    assert log_probs.shape == (len(result.rounds), 4, model.config.vocab_size)
    greedy, root = greedy_reference(model, prompt, 20), 0
    for r, length in enumerate(result.acceptance_lengths):
        depth = result.rounds[r].draft.depth
        want = greedy[root + 1 : root + 1 + depth]
        assert labels[r].tolist() == want + [NO_LABEL] * (4 - len(want))
        assert torch.equal(log_probs[r, :depth], result.rounds[r].draft.log_probs)
        root += length


def test_the_chain_mask_keeps_depths_below_top1_hits_only():
    log_probs = torch.log_softmax(torch.tensor([[[3.0, 0, 0], [0, 3.0, 0], [0, 0, 3.0]],
                                                [[3.0, 0, 0], [3.0, 0, 0], [3.0, 0, 0]]]), -1)  # top-1: 0 1 2, 0 0 0
    labels = torch.tensor([[0, 1, 0], [1, 0, NO_LABEL]])
    assert chain_mask(log_probs, labels).tolist() == [[True, True, True], [True, False, False]]


@pytest.mark.parametrize("on_chain", [True, False])
def test_the_fit_recovers_the_temperatures_labels_were_drawn_at(on_chain):
    g = torch.Generator().manual_seed(0)
    true = torch.tensor([0.5, 1.0, 2.0])
    log_probs = torch.log_softmax(2 * torch.randn(4000, 3, 16, generator=g), -1)  # [R, L, vocab]
    torch.manual_seed(0)  # Categorical.sample draws from the global generator: fixed whatever ran before
    labels = torch.distributions.Categorical(logits=log_probs / true[None, :, None]).sample()
    # on the chain: only depths below top-1 hits count (the labels do not depend on them)
    mask = chain_mask(log_probs, labels) if on_chain else labels != NO_LABEL
    fitted = fit_depth_temperatures(log_probs, labels, mask)
    assert fitted == pytest.approx(true.tolist(), rel=0.08)
    assert (depth_nll(log_probs, labels, fitted) <= depth_nll(log_probs, labels, [1.0]) + 1e-6).all()


def test_depths_with_too_few_examples_take_the_temperature_above():
    g = torch.Generator().manual_seed(1)
    log_probs = torch.log_softmax(torch.randn(50, 3, 8, generator=g), -1)
    labels = log_probs.argmax(-1)  # the draft always right: sharpen (T < 1)
    labels[:, 1:] = NO_LABEL
    labels[:3, 2] = 0  # 3 examples at depth 3, fewer than min_examples
    fitted = fit_depth_temperatures(log_probs, labels, labels != NO_LABEL)
    assert fitted[0] < 1 and fitted[1] == fitted[2] == fitted[0]
