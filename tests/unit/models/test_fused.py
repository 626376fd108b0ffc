"""The fused norm / MLP / rotary functions are the stock math, and ``fused_ops`` leaves no trace."""

import functools
import inspect
import math
import types

import pytest
import torch
from torch import nn
from transformers import DynamicCache
from transformers.activations import ACT2FN
from transformers.models.llama import modeling_llama
from transformers.models.qwen3 import modeling_qwen3
from transformers.models.qwen3_5 import modeling_qwen3_5

from ddtree.models import fused
from ddtree.models.fused import compiled, fused_ops, rms_norm, rotary, silu_mul
from ddtree.testing import tiny_target

MODELING = {"qwen3": modeling_qwen3, "llama": modeling_llama}
PREFIX = {"qwen3": "Qwen3", "llama": "Llama"}
ORIGINAL_ROTARY = {name: mod.apply_rotary_pos_emb for name, mod in MODELING.items()}


def _ids(seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 96, (2, 11), generator=torch.Generator().manual_seed(seed))


def _expected_count(model, family: str) -> int:
    layers = model.config.num_hidden_layers
    norms_per_layer = 4 if family == "qwen3" else 2  # Qwen3 adds q_norm and k_norm
    return layers * norms_per_layer + 1 + layers      # + final norm, + one MLP per layer


def _attention(model) -> list:
    return [m for m in model.modules() if type(m).__name__.endswith("Attention")]


def _rotary_of(attention) -> object:
    """The ``apply_rotary_pos_emb`` an attention module's forward reads now."""
    return inspect.unwrap(attention.forward).__globals__["apply_rotary_pos_emb"]


def _assert_stock(model) -> None:
    assert not [name for name, m in model.named_modules() if "forward" in m.__dict__]
    for name, mod in MODELING.items():
        assert mod.apply_rotary_pos_emb is ORIGINAL_ROTARY[name]
    assert not fused._PATCHES


@torch.no_grad()
def test_fused_forward_is_bitwise_the_stock_one(tiny_models, family):
    model = tiny_models[family]
    ref = model(_ids()).logits
    with fused_ops(model, compile=False) as count:
        assert MODELING[family].apply_rotary_pos_emb is ORIGINAL_ROTARY[family]  # no module global changes
        assert all(_rotary_of(m) is rotary for m in _attention(model))
        out = model(_ids()).logits
    assert count == _expected_count(model, family) > 0
    assert torch.equal(out, ref)
    _assert_stock(model)
    assert torch.equal(model(_ids()).logits, ref)


