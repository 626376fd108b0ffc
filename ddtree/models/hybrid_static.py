"""A hybrid GDN / attention target (Qwen3.5, Qwen3.6) over static buffers, CUDA-graphed per verify size.

``HybridTarget`` is exact but eager: at batch 1 its rounds are launch-bound, and a dynamic cache
cannot be captured. Here every piece of sequence state lives in a buffer allocated once:

- attention K/V: ``keys``/``values`` ``[A, kv_heads, max_length, head_dim]``, one slab for all A
  attention layers; a verify of n tokens after P writes rows P..P+n-1 through ``index_copy_`` at a
  device row index, and the commit moves the accepted rows to P..P+a-1 (two copies in all);
- GDN conv windows ``[G, C, K]`` (model dtype) and recurrent states ``[G, H, dk, dv]`` (float32),
  one slab each for all G GDN layers.

A verify never writes the GDN slabs (each node sees only its root path, ``gdn_tree_forward``); it
leaves, per GDN layer, what the commit needs in a stash ``[G, n, ...]``, and the commit updates
all G layers with a handful of batched ops (the recurrent states in one Triton launch where the Triton
kernels run, ``gdn_tree_triton.commit_state``). The tree's tables are built once per verify, not once per
layer: its ancestor matrix is the layout's ``[n, n]`` tree block (every mask compiler of this library lays
out ``Tree.ancestors()``, the ancestors of ``parents``), and the conv taps come from the parents, on the
device. The prompt goes
through the model's own forward (Transformers' GDN kernels, flash-linear-attention's where
installed) on a dynamic cache that is then copied into the slabs, so prefill is what the eager
target computes.

With ``fuse`` (on with graphs) the GDN mixing steps (``tree_mix``) and the Qwen3.5 norms and MLPs run as
``torch.compile``d kernels (``ddtree.models.fused``), and, where Triton runs, each layer's tree delta rule
is one Triton kernel (``tree_mix_triton``, ``ddtree.models.gdn_tree_triton``; ``triton=False``: the
compiled torch math). With CUDA graphs, one graph is kept per (n, W) as in ``StaticTarget``: its inputs (ids,
positions, K/V rows, parents, the tree block) are copied into its buffers and the mask rewritten in place
before each replay, and every state slab it reads is only ever updated in place.
"""

from __future__ import annotations

import importlib.util
import logging
import contextlib
import functools
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel

from ddtree.models import fused, gdn_tree_layer, gdn_tree_triton
from ddtree.models.attention import use_folded_sdpa
from ddtree.models.flex_attention import ATTENTIONS, FlexChoice, FlexLayout
from ddtree.models.folded_mask import FoldedMasks
from ddtree.models.gdn_tree import TreeTables, conv_taps
from ddtree.models.gdn_tree_layer import GDNState, gdn_tree_forward, read_gdn_state, tree_mix, tree_mix_triton
from ddtree.models.hybrid import ATTENTION, GDN, HybridTarget, patched_forwards
from ddtree.models.static_kv import StaticKV
from ddtree.types import TargetOutput, VerifyInputs

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GDNStash:
    """What a verify of n nodes leaves for the commit, for all G GDN layers at once."""

    conv_inputs: Tensor  # [G, n, C] pre-conv inputs, model dtype
    keys: Tensor  # [G, n, Hk, dk] l2-normalised keys (one per key head), compute dtype
    updates: Tensor  # [G, n, H, dv] the delta each node writes
    log_decay: Tensor  # [G, n, H] summed log decay along each node's root path

    @classmethod
    def empty(cls, g: int, n: int, module: nn.Module, dtype: torch.dtype, compute: torch.dtype,
              device: torch.device) -> "GDNStash":
        h, hk, dk, dv = module.num_v_heads, module.num_k_heads, module.head_k_dim, module.head_v_dim
        return cls(
            conv_inputs=torch.zeros(g, n, module.conv_dim, dtype=dtype, device=device),
            keys=torch.zeros(g, n, hk, dk, dtype=compute, device=device),
            updates=torch.zeros(g, n, h, dv, dtype=compute, device=device),
            log_decay=torch.zeros(g, n, h, dtype=compute, device=device),
        )


