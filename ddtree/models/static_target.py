"""A target with a preallocated KV cache and, on CUDA, one captured graph per verify size.

Eager Transformers is launch-bound at batch 1; a DDTree round always verifies 1 + B tokens, so
the verify forward has a static shape per budget and can be replayed from a CUDA graph.

The K/V of all layers live in one slab (``StaticKV``, ``[layers, kv_heads, max_length, head_dim]``):
a forward writes its rows at a device index computed once for all layers (inside a graph, from
the prefix length P written into the graph's buffer before each replay), so a verify of n tokens
at committed length P writes rows P..P+n-1; the commit then moves the accepted rows of every layer
to P..P+a-1 with one gather and one scatter. Keys beyond the committed length hold stale rows,
which the mask hides. The mask is ``[1, 1, groups * n, W]``: W, the live width rounded up to a multiple of
``width_step``, tells the attention (``ddtree.models.attention``) how many cache rows to read,
and its rows are repeated once per query head sharing a K/V head, so no K/V copy is made. One
graph is kept per (n, W), each with its own memory pool (graphs that share one cannot be
thrown away safely when the taps change). A graph reads the mask buffer it was recorded with,
so that buffer belongs to its (n, W) for the target's lifetime: a prefill of n tokens builds a
mask of its own and never touches a verify buffer. With ``fuse`` (on with graphs), the target's RMSNorms,
rotary embedding and SiLU-and-mul run as ``torch.compile``d kernels inside its forwards
(``ddtree.models.fused``): inside a graph the many tiny eager kernels they otherwise launch
cost about a third of a budget-256 verify. The kernels are compiled once on tiny tensors before
the first forward; only if that fails (no working compiler) does the target fall back to the stock ones.

Long context (``attention``): a dense mask over the live width keeps SDPA off its flash kernels and
costs one graph per width bucket. With ``attention="flex"``, and with ``"auto"`` on CUDA once the
live length reaches ``flex_threshold`` rows, a verify runs block-sparse FlexAttention instead
(``ddtree.models.flex_attention``): the committed prefix is read with no mask, the tree block
through its ``[n, n]`` ancestor visibility, and one graph per verify size n serves every prefix
length (the prefix length P and the visibility are written in place before each replay). Dense
and flex graphs coexist. Such a prefill runs in chunks of ``prefill_chunk`` rows: the first
``n mod prefill_chunk`` rows with a dense causal mask of that square size, every further chunk
with FlexAttention over the rows before it, so no buffer grows with prompt x context.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch import Tensor
from transformers import PreTrainedModel

from ddtree.models import fused
from ddtree.models.attention import use_folded_sdpa
from ddtree.models.folded_mask import FoldedMasks
from ddtree.models.flex_attention import ATTENTIONS, FlexChoice, FlexLayout
from ddtree.models.static_kv import StaticKV
from ddtree.models.target import HFTarget, to_sink
from ddtree.types import TargetOutput, VerifyInputs

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _VerifyGraph:
    """One captured verify of n tokens over W cache rows (or over a ``FlexLayout``), with every
    buffer it reads or writes: the inputs are copied into ``ids`` and ``positions``, P into ``past``
    and the mask rewritten in ``mask`` (a layout's P and visibility) before each replay; ``logits``
    ``[n, vocab]`` and ``taps`` are overwritten by it."""

    graph: torch.cuda.CUDAGraph
    ids: Tensor  # [1, n]
    positions: Tensor  # [1, n]
    past: Tensor  # [] P: the graph writes the K/V of its n tokens at rows P..P+n-1 (a layout's own P)
    steps: Tensor  # [n] 0..n-1, read by the graph (kept here: a freed buffer would be reused under it)
    rows: Tensor  # [n] P + steps, written and read by the graph
    mask: Tensor | FlexLayout  # [1, 1, groups * n, W], or the layout whose tables the graph rebuilds
    logits: Tensor
    taps: Tensor | None


class StaticTarget(FlexChoice, HFTarget):
    """``HFTarget`` over one static K/V slab of ``max_length`` rows (``StaticKV``), optionally CUDA-graphed.
    The whole model on one device (a model over several: ``HFTarget``), full-attention layers only.

    ``cuda_graphs=None`` captures graphs when the model lives on one CUDA device. ``attention``:
    ``"dense"`` (masked SDPA), ``"flex"`` (block-sparse FlexAttention for every verify), or
    ``"auto"`` (flex on CUDA from ``flex_threshold`` live rows on, dense below and on the CPU).

    >>> target = StaticTarget(model, max_length=4096)     # doctest: +SKIP
    >>> long = StaticTarget(model, max_length=135168, attention="auto", flex_threshold=4096)  # doctest: +SKIP

    ``fuse_projections=True`` stores each MLP's gate and up weights, and each attention layer's q, k and
    v, in one tensor a group (``fused.fuse_projections``: the parameters become views of it) and, with
    ``fuse``, runs each group as one GEMM. ``None`` (the default): on with CUDA graphs, as ``fuse``.
    """

    reads_tree_block = True  # a verify's bool [n, n] tree block is written into its own masks (AutoMaskCompiler)

    def __init__(self, model: PreTrainedModel, max_length: int = 4096, cuda_graphs: bool | None = None,
                 width_step: int = 256, fuse: bool | None = None, attention: str = "auto",
                 flex_threshold: int = 4096, prefill_chunk: int = 4096, fuse_projections: bool | None = None) -> None:
        if attention not in ATTENTIONS:  # before the model is touched
            raise ValueError(f"attention={attention!r}: choose one of {ATTENTIONS}")
        if prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be a positive number of rows, got {prefill_chunk}")
        super().__init__(model, max_length=max_length)
        self.init_flex(attention, flex_threshold)
        self.prefill_chunk = int(prefill_chunk)
        self._flex_graphs: dict[int, _VerifyGraph] = {}
        use_folded_sdpa(model)
        self.width_step = width_step
        self.groups = self.config.num_attention_heads // self.config.num_key_value_heads
        devices = {p.device for p in model.parameters()}
        if len(devices) != 1:
            raise ValueError(
                f"StaticTarget keeps every layer's K/V in one slab on one device; the model spans "
                f"{sorted(map(str, devices))}. Use HFTarget for a model split over devices"
            )
        one_cuda = next(iter(devices)).type == "cuda"
        if cuda_graphs and not one_cuda:
            raise ValueError("CUDA graphs need the whole target on one CUDA device; pass cuda_graphs=False")
        self.cuda_graphs = one_cuda if cuda_graphs is None else cuda_graphs
        self.fuse = self.cuda_graphs if fuse is None else bool(fuse)
        fuse_projections = self.cuda_graphs if fuse_projections is None else bool(fuse_projections)
        self.fused_projections = fused.fuse_projections(model) if fuse_projections else 0
        self._probed = False  # whether the fused functions were compiled once (``_probe_compiler``)
        cfg, layers = self.config, len(self.layers)
        kinds = set(getattr(cfg, "layer_types", None) or ("full_attention",))
        if kinds != {"full_attention"}:
            raise NotImplementedError(
                f"the model's layers are {sorted(kinds)}: StaticTarget handles full attention only (no sliding "
                "windows, no recurrent layers); use HybridTarget or StaticHybridTarget for Qwen3.5/3.6, HFTarget else"
            )
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.kv = StaticKV(layers, cfg.num_key_value_heads, self.max_length, head_dim, self.dtype,
                           next(iter(devices)), slots={i: i for i in range(layers)})
        self.cache = self.kv  # what the model's attention layers update: every layer's K/V in one slab
        self.masks = FoldedMasks(self.groups, width_step, self.max_length, self.dtype, self.input_device)
        self._graphs: dict[tuple[int, int], _VerifyGraph] = {}

    def _forward(self, ids: Tensor, positions: Tensor, mask, logits_to_keep: int) -> TargetOutput:
        if self.fuse and not self._probed:
            self._probe_compiler()
        if not self.fuse:
            return super()._forward(ids, positions, mask, logits_to_keep)
        with fused.fused_ops(self.model):
            return super()._forward(ids, positions, mask, logits_to_keep)

    def _probe_compiler(self) -> None:
        """Compile the fused functions once, outside any forward: without a working compiler the
        stock kernels run instead (the same math). An error of the forward itself propagates."""
        self._probed = True
        self.fuse = self._compiles(fused.probe, (
            "runs the stock kernels instead of the fused ones: the same tokens, slower inside CUDA graphs. "
            "Install a working C++ compiler (and Triton on CUDA) for the fused kernels, or pass fuse=False "
            "to silence this."))

    def set_taps(self, layers: Sequence[int]) -> None:
        if tuple(layers) != self._taps:
            self._graphs.clear()  # a graph replays the taps it was recorded with (no-op if unchanged)
            self._flex_graphs.clear()
        super().set_taps(layers)

    def new_cache(self) -> StaticKV:
        # The slab is reused across prompts (graphs hold its address); rows past the prefix are masked.
        self.kv.length = 0
        return self.kv

    def _rows(self, start: int, n: int) -> StaticKV:
        """The slab, set to write the next forward's n rows at start..start+n-1 (eager forwards)."""
        return self.kv.at(torch.arange(start, start + n, device=self.kv.keys.device))

    def prefill(self, input_ids: Tensor, taps_sink: Callable[[Tensor], None] | None = None) -> TargetOutput:
        """The prompt into the static cache; logits of its last row. With ``taps_sink`` the taps go
        to it, on the chunked FlexAttention path one chunk at a time (never all rows at once)."""
        ids = input_ids.reshape(1, -1)
        n = ids.shape[1]
        if n > self.max_length:
            raise ValueError(f"a prompt of {n} tokens exceeds the static cache of {self.max_length} rows")
        self.new_cache()
        self.past_length = 0
        if self._uses_flex(n):
            out = self._chunked_prefill(ids, taps_sink)
        else:
            self._rows(0, n)
            out = to_sink(self._forward(ids, torch.arange(n)[None], self.masks.prefill(n), logits_to_keep=1), taps_sink)
        self.past_length = self.kv.length = n
        return out

    def _chunked_prefill(self, ids: Tensor, taps_sink: Callable[[Tensor], None] | None = None) -> TargetOutput:
        """The prompt ``ids`` ``[1, n]`` in chunks: the first ``n mod prefill_chunk`` rows under a
        dense causal mask of their own square size, then each chunk of ``prefill_chunk`` rows with
        FlexAttention over every row before it (one compiled kernel for every chunk). Logits of the
        last row; taps ``[n, n_taps * hidden]`` of every row, or, with ``taps_sink``, each chunk's
        taps handed to it as the chunk is done (and none in the output)."""
        n, chunk = ids.shape[1], self.prefill_chunk
        head = n % chunk
        out, taps = None, None

        def keep(part: TargetOutput, start: int) -> TargetOutput:
            """Each chunk's taps go to the sink, or straight into one ``[n, F]`` buffer: no list of
            chunks, no concatenation."""
            nonlocal taps
            if part.taps is None:
                return part
            if taps_sink is not None:
                taps_sink(part.taps)
                return part
            if taps is None:
                taps = part.taps.new_empty(n, part.taps.shape[-1])
            taps[start : start + part.taps.shape[0]] = part.taps
            return part

        if head:
            self._rows(0, head)
            out = keep(self._forward(ids[:, :head], torch.arange(head)[None], self.masks.prefill(head), logits_to_keep=1), 0)
        if head < n:
            layout = self._layout(chunk)
            causal = torch.ones(chunk, chunk, dtype=torch.bool, device=self.input_device).tril()
            for start in range(head, n, chunk):
                layout.set(start, causal)
                self.kv.at(layout.rows)  # start..start+chunk-1, as the layout computed them
                positions = torch.arange(start, start + chunk)[None]
                out = keep(self._forward(ids[:, start : start + chunk], positions, layout.block_mask, logits_to_keep=1),
                           start)
        return TargetOutput(tokens=ids[0], logits=out.logits, taps=taps)

    def forward_tree(self, inputs: VerifyInputs) -> TargetOutput:
        n, past = inputs.input_ids.shape[1], inputs.past_length
        if past + n > self.max_length:
            raise ValueError(f"verify of {n} tokens after {past} exceeds the static cache of {self.max_length} rows")
        if self._uses_flex(past + n):
            return self._flex_tree(inputs)
        mask = self.masks.verify(n, inputs.attention_mask, past)
        if not self.cuda_graphs:
            self._rows(past, n)
            return self._forward(inputs.input_ids, inputs.position_ids, mask, logits_to_keep=0)
        key = (n, mask.shape[-1])
        if key not in self._graphs:
            self._graphs[key] = self._record_graph(n, mask)
        rec = self._graphs[key]
        if rec.mask is not mask:  # the graph would read a buffer nobody writes any more
            raise RuntimeError(f"the verify graph for {key} reads another mask buffer than the one written")
        rec.ids.copy_(inputs.input_ids, non_blocking=True)
        rec.positions.copy_(inputs.position_ids, non_blocking=True)
        rec.past.fill_(past)
        rec.graph.replay()
        return TargetOutput(tokens=inputs.input_ids[0], logits=rec.logits, taps=rec.taps)

    def _flex_tree(self, inputs: VerifyInputs) -> TargetOutput:
        """``forward_tree`` through the FlexAttention layout of its size: P and the ancestor
        visibility written in place, then the one graph of that size replayed (it rebuilds the
        block tables from P itself)."""
        n, past = inputs.input_ids.shape[1], inputs.past_length
        layout, visible = self._layout(n), self._visibility(inputs)
        if not self.cuda_graphs:
            layout.set(past, visible.to(layout.visible.device))
            self.kv.at(layout.rows)
            return self._forward(inputs.input_ids, inputs.position_ids, layout.block_mask, logits_to_keep=0)
        layout.past.fill_(past)
        layout.visible.copy_(visible, non_blocking=True)
        if n not in self._flex_graphs:
            self._flex_graphs[n] = self._record_graph(n, layout)
        rec = self._flex_graphs[n]
        rec.ids.copy_(inputs.input_ids, non_blocking=True)
        rec.positions.copy_(inputs.position_ids, non_blocking=True)
        rec.graph.replay()
        return TargetOutput(tokens=inputs.input_ids[0], logits=rec.logits, taps=rec.taps)

    def _record_graph(self, n: int, mask: Tensor | FlexLayout) -> "_VerifyGraph":
        """Record one verify of n tokens (a layout's table rebuild first, inside the graph; the K/V
        rows P..P+n-1 from the graph's P, also inside it). Warm-up runs write rows past the
        committed length only, so capturing never disturbs the sequence."""
        device = self.kv.keys.device
        ids = torch.zeros(1, n, dtype=torch.long, device=self.input_device)
        positions = torch.zeros(1, n, dtype=torch.long, device=self.input_device)
        past = mask.past if isinstance(mask, FlexLayout) else torch.full((), self.past_length, device=device)
        steps, rows = torch.arange(n, device=device), torch.empty(n, dtype=torch.long, device=device)

        def verify() -> TargetOutput:
            if isinstance(mask, FlexLayout):
                mask.refresh()
                self.kv.at(mask.rows)
                return self._forward(ids, positions, mask.block_mask, logits_to_keep=0)
            self.kv.at(torch.add(past, steps, out=rows))
            return self._forward(ids, positions, mask, logits_to_keep=0)

        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                verify()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = verify()
        return _VerifyGraph(graph, ids, positions, past, steps, rows, mask, out.logits, out.taps)

    def commit(self, path: Sequence[int]) -> None:
        """Move the accepted rows of every layer to P..P+a-1 in place (one gather and one write a slab)."""
        past, a = self.past_length, len(path)
        if list(path) != list(range(a)):  # a pure prefix is already in place
            src = (past + torch.as_tensor(path, dtype=torch.long)).to(self.kv.keys.device, non_blocking=True)
            for slab in (self.kv.keys, self.kv.values):  # every layer at once: [layers, kv_heads, rows, head_dim]
                slab[:, :, past : past + a] = slab.index_select(2, src)
        self.past_length = self.kv.length = past + a
