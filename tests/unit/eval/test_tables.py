"""Table 1 from run directories: tau as a mean of means, speedup as a TPOT ratio, best budget."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import pytest

from ddtree.eval import (
    RecordWriter,
    cells,
    load_paper_numbers,
    load_runs,
    method_of,
    run_rows,
    table_rows,
    to_csv,
    to_latex,
    to_markdown,
    write_json,
)

REFERENCE = Path(__file__).with_name("paper_table1.md")  # Table 1 as printed in the paper
PARTS = {"ar": ("NullDrafter", "ChainTreeBuilder"), "dflash": ("DFlashDrafter", "ChainTreeBuilder"),
         "ddtree": ("DFlashDrafter", "BestFirstTreeBuilder")}


def make_run(root: Path, name: str, method: str, responses: list[tuple[list[int], float]], budget=None,
             temperature=0.0, dataset="math500", model="Qwen3-8B", ranks: int = 1) -> None:
    """A run directory as experiments/run.py writes it: run.json and (per rank) records."""
    drafter, tree = PARTS[method]
    write_json(root / name / "run.json", {"config": {}, "dataset": dataset, "model": model, "parts": {
        "drafter": drafter, "tree": tree, "budget": budget, "temperature": temperature}})
    for i, (lengths, tpot) in enumerate(responses):
        rank = i % ranks
        file = "records.jsonl" if ranks == 1 else f"records.rank{rank}-of-{ranks}.jsonl"
        with RecordWriter(root / name / file) as out:
            out.write({"key": f"{i}:0", "index": i, "turn": 0, "acceptance_lengths": lengths, "tpot": tpot})


@pytest.fixture
def runs(tmp_path):
    make_run(tmp_path, "ar", "ar", [([1, 1], 0.10), ([1], 0.20)])
    make_run(tmp_path, "dflash", "dflash", [([1, 1, 1, 5], 0.05), ([4], 0.05)])  # tau 3 (pooled: 2.4)
    make_run(tmp_path, "b16", "ddtree", [([4], 0.04), ([6], 0.02)], budget=16, ranks=2)  # tau 5, 5x
    make_run(tmp_path, "b64", "ddtree", [([8], 0.05), ([6, 6], 0.05)], budget=64)  # tau 7, 3x
    make_run(tmp_path, "t1", "dflash", [([2], 0.1)], temperature=1.0)  # no AR at T = 1
    return load_runs([tmp_path])


def test_table1_numbers(runs) -> None:
    [t0, t1] = table_rows(cells(runs))
    assert t0["dflash_tau"] == pytest.approx(3.0)  # mean of per-response means, not pooled
    assert t0["dflash_speedup"] == pytest.approx(0.15 / 0.05)
    assert t0["ddtree_budget"] == 16  # the best speedup, although B = 64 accepts more
    assert t0["ddtree_speedup"] == pytest.approx(0.15 / 0.03) and t0["ddtree_tau"] == pytest.approx(5.0)
    assert (t0["n_ar"], t0["n_dflash"], t0["n_ddtree"]) == (2, 2, 2)  # both ranks' records gathered
    assert t1["dflash_tau"] == 2.0 and t1["dflash_speedup"] is None  # no AR run: speedup unknown


def test_every_run_is_listed_with_its_speedup(runs) -> None:
    rows = {(r["method"], r["budget"], r["temperature"]): r for r in run_rows(runs)}
    assert rows[("ddtree", 64, 0.0)]["tau"] == pytest.approx(7.0)
    assert rows[("ddtree", 64, 0.0)]["speedup"] == pytest.approx(3.0)
    assert rows[("ar", None, 0.0)]["speedup"] == pytest.approx(1.0)


def test_formats(runs) -> None:
    rows = table_rows(cells(runs))
    md = to_markdown(rows)
    assert "**Temperature = 0**" in md and "**Temperature = 1**" in md
    assert "| MATH-500 | 3.00× | 3.00 | 5.00× | 5.00 | 16 |" in md
    tex = to_latex(rows)
    assert r"\multicolumn{5}{c}{Qwen3-8B}" in tex and r"5.00$\times$ & 5.00 & 16 \\" in tex
    parsed = list(csv.DictReader(io.StringIO(to_csv(rows))))
    assert float(parsed[0]["ddtree_speedup"]) == pytest.approx(5.0) and parsed[1]["dflash_speedup"] == ""


def test_compare_with_the_paper(runs) -> None:
    rows = table_rows(cells(runs), load_paper_numbers())
    row = rows[0]  # MATH-500, Qwen3-8B, T = 0: DFlash 5.56x / 7.79, DDTree 7.52x / 10.73
    assert (row["paper_dflash_speedup"], row["paper_ddtree_tau"]) == (5.56, 10.73)
    assert row["diff_ddtree_tau"] == pytest.approx(5.0 - 10.73)
    assert "5.00× / 7.52× / -2.52" in to_markdown(rows)


def test_two_runs_of_one_cell_are_refused(tmp_path) -> None:
    make_run(tmp_path, "a", "dflash", [([2], 0.1)])
    make_run(tmp_path, "b", "dflash", [([3], 0.1)])
    with pytest.raises(ValueError, match="two runs of"):
        load_runs([tmp_path])


def test_method_names_come_from_the_parts() -> None:
    assert method_of({"drafter": "NullDrafter", "tree": "BestFirstTreeBuilder"}) == "ar"
    assert method_of({"drafter": "MTPDrafter", "tree": "ChainTreeBuilder"}) == "mtp"
    other = {"drafter": "OracleDrafter", "tree": "BestFirstTreeBuilder"}
    assert method_of(other) == "OracleDrafter+BestFirstTreeBuilder"


def test_paper_numbers_are_complete_and_consistent() -> None:
    paper = load_paper_numbers()
    assert len(paper["table1"]) == 2 * 10 * 3
    fig3 = paper["fig3"]
    cell = next(r for r in paper["table1"]
                if (r["dataset"], r["model"], r["temperature"]) == ("math500", "Qwen3-8B", 0.0))
    i = fig3["budgets"].index(512)  # the paper's best budget there: Table 1 and Fig. 3 agree
    assert (fig3["ddtree_speedup"][i], fig3["ddtree_tau"][i]) == (cell["ddtree_speedup"], cell["ddtree_tau"])
    assert (fig3["dflash_speedup"], fig3["dflash_tau"]) == (cell["dflash_speedup"], cell["dflash_tau"])
    assert abs(sum(paper["fig4"]["dflash"]) - 100) < 0.1 and abs(sum(paper["fig4"]["ddtree"]) - 100) < 0.1


def test_paper_numbers_match_the_printed_table() -> None:
    text = REFERENCE.read_text()
    paper = load_paper_numbers()
    labels = {"MATH-500": "math500", "GSM8K": "gsm8k", "AIME 2024": "aime24", "AIME 2025": "aime25",
              "HumanEval": "humaneval", "MBPP": "mbpp", "LiveCodeBench": "livecodebench",
              "SWE-bench Lite": "swe-bench", "MT-Bench": "mt-bench", "Alpaca": "alpaca"}
    for temperature, heading in ((0.0, "**Temperature = 0.0**"), (1.0, "**Temperature = 1.0**")):
        lines = [line for line in text.split(heading)[1].splitlines() if line.startswith("|")][2:12]
        for line in lines:
            cells_ = [c.strip() for c in line.strip("|").split("|")]
            values = [float(re.sub("[×*]", "", c)) for c in cells_[1:]]
            for k, model in enumerate(("Qwen3-4B", "Qwen3-8B", "Qwen3-Coder-30B-A3B")):
                row = next(r for r in paper["table1"] if (r["dataset"], r["model"], r["temperature"])
                           == (labels[cells_[0]], model, temperature))
                assert [row[m] for m in ("dflash_speedup", "dflash_tau", "ddtree_speedup", "ddtree_tau")] \
                       == values[4 * k: 4 * k + 4]
    json.dumps(paper)
