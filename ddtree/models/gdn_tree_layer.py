"""Tree verification of a transformers ``Qwen3_5GatedDeltaNet`` layer, without touching its cache.

``gdn_tree_forward`` runs the layer's own per-token modules (projections, gated norm,
``out_proj``) and replaces the two sequence-mixing steps by their tree forms from
``gdn_tree``. It returns the layer output for every node plus a ``GDNTreeVerify`` stash;
``commit_gdn_path`` turns the stash and the accepted path into the new layer state, which
``write_gdn_state`` copies into the cache. The projections are never re-run.

Cache layout (identical in transformers 5.17 and 5.24, ``LinearAttentionLayer``):
``layer.conv_states[0]`` ``[B, C, K]`` in the model dtype (more than K columns while
``record_past`` is on, fewer after a short prefill in that mode), ``layer.recurrent_states[0]``
``[B, H, dk, dv]`` float32, ``layer.has_previous_state[0]``. The Cache-level getters differ
between the two versions, so the layer attributes are read directly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ddtree.models import fused, gdn_tree_triton
from ddtree.models.gdn_tree import (
    DeltaTreeResult,
    TreeTables,
    commit_conv_window,
    commit_delta_state,
    delta_rule_solve,
    l2norm,
    tree_causal_conv1d,
)


@dataclass(frozen=True)
class GDNState:
    """One GDN layer's committed state for a single sequence."""

    conv_window: Tensor  # [C, K] last K conv inputs, oldest first, model dtype
    recurrent_state: Tensor  # [H, dk, dv] float32 (float64 in float64 tests)


@dataclass(frozen=True)
class GDNTreeVerify:
    """What a no-commit tree pass through one GDN layer keeps for the commit."""

    conv_inputs: Tensor  # [n, C] pre-conv in_proj_qkv outputs
    conv_window: Tensor  # [C, K] the window the pass started from
    delta: DeltaTreeResult


def read_gdn_state(cache, layer_idx: int, kernel_size: int) -> GDNState | None:
    """The committed state of GDN layer ``layer_idx`` (batch row 0), or None before any forward.

    The window is returned as exactly K columns: in ``record_past`` mode transformers keeps all
    recent columns (or, after a prefill shorter than K, fewer than K without padding).
    """
    layer = cache.layers[layer_idx]
    if not layer.has_previous_state[0]:
        return None
    window = layer.conv_states[0][0, :, -kernel_size:]  # [C, <=K]
    if window.shape[-1] < kernel_size:
        window = F.pad(window, (kernel_size - window.shape[-1], 0))
    return GDNState(conv_window=window, recurrent_state=layer.recurrent_states[0][0])


def write_gdn_state(cache, layer_idx: int, state: GDNState, tokens: int = 0) -> None:
    """Store ``state`` as the committed state of GDN layer ``layer_idx`` (batch size 1), ``tokens``
    more tokens than before.

    Copies in place where the shapes allow, which keeps the static addresses transformers marks
    for CUDA graphs; the recurrent buffer stays float32 whatever ``state`` holds. Where the layer
    counts its tokens (``cumulative_length_linear``, transformers >= 5.25, which then reads the
    cache's length, and so the next positions, from it) the count grows by ``tokens``.
    """
    layer = cache.layers[layer_idx]
    window = state.conv_window[None]  # [1, C, K]
    recurrent = state.recurrent_state[None]  # [1, H, dk, dv]
    if layer.conv_states[0] is None:
        layer.lazy_initialization(conv_states=window, conv_kernel_size=window.shape[-1])
    if layer.recurrent_states[0] is None:
        layer.lazy_initialization(recurrent_states=recurrent.float())
    conv = layer.conv_states[0]
    if conv.shape == window.shape:
        conv.copy_(window)
    else:  # record_past mode grew the window: assign, as transformers itself does there
        layer.conv_states[0] = window.to(conv.dtype).clone()
    layer.recurrent_states[0].copy_(recurrent)
    layer.has_previous_state[0] = True
    if tokens and hasattr(layer, "cumulative_length_linear"):
        layer.cumulative_length_linear.add_(tokens)


