"""A verify's attention at long context in two parts, merged by their log-sum-exps.

Every query of a verify (or of a DFlash block) sees the whole committed prefix, rows [0, P), and,
among its own rows P..P+n-1, those its ``[n, n]`` visibility allows. The prefix part needs no mask,
so a stock flash kernel can read it; the block part is ``n x n``, small enough for plain tensor math.
Each part returns its output and its log-sum-exp per query row, and the exact softmax over both is

    out = (e^(lse_1 - m) out_1 + e^(lse_2 - m) out_2) / (e^(lse_1 - m) + e^(lse_2 - m)),  m = max(lse_1, lse_2).

The prefix runs through ``aten._flash_attention_forward``'s variable-length form, which reads the
sequence boundaries from a device tensor: P is never a shape, so one CUDA graph per n serves every
prefix length, as FlexAttention's block tables do (``ddtree.models.flex_attention``). The query heads
of a K/V head are folded into the query rows (head ``j * groups + i``, token t -> row ``i * n + t``
of K/V head j), and the prefix is cut into S segments that run as S sequences of a batch, so a short
query still spreads over the GPU (flash-decoding's split over keys, with stock kernels).

The block part and the merge run as one function with three implementations, the same math:
``torch.compile``d (``_merge_kernel``), one Triton launch (``triton_merge``), and eager tensor ops
(``block_and_merge``). ``serves`` picks the first that agrees with the reference at each shape: the
compiled one was wrong at some shapes on an H100 (torch 2.11). With ``FUSED_BLOCK`` the Triton prefix
runs the block part too, as one more segment (``prefix_block_triton``), and the merge is a weighted
sum of segments (``triton_combine``).

The flash kernel takes bf16 and fp16 only: float32 verifies, the CPU, and query blocks of more than
``SPLIT_MAX_QUERIES`` rows (prefill chunks: their block part would be large) stay on FlexAttention.
``split_attend`` takes the prefix kernel as an argument, so the tests run the whole computation
(segments, folding, masking, merge) on the CPU with ``prefix_reference``.
"""

from __future__ import annotations

import functools
import logging
import math
from typing import Callable

import torch
from torch import Tensor

from ddtree.models.fused import recompile_limit
# Whether a Triton kernel can run on a device (Triton installed, a CUDA GPU): the one check the GDN
# kernels use too. The tests run ``triton_merge`` on the CPU through Triton's interpreter.
from ddtree.models.gdn_tree_triton import available as triton_available, tile

log = logging.getLogger(__name__)

SPLIT_MAX_QUERIES = 512  # longer query blocks (prefill chunks) keep FlexAttention
# One query (an AR step) of head dim 128 stays on FlexAttention's decoding kernel, faster there on one
# H100 (graphed, Qwen3-8B heads over a 132K-row buffer: 45 / 65 / 196 us against the split's 58 / 97 / 248
# at 8K / 32K / 128K). Past head dim 128 the decoding kernel is slow (Qwen3.6-27B geometry at 8192, one
# H100: the AR verify took 27.16 ms through it, a 4-token MTP verify through the split 24.86), so one
# query splits there too.
SPLIT_MIN_QUERIES = 2
SEGMENT_MIN_ROWS = 512  # a segment of the prefix spans at least this many buffer rows
M_BLOCK = 128  # query rows per flash program (sizing the split)
# From this many queries the Triton merge is tried before the compiled one: one H100, graphed, one layer
# over a 132K-row buffer, the flash prefix with either merge (experiments/prefix_tiles_bench.py,
# docs/results/prefix_tiles_merge_h100.json, us, Triton / compiled): Qwen3.6-27B heads at 8K, 16 queries
# 106.8 / 106.2, 65: 118.7 / 161.4, 257: 339.7 / 364.1; Qwen3-8B heads at 8K, 16: 73.0 / 84.9, 65:
# 81.7 / 101.2; at 32K, 16: 114.1 / 124.9 (27B: 150.7 / 147.2). At one query the compiled merge is
# ahead (27B heads: 39.6 / 48.7 at 8K, 80.8 / 87.4 at 32K).
TRITON_FIRST_QUERIES = 2
# Whether ``serves`` tries the Triton prefix kernel (``prefix_triton``, with the Triton merge) first:
# None (default) by ``triton_prefix_first``'s measured rule, True for every shape, False for none.
TRITON_PREFIX: bool | None = None
# Whether the Triton prefix runs the block part in its own launch (``prefix_block_triton``, then
# ``triton_combine``) where ``serves`` tries the Triton prefix; off: a separate block-and-merge launch.
FUSED_BLOCK = False


