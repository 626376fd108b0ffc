"""Kernel times of one attention layer of a tree verify over a long committed prefix, per candidate.

    python experiments/attention_bench.py --out attention_bench.json      # one GPU, ~1 min

n queries (a tree of n nodes; 1 is an AR step) at committed length P, Qwen3-8B's heads by default
(32 query heads over 8 K/V heads of 128). Candidates, each timed alone as the fast path runs
kernels: --reps calls captured in one CUDA graph (``ddtree.metrics.timer.graphed_us``), so launch
gaps and the compiled function's host-side guards are not counted. One that cannot be captured is
timed call by call with CUDA events (row key ``<name>_ungraphed``: launch gaps included); one that
fails is recorded with its error:

- ``flex``: what the fast path runs now: ``ddtree.models.flex_attention.attend`` over the cache
  buffer with the ``FlexLayout`` of P and an ``[n, n]`` tree visibility (prefix and tree block in one).
- ``split``: what the fast path runs for 2 to 512 queries in bf16/fp16 with ``attention=auto``
  (``ddtree.models.split_attention``): the prefix through the variable-length flash kernel in
  segments, the tree block in tensor math, merged by log-sum-exps (for one query it is timed as
  if it served one).
- ``split_plain`` / ``split_triton``: the same with the merge in eager tensor ops
  (``block_and_merge``) / in one Triton launch (``triton_merge``) in place of the compiled one: what
  a shape gets where the compiled merge disagrees with the reference (``split_attention.serves``).
- ``sdpa``: ``scaled_dot_product_attention`` over the prefix alone, the query heads of each K/V
  head folded into the query length (no mask, no copy of K/V): the flash kernel's time for the
  prefix part of a split, without its log-sum-exp.
- ``flash_lse``: the same through ``aten._scaled_dot_product_flash_attention``, which returns the
  log-sum-exp a merge with the tree block needs.
- ``cudnn_lse``: the prefix through cuDNN's attention (``aten._scaled_dot_product_cudnn_attention``)
  with its log-sum-exp: where ``sdpa`` beats ``flash_lse``, whether a log-sum-exp kernel as fast
  exists (its P is a shape: one graph per length).
- ``efficient_lse``: the prefix through the memory-efficient kernel
  (``aten._efficient_attention_forward``) over the whole buffer with the key count in a device tensor
  (``seqlen_k``) and its log-sum-exp: graph-safe across P, as the split's flash call is.
- ``split_flash``: the prefix cut into segments of --segment rows, run as a batch of segments
  (a strided view of the buffer, no copy), merged by their log-sum-exps: flash-decoding's split
  over keys, from stock kernels.

The prefix-only candidates leave out the tree block (``[n, n]``, a few microseconds): they bound
what a prefix/tree split could cost. Random data; kernels only, no model. Plain argparse.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch
import torch.nn.functional as F

from ddtree.metrics.hardware import read_bandwidth
from ddtree.metrics.timer import graphed_us
from ddtree.models import split_attention
from ddtree.models.flex_attention import FlexLayout, attend



def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prefixes", type=int, nargs="+", default=[8192, 32768, 131072])
    p.add_argument("--sizes", type=int, nargs="+", default=[1, 16, 65, 257])
    p.add_argument("--heads", type=int, nargs=3, default=[32, 8, 128], metavar=("Q", "KV", "DIM"))
    p.add_argument("--segment", type=int, default=4096, help="split_flash: rows per segment of the prefix")
    p.add_argument("--candidates", nargs="+", default=["flex", "split", "split_plain", "split_triton", "sdpa", "flash_lse",
                                                        "cudnn_lse", "efficient_lse", "split_flash"])
    p.add_argument("--buffer", type=int, default=None,
                   help="rows of the K/V buffers (a fast path's static cache, e.g. 132000); default: prefix + n")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--out", type=Path, default=None)
    return p.parse_args(argv)


def timed_us(fn, reps: int) -> float:
    """Microseconds per call, call by call (CUDA events around each; launch gaps included)."""
    fn()  # warm-up (and compilation)
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(1e3 * start.elapsed_time(end))
    return statistics.median(times)


def merge(out: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """Segments' outputs ``[S, H, R, d]`` and log-sum-exps ``[S, H, R]`` -> ``[H, R, d]``."""
    top = lse.max(dim=0).values
    weight = (lse - top).exp()  # [S, H, R]
    return (weight[..., None] * out.float()).sum(0) / weight.sum(0)[..., None]


