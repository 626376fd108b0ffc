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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run or sweep directories (searched recursively)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: <first run dir>/tables)")
    parser.add_argument("--compare-paper", action="store_true", help="put the published numbers beside ours")
    parser.add_argument("--no-plots", action="store_true", help="skip the figures")
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
    log.info("%d runs, %d cells -> %s", len(runs), len(table), out)
    return 0


if __name__ == "__main__":
    run_cli(main)
