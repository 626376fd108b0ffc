"""The paper's figures draw from plain numbers (matplotlib is the optional viz extra)."""

import pytest

pytest.importorskip("matplotlib")

from ddtree.eval import load_paper_numbers  # noqa: E402
from ddtree.viz.plots import plot_acceptance_histogram, plot_budget_tradeoff  # noqa: E402


def test_budget_tradeoff_with_the_published_curve(tmp_path) -> None:
    fig3 = load_paper_numbers()["fig3"]
    fig = plot_budget_tradeoff([16, 64, 256], tau=[8.0, 9.0, 9.5], speedup=[5.0, 6.0, None],
                               baseline={"tau": 7.0, "speedup": 4.5}, reference=fig3, title="MATH-500")
    assert len(fig.axes) == 2  # speedup and tau
    fig.savefig(tmp_path / "fig3.png")
    assert (tmp_path / "fig3.png").stat().st_size > 0
    assert len(plot_budget_tradeoff([16, 32], tau=[2.0, 2.5]).axes) == 1  # no AR run: tau only


def test_acceptance_histogram(tmp_path) -> None:
    fig4 = load_paper_numbers()["fig4"]
    paper = {k: v / 100 for k, v in zip(fig4["lengths"], fig4["ddtree"])}
    fig = plot_acceptance_histogram({"ours": {1: 0.5, 2: 0.25, 16: 0.25}, "paper": paper})
    fig.savefig(tmp_path / "fig4.png")
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == ["ours", "paper"]


def test_round_figures_draw_from_the_analysis(tmp_path) -> None:
    import numpy as np

    from ddtree.metrics.rounds import Calibration
    from ddtree.viz import plot_budget_estimate, plot_calibration, plot_depth_rank

    fig = plot_depth_rank(np.array([[0.7, 0.1, np.nan], [0.5, 0.0, 0.2]]), "acceptance rate", title="rates")
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["0", "1", "2+"]
    cal = Calibration(np.linspace(0, 1, 3), np.array([0.2, np.nan]), np.array([0.3, np.nan]), np.array([4, 0]))
    fig = plot_calibration({"rank 0": cal})
    assert "n=4" in fig.axes[0].get_legend().get_texts()[1].get_text()
    fig = plot_budget_estimate({1: 1.5, 2: 1.8, 4: 2.0}, measured={4: 2.1}, chain=(1.4, 1.3))
    fig.savefig(tmp_path / "budgets.png")
    assert len(fig.axes[0].get_legend().get_texts()) == 4


def test_stage_times_stack_each_strategy_s_mean_round(tmp_path) -> None:
    from ddtree.types import GenerationResult, StageTimes
    from ddtree.viz import plot_stage_times

    rounds = [StageTimes(draft=0.002, tree=0.0005, layout=0.0002, verify=0.010, commit=0.0003),
              StageTimes(draft=0.004, tree=0.0005, layout=0.0002, verify=0.012, commit=0.0003)]
    result = GenerationResult(tokens=[1, 2], acceptance_lengths=[1, 1], stage_times=StageTimes(),
                              time_to_first_token=0.0, decode_time=0.03, round_stage_times=rounds)
    fig = plot_stage_times({"ar": [StageTimes(verify=0.009, commit=0.0002)], "ddtree-64": result}, title="27B")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["ar", "ddtree-64"]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["draft", "tree", "layout", "verify", "commit"]
    widths = {(round(p.get_y() + p.get_height() / 2), round(p.get_width(), 6)) for p in ax.patches}
    assert (1, 3.0) in widths and (1, 11.0) in widths and (0, 9.0) in widths  # ms: means over the rounds
    fig.savefig(tmp_path / "stages.png")
    with pytest.raises(ValueError, match="no rounds"):
        plot_stage_times({"empty": []})
