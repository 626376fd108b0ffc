"""The pair directory: every part reloads through the decoding side with identical outputs."""

import json
from pathlib import Path

import pytest
import torch

from ddtree.drafters import DFlashDrafter
from ddtree.drafters.mtp import MTPDrafter
from ddtree.models import DFlashDraftModel, target_for
from ddtree.models.mtp import MTPHead
from ddtree.training.pair import load_pair, mtp_location, render_card, save_pair, tiny_pair

SHIPPED = Path(__file__).resolve().parents[3] / "assets" / "pair"


def _drafts(model, dflash, mtp, prompt):
    """Target logits, one DFlash draft and one MTP draft after ``prompt``."""
    target = target_for(model, fast=False)  # HybridTarget for a Qwen3.5 hybrid
    out = {}
    for name, drafter in (("dflash", DFlashDrafter(dflash, target)), ("mtp", MTPDrafter(mtp, target, 3))):
        target.set_taps(drafter.hidden_layers)
        prefill = target.prefill(prompt)
        drafter.reset(prefill)
        out[name] = drafter.draft(int(prefill.logits[-1].argmax())).log_probs
        out["logits"] = prefill.logits
    return out


@pytest.mark.parametrize("hybrid", [False, True], ids=["qwen3", "qwen35-hybrid"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_saved_pair_reloads_with_identical_outputs(tmp_path, dtype, hybrid):
    pair = load_pair(tiny_pair(tmp_path / "a", hybrid=hybrid), dtype=dtype)
    save_pair(tmp_path / "b", pair.target, pair.tokenizer, pair.dflash, pair.mtp, pair.prompts, metrics={},
              mtp_in_target=hybrid)
    again = load_pair(tmp_path / "b")
    assert again.target.dtype == dtype and next(again.dflash.parameters()).dtype == dtype
    assert next(again.mtp.parameters()).dtype == dtype
    prompt = torch.tensor(pair.tokenizer.encode(pair.prompts[0]["text"]))
    before = _drafts(pair.target, pair.dflash, pair.mtp, prompt)
    after = _drafts(again.target, again.dflash, again.mtp, prompt)
    for key in before:
        assert torch.equal(before[key], after[key]), key
    # The parts load with the decoding side's own loaders, unchanged.
    assert isinstance(DFlashDraftModel.from_pretrained(tmp_path / "b" / "dflash"), DFlashDraftModel)
    assert mtp_location(tmp_path / "b") == tmp_path / "b" / ("target" if hybrid else "mtp")
    assert isinstance(MTPHead.from_pretrained(mtp_location(tmp_path / "b")), MTPHead)
    assert (tmp_path / "b" / "mtp").exists() != hybrid
    assert again.prompts == pair.prompts and again.tokenizer.mask_token_id == pair.dflash.config.mask_token_id


def test_missing_drafters_are_none_and_a_bad_path_is_clear(tmp_path):
    pair = load_pair(tiny_pair(tmp_path / "a"))
    save_pair(tmp_path / "b", pair.target, pair.tokenizer)
    assert load_pair(tmp_path / "b").dflash is None and load_pair(tmp_path / "b").mtp is None
    with pytest.raises(FileNotFoundError, match="not a model pair directory"):
        load_pair(tmp_path / "nothing")


def test_card_is_rendered_from_measured_values():
    metrics = {
        "corpus": {"source": "CPython 3.11.7 Lib/", "train_files": 584, "heldout_files": 24, "train_tokens": 2448569,
                   "heldout_tokens": 69695},
        "tokenizer": {"vocab_size": 8192},
        "target": {"parameters": 12588672, "steps": 2000, "seconds": 150.5, "final_loss": 1.234, "heldout_perplexity": 7.89,
                   "layers": 6, "hidden_size": 384, "seq_len": 512, "best_step": 1800},
        "regenerate": {"sequences": 4096, "prompt_tokens": 64, "new_tokens": 320, "temperatures": [0.0, 0.0, 0.0, 1.0],
                       "sequences_per_temperature": {"0.0": 3072, "1.0": 1024}, "prompts": 4096, "docstring_prompts": 2048},
        "dflash": {"parameters": 3590656, "steps": 4000, "seconds": 110.0, "final_loss": 2.5, "block_size": 16,
                   "layers": 2, "taps": [1, 2, 3]},
        "mtp": {"parameters": 1869824, "steps": 900, "seconds": 45.0, "final_loss": 1.9, "depth": 3},
        "tau": [{"strategy": "dflash", "temperature": 0.0, "tau": 4.321}, {"strategy": "dflash", "temperature": 1.0, "tau": 3.2}],
        "tau_setup": {"prompts": 8, "max_new_tokens": 128}, "weight_megabytes": 35.9, "weight_dtype": "bfloat16", "wall_seconds": 420.0,
        "train_seconds": 380.0, "evaluate_seconds": 40.0,
        "environment": {"device": "NVIDIA H200", "torch": "2.11.0", "transformers": "5.17.0"},
        "evaluate_environment": {"device": "CPU", "torch": "2.13.0", "transformers": "5.24.0"},
    }
    card = render_card(metrics)
    for text in ("7.89", "| dflash | 4.32 | 3.20 |", "12588672", "2448569", "NVIDIA H200", "35.90 MB of bfloat16", "block 16",
                 "3072 at T = 0.0, 1024 at T = 1.0", "2048 of the 4096 prompts end just after a function's docstring",
                 "Training wall time 380.0 s on NVIDIA H200", "evaluation 40.0 s on CPU", "new tokens, CPU:"):
        assert text in card, text
    assert "n/a" not in card
    json.dumps(metrics)


def test_card_names_each_stage_device_when_the_stages_ran_on_different_ones():
    # A continued build keeps the target's stage record (its device) and trains the drafters elsewhere.
    h200, h100 = {"device": "NVIDIA H200"}, {"device": "NVIDIA H100 80GB HBM3"}
    metrics = {"target": {"environment": h200}, "regenerate": {"environment": h100}, "dflash": {"environment": h100},
               "mtp": {"environment": h100}, "train_seconds": 588.5, "environment": h200}
    assert "Training wall time 588.5 s on NVIDIA H200 (target), NVIDIA H100 80GB HBM3 (regenerate, dflash, mtp)" \
        in render_card(metrics)
    same = {**metrics, "regenerate": {"environment": h200}, "dflash": {}, "mtp": {"environment": h200}}
    assert "Training wall time 588.5 s on NVIDIA H200 (torch" in render_card(same)


@pytest.mark.skipif(not (SHIPPED / "metrics.json").is_file(), reason="no shipped pair")
def test_the_shipped_card_still_renders_from_its_metrics():
    # The committed metrics.json came from the evaluate stage before it ran through
    # ddtree.presets.run_comparison; its rows have the shape that stage still writes.
    metrics = json.loads((SHIPPED / "metrics.json").read_text())
    card = render_card(metrics)
    assert "n/a" not in card
    for name in ("ar", "mtp", "dflash", "ddtree-16", "ddtree-32", "ddtree-64"):
        tau = {row["temperature"]: row["tau"] for row in metrics["tau"] if row["strategy"] == name}
        assert f"| {name} | {tau[0.0]:.2f} | {tau[1.0]:.2f} |" in card


@pytest.mark.parametrize("name", ["pair", "pair_hybrid"])
def test_each_committed_card_is_its_metrics_rendered(name):
    path = SHIPPED.parent / name
    assert (path / "README.md").read_text() == render_card(json.loads((path / "metrics.json").read_text()))
