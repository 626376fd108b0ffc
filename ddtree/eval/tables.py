"""The paper's Table 1 from run directories: speedup and tau of DFlash and of DDTree's best budget.

Definitions (the papers' protocol):

    tau      = mean over responses of each response's mean acceptance length (bonus included)
    TPOT     = decode time / generated tokens, per response (prefill and draft prefill excluded)
    speedup  = mean TPOT(AR) / mean TPOT(method), AR from the same dataset, model and temperature
    best B   = the DDTree budget with the highest speedup (the lowest mean TPOT)

A cell is (dataset, model, temperature). Which column a run feeds is the strategy preset it was
composed from (``run.json``'s ``preset``: ar, dflash, ddtree; the budget from its tree); runs
written before presets were recorded are named by their parts (``NullDrafter`` is AR,
``DFlashDrafter`` with the chain DFlash, with the best-first tree DDTree). Any other strategy
still appears in ``run_rows`` (every run, every budget) under its preset's name.

    >>> runs = load_runs(["multirun/"])           # doctest: +SKIP
    >>> print(to_markdown(table_rows(cells(runs))))  # doctest: +SKIP
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean
from typing import Iterable, Sequence

from ddtree.eval.records import RUN_FILE, read_records
from ddtree.metrics import mean_of_means, pooled_histogram

# Display order and labels: the paper's models, then the project's dataset order.
PAPER_MODELS = ("Qwen3-4B", "Qwen3-8B", "Qwen3-Coder-30B-A3B")
DATASET_LABELS = {
    "math500": "MATH-500", "gsm8k": "GSM8K", "aime24": "AIME 2024", "aime25": "AIME 2025",
    "humaneval": "HumanEval", "mbpp": "MBPP", "livecodebench": "LiveCodeBench",
    "swe-bench": "SWE-bench Lite", "mt-bench": "MT-Bench", "alpaca": "Alpaca",
}


def method_of(parts: dict) -> str:
    """The paper's name for a run's parts: ar, dflash, ddtree, mtp, or drafter+tree otherwise."""
    drafter, tree = parts.get("drafter"), parts.get("tree")
    if drafter == "NullDrafter":
        return "ar"
    names = {("DFlashDrafter", "ChainTreeBuilder"): "dflash", ("DFlashDrafter", "BestFirstTreeBuilder"): "ddtree",
             ("MTPDrafter", "ChainTreeBuilder"): "mtp"}
    return names.get((drafter, tree), f"{drafter}+{tree}")


@dataclass(frozen=True)
class Run:
    """One run directory: what ran and its response records (all ranks)."""

    path: Path
    dataset: str
    model: str
    temperature: float
    method: str
    budget: int | None
    records: tuple[dict, ...]

    @property
    def n(self) -> int:
        return len(self.records)

    @property
    def tau(self) -> float:
        return mean_of_means(r["acceptance_lengths"] for r in self.records)

    @property
    def tpot(self) -> float:
        """Mean over responses of time per output token, seconds."""
        return fmean(r["tpot"] for r in self.records) if self.records else float("nan")

    def histogram(self) -> dict[int, float]:
        """Fraction of rounds at each acceptance length, pooled over rounds (Fig. 4)."""
        return pooled_histogram(r["acceptance_lengths"] for r in self.records)


def load_run(run_dir: str | Path) -> Run:
    run_dir = Path(run_dir)
    meta = json.loads((run_dir / RUN_FILE).read_text())
    parts = meta["parts"]
    method = meta.get("preset") or method_of(parts)
    records = tuple(sorted(read_records(run_dir).values(), key=lambda r: (r["index"], r["turn"])))
    return Run(run_dir, meta["dataset"], meta["model"], float(parts["temperature"]), method,
               parts.get("budget") if method != "ar" else None, records)


def load_runs(roots: Iterable[str | Path]) -> list[Run]:
    """Every run directory (one holding ``run.json``) under the roots; empty runs are left out."""
    runs, seen = [], {}
    for root in roots:
        root = Path(root)
        if not root.exists():
            raise FileNotFoundError(f"no run directory at {root}")
        for meta in sorted(root.rglob(RUN_FILE)):
            run = load_run(meta.parent)
            if not run.n:
                continue
            ident = (run.dataset, run.model, run.temperature, run.method, run.budget)
            if ident in seen and seen[ident] != run.path:
                raise ValueError(
                    f"two runs of one cell (dataset, model, temperature, method, budget = {ident}) with different "
                    f"configs: {seen[ident]} and {run.path}; pass the directories of one configuration only, and keep "
                    "sweeps apart by giving each its own hydra.sweep.dir=multirun/NAME"
                )
            seen[ident] = run.path
            runs.append(run)
    return runs


@dataclass(frozen=True)
class Cell:
    """One (dataset, model, temperature) of Table 1 and the runs that fill it."""

    dataset: str
    model: str
    temperature: float
    ar: Run | None
    dflash: Run | None
    ddtree: tuple[Run, ...]  # one per budget, ascending

    def speedup(self, run: Run | None) -> float | None:
        if run is None or self.ar is None:
            return None
        return self.ar.tpot / run.tpot

    @property
    def best_ddtree(self) -> Run | None:
        """The budget with the highest speedup, i.e. the lowest mean TPOT (defined without AR too)."""
        return min(self.ddtree, key=lambda r: r.tpot) if self.ddtree else None


def _order(dataset: str, model: str, temperature: float) -> tuple:
    datasets, models = list(DATASET_LABELS), list(PAPER_MODELS)
    return (temperature, datasets.index(dataset) if dataset in datasets else len(datasets), dataset,
            models.index(model) if model in models else len(models), model)


def cells(runs: Sequence[Run]) -> list[Cell]:
    """Group runs into Table 1 cells, in the paper's order."""
    keys = sorted({(r.dataset, r.model, r.temperature) for r in runs}, key=lambda k: _order(*k))
    out = []
    for key in keys:
        mine = [r for r in runs if (r.dataset, r.model, r.temperature) == key]
        pick = lambda method: next((r for r in mine if r.method == method), None)  # noqa: E731
        trees = tuple(sorted((r for r in mine if r.method == "ddtree"), key=lambda r: r.budget or 0))
        if pick("dflash") or trees:
            out.append(Cell(*key, pick("ar"), pick("dflash"), trees))
    return out


