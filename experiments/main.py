"""The main job: AR, MTP, DFlash and DDTree on the shipped pair, on a CPU, in a few minutes.

    python experiments/main.py                                  # assets/pair, defaults below
    python experiments/main.py --humaneval 2 --heldout 2 --max-new-tokens 32   # a quick look
    python experiments/main.py --pair /path/to/pair --json results.json

Prompts: HumanEval problems (``ddtree.data.load_prompts("humaneval")``, the paper's
``shuffle(seed=0)`` order) given as raw code prefixes, since the shipped target is a plain code
LM with no chat template, and the held-out stdlib prefixes shipped in the pair directory. Every
strategy decodes every prompt at T = 0 and T = 1 through the one engine; the tables give tau
(mean acceptance length, bonus included), tokens/s and speedup over AR (mean TPOT ratio,
decode time only).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from pathlib import Path

import torch

from ddtree.training.bench import benchmark, format_table, strategies
from ddtree.training.pair import load_pair

FENCE = "```python\n"


def humaneval_code(limit: int) -> list[str]:
    """The first ``limit`` HumanEval prompts (protocol order) as bare code, without the fence."""
    from ddtree.data import load_prompts

    texts = []
    for prompt in load_prompts("humaneval", limit=limit):
        text = prompt.turns[0]
        if FENCE in text:  # the protocol's template wraps the code in a header and a fence
            text = text.split(FENCE, 1)[1].rsplit("\n```", 1)[0]
        texts.append(text)
    return texts


def encode(tokenizer, texts: list[str], max_prompt_tokens: int) -> list[list[int]]:
    """Token ids of each text, keeping its last ``max_prompt_tokens`` (the end is what is continued)."""
    return [tokenizer.encode(t)[-max_prompt_tokens:] or [tokenizer.eos_token_id] for t in texts]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", type=Path, default=Path("assets/pair"))
    parser.add_argument("--humaneval", type=int, default=4, help="HumanEval prompts")
    parser.add_argument("--heldout", type=int, default=4, help="held-out corpus prompts")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--max-seconds", type=float, default=200.0,
                        help="decode time budget: no new prompt starts once a set's share is spent")
    parser.add_argument("--max-prompt-tokens", type=int, default=256)
    parser.add_argument("--temperatures", default="0,1")
    parser.add_argument("--budgets", default="16,32,64", help="DDTree node budgets")
    parser.add_argument("--mtp-steps", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default=None, help="float32 on CPU, bfloat16 on CUDA unless given")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads; 1 by default: at batch 1 a second thread buys little, and on a "
                             "busy machine its spin-waits can slow every step several times over")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args()

    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if args.device.startswith("cuda") else torch.float32)
    start = time.perf_counter()
    pair = load_pair(args.pair, device=args.device, dtype=dtype)
    plan = strategies(pair.dflash, pair.mtp, [int(b) for b in args.budgets.split(",") if b], args.mtp_steps)
    temperatures = [float(t) for t in args.temperatures.split(",")]
    sets = {
        "humaneval": encode(pair.tokenizer, humaneval_code(args.humaneval), args.max_prompt_tokens) if args.humaneval else [],
        "heldout": encode(pair.tokenizer, [p["text"] for p in pair.prompts[: args.heldout]], args.max_prompt_tokens),
    }
    print(f"pair {args.pair}: strategies {', '.join(s.name for s in plan)}; threads {torch.get_num_threads()}, "
          f"{os.cpu_count()} cores; {args.max_new_tokens} new tokens")
    results, todo = {}, [name for name, prompts in sets.items() if prompts]
    for i, name in enumerate(todo):
        share = (args.max_seconds - (time.perf_counter() - start)) / (len(todo) - i)
        rows = benchmark(pair.target, plan, sets[name], temperatures, args.max_new_tokens,
                         stop_token_ids=[pair.tokenizer.eos_token_id], seed=args.seed, max_seconds=share)
        print()
        print(format_table(rows, f"{name}: {rows[0].responses} prompts"))
        results[name] = [dataclasses.asdict(r) for r in rows]
    print(f"\ntotal {time.perf_counter() - start:.1f}s")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
