"""The main job runs on a pair directory (tiny random models here) and prints the full table."""

import json
import os
import subprocess
import sys
from pathlib import Path

from ddtree.training.pair import tiny_pair

ROOT = Path(__file__).resolve().parents[2]
STRATEGIES = ("ar", "mtp", "dflash", "ddtree-8", "ddtree-16")


def test_main_job_prints_every_strategy_at_both_temperatures(tmp_path):
    pair = tiny_pair(tmp_path / "pair")
    out = tmp_path / "rows.json"
    cmd = [sys.executable, str(ROOT / "experiments" / "main.py"), "--pair", str(pair), "--humaneval", "2",
           "--heldout", "2", "--max-new-tokens", "8", "--budgets", "8,16", "--threads", "1", "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "humaneval: 2 prompts" in proc.stdout and "heldout: 2 prompts" in proc.stdout
    rows = json.loads(out.read_text())
    for name in ("humaneval", "heldout"):
        got = {(r["strategy"], r["temperature"]) for r in rows[name]}
        assert got == {(s, t) for s in STRATEGIES for t in (0.0, 1.0)}
        for r in rows[name]:
            assert r["responses"] == 2 and r["tau"] >= 1.0 and r["tokens_per_second"] > 0
            assert r["speedup"] == 1.0 if r["strategy"] == "ar" else r["speedup"] > 0