def table_rows(table: Sequence[Cell], paper: dict | None = None) -> list[dict]:
    """One row per cell: the numbers of Table 1 (and, with ``paper``, the published ones and the
    differences ours - paper)."""
    rows = []
    for cell in table:
        best = cell.best_ddtree
        row = {
            "dataset": cell.dataset, "model": cell.model, "temperature": cell.temperature,
            "dflash_speedup": cell.speedup(cell.dflash), "dflash_tau": cell.dflash.tau if cell.dflash else None,
            "ddtree_speedup": cell.speedup(best), "ddtree_tau": best.tau if best else None,
            "ddtree_budget": best.budget if best else None,
            "ar_tpot_ms": 1e3 * cell.ar.tpot if cell.ar else None,
            "n_ar": cell.ar.n if cell.ar else 0, "n_dflash": cell.dflash.n if cell.dflash else 0,
            "n_ddtree": best.n if best else 0,
        }
        if paper is not None:
            published = paper_cell(paper, cell.dataset, cell.model, cell.temperature) or {}
            for metric in ("dflash_speedup", "dflash_tau", "ddtree_speedup", "ddtree_tau"):
                theirs = published.get(metric)
                row[f"paper_{metric}"] = theirs
                row[f"diff_{metric}"] = None if theirs is None or row[metric] is None else row[metric] - theirs
        rows.append(row)
    return rows


def run_rows(runs: Sequence[Run]) -> list[dict]:
    """Every run with its tau, TPOT and speedup (the data behind the budget plots)."""
    ar = {(r.dataset, r.model, r.temperature): r for r in runs if r.method == "ar"}
    rows = []
    for r in sorted(runs, key=lambda r: (*_order(r.dataset, r.model, r.temperature), r.method, r.budget or 0)):
        base = ar.get((r.dataset, r.model, r.temperature))
        rows.append({"dataset": r.dataset, "model": r.model, "temperature": r.temperature, "method": r.method,
                     "budget": r.budget, "n": r.n, "tau": r.tau, "tpot_ms": 1e3 * r.tpot,
                     "speedup": base.tpot / r.tpot if base else None, "path": str(r.path)})
    return rows


def paper_cell(paper: dict, dataset: str, model: str, temperature: float) -> dict | None:
    return next((row for row in paper["table1"] if (row["dataset"], row["model"]) == (dataset, model)
                 and abs(row["temperature"] - temperature) < 1e-9), None)


def load_paper_numbers() -> dict:
    """The published Table 1 (T = 0 and 1), Fig. 3 budget ablation and Fig. 4 histogram."""
    return json.loads((Path(__file__).with_name("paper_numbers.json")).read_text())


# -- formats ---------------------------------------------------------------------------------
def _x(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f}×"


def _f(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f}"


def _d(v: float | None) -> str:
    return "–" if v is None else f"{v:+.2f}"


def _models(rows: Sequence[dict]) -> list[str]:
    return sorted({r["model"] for r in rows}, key=lambda m: _order("", m, 0)[3:])


def _by_temperature(rows: Sequence[dict]) -> dict[float, list[dict]]:
    out: dict[float, list[dict]] = {}
    for row in rows:
        out.setdefault(row["temperature"], []).append(row)
    return out


