"""MTP head: the Qwen3.5 ``mtp.*`` checkpoint layout loads with every key consumed, other
namings (DeepSeek-V3, per-expert MoE) map onto the same module, and bad checkpoints fail naming
the key. The forward is checked against its own cache and against each supported family."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import (
    DynamicCache, LlamaConfig, Qwen3_5ForCausalLM, Qwen3_5MoeTextConfig, Qwen3_5TextConfig, Qwen3Config,
    Qwen3NextConfig,
)

from ddtree.drafters import MTPDrafter
from ddtree.models import HFTarget, MTPHead
from ddtree.models.mtp import FAMILIES, causal_mask
from ddtree.testing import tiny_target

TINY = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=256)
GDN = dict(linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4)
MOE = dict(moe_intermediate_size=32, shared_expert_intermediate_size=32, num_experts=4, num_experts_per_tok=2)
CONFIGS = {
    "qwen3": lambda: Qwen3Config(**TINY),
    "llama": lambda: LlamaConfig(**TINY),
    "qwen3_5_text": lambda: Qwen3_5TextConfig(**TINY, **GDN),
    "qwen3_5_moe_text": lambda: Qwen3_5MoeTextConfig(**TINY, **GDN, **MOE),
    "qwen3_next": lambda: Qwen3NextConfig(**TINY, **GDN, **MOE),
}
# The 15 tensors of the Qwen3.6-27B MTP module (reference/hybrid_gdn_mtp.md section 2.1).
QWEN35_KEYS = {
    "mtp.fc.weight", "mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight", "mtp.norm.weight",
    "mtp.layers.0.input_layernorm.weight", "mtp.layers.0.post_attention_layernorm.weight",
    *(f"mtp.layers.0.self_attn.{p}.weight" for p in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm")),
    *(f"mtp.layers.0.mlp.{p}.weight" for p in ("gate_proj", "up_proj", "down_proj")),
}


def _head(config, seed: int = 0) -> MTPHead:
    torch.manual_seed(seed)
    head = MTPHead(config)
    with torch.no_grad():  # norms start at 0 or 1: perturb them so a wrong mapping shows
        for p in head.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return head.eval()


def _assert_same(a: MTPHead, b: MTPHead) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert torch.equal(sa[key], sb[key]), key


def _qwen35_checkpoint(path, head: MTPHead, extra: dict | None = None, drop: str | None = None) -> None:
    """A tiny Qwen3.5 trunk saved by transformers, with the head's tensors added as ``mtp.*``."""
    torch.manual_seed(0)
    Qwen3_5ForCausalLM(head.config).save_pretrained(path)
    state = load_file(str(path / "model.safetensors"))
    state.update({f"mtp.{k}": v.contiguous() for k, v in head.state_dict().items()})
    state.update(extra or {})
    state.pop(drop, None)
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})


@pytest.fixture
def qwen35_head() -> MTPHead:
    return _head(CONFIGS["qwen3_5_text"]())


def test_qwen35_checkpoint_loads_every_key(tmp_path, qwen35_head):
    _qwen35_checkpoint(tmp_path, qwen35_head)
    keys = {k for k in load_file(str(tmp_path / "model.safetensors")) if k.startswith("mtp.")}
    assert keys == QWEN35_KEYS
    loaded = MTPHead.from_pretrained(tmp_path)
    _assert_same(qwen35_head, loaded)
    # Gated full attention: q_proj also produces the output gate.
    assert loaded.layers[0].self_attn.q_proj.weight.shape == (2 * 4 * 16, 64)
    # transformers itself ignores the mtp.* tensors of such a checkpoint (that is why we read them).
    trunk = Qwen3_5ForCausalLM.from_pretrained(tmp_path, use_safetensors=True)
    assert not any(k.startswith("mtp") for k in trunk.state_dict())


