"""experiments/run.py and make_tables.py end to end on tiny random models (CPU, no downloads).

A 2 x 2 multirun (two budgets, two temperatures) next to an AR run, one of its jobs resumed from a
pre-written record, a prompt too long for the context skipped by name, and Table 1 equal to the
numbers computed from the records by hand. Then the bad-input errors users see.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from statistics import fmean

import pytest

from ddtree.metrics import mean_of_means

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "experiments" / "run.py"
COMMON = ["data=jsonl", "max_new_tokens=12", "warmup_tokens=2", "progress=false", "target.model.max_length=80"]
PROMPTS = [{"id": "hello", "prompt": "Say hello."}, {"id": "fruit", "turns": ["Name a fruit.", "And a vegetable?"]},
           {"id": "long", "prompt": "x" * 100}]  # 100 + 12 tokens > the 80-token context


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HYDRA_FULL_ERROR": "0"}
    env.pop("RANK", None), env.pop("WORLD_SIZE", None)
    return subprocess.run([sys.executable, str(RUN), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def experiments_run():
    spec = importlib.util.spec_from_file_location("experiments_run", RUN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for f in sorted(run_dir.glob("records*.jsonl")) for line in f.read_text().splitlines()]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """AR at T = 0, 1 and DDTree at B = 4, 8 x T = 0, 1, one job started from a pre-written record."""
    root = tmp_path_factory.mktemp("sweep")
    data = root / "prompts.jsonl"
    data.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    common = [*COMMON, f"data.path={data}", f"hydra.sweep.dir={root / 'multirun'}"]

    # An interrupted job: the first response is already recorded (a marker no run would write).
    # Run directories are named by the sorted overrides (hydra.job.override_dirname, made flat).
    overrides = sorted([*COMMON[:3], f"data.path={data}", *COMMON[4:], "drafter=dflash_random",
                        "experiment=ddtree", "temperature=0", "tree.budget=4"])
    job = root / "multirun" / experiments_run().run_dirname(",".join(overrides))
    job.mkdir(parents=True)
    marker = {"key": "0:0", "prompt_id": "hello", "index": 0, "turn": 0, "tokens": [7, 8], "text": "pre-written",
              "acceptance_lengths": [2], "tpot": 0.5, "marker": True}
    (job / "records.jsonl").write_text(json.dumps(marker) + "\n")

    ar = run("-m", "experiment=ar", "temperature=0,1", *common, cwd=root)
    assert ar.returncode == 0, ar.stderr[-3000:]
    tree = run("-m", "experiment=ddtree", "drafter=dflash_random", "tree.budget=4,8", "temperature=0,1", *common,
               cwd=root)
    assert tree.returncode == 0, tree.stderr[-3000:]
    return root, job, ar.stdout + ar.stderr + tree.stdout + tree.stderr


def test_the_multirun_completes_every_job(sweep) -> None:
    root, _, _ = sweep
    jobs = sorted(p.parent for p in (root / "multirun").rglob("run.json"))
    assert len(jobs) == 2 + 4
    for job in jobs:
        assert sorted(r["key"] for r in records(job)) == ["0:0", "1:0", "1:1"]  # "long" was skipped
        meta = json.loads((job / "run.json").read_text())
        assert meta["parts"]["drafter"] in {"NullDrafter", "DFlashDrafter"} and meta["model"] == "tiny-qwen3"


def test_a_resumed_job_computes_only_the_missing_responses(sweep) -> None:
    _, job, log = sweep
    mine = records(job)
    assert mine[0]["marker"] is True and mine[0]["text"] == "pre-written"  # kept, not recomputed
    assert sum(r["key"] == "0:0" for r in mine) == 1 and len(mine) == 3
    assert "computed 2, reused 1, skipped 1" in (job / "run.log").read_text()


def test_a_prompt_too_long_for_the_context_is_skipped_with_its_name(sweep) -> None:
    _, job, _ = sweep
    text = (job / "run.log").read_text()
    assert "skipping prompt long (turn 0)" in text and "longer than the target's context of 80 tokens" in text


def test_make_tables_equals_the_numbers_from_the_records(sweep, tmp_path) -> None:
    root, _, _ = sweep
    spec = importlib.util.spec_from_file_location("make_tables", ROOT / "experiments" / "make_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main([str(root / "multirun"), "--out", str(tmp_path), "--compare-paper"]) == 0
    rows = {float(r["temperature"]): r for r in csv.DictReader(open(tmp_path / "table1.csv"))}
    assert set(rows) == {0.0, 1.0}

    jobs = {}
    for meta_file in (root / "multirun").rglob("run.json"):
        parts = json.loads(meta_file.read_text())["parts"]
        jobs[(parts["drafter"], parts["budget"], parts["temperature"])] = records(meta_file.parent)
    for temperature, row in rows.items():
        ar_tpot = fmean(r["tpot"] for r in jobs[("NullDrafter", None, temperature)])
        by_budget = {b: jobs[("DFlashDrafter", b, temperature)] for b in (4, 8)}
        speedup = {b: ar_tpot / fmean(r["tpot"] for r in recs) for b, recs in by_budget.items()}
        best = max(speedup, key=speedup.get)
        assert int(row["ddtree_budget"]) == best
        assert float(row["ddtree_speedup"]) == pytest.approx(speedup[best], rel=1e-12)
        assert float(row["ddtree_tau"]) == pytest.approx(
            mean_of_means(r["acceptance_lengths"] for r in by_budget[best]), rel=1e-12)
        assert row["dflash_speedup"] == "" and int(row["n_ddtree"]) == 3
    assert (tmp_path / "table1.md").read_text().count("tiny-qwen3") == 2
    assert "\\begin{tabular}" in (tmp_path / "table1.tex").read_text()
    if importlib.util.find_spec("matplotlib"):
        assert len(list(tmp_path.glob("fig3_*.png"))) == 2 and len(list(tmp_path.glob("fig4_*.png"))) == 2


@pytest.mark.parametrize(("override", "message"), [
    ("tree.budget=-1", "tree budget must be a non-negative integer (nodes below the root), got -1"),
    ("temperature=-1", "temperature must be a number >= 0, got -1"),
])
def test_bad_knobs_reach_the_user_before_any_weights_load(override, message, tmp_path) -> None:
    out = run("experiment=ddtree", "drafter=dflash_random", override, *COMMON, "data.path=unused.jsonl",
              f"hydra.run.dir={tmp_path}", cwd=tmp_path)
    assert out.returncode != 0
    assert message in out.stderr
    assert not list(tmp_path.glob("records*.jsonl"))


def test_run_directories_are_flat_deterministic_names() -> None:
    name = experiments_run().run_dirname
    assert name("") == "defaults"
    assert name("data.path=/data/gsm8k.jsonl,data=jsonl") == "data.path=_data_gsm8k.jsonl,data=jsonl"
    long = ",".join(f"knob{i}=/some/long/path/{i}" for i in range(20))
    assert len(name(long)) < 200 and name(long) == name(long) != name(long + "x")


def test_the_fast_path_forced_on_decodes_the_same_tokens(tmp_path) -> None:
    # fast=true puts the tiny target on StaticTarget (on a CPU: no CUDA graphs); the responses
    # must equal those of the plain path token for token.
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS[:2]))
    tokens = {}
    for fast in ("true", "false"):
        out = run("experiment=ddtree", "drafter=dflash_random", "tree.budget=8", f"fast={fast}", *COMMON,
                  f"data.path={data}", f"hydra.run.dir={tmp_path / fast}", cwd=tmp_path)
        assert out.returncode == 0, out.stderr[-3000:]
        tokens[fast] = [r["tokens"] for r in sorted(records(tmp_path / fast), key=lambda r: r["key"])]
    assert tokens["true"] == tokens["false"] and len(tokens["true"]) == 3


@pytest.mark.parametrize("override, name", [([], "null"), (["mask=tree"], "tree"), (["mask=dense"], "dense")])
def test_speed_takes_mask_on_its_command_line(override, name, tmp_path):
    """`experiments/speed.py mask=tree` picks the mask group's config as the run configs do, and
    speed.py reads its name off `mask_name` (a plain `mask` key was refused by Hydra)."""
    script = Path(__file__).resolve().parents[2] / "experiments" / "speed.py"
    out = subprocess.run([sys.executable, str(script), *override, "--cfg", "job", "--resolve"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"mask_name: {name}" in out.stdout.splitlines()


@pytest.mark.parametrize("mask", [None, "tree"])
def test_speed_takes_its_strategies_from_the_presets(mask):
    """speed.py builds every preset of `strategies` (a tree preset once per budget) through the
    presets, on both paths, with their mask compiler or the one `mask` names; they all decode the
    greedy text (the timing itself needs a GPU)."""
    import importlib.util

    import torch
    from omegaconf import OmegaConf

    from ddtree.models import HFTarget
    from ddtree.models.static_target import StaticTarget
    from ddtree.testing import greedy_reference, tiny_dflash, tiny_target

    spec = importlib.util.spec_from_file_location("speed", Path(__file__).resolve().parents[2] / "experiments" / "speed.py")
    speed = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(speed)
    model = tiny_target("qwen3")
    cfg = OmegaConf.create({"strategies": ["ar", "dflash", "ddtree", "mtp_tree"], "budgets": [4, 16],
                            "paths": ["eager", "fast"], "max_length": 256, "cuda_graphs": True, "tree_method": "auto",
                            "mask_name": mask})
    fast = StaticTarget(model, max_length=256, cuda_graphs=False)
    from ddtree.models import MTPHead

    built = list(speed._strategies(cfg, HFTarget(model), fast, tiny_dflash(model, block_size=8), MTPHead.for_target(model)))
    assert [(label, path) for label, path, _ in built] == [
        (s, p) for s in ("ar", "dflash", "ddtree-4", "ddtree-16", "mtp_tree-4", "mtp_tree-16") for p in ("eager", "fast")]
    prompt = torch.arange(4, 20)
    want = greedy_reference(model, prompt, 16)
    for label, path, engine in built:
        # unset: the presets' mask=auto, the tree block for the fast target and a dense mask for the eager one
        tree = mask == "tree" or (mask is None and path == "fast")
        assert type(engine.mask_compiler).__name__ == ("TreeMaskCompiler" if tree else "DenseMaskCompiler")
        assert engine.generate(prompt, max_new_tokens=16).tokens == want, (label, path)
        if label.startswith("mtp"):  # the fast path's MTP drafter: its static cache (op by op off the GPU)
            assert (engine.drafter._chain is not None) == (path == "fast"), (label, path)


def test_calibrate_tree_fits_and_writes_a_config_the_builder_reads(tmp_path):
    """experiments/calibrate_tree.py on the shipped pair (one short prompt): a config that composes."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    script = Path(__file__).resolve().parents[2] / "experiments" / "calibrate_tree.py"
    out = tmp_path / "calibrated.yaml"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    done = subprocess.run([sys.executable, str(script), "--limit", "1", "--max-new-tokens", "24", "--threads", "1",
                           "--out", str(out)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "NLL fit" in done.stdout and "1 prompts" in done.stdout
    builder = instantiate(OmegaConf.load(out), budget=16)
    assert type(builder).__name__ == "CalibratedTreeBuilder" and builder.temperatures.numel() == 15


def test_decode_tau_reads_the_main_jobs_dflash_tau_off_teacher_forcing(tmp_path):
    """experiments/decode_tau.py on the hybrid pair: the tau the main job decodes, from a cached continuation."""
    script = Path(__file__).resolve().parents[2] / "experiments" / "decode_tau.py"
    cache = tmp_path / "greedy.safetensors"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    args = [sys.executable, str(script), "--limit", "2", "--max-new-tokens", "24", "--threads", "1", "--cache", str(cache)]
    first = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    again = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert "greedy continuations of 2 prompts from" in again.stdout  # the cache, not the target, this time
    main_job = subprocess.run(
        [sys.executable, str(Path(script).parent / "main.py"), "target=pair_hybrid", "data=humaneval-code", "data.limit=2",
         "strategies=[dflash]", "temperatures=[0]", "max_new_tokens=24", "threads=1", f"hydra.run.dir={tmp_path / 'main'}"],
        env=env, capture_output=True, text=True, timeout=300)
    assert main_job.returncode == 0, main_job.stderr[-3000:]
    decoded = next(float(line.split()[2]) for line in main_job.stdout.splitlines() if line.startswith("dflash "))
    walked = float(first.stdout.split("DFlash tau ")[1].split()[0])
    assert round(walked, 2) == decoded and walked > 1.0
    other = subprocess.run([*args, "--drafter", str(script.parents[1] / "assets" / "pair" / "dflash")], env=env,
                           capture_output=True, text=True, timeout=300)  # the Qwen3 pair's drafter: another target
    assert other.returncode == 2 and "DFlash drafter does not match the target" in other.stderr


def test_attention_bench_merges_segments_into_the_whole_prefix_attention():
    """experiments/attention_bench.py's split over keys: segments' outputs merged by their
    log-sum-exps equal attention over the whole prefix (the kernels themselves need a GPU)."""
    import importlib.util

    import torch

    spec = importlib.util.spec_from_file_location(
        "attention_bench", Path(__file__).resolve().parents[2] / "experiments" / "attention_bench.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, rows, 8, generator=gen, dtype=torch.float64) for rows in (5, 12, 12))
    want = torch.softmax(q @ k.transpose(-1, -2), -1) @ v  # [H, R, d]
    outs, lses = [], []
    for part in range(3):  # three segments of 4 keys
        scores = q @ k[:, 4 * part : 4 * part + 4].transpose(-1, -2)
        outs.append(torch.softmax(scores, -1) @ v[:, 4 * part : 4 * part + 4])
        lses.append(scores.logsumexp(-1))
    torch.testing.assert_close(bench.merge(torch.stack(outs), torch.stack(lses)).double(), want)


def test_split_merge_diag_says_it_needs_a_gpu(monkeypatch):
    """experiments/split_merge_diag.py compares GPU kernels: without CUDA it stops with a one-line reason."""
    import importlib.util

    import torch

    spec = importlib.util.spec_from_file_location(
        "split_merge_diag", Path(__file__).resolve().parents[2] / "experiments" / "split_merge_diag.py")
    diag = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(diag)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="no CUDA device"):
        diag.main([])


def test_speed_floors_count_the_verify_s_flops_and_its_nodes():
    """speed.py's FLOP floor: 2 FLOPs per linear weight per token plus 4 x heads x head dim per query
    and key in each attention layer; the verify size read off each row's label."""
    import torch

    from ddtree.testing import tiny_target

    spec = importlib.util.spec_from_file_location("speed", Path(__file__).resolve().parents[2] / "experiments" / "speed.py")
    speed = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(speed)
    assert [speed._verify_nodes(label, 16) for label in ("ar", "dflash", "ddtree-64", "mtp-k3", "mtp_tree-16-k2",
                                                          "oracle")] == [1, 16, 65, 4, 17, None]
    model = tiny_target("qwen3")
    c = model.config
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    want = 2 * linear * 5 + 4 * c.num_hidden_layers * c.num_attention_heads * head_dim * 5 * (100 + 5)
    assert speed._compute_floor_ms(model, 100, 5) == pytest.approx(1e3 * want / speed.PEAK_FLOPS)


def test_gemm_rows_bench_counts_every_linear_weight_once_plain_and_fused(monkeypatch):
    """experiments/gemm_rows_bench.py's shapes: the plain and the fused lists hold the same weights
    (the Qwen3.6-27B geometry on the meta device), and fusing leaves one GEMM per group and layer."""
    spec = importlib.util.spec_from_file_location(
        "gemm_rows_bench", Path(__file__).resolve().parents[2] / "experiments" / "gemm_rows_bench.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    plain, fused = bench.linear_shapes("qwen3.6-27b")
    weights = lambda counter: sum(c * k * o for (k, o), c in counter.items())  # noqa: E731
    assert weights(plain) == weights(fused) == 25_621_954_560
    assert fused[(5120, 10240 + 6144 + 48 + 48)] == 48  # a GDN layer's qkv, z, b and a
    assert fused[(5120, 2 * 17408)] == 64 and fused[(5120, 12288 + 2 * 1024)] == 16
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="no CUDA device"):  # without a GPU: one line, before any work
        bench.main([])
    assert sum(plain.values()) == 64 * 3 + 48 * 5 + 16 * 4 + 1 and sum(fused.values()) == 64 * 2 + 64 * 2 + 1


def test_every_gpu_tables_step_is_a_command_line_its_tool_takes(tmp_path):
    """``gpu_tables.sh`` under ``PRINT=1``: each step's command, as the GPU run would start it, parses:
    speed.py's overrides compose (``--cfg job``), the profilers' flags parse, the suite files exist."""
    script = ROOT / "experiments" / "gpu_tables.sh"
    steps = [s for line in script.read_text().split("# Steps:")[1].split("set -uo")[0].splitlines()
             for s in line.lstrip("# ").split("  ")[0].split() if s]
    env = {**os.environ, "OUT": str(tmp_path), "PRINT": "1", "PYTHON": sys.executable}
    printed = subprocess.run(["bash", str(script), *steps], env=env, capture_output=True, text=True, timeout=60)
    assert printed.returncode == 0, printed.stderr
    lines = printed.stdout.splitlines()
    assert len(lines) == len(steps) >= 10
    for line in lines:
        argv = line.split()[1:]
        if argv[:2] == ["-m", "pytest"]:
            assert (ROOT / argv[4]).is_file(), line
        elif argv[0].endswith("speed.py"):
            check = subprocess.run([sys.executable, *argv, "--cfg", "job"], cwd=ROOT, capture_output=True, text=True,
                                   timeout=120, env={**os.environ, "HYDRA_FULL_ERROR": "1"})
            assert check.returncode == 0, f"{line}\n{check.stderr[-2000:]}"
        else:
            spec = importlib.util.spec_from_file_location("tool", ROOT / argv[0])
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            module.parse_args(argv[1:])
    bad = subprocess.run(["bash", str(script), "no-such-step"], env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "unknown step 'no-such-step'" in bad.stderr


def test_speed_stages_are_those_of_the_timed_rounds(monkeypatch):
    """speed.py's per-stage times are the mean over the same first rounds as its round time, not over the
    tail rounds whose drafts the end of the run cuts (the CUDA calls stood in for on the CPU)."""
    import torch

    from ddtree import SpeculativeEngine
    from ddtree.drafters import DFlashDrafter
    from ddtree.models import HFTarget
    from ddtree.testing import tiny_dflash, tiny_target
    from ddtree.trees import BestFirstTreeBuilder

    spec = importlib.util.spec_from_file_location("speed", ROOT / "experiments" / "speed.py")
    speed = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(speed)
    for name in ("synchronize", "reset_peak_memory_stats"):
        monkeypatch.setattr(torch.cuda, name, lambda *a, **k: None)
    for name in ("memory_allocated", "max_memory_allocated"):
        monkeypatch.setattr(torch.cuda, name, lambda *a, **k: 0)
    model = tiny_target("qwen3")
    target = HFTarget(model)
    engine = SpeculativeEngine(target, DFlashDrafter(tiny_dflash(model, block_size=8), target), BestFirstTreeBuilder(8))
    seen = []
    real = engine.generate
    monkeypatch.setattr(engine, "generate", lambda *a, **k: seen.append(real(*a, **k)) or seen[-1])
    row = speed._time(engine, torch.arange(4, 20), rounds=3, tail=8)
    staged = seen[-1]
    assert len(staged.round_stage_times) > 3  # the tail rounds ran, and are left out
    for stage, ms in row["stages_ms"].items():
        assert ms == pytest.approx(1e3 * sum(getattr(r, stage) for r in staged.round_stage_times[:3]) / 3)


def test_host_stages_bench_times_the_heap_and_the_layout(tmp_path):
    spec = importlib.util.spec_from_file_location("host_bench", ROOT / "experiments" / "host_stages_bench.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "host.json"
    result = bench.main(["--budgets", "4", "16", "--reps", "2", "--out", str(out)])
    assert json.loads(out.read_text()) == result
    assert [row["nodes"] for row in result["rows"]] == [5, 17]
    assert all(row["build_us"] > 0 and row["compile_us"] > 0 for row in result["rows"])


def test_the_loop_profile_counts_only_the_first_rounds_and_no_device_side_ranges():
    """``round_profile.stage_summary``: host ops and kernels go to the host ``stage:`` range they start in,
    up to the end of the asked-for round's commit; the ranges' device-side copies (user annotations) are
    neither ranges nor kernels."""
    from types import SimpleNamespace

    import torch

    spec = importlib.util.spec_from_file_location("round_profile", ROOT / "experiments" / "round_profile.py")
    profile_module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(profile_module)
    cpu, cuda = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA

    def event(name, start, end, device=cpu, self_us=0.0, annotation=False):
        return SimpleNamespace(name=name, device_type=device, time_range=SimpleNamespace(start=start, end=end),
                               thread=1, self_cpu_time_total=self_us, device_time=end - start,
                               is_user_annotation=annotation)

    events = []
    for r in range(3):  # three rounds of tree (10 us) and commit (10 us), 100 us apart
        t = 100 * r
        events += [event("stage:tree", t, t + 10), event("stage:commit", t + 20, t + 30),
                   event("aten::topk", t + 1, t + 3, self_us=2.0), event("cudaStreamSynchronize", t + 4, t + 9, self_us=5.0),
                   event("topk_kernel", t + 2, t + 8, device=cuda),
                   event("stage:tree", t + 1, t + 9, device=cuda, annotation=True)]
    prof = SimpleNamespace(events=lambda: events)
    summary = profile_module.stage_summary(prof, rounds=2, top=5)
    tree = summary["tree"]
    assert tree["span_ms"] == pytest.approx(0.010) and tree["host_ops_ms"] == pytest.approx(0.007)
    assert tree["syncs"] == 1 and tree["sync_ms"] == pytest.approx(0.005)
    assert tree["kernels"] == 1 and tree["kernel_ms"] == pytest.approx(0.006)  # the annotation is no kernel
    assert [t["name"] for t in tree["top"]] == ["cudaStreamSynchronize", "aten::topk"]
    assert summary["commit"]["host_ops_ms"] == 0.0 and summary["commit"]["span_ms"] == pytest.approx(0.010)


def test_speed_sets_the_kernel_forms_it_is_given_and_refuses_bad_ones(monkeypatch):
    """speed.yaml's ``split_block``, ``prefix_tile_256`` and ``gdn_push``: set on the modules for the run
    (null keeps the library's), a malformed value refused with what to give instead."""
    from omegaconf import OmegaConf

    from ddtree.models import gdn_tree_triton, split_attention

    spec = importlib.util.spec_from_file_location("speed", Path(__file__).resolve().parents[2] / "experiments" / "speed.py")
    speed = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(speed)
    monkeypatch.setattr(split_attention, "PREFIX_TILES", dict(split_attention.PREFIX_TILES))
    monkeypatch.setattr(split_attention, "FUSED_BLOCK", split_attention.FUSED_BLOCK)
    monkeypatch.setattr(gdn_tree_triton, "PUSH", gdn_tree_triton.PUSH)
    kept = dict(split_attention.PREFIX_TILES)
    speed._kernel_forms(OmegaConf.create({"split_block": None, "prefix_tile_256": None, "gdn_push": None}))
    assert split_attention.PREFIX_TILES == kept and not split_attention.FUSED_BLOCK and not gdn_tree_triton.PUSH
    speed._kernel_forms(OmegaConf.create({"split_block": True, "prefix_tile_256": [128, 32, 8, 2, 128],
                                         "gdn_push": True}))
    assert split_attention.PREFIX_TILES[256] == (128, 32, 8, 2, 128)
    assert split_attention.FUSED_BLOCK and gdn_tree_triton.PUSH
    with pytest.raises(SystemExit, match="BC a power of two"):
        speed._kernel_forms(OmegaConf.create({"prefix_tile_256": [128, 32, 8, 2, 96]}))
    with pytest.raises(SystemExit, match="gdn_push='yes'"):
        speed._kernel_forms(OmegaConf.create({"gdn_push": "yes"}))


def test_pick_forms_prints_the_fastest_forms_as_speed_overrides(tmp_path):
    """``experiments/pick_forms.py DIR``: from the benches' JSON, the prefix form with the least summed
    time over 16/65/257 queries at the library's segment count (a faster count it does not run, a
    form past the tolerance and one that did not build are passed over) and whether push beat split;
    a folder without either file is a bad input (status 2)."""
    script = ROOT / "experiments" / "pick_forms.py"
    prefix = [{"P": 8192, "n": n, "S0": 17, "(64, 32, 4, 2)/S17": [100.0, 0.0005],
               "(64, 32, 4, 2)/S17/fused": [90.0, 0.0005], "(64, 32, 4, 2)/S33": [10.0, 0.0005],
               "(128, 32, 8, 2, 128)/S17": [80.0, 0.5], "(64, 64, 4, 2, 128)/S17": "OutOfResources: shared memory"}
              for n in (16, 65, 257)]
    gdn = {"rows": [{"n": 65, "rule/bt16/bv32/tf32/split": {"us": 26.0}, "rule/bt16/bv32/tf32/push": {"us": 30.0}},
                    {"n": 257, "rule/bt32/bv32/tf32/split": {"us": 112.0}}]}
    (tmp_path / "prefix-forms.json").write_text(json.dumps(prefix))
    (tmp_path / "gdn-push.json").write_text(json.dumps(gdn))
    done = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["prefix_tile_256=[64,32,4,2]", "split_block=true", "gdn_push=false"]
    bad = subprocess.run([sys.executable, str(script), str(tmp_path / "none")], capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and "no prefix-forms.json or gdn-push.json" in bad.stderr
