"""What one GDN layer's tree mixing costs per kernel variant (Qwen3.6-27B geometry by default).

    python experiments/gdn_kernel_bench.py --out gdn_kernels.json                 # one H200, ~1 min
    python experiments/gdn_kernel_bench.py --sizes 65 257 --blocks 32 --value-blocks 32
    python experiments/gdn_kernel_bench.py --sizes 65 257 --precisions tf32   # the bf16 model's variants alone

For each verify size n (a random tree of depth <= 16, as DDTree builds) it times, as CUDA-graph
replays of --reps back-to-back calls (the median of five replays, per call):

- ``mix/torch``: the compiled torch tree mixing (``tree_mix``: conv, decay, batched triangular solve);
- ``mix/triton``: ``tree_mix_triton`` as the fast path runs it (the Triton conv with each head's l2 norm
  and the decay in one kernel, ``tree_prologue``, then the Triton rule);
- ``mix/triton_compiled_prologue``: the same with the Triton conv and a compiled prologue
  (``gdn_tree_layer.FUSED_PROLOGUE = False``);
- ``mix/triton_compiled_conv``: the same with the tree conv inside the compiled prologue
  (``gdn_tree_layer.TRITON_CONV = False``);
- ``prologue``: the compiled prologue alone (conv, l2norm, path-summed decay);
- ``prologue/triton``: its work as two Triton kernels alone (``tree_conv_heads`` and ``tree_decay``);
- ``prologue/triton_one``: the same work as one launch, ``tree_prologue`` (what ``mix/triton`` runs), and
  whether its outputs equal the two kernels' bit for bit;
- ``conv/compiled`` and ``conv/triton``: the tree conv alone, compiled by Inductor and as
  ``gdn_tree_triton.tree_conv`` (with its largest difference from the compiled one);
- ``rule/...``: ``gdn_tree_triton.tree_delta_rule`` alone, per block, value block, precision and form
  (one kernel, or ``split``: the system in parallel, then the forward substitution, or ``push``: that
  substitution right-looking, in registers),

each with its error ``|out - ref| / |ref|`` against the float64 torch math on the same inputs.
Random inputs, bf16 activations as in the model. Plain argparse, no Hydra.
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import torch

from ddtree.metrics.timer import graphed_us
from ddtree.models import fused, gdn_tree_layer
from ddtree.models.gdn_tree import ancestor_matrix, conv_taps, delta_rule_tensors, tree_causal_conv1d
from ddtree.models.gdn_tree_layer import tree_mix, tree_mix_inputs, tree_mix_triton
from ddtree.models.gdn_tree_triton import tree_conv, tree_conv_heads, tree_decay, tree_delta_rule, tree_prologue


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--key-heads", type=int, default=16)
    p.add_argument("--value-heads", type=int, default=48)
    p.add_argument("--head-dim", type=int, default=128, help="dk = dv")
    p.add_argument("--kernel-size", type=int, default=4)
    p.add_argument("--sizes", type=int, nargs="+", default=[1, 17, 65, 257])
    p.add_argument("--blocks", type=int, nargs="+", default=[16, 32, 64])
    p.add_argument("--value-blocks", type=int, nargs="+", default=[32, 64])
    p.add_argument("--precisions", nargs="+", choices=["ieee", "tf32"], default=["ieee", "tf32"],
                   help="dot precisions of the rule (bf16 models run tf32, fp32 models ieee)")
    p.add_argument("--forms", nargs="+", choices=["one", "split", "push"], default=["one", "split"],
                   help="the one-kernel rule, the split one, the split one with the right-looking substitution "
                        "(push, up to 128 nodes)")
    p.add_argument("--reps", type=int, default=20, help="calls per captured graph")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rule-only", action="store_true", help="time the delta rule's forms alone (no compiles)")
    p.add_argument("--out", type=Path, default=None)
    return p.parse_args(argv)


def random_tree(n: int, gen: torch.Generator, max_depth: int = 16) -> torch.Tensor:  # [n] parents
    parents, depth = [-1], [0]
    for i in range(1, n):
        while True:
            j = int(torch.randint(0, i, (1,), generator=gen))
            if depth[j] < max_depth - 1:
                break
        parents.append(j)
        depth.append(depth[j] + 1)
    return torch.tensor(parents)


def bench_size(args, n: int, gen: torch.Generator) -> dict:
    dev, bf16 = torch.device("cuda"), torch.bfloat16
    hk, h, d, k = args.key_heads, args.value_heads, args.head_dim, args.kernel_size
    channels = 2 * hk * d + h * d
    parents = random_tree(n, gen).to(dev)
    anc, taps = ancestor_matrix(parents), conv_taps(parents, k)
    r = lambda *shape: torch.randn(*shape, generator=gen).to(dev)  # noqa: E731
    x, a, logits = r(n, channels).to(bf16), r(n, h).to(bf16), r(n, h).to(bf16)  # logits: in_proj_b's output
    a_log, dt_bias = 0.5 * r(h), 0.5 * r(h)
    window, weight, s0 = r(channels, k).to(bf16), (0.5 * r(channels, k)).to(bf16), 0.1 * r(h, d, d)
    beta = logits.sigmoid()  # what the torch mixes take; tree_mix_triton takes the logits
    mix_args = (x, a, beta, a_log, dt_bias, window, weight, None, s0, taps, anc, hk * d, hk * d, d)
    triton_args = (x, a, logits, *mix_args[3:])
    prologue_args = (x, a, beta, a_log, dt_bias, window, weight, None, taps, anc, hk * d, hk * d, d)
    row: dict = {"n": n}
    if args.rule_only:  # the rule's inputs from the eager prologue; no mix, prologue or conv timed
        q, key, v, gamma, b = tree_mix_inputs(*prologue_args)
        return rule_rows(args, row, q, key, v, gamma, b, s0, anc, d)
    torch_mix, prologue = fused.compiled(tree_mix), fused.compiled(tree_mix_inputs)
    row["mix/torch"] = graphed_us(lambda: torch_mix(*mix_args), args.reps)
    row["mix/triton"] = graphed_us(lambda: tree_mix_triton(*triton_args), args.reps)
    for flag, name in (("FUSED_PROLOGUE", "mix/triton_compiled_prologue"), ("TRITON_CONV", "mix/triton_compiled_conv")):
        previous = getattr(gdn_tree_layer, flag)
        setattr(gdn_tree_layer, flag, False)
        try:
            row[name] = graphed_us(lambda: tree_mix_triton(*triton_args), args.reps)
        finally:
            setattr(gdn_tree_layer, flag, previous)
    row["prologue"] = graphed_us(lambda: prologue(*prologue_args), args.reps)

    def triton_prologue():
        tree_conv_heads(x, window, weight, None, taps, hk * d, d)
        tree_decay(a, logits, a_log, dt_bias, anc, beta_logits=True)

    q, key, v, gamma, b = prologue(*prologue_args)
    tq, tk, tv = tree_conv_heads(x, window, weight, None, taps, hk * d, d)
    tg, tb = tree_decay(a, logits, a_log, dt_bias, anc, beta_logits=True)
    row["prologue/triton"] = {
        "us": graphed_us(triton_prologue, args.reps),
        "max_diff": {name: float((got.reshape(mine.shape) - mine).abs().max())
                     for name, got, mine in (("q", tq, q), ("k", tk, key), ("v", tv, v), ("gamma", tg, gamma),
                                             ("beta", tb, b))}}
    one = tree_prologue(x, window, weight, None, taps, hk * d, d, a, logits, a_log, dt_bias, anc, beta_logits=True)
    row["prologue/triton_one"] = {
        "us": graphed_us(lambda: tree_prologue(x, window, weight, None, taps, hk * d, d, a, logits, a_log, dt_bias, anc,
                                               beta_logits=True), args.reps),
        "bitwise": all(torch.equal(got, mine) for got, mine in zip(one, (tq, tk, tv, tg, tb)))}
    conv = fused.compiled(tree_causal_conv1d)
    row["conv/compiled"] = graphed_us(lambda: conv(x, None, window, weight, None, taps), args.reps)
    row["conv/triton"] = {"us": graphed_us(lambda: tree_conv(x, window, weight, None, taps), args.reps),
                          "max_diff": float((tree_conv(x, window, weight, None, taps).float()
                                             - conv(x, None, window, weight, None, taps).float()).abs().max())}
    return rule_rows(args, row, q, key, v, gamma, b, s0, anc, d)


def rule_rows(args, row: dict, q, key, v, gamma, b, s0, anc, d: int) -> dict:
    """``row`` with the ``rule/...`` timings of every block, value block, precision and form."""
    # The float64 reference on the same inputs: g back from gamma (anc is unit lower triangular).
    g = torch.linalg.solve_triangular(anc.double(), gamma.double(), upper=False, unitriangular=True)
    ref = delta_rule_tensors(q.double() * d**0.5, key.double(), v.double(), g, b.double(), None, s0.double(), anc)[0]
    for block, value_block, precision, form in itertools.product(args.blocks, args.value_blocks, args.precisions,
                                                                  args.forms):
        name = f"rule/bt{block}/bv{value_block}/{precision}" + ("" if form == "one" else f"/{form}")
        run = lambda: tree_delta_rule(q, key, v, gamma, b, s0, anc, block=block, value_block=value_block,  # noqa: E731
                                      precision=precision, split=form != "one", push=form == "push")
        try:
            out = run()[0]
            row[name] = {"us": graphed_us(run, args.reps),
                         "rel_err": float((out.double() - ref).norm() / ref.norm())}
        except Exception as err:  # a variant Triton cannot build here: recorded, not fatal
            row[name] = {"error": f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"}
    return row


def main(argv=None) -> None:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("experiments/gdn_kernel_bench.py times GPU kernels: no CUDA device is visible")
    gen = torch.Generator().manual_seed(args.seed)
    rows = []
    for n in args.sizes:
        rows.append(bench_size(args, n, gen))
        print(json.dumps(rows[-1]), flush=True)
        if args.out is not None:  # rewritten after every size: a run cut short keeps what it measured
            args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
