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


def test_a_stage_is_a_named_range_under_the_profiler_and_nothing_without_it():
    from torch.profiler import ProfilerActivity, profile

    timer = StageTimer()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with timer.stage("tree"):
            torch.ones(4).sum()
    ranges = [e for e in prof.events() if e.name == "stage:tree"]
    assert len(ranges) == 1
    assert any(e.name == "aten::sum" and e.cpu_parent is ranges[0] for e in prof.events())
    with timer.stage("layout"):  # no profiler: no range is opened
        assert not torch.autograd.profiler._is_profiler_enabled