def test_sharded_and_nested_text_config(tmp_path, qwen35_head):
    _qwen35_checkpoint(tmp_path, qwen35_head)
    state = load_file(str(tmp_path / "model.safetensors"))
    (tmp_path / "model.safetensors").unlink()
    shards = {"model-00001-of-00002.safetensors": {k: v for k, v in state.items() if not k.startswith("mtp.")},
              "model-00002-of-00002.safetensors": {k: v for k, v in state.items() if k.startswith("mtp.")}}
    for name, part in shards.items():
        save_file(part, str(tmp_path / name), metadata={"format": "pt"})
    weight_map = {k: name for name, part in shards.items() for k in part}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    text = json.loads((tmp_path / "config.json").read_text())
    nested = {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5", "text_config": text}
    (tmp_path / "config.json").write_text(json.dumps(nested))
    loaded = MTPHead.from_pretrained(tmp_path, dtype=torch.float64)
    assert loaded.config.model_type == "qwen3_5_text" and loaded.fc.weight.dtype == torch.float64
    _assert_same(qwen35_head.double(), loaded)


def test_missing_key_is_named(tmp_path, qwen35_head):
    _qwen35_checkpoint(tmp_path, qwen35_head, drop="mtp.layers.0.self_attn.k_norm.weight")
    missing = r"missing keys \['mtp.layers.0.self_attn.k_norm.weight'\], unexpected keys \[\]"
    with pytest.raises(ValueError, match=missing):
        MTPHead.from_pretrained(tmp_path)


def test_extra_key_is_named(tmp_path, qwen35_head):
    _qwen35_checkpoint(tmp_path, qwen35_head, extra={"mtp.layers.0.mlp.extra_proj.weight": torch.zeros(2, 2)})
    extra = r"missing keys \[\], unexpected keys \['mtp.layers.0.mlp.extra_proj.weight'\]"
    with pytest.raises(ValueError, match=extra):
        MTPHead.from_pretrained(tmp_path)


def test_wrong_shape_is_named(tmp_path, qwen35_head):
    _qwen35_checkpoint(tmp_path, qwen35_head, extra={"mtp.fc.weight": torch.zeros(64, 64)})
    with pytest.raises(ValueError, match=r"'mtp.fc.weight' .* shape \(64, 64\), the module expects \(64, 128\)"):
        MTPHead.from_pretrained(tmp_path)


def test_checkpoint_without_mtp_is_a_clear_error(tmp_path):
    tiny_target("qwen3").save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="ships no MTP head"):
        MTPHead.from_pretrained(tmp_path)


def test_round_trip_for_a_trained_head(tmp_path, tiny_models):
    head = _head(tiny_models["qwen3"].config)
    head.save_pretrained(tmp_path)
    assert all(k.startswith("mtp.") for k in load_file(str(tmp_path / "model.safetensors")))
    loaded = MTPHead.from_pretrained(tmp_path)
    assert loaded.config.model_type == "qwen3" and loaded.config.num_hidden_layers == 4
    _assert_same(head, loaded)


def test_a_head_saved_into_its_target_checkpoint_loads_as_a_real_qwen35s(tmp_path, qwen35_head):
    torch.manual_seed(0)
    trunk = Qwen3_5ForCausalLM(qwen35_head.config)
    trunk.save_pretrained(tmp_path)
    qwen35_head.save_into(tmp_path)
    _head(qwen35_head.config, seed=1).save_into(tmp_path)  # a second save replaces the first's tensors
    keys = {k for k in load_file(str(tmp_path / "model.safetensors")) if k.startswith("mtp.")}
    assert keys == QWEN35_KEYS and json.loads((tmp_path / "config.json").read_text())["mtp_num_hidden_layers"] == 1
    _assert_same(_head(qwen35_head.config, seed=1), MTPHead.from_pretrained(tmp_path))
    reloaded = Qwen3_5ForCausalLM.from_pretrained(tmp_path, use_safetensors=True)  # the trunk's tensors are untouched
    for key, value in trunk.state_dict().items():
        assert torch.equal(value, reloaded.state_dict()[key]), key


def test_deepseek_names_map_onto_the_module(tmp_path, tiny_models):
    """``model.layers.{N}.{eh_proj, enorm, hnorm, shared_head.norm, self_attn, mlp, ...}``."""
    head = _head(tiny_models["qwen3"].config)
    renames = {"fc.": "eh_proj.", "pre_fc_norm_embedding.": "enorm.", "pre_fc_norm_hidden.": "hnorm.",
               "norm.": "shared_head.norm.", "layers.0.": ""}
    state = {}
    for key, value in head.state_dict().items():
        old = next(o for o in renames if key.startswith(o))
        state[f"model.layers.4.{renames[old]}{key[len(old):]}"] = value.contiguous()
    state["model.layers.4.embed_tokens.weight"] = torch.zeros(96, 64)  # copies of the target's, not loaded
    state["model.layers.4.shared_head.head.weight"] = torch.zeros(96, 64)
    state["model.layers.3.mlp.up_proj.weight"] = torch.zeros(128, 64)  # a trunk tensor: not MTP
    save_file(state, str(tmp_path / "model.safetensors"))
    head.save_pretrained(tmp_path / "ref")
    (tmp_path / "config.json").write_text((tmp_path / "ref" / "config.json").read_text())
    _assert_same(head, MTPHead.from_pretrained(tmp_path))
    state["model.layers.4.eh_proj.bias"] = torch.zeros(64)  # an extra key is named as the checkpoint has it
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"unexpected keys \['model.layers.4.eh_proj.bias'\]"):
        MTPHead.from_pretrained(tmp_path)


