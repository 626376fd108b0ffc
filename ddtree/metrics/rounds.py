"""Why a tree wins: acceptance per (depth, rank), the drafter's calibration, and the tau of every
smaller budget and of the chain, all from the recorded rounds of one run.

A recorded round (``generate(record=True)``) is stored compactly as a ``RoundTrace``: the tree in
node order (parent, depth, the token's rank in the draft at its depth, the token, its draft
log-probability), the draft's top-1 token per depth, the accepted path and the bonus token.

Sub-trees from one run. At T = 0 the target's verdict on a node depends only on the node's root
path, so a prefix-closed sub-tree of the recorded tree accepts exactly the recorded accepted path
down to its deepest node that the sub-tree holds, and commits that many tokens plus the target's
next one. The best-first tree of budget b is the first b nodes of the best-first tree of a larger
budget (nodes are numbered in pop order), so every b up to the run's budget is read off one run,
exactly per round, as long as the draft has no tied log-probabilities among the ranks the tree
uses (``torch.topk`` orders ties differently for different k; such rounds are counted). The chain
is a sub-tree as far as the recorded tree holds it; where it would continue past the recorded tree
with the target agreeing, the estimate is a lower bound (counted as ``censored``). A run at budget
b differs from the estimate because its later rounds start elsewhere: estimates are per round of
the recorded run, not of the run at b.

    >>> result = engine.generate(ids, max_new_tokens=96, record=True)       # doctest: +SKIP
    >>> traces = [round_traces(result)]                                      # one list per response
    >>> estimate_budget(traces, 16).tau, estimate_chain(traces).tau          # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import torch

from ddtree.metrics.acceptance import mean_of_means, pooled_histogram

Responses = Sequence[Sequence["RoundTrace"]]  # per response, its rounds in order


@dataclass(frozen=True)
class RoundTrace:
    """One recorded round in plain lists (node 0 is the root: parent -1, depth 0, log-prob 0)."""

    parents: tuple[int, ...]
    depths: tuple[int, ...]
    ranks: tuple[int, ...]  # how many tokens the draft ranks strictly above this one at its depth (0: top-1)
    tokens: tuple[int, ...]
    log_probs: tuple[float, ...]  # the draft's log q_depth(token), untempered
    top: tuple[int, ...]  # the draft's top-1 token at depths 1..L (the chain builder's choice)
    path: tuple[int, ...]  # accepted nodes, path[0] == 0
    bonus: int
    length: int  # tokens the round committed: accepted + bonus, cut after a stop token
    stop: bool = False  # the response ended on a stop token in this round
    tie: bool = False  # a tree token's draft log-prob ties with another token's at its depth

    @property
    def size(self) -> int:
        return len(self.tokens)

    @classmethod
    def from_round(cls, record, length: int, stop: bool = False) -> "RoundTrace":
        """From an engine ``RoundRecord`` (draft, tree, verification) and the round's committed length."""
        logp = record.draft.log_probs.float().cpu()  # [L, vocab]
        tree = record.tree
        depths = tree.depths.cpu()
        node_lp, ranks = torch.zeros(tree.size), torch.zeros(tree.size, dtype=torch.long)
        tie = False
        if tree.size > 1:
            rows = logp[depths[1:] - 1]  # [n - 1, vocab]
            node_lp[1:] = rows.gather(1, tree.tokens[1:].cpu()[:, None])[:, 0]
            ranks[1:] = (rows > node_lp[1:, None]).sum(-1)
            # A tree token whose log-prob another token shares: the ranks the tree uses are contiguous
            # per depth, so only such a tie can make a smaller budget take a different token.
            tie = bool(((rows == node_lp[1:, None]).sum(-1) > 1).any())
        # The chain builder's own argmax, on the draft's device (where it breaks ties).
        top = record.draft.log_probs.float().max(dim=-1).indices.cpu()  # [L]
        v = record.verification
        return cls(tuple(tree.parents.tolist()), tuple(depths.tolist()), tuple(ranks.tolist()),
                   tuple(tree.tokens.tolist()), tuple(round(x, 5) for x in node_lp.tolist()), tuple(top.tolist()),
                   tuple(v.path), int(v.bonus), int(length), stop, tie)

    def to_json(self) -> dict:
        """Compact lists for a JSON-lines record (``stop``/``tie`` only when set)."""
        data = {"parent": list(self.parents), "depth": list(self.depths), "rank": list(self.ranks),
                "token": list(self.tokens), "logp": list(self.log_probs), "top": list(self.top),
                "path": list(self.path), "bonus": self.bonus, "n": self.length}
        return {**data, **({"stop": True} if self.stop else {}), **({"tie": True} if self.tie else {})}

    @classmethod
    def from_json(cls, data: Mapping) -> "RoundTrace":
        return cls(tuple(data["parent"]), tuple(data["depth"]), tuple(data["rank"]), tuple(data["token"]),
                   tuple(data["logp"]), tuple(data["top"]), tuple(data["path"]), int(data["bonus"]),
                   int(data["n"]), bool(data.get("stop", False)), bool(data.get("tie", False)))


