"""Lossless decoding on a hybrid Gated DeltaNet / attention target (tiny Qwen3.5, fp32, CPU).

T = 0 greedy identity for every strategy is in test_lossless_greedy (family qwen35). T > 0: the first
tokens follow the target's exact distribution (chi-square, as test_lossless_sampling). And the
danger is real: a crop-based rollback, which leaves the GDN recurrent state holding rejected
tokens, changes the output, so these tests would catch a regression to ``crop``.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ddtree import SpeculativeEngine
from ddtree.drafters import NullDrafter, OracleDrafter
from ddtree.masks import DenseMaskCompiler
from ddtree.models import HFTarget, HybridTarget
from ddtree.testing import (CHECK_ALPHA, CHECK_NEW, CHECK_PROMPT, CHECK_VOCAB, chi_square_p_value,
                            continuation_distribution, greedy_reference, sample_continuations, tiny_hybrid_target)
from ddtree.trees import BestFirstTreeBuilder, ChainTreeBuilder
from ddtree.verifiers import GreedyVerifier, SamplingVerifier

NEW_TOKENS = 64
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model():
    return tiny_hybrid_target()


def _prompt(length: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 90, (length,), generator=torch.Generator().manual_seed(seed))


def _greedy_reference(model, prompt, new_tokens=NEW_TOKENS):
    return greedy_reference(model, prompt, new_tokens)


def _oracle(model):
    return OracleDrafter(model, depth=7, swap_prob=0.3, sharpness=10)


# ---------------------------------------------------------------- the danger is real


class CropRollbackTarget(HybridTarget):
    """The naive rollback this library must never regress to: a plain forward over the chain (which
    commits every drafted token into the GDN layers), then the rejected tokens' K/V rows dropped, as
    a cache ``crop`` does. The GDN layers keep the rejected tokens: transformers' own ``crop`` rolls
    back their conv windows (and, from 5.25, recurrent states only where a history was recorded)."""

    def forward_tree(self, inputs):
        return HFTarget.forward_tree(self, inputs)

    def commit(self, path):
        assert list(path) == list(range(len(path))), "a crop can only keep a chain's prefix"
        HFTarget.commit(self, path)  # the attention layers' rows; the GDN states stay as the forward left them


def test_crop_rollback_changes_the_output(model):
    prompt = _prompt(13, seed=13)
    expected = _greedy_reference(model, prompt)
    parts = (_oracle(model), ChainTreeBuilder(), DenseMaskCompiler(), GreedyVerifier())
    naive = SpeculativeEngine(CropRollbackTarget(model), *parts).generate(prompt, max_new_tokens=NEW_TOKENS)
    assert naive.mean_acceptance < 7.5  # drafts were rejected, so crop had real work to do
    assert naive.tokens != expected, "crop-based rollback should corrupt the GDN state"
    parts = (_oracle(model), ChainTreeBuilder(), DenseMaskCompiler(), GreedyVerifier())
    assert SpeculativeEngine(HybridTarget(model), *parts).generate(prompt, max_new_tokens=NEW_TOKENS).tokens == expected


# ---------------------------------------------------------------- T > 0


# The same 4-token vocabulary, prompt and 3-token continuations as test_lossless_sampling.
VOCAB, NEW, PROMPT, ALPHA = CHECK_VOCAB, CHECK_NEW, CHECK_PROMPT, CHECK_ALPHA
SAMPLES = 600


@pytest.fixture(scope="module")
def small_vocab_model():
    model = tiny_hybrid_target(vocab_size=VOCAB, seed=1)
    with torch.no_grad():  # a little more peaked, so trees are accepted often
        model.get_output_embeddings().weight.mul_(3.0)
    return model


@pytest.mark.parametrize("name, temperature", [("ar", 1.0), ("ddtree-oracle", 1.0)])
def test_first_tokens_follow_the_target_distribution(small_vocab_model, name, temperature):
    model = small_vocab_model
    drafter = NullDrafter() if name == "ar" else OracleDrafter(model, depth=NEW - 1, sharpness=2.0)
    tree = ChainTreeBuilder() if name == "ar" else BestFirstTreeBuilder(6)
    engine = SpeculativeEngine(HybridTarget(model), drafter, tree, DenseMaskCompiler(), SamplingVerifier(temperature))
    counts, accepted = sample_continuations(engine, PROMPT, NEW, SAMPLES)
    p_value = chi_square_p_value(counts, continuation_distribution(model, PROMPT, NEW, temperature), SAMPLES)
    assert p_value > ALPHA, f"{name} at T={temperature}: chi-square p = {p_value:.2e}"
    if name != "ar":  # only meaningful if drafts are accepted
        assert accepted > 0.3 * SAMPLES


# ---------------------------------------------------------------- the GPU benchmark, smoke-tested


def test_verify_bench_runs_on_cpu(tmp_path):
    out = tmp_path / "bench.json"
    cmd = [sys.executable, str(REPO / "experiments" / "hybrid_verify_bench.py"), "--device", "cpu",
           "--dtype", "float32",
           "--layers", "4", "--hidden-size", "64", "--intermediate-size", "96", "--heads", "4", "--kv-heads", "2",
           "--head-dim", "16", "--gdn-key-heads", "2", "--gdn-value-heads", "4", "--gdn-head-dim", "16",
           "--vocab", "128", "--prompt", "32", "--sizes", "1", "16", "--warmup", "1", "--reps", "2",
           "--check-layers", "4", "--check-tokens", "8", "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=REPO, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(out.read_text())
    assert [row["nodes"] for row in report["timings"]] == [1, 16]
    assert all(row["hybrid_verify_ms"] > 0 and row["hf_forward_ms"] > 0 for row in report["timings"])
    assert report["greedy_check"]["tokens"] == 8 and report["greedy_check"]["equal"]  # fp32: exact
    assert "| nodes |" in run.stdout


@pytest.mark.parametrize("geometry", ["qwen3.6-27b", "qwen3-8b"])
def test_profile_runs_on_cpu(tmp_path, geometry):
    out = tmp_path / "profile.json"
    cmd = [sys.executable, str(REPO / "experiments" / "round_profile.py"), "--tiny", "--device", "cpu",
           "--geometry", geometry, "--prompt", "16", "--sizes", "1", "9", "--reps", "1", "--top", "3",
           "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=REPO, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(out.read_text())
    assert list(report["sizes"]) == ["1", "9"] and report["device"] == "cpu"
    for row in report["sizes"].values():
        assert row["graphed_verify_ms"] > 0 and row["eager_commit_ms"] > 0 and len(row["top"]) == 3
        assert abs(sum(row["by_kind_ms"].values()) - row["profiled_ms"]) < 1e-6
        assert row["gap_ms"] == pytest.approx(row["graphed_verify_ms"] - row["profiled_ms"])
    assert report["weight_read_ms"] > 0
    assert list(report["drafters"]) == (["dflash", "mtp"] if geometry == "qwen3.6-27b" else ["dflash"])  # the drafts of a round, profiled the same way
    assert all(row["eager_ms"] > 0 and len(row["top"]) == 3 for row in report["drafters"].values())


def test_profile_of_whole_rounds_splits_them_by_stage(tmp_path):
    out = tmp_path / "profile.json"
    cmd = [sys.executable, str(REPO / "experiments" / "round_profile.py"), "--tiny", "--device", "cpu",
           "--geometry", "qwen3.6-27b", "--prompt", "16", "--sizes", "1", "--reps", "1", "--top", "4",
           "--drafters", "--loop", "0", "8", "--loop-rounds", "3", "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    loop = json.loads(out.read_text())["loop"]
    assert list(loop) == ["0", "8"]
    for budget, row in loop.items():
        stages = row["stages"]
        assert row["rounds"] >= 2 and {"tree", "layout", "verify", "commit"} <= set(stages)
        assert stages["verify"]["wall_ms"] > 0 and stages["verify"]["host_ops_ms"] > 0
        assert len(stages["verify"]["top"]) == 4 and stages["verify"]["kernels"] == 0  # no GPU here
    assert loop["8"]["stages"]["draft"]["host_ops_ms"] > loop["0"]["stages"]["draft"]["host_ops_ms"]
    assert "== loop, DDTree-8" in run.stdout


def test_the_triton_tree_kernels_and_commit_decode_greedy_under_the_interpreter(model, monkeypatch):
    """The hybrid fast path with its Triton kernels forced on, run by Triton's interpreter on the CPU: the
    one-launch prologue (beta's sigmoid included), the tree delta rule and the one-pass commit of the
    recurrent states, through whole DDTree and AR decodes: the target's greedy tokens."""
    pytest.importorskip("triton")
    from ddtree.models import gdn_tree_triton
    from ddtree.models.hybrid_static import StaticHybridTarget
    from ddtree.testing import triton_interpreted

    calls = {"commit_state": 0, "tree_prologue": 0}
    for name in calls:
        real = getattr(gdn_tree_triton, name)
        monkeypatch.setattr(gdn_tree_triton, name, lambda *a, _real=real, _name=name, **k: calls.__setitem__(
            _name, calls[_name] + 1) or _real(*a, **k))
    with triton_interpreted("ddtree.models.gdn_tree_kernels", gdn_tree_triton._kernels):
        target = StaticHybridTarget(model, max_length=256, cuda_graphs=False, fuse=False, fuse_projections=False)
        target.triton = True  # what a GPU with Triton gets; the interpreter runs the kernels here
        assert target.kernels()["commit"].startswith("Triton")
        for drafter, tree in ((_oracle(model), BestFirstTreeBuilder(12)), (NullDrafter(), ChainTreeBuilder())):
            engine = SpeculativeEngine(target, drafter, tree, verifier=GreedyVerifier())
            prompt = _prompt(9, seed=4)
            assert engine.generate(prompt, max_new_tokens=24).tokens == _greedy_reference(model, prompt, 24)
    assert calls["commit_state"] > 0 and calls["tree_prologue"] > 0