def triton_prefix_first(n: int, head_dim: int) -> bool:
    """Whether the Triton prefix is tried before the flash one for n queries of ``head_dim``: from 2
    queries at head dim 256, from 2 to 16 at 128 and below. One H100, one layer over a 132K-row
    buffer, both with the Triton merge (``docs/results/prefix_tiles_merge_h100.json``, us, Triton /
    flash prefix): 27B heads (24 over 4 of 256) at 8K, 16 queries 82.5 / 106.8, 65: 104.0 / 118.7,
    257: 308.6 / 339.7; at 32K 136.1 / 150.7, 267.5 / 269.6, 956.9 / 944.2. Qwen3-8B heads (32 over 8
    of 128) at 8K, 16: 54.1 / 73.0, 65: 79.3 / 81.7, 257: 241.1 / 231.1; at 32K 95.7 / 114.1, 213.0 /
    187.4, 777.2 / 678.2. At one query the flash prefix with the compiled merge is ahead at head dim
    256 (39.6 against 43.7 at 8K), and a head dim of 128 does not split one query (``min_queries``).

    >>> [triton_prefix_first(n, 256) for n in (1, 16, 65, 257)], [triton_prefix_first(n, 128) for n in (1, 16, 65)]
    ([False, True, True, True], [False, True, False])
    """
    if TRITON_PREFIX is not None:
        return TRITON_PREFIX
    return n >= 2 and (head_dim > 128 or n <= 16)


PrefixKernel = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, int, int, float], tuple[Tensor, Tensor]]


def min_queries(head_dim: int) -> int:
    """The fewest queries split attention serves at this head dim (fewer: FlexAttention).

    >>> min_queries(128), min_queries(256)
    (2, 1)
    """
    return SPLIT_MIN_QUERIES if head_dim <= 128 else 1


def segments_for(n: int, groups: int, kv_heads: int, kv_length: int, sms: int) -> int:
    """How many segments the prefix of a ``kv_length``-row buffer is cut into for n queries: enough
    programs for two per multiprocessor (K/V heads x query blocks x segments), none shorter than
    ``SEGMENT_MIN_ROWS`` rows of the buffer.

    >>> segments_for(1, 4, 8, 132000, 132), segments_for(65, 4, 8, 132000, 132), segments_for(257, 4, 8, 132000, 132)
    (33, 11, 4)
    """
    programs = kv_heads * math.ceil(groups * n / M_BLOCK)
    return max(1, min(math.ceil(2 * sms / programs), math.ceil(kv_length / SEGMENT_MIN_ROWS)))


def _lse_by_segment(lse: Tensor, segments: int, kv_heads: int, rows: int) -> Tensor:
    """A variable-length flash call's log-sum-exp as a contiguous ``[S, Hkv, rows]`` float32: from
    ``[Hkv, S * rows]`` (packed, newer kernels) or ``[S, Hkv, rows]`` (padded, older ones). Contiguous
    because on one H100 the compiled merge went wrong on the packed layout's strided view at shapes
    where it was right on contiguous input (``serves``); the copy is S x Hkv x rows floats."""
    if lse.dim() == 2:
        return lse.view(kv_heads, segments, rows).transpose(0, 1).float().contiguous()
    return lse[..., :rows].float().contiguous()


def prefix_flash(q: Tensor, k: Tensor, v: Tensor, cu_q: Tensor, starts: Tensor, used: Tensor, rows: int,
                 max_k: int, scale: float) -> tuple[Tensor, Tensor]:
    """S sequences of ``rows`` queries each (``q`` ``[S * rows, Hkv, d]``, boundaries ``cu_q``), sequence
    s over the ``used[s]`` keys from row ``starts[s]`` of ``k``/``v`` ``[L, Hkv, d]`` (``starts``
    ``[S + 1]`` and ``used`` ``[S]``, int32 on the device): the outputs ``[S * rows, Hkv, d]`` and
    log-sum-exps ``[S, Hkv, rows]`` (float32). Every ``used[s]`` is kept at least 1, so no sequence
    takes the kernel's early exit for empty keys: wrong results on an H100 came only from calls with
    empty sequences (see ``serves``)."""
    out, lse = torch.ops.aten._flash_attention_forward(q, k, v, cu_q, starts, rows, max_k, 0.0, False, False,
                                                       scale=scale, seqused_k=used)[:2]
    return out, _lse_by_segment(lse, cu_q.numel() - 1, k.shape[1], rows)


