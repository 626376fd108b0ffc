"""The tree delta rule of ``gdn_tree`` as Triton kernels: one launch per GDN layer of a tree verify.

``delta_rule_tensors`` solves, per value head, ``(I + A) U = rhs`` with A the n x n strictly
lower-triangular ancestor system and then ``O = e^gamma Q S0 + (Q K^T * D) U``, through a batched
triangular solve and dense ``[H, n, n]`` decay tensors: on a 48-GDN-layer model at n = 257 that is
about twenty launches and a few hundred microseconds per layer. Here one program owns a value head
and a slice of its value dimension and walks the nodes in blocks of ``BT`` rows (parents precede
children, so block b needs only blocks <= b):

    acc_u = beta_b (v_b - e^gamma_b K_b S0) - sum_{c<b} A_bc U_c     (A_bc = beta_b (K_b K_c^T * D_bc))
    U_b   = (I + A_bb)^-1 acc_u                                        (A_bb nilpotent: a product of
                                                                        log2(BT) factors I + A^(2^i))
    O_b   = e^gamma_b Q_b S0 + sum_{c<=b} (Q_b K_c^T * D_bc) U_c

with ``D_ij = e^{gamma_i - gamma_j}`` where j is i or an ancestor of i, else 0. ``U_c`` of earlier
blocks is read back from the output it was written to by the same program. Dots run in IEEE
float32 by default (the float32 tests' exactness); ``precision="tf32"`` trades that for speed.

The kernels live in ``gdn_tree_kernels``, imported on first use: without Triton (CPU wheels of
torch) ``available()`` is False and callers keep the torch math. ``TRITON_INTERPRET=1`` (set before
that import) runs the kernels on the CPU for tests.
"""

from __future__ import annotations

import functools
import importlib.util
import math

import torch
from torch import Tensor

PRECISIONS = ("ieee", "tf32")
DECAY_COLS = 32  # the decay kernels' ancestor columns per step of their anc @ g
PUSH_MAX_NODES = 128  # ``tree_push_kernel`` holds every row's sums in registers: [tile(n), value block] x 2
PUSH = False  # whether ``rule_options`` picks the push form where it applies


def available(device: torch.device) -> bool:
    """Whether the kernel can run on ``device``: Triton is installed and the device is a CUDA GPU."""
    return device.type == "cuda" and importlib.util.find_spec("triton") is not None


@functools.cache
def _kernels():
    from ddtree.models import gdn_tree_kernels  # imports Triton

    return gdn_tree_kernels


def rule_options(n: int, precision: str) -> dict:
    """The block, and one launch or split, for a tree of ``n`` nodes: the fastest measured form.

    One H100, Qwen3.6-27B's 48 value heads of 128 x 128, us per layer
    (``experiments/gdn_kernel_bench.py --sizes 65 257 --forms one split --blocks 16 32``, with n = 1 from
    ``docs/results/gdn_kernels_h100_partial.json``), value blocks of 32:

    ========  =========================  =========================  ===========================
    n         tf32 one (16 / 32)         tf32 split (16 / 32)       ieee split (16 / 32)
    ========  =========================  =========================  ===========================
    1         4.8 / 11.3                 6.6 / 10.1                 10.3 / 27.9
    65        38.1 / 76.0                26.6 / 30.7                56.0 / 86.7
    257       257.0 / 313.0              161.4 / 112.6              335.8 / 322.8
    ========  =========================  =========================  ===========================

    One launch only for a single tf32 node; 32-row blocks past 128 nodes. 64-row blocks (tf32 split)
    took 128.6 us at 257 and 36.6 at 65 (``docs/results/gdn_kernels_tree_conv_h100.json``). Value blocks
    of 64 (tf32 split, 16 / 32-row blocks) took 6.9 / 8.7 us at 1, 26.4 / 27.6 at 65 and 167.3 / 110.8 at
    257, against 6.6 / 10.0, 26.9 / 31.2 and 163.9 / 112.0 with 32 in the same H100 run: within noise of the
    blocks picked here, so the default of 32 stays (``docs/results/gdn_kernels_fused_prologue_h100.json``).

    With ``PUSH`` set, trees of up to ``PUSH_MAX_NODES`` nodes run the split form's substitution
    right-looking (``tree_push_kernel``).

    >>> rule_options(257, "tf32")
    {'block': 32, 'split': True, 'push': False}
    """
    split = n > 1 or precision == "ieee"
    return {"block": 32 if n > 128 else 16, "split": split, "push": PUSH and split and n <= PUSH_MAX_NODES}


