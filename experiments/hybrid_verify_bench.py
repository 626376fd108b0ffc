"""What verifying a token tree costs on a hybrid GDN target (Qwen3.6-27B geometry, random weights).

    python experiments/hybrid_verify_bench.py --out hybrid_verify.json            # one H200, ~1-2 min
    python experiments/hybrid_verify_bench.py --layers 8 --out smoke.json         # a shrunk stack

After a 512-token prefill it times, with CUDA events (warmup, then the median of --reps), one
``HybridTarget`` verify (``forward_tree`` + ``commit``) for trees of 1 (one AR step), 16, 64 and
256 nodes (random best-first trees), next to a plain transformers forward of as many tokens on
the same DynamicCache, and the extra peak memory of each. The cache is restored between runs,
outside the timed region. Then, on a shrunk stack (--check-layers), it checks that HybridTarget +
DDTree gives model.generate's greedy tokens in the benchmark dtype and reports any divergence.
Random weights: acceptance is meaningless here, costs are real. Plain argparse, no Hydra.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from pathlib import Path

import torch
import transformers
from transformers import Qwen3_5ForCausalLM

from ddtree import SpeculativeEngine
from ddtree.drafters import OracleDrafter
from ddtree.masks import DenseMaskCompiler
from ddtree.models.geometry import random_hybrid
from ddtree.models import HybridTarget
from ddtree.trees import BestFirstTreeBuilder
from ddtree.types import Draft, Tree
from ddtree.verifiers import GreedyVerifier


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    g = p.add_argument_group("geometry (defaults: Qwen3.6-27B)")
    g.add_argument("--layers", type=int, default=64, help="decoder layers; every 4th is full attention")
    g.add_argument("--hidden-size", type=int, default=5120)
    g.add_argument("--intermediate-size", type=int, default=17408)
    g.add_argument("--heads", type=int, default=24)
    g.add_argument("--kv-heads", type=int, default=4)
    g.add_argument("--head-dim", type=int, default=256)
    g.add_argument("--gdn-key-heads", type=int, default=16)
    g.add_argument("--gdn-value-heads", type=int, default=48)
    g.add_argument("--gdn-head-dim", type=int, default=128)
    g.add_argument("--conv-kernel", type=int, default=4)
    g.add_argument("--vocab", type=int, default=248320)
    r = p.add_argument_group("run")
    r.add_argument("--device", default="cuda")
    r.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    r.add_argument("--prompt", type=int, default=512, help="prefill length")
    r.add_argument("--sizes", type=int, nargs="+", default=[1, 16, 64, 256], help="tree sizes, root included")
    r.add_argument("--depth", type=int, default=15, help="draft depth of the random trees (a 16-block drafter)")
    r.add_argument("--warmup", type=int, default=3)
    r.add_argument("--reps", type=int, default=10)
    r.add_argument("--check-layers", type=int, default=8, help="layers of the greedy check model (0: skip)")
    r.add_argument("--check-tokens", type=int, default=32)
    r.add_argument("--check-budget", type=int, default=64)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--out", type=Path, default=Path("hybrid_verify_bench.json"))
    return p.parse_args(argv)


# ---------------------------------------------------------------- the model, fast


def build_model(args, layers: int, device: torch.device, dtype: torch.dtype) -> Qwen3_5ForCausalLM:
    """Random weights allocated directly on ``device`` in ``dtype`` (``random_hybrid``)."""
    return random_hybrid(
        device=device, dtype=dtype, seed=args.seed, vocab_size=args.vocab, hidden_size=args.hidden_size,
        intermediate_size=args.intermediate_size, num_hidden_layers=layers, num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads, head_dim=args.head_dim, linear_num_key_heads=args.gdn_key_heads,
        linear_num_value_heads=args.gdn_value_heads, linear_key_head_dim=args.gdn_head_dim,
        linear_value_head_dim=args.gdn_head_dim, linear_conv_kernel_dim=args.conv_kernel,
    )


# ---------------------------------------------------------------- timing


class Clock:
    """CUDA events on a GPU (one sync per measurement), perf_counter elsewhere."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def mark(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def ms(self, start, end) -> float:
        if self.cuda:
            end.synchronize()
            return start.elapsed_time(end)
        return 1e3 * (end - start)

    @contextlib.contextmanager
    def peak(self, out: list):
        """Appends the extra peak memory (MiB) of the block, GPU only."""
        if not self.cuda:
            yield
            return
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        yield
        torch.cuda.synchronize()
        out.append((torch.cuda.max_memory_allocated() - base) / 2**20)


