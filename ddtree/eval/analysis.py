"""Why a tree wins, from run directories: the recorded rounds of one wide DDTree run (``record_rounds``)
against the runs actually made at smaller budgets and with the chain, plus per-(depth, rank) and
calibration tables. ``make_tables.py --rounds`` writes them; the notebook
``why_the_tree_wins.ipynb`` draws them.

    >>> runs = load_runs(["outputs/main/record_rounds=true/"])                     # doctest: +SKIP
    >>> source = widest_recorded(runs)                                             # doctest: +SKIP
    >>> print(budget_markdown(budget_rows(source, runs)))                          # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ddtree.eval.tables import Run
from ddtree.metrics import mean_of_means
from ddtree.metrics.rounds import DepthRank, RoundTrace, estimate_budget, estimate_chain, recorded, traces_of

CHAIN_METHODS = ("dflash",)  # runs whose tree is the chain of the recorded run's drafter


def traces(run: Run, keys: set[str] | None = None) -> dict[str, list[RoundTrace]]:
    """Response key -> its round traces, for the run's responses that carry rounds (and are in ``keys``)."""
    out = {r["key"]: traces_of(r) for r in run.records if keys is None or r["key"] in keys}
    return {k: v for k, v in out.items() if v}


def widest_recorded(runs: Sequence[Run]) -> Run | None:
    """The DDTree run at T = 0 with the largest budget whose records carry rounds."""
    found = [r for r in runs if r.method == "ddtree" and r.temperature == 0 and r.budget and traces(r)]
    return max(found, key=lambda r: r.budget, default=None)


@dataclass(frozen=True)
class BudgetRow:
    """tau of one tree read off the recorded run, against the run made with that tree, on the same responses."""

    name: str  # "B=16", "chain"
    budget: int | None
    estimated: float
    measured: float | None  # None: no such run
    responses: int
    rounds: int
    censored: int  # rounds where the estimate is a lower bound
    ties: int  # rounds with tied draft log-probs (the smaller tree may take another tied token)

    @property
    def error(self) -> float | None:
        return None if self.measured is None else self.estimated - self.measured


def _same(source: Run, run: Run) -> bool:
    return (run.dataset, run.model, run.temperature) == (source.dataset, source.model, source.temperature)


def budget_rows(source: Run, runs: Sequence[Run], budgets: Sequence[int] = ()) -> list[BudgetRow]:
    """One row per budget (``budgets``, every measured DDTree budget up to the source's, the source's
    own) and one for the chain; each compares on the responses both runs hold."""
    recorded_traces = traces(source)
    measured = {r.budget: r for r in runs if r.method == "ddtree" and _same(source, r) and r.budget <= source.budget}
    chain_run = next((r for r in runs if r.method in CHAIN_METHODS and _same(source, r)), None)
    rows = []
    for b in sorted({*budgets, *measured, source.budget}):
        rows.append(_row(f"B={b}", b, recorded_traces, measured.get(b), lambda t, b=b: estimate_budget(t, b)))
    rows.append(_row("chain", None, recorded_traces, chain_run, estimate_chain))
    return rows


def _row(name, budget, recorded_traces, run: Run | None, estimate) -> BudgetRow:
    keys = set(recorded_traces) if run is None else set(recorded_traces) & {r["key"] for r in run.records}
    responses = [recorded_traces[k] for k in sorted(keys)]
    est = estimate(responses)
    measured = None if run is None else mean_of_means(r["acceptance_lengths"] for r in run.records if r["key"] in keys)
    return BudgetRow(name, budget, est.tau, measured, len(responses), est.rounds, est.censored, est.ties)


def budget_markdown(rows: Sequence[BudgetRow], title: str = "") -> str:
    """Estimated against measured tau, with the difference."""
    lines = [f"**{title}**", ""] if title else []
    lines += ["| tree | τ read off the wide run | τ of the run at that tree | difference | responses | rounds "
              "| lower bounds | tied rounds |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        m = "–" if r.measured is None else f"{r.measured:.2f}"
        e = "–" if r.error is None else f"{r.error:+.2f}"
        lines.append(f"| {r.name} | {r.estimated:.2f} | {m} | {e} | {r.responses} | {r.rounds} | {r.censored} "
                     f"| {r.ties} |")
    return "\n".join(lines) + "\n"


def grid_markdown(values: np.ndarray, fmt: str = "{:.2f}", title: str = "") -> str:
    """A depth x rank array as a markdown table (depth 1 first; the last column: that rank and beyond)."""
    depths, ranks = values.shape
    lines = [f"**{title}**", ""] if title else []
    lines.append("| depth | " + " | ".join([str(r) for r in range(ranks - 1)] + [f"{ranks - 1}+"]) + " |")
    lines.append("|---:|" + "---:|" * ranks)
    for d in range(depths):
        cells = ["–" if np.isnan(v) else fmt.format(v) for v in values[d]]
        lines.append(f"| {d + 1} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def depth_rank_markdown(table: DepthRank, title: str = "") -> str:
    """Acceptance rate (accepted / tested) per depth and rank, and the tested counts."""
    return grid_markdown(table.rate, title=f"{title}: acceptance rate" if title else "acceptance rate") + "\n" + \
        grid_markdown(table.tested.astype(float), fmt="{:.0f}", title="tested nodes (parent on the accepted path)")


def recorded_tau(source: Run) -> float:
    """The wide run's own tau over its responses with rounds."""
    return recorded(list(traces(source).values())).tau