@torch.no_grad()
def test_the_fused_functions_are_the_ones_called(tiny_models, family, monkeypatch):
    model, calls = tiny_models[family], {"rms_norm": 0, "silu_mul": 0, "rotary": 0}

    def spy(name, fn):
        def wrapped(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return wrapped

    for name in calls:
        monkeypatch.setattr(fused, name, spy(name, getattr(fused, name)))
    with fused_ops(model, compile=False) as count:
        model(_ids())
    layers = model.config.num_hidden_layers
    assert calls == {"rms_norm": count - layers, "silu_mul": layers, "rotary": layers}


def test_attention_reads_the_rotary_as_a_module_global(family):
    mod = MODELING[family]
    forward = inspect.unwrap(getattr(mod, f"{PREFIX[family]}Attention").forward)
    assert "apply_rotary_pos_emb" in forward.__code__.co_names and forward.__globals__ is vars(mod)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_plain_functions_equal_the_hf_modules_bitwise(tiny_models, family, dtype):
    mod, prefix, config = MODELING[family], PREFIX[family], tiny_models[family].config
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        norm = getattr(mod, f"{prefix}RMSNorm")(64, eps=1e-5).to(dtype)
        norm.weight.copy_(torch.randn(64, generator=g) * 0.5 + 1)
        mlp = getattr(mod, f"{prefix}MLP")(config).to(dtype)
        x = (torch.randn(3, 7, 64, generator=g) * 3).to(dtype)
        assert torch.equal(rms_norm(x, norm.weight, norm.variance_epsilon), norm(x))

        gate, up = torch.randn(2, 3, 128, generator=g).to(dtype), torch.randn(2, 3, 128, generator=g).to(dtype)
        assert torch.equal(silu_mul(gate, up), ACT2FN["silu"](gate) * up)
        assert torch.equal(mlp.down_proj(silu_mul(mlp.gate_proj(x), mlp.up_proj(x))), mlp(x))

        rope = getattr(mod, f"{prefix}RotaryEmbedding")(config)
        positions = torch.arange(5)[None].expand(2, -1) + torch.tensor([[0], [9]])
        cos, sin = rope(x, positions)  # [2, 5, 16], cast to dtype like the model's
        q, k = torch.randn(2, 4, 5, 16, generator=g).to(dtype), torch.randn(2, 2, 5, 16, generator=g).to(dtype)
        for got, want in zip(rotary(q, k, cos, sin), mod.apply_rotary_pos_emb(q, k, cos, sin)):
            assert torch.equal(got, want)
        qt, kt = q.transpose(1, 2), k.transpose(1, 2)  # [b, s, h, d] with unsqueeze_dim=2
        for got, want in zip(rotary(qt, kt, cos, sin, unsqueeze_dim=2),
                             mod.apply_rotary_pos_emb(qt, kt, cos, sin, unsqueeze_dim=2)):
            assert torch.equal(got, want)


def test_everything_is_restored_after_an_exception(tiny_models, family):
    model = tiny_models[family]
    with pytest.raises(RuntimeError, match="boom"):
        with fused_ops(model, compile=False):
            raise RuntimeError("boom")
    _assert_stock(model)


def test_a_preexisting_instance_forward_comes_back(tiny_models):
    model = tiny_models["qwen3"]
    norm = model.model.norm
    own = norm.forward.__func__.__get__(norm)  # what ``kernels.kernelize`` leaves: a bound instance forward
    norm.forward = own
    try:
        with fused_ops(model, compile=False):
            assert norm.__dict__["forward"] is not own
        assert norm.__dict__["forward"] is own
    finally:
        del norm.forward
    _assert_stock(model)


@torch.no_grad()
def test_nested_and_interleaved_contexts_restore(tiny_models):
    model, other = tiny_models["qwen3"], tiny_target("qwen3", num_layers=2, seed=1)
    ref = model(_ids()).logits
    with fused_ops(model, compile=False) as outer:
        with fused_ops(model, compile=False) as inner:
            assert inner == outer
        assert "forward" in model.model.norm.__dict__ and all(_rotary_of(m) is rotary for m in _attention(model))
        assert torch.equal(model(_ids()).logits, ref)
    _assert_stock(model)
    # Two models of one family: the first to leave must not unpatch the other.
    a, b = fused_ops(model, compile=False), fused_ops(other, compile=False)
    a.__enter__()
    b.__enter__()
    a.__exit__(None, None, None)
    assert all(_rotary_of(m) is rotary for m in _attention(other)) and "forward" in other.model.norm.__dict__
    assert "forward" not in model.model.norm.__dict__ and not [m for m in _attention(model) if "forward" in vars(m)]
    b.__exit__(None, None, None)
    _assert_stock(model)
    _assert_stock(other)


def test_other_classes_are_left_alone(tiny_models):
    class ScaledNorm(modeling_qwen3.Qwen3RMSNorm):  # a subclass may change the formula
        def forward(self, hidden_states):
            return 2 * super().forward(hidden_states)

    config = modeling_qwen3.Qwen3Config(hidden_size=64, intermediate_size=128, hidden_act="gelu")
    box = nn.ModuleList([modeling_qwen3.Qwen3RMSNorm(64), ScaledNorm(64), modeling_qwen3.Qwen3MLP(config)])
    with fused_ops(box, compile=False) as count:
        assert count == 1 and "forward" in box[0].__dict__
        assert "forward" not in box[1].__dict__ and "forward" not in box[2].__dict__  # gelu MLP: not SiLU
        assert modeling_qwen3.apply_rotary_pos_emb is ORIGINAL_ROTARY["qwen3"]  # no Qwen3 attention in it
    _assert_stock(box)


@torch.no_grad()
def test_a_hybrid_gets_the_twins_of_its_own_norms(tiny_models):
    model = tiny_models["qwen35"]  # Qwen3.5 norms are ``(1 + weight)`` and gated: formulas of their own
    ref = model(_ids()).logits
    kinds = ("Qwen3_5RMSNorm", "Qwen3_5RMSNormGated", "Qwen3_5MLP")
    expected = sum(type(m).__name__ in kinds for m in model.modules())
    with fused_ops(model, compile=False) as count:
        assert count == expected > 0
        patched = {type(m).__name__ for m in model.modules() if "forward" in m.__dict__}
        assert patched == {*kinds, "Qwen3_5Attention"}  # the attention: its partial rotary's twin
        assert all(_rotary_of(m) is fused.rotary_partial for m in model.modules()
                   if type(m).__name__ == "Qwen3_5Attention")
        assert torch.equal(model(_ids()).logits, ref)
    _assert_stock(model)
    assert _rotary_of(next(m for m in model.modules() if type(m).__name__ == "Qwen3_5Attention")) is \
        modeling_qwen3_5.apply_rotary_pos_emb


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_partial_rotary_is_qwen35s_bitwise(dtype):
    """``rotary_partial`` against Qwen3.5's own ``apply_rotary_pos_emb``: a quarter, half and all of a head rotated."""
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 4, 5, 16, generator=g).to(dtype) for _ in range(2))
    for d in (4, 8, 16):
        cos, sin = (torch.randn(1, 5, d, generator=g).to(dtype) for _ in range(2))
        for got, want in zip(fused.rotary_partial(q, k, cos, sin), modeling_qwen3_5.apply_rotary_pos_emb(q, k, cos, sin)):
            assert torch.equal(got, want)


