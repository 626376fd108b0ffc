"""DDTree's best-first tree: the top-B prefixes by draft probability (the paper's Algorithm 1).

The score of a prefix u is sum_d log q_d(u_d). The best tree of B nodes is the set of the B
highest-scoring prefixes, which is prefix-closed (a prefix never scores below its extensions),
and only each depth's top K = min(B, vocab) tokens can appear in it. Two exact ways to find it:

- ``method="beam"``: a few tensor operations per depth, on the draft's device. A prefix
  in the top B is among the top B of its own depth, and so is its parent one depth up; so the
  B best prefixes of depth d are the B best extensions (parent score + token log-prob) of the
  B best of depth d - 1, among only the about B ln B (parent, token) rank pairs that can win. The tree is the B best of all depths, taken in a stable
  descending sort of the depth-major list, so a parent always comes before its children (ties
  included) and nodes are numbered in non-increasing score. No Python runs per node.
- ``method="heap"``: Algorithm 1 as written. A heap over (depth, rank) tuples enumerates the
  prefixes in non-increasing score: popping a node pushes its next sibling (same depth,
  rank + 1) and its first child (depth + 1, rank 1), so every prefix is reached exactly once.

Both give a tree of the same (optimal) total draft probability; without ties in score they give
the same tree, node for node. ``method="auto"`` (default) takes the heap up to 512 nodes and the
beam beyond: on an H200 the beam's ~10 launches per depth cost more than the heap's Python
below that (tree stage 1.6 vs 0.3-0.4 ms at B = 64) and less above it (3.1 vs 4.1 ms at 1024).
"""

from __future__ import annotations

import heapq
from array import array

import numpy as np
import torch

from ddtree.trees.topk import TopK
from ddtree.types import Draft, Tree


