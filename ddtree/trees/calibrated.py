"""A best-first tree over recalibrated draft scores: one temperature per depth.

The best-first tree spends its budget where the product of the draft's probabilities is high,
so it is only as good as those probabilities are calibrated. A drafter that is over-confident
at depth 1 and under-confident at depth 8 (block-diffusion marginals often are) makes the tree
too wide near the root and too shallow. Tempering depth d by its own T_d,

    q'_d = softmax(log q_d / T_d),

keeps every depth's ranking (a monotone map per depth) and changes only how the budget is shared
between depths. The T_d are fitted on held-out rounds (``ddtree.training.calibration``,
``experiments/calibrate_tree.py``). Verification never reads the scores, so any temperatures are
exactly as lossless as the plain best-first tree: a tree is just another set of candidates.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ddtree.trees.best_first import BestFirstTreeBuilder
from ddtree.types import Draft, Tree


def temper(draft: Draft, temperatures: torch.Tensor) -> Draft:
    """``log_softmax(log q_d / T_d)`` for each depth d; depths past the last temperature take the last.

    ``temperatures`` is ``[K]``, K >= 1; the result has the draft's shape ``[L, vocab]``.

    >>> q = torch.log_softmax(torch.tensor([[2.0, 0.0], [1.0, 0.0]]), -1)
    >>> temper(Draft(q), torch.tensor([1.0, 0.5])).log_probs.exp().round(decimals=3)
    tensor([[0.8810, 0.1190],
            [0.8810, 0.1190]])
    """
    depth = draft.depth
    if depth == 0:
        return draft
    index = torch.arange(depth).clamp(max=temperatures.numel() - 1)
    per_depth = temperatures[index].to(draft.log_probs.device).unsqueeze(-1)  # [L, 1]
    return Draft(torch.log_softmax(draft.log_probs.float() / per_depth, dim=-1))


class CalibratedTreeBuilder:
    """Best-first tree with node budget B over per-depth tempered draft scores.

    ``temperatures[d]`` tempers depth d + 1 (the last one also every deeper depth); all 1.0 is
    the plain best-first tree. The tree's ``scores`` are the tempered log-probabilities.

    >>> q = torch.log_softmax(torch.randn(4, 10), -1)
    >>> CalibratedTreeBuilder(budget=6, temperatures=[0.8, 1.2]).build(Draft(q), root_token=3).size
    7
    """

    def __init__(self, budget: int, temperatures: Sequence[float], max_width: int | None = None,
                 method: str = "auto", graphs: bool | None = None) -> None:
        values = [float(t) for t in temperatures]
        if not values or not all(t > 0 for t in values):
            raise ValueError(f"temperatures must be a non-empty list of positive numbers (one per depth), got "
                             f"{list(temperatures)!r}; fit them with experiments/calibrate_tree.py")
        self.best_first = BestFirstTreeBuilder(budget, max_width=max_width, method=method, graphs=graphs)
        self.budget = budget
        self.temperatures = torch.tensor(values, dtype=torch.float32)  # [K]

    def build(self, draft: Draft, root_token: int) -> Tree:
        return self.best_first.build(temper(draft, self.temperatures), root_token)
