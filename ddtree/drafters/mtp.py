"""MTP as a drafter: k chained steps of one MTP head over the target's post-norm hidden states.

Alignment. The head's cache row at position t holds the pair (h_t, x_{t+1}): the target's hidden
at t and the token after it, and its output predicts x_{t+2}. After a round the committed tokens
are x_0..x_{N-1} and the bonus b = x_N is not yet fed, so the cache can hold the pairs for
t = 0..N-2 only: the pair (h_{N-1}, b) is the first draft step, which drafts x_{N+1}, the token
at depth 1 below the root b. Step j > 1 feeds the head's own output h' and its own top-1 token.

Cache. Only pairs of two committed tokens with the target's true hidden are kept. Step 1 is such
a pair (the root is always committed); chained steps use h', so they are cropped after every
draft. The prompt's pairs are fed at ``reset`` (the head's prefill, not decode time); the accepted
path's pairs (from the verify's hidden taps) are queued in ``accept`` and fed in one forward,
together with step 1, at the next ``draft``.

Fast path. With ``cuda_graphs`` the cache is static (``max_length`` rows) and each round's k
steps run from fixed-shape buffers, replayed from one CUDA graph on a GPU
(``ddtree.drafters.mtp_static``); the queue above is the same in both modes.
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformers import DynamicCache

from ddtree.drafters.mtp_static import StaticChain
from ddtree.models.dispatch import graphable
from ddtree.models.mtp import MTPHead
from ddtree.types import FINAL_NORM, Draft, TargetOutput, Verification


def check_pair(head: MTPHead, target) -> None:
    """Clear errors for a head made for another target."""
    problems = []
    target_hidden = int(target.config.hidden_size)
    if head.hidden_size != target_hidden:
        problems.append(f"head hidden size {head.hidden_size} != target hidden size {target_hidden}")
    if head.vocab_size != target.vocab_size:
        problems.append(f"head vocabulary {head.vocab_size} != target vocabulary {target.vocab_size}")
    if problems:
        raise ValueError("MTP head does not match the target: " + "; ".join(problems))


def _truncate(cache: DynamicCache, length: int) -> None:
    """Keep the first ``length`` rows (``DynamicCache.crop``'s argument changed meaning across versions)."""
    for layer in cache.layers:
        if layer.keys is not None and layer.keys.shape[-2] > length:
            layer.keys, layer.values = layer.keys[..., :length, :], layer.values[..., :length, :]


class MTPDrafter:
    """Drafts ``steps`` depths by chaining one MTP head; ``top_k`` keeps each depth's k best tokens.

    Rows are float32 log-probs of the target's LM head over the head's output, so the chain
    builder takes the top-1 path and ``BestFirstTreeBuilder`` branches along it (MTP-tree).
    With ``top_k`` the other entries are -inf, which caps a tree's width per depth.

    ``cuda_graphs``: False drafts eagerly over a growing cache. True drafts from a static cache
    of ``max_length`` rows, replayed from a CUDA graph when the head is on a GPU; elsewhere the
    same static code runs op by op (as ``DFlashDrafter`` falls back). "auto" is True on a GPU
    for a head whose layer a graph can replay (no mixture of experts), False otherwise.
    ``attention`` and ``flex_threshold``: how the static chain reads its cache (``StaticChain``:
    "auto" reads only the live rows, the prefix by split attention where it runs, when graphed over
    more than ``flex_threshold`` rows; "dense", "flex" and "split" force one).

    >>> drafter = MTPDrafter(MTPHead.from_pretrained(path), target, steps=3)      # doctest: +SKIP
    >>> SpeculativeEngine(target, drafter, ChainTreeBuilder(), ...).generate(ids)  # doctest: +SKIP
    """

    hidden_layers: tuple[int, ...] = (FINAL_NORM,)

    def __init__(self, head: MTPHead, target, steps: int = 3, top_k: int | None = None,
                 max_length: int | None = None, cuda_graphs: bool | str = False, attention: str = "auto",
                 flex_threshold: int = 4096) -> None:
        if not isinstance(steps, int) or steps < 0:
            raise ValueError(f"steps must be a non-negative integer (0 drafts nothing, as AR), got {steps!r}")
        if top_k is not None and (not isinstance(top_k, int) or top_k < 1):
            raise ValueError(f"top_k must be a positive integer or None, got {top_k!r}")
        check_pair(head, target)
        self.head, self.target, self.steps, self.top_k = head.eval(), target, steps, top_k
        param = next(head.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.cache = DynamicCache()
        self.length = 0  # pairs in the cache: positions 0..length-1
        self._hidden = torch.empty(0, head.hidden_size, device=self.device, dtype=self.dtype)  # [P, H] queued
        self._tokens: list[int] = []  # [P] the token after each queued hidden
        self._last: Tensor | None = None  # [H] hidden of the last committed token, awaiting its next token
        self._chain = self._static_chain(cuda_graphs, max_length, attention, flex_threshold)

    def _static_chain(self, cuda_graphs: bool | str, max_length: int | None, attention: str = "auto",
                      flex_threshold: int = 4096) -> StaticChain | None:
        """The static cache and graph of the fast path, or None for the eager drafter."""
        if cuda_graphs not in (True, False, "auto"):
            raise ValueError(f"cuda_graphs must be true, false or auto, got {cuda_graphs!r}")
        on_gpu, problem = self.device.type == "cuda", self._graph_problem()
        if cuda_graphs == "auto":
            cuda_graphs = on_gpu and problem is None
        if not cuda_graphs or self.steps == 0:
            return None
        if on_gpu and problem is not None:
            raise ValueError(f"{problem}; pass cuda_graphs=False (or auto)")
        length = int(max_length or min(self.target.max_length, 16384))
        return StaticChain(self.head, self.target, self.steps, length, graphs=on_gpu, attention=attention,
                           flex_threshold=flex_threshold)

    def _graph_problem(self) -> str | None:
        """Why a CUDA graph cannot replay this head's draft, or None."""
        if not graphable(self.head.layer_config):
            return "this MTP head's layer routes tokens to experts, which a CUDA graph cannot replay"
        # The graph replays the head, the target's embedding and its LM head: one device for all three.
        devices = {self.device, torch.device(self.target.input_device), torch.device(self.target.output_device)}
        if len(devices) > 1:
            return f"the MTP head and the target's embedding and LM head sit on {sorted(map(str, devices))}, not one device"
        return None

    @property
    def cuda_graphs(self) -> bool:
        """Whether drafts are replayed from a CUDA graph."""
        return self._chain is not None and self._chain.graphs

    def _taps(self, taps: Tensor) -> Tensor:
        return taps.to(self.device, self.dtype)

    @torch.inference_mode()
    def reset(self, prompt: TargetOutput) -> None:
        """The prompt's pairs (h_t, x_{t+1}) go into the head's cache; h of its last token waits for the bonus."""
        taps = self._taps(prompt.taps)  # [T, H]
        self.cache, self.length = DynamicCache(), 0
        self._hidden, self._tokens = taps[:-1], prompt.tokens[1:].tolist()
        self._last = taps[-1]
        # The head's prefill: the prompt's pairs go into its cache now, not in the first round's draft
        # (the draft prefill is not decode time). The eager drafter feeds them in one forward (step 1's
        # pair follows in the first draft); the static chain absorbs all but the pairs its first draft
        # takes with the root's, as that draft would have.
        if self.steps == 0:
            return
        if self._chain is None:
            self.catch_up()
        else:
            self._absorb_static(self._chain.rows - 1)

    @torch.inference_mode()
    def catch_up(self) -> Tensor | None:
        """Feed the queued pairs in one forward; their outputs ``[P, H]`` (None when nothing is queued)."""
        count = len(self._tokens)
        if count == 0:
            return None
        embeds = self.target.embed(torch.tensor(self._tokens)[None]).to(self.device, self.dtype)  # [1, P, H]
        positions = torch.arange(self.length, self.length + count, device=self.device)[None]
        out = self.head(embeds, self._hidden[None], positions, self.cache)[0]  # [P, H]
        self.length += count
        self._hidden, self._tokens = self._hidden[:0], []
        return out

    def _log_probs(self, hidden: Tensor) -> Tensor:  # [1, H] -> [1, vocab] float32
        return torch.log_softmax(self.target.lm_head(hidden).float(), dim=-1)

    @torch.inference_mode()
    def draft(self, root_token: int) -> Draft:
        # Step 1's pair (h_{N-1}, b) is true (the root is always accepted): queue it with the rest.
        self._hidden = torch.cat([self._hidden, self._last[None]])
        self._tokens.append(int(root_token))
        self._last = None
        if self.steps == 0:
            return Draft.empty(self.target.vocab_size, self.target.output_device)
        log_probs = self._draft_eager() if self._chain is None else self._draft_static()  # [steps, vocab]
        if self.top_k is not None and self.top_k < log_probs.shape[-1]:
            cut = log_probs.topk(self.top_k, dim=-1).values[:, -1:]  # [steps, 1]
            log_probs = log_probs.masked_fill(log_probs < cut, float("-inf"))
        return Draft(log_probs)

    def _draft_eager(self) -> Tensor:  # [steps, vocab]
        hidden = self.catch_up()[-1:]  # [1, H] step 1's output, after the committed pairs
        rows = [self._log_probs(hidden)]
        for step in range(1, self.steps):
            token = rows[-1].argmax(dim=-1)  # [1] the head's own top-1, fed to the next step
            embeds = self.target.embed(token[None]).to(self.device, self.dtype)  # [1, 1, H]
            positions = torch.tensor([[self.length - 1 + step]], device=self.device)
            hidden = self.head(embeds, hidden[None], positions, self.cache)[0]  # [1, H]
            rows.append(self._log_probs(hidden))
        _truncate(self.cache, self.length)  # chained rows used h', not the target's hidden: never kept
        return torch.cat(rows)

    def _draft_static(self) -> Tensor:  # [steps, vocab]
        self._absorb_static(self._chain.rows)
        hidden, tokens = self._hidden, self._tokens
        log_probs = self._chain.draft(hidden, tokens, self.length)
        self.length += len(tokens)
        self._hidden, self._tokens = self._hidden[:0], []
        return log_probs

    def _absorb_static(self, keep: int) -> None:
        """Feed all but the last ``keep`` queued pairs into the static cache, op by op (more pairs than
        one chain step takes: a prompt's)."""
        extra = len(self._tokens) - keep
        if extra > 0:
            self._chain.absorb(self._hidden[:extra], self._tokens[:extra], self.length)
            self.length += extra
            self._hidden, self._tokens = self._hidden[extra:], self._tokens[extra:]

    def accept(self, verification: Verification, context: TargetOutput) -> None:
        """Queue the accepted path's pairs (h_{path[i]}, token of path[i + 1]); the last h waits for the bonus."""
        taps = self._taps(context.taps[list(verification.path)])  # [a, H] path order
        self._hidden = torch.cat([self._hidden, taps[:-1]])
        self._tokens += list(verification.tokens[1:])
        self._last = taps[-1]
