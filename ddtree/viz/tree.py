"""Draw one round's draft tree: depth left to right, nodes shaded by draft probability, the
accepted path in red and the target's bonus token as one extra node after it.

Rows come from a depth-first leaf order (each leaf its own row, a parent on its first child's
row), so siblings never overlap and each node's most likely continuation runs straight to the
right: the top row of a best-first tree is the DFlash chain, and a chain is drawn as one row.
matplotlib is the optional ``viz`` extra, imported only when a tree is drawn.

    >>> result = engine.generate(ids, max_new_tokens=32, record=True)             # doctest: +SKIP
    >>> fig = draw_round(result.rounds[0], tokenizer)                            # doctest: +SKIP
    >>> fig.savefig("round.png")                                                 # doctest: +SKIP
    >>> drawing_of(fig).highlighted                                              # doctest: +SKIP
    [0, 1, 4]
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ddtree.types import Draft, Tree, Verification

BONUS = -1  # the index DrawnNode uses for the bonus token, which is not a node of the tree
ACCEPTED = "#d62728"  # red: accepted edges, accepted node outlines, the bonus node


@dataclass
class DrawnNode:
    """One drawn token: its tree node (``BONUS`` for the bonus token), label, place and artist."""

    index: int
    token: int
    label: str
    x: float  # depth
    y: float  # row
    prob: float  # the shade: path or conditional draft probability (the root: 1, the bonus: nan)
    highlighted: bool  # on the accepted path (the bonus too)
    artist: Any  # matplotlib Text, boxed


@dataclass
class DrawnEdge:
    """One drawn edge, parent to child, and whether it lies on the accepted path."""

    parent: int
    child: int  # BONUS for the edge into the bonus token
    highlighted: bool
    artist: Any  # matplotlib Line2D


@dataclass
class TreeDrawing:
    """What ``draw_tree`` put on its axes, so tests and notebooks can inspect it without pixels."""

    nodes: list[DrawnNode] = field(default_factory=list)
    edges: list[DrawnEdge] = field(default_factory=list)

    @property
    def highlighted(self) -> list[int]:
        """Tree nodes on the accepted path, root first (the bonus excluded)."""
        return [n.index for n in self.nodes if n.highlighted and n.index != BONUS]

    @property
    def bonus(self) -> DrawnNode | None:
        return next((n for n in self.nodes if n.index == BONUS), None)


def _rows(children: list[list[int]]) -> list[float]:
    """Row of every node: leaves numbered in depth-first order, a parent on its first child's row."""
    rows, next_leaf, stack = [0.0] * len(children), 0, [0]
    while stack:  # pre-order, first child on top
        node = stack.pop()
        if not children[node]:
            rows[node], next_leaf = float(next_leaf), next_leaf + 1
        stack.extend(reversed(children[node]))
    for node in reversed(range(len(children))):  # children come after parents: fill bottom-up
        if children[node]:
            rows[node] = rows[children[node][0]]
    return rows


def _label(token: int, tokenizer) -> str:
    if tokenizer is None:
        return str(token)
    text = tokenizer.decode([token])
    # Whitespace is most of what a code model drafts: make it visible, and keep boxes short.
    text = repr(text)[1:-1].replace(" ", "␣")
    return text if len(text) <= 12 else text[:11] + "…"


def _probs(tree: Tree, draft: Draft | None) -> list[float]:
    """exp(score): the path probability; with the draft, each node's own q_d(token)."""
    if draft is None:
        return tree.scores.float().exp().tolist()
    depths, tokens = tree.depths.tolist(), tree.tokens.tolist()
    rows = draft.log_probs.float().cpu()  # [L, vocab]
    return [1.0 if d == 0 else math.exp(float(rows[d - 1, t])) for d, t in zip(depths, tokens)]


