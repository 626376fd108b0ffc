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


def test_each_round_keeps_its_own_stage_times_and_they_add_up_to_the_totals():
    timer = StageTimer()
    for sleep in (0.002, 0.004):
        with timer.stage("draft"):
            time.sleep(sleep)
        with timer.stage("verify"):
            time.sleep(sleep)
        timer.end_round()
    first, second = timer.rounds
    assert first.draft >= 0.002 and second.draft >= 0.004 and first.tree == 0.0
    totals = timer.result()
    assert abs(first.verify + second.verify - totals.verify) < 1e-12


def test_a_generation_reports_every_round_s_stage_times():
    from ddtree import SpeculativeEngine
    from ddtree.drafters import NullDrafter
    from ddtree.models import HFTarget
    from ddtree.testing import tiny_target
    from ddtree.trees import ChainTreeBuilder

    engine = SpeculativeEngine(HFTarget(tiny_target()), NullDrafter(), ChainTreeBuilder())
    result = engine.generate(torch.tensor([5, 6, 7]), max_new_tokens=4)
    assert len(result.round_stage_times) == len(result.acceptance_lengths) == 3
    assert abs(sum(r.verify for r in result.round_stage_times) - result.stage_times.verify) < 1e-9
