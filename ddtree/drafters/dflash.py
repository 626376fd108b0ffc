"""DFlash as a drafter: one block-diffusion pass drafts depths 1..block_size-1.

The drafter's cache holds context K/V for committed tokens only: the features of the accepted
nodes arrive in ``accept`` and are absorbed at the next ``draft``; the block's own K/V are never
kept (the reference crops them after every call, which is the same thing). The cache is
preallocated (``max_length`` rows per layer) and written in place. On CUDA the block pass can be
replayed from one captured graph: it then attends over the whole buffer with a mask that hides
rows at or past the committed length, so its shapes never change. At long context that mask
reads the whole buffer: with ``attention="flex"`` (``"auto"``: on CUDA with graphs, for a cache of
more than ``flex_threshold`` rows) the block's K/V are written into the cache after the committed
rows and block-sparse FlexAttention reads only the live blocks (``ddtree.models.flex_attention``).
"""

from __future__ import annotations

import contextlib
from typing import Callable

import torch
from torch import Tensor

from ddtree.interfaces import Target
from ddtree.models import flex_attention, fused
from ddtree.models.dflash import DFlashDraftModel
from ddtree.models.flex_attention import FlexLayout
from ddtree.types import Draft, TargetOutput, Verification


def check_pair(model: DFlashDraftModel, target: Target) -> None:
    """Clear errors for a drafter made for another target."""
    cfg, tcfg = model.config, target.config
    problems = []
    if cfg.num_target_layers != len(target.layers):
        problems.append(f"drafter expects a {cfg.num_target_layers}-layer target, this one has {len(target.layers)}")
    if cfg.hidden_size != tcfg.hidden_size:
        problems.append(f"drafter hidden size {cfg.hidden_size} != target hidden size {tcfg.hidden_size}")
    if not 0 <= cfg.mask_token_id < target.vocab_size:
        problems.append(
            f"mask token id {cfg.mask_token_id} is not in the target's vocabulary of {target.vocab_size} "
            "(add the mask token to the tokenizer and embeddings, or fix dflash_config.mask_token_id)"
        )
    if problems:
        raise ValueError("DFlash drafter does not match the target: " + "; ".join(problems))


def block_size_for(model: DFlashDraftModel, block_size: int | None) -> int:
    """The block a drafter runs: the checkpoint's own (``None``), or a shorter one it was asked for.

    A block is the root plus the drafted depths, so it needs 2 or more positions; the checkpoint
    was trained on blocks of ``model.config.block_size`` and has never seen a longer one.

    >>> drafter_model = tiny_dflash(model, block_size=8)                        # doctest: +SKIP
    >>> block_size_for(drafter_model, None), block_size_for(drafter_model, 4)   # doctest: +SKIP
    (8, 4)
    """
    trained = int(model.config.block_size)
    if block_size is None:
        return trained
    if not isinstance(block_size, int) or isinstance(block_size, bool) or not 2 <= block_size <= trained:
        raise ValueError(
            f"block_size={block_size!r} does not fit this DFlash drafter: its checkpoint drafts blocks of "
            f"{trained} (the root and {trained - 1} tokens). Pass 2 <= block_size <= {trained} for a shorter "
            "block, or leave it unset (block_size=null in the configs) for the checkpoint's own."
        )
    return block_size


