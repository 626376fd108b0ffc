"""The walk shared by every verifier that picks one target token per node."""

from __future__ import annotations

from torch import Tensor

from ddtree.types import Tree, Verification


def walk_tree(tree: Tree, target_tokens: Tensor) -> Verification:
    """Follow the target's token at each node while it is one of the node's children.

    ``target_tokens[i]`` is the target's choice after node i (argmax, or a sample); the choice
    at the last accepted node is the next bonus token.
    """
    picks = target_tokens.tolist()  # [n]
    if tree.size == 1:
        return Verification(path=(0,), tokens=(int(tree.tokens[0]),), bonus=picks[0])
    tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
    child = {(parents[i], tokens[i]): i for i in range(1, tree.size)}
    path = [0]
    while (nxt := child.get((path[-1], picks[path[-1]]))) is not None:
        path.append(nxt)
    return Verification(path=tuple(path), tokens=tuple(tokens[i] for i in path), bonus=picks[path[-1]])