def round_traces(result) -> list[RoundTrace]:
    """The traces of a ``GenerationResult`` decoded with ``record=True``."""
    if len(result.rounds) != len(result.acceptance_lengths):
        raise ValueError("the result holds no recorded rounds: decode with generate(..., record=True)")
    last = len(result.rounds) - 1
    return [RoundTrace.from_round(r, n, stop=i == last and result.stopped_by == "stop_token")
            for i, (r, n) in enumerate(zip(result.rounds, result.acceptance_lengths))]


def traces_of(record: Mapping) -> list[RoundTrace]:
    """The traces stored in a response record (``record_rounds``); [] for a record without them."""
    return [RoundTrace.from_json(r) for r in record.get("rounds") or ()]


def subtree_length(trace: RoundTrace, keep: Sequence[bool]) -> int:
    """Tokens the round commits when only the ``keep`` nodes (prefix-closed) are verified (T = 0)."""
    accepted = 0
    for depth, node in enumerate(trace.path[1:], start=1):
        if not keep[node]:
            break
        accepted = depth
    return min(accepted + 1, trace.length)


def chain_nodes(trace: RoundTrace) -> list[bool]:
    """Which nodes lie on the draft's top-1 chain (the root included)."""
    keep = [True] * trace.size
    for i in range(1, trace.size):
        keep[i] = keep[trace.parents[i]] and trace.tokens[i] == trace.top[trace.depths[i] - 1]
    return keep


@dataclass(frozen=True)
class Estimate:
    """Per-round acceptance lengths of a tree read off recorded rounds."""

    name: str
    lengths: tuple[tuple[int, ...], ...]  # per response, per round (accepted + bonus)
    censored: int = 0  # rounds where the length is a lower bound (the chain leaves the recorded tree)
    ties: int = 0  # rounds whose draft ties within the tree's ranks: the smaller tree may take another tie

    @property
    def rounds(self) -> int:
        return sum(len(r) for r in self.lengths)

    @property
    def tau(self) -> float:
        """Mean over responses of the per-response mean length (``mean_of_means``)."""
        return mean_of_means(self.lengths)

    def histogram(self) -> dict[int, float]:
        return pooled_histogram(self.lengths)


def recorded(responses: Responses, name: str = "recorded") -> Estimate:
    """The recorded run itself."""
    return Estimate(name, tuple(tuple(t.length for t in r) for r in responses))


def estimate_budget(responses: Responses, budget: int) -> Estimate:
    """Best-first budget ``budget`` (at most the recorded run's) from a best-first run, at T = 0."""
    if not any(t.size - 1 >= budget for r in responses for t in r):
        raise ValueError(f"budget {budget} is above the recorded trees' size: estimate budgets up to the run's own")
    lengths = tuple(tuple(subtree_length(t, [i <= budget for i in range(t.size)]) for t in r) for r in responses)
    ties = sum(t.tie and t.size - 1 > budget for r in responses for t in r)
    return Estimate(f"B={budget}", lengths, ties=ties)


def _chain_length(trace: RoundTrace) -> tuple[int, bool]:
    """The chain's length in this round, and whether it is a lower bound."""
    keep = chain_nodes(trace)
    length = subtree_length(trace, keep)
    accepted = length - 1
    held = {trace.depths[i] for i in range(trace.size) if keep[i]}
    # The target took the chain's next token, but the recorded tree does not hold that node:
    # the chain accepts it too, and what the target says after it is unknown.
    beyond = (accepted < len(trace.top) and accepted + 1 not in held and len(trace.path) == accepted + 1
              and trace.bonus == trace.top[accepted] and not trace.stop)
    return (length + 1, True) if beyond else (length, False)


