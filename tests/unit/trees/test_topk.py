"""``TopK`` gives ``torch.topk``'s values and tokens, ties in the same order, op by op and from its
recorded graphs (run on the CPU by ``fake_cuda_graphs``: the recording logic, the buffer reuse)."""

import numpy as np
import pytest
import torch

from ddtree.testing import fake_cuda_graphs
from ddtree.trees import BestFirstTreeBuilder
from ddtree.trees.topk import TopK
from ddtree.types import Draft


def _tied(seed: int, rows: int, vocab: int) -> torch.Tensor:
    """Log-probs from coarse logits (quarters, as low-precision logits are): few distinct values, so
    many ties in every row, among the top ones too."""
    g = torch.Generator().manual_seed(seed)
    logits = (8 * torch.randn(rows, vocab, generator=g)).round() / 4
    return torch.log_softmax(logits, -1)


def _reference(log_probs: torch.Tensor, k: int) -> tuple[np.ndarray, np.ndarray]:
    values, index = log_probs.topk(k, dim=-1)
    return values.double().numpy().reshape(-1), index.numpy().reshape(-1)


@pytest.mark.parametrize("graphs", [False, True])
def test_topk_equals_torch_topk_with_ties_over_changing_shapes(graphs):
    top = TopK(graphs=graphs)
    # depths as a run's drafts come (full, then cut near the end, then full again) and several k
    shapes = [(6, 500, 8), (6, 500, 8), (6, 500, 8), (3, 500, 8), (6, 500, 64), (6, 500, 64), (1, 500, 8),
              (6, 500, 8), (8, 500, 8), (8, 500, 8), (6, 500, 8), (6, 700, 5), (6, 700, 5)]
    with fake_cuda_graphs(replay=True):
        for seed, (rows, vocab, k) in enumerate(shapes):
            log_probs = _tied(seed, rows, vocab)
            assert all(len(np.unique(row)) < vocab // 2 for row in log_probs.numpy())  # ties abound in each row
            values, tokens = top(log_probs, k)
            want_values, want_tokens = _reference(log_probs, k)
            assert values.dtype == np.float64 and tokens.dtype == np.int64
            np.testing.assert_array_equal(tokens, want_tokens)
            np.testing.assert_array_equal(values, want_values)
    if graphs:  # one buffer of the most rows seen; a shape is recorded at its second use on that buffer
        assert top._static.shape == (6, 700) and set(top._recorded) == {(6, 5)}
        assert {(3, 8), (1, 8)} <= top._seen


def test_the_buffer_serves_calls_in_and_out_of_inference_mode():
    """A buffer made under ``torch.inference_mode`` (the loop's) still serves a later call outside it."""
    top = TopK(graphs=True)
    log_probs = _tied(3, 4, 300)
    with fake_cuda_graphs(replay=True):
        with torch.inference_mode():
            top(log_probs, 8)
            top(log_probs, 8)
        values, tokens = top(log_probs, 8)
    np.testing.assert_array_equal(tokens, _reference(log_probs, 8)[1])
    assert (4, 8) in top._recorded


def test_a_failed_recording_runs_op_by_op(monkeypatch, caplog):
    """Where the recording fails, that shape runs ``packed_topk`` op by op, with a warning once."""
    top = TopK(graphs=True)

    def refuse(*args, **kwargs):
        raise RuntimeError("operation not permitted when stream is capturing")

    log_probs = _tied(0, 4, 300)
    real = torch.cuda.CUDAGraph
    with fake_cuda_graphs(replay=True), monkeypatch.context() as patch:  # undone before the fake graphs are
        patch.setattr(torch.cuda, "CUDAGraph", refuse)
        values, tokens = top(log_probs, 16)
        again = top(log_probs, 16)
    assert torch.cuda.CUDAGraph is real
    np.testing.assert_array_equal(tokens, _reference(log_probs, 16)[1])
    np.testing.assert_array_equal(again[0], values)
    assert top._recorded == {(4, 16): None} and "runs op by op" in caplog.text


def test_heap_trees_are_the_same_from_the_graphed_topk():
    """The best-first heap through ``TopK``'s graphs builds the tree the op-by-op ``topk`` builds, ties
    included, over a run's worth of drafts on one builder."""
    graphed, plain = BestFirstTreeBuilder(24, method="heap"), BestFirstTreeBuilder(24, method="heap")
    graphed._topk, plain._topk = TopK(graphs=True), TopK(graphs=False)
    with fake_cuda_graphs(replay=True):
        for seed in range(12):
            draft = Draft(_tied(seed, 5 if seed % 4 else 2, 400))
            a, b = graphed.build(draft, root_token=seed), plain.build(draft, root_token=seed)
            for field in ("tokens", "parents", "depths", "scores"):
                assert torch.equal(getattr(a, field), getattr(b, field)), (seed, field)


def test_a_bad_graphs_setting_is_refused():
    with pytest.raises(ValueError, match="graphs must be null"):
        BestFirstTreeBuilder(16, graphs="yes")
