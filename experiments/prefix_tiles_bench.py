"""Tiles and segment counts of split attention's Triton prefix kernel against the flash prefix, per shape.

    python experiments/prefix_tiles_bench.py --out prefix_tiles.json      # one GPU, ~2 min

For Qwen3.6-27B's attention heads (24 over 4 of 256) and Qwen3-8B's (32 over 8 of 128), at
committed lengths 8192 and 32768 over 132000-row K/V buffers (a long-context fast path's static
cache), and n = 1, 16, 65, 257 queries: one layer's ``split_attend`` time, graphed
(``ddtree.metrics.timer.graphed_us``), with

- ``flash_us``: the flash prefix (``prefix_flash``) and the Triton merge, ``segments_for``'s count
  (S0); ``flash_compiled_merge_us``: the same with the compiled merge (and its difference from the
  reference); ``flash_prefix_only_us``: the flash call alone; ``flex_us`` (n <= 16): FlexAttention;
- ``(BM, BN, warps, stages)/S<k>``: ``prefix_triton`` with those tiles (``PREFIX_TILES``) and k
  segments (S0, and the count that gives two programs per multiprocessor at that BM), with the Triton
  merge: [us, largest difference from the plain-math reference]; with ``--fused``, ``.../fused``: the
  block part in the same launch as one more segment (``prefix_block_triton``), then ``triton_combine``.

Each row names the fastest Triton form within 0.05 of the reference (``best``). Random data;
kernels only. Plain argparse; stops adding shapes after ``--seconds``.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch

from ddtree.metrics.timer import graphed_us
from ddtree.models import split_attention as sa
from ddtree.models.flex_attention import FlexLayout, attend

TILES = {128: [(64, 64, 4, 3), (64, 64, 4, 2), (128, 64, 8, 3), (16, 64, 4, 3)],
         256: [(64, 32, 8, 2), (64, 32, 4, 2), (32, 64, 4, 2), (16, 64, 4, 2)]}
# More tiles (``--more``): 128-row programs over two warp groups, half the key/value re-reads of
# 64-row ones where many query rows share a K/V head (65 queries: 390 rows).
# A fifth entry: the output columns a program writes (its scores still over the whole head dim), fewer
# registers (no spills at 128 of 256 in an sm_90 build) for twice the programs and score work.
MORE_TILES = {128: [(64, 64, 4, 3, 64)],
              256: [(128, 32, 8, 2), (64, 32, 4, 2, 128), (128, 32, 8, 2, 128), (128, 64, 8, 2, 128),
                    (64, 64, 4, 2, 128), (64, 32, 4, 3, 128)]}
HEADS = {"27b": (24, 4, 256), "8b": (32, 8, 128)}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--buffer", type=int, default=132000)
    p.add_argument("--seconds", type=float, default=115.0)
    p.add_argument("--out", type=Path, default=Path("prefix_tiles.json"))
    p.add_argument("--heads", nargs="+", choices=sorted(HEADS), default=["27b", "8b"],
                   help="27b: 24 query heads over 4 of 256; 8b: 32 over 8 of 128")
    p.add_argument("--pasts", type=int, nargs="+", default=[8192, 32768], help="committed prefix lengths")
    p.add_argument("--sizes", type=int, nargs="+", default=[1, 16, 65, 257], help="queries per call")
    p.add_argument("--more", action="store_true", help="also time MORE_TILES")
    p.add_argument("--fused", action="store_true",
                   help="also time each tile with the block part in the prefix launch (prefix_block_triton, "
                        "then triton_combine): '<tile>/S<k>/fused'")
    p.add_argument("--segments", type=int, nargs="*", default=[],
                   help="more segment counts to time each tile at (besides S0 and the two-per-SM count)")
    return p.parse_args(argv)


def shape_row(q, k, v, past: int, n: int, sms: int, tiles: list | None = None, extra_segments=(),
              fused: bool = False) -> dict:
    """One shape's timings (see the module doc)."""
    dev, (_, hq, _, d), hkv, length = q.device, q.shape, k.shape[1], k.shape[2]
    groups, m = hq // hkv, hq // hkv * n
    vis = torch.ones(n, n, dtype=torch.bool, device=dev).tril()
    p, rows = torch.tensor(past, device=dev), torch.arange(past, past + n, device=dev)
    s0 = sa.segments_for(n, groups, hkv, length, sms)
    row = {"heads": [hq, hkv, d], "P": past, "n": n, "S0": s0}

    def reference(bounds, segments):
        return sa.split_attend(q, k, v, p, rows, vis, segments=segments, prefix=sa.prefix_reference,
                               merge=sa.block_and_merge, bounds=bounds).float()

    b0 = sa.SegmentBounds(p, s0, m)
    want0 = reference(b0, s0)
    flash = lambda: sa.split_attend(q, k, v, p, rows, vis, segments=s0, merge=sa.triton_merge, bounds=b0)
    row["flash_err"] = float((flash().float() - want0).abs().max())
    row["flash_us"] = graphed_us(flash, 20)
    compiled = lambda: sa.split_attend(q, k, v, p, rows, vis, segments=s0, merge=sa._merge_kernel(dev), bounds=b0)
    row["flash_compiled_merge_err"] = float((compiled().float() - want0).abs().max())
    row["flash_compiled_merge_us"] = graphed_us(compiled, 20)
    packed = q[0].reshape(hkv, m, d).transpose(0, 1).unsqueeze(0).expand(s0, m, hkv, d).reshape(s0 * m, hkv, d)
    row["flash_prefix_only_us"] = graphed_us(lambda: sa.prefix_flash(
        packed, k[0].transpose(0, 1), v[0].transpose(0, 1), b0.cu_q, b0.starts, b0.used, m, length, d**-0.5), 20)
    if n <= 16:
        layout = FlexLayout(n, length, dev)
        layout.set(past, vis)
        fn = lambda: attend(q, k, v, layout.block_mask)
        fn()
        row["flex_us"] = graphed_us(fn, 20)
    best, kept = None, dict(sa.PREFIX_TILES)
    forms = [("", sa.prefix_triton, sa.triton_merge)] + [("/fused", sa.prefix_block_triton, sa.triton_combine)] * fused
    try:
        for tile in tiles or TILES[d]:
            sa.PREFIX_TILES[d] = tile
            fill = max(1, min(math.ceil(2 * sms / (hkv * math.ceil(m / tile[0]))), math.ceil(length / 512)))
            for segments in sorted({s0, fill, *extra_segments}):
                bounds = sa.SegmentBounds(p, segments, m)
                want = want0 if segments == s0 else reference(bounds, segments)
                for suffix, prefix, merge in forms:
                    name = f"{tile}/S{segments}{suffix}"
                    fn = lambda: sa.split_attend(q, k, v, p, rows, vis, segments=segments, prefix=prefix,  # noqa: E731
                                                 merge=merge, bounds=bounds)
                    try:
                        err = float((fn().float() - want).abs().max())
                        us = graphed_us(fn, 20)
                    except Exception as exc:  # a tile the GPU cannot hold (shared memory, registers)
                        row[name] = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:120]}"
                        continue
                    row[name] = [round(us, 1), round(err, 4)]
                    if err < sa.SERVES_TOLERANCE and (best is None or us < best[1]):
                        best = (name, us)
    finally:
        sa.PREFIX_TILES.clear()
        sa.PREFIX_TILES.update(kept)
    row["best"] = best
    return row


@torch.inference_mode()
def main(argv=None) -> None:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("experiments/prefix_tiles_bench.py times GPU kernels: no CUDA device is visible")
    dev, dtype = torch.device("cuda"), torch.bfloat16
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    rows, start = [], time.time()
    for hq, hkv, d in (HEADS[name] for name in args.heads):
        tiles = TILES[d] + (MORE_TILES[d] if args.more else [])
        gen = torch.Generator(dev).manual_seed(0)
        k = torch.randn(1, hkv, args.buffer, d, device=dev, dtype=dtype, generator=gen)
        v = torch.randn_like(k)
        for past in args.pasts:
            for n in args.sizes:
                if time.time() - start > args.seconds:
                    break
                q = torch.randn(1, hq, n, d, device=dev, dtype=dtype, generator=gen)
                rows.append(shape_row(q, k, v, past, n, sms, tiles, args.segments, args.fused))
                print(json.dumps({key: rows[-1].get(key) for key in ("heads", "P", "n", "S0", "flex_us", "flash_us",
                                                                      "flash_compiled_merge_us",
                                                                      "flash_prefix_only_us", "best")}), flush=True)
                args.out.write_text(json.dumps(rows, indent=1))
        del k, v
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
