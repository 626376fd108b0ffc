"""Figures of recorded rounds (``ddtree.metrics.rounds``): acceptance per depth and rank, the
drafter's calibration, and the budget curve read off one run against measured runs.

    >>> fig = plot_depth_rank(depth_rank(traces).rate, "acceptance rate")                 # doctest: +SKIP
    >>> fig = plot_calibration({"rank 0": calibration(traces, ranks=[0])})                 # doctest: +SKIP
    >>> fig = plot_budget_estimate({16: 3.9, 64: 4.5}, measured={16: 3.8, 64: 4.6})       # doctest: +SKIP
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from ddtree.viz.plots import _pyplot


def plot_depth_rank(values: np.ndarray, label: str, title: str = "", fmt: str = "{:.2f}", cmap: str = "viridis"):
    """A depth x rank heat map (``[depths, ranks]``, depth 1 in row 0), each cell printed; NaN cells blank.
    The last rank column holds that rank and every rank after it."""
    plt = _pyplot()
    depths, ranks = values.shape
    fig, ax = plt.subplots(figsize=(1.0 + 0.7 * ranks, 0.9 + 0.36 * depths))
    image = ax.imshow(np.ma.masked_invalid(values), cmap=cmap, aspect="auto")
    for (d, r), v in np.ndenumerate(values):
        if not np.isnan(v) and v != 0:
            ax.text(r, d, fmt.format(v), ha="center", va="center", fontsize=7,
                    color="white" if v < 0.6 * np.nanmax(values) else "black")
    ax.set_xticks(range(ranks), [str(r) for r in range(ranks - 1)] + [f"{ranks - 1}+"])
    ax.set_yticks(range(depths), [str(d + 1) for d in range(depths)])
    ax.set_xlabel("rank of the token in the draft at its depth (0: top-1)")
    ax.set_ylabel("depth")
    fig.colorbar(image, ax=ax, label=label)
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def plot_calibration(curves: Mapping[str, object], title: str = ""):
    """Reliability curves: the drafter's stated q against how often the target took the token,
    one line per ``Calibration`` (empty bins left out); the diagonal is a calibrated drafter."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(4.8, 4.2))
    ax.plot([0, 1], [0, 1], ":", color="grey", label="calibrated")
    for name, cal in curves.items():
        full = cal.count > 0
        ax.plot(cal.stated[full], cal.hit_rate[full], "o-", markersize=4,
                label=f"{name} (n={int(cal.count.sum())}, ECE {cal.error:.3f})")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    return _finish(fig, ax, "drafter's probability q of the token", "fraction the target took (T = 0)", title)


def plot_budget_estimate(estimated: Mapping[int, float], measured: Mapping[int, float] | None = None,
                         chain: tuple[float, float | None] | None = None, title: str = ""):
    """tau per budget read off one run (``estimated``: budget -> tau) against runs at those budgets
    (``measured``); ``chain``: (estimated, measured) tau of the chain, drawn flat."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.4, 3.8))
    budgets = sorted(estimated)
    ax.plot(budgets, [estimated[b] for b in budgets], "-", color="C0", label="DDTree, read off one run")
    if measured:
        points = sorted(measured)
        ax.plot(points, [measured[b] for b in points], "o", color="C3", label="DDTree, run at that budget")
    if chain:
        ax.axhline(chain[0], color="C1", linestyle="--", label="chain, read off the same run")
        if chain[1] is not None:
            ax.axhline(chain[1], color="C1", linestyle=":", label="DFlash chain, run")
    ax.set_xscale("log", base=2)
    ticks = [b for b in budgets if b & (b - 1) == 0]
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.minorticks_off()
    return _finish(fig, ax, "node budget B", "mean acceptance length τ", title)


def _finish(fig, ax, xlabel: str, ylabel: str, title: str):
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig
