"""Fit per-depth draft temperatures for the calibrated tree builder, and write them to its config.

Decodes held-out prompts at T = 0 with DDTree on a pair (records every round), labels each
round's draft with the target's own tokens, fits one temperature per depth
(``ddtree.training.calibration``) and writes ``configs/tree/calibrated.yaml``. It prints the
per-depth NLL of the target's tokens before and after, on the rounds it fitted.

    python experiments/calibrate_tree.py                      # the shipped pair, its 16 held-out prompts
    python experiments/calibrate_tree.py --marginal --out /tmp/calibrated.yaml

Then compare with the plain best-first tree on other prompts (the main job's HumanEval stubs):

    python experiments/main.py '~prompt_sets.heldout' prompt_sets.humaneval.limit=32 'temperatures=[0]' \\
        'strategies=[ddtree-16,cal-16,ddtree-64,cal-64]' max_seconds=3600 threads=1 \\
        "+strategy_specs.cal-16=['experiment=ddtree','tree=calibrated','tree.budget=16']" \\
        "+strategy_specs.cal-64=['experiment=ddtree','tree=calibrated','tree.budget=64']"
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

import ddtree
from ddtree.data import encode_turn, load_prompts
from ddtree.presets import REPO
from ddtree.training.calibration import NO_LABEL, chain_mask, depth_nll, fit_depth_temperatures, round_examples

CONFIG = """\
# DDTree over recalibrated draft scores: the best-first tree of `budget` nodes after tempering
# depth d's draft by temperatures[d - 1] (the last one also for deeper depths; all 1.0 is the
# plain best-first tree). Verification never reads the scores: as lossless as best_first.
# Fitted for {pair} by experiments/calibrate_tree.py:
# {how}.
_target_: ddtree.trees.CalibratedTreeBuilder
budget: 256
max_width: null
method: auto
temperatures: [{temperatures}]
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", type=Path, default=REPO / "assets" / "pair", help="a pair directory")
    parser.add_argument("--prompts", type=Path, default=None, help="JSONL prompts (default: the pair's held-out ones)")
    parser.add_argument("--limit", type=int, default=16, help="prompts to decode")
    parser.add_argument("--budget", type=int, default=64, help="budget of the DDTree run that records the rounds")
    parser.add_argument("--max-new-tokens", type=int, default=192)
    parser.add_argument("--max-prompt-tokens", type=int, default=256, help="a prompt's last tokens (as the main job)")
    parser.add_argument("--marginal", action="store_true", help="fit every labelled depth, not only on the top-1 path")
    parser.add_argument("--out", type=Path, default=REPO / "configs" / "tree" / "calibrated.yaml")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    start = time.perf_counter()
    engine = ddtree.load("ddtree", target=args.pair, budget=args.budget)
    prompts = load_prompts("jsonl", path=args.prompts or args.pair / "heldout_prompts.jsonl", limit=args.limit)
    results = []
    for prompt in prompts:
        ids = encode_turn(engine.tokenizer, prompt.turns[0])[-args.max_prompt_tokens :]
        results.append(engine.generate(ids, max_new_tokens=args.max_new_tokens, record=True))
    log_probs, labels = round_examples(results)
    mask = labels != NO_LABEL if args.marginal else chain_mask(log_probs, labels)
    temperatures = fit_depth_temperatures(log_probs, labels, mask)
    before, after = depth_nll(log_probs, labels, [1.0], mask), depth_nll(log_probs, labels, temperatures, mask)
    print(f"{len(prompts)} prompts, {labels.shape[0]} rounds, {time.perf_counter() - start:.0f} s")
    print(f"{'depth':>5} {'examples':>8} {'T':>7} {'NLL T=1':>8} {'NLL fit':>8}")
    for d, (n, t, b, a) in enumerate(zip(mask.sum(0).tolist(), temperatures, before.tolist(), after.tolist())):
        print(f"{d + 1:>5} {n:>8} {t:>7.3f} {b:>8.3f} {a:>8.3f}")
    how = (f"{len(prompts)} prompts of {args.prompts or 'its heldout_prompts.jsonl'}, DDTree-{args.budget}, "
           f"{args.max_new_tokens} new tokens, {'every labelled depth' if args.marginal else 'on the top-1 path'}")
    pair = "the shipped pair (assets/pair)" if args.pair.resolve() == (REPO / "assets" / "pair").resolve() else args.pair
    args.out.write_text(CONFIG.format(pair=pair, how=how, temperatures=", ".join(f"{t:g}" for t in temperatures)))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
