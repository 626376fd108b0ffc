"""The values that pass between the four parts of the decoding loop.

Everything here is a frozen dataclass of tensors: parts never share mutable state, and a
round can be recorded, replayed or drawn from these values alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

# A hidden-state tap index. Non-negative i is the output of decoder layer i (what Hugging Face
# calls ``hidden_states[i + 1]``); FINAL_NORM is the output of the final norm, the state the LM
# head reads (what MTP heads condition on).
FINAL_NORM = -1


@dataclass(frozen=True)
class Draft:
    """Per-depth draft distributions for one round.

    ``log_probs[d]`` is the drafter's log-distribution of the token at depth ``d + 1`` below
    the root (float32, untempered). AR drafts nothing: ``depth == 0``.
    """

    log_probs: Tensor  # [L, vocab]

    @property
    def depth(self) -> int:
        return self.log_probs.shape[0]

    @staticmethod
    def empty(vocab_size: int, device: torch.device | str = "cpu") -> "Draft":
        return Draft(torch.empty(0, vocab_size, device=device))

    def truncate(self, depth: int) -> "Draft":
        """The same draft limited to ``depth`` levels (near ``max_new_tokens``)."""
        return self if depth >= self.depth else Draft(self.log_probs[: max(depth, 0)])


@dataclass(frozen=True)
class Tree:
    """A draft tree. Node 0 is the root: the bonus token, sampled by the target, not yet fed.

    Nodes are numbered so that a parent always precedes its children.
    """

    tokens: Tensor  # [n] long
    parents: Tensor  # [n] long, parents[0] == -1
    depths: Tensor  # [n] long, depths[0] == 0
    scores: Tensor  # [n] float, sum of draft log-probabilities along the root path (root: 0)

    def __post_init__(self) -> None:
        n = self.tokens.shape[0]
        if n < 1 or self.parents.shape != (n,) or self.depths.shape != (n,):
            raise ValueError(f"a tree needs n >= 1 nodes with matching shapes, got {n}")

    @property
    def size(self) -> int:
        return self.tokens.shape[0]

    @staticmethod
    def root(token: int) -> "Tree":
        """The tree of AR decoding: the root alone."""
        zero = torch.zeros(1, dtype=torch.long)
        return Tree(torch.tensor([token]), torch.tensor([-1]), zero, torch.zeros(1))

    def ancestors(self) -> Tensor:  # [n, n] bool
        """``a[i, j]`` is True when j is i or an ancestor of i (row i = row parent(i) | e_i)."""
        n = self.size
        if n == 1:  # AR's root alone
            return torch.ones(1, 1, dtype=torch.bool)
        # In numpy, on one thread: torch parallelises a CPU op past 32K elements (from 182 nodes on),
        # and where its pool has more threads than free cores the wake-ups cost more than the work
        # (257 nodes, 16 threads on 2 cores: 0.29 ms against 0.13 on one thread). numpy: 0.05 ms.
        step = self.parents.cpu().numpy().clip(min=0)  # the root (parent -1) climbs to itself
        anc = np.eye(n, dtype=bool)
        rows, node = np.arange(n), np.arange(n)
        # Climb one level per step for every node at once: depth steps, not n Python iterations.
        for _ in range(int(self.depths.max())):
            node = step[node]
            anc[rows, node] = True
        return torch.from_numpy(anc)

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root down to ``node``."""
        parents, path = self.parents.tolist(), [node]
        while parents[path[-1]] >= 0:
            path.append(parents[path[-1]])
        return path[::-1]


@dataclass(frozen=True)
class VerifyInputs:
    """What the target's tree forward consumes (built by a MaskCompiler)."""

    input_ids: Tensor  # [1, n]
    position_ids: Tensor  # [1, n], past_length + depth
    attention_mask: Tensor | object  # dense [1, 1, n, past + n] additive, or a backend mask
    parents: Tensor  # [n], for layers that need the tree itself (recurrent layers)
    past_length: int


@dataclass(frozen=True)
class Verification:
    """The outcome of one verify: the accepted root path and the next bonus token."""

    path: tuple[int, ...]  # accepted node indices, path[0] == 0 (the root)
    tokens: tuple[int, ...]  # the tokens of those nodes
    bonus: int  # the target's token after the last accepted node

    @property
    def accepted(self) -> int:
        """Accepted draft tokens (the root is not a draft)."""
        return len(self.path) - 1


@dataclass(frozen=True)
class TargetOutput:
    """One target forward: logits and hidden taps for the tokens it consumed."""

    tokens: Tensor  # [n] long, the tokens fed
    logits: Tensor  # [n, vocab] (prefill: only the last row)
    taps: Tensor | None = None  # [n, n_taps * hidden], the requested layers concatenated

    def select(self, rows: Tensor | list[int]) -> "TargetOutput":
        """The output restricted to some rows (e.g. the accepted path), taps included."""
        idx = torch.as_tensor(rows, dtype=torch.long)
        taps = None if self.taps is None else self.taps[idx.to(self.taps.device)]
        logits = self.logits[idx.to(self.logits.device)] if self.logits.shape[0] > 1 else self.logits
        return TargetOutput(self.tokens[idx.to(self.tokens.device)], logits, taps)


@dataclass(frozen=True)
class StageTimes:
    """Wall time in seconds spent in each stage, summed over rounds."""

    draft: float = 0.0
    tree: float = 0.0
    layout: float = 0.0
    verify: float = 0.0
    commit: float = 0.0


@dataclass(frozen=True)
class GenerationResult:
    """What one call of the engine returns."""

    tokens: list[int]  # generated token ids (the prompt excluded)
    acceptance_lengths: list[int]  # per round: accepted drafts + 1 (AR: all 1)
    stage_times: StageTimes
    time_to_first_token: float  # prefill + first target token, seconds
    decode_time: float  # excludes prefill and the drafter's first call over the prompt
    stopped_by: str = "max_new_tokens"  # "stop_token" or "max_new_tokens"
    round_ends: list[float] = field(default_factory=list)  # seconds from decode start to each round's end
    round_stage_times: list[StageTimes] = field(default_factory=list)  # each round's own stage times
    rounds: list[object] = field(default_factory=list)  # recorded rounds, when asked for

    @property
    def mean_acceptance(self) -> float:
        """tau for this response: the mean acceptance length, bonus included.

        A response with no round (its first token, from the prefill, was a stop token or all of
        ``max_new_tokens``) has no acceptance length: NaN, never 0. Averages over responses
        leave it out (``ddtree.metrics.mean_of_means``, the same rule).
        """
        lengths = self.acceptance_lengths
        return sum(lengths) / len(lengths) if lengths else float("nan")

    @property
    def time_per_output_token(self) -> float:
        return self.decode_time / max(len(self.tokens), 1)
