"""The chain: the drafter's top-1 token at every depth (DFlash, MTP; AR when L = 0)."""

from __future__ import annotations

import torch

from ddtree.types import Draft, Tree


class ChainTreeBuilder:
    """One child per depth: node d is the argmax of ``q_d``, its parent node d - 1.

    >>> ChainTreeBuilder().build(Draft(torch.log_softmax(torch.randn(3, 5), -1)), 7).size
    4
    """

    def build(self, draft: Draft, root_token: int) -> Tree:
        if draft.depth == 0:  # AR: the root alone, without a reduction over an empty draft
            return Tree.root(root_token)
        top_logp, top_tok = draft.log_probs.float().max(dim=-1)  # [L], [L]
        # One copy to the host for both (float64 holds a token id and a float32 value exactly).
        host = torch.stack([top_logp.double(), top_tok.double()]).cpu()
        length = draft.depth
        tokens = torch.cat([torch.tensor([root_token]), host[1].long()])
        parents = torch.arange(-1, length, dtype=torch.long)
        depths = torch.arange(0, length + 1, dtype=torch.long)
        scores = torch.cat([torch.zeros(1), host[0].float().cumsum(0)])
        return Tree(tokens, parents, depths, scores)
