"""The main job (a Hydra app over the strategy presets) runs on a pair directory (tiny random
models here), prints every strategy at both temperatures, writes records make_tables reads,
and resumes: a rerun decodes nothing."""

import json
import os
import subprocess
import sys
from pathlib import Path

from ddtree.training.pair import tiny_pair

ROOT = Path(__file__).resolve().parents[2]
STRATEGIES = ("ar", "mtp", "dflash", "ddtree-8", "ddtree-16")


def _main(pair: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(ROOT / "experiments" / "main.py"), f"target.dir={pair}",
           "+strategy_specs.ddtree-8=['experiment=ddtree','tree.budget=8']", f"strategies=[{','.join(STRATEGIES)}]",
           "prompt_sets.humaneval.limit=2", "prompt_sets.heldout.limit=2", "max_new_tokens=8", "warmup_tokens=2",
           "progress=false", f"hydra.run.dir={out}", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_main_job_prints_every_strategy_at_both_temperatures_and_resumes(tmp_path):
    pair, out = tiny_pair(tmp_path / "pair"), tmp_path / "out"
    proc = _main(pair, out)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "humaneval: 2 of 2 prompts" in proc.stdout and "heldout: 2 of 2 prompts" in proc.stdout
    assert "tau: mean acceptance length" in proc.stdout
    rows = json.loads((out / "tables.json").read_text())
    for name in ("humaneval", "heldout"):
        got = {(r["strategy"], r["temperature"]) for r in rows[name]}
        assert got == {(s, t) for s in STRATEGIES for t in (0.0, 1.0)}
        for r in rows[name]:
            assert r["responses"] == 2 and r["tau"] >= 1.0 and r["tokens_per_second"] > 0
            assert r["speedup"] == 1.0 if r["strategy"] == "ar" else r["speedup"] > 0
    meta = json.loads((out / "humaneval" / "ddtree-8_T0" / "run.json").read_text())
    assert meta["preset"] == "ddtree" and meta["parts"]["budget"] == 8 and meta["strategy"] == "ddtree-8"
    again = _main(pair, out)
    assert again.returncode == 0 and "reused" in again.stdout
    assert json.loads((out / "tables.json").read_text()) == rows


def test_main_job_takes_a_prompt_file_and_says_what_a_time_cap_cut(tmp_path):
    pair, out = tiny_pair(tmp_path / "pair"), tmp_path / "out"
    prompts = tmp_path / "mine.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"def f{i}(x):\n"}) + "\n" for i in range(3)))
    proc = _main(pair, out, "data=jsonl", f"data.path={prompts}", "strategies=[ar,ddtree-8]", "temperatures=[0]",
                 "max_seconds=0")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "jsonl: 1 of 3 prompts" in proc.stdout
    assert "time cap: jsonl stopped after 1 of 3 prompts" in proc.stdout