@torch.no_grad()
def test_the_hybrid_attention_calls_the_partial_rotary_once_a_layer(tiny_models, monkeypatch):
    model, calls = tiny_models["qwen35"], []
    plain = fused.rotary_partial
    monkeypatch.setattr(fused, "rotary_partial", lambda *args, **kwargs: calls.append(1) or plain(*args, **kwargs))
    with fused_ops(model, compile=False):
        model(_ids())
    assert len(calls) == sum(type(m).__name__ == "Qwen3_5Attention" for m in model.modules()) > 0


# A cold Inductor compile of even rms_norm takes ~45 s on the 2-core CPU machine (8 s warm).
@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch.compile is too slow on CPU for a unit test")
def test_compiled_rms_norm_matches_the_plain_one():
    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(3, 7, 64, generator=g).cuda(), torch.randn(64, generator=g).cuda()
    torch.testing.assert_close(compiled(rms_norm)(x, w, 1e-6), rms_norm(x, w, 1e-6))
    assert compiled(rms_norm) is compiled(rms_norm)


@torch.no_grad()
def test_an_older_rotary_signature_is_adapted_and_an_unknown_one_left(tiny_models, monkeypatch):
    model, calls = tiny_models["qwen3"], []
    attention = _attention(model)[0]

    def with_position_ids(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):  # the 5.x-before-removal form
        calls.append(position_ids)
        return ORIGINAL_ROTARY["qwen3"](q, k, cos, sin, unsqueeze_dim)

    def unknown(q, k, cos, sin, scale):
        raise AssertionError("never called")

    monkeypatch.setattr(modeling_qwen3, "apply_rotary_pos_emb", with_position_ids)
    ref = model(_ids()).logits
    calls.clear()
    with fused_ops(model, compile=False):
        adapted = _rotary_of(attention)
        assert adapted is not with_position_ids and list(inspect.signature(adapted).parameters)[4] == "position_ids"
        assert torch.equal(model(_ids()).logits, ref) and not calls
        assert modeling_qwen3.apply_rotary_pos_emb is with_position_ids
    monkeypatch.setattr(modeling_qwen3, "apply_rotary_pos_emb", unknown)
    with fused_ops(model, compile=False):
        assert "forward" not in vars(attention) and _rotary_of(attention) is unknown
    assert not fused._PATCHES


@torch.no_grad()
def test_another_model_of_the_family_keeps_the_stock_rotary(tiny_models, family, monkeypatch):
    model, other = tiny_models[family], tiny_target(family, num_layers=2, seed=1)
    calls = []
    monkeypatch.setattr(fused, "rotary", lambda *args, **kwargs: calls.append(1) or rotary(*args, **kwargs))
    ref = other(_ids()).logits
    with fused_ops(model, compile=False):
        assert MODELING[family].apply_rotary_pos_emb is ORIGINAL_ROTARY[family]
        assert torch.equal(other(_ids()).logits, ref) and not calls  # the stock rotary, not the fused one
        assert not [name for name, m in other.named_modules() if "forward" in m.__dict__]
        model(_ids())
        assert len(calls) == model.config.num_hidden_layers  # while this model's attention uses it
    _assert_stock(model)


