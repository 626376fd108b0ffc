"""T > 0: the distribution of the first generated tokens is the target's own.

A tiny target with a 4-token vocabulary has 64 possible 3-token continuations; their exact
probabilities under the target are enumerated, and a chi-square goodness-of-fit test compares
them with the continuations each strategy produces over many seeds. The seeds are fixed, so the
test is deterministic; for a correct sampler its false-alarm rate is ALPHA per strategy.
"""

import pytest
import torch

from ddtree import SpeculativeEngine
from ddtree.drafters import DFlashDrafter, NullDrafter, OracleDrafter
from ddtree.masks import DenseMaskCompiler, TreeMaskCompiler
from ddtree.models import HFTarget
from ddtree.testing import (CHECK_ALPHA, CHECK_NEW, CHECK_PROMPT, CHECK_VOCAB, chi_square_p_value,
                            continuation_distribution, sample_continuations, tiny_dflash, tiny_target)
from ddtree.trees import BestFirstTreeBuilder, CalibratedTreeBuilder, ChainTreeBuilder
from ddtree.verifiers import SamplingVerifier

VOCAB, NEW, ALPHA, PROMPT, SAMPLES = CHECK_VOCAB, CHECK_NEW, CHECK_ALPHA, CHECK_PROMPT, 1200


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
        "ddtree-oracle-beam": (OracleDrafter(model, depth=3, sharpness=2.0), BestFirstTreeBuilder(6, method="beam")),
        "calibrated-oracle": (OracleDrafter(model, depth=3, sharpness=2.0), CalibratedTreeBuilder(6, [0.5, 2.0])),
    }


@pytest.mark.parametrize(
    "name, temperature, mask",
    [("ar", 1.0, "dense"), ("dflash-random", 1.0, "dense"), ("dflash-oracle", 1.0, "dense"),
     ("ddtree-oracle", 1.0, "dense"), ("ddtree-oracle", 0.6, "dense"), ("ddtree-oracle-beam", 1.0, "dense"),
     ("calibrated-oracle", 1.0, "dense"), ("ddtree-oracle", 1.0, "tree")],
)
def test_first_tokens_follow_the_target_distribution(small_vocab_model, name, temperature, mask):
    model = small_vocab_model
    target = HFTarget(model)
    drafter, tree = _strategies(model, target)[name]
    masks = {"dense": DenseMaskCompiler, "tree": TreeMaskCompiler}[mask]()  # tree: the [n, n] block, expanded by the target
    engine = SpeculativeEngine(target, drafter, tree, masks, SamplingVerifier(temperature))
    counts, accepted = sample_continuations(engine, PROMPT, NEW, SAMPLES)
    p_value = chi_square_p_value(counts, continuation_distribution(model, PROMPT, NEW, temperature), SAMPLES)
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
    counts, _ = sample_continuations(engine, PROMPT, NEW, SAMPLES)
    assert chi_square_p_value(counts, continuation_distribution(model, PROMPT, NEW, 1.0), SAMPLES) < ALPHA