def draw_tree(tree: Tree, verification: Verification | None = None, draft: Draft | None = None,
              tokenizer=None, ax=None):
    """Draw ``tree`` and return the matplotlib Figure (its axes carry ``.tree_drawing``).

    Shading is exp(``tree.scores``), the draft probability of the whole root path, or with
    ``draft`` the per-node conditional ``q_d(token)``. With ``verification`` the accepted path
    gets thick red edges and red outlines, and the bonus token a red node one depth after it.
    Labels are the decoded tokens when a ``tokenizer`` is given, else the ids.

    >>> fig = draw_tree(Tree(torch.tensor([5, 7, 8]), torch.tensor([-1, 0, 0]), torch.tensor([0, 1, 1]),
    ...                      torch.tensor([0.0, -0.3, -1.6])))                         # doctest: +SKIP
    >>> len(drawing_of(fig).nodes)                                                    # doctest: +SKIP
    3
    """
    try:
        # No matplotlib.use(): a notebook's inline backend must stay; headless runs fall back to Agg.
        import matplotlib.pyplot as plt
        from matplotlib.cm import ScalarMappable
        from matplotlib.colors import Normalize
    except ImportError as err:
        raise ImportError('drawing trees needs matplotlib: pip install -e ".[viz]"') from err

    n, parents = tree.size, tree.parents.tolist()
    path = list(verification.path) if verification is not None else []
    if any(not 0 <= i < n for i in path):
        raise ValueError(f"the verification's path {path} names nodes outside this tree of {n} nodes")
    children: list[list[int]] = [[] for _ in range(n + 1)]  # slot n: the bonus, if drawn
    for node in range(1, n):
        children[parents[node]].append(node)
    if path:  # the bonus is a new last child of the last accepted node: it gets its own row
        children[path[-1]].append(n)
    rows, depths = _rows(children), tree.depths.tolist()
    probs, tokens, on_path = _probs(tree, draft), tree.tokens.tolist(), set(path)

    bonus_depth = depths[path[-1]] + 1 if path else 0
    leaves, right = max(rows) + 1, max(*depths, bonus_depth)  # the bonus may stick out one depth
    own = ax is None
    if own:
        width = 1.1 * (right + 1) + 1.8
        _, ax = plt.subplots(figsize=(min(max(width, 4.0), 24.0), min(max(0.42 * leaves + 1.2, 2.6), 30.0)))
    fig, cmap, norm = ax.figure, plt.get_cmap("Blues"), Normalize(0.0, 1.0)
    drawing = TreeDrawing()

    def edge(parent: int, child: int, x: float, y: float, highlighted: bool, dashed: bool = False) -> None:
        (line,) = ax.plot([depths[parent], x], [rows[parent], y], zorder=1, linestyle="--" if dashed else "-",
                          color=ACCEPTED if highlighted else "0.6", linewidth=3.0 if highlighted else 1.0)
        drawing.edges.append(DrawnEdge(parent, child, highlighted, line))

    def box(index: int, token: int, label: str, x: float, y: float, prob: float, highlighted: bool,
            face) -> None:
        # parse_math=False: code tokens are full of "$" and "_" that mathtext would eat.
        text = ax.text(x, y, label, ha="center", va="center", zorder=3, fontsize=9, parse_math=False,
                       color="white" if prob > 0.6 else "black",
                       bbox=dict(boxstyle="round,pad=0.3", facecolor=face, linewidth=2.5 if highlighted else 0.6,
                                 edgecolor=ACCEPTED if highlighted else "0.4"))
        drawing.nodes.append(DrawnNode(index, token, label, x, y, prob, highlighted, text))

    for node in range(1, n):
        edge(parents[node], node, depths[node], rows[node], node in on_path and parents[node] in on_path)
    for node in range(n):
        box(node, tokens[node], _label(tokens[node], tokenizer), depths[node], rows[node], probs[node],
            node in on_path, cmap(norm(probs[node])))
    if path:
        last, bonus = path[-1], int(verification.bonus)
        edge(last, BONUS, bonus_depth, rows[n], True, dashed=True)
        box(BONUS, bonus, _label(bonus, tokenizer), bonus_depth, rows[n], math.nan, True, "#fde0dd")
        ax.annotate("bonus", (bonus_depth, rows[n]), xytext=(0, 11), textcoords="offset points",
                    ha="center", va="bottom", fontsize=7, color=ACCEPTED)

    ax.set_xlim(-0.6, right + 0.6)
    ax.set_ylim(leaves - 0.4, -0.6)  # row 0 on top: the first (most likely) child first
    ax.set_xticks(range(0, right + 1))
    ax.set_xlabel("depth (0: the root, the last round's bonus token)")
    ax.set_yticks([])
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    shade = "q_d(token)" if draft is not None else "path probability exp(score)"
    fig.colorbar(ScalarMappable(norm, cmap), ax=ax, fraction=0.03, pad=0.02).set_label(f"draft {shade}")
    title = f"{n - 1} draft nodes"
    if verification is not None:
        title += f", {verification.accepted} accepted, bonus '{_label(int(verification.bonus), tokenizer)}'"
    ax.set_title(title, fontsize=10)
    ax.tree_drawing = drawing
    if own:  # a caller's axes keep the caller's layout
        fig.tight_layout()
    return fig


def draw_round(record, tokenizer=None, ax=None):
    """``draw_tree`` of a recorded round (``RoundRecord``), shaded by the draft's q_d(token)."""
    return draw_tree(record.tree, record.verification, record.draft, tokenizer, ax)


def drawing_of(fig) -> TreeDrawing:
    """The ``TreeDrawing`` of the first axes of ``fig`` that holds a drawn tree."""
    for ax in fig.axes:
        if hasattr(ax, "tree_drawing"):
            return ax.tree_drawing
    raise ValueError("this figure holds no tree drawn by ddtree.viz.draw_tree")
