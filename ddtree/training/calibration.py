"""Fit one draft temperature per depth on recorded rounds (for ``ddtree.trees.CalibratedTreeBuilder``).

At T = 0 the tokens a run returns are the target's own greedy tokens, so every recorded round
is labelled for free: the round whose root is token j drafted q_1..q_L for tokens j + 1..j + L.
T_d minimises the negative log-likelihood of the target's token under softmax(log q_d / T_d)
(one 1-D problem per depth, convex in 1 / T, solved together by L-BFGS over log T).

Which rounds count at depth d: by default (``chain_mask``) only those whose target tokens at
depths 1..d-1 were the draft's top-1 tokens. A best-first score is a sum of log-probabilities
along a path, meant as the log-probability that the target's walk reaches the node; so depth
d's probabilities matter given the walk got there, which is along the top-1 path for almost all
of the mass. A mask of every labelled depth (``labels != NO_LABEL``) fits the plain marginals.

    >>> result = engine.generate(prompt_ids, max_new_tokens=96, record=True)   # doctest: +SKIP
    >>> log_probs, labels = round_examples([result])                           # doctest: +SKIP
    >>> fit_depth_temperatures(log_probs, labels)                              # doctest: +SKIP
    [0.858, 0.7771, 0.8177, ...]
"""

from __future__ import annotations

from typing import Iterable, Sequence

import torch
from torch import Tensor

from ddtree.types import GenerationResult

NO_LABEL = -1


def round_examples(results: Iterable[GenerationResult]) -> tuple[Tensor, Tensor]:
    """Every recorded round's draft and the target's tokens it tried to draft.

    Returns log_probs ``[R, L, vocab]`` (zeros past a shortened draft) and labels ``[R, L]``
    (``NO_LABEL`` where the run has no token there: past its end or past the draft).
    """
    drafts, labels = [], []
    for result in results:
        if result.acceptance_lengths and not result.rounds:
            raise ValueError("round_examples needs runs decoded with generate(record=True)")
        root = 0  # index of the round's root (its bonus token) in result.tokens
        for record, length in zip(result.rounds, result.acceptance_lengths):
            logp = record.draft.log_probs.float().cpu()  # [l, vocab]
            known = result.tokens[root + 1 : root + 1 + logp.shape[0]]
            drafts.append(logp)
            labels.append(torch.tensor(known + [NO_LABEL] * (logp.shape[0] - len(known)), dtype=torch.long))
            root += length
    if not drafts:
        raise ValueError("no recorded rounds with a draft: decode longer, or with a drafter")
    depth, vocab = max(d.shape[0] for d in drafts), drafts[0].shape[1]
    log_probs = torch.zeros(len(drafts), depth, vocab)
    label = torch.full((len(drafts), depth), NO_LABEL, dtype=torch.long)
    for i, (logp, y) in enumerate(zip(drafts, labels)):
        log_probs[i, : logp.shape[0]], label[i, : y.shape[0]] = logp, y
    return log_probs, label


def chain_mask(log_probs: Tensor, labels: Tensor) -> Tensor:
    """``[R, L]`` bool: depth d is labelled and the target's tokens above it were the draft's top-1."""
    hit = log_probs.argmax(-1) == labels  # [R, L]
    above = torch.cat([torch.ones_like(hit[:, :1]), hit[:, :-1].cumprod(dim=1)], dim=1).bool()
    return above & (labels != NO_LABEL)


def depth_nll(log_probs: Tensor, labels: Tensor, temperatures: Sequence[float] | Tensor,
              mask: Tensor | None = None) -> Tensor:
    """Mean NLL of the labels under the tempered drafts, per depth: ``[L]`` (NaN where no example)."""
    mask = (labels != NO_LABEL) if mask is None else mask
    temps = torch.as_tensor(temperatures, dtype=torch.float32)
    return _per_depth_nll(log_probs, labels, mask, temps.log())


def _per_depth_nll(log_probs: Tensor, labels: Tensor, mask: Tensor, log_t: Tensor) -> Tensor:
    tempered = torch.log_softmax(log_probs / log_t.exp()[None, :, None], dim=-1)  # [R, L, vocab]
    nll = -tempered.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)  # [R, L]
    counts = mask.sum(0)
    return torch.where(counts > 0, (nll * mask).sum(0) / counts.clamp(min=1), torch.nan)


def fit_depth_temperatures(log_probs: Tensor, labels: Tensor, mask: Tensor | None = None,
                           min_examples: int = 8, steps: int = 50) -> list[float]:
    """Per-depth temperatures minimising the labels' NLL over the examples ``mask`` keeps
    (default: ``chain_mask``). A depth with fewer than ``min_examples`` examples (deep ones, on
    the top-1 path) takes the temperature of the depth above it (1.0 at depth 1).

    ``log_probs`` ``[R, L, vocab]``, ``labels`` ``[R, L]`` as ``round_examples`` returns them; ``mask`` ``[R, L]``.
    """
    mask = chain_mask(log_probs, labels) if mask is None else mask
    enough = mask.sum(0) >= min_examples  # [L]
    log_t = torch.zeros(log_probs.shape[1], requires_grad=True)
    optimiser = torch.optim.LBFGS([log_t], max_iter=steps, line_search_fn="strong_wolfe")

    def closure() -> Tensor:
        optimiser.zero_grad()
        # The depths are independent: the sum of their mean NLLs has one minimum per depth.
        loss = _per_depth_nll(log_probs, labels, mask, log_t)[enough].sum()
        loss.backward()
        return loss

    if bool(enough.any()):
        optimiser.step(closure)
    temperatures, previous = [], 1.0
    for t, ok in zip(log_t.detach().exp().tolist(), enough.tolist()):
        previous = round(t, 4) if ok else previous
        temperatures.append(previous)
    return temperatures
