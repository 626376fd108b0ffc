"""The main job (a Hydra app over the strategy presets) runs on a pair directory (tiny random
models here), prints every strategy at both temperatures, writes records make_tables reads,
and resumes: a rerun decodes nothing."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

from ddtree.training.pair import tiny_pair

ROOT = Path(__file__).resolve().parents[2]
STRATEGIES = ("ar", "mtp", "dflash", "ddtree-8", "ddtree-16")


def _overrides(pair: Path | None, *extra: str) -> list[str]:
    return [*([f"target.dir={pair}"] if pair else []), "+strategy_specs.ddtree-8=['experiment=ddtree','tree.budget=8']",
            f"strategies=[{','.join(STRATEGIES)}]", "prompt_sets.humaneval.limit=1", "prompt_sets.heldout.limit=1",
            "max_new_tokens=8", "warmup_tokens=2", "progress=false", *extra]


def _main(pair: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    """The command line, as a user runs it."""
    cmd = [sys.executable, str(ROOT / "experiments" / "main.py"), *_overrides(pair, *extra), f"hydra.run.dir={out}"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


def _main_here(pair: Path, out: Path, capsys, *extra: str) -> tuple[int, str]:
    """The same job in this process (no second interpreter start): its exit code and output."""
    from ddtree import presets

    spec = importlib.util.spec_from_file_location("main_job", ROOT / "experiments" / "main.py")
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    overrides = _overrides(pair, *extra)
    code = job.run(presets.compose(None, overrides, "main"), out, overrides)
    return code, capsys.readouterr().out


def test_main_job_prints_every_strategy_at_both_temperatures_and_resumes(tmp_path, capsys):
    pair, out = tiny_pair(tmp_path / "pair"), tmp_path / "out"
    proc = _main(pair, out)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "humaneval: 1 of 1 prompts" in proc.stdout and "heldout: 1 of 1 prompts" in proc.stdout
    assert "tau: mean acceptance length" in proc.stdout
    rows = json.loads((out / "tables.json").read_text())["ddtree-pair"]
    for name in ("humaneval", "heldout"):
        got = {(r["strategy"], r["temperature"]) for r in rows[name]}
        assert got == {(s, t) for s in STRATEGIES for t in (0.0, 1.0)}
        for r in rows[name]:
            assert r["responses"] == 1 and r["tau"] >= 1.0 and r["tokens_per_second"] > 0
            assert r["speedup"] == 1.0 if r["strategy"] == "ar" else r["speedup"] > 0
    meta = json.loads((out / "humaneval" / "ddtree-8_T0" / "run.json").read_text())
    assert meta["preset"] == "ddtree" and meta["parts"]["budget"] == 8 and meta["strategy"] == "ddtree-8"
    code, stdout = _main_here(pair, out, capsys)  # the same command again: everything is recorded
    assert code == 0 and "reused" in stdout
    assert json.loads((out / "tables.json").read_text())["ddtree-pair"] == rows

    # A user's prompt file instead of the two sets, and a time cap that says what it cut.
    prompts = tmp_path / "mine.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"def f{i}(x):\n"}) + "\n" for i in range(3)))
    code, stdout = _main_here(pair, tmp_path / "mine", capsys, "data=jsonl", f"data.path={prompts}",
                              "strategies=[ar,ddtree-8]", "temperatures=[0]", "max_seconds=0")
    assert code == 0 and "jsonl: 1 of 3 prompts" in stdout
    assert "time cap: jsonl stopped after 1 of 3 prompts" in stdout


def test_main_job_runs_both_pairs_in_turn_the_hybrid_one_on_its_own_mtp_layer(tmp_path, capsys):
    qwen3, hybrid = tiny_pair(tmp_path / "qwen3"), tiny_pair(tmp_path / "hybrid", hybrid=True)
    code, stdout = _main_here(None, tmp_path / "out", capsys, f"pairs.pair={qwen3}", f"pairs.pair_hybrid={hybrid}",
                              "strategies=[ar,mtp,ddtree-8]", "temperatures=[0]", "~prompt_sets.heldout")
    assert code == 0
    assert "ddtree-pair as " in stdout and "ddtree-pair-hybrid as HybridTarget" in stdout
    tables = json.loads((tmp_path / "out" / "tables.json").read_text())
    assert list(tables) == ["pair", "pair_hybrid"]
    for name in tables:
        assert {r["strategy"] for r in tables[name]["humaneval"]} == {"ar", "mtp", "ddtree-8"}
        assert all(r["responses"] == 1 for r in tables[name]["humaneval"])
    meta = json.loads((tmp_path / "out" / "pair_hybrid" / "humaneval" / "mtp_T0" / "run.json").read_text())
    assert meta["parts"]["drafter"] == "MTPDrafter"
