"""Triton kernels of split attention: the prefix in segments, and the block part with the merge
(``split_attention`` holds the math and the launchers).

Imported only where Triton is installed (``split_attention._triton_kernels``). One program owns a
K/V head, ``BM`` folded query rows and ``BC`` columns of the output: it runs the rows' attention
over the block's own keys with an online softmax (keys in tiles of ``BN``, scores over the whole
head dim, the ``[n, n]`` visibility read per tile), then folds in the prefix segments, ``SB`` at a
time, as more terms of the same softmax, weighted by their log-sum-exps, and writes the normalised
output in the output's dtype. Splitting the columns and loading segments in groups keeps the
programs many and their dependent chains short where a row block has few rows and many segments
(one query at long context). One launch replaces the dozen or more of the merge in
tensor ops.

``prefix_segment_kernel`` is the prefix part: one program owns a K/V head, ``BM`` folded query rows
and one segment of the prefix, whose first row and key count it reads from the device
(``SegmentBounds``), so no shape depends on P and one graph serves every length. It reads the folded
queries and the cache buffer in place (no per-segment copy of the queries, no packed layout) and
writes the segment's normalised output and log-sum-exp, the terms ``block_merge_kernel`` folds in.
"""

import triton
import triton.language as tl


@triton.jit
def _maximum(a, b):
    return tl.maximum(a, b)


@triton.jit
def _add(a, b):
    return a + b


@triton.jit
def _shift(m_i, new_max):
    """The online softmax's shift for a running max moving from ``m_i`` to ``new_max``, and the factor
    for what was summed so far. A row that has seen only -inf keeps shift 0 (its weights are all 0)."""
    safe = tl.where(new_max == float("-inf"), 0.0, new_max)
    return safe, tl.exp(m_i - safe)


@triton.jit
def _online_step(scores, v, m_i, l_i, acc, PRECISION: tl.constexpr):
    """One tile of keys into the online softmax: ``scores`` ``[BM, BN]`` (float32, -inf where unseen)
    and their values ``v`` ``[BN, BD]``; returns the running max, sum and output sum."""
    new_max = tl.maximum(m_i, tl.reduce(scores, 1, _maximum))
    safe, alpha = _shift(m_i, new_max)
    p = tl.exp(scores - safe[:, None])
    l_i = l_i * alpha + tl.reduce(p, 1, _add)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return new_max, l_i, acc


@triton.jit
def _fold_segments(o_ptr, lse_ptr, len_ptr, h, rows, live, dc, cmask_d, segments, so_s, so_h, so_r, sl_s, sl_h, sl_r,
                   m_i, l_i, acc, SB: tl.constexpr, LENGTHS: tl.constexpr):
    """The segments' outputs (columns ``dc``) into the online softmax, SB segments a load ([SB, BM, BC]),
    each weighted by its log-sum-exp; with LENGTHS a segment whose key count is 0 adds nothing."""
    ss = tl.arange(0, SB)
    for first in range(0, segments, SB):
        seg = first + ss
        smask = seg < segments
        both = smask[:, None] & live[None, :]
        lse = tl.load(lse_ptr + seg[:, None] * sl_s + h * sl_h + rows[None, :] * sl_r, mask=both, other=float("-inf"))
        if LENGTHS:
            length = tl.load(len_ptr + seg, mask=smask, other=0)
            lse = tl.where(length[:, None] > 0, lse, float("-inf"))  # an empty segment adds nothing
        out = tl.load(o_ptr + seg[:, None, None] * so_s + h * so_h + rows[None, :, None] * so_r + dc[None, None, :],
                      mask=both[:, :, None] & cmask_d[None, None, :], other=0.0).to(tl.float32)  # [SB, BM, BC]
        new_max = tl.maximum(m_i, tl.reduce(lse, 0, _maximum))
        safe, alpha = _shift(m_i, new_max)
        weight = tl.exp(lse - safe[None, :])  # [SB, BM]
        l_i = l_i * alpha + tl.reduce(weight, 0, _add)
        acc = acc * alpha[:, None] + tl.reduce(weight[:, :, None] * out, 0, _add)
        m_i = new_max
    return m_i, l_i, acc


