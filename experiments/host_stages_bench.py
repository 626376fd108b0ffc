"""The host side of a round's tree and layout stages, on the CPU: what Python and numpy cost per round.

    python experiments/host_stages_bench.py                                  # budgets 16, 64, 256, 512
    python experiments/host_stages_bench.py --budgets 64 256 --reps 500 --out host.json

A DDTree round builds its tree on the host (``BestFirstTreeBuilder``'s heap, after a top-K of the draft
that runs on the draft's device) and lays it out there (``TreeMaskCompiler``: the ``[n, n]`` ancestor
visibility). On a GPU these are most of the tree and layout stages besides the top-K kernel and the
copies. This times, per budget, on drafts shaped like a DFlash block (``--depth`` rows, peaked so that
trees grow deep): ``build_us``, the heap from the top-K values on (the draft's vocabulary cut to the
budget, so the top-K itself costs next to nothing), ``ancestors_us`` and ``compile_us`` (the whole
layout), the median over ``--reps`` calls of five repeats. Threads: one (``torch.set_num_threads(1)``),
as a decode loop runs it. Plain argparse, no Hydra.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from ddtree.masks import TreeMaskCompiler
from ddtree.trees import BestFirstTreeBuilder
from ddtree.types import Draft


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--budgets", type=int, nargs="+", default=[16, 64, 256, 512])
    p.add_argument("--depth", type=int, default=15, help="drafted depths (a DFlash block of 16: 15)")
    p.add_argument("--sharpness", type=float, default=8.0, help="logit margin of each depth's top token")
    p.add_argument("--reps", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None)
    return p.parse_args(argv)


def per_call_us(fn, reps: int) -> float:
    """Median over five repeats of the mean time of ``reps`` calls, in microseconds."""
    fn()
    times = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        times.append((time.perf_counter() - start) / reps * 1e6)
    return statistics.median(times)


def draft_for(budget: int, depth: int, sharpness: float, gen: torch.Generator) -> Draft:
    """Peaked per-depth log-probs over ``budget`` tokens, already the top-K a builder would take."""
    logits = torch.randn(depth, budget, generator=gen)
    logits[torch.arange(depth), torch.randint(budget, (depth,), generator=gen)] += sharpness
    return Draft(torch.log_softmax(logits, -1))


def main(argv=None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(args.seed)
    rows = []
    for budget in args.budgets:
        draft = draft_for(budget, args.depth, args.sharpness, gen)
        builder, compiler = BestFirstTreeBuilder(budget, method="heap"), TreeMaskCompiler()
        tree = builder.build(draft, root_token=1)
        row = {"budget": budget, "nodes": tree.size, "tree_depth": int(tree.depths.max()),
               "build_us": per_call_us(lambda: builder.build(draft, root_token=1), args.reps),
               "ancestors_us": per_call_us(tree.ancestors, args.reps),
               "compile_us": per_call_us(lambda: compiler.compile(tree, 1000), args.reps)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    result = {"machine": platform.processor() or platform.machine(), "python": platform.python_version(),
              "torch": torch.__version__, "rows": rows}
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
