"""Sampling verification at temperature T > 0.

Sample the target's token independently at every node from softmax(logits / T), then walk
while the sample is a child. Each committed token is then a genuine sample of the target given
the committed prefix, so the output distribution is the target's exactly; for a tree whose
children are fixed, no lossless rule continues more often (P = sum of p over the children).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ddtree.types import Tree, Verification
from ddtree.verifiers.walk import walk_tree


def check_temperature(temperature: float) -> float:
    if not isinstance(temperature, (int, float)) or temperature < 0:
        raise ValueError(
            f"temperature must be a number >= 0, got {temperature!r}; use 0 for greedy decoding"
        )
    return float(temperature)


def sample_tokens(logits: Tensor, temperature: float, generator: torch.Generator | None) -> Tensor:
    """One token per row of ``logits`` ``[n, vocab]``; argmax when temperature is 0."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)  # [n]


class SamplingVerifier:
    """The target's own sampling rule at ``temperature`` (0 reduces to greedy)."""

    def __init__(self, temperature: float = 1.0) -> None:
        self.temperature = check_temperature(temperature)

    def verify(self, tree: Tree, logits: Tensor, generator: torch.Generator | None = None) -> Verification:
        return walk_tree(tree, sample_tokens(logits, self.temperature, generator))
