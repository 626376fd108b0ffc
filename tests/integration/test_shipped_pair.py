"""The shipped pair loads, decodes greedily what its target decodes, and still accepts well.

A small guard on the committed weights (the main job's full table is ``experiments/main.py``):
one held-out prompt, 48 tokens, fp32 on the CPU.
"""

from pathlib import Path

import pytest
import torch

from ddtree import SpeculativeEngine
from ddtree.drafters import DFlashDrafter, NullDrafter
from ddtree.drafters.mtp import MTPDrafter
from ddtree.masks import DenseMaskCompiler
from ddtree.models import HFTarget
from ddtree.training.pair import load_pair
from ddtree.trees import BestFirstTreeBuilder, ChainTreeBuilder
from ddtree.verifiers import GreedyVerifier

PAIR = Path(__file__).resolve().parents[2] / "assets" / "pair"
pytestmark = pytest.mark.skipif(not (PAIR / "target" / "config.json").is_file(), reason="no shipped pair")


def test_shipped_pair_is_lossless_and_accepts_more_than_one_token():
    pair = load_pair(PAIR, dtype=torch.float32)
    target = HFTarget(pair.target)
    prompt = pair.tokenizer.encode(pair.prompts[0]["text"])
    parts = {"ar": (NullDrafter(), ChainTreeBuilder()), "mtp": (MTPDrafter(pair.mtp, target, 3), ChainTreeBuilder()),
             "dflash": (DFlashDrafter(pair.dflash, target), ChainTreeBuilder()),
             "ddtree-64": (DFlashDrafter(pair.dflash, target), BestFirstTreeBuilder(64))}
    results = {name: SpeculativeEngine(target, drafter, tree, DenseMaskCompiler(), GreedyVerifier()).generate(
        prompt, max_new_tokens=48) for name, (drafter, tree) in parts.items()}
    for name, result in results.items():
        assert result.tokens == results["ar"].tokens, name
    # Far below what the pair measures (README), far above a broken drafter's 1.0.
    assert results["mtp"].mean_acceptance > 1.5 and results["dflash"].mean_acceptance > 1.5
    assert results["ddtree-64"].mean_acceptance > results["dflash"].mean_acceptance
