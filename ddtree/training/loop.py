"""The optimisation loop every trainer here shares: AdamW, warmup + cosine, grad clip, budgets.

A run stops at ``max_steps`` or ``max_seconds``, whichever comes first, and the learning-rate
schedule runs on the same clock: progress = max(step / max_steps, elapsed / max_seconds). A
run bounded by steps is therefore exactly reproducible, and a run bounded by time still warms
up, decays to the floor and ends on schedule, however fast the machine is.

    >>> w = torch.nn.Parameter(torch.ones(3))
    >>> result = train_loop([w], lambda step: (w ** 2).sum(), Budget(max_steps=20), OptimConfig(lr=0.1), log=None)
    >>> result.steps, result.losses[-1] < result.losses[0]
    (20, True)
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

import torch
from torch import Tensor


@dataclass(frozen=True)
class Budget:
    """Stop after ``max_steps`` optimiser steps or ``max_seconds`` of wall time."""

    max_steps: int = 1_000_000
    max_seconds: float = float("inf")

    def __post_init__(self) -> None:
        if self.max_steps < 1 or self.max_seconds <= 0:
            raise ValueError(f"a budget needs max_steps >= 1 and max_seconds > 0, got {self}")
        if math.isinf(self.max_seconds) and self.max_steps >= 1_000_000:
            raise ValueError("set max_steps or max_seconds: an unbounded run would never stop")

    def progress(self, step: int, elapsed: float) -> float:
        return max(step / self.max_steps, elapsed / self.max_seconds)


@dataclass(frozen=True)
class OptimConfig:
    """AdamW with linear warmup then cosine decay to ``min_lr_ratio * lr`` (the DFlash recipe)."""

    lr: float = 6e-4
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.95)
    warmup_ratio: float = 0.04
    min_lr_ratio: float = 0.0
    grad_clip: float = 1.0

    def lr_at(self, progress: float) -> float:
        """The learning rate at ``progress`` in [0, 1].

        >>> cfg = OptimConfig(lr=1.0, warmup_ratio=0.5)
        >>> cfg.lr_at(0.25), cfg.lr_at(0.5), round(cfg.lr_at(1.0), 6)
        (0.5, 1.0, 0.0)
        """
        if progress < self.warmup_ratio:
            return self.lr * progress / self.warmup_ratio
        decay = (progress - self.warmup_ratio) / max(1.0 - self.warmup_ratio, 1e-8)
        cosine = 0.5 * (1.0 + math.cos(math.pi * min(decay, 1.0)))
        return self.lr * (self.min_lr_ratio + (1.0 - self.min_lr_ratio) * cosine)


@dataclass
class TrainResult:
    steps: int = 0
    seconds: float = 0.0
    losses: list[float] = field(default_factory=list)  # one per logged step
    logged_steps: list[int] = field(default_factory=list)


def autocast(device: torch.device | str, dtype: torch.dtype | None = None):
    """bf16 autocast on CUDA (or when ``dtype`` asks for it); a no-op context otherwise."""
    device = torch.device(device)
    if dtype is None and device.type == "cuda":
        dtype = torch.bfloat16
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def make_optimizer(params: list[torch.nn.Parameter], cfg: OptimConfig) -> torch.optim.AdamW:
    """AdamW; matrices decay, norms and vectors do not (the usual GPT split)."""
    decay = [p for p in params if p.ndim >= 2]
    rest = [p for p in params if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": rest, "weight_decay": 0.0}]
    fused = all(p.is_cuda for p in params)  # the fused kernel is CUDA-only
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, fused=fused or None)


def train_loop(
    params: Iterable[torch.nn.Parameter],
    loss_fn: Callable[[int], Tensor],
    budget: Budget,
    cfg: OptimConfig,
    log_every: int = 50,
    log: Callable[[str], None] | None = print,
    on_log: Callable[[int, float], None] | None = None,
) -> TrainResult:
    """Minimise ``loss_fn(step)`` (a scalar, built under autocast by the caller) over ``params``.

    ``on_log(step, loss)`` runs at every logged step (evaluation, best-checkpoint keeping).
    """
    params = [p for p in params if p.requires_grad]
    if not params:
        raise ValueError("no trainable parameters: nothing to optimise")
    optimizer = make_optimizer(params, cfg)
    result, start, step, loss = TrainResult(), time.perf_counter(), 0, None

    def record(lr: float) -> None:
        value = float(loss.detach())  # the only host sync of the loop
        result.losses.append(value)
        result.logged_steps.append(step)
        if log:
            log(f"  step {step:6d}  loss {value:.4f}  lr {lr:.2e}  {time.perf_counter() - start:7.1f}s")
        if on_log:
            on_log(step, value)

    while (progress := budget.progress(step, time.perf_counter() - start)) < 1.0:
        lr = cfg.lr_at(progress)
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss = loss_fn(step)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        if step % log_every == 0 or step == 1:
            record(lr)
    if loss is not None and result.logged_steps[-1:] != [step]:
        record(lr)  # the final step is always logged
    result.steps, result.seconds = step, time.perf_counter() - start
    return result
