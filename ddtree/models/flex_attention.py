"""Block-sparse FlexAttention for verifies and drafts at long context: no dense mask.

A query block of n tokens at committed length P sees every cache row below P, and the rows
P..P+n-1 (its own) through an ``[n, n]`` visibility (the tree's ancestor mask; all-True for the
DFlash block, lower-triangular for a prefill chunk). ``FlexLayout`` keeps, for one n over a cache
of ``kv_length`` rows, a 0-dim device tensor P, the ``[n, n]`` bool visibility, and the block
tables a ``BlockMask`` reads, all in static buffers: ``refresh`` rewrites the tables from P with
device ops of static shape, so one CUDA graph per n serves every prefix length (write P and the
visibility in place, replay). Blocks wholly below P are "full" (read with no ``mask_mod`` call);
only the blocks over [P, P + n) are partial; nothing at or past P + n is read at all.

On CUDA, ``attend`` runs ``torch.compile``d ``flex_attention`` (one kernel per n, compiled on
first use: run it once before a graph capture, ``probe``); elsewhere the eager reference, which
materialises the scores and applies ``mask_mod`` everywhere (block tables unused): the same
math, for tests.
"""

from __future__ import annotations

import math
import warnings
from typing import Callable

import torch
from torch import Tensor
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from ddtree.models import split_attention
from ddtree.models.fused import compiles, recompile_limit

ATTENTIONS = ("auto", "dense", "flex")
KV_BLOCK = 128  # rows per sparse block (FlexAttention's default), along queries and keys
# The most outputs a decoding tile holds (BLOCK_M x head dim, float32, over two warps) without spilling.
DECODE_TILE_OUTPUTS = 64 * 128
# The decoding kernel's split over keys: buffer rows per split at most, and the most bytes of
# float32 partial outputs ([splits, query heads, n, head dim]) the splits may write per call.
DECODE_SPLIT_ROWS = 512
DECODE_PARTIALS_BYTES = 16 * 2**20


def visibility_mask_mod(past: Tensor, visible: Tensor) -> Callable:
    """``kv < P or (P <= kv < P + n and visible[q, kv - P])``, P = ``past`` (0-dim), visible ``[n, n]`` bool."""
    n = visible.shape[0]

    def mask_mod(b, h, q, kv):
        offset = kv - past
        own = (offset >= 0) & (offset < n)
        # Indices are clamped: the kernels may call this for padding rows and columns.
        return (kv < past) | (own & visible[q.clamp(0, n - 1), offset.clamp(0, n - 1)])

    return mask_mod


