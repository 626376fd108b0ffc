"""What a verify's linear layers cost per row count: every ``nn.Linear`` of a geometry, graphed.

    python experiments/gemm_rows_bench.py --geometry qwen3.6-27b --out gemm_rows.json   # one GPU, ~30 s

A verify of n tokens runs each linear layer as one GEMM of n rows. At a few rows the GEMMs read
their weights (memory-bound); at a few hundred they compute, and the kernel cuBLAS picks for each
shape decides what a row costs (compare 256 rows with 257: a budget-256 tree and its root). For
each row count of ``--rows`` this prints and writes

- ``ms``: the sum over the model's linear layers (each distinct weight shape timed once, times its
  count), ``tflops``: what that sum achieves;
- ``fused_ms``: the same with each layer's projections that read one input as one GEMM (a GDN
  layer's qkv, z, b and a; an attention layer's q, k and v; an MLP's gate and up);
- per shape, ``[us, TFLOP/s]``.

Random bf16 data; kernels only (``ddtree.metrics.timer.graphed_us``). Plain argparse.
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

import torch

from ddtree.metrics.timer import graphed_us
from ddtree.models.fused import PROJECTION_GROUPS


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--geometry", default="qwen3.6-27b")
    p.add_argument("--rows", type=int, nargs="+", default=[1, 16, 65, 128, 129, 256, 257, 264, 272, 320, 384])
    p.add_argument("--blas", nargs="+", default=["default"], help="torch.backends.cuda.preferred_blas_library values")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--out", type=Path, default=Path("gemm_rows.json"))
    return p.parse_args(argv)


def linear_shapes(geometry: str) -> tuple[collections.Counter, collections.Counter]:
    """``(in, out)`` -> count over every ``nn.Linear`` of the geometry (built on the meta device), and
    the same with each group of ``PROJECTION_GROUPS`` in one layer summed into one shape (as
    ``fused.fuse_projections`` stores them)."""
    from ddtree.models import geometry as g

    with torch.device("meta"):
        if geometry in g.HYBRID:
            from transformers import Qwen3_5ForCausalLM

            model = Qwen3_5ForCausalLM(g.hybrid_config(**g.HYBRID[geometry]))
        else:
            model = g.random_qwen3(geometry, device="meta")
    plain, fused = collections.Counter(), collections.Counter()
    for parent in model.modules():
        linears = {name: m for name, m in parent.named_children() if isinstance(m, torch.nn.Linear)}
        grouped = set()
        for group in PROJECTION_GROUPS:
            if all(name in linears for name in group):
                fused[(linears[group[0]].in_features, sum(linears[n].out_features for n in group))] += 1
                grouped.update(group)
        for name, m in linears.items():
            plain[(m.in_features, m.out_features)] += 1
            if name not in grouped:
                fused[(m.in_features, m.out_features)] += 1
    return plain, fused


def time_shapes(shapes, rows: int, reps: int) -> dict:
    """``(in, out)`` -> ``[us, TFLOP/s]`` of one ``F.linear`` of ``rows`` rows, graphed."""
    out = {}
    for k_in, n_out in shapes:
        w = torch.randn(n_out, k_in, device="cuda", dtype=torch.bfloat16) * 0.02
        x = torch.randn(rows, k_in, device="cuda", dtype=torch.bfloat16)
        us = graphed_us(lambda: torch.nn.functional.linear(x, w), reps)
        out[(k_in, n_out)] = [round(us, 2), round(2 * rows * k_in * n_out / us / 1e6, 1)]
        del w, x
    return out


def main(argv=None) -> None:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("experiments/gemm_rows_bench.py times GPU kernels: no CUDA device is visible")
    plain, fused = linear_shapes(args.geometry)
    every = sorted(set(plain) | set(fused))
    flops = lambda counter, n: 2 * n * sum(c * k * o for (k, o), c in counter.items())  # noqa: E731
    result = {"geometry": args.geometry, "gpu": torch.cuda.get_device_name(), "plain_shapes": {str(k): c for k, c in plain.items()},
              "fused_shapes": {str(k): c for k, c in fused.items()}, "runs": []}
    for blas in args.blas:
        if blas != "default":
            torch.backends.cuda.preferred_blas_library(blas)
        for n in args.rows:
            times = time_shapes(every, n, args.reps)
            ms = sum(c * times[s][0] for s, c in plain.items()) / 1e3
            fused_ms = sum(c * times[s][0] for s, c in fused.items()) / 1e3
            run = {"blas": blas, "rows": n, "ms": round(ms, 3), "fused_ms": round(fused_ms, 3),
                   "tflops": round(flops(plain, n) / ms / 1e9, 1), "shapes": {str(k): v for k, v in times.items()}}
            result["runs"].append(run)
            print(json.dumps({k: run[k] for k in ("blas", "rows", "ms", "fused_ms", "tflops")}), flush=True)
            args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