def estimate_chain(responses: Responses) -> Estimate:
    """The top-1 chain (DFlash/MTP's tree) on the recorded rounds, at T = 0."""
    per = [[_chain_length(t) for t in r] for r in responses]
    lengths = tuple(tuple(n for n, _ in r) for r in per)
    return Estimate("chain", lengths, censored=sum(c for r in per for _, c in r))


@dataclass(frozen=True)
class DepthRank:
    """Counts per (depth, rank) of the draft, depth 1 in row 0, rank 0 (top-1) in column 0.

    A node is tested when its parent is on the accepted path (the target's choice there is then
    this token or another), accepted when it is on the path itself.
    """

    tested: np.ndarray  # [depths, ranks] int
    accepted: np.ndarray  # [depths, ranks] int
    rounds: int

    @property
    def rate(self) -> np.ndarray:  # [depths, ranks], nan where nothing was tested
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.tested > 0, self.accepted / np.maximum(self.tested, 1), np.nan)

    @property
    def per_round(self) -> np.ndarray:  # [depths, ranks]: accepted tokens per round from each cell
        return self.accepted / max(self.rounds, 1)


def tested_nodes(responses: Responses):
    """``(trace, node, accepted)`` for every tested node: one whose parent is on the accepted path
    (the target's choice there was this token or another), accepted when it is on the path itself."""
    for r in responses:
        for t in r:
            on_path = set(t.path)
            for i in range(1, t.size):
                if t.parents[i] in on_path:
                    yield t, i, i in on_path


def depth_rank(responses: Responses, max_rank: int = 8) -> DepthRank:
    """Acceptance per (depth, rank); ranks at or past ``max_rank`` share the last column."""
    traces = [t for r in responses for t in r]
    depth = max((max(t.depths) for t in traces), default=0)
    tested, accepted = np.zeros((depth, max_rank), dtype=int), np.zeros((depth, max_rank), dtype=int)
    for t, i, hit in tested_nodes(responses):
        cell = (t.depths[i] - 1, min(t.ranks[i], max_rank - 1))
        tested[cell] += 1
        accepted[cell] += hit
    return DepthRank(tested, accepted, len(traces))


def branch_gain(responses: Responses, max_rank: int = 8) -> np.ndarray:
    """Tokens per round the tree gains over the chain, put on the (depth, rank) where its accepted
    path first leaves the chain: where the extra accepted tokens come from. ``[depths, ranks]``."""
    traces = [t for r in responses for t in r]
    depth = max((max(t.depths) for t in traces), default=0)
    gain = np.zeros((depth, max_rank))
    for t in traces:
        keep = chain_nodes(t)
        off = next((i for i in t.path if not keep[i]), None)
        if off is not None:
            gain[t.depths[off] - 1, min(t.ranks[off], max_rank - 1)] += t.length - _chain_length(t)[0]
    return gain / max(len(traces), 1)


@dataclass(frozen=True)
class Calibration:
    """The drafter's stated probability against the target's measured agreement, binned by q."""

    edges: np.ndarray  # [bins + 1]
    stated: np.ndarray  # [bins] mean q of the tested nodes in each bin (nan: empty bin)
    hit_rate: np.ndarray  # [bins] fraction of them the target accepted
    count: np.ndarray  # [bins]

    @property
    def error(self) -> float:
        """Expected calibration error: the count-weighted mean |stated - hit rate|."""
        full = self.count > 0
        total = self.count[full].sum()
        if not total:
            return float("nan")
        return float((self.count[full] * np.abs(self.stated[full] - self.hit_rate[full])).sum() / total)


def calibration(responses: Responses, bins: int = 10, depths: Sequence[int] | None = None,
                ranks: Sequence[int] | None = None) -> Calibration:
    """Reliability of q over the tested nodes at the given depths and ranks (all when None):
    in each of ``bins`` equal bins of q in [0, 1], the mean q against the fraction accepted."""
    stated, hit = [], []
    for t, i, accepted in tested_nodes(responses):
        if (depths is None or t.depths[i] in depths) and (ranks is None or t.ranks[i] in ranks):
            stated.append(float(np.exp(t.log_probs[i])))
            hit.append(accepted)
    edges = np.linspace(0.0, 1.0, bins + 1)
    q, h = np.asarray(stated, dtype=float), np.asarray(hit, dtype=float)
    which = np.clip(np.searchsorted(edges, q, side="right") - 1, 0, bins - 1)
    count = np.bincount(which, minlength=bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_q = np.bincount(which, weights=q, minlength=bins) / count
        rate = np.bincount(which, weights=h, minlength=bins) / count
    return Calibration(edges, mean_q, rate, count)
