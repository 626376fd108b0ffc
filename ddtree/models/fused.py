"""Fused RMSNorm, rotary embedding and SiLU-and-mul for a captured Qwen3/Llama verify forward.

Inside a CUDA graph the launches stay, only the CPU cost goes: an eager RMSNorm is ~7 tiny
kernels (to float32, pow, mean, add eps, rsqrt, mul, to dtype, mul weight), the rotary embedding
~10 (mul, neg, cat, mul, add for q and k) and the MLP's ``act(gate) * up`` two. ``fused_ops``
swaps them, for one model and only while the context is open, for free functions with exactly
the stock math that ``torch.compile`` (Inductor) turns into one kernel each.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import logging
import threading
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

log = logging.getLogger(__name__)

# (modeling module, RMSNorm class, MLP class, attention class) of each family whose parts are the
# stock ones. Matching is by exact type: a subclass, or another family's norm with a different
# formula (Qwen3.5's ``(1 + weight)`` norm, Gemma's), is left alone.
FAMILIES: tuple[tuple[str, str, str, str], ...] = (
    ("transformers.models.qwen3.modeling_qwen3", "Qwen3RMSNorm", "Qwen3MLP", "Qwen3Attention"),
    ("transformers.models.llama.modeling_llama", "LlamaRMSNorm", "LlamaMLP", "LlamaAttention"),
)
ROTARY_GLOBAL = "apply_rotary_pos_emb"


# -- the stock math, as free functions -------------------------------------------------------

def rms_norm(hidden: Tensor, weight: Tensor, eps: float) -> Tensor:
    """``Qwen3RMSNorm`` / ``LlamaRMSNorm``: normalise in float32, cast back, then scale."""
    input_dtype = hidden.dtype
    hidden = hidden.to(torch.float32)
    variance = hidden.pow(2).mean(-1, keepdim=True)
    hidden = hidden * torch.rsqrt(variance + eps)
    return weight * hidden.to(input_dtype)


def silu_mul(gate: Tensor, up: Tensor) -> Tensor:
    """The gated MLP's ``silu(gate) * up``."""
    return F.silu(gate) * up


def _rotate_half(x: Tensor) -> Tensor:
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def rotary(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int = 1) -> tuple[Tensor, Tensor]:
    """HF ``apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)``."""
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    q_embed = (q * cos) + (_rotate_half(q) * sin)
    k_embed = (k * cos) + (_rotate_half(k) * sin)
    return q_embed, k_embed


_COMPILED: dict[Callable, Callable] = {}


def compiled(fn: Callable) -> Callable:
    """``torch.compile(fn, dynamic=True, fullgraph=True)``, one per function (compiled on first call).

    Run it once before a CUDA graph capture: compiling inside a capture fails.
    """
    if fn not in _COMPILED:
        _COMPILED[fn] = torch.compile(fn, dynamic=True, fullgraph=True)
    return _COMPILED[fn]


# -- reversible attribute patches --------------------------------------------------------------
# Each (object, name) keeps its original value and a stack of (owner, value); the top one is
# live, and when the last owner leaves the original comes back. So nested and interleaved
# contexts (two models of one family share the modeling module's globals) restore correctly.

_MISSING = object()
_PATCHES: dict[tuple[int, str], tuple[Any, Any, list[tuple[object, Any]]]] = {}
_LOCK = threading.RLock()


def _push(holder: Any, name: str, value: Any, owner: object) -> None:
    with _LOCK:
        key = (id(holder), name)
        if key not in _PATCHES:
            _PATCHES[key] = (holder, vars(holder).get(name, _MISSING), [])
        _PATCHES[key][2].append((owner, value))
        setattr(holder, name, value)


def _original(holder: Any, name: str) -> Any:
    """``holder.name`` as it was before any patch (``None`` if unset)."""
    with _LOCK:
        entry = _PATCHES.get((id(holder), name))
        value = vars(holder).get(name, _MISSING) if entry is None else entry[1]
    return None if value is _MISSING else value


def _pop_all(owner: object) -> None:
    with _LOCK:
        for key, (holder, original, stack) in list(_PATCHES.items()):
            if not any(o is owner for o, _ in stack):
                continue
            stack[:] = [(o, v) for o, v in stack if o is not owner]
            if stack:
                setattr(holder, key[1], stack[-1][1])
                continue
            del _PATCHES[key]
            if original is _MISSING:
                vars(holder).pop(key[1], None)
            else:
                setattr(holder, key[1], original)


# -- what to patch -----------------------------------------------------------------------------