class DFlashDrafter:
    """Drafts ``block_size - 1`` per-depth marginals from one forward of the block.

    ``block_size=None`` runs the checkpoint's own block (``model.config.block_size``); a value
    from 2 up to it runs a shorter one (fewer drafted depths). ``attention``: ``"dense"``,
    ``"flex"``, ``"split"`` (flex with the context through split attention where it runs) or ``"auto"``
    (split when graphed on CUDA over more than ``flex_threshold`` rows, else dense); ``drafter.attention``
    says which one the drafts run.
    ``fuse``: the drafter's norms, MLP activations and rotary run as compiled kernels (``ddtree.models.fused``),
    as the fast target's do, in its graph and in eager drafts; None (the default): on with CUDA graphs.
    On one H100 (Qwen3-8B geometry, prompt 512, ``experiments/speed.py``) it took the graphed draft
    from 2.75 to 2.00 ms and a DDTree-64 round from 13.07 to 12.04. ``fuse_projections`` (None: as
    ``fuse``) stores each layer's q, k and v, and its MLP's gate and up, in one tensor a group
    (``fused.fuse_projections``: the model's parameters become views of it); under ``fuse`` the block's
    q, k and v are then one GEMM, the context's k and v one more, and the MLP's gate and up one.

    >>> drafter = DFlashDrafter(DFlashDraftModel.from_pretrained(path), target)   # doctest: +SKIP
    """

    absorb_chunk = 4096  # context rows projected into the drafter cache at a time (a prompt's, in chunks)

    def __init__(self, model: DFlashDraftModel, target: Target, block_size: int | None = None,
                 max_length: int | None = None, cuda_graphs: bool | str = False, attention: str = "auto",
                 flex_threshold: int = 4096, fuse: bool | None = None, fuse_projections: bool | None = None) -> None:
        check_pair(model, target)
        self.model, self.target = model.eval(), target
        self.block_size = block_size_for(model, block_size)
        self.hidden_layers = tuple(model.config.target_layer_ids)
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.max_length = int(max_length or min(target.max_length, 16384))
        if cuda_graphs not in (True, False, "auto"):
            raise ValueError(f"cuda_graphs must be true, false or auto, got {cuda_graphs!r}")
        self.cuda_graphs = bool(cuda_graphs) and self.device.type == "cuda"  # "auto": on CUDA
        self.fuse = self.cuda_graphs if fuse is None else bool(fuse)
        self._fuse_probed = False
        fuse_projections = self.fuse if fuse_projections is None else bool(fuse_projections)
        self.fused_projections = fused.fuse_projections(model) if fuse_projections else 0
        cfg = model.config
        shape = (1, cfg.num_key_value_heads, self.max_length, cfg.head_dim)
        self._keys = [torch.zeros(shape, device=self.device, dtype=self.dtype) for _ in model.layers]
        self._values = [torch.zeros(shape, device=self.device, dtype=self.dtype) for _ in model.layers]
        self._pending: Tensor | None = None
        self._streamed = False  # the prompt's taps came through ``prompt_sink``
        self.length = 0  # committed tokens whose features are in the cache
        self._graph: tuple | None = None
        if attention not in ("auto", "dense", "flex", "split"):
            raise ValueError(f"attention={attention!r}: choose one of auto, dense, flex, split")
        if attention == "auto":  # the context through a flash kernel where it runs (split_attention)
            attention = "split" if self.cuda_graphs and self.max_length > flex_threshold else "dense"
        # The block over the buffers; None where FlexAttention does not compile (then dense).
        self._layout = self._flex_layout(attention == "split") if attention != "dense" else None
        self.attention = attention if self._layout is not None else "dense"  # what the drafts run

    def _flex_layout(self, split: bool = False) -> FlexLayout | None:
        """The block's layout (every block row sees the committed rows and the whole block), compiled
        once on CUDA; None, with a warning, where FlexAttention does not compile. With ``split`` the
        context goes through a flash kernel and the block through tensor math, merged by their
        log-sum-exps, where those run (``ddtree.models.split_attention``)."""
        if self.device.type == "cuda" and not fused.compiles(flex_attention.probe, self.dtype, self.device,
                                                             "the DFlash drafter keeps its dense mask"):
            return None
        layout = FlexLayout(self.block_size, self.max_length, self.device, split=split)
        layout.visible.fill_(True)
        return layout

    @classmethod
    def from_pretrained(cls, name_or_path, target: Target, **kwargs) -> "DFlashDrafter":
        """A DFlash checkpoint (hub name or directory, z-lab format) loaded in the target's dtype,
        on the device of its output; ``kwargs`` as for the constructor.

        >>> drafter = DFlashDrafter.from_pretrained("z-lab/Qwen3-8B-DFlash-b16", target)   # doctest: +SKIP
        """
        model = DFlashDraftModel.from_pretrained(name_or_path, dtype=target.dtype, device=target.output_device)
        return cls(model, target, **kwargs)

    def reset(self, prompt: TargetOutput) -> None:
        streamed, self._streamed = self._streamed, False
        if streamed and prompt.taps is None:  # the prompt came through ``prompt_sink``: absorbed already
            return
        self.length, self._pending = 0, prompt.taps
        self._absorb()  # the draft prefill over the prompt

    def prompt_sink(self) -> Callable[[Tensor], None]:
        """Start a sequence whose prompt taps arrive in chunks while the target prefills
        (``Target.prefill(ids, taps_sink=...)``): each chunk's K/V go into the cache at once, so the
        prompt's ``[T, n_taps * hidden]`` taps (5.4 GB for a 131K-token prompt of Qwen3-8B) never
        exist whole. ``reset`` then takes the prefill's output, which has no taps.

        >>> prompt = target.prefill(ids, taps_sink=drafter.prompt_sink()); drafter.reset(prompt)  # doctest: +SKIP
        """
        self.length, self._pending, self._streamed = 0, None, True

        def absorb(taps: Tensor) -> None:  # [c, n_taps * hidden], the rows after those absorbed so far
            self._pending = taps
            self._absorb()

        return absorb

    def _absorb(self) -> None:
        """Write the pending features' K/V after the committed rows (positions continue on)."""
        if self._pending is None or self._pending.shape[0] == 0:
            return
        pending = self._pending  # [C, n_feat * H]
        end = self.length + pending.shape[0]
        if end + self.block_size > self.max_length:
            raise ValueError(f"drafter cache of {self.max_length} rows is full; pass a larger max_length")
        # In chunks of ``absorb_chunk`` rows: a long prompt's projections never exist all at once.
        for start in range(0, pending.shape[0], self.absorb_chunk):
            taps = pending[start : start + self.absorb_chunk].to(self.device, self.dtype)
            lo = self.length + start
            hi = lo + taps.shape[0]
            positions = torch.arange(lo, hi, device=self.device)
            for buf_k, buf_v, (k, v) in zip(self._keys, self._values, self.model.context_kv(taps, positions)):
                buf_k[:, :, lo:hi] = k
                buf_v[:, :, lo:hi] = v
        self.length, self._pending = end, None

    def _block_log_probs(self, ids: Tensor, length: Tensor | int) -> Tensor:
        """Log-probs ``[size - 1, vocab]`` of the block ``ids`` ``[size]`` after ``length`` rows."""
        size = self.block_size
        block = self.target.embed(ids[None]).to(self.device, self.dtype)  # [1, size, H]
        positions = length + torch.arange(size, device=self.device)
        if self._layout is not None:  # the block written after the committed rows, live blocks read
            self._layout.move(length)
            context, mask = list(zip(self._keys, self._values)), self._layout
        elif isinstance(length, int):  # eager: attend over the committed rows only
            context = [(k[:, :, :length], v[:, :, :length]) for k, v in zip(self._keys, self._values)]
            mask = None
        else:  # graph: the whole buffer, rows at or past ``length`` hidden
            context = list(zip(self._keys, self._values))
            cols = torch.arange(self.max_length + size, device=self.device)
            visible = (cols < length) | (cols >= self.max_length)
            mask = torch.zeros(cols.shape, device=self.device, dtype=self.dtype)
            mask = mask.masked_fill(~visible, torch.finfo(self.dtype).min)[None, None, None]
        hidden = self.model(block, positions, context, mask)[0, 1:]  # [size - 1, H]
        return torch.log_softmax(self.target.lm_head(hidden).float(), dim=-1)

    def _graph_step(self, taps: Tensor, count: Tensor, length: Tensor, ids: Tensor) -> Tensor:
        """Absorb ``count`` pending rows (``taps`` padded to the block size), then draft."""
        positions = length + torch.arange(taps.shape[0], device=self.device)
        for buf_k, buf_v, (k, v) in zip(self._keys, self._values, self.model.context_kv(taps, positions)):
            buf_k.index_copy_(2, positions, k)  # padding rows land past the new length: masked, then overwritten
            buf_v.index_copy_(2, positions, v)
        return self._block_log_probs(ids, length + count)

    def _record_graph(self) -> tuple:
        cfg = self.model.config
        taps = torch.zeros(self.block_size, len(cfg.target_layer_ids) * cfg.hidden_size, device=self.device, dtype=self.dtype)
        count, length = (torch.zeros((), dtype=torch.long, device=self.device) for _ in range(2))
        length.fill_(self.length)  # warm-up writes land past the committed rows
        ids = torch.full((self.block_size,), cfg.mask_token_id, dtype=torch.long, device=self.device)
        with self._fused():
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):  # also compiles the fused kernels for these shapes, outside the capture
                    self._graph_step(taps, count, length, ids)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = self._graph_step(taps, count, length, ids)
        return graph, taps, count, length, ids, out

    def _fused(self) -> contextlib.AbstractContextManager:
        """The fused kernels' context (``fuse``) for a graph's recording or an eager draft, or none.
        They are compiled once on tiny tensors first; where that fails the stock ops run, with a warning."""
        if self.fuse and not self._fuse_probed:
            self._fuse_probed = True
            self.fuse = fused.compiles(fused.probe, self.dtype, self.device,
                                       "the DFlash drafter runs the stock norms and MLPs: the same drafts, slower")
        return fused.fused_ops(self.model) if self.fuse else contextlib.nullcontext()

    def draft(self, root_token: int) -> Draft:
        if not self.cuda_graphs:
            ids = torch.full((self.block_size,), self.model.config.mask_token_id, dtype=torch.long)
            ids[0] = root_token
            with self._fused():
                self._absorb()
                return Draft(self._block_log_probs(ids.to(self.device), self.length))
        pending = self._pending
        if pending is not None and pending.shape[0] > self.block_size:
            self._absorb()  # more rows than one graph step takes (a prompt): eager
            pending = None
        if self.length + 2 * self.block_size > self.max_length:
            raise ValueError(f"drafter cache of {self.max_length} rows is full; pass a larger max_length")
        if self._graph is None:
            self._graph = self._record_graph()
        graph, taps, count, length, ids, out = self._graph
        rows = 0 if pending is None else pending.shape[0]
        if rows:
            taps[:rows].copy_(pending, non_blocking=True)
        count.fill_(rows)
        length.fill_(self.length)
        ids[0].fill_(root_token)
        graph.replay()
        self.length, self._pending = self.length + rows, None
        return Draft(out.clone())  # the graph's buffer is rewritten next round

    def accept(self, verification: Verification, context: TargetOutput) -> None:
        self._pending = context.taps[list(verification.path)]  # [a, n_feat * H], path order
