"""Exact tree verification math for Gated DeltaNet (GDN) layers.

A GDN layer is per-token everywhere except in two places: a depthwise causal conv over the
last K inputs, and the gated delta rule recurrence. To verify a token tree in one pass, both
are evaluated so that node i sees exactly its root path, as if that path had been decoded
token by token after the committed prefix:

- conv: node i's window is its ancestor chain (nearest last), then the committed window;
- delta rule: node i's state is its parent's state (a root's: the committed state) updated by
  node i's token. The closed form below solves every node at once.

Tree convention: ``parents[i] < i``, and ``parents[i] == -1`` attaches node i to the committed
prefix (node 0, the root, always; a forest is allowed). Nothing here touches a cache; the
commit functions return what a sequential forward over the accepted path would leave.

Conv window layout (as transformers keeps ``conv_states``): ``[C, K]``, K columns, oldest
first, so column ``K - r`` is the r-th most recent committed input. The next token's conv reads
only columns 1..K-1; column 0 is kept but unused.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor


def ancestor_matrix(parents: Tensor) -> Tensor:  # [n, n] bool
    """``anc[i, j]`` is True when j is i or an ancestor of i.

    Built by pointer doubling (row i |= row of its 2^s-th ancestor), so the number of steps is
    ceil(log2 n) with no data-dependent control flow and no host sync: it is captured in CUDA graphs.

    >>> ancestor_matrix(torch.tensor([-1, 0, 0, 1])).int()[3].tolist()
    [1, 1, 0, 1]
    """
    n = parents.shape[0]
    device = parents.device
    # Index n is a sentinel "above the prefix": its row is empty and it is its own ancestor.
    jump = torch.where(parents < 0, n, parents).long()
    jump = torch.cat([jump, torch.full((1,), n, dtype=torch.long, device=device)])  # [n + 1]
    # No index assignment of a Python constant: inside a CUDA graph capture that is a host copy.
    anc = torch.cat([torch.eye(n, dtype=torch.bool, device=device), torch.zeros(1, n, dtype=torch.bool, device=device)])
    for _ in range(max(1, math.ceil(math.log2(max(n, 2))))):
        anc = anc | anc[jump]  # now covers distances < 2^(s+1)
        jump = jump[jump]
    return anc[:n]


def conv_taps(parents: Tensor, kernel_size: int) -> Tensor:  # [n, K] long
    """Rows of ``[conv_window^T ; x]`` that node i's conv reads, oldest tap first.

    Rows 0..K-1 are the window columns, row K + i is node i. Walking up one step from a node
    goes to its parent, or from a root into the newest window column (row K-1); from a window
    column it goes one column older. K-1 steps never go past column 1.
    """
    n, k = parents.shape[0], kernel_size
    device = parents.device
    nodes_up = torch.where(parents < 0, k - 1, parents + k).long()  # [n]
    window_up = (torch.arange(k, device=device) - 1).clamp(min=0)  # [K]
    up = torch.cat([window_up, nodes_up])  # [K + n]
    taps = [torch.arange(k, k + n, device=device)]
    for _ in range(k - 1):
        taps.append(up[taps[-1]])
    # taps[m] is the m-th ancestor; kernel column K-1-m multiplies it (cross-correlation order).
    return torch.stack(taps[::-1], dim=1)


@dataclass(frozen=True)
class TreeTables:
    """What every GDN layer of one tree forward reads about the tree: built once per forward,
    not once per layer (on a 48-GDN-layer model the rebuilt tables cost more than the math).

    >>> TreeTables.of(torch.tensor([-1, 0, 0]), kernel_size=4).taps.shape
    torch.Size([3, 4])
    """

    parents: Tensor  # [n] long
    anc: Tensor  # [n, n] bool, ``ancestor_matrix(parents)``
    taps: Tensor  # [n, K] long, ``conv_taps(parents, K)``

    @classmethod
    def of(cls, parents: Tensor, kernel_size: int) -> "TreeTables":
        return cls(parents, ancestor_matrix(parents), conv_taps(parents, kernel_size))


def tree_causal_conv1d(
    x: Tensor,  # [n, C] pre-conv inputs (in_proj_qkv output) of the tree nodes
    parents: Tensor,  # [n] long
    conv_window: Tensor,  # [C, K] committed window, transformers layout
    weight: Tensor,  # [C, K] depthwise kernel, conv1d.weight[:, 0, :]
    bias: Tensor | None = None,  # [C]
    taps: Tensor | None = None,  # [n, K] long, ``conv_taps(parents, K)`` when built once per round
) -> Tensor:  # [n, C]
    """Depthwise causal conv of every node over its root path, then SiLU (as the GDN layer).

    Equals, for each node i, ``silu(conv1d(cat(conv_window, x[path(i)].T))[-1])``. The sum is
    taken in at least float32 and rounded to the weight dtype before SiLU, as transformers'
    ``causal_conv1d_fn`` does with ``F.conv1d``.

    >>> y = tree_causal_conv1d(torch.randn(3, 8), torch.tensor([-1, 0, 0]), torch.zeros(8, 4), torch.randn(8, 4))
    >>> y.shape
    torch.Size([3, 8])
    """
    k = weight.shape[-1]
    acc = torch.promote_types(weight.dtype, torch.float32)
    rows = torch.cat([conv_window.transpose(0, 1), x], dim=0).to(weight.dtype)  # [K + n, C]
    taps = conv_taps(parents, k) if taps is None else taps  # [n, K]
    # One gathered row per tap, multiplied and summed: a single pointwise kernel when compiled (a
    # [n, K, C] gather reduced over K compiles to a strided reduction several times slower).
    w = weight.to(acc)
    out = rows[taps[:, 0]].to(acc) * w[:, 0]
    for m in range(1, k):
        out = out + rows[taps[:, m]].to(acc) * w[:, m]
    if bias is not None:
        out = out + bias.to(acc)
    return F.silu(out.to(weight.dtype)).to(x.dtype)


def commit_conv_window(
    x: Tensor,  # [n, C] pre-conv inputs of the tree nodes
    conv_window: Tensor,  # [C, K] committed window before the round
    path: Tensor | Sequence[int],  # accepted node indices, root first
) -> Tensor:  # [C, K]
    """The conv window after feeding the path's tokens: the last K columns of window + path."""
    k = conv_window.shape[-1]
    idx = torch.as_tensor(path, dtype=torch.long, device=x.device)
    return torch.cat([conv_window, x[idx].transpose(0, 1).to(conv_window.dtype)], dim=1)[:, -k:]


