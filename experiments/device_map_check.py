"""Greedy outputs with a target split by an ``accelerate`` device map equal the one-device outputs.

    python experiments/device_map_check.py                          # half on cuda:0, half on the CPU
    python experiments/device_map_check.py --devices cuda:0 cuda:1   # two GPUs, where lent

A random-weight Qwen3 (fp32, so both placements compute the same function to rounding) is
placed on the first device and, separately, split layer-wise over the devices given; AR, DFlash
and DDTree run on both and their tokens are compared. Round times are reported per placement,
with the number of cross-device hops a forward makes (one per device boundary, each way).
"""

from __future__ import annotations

import argparse
import copy
import json
import time

import torch
from accelerate import dispatch_model
from transformers import Qwen3Config, Qwen3ForCausalLM

from ddtree import SpeculativeEngine
from ddtree.drafters import DFlashDrafter, NullDrafter
from ddtree.masks import DenseMaskCompiler
from ddtree.models import HFTarget
from ddtree.testing import tiny_dflash
from ddtree.trees import BestFirstTreeBuilder, ChainTreeBuilder
from ddtree.verifiers import GreedyVerifier


def split_map(num_layers: int, devices: list[str]) -> dict[str, str]:
    """Embedding on the first device, layers in equal consecutive runs, norm and head on the last."""
    per = -(-num_layers // len(devices))
    device_map = {"model.embed_tokens": devices[0], "model.rotary_emb": devices[0]}
    device_map.update({f"model.layers.{i}": devices[i // per] for i in range(num_layers)})
    device_map.update({"model.norm": devices[-1], "lm_head": devices[-1]})
    return device_map


def run(model, drafter_model, prompt, new_tokens: int, drafter_device: str) -> dict:
    target = HFTarget(model)
    drafter_model = drafter_model.to(drafter_device)
    out = {}
    for name, drafter, tree in [
        ("AR", NullDrafter(), ChainTreeBuilder()),
        ("DFlash", DFlashDrafter(drafter_model, target), ChainTreeBuilder()),
        ("DDTree-16", DFlashDrafter(drafter_model, target), BestFirstTreeBuilder(16)),
        ("DDTree-64", DFlashDrafter(drafter_model, target), BestFirstTreeBuilder(64)),
        ("DDTree-256", DFlashDrafter(drafter_model, target), BestFirstTreeBuilder(256)),
    ]:
        engine = SpeculativeEngine(target, drafter, tree, DenseMaskCompiler(), GreedyVerifier())
        engine.generate(prompt, max_new_tokens=4)
        start = time.perf_counter()
        result = engine.generate(prompt, max_new_tokens=new_tokens)
        out[name] = {"tokens": result.tokens, "round_ms": 1e3 * result.decode_time / len(result.acceptance_lengths),
                     "seconds": time.perf_counter() - start}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", nargs="+", default=["cuda:0", "cpu"])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=4096, hidden_size=args.hidden, intermediate_size=4 * args.hidden,
                         num_hidden_layers=args.layers, num_attention_heads=8, num_key_value_heads=4, head_dim=64,
                         max_position_embeddings=4096, tie_word_embeddings=False, attn_implementation="sdpa")
    reference = Qwen3ForCausalLM(config).eval()
    with torch.no_grad():
        reference.lm_head.weight.mul_(8.0)  # peaked logits: fewer near-ties between placements
    split = dispatch_model(copy.deepcopy(reference), device_map=split_map(args.layers, args.devices))
    one = reference.to(args.devices[0])
    drafter_model = tiny_dflash(reference, block_size=16)
    prompt = torch.randint(0, 4000, (64,))

    single = run(one, drafter_model, prompt, args.new_tokens, args.devices[0])
    spread = run(split, drafter_model, prompt, args.new_tokens, args.devices[-1])
    hops = 2 * (len(dict.fromkeys(split_map(args.layers, args.devices).values())) - 1)
    rows = {name: {"identical": single[name]["tokens"] == spread[name]["tokens"],
                   "one_device_round_ms": single[name]["round_ms"], "split_round_ms": spread[name]["round_ms"]}
            for name in single}
    # One-device greedy from transformers itself, as the ground truth.
    expected = one.generate(prompt[None].to(args.devices[0]), max_new_tokens=args.new_tokens, do_sample=False,
                            eos_token_id=None, pad_token_id=0)[0, prompt.numel():].tolist()
    print(f"devices {args.devices}, {args.layers} layers, hidden {args.hidden}, fp32; device hops per forward: {hops}")
    print("| strategy | split == one device | one == generate | one device ms/round | split ms/round |")
    print("|---|---|---|---:|---:|")
    for name, r in rows.items():
        same = single[name]["tokens"] == expected
        print(f"| {name} | {r['identical']} | {same} | {r['one_device_round_ms']:.2f} | {r['split_round_ms']:.2f} |")
        r["equals_generate"] = same
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "hops_per_forward": hops, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