@triton.jit
def block_merge_kernel(q_ptr, k_ptr, v_ptr, vis_ptr, o_ptr, lse_ptr, len_ptr, res_ptr, scale, m, n, d, segments,
                       sq_h, sq_r, sk_h, sk_r, so_s, so_h, so_r, sl_s, sl_h, sl_r, sr_h, sr_r,
                       BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr, BC: tl.constexpr, SB: tl.constexpr,
                       PRECISION: tl.constexpr):
    # Program (row block, K/V head, column chunk): the scores over the whole head dim, the output's
    # BC columns from BC * chunk on; the segments folded in SB at a time (one [SB, BM, BC] load each).
    pid_m, h, chunk = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rows = pid_m * BM + tl.arange(0, BM)
    live = rows < m
    dd = tl.arange(0, BD)
    dmask = dd < d
    dc = chunk * BC + tl.arange(0, BC)
    cmask_d = dc < d
    q = tl.load(q_ptr + h * sq_h + rows[:, None] * sq_r + dd[None, :], mask=live[:, None] & dmask[None, :], other=0.0)
    token = rows % n  # folded row i * n + t is token t's query for query head i of this K/V head
    # Reductions through tl.reduce with this module's combine functions, and tl.full for zeros: the
    # helpers of triton.language's standard library run in Triton's interpreter only if it was on
    # when they were first imported, which a test process cannot promise.
    m_i = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.full([BM], 0.0, tl.float32)
    acc = tl.full([BM, BC], 0.0, tl.float32)
    for start in range(0, n, BN):
        cols = start + tl.arange(0, BN)
        cmask = cols < n
        k = tl.load(k_ptr + h * sk_h + cols[:, None] * sk_r + dd[None, :], mask=cmask[:, None] & dmask[None, :],
                    other=0.0)
        v = tl.load(v_ptr + h * sk_h + cols[:, None] * sk_r + dc[None, :], mask=cmask[:, None] & cmask_d[None, :],
                    other=0.0)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale  # [BM, BN] float32
        seen = tl.load(vis_ptr + token[:, None] * n + cols[None, :], mask=live[:, None] & cmask[None, :], other=0)
        scores = tl.where(seen != 0, scores, float("-inf"))
        m_i, l_i, acc = _online_step(scores, v, m_i, l_i, acc, PRECISION)
    m_i, l_i, acc = _fold_segments(o_ptr, lse_ptr, len_ptr, h, rows, live, dc, cmask_d, segments, so_s, so_h, so_r,
                                   sl_s, sl_h, sl_r, m_i, l_i, acc, SB, True)
    result = acc / tl.where(live, l_i, 1.0)[:, None]  # every live row sees its own key: l_i > 0
    tl.store(res_ptr + h * sr_h + rows[:, None] * sr_r + dc[None, :], result.to(res_ptr.dtype.element_ty),
             mask=live[:, None] & cmask_d[None, :])


