"""Training end to end: trained drafters accept under the decoding loop, reload unchanged, and
the GPU pipeline script runs start to finish on a CPU at toy size."""

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch

from ddtree import SpeculativeEngine
from ddtree.drafters import DFlashDrafter, NullDrafter
from ddtree.drafters.mtp import MTPDrafter
from ddtree.masks import DenseMaskCompiler
from ddtree.models import DFlashDraftModel, HFTarget
from ddtree.models.mtp import MTPHead
from ddtree.testing import tiny_target
from ddtree.training.corpus import build_corpus, is_heldout, write_corpus
from ddtree.training.dflash import DFlashTrainConfig, new_dflash, train_dflash
from ddtree.training.loop import Budget, OptimConfig
from ddtree.training.mtp import MTPTrainConfig, train_mtp
from ddtree.training.pair import load_pair
from ddtree.training.sequences import regenerate
from ddtree.trees import ChainTreeBuilder
from ddtree.verifiers import GreedyVerifier

ROOT = Path(__file__).resolve().parents[2]


def shipped_pair():
    """experiments/shipped_pair.py as a module (it imports its sibling pair_pipeline.py)."""
    spec = importlib.util.spec_from_file_location("shipped_pair", ROOT / "experiments" / "shipped_pair.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def setting():
    """A tiny random target and its own greedy continuations (repetitive, hence learnable)."""
    model = tiny_target("qwen3")
    prompts = torch.randint(0, 90, (64, 8), generator=torch.Generator().manual_seed(0))
    data = regenerate(model, prompts, new_tokens=56, eos_token_id=None, pad_token_id=0, batch_size=64, log=None)
    return model, data


def _decode(model, drafter):
    """Mean acceptance on fresh prompts, checking every output against the target's greedy text."""
    target = HFTarget(model)
    taus = []
    for seed in range(6):
        prompt = torch.randint(0, 90, (8,), generator=torch.Generator().manual_seed(100 + seed))
        ar = SpeculativeEngine(target, NullDrafter(), ChainTreeBuilder(), DenseMaskCompiler(), GreedyVerifier())
        expected = ar.generate(prompt, max_new_tokens=40).tokens
        engine = SpeculativeEngine(target, drafter(target), ChainTreeBuilder(), DenseMaskCompiler(), GreedyVerifier())
        result = engine.generate(prompt, max_new_tokens=40)
        assert result.tokens == expected  # lossless, whatever the drafter learnt
        taus.append(result.mean_acceptance)
    return sum(taus) / len(taus), taus


def test_trained_dflash_drafter_accepts_and_reloads_unchanged(setting, tmp_path):
    model, data = setting
    drafter = new_dflash(model, mask_token_id=95, block_size=8, num_layers=1, num_taps=2)
    untrained, _ = _decode(model, lambda t: DFlashDrafter(drafter, t))
    cfg = DFlashTrainConfig(batch_size=8, anchors=8, optim=OptimConfig(lr=3e-3))
    train_dflash(drafter, model, data, cfg, Budget(max_steps=200), log=None)
    tau, taus = _decode(model, lambda t: DFlashDrafter(drafter, t))
    assert tau > 2.0 and tau > untrained + 1.0, (untrained, taus)
    drafter.save_pretrained(tmp_path)
    loaded = DFlashDraftModel.from_pretrained(tmp_path)
    assert _decode(model, lambda t: DFlashDrafter(loaded, t)) == (tau, taus)


def test_trained_mtp_head_accepts_and_reloads_unchanged(setting, tmp_path):
    model, data = setting
    head = MTPHead.for_target(model).float()
    cfg = MTPTrainConfig(batch_size=16, depth=3, optim=OptimConfig(lr=3e-3))
    train_mtp(head, model, data, cfg, Budget(max_steps=60), log=None)
    tau, taus = _decode(model, lambda t: MTPDrafter(head, t, steps=3))
    assert tau > 1.5, taus
    head.save_pretrained(tmp_path)
    loaded = MTPHead.from_pretrained(tmp_path)
    assert _decode(model, lambda t: MTPDrafter(loaded, t, steps=3)) == (tau, taus)


def _tiny_corpus(path: Path) -> Path:
    """A fake Lib/ of small, regular modules, a few of them in the held-out bucket."""
    lib, names, heldout = path / "Lib", [], 0
    i = 0
    while len(names) < 30 or heldout < 2:
        name = f"mod{i}"
        i += 1
        if is_heldout(name) and heldout >= 2:
            continue
        heldout += is_heldout(name)
        names.append(name)
    lib.mkdir(parents=True)
    for k, name in enumerate(names):
        body = "".join(f"def f{j}(x):\n    return x + {j * k}\n\n\n" for j in range(12))
        (lib / f"{name}.py").write_text(f'"""Module {name}."""\n\n\n{body}class C{k}:\n    value = {k}\n')
    return write_corpus(build_corpus(lib), path / "corpus.jsonl", source="test")


def test_gpu_pipeline_script_runs_end_to_end_on_cpu(tmp_path):
    corpus = _tiny_corpus(tmp_path / "c")
    out, work = tmp_path / "out", tmp_path / "work"
    env = {**os.environ, "OUT": str(out), "WORK": str(work), "CORPUS": str(corpus), "PRESET": "smoke",
           "PYTHON": sys.executable, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(["bash", str(ROOT / "experiments" / "make_shipped_pair.sh"), "device=cpu", "assets=null"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    files = sorted(p.name for p in out.iterdir())
    assert files[:3] == ["README.md", "metrics.json", "pair.tar.part-00"] and len(files) <= 8
    assert all(p.stat().st_size <= 15 * 2**20 for p in out.iterdir())
    with open(tmp_path / "pair.tar", "wb") as f:
        for part in sorted(out.glob("pair.tar.part-*")):
            f.write(part.read_bytes())
    with tarfile.open(tmp_path / "pair.tar") as tar:
        tar.extractall(tmp_path / "unpacked", filter="data")
    pair = load_pair(tmp_path / "unpacked" / "pair")
    assert pair.dflash is not None and pair.mtp is not None and len(pair.prompts) == 2
    # The evaluate stage: the main job's strategies (configs/main.yaml) that the smoke preset names,
    # decoded by ddtree.presets.run_comparison, recorded in the rows the card has always read.
    tau = pair.metrics["tau"]
    assert [r["strategy"] for r in tau] == ["ar", "mtp", "dflash", "ddtree-16"] * 2
    assert [r["temperature"] for r in tau] == [0.0] * 4 + [1.0] * 4
    assert {r["responses"] for r in tau} == {2} and tau[0]["speedup"] == 1.0
    shipped = ROOT / "assets" / "pair" / "metrics.json"
    if shipped.is_file():
        assert set(tau[0]) == set(json.loads(shipped.read_text())["tau"][0])
    assert (work / "evaluate" / "heldout" / "ddtree-16_T1" / "records.jsonl").is_file()  # the main job's records
    assert 1.0 <= pair.metrics["dflash"]["heldout_decode_tau"] <= 8  # read off 2 greedy held-out continuations
    card = (tmp_path / "unpacked" / "pair" / "README.md").read_text()
    assert "DFlash decode tau on 2 greedy held-out continuations" in card
    assert "Held-out perplexity" in card and "n/a" not in card and "| ddtree-16 |" in card
    assert not (work / ".hydra").exists() and not list(work.glob("*.log"))  # Hydra wrote nothing of its own
    # Resumable: every stage left its record, so a second run skips them all.
    script, logs = shipped_pair(), []
    common = [f"corpus={corpus}", "device=cpu"]
    script.run(script.compose([*common, f"work={work}"]), log=logs.append)
    assert sum("skipped" in line for line in logs) == 6
    # Continued: the same target's drafters train on from the finished pair's weights.
    earlier = tmp_path / "unpacked" / "pair"
    again = [*common, f"work={tmp_path / 'again'}", "pipeline/preset=smoke", f"reuse_target={earlier}",
             f"continue_from={earlier}", "seed=1", "stages=[tokenizer,target,regenerate,dflash,mtp]",
             "dflash_budget.max_steps=3", "mtp_budget.max_steps=2", "dflash_layers=2", "dflash_tap_layers=[1,2]"]
    metrics = script.run(script.compose(again), log=logs.append)
    assert metrics["dflash"]["steps"] == 3 and metrics["dflash"]["continued_from"]["steps"] == 20
    assert metrics["mtp"]["continued_from"]["steps"] == 20
    assert {"heldout_decode_tau", "heldout_decode_tau_before"} <= set(metrics["dflash"])
    assert metrics["dflash"]["layers"] == 2 and metrics["dflash"]["taps"] == [1, 2]  # grown, then trained
    assert any("grown from 1 layers, taps [1] to 2 layers, taps [1, 2]" in line for line in logs)
    card = (tmp_path / "again" / "pair" / "README.md").read_text()
    assert "| 20 + 3 |" in card and "| 20 + 2 |" in card and "continued from an earlier build" in card
    pipeline = sys.modules["pair_pipeline"]
    broken = dataclasses.replace(script.from_config(script.compose(again)), continue_from=tmp_path / "nothing")
    with pytest.raises(FileNotFoundError, match="no dflash/ checkpoint"):
        pipeline.stage_dflash(pipeline.Run(broken, print))