class Snapshot:
    """The committed cache after prefill; ``restore`` puts the target back there (untimed)."""

    def __init__(self, target: HybridTarget) -> None:
        self.target, self.length = target, target.past_length
        layers = target.cache.layers
        self.gdn = {i: (layers[i].conv_states[0].clone(), layers[i].recurrent_states[0].clone())
                    for i in target.gdn_modules}

    def restore(self) -> None:
        target, layers = self.target, self.target.cache.layers
        for layer in target._kv_layers():
            layer.keys, layer.values = layer.keys[..., : self.length, :], layer.values[..., : self.length, :]
        for i, (conv, recurrent) in self.gdn.items():
            if layers[i].conv_states[0].shape == conv.shape:
                layers[i].conv_states[0].copy_(conv)
            else:
                layers[i].conv_states[0] = conv.clone()
            layers[i].recurrent_states[0].copy_(recurrent)
        target._pending, target.past_length = None, self.length


def random_tree(nodes: int, depth: int, vocab: int, gen: torch.Generator) -> Tree:
    """Best-first tree of ``nodes`` nodes over a Zipf(2) draft (p_rank ~ rank^-2: the top token
    61 %, the next 15 %), random tokens per depth: deep and branching, like a confident drafter."""
    if nodes == 1:
        return Tree.root(int(torch.randint(vocab, (1,), generator=gen)))
    zipf = torch.log_softmax(-2.0 * torch.arange(1, vocab + 1, dtype=torch.float).log(), dim=0)  # [vocab]
    logp = torch.empty(depth, vocab)
    for d in range(depth):
        logp[d, torch.randperm(vocab, generator=gen)] = zipf
    draft = Draft(logp)
    return BestFirstTreeBuilder(nodes - 1).build(draft, root_token=int(torch.randint(vocab, (1,), generator=gen)))


def time_size(target: HybridTarget, snap: Snapshot, tree: Tree, args, clock: Clock) -> dict:
    """Median verify (forward_tree + commit) and plain HF forward of as many tokens."""
    compiler = DenseMaskCompiler().to(target.input_device, target.dtype)
    inputs = compiler.compile(tree, snap.length)
    path = tree.path_to(int(tree.depths.argmax()))  # the longest accepted path: the costliest commit
    kwarg = {target._cache_kwarg: target.cache}
    ids = inputs.input_ids
    plain_pos = (snap.length + torch.arange(tree.size, device=ids.device))[None]
    verify, commit, plain, verify_mem, plain_mem = [], [], [], [], []
    for rep in range(args.warmup + args.reps):
        snap.restore()
        mem = verify_mem if rep >= args.warmup else []
        with clock.peak(mem):
            t0 = clock.mark()
            target.forward_tree(inputs)
            t1 = clock.mark()
            target.commit(path)
            t2 = clock.mark()
        if rep >= args.warmup:
            verify.append(clock.ms(t0, t2))
            commit.append(clock.ms(t1, t2))
        snap.restore()
        mem = plain_mem if rep >= args.warmup else []
        with clock.peak(mem):
            t0 = clock.mark()
            target.model(input_ids=ids, position_ids=plain_pos, use_cache=True, logits_to_keep=0, **kwarg)
            t1 = clock.mark()
        if rep >= args.warmup:
            plain.append(clock.ms(t0, t1))
    snap.restore()
    med = statistics.median
    return {
        "nodes": tree.size, "budget": tree.size - 1, "depth": int(tree.depths.max()), "path": len(path),
        "hybrid_verify_ms": med(verify), "hybrid_commit_ms": med(commit), "hf_forward_ms": med(plain),
        "hybrid_peak_extra_mib": max(verify_mem) if verify_mem else None,
        "hf_peak_extra_mib": max(plain_mem) if plain_mem else None,
    }


