"""Bad input gets a clear error naming what was wrong and what to do."""

import pytest
import torch

from ddtree import ContextLengthError, SpeculativeEngine
from ddtree.drafters import NullDrafter
from ddtree.masks import DenseMaskCompiler
from ddtree.models import HFTarget
from ddtree.trees import BestFirstTreeBuilder, ChainTreeBuilder
from ddtree.verifiers import GreedyVerifier, SamplingVerifier


@pytest.fixture
def engine(tiny_models):
    target = HFTarget(tiny_models["qwen3"])
    return SpeculativeEngine(target, NullDrafter(), ChainTreeBuilder(), DenseMaskCompiler(), GreedyVerifier())


def test_negative_budget():
    with pytest.raises(ValueError, match="tree budget must be a non-negative integer.*got -1"):
        BestFirstTreeBuilder(-1)


def test_negative_temperature():
    with pytest.raises(ValueError, match="temperature must be a number >= 0, got -1"):
        SamplingVerifier(-1.0)


def test_prompt_longer_than_the_context(engine):
    with pytest.raises(ContextLengthError, match="longer than the target's context of 1024 tokens; shorten the prompt"):
        engine.generate(torch.zeros(1020, dtype=torch.long), max_new_tokens=8)


def test_batch_larger_than_one(engine):
    with pytest.raises(ValueError, match="batch size 2 is not supported yet"):
        engine.generate(torch.zeros(2, 5, dtype=torch.long))


def test_empty_prompt_and_bad_max_new_tokens(engine):
    with pytest.raises(ValueError, match="non-empty"):
        engine.generate(torch.zeros(0, dtype=torch.long))
    with pytest.raises(ValueError, match="max_new_tokens must be a positive integer"):
        engine.generate(torch.ones(3, dtype=torch.long), max_new_tokens=0)


def test_token_outside_the_vocabulary(engine):
    with pytest.raises(ValueError, match="outside the target's vocabulary"):
        engine.generate(torch.tensor([1, 2, 500]))
