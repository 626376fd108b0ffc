"""Where a fast-path round spends its GPU time (a named geometry, random weights, one GPU).

    python experiments/round_profile.py --out hybrid_profile.json           # Qwen3.6-27B, one H200, ~2 min
    python experiments/round_profile.py --geometry qwen3-8b --sizes 1 65 257 --drafters dflash
    python experiments/round_profile.py --layers 8 --sizes 1 65             # a shrunk stack
    python experiments/round_profile.py --tiny --device cpu --reps 2        # a smoke run on a CPU
    python experiments/round_profile.py --prompt 8192 --sizes 1 --drafters --loop 0 64 256   # whole rounds by stage

After a prefill, for trees of each size (random best-first trees; 1 is an AR step) it times with
CUDA events the graphed verify of the fast target (``StaticHybridTarget`` for the hybrid geometries,
``StaticTarget`` for Qwen3's) and its commit apart (median of --reps), then
profiles one verify of the same tree without graphs (the same fused kernels, launched one by one)
with ``torch.profiler`` and sums its kernels' GPU time by kind: GEMMs, the Triton tree delta rule,
other compiled (Triton) kernels, attention, copies, the rest. Graph replays hide their kernels
from the profiler, hence the second, eager run; its kernel times are the graph's, its launch gaps
are not: ``gap_ms`` (graphed verify minus the profiled kernels) is what launches and gaps cost inside
the graph. ``weight_read_ms`` is the weights' read time at ``--bandwidth`` (default: the card's peak; the
floor of a one-token verify). Random weights: acceptance is meaningless here, costs are real. Plain argparse, no Hydra.

``--loop`` budgets (0: AR) then run whole rounds through the loop, graphed as ``speed.py``'s fast path
runs them (a random DFlash drafter, a best-first tree; the first ``--loop-rounds`` rounds of a run a drafter
block longer): per stage and round, its synchronised wall time (an unprofiled run), and under the profiler
the host time of the ops and CUDA runtime calls it made (by name; the rest of its span is Python and the
profiler's cost), its launches, graph launches, copies and synchronisations, and the kernels that ran in it. That is where the host stages (tree, layout) and the host side of verify and commit go.
"""

from __future__ import annotations

import argparse
import bisect
import json
import statistics
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from ddtree.masks import DenseMaskCompiler
from ddtree.metrics.hardware import read_bandwidth
from ddtree.models.geometry import QWEN3, random_hybrid, random_qwen3
from ddtree.models.hybrid_static import StaticHybridTarget
from ddtree.models.static_target import StaticTarget
from ddtree.trees import BestFirstTreeBuilder
from ddtree.types import Draft

# Kernel name -> kind, first match wins (names as CUDA, cuBLAS, Triton and Inductor give them).
KINDS = (
    ("tree delta rule (Triton)", ("tree_delta", "tree_system", "tree_solve")),
    ("GEMM", ("gemm", "nvjet", "cutlass", "sm90_xmma", "sm80_xmma", "cublas", "splitk")),
    ("attention", ("flash", "fmha", "attention", "sdpa", "flex")),
    ("compiled (Inductor/Triton)", ("triton_",)),
    ("copy / index", ("copy", "index", "gather", "scatter", "cat")),
)


def summarise(prof, gpu: bool, top: int) -> dict:
    """Kernel time of a ``torch.profiler`` run by kind and by name (the ``top`` costliest)."""
    kind = torch.autograd.DeviceType.CUDA if gpu else torch.autograd.DeviceType.CPU
    kernels = [e for e in prof.events() if e.device_type == kind and (gpu or not e.cpu_children)]
    by_kind, by_name, count = defaultdict(float), defaultdict(float), defaultdict(int)
    for e in kernels:
        ms = (e.device_time if gpu else e.cpu_time) / 1e3
        by_kind[kind_of(e.name)] += ms
        by_name[e.name] += ms
        count[e.name] += 1
    ranked = sorted(by_name.items(), key=lambda kv: -kv[1])[:top]
    return {"profiled_ms": sum(by_kind.values()), "kernels": len(kernels),
            "by_kind_ms": dict(sorted(by_kind.items(), key=lambda kv: -kv[1])),
            "top": [{"name": name[:120], "ms": ms, "calls": count[name]} for name, ms in ranked]}


def report(title: str, row: dict) -> None:
    print(f"{title}; profiled kernels {row['kernels']}, {row['profiled_ms']:.2f} ms of device time", flush=True)
    for kind, ms in row["by_kind_ms"].items():
        print(f"  {kind:<28} {ms:8.2f} ms")
    for t in row["top"]:
        print(f"    {t['ms']:8.3f} ms {t['calls']:5d}x  {t['name']}")


