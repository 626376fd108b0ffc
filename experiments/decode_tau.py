"""A DFlash drafter's T = 0 tau on a prompt set without decoding: the target's greedy text, then one
teacher-forced drafter forward over every anchor of it (``ddtree.training.dflash.decode_tau``).

At T = 0 the chain DFlash decode of a prompt commits the target's greedy continuation whatever the
drafter, and each round accepts the drafter's correct prefix at its anchor; so the rounds, and tau,
follow from the continuation and the drafter's prediction at every anchor. The continuations are
the drafter-independent part: they are cached (``--cache``), and drafters are then compared in
about a minute each on a CPU, where the main job decodes for twenty. Encoding and settings are the
main job's (the last 256 prompt tokens, 96 new tokens, exact accounting).

    python experiments/decode_tau.py                                        # hybrid pair, 164 HumanEval stubs
    python experiments/decode_tau.py --drafter /tmp/w/pair/dflash           # another drafter, same cache
    python experiments/decode_tau.py --pair assets/pair --data jsonl --path assets/pair/heldout_prompts.jsonl
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from ddtree.data import encode_turn, load_prompts
from ddtree.drafters.dflash import check_pair
from ddtree.errors import run_cli
from ddtree.models import target_for
from ddtree.models.dflash import DFlashDraftModel
from ddtree.presets import REPO
from ddtree.testing import greedy_reference
from ddtree.training.dflash import decode_tau
from ddtree.training.pair import load_pair
from ddtree.training.sequences import SequenceSet


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pair", type=Path, default=REPO / "assets" / "pair_hybrid", help="a pair directory (its target)")
    p.add_argument("--drafter", type=Path, nargs="+", default=None, help="DFlash checkpoints (default: the pair's)")
    p.add_argument("--data", default="humaneval-code", help="a ddtree.data.load_prompts name")
    p.add_argument("--path", type=Path, default=None, help="the prompts file for --data jsonl")
    p.add_argument("--limit", type=int, default=None, help="prompts (default: the dataset's protocol count)")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--max-prompt-tokens", type=int, default=256)
    p.add_argument("--cache", type=Path, default=None, help="the greedy continuations' file (default: under outputs/)")
    p.add_argument("--threads", type=int, default=2)
    return p.parse_args(argv)


def greedy_continuations(pair, prompts, max_new_tokens: int, max_prompt_tokens: int) -> SequenceSet:
    """Each prompt's last ``max_prompt_tokens`` tokens and the target's greedy continuation, padded
    on the right: ``[N, S]``, the continuation (eos included) marked in the loss mask."""
    tok = pair.tokenizer
    rows = []
    for prompt in prompts:
        ids = encode_turn(tok, prompt.turns[0])[-max_prompt_tokens:]
        rows.append((ids, greedy_reference(pair.target, torch.tensor(ids), max_new_tokens, tok.eos_token_id)))
    width = max(len(p) + len(c) for p, c in rows)
    ids = torch.full((len(rows), width), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for r, (p, c) in enumerate(rows):
        ids[r, : len(p) + len(c)] = torch.tensor(p + c)
        mask[r, len(p) : len(p) + len(c)] = True
    return SequenceSet(ids, mask)


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    pair = load_pair(args.pair, dtype=torch.float32)
    drafters = {path: DFlashDraftModel.from_pretrained(path, dtype=torch.float32) for path in args.drafter or []}
    target = target_for(pair.target, fast=False)
    for drafter in drafters.values():
        check_pair(drafter, target)  # before any decoding: a drafter made for another target says so
    prompts = load_prompts(args.data, path=args.path, limit=args.limit)
    name = f"{args.pair.name}_{args.data}_{len(prompts)}_{args.max_prompt_tokens}_{args.max_new_tokens}.safetensors"
    cache = args.cache or REPO / "outputs" / "decode_tau" / name
    if cache.is_file():
        data = SequenceSet.load(cache)
        print(f"greedy continuations of {len(data)} prompts from {cache}")
    else:
        start = time.perf_counter()
        data = greedy_continuations(pair, prompts, args.max_new_tokens, args.max_prompt_tokens)
        data.save(cache)
        print(f"greedy continuations of {len(data)} prompts in {time.perf_counter() - start:.0f}s -> {cache}")
    for path, drafter in (drafters or {args.pair / "dflash": pair.dflash}).items():
        start = time.perf_counter()
        tau = decode_tau(drafter, pair.target, data)
        print(f"{path}: DFlash tau {tau:.3f} (T = 0, {len(data)} prompts of {args.data}, "
              f"{args.max_new_tokens} new tokens; {time.perf_counter() - start:.0f}s)")


if __name__ == "__main__":
    run_cli(main)