def greedy_check(args, device, dtype) -> dict:
    """HybridTarget + DDTree (oracle drafter) against model.generate, greedy, in ``dtype``."""
    model = build_model(args, args.check_layers, device, dtype)
    prompt = torch.randint(0, args.vocab, (64,), generator=torch.Generator().manual_seed(args.seed + 1))
    ids = prompt[None].to(device)
    # An explicit mask: generate would otherwise take every token equal to pad_token_id for padding.
    ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.check_tokens,
                         do_sample=False, eos_token_id=None, pad_token_id=0)[0, prompt.numel():].tolist()
    engine = SpeculativeEngine(HybridTarget(model), OracleDrafter(model, depth=7, swap_prob=0.3, sharpness=10),
                               BestFirstTreeBuilder(args.check_budget), DenseMaskCompiler(), GreedyVerifier())
    result = engine.generate(prompt, max_new_tokens=args.check_tokens)
    diverge = next((i for i, (a, b) in enumerate(zip(result.tokens, ref)) if a != b), None)
    if diverge is None and len(result.tokens) != len(ref):
        diverge = min(len(result.tokens), len(ref))
    return {"layers": args.check_layers, "tokens": len(ref), "budget": args.check_budget, "equal": diverge is None,
            "first_divergence": diverge,
            "tau": result.mean_acceptance if result.acceptance_lengths else None,  # no round: no tau
            "distinct_tokens": len(set(ref))}  # a degenerate (repeating) text would make the check weak


# ---------------------------------------------------------------- main


def table(rows: list[dict]) -> str:
    def mib(x):
        return "-" if x is None else f"{x:.0f}"

    lines = ["| nodes | depth | HybridTarget verify ms | of which commit ms | HF forward ms | verify / HF "
             "| extra peak MiB (verify) | extra peak MiB (HF) |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        nodes = "1 (AR step)" if r["nodes"] == 1 else r["nodes"]
        lines.append(f"| {nodes} | {r['depth']} | {r['hybrid_verify_ms']:.2f} | {r['hybrid_commit_ms']:.2f} "
                     f"| {r['hf_forward_ms']:.2f} | {r['hybrid_verify_ms'] / r['hf_forward_ms']:.2f} "
                     f"| {mib(r['hybrid_peak_extra_mib'])} | {mib(r['hf_peak_extra_mib'])} |")
    return "\n".join(lines)


@torch.inference_mode()
def main(argv=None) -> dict:
    args = parse_args(argv)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    clock, started = Clock(device), time.perf_counter()
    model = build_model(args, args.layers, device, dtype)
    if clock.cuda:
        torch.cuda.synchronize()
    load_s = time.perf_counter() - started
    n_params = sum(p.numel() for p in model.parameters())
    print(f"built {args.layers}-layer model, {n_params / 1e9:.2f} B params, in {load_s:.1f} s", flush=True)

    target = HybridTarget(model)
    prompt = torch.randint(0, args.vocab, (args.prompt,), generator=torch.Generator().manual_seed(args.seed))
    t0 = clock.mark()
    target.prefill(prompt)
    prefill_ms = clock.ms(t0, clock.mark())
    snap = Snapshot(target)
    gen = torch.Generator().manual_seed(args.seed)
    rows = []
    for size in args.sizes:
        rows.append(time_size(target, snap, random_tree(size, args.depth, args.vocab, gen), args, clock))
        print(f"  {size} nodes: verify {rows[-1]['hybrid_verify_ms']:.2f} ms, HF {rows[-1]['hf_forward_ms']:.2f} ms",
              flush=True)
    del target, snap, model
    if clock.cuda:
        torch.cuda.empty_cache()
    check = greedy_check(args, device, dtype) if args.check_layers > 0 else None

    report = {
        "geometry": {k: getattr(args, k) for k in ("layers", "hidden_size", "intermediate_size", "heads", "kv_heads",
                                                    "head_dim", "gdn_key_heads", "gdn_value_heads", "gdn_head_dim",
                                                    "conv_kernel", "vocab")},
        "device": torch.cuda.get_device_name(device) if clock.cuda else str(device), "dtype": args.dtype,
        "torch": torch.__version__, "transformers": transformers.__version__,
        "params": n_params, "load_s": load_s, "prompt": args.prompt, "prefill_ms": prefill_ms,
        "warmup": args.warmup, "reps": args.reps, "timings": rows, "greedy_check": check,
        "total_s": time.perf_counter() - started,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(f"\n{args.layers} layers, {args.dtype}, prompt {args.prompt}, median of {args.reps} ({report['device']})\n")
    print(table(rows))
    if check is not None:
        verdict = "identical" if check["equal"] else f"DIVERGES at token {check['first_divergence']}"
        print(f"\ngreedy check ({check['layers']} layers, {check['tokens']} tokens, budget {check['budget']}): "
              f"{verdict}; tau {check['tau']:.2f}, {check['distinct_tokens']} distinct tokens")
    print(f"\ntotal {report['total_s']:.1f} s; JSON in {args.out}")
    return report


if __name__ == "__main__":
    main()