def profile_drafters(args, model, target, prompt: torch.Tensor, device: torch.device) -> dict:
    """Per drafter of ``args.drafters``: the median graphed draft (CUDA events) after a prefill of
    ``prompt``, then one draft of the same drafter run op by op under the profiler. The DFlash
    draft absorbs a block of pending features first, as every round does; the MTP draft is the
    static chain's (``steps`` head forwards and LM heads over one round's pairs). Both runs of either
    drafter read the context as the loop's graphed drafter does (``attention="auto"``: split attention
    over a cache of more than 4096 rows, the op-by-op run told the same with ``attention="split"``; at
    commit 7fcbbe9 and before, the MTP chain's op-by-op run read it through FlexAttention's own kernel,
    so its kernel table there is not the graphed run's). Before that, both DFlash runs
    read a dense mask over the whole cache, and at prompt 8192 on Qwen3.6-27B's geometry (one H100) the
    graphed draft took 7.12 ms here against speed.py's 3.16."""
    from ddtree.drafters.dflash import DFlashDrafter
    from ddtree.drafters.mtp_static import StaticChain
    from ddtree.models import MTPHead
    from ddtree.models.geometry import random_dflash_for

    gpu, rows = device.type == "cuda", {}
    param = next(model.parameters())
    max_length = target.max_length
    for name in args.drafters:
        if name == "dflash":
            body = random_dflash_for(model, device=str(device), dtype=param.dtype)
            runs, attention = {}, "auto"  # the graphed run's choice; the op-by-op run takes it
            for graphs in dict.fromkeys((gpu, False)):  # graphed and op by op; once off a GPU
                drafter = DFlashDrafter(body, target, max_length=max_length, cuda_graphs=graphs, attention=attention,
                                        fuse=args.fuse_drafter and gpu)  # op by op, the graph's kernels
                attention = drafter.attention
                target.set_taps(drafter.hidden_layers)
                out = target.prefill(prompt)
                drafter.reset(out)
                block = out.taps[-body.config.block_size:]

                def step(drafter=drafter, block=block):
                    drafter._pending = block  # one round's accepted features, absorbed before the draft
                    drafter.length -= block.shape[0]
                    drafter.draft(int(prompt[-1]))

                runs[graphs] = step
        else:
            head = MTPHead.for_target(model).to(device)
            target.set_taps((-1,))
            hidden = torch.randn(args.mtp_steps + 1, head.hidden_size, device=device, dtype=param.dtype)
            tokens = prompt[-(args.mtp_steps + 1):].tolist()
            length = prompt.numel()
            runs, attention = {}, "auto"  # as MTPDrafter decides; the op-by-op run takes the graphed run's choice
            for graphs in dict.fromkeys((gpu, False)):  # graphed and op by op; once off a GPU
                chain = StaticChain(head, target, args.mtp_steps, max_length, graphs=graphs, attention=attention)
                attention = chain.attention
                runs[graphs] = lambda chain=chain: chain.draft(hidden, tokens, length)
        ms = []
        for _ in range(args.reps + 3):
            sync(device)
            ms.append(timed(runs[gpu], device))
        runs[False]()  # warm-up of the op-by-op run
        sync(device)
        with profile(activities=[ProfilerActivity.CUDA if gpu else ProfilerActivity.CPU]) as prof:
            runs[False]()
            sync(device)
        row = {"graphed_ms" if gpu else "eager_ms": statistics.median(ms[3:]), **summarise(prof, gpu, args.top)}
        rows[name] = row
        report(f"\n== {name} draft: {'graphed' if gpu else 'eager'} {statistics.median(ms[3:]):.2f} ms", row)
    return rows


