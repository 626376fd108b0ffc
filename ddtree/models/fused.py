"""Fused RMSNorm, rotary embedding and SiLU-and-mul for a captured verify forward (Qwen3, Llama; the
norms and MLPs of Qwen3.5/3.6 hybrids and of the DFlash drafter).

Inside a CUDA graph the launches stay, only the CPU cost goes: an eager RMSNorm is ~7 tiny
kernels (to float32, pow, mean, add eps, rsqrt, mul, to dtype, mul weight), the rotary embedding
~10 (mul, neg, cat, mul, add for q and k) and the MLP's ``act(gate) * up`` two. ``fused_ops``
swaps them, for one model and only while the context is open, for free functions with exactly
the stock math that ``torch.compile`` (Inductor) turns into one kernel each.

Everything is an instance attribute of that model's modules; no module global changes. The
attention reads ``apply_rotary_pos_emb`` as a global of its modeling module, so each attention
module gets an instance ``forward`` that is its class's forward rebuilt over a copy of those
globals in which the name is the fused rotary (decorators such as ``deprecate_kwarg`` rebuilt
around it). Another model of the same family, in no context, keeps the stock rotary.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import logging
import threading
import types
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
# Qwen3.5/3.6 (hybrid GDN) parts: norms of their own formulas, each with its fused twin below, the
# stock SiLU MLP, and an attention whose rotary turns only the first ``cos.shape[-1]`` channels of a
# head (``rotary_partial``).
QWEN35 = "transformers.models.qwen3_5.modeling_qwen3_5"
# The DFlash drafter's own norm has the Qwen3 formula, and its MLP the stock SiLU one.
DFLASH = "ddtree.models.dflash"
OTHER_NORMS: tuple[tuple[str, str, str], ...] = (  # (module, class, fused function name)
    (QWEN35, "Qwen3_5RMSNorm", "rms_norm_offset"),
    (QWEN35, "Qwen3_5RMSNormGated", "rms_norm_gated"),
    (DFLASH, "RMSNorm", "rms_norm"),
)
OTHER_MLPS: tuple[tuple[str, str], ...] = ((QWEN35, "Qwen3_5MLP"), (DFLASH, "DFlashMLP"))
# (module, attention class, fused rotary function name) of attentions whose rotary has another
# formula than the families' (the families' attentions take ``rotary``).
OTHER_ROTARY: tuple[tuple[str, str, str], ...] = ((QWEN35, "Qwen3_5Attention", "rotary_partial"),)


# -- the stock math, as free functions -------------------------------------------------------

def rms_norm(hidden: Tensor, weight: Tensor, eps: float) -> Tensor:
    """``Qwen3RMSNorm`` / ``LlamaRMSNorm``: normalise in float32, cast back, then scale."""
    input_dtype = hidden.dtype
    hidden = hidden.to(torch.float32)
    variance = hidden.pow(2).mean(-1, keepdim=True)
    hidden = hidden * torch.rsqrt(variance + eps)
    return weight * hidden.to(input_dtype)


def rms_norm_offset(hidden: Tensor, weight: Tensor, eps: float) -> Tensor:
    """``Qwen3_5RMSNorm`` (zero-centred weight): normalise and scale by ``1 + w`` in float32, then cast."""
    out = hidden.float()
    out = out * torch.rsqrt(out.pow(2).mean(-1, keepdim=True) + eps)
    return (out * (1.0 + weight.float())).type_as(hidden)


def rms_norm_gated(hidden: Tensor, gate: Tensor, weight: Tensor, eps: float) -> Tensor:
    """``Qwen3_5RMSNormGated`` (the GDN output norm): RMSNorm, scale, then times SiLU of the gate."""
    input_dtype = hidden.dtype
    out = hidden.to(torch.float32)
    out = out * torch.rsqrt(out.pow(2).mean(-1, keepdim=True) + eps)
    out = weight * out.to(input_dtype)
    return (out * F.silu(gate.to(torch.float32))).to(input_dtype)


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


def rotary_partial(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int = 1) -> tuple[Tensor, Tensor]:
    """Qwen3.5/3.6's ``apply_rotary_pos_emb``: ``rotary`` on each head's first ``cos.shape[-1]``
    channels, the others passed through. Stock, it is a dozen kernels an attention layer (the two
    ``torch.cat`` of ``rotate_half``, two more putting the passed channels back, the products and
    sums); compiled, Inductor writes it as one or two."""
    d = cos.shape[-1]
    q_rot, k_rot = rotary(q[..., :d], k[..., :d], cos, sin, unsqueeze_dim)
    return torch.cat([q_rot, q[..., d:]], dim=-1), torch.cat([k_rot, k[..., d:]], dim=-1)


# The DFlash attention's rotary: the module global its methods read (``ddtree.models.dflash.apply_rope``,
# this project's own function, compiled as it is), and those methods.
DFLASH_ROPE = ("apply_rope", ("forward", "keys_values"))


_COMPILED: dict[Callable, Callable] = {}
BACKEND = "inductor"  # torch.compile's backend for ``compiled`` (the unit tests use "eager")
# Compiled variants one function may hold (Dynamo's default is 8; past it a ``fullgraph`` function
# raises). Every verify size a target serves is one kernel of FlexAttention and of the split
# attention's merge; one norm serves the input norms ([1, n, D]) and the q and k norms of every layer,
# whose inputs are views with their own strides (a chunk of q_proj's output, columns of a fused q/k/v
# GEMM), each once for one row and once for many.
RECOMPILE_LIMIT = 64
_LIMIT_NAME = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"


@contextlib.contextmanager
def recompile_limit() -> Iterator[None]:
    """Within the block Dynamo allows at least ``RECOMPILE_LIMIT`` variants a function. Set and restored
    directly: ``torch._dynamo.config.patch`` cost about 38 us a call on a 2-core CPU, this about 6."""
    config = torch._dynamo.config
    before = getattr(config, _LIMIT_NAME)
    setattr(config, _LIMIT_NAME, max(before, RECOMPILE_LIMIT))
    try:
        yield
    finally:
        setattr(config, _LIMIT_NAME, before)


def compiled(fn: Callable) -> Callable:
    """``torch.compile(fn, dynamic=True, fullgraph=True)``, one per function (compiled on first call),
    called under ``recompile_limit``.

    Run it once before a CUDA graph capture: compiling inside a capture fails.
    """
    if fn not in _COMPILED:
        inner = torch.compile(fn, dynamic=True, fullgraph=True, backend=BACKEND)

        def call(*args, **kwargs):
            with recompile_limit():
                return inner(*args, **kwargs)

        _COMPILED[fn] = functools.wraps(fn)(call)
    return _COMPILED[fn]


# What a missing or broken compiler raises: torch._dynamo's BackendCompilerFailed and Unsupported
# and Inductor's InvalidCxxCompiler/CppCompileError are RuntimeErrors; a missing Triton is an
# ImportError or a RuntimeError; a missing compiler executable an OSError.
COMPILER_ERRORS = (RuntimeError, ImportError, OSError)


def compiles(check: Callable, dtype: torch.dtype, device: torch.device, instead: str) -> bool:
    """Whether ``check(dtype, device)`` (a ``probe``) runs here. Where it raises one of
    ``COMPILER_ERRORS``: False, and a warning naming the error and what the caller does ``instead``.

    >>> compiles(lambda dtype, device: None, torch.float32, torch.device("cpu"), "unused")
    True
    """
    try:
        check(dtype, device)
    except COMPILER_ERRORS as err:
        log.warning("torch.compile does not work here (%s: %s), so %s", type(err).__name__,
                    (str(err).splitlines() or [""])[0], instead)
        return False
    return True


def probe(dtype: torch.dtype, device: torch.device) -> None:
    """Compile and run each fused function once on tiny tensors of ``dtype`` on ``device``.

    Raises what the compiler raises (one of ``COMPILER_ERRORS``); run it outside any model
    forward, so that a failure here means "no working compiler" and nothing else.

    >>> probe(torch.float32, torch.device("cuda"))     # doctest: +SKIP
    """
    x = torch.ones(1, 2, 8, dtype=dtype, device=device)  # [b, n, hidden]
    compiled(rms_norm)(x, torch.ones(8, dtype=dtype, device=device), 1e-6)
    compiled(silu_mul)(x, x)
    q, cos = torch.ones(1, 2, 2, 8, dtype=dtype, device=device), torch.ones(1, 2, 8, dtype=dtype, device=device)
    compiled(rotary)(q, q, cos, cos)  # q, k [b, heads, n, head_dim]; cos, sin [b, n, head_dim]
    compiled(rotary_partial)(q, q, cos[..., :4], cos[..., :4])  # the rotary on half of each head
    from ddtree.models.dflash import apply_rope  # the DFlash drafter's: x [b, heads, n, d], cos [b, 1, n, d]

    compiled(apply_rope)(q, cos[:, None], cos[:, None])
    w = torch.ones(8, dtype=dtype, device=device)
    compiled(rms_norm_offset)(x, w, 1e-6)
    compiled(rms_norm_gated)(x, x, w, 1e-6)


# -- reversible attribute patches --------------------------------------------------------------
# Each (module, "forward") keeps its original value and a stack of (owner, value); the top one
# is live, and when the last owner leaves the original comes back. So nested and interleaved
# contexts on one model restore correctly.

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


def _found(specs: tuple[tuple[str, ...], ...]) -> list[tuple[Any, ...]]:
    """``(module, class, *rest)`` for each spec ``(module name, class name, *rest)`` whose module
    imports and holds the class (transformers versions differ in which families they have)."""
    found = []
    for module_name, cls, *rest in specs:
        try:
            mod = importlib.import_module(module_name)
            found.append((mod, getattr(mod, cls), *rest))
        except (ImportError, AttributeError):
            continue
    return found


def _other_classes() -> tuple[dict[type, str], set[type]]:
    """The ``OTHER_NORMS`` classes found (class -> fused function name) and the ``OTHER_MLPS``."""
    return {cls: fn for _, cls, fn in _found(OTHER_NORMS)}, {cls for _, cls in _found(OTHER_MLPS)}


def _silu_types() -> tuple[type, ...]:
    kinds: tuple[type, ...] = (nn.SiLU,)
    try:
        from transformers.activations import SiLUActivation
        kinds += (SiLUActivation,)
    except ImportError:
        pass
    return kinds


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


def _with_globals(fn: Callable, overrides: dict[str, Any]) -> Callable | None:
    """``fn`` whose innermost function reads ``overrides`` before its own module's globals.

    The innermost function (``fn.__wrapped__`` all the way down) is rebuilt over a copy of its
    globals; each decorator layer above it (a ``functools.wraps`` wrapper holding the function
    it wraps in a closure cell, like ``deprecate_kwarg``) is rebuilt around the new one, so the
    decorators still run. None for a wrapper of another shape.
    """
    inner = getattr(fn, "__wrapped__", None)
    if not isinstance(fn, types.FunctionType) or (inner is not None and not isinstance(inner, types.FunctionType)):
        return None
    if inner is None:
        new = types.FunctionType(fn.__code__, {**fn.__globals__, **overrides}, fn.__name__, fn.__defaults__,
                                 fn.__closure__)
    else:
        rebuilt = _with_globals(inner, overrides)
        cells = fn.__closure__ or ()
        holding = [i for i, cell in enumerate(cells) if _contents(cell) is inner]
        if rebuilt is None or len(holding) != 1:
            return None
        closure = tuple(types.CellType(rebuilt) if i in holding else cell for i, cell in enumerate(cells))
        new = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, closure)
    new.__dict__.update(fn.__dict__)
    if inner is not None:
        new.__wrapped__ = rebuilt
    new.__kwdefaults__ = dict(fn.__kwdefaults__) if fn.__kwdefaults__ else None
    new.__qualname__, new.__doc__, new.__module__ = fn.__qualname__, fn.__doc__, fn.__module__
    return new


def _contents(cell: types.CellType) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return None


# -- same-input projections as one GEMM ------------------------------------------------------

# Linear layers of one module that read the same input: an MLP's gate and up, a Qwen3.5/3.6 GDN
# layer's four input projections, an attention layer's q, k and v. ``fuse_projections`` stores each
# group in one weight.
GATE_UP = ("gate_proj", "up_proj")
GDN_INPUTS = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")
QKV = ("q_proj", "k_proj", "v_proj")
PROJECTION_GROUPS: tuple[tuple[str, ...], ...] = (GATE_UP, GDN_INPUTS, QKV)
_FUSED = "_ddtree_fused_projections"  # module attribute: {names: (weight, sizes, each linear's weight address)}


def fuse_projections(model: nn.Module) -> int:
    """Store each group of ``PROJECTION_GROUPS`` that a module holds in one weight, and make each
    linear's weight a view of its rows: the same values and memory, and one GEMM wherever a forward
    goes through ``project``: an MLP's group inside ``fused_ops``, a GDN layer's in the tree verify, an
    attention layer's q, k and v inside ``fused_ops`` (the first of the three calls computes all
    three). On one H100 the Qwen3.6-27B geometry's linear layers took 23.0 ms so at 257 rows against
    26.5, and 18.9 against 20.0 at one row (``experiments/gemm_rows_bench.py``). A group is skipped where its
    linears differ in input size, dtype or device, have a bias, sit on the meta device or carry an
    accelerate hook (offloaded or dispatched weights). Returns the number of groups fused; calling it
    again fuses nothing new. The model's parameters stay what they were, views of one tensor a group:
    ``save_pretrained`` writes them as separate weights (transformers 5.17 and 5.25), while
    ``safetensors.torch.save_model`` refuses them as tensors that share memory.

    >>> fuse_projections(model)     # doctest: +SKIP
    36
    """
    count = 0
    for module in model.modules():
        for names in PROJECTION_GROUPS:
            linears = [getattr(module, name, None) for name in names]
            if not all(isinstance(m, nn.Linear) for m in linears) or names in getattr(module, _FUSED, {}):
                continue
            weights = [m.weight for m in linears]
            if (len({(w.shape[1], w.dtype, w.device) for w in weights}) != 1 or weights[0].device.type == "meta"
                    or any(m.bias is not None or hasattr(m, "_hf_hook") for m in linears)):
                continue
            with torch.no_grad():
                fused_weight = torch.cat([w.detach() for w in weights])
            sizes, start = [w.shape[0] for w in weights], 0
            for m, w, size in zip(linears, weights, sizes):
                m.weight = nn.Parameter(fused_weight[start:start + size], requires_grad=w.requires_grad)
                start += size
            if not hasattr(module, _FUSED):
                object.__setattr__(module, _FUSED, {})
            getattr(module, _FUSED)[names] = (fused_weight, tuple(sizes), tuple(m.weight.data_ptr() for m in linears))
            count += 1
    return count


def project(module: nn.Module, names: tuple[str, ...], x: Tensor, start: int = 0) -> tuple[Tensor, ...]:
    """The outputs of ``module``'s linears ``names[start:]`` for input ``x``: one GEMM split by columns
    where ``fuse_projections`` stored the group ``names`` together (the rows of the linears from
    ``start`` on are one slice of it) and every weight still views that storage (a later ``.to()`` or
    parameter swap falls back), else one call per linear. The split outputs are views."""
    fused = getattr(module, _FUSED, {}).get(names)
    if fused is not None:
        weight, sizes, addresses = fused
        if all(getattr(module, name).weight.data_ptr() == at for name, at in zip(names, addresses)):
            return F.linear(x, weight[sum(sizes[:start]):]).split(sizes[start:], dim=-1)
    return tuple(getattr(module, name)(x) for name in names[start:])


def _shared_projection_forwards(module: nn.Module, names: tuple[str, ...]) -> list[Callable]:
    """Instance forwards for the linears ``names`` of ``module`` (called one after another on one input,
    as an attention forward calls q, k and v): a call on a new input runs ``project`` for its linear
    and those after it (one GEMM where fused) and keeps the outputs; the later ones return theirs while
    the input is the same tensor, else run again. So q, k and v of one input are one GEMM, and k and v
    alone (the DFlash drafter's context keys and values) one GEMM without q."""
    kept: dict[str, Any] = {}

    def forward_for(i: int) -> Callable:
        def forward(x: Tensor) -> Tensor:
            if kept.get("input") is not x or i not in kept["outputs"]:
                kept["input"] = x
                kept["outputs"] = dict(enumerate(project(module, names, x, start=i), start=i))
            out = kept["outputs"][i]
            if i == len(names) - 1:
                kept.clear()  # no tensor outlives the layer
            return out
        return forward

    return [forward_for(i) for i in range(len(names))]


def _norm_forward(module: nn.Module, fn: Callable) -> Callable:
    def forward(hidden_states: Tensor) -> Tensor:
        return fn(hidden_states, module.weight, module.variance_epsilon)
    return forward


def _other_norm_forward(module: nn.Module, fn: Callable, gated: bool) -> Callable:
    eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
    if gated:
        def gated_forward(hidden_states: Tensor, gate: Tensor) -> Tensor:
            return fn(hidden_states, gate, module.weight, eps)
        return gated_forward

    def forward(hidden_states: Tensor) -> Tensor:
        return fn(hidden_states, module.weight, eps)
    return forward


def _mlp_forward(module: nn.Module, fn: Callable) -> Callable:
    def forward(x: Tensor) -> Tensor:
        return module.down_proj(fn(*project(module, GATE_UP, x)))
    return forward


def _fuse_dflash_rope(model: nn.Module, wrap: Callable, owner: object) -> None:
    """The DFlash drafter's attention modules run ``wrap(apply_rope)`` for their rotary: each method
    of ``DFLASH_ROPE`` that reads the global gets an instance attribute rebuilt over it (a module
    with one of those attributes of its own, not set by a context, is left alone)."""
    from ddtree.models import dflash  # at use: fusing a target needs none of the drafter's code

    name, methods = DFLASH_ROPE
    fn = wrap(getattr(dflash, name))
    modules = [m for m in model.modules() if type(m) is dflash.DFlashAttention
               and all(meth not in vars(m) or (id(m), meth) in _PATCHES for meth in methods)]
    if not modules:
        return
    for meth in methods:
        rebuilt = _with_globals(getattr(dflash.DFlashAttention, meth), {name: fn})
        if rebuilt is None or name not in rebuilt.__code__.co_names:
            log.warning("DFlashAttention.%s has an unknown shape; its rotary is left unfused", meth)
            continue
        for m in modules:
            _push(m, meth, types.MethodType(rebuilt, m), owner)


@contextlib.contextmanager
def fused_ops(model: nn.Module, compile: bool = True) -> Iterator[int]:
    """Run ``model``'s RMSNorms, SiLU MLPs and rotary embedding (Qwen3/Llama; Qwen3.5/3.6 norms, MLPs
    and partial rotary) through the fused functions.

    Sets instance ``forward`` attributes on the matching submodules (exact class, so subclasses
    and other norms are untouched): norms and MLPs call the fused functions; attention modules
    run their class's forward with the fused rotary in place of ``apply_rotary_pos_emb`` (an
    attention module that already has an instance forward of its own, e.g. a hook's, keeps it
    and the stock rotary). Nothing outside ``model`` changes: other models of the family, and
    the modeling module's globals, are left alone. Everything is restored on exit, exceptions
    included. ``compile=False`` uses the plain functions (bitwise the stock result);
    ``compile=True`` their ``torch.compile``d versions (close, not bitwise: Inductor skips some
    intermediate roundings), compiled on first call, so warm up (``probe``) before a graph
    capture. Yields the number of norms and MLPs patched (0 for a family not covered).

    >>> with fused_ops(target.model) as n:     # doctest: +SKIP
    ...     logits = target.model(ids).logits
    """
    wrap = compiled if compile else (lambda fn: fn)
    norm_fn, mlp_fn, rotary_fn = wrap(rms_norm), wrap(silu_mul), wrap(rotary)
    owner = object()
    families = _family_classes()
    norm_types = {norm for _, norm, _, _ in families}
    other_norms, other_mlps = _other_classes()
    mlp_types = {mlp for _, _, mlp, _ in families} | other_mlps
    silu = _silu_types()
    patched = 0
    try:
        for m in model.modules():
            if type(m) in norm_types:
                _push(m, "forward", _norm_forward(m, norm_fn), owner)
                patched += 1
            elif type(m) in other_norms:
                name = other_norms[type(m)]
                _push(m, "forward", _other_norm_forward(m, wrap(globals()[name]), name == "rms_norm_gated"), owner)
                patched += 1
            elif type(m) in mlp_types and type(getattr(m, "act_fn", None)) in silu:
                _push(m, "forward", _mlp_forward(m, mlp_fn), owner)
                patched += 1
        for m in model.modules():  # attention layers whose q, k and v ``fuse_projections`` stored together
            if QKV in getattr(m, _FUSED, {}) and not any("forward" in vars(getattr(m, n)) for n in QKV):
                for name, forward in zip(QKV, _shared_projection_forwards(m, QKV)):
                    _push(getattr(m, name), "forward", forward, owner)
        rotaries = [(mod, attention, rotary_fn) for mod, _, _, attention in families]
        rotaries += [(mod, attention, wrap(globals()[fn])) for mod, attention, fn in _found(OTHER_ROTARY)]
        for mod, attention, fn in rotaries:
            # Free: no instance forward, or one a fused_ops context set (nested contexts).
            modules = [m for m in model.modules() if type(m) is attention
                       and ("forward" not in vars(m) or (id(m), "forward") in _PATCHES)]
            if not modules or not _reads_rotary_global(attention, mod):
                continue
            replacement = _rotary_for(vars(mod).get(ROTARY_GLOBAL), fn)
            forward = None if replacement is None else _with_globals(attention.forward, {ROTARY_GLOBAL: replacement})
            if forward is None:
                log.warning("%s.%s or %s.forward has an unknown shape; rotary left unfused", mod.__name__,
                            ROTARY_GLOBAL, attention.__name__)
                continue
            for m in modules:
                _push(m, "forward", types.MethodType(forward, m), owner)
        _fuse_dflash_rope(model, wrap, owner)
        yield patched
    finally:
        _pop_all(owner)