def gdn_tree_forward(
    module: nn.Module,
    hidden_states: Tensor,  # [1, n, D] input of linear_attn (after input_layernorm)
    parents: Tensor,  # [n] long, parents[i] < i, -1 for the root
    state: GDNState | None,  # committed state; None for an empty prefix
    tables: TreeTables | None = None,  # the tree's tables when built once for all layers
    mix: Callable | None = None,  # the mixing steps: ``tree_mix`` (default), its compiled form, or ``tree_mix_triton``
) -> tuple[Tensor, GDNTreeVerify]:  # [1, n, D]
    """Output of a ``Qwen3_5GatedDeltaNet`` for every tree node, each seeing only its root path.

    Node i's output equals the layer's output for the last token when the root->i path is
    fed after the committed prefix. The cache is not read or written here; pass the state from
    ``read_gdn_state``. Mirrors the layer's dtype handling: beta = sigmoid in the model dtype,
    g and the delta rule in at least float32, the core output cast back before the gated norm.
    """
    if hidden_states.shape[0] != 1:
        raise ValueError(f"tree verification is per sequence, got batch {hidden_states.shape[0]}")
    if module.activation != "silu":
        raise ValueError(f"the GDN conv applies {module.activation!r}; only 'silu' is supported")
    n = hidden_states.shape[1]
    dtype = hidden_states.dtype
    h, dk, dv = module.num_v_heads, module.head_k_dim, module.head_v_dim
    weight = module.conv1d.weight[:, 0, :]  # [C, K]
    if state is None:
        window = torch.zeros_like(weight)
        initial = None
    else:
        window, initial = state.conv_window, state.recurrent_state

    # One GEMM where ``fused.fuse_projections`` stored the four together (column views of its output).
    x, z, b, a = fused.project(module, fused.GDN_INPUTS, hidden_states)
    x = x[0]  # [n, C]
    z = z[0].reshape(n, h, dv)
    b, a = b[0], a[0]  # [n, H] each
    # beta = sigmoid(b) in the model dtype, taken here, outside any compiled mix (Inductor would not round it to
    # that dtype); a mix that takes the logits (``takes_logits``) runs the sigmoid in a kernel of its own.
    beta = b if takes_logits(mix) else b.sigmoid()
    if tables is None:
        tables = TreeTables.of(parents, module.conv_kernel_size)
    if initial is None:
        initial = torch.zeros(h, dk, dv, dtype=torch.promote_types(dtype, torch.float32), device=x.device)
    out, keys, updates, log_decay, s0 = (mix or tree_mix)(
        x, a, beta, module.A_log, module.dt_bias, window, weight, module.conv1d.bias, initial, tables.taps,
        tables.anc, module.key_dim, module.value_dim, dk,
    )
    delta = DeltaTreeResult(out=out, keys=keys, updates=updates, log_decay=log_decay, initial_state=s0)
    core = module.norm(delta.out.to(dtype).reshape(-1, dv), z.reshape(-1, dv))  # [n * H, dv]
    out = module.out_proj(core.reshape(1, n, h * dv))
    return out, GDNTreeVerify(conv_inputs=x, conv_window=window, delta=delta)