def _family_classes() -> list[tuple[Any, type, type, type]]:
    found = []
    for module_name, norm, mlp, attention in FAMILIES:
        try:
            mod = importlib.import_module(module_name)
            found.append((mod, getattr(mod, norm), getattr(mod, mlp), getattr(mod, attention)))
        except (ImportError, AttributeError):
            continue
    return found


def _silu_types() -> tuple[type, ...]:
    types: tuple[type, ...] = (nn.SiLU,)
    try:
        from transformers.activations import SiLUActivation
        types += (SiLUActivation,)
    except ImportError:
        pass
    return types


def _reads_rotary_global(attention_cls: type, mod: Any) -> bool:
    """Whether ``attention_cls.forward`` calls ``mod.apply_rotary_pos_emb`` through its globals."""
    forward = inspect.unwrap(attention_cls.forward)  # past ``deprecate_kwarg`` and the like
    code = getattr(forward, "__code__", None)
    return code is not None and ROTARY_GLOBAL in code.co_names and forward.__globals__ is vars(mod)


def _rotary_for(original: Any, fn: Callable) -> Callable | None:
    """``fn`` shaped like ``original`` (the module's ``apply_rotary_pos_emb``); None if unknown."""
    target = original.forward if isinstance(original, nn.Module) else original  # kernels' function module
    try:
        names = tuple(inspect.signature(target).parameters)
    except (TypeError, ValueError):
        return None
    if names == ("q", "k", "cos", "sin", "unsqueeze_dim"):
        return fn
    if names == ("q", "k", "cos", "sin", "position_ids", "unsqueeze_dim"):  # older 5.x: deprecated, unused
        def rotary_with_position_ids(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, position_ids: Any = None,
                                     unsqueeze_dim: int = 1) -> tuple[Tensor, Tensor]:
            return fn(q, k, cos, sin, unsqueeze_dim)
        return rotary_with_position_ids
    return None


def _norm_forward(module: nn.Module, fn: Callable) -> Callable:
    def forward(hidden_states: Tensor) -> Tensor:
        return fn(hidden_states, module.weight, module.variance_epsilon)
    return forward


def _mlp_forward(module: nn.Module, fn: Callable) -> Callable:
    def forward(x: Tensor) -> Tensor:
        return module.down_proj(fn(module.gate_proj(x), module.up_proj(x)))
    return forward


@contextlib.contextmanager
def fused_ops(model: nn.Module, compile: bool = True) -> Iterator[int]:
    """Run ``model``'s Qwen3/Llama RMSNorms, SiLU MLPs and rotary embedding through the fused functions.

    Patches instance ``forward`` attributes of the matching submodules (exact class, so subclasses
    and other norms are untouched) and, where the attention reads it as a module global, the
    modeling module's ``apply_rotary_pos_emb``. That global is process-wide: while the context is
    open, every model of that family uses the fused rotary (same math). Everything is restored on
    exit, exceptions included. ``compile=False`` uses the plain functions (bitwise the stock
    result); ``compile=True`` their ``torch.compile``d versions (close, not bitwise: Inductor skips
    some intermediate roundings), compiled on first call, so warm up before a graph capture.
    Yields the number of norms and MLPs patched (0 for a family not covered).

    >>> with fused_ops(target.model) as n:     # doctest: +SKIP
    ...     logits = target.model(ids).logits
    """
    wrap = compiled if compile else (lambda fn: fn)
    norm_fn, mlp_fn, rotary_fn = wrap(rms_norm), wrap(silu_mul), wrap(rotary)
    owner = object()
    families = _family_classes()
    norm_types = {norm for _, norm, _, _ in families}
    mlp_types = {mlp for _, _, mlp, _ in families}
    silu = _silu_types()
    patched = 0
    try:
        present = {type(m) for m in model.modules()}
        for m in model.modules():
            if type(m) in norm_types:
                _push(m, "forward", _norm_forward(m, norm_fn), owner)
                patched += 1
            elif type(m) in mlp_types and type(getattr(m, "act_fn", None)) in silu:
                _push(m, "forward", _mlp_forward(m, mlp_fn), owner)
                patched += 1
        for mod, _, _, attention in families:
            if attention not in present or not _reads_rotary_global(attention, mod):
                continue
            replacement = _rotary_for(_original(mod, ROTARY_GLOBAL), rotary_fn)
            if replacement is None:
                log.warning("%s.%s has an unknown signature; rotary left unfused", mod.__name__, ROTARY_GLOBAL)
                continue
            _push(mod, ROTARY_GLOBAL, replacement, owner)
        yield patched
    finally:
        _pop_all(owner)
