"""Per-stage wall clocks, injected into the loop rather than woven through it."""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator

import torch

from ddtree.types import StageTimes

STAGES = ("draft", "tree", "layout", "verify", "commit")


class StageTimer:
    """Sums wall time per stage. With ``sync`` set, CUDA work is finished before each reading,
    so a stage is charged for its own kernels (at the price of one synchronisation per stage).
    Without CUDA there is nothing to wait for, and ``sync`` is ignored.
    """

    def __init__(self, sync: bool | None = None) -> None:
        self.sync = torch.cuda.is_available() and (sync is None or bool(sync))
        self.totals = dict.fromkeys(STAGES, 0.0)

    def now(self) -> float:
        if self.sync:
            torch.cuda.synchronize()
        return time.perf_counter()

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        start = self.now()
        try:
            yield
        finally:
            self.totals[name] += self.now() - start

    def result(self) -> StageTimes:
        return StageTimes(**self.totals)
