"""DFlash as a drafter: one block-diffusion pass drafts depths 1..block_size-1.

The drafter's cache holds context K/V for committed tokens only: the features of the accepted
nodes arrive in ``accept`` and are absorbed at the next ``draft``; the block's own K/V are never
kept (the reference crops them after every call, which is the same thing).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ddtree.models.dflash import DFlashDraftModel
from ddtree.types import Draft, TargetOutput, Verification


def check_pair(model: DFlashDraftModel, target) -> None:
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


class DFlashDrafter:
    """Drafts ``block_size - 1`` per-depth marginals from one forward of the block.

    >>> drafter = DFlashDrafter(DFlashDraftModel.from_pretrained(path), target)   # doctest: +SKIP
    """

    def __init__(self, model: DFlashDraftModel, target, block_size: int | None = None) -> None:
        check_pair(model, target)
        self.model, self.target = model.eval(), target
        self.block_size = int(block_size or model.config.block_size)
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        self.hidden_layers = tuple(model.config.target_layer_ids)
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self._context: list[tuple[Tensor, Tensor]] = []
        self._pending: Tensor | None = None
        self.length = 0  # committed tokens whose features are in the cache

    def reset(self, prompt: TargetOutput) -> None:
        self._context, self.length, self._pending = [], 0, prompt.taps
        self._absorb()  # the draft prefill over the prompt

    def _absorb(self) -> None:
        """Append the pending features' K/V (positions continue the committed length)."""
        if self._pending is None or self._pending.shape[0] == 0:
            return
        taps = self._pending.to(self.device, self.dtype)  # [C, n_feat * H]
        positions = torch.arange(self.length, self.length + taps.shape[0], device=self.device)
        new = self.model.context_kv(taps, positions)
        if self._context:
            new = [(torch.cat([k0, k], 2), torch.cat([v0, v], 2)) for (k0, v0), (k, v) in zip(self._context, new)]
        self._context, self.length, self._pending = new, self.length + taps.shape[0], None

    def draft(self, root_token: int) -> Draft:
        self._absorb()
        size = self.block_size
        ids = torch.full((size,), self.model.config.mask_token_id, dtype=torch.long)
        ids[0] = root_token
        block = self.target.embed(ids[None]).to(self.device, self.dtype)  # [1, size, H]
        positions = torch.arange(self.length, self.length + size, device=self.device)
        hidden = self.model(block, positions, self._context)[0, 1:]  # [size - 1, H]
        logits = self.target.lm_head(hidden)  # [size - 1, vocab]
        return Draft(torch.log_softmax(logits.float(), dim=-1))

    def accept(self, verification: Verification, context: TargetOutput) -> None:
        self._pending = context.taps[list(verification.path)]  # [a, n_feat * H], path order
