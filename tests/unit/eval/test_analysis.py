"""Round analysis from run directories: a recorded wide run read against the runs at smaller
budgets and the chain, on the responses both hold; make_tables.py --rounds writes it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from ddtree.eval import RecordWriter, load_runs, write_json
from ddtree.eval.analysis import budget_markdown, budget_rows, widest_recorded

ROOT = Path(__file__).resolve().parents[3]
PARTS = {"dflash": "ChainTreeBuilder", "ddtree": "BestFirstTreeBuilder"}
# Root 5; depth 1: 10 (top-1), 11; depth 2: 20 under each. The target took 11 then 20 (path 0, 2, 4).
WIDE = {"parent": [-1, 0, 0, 1, 2], "depth": [0, 1, 1, 2, 2], "rank": [0, 0, 1, 0, 0], "token": [5, 10, 11, 20, 20],
        "logp": [0.0, -0.5, -1.2, -0.7, -0.7], "top": [10, 20], "path": [0, 2, 4], "bonus": 7, "n": 3}
# The target took the top-1 chain: 10, 20.
CHAIN = {**WIDE, "path": [0, 1, 3]}


def make_run(root: Path, name: str, method: str, budget, lengths: dict[int, list[int]], rounds=None) -> None:
    write_json(root / name / "run.json", {"config": {}, "dataset": "humaneval", "model": "pair", "parts": {
        "drafter": "DFlashDrafter", "tree": PARTS[method], "budget": budget, "temperature": 0.0}})
    with RecordWriter(root / name / "records.jsonl") as out:
        for i, n in lengths.items():
            out.write({"key": f"{i}:0", "index": i, "turn": 0, "acceptance_lengths": n, "tpot": 0.1,
                       **({"rounds": rounds[i]} if rounds else {})})


@pytest.fixture
def runs(tmp_path):
    make_run(tmp_path, "b4", "ddtree", 4, {0: [3], 1: [3]}, rounds={0: [WIDE], 1: [CHAIN]})
    make_run(tmp_path, "b2", "ddtree", 2, {0: [2], 1: [2], 2: [1]})  # prompt 2 is not in the wide run
    make_run(tmp_path, "old", "ddtree", 8, {0: [4]})  # written before rounds were recorded
    make_run(tmp_path, "dflash", "dflash", None, {1: [3]})
    return load_runs([tmp_path])


def test_estimates_against_the_runs_on_common_responses(runs) -> None:
    source = widest_recorded(runs)
    assert source.budget == 4  # the B = 8 run has no rounds
    rows = {r.name: r for r in budget_rows(source, runs, [1])}
    assert list(rows) == ["B=1", "B=2", "B=4", "chain"]
    assert (rows["B=1"].estimated, rows["B=1"].measured, rows["B=1"].responses) == (1.5, None, 2)
    assert (rows["B=2"].estimated, rows["B=2"].measured, rows["B=2"].error) == (2.0, 2.0, 0.0)
    assert (rows["B=4"].estimated, rows["B=4"].measured) == (3.0, 3.0)
    assert (rows["chain"].estimated, rows["chain"].measured, rows["chain"].responses) == (3.0, 3.0, 1)
    assert "| B=2 | 2.00 | 2.00 | +0.00 | 2 | 2 | 0 | 0 |" in budget_markdown(rows.values())


def test_make_tables_writes_the_round_analysis(runs, tmp_path) -> None:
    spec = importlib.util.spec_from_file_location("make_tables", ROOT / "experiments" / "make_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "tables"
    assert module.main([str(tmp_path), "--out", str(out), "--rounds"]) == 0
    text = (out / "rounds_humaneval_pair_B4.md").read_text()
    assert "| chain | 3.00 | 3.00 |" in text and "acceptance rate" in text
    if importlib.util.find_spec("matplotlib"):
        assert len(list(out.glob("rounds_*_humaneval_pair_B4.png"))) == 5