@torch.no_grad()
def test_a_cached_decode_inside_the_context_is_bitwise_the_stock_one(tiny_models, family):
    model, ids = tiny_models[family], _ids()[:1]
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"  # 5.24 / 5.17

    def two_steps():
        cache = {name: DynamicCache(config=model.config)}
        first = model(ids[:, :7], use_cache=True, **cache).logits
        return first, model(ids[:, 7:], use_cache=True, **cache).logits

    ref = two_steps()
    with fused_ops(model, compile=False):
        out = two_steps()
    assert all(torch.equal(a, b) for a, b in zip(out, ref))
    _assert_stock(model)


def test_rebuilt_functions_read_the_override_and_keep_their_decorators():
    def renaming(fn):  # a decorator like transformers' deprecate_kwarg: renames a keyword
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if "old" in kwargs:
                kwargs["new"] = kwargs.pop("old")
            return fn(*args, **kwargs)
        return wrapper

    @renaming
    def scaled(x, *, new=1):
        return math.floor(x * new)

    rebuilt = fused._with_globals(scaled, {"math": types.SimpleNamespace(floor=lambda v: -v)})
    assert rebuilt(2.5, old=2) == -5.0 and scaled(2.5, old=2) == 5  # the override; the original untouched
    assert inspect.unwrap(rebuilt).__globals__ is not globals() and inspect.unwrap(scaled).__globals__ is globals()
    assert rebuilt(3) == -3 and rebuilt.__name__ == "scaled"
    # A wrapper that does not hold what it wraps in a cell cannot be rebuilt.
    opaque = functools.partial(scaled)
    assert fused._with_globals(opaque, {}) is None


@torch.no_grad()
def test_the_dflash_drafter_gets_the_fused_norms_and_mlp_bitwise(tiny_models):
    """The drafter's own RMSNorm (the Qwen3 formula), gated SiLU MLP and rotary run through ``rms_norm``,
    ``silu_mul`` and its own ``apply_rope``, as the context's kernels: every one of them patched, the block pass and the context K/V bitwise the
    stock ones, nothing left afterwards."""
    from ddtree.models.dflash import DFlashAttention, DFlashMLP, RMSNorm
    from ddtree.testing import tiny_dflash

    drafter = tiny_dflash(tiny_models["qwen3"])
    cfg = drafter.config
    gen = torch.Generator().manual_seed(3)
    taps = torch.randn(6, len(cfg.target_layer_ids) * cfg.hidden_size, generator=gen)
    block = torch.randn(1, 4, cfg.hidden_size, generator=gen)

    def run():
        context = drafter.context_kv(taps, torch.arange(6))
        return drafter(block, torch.arange(6, 10), context), context

    ref, ref_context = run()
    with fused_ops(drafter, compile=False) as count:
        out, context = run()
        patched = [m for m in drafter.modules() if isinstance(m, (RMSNorm, DFlashMLP)) and "forward" in m.__dict__]
        rotaries = [m for m in drafter.modules() if isinstance(m, DFlashAttention)
                    and {"forward", "keys_values"} <= set(m.__dict__)]
    expected = sum(isinstance(m, (RMSNorm, DFlashMLP)) for m in drafter.modules())
    assert count == len(patched) == expected == 5 * cfg.num_hidden_layers + 2  # 4 norms and an MLP a layer, 2 more norms
    assert len(rotaries) == cfg.num_hidden_layers  # each attention's rotary rebuilt over the context's kernel
    assert torch.equal(out, ref)
    assert all(torch.equal(a, b) for pair, ref_pair in zip(context, ref_context) for a, b in zip(pair, ref_pair))
    assert not fused._PATCHES and not [m for m in drafter.modules() if {"forward", "keys_values"} & set(m.__dict__)]


def test_the_dflash_drafter_fuses_when_asked(tiny_models):
    from ddtree.drafters import DFlashDrafter
    from ddtree.models import HFTarget
    from ddtree.testing import tiny_dflash

    target = HFTarget(tiny_models["qwen3"])
    body = tiny_dflash(tiny_models["qwen3"])
    assert not DFlashDrafter(body, target, max_length=64).fuse  # the default: on with CUDA graphs only
    assert not DFlashDrafter(body, target, max_length=64, cuda_graphs="auto").fuse  # no graphs on the CPU
    assert DFlashDrafter(body, target, max_length=64, fuse=True).fuse