# CUDA runtime calls by what they do (names as the profiler gives them).
RUNTIME = (
    ("syncs", ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")),
    ("graph_launches", ("cudaGraphLaunch",)),
    ("launches", ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchCooperativeKernel")),
    ("copies", ("cudaMemcpy", "cudaMemset")),
)


def profile_loop(args, model, target, prompt: torch.Tensor, device: torch.device, budget: int) -> dict:
    """Whole rounds of the loop (AR for budget 0, else a random DFlash drafter and a best-first tree of
    ``budget``), graphed as ``speed.py``'s fast path runs them: the first ``--loop-rounds`` rounds of a run
    that goes a drafter block further (as ``speed.py`` times them: near ``max_new_tokens`` drafts are cut).
    After a warm-up run, an unprofiled synchronised run gives each stage's wall time per round
    (``wall_ms``), and a run under the profiler the rest, per stage and round over the same rounds: the
    host time of the ops and CUDA runtime calls it ran (by name; ``other_host_ms`` is the span no op
    accounts for: Python, and the profiler's own cost), the launches, graph launches, copies and
    synchronisations it made and the kernels that ran in it."""
    from ddtree import SpeculativeEngine
    from ddtree.drafters import DFlashDrafter, NullDrafter
    from ddtree.models.geometry import random_dflash_for
    from ddtree.trees import ChainTreeBuilder

    gpu = device.type == "cuda"
    if budget == 0:
        drafter, tree, tail = NullDrafter(), ChainTreeBuilder(), 0
    else:
        body = random_dflash_for(model, device=str(device), dtype=next(model.parameters()).dtype)
        drafter = DFlashDrafter(body, target, max_length=target.max_length, cuda_graphs=gpu,
                                fuse=args.fuse_drafter and gpu)
        tree, tail = BestFirstTreeBuilder(budget), body.config.block_size
    engine = SpeculativeEngine(target, drafter, tree, timer_sync=True)
    new = args.loop_rounds + tail + 1  # a random drafter: about one token a round
    engine.generate(prompt, max_new_tokens=new)  # compiles and records the graphs
    walled = engine.generate(prompt, max_new_tokens=new).round_stage_times[: args.loop_rounds]
    rounds = len(walled)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
    with profile(activities=activities) as prof:
        engine.generate(prompt, max_new_tokens=new)
    row = {"rounds": rounds, "stages": stage_summary(prof, rounds, args.top)}
    for stage in vars(walled[0]):
        row["stages"].setdefault(stage, {})["wall_ms"] = 1e3 * sum(getattr(r, stage) for r in walled) / rounds
    report_loop(f"\n== loop, {'AR' if budget == 0 else f'DDTree-{budget}'}: {rounds} rounds, per round", row)
    return row


def stage_summary(prof, rounds: int, top: int) -> dict:
    """The profiler's events by the ``stage:<name>`` range they fall in (``StageTimer`` opens one per
    stage on the host), over the first ``rounds`` rounds (up to the end of the ``rounds``-th commit), per
    round: host ops by self time, runtime calls counted by kind, kernels by count and time. The ranges'
    device-side copies (user annotations, which the profiler adds with CUDA on) are neither ranges nor
    kernels."""
    events = list(prof.events())
    cpu = torch.autograd.DeviceType.CPU
    ranges = sorted((e for e in events if e.name.startswith("stage:") and e.device_type == cpu),
                    key=lambda e: e.time_range.start)
    commits = [r for r in ranges if r.name == "stage:commit"]
    if len(commits) >= rounds > 0:
        cutoff = commits[rounds - 1].time_range.end
        ranges = [r for r in ranges if r.time_range.start <= cutoff]
    starts = [e.time_range.start for e in ranges]

    def stage_of(e, thread_bound: bool):
        i = bisect.bisect_right(starts, e.time_range.start) - 1
        if i < 0 or e.time_range.start > ranges[i].time_range.end or (thread_bound and e.thread != ranges[i].thread):
            return None
        return ranges[i].name.removeprefix("stage:")

    out = defaultdict(lambda: {"host_ops_ms": 0.0, "kernels": 0, "kernel_ms": 0.0, "sync_ms": 0.0,
                               **{kind: 0 for kind, _ in RUNTIME}, "by_op": defaultdict(lambda: [0.0, 0])})
    spans = defaultdict(float)
    for r in ranges:
        spans[r.name.removeprefix("stage:")] += (r.time_range.end - r.time_range.start) / 1e3
    for e in events:
        if e.name.startswith("stage:") or getattr(e, "is_user_annotation", False):
            continue
        on_host = e.device_type == cpu
        stage = stage_of(e, thread_bound=on_host)
        if stage is None:
            continue
        row = out[stage]
        if not on_host:  # a kernel (or a device copy): where it started
            row["kernels"] += 1
            row["kernel_ms"] += e.device_time / 1e3
            continue
        ms = e.self_cpu_time_total / 1e3
        row["host_ops_ms"] += ms
        row["by_op"][e.name][0] += ms
        row["by_op"][e.name][1] += 1
        kind = next((k for k, names in RUNTIME if e.name.startswith(names)), None)
        if kind is not None:
            row[kind] += 1
            if kind == "syncs":
                row["sync_ms"] += ms
    summary = {}
    for stage in spans:  # every stage that ran, ops or not
        row = out[stage]
        by_op = sorted(row.pop("by_op").items(), key=lambda kv: -kv[1][0])[:top]
        per_round = {k: v / rounds for k, v in row.items()}
        per_round["span_ms"] = spans[stage] / rounds
        per_round["other_host_ms"] = per_round["span_ms"] - per_round["host_ops_ms"]
        per_round["top"] = [{"name": name[:120], "ms": ms / rounds, "calls": calls / rounds} for name, (ms, calls) in by_op]
        summary[stage] = per_round
    return summary


def report_loop(title: str, row: dict) -> None:
    print(title, flush=True)
    print("  stage    wall ms  host ops  other host  sync wait  launches  graphs  copies  syncs  kernels  kernel ms")
    for stage, s in row["stages"].items():
        if "span_ms" not in s:
            continue
        print(f"  {stage:<7} {s['wall_ms']:8.3f} {s['host_ops_ms']:9.3f} {s['other_host_ms']:11.3f} {s['sync_ms']:10.3f} "
              f"{s['launches']:9.1f} {s['graph_launches']:7.1f} {s['copies']:7.1f} {s['syncs']:6.1f} {s['kernels']:8.1f} "
              f"{s['kernel_ms']:10.3f}")
        for t in s["top"]:
            print(f"            {t['ms']:8.3f} ms {t['calls']:6.1f}x  {t['name']}")


def kind_of(name: str) -> str:
    low = name.lower()
    return next((kind for kind, keys in KINDS if any(k in low for k in keys)), "other")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--geometry", default="qwen3.6-27b", help="a hybrid geometry, or one of Qwen3's (qwen3-8b)")
    p.add_argument("--bandwidth", type=float, default=None,
                   help="TB/s for the weight-read floor (default: the card's peak, ddtree.metrics.hardware)")
    p.add_argument("--layers", type=int, default=None, help="decoder layers (default: the geometry's)")
    p.add_argument("--tiny", action="store_true", help="a tiny stack of the same layout (smoke runs)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--sizes", type=int, nargs="+", default=[1, 65, 257], help="tree sizes, root included")
    p.add_argument("--depth", type=int, default=16)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--top", type=int, default=25, help="kernels listed per size")
    p.add_argument("--triton", choices=["auto", "on", "off"], default="auto")
    p.add_argument("--drafters", nargs="*", choices=["dflash", "mtp"], default=None,
                   help="also time the graphed draft of these drafters and profile it (none: skip; default: "
                        "dflash and, on hybrids, mtp)")
    p.add_argument("--mtp-steps", type=int, default=3)
    p.add_argument("--fuse-drafter", action=argparse.BooleanOptionalAction, default=True,
                   help="the DFlash drafter's norms, MLP and rotary as compiled kernels (DFlashDrafter(fuse=True)), on a "
                        "GPU, as the fast path runs it (--no-fuse-drafter: the stock ops)")
    p.add_argument("--loop", type=int, nargs="*", default=[],
                   help="tree budgets (0: AR) whose whole rounds run through the loop under the profiler, by stage: "
                        "host time by op, launches, copies, syncs and kernel time per round (a random DFlash drafter)")
    p.add_argument("--loop-rounds", type=int, default=8, help="profiled rounds per --loop budget")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("round_profile.json"))
    args = p.parse_args(argv)
    if args.drafters is None:
        args.drafters = ["dflash"] if args.geometry in QWEN3 else ["dflash", "mtp"]
    return args


def random_tree(vocab: int, nodes: int, depth: int, gen: torch.Generator):
    draft = Draft(torch.log_softmax(3 * torch.randn(depth, vocab, generator=gen), -1))
    return BestFirstTreeBuilder(nodes - 1).build(draft, root_token=int(torch.randint(vocab, (1,), generator=gen)))


TINY = dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
            linear_key_head_dim=32, linear_value_head_dim=32, linear_conv_kernel_dim=4)