def _wide(rows: Sequence[dict]) -> Iterable[tuple[float, list[str], list[list[str]]]]:
    """Table 1's layout per temperature: a row per dataset, five columns per model."""
    for temperature, group in _by_temperature(rows).items():
        models = _models(group)
        header = ["Dataset"] + [f"{m} {c}" for m in models for c in ("DFlash", "τ", "+DDTree", "τ", "B*")]
        body = []
        for dataset in dict.fromkeys(r["dataset"] for r in group):
            line = [DATASET_LABELS.get(dataset, dataset)]
            for model in models:
                r = next((r for r in group if (r["dataset"], r["model"]) == (dataset, model)), None)
                line += ["–"] * 5 if r is None else [
                    _x(r["dflash_speedup"]), _f(r["dflash_tau"]), _x(r["ddtree_speedup"]), _f(r["ddtree_tau"]),
                    "–" if r["ddtree_budget"] is None else str(r["ddtree_budget"])]
            body.append(line)
        yield temperature, header, body


def _md_table(header: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
    return "\n".join(lines + ["| " + " | ".join(line) + " |" for line in body])


def to_markdown(rows: Sequence[dict]) -> str:
    """Table 1 as Markdown, one table per temperature; with paper columns, a comparison table."""
    if rows and "paper_dflash_tau" in rows[0]:
        return _markdown_compare(rows)
    parts = [f"**Temperature = {t:g}**\n\n" + _md_table(h, b) for t, h, b in _wide(rows)]
    return "\n\n".join(parts) + "\n"


def _markdown_compare(rows: Sequence[dict]) -> str:
    header = ["Dataset", "Model", "T"] + [f"{name} (ours / paper / Δ)" for name in
                                          ("DFlash ×", "DFlash τ", "DDTree ×", "DDTree τ")] + ["B*"]
    body = []
    for r in rows:
        line = [DATASET_LABELS.get(r["dataset"], r["dataset"]), r["model"], f"{r['temperature']:g}"]
        for metric, fmt in (("dflash_speedup", _x), ("dflash_tau", _f), ("ddtree_speedup", _x), ("ddtree_tau", _f)):
            line.append(f"{fmt(r[metric])} / {fmt(r['paper_' + metric])} / {_d(r['diff_' + metric])}")
        line.append("–" if r["ddtree_budget"] is None else str(r["ddtree_budget"]))
        body.append(line)
    return _md_table(header, body) + "\n"


_TEX = {"\\": r"\textbackslash{}", "_": r"\_", "&": r"\&", "%": r"\%", "#": r"\#"}


def _tex(s: str) -> str:
    return "".join(_TEX.get(c, c) for c in s)


def to_latex(rows: Sequence[dict]) -> str:
    """Table 1 as LaTeX (booktabs), one tabular per temperature; ``ours (paper)`` when compared."""
    compare = bool(rows) and "paper_dflash_tau" in rows[0]
    out = []
    for temperature, group in _by_temperature(rows).items():
        models = _models(group)
        cols = "l" + "rrrrr" * len(models)
        head1 = " & ".join([""] + [rf"\multicolumn{{5}}{{c}}{{{_tex(m)}}}" for m in models])
        head2 = " & ".join(["Dataset"] + [r"DFlash & $\tau$ & +DDTree & $\tau$ & $B^*$"] * len(models))
        lines = [rf"% Temperature = {temperature:g}", rf"\begin{{tabular}}{{{cols}}}", r"\toprule",
                 head1 + r" \\", head2 + r" \\", r"\midrule"]
        for dataset in dict.fromkeys(r["dataset"] for r in group):
            cells_ = [_tex(DATASET_LABELS.get(dataset, dataset))]
            for model in models:
                r = next((r for r in group if (r["dataset"], r["model"]) == (dataset, model)), None)
                if r is None:
                    cells_ += ["--"] * 5
                    continue
                for metric, fmt in (("dflash_speedup", _x), ("dflash_tau", _f), ("ddtree_speedup", _x),
                                    ("ddtree_tau", _f)):
                    text = fmt(r[metric]).replace("×", r"$\times$").replace("–", "--")
                    if compare and r.get("paper_" + metric) is not None:
                        text += f" ({fmt(r['paper_' + metric])})".replace("×", r"$\times$")
                    cells_.append(text)
                cells_.append("--" if r["ddtree_budget"] is None else str(r["ddtree_budget"]))
            lines.append(" & ".join(cells_) + r" \\")
        lines += [r"\bottomrule", r"\end{tabular}"]
        out.append("\n".join(lines))
    return "\n\n".join(out) + "\n"


def to_csv(rows: Sequence[dict]) -> str:
    """Rows as CSV, full precision (empty where a number is missing)."""
    if not rows:
        return ""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: ("" if v is None else v) for k, v in row.items()} for row in rows)
    return buffer.getvalue()