@torch.no_grad()
def test_the_dflash_rotary_goes_through_the_compiled_kernel(tiny_models, monkeypatch):
    """Inside the context the drafter's rotary runs what ``compiled`` made of ``apply_rope`` (a marker
    here, so nothing compiles on the CPU), and outside it the stock function again."""
    from ddtree.models import dflash
    from ddtree.testing import tiny_dflash

    drafter, calls = tiny_dflash(tiny_models["qwen3"]), []

    def marked(fn):
        if fn is not dflash.apply_rope:
            return fn
        return lambda *args: calls.append(1) or fn(*args)

    monkeypatch.setattr(fused, "compiled", marked)
    cfg = drafter.config
    taps = torch.randn(3, len(cfg.target_layer_ids) * cfg.hidden_size)

    def run():
        drafter(torch.randn(1, 4, cfg.hidden_size), torch.arange(3, 7), drafter.context_kv(taps, torch.arange(3)))

    with fused_ops(drafter, compile=True):
        run()
    assert len(calls) == 3 * cfg.num_hidden_layers  # per layer: the context's k, then the block's q and k
    run()
    assert len(calls) == 3 * cfg.num_hidden_layers


def test_fuse_projections_puts_each_group_in_one_weight_and_keeps_every_value():
    """``fuse_projections`` on a tiny hybrid: every MLP's gate and up and every GDN layer's four input
    projections become row views of one tensor a group (adjacent in memory), the state dict keeps its
    values, ``project`` equals the separate linears, the forward is unchanged (plain and under
    ``fused_ops``), a second call fuses nothing, and after ``.to(float64)`` ``project`` falls back."""
    from ddtree.testing import tiny_hybrid_target

    model = tiny_hybrid_target(num_layers=4)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ids = torch.randint(0, 90, (1, 9), generator=torch.Generator().manual_seed(0))
    want = model(ids).logits
    assert fused.fuse_projections(model) == 2 * model.config.num_hidden_layers  # an MLP + a GDN or attention group
    assert fused.fuse_projections(model) == 0
    after = model.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], v) for k, v in before.items())
    mlp, layer = model.model.layers[0].mlp, model.model.layers[0].linear_attn
    gate, up = mlp.gate_proj.weight, mlp.up_proj.weight
    assert up.data_ptr() == gate.data_ptr() + gate.numel() * gate.element_size()
    x = torch.randn(1, 5, model.config.hidden_size)
    names = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")
    for module, group in ((mlp, ("gate_proj", "up_proj")), (layer, names)):
        for got, name in zip(fused.project(module, group, x), group, strict=True):
            torch.testing.assert_close(got, getattr(module, name)(x))
    torch.testing.assert_close(model(ids).logits, want)
    with fused_ops(model, compile=False):
        torch.testing.assert_close(model(ids).logits, want)
    model.to(torch.float64)
    outs = fused.project(mlp, ("gate_proj", "up_proj"), x.double())
    assert all(o.dtype == torch.float64 for o in outs)
    torch.testing.assert_close(outs[1], mlp.up_proj(x.double()))


def test_static_target_fuses_each_mlp_s_gate_and_up_when_asked():
    """``StaticTarget(fuse_projections=True)`` on a tiny Qwen3: two groups a layer (its MLP's gate and
    up, its attention's q, k and v), the same prefill logits as without, and under ``fused_ops`` the
    attention's three linears run as one GEMM with the same forward."""
    from ddtree.models.static_target import StaticTarget

    model = tiny_target("qwen3")
    ids = torch.randint(0, 90, (7,), generator=torch.Generator().manual_seed(1))
    want = StaticTarget(model, max_length=64, cuda_graphs=False).prefill(ids).logits
    target = StaticTarget(model, max_length=64, cuda_graphs=False, fuse_projections=True)
    assert target.fused_projections == 2 * model.config.num_hidden_layers
    assert StaticTarget(model, max_length=64, cuda_graphs=False).fused_projections == 0
    torch.testing.assert_close(target.prefill(ids).logits, want)
    calls = []
    attention = model.model.layers[0].self_attn
    original = fused.project
    with fused_ops(model, compile=False):
        fused.project = lambda module, names, x, start=0: calls.append(names[start:]) or original(module, names, x, start)
        try:
            got = model(ids[None]).logits
        finally:
            fused.project = original
        assert all("forward" in vars(getattr(attention, n)) for n in fused.QKV)
    assert not any("forward" in vars(getattr(attention, n)) for n in fused.QKV)  # restored
    assert calls.count(fused.QKV) == model.config.num_hidden_layers  # one GEMM a layer, not three
    torch.testing.assert_close(got, model(ids[None]).logits)  # outside the context: three GEMMs on the views


