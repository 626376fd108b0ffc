"""MTP's chained draft steps over a static cache, replayable from one CUDA graph.

Every round drafts from buffers of one fixed shape. Step 1 reads ``rows = steps + 1`` pairs (the
previous round's accepted pairs and the root's: at most ``steps + 1``), padded to that many; the
``steps - 1`` chained steps read one token each, their own top-1 and the previous step's output.
What a round changes (the pairs, how many of them are real, the committed length) is written
into those buffers before the run, so the graph recorded in the first round serves every later
one and is never recorded again.

Attention reads the whole static cache with a mask that hides every row past the query's own
position; the mask is folded (``groups`` copies of its rows), so the query heads that share a
K/V head attend as one and the cache is never expanded to the query heads. Padding rows and chained steps write K/V past the committed length: the mask hides
them, and the next round writes its own rows there before any query can see them.

Such a dense mask is as wide as the cache whatever the context: with ``attention="flex"`` or
``"split"`` (``"auto"``: split, graphed, over a cache of more than ``flex_threshold`` rows, as the
DFlash drafter decides) each forward reads only the live rows instead, through a ``FlexLayout`` per
forward of the chain (block-sparse FlexAttention; with split, the prefix/block split of
``ddtree.models.split_attention`` where it runs), whose P the graph rewrites from the committed
length on the device.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from ddtree.models import flex_attention, fused
from ddtree.models.flex_attention import ATTENTIONS, FlexLayout
from ddtree.models.mtp import MTPHead, causal_mask
from ddtree.models.static_kv import StaticKV


class StaticChain:
    """The k-step draft of an MTP head from static buffers; on CUDA with ``graphs``, from one graph.

    ``draft`` and ``absorb`` take the pairs (target hidden ``[c, H]``, next token) to append after
    ``length`` committed pairs; the caller keeps the count. Without ``graphs`` the same code runs
    op by op (on the CPU too), which is what makes the graph's logic testable there.

    ``attention``: "dense" (the folded mask over the whole cache), "flex" (a ``FlexLayout`` per
    forward: only the live rows are read), "split" (those layouts, the prefix read by split attention
    where it runs) or "auto" (split when graphed over more than ``flex_threshold`` rows and
    FlexAttention compiles here, else dense). ``chain.attention`` says which runs: an op-by-op chain
    given it runs the graphed chain's attention (``experiments/round_profile.py`` profiles so).

    >>> chain = StaticChain(head, target, steps=3, max_length=4096, graphs=True)   # doctest: +SKIP
    >>> chain.draft(hidden, [root], length=41)   # [3, vocab] float32 log-probs     # doctest: +SKIP
    """

    absorb_chunk = 1024  # pairs a prompt is absorbed in at a time (each chunk's mask: [c, rows before + c])

    def __init__(self, head: MTPHead, target, steps: int, max_length: int, graphs: bool, attention: str = "dense",
                 flex_threshold: int = 4096) -> None:
        if steps < 1:
            raise ValueError(f"a chain drafts at least one step, got steps={steps}")
        if attention not in (*ATTENTIONS, "split"):
            raise ValueError(f"attention={attention!r}: choose one of {(*ATTENTIONS, 'split')}")
        param = next(head.parameters())
        if graphs and param.device.type != "cuda":
            raise ValueError(f"CUDA graphs need the MTP head on a CUDA device; it is on {param.device}")
        self.head, self.target, self.steps, self.graphs = head, target, steps, graphs
        self.device, self.dtype = param.device, param.dtype
        self.rows, self.max_length = steps + 1, max_length
        attn = head.layers[0].self_attn  # the head's one attention layer
        self.kv = StaticKV(1, int(head.layer_config.num_key_value_heads), max_length, int(attn.head_dim),
                           self.dtype, self.device)
        head.use_folded_sdpa()
        self.hidden = torch.zeros(self.rows, head.hidden_size, device=self.device, dtype=self.dtype)  # [R, H]
        self.tokens = torch.zeros(self.rows, dtype=torch.long, device=self.device)  # [R]
        self.count = torch.ones(1, dtype=torch.long, device=self.device)  # [1] real pairs among the R
        self.length = torch.zeros(1, dtype=torch.long, device=self.device)  # [1] committed pairs before them
        self._offsets = torch.arange(self.rows, device=self.device)  # [R]
        self._cols = torch.arange(max_length, device=self.device)  # [max_length]
        self._graph: tuple[torch.cuda.CUDAGraph, Tensor] | None = None
        if attention == "auto":  # the prefix through a flash kernel where it runs (split_attention)
            attention = "split" if graphs and max_length > flex_threshold and fused.compiles(
                flex_attention.probe, self.dtype, self.device, "the MTP drafter keeps its dense mask") else "dense"
        self._split = split = attention == "split"
        # One layout per forward of the chain: step 1's rows see the prefix and the block causally,
        # each chained step (one query at its own row) the prefix up to that row.
        self.layouts: list[FlexLayout] | None = None
        if attention in ("flex", "split"):
            self.layouts = [FlexLayout(self.rows, max_length, self.device, split=split)]
            self.layouts += [FlexLayout(1, max_length, self.device, split=split) for _ in range(steps - 1)]
            self.layouts[0].visible.copy_(torch.ones(self.rows, self.rows, dtype=torch.bool).tril())
            for layout in self.layouts[1:]:
                layout.visible.fill_(True)

    @property
    def attention(self) -> str:
        """"flex" where forwards read the live rows through ``FlexLayout``s, "split" where those layouts
        read the prefix by split attention where it runs, else "dense"."""
        return "dense" if self.layouts is None else ("split" if self._split else "flex")

    def _embed(self, tokens: Tensor) -> Tensor:  # [n] -> [n, H]
        return self.target.embed(tokens).to(self.device, self.dtype)

    def _log_probs(self, hidden: Tensor) -> Tensor:  # [1, H] -> [1, vocab] float32
        return torch.log_softmax(self.target.lm_head(hidden).float(), dim=-1)

    def absorb(self, hidden: Tensor, tokens: Sequence[int], length: int) -> None:
        """Write the K/V of pairs ``hidden`` ``[n, H]`` (any n, e.g. a prompt's) at rows
        ``length..length+n-1``, op by op, attending over exactly the rows before them. In chunks of
        ``absorb_chunk`` pairs, each under a causal mask of its own rows by the rows before them: a
        prompt's mask is never ``[n, n]`` (34 GB in bf16 for 131K tokens)."""
        n = len(tokens)
        self._check_room(length + n)
        ids = torch.tensor(tokens, device=self.device)
        for start in range(0, n, self.absorb_chunk):
            stop, lo = min(start + self.absorb_chunk, n), length + start
            count = stop - start
            positions = torch.arange(lo, lo + count, device=self.device)  # [c]
            mask = causal_mask(count, lo, self.dtype, self.device)  # [1, 1, c, lo + c]
            self.head(self._embed(ids[start:stop])[None], hidden[start:stop][None], positions[None],
                      self.kv.at(positions, lo + count), attention_mask=mask)

    def draft(self, hidden: Tensor, tokens: Sequence[int], length: int) -> Tensor:
        """Log-probs ``[steps, vocab]`` (float32) of the chain after ``length`` committed pairs and
        these ``c <= rows`` pairs ``hidden`` ``[c, H]``; their K/V stay at ``length..length+c-1``."""
        c = len(tokens)
        if not 1 <= c <= self.rows:
            raise ValueError(f"a chain step takes 1 to {self.rows} pairs, got {c}")
        self._check_room(length + self.rows + self.steps)
        # Everything the run reads that this round changed, written in place into its buffers.
        self.hidden[:c].copy_(hidden)
        self.tokens[:c].copy_(torch.tensor(tokens))
        self.count.fill_(c)
        self.length.fill_(length)
        if not self.graphs:
            return self._run()
        if self._graph is None:
            self._graph = self._record()
        graph, out = self._graph
        graph.replay()
        return out.clone()  # the graph's buffer is rewritten next round

    def _check_room(self, end: int) -> None:
        if end > self.max_length:
            raise ValueError(f"MTP drafter cache of {self.max_length} rows is full; pass a larger max_length")

    def _run(self) -> Tensor:
        """The whole draft from the buffers: fixed shapes, no host sync. ``[steps, vocab]``."""
        positions = self.length + self._offsets  # [R] padding rows run on past the real ones
        out = self._forward(self._embed(self.tokens), self.hidden, positions, 0)  # [R, H]
        hidden = out.index_select(0, self.count - 1)  # [1, H] step 1: the output after the last real pair
        position = self.length + self.count - 1  # [1]
        rows = [self._log_probs(hidden)]
        for step in range(1, self.steps):
            token = rows[-1].argmax(dim=-1)  # [1] the head's own top-1, fed to the next step
            position = position + 1
            hidden = self._forward(self._embed(token), hidden, position, step)  # [1, H]
            rows.append(self._log_probs(hidden))
        return torch.cat(rows)

    def _forward(self, embeds: Tensor, hidden: Tensor, positions: Tensor, step: int) -> Tensor:
        """The head over n pairs ``[n, H]`` at ``positions`` ``[n]`` (consecutive rows), forward ``step``
        of the chain, over the whole cache. ``[n, H]``"""
        kv = self.kv.at(positions, self.max_length)
        if self.layouts is not None:  # P = the first query's row, rewritten on the device
            layout = self.layouts[step]
            layout.move(positions[0])
            return self.head(embeds[None], hidden[None], positions[None], kv, attention_mask=layout.block_mask)[0]
        hidden_cols = self._cols[None] > positions[:, None]  # [n, max_length] rows past each query's position
        mask = torch.zeros(hidden_cols.shape, device=self.device, dtype=self.dtype)
        mask = mask.masked_fill(hidden_cols, torch.finfo(self.dtype).min).repeat(self.head.groups, 1)
        mask = mask[None, None]  # [1, 1, groups * n, max_length] folded
        return self.head(embeds[None], hidden[None], positions[None], kv, attention_mask=mask)[0]

    def _record(self) -> tuple[torch.cuda.CUDAGraph, Tensor]:
        """Record ``_run`` once. The warm-up runs read this round's buffers and write the same K/V
        the replay will, so recording never disturbs the sequence."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._run()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = self._run()
        return graph, out
