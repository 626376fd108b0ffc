"""Which part of split attention departs from its reference on a shape: the flash kernel over the
prefix, the compiled merge, or neither (one GPU; random bf16 data over a 3000-row prefix).

    python experiments/split_merge_diag.py --out split_merge_diag.json

Per shape (Hq, Hkv, head dim, n) and prefix length P, the largest difference from the all-reference
split (``prefix_reference`` and the plain ``block_and_merge``) of: the flash kernel with the plain merge
(``flash+plain``), the reference prefix with the compiled merge (``ref+compiled``), and the flash kernel
with the compiled merge (``flash+compiled``, what the fast path runs); then the flash kernel's outputs
and log-sum-exps against the reference's, segment by segment. Plain argparse, no Hydra.
"""

from __future__ import annotations

import argparse
import json
import traceback
from pathlib import Path

import torch

from ddtree.models import split_attention as sa
from ddtree.models.fused import recompile_limit

SHAPES = [((24, 4, 256), 65), ((24, 4, 256), 257), ((4, 2, 16), 257), ((32, 8, 128), 257), ((24, 4, 256), 16)]


def diagnose(q_heads: int, kv_heads: int, d: int, n: int, pasts, length: int, device: torch.device) -> dict:
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    segments = sa.segments_for(n, q_heads // kv_heads, kv_heads, length, sms)
    gen = torch.Generator(device).manual_seed(n)
    q = torch.randn(1, q_heads, n, d, device=device, dtype=torch.bfloat16, generator=gen)
    k, v = (torch.randn(1, kv_heads, length + n, d, device=device, dtype=torch.bfloat16, generator=gen) for _ in range(2))
    visible = torch.ones(n, n, dtype=torch.bool, device=device).tril()
    m = (q_heads // kv_heads) * n
    rows = {"segments": segments}
    for past in pasts:
        row = {}
        p, own = torch.tensor(past, device=device), torch.arange(past, past + n, device=device)
        try:
            want = sa.split_attend(q, k, v, p, own, visible, segments=segments, prefix=sa.prefix_reference,
                                   merge=sa.block_and_merge)
            for name, kwargs in (("flash+plain", dict(merge=sa.block_and_merge)), ("ref+compiled", dict(prefix=sa.prefix_reference)),
                                 ("flash+compiled", {})):
                try:
                    with recompile_limit():
                        got = sa.split_attend(q, k, v, p, own, visible, segments=segments, **kwargs)
                    row[name] = (got.float() - want.float()).abs().max().item()
                except Exception as err:
                    row[name] = f"{type(err).__name__}: {str(err)[:300]}"
            bounds = sa.SegmentBounds(p, segments, m)
            packed = q[0].reshape(kv_heads, m, d).transpose(0, 1).unsqueeze(0).expand(segments, m, kv_heads, d)
            args = (packed.reshape(segments * m, kv_heads, d), k[0].transpose(0, 1), v[0].transpose(0, 1), bounds.cu_q,
                    bounds.starts, bounds.used, m, length + n, d**-0.5)
            flash_out, flash_lse = sa.prefix_flash(*args)
            ref_out, ref_lse = sa.prefix_reference(*args)
            row["flash_out_err"] = (flash_out.float() - ref_out.float()).abs().max().item()
            row["flash_lse_err"] = (flash_lse - ref_lse).abs().max().item()
            row["flash_out_err_by_segment"] = (flash_out.float() - ref_out.float()).abs().view(segments, -1).amax(1).tolist()
        except Exception:
            row["error"] = traceback.format_exc()[-1500:]
        rows[str(past)] = row
    return rows


@torch.inference_mode()
def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--length", type=int, default=3000, help="prefix rows of the buffer")
    p.add_argument("--pasts", type=int, nargs="+", default=[0, 1, 777, 3000])
    p.add_argument("--out", type=Path, default=Path("split_merge_diag.json"))
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("experiments/split_merge_diag.py compares GPU kernels: no CUDA device is visible")
    device = torch.device("cuda")
    result = {"device": torch.cuda.get_device_name(device), "torch": torch.__version__, "shapes": {}}
    for (q_heads, kv_heads, d), n in SHAPES:
        key = f"{q_heads}/{kv_heads}/{d} n={n}"
        result["shapes"][key] = diagnose(q_heads, kv_heads, d, n, args.pasts, args.length, device)
        print(key, json.dumps(result["shapes"][key])[:800], flush=True)
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
