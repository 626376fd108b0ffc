"""The paper's Table 1 (and Fig. 3, Fig. 4) from run directories.

    python experiments/make_tables.py multirun/                       # -> multirun/tables/
    python experiments/make_tables.py multirun/ outputs/ --out tables/ --compare-paper

For every (dataset, model, temperature) with DFlash or DDTree runs: DFlash's speedup and tau,
DDTree's at the best budget (highest speedup) and that budget; speedup = mean TPOT(AR) / mean
TPOT(method), tau = mean over responses of per-response mean acceptance (bonus included).
Records of every rank of a data-parallel run are gathered. Writes table1.{md,tex,csv} and
runs.csv (every run, every budget), plus fig3_*.png (tau/speedup against budget) and fig4_*.png
(acceptance-length histogram) when matplotlib is installed. ``--compare-paper`` adds the
published numbers (ddtree/eval/paper_numbers.json) and ours - paper.

``--rounds``: for every (dataset, model) whose widest DDTree run at T = 0 recorded its rounds
(``record_rounds=true``), rounds_<cell>.md: tau of every budget up to it and of the chain read off
that one run against the runs made at those budgets and with DFlash, acceptance per depth and rank,
and the drafter's calibration; with plots, rounds_{depth_rank,gain,calibration,budgets,hist}_<cell>.png.

    python experiments/main.py record_rounds=true "+strategy_specs.ddtree-256=[experiment=ddtree,tree.budget=256]" \
        'strategies=[ddtree-256,ddtree-16,ddtree-64,dflash]' 'temperatures=[0]' '~prompt_sets.heldout'
    python experiments/make_tables.py outputs/main/ --rounds
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from ddtree.errors import run_cli
from ddtree.eval import cells, load_paper_numbers, load_runs, run_rows, table_rows, to_csv, to_latex, to_markdown
from ddtree.eval.tables import Cell

log = logging.getLogger("make_tables")


def _slug(cell: Cell) -> str:
    return f"{cell.dataset}_{cell.model}_T{cell.temperature:g}".replace("/", "-").replace(" ", "")


def _paper_figure(paper: dict, name: str, cell: Cell) -> dict | None:
    fig = paper[name]
    same = (fig["dataset"], fig["model"], float(fig["temperature"])) == (cell.dataset, cell.model, cell.temperature)
    return fig if same else None


def write_figures(table: list[Cell], out: Path, paper: dict | None) -> list[Path]:
    """Fig. 3 for cells with two or more budgets, Fig. 4 for every cell; paper data overlaid."""
    from ddtree.viz.plots import plot_acceptance_histogram, plot_budget_tradeoff

    written = []
    for cell in table:
        label = f"{cell.dataset}, {cell.model}, T={cell.temperature:g}"
        if len(cell.ddtree) >= 2:
            baseline = {"tau": cell.dflash.tau, "speedup": cell.speedup(cell.dflash)} if cell.dflash else None
            fig = plot_budget_tradeoff(
                [r.budget for r in cell.ddtree], [r.tau for r in cell.ddtree],
                [cell.speedup(r) for r in cell.ddtree], baseline=baseline,
                reference=_paper_figure(paper, "fig3", cell) if paper else None, title=label)
            written.append(out / f"fig3_{_slug(cell)}.png")
            fig.savefig(written[-1], dpi=120)
        hists = {}
        if cell.dflash:
            hists["DFlash"] = cell.dflash.histogram()
        if cell.best_ddtree:
            hists[f"DDTree (B={cell.best_ddtree.budget})"] = cell.best_ddtree.histogram()
        ref = _paper_figure(paper, "fig4", cell) if paper else None
        if ref:
            percent = lambda values: {k: v / 100 for k, v in zip(ref["lengths"], values)}  # noqa: E731
            hists["DFlash (paper)"] = percent(ref["dflash"])
            hists[f"DDTree B={ref['ddtree_budget']} (paper)"] = percent(ref["ddtree"])
        fig = plot_acceptance_histogram(hists, title=label)
        written.append(out / f"fig4_{_slug(cell)}.png")
        fig.savefig(written[-1], dpi=120)
    return written


def budget_markdown(table: list[Cell], paper: dict | None) -> str:
    """Fig. 3's numbers per cell: tau and speedup at every budget (paper beside ours when shown)."""
    parts = []
    for cell in table:
        if not cell.ddtree:
            continue
        ref = _paper_figure(paper, "fig3", cell) if paper else None
        header = "| B | τ | speedup |" + (" τ (paper) | speedup (paper) |" if ref else "")
        lines = [f"**{cell.dataset}, {cell.model}, T={cell.temperature:g}**", "", header,
                 "|" + "---:|" * (5 if ref else 3)]
        for r in cell.ddtree:
            s = cell.speedup(r)
            line = f"| {r.budget} | {r.tau:.2f} | {'–' if s is None else f'{s:.2f}×'} |"
            if ref:
                i = ref["budgets"].index(r.budget) if r.budget in ref["budgets"] else None
                line += " – | – |" if i is None else f" {ref['ddtree_tau'][i]:.2f} | {ref['ddtree_speedup'][i]:.2f}× |"
            lines.append(line)
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + ("\n" if parts else "")


BUDGETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


def rank_groups(budget: int) -> dict:
    return {"rank 0": [0], "rank 1": [1], "rank 2+": range(2, budget + 1)}


def write_rounds(runs: list, out: Path, plots: bool) -> list[Path]:
    """The round analysis of every cell with a recorded wide run (see the module docstring)."""
    from ddtree.eval.analysis import budget_markdown, budget_rows, depth_rank_markdown, traces, widest_recorded
    from ddtree.metrics.rounds import calibration, depth_rank

    written = []
    for dataset, model in sorted({(r.dataset, r.model) for r in runs}):
        source = widest_recorded([r for r in runs if (r.dataset, r.model) == (dataset, model)])
        if source is None:
            continue
        responses = list(traces(source).values())
        slug = f"{dataset}_{model}_B{source.budget}".replace("/", "-").replace(" ", "")
        title = f"{dataset}, {model}, T=0: {len(responses)} responses recorded at B={source.budget}"
        rows = budget_rows(source, runs, [b for b in BUDGETS if b < source.budget])
        text = "\n".join([budget_markdown(rows, title),
                          depth_rank_markdown(depth_rank(responses), "per depth and rank"),
                          "Drafter calibration (expected calibration error over tested nodes): " + ", ".join(
                              f"{name} {calibration(responses, ranks=r).error:.3f}"
                              for name, r in rank_groups(source.budget).items()) + ".\n"])
        written.append(out / f"rounds_{slug}.md")
        written[-1].write_text(text)
        if plots:
            import matplotlib.pyplot as plt

            for name, fig in round_figures(responses, rows, source.budget, title).items():
                written.append(out / f"rounds_{name}_{slug}.png")
                fig.savefig(written[-1], dpi=110)
                plt.close(fig)
    return written


def round_figures(responses: list, rows: list, budget: int, title: str) -> dict:
    """Name -> figure: depth x rank acceptance and gain over the chain, calibration per rank, the
    budget curve read off the run against the runs, and the acceptance-length histograms."""
    from ddtree.metrics.rounds import branch_gain, calibration, depth_rank, estimate_budget, estimate_chain, recorded
    from ddtree.viz import plot_acceptance_histogram, plot_budget_estimate, plot_calibration, plot_depth_rank

    chain = next(r for r in rows if r.budget is None)
    trees = [r for r in rows if r.budget is not None]
    histograms = {"chain (read off)": estimate_chain(responses).histogram(),
                  **{f"B={b} (read off)": estimate_budget(responses, b).histogram() for b in (16, 64) if b < budget},
                  f"B={budget} (recorded)": recorded(responses).histogram()}
    return {
        "depth_rank": plot_depth_rank(depth_rank(responses).rate, "acceptance rate", title),
        "gain": plot_depth_rank(branch_gain(responses), "tokens per round over the chain", title, cmap="magma"),
        "calibration": plot_calibration({k: calibration(responses, ranks=v) for k, v in rank_groups(budget).items()},
                                        title),
        "budgets": plot_budget_estimate({r.budget: r.estimated for r in trees},
                                        {r.budget: r.measured for r in trees if r.measured is not None},
                                        (chain.estimated, chain.measured), title),
        "hist": plot_acceptance_histogram(histograms, title),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run or sweep directories (searched recursively)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: <first run dir>/tables)")
    parser.add_argument("--compare-paper", action="store_true", help="put the published numbers beside ours")
    parser.add_argument("--no-plots", action="store_true", help="skip the figures")
    parser.add_argument("--rounds", action="store_true",
                        help="analyse recorded rounds (record_rounds=true): budgets read off one wide run, "
                             "acceptance per depth and rank, calibration")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    runs = load_runs(args.runs)
    if not runs:
        raise FileNotFoundError(f"no finished responses under {', '.join(map(str, args.runs))} (looked for run.json "
                                "beside records): pass the run or sweep directories that run.py wrote")
    table = cells(runs)
    paper = load_paper_numbers() if args.compare_paper else None
    rows = table_rows(table, paper)
    out = args.out or args.runs[0] / "tables"
    out.mkdir(parents=True, exist_ok=True)
    (out / "table1.md").write_text(to_markdown(rows))
    (out / "table1.tex").write_text(to_latex(rows))
    (out / "table1.csv").write_text(to_csv(rows))
    (out / "runs.csv").write_text(to_csv(run_rows(runs)))
    (out / "budgets.md").write_text(budget_markdown(table, paper))
    print(to_markdown(rows) if rows else "(no DFlash or DDTree runs: see runs.csv)")
    if not args.no_plots:
        try:
            figures = write_figures(table, out, paper)
            log.info("%d figures", len(figures))
        except ImportError as err:
            log.warning("no figures: %s", err)
    if args.rounds:
        analysed = write_rounds(runs, out, plots=not args.no_plots)
        log.info("%d round-analysis files%s", len(analysed), "" if analysed else
                 " (no DDTree run at T = 0 recorded its rounds: rerun it with record_rounds=true)")
    log.info("%d runs, %d cells -> %s", len(runs), len(table), out)
    return 0


if __name__ == "__main__":
    run_cli(main)
