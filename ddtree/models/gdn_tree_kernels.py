"""Triton kernels of the tree delta rule (``gdn_tree_triton`` holds the math and the launcher).

Imported only where Triton is installed (``gdn_tree_triton._kernels``); every ``@triton.jit``
function is module-level so that the kernels can call the helpers.
"""

import triton
import triton.language as tl


@triton.jit
def _add(a, b):  # tl.reduce's combine (tl.sum runs in the interpreter only if it was on when Triton was imported)
    return a + b


@triton.jit
def path_decay(anc, g_rows, g_cols):  # [BT, BT]: e^{gamma_i - gamma_j} where j is i or an ancestor, else 0
    # Exponent only where anc is set: there gamma_i - gamma_j <= 0, elsewhere it could overflow.
    return tl.where(anc, tl.exp(tl.where(anc, g_rows[:, None] - g_cols[None, :], 0.0)), 0.0)


@triton.jit
def unit_lower_inverse(system, BT: tl.constexpr, LOG2BT: tl.constexpr, PRECISION: tl.constexpr):
    # (I + A)^-1 = (I - A)(I + A^2)(I + A^4)...(I + A^(BT/2)): A^BT = 0 for a strictly lower BT x BT A.
    t = tl.arange(0, BT)
    eye = (t[:, None] == t[None, :]).to(tl.float32)
    inverse = eye - system
    power = system
    for _ in tl.static_range(LOG2BT - 1):
        power = tl.dot(power, power, input_precision=PRECISION)
        inverse = tl.dot(inverse, eye + power, input_precision=PRECISION)
    return inverse


@triton.jit
def block_start(q_ptr, k_ptr, v_ptr, gamma_ptr, beta_ptr, s0, rows, live, h, hk, dk, dv, stride_qn, stride_vn,
                stride_gn, DK: tl.constexpr, DV: tl.constexpr, PRECISION: tl.constexpr):
    """A row block's keys, queries, gamma, beta, and what its U and O start from (the committed state's share):
    acc_u = beta (v - e^gamma K S0), acc_o = e^gamma Q S0, both [BT, BV]."""
    kb = tl.load(k_ptr + rows[:, None] * stride_qn + hk * DK + dk[None, :], mask=live[:, None], other=0.0)
    qb = tl.load(q_ptr + rows[:, None] * stride_qn + hk * DK + dk[None, :], mask=live[:, None], other=0.0)
    vb = tl.load(v_ptr + rows[:, None] * stride_vn + h * DV + dv[None, :], mask=live[:, None], other=0.0)
    gb = tl.load(gamma_ptr + rows * stride_gn + h, mask=live, other=0.0)
    bb = tl.load(beta_ptr + rows * stride_gn + h, mask=live, other=0.0)
    eg = tl.exp(gb)
    acc_u = bb[:, None] * (vb - eg[:, None] * tl.dot(kb, s0, input_precision=PRECISION))
    acc_o = eg[:, None] * tl.dot(qb, s0, input_precision=PRECISION)
    return kb, qb, gb, bb, acc_u, acc_o


