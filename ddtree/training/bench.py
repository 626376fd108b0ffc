"""AR, MTP, DFlash and DDTree on one pair, through the one engine: tau, tokens/s and speedup.

Speedup follows the papers' protocol: mean TPOT of AR over mean TPOT of the method, at the
same temperature, decode time excluding prefill and the draft prefill. Strategies take turns
on every prompt (rather than one strategy over all prompts, then the next), so load that
drifts on a shared machine spreads over all of them alike.

    >>> rows = benchmark(model, strategies(model, dflash, mtp), prompts, (0.0, 1.0), 64)   # doctest: +SKIP
    >>> print(format_table(rows))                                                       # doctest: +SKIP
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

from ddtree.drafters import DFlashDrafter, NullDrafter
from ddtree.engine import SpeculativeEngine
from ddtree.masks import DenseMaskCompiler
from ddtree.metrics import mean_of_means
from ddtree.models import HFTarget
from ddtree.trees import BestFirstTreeBuilder, ChainTreeBuilder
from ddtree.verifiers import GreedyVerifier, SamplingVerifier


@dataclass(frozen=True)
class Strategy:
    name: str
    drafter: Callable[[HFTarget], object]  # target -> Drafter
    tree: object  # TreeBuilder


def strategies(dflash=None, mtp=None, budgets: Sequence[int] = (16, 32, 64), mtp_steps: int = 3) -> list[Strategy]:
    """AR always; MTP when a head is given; DFlash and DDTree (one per budget) with a drafter."""
    out = [Strategy("ar", lambda target: NullDrafter(), ChainTreeBuilder())]
    if mtp is not None:
        from ddtree.drafters.mtp import MTPDrafter

        out.append(Strategy("mtp", lambda target: MTPDrafter(mtp, target, steps=mtp_steps), ChainTreeBuilder()))
    if dflash is not None:
        out.append(Strategy("dflash", lambda target: DFlashDrafter(dflash, target), ChainTreeBuilder()))
        out += [Strategy(f"ddtree-{b}", lambda target: DFlashDrafter(dflash, target), BestFirstTreeBuilder(b))
                for b in budgets]
    return out


@dataclass(frozen=True)
class Row:
    strategy: str
    temperature: float
    tau: float  # mean over responses of the per-response mean acceptance length
    tokens_per_second: float  # output tokens over decode time, all responses pooled
    tpot: float  # mean over responses of the time per output token (s)
    speedup: float  # mean TPOT(AR) / mean TPOT(this), same temperature
    responses: int


def benchmark(model, plan: Sequence[Strategy], prompts: Sequence[Sequence[int]], temperatures: Sequence[float],
              max_new_tokens: int, stop_token_ids: Sequence[int] = (), seed: int = 0,
              max_seconds: float = float("inf"), log: Callable[[str], None] | None = None) -> list[Row]:
    """Decode every prompt with every strategy at every temperature; one Row per (strategy, T).

    Stops taking new prompts after ``max_seconds`` (all rows still cover the same prompts, at
    least one).
    """
    target = HFTarget(model)

    def engine(s: Strategy, t: float) -> SpeculativeEngine:
        # Built per call: engines are cheap, and each sets the target's taps for its own drafter
        # (MTP taps the final norm, DFlash inner layers), which one shared target cannot hold at once.
        verifier = GreedyVerifier() if t == 0 else SamplingVerifier(t)
        return SpeculativeEngine(target, s.drafter(target), s.tree, DenseMaskCompiler(), verifier,
                                 stop_token_ids=stop_token_ids)

    keys = [(s, t) for t in temperatures for s in plan]
    for s, t in keys:  # warm-up: lazy initialisation is nobody's decode time
        engine(s, t).generate(prompts[0], max_new_tokens=min(8, max_new_tokens), seed=seed)
    results: dict[tuple[str, float], list] = {(s.name, t): [] for s, t in keys}
    start = time.perf_counter()
    for i, prompt in enumerate(prompts):
        if i > 0 and time.perf_counter() - start > max_seconds:  # every row covers at least one prompt
            if log:
                log(f"  time limit: {i} of {len(prompts)} prompts decoded")
            break
        for s, t in keys:
            results[s.name, t].append(engine(s, t).generate(prompt, max_new_tokens=max_new_tokens, seed=seed + i))
        if log:
            log(f"  prompt {i + 1}/{len(prompts)}  {time.perf_counter() - start:6.1f}s")
    return _rows(results, plan, temperatures)


def _rows(results: dict, plan: Sequence[Strategy], temperatures: Sequence[float]) -> list[Row]:
    rows = []
    for t in temperatures:
        base = _mean([r.time_per_output_token for r in results[plan[0].name, t]])
        for s in plan:
            res = results[s.name, t]
            tpot = _mean([r.time_per_output_token for r in res])
            tokens, seconds = sum(len(r.tokens) for r in res), sum(r.decode_time for r in res)
            rows.append(Row(s.name, t, mean_of_means(r.acceptance_lengths for r in res),
                            tokens / seconds if seconds > 0 else float("nan"), tpot,
                            base / tpot if tpot > 0 else float("nan"), len(res)))
    return rows


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def format_table(rows: Sequence[Row], title: str = "") -> str:
    """A plain-text table: one line per (strategy, temperature)."""
    lines = [title] if title else []
    lines.append(f"{'strategy':<12} {'T':>4} {'tau':>6} {'tok/s':>9} {'speedup':>8} {'n':>4}")
    for r in rows:
        lines.append(f"{r.strategy:<12} {r.temperature:>4.1f} {r.tau:>6.2f} {r.tokens_per_second:>9.1f} "
                     f"{r.speedup:>7.2f}x {r.responses:>4}")
    return "\n".join(lines)