def candidates(q, keys, values, past: int, n: int, segment: int, layout: FlexLayout, split: FlexLayout):
    """name -> a no-argument call, for ``q`` ``[1, Hq, n, d]`` over buffers ``[1, Hkv, L, d]``."""
    hkv, d = keys.shape[1], keys.shape[3]
    groups = q.shape[1] // hkv
    folded = q.reshape(1, hkv, groups * n, d)  # head j * groups + i, row t -> row i * n + t (as the fast path folds)
    k, v = keys[:, :, :past], values[:, :, :past]
    segments = past // segment

    def split_flash():
        ks = keys[0, :, : segments * segment].unflatten(1, (segments, segment)).transpose(0, 1)  # [S, Hkv, seg, d]
        vs = values[0, :, : segments * segment].unflatten(1, (segments, segment)).transpose(0, 1)
        qs = folded.expand(segments, -1, -1, -1)
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention(qs, ks, vs)[:2]
        return merge(out, lse)

    sms = torch.cuda.get_device_properties(q.device).multi_processor_count
    cut = split_attention.segments_for(n, groups, hkv, keys.shape[2], sms)

    def split_with(merge):
        return lambda: split_attention.split_attend(q, keys, values, split.past, split.rows, split.visible,
                                                    segments=cut, merge=merge, bounds=split.bounds(cut, groups * n))

    packed_k, packed_v = keys.transpose(1, 2), values.transpose(1, 2)  # [1, L, Hkv, d] views, unit-stride head dim
    packed_q = folded.transpose(1, 2)  # [1, rows, Hkv, d]
    seqlen_k = torch.full((1,), past, dtype=torch.int32, device=q.device)

    return {
        "flex": lambda: attend(q, keys, values, layout.block_mask),
        "split": lambda: attend(q, keys, values, split.block_mask),
        "split_plain": split_with(split_attention.block_and_merge),
        "split_triton": split_with(split_attention.triton_merge),
        "sdpa": lambda: F.scaled_dot_product_attention(folded, k, v),
        "flash_lse": lambda: torch.ops.aten._scaled_dot_product_flash_attention(folded, k, v)[:2],
        "cudnn_lse": lambda: torch.ops.aten._scaled_dot_product_cudnn_attention(folded, k, v, None, True)[:2],
        "efficient_lse": lambda: torch.ops.aten._efficient_attention_forward(
            packed_q, packed_k, packed_v, None, None, None, None, None, 0.0, 0, True, seqlen_k=seqlen_k)[:2],
        "split_flash": split_flash,
    }


@torch.inference_mode()
def main(argv=None) -> None:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("experiments/attention_bench.py times GPU kernels: no CUDA device is visible")
    hq, hkv, d = args.heads
    split_attention.min_queries = lambda head_dim: 1  # time the split for one query too (the fast path may not)
    device, dtype = torch.device("cuda"), torch.bfloat16
    gen = torch.Generator(device).manual_seed(0)
    rows, bandwidth = [], read_bandwidth(torch.cuda.get_device_name())
    for past in args.prefixes:
        length = max(past + max(args.sizes), args.buffer or 0)
        keys = torch.randn(1, hkv, length, d, device=device, dtype=dtype, generator=gen)
        values = torch.randn_like(keys)
        floor_us = 1e6 * 2 * past * hkv * d * keys.element_size() / bandwidth
        for n in args.sizes:
            q = torch.randn(1, hq, n, d, device=device, dtype=dtype, generator=gen)
            layout = FlexLayout(n, length, device)
            layout.set(past, torch.ones(n, n, dtype=torch.bool, device=device).tril())
            split = FlexLayout(n, length, device, split=True)
            split.set(past, layout.visible)
            row = {"prefix": past, "n": n, "kv_read_floor_us": floor_us}
            for name, fn in candidates(q, keys, values, past, n, args.segment, layout, split).items():
                if name not in args.candidates:
                    continue
                try:
                    fn()  # compiles outside the capture
                    row[name] = graphed_us(fn, args.reps)
                except Exception as err:  # not capturable, or not for this shape: call by call, else the error
                    torch.cuda.synchronize()
                    try:
                        row[f"{name}_ungraphed"] = timed_us(fn, args.reps)
                    except Exception as again:
                        row[name] = f"{type(again).__name__}: {str(again).splitlines()[0][:160]}"
                    else:
                        row[name] = f"not captured ({type(err).__name__}: {str(err).splitlines()[0][:120]})"
            rows.append(row)
            print(json.dumps(row), flush=True)
            if args.out is not None:
                args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(device), "heads": args.heads,
                                                "segment": args.segment, "buffer": args.buffer, "rows": rows},
                                               indent=1))
        del keys, values
    print("\nus per layer, graphed; (call by call) where a graph could not hold it")
    print("\n| prefix | n | K/V read floor us | " + " | ".join(args.candidates) + " |")
    print("|---:|---:|---:|" + "---:|" * len(args.candidates))
    for r in rows:
        cells = [f"{r[c]:.1f}" if isinstance(r.get(c), float) else
                 f"({r[c + '_ungraphed']:.1f})" if isinstance(r.get(c + "_ungraphed"), float) else "fail"
                 for c in args.candidates]
        print(f"| {r['prefix']} | {r['n']} | {r['kv_read_floor_us']:.1f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