def prefix_reference(q: Tensor, k: Tensor, v: Tensor, cu_q: Tensor, starts: Tensor, used: Tensor, rows: int,
                     max_k: int, scale: float) -> tuple[Tensor, Tensor]:
    """``prefix_flash`` in plain tensor math (any device and dtype; host reads of the boundaries):
    the tests' stand-in for the flash kernel."""
    first, count = starts.tolist(), used.tolist()
    outs, lses = [], []
    for s in range(cu_q.numel() - 1):
        qs = q[s * rows : (s + 1) * rows].transpose(0, 1).float()  # [Hkv, rows, d]
        ks = k[first[s] : first[s] + count[s]].transpose(0, 1).float()
        vs = v[first[s] : first[s] + count[s]].transpose(0, 1).float()
        scores = qs @ ks.transpose(-1, -2) * scale
        lse = scores.logsumexp(-1)
        outs.append(((scores - lse[..., None]).exp() @ vs).transpose(0, 1).to(q.dtype))
        lses.append(lse)
    return torch.cat(outs), torch.stack(lses)


def block_and_merge(folded: Tensor, keys: Tensor, values: Tensor, visible: Tensor, out: Tensor, lse: Tensor,
                    lengths: Tensor, scale: float) -> Tensor:
    """The block part and the merge. ``folded`` ``[Hkv, rows, d]`` queries (rows = groups x n), the
    block's ``keys``/``values`` ``[Hkv, n, d]``, ``visible`` ``[n, n]`` bool, the prefix segments'
    ``out`` ``[S, Hkv, rows, d]`` and ``lse`` ``[S, Hkv, rows]`` with their key counts ``lengths``
    ``[S]``: the attention output ``[Hkv, rows, d]`` (float32)."""
    n = keys.shape[1]
    scores = folded.float() @ keys.float().transpose(-1, -2) * scale  # [Hkv, rows, n]
    seen = visible.repeat(folded.shape[1] // n, 1)  # row i * n + t sees what token t sees
    scores = scores.masked_fill(~seen, -math.inf)
    block_lse = scores.logsumexp(-1)  # finite: every token sees itself
    block_out = (scores - block_lse[..., None]).exp() @ values.float()
    lse = torch.where(lengths[:, None, None] > 0, lse, -math.inf)  # an empty segment adds nothing
    top = torch.maximum(lse.max(0).values, block_lse)
    weight, block_weight = (lse - top).exp(), (block_lse - top).exp()
    total = (weight[..., None] * out.float()).sum(0) + block_weight[..., None] * block_out
    return total / (weight.sum(0) + block_weight)[..., None]


@functools.cache
def _triton_kernels():
    from ddtree.models import split_merge_kernels  # imports Triton

    return split_merge_kernels


def padded_head_dim(d: int) -> int:
    """The Triton kernels' head-dim tile: d rounded up to a power of two, at least 16.

    >>> padded_head_dim(96), padded_head_dim(128), padded_head_dim(8)
    (128, 128, 16)
    """
    return tile(d)


def merge_tiles(m: int, d: int) -> tuple[int, int, int]:
    """``block_merge_kernel``'s (BM folded rows, BC output columns, SB segments loaded at once) for m
    folded rows of head dim d. Up to 512 rows: 16-row blocks for a few rows (one query: the heads of a
    K/V group), 32 past that, columns in chunks of 64, [SB, BM, BC] segment loads of 8K floats: more
    programs and fewer dependent loads where a row block has few rows and many segments. Past 512
    rows (257 queries), the whole head dim a program and 32 rows at head dim 256, 64 below: faster
    there (one H100, the flash prefix and this merge, ``docs/results/prefix_tiles_merge_h100.json``:
    27B heads at 8K, 257 queries, 339.7 us chunked against 312.6 whole in the sweep before).

    >>> merge_tiles(6, 256), merge_tiles(390, 256), merge_tiles(1542, 256), merge_tiles(1028, 128)
    ((16, 64, 8), (32, 64, 4), (32, 256, 1), (64, 128, 1))
    """
    block_d = padded_head_dim(d)
    if m > 512:
        block_m, block_c = (32 if block_d >= 256 else 64), block_d
    else:
        block_m, block_c = (16 if m <= 64 else 32), min(block_d, 64)
    return block_m, block_c, max(1, 8192 // (block_m * block_c))


def triton_merge(folded: Tensor, keys: Tensor, values: Tensor, visible: Tensor, out: Tensor, lse: Tensor,
                 lengths: Tensor, scale: float) -> Tensor:
    """``block_and_merge`` in one Triton launch (``ddtree.models.split_merge_kernels``), the same
    arguments; the result ``[Hkv, rows, d]`` in the queries' dtype. Dots of half-precision inputs run
    on their own dtype with float32 sums, the probabilities cast to the values' dtype as the flash
    kernel casts them; float32 inputs in IEEE float32."""
    kv_heads, m, d = folded.shape
    n, segments = keys.shape[1], out.shape[0]
    if not (folded.stride(-1) == keys.stride(-1) == values.stride(-1) == out.stride(-1) == 1):
        raise ValueError("triton_merge reads the head dim with unit stride")
    if keys.stride() != values.stride() or not visible.is_contiguous():
        raise ValueError("triton_merge wants keys and values of one layout and a contiguous visibility")
    result = torch.empty(kv_heads, m, d, dtype=folded.dtype, device=folded.device)
    block_d, (block_m, block_c, group) = padded_head_dim(d), merge_tiles(m, d)
    grid = (math.ceil(m / block_m), kv_heads, math.ceil(d / block_c))
    _triton_kernels().block_merge_kernel[grid](
        folded, keys, values, visible, out, lse, lengths, result, scale, m, n, d, segments,
        folded.stride(0), folded.stride(1), keys.stride(0), keys.stride(1), out.stride(0), out.stride(1),
        out.stride(2), lse.stride(0), lse.stride(1), lse.stride(2), result.stride(0), result.stride(1),
        BM=block_m, BN=32, BD=block_d, BC=block_c, SB=group,
        PRECISION="ieee" if folded.dtype == torch.float32 else "tf32")
    return result


# (BM folded rows, BN keys, warps, stages[, BC output columns]) of ``prefix_triton``'s programs by padded
# head dim (no BC: the whole head dim a program; ``prefix_tiles``), from one
# H100 (experiments/prefix_tiles_bench.py, docs/results/triton_prefix_sweep_132k_h100.json): at 256 the
# fastest tiles timed at 65 and 257 queries and within 6% of the best at 1 and 16 (8 warps took 1.5-2x
# as long); at 128 the fastest at 16 queries, within 7% of the best at 1 and within 3% at 65 and 257.
PREFIX_TILES: dict[int, tuple[int, ...]] = {16: (64, 64, 4, 2), 32: (64, 64, 4, 2), 64: (64, 64, 4, 3),
                                                      128: (64, 64, 4, 3), 256: (64, 32, 4, 2)}


def prefix_triton(folded: Tensor, key: Tensor, value: Tensor, bounds: SegmentBounds, scale: float,
                  block: tuple[Tensor, Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
    """The prefix part in one Triton launch (``split_merge_kernels.prefix_segment_kernel``): ``folded``
    ``[Hkv, m, d]`` queries over ``bounds.segments`` segments of ``key``/``value`` ``[Hkv, L, d]``
    (the cache buffers, read in place), each from row ``bounds.starts[s]`` over ``bounds.lengths[s]``
    keys (none: output 0, log-sum-exp -inf). Returns the segments' outputs ``[S, Hkv, m, d]`` in the
    queries' dtype and log-sum-exps ``[S, Hkv, m]`` (float32): ``block_and_merge``'s ``out``/``lse``.
    Half-precision dots sum in float32, probabilities cast to the values' dtype (as the flash kernel
    does); float32 inputs in IEEE float32. A folded prefix kernel (``split_attend``).
    ``block``: the block's keys and values ``[Hkv, n, d]`` and visibility ``[n, n]``, run in the same
    launch as one more segment, the last of S + 1 (``prefix_block_triton``)."""
    kv_heads, m, d = folded.shape
    keys, values, visible = block or (key, value, bounds.lengths)  # without a block: unread stand-ins
    if not (folded.stride(-1) == key.stride(-1) == value.stride(-1) == keys.stride(-1) == 1) \
            or key.stride() != value.stride() or keys.stride() != values.stride() or not visible.is_contiguous():
        raise ValueError("prefix_triton reads the head dim with unit stride, keys and values of one layout")
    n = 0 if block is None else keys.shape[1]
    segments = bounds.segments + (block is not None)
    out = torch.empty(segments, kv_heads, m, d, dtype=folded.dtype, device=folded.device)
    lse = torch.empty(segments, kv_heads, m, dtype=torch.float32, device=folded.device)
    block_d = padded_head_dim(d)
    block_m, block_n, warps, stages, block_c = prefix_tiles(block_d)
    grid = (math.ceil(m / block_m) * (block_d // block_c), kv_heads, segments)
    _triton_kernels().prefix_segment_kernel[grid](
        folded, key, value, bounds.starts, bounds.lengths, out, lse, scale, m, d,
        folded.stride(0), folded.stride(1), key.stride(0), key.stride(1), out.stride(0), out.stride(1),
        out.stride(2), lse.stride(0), lse.stride(1), keys, values, visible, max(n, 1), bounds.segments,
        keys.stride(0), keys.stride(1),
        BM=block_m, BN=block_n, BD=block_d, BC=block_c, PRECISION="ieee" if folded.dtype == torch.float32 else "tf32",
        WITH_BLOCK=block is not None, num_warps=warps, num_stages=stages)
    return out, lse


prefix_triton.folded = True  # takes the folded queries and the buffers as they are (see split_attend)


def prefix_tiles(block_d: int) -> tuple[int, int, int, int, int]:
    """``PREFIX_TILES[block_d]`` as (BM, BN, warps, stages, BC): BC output columns a program (the whole
    head dim where the entry names no fifth)."""
    block_m, block_n, warps, stages, *columns = PREFIX_TILES[block_d]
    return block_m, block_n, warps, stages, (columns[0] if columns else block_d)


def prefix_block_triton(folded: Tensor, key: Tensor, value: Tensor, bounds: SegmentBounds, scale: float,
                        keys: Tensor, values: Tensor, visible: Tensor) -> tuple[Tensor, Tensor]:
    """``prefix_triton`` with the block part in the same launch, as one more segment: the block's
    ``keys``/``values`` ``[Hkv, n, d]`` under ``visible`` ``[n, n]``. Returns ``[S + 1, Hkv, m, d]``
    outputs and ``[S + 1, Hkv, m]`` log-sum-exps, the last the block's, so that ``combine`` (a weighted
    sum, no attention left) finishes the split; empty segments carry -inf."""
    return prefix_triton(folded, key, value, bounds, scale, block=(keys, values, visible))


prefix_block_triton.folded = True
prefix_block_triton.with_block = True  # split_attend hands it the block, and its merge is ``combine``


def combine(folded: Tensor, keys: Tensor, values: Tensor, visible: Tensor, out: Tensor, lse: Tensor,
            lengths: Tensor, scale: float) -> Tensor:
    """The merge after ``prefix_block_triton``: the segments' outputs ``out`` ``[S + 1, Hkv, m, d]``
    weighted by their log-sum-exps ``lse`` ``[S + 1, Hkv, m]`` (a merge's arguments; the block's are
    already in the last segment). Float32 ``[Hkv, m, d]``, in tensor ops."""
    top = lse.max(0).values
    weight = (lse - top).exp()
    return (weight[..., None] * out.float()).sum(0) / weight.sum(0)[..., None]


def triton_combine(folded: Tensor, keys: Tensor, values: Tensor, visible: Tensor, out: Tensor, lse: Tensor,
                   lengths: Tensor, scale: float) -> Tensor:
    """``combine`` in one Triton launch (``split_merge_kernels.combine_kernel``); the result in the
    queries' dtype."""
    segments, kv_heads, m, d = out.shape
    if out.stride(-1) != 1:
        raise ValueError("triton_combine reads the head dim with unit stride")
    result = torch.empty(kv_heads, m, d, dtype=folded.dtype, device=folded.device)
    block_m, block_c, group = merge_tiles(m, d)
    grid = (math.ceil(m / block_m), kv_heads, math.ceil(d / block_c))
    _triton_kernels().combine_kernel[grid](
        out, lse, result, m, d, segments, out.stride(0), out.stride(1), out.stride(2), lse.stride(0), lse.stride(1),
        result.stride(0), result.stride(1), BM=block_m, BC=block_c, SB=group)
    return result


_MERGE: list[Callable] = []


def _merge_kernel(device: torch.device) -> Callable:
    """``block_and_merge``, compiled once on CUDA (a few fused kernels instead of a dozen launches a
    layer), the plain function elsewhere. Where it does not compile or disagrees with the reference,
    ``serves`` gives the shape the Triton merge or the plain one, or FlexAttention."""
    if device.type != "cuda":
        return block_and_merge
    if not _MERGE:
        _MERGE.append(torch.compile(block_and_merge, dynamic=False, fullgraph=True))
    return _MERGE[0]


class SegmentBounds:
    """Where the S segments of the prefix lie for P = ``past`` and m folded query rows each: static
    device buffers, rewritten in place by ``update`` (graph-safe), so a forward computes them once
    for all its layers (``FlexLayout.bounds``) rather than once a layer.

    Segment s covers prefix rows [s * c, (s + 1) * c) cut at P, c = ceil(P / S). A segment the cut
    leaves empty (P < S * c) reads row P - 1 instead (row 0 at P = 0), with one key, and the merge
    drops it (``lengths`` 0): no sequence reaches the kernel empty (see ``prefix_flash``).

    >>> b = SegmentBounds(torch.tensor(5), segments=4, rows=3)
    >>> b.lengths.tolist(), b.starts.tolist(), b.used.tolist(), b.cu_q.tolist()
    ([2, 2, 1, 0], [0, 2, 4, 4, 4], [2, 2, 1, 1], [0, 3, 6, 9, 12])
    """

    def __init__(self, past: Tensor, segments: int, rows: int) -> None:
        device = past.device
        self.segments, self.rows = segments, rows
        self.cu_q = torch.arange(0, (segments + 1) * rows, rows, device=device, dtype=torch.int32)  # [S + 1]
        self._index = torch.arange(segments + 1, device=device)
        self.lengths = torch.zeros(segments, dtype=torch.long, device=device)  # [S] live keys of each
        self.starts = torch.zeros(segments + 1, dtype=torch.int32, device=device)  # [S + 1] first row of each
        self.used = torch.ones(segments, dtype=torch.int32, device=device)  # [S] keys the kernel reads
        self.update(past)

    def update(self, past: Tensor) -> None:
        chunk = torch.div(past + self.segments - 1, self.segments, rounding_mode="floor")
        bounds = (self._index * chunk).clamp(max=past)
        self.lengths.copy_(bounds.diff())
        self.starts.copy_(torch.minimum(bounds, (past - 1).clamp(min=0)))
        self.used.copy_(self.lengths.clamp(min=1))


def split_attend(query: Tensor, key: Tensor, value: Tensor, past: Tensor, rows: Tensor, visible: Tensor,
                 scale: float | None = None, segments: int = 1, prefix: PrefixKernel = prefix_flash,
                 merge: Callable | None = None, bounds: SegmentBounds | None = None) -> Tensor:
    """``query`` ``[1, Hq, n, d]`` at rows ``rows`` (P..P+n-1, their keys already in the buffers)
    over ``key``/``value`` ``[1, Hkv, L, d]``: rows below ``past`` (P, a 0-dim device tensor) are
    all visible, the block's own through ``visible`` ``[n, n]``. Returns ``[1, Hq, n, d]``; no host
    read of P, no shape depends on it (graph-safe with ``prefix_flash`` and ``prefix_triton``).
    ``bounds``: the segments' ``SegmentBounds`` for this P, ``segments`` and n x groups rows, kept up
    to date by the caller (computed here when None). ``prefix``: a variable-length kernel
    (``PrefixKernel``: packed queries, one sequence per segment) or, where it has ``folded = True``,
    one that takes the folded queries ``[Hkv, m, d]``, the buffers ``[Hkv, L, d]`` and ``bounds`` and
    returns the segments' ``[S, Hkv, m, d]`` outputs and ``[S, Hkv, m]`` log-sum-exps
    (``prefix_triton``); where it has ``with_block = True`` it also takes the block's keys, values and
    visibility and returns the block as segment S (``prefix_block_triton``, whose merge is ``combine``)."""
    _, q_heads, n, d = query.shape
    kv_heads, length = key.shape[1], key.shape[2]
    groups = q_heads // kv_heads
    m = groups * n
    scale = d**-0.5 if scale is None else scale
    folded = query[0].reshape(kv_heads, m, d)  # head j * groups + i, token t -> row i * n + t of head j
    if bounds is None:
        bounds = SegmentBounds(past, segments, m)
    elif (bounds.segments, bounds.rows) != (segments, m):
        raise ValueError(f"bounds for {bounds.segments} segments of {bounds.rows} rows, not {segments} of {m}")
    block_k, block_v = key[0].index_select(1, rows), value[0].index_select(1, rows)  # [Hkv, n, d]
    if getattr(prefix, "with_block", False):
        out, lse = prefix(folded, key[0], value[0], bounds, scale, block_k, block_v, visible)
    elif getattr(prefix, "folded", False):
        out, lse = prefix(folded, key[0], value[0], bounds, scale)
    else:
        packed = folded.transpose(0, 1)  # [m, Hkv, d]
        packed = packed.unsqueeze(0).expand(segments, m, kv_heads, d).reshape(segments * m, kv_heads, d)
        out, lse = prefix(packed, key[0].transpose(0, 1), value[0].transpose(0, 1), bounds.cu_q, bounds.starts,
                          bounds.used, m, length, scale)
        out = out.view(segments, m, kv_heads, d).transpose(1, 2)  # [S, Hkv, m, d]
    merged = (merge or _merge_kernel(query.device))(folded, block_k, block_v, visible, out, lse, bounds.lengths, scale)
    return merged.to(query.dtype).reshape(1, q_heads, n, d)


def splits(query: Tensor, key: Tensor) -> bool:
    """Whether ``split_attend`` (the flash kernel) serves these shapes here: CUDA at sm_80 or newer,
    bf16/fp16, a head dim the kernel takes, ``min_queries(head_dim)`` to ``SPLIT_MAX_QUERIES`` queries."""
    if query.device.type != "cuda" or query.dtype not in (torch.bfloat16, torch.float16) or not _STATE["on"]:
        return False
    n, d = query.shape[2], query.shape[3]
    return (min_queries(d) <= n <= SPLIT_MAX_QUERIES and d <= 256 and d % 8 == 0
            and torch.cuda.get_device_capability(query.device)[0] >= 8)


_STATE = {"on": True, "probed": False}
# (n, Hq, Hkv, d, dtype, segments) -> the (prefix, merge) that gave the reference's result there (None: none did)
_SERVES: dict[tuple, tuple[Callable, Callable] | None] = {}
SERVES_TOLERANCE = 0.05  # the largest difference from the reference a shape may show (bf16/fp16 outputs)


def _disagreement(n: int, q_heads: int, kv_heads: int, d: int, dtype: torch.dtype, device: torch.device,
                  segments: int, pasts: tuple[int, ...], length: int, merge: Callable | None = None,
                  prefix: Callable = prefix_flash) -> float:
    """The largest difference between ``split_attend`` (with ``prefix`` and ``merge``; None: the compiled
    merge) and its plain-math reference on random tensors of these shapes over a ``length``-row buffer,
    at each prefix length of ``pasts``."""
    gen = torch.Generator(device).manual_seed(n)
    q = torch.randn(1, q_heads, n, d, device=device, dtype=dtype, generator=gen)
    k, v = (torch.randn(1, kv_heads, length, d, device=device, dtype=dtype, generator=gen) for _ in range(2))
    visible = torch.ones(n, n, dtype=torch.bool, device=device).tril()
    error = 0.0
    for past in pasts:
        rows, p = torch.arange(past, past + n, device=device), torch.tensor(past, device=device)
        got = split_attend(q, k, v, p, rows, visible, segments=segments, merge=merge, prefix=prefix)
        want = split_attend(q, k, v, p, rows, visible, segments=segments, prefix=prefix_reference,
                            merge=block_and_merge)
        error = max(error, (got.float() - want.float()).abs().max().item())
    return error


def _candidates(n: int, device: torch.device, head_dim: int) -> list[tuple[str, Callable, Callable | None]]:
    """(name, prefix kernel, merge) in the order ``serves`` tries them at n queries of ``head_dim``: the
    merges' names mean the flash prefix; "Triton prefix" is ``prefix_triton`` with the Triton merge."""
    triton = triton_available(device)
    merges = [("compiled merge", prefix_flash, None)] + [("Triton merge", prefix_flash, triton_merge)] * triton
    if n >= TRITON_FIRST_QUERIES:
        merges.reverse()
    first = [("Triton prefix with the block", prefix_block_triton, triton_combine)] * FUSED_BLOCK
    first = (first + [("Triton prefix", prefix_triton, triton_merge)]) * (triton and triton_prefix_first(n, head_dim))
    return first + merges + [("plain merge", prefix_flash, block_and_merge)]


def serves(query: Tensor, key: Tensor, segments: int) -> tuple[Callable, Callable] | None:
    """The prefix kernel and merge with which the split gives the reference's result at this shape
    (n queries of Hq heads over Hkv, head dim, dtype, segments), or None where none does: tried once
    per shape on random tensors of a 3K-row buffer at its first use (a graph's warm-up, never inside
    a capture), P = 0 and 1 among the lengths tried. The order (``_candidates``): where Triton runs
    and ``triton_prefix_first`` says so, the Triton prefix with the Triton merge; then the flash prefix with
    the compiled merge, then with the Triton one (from ``TRITON_FIRST_QUERIES`` queries on, Triton
    before the compiled one: faster there); then with the plain merge (more launches, the same math).
    On one H100 (torch 2.11) the compiled merge was wrong (errors up to inf) at head dim 256 with 65
    and 257 queries and at head dim 16 with 257, where the flash kernel and the plain merge were right
    (``docs/results/split_merge_diag_h100.json``); with contiguous log-sum-exps it was still wrong at
    head dim 256 with 257 queries (attention bench, 2026-12-06).
    A shape this refuses stays on FlexAttention; either fallback is logged once."""
    _, q_heads, n, d = query.shape
    kv_heads = key.shape[1]
    shape = (n, q_heads, kv_heads, d, query.dtype, segments)
    if shape not in _SERVES:
        length = 3000 + n
        reasons, chosen, name = [], None, ""
        for name, prefix, merge in _candidates(n, query.device, d):
            try:
                with recompile_limit():
                    error = _disagreement(n, q_heads, kv_heads, d, query.dtype, query.device, segments,
                                          (0, 1, 777, length - n), length, merge=merge, prefix=prefix)
            except Exception as err:  # a kernel that refuses the shape, a merge that does not compile
                reasons.append(f"{name}: {type(err).__name__}: {(str(err).splitlines() or [''])[0]}")
                continue
            if error < SERVES_TOLERANCE:
                chosen = (prefix, merge or _merge_kernel(query.device))
                break
            reasons.append(f"{name}: differs from the reference by {error:.3g}")
        _SERVES[shape] = chosen
        if reasons:
            log.warning("split attention for %d queries (%d over %d heads of %d, %s, %d segments): %s; %s", n,
                        q_heads, kv_heads, d, query.dtype, segments, "; ".join(reasons),
                        "FlexAttention serves them" if chosen is None else f"the {name} serves them")
    return _SERVES[shape]


def probe(dtype: torch.dtype, device: torch.device) -> bool:
    """Run ``split_attend`` once on small tensors against ``prefix_reference`` (flash kernel and compiled
    merge alike, before any graph capture); where it fails or disagrees, split attention is switched
    off for the process, with a warning, and FlexAttention serves every verify. Returns whether it is on."""
    if _STATE["probed"] or device.type != "cuda" or dtype not in (torch.bfloat16, torch.float16):
        return _STATE["on"]
    _STATE["probed"] = True
    try:
        error = _disagreement(5, 4, 2, 64, dtype, device, segments=3, pasts=(300,), length=640)
        if not error < SERVES_TOLERANCE:
            raise ValueError(f"differs from the reference by {error:.3g}")
    except Exception as err:  # a missing kernel, a compiler failure, or another layout of its results
        log.warning("split attention (a flash kernel over the prefix) does not run here (%s: %s); FlexAttention "
                    "serves every verify", type(err).__name__, (str(err).splitlines() or [""])[0])
        _STATE["on"] = False
    return _STATE["on"]