def tree_delta_rule(
    q: Tensor,  # [n, Hk, dk] l2-normalised and scaled by dk^-1/2, float32
    k: Tensor,  # [n, Hk, dk] l2-normalised, float32
    v: Tensor,  # [n, H, dv] float32
    gamma: Tensor,  # [n, H] summed log decay along each node's root path
    beta: Tensor,  # [n, H]
    initial_state: Tensor,  # [H, dk, dv] float32
    anc: Tensor,  # [n, n] bool, ``ancestor_matrix``
    block: int = 32,
    value_block: int = 32,
    precision: str = "ieee",
    split: bool = False,
    updates: Tensor | None = None,  # [n, H, dv] contiguous float32: where the updates are written
    out_dtype: torch.dtype = torch.float32,
    push: bool = False,
) -> tuple[Tensor, Tensor]:  # out [n, H, dv], updates [n, H, dv]
    """Per-node outputs and updates of the tree delta rule (``delta_rule_tensors``'s math).
    ``updates`` names the tensor the updates go to (the hybrid fast path's commit stash); by default a
    new one. ``out_dtype``: the outputs are computed in float32 and stored in it, rounded to nearest even
    as ``.to(out_dtype)`` rounds (a bf16 model's layer casts them so before its gated norm: no cast
    kernel of its own then).

    One launch by default. ``split=True`` first builds every block of the system, of the masked
    scores and of the diagonal inverses in parallel (a program per head and row block, into
    ``[H, n', n']`` scratch), then runs the block forward substitution over them: a shorter
    dependent chain per program for more memory traffic (the same math and rounding steps).
    ``push=True`` (with ``split``, up to ``PUSH_MAX_NODES`` nodes) runs that substitution
    right-looking, every row's sums in registers (``tree_push_kernel``): no solved block is read back
    from memory on the dependent chain. The same sums in the same order.

    >>> out, u = tree_delta_rule(q, k, v, gamma, beta, s0, anc)     # doctest: +SKIP
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r}: choose one of {PRECISIONS}")
    n, hk, dk = k.shape
    h, dv = v.shape[1], v.shape[2]
    value_block = min(value_block, dv)
    if block & (block - 1) or block < 16 or dv % value_block:
        raise ValueError(f"block {block} must be a power of two >= 16 and value_block {value_block} divide dv {dv}")
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    gamma, beta = gamma.float().contiguous(), beta.float().contiguous()
    s0 = initial_state.float().contiguous()
    anc = anc.contiguous().view(torch.int8)
    out = torch.empty(n, h, dv, dtype=out_dtype, device=v.device)
    if updates is None:
        updates = torch.empty(n, h, dv, dtype=torch.float32, device=v.device)
    elif updates.shape != out.shape or updates.dtype != torch.float32 or not updates.is_contiguous():
        raise ValueError(f"updates must be a contiguous {tuple(out.shape)} float32 tensor, got "
                         f"{tuple(updates.shape)} {updates.dtype}")
    if push and not (split and n <= PUSH_MAX_NODES):
        raise ValueError(f"push runs with split=True and at most {PUSH_MAX_NODES} nodes, not split={split}, n={n}")
    kernels, log2bt = _kernels(), block.bit_length() - 1
    if not split:
        kernels.tree_delta_kernel[(h, dv // value_block)](
            q, k, v, gamma, beta, s0, anc, out, updates,
            q.stride(0), v.stride(0), gamma.stride(0), anc.stride(0), out.stride(0),
            N=n, R=h // hk, DK=dk, DV=dv, BV=value_block, BT=block, LOG2BT=log2bt, PRECISION=precision,
        )
        return out, updates
    blocks = -(-n // block)
    padded = blocks * block
    system = torch.empty(h, padded, padded, dtype=torch.float32, device=v.device)  # only blocks c <= b are written
    scores = torch.empty_like(system)
    inverse = torch.empty(h, padded, block, dtype=torch.float32, device=v.device)
    kernels.tree_system_kernel[(h, blocks)](
        q, k, gamma, beta, anc, system, scores, inverse, q.stride(0), gamma.stride(0), anc.stride(0),
        N=n, NP=padded, R=h // hk, DK=dk, BT=block, LOG2BT=log2bt, PRECISION=precision,
    )
    if push:
        kernels.tree_push_kernel[(h, dv // value_block)](
            q, k, v, gamma, beta, s0, system, scores, inverse, out, updates,
            q.stride(0), v.stride(0), gamma.stride(0), out.stride(0),
            N=n, NP=padded, NR=max(tile(n), block), R=h // hk, DK=dk, DV=dv, BV=value_block, BT=block,
            KC=min(dk, 32), PRECISION=precision, num_warps=8 if n > 64 else 4,
        )
        return out, updates
    kernels.tree_solve_kernel[(h, dv // value_block)](
        q, k, v, gamma, beta, s0, system, scores, inverse, out, updates,
        q.stride(0), v.stride(0), gamma.stride(0), out.stride(0),
        N=n, NP=padded, R=h // hk, DK=dk, DV=dv, BV=value_block, BT=block, PRECISION=precision,
    )
    return out, updates


def tree_conv(
    x: Tensor,  # [n, C] pre-conv inputs
    window: Tensor,  # [C, K] committed conv window
    weight: Tensor,  # [C, K] depthwise kernel
    bias: Tensor | None,  # [C]
    taps: Tensor,  # [n, K] ``conv_taps``
    block_nodes: int = 16,
    block_channels: int = 256,
    copy: Tensor | None = None,  # [n, C] contiguous, x's dtype: also receives x, row for row
) -> Tensor:  # [n, C]
    """``gdn_tree.tree_causal_conv1d`` (conv over each node's root path, then SiLU) as one Triton kernel:
    a program per tile of nodes and channels reads its taps' rows in place from the window and x.
    ``copy`` also gets x itself, written by the same programs (the hybrid fast path's commit stash).

    >>> y = tree_conv(x, window, weight, None, conv_taps(parents, 4))   # doctest: +SKIP
    """
    n, c = x.shape
    k = weight.shape[-1]
    out = torch.empty(n, c, dtype=x.dtype, device=x.device)
    _check_copy(x, copy)
    if n == 0:
        return out
    weight = weight.contiguous()
    x = x if x.stride(1) == 1 else x.contiguous()  # rows may be strided (a column slice of a fused projection)
    grid = (-(-n // block_nodes), -(-c // block_channels))
    _kernels().tree_conv_kernel[grid](
        x, window.contiguous(), weight, weight if bias is None else bias.contiguous(), taps.contiguous(),
        out, out if copy is None else copy, n, c, x.stride(0), K=k, HAS_BIAS=bias is not None,
        COPY=copy is not None, BN=block_nodes, BC=block_channels,
    )
    return out


def tile(n: int) -> int:
    """``n`` rounded up to a power of two, at least 16: the side of a Triton tile that holds n (a dot's
    smallest).

    >>> tile(48), tile(128), tile(5)
    (64, 128, 16)
    """
    return max(16, 1 << max(n - 1, 0).bit_length())


def heads_fit(dk: int, key_dim: int, channels: int) -> bool:
    """Whether ``tree_conv_heads`` serves a layer: heads of a power-of-two ``dk`` >= 16 tile the q, k and v
    channels exactly."""
    return dk >= 16 and not dk & (dk - 1) and key_dim % dk == 0 and (channels - 2 * key_dim) % dk == 0


def _check_copy(x: Tensor, copy: Tensor | None) -> None:
    if copy is not None and (copy.shape != x.shape or copy.dtype != x.dtype or not copy.is_contiguous()):
        raise ValueError(f"copy must be a contiguous {tuple(x.shape)} {x.dtype} tensor, got {tuple(copy.shape)} "
                         f"{copy.dtype}")


def _heads_outputs(x: Tensor, key_dim: int, dk: int, copy: Tensor | None,
                   keys_out: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:  # q, k [n, key_dim / dk, dk], v
    """``tree_conv_heads``' checks and its outputs, allocated (the keys' where ``keys_out`` is None)."""
    n, c = x.shape
    if not heads_fit(dk, key_dim, c):
        raise ValueError(f"heads of {dk} channels do not tile key_dim {key_dim} and {c} channels (need a power "
                         "of two >= 16 that divides both)")
    q = torch.empty(n, key_dim // dk, dk, dtype=torch.float32, device=x.device)
    if keys_out is None:
        keys_out = torch.empty_like(q)
    elif keys_out.shape != q.shape or keys_out.dtype != torch.float32 or not keys_out.is_contiguous():
        raise ValueError(f"keys_out must be a contiguous {tuple(q.shape)} float32 tensor, got "
                         f"{tuple(keys_out.shape)} {keys_out.dtype}")
    _check_copy(x, copy)
    return q, keys_out, torch.empty(n, c - 2 * key_dim, dtype=torch.float32, device=x.device)


def _heads_launch(x: Tensor, window: Tensor, weight: Tensor, bias: Tensor | None, taps: Tensor, q: Tensor,
                  keys: Tensor, v: Tensor, copy: Tensor | None, dk: int) -> tuple[tuple, dict]:
    """The arguments every launch of ``conv_heads_tile`` starts with, and its constants."""
    x = x if x.stride(1) == 1 else x.contiguous()  # rows may be strided (a column slice of a fused projection)
    weight = weight.contiguous()
    operands = (x, window.contiguous(), weight, weight if bias is None else bias.contiguous(), taps.contiguous(), q,
                keys, v, x if copy is None else copy)
    return operands, dict(K=weight.shape[-1], HAS_BIAS=bias is not None, COPY=copy is not None, DK=dk)


def tree_conv_heads(
    x: Tensor,  # [n, C] pre-conv inputs, C = 2 key_dim + value_dim
    window: Tensor,  # [C, K] committed conv window
    weight: Tensor,  # [C, K] depthwise kernel
    bias: Tensor | None,  # [C]
    taps: Tensor,  # [n, K] ``conv_taps``
    key_dim: int,
    dk: int,
    block_nodes: int = 16,
    copy: Tensor | None = None,  # [n, C] contiguous, x's dtype: also receives x, row for row
    keys_out: Tensor | None = None,  # [n, key_dim / dk, dk] contiguous, float32: where the keys go
) -> tuple[Tensor, Tensor, Tensor]:  # q, k [n, key_dim / dk, dk], v [n, C - 2 key_dim], float32
    """``tree_conv`` and the split, l2 norms and float32 casts of ``gdn_tree_layer.mix_inputs_after_conv``
    as one kernel, a program per tile of nodes and one head: q (l2-normalised, times dk^-1/2), k
    (l2-normalised) and v, as the delta rule reads them. The conv's output is rounded to x's dtype
    first, as the layer stores it. Needs ``heads_fit(dk, key_dim, C)``.

    >>> q, k, v = tree_conv_heads(x, window, weight, None, taps, key_dim=2048, dk=128)   # doctest: +SKIP
    """
    q, keys, v = _heads_outputs(x, key_dim, dk, copy, keys_out)
    n, c = x.shape
    if n == 0:
        return q, keys, v
    operands, constants = _heads_launch(x, window, weight, bias, taps, q, keys, v, copy, dk)
    _kernels().tree_conv_heads_kernel[(-(-n // block_nodes), c // dk)](
        *operands, n, c, key_dim, operands[0].stride(0), dk**-0.5, 1e-6, BN=block_nodes, **constants,
    )
    return q, keys, v


def _decay_outputs(a: Tensor, gamma_out: Tensor | None) -> tuple[Tensor, Tensor]:  # gamma, beta [n, H] float32
    """``tree_decay``'s check and its outputs, allocated (gamma's where ``gamma_out`` is None)."""
    n, h = a.shape
    gamma = torch.empty(n, h, dtype=torch.float32, device=a.device) if gamma_out is None else gamma_out
    if gamma.shape != (n, h) or gamma.dtype != torch.float32 or not gamma.is_contiguous():
        raise ValueError(f"gamma_out must be a contiguous {(n, h)} float32 tensor, got {tuple(gamma.shape)} "
                         f"{gamma.dtype}")
    return gamma, torch.empty(n, h, dtype=torch.float32, device=a.device)


def _decay_launch(a: Tensor, beta: Tensor, a_log: Tensor, dt_bias: Tensor, anc: Tensor, gamma: Tensor,
                  beta_out: Tensor) -> tuple[tuple, tuple]:
    """The arguments every launch of ``decay_tile`` starts with, and its strides (a's rows, beta's, anc's)."""
    a = a if a.stride(1) == 1 else a.contiguous()  # rows may be strided (column slices of a fused projection)
    beta = beta if beta.stride(1) == 1 else beta.contiguous()
    anc = anc.contiguous().view(torch.int8)
    strides = (a.stride(0), beta.stride(0), anc.stride(0))
    return (a, beta, a_log.contiguous(), dt_bias.contiguous(), anc, gamma, beta_out), strides


def tree_decay(
    a: Tensor,  # [n, H] in_proj_a output (rows may be strided)
    beta: Tensor,  # [n, H] sigmoid of in_proj_b, model dtype (``beta_logits``: in_proj_b's output itself)
    a_log: Tensor,  # [H]
    dt_bias: Tensor,  # [H]
    anc: Tensor,  # [n, n] bool, ``ancestor_matrix``
    gamma_out: Tensor | None = None,  # [n, H] contiguous float32: where gamma goes
    block_nodes: int = 16,
    block_cols: int = DECAY_COLS,
    beta_logits: bool = False,
) -> tuple[Tensor, Tensor]:  # gamma, beta [n, H] float32
    """The path-summed log decay ``gamma = anc @ g`` with ``g = -exp(A_log) softplus(a + dt_bias)``, and beta
    in float32, as ``gdn_tree_layer.mix_inputs_after_conv`` computes them, in one kernel. ``beta_logits``: ``beta``
    is in_proj_b's output and the kernel takes its sigmoid (in float32, rounded to its dtype as ``b.sigmoid()``
    is; Triton's exp and division put it within a few float32 ulps of torch's before that rounding), which saves
    the layer a launch.

    >>> gamma, beta32 = tree_decay(a, beta, module.A_log, module.dt_bias, anc)   # doctest: +SKIP
    """
    gamma, beta_out = _decay_outputs(a, gamma_out)
    n, h = a.shape
    if n == 0:
        return gamma, beta_out
    operands, strides = _decay_launch(a, beta, a_log, dt_bias, anc, gamma, beta_out)
    _kernels().tree_decay_kernel[(-(-n // block_nodes),)](
        *operands, h, *strides, N=n, BN=block_nodes, BJ=block_cols, HP=tile(h), SIGMOID=beta_logits,
    )
    return gamma, beta_out


def tree_prologue(x: Tensor, window: Tensor, weight: Tensor, bias: Tensor | None, taps: Tensor, key_dim: int, dk: int,
                  a: Tensor, beta: Tensor, a_log: Tensor, dt_bias: Tensor, anc: Tensor, copy: Tensor | None = None,
                  keys_out: Tensor | None = None, gamma_out: Tensor | None = None,
                  block_nodes: int = 16, beta_logits: bool = False) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``tree_conv_heads(x, window, weight, bias, taps, key_dim, dk, copy=copy, keys_out=keys_out)`` then
    ``tree_decay(a, beta, a_log, dt_bias, anc, gamma_out=gamma_out, beta_logits=beta_logits)`` (shapes and checks
    as there) in one launch, the same values bit for bit: q, k [n, key_dim / dk, dk], v [n, C - 2 key_dim], gamma and beta
    [n, H], all float32. Per node block, a program per head runs the conv's work and one more the decay's
    (which reads no conv output): everything ``gdn_tree_layer.tree_mix_triton`` computes before the rule.

    >>> q, k, v, gamma, beta32 = tree_prologue(x, window, weight, None, taps, 2048, 128, a, beta,
    ...                                        module.A_log, module.dt_bias, anc)   # doctest: +SKIP
    """
    q, keys, v = _heads_outputs(x, key_dim, dk, copy, keys_out)
    gamma, beta_out = _decay_outputs(a, gamma_out)
    (n, c), h = x.shape, a.shape[1]
    if n == 0:
        return q, keys, v, gamma, beta_out
    heads, constants = _heads_launch(x, window, weight, bias, taps, q, keys, v, copy, dk)
    decay, strides = _decay_launch(a, beta, a_log, dt_bias, anc, gamma, beta_out)
    _kernels().tree_prologue_kernel[(-(-n // block_nodes), c // dk + 1)](
        *heads, *decay, c, key_dim, h, heads[0].stride(0), *strides, dk**-0.5, 1e-6, N=n, BN=block_nodes,
        BJ=DECAY_COLS, HP=tile(h), SIGMOID=beta_logits, **constants,
    )
    return q, keys, v, gamma, beta_out


def commit_state(state: Tensor, log_decay: Tensor, keys: Tensor, updates: Tensor, path: Tensor,
                 value_block: int = 32) -> Tensor:
    """The recurrent states after the accepted ``path`` ([a] node indices below n on the device, root first; not
    checked, as a host read would be: a graph replays this), written
    into ``state`` ([G, H, dk, dv] contiguous float32, the committed states) in one pass: per GDN layer
    ``S_a = e^{gamma_a} S0 + sum_j e^{gamma_a - gamma_j} k_j u_j^T`` (``gdn_tree.commit_delta_state``) from the
    verify's stash, ``log_decay`` [G, n, H], ``keys`` [G, n, Hk, dk] and ``updates`` [G, n, H, dv] (float32).
    Where the torch form scales the states, then adds a batched GEMM into them, reading and writing them
    twice, this reads and writes them once (151 MB each way on Qwen3.6-27B). Returns ``state``.

    >>> commit_state(target.recurrent, stash.log_decay, stash.keys, stash.updates, path)   # doctest: +SKIP
    """
    g, h, dk, dv = state.shape
    a = path.shape[0]
    if state.dtype != torch.float32 or not state.is_contiguous():
        raise ValueError(f"state must be a contiguous float32 [G, H, dk, dv] tensor, got {state.dtype} "
                         f"strides {state.stride()}")
    if a == 0:
        raise ValueError("commit_state of an empty path: the root is always accepted; pass at least node 0")
    if path.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"path must hold node indices (int32 or int64), got {path.dtype}")
    n, hk = keys.shape[1], keys.shape[2]
    shapes = {"log_decay": (log_decay, (g, n, h)), "keys": (keys, (g, n, hk, dk)), "updates": (updates, (g, n, h, dv))}
    for name, (tensor, shape) in shapes.items():
        if tensor.dtype != torch.float32 or tuple(tensor.shape) != shape:
            raise ValueError(f"{name} must be a float32 {shape} stash for a state of shape {tuple(state.shape)} "
                             f"(keys [G, n, Hk, dk]), got {tensor.dtype} {tuple(tensor.shape)}")
    if h % hk:
        raise ValueError(f"{h} value heads do not share {hk} key heads evenly")
    block = math.gcd(dv, value_block)  # a power of two dividing dv: the value columns of a program
    if block < 16 or dk != tile(dk):
        raise ValueError(f"commit_state needs dk a power of two >= 16 and dv a multiple of 16, got {dk} and {dv}")
    stash = (log_decay.contiguous(), keys.contiguous(), updates.contiguous())
    _kernels().commit_state_kernel[(g * h, dv // block)](
        state, *stash, path.contiguous(), a, h, h // hk, n, DK=dk, DV=dv, BV=block, AP=tile(a),
    )
    return state