class FlexLayout:
    """The ``BlockMask`` of n queries over ``kv_length`` cache rows, rebuilt in place from P.

    >>> layout = FlexLayout(3, 512, torch.device("cpu"))
    >>> layout.set(200, torch.ones(3, 3, dtype=torch.bool).tril())
    >>> int(layout.full_num_blocks[0, 0, 0]), int(layout.kv_num_blocks[0, 0, 0]), int(layout.kv_indices[0, 0, 0, 0])
    (1, 1, 1)
    """

    def __init__(self, n: int, kv_length: int, device: torch.device, split: bool = False) -> None:
        self.n, self.kv_length, self.split = n, kv_length, split
        q_blocks, kv_blocks = math.ceil(n / KV_BLOCK), math.ceil(kv_length / KV_BLOCK)
        self.past = torch.zeros((), dtype=torch.long, device=device)  # P
        self.visible = torch.zeros(n, n, dtype=torch.bool, device=device)  # [n, n]
        self.rows = torch.arange(n, device=device)  # [n] P + 0..n-1: the cache rows of the queries' own keys
        self._blocks = torch.arange(kv_blocks, dtype=torch.int32, device=device)  # [kv_blocks]
        shape = (1, 1, q_blocks)
        self.kv_num_blocks = torch.zeros(shape, dtype=torch.int32, device=device)  # partial blocks
        self.kv_indices = torch.zeros(*shape, kv_blocks, dtype=torch.int32, device=device)
        self.full_num_blocks = torch.zeros(shape, dtype=torch.int32, device=device)  # blocks below P
        self.full_indices = self._blocks.expand(*shape, kv_blocks).contiguous()  # never rewritten
        self._bounds: dict[tuple[int, int], split_attention.SegmentBounds] = {}  # (S, rows) -> the split's segments
        self.refresh()
        self.block_mask = BlockMask.from_kv_blocks(
            self.kv_num_blocks, self.kv_indices, self.full_num_blocks, self.full_indices, BLOCK_SIZE=KV_BLOCK,
            mask_mod=visibility_mask_mod(self.past, self.visible), seq_lengths=(n, kv_length),
            compute_q_blocks=False,  # forward only
        )
        self.block_mask.layout = self  # what ``attend`` reads for a split (``ddtree.models.split_attention``)

    def refresh(self) -> None:
        """Rewrite the block tables and ``rows`` from ``past`` (device ops, no host sync: graph-safe).
        Every query block gets the same tables: blocks [0, P // 128) full, then the partial ones
        up to the block of row P + n - 1."""
        first = torch.div(self.past, KV_BLOCK, rounding_mode="floor")
        last = torch.div(self.past + self.n - 1, KV_BLOCK, rounding_mode="floor")
        self.full_num_blocks.copy_(first.to(torch.int32).expand_as(self.full_num_blocks))
        self.kv_num_blocks.copy_((last - first + 1).to(torch.int32).expand_as(self.kv_num_blocks))
        partial = (self._blocks + first.to(torch.int32)).clamp(max=self._blocks.numel() - 1)
        self.kv_indices.copy_(partial.expand_as(self.kv_indices))
        torch.add(self.past, torch.arange(self.n, device=self.rows.device), out=self.rows)
        for bounds in self._bounds.values():
            bounds.update(self.past)

    def bounds(self, segments: int, rows: int) -> split_attention.SegmentBounds:
        """The split's segment bounds for ``segments`` and ``rows`` folded query rows at this P: made
        at first use, then rewritten by every ``refresh``, so all layers of a forward share one
        computation. Inside a graph capture a new one is computed in the captured forward and not
        kept (its memory would belong to the graph's pool)."""
        key = (segments, rows)
        if key in self._bounds:
            return self._bounds[key]
        made = split_attention.SegmentBounds(self.past, segments, rows)
        if not torch.cuda.is_available() or not torch.cuda.is_current_stream_capturing():
            self._bounds[key] = made
        return made

    def move(self, past: int | Tensor) -> None:
        """Write P (an int, or a 0-dim device tensor) in place, then ``refresh``."""
        if isinstance(past, Tensor):
            self.past.copy_(past)
        else:
            self.past.fill_(past)
        self.refresh()

    def set(self, past: int | Tensor, visible: Tensor) -> None:
        """Write P and the ``[n, n]`` visibility in place, then ``refresh``."""
        self.visible.copy_(visible, non_blocking=True)
        self.move(past)


# -- the kernel ---------------------------------------------------------------------------------

_COMPILED: list[Callable] = []


def _compiled() -> Callable:
    if not _COMPILED:
        _COMPILED.append(torch.compile(flex_attention, dynamic=False, fullgraph=True))
    return _COMPILED[0]