@triton.jit
def prefix_segment_kernel(q_ptr, k_ptr, v_ptr, start_ptr, len_ptr, o_ptr, lse_ptr, scale, m, d,
                          sq_h, sq_r, sk_h, sk_r, so_s, so_h, so_r, sl_s, sl_h,
                          bk_ptr, bv_ptr, vis_ptr, n, segments, sb_h, sb_r,
                          BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr, BC: tl.constexpr,
                          PRECISION: tl.constexpr, WITH_BLOCK: tl.constexpr):
    # Program (row block x column chunk, K/V head, segment). BC < BD: the program writes BC of the
    # output's columns (its scores still over the whole head dim), fewer registers for more programs.
    # WITH_BLOCK: program s == segments runs the block part instead (the block's n keys ``bk``/``bv``
    # [Hkv, n, d], strides sb_*, each row's visibility from ``vis`` [n, n]) and writes it as segment
    # ``segments``: what is left for the merge is a sum of weighted segments (``combine_kernel``).
    chunks: tl.constexpr = BD // BC
    pid, h, s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    pid_m, chunk = pid // chunks, pid % chunks
    rows = pid_m * BM + tl.arange(0, BM)
    live = rows < m
    dd = tl.arange(0, BD)
    dmask = dd < d
    dc = chunk * BC + tl.arange(0, BC)
    cmask_d = dc < d
    q = tl.load(q_ptr + h * sq_h + rows[:, None] * sq_r + dd[None, :], mask=live[:, None] & dmask[None, :], other=0.0)
    block = (s == segments) & WITH_BLOCK
    first = tl.load(start_ptr + s, mask=s < segments, other=0).to(tl.int64)
    count = tl.where(block, n, tl.load(len_ptr + s, mask=s < segments, other=0).to(tl.int32))
    k_base = tl.where(block, bk_ptr + h * sb_h, k_ptr + h * sk_h + first * sk_r)
    v_base = tl.where(block, bv_ptr + h * sb_h, v_ptr + h * sk_h + first * sk_r)
    stride = tl.where(block, sb_r, sk_r)
    m_i = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.full([BM], 0.0, tl.float32)
    acc = tl.full([BM, BC], 0.0, tl.float32)
    for start in range(0, count, BN):
        offs = start + tl.arange(0, BN)
        cmask = offs < count
        k = tl.load(k_base + offs[:, None] * stride + dd[None, :], mask=cmask[:, None] & dmask[None, :], other=0.0)
        v = tl.load(v_base + offs[:, None] * stride + dc[None, :], mask=cmask[:, None] & cmask_d[None, :], other=0.0)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale  # [BM, BN] float32
        keep = cmask[None, :]
        if WITH_BLOCK:  # the block's keys: each row sees its token's ancestors and itself (token = row % n)
            seen = tl.load(vis_ptr + (rows % n)[:, None] * n + offs[None, :],
                           mask=live[:, None] & cmask[None, :] & (rows[:, None] * 0 + s == segments), other=1)
            keep = keep & (seen != 0)
        scores = tl.where(keep, scores, float("-inf"))
        m_i, l_i, acc = _online_step(scores, v, m_i, l_i, acc, PRECISION)
    seen = l_i > 0.0  # a segment with no keys: output 0, log-sum-exp -inf (the merge adds nothing)
    out = acc / tl.where(seen, l_i, 1.0)[:, None]
    lse = tl.where(seen, m_i + tl.log(tl.where(seen, l_i, 1.0)), float("-inf"))
    tl.store(o_ptr + s * so_s + h * so_h + rows[:, None] * so_r + dc[None, :], out.to(o_ptr.dtype.element_ty),
             mask=live[:, None] & cmask_d[None, :])
    tl.store(lse_ptr + s * sl_s + h * sl_h + rows, lse, mask=live & (rows * 0 + chunk == 0))  # once per row


@triton.jit
def combine_kernel(o_ptr, lse_ptr, res_ptr, m, d, segments, so_s, so_h, so_r, sl_s, sl_h, sr_h, sr_r,
                   BM: tl.constexpr, BC: tl.constexpr, SB: tl.constexpr):
    # Program (row block, K/V head, column chunk): the softmax-weighted sum of the ``segments``
    # outputs (segments with no keys carry log-sum-exp -inf and add nothing), SB segments a load.
    pid_m, h, chunk = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rows = pid_m * BM + tl.arange(0, BM)
    live = rows < m
    dc = chunk * BC + tl.arange(0, BC)
    cmask_d = dc < d
    m_i = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.full([BM], 0.0, tl.float32)
    acc = tl.full([BM, BC], 0.0, tl.float32)
    m_i, l_i, acc = _fold_segments(o_ptr, lse_ptr, lse_ptr, h, rows, live, dc, cmask_d, segments, so_s, so_h, so_r,
                                   sl_s, sl_h, 1, m_i, l_i, acc, SB, False)
    result = acc / tl.where(live, l_i, 1.0)[:, None]  # the block segment holds each row's own key: l_i > 0
    tl.store(res_ptr + h * sr_h + rows[:, None] * sr_r + dc[None, :], result.to(res_ptr.dtype.element_ty),
             mask=live[:, None] & cmask_d[None, :])
