"""DDTree's best-first tree: the top-B prefixes by draft probability (the paper's Algorithm 1).

The score of a prefix u is sum_d log q_d(u_d). The best tree of B nodes is the set of the B
highest-scoring prefixes, which is prefix-closed, and only each depth's top K = min(B, vocab)
tokens can appear in it. A heap over (depth, rank) tuples enumerates those prefixes in
non-increasing score: popping a node pushes its next sibling (same depth, rank + 1) and its
first child (depth + 1, rank 1), so every prefix is reached exactly once.
"""

from __future__ import annotations

import heapq

import torch

from ddtree.types import Draft, Tree


class BestFirstTreeBuilder:
    """Best-first tree with node budget B (the root does not count: verify length 1 + B).

    ``max_width`` caps the ranks per depth (``max_width=1`` gives the chain). ``draft_temperature``
    rescales the draft before scoring (below 1: trust the drafter more, which grows deeper, narrower
    trees when a drafter ranks well but is under-confident). Verification does not depend on it, so
    every setting is equally lossless.

    >>> q = torch.log_softmax(torch.randn(4, 10), -1)
    >>> BestFirstTreeBuilder(budget=6).build(Draft(q), root_token=3).size
    7
    """

    def __init__(self, budget: int, max_width: int | None = None, draft_temperature: float = 1.0) -> None:
        if not isinstance(budget, int) or budget < 0:
            raise ValueError(
                f"tree budget must be a non-negative integer (nodes below the root), got {budget!r}; "
                "use e.g. tree.budget=64 (0 verifies the root alone, as AR does)"
            )
        if max_width is not None and max_width < 1:
            raise ValueError(f"max_width must be >= 1 or None, got {max_width!r}")
        if not draft_temperature > 0:
            raise ValueError(f"draft_temperature must be > 0, got {draft_temperature!r}")
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
        top_logp, top_tok = logp_all.topk(k, dim=-1)  # [L, K] each, sorted
        logp, tok = top_logp.cpu().tolist(), top_tok.cpu().tolist()

        tokens, parents, depths, scores = [root_token], [-1], [0], [0.0]
        # Heap entries: (-score, depth, rank, parent node, parent score); ranks are 0-based.
        heap = [(-logp[0][0], 1, 0, 0, 0.0)]
        while heap and len(tokens) <= self.budget:
            neg, depth, rank, parent, parent_score = heapq.heappop(heap)
            node, score = len(tokens), -neg
            tokens.append(tok[depth - 1][rank])
            parents.append(parent)
            depths.append(depth)
            scores.append(score)
            if rank + 1 < k:  # next sibling: same parent, next-ranked token at this depth
                sib = parent_score + logp[depth - 1][rank + 1]
                heapq.heappush(heap, (-sib, depth, rank + 1, parent, parent_score))
            if depth < depth_limit:  # first child: the best token one level deeper
                heapq.heappush(heap, (-(score + logp[depth][0]), depth + 1, 0, node, score))
        return Tree(
            torch.tensor(tokens, dtype=torch.long),
            torch.tensor(parents, dtype=torch.long),
            torch.tensor(depths, dtype=torch.long),
            torch.tensor(scores, dtype=torch.float32),
        )