def kernel_options(n: int, groups: int, dtype: torch.dtype, capability: tuple[int, int], head_dim: int,
                   kv_length: int | None = None, kv_heads: int = 1, sms: int | None = None) -> dict:
    """Triton options for n queries with ``groups`` query heads per K/V head of ``head_dim`` on a GPU
    of ``capability`` (with ``sms`` multiprocessors), over buffers of ``kv_length`` rows and ``kv_heads``.

    Queries shorter than 128 rows run FlexAttention's decoding kernel, which stacks the ``groups``
    heads of a K/V head into one tile of ``BLOCK_M`` rows; its default (the next power of two of
    n * groups) must divide the 128-row query block, so a longer stack (n * groups > 128, e.g. a
    65-token verify with 4 groups) is cut into tiles of 128 rows or fewer. The kernel runs two warps
    a tile, which hold the tile's ``BLOCK_M x head_dim`` float32 outputs in registers: past 64 x 128
    (128 a thread) they spill, and a 128 x 128 tile (a 65-node verify of Qwen3-8B's 32 over 8
    heads) did not finish within 4 minutes on an H100, so the tile is halved until it fits (16 rows
    at least). Ampere parts other than the A100 (sm_86/sm_89: A6000, RTX 30/40) have ~100 KB of
    shared memory per block against 164 KB (A100) and 228 KB (H100/H200): the defaults picked for
    sm_80 (128 x 64 tiles, 3 stages, head dim 128) do not fit there, so they get 64 x 64 tiles in 2
    stages (fp32: 32 x 32, 1 stage).

    The decoding kernel also splits the keys over ``SPLIT_KV`` programs per K/V head, two per
    multiprocessor by default (32 for 8 K/V heads on 132), and sizes the splits by the buffer's
    length, not the live prefix's: with the fast path's static buffers a 131K-row cache leaves a
    prefix of 8K rows to two splits per head. On one H200 the AR step at 8192 took 11.98 ms with
    131K-row caches against 8.18 with 33K-row ones. So given ``kv_length`` and ``sms``, splits are
    at most ``DECODE_SPLIT_ROWS`` rows, as long as their partial outputs stay within
    ``DECODE_PARTIALS_BYTES`` (one query: 257 splits of a 131K buffer; 65 queries: the default).
    """
    small_smem = capability[0] == 8 and capability[1] != 0
    options: dict = {}
    if small_smem:
        wide = dtype in (torch.float16, torch.bfloat16)
        options.update(BLOCK_M=64 if wide else 32, BLOCK_N=64 if wide else 32, num_stages=2 if wide else 1)
    if n < KV_BLOCK:  # the decoding kernel: one tile per K/V head holds groups * BLOCK_M / groups rows
        stacked = max(16, 1 << max(n * groups - 1, 0).bit_length())
        block_m = min(stacked, 64 if small_smem else KV_BLOCK)
        while block_m > 16 and block_m * head_dim > DECODE_TILE_OUTPUTS:
            block_m //= 2
        options["BLOCK_M"] = block_m
        if kv_length is not None and sms is not None:
            default = max(sms // kv_heads * 2, 1)  # FlexAttention's own choice
            cap = DECODE_PARTIALS_BYTES // (4 * n * groups * kv_heads * head_dim)
            splits = min(-(-kv_length // DECODE_SPLIT_ROWS), cap)
            if splits > default:
                options["SPLIT_KV"] = splits
    return options


def attend(query: Tensor, key: Tensor, value: Tensor, block_mask: BlockMask, scale: float | None = None) -> Tensor:
    """``query`` [1, Hq, n, d] over ``key``/``value`` [1, Hkv, L, d] under ``block_mask`` -> [1, Hq, n, d]."""
    groups = query.shape[1] // key.shape[1]
    gqa = groups > 1
    if query.device.type != "cuda":
        with warnings.catch_warnings():  # the eager reference materialises the scores, and says so
            warnings.simplefilter("ignore", UserWarning)
            return flex_attention(query, key, value, block_mask=block_mask, scale=scale, enable_gqa=gqa)
    props = torch.cuda.get_device_properties(query.device)
    layout = getattr(block_mask, "layout", None)
    if layout is not None and layout.split and split_attention.splits(query, key):
        segments = split_attention.segments_for(query.shape[2], groups, key.shape[1], key.shape[2],
                                                props.multi_processor_count)
        with recompile_limit():  # every verify size is one compiled kernel
            chosen = split_attention.serves(query, key, segments)
            if chosen is not None:
                bounds = layout.bounds(segments, groups * query.shape[2])
                return split_attention.split_attend(query, key, value, layout.past, layout.rows, layout.visible,
                                                    scale, segments=segments, prefix=chosen[0], merge=chosen[1],
                                                    bounds=bounds)
    options = kernel_options(query.shape[2], groups, query.dtype, (props.major, props.minor), head_dim=query.shape[-1],
                             kv_length=key.shape[2], kv_heads=key.shape[1], sms=props.multi_processor_count)
    with recompile_limit():  # every verify size is one compiled kernel
        return _compiled()(query, key, value, block_mask=block_mask, scale=scale, enable_gqa=gqa,
                           kernel_options=options)


def flex_attention_forward(module, query: Tensor, key: Tensor, value: Tensor, block_mask: BlockMask,
                           scaling: float | None = None) -> tuple[Tensor, None]:
    """A transformers attention function's result: ``[1, n, Hq, d]`` and no weights."""
    return attend(query, key, value, block_mask, scaling).transpose(1, 2).contiguous(), None


def probe(dtype: torch.dtype, device: torch.device) -> None:
    """Compile and run ``attend`` once on tiny tensors (4 query heads over 2 K/V heads, head dim 16):
    raises what the compiler raises (``ddtree.models.fused.COMPILER_ERRORS``). Run it outside any
    forward and before any graph capture.

    >>> probe(torch.bfloat16, torch.device("cuda"))     # doctest: +SKIP
    """
    layout = FlexLayout(2, 2 * KV_BLOCK, device)
    layout.set(KV_BLOCK + 3, torch.ones(2, 2, dtype=torch.bool, device=device).tril())
    q = torch.ones(1, 4, 2, 16, dtype=dtype, device=device)
    kv = torch.ones(1, 2, 2 * KV_BLOCK, 16, dtype=dtype, device=device)
    attend(q, kv, kv, layout.block_mask)
    split_attention.probe(dtype, device)  # the split's flash kernel and merge: on where they run


class FlexChoice:
    """Which attention a static target's verify runs: mixed into ``StaticTarget`` and
    ``StaticHybridTarget``, which set ``attention``, ``flex_threshold``, ``max_length``, ``dtype``
    and ``input_device`` (``init_flex``). ``"dense"``: the folded dense-mask SDPA; ``"flex"``: this
    module's block-sparse FlexAttention for every verify; ``"auto"``: flex on CUDA from
    ``flex_threshold`` live rows on, dense below and on the CPU."""

    def init_flex(self, attention: str, flex_threshold: int) -> None:
        if attention not in ATTENTIONS:
            raise ValueError(f"attention={attention!r}: choose one of {ATTENTIONS}")
        self.attention, self.flex_threshold = attention, int(flex_threshold)
        self._flex_probed = False
        self._layouts: dict[int, FlexLayout] = {}  # n -> the layout every flex forward of n queries reads

    def _uses_flex(self, rows: int) -> bool:
        """Whether a forward reaching ``rows`` live cache rows runs FlexAttention."""
        if self.attention == "dense" or (self.attention == "auto" and (
                self.input_device.type != "cuda" or rows < self.flex_threshold)):
            return False
        if self.input_device.type == "cuda" and not self._flex_probed:
            self._probe_flex()
        return self.attention != "dense"

    def _probe_flex(self) -> None:
        """Compile FlexAttention once, outside any forward and graph capture; without a working
        compiler it would materialise the scores, so the target stays dense instead."""
        self._flex_probed = True
        if not self._compiles(probe, (
                "keeps the dense-mask attention: the same tokens, slower at long context. Install Triton "
                "for the FlexAttention kernels, or pass attention='dense' to silence this.")):
            self.attention = "dense"

    def _compiles(self, check: Callable, instead: str) -> bool:
        """Whether ``check(dtype, device)`` compiles; if not, a warning says why and what the target does ``instead``."""
        return compiles(check, self.dtype, self.input_device, f"{type(self).__name__} {instead}")

    def _layout(self, n: int) -> FlexLayout:
        if n not in self._layouts:  # auto: the prefix/block split where it serves (split_attention)
            self._layouts[n] = FlexLayout(n, self.max_length, self.input_device, split=self.attention == "auto")
        return self._layouts[n]

    @staticmethod
    def _visibility(inputs) -> Tensor:  # [n, n] bool
        """The tree block of a verify's mask: a bool ``[n, n]`` as given, or read off a MaskCompiler's
        additive ``[1, 1, n, past + n]``."""
        tree, n, past = inputs.attention_mask, inputs.input_ids.shape[1], inputs.past_length
        return tree if tree.dtype == torch.bool else tree[0, 0, :, past : past + n] == 0