def tree_mix(
    x: Tensor,  # [n, C] pre-conv inputs
    a: Tensor,  # [n, H] in_proj_a output
    beta: Tensor,  # [n, H] sigmoid of in_proj_b, model dtype
    a_log: Tensor,  # [H]
    dt_bias: Tensor,  # [H]
    window: Tensor,  # [C, K] committed conv window
    weight: Tensor,  # [C, K] depthwise kernel
    bias: Tensor | None,  # [C]
    initial: Tensor,  # [H, dk, dv] committed recurrent state
    taps: Tensor,  # [n, K] ``conv_taps``
    anc: Tensor,  # [n, n] ``ancestor_matrix``
    key_dim: int,
    value_dim: int,
    dk: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:  # out [n, H, dv], keys, updates, log_decay, S0
    """A GDN layer's two sequence-mixing steps over a tree, between its projections and its gated
    norm: the decay g, the tree conv, then the tree delta rule. Tensors in and out only, so that
    ``torch.compile`` can fuse its elementwise work (on a 48-GDN-layer model at batch 1 the many
    tiny kernels of the eager form cost more than its arithmetic)."""
    q, k, v, gamma, beta = tree_mix_inputs(x, a, beta, a_log, dt_bias, window, weight, bias, taps, anc, key_dim,
                                           value_dim, dk)
    return delta_rule_solve(q, k, v, gamma, beta, initial, anc)


def tree_mix_inputs(x: Tensor, a: Tensor, beta: Tensor, a_log: Tensor, dt_bias: Tensor, window: Tensor,
                    weight: Tensor, bias: Tensor | None, taps: Tensor, anc: Tensor, key_dim: int, value_dim: int,
                    dk: int, keys_out: Tensor | None = None,
                    log_decay_out: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``tree_mix`` up to the delta rule, in the compute dtype: q (l2-normalised, scaled by dk^-1/2) and k
    (l2-normalised) ``[n, Hk, dk]``, v ``[n, H, dv]``, the path-summed log decay gamma and beta ``[n, H]``
    (k and gamma written into ``keys_out`` and ``log_decay_out`` where given, see ``mix_inputs_after_conv``)."""
    mixed = tree_causal_conv1d(x, None, window, weight, bias, taps)  # [n, C]
    return mix_inputs_after_conv(mixed, a, beta, a_log, dt_bias, anc, key_dim, dk, keys_out, log_decay_out)


def mix_inputs_after_conv(mixed: Tensor, a: Tensor, beta: Tensor, a_log: Tensor, dt_bias: Tensor, anc: Tensor,
                          key_dim: int, dk: int, keys_out: Tensor | None = None,
                          log_decay_out: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``tree_mix_inputs`` from the conv's output ``mixed`` [n, C] on: the decay, the split, the l2 norms.
    ``keys_out`` [n, Hk, dk] and ``log_decay_out`` [n, H] (compute dtype), where given, receive k and gamma
    and are returned in their place: compiled, the kernels that compute them store them there, with no
    copy of their own."""
    n, h = a.shape
    compute = torch.promote_types(a.dtype, torch.float32)
    g = -a_log.to(compute).exp() * F.softplus(a.to(compute) + dt_bias)  # [n, H]
    # Sizes off the tensor, not value_dim: a compiled graph with dynamic ints need not prove they add up.
    q, k, v = torch.split(mixed.to(compute), [key_dim, key_dim, mixed.shape[-1] - 2 * key_dim], dim=-1)
    q = l2norm(q.reshape(n, -1, dk)) * dk**-0.5
    k = l2norm(k.reshape(n, -1, dk))
    gamma = anc.to(compute) @ g
    if keys_out is not None:
        k = keys_out.copy_(k)
    if log_decay_out is not None:
        gamma = log_decay_out.copy_(gamma)
    return q, k, v.reshape(n, h, -1), gamma, beta.to(compute)


# Whether ``tree_mix_triton`` runs the tree conv as its own Triton kernel (``gdn_tree_triton.tree_conv``)
# rather than inside the compiled prologue (where Inductor builds it from the gathers).
TRITON_CONV = True
# Whether ``tree_mix_triton`` runs everything before the delta rule as one Triton kernel where the heads fit
# (``gdn_tree_triton.tree_prologue``: the tree conv with each head's split, l2 norm and cast, and in the same
# launch the decay), rather than the Triton conv and a compiled prologue of several kernels.
FUSED_PROLOGUE = True


def fused_prologue(dk: int, key_dim: int, channels: int) -> bool:
    """Whether ``tree_mix_triton`` runs the one-kernel prologue (``gdn_tree_triton.tree_prologue``) for a layer
    of these sizes (``FUSED_PROLOGUE``)."""
    return TRITON_CONV and FUSED_PROLOGUE and gdn_tree_triton.heads_fit(dk, key_dim, channels)


def tree_mix_triton(x: Tensor, a: Tensor, b: Tensor, a_log: Tensor, dt_bias: Tensor, window: Tensor,
                    weight: Tensor, bias: Tensor | None, initial: Tensor, taps: Tensor, anc: Tensor, key_dim: int,
                    value_dim: int, dk: int, conv_copy: Tensor | None = None, updates_out: Tensor | None = None,
                    keys_out: Tensor | None = None,
                    log_decay_out: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``tree_mix`` with its elementwise steps compiled and the tree conv and delta rule as Triton kernels
    (``gdn_tree_triton``); the same outputs, on a CUDA device with Triton. Its dots are IEEE float32
    for a float32 model and tf32 for a bf16/fp16 one (whose projections already round to 8-10 bits).
    ``conv_copy`` [n, C] receives x and ``updates_out`` [n, H, dv] the updates, written by the kernels
    themselves, and ``keys_out`` [n, Hk, dk] and ``log_decay_out`` [n, H] the keys and the log decay,
    written by the kernel before the rule (``FUSED_PROLOGUE``) or the compiled prologue (the fast path's
    commit stash, without a copy per layer); the returned keys and log decay are then those tensors.
    The output comes in the model's dtype (``x``'s), as the layer casts it before its gated norm
    (``tree_mix`` gives it in float32: the same values once cast). It takes in_proj_b's output ``b`` rather
    than beta (``takes_logits``): with the one-kernel prologue the sigmoid runs in that kernel
    (``beta_logits``), else here, in the model's dtype, before the compiled steps."""
    outs = (keys_out, log_decay_out)
    if fused_prologue(dk, key_dim, x.shape[-1]):
        q, k, v, gamma, beta = gdn_tree_triton.tree_prologue(x, window, weight, bias, taps, key_dim, dk, a, b,
                                                             a_log, dt_bias, anc, copy=conv_copy, keys_out=keys_out,
                                                             gamma_out=log_decay_out, beta_logits=True)
        v = v.view(x.shape[0], a.shape[1], -1)
    elif TRITON_CONV:
        mixed = gdn_tree_triton.tree_conv(x, window, weight, bias, taps, copy=conv_copy)
        q, k, v, gamma, beta = fused.compiled(mix_inputs_after_conv)(mixed, a, b.sigmoid(), a_log, dt_bias, anc,
                                                                     key_dim, dk, *outs)
    else:
        if conv_copy is not None:
            conv_copy.copy_(x)
        q, k, v, gamma, beta = fused.compiled(tree_mix_inputs)(x, a, b.sigmoid(), a_log, dt_bias, window, weight, bias,
                                                               taps, anc, key_dim, value_dim, dk, *outs)
    precision = "ieee" if x.dtype in (torch.float32, torch.float64) else "tf32"
    out, updates = gdn_tree_triton.tree_delta_rule(q, k, v, gamma, beta, initial, anc, precision=precision,
                                                   updates=updates_out, out_dtype=x.dtype,
                                                   **gdn_tree_triton.rule_options(q.shape[0], precision))
    return out, k, updates, gamma, initial


tree_mix_triton.takes_logits = True  # its third argument is in_proj_b's output, not beta


def takes_logits(mix: Callable | None) -> bool:
    """Whether a mixing function (or a ``functools.partial`` of one) takes in_proj_b's output rather than beta."""
    return bool(getattr(getattr(mix, "func", mix), "takes_logits", False))


def commit_gdn_path(
    verify: GDNTreeVerify,
    path: Tensor | Sequence[int],  # accepted node indices, root first, e.g. [0, 3, 7]
) -> GDNState:
    """The layer state a sequential forward over the path's tokens would leave.

    ``path`` must be the root path of its last node (each entry the parent of the next).
    """
    return GDNState(
        conv_window=commit_conv_window(verify.conv_inputs, verify.conv_window, path),
        recurrent_state=commit_delta_state(verify.delta, path),
    )
