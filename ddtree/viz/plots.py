"""The paper's figures: tau and speedup against the node budget (Fig. 3), and the acceptance-length
histogram (Fig. 4); and where a round's time goes, stage by stage (``plot_stage_times``). matplotlib is an optional extra (``pip install -e ".[viz]"``), imported here
only when a figure is drawn.

    >>> fig = plot_budget_tradeoff([16, 64, 256], tau=[8.6, 9.8, 10.4], speedup=[6.1, 7.0, 7.4],
    ...                            baseline={"tau": 7.79, "speedup": 5.56})          # doctest: +SKIP
    >>> fig.savefig("fig3.png")                                                       # doctest: +SKIP
"""

from __future__ import annotations

from typing import Mapping, Sequence

from ddtree.metrics.timer import STAGES


def _pyplot():
    try:
        import matplotlib.pyplot as plt  # headless runs fall back to Agg by themselves
    except ImportError as err:
        raise ImportError('plotting needs matplotlib: pip install -e ".[viz]"') from err
    return plt


def plot_budget_tradeoff(
    budgets: Sequence[int],
    tau: Sequence[float],
    speedup: Sequence[float | None] | None = None,
    baseline: Mapping[str, float | None] | None = None,
    reference: Mapping[str, Sequence[float] | float] | None = None,
    title: str = "",
):
    """Fig. 3: DDTree's tau (and speedup, when AR was run) per node budget, log2 budget axis.

    ``baseline`` holds DFlash's ``tau``/``speedup`` (drawn flat); ``reference`` the published
    curve: ``budgets``, ``ddtree_tau``, ``ddtree_speedup``, ``dflash_tau``, ``dflash_speedup``.
    Returns the matplotlib Figure.
    """
    plt = _pyplot()
    panels = [("tau", "mean acceptance length τ", tau, "ddtree_tau", "dflash_tau")]
    if speedup is not None and any(s is not None for s in speedup):
        panels.insert(0, ("speedup", "speedup over AR (×)", speedup, "ddtree_speedup", "dflash_speedup"))
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.6), squeeze=False)
    for ax, (key, label, values, ref_key, ref_base) in zip(axes[0], panels):
        points = [(b, v) for b, v in zip(budgets, values) if v is not None]
        ax.plot([b for b, _ in points], [v for _, v in points], "o-", color="C0", label="DDTree (ours)")
        if baseline and baseline.get(key) is not None:
            ax.axhline(baseline[key], color="C1", linestyle="--", label="DFlash (ours)")
        if reference:
            ax.plot(reference["budgets"], reference[ref_key], "s:", color="C0", alpha=0.5, label="DDTree (paper)")
            ax.axhline(reference[ref_base], color="C1", linestyle=":", alpha=0.5, label="DFlash (paper)")
        ax.set_xscale("log", base=2)
        ticks = sorted(set(budgets) | set(reference["budgets"] if reference else ()))
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.minorticks_off()
        ax.set_xlabel("node budget B")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_acceptance_histogram(histograms: Mapping[str, Mapping[int, float]], title: str = ""):
    """Fig. 4: percent of rounds at each acceptance length, one bar group per length.

    ``histograms`` maps a label to ``{length: fraction}`` (``ddtree.metrics.pooled_histogram``
    gives fractions; published percentages divide by 100 first). Returns the Figure.
    """
    plt = _pyplot()
    lengths = sorted({k for h in histograms.values() for k in h})
    fig, ax = plt.subplots(figsize=(max(6.0, 0.45 * len(lengths) * max(len(histograms), 1)), 3.6))
    width = 0.8 / max(len(histograms), 1)
    for i, (label, hist) in enumerate(histograms.items()):
        xs = [k + (i - (len(histograms) - 1) / 2) * width for k in lengths]
        ax.bar(xs, [100 * hist.get(k, 0.0) for k in lengths], width=width, label=label)
    ax.set_xticks(lengths)
    ax.set_xlabel("acceptance length (accepted drafts + 1)")
    ax.set_ylabel("% of rounds")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return fig



def plot_stage_times(results: Mapping[str, object], title: str = ""):
    """Where a round's time goes: one stacked bar per strategy, its mean ms per round in each stage.

    ``results`` maps a label to a ``GenerationResult`` (its ``round_stage_times``) or to a sequence of
    ``StageTimes``, one per round. On a GPU, run the engine with ``timer_sync=True`` first, so that each
    stage is charged for its own kernels. Returns the Figure.

    >>> fig = plot_stage_times({"ar": ar_result, "ddtree-64": tree_result})   # doctest: +SKIP
    """
    plt = _pyplot()
    means = {}
    for label, rounds in results.items():
        rounds = list(getattr(rounds, "round_stage_times", rounds))
        if not rounds:
            raise ValueError(f"{label!r} has no rounds to draw: pass a GenerationResult of at least one round, "
                             "or its round_stage_times")
        means[label] = [1e3 * sum(getattr(r, stage) for r in rounds) / len(rounds) for stage in STAGES]
    fig, ax = plt.subplots(figsize=(7.0, 0.6 * len(means) + 1.4))
    left = [0.0] * len(means)
    for i, stage in enumerate(STAGES):
        widths = [m[i] for m in means.values()]
        ax.barh(range(len(means)), widths, left=left, label=stage)
        left = [a + b for a, b in zip(left, widths)]
    ax.set_yticks(range(len(means)), list(means))
    ax.invert_yaxis()  # the first label on top
    ax.set_xlabel("ms per round (mean)")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=8, ncol=len(STAGES), loc="lower center", bbox_to_anchor=(0.5, 1.0))
    if title:
        ax.set_title(title, pad=24)
    fig.tight_layout()
    return fig
