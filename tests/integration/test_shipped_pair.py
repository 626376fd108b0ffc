"""The shipped pairs load, decode greedily what their targets decode, and still accept well.

A small guard on the committed weights (the main job's full tables are ``experiments/main.py``):
one held-out prompt, 48 tokens, fp32 on the CPU, for the Qwen3 pair and the Qwen3.5-layout hybrid
pair (whose MTP layer is read from the target's own checkpoint).
"""

from pathlib import Path

import pytest
import torch

from ddtree import SpeculativeEngine
from ddtree.drafters import DFlashDrafter, NullDrafter
from ddtree.drafters.mtp import MTPDrafter
from ddtree.masks import DenseMaskCompiler
from ddtree.models import target_for
from ddtree.testing import greedy_reference
from ddtree.training.dflash import anchor_acceptance, walk_rounds
from ddtree.training.pair import load_pair, mtp_location
from ddtree.training.sequences import SequenceSet
from ddtree.trees import BestFirstTreeBuilder, ChainTreeBuilder
from ddtree.verifiers import GreedyVerifier

ASSETS = Path(__file__).resolve().parents[2] / "assets"
PAIRS = [pytest.param(ASSETS / name, id=name, marks=pytest.mark.skipif(
    not (ASSETS / name / "target" / "config.json").is_file(), reason=f"no assets/{name}")) for name in ("pair", "pair_hybrid")]


@pytest.mark.parametrize("path", PAIRS)
def test_shipped_pair_is_lossless_and_accepts_more_than_one_token(path):
    pair = load_pair(path, dtype=torch.float32)
    target = target_for(pair.target, fast=False)  # HybridTarget for the hybrid pair
    prompt = pair.tokenizer.encode(pair.prompts[0]["text"])
    parts = {"ar": (NullDrafter(), ChainTreeBuilder()), "mtp": (MTPDrafter(pair.mtp, target, 3), ChainTreeBuilder()),
             "dflash": (DFlashDrafter(pair.dflash, target), ChainTreeBuilder()),
             "ddtree-64": (DFlashDrafter(pair.dflash, target), BestFirstTreeBuilder(64))}
    eos = pair.tokenizer.eos_token_id
    results = {name: SpeculativeEngine(target, drafter, tree, DenseMaskCompiler(), GreedyVerifier(), (eos,)).generate(
        prompt, max_new_tokens=48) for name, (drafter, tree) in parts.items()}
    reference = greedy_reference(pair.target, torch.tensor(prompt), 48, eos)
    for name, result in results.items():
        assert result.tokens == reference, name
    # Far below what the pairs measure (README), far above a broken drafter's 1.0.
    assert results["mtp"].mean_acceptance > 1.5 and results["dflash"].mean_acceptance > 1.5
    assert results["ddtree-64"].mean_acceptance > results["dflash"].mean_acceptance
    # The training side's decode tau walks the same rounds off one teacher-forced forward.
    response = SequenceSet.from_tokens(torch.tensor([prompt + reference]), len(prompt))
    assert walk_rounds(anchor_acceptance(pair.dflash, pair.target, response)[0]) == results["dflash"].acceptance_lengths
    if path.name == "pair_hybrid":
        assert type(target).__name__ == "HybridTarget" and mtp_location(path) == path / "target"