def l2norm(x: Tensor, eps: float = 1e-6) -> Tensor:
    """Same formula and eps as transformers' (and FLA's) GDN l2norm: ``x * rsqrt(|x|^2 + eps)``."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


@dataclass(frozen=True)
class DeltaTreeResult:
    """Per-node outputs of the tree delta rule and what the commit needs (no projections re-run).

    All tensors are in the compute dtype: float32 for bf16/fp16/fp32 inputs, float64 for float64.
    """

    out: Tensor  # [n, H, dv] o_i = S_i^T q_i
    keys: Tensor  # [n, Hk, dk] l2-normalised keys, one per key head (value head h reads h // (H / Hk))
    updates: Tensor  # [n, H, dv] u_i, the delta written into the state by node i
    log_decay: Tensor  # [n, H] gamma_i, sum of g over path(i)
    initial_state: Tensor  # [H, dk, dv] the committed state S0


def solve_tree_delta_rule(
    q: Tensor,  # [n, Hk, dk] raw query (conv output), no l2norm, no scale
    k: Tensor,  # [n, Hk, dk] raw key
    v: Tensor,  # [n, H, dv]
    g: Tensor,  # [n, H] log decay (<= 0)
    beta: Tensor,  # [n, H]
    parents: Tensor,  # [n] long
    initial_state: Tensor | None = None,  # [H, dk, dv]; None means zeros (empty prefix)
    anc: Tensor | None = None,  # [n, n] bool, ``ancestor_matrix(parents)`` when built once per round
) -> DeltaTreeResult:
    """Gated delta rule over a tree, all nodes at once (tree form of the chunked WY solve).

    Semantics, per value head, with q, k l2-normalised and q scaled by dk^-1/2 here (as
    ``use_qk_l2norm_in_kernel=True``), q/k heads repeated to H (head h reads k-head h // (H/Hk)):

        S_parent(root) = S0;  S_i = e^{g_i} S_p + k_i u_i^T,
        u_i = beta_i (v_i - e^{g_i} S_p^T k_i),  o_i = S_i^T q_i.

    Unrolled along path(i), with gamma_i = sum of g on path(i) and D_ij = anc_ij e^{gamma_i - gamma_j}:

        (I + strict(diag(beta) (K K^T * D))) U = beta V - beta e^gamma K S0
        O = e^gamma Q S0 + (Q K^T * D) U

    ``anc`` is lower-triangular because parents precede children, so one triangular solve gives
    every u_i; u_i depends only on i's own path, hence is the same in every descendant's context.
    """
    out, keys, updates, log_decay, s0 = delta_rule_tensors(q, k, v, g, beta, parents, initial_state, anc)
    return DeltaTreeResult(out=out, keys=keys, updates=updates, log_decay=log_decay, initial_state=s0)


def delta_rule_tensors(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, parents: Tensor | None,
                       initial_state: Tensor | None = None, anc: Tensor | None = None
                       ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``solve_tree_delta_rule`` as a tuple of tensors (out, keys, updates, log_decay, initial_state),
    for callers that compile it; ``parents`` may be None when ``anc`` is given."""
    dk = k.shape[-1]
    dtype = torch.promote_types(v.dtype, torch.float32)
    anc = ancestor_matrix(parents) if anc is None else anc  # [n, n]
    return delta_rule_solve(l2norm(q.to(dtype)) * dk**-0.5, l2norm(k.to(dtype)), v.to(dtype),
                            anc.to(dtype) @ g.to(dtype), beta.to(dtype), initial_state, anc)


def delta_rule_solve(q: Tensor, k: Tensor, v: Tensor, gamma: Tensor, beta: Tensor, initial_state: Tensor | None,
                     anc: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The torch solve of ``delta_rule_tensors`` from its prepared inputs, all in the compute dtype: q
    (l2-normalised, scaled by dk^-1/2) and k (l2-normalised) ``[n, Hk, dk]``, v ``[n, H, dv]``, the
    path-summed log decay gamma and beta ``[n, H]`` (what ``gdn_tree_triton.tree_delta_rule`` takes)."""
    n, num_k_heads, dk = k.shape
    num_heads = v.shape[1]
    qh, kh = q, k
    if num_heads != num_k_heads:
        qh = qh.repeat_interleave(num_heads // num_k_heads, dim=1)
        kh = kh.repeat_interleave(num_heads // num_k_heads, dim=1)
    # Heads first for the batched solve: [H, n, d].
    qh, kh, vh = qh.transpose(0, 1), kh.transpose(0, 1), v.transpose(0, 1)
    bh, gamma = beta.transpose(0, 1), gamma.transpose(0, 1)  # [H, n]
    if initial_state is None:
        s0 = torch.zeros(num_heads, dk, vh.shape[-1], dtype=v.dtype, device=v.device)
    else:
        s0 = initial_state.to(v.dtype)
    # Exponent only where anc is set: there gamma_i - gamma_j <= 0, elsewhere it could overflow.
    decay = (gamma[:, :, None] - gamma[:, None, :]).masked_fill(~anc, float("-inf")).exp()  # [H, n, n]
    strict = anc & ~torch.eye(n, dtype=torch.bool, device=anc.device)
    system = ((kh @ kh.transpose(-1, -2)) * decay * bh[:, :, None]).masked_fill(~strict, 0.0)
    scale = gamma.exp()[:, :, None]  # [H, n, 1]
    rhs = bh[:, :, None] * (vh - scale * (kh @ s0))  # [H, n, dv]
    # unitriangular: the solve treats the diagonal as 1, i.e. solves (I + system) U = rhs.
    u = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
    out = scale * (qh @ s0) + ((qh @ kh.transpose(-1, -2)) * decay) @ u  # [H, n, dv]
    return out.transpose(0, 1), k, u.transpose(0, 1), gamma.transpose(0, 1), s0


def tree_gated_delta_rule(
    q: Tensor,  # [n, Hk, dk]
    k: Tensor,  # [n, Hk, dk]
    v: Tensor,  # [n, H, dv]
    g: Tensor,  # [n, H]
    beta: Tensor,  # [n, H]
    parents: Tensor,  # [n] long
    initial_state: Tensor | None = None,  # [H, dk, dv]
) -> Tensor:  # [n, H, dv], compute dtype (>= float32)
    """Per-node outputs of the gated delta rule over a tree; see ``solve_tree_delta_rule``.

    >>> n, h, d = 3, 2, 4
    >>> o = tree_gated_delta_rule(torch.randn(n, h, d), torch.randn(n, h, d), torch.randn(n, h, d),
    ...                           -torch.rand(n, h), torch.rand(n, h), torch.tensor([-1, 0, 0]))
    >>> o.shape
    torch.Size([3, 2, 4])
    """
    return solve_tree_delta_rule(q, k, v, g, beta, parents, initial_state).out


def commit_delta_state(
    result: DeltaTreeResult,
    path: Tensor | Sequence[int],  # accepted node indices, root first; must be a root path
) -> Tensor:  # [H, dk, dv], compute dtype
    """The recurrent state a sequential forward over the path leaves.

    S_a = e^{gamma_a} S0 + sum_{j in path} e^{gamma_a - gamma_j} k_j u_j^T, with a the path's
    last node. An empty path leaves S0.
    """
    idx = torch.as_tensor(path, dtype=torch.long, device=result.keys.device)
    if idx.numel() == 0:
        return result.initial_state
    gamma = result.log_decay[idx]  # [p, H]
    weights = (gamma[-1:] - gamma).exp()  # [p, H]
    written = grouped_outer_sum(weights, result.keys[idx], result.updates[idx])
    return gamma[-1].exp()[:, None, None] * result.initial_state + written


def grouped_outer_sum(weights: Tensor, keys: Tensor, updates: Tensor) -> Tensor:  # [..., H, dk, dv]
    """``sum_p weights[p, h] k[p, h // r] u[p, h]^T`` over the leading path axis p of ``[..., p, ...]``
    tensors (weights ``[..., p, H]``, keys ``[..., p, Hk, dk]``, updates ``[..., p, H, dv]``, r = H / Hk),
    without repeating the keys to the value heads."""
    *lead, p, h = weights.shape
    hk, dk, dv = keys.shape[-2], keys.shape[-1], updates.shape[-1]
    written = torch.einsum("...pir,...pik,...pirv->...irkv", weights.reshape(*lead, p, hk, h // hk), keys,
                           updates.reshape(*lead, p, hk, h // hk, dv))
    return written.reshape(*lead, h, dk, dv)