class BestFirstTreeBuilder:
    """Best-first tree with node budget B (the root does not count: verify length 1 + B).

    ``max_width`` caps the ranks per depth (``max_width=1`` gives the chain). ``draft_temperature``
    rescales the draft before scoring (below 1: trust the drafter more, which grows deeper, narrower
    trees when a drafter ranks well but is under-confident). Verification does not depend on it, so
    every setting is equally lossless. ``graphs``: how the heap's top-k runs (``ddtree.trees.topk.TopK``):
    None (default) from a CUDA graph for a draft on CUDA, op by op elsewhere; False always op by op.

    >>> q = torch.log_softmax(torch.randn(4, 10), -1)
    >>> BestFirstTreeBuilder(budget=6).build(Draft(q), root_token=3).size
    7
    """

    def __init__(self, budget: int, max_width: int | None = None, draft_temperature: float = 1.0,
                 method: str = "auto", graphs: bool | None = None) -> None:
        if not isinstance(budget, int) or budget < 0:
            raise ValueError(
                f"tree budget must be a non-negative integer (nodes below the root), got {budget!r}; "
                "use e.g. tree.budget=64 (0 verifies the root alone, as AR does)"
            )
        if max_width is not None and max_width < 1:
            raise ValueError(f"max_width must be >= 1 or None, got {max_width!r}")
        if graphs not in (None, True, False):
            raise ValueError(f"graphs must be null (a CUDA graph for a draft on CUDA), true or false, got {graphs!r}")
        if not draft_temperature > 0:
            raise ValueError(f"draft_temperature must be > 0, got {draft_temperature!r}")
        if method not in ("auto", "beam", "heap"):
            raise ValueError(f"unknown tree method {method!r}: use 'beam' (tensor ops per depth), 'heap' "
                             "(Algorithm 1) or 'auto'")
        # auto: the heap up to 512 nodes, where a few hundred Python steps cost less than the
        # beam's launches per depth on a GPU; the beam beyond (H200 timings in the README)
        self.method = method if method != "auto" else ("beam" if budget > 512 else "heap")
        self._pair_cache: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
        self._topk = TopK(graphs=graphs)
        self.budget = budget
        self.max_width = max_width
        self.draft_temperature = float(draft_temperature)

    def build(self, draft: Draft, root_token: int) -> Tree:
        depth_limit, vocab = draft.log_probs.shape
        k = min(self.budget, vocab, self.max_width or vocab)
        if depth_limit == 0 or k == 0:
            return Tree.root(root_token)
        logp_all = draft.log_probs.float()
        if self.draft_temperature != 1.0:
            logp_all = torch.log_softmax(logp_all / self.draft_temperature, dim=-1)
        if self.method == "beam":
            return self._beam(*logp_all.topk(k, dim=-1), root_token)  # [L, K] each, sorted
        # The top-K log-probs and tokens on the host in one copy (on CUDA from a graph: ``TopK``). The
        # log-probs as Python floats on demand: a flat float64 array (no object per entry; element
        # [row * k + rank], the float32 values exactly) instead of a nested list of L x K floats, and the
        # tokens gathered once at the end: at B = 256 about a third less host time than lists.
        values, tok = self._topk(logp_all, k)
        logp = array("d", values.tobytes())

        flat, parents, depths, scores = [0], [-1], [0], [0.0]  # flat: each node's row * k + rank (the root's unused)
        # Heap entries: (-score, depth, rank, parent node, parent score); ranks are 0-based. Every
        # entry is unique, so the pops come in one order however the heap is kept: the popped node
        # is replaced in place by its first child or next sibling (one sift instead of two).
        heap, push, replace = [(-logp[0], 1, 0, 0, 0.0)], heapq.heappush, heapq.heapreplace
        for node in range(1, self.budget + 1):
            if not heap:
                break
            neg, depth, rank, parent, parent_score = heap[0]
            score, row = -neg, (depth - 1) * k
            flat.append(row + rank)
            parents.append(parent)
            depths.append(depth)
            scores.append(score)
            # next sibling: same parent, next-ranked token at this depth
            sibling = (-(parent_score + logp[row + rank + 1]), depth, rank + 1, parent, parent_score) \
                if rank + 1 < k else None
            if depth < depth_limit:  # first child: the best token one level deeper
                replace(heap, (-(score + logp[row + k]), depth + 1, 0, node, score))
                if sibling is not None:
                    push(heap, sibling)
            elif sibling is not None:
                replace(heap, sibling)
            else:
                heapq.heappop(heap)
        tokens = tok[np.array(flat)]
        tokens[0] = root_token
        # Through numpy: torch.tensor over a Python list costs about 30 us for 257 ints, numpy 5.
        return Tree(
            torch.from_numpy(tokens),
            torch.from_numpy(np.array(parents, dtype=np.int64)),
            torch.from_numpy(np.array(depths, dtype=np.int64)),
            torch.from_numpy(np.array(scores, dtype=np.float32)),
        )

    def _pairs(self, m: int, k: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(parent rank i, token rank r) pairs with (i + 1)(r + 1) <= B, parent-major: with both
        lists sorted, (i, r) is outscored by every (i' <= i, r' <= r), so the others cannot make
        the top B. About B ln B pairs instead of B * K, cached per shape."""
        key = (m, k, device)
        pairs = self._pair_cache.get(key)
        if pairs is None:
            i = torch.arange(m).repeat_interleave(torch.clamp(self.budget // torch.arange(1, m + 1), max=k))
            start = torch.cat([torch.zeros(1, dtype=torch.long), torch.bincount(i, minlength=m).cumsum(0)[:-1]])
            r = torch.arange(i.numel()) - start[i]
            pairs = self._pair_cache[key] = (i.to(device), r.to(device))
        return pairs

    def _beam(self, top_logp: torch.Tensor, top_tok: torch.Tensor, root_token: int) -> Tree:
        """The top-B prefixes from per-depth beams (see the module docstring); one copy to the host."""
        depth_limit, k = top_logp.shape
        top_logp = top_logp.double()  # scores summed as the heap sums them (Python floats)
        device = top_logp.device
        scores, parents, tokens = [top_logp[0]], [torch.full((k,), -1, dtype=torch.long, device=device)], [top_tok[0]]
        for d in range(1, depth_limit):
            rows, cols = self._pairs(scores[-1].numel(), k, device)
            table = scores[-1][rows] + top_logp[d][cols]  # parent-major
            best, index = table.topk(min(self.budget, table.numel()))  # sorted, descending
            scores.append(best)
            parents.append(rows[index])
            tokens.append(top_tok[d][cols[index]])
        sizes = [s.numel() for s in scores]
        offsets = torch.tensor([0, *sizes[:-1]], device=device).cumsum(0)
        depth = torch.cat([torch.full((n,), d + 1, dtype=torch.long, device=device) for d, n in enumerate(sizes)])
        flat_parent = torch.cat(parents)
        # A parent's index in the flat depth-major list (-1: the root).
        flat_parent = torch.where(flat_parent >= 0, flat_parent + offsets[(depth - 2).clamp(min=0)], flat_parent)
        flat_scores = torch.cat(scores)
        order = torch.sort(flat_scores, descending=True, stable=True).indices[: self.budget]  # [n - 1]
        node_of = torch.full((depth.numel() + 1,), -1, dtype=torch.long, device=device)
        node_of[order] = torch.arange(1, order.numel() + 1, device=device)
        node_of[-1] = 0  # flat index -1: the root is node 0
        chosen_parent = node_of[flat_parent[order]]
        ints = torch.stack([torch.cat([top_tok.new_tensor([root_token]), torch.cat(tokens)[order]]),
                            torch.cat([chosen_parent.new_tensor([-1]), chosen_parent]),
                            torch.cat([depth.new_tensor([0]), depth[order]])]).cpu()
        node_scores = torch.cat([top_logp.new_zeros(1), flat_scores[order]]).float().cpu()
        return Tree(ints[0], ints[1], ints[2], node_scores)
