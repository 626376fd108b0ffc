"""The tree stage's graphed top-k on a GPU (run with ``pytest -m gpu``): ``TopK``'s CUDA graphs give
``torch.topk``'s values and tokens, ties in the same order, at the vocabularies and budgets the
issues time, and the best-first heap builds the same trees from them as from the op-by-op ``topk``.
"""

import numpy as np
import pytest
import torch

from ddtree.trees import BestFirstTreeBuilder
from ddtree.trees.topk import TopK
from ddtree.types import Draft

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _draft(seed: int, rows: int, vocab: int) -> torch.Tensor:
    """A drafter's float32 log-probs from bf16 logits (ties among them, as in the bf16 runs)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    logits = (3 * torch.randn(rows, vocab, device="cuda", generator=gen)).to(torch.bfloat16)
    return torch.log_softmax(logits.float(), -1)


@pytest.mark.parametrize("vocab", [151936, 248320])
def test_graphed_topk_equals_torch_topk(vocab):
    top = TopK()  # graphs on CUDA: a shape is recorded at its second use, replayed from then on
    shapes = [(15, 64), (15, 256), (7, 64), (15, 512), (1, 64)]
    for seed, (rows, k) in enumerate([shape for shape in shapes for _ in range(3)] + shapes):
        log_probs = _draft(seed, rows, vocab)
        values, tokens = top(log_probs, k)
        want_values, want_tokens = log_probs.topk(k, dim=-1)
        np.testing.assert_array_equal(tokens, want_tokens.cpu().numpy().reshape(-1))
        np.testing.assert_array_equal(values, want_values.double().cpu().numpy().reshape(-1))
    assert set(top._recorded) == set(shapes), "every shape recorded"
    assert all(recorded is not None for recorded in top._recorded.values()), "a recording fell back"


@pytest.mark.parametrize("budget", [64, 256])
def test_heap_trees_from_the_graphed_topk_equal_the_op_by_op_ones(budget):
    graphed, plain = BestFirstTreeBuilder(budget, method="heap"), BestFirstTreeBuilder(budget, method="heap")
    plain._topk = TopK(graphs=False)
    for seed in range(8):
        draft = Draft(_draft(100 + seed, 15, 248320))
        a, b = graphed.build(draft, root_token=seed), plain.build(draft, root_token=seed)
        for field in ("tokens", "parents", "depths", "scores"):
            assert torch.equal(getattr(a, field), getattr(b, field)), (seed, field)