def test_per_expert_moe_weights_are_fused(tmp_path):
    head = _head(CONFIGS["qwen3_5_moe_text"]())
    state = {f"mtp.{k}": v for k, v in head.state_dict().items() if ".experts." not in k}
    experts = head.layers[0].mlp.experts
    inter = experts.down_proj.shape[-1]
    for e in range(experts.gate_up_proj.shape[0]):
        gate, up = experts.gate_up_proj[e].split(inter)
        for name, value in (("gate", gate), ("up", up), ("down", experts.down_proj[e])):
            state[f"mtp.layers.0.mlp.experts.{e}.{name}_proj.weight"] = value.detach().contiguous()
    save_file(state, str(tmp_path / "model.safetensors"))
    head.save_pretrained(tmp_path / "ref")
    (tmp_path / "config.json").write_text((tmp_path / "ref" / "config.json").read_text())
    _assert_same(head, MTPHead.from_pretrained(tmp_path))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_cached_steps_equal_one_pass(family):
    """Row by row through the cache gives the one-pass causal output, for every family."""
    head = _head(CONFIGS[family]())
    embeds, hidden = torch.randn(1, 6, 64), torch.randn(1, 6, 64)
    positions = torch.arange(6)[None]
    with torch.no_grad():
        full = head(embeds, hidden, positions)  # [1, 6, H]
        cache = DynamicCache()
        first = head(embeds[:, :4], hidden[:, :4], positions[:, :4], cache)  # catch-up: 4 rows at once
        rest = [head(embeds[:, i:i + 1], hidden[:, i:i + 1], positions[:, i:i + 1], cache) for i in (4, 5)]
    torch.testing.assert_close(torch.cat([first, *rest], 1), full, atol=1e-5, rtol=1e-5)
    # The concat order matters: [embedding, hidden] (swapping gives another function).
    with torch.no_grad():
        assert not torch.allclose(head(hidden, embeds, positions), full, atol=1e-3)


def test_causal_mask_after_a_cache():
    mask = causal_mask(2, past=3, dtype=torch.float32, device=torch.device("cpu"))
    assert mask.shape == (1, 1, 2, 5)
    assert (mask[0, 0] == 0).tolist() == [[True, True, True, True, False], [True] * 5]


def test_drafter_rejects_a_mismatched_head(tiny_models):
    target = HFTarget(tiny_models["qwen3"])
    wide = MTPHead(Qwen3Config(**{**TINY, "hidden_size": 32, "head_dim": 8}))
    with pytest.raises(ValueError, match="head hidden size 32 != target hidden size 64"):
        MTPDrafter(wide, target)
    other_vocab = MTPHead(Qwen3Config(**{**TINY, "vocab_size": 50}))
    with pytest.raises(ValueError, match="head vocabulary 50 != target vocabulary 96"):
        MTPDrafter(other_vocab, target)
    with pytest.raises(ValueError, match="steps must be a non-negative integer"):
        MTPDrafter(MTPHead.for_target(tiny_models["qwen3"]), target, steps=-1)
    with pytest.raises(ValueError, match="top_k must be a positive integer"):
        MTPDrafter(MTPHead.for_target(tiny_models["qwen3"]), target, top_k=0)


def test_for_target_is_seeded_and_leaves_the_global_rng(tiny_models):
    state = torch.random.get_rng_state()
    a, b = MTPHead.for_target(tiny_models["qwen3"], seed=3), MTPHead.for_target(tiny_models["qwen3"], seed=3)
    assert torch.equal(torch.random.get_rng_state(), state)
    _assert_same(a, b)
