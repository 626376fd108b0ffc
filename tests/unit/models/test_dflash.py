"""DFlash checkpoints: the z-lab layout round-trips, and bad directories fail clearly."""

import json

import pytest
import torch
from safetensors.torch import load_file

from ddtree.drafters import DFlashDrafter
from ddtree.models import DFlashDraftModel, HFTarget
from ddtree.testing import tiny_dflash, tiny_target

ZLAB_KEYS = {"fc.weight", "hidden_norm.weight", "norm.weight"}


def test_round_trip_is_bit_identical_and_in_zlab_layout(tmp_path, tiny_models):
    model = tiny_dflash(tiny_models["qwen3"])
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["dflash_config"] == {"mask_token_id": 95, "target_layer_ids": [1, 2]}
    assert config["block_size"] == 8 and config["num_target_layers"] == 4
    assert config["architectures"] == ["DFlashDraftModel"]
    keys = set(load_file(str(tmp_path / "model.safetensors")))
    assert ZLAB_KEYS <= keys and all(k in ZLAB_KEYS or k.startswith("layers.") for k in keys)
    assert "layers.0.self_attn.q_norm.weight" in keys and "layers.1.mlp.down_proj.weight" in keys

    loaded = DFlashDraftModel.from_pretrained(tmp_path)
    assert loaded.config == model.config
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name


def _write(tmp_path, config):
    (tmp_path / "config.json").write_text(json.dumps(config))


def test_missing_dflash_config_is_a_clear_error(tmp_path, tiny_models):
    tiny_dflash(tiny_models["qwen3"]).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    del config["dflash_config"]
    _write(tmp_path, config)
    with pytest.raises(ValueError, match="no 'dflash_config' section"):
        DFlashDraftModel.from_pretrained(tmp_path)


def test_missing_mask_token_is_a_clear_error(tmp_path, tiny_models):
    tiny_dflash(tiny_models["qwen3"]).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    del config["dflash_config"]["mask_token_id"]
    _write(tmp_path, config)
    with pytest.raises(ValueError, match="mask_token_id is missing"):
        DFlashDraftModel.from_pretrained(tmp_path)


def test_layer_ids_out_of_range_is_a_clear_error(tmp_path, tiny_models):
    tiny_dflash(tiny_models["qwen3"]).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["dflash_config"]["target_layer_ids"] = [1, 7]
    _write(tmp_path, config)
    with pytest.raises(ValueError, match=r"target_layer_ids \[1, 7\] must be .* within 0..3"):
        DFlashDraftModel.from_pretrained(tmp_path)


def test_missing_weights_name_the_keys(tmp_path, tiny_models):
    model = tiny_dflash(tiny_models["qwen3"])
    model.save_pretrained(tmp_path)
    from safetensors.torch import save_file

    state = load_file(str(tmp_path / "model.safetensors"))
    del state["fc.weight"]
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="missing keys \\['fc.weight'\\]"):
        DFlashDraftModel.from_pretrained(tmp_path)


def test_unknown_local_path_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        DFlashDraftModel.from_pretrained(tmp_path / "nope")


def test_mismatched_target_is_refused(tiny_models):
    drafter_model = tiny_dflash(tiny_models["qwen3"])
    other = tiny_target("llama", num_layers=6)
    with pytest.raises(ValueError, match="expects a 4-layer target, this one has 6"):
        DFlashDrafter(drafter_model, HFTarget(other))


def test_mask_token_outside_the_vocabulary_is_refused(tiny_models):
    drafter_model = tiny_dflash(tiny_models["qwen3"], mask_token_id=500)
    with pytest.raises(ValueError, match="mask token id 500 is not in the target's vocabulary"):
        DFlashDrafter(drafter_model, HFTarget(tiny_models["qwen3"]))


def test_the_block_is_the_checkpoints_own_unless_a_shorter_one_is_asked_for(tiny_models):
    target = HFTarget(tiny_models["qwen3"])
    drafter_model = tiny_dflash(tiny_models["qwen3"], block_size=8)
    assert DFlashDrafter(drafter_model, target).block_size == 8
    shorter = DFlashDrafter(drafter_model, target, block_size=4)
    target.set_taps(shorter.hidden_layers)
    shorter.reset(target.prefill(torch.arange(4, 12)))
    assert shorter.block_size == 4 and shorter.draft(7).depth == 3


@pytest.mark.parametrize("block_size", [0, 1, 9, 16])
def test_a_block_the_checkpoint_cannot_run_is_refused(tiny_models, block_size):
    drafter_model = tiny_dflash(tiny_models["qwen3"], block_size=8)
    with pytest.raises(ValueError, match=rf"block_size={block_size} does not fit .* blocks of 8 .* 2 <= block_size <= 8"):
        DFlashDrafter(drafter_model, HFTarget(tiny_models["qwen3"]), block_size=block_size)


def test_folded_attention_equals_expanded_heads(tiny_models):
    """Query heads folded into the query length (masks that do not vary by row) give exactly
    what expanding K/V to every head gives (a row-varying mask forces the expansion)."""
    from ddtree.models.dflash import rope_cos_sin

    attention = tiny_dflash(tiny_models["qwen3"]).layers[0].self_attn
    g = torch.Generator().manual_seed(0)
    x, ctx_k, ctx_v = torch.randn(1, 8, 64, generator=g), torch.randn(1, 2, 20, 16, generator=g), torch.randn(1, 2, 20, 16, generator=g)
    cos, sin = rope_cos_sin(torch.arange(20, 28), 16, 1e6, torch.float32)
    columns = torch.zeros(1, 1, 1, 28)
    columns[..., 3] = torch.finfo(torch.float32).min
    folded = attention(x, ctx_k, ctx_v, cos, sin, columns)
    expanded = attention(x, ctx_k, ctx_v, cos, sin, columns.expand(1, 1, 8, 28).clone())
    torch.testing.assert_close(folded, expanded, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(attention(x, ctx_k, ctx_v, cos, sin), attention(x, ctx_k, ctx_v, cos, sin, torch.zeros(1, 1, 8, 28)))


def test_from_pretrained_loads_a_checkpoint_for_the_target_and_the_engine_has_defaults(tiny_models, tmp_path):
    import torch

    from ddtree import SpeculativeEngine
    from ddtree.drafters import DFlashDrafter
    from ddtree.models import HFTarget
    from ddtree.testing import greedy_reference, tiny_dflash
    from ddtree.trees import BestFirstTreeBuilder

    model = tiny_models["qwen3"]
    tiny_dflash(model, block_size=8).save_pretrained(tmp_path / "drafter")
    target = HFTarget(model)
    drafter = DFlashDrafter.from_pretrained(tmp_path / "drafter", target)
    assert drafter.block_size == 8 and drafter.dtype == target.dtype
    engine = SpeculativeEngine(target, drafter, BestFirstTreeBuilder(16))  # dense masks, greedy verify
    prompt = torch.arange(4, 14)
    assert engine.generate(prompt, max_new_tokens=12).tokens == greedy_reference(model, prompt, 12)
