"""Train the shipped pair, stage by stage, in one process (no Hydra: runs on the bare GPU image).

    python experiments/shipped_pair.py --corpus .corpus/stdlib.jsonl --work /tmp/pair_work
    python experiments/shipped_pair.py --preset smoke --device cpu ...   # a tiny end-to-end run

Stages: tokenizer, target, regenerate, dflash, mtp, evaluate. A finished stage leaves
``stage_<name>.json`` in the work directory and is skipped on the next run; ``--redo`` names
stages to run again (with every stage after them, since those were built from the old outputs).
``--reuse-target assets/pair`` starts from a finished pair's tokenizer and target, so that only
the drafters are trained again; ``--continue-from assets/pair`` starts those drafters from that
pair's weights instead of fresh ones (with ``--seed 1``, on newly drawn prompts). The pair lands in ``<work>/pair``; ``make_shipped_pair.sh`` packs it.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import transformers

from ddtree.training.dflash import DFlashTrainConfig
from ddtree.training.lm import LMTrainConfig, TargetSpec
from ddtree.training.loop import Budget
from ddtree.training.mtp import MTPTrainConfig
from ddtree.training.pipeline import STAGES, PipelineConfig, reuse_target, run_pipeline


def smoke(cfg: PipelineConfig) -> PipelineConfig:
    """Every stage at toy size: seconds on a CPU, to check the pipeline end to end."""
    return dataclasses.replace(
        cfg, vocab_size=320, target=TargetSpec.tiny(320), lm=LMTrainConfig(batch_size=4, seq_len=64, eval_every=10),
        target_budget=Budget(max_steps=20), regen_prompts=16, prompt_tokens=16, new_tokens=32, regen_batch=8,
        block_size=8, dflash_layers=1, dflash_taps=2, dflash=DFlashTrainConfig(batch_size=4, anchors=4, log_every=10),
        dflash_budget=Budget(max_steps=20), mtp=MTPTrainConfig(batch_size=4, depth=2, log_every=10),
        mtp_budget=Budget(max_steps=20), heldout_prompts=2, tau_new_tokens=16, tau_budgets=(8,),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, default=Path(".corpus/stdlib.jsonl"))
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--assets", default="assets/pair",
                        help="committed tokenizer/ and heldout_prompts.jsonl to reuse ('' to build them)")
    parser.add_argument("--device", default=None)
    parser.add_argument("--preset", choices=("h200", "smoke"), default="h200")
    parser.add_argument("--deadline", type=float, default=None, help="seconds for the whole run")
    parser.add_argument("--stages", default=",".join(STAGES))
    parser.add_argument("--redo", default="", help="comma-separated stages to run again (and all later ones)")
    for stage in ("target", "regen", "dflash", "mtp", "tau"):
        parser.add_argument(f"--{stage}-seconds", type=float, default=None)
    parser.add_argument("--reuse-target", type=Path, default=None,
                        help="a finished pair whose tokenizer and target to keep (only later stages train)")
    parser.add_argument("--continue-from", type=Path, default=None,
                        help="a finished pair whose DFlash drafter and MTP head training continues from")
    parser.add_argument("--seed", type=int, default=None, help="seeds prompts, sampling and fresh weights (0)")
    parser.add_argument("--regen-prompts", type=int, default=None, help="prompts the target continues")
    parser.add_argument("--temperatures", default=None, type=lambda text: tuple(float(t) for t in text.split(",")),
                        help="comma-separated; the prompts are split evenly among them (0,0,1: two thirds greedy)")
    parser.add_argument("--dflash-layers", type=int, default=None)
    parser.add_argument("--docstring-fraction", type=float, default=None,
                        help="share of the prompts that end after a function's docstring (the rest: random windows)")
    args = parser.parse_args()
    transformers.utils.logging.disable_progress_bar()  # one line per stage event, not per shard

    cfg = PipelineConfig(corpus=args.corpus, work=args.work, stages=tuple(s for s in args.stages.split(",") if s),
                         assets=Path(args.assets) if args.assets else None)
    if args.preset == "smoke":
        cfg = smoke(cfg)
    changes = {"device": args.device, "deadline_seconds": args.deadline, "regen_seconds": args.regen_seconds,
               "tau_seconds": args.tau_seconds, "regen_prompts": args.regen_prompts, "dflash_layers": args.dflash_layers,
               "docstring_fraction": args.docstring_fraction,
               "temperatures": args.temperatures, "continue_from": args.continue_from, "seed": args.seed}
    for name, field in (("target", "target_budget"), ("dflash", "dflash_budget"), ("mtp", "mtp_budget")):
        seconds = getattr(args, f"{name}_seconds")
        if seconds is not None:
            changes[field] = dataclasses.replace(getattr(cfg, field), max_seconds=seconds)
    cfg = dataclasses.replace(cfg, **{k: v for k, v in changes.items() if v is not None})
    redo = [STAGES.index(s) for s in filter(None, args.redo.split(","))]
    for stage in STAGES[min(redo):] if redo else ():  # later stages were built from the old outputs
        (cfg.work / f"stage_{stage}.json").unlink(missing_ok=True)
    if redo and min(redo) == 0:
        for tokens in cfg.work.glob("tokens_*.pt"):  # tokenised with the old tokenizer
            tokens.unlink()
    if args.reuse_target is not None:
        reuse_target(cfg, args.reuse_target)
    metrics = run_pipeline(cfg)
    print(f"pair written to {cfg.pair} ({metrics['weight_megabytes']:.1f} MB of weights)")


if __name__ == "__main__":
    main()
