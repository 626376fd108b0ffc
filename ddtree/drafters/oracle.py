"""A drafter that asks the target itself: near-perfect drafts with controllable mistakes.

For tests and upper-bound studies on small models. Each draft reruns the target from scratch
over the committed tokens (no cache), so it is slow by design and only meant for tiny models.
At depth d it proposes the target's own distribution along its greedy continuation (what a
block drafter's marginals approximate); with probability ``swap_prob`` per depth the top two
tokens trade places, so chains fail where trees with siblings still succeed. ``sharpness``
scales the logits (above 1: a more confident drafter).
"""

from __future__ import annotations

import inspect

import torch
from transformers import DynamicCache

from ddtree.types import Draft, TargetOutput, Verification


class OracleDrafter:
    hidden_layers: tuple[int, ...] = ()

    def __init__(self, model, depth: int = 7, swap_prob: float = 0.0, sharpness: float = 1.0, seed: int = 0) -> None:
        if depth < 0 or not 0 <= swap_prob <= 1 or sharpness <= 0:
            raise ValueError(f"need depth >= 0, 0 <= swap_prob <= 1, sharpness > 0; got {depth}, {swap_prob}, {sharpness}")
        self.model, self.depth, self.swap_prob, self.sharpness = model, depth, swap_prob, sharpness
        self.rng = torch.Generator().manual_seed(seed)
        self.committed: list[int] = []
        self._cache_kwarg: str | None = None

    def reset(self, prompt: TargetOutput) -> None:
        self.committed = prompt.tokens.tolist()

    @torch.inference_mode()
    def draft(self, root_token: int) -> Draft:
        device = self.model.get_input_embeddings().weight.device
        ids = torch.tensor([self.committed + [root_token]], device=device)
        vocab = self.model.get_output_embeddings().weight.shape[0]
        if self.depth == 0:
            return Draft.empty(vocab)
        logp = torch.log_softmax(self.sharpness * self._greedy_logits(ids).float(), dim=-1).cpu()  # [L, vocab]
        for d in range(logp.shape[0]):
            if torch.rand((), generator=self.rng) < self.swap_prob:
                top2 = logp[d].topk(2).indices
                logp[d, top2] = logp[d, top2.flip(0)]
        return Draft(logp)

    def _greedy_logits(self, ids: torch.Tensor) -> torch.Tensor:
        """The model's logits ``[depth, vocab]`` along its own greedy continuation of ``ids``: what
        ``generate(do_sample=False, output_logits=True)`` returns, without its per-call overhead."""
        if self._cache_kwarg is None:
            params = inspect.signature(self.model.forward).parameters
            self._cache_kwarg = "cache" if "cache" in params else "past_key_values"
        cache = DynamicCache(config=self.model.config)
        logits, step = [], ids
        for _ in range(self.depth):
            out = self.model(input_ids=step, use_cache=True, **{self._cache_kwarg: cache})
            logits.append(out.logits[0, -1])
            step = logits[-1].argmax()[None, None]
        return torch.stack(logits)

    def accept(self, verification: Verification, context: TargetOutput) -> None:
        self.committed += list(verification.tokens)
