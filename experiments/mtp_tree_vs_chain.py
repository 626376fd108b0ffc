"""MTP-chain vs MTP-tree: acceptance of one fitted MTP head under both tree builders (CPU, tiny).

A tiny random-weight target gets an MTP head distilled on its own greedy text; then the same
head drafts for the chain builder (top-1 per depth, k = 1..5) and for the best-first builder
(budget B over ``--tree-steps`` depths). Every run is checked token-identical to the target's
greedy output. tau (mean acceptance length, bonus included) is reported on the prompts the head
was fitted on (a confident drafter) and on held-out prompts (an unsure one), since trees pay
off when the top-1 token is often wrong.

    python experiments/mtp_tree_vs_chain.py                      # about a minute on 2 cores
    python experiments/mtp_tree_vs_chain.py --family llama --budgets 4 16 64
"""

from __future__ import annotations

import argparse
import time

import torch

from ddtree import SpeculativeEngine
from ddtree.drafters import MTPDrafter
from ddtree.masks import DenseMaskCompiler
from ddtree.metrics import mean_of_means
from ddtree.models import HFTarget, MTPHead
from ddtree.models.mtp import fit_to_target
from ddtree.testing import tiny_target
from ddtree.trees import BestFirstTreeBuilder, ChainTreeBuilder
from ddtree.verifiers import GreedyVerifier


def _prompts(count: int, seed: int, length: int = 8, vocab: int = 90) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (length,), generator=gen) for _ in range(count)]


def _greedy(model, prompt: torch.Tensor, new_tokens: int) -> list[int]:
    ids = prompt[None]  # an explicit mask: generate would otherwise mask prompt tokens equal to pad
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False,
                         eos_token_id=None, pad_token_id=0)
    return out[0, prompt.numel():].tolist()


def _tau(engine: SpeculativeEngine, model, prompts, references, new_tokens: int) -> float:
    lengths = []
    for prompt, reference in zip(prompts, references):
        result = engine.generate(prompt, max_new_tokens=new_tokens)
        if result.tokens != reference:
            raise AssertionError(f"output differs from the target's greedy output:\n{result.tokens}\n{reference}")
        lengths.append(result.acceptance_lengths)
    return mean_of_means(lengths)  # responses with no round have no tau


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", default="qwen3", choices=["qwen3", "llama"])
    parser.add_argument("--train-prompts", type=int, default=24)
    parser.add_argument("--eval-prompts", type=int, default=6, help="held-out prompts (and as many fitted ones)")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--fit-steps", type=int, default=300)
    parser.add_argument("--fit-depth", type=int, default=3)
    parser.add_argument("--temperature", type=float, default=0.25, help="distillation temperature")
    parser.add_argument("--depths", type=int, nargs="+", default=[1, 2, 3, 5], help="chain lengths k")
    parser.add_argument("--budgets", type=int, nargs="+", default=[4, 8, 16, 32], help="tree node budgets B")
    parser.add_argument("--tree-steps", type=int, default=5, help="MTP steps drafted for the trees")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (tiny ops: more threads only contend)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    start = time.perf_counter()
    model = tiny_target(args.family, seed=args.seed)
    target = HFTarget(model)
    train = _prompts(args.train_prompts, seed=args.seed + 1)
    held_out = _prompts(args.eval_prompts, seed=args.seed + 2)
    seen = train[: args.eval_prompts]
    with torch.no_grad():
        sequences = [torch.cat([p, torch.tensor(_greedy(model, p, args.new_tokens))]) for p in train]
    head = MTPHead.for_target(model, seed=args.seed)
    losses = fit_to_target(head, model, sequences, steps=args.fit_steps, depth=args.fit_depth,
                           temperature=args.temperature)
    print(f"fitted MTP head on {len(train)} greedy continuations: KL {losses[0]:.3f} -> {losses[-1]:.3f} "
          f"({time.perf_counter() - start:.1f} s)")

    refs = {name: [_greedy(model, p, args.new_tokens) for p in ps] for name, ps in (("seen", seen), ("held", held_out))}
    runs = [(f"mtp-chain k={k}", k, ChainTreeBuilder(), 1 + k) for k in args.depths]
    runs += [(f"mtp-tree B={b}", args.tree_steps, BestFirstTreeBuilder(b), 1 + b) for b in args.budgets]
    print(f"\n{'strategy':<18} {'steps':>5} {'verify':>6} {'tau fitted':>11} {'tau held-out':>13}")
    for name, steps, tree, verify in runs:
        engine = SpeculativeEngine(target, MTPDrafter(head, target, steps=steps), tree, DenseMaskCompiler(),
                                   GreedyVerifier())
        tau_seen = _tau(engine, model, seen, refs["seen"], args.new_tokens)
        tau_held = _tau(engine, model, held_out, refs["held"], args.new_tokens)
        print(f"{name:<18} {steps:>5} {verify:>6} {tau_seen:>11.2f} {tau_held:>13.2f}")
    print(f"\nall outputs token-identical to greedy; {time.perf_counter() - start:.1f} s in all")


if __name__ == "__main__":
    main()
