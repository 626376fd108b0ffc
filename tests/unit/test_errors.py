"""Bad input gets a clear error naming what was wrong and what to do."""

from pathlib import Path

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


PAIR = Path(__file__).resolve().parents[2] / "assets" / "pair"


def test_a_tokenizer_larger_than_the_model_vocabulary_is_refused_naming_both(engine):
    from ddtree.eval import build_engine
    from ddtree.models.hub import load_tokenizer

    tokenizer = load_tokenizer(PAIR / "tokenizer")  # 8192 tokens; the tiny target has fewer rows
    parts = NullDrafter(), ChainTreeBuilder(), DenseMaskCompiler(), GreedyVerifier()
    with pytest.raises(ValueError, match=rf"tokenizer \({PAIR / 'tokenizer'}\) has 8192 tokens but the target model "
                                         rf"\(.*\) has a vocabulary of {engine.target.vocab_size}"):
        build_engine(engine.target, *parts, tokenizer=tokenizer)


def test_a_model_vocabulary_padded_beyond_the_tokenizer_is_fine(engine):
    from ddtree.models.hub import check_vocabularies

    class Small:
        name_or_path = "small"

        def __len__(self):
            return engine.target.vocab_size - 7

    check_vocabularies(Small(), engine.target)


def test_a_target_directory_without_a_tokenizer_points_at_the_pair_tokenizer():
    from ddtree.models.hub import load_tokenizer

    with pytest.raises(FileNotFoundError, match=rf"holds no tokenizer.*name_or_path={PAIR / 'tokenizer'}"):
        load_tokenizer(PAIR / "target")


def test_a_truncated_checkpoint_is_named(tmp_path):
    from ddtree.models.loading import check_safetensors

    (tmp_path / "model.safetensors").write_bytes((PAIR / "mtp" / "model.safetensors").read_bytes()[:-10])
    with pytest.raises(ValueError, match=rf"{tmp_path / 'model.safetensors'} is not a readable safetensors file"):
        check_safetensors(tmp_path)


def test_one_line_keeps_bugs_out():
    from ddtree.errors import one_line

    assert one_line(ValueError("bad knob\nsecond line")) == "bad knob; second line"
    assert one_line(TypeError("a bug")) is None  # a bug keeps its traceback
