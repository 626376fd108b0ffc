"""Per-stage wall clocks, injected into the loop rather than woven through it."""

from __future__ import annotations

import time
from contextlib import contextmanager, nullcontext
from typing import Iterator

import torch

from ddtree.types import StageTimes

STAGES = ("draft", "tree", "layout", "verify", "commit")


class StageTimer:
    """Sums wall time per stage. With ``sync`` set, CUDA work is finished before each reading,
    so a stage is charged for its own kernels (at the price of one synchronisation per stage).
    Without CUDA there is nothing to wait for, and ``sync`` is ignored. Under ``torch.profiler`` each
    stage is also a named range, ``stage:<name>``, so a trace shows which stage every op ran in
    (``experiments/round_profile.py --loop`` sums them); without a profiler no range is opened.
    """

    def __init__(self, sync: bool | None = None) -> None:
        self.sync = torch.cuda.is_available() and (sync is None or bool(sync))
        self.totals = dict.fromkeys(STAGES, 0.0)
        self.rounds: list[StageTimes] = []  # each finished round's own stage times (``end_round``)
        self._round_start = dict(self.totals)

    def now(self) -> float:
        if self.sync:
            torch.cuda.synchronize()
        return time.perf_counter()

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        named = torch.profiler.record_function(f"stage:{name}") if torch.autograd.profiler._is_profiler_enabled \
            else nullcontext()
        with named:
            start = self.now()
            try:
                yield
            finally:
                self.totals[name] += self.now() - start

    def end_round(self) -> None:
        """Close a round: its stage times (what each stage gained since the last call) join ``rounds``."""
        self.rounds.append(StageTimes(**{k: v - self._round_start[k] for k, v in self.totals.items()}))
        self._round_start = dict(self.totals)

    def result(self) -> StageTimes:
        return StageTimes(**self.totals)


def graphed_us(fn, reps: int) -> float:
    """Microseconds per call of ``fn`` on the current CUDA device: ``reps`` calls captured in one CUDA
    graph, the median of five replays. Kernel time without launch gaps (a graph replays its kernels
    back to back), which is what a graphed verify pays; ``fn`` must be capturable."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(1e3 * start.elapsed_time(end) / reps)
    return sorted(times)[2]
