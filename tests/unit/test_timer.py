"""The stage timer sums per-stage wall time, and asking it to synchronise is safe without CUDA."""

import time

import torch

from ddtree.metrics.timer import StageTimer


def test_stages_accumulate_and_sync_needs_cuda():
    timer = StageTimer(sync=True)
    assert timer.sync == torch.cuda.is_available()
    for _ in range(2):
        with timer.stage("verify"):
            time.sleep(0.01)
    times = timer.result()
    assert times.verify >= 0.02 and times.draft == 0.0
