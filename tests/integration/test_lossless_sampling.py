"""T > 0: the distribution of the first generated tokens is the target's own.

A tiny target with a 4-token vocabulary has 64 possible 3-token continuations; their exact
probabilities under the target are enumerated, and a chi-square goodness-of-fit test compares
them with the continuations each strategy produces over many seeds. The seeds are fixed, so the
test is deterministic; for a correct sampler its false-alarm rate is ALPHA per strategy.
"""

import itertools

import pytest
import torch

from ddtree import SpeculativeEngine
from ddtree.drafters import DFlashDrafter, NullDrafter, OracleDrafter
from ddtree.masks import DenseMaskCompiler
from ddtree.models import HFTarget
from ddtree.testing import tiny_dflash, tiny_target
from ddtree.trees import BestFirstTreeBuilder, ChainTreeBuilder
from ddtree.verifiers import SamplingVerifier

VOCAB, NEW, SAMPLES, ALPHA = 4, 3, 1200, 1e-3
PROMPT = torch.tensor([1, 3, 0, 2, 2])


def _exact_distribution(model, temperature: float) -> dict[tuple[int, ...], float]:
    seqs = list(itertools.product(range(VOCAB), repeat=NEW))
    ids = torch.cat([PROMPT.expand(len(seqs), -1), torch.tensor(seqs)], dim=1)
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits.double() / temperature, dim=-1)
    n = PROMPT.numel()
    probs = {}
    for row, seq in enumerate(seqs):
        probs[seq] = float(sum(logp[row, n - 1 + i, tok] for i, tok in enumerate(seq)).exp())
    return probs


def _chi_square_p_value(counts: dict, probs: dict, total: int) -> float:
    observed, expected, small_o, small_e = [], [], 0.0, 0.0
    for cell, p in probs.items():
        if p * total >= 5:
            observed.append(counts.get(cell, 0))
            expected.append(p * total)
        else:  # merge sparse cells so the chi-square approximation holds
            small_o += counts.get(cell, 0)
            small_e += p * total
    if small_e > 0:
        observed.append(small_o)
        expected.append(small_e)
    o, e = torch.tensor(observed, dtype=torch.float64), torch.tensor(expected, dtype=torch.float64)
    stat = ((o - e) ** 2 / e).sum()
    dof = torch.tensor((len(observed) - 1) / 2, dtype=torch.float64)
    return float(torch.special.gammaincc(dof, stat / 2))


@pytest.fixture(scope="module")
def small_vocab_model():
    model = tiny_target("qwen3", vocab_size=VOCAB, seed=1)
    with torch.no_grad():  # a little more peaked, so trees are accepted often
        model.get_output_embeddings().weight.mul_(3.0)
    return model


def _strategies(model, target):
    dflash = tiny_dflash(model, block_size=4, mask_token_id=VOCAB - 1)
    return {
        "ar": (NullDrafter(), ChainTreeBuilder()),
        "dflash-random": (DFlashDrafter(dflash, target), ChainTreeBuilder()),
        "dflash-oracle": (OracleDrafter(model, depth=3, sharpness=2.0), ChainTreeBuilder()),
        "ddtree-oracle": (OracleDrafter(model, depth=3, sharpness=2.0), BestFirstTreeBuilder(6)),
    }


@pytest.mark.parametrize(
    "name, temperature",
    [("ar", 1.0), ("dflash-random", 1.0), ("dflash-oracle", 1.0), ("ddtree-oracle", 1.0), ("ddtree-oracle", 0.6)],
)
def test_first_tokens_follow_the_target_distribution(small_vocab_model, name, temperature):
    model = small_vocab_model
    target = HFTarget(model)
    drafter, tree = _strategies(model, target)[name]
    engine = SpeculativeEngine(target, drafter, tree, DenseMaskCompiler(), SamplingVerifier(temperature))
    counts, accepted = {}, 0
    for seed in range(SAMPLES):
        result = engine.generate(PROMPT, max_new_tokens=NEW, seed=seed)
        key = tuple(result.tokens)
        counts[key] = counts.get(key, 0) + 1
        accepted += sum(length - 1 for length in result.acceptance_lengths)
    p_value = _chi_square_p_value(counts, _exact_distribution(model, temperature), SAMPLES)
    assert p_value > ALPHA, f"{name} at T={temperature}: chi-square p = {p_value:.2e}"
    if name.endswith("oracle"):  # the test is only meaningful if drafts are accepted
        assert accepted > 0.3 * SAMPLES


def test_a_biased_sampler_is_caught(small_vocab_model):
    """The test has power: always taking the draft's top token when it is a child is lossy."""
    model = small_vocab_model
    target = HFTarget(model)

    class TopChildVerifier(SamplingVerifier):
        def verify(self, tree, logits, generator=None):
            biased = logits.clone()
            biased[0, tree.tokens[1:2]] += 2.0  # favour the first child at the root
            return super().verify(tree, biased, generator)

    engine = SpeculativeEngine(target, OracleDrafter(model, depth=3, sharpness=2.0), ChainTreeBuilder(),
                               DenseMaskCompiler(), TopChildVerifier(1.0))
    counts = {}
    for seed in range(SAMPLES):
        key = tuple(engine.generate(PROMPT, max_new_tokens=NEW, seed=seed).tokens)
        counts[key] = counts.get(key, 0) + 1
    assert _chi_square_p_value(counts, _exact_distribution(model, 1.0), SAMPLES) < ALPHA
