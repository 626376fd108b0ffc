"""Draw the README's picture of one DDTree round: docs/images/ddtree_round.png.

    python docs/make_images.py                       # the shipped pair if assets/pair has one
    python docs/make_images.py --tiny                # a tiny random target with the oracle drafter

With the shipped pair (a trained code target and its DFlash drafter) the round is real DDTree on a
HumanEval prefix. Without it, a tiny random-weight target stands in, drafted by the oracle drafter
(the target's own distribution with the top two tokens swapped at random depths), so the picture
still shows a tree whose side branches catch what the top-1 chain misses. The drawn round is the
one that accepted the most tokens.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from ddtree import SpeculativeEngine
from ddtree.masks import DenseMaskCompiler
from ddtree.models import HFTarget
from ddtree.trees import BestFirstTreeBuilder
from ddtree.verifiers import GreedyVerifier
from ddtree.viz import draw_round

ROOT = Path(__file__).resolve().parents[1]
FENCE = "```python\n"


def humaneval_code() -> str:
    """The first protocol HumanEval prompt as bare code (the shipped target is a plain code LM)."""
    from ddtree.data import load_prompts

    text = load_prompts("humaneval", limit=1)[0].turns[0]
    return text.split(FENCE, 1)[1].rsplit("\n```", 1)[0] if FENCE in text else text


def parts(pair_dir: Path, tiny: bool):
    """(target, drafter, tokenizer, prompt ids, where they came from)."""
    if not tiny and (pair_dir / "target" / "config.json").is_file():
        from ddtree.drafters import DFlashDrafter
        from ddtree.training.pair import load_pair

        pair = load_pair(pair_dir, dtype=torch.float32)
        target = HFTarget(pair.target)
        ids = pair.tokenizer.encode(humaneval_code())[-128:]
        return target, DFlashDrafter(pair.dflash, target), pair.tokenizer, ids, "shipped pair, DFlash drafter"
    from ddtree.testing import oracle_drafter, tiny_target, tiny_tokenizer

    target, tokenizer = HFTarget(tiny_target("qwen3")), tiny_tokenizer(96)
    ids = tokenizer.encode("def add(a, b):\n    return a + b\n", add_special_tokens=False)
    drafter = oracle_drafter(target, depth=6, swap_prob=0.35, sharpness=8.0, seed=1)
    return target, drafter, tokenizer, ids, "tiny random target, oracle drafter"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", type=Path, default=ROOT / "assets" / "pair")
    parser.add_argument("--tiny", action="store_true", help="use a tiny random target even if the pair is there")
    parser.add_argument("--budget", type=int, default=20, help="tree nodes (small enough to read)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images" / "ddtree_round.png")
    args = parser.parse_args()

    torch.manual_seed(0)
    target, drafter, tokenizer, ids, source = parts(args.pair, args.tiny)
    engine = SpeculativeEngine(target, drafter, BestFirstTreeBuilder(args.budget), DenseMaskCompiler(), GreedyVerifier())
    result = engine.generate(ids, max_new_tokens=32, record=True)
    best = max(result.rounds, key=lambda r: r.verification.accepted)  # max keeps the first of ties
    fig = draw_round(best, tokenizer)
    fig.axes[0].set_title(f"one DDTree round, budget {args.budget}: {best.verification.accepted} accepted + bonus"
                          f"  [{source}]", fontsize=9)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110, bbox_inches="tight")
    print(f"{args.out}: round of {best.tree.size} nodes, tau of the run {result.mean_acceptance:.2f} ({source})")


if __name__ == "__main__":
    main()
