"""The shared optimisation loop: schedule, budgets, clipping, loss goes down."""

import pytest
import torch

from ddtree.training.loop import Budget, OptimConfig, autocast, train_loop


def test_warmup_then_cosine_to_the_floor():
    cfg = OptimConfig(lr=1.0, warmup_ratio=0.04, min_lr_ratio=0.1)
    assert cfg.lr_at(0.0) == 0.0 and cfg.lr_at(0.02) == pytest.approx(0.5) and cfg.lr_at(0.04) == pytest.approx(1.0)
    assert cfg.lr_at(0.52) == pytest.approx(0.55)  # half way through the decay: floor + half the span
    assert cfg.lr_at(1.0) == pytest.approx(0.1)
    lrs = [cfg.lr_at(p / 100) for p in range(4, 101)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))


def test_budget_progress_takes_the_binding_limit():
    assert Budget(max_steps=10, max_seconds=100).progress(5, 10.0) == 0.5
    assert Budget(max_steps=10, max_seconds=100).progress(1, 80.0) == 0.8
    with pytest.raises(ValueError, match="unbounded"):
        Budget()
    with pytest.raises(ValueError):
        Budget(max_steps=0)


def test_loop_minimises_and_stops_on_steps_or_time():
    w = torch.nn.Parameter(torch.full((4,), 3.0))
    result = train_loop([w], lambda step: ((w - 1) ** 2).sum(), Budget(max_steps=200), OptimConfig(lr=0.1), log=None)
    assert result.steps == 200 and result.logged_steps[-1] == 200
    assert result.losses[-1] < 1e-2 * result.losses[0]
    w2 = torch.nn.Parameter(torch.ones(2))
    timed = train_loop([w2], lambda step: (w2**2).sum(), Budget(max_seconds=0.2), OptimConfig(), log=None)
    assert timed.seconds < 2.0 and timed.steps >= 1


def test_autocast_is_a_no_op_on_cpu_unless_asked():
    with autocast("cpu"):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32
    with autocast("cpu", torch.bfloat16):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