def test_a_compiled_function_serves_more_layouts_than_torchs_default_recompile_limit(monkeypatch):
    """One norm meets many input layouts (input norms, q and k norms as views of q_proj's or a fused
    q/k/v GEMM's output, one row or many): ``compiled`` lets it compile past torch's default of 8
    variants instead of failing (``fullgraph=True`` turns the limit into an error)."""
    monkeypatch.setattr(fused, "BACKEND", "eager")  # dynamo's guards and recompiles, without Inductor
    monkeypatch.setattr(fused, "_COMPILED", {})

    def offset_norm(hidden, weight, eps):  # a fresh code object: no variants from other tests
        return fused.rms_norm_offset(hidden, weight, eps)

    d, w = 16, torch.ones(16)
    # Ranks 2 to 6, one row and five: ten variants (layouts of one rank can share one; ranks cannot).
    layouts = [torch.randn(n, *(2,) * (rank - 2), d) for rank in range(2, 7) for n in (1, 5)]
    fn = compiled(offset_norm)
    for x in layouts:
        torch.testing.assert_close(fn(x, w, 1e-6), fused.rms_norm_offset(x, w, 1e-6))
    assert len(layouts) > 8


def test_compiles_warns_and_says_what_happens_instead_where_the_probe_fails(caplog):
    """``fused.compiles``: True where the probe runs; where it raises a compiler error, False and a
    warning naming the error and the caller's fallback (the drafters' and targets' one message)."""

    def broken(dtype, device):
        raise RuntimeError("no working compiler\nmore")

    assert fused.compiles(lambda dtype, device: None, torch.float32, torch.device("cpu"), "unused")
    with caplog.at_level("WARNING"):
        assert not fused.compiles(broken, torch.bfloat16, torch.device("cpu"), "the MTP drafter keeps its dense mask")
    assert "(RuntimeError: no working compiler), so the MTP drafter keeps its dense mask" in caplog.text


def test_a_model_with_fused_projections_saves_and_loads_back_through_save_pretrained(tmp_path):
    """The fused weights are row views of one tensor a group: ``save_pretrained`` writes them as the
    separate weights they are, and a fresh load gives every value back."""
    from transformers import AutoModelForCausalLM

    model = tiny_target("qwen3")
    assert fused.fuse_projections(model) > 0
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, use_safetensors=True)
    want = model.state_dict()
    assert set(loaded.state_dict()) == set(want)
    for name, value in loaded.state_dict().items():
        torch.testing.assert_close(value, want[name], atol=0, rtol=0)


@torch.no_grad()
def test_the_dflash_drafter_runs_its_projections_as_one_gemm_a_group(tiny_models, monkeypatch):
    """``DFlashDrafter(fuse_projections=True)``: each layer's q, k, v and gate, up stored together; under
    ``fused_ops`` the block's q, k and v are one GEMM, the context's k and v one (no q for the
    context), the MLP's gate and up one; the drafts equal the unfused drafter's."""
    from ddtree.drafters import DFlashDrafter
    from ddtree.models import HFTarget
    from ddtree.testing import tiny_dflash

    target = HFTarget(tiny_models["qwen3"])
    body = tiny_dflash(tiny_models["qwen3"])
    gen = torch.Generator().manual_seed(5)
    cfg = body.config
    taps = torch.randn(7, len(cfg.target_layer_ids) * cfg.hidden_size, generator=gen)

    def draft(drafter):
        drafter.reset(types.SimpleNamespace(taps=taps))
        return drafter.draft(3).log_probs

    want = draft(DFlashDrafter(body, target, max_length=64))
    drafter = DFlashDrafter(body, target, max_length=64, fuse=False, fuse_projections=True)
    assert drafter.fused_projections == 2 * cfg.num_hidden_layers
    calls, original = [], fused.project
    monkeypatch.setattr(fused, "project", lambda module, names, x, start=0: calls.append(names[start:])
                        or original(module, names, x, start))
    with fused_ops(body, compile=False):
        drafter.reset(types.SimpleNamespace(taps=taps))
        calls.clear()  # the prompt's absorb: k and v a layer
        block = torch.randn(1, drafter.block_size, cfg.hidden_size, generator=gen)
        body(block, torch.arange(7, 7 + drafter.block_size), body.context_kv(taps, torch.arange(7)))
    layers = cfg.num_hidden_layers
    assert calls.count(fused.QKV) == layers and calls.count(fused.QKV[1:]) == layers
    assert calls.count(fused.GATE_UP) == layers and len(calls) == 3 * layers
    torch.testing.assert_close(draft(drafter), want)