TINY_DENSE = dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=32)


def build(args):
    """The model of ``args.geometry`` (shrunk by --tiny / --layers) and its fast target's class."""
    dense = args.geometry in QWEN3
    sizes = dict(TINY_DENSE if dense else TINY) if args.tiny else {}
    if args.layers is not None:
        sizes["num_hidden_layers"] = args.layers
    if dense:
        dtype = torch.float32 if args.device == "cpu" else torch.bfloat16
        return random_qwen3(args.geometry, device=args.device, dtype=dtype, **sizes), StaticTarget
    return random_hybrid(None if args.tiny else args.geometry, device=args.device, seed=args.seed, **sizes), \
        StaticHybridTarget


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device: torch.device) -> float:
    """ms of one call of ``fn``: CUDA events around it on a GPU, the wall clock elsewhere."""
    if device.type != "cuda":
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize(device)
    return start.elapsed_time(end)


@torch.inference_mode()  # no autograd records: the 27B geometry's prefill would not fit an 80 GB card
def main(argv=None) -> None:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    model, fast = build(args)
    device = next(model.parameters()).device
    vocab = model.config.get_text_config().vocab_size
    max_length = args.prompt + max(args.sizes) * (args.reps + 8) + 64
    max_length = max(max_length, args.prompt + (max(args.loop, default=0) + 1) * (2 * args.loop_rounds + 8) + 64)
    if fast is StaticHybridTarget:
        triton = {"auto": None, "on": True, "off": False}[args.triton]
        graphed = StaticHybridTarget(model, max_length, cuda_graphs=device.type == "cuda", triton=triton)
        eager = StaticHybridTarget(model, max_length, cuda_graphs=False, fuse=graphed.fuse, triton=graphed.triton)
        kernels = graphed.kernels()
    else:
        graphed = StaticTarget(model, max_length, cuda_graphs=device.type == "cuda")
        eager = StaticTarget(model, max_length, cuda_graphs=False, fuse=graphed.fuse)
        kernels = {"verify": f"fused={graphed.fuse}, CUDA graphs={graphed.cuda_graphs}, attention={graphed.attention}"}
    print(f"kernels: {kernels}", flush=True)
    weight_bytes = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if "embed_tokens" not in n)
    args.bandwidth = read_bandwidth(torch.cuda.get_device_name(device) if device.type == "cuda" else "",
                                    args.bandwidth) / 1e12  # TB/s
    compiler = DenseMaskCompiler().to(graphed.input_device, graphed.dtype)
    gen = torch.Generator().manual_seed(args.seed)
    prompt = torch.randint(0, vocab - 1, (args.prompt,), generator=gen)
    result = {"geometry": args.geometry, "layers": model.config.get_text_config().num_hidden_layers,
              "prompt": args.prompt, "kernels": kernels,
              "weight_read_ms": weight_bytes / (args.bandwidth * 1e9), "bandwidth_tb_s": args.bandwidth,
              "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "sizes": {}}
    for n in args.sizes:
        tree = random_tree(vocab, n, args.depth, gen)
        path = tree.path_to(int(tree.depths.argmax()))  # the deepest path: the largest commit
        row = {}
        for name, target in (("graphed", graphed), ("eager", eager)):
            target.prefill(prompt)
            inputs = lambda: compiler.compile(tree, target.past_length)  # noqa: E731
            verify_ms, commit_ms = [], []
            for i in range(args.reps + 3):  # 3 warm-up rounds: compilation, capture
                layout = inputs()
                sync(device)
                verify_ms.append(timed(lambda: target.forward_tree(layout), device))
                commit_ms.append(timed(lambda: target.commit(path), device))
            row[f"{name}_verify_ms"] = statistics.median(verify_ms[3:])
            row[f"{name}_commit_ms"] = statistics.median(commit_ms[3:])
        # One eager verify under the profiler: its kernels are the graph's.
        layout = compiler.compile(tree, eager.past_length)
        sync(device)
        gpu = device.type == "cuda"
        with profile(activities=[ProfilerActivity.CUDA if gpu else ProfilerActivity.CPU]) as prof:
            eager.forward_tree(layout)
            sync(device)
        eager.commit(path)
        row.update(summarise(prof, gpu, args.top))
        row["gap_ms"] = row["graphed_verify_ms"] - row["profiled_ms"]
        result["sizes"][n] = row
        report(f"\n== {n} nodes: graphed verify {row['graphed_verify_ms']:.2f} ms + commit {row['graphed_commit_ms']:.2f}; "
               f"eager verify {row['eager_verify_ms']:.2f} + commit {row['eager_commit_ms']:.2f}; weight read "
               f"{result['weight_read_ms']:.2f} ms at {args.bandwidth} TB/s", row)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))  # after every size: a cut run keeps what it measured
    if args.drafters:
        result["drafters"] = profile_drafters(args, model, graphed, prompt, device)
    if args.loop:
        result["loop"] = {}
        for budget in args.loop:
            result["loop"][budget] = profile_loop(args, model, graphed, prompt, device, budget)
            args.out.write_text(json.dumps(result, indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"\nwritten {args.out}")


if __name__ == "__main__":
    main()
