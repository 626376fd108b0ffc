"""ddtree.load and the presets: a strategy is one YAML in configs/experiment/, built the same way
for Python users as for the entry points."""

import shutil

import pytest
import torch

import ddtree
from ddtree import presets


@pytest.fixture(scope="module")
def ar():
    return ddtree.load("ar")  # the shipped pair


def test_the_strategies_are_the_presets_that_name_one():
    assert {"ar", "mtp", "dflash", "ddtree", "mtp_tree"} <= set(presets.strategy_names())
    assert "paper_qwen3_8b" not in presets.strategy_names()  # a model pair, not a strategy


def test_every_strategy_loads_on_the_shipped_pair_and_decodes_the_greedy_text(ar):
    reference = ar.generate("def fibonacci(n):\n", max_new_tokens=32).tokens
    for name, budget in (("mtp", None), ("dflash", None), ("ddtree", 16), ("mtp_tree", 8)):
        engine = ddtree.load(name, target=ar.target, budget=budget)
        assert engine.target is ar.target and engine.tokenizer is not None
        result = engine.generate("def fibonacci(n):\n", max_new_tokens=32)
        assert result.tokens == reference, name
        assert name == "mtp_tree" or result.mean_acceptance > 1.5, name


def test_generate_takes_what_a_tokenizer_returns(ar):
    text = "import os\n"
    want = ar.generate(text, max_new_tokens=8).tokens
    encoded = ar.tokenizer(text, return_tensors="pt")  # a BatchEncoding of [1, T] tensors
    assert ar.generate(encoded, max_new_tokens=8).tokens == want
    assert ar.generate(dict(encoded), max_new_tokens=8).tokens == want
    assert ar.generate(encoded["input_ids"][0].tolist(), max_new_tokens=8).tokens == want
    with pytest.raises(ValueError, match="input_ids"):
        ar.generate({"ids": [1, 2]}, max_new_tokens=8)


def test_bad_names_and_knobs_say_what_to_do(ar):
    with pytest.raises(ValueError, match="unknown strategy 'nope'.*ar, ddtree"):
        ddtree.load("nope")
    with pytest.raises(ValueError, match="budget=4 applies to tree strategies"):
        ddtree.load("dflash", target=ar.target, budget=4)
    no_tokenizer = ddtree.load("ar", target=ar.target.model, tokenizer=None)
    with pytest.raises(ValueError, match="needs a tokenizer"):
        no_tokenizer.generate("def f():", max_new_tokens=4)


def test_a_new_strategy_is_one_yaml(tmp_path, monkeypatch, ar):
    configs = tmp_path / "configs"
    shutil.copytree(presets.config_dir(), configs)
    (configs / "experiment" / "ddtree_sharp.yaml").write_text(
        "# @package _global_\ndefaults:\n  - override /drafter: dflash\n  - override /tree: best_first\n"
        "strategy: ddtree_sharp\ntree:\n  draft_temperature: 0.5\n")
    monkeypatch.setenv(presets.CONFIG_ENV, str(configs))
    assert "ddtree_sharp" in presets.strategy_names()
    engine = ddtree.load("ddtree_sharp", target=ar.target, budget=16)
    assert engine.tree_builder.draft_temperature == 0.5
    assert engine.generate("x = 1\n", max_new_tokens=16).tokens == ar.generate("x = 1\n", max_new_tokens=16).tokens


def test_a_loaded_model_serves_as_the_target():
    from ddtree.testing import tiny_target

    model = tiny_target("qwen3")
    engine = ddtree.load("ar", target=model, fast=False)
    prompt = torch.arange(4, 12)
    from ddtree.testing import greedy_reference

    assert engine.generate(prompt, max_new_tokens=8).tokens == greedy_reference(model, prompt, 8)


def test_a_loaded_drafter_network_is_taken_as_it_is(ar):
    from ddtree.models import DFlashDraftModel

    network = DFlashDraftModel.from_pretrained(presets.REPO / "assets" / "pair" / "dflash", dtype=ar.target.dtype)
    engine = ddtree.load("dflash", target=ar.target, drafter=network)
    assert engine.drafter.model is network
    assert engine.generate("x = 1\n", max_new_tokens=16).tokens == ar.generate("x = 1\n", max_new_tokens=16).tokens


def test_fast_reaches_the_mtp_drafter_as_it_reaches_dflash(ar):
    """``fast`` (and ``engine_from_config(..., cuda_graphs=...)``, as speed.py calls it) gives the
    MTP drafter its static cache: graphed on a GPU, op by op here; auto keeps it eager off the GPU."""
    reference = ar.generate("x = 1\n", max_new_tokens=16).tokens
    static = ddtree.load("mtp", target=ar.target, fast=True)
    assert static.drafter._chain is not None and not static.drafter.cuda_graphs
    assert static.generate("x = 1\n", max_new_tokens=16).tokens == reference
    assert ddtree.load("mtp", target=ar.target).drafter._chain is None
    engine = presets.engine_from_config(presets.compose("mtp", [*ar.target.preset_overrides, "fast=false"]), ar.target, cuda_graphs=True,
                                        max_length=64)
    assert engine.drafter._chain.max_length == 64