@dataclass(frozen=True)
class _VerifyGraph:
    """One captured verify of n tokens over W cache rows and the buffers it reads and writes."""

    graph: torch.cuda.CUDAGraph
    ids: Tensor  # [1, n]
    positions: Tensor  # [1, n]
    rows: Tensor  # [n]
    parents: Tensor  # [n]
    visible: Tensor  # [n, n] bool: the tree's ancestor matrix, which the GDN layers read (a flex layout's own)
    mask: Tensor  # [1, 1, groups * n, W]
    logits: Tensor
    taps: Tensor | None
    stash: GDNStash
    path: Tensor  # [n] the accepted nodes (the first a of them), for the commit graphs
    past: Tensor  # [] P, for the commit graphs
    commits: dict[int, torch.cuda.CUDAGraph]  # a -> the recorded commit of a nodes from this graph's stash


class StaticHybridTarget(FlexChoice, HybridTarget):
    """``HybridTarget`` over static slabs, optionally CUDA-graphed; decodes the same tokens.

    ``cuda_graphs=None`` captures graphs when the model lives on one CUDA device. On the CPU
    (``cuda_graphs=False``) it runs the same buffers eagerly, which is how CPU tests check it.

    >>> target = StaticHybridTarget(model, max_length=8192)     # doctest: +SKIP

    ``attention`` (its attention layers), as for ``StaticTarget``: ``"auto"`` (the default) reads the
    dense folded mask below ``flex_threshold`` live rows and on the CPU, and from there on a GPU the
    FlexAttention layouts, with split attention where it serves; ``"dense"`` or ``"flex"`` forces one.
    On one H100 (Qwen3.6-27B geometry, prompt 8192) the dense mask's attention took 7.3 ms of an
    AR verify's kernels (``experiments/round_profile.py --prompt 8192``), where the AR verify under
    ``"auto"`` took 21.45 ms in all, as at prompt 512 (``experiments/speed.py``).

    ``fuse_projections=True`` stores each GDN layer's four input projections, each MLP's gate and up and
    each attention layer's q, k and v in one tensor a group (``fused.fuse_projections``: the parameters
    become views of it); a tree verify then runs each group as one GEMM (the MLP's and the attention's
    with ``fuse``). ``None`` (the default): on with CUDA graphs, as ``fuse``.
    """

    reads_tree_block = True  # a verify's bool [n, n] tree block is written into its own masks (AutoMaskCompiler)

    def __init__(self, model: PreTrainedModel, max_length: int = 4096, cuda_graphs: bool | None = None,
                 width_step: int = 256, fuse: bool | None = None, attention: str = "auto",
                 flex_threshold: int = 4096, triton: bool | None = None, fuse_projections: bool | None = None) -> None:
        if attention not in ATTENTIONS:  # before the model is touched
            raise ValueError(f"attention={attention!r}: choose one of {ATTENTIONS}")
        super().__init__(model, max_length)
        self.init_flex(attention, flex_threshold)
        devices = {p.device for p in model.parameters()}
        if len(devices) != 1:
            raise ValueError(
                f"StaticHybridTarget keeps its state slabs on one device; the model spans {sorted(map(str, devices))}. "
                "Use HybridTarget for a model split over devices"
            )
        device = next(iter(devices))
        if cuda_graphs and device.type != "cuda":
            raise ValueError("CUDA graphs need the whole target on one CUDA device; pass cuda_graphs=False")
        self.cuda_graphs = device.type == "cuda" if cuda_graphs is None else bool(cuda_graphs)
        self.fuse = self.cuda_graphs if fuse is None else bool(fuse)
        if triton and not (self.fuse and gdn_tree_triton.available(device)):
            raise ValueError("the Triton tree delta rule needs fuse=True, Triton installed and the model on a CUDA GPU")
        # The tree delta rule as one Triton kernel per layer (fused path on a GPU), else torch ops.
        self.triton = self.fuse and gdn_tree_triton.available(device) if triton is None else bool(triton)
        fuse_projections = self.cuda_graphs if fuse_projections is None else bool(fuse_projections)
        self.fused_projections = fused.fuse_projections(model) if fuse_projections else 0
        self._probed = False
        use_folded_sdpa(model)
        cfg = self.config
        self.groups = cfg.num_attention_heads // cfg.num_key_value_heads
        self.masks = FoldedMasks(self.groups, width_step, self.max_length, self.dtype, device)
        self.attention_layers = [i for i, kind in enumerate(self.layer_types) if kind == ATTENTION]
        self.gdn_layers = sorted(self.gdn_modules)
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.kv = StaticKV(len(self.attention_layers), cfg.num_key_value_heads, self.max_length, head_dim, self.dtype,
                           device, slots={layer: a for a, layer in enumerate(self.attention_layers)})
        self.keys, self.values = self.kv.keys, self.kv.values  # [A, kv_heads, max_length, head_dim]
        first = self.gdn_modules[self.gdn_layers[0]]
        self.kernel_size = first.conv_kernel_size
        self.compute_dtype = torch.promote_types(self.dtype, torch.float32)
        g = len(self.gdn_layers)
        self.conv = torch.zeros(g, first.conv_dim, self.kernel_size, dtype=self.dtype, device=device)
        self.recurrent = torch.zeros(g, first.num_v_heads, first.head_k_dim, first.head_v_dim,
                                     dtype=self.compute_dtype, device=device)
        self._graphs: dict[tuple[int, int], _VerifyGraph] = {}
        self._stash: GDNStash | None = None
        self._pending_graph: _VerifyGraph | None = None  # the graph whose stash the pending commit reads
        self._commit_pool = None  # the memory pool every commit graph shares
        log.info("StaticHybridTarget kernels: %s", self.kernels())

    def kernels(self) -> dict[str, str]:
        """Which kernels run where: the prompt's GDN layers (Transformers' forward: flash-linear-attention's
        kernels when installed, ``pip install ddtree[gdn]``, else its torch fallback) and the tree verify."""
        fla = importlib.util.find_spec("fla") is not None
        first = self.gdn_modules[self.gdn_layers[0]]
        return {
            "prefill": "flash-linear-attention" if fla else "torch fallback (install the gdn extra for its kernels)",
            "verify": ("Triton tree conv (with the head norms) and decay as one kernel, then delta rule"
                       if self.triton and gdn_tree_layer.fused_prologue(first.head_k_dim, first.key_dim, first.conv_dim)
                       else "Triton tree conv and delta rule" if self.triton and gdn_tree_layer.TRITON_CONV
                       else "torch.compile'd tree conv, Triton tree delta rule" if self.triton
                       else "torch.compile'd tree conv and delta rule" if self.fuse
                       else "torch tree conv and delta rule") + (", CUDA graphs" if self.cuda_graphs else "")
            + (f", {self.fused_projections} same-input projection groups as one GEMM each"
               if self.fused_projections else "")
            + (" (to be compiled at the first verify: a failure there falls back, with a warning)"
               if self.fuse and not self._probed else ""),
            "commit": "Triton recurrent-state update, one pass" if self._commit_kernel()
            else "torch recurrent-state update (scale, then a batched GEMM)",
        }

    def _commit_kernel(self) -> bool:
        """Whether the commit updates the recurrent states with ``gdn_tree_triton.commit_state``: with the Triton
        tree kernels, float32 states and head sizes it tiles (dk a power of two >= 16, dv a multiple of 16)."""
        _, _, dk, dv = self.recurrent.shape
        return self.triton and self.recurrent.dtype == torch.float32 and dk == gdn_tree_triton.tile(dk) and dv % 16 == 0

    def set_taps(self, layers: Sequence[int]) -> None:
        if tuple(layers) != self._taps:
            self._graphs.clear()  # a graph replays the taps it was recorded with
        super().set_taps(layers)

    # -- prefill: the model's own forward, then into the slabs ---------------------------------
    def prefill(self, input_ids: Tensor, taps_sink: Callable[[Tensor], None] | None = None) -> TargetOutput:
        ids = input_ids.reshape(1, -1)
        if ids.shape[1] > self.max_length:
            raise ValueError(
                f"the prompt has {ids.shape[1]} tokens, more than the static cache's {self.max_length} rows: "
                "raise max_length"
            )
        out = super().prefill(ids, taps_sink)  # a DynamicCache, exactly as HybridTarget fills it
        length = ids.shape[1]
        for slot, layer in enumerate(self.attention_layers):
            self.keys[slot, :, :length] = self.cache.layers[layer].keys[0]
            self.values[slot, :, :length] = self.cache.layers[layer].values[0]
        for slot, layer in enumerate(self.gdn_layers):
            state = read_gdn_state(self.cache, layer, self.kernel_size)
            self.conv[slot].copy_(state.conv_window)
            self.recurrent[slot].copy_(state.recurrent_state)
        self.cache, self.kv.length = self.kv, length  # the dynamic cache is dropped
        return out

    # -- verify -------------------------------------------------------------------------------
    def forward_tree(self, inputs: VerifyInputs) -> TargetOutput:
        """Logits ``[n, vocab]`` (and taps) for every node; no committed state is changed."""
        if self.cache is not self.kv:
            raise RuntimeError("forward_tree before prefill: there is no committed prefix to verify against")
        if self._pending is not None:
            raise RuntimeError("forward_tree called twice without commit: the first tree is still pending")
        n, past = inputs.input_ids.shape[1], inputs.past_length
        if past != self.past_length:
            raise ValueError(f"the tree was laid out after {past} tokens, the cache holds {self.past_length}")
        if past + n > self.max_length:
            raise ValueError(f"verify of {n} tokens after {past} exceeds the static cache of {self.max_length} rows")
        device = self.keys.device
        rows = torch.arange(past, past + n, device=device)
        if self._uses_flex(past + n):  # P and the visibility in place; the layout's tables follow in the forward
            mask = self._layout(n)
            mask.past.fill_(past)
            mask.visible.copy_(self._visibility(inputs), non_blocking=True)
        else:
            mask = self.masks.verify(n, inputs.attention_mask, past)
        rec = None
        if not self.cuda_graphs:
            out, stash = self._verify(inputs.input_ids.to(device), inputs.position_ids.to(device), rows,
                                      inputs.parents.to(device), mask, self._visibility(inputs).to(device))
        else:
            key = (n, 0 if isinstance(mask, FlexLayout) else mask.shape[-1])  # one flex graph per n
            if key not in self._graphs:
                self._graphs[key] = self._record_graph(n, mask)
            rec = self._graphs[key]
            if rec.mask is not mask:
                raise RuntimeError(f"the verify graph for {key} reads another mask buffer than the one written")
            rec.ids.copy_(inputs.input_ids, non_blocking=True)
            rec.positions.copy_(inputs.position_ids, non_blocking=True)
            rec.rows.copy_(rows)
            rec.parents.copy_(inputs.parents, non_blocking=True)
            if not isinstance(mask, FlexLayout):  # a layout's visibility was written above
                rec.visible.copy_(self._visibility(inputs), non_blocking=True)
            rec.graph.replay()
            out, stash = TargetOutput(tokens=inputs.input_ids[0], logits=rec.logits, taps=rec.taps), rec.stash
        self._pending, self._pending_parents = stash, inputs.parents.tolist()
        self._pending_graph = rec
        return out

    def _verify(self, ids: Tensor, positions: Tensor, rows: Tensor, parents: Tensor,
                mask: Tensor | FlexLayout, visible: Tensor) -> tuple[TargetOutput, GDNStash]:
        """The verify forward itself (eager, or the body of a captured graph): a dense folded mask,
        or a FlexAttention layout whose block tables are rebuilt here from its P. ``visible`` [n, n] is the
        layout's tree block, the tree's ancestor matrix: the GDN layers read it as such rather than
        rebuild it from ``parents`` (pointer doubling, about 25 small kernels at 65 nodes)."""
        n = ids.shape[1]
        if isinstance(mask, FlexLayout):
            mask.refresh()
            mask = mask.block_mask
        stash = GDNStash.empty(len(self.gdn_layers), n, self.gdn_modules[self.gdn_layers[0]], self.dtype,
                               self.compute_dtype, self.keys.device)
        self.kv.at(rows)
        if self.fuse and not self._probed:
            self._probe_compiler()
        tables = TreeTables(parents, visible, conv_taps(parents, self.kernel_size))
        fused_kernels = fused.fused_ops(self.model) if self.fuse else contextlib.nullcontext()
        with self._static_gdn_mode(tables, stash), fused_kernels:
            out = self._forward(ids, positions, {ATTENTION: mask, GDN: None}, logits_to_keep=0)
        return out, stash

    def _probe_compiler(self) -> None:
        """Compile the fused functions once on tiny tensors, outside any forward; without a working
        compiler the plain functions run instead (the same math, more kernels)."""
        self._probed = True

        def tiny_mix(mix, dtype: torch.dtype, device: torch.device) -> None:
            n, h, d, k = 2, 2, 16, self.kernel_size
            t = lambda *shape, dtype=dtype: torch.ones(*shape, dtype=dtype, device=device)  # noqa: E731
            mix(t(n, 3 * h * d), t(n, h), t(n, h), t(h), t(h), t(3 * h * d, k), t(3 * h * d, k), None,
                t(h, d, d, dtype=self.compute_dtype), torch.zeros(n, k, dtype=torch.long, device=device),
                torch.eye(n, dtype=torch.bool, device=device), h * d, h * d, d)

        def check(dtype: torch.dtype, device: torch.device) -> None:
            fused.probe(dtype, device)
            tiny_mix(fused.compiled(tree_mix), dtype, device)

        self.fuse = self._compiles(check, "runs the plain functions (the same tokens, slower); pass fuse=False "
                                          "to silence this.")
        if self.triton and self.fuse:
            try:
                tiny_mix(tree_mix_triton, self.dtype, self.input_device)
            except Exception as err:  # a Triton build or launch failure of any kind: keep the compiled torch math
                log.warning("the Triton tree delta rule does not run here (%s: %s); the compiled torch math runs instead",
                            type(err).__name__, (str(err).splitlines() or [""])[0])
                self.triton = False
        self.triton = self.triton and self.fuse

    def _static_gdn_mode(self, tables: TreeTables, stash: GDNStash):
        """Within the block each GDN module runs the no-commit tree forward over its slab state."""
        slot = {layer: g for g, layer in enumerate(self.gdn_layers)}
        mix = tree_mix_triton if self.triton else fused.compiled(tree_mix) if self.fuse else tree_mix
        return patched_forwards(self.gdn_modules,
                                lambda layer, _: self._gdn_forward(slot[layer], layer, tables, stash, mix))

    def _gdn_forward(self, slot: int, layer: int, tables: TreeTables, stash: GDNStash, mix):
        module = self.gdn_modules[layer]

        # The Triton kernels and the compiled prologue write x, the updates, the keys and the log decay
        # into this layer's stash rows themselves.
        into = functools.partial(mix, conv_copy=stash.conv_inputs[slot], updates_out=stash.updates[slot],
                                 keys_out=stash.keys[slot], log_decay_out=stash.log_decay[slot]) \
            if mix is tree_mix_triton else None

        def forward(hidden_states: Tensor, *args, **kwargs) -> Tensor:  # [1, n, D] -> [1, n, D]
            state = GDNState(conv_window=self.conv[slot], recurrent_state=self.recurrent[slot])
            out, verify = gdn_tree_forward(module, hidden_states, tables.parents, state, tables, into or mix)
            if into is None:
                stash.conv_inputs[slot].copy_(verify.conv_inputs)
                stash.updates[slot].copy_(verify.delta.updates)
                stash.keys[slot].copy_(verify.delta.keys)
                stash.log_decay[slot].copy_(verify.delta.log_decay)
            return out

        return forward

    def _record_graph(self, n: int, mask: Tensor) -> _VerifyGraph:
        """Record one verify of n tokens. Warm-up and capture write K/V rows past the committed
        length only and never the GDN slabs, so recording never disturbs the sequence."""
        device = self.keys.device
        ids = torch.zeros(1, n, dtype=torch.long, device=device)
        positions = torch.full((1, n), self.past_length, dtype=torch.long, device=device)
        rows = torch.arange(self.past_length, self.past_length + n, device=device)
        parents = torch.arange(-1, n - 1, device=device)  # a chain: any valid tree will do
        # Its ancestors, or the layout's own visibility buffer (written before every replay).
        visible = mask.visible if isinstance(mask, FlexLayout) else torch.ones(n, n, dtype=torch.bool, device=device).tril()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._verify(ids, positions, rows, parents, mask, visible)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out, stash = self._verify(ids, positions, rows, parents, mask, visible)
        return _VerifyGraph(graph, ids, positions, rows, parents, visible, mask, out.logits, out.taps, stash,
                            torch.zeros(n, dtype=torch.long, device=device), torch.zeros((), dtype=torch.long, device=device), {})

    # -- commit -------------------------------------------------------------------------------
    def commit(self, path: Sequence[int]) -> None:
        """Keep the accepted root path: every GDN slab from the stash at once, K/V rows by index.

        With CUDA graphs the commit of a accepted nodes is itself a graph, one per (verify graph, a):
        the first such commit runs eagerly and is then recorded (recording runs nothing), later ones
        copy the path and P into its buffers and replay it.
        """
        if self._pending is None:
            raise RuntimeError("commit without a pending forward_tree: nothing to commit")
        path = [int(node) for node in path]
        self._check_path(path)
        stash, past, a = self._pending, self.past_length, len(path)
        rec = self._pending_graph
        if rec is None:
            self._commit(stash, torch.tensor(path, dtype=torch.long, device=self.keys.device),
                         past if path != list(range(a)) else None)
        else:
            rec.path[:a].copy_(torch.tensor(path, dtype=torch.long), non_blocking=True)
            rec.past.fill_(past)
            graph = rec.commits.get(a)
            if graph is None:
                self._commit(stash, rec.path[:a], rec.past)
                graph = rec.commits[a] = torch.cuda.CUDAGraph()
                if self._commit_pool is None:
                    self._commit_pool = torch.cuda.graph_pool_handle()
                with torch.cuda.graph(graph, pool=self._commit_pool):  # one pool: a commit's temporaries die with it
                    self._commit(stash, rec.path[:a], rec.past)
            else:
                graph.replay()
        self._pending = self._pending_graph = None
        self.past_length = self.kv.length = past + a

    def _commit(self, stash: GDNStash, idx: Tensor, past: Tensor | int | None) -> None:
        """The commit's device work for the accepted nodes ``idx`` ``[a]``; the K/V rows move from
        ``past + idx`` to ``past + 0..a-1`` (``past`` None: a pure prefix, already in place)."""
        a = idx.shape[0]
        # Recurrent state, in place: S_a = e^{gamma_a} S0 + sum_j e^{gamma_a - gamma_j} k_j u_j^T (commit_delta_state).
        if self._commit_kernel():  # one Triton launch, one pass over the slab
            gdn_tree_triton.commit_state(self.recurrent, stash.log_decay, stash.keys, stash.updates, idx)
        else:  # the sum one batched rank-a GEMM accumulated into the slab: no [G, H, dk, dv] temporary
            g, h, dk, dv = self.recurrent.shape
            gamma = stash.log_decay.index_select(1, idx)  # [G, a, H]
            keys = stash.keys.index_select(1, idx)  # [G, a, Hk, dk]
            hk = keys.shape[2]
            weighted = (gamma[:, -1:] - gamma).exp().view(g, a, hk, h // hk, 1) * keys[:, :, :, None]  # [G, a, Hk, r, dk]
            weighted = weighted.reshape(g, a, h, dk).permute(0, 2, 3, 1).reshape(g * h, dk, a)
            updates = stash.updates.index_select(1, idx).permute(0, 2, 1, 3).reshape(g * h, a, dv)
            state = self.recurrent.view(g * h, dk, dv)
            state.mul_(gamma[:, -1].exp().reshape(g * h, 1, 1)).baddbmm_(weighted, updates)
        # Conv windows: the last K columns of window + path inputs.
        fed = stash.conv_inputs.index_select(1, idx).transpose(1, 2)  # [G, C, a]
        self.conv.copy_(torch.cat([self.conv, fed], dim=2)[:, :, -self.kernel_size:])
        if past is not None:
            src = past + idx
            dst = past + torch.arange(a, device=idx.device)
            self.keys.index_copy_(2, dst, self.keys.index_select(2, src))
            self.values.index_copy_(2, dst, self.values.index_select(2, src))