@triton.jit
def tree_delta_kernel(
    q_ptr, k_ptr, v_ptr, gamma_ptr, beta_ptr, s0_ptr, anc_ptr, out_ptr, u_ptr,
    stride_qn, stride_vn, stride_gn, stride_an, stride_on,
    N: tl.constexpr, R: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr,
    LOG2BT: tl.constexpr, PRECISION: tl.constexpr,
):
    """One kernel: the system, its solve and the outputs, block by block (a program per head and value slice)."""
    h = tl.program_id(0)  # value head
    vs = tl.program_id(1) * BV  # first value column of this program
    hk = h // R  # the key head it reads
    t = tl.arange(0, BT)
    dk = tl.arange(0, DK)
    dv = vs + tl.arange(0, BV)
    s0 = tl.load(s0_ptr + h * DK * DV + dk[:, None] * DV + dv[None, :])  # [DK, BV]
    below = t[:, None] > t[None, :]
    for b in range((N + BT - 1) // BT):
        rows = b * BT + t
        live = rows < N
        kb, qb, gb, bb, acc_u, acc_o = block_start(q_ptr, k_ptr, v_ptr, gamma_ptr, beta_ptr, s0, rows, live, h, hk, dk,
                                                   dv, stride_qn, stride_vn, stride_gn, DK, DV, PRECISION)
        for c in range(b):  # earlier blocks: all rows < N
            cols = c * BT + t
            kc = tl.load(k_ptr + cols[:, None] * stride_qn + hk * DK + dk[None, :])
            uc = tl.load(u_ptr + cols[:, None] * stride_on + h * DV + dv[None, :])
            gc = tl.load(gamma_ptr + cols * stride_gn + h)
            anc = tl.load(anc_ptr + rows[:, None] * stride_an + cols[None, :], mask=live[:, None], other=0) != 0
            decay = path_decay(anc, gb, gc)
            kct = tl.trans(kc)
            system = bb[:, None] * tl.dot(kb, kct, input_precision=PRECISION) * decay
            scores = tl.dot(qb, kct, input_precision=PRECISION) * decay
            acc_u -= tl.dot(system, uc, input_precision=PRECISION)
            acc_o += tl.dot(scores, uc, input_precision=PRECISION)
        anc = tl.load(anc_ptr + rows[:, None] * stride_an + rows[None, :],
                      mask=live[:, None] & live[None, :], other=0) != 0
        decay = path_decay(anc, gb, gb)
        kbt = tl.trans(kb)
        system = tl.where(below, bb[:, None] * tl.dot(kb, kbt, input_precision=PRECISION) * decay, 0.0)
        ub = tl.dot(unit_lower_inverse(system, BT, LOG2BT, PRECISION), acc_u, input_precision=PRECISION)
        scores = tl.dot(qb, kbt, input_precision=PRECISION) * decay
        acc_o += tl.dot(scores, ub, input_precision=PRECISION)
        tl.store(u_ptr + rows[:, None] * stride_on + h * DV + dv[None, :], ub, mask=live[:, None])
        tl.store(out_ptr + rows[:, None] * stride_on + h * DV + dv[None, :], acc_o.to(out_ptr.dtype.element_ty),
                 mask=live[:, None])
        tl.debug_barrier()  # this block's U, read back by later blocks, is visible to every thread


@triton.jit
def tree_system_kernel(
    q_ptr, k_ptr, gamma_ptr, beta_ptr, anc_ptr, sys_ptr, scores_ptr, inv_ptr,
    stride_qn, stride_gn, stride_an,
    N: tl.constexpr, NP: tl.constexpr, R: tl.constexpr, DK: tl.constexpr, BT: tl.constexpr,
    LOG2BT: tl.constexpr, PRECISION: tl.constexpr,
):
    """Split form, part 1 (a program per head and row block, all in parallel): the blocks of the
    system A and of the masked scores Q K^T * D left of and on the diagonal, and the inverse of
    each diagonal block of I + A. Nothing here depends on U."""
    h = tl.program_id(0)
    b = tl.program_id(1)
    hk = h // R
    t = tl.arange(0, BT)
    dk = tl.arange(0, DK)
    rows = b * BT + t
    live = rows < N
    kb = tl.load(k_ptr + rows[:, None] * stride_qn + hk * DK + dk[None, :], mask=live[:, None], other=0.0)
    qb = tl.load(q_ptr + rows[:, None] * stride_qn + hk * DK + dk[None, :], mask=live[:, None], other=0.0)
    gb = tl.load(gamma_ptr + rows * stride_gn + h, mask=live, other=0.0)
    bb = tl.load(beta_ptr + rows * stride_gn + h, mask=live, other=0.0)
    out = h * NP * NP + rows[:, None] * NP
    for c in range(NP // BT):  # a static bound, as the interpreter needs; blocks right of the diagonal are skipped
        if c <= b:
            cols = c * BT + t
            kc = tl.load(k_ptr + cols[:, None] * stride_qn + hk * DK + dk[None, :], mask=(cols < N)[:, None],
                         other=0.0)
            gc = tl.load(gamma_ptr + cols * stride_gn + h, mask=cols < N, other=0.0)
            anc = tl.load(anc_ptr + rows[:, None] * stride_an + cols[None, :],
                          mask=live[:, None] & (cols < N)[None, :], other=0) != 0
            decay = path_decay(anc, gb, gc)
            kct = tl.trans(kc)
            system = bb[:, None] * tl.dot(kb, kct, input_precision=PRECISION) * decay
            if c == b:
                system = tl.where(t[:, None] > t[None, :], system, 0.0)
                inverse = unit_lower_inverse(system, BT, LOG2BT, PRECISION)
                tl.store(inv_ptr + h * NP * BT + rows[:, None] * BT + t[None, :], inverse)
            tl.store(sys_ptr + out + cols[None, :], system)
            tl.store(scores_ptr + out + cols[None, :], tl.dot(qb, kct, input_precision=PRECISION) * decay)


@triton.jit
def tree_solve_kernel(
    q_ptr, k_ptr, v_ptr, gamma_ptr, beta_ptr, s0_ptr, sys_ptr, scores_ptr, inv_ptr, out_ptr, u_ptr,
    stride_qn, stride_vn, stride_gn, stride_on,
    N: tl.constexpr, NP: tl.constexpr, R: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    BV: tl.constexpr, BT: tl.constexpr, PRECISION: tl.constexpr,
):
    """Split form, part 2 (a program per head and value slice): the block forward substitution
    over the stored system, and the outputs; each step is a few [BT, BT] x [BT, BV] dots."""
    h = tl.program_id(0)
    vs = tl.program_id(1) * BV
    hk = h // R
    t = tl.arange(0, BT)
    dk = tl.arange(0, DK)
    dv = vs + tl.arange(0, BV)
    s0 = tl.load(s0_ptr + h * DK * DV + dk[:, None] * DV + dv[None, :])  # [DK, BV]
    for b in range((N + BT - 1) // BT):
        rows = b * BT + t
        live = rows < N
        kb, qb, gb, bb, acc_u, acc_o = block_start(q_ptr, k_ptr, v_ptr, gamma_ptr, beta_ptr, s0, rows, live, h, hk, dk,
                                                   dv, stride_qn, stride_vn, stride_gn, DK, DV, PRECISION)
        out = h * NP * NP + rows[:, None] * NP
        for c in range(b):
            cols = c * BT + t
            uc = tl.load(u_ptr + cols[:, None] * stride_on + h * DV + dv[None, :])
            acc_u -= tl.dot(tl.load(sys_ptr + out + cols[None, :]), uc, input_precision=PRECISION)
            acc_o += tl.dot(tl.load(scores_ptr + out + cols[None, :]), uc, input_precision=PRECISION)
        inverse = tl.load(inv_ptr + h * NP * BT + rows[:, None] * BT + t[None, :])
        ub = tl.dot(inverse, acc_u, input_precision=PRECISION)
        acc_o += tl.dot(tl.load(scores_ptr + out + rows[None, :]), ub, input_precision=PRECISION)
        tl.store(u_ptr + rows[:, None] * stride_on + h * DV + dv[None, :], ub, mask=live[:, None])
        tl.store(out_ptr + rows[:, None] * stride_on + h * DV + dv[None, :], acc_o.to(out_ptr.dtype.element_ty),
                 mask=live[:, None])
        tl.debug_barrier()  # this block's U, read back by later blocks, is visible to every thread


@triton.jit
def tree_push_kernel(
    q_ptr, k_ptr, v_ptr, gamma_ptr, beta_ptr, s0_ptr, sys_ptr, scores_ptr, inv_ptr, out_ptr, u_ptr,
    stride_qn, stride_vn, stride_gn, stride_on,
    N: tl.constexpr, NP: tl.constexpr, NR: tl.constexpr, R: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    BV: tl.constexpr, BT: tl.constexpr, KC: tl.constexpr, PRECISION: tl.constexpr,
):
    """Split form, part 2 for a tree of at most NR rows (a power of two): every row's acc_u and acc_o
    stay in registers. Once block c's U_c is solved, the system's and the scores' column block c
    update every later row at once (a right-looking substitution), so no U is read back from memory
    and nothing on the dependent chain waits on a load. The same sums in the same order as
    ``tree_solve_kernel``: each row's terms come in block order c = 0, 1, ..."""
    h = tl.program_id(0)
    vs = tl.program_id(1) * BV
    hk = h // R
    r = tl.arange(0, NR)
    live = r < N
    dk = tl.arange(0, DK)
    dv = vs + tl.arange(0, BV)
    t = tl.arange(0, BT)
    # What every row starts from (``block_start``'s acc_u and acc_o), its K S0 and Q S0 summed over the
    # key dim in chunks of KC: [NR, DK] operands at once would stage more shared memory than an sm_86 block has.
    ks0 = tl.full([NR, BV], 0.0, tl.float32)
    qs0 = tl.full([NR, BV], 0.0, tl.float32)
    for c0 in tl.static_range(0, DK, KC):
        kk = c0 + tl.arange(0, KC)
        s0c = tl.load(s0_ptr + h * DK * DV + kk[:, None] * DV + dv[None, :])  # [KC, BV]
        kc = tl.load(k_ptr + r[:, None] * stride_qn + hk * DK + kk[None, :], mask=live[:, None], other=0.0)
        qc = tl.load(q_ptr + r[:, None] * stride_qn + hk * DK + kk[None, :], mask=live[:, None], other=0.0)
        ks0 = tl.dot(kc, s0c, ks0, input_precision=PRECISION)
        qs0 = tl.dot(qc, s0c, qs0, input_precision=PRECISION)
    vr = tl.load(v_ptr + r[:, None] * stride_vn + h * DV + dv[None, :], mask=live[:, None], other=0.0)
    eg = tl.exp(tl.load(gamma_ptr + r * stride_gn + h, mask=live, other=0.0))
    acc_u = tl.load(beta_ptr + r * stride_gn + h, mask=live, other=0.0)[:, None] * (vr - eg[:, None] * ks0)
    acc_o = eg[:, None] * qs0
    nb = tl.arange(0, NR // BT)
    block_of = r // BT
    base = h * NP * NP + r[:, None] * NP
    for c in tl.static_range((N + BT - 1) // BT):
        cols = c * BT + t
        # Block c's rows of acc_u, picked exactly (a select and a sum of zeros, no dot).
        pick = tl.where((nb == c)[:, None, None], tl.reshape(acc_u, (NR // BT, BT, BV)), 0.0)
        inverse = tl.load(inv_ptr + h * NP * BT + cols[:, None] * BT + t[None, :])
        uc = tl.dot(inverse, tl.reduce(pick, 0, _add), input_precision=PRECISION)  # [BT, BV]
        tl.store(u_ptr + cols[:, None] * stride_on + h * DV + dv[None, :], uc, mask=(cols < N)[:, None])
        # Column block c: of the system for the rows of later blocks, of the scores from block c on
        # (zeros elsewhere, so those rows' sums are unchanged).
        a_col = tl.load(sys_ptr + base + cols[None, :], mask=(live & (block_of > c))[:, None], other=0.0)
        s_col = tl.load(scores_ptr + base + cols[None, :], mask=(live & (block_of >= c))[:, None], other=0.0)
        acc_u -= tl.dot(a_col, uc, input_precision=PRECISION)
        acc_o += tl.dot(s_col, uc, input_precision=PRECISION)
    tl.store(out_ptr + r[:, None] * stride_on + h * DV + dv[None, :], acc_o.to(out_ptr.dtype.element_ty),
             mask=live[:, None])


@triton.jit
def conv_tile(x_ptr, window_ptr, weight_ptr, bias_ptr, taps_ptr, copy_ptr, rows, cols, n, C, stride_x,
              K: tl.constexpr, HAS_BIAS: tl.constexpr, COPY: tl.constexpr, BN: tl.constexpr, BC: tl.constexpr):
    """``gdn_tree.tree_causal_conv1d`` for a [BN, BC] tile of nodes ``rows`` x channels ``cols``, in the weight
    dtype: tap m of node i reads row ``taps[i, m]`` of cat(window^T, x) (the window [C, K] where the row is
    < K, else x [n, C]); the products summed in float32 in tap order, plus the bias, rounded to the weight
    dtype, then SiLU. With ``COPY`` the tile's own rows of x are also stored, unchanged, at ``copy_ptr``
    ([n, C])."""
    live, lane = rows < n, cols < C
    both = live[:, None] & lane[None, :]
    acc = tl.full((BN, BC), 0.0, tl.float32)
    for m in tl.static_range(K):
        t = tl.load(taps_ptr + rows * K + m, mask=live, other=0)
        in_x = t >= K
        from_x = tl.load(x_ptr + (t - K)[:, None] * stride_x + cols[None, :], mask=both & in_x[:, None], other=0.0)
        from_window = tl.load(window_ptr + cols[None, :] * K + t[:, None], mask=both & ~in_x[:, None], other=0.0)
        row = tl.where(in_x[:, None], from_x.to(weight_ptr.dtype.element_ty),
                       from_window.to(weight_ptr.dtype.element_ty))
        w = tl.load(weight_ptr + cols * K + m, mask=lane, other=0.0).to(tl.float32)
        acc = acc + row.to(tl.float32) * w[None, :]
    if HAS_BIAS:
        acc = acc + tl.load(bias_ptr + cols, mask=lane, other=0.0).to(tl.float32)[None, :]
    if COPY:
        own = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=both, other=0.0)
        tl.store(copy_ptr + rows[:, None] * C + cols[None, :], own, mask=both)
    y = acc.to(weight_ptr.dtype.element_ty).to(tl.float32)
    y = y / (1.0 + tl.exp(-y))
    return y.to(weight_ptr.dtype.element_ty)


@triton.jit
def tree_conv_kernel(x_ptr, window_ptr, weight_ptr, bias_ptr, taps_ptr, out_ptr, copy_ptr, n, C, stride_x,
                     K: tl.constexpr, HAS_BIAS: tl.constexpr, COPY: tl.constexpr, BN: tl.constexpr,
                     BC: tl.constexpr):
    """``conv_tile`` over a program's [BN, BC] tile of nodes x channels, stored at ``out_ptr`` ([n, C])."""
    rows = tl.program_id(0) * BN + tl.arange(0, BN)
    cols = tl.program_id(1) * BC + tl.arange(0, BC)
    y = conv_tile(x_ptr, window_ptr, weight_ptr, bias_ptr, taps_ptr, copy_ptr, rows, cols, n, C, stride_x, K,
                  HAS_BIAS, COPY, BN, BC)
    tl.store(out_ptr + rows[:, None] * C + cols[None, :], y.to(out_ptr.dtype.element_ty),
             mask=(rows < n)[:, None] & (cols < C)[None, :])


@triton.jit
def conv_heads_tile(x_ptr, window_ptr, weight_ptr, bias_ptr, taps_ptr, q_ptr, k_ptr, v_ptr, copy_ptr, block, head, n, C,
                    KEY, stride_x, scale, eps, K: tl.constexpr, HAS_BIAS: tl.constexpr, COPY: tl.constexpr,
                    BN: tl.constexpr, DK: tl.constexpr):
    """``conv_tile`` over node block ``block`` and the ``DK`` channels of head ``head``, and what the GDN layer
    does next to them: the output rounded as the conv's, then in float32 the l2 norm of a query or key head
    (times ``scale`` for a query), stored at ``q_ptr`` / ``k_ptr`` ([n, KEY]), or the value head as it is at
    ``v_ptr`` ([n, C - 2 KEY])."""
    rows = block * BN + tl.arange(0, BN)
    start = head * DK
    cols = start + tl.arange(0, DK)
    live = rows < n
    y = conv_tile(x_ptr, window_ptr, weight_ptr, bias_ptr, taps_ptr, copy_ptr, rows, cols, n, C, stride_x, K,
                  HAS_BIAS, COPY, BN, DK)
    y = y.to(x_ptr.dtype.element_ty).to(tl.float32)  # the conv's output, as stored
    if start < 2 * KEY:
        y = y * tl.rsqrt(tl.reduce(y * y, 1, _add) + eps)[:, None]
        if start < KEY:
            tl.store(q_ptr + rows[:, None] * KEY + cols[None, :], y * scale, mask=live[:, None])
        else:
            tl.store(k_ptr + rows[:, None] * KEY + (cols - KEY)[None, :], y, mask=live[:, None])
    else:
        tl.store(v_ptr + rows[:, None] * (C - 2 * KEY) + (cols - 2 * KEY)[None, :], y, mask=live[:, None])


@triton.jit
def tree_conv_heads_kernel(x_ptr, window_ptr, weight_ptr, bias_ptr, taps_ptr, q_ptr, k_ptr, v_ptr, copy_ptr, n, C,
                           KEY, stride_x, scale, eps, K: tl.constexpr, HAS_BIAS: tl.constexpr, COPY: tl.constexpr,
                           BN: tl.constexpr, DK: tl.constexpr):
    """``conv_heads_tile`` for a program's node block and head."""
    conv_heads_tile(x_ptr, window_ptr, weight_ptr, bias_ptr, taps_ptr, q_ptr, k_ptr, v_ptr, copy_ptr, tl.program_id(0),
                    tl.program_id(1), n, C, KEY, stride_x, scale, eps, K, HAS_BIAS, COPY, BN, DK)


@triton.jit
def decay_tile(a_ptr, beta_ptr, a_log_ptr, dt_bias_ptr, anc_ptr, gamma_ptr, beta_out_ptr, block, H, stride_a, stride_b,
               stride_an, N: tl.constexpr, BN: tl.constexpr, BJ: tl.constexpr, HP: tl.constexpr,
               SIGMOID: tl.constexpr):
    """The GDN decay summed along each node's root path, for node block ``block`` (``BN`` nodes) and every head:
    ``gamma_i = sum_j anc[i, j] g_j`` with ``g = -exp(A_log) softplus(a + dt_bias)`` in float32 (softplus
    as torch's: x past 20, else log1p(exp(x))); and beta in float32. Both stored as [N, H] (N a constant, as the
    verify sizes are: a loop bound the interpreter can read). ``SIGMOID``: ``beta_ptr`` holds the projection's
    logits b, and beta is sigmoid(b) computed in float32 and rounded to b's dtype, as the layer's
    ``b.sigmoid()`` is (Triton's exp and division: within a few float32 ulps of torch's before that rounding)."""
    rows = block * BN + tl.arange(0, BN)
    heads = tl.arange(0, HP)
    live, lane = rows < N, heads < H
    coef = -tl.exp(tl.load(a_log_ptr + heads, mask=lane, other=0.0).to(tl.float32))
    dt_bias = tl.load(dt_bias_ptr + heads, mask=lane, other=0.0).to(tl.float32)
    acc = tl.full((BN, HP), 0.0, tl.float32)
    for j in range(0, N, BJ):
        cols = j + tl.arange(0, BJ)
        both = (cols < N)[:, None] & lane[None, :]
        x = tl.load(a_ptr + cols[:, None] * stride_a + heads[None, :], mask=both, other=0.0).to(tl.float32)
        x = x + dt_bias[None, :]
        u = tl.exp(tl.minimum(x, 20.0))
        w = 1.0 + u
        # log1p(u) to a few ulps from log alone (where 1 + u rounds to 1, log1p(u) is u).
        log1p = tl.where(w == 1.0, u, tl.log(w) * (u / tl.where(w == 1.0, 1.0, w - 1.0)))
        g = tl.where(both, coef[None, :] * tl.where(x > 20.0, x, log1p), 0.0)
        anc = tl.load(anc_ptr + rows[:, None] * stride_an + cols[None, :],
                      mask=live[:, None] & (cols < N)[None, :], other=0)
        acc += tl.dot((anc != 0).to(tl.float32), g, input_precision="ieee")
    out = rows[:, None] * H + heads[None, :]
    tl.store(gamma_ptr + out, acc, mask=live[:, None] & lane[None, :])
    beta = tl.load(beta_ptr + rows[:, None] * stride_b + heads[None, :], mask=live[:, None] & lane[None, :], other=0.0)
    if SIGMOID:
        beta = (1.0 / (1.0 + tl.exp(-beta.to(tl.float32)))).to(beta_ptr.dtype.element_ty)
    tl.store(beta_out_ptr + out, beta.to(tl.float32), mask=live[:, None] & lane[None, :])


@triton.jit
def tree_decay_kernel(a_ptr, beta_ptr, a_log_ptr, dt_bias_ptr, anc_ptr, gamma_ptr, beta_out_ptr, H, stride_a, stride_b,
                      stride_an, N: tl.constexpr, BN: tl.constexpr, BJ: tl.constexpr, HP: tl.constexpr,
                      SIGMOID: tl.constexpr):
    """``decay_tile`` for a program's node block."""
    decay_tile(a_ptr, beta_ptr, a_log_ptr, dt_bias_ptr, anc_ptr, gamma_ptr, beta_out_ptr, tl.program_id(0), H, stride_a,
               stride_b, stride_an, N, BN, BJ, HP, SIGMOID)


@triton.jit
def tree_prologue_kernel(x_ptr, window_ptr, weight_ptr, bias_ptr, taps_ptr, q_ptr, k_ptr, v_ptr, copy_ptr, a_ptr,
                         beta_ptr, a_log_ptr, dt_bias_ptr, anc_ptr, gamma_ptr, beta_out_ptr, C, KEY, H, stride_x,
                         stride_a, stride_b, stride_an, scale, eps, K: tl.constexpr, HAS_BIAS: tl.constexpr,
                         COPY: tl.constexpr, N: tl.constexpr, BN: tl.constexpr, DK: tl.constexpr, BJ: tl.constexpr,
                         HP: tl.constexpr, SIGMOID: tl.constexpr):
    """``tree_conv_heads_kernel`` and ``tree_decay_kernel`` in one launch, on the grid (node blocks, C / DK + 1):
    the programs of columns below C / DK run ``conv_heads_tile`` for their head, those of the last column
    ``decay_tile`` for the same node block (N nodes in all)."""
    block, head = tl.program_id(0), tl.program_id(1)
    if head < C // DK:
        conv_heads_tile(x_ptr, window_ptr, weight_ptr, bias_ptr, taps_ptr, q_ptr, k_ptr, v_ptr, copy_ptr, block, head,
                        N, C, KEY, stride_x, scale, eps, K, HAS_BIAS, COPY, BN, DK)
    else:
        decay_tile(a_ptr, beta_ptr, a_log_ptr, dt_bias_ptr, anc_ptr, gamma_ptr, beta_out_ptr, block, H, stride_a,
                   stride_b, stride_an, N, BN, BJ, HP, SIGMOID)


@triton.jit
def commit_state_kernel(state_ptr, gamma_ptr, keys_ptr, updates_ptr, path_ptr, A, H, R, N,
                        DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr, AP: tl.constexpr):
    """The accepted path's recurrent state, in place and in one pass over it: for GDN layer g and value head h
    (program 0: g * H + h) and ``BV`` value columns (program 1),
    ``S = e^{gamma_a} S + sum_j e^{gamma_a - gamma_j} k_j u_j^T`` over the A path nodes (``path``, at most
    ``AP``), gamma, k and u read from the verify's stash ([G, N, H], [G, N, H / R, DK], [G, N, H, DV])."""
    gh = tl.program_id(0)
    g, h = gh // H, gh % H
    dv = tl.program_id(1) * BV + tl.arange(0, BV)
    dk = tl.arange(0, DK)
    j = tl.arange(0, AP)
    on = j < A
    node = tl.load(path_ptr + j, mask=on, other=0)
    rows = g * N + node  # [AP] stash rows
    gamma = tl.load(gamma_ptr + rows * H + h, mask=on, other=0.0)
    last = tl.load(gamma_ptr + (g * N + tl.load(path_ptr + A - 1)) * H + h)
    weight = tl.where(on, tl.exp(last - gamma), 0.0)  # [AP]
    keys = tl.load(keys_ptr + (rows[:, None] * (H // R) + h // R) * DK + dk[None, :], mask=on[:, None], other=0.0)
    updates = tl.load(updates_ptr + (rows[:, None] * H + h) * DV + dv[None, :], mask=on[:, None], other=0.0)
    written = tl.dot(tl.trans(keys * weight[:, None]), updates, input_precision="ieee")  # [DK, BV]
    cells = state_ptr + gh * DK * DV + dk[:, None] * DV + dv[None, :]
    tl.store(cells, tl.exp(last) * tl.load(cells) + written)
