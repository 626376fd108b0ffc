"""Each depth's k best draft tokens, as host arrays, in one copy from the device.

The best-first heap reads the top-k log-probs and tokens of every depth on the host. On a GPU,
``torch.topk`` over a row as wide as the vocabulary is some twenty kernel launches, and the values
and the tokens were two copies to the host, each a synchronisation. ``TopK`` runs the same
``topk`` (so the same ties in the same order) and packs both results into one float64 tensor
(a token id below 2^53 and a float32 value are exact in float64), copied to the host at once. On
CUDA it records that work as a CUDA graph per (depth, vocab, k) over a static input buffer, at a
shape's second use (a draft cut short near the end of a run is met once): each call is then a copy
of the draft into the buffer, one graph launch and one copy out.
"""

from __future__ import annotations

import logging

import numpy as np
import torch
from torch import Tensor

log = logging.getLogger(__name__)


def packed_topk(log_probs: Tensor, k: int) -> Tensor:
    """``[2, L, k]`` float64: each row's k largest entries of ``log_probs`` ``[L, V]`` (sorted, as
    ``topk`` orders them) and their column indices.

    >>> packed_topk(torch.tensor([[0.5, 2.0, 1.0]]), 2).tolist()
    [[[2.0, 1.0]], [[1.0, 2.0]]]
    """
    values, index = log_probs.topk(k, dim=-1)
    return torch.stack([values.double(), index.double()])


class TopK:
    """``topk`` of a draft's rows on the host: ``(values, tokens)``, float64 and int64 arrays of
    ``L * k`` entries (row-major), exactly ``log_probs.topk(k)``'s.

    ``graphs``: None (default) graphs on CUDA, runs ``packed_topk`` op by op elsewhere; True or False
    forces it (True on a CPU runs the recording code, as ``ddtree.testing.fake_cuda_graphs`` lets a
    test do). A shape whose recording fails is run op by op from then on (logged once).

    >>> values, tokens = TopK()(torch.tensor([[0.1, 0.7, 0.2], [0.6, 0.3, 0.1]]).log(), 2)
    >>> tokens.tolist(), values.round(3).tolist()
    ([1, 2, 0, 1], [-0.357, -1.609, -0.511, -1.204])
    """

    def __init__(self, graphs: bool | None = None) -> None:
        self.graphs = graphs
        self._static: Tensor | None = None  # [rows, V] the graphs' input; its first L rows are a draft's
        self._recorded: dict[tuple, tuple[torch.cuda.CUDAGraph, Tensor] | None] = {}
        self._seen: set[tuple] = set()  # (rows, k) met once: recorded at the second meeting

    @torch.inference_mode()  # the buffer is then the same kind of tensor whoever calls first
    def __call__(self, log_probs: Tensor, k: int) -> tuple[np.ndarray, np.ndarray]:
        graphs = log_probs.is_cuda if self.graphs is None else self.graphs
        host = (self._replay(log_probs, k) if graphs else packed_topk(log_probs, k)).cpu().numpy()
        return host[0].reshape(-1), host[1].reshape(-1).astype(np.int64)

    def _replay(self, log_probs: Tensor, k: int) -> Tensor:
        key = (log_probs.shape[0], k)
        if key not in self._recorded and key not in self._seen:  # met once (a draft cut near the end):
            self._seen.add(key)                                   # not worth a recording yet
            return packed_topk(log_probs, k)
        static = self._static
        if (static is None or static.shape[0] < key[0] or static.shape[1:] != log_probs.shape[1:]
                or static.dtype != log_probs.dtype or static.device != log_probs.device):
            static = self._static = torch.empty_like(log_probs)
            self._recorded.clear()  # recorded over the buffer just replaced
        view = static[: key[0]]
        view.copy_(log_probs)
        if key not in self._recorded:
            self._recorded[key] = self._record(view, k)
        recorded = self._recorded[key]
        if recorded is None:
            return packed_topk(log_probs, k)
        graph, out = recorded
        graph.replay()
        return out

    @staticmethod
    def _record(view: Tensor, k: int) -> tuple[torch.cuda.CUDAGraph, Tensor] | None:
        """``packed_topk(view, k)`` recorded once, after a warm-up, on a stream of the draft's own device
        (``torch.cuda.graph``'s default capture stream is shared by every graph of the process and
        lives on one device), or None where the recording fails."""
        try:
            stream = torch.cuda.Stream(device=view.device)
            stream.wait_stream(torch.cuda.current_stream(view.device))
            with torch.cuda.stream(stream):
                packed_topk(view, k)
            torch.cuda.current_stream(view.device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                out = packed_topk(view, k)
            return graph, out
        except RuntimeError as err:  # a topk this torch cannot record: op by op, as before
            log.warning("the tree's top-k runs op by op at %s rows, k=%d: its CUDA graph failed (%s)",
                        view.shape[0], k, (str(err).splitlines() or [""])[0])
            return None
