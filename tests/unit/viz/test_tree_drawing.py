"""draw_tree on small known trees: node count, the highlighted accepted path, the bonus node,
no overlapping siblings, and a chain. Checked on the figure's objects, not on pixels."""

import math

import pytest
import torch

pytest.importorskip("matplotlib")

from matplotlib.colors import to_rgba  # noqa: E402

from ddtree.testing import tiny_tokenizer  # noqa: E402
from ddtree.trees import ChainTreeBuilder  # noqa: E402
from ddtree.types import Draft, Tree, Verification  # noqa: E402
from ddtree.viz import draw_round, draw_tree, drawing_of  # noqa: E402
from ddtree.viz.tree import ACCEPTED, BONUS  # noqa: E402

RED = to_rgba(ACCEPTED)

#         0 (tok 10)
#        / \
#   1 (11)  2 (12)
#    |   \
#  3 (13) 4 (14)      accepted: 0 -> 1 -> 4, then the target's bonus 15
#    |
#  5 (16)
TREE = Tree(
    tokens=torch.tensor([10, 11, 12, 13, 14, 16]),
    parents=torch.tensor([-1, 0, 0, 1, 1, 3]),
    depths=torch.tensor([0, 1, 1, 2, 2, 3]),
    scores=torch.tensor([0.0, -0.2, -1.8, -0.9, -1.4, -1.5]),
)
ACCEPT = Verification(path=(0, 1, 4), tokens=(10, 11, 14), bonus=15)


def _is_red(edgecolor) -> bool:
    return tuple(edgecolor) == RED


def test_known_tree_renders_with_the_accepted_path_and_the_bonus(tmp_path):
    fig = draw_tree(TREE, ACCEPT)
    fig.savefig(tmp_path / "tree.png")
    assert (tmp_path / "tree.png").stat().st_size > 0

    drawing = drawing_of(fig)
    assert len(drawing.nodes) == TREE.size + 1  # every tree node and the bonus
    assert len(drawing.edges) == TREE.size  # n - 1 tree edges and the one into the bonus
    assert drawing.highlighted == [0, 1, 4]
    for node in drawing.nodes:
        patch = node.artist.get_bbox_patch()
        assert _is_red(patch.get_edgecolor()) == node.highlighted
        assert (patch.get_linewidth() > 1.0) == node.highlighted
    assert {(e.parent, e.child) for e in drawing.edges if e.highlighted} == {(0, 1), (1, 4), (4, BONUS)}
    for e in drawing.edges:
        assert (tuple(to_rgba(e.artist.get_color())) == RED) == e.highlighted

    bonus = drawing.bonus
    assert bonus is not None and bonus.token == 15 and bonus.label == "15" and bonus.highlighted
    assert bonus.x == 3  # one depth after the last accepted node (depth 2)
    assert [n.label for n in drawing.nodes if n.index >= 0] == ["10", "11", "12", "13", "14", "16"]


def test_layout_gives_every_node_its_own_place_and_depth_runs_left_to_right():
    drawing = drawing_of(draw_tree(TREE, ACCEPT))
    places = [(n.x, n.y) for n in drawing.nodes]
    assert len(set(places)) == len(places)
    by_index = {n.index: n for n in drawing.nodes}
    assert [by_index[i].x for i in range(TREE.size)] == TREE.depths.tolist()
    # Leaves (5, 4's bonus, 2) take rows top to bottom in depth-first order; a parent sits on
    # its first child's row, so the first-child line 0 -> 1 -> 3 -> 5 is one straight row.
    assert by_index[5].y < by_index[BONUS].y < by_index[2].y
    assert by_index[0].y == by_index[1].y == by_index[3].y == by_index[5].y
    assert by_index[4].y == by_index[BONUS].y


def test_shading_is_path_probability_or_the_drafts_conditional_q():
    drawing = drawing_of(draw_tree(TREE))
    assert [n.prob for n in drawing.nodes] == pytest.approx(TREE.scores.exp().tolist())
    assert drawing.bonus is None and drawing.highlighted == []

    log_probs = torch.log_softmax(torch.randn(3, 20, generator=torch.Generator().manual_seed(0)), -1)
    drawing = drawing_of(draw_tree(TREE, ACCEPT, draft=Draft(log_probs)))
    for n in drawing.nodes:
        if n.index == BONUS:
            assert math.isnan(n.prob)
        elif n.index > 0:
            depth, token = TREE.depths[n.index].item(), TREE.tokens[n.index].item()
            assert n.prob == pytest.approx(log_probs[depth - 1, token].exp().item())


def test_a_dflash_chain_draws_in_one_row(tmp_path):
    draft = Draft(torch.log_softmax(torch.randn(5, 30, generator=torch.Generator().manual_seed(1)), -1))
    chain = ChainTreeBuilder().build(draft, root_token=3)
    verification = Verification(path=(0, 1, 2), tokens=tuple(chain.tokens[:3].tolist()), bonus=7)

    class Record:  # what engine.generate(record=True) keeps per round
        pass

    record = Record()
    record.tree, record.verification, record.draft = chain, verification, draft
    fig = draw_round(record)
    fig.savefig(tmp_path / "chain.png")
    drawing = drawing_of(fig)
    assert len(drawing.nodes) == chain.size + 1
    assert {n.y for n in drawing.nodes if n.index != BONUS} == {0.0}  # one row
    assert drawing.highlighted == [0, 1, 2]
    assert (drawing.bonus.x, drawing.bonus.y) == (3, 1.0)  # beside the rejected node 3, one row down


def test_labels_decode_with_a_tokenizer_and_draw_into_a_given_axes(tmp_path):
    import matplotlib.pyplot as plt

    tok = tiny_tokenizer(96)
    ids = tok.encode("a $\n", add_special_tokens=False)  # "$" would start mathtext; " " and "\n" are invisible
    tree = Tree(torch.tensor(ids), torch.tensor([-1, 0, 1, 2]), torch.tensor([0, 1, 2, 3]), torch.zeros(4))
    fig, (left, right) = plt.subplots(1, 2)
    assert draw_tree(tree, tokenizer=tok, ax=right) is fig
    fig.savefig(tmp_path / "labels.png")
    assert not hasattr(left, "tree_drawing")
    assert [n.label for n in right.tree_drawing.nodes] == ["a", "␣", "$", "\\n"]


def test_a_path_outside_the_tree_is_an_error():
    with pytest.raises(ValueError, match="outside this tree"):
        draw_tree(TREE, Verification(path=(0, 9), tokens=(10, 0), bonus=1))
