"""The main job: every strategy on the shipped pairs, over prompt sets, at T = 0 and T = 1.

    python experiments/main.py                                      # assets/pair and assets/pair_hybrid
    python experiments/main.py '~pairs.pair'                        # the hybrid pair alone
    python experiments/main.py max_new_tokens=32 prompt_sets.humaneval.limit=2 prompt_sets.heldout.limit=2
    python experiments/main.py data=jsonl data.path=my_prompts.jsonl # your prompts instead
    python experiments/main.py target.dir=/path/to/pair              # another pair directory
    python experiments/main.py strategies='[ar,ddtree-64]' temperatures='[0]'
    python experiments/main.py "+strategy_specs.mtp-tree=['experiment=mtp_tree','tree.budget=16']"

Strategies are the presets of configs/experiment/ (``strategy_specs`` in configs/main.yaml says
which, with which knobs); each is composed exactly as ``experiments/run.py`` would compose it,
and all share one loaded target. The pairs (``pairs`` in configs/main.yaml: the Qwen3 pair, then
the Qwen3.5-layout hybrid pair) run one after the other; a ``target=``/``target.dir=`` override runs
that target alone. Every strategy decodes every prompt in turn; records go to
``outputs/main/<overrides>/<pair>/<set>/<strategy>_T<t>/`` (no ``<pair>/`` for a single target) in the
format ``make_tables.py`` reads, and a rerun of the same command resumes there. The tables give tau (mean acceptance length, bonus
included), tokens/s and the speedup over AR (mean TPOT ratio, decode time only).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig

from ddtree import presets
from ddtree.errors import NothingDecodedError, reported, run_cli
from ddtree.presets import run_comparison
from ddtree.eval.runner import RunSettings

presets.register_resolvers()


def selected_specs(cfg: DictConfig) -> dict[str, list[str]]:
    """``strategies`` (all of ``strategy_specs`` when null) -> their overrides, in that order."""
    names = list(cfg.strategies) if cfg.strategies else list(cfg.strategy_specs)
    unknown = [n for n in names if n not in cfg.strategy_specs]
    if unknown:
        raise ValueError(f"unknown strategies {unknown}: strategy_specs has {', '.join(cfg.strategy_specs)} "
                         "(add one with +strategy_specs.NAME=['experiment=PRESET',...])")
    return {name: list(cfg.strategy_specs[name]) for name in names}


def targets(cfg: DictConfig, overrides: list[str]) -> dict[str, list[str]]:
    """Each target to run -> the overrides that select it: ``pairs`` in turn, or the composed target
    alone when the command line sets one (``target=...`` or ``target.dir=...``) or ``pairs`` is empty."""
    if any(o.lstrip("+~").split("=")[0].split(".")[0] == "target" for o in overrides) or not cfg.get("pairs"):
        return {cfg.target.name: []}
    return {name: [f"target={name}", *([f"target.dir='{where}'"] if where else [])]
            for name, where in cfg.pairs.items()}


def run(cfg: DictConfig, out: Path, overrides: list[str]) -> int:
    torch.set_num_threads(cfg.threads)
    start = time.perf_counter()
    settings = RunSettings(max_new_tokens=cfg.max_new_tokens, seed=cfg.seed, warmup_tokens=cfg.warmup_tokens,
                           progress=cfg.progress, max_prompt_tokens=cfg.max_prompt_tokens,
                           accounting=instantiate(cfg.accounting), record_rounds=cfg.record_rounds)
    pairs, tables = targets(cfg, overrides), {}
    for i, (name, selection) in enumerate(pairs.items()):
        pair_overrides = [*selection, *overrides]
        pair_cfg = presets.compose(None, pair_overrides, "main") if selection else cfg
        sets = {pair_cfg.data.name: pair_cfg.data} if pair_cfg.get("data") is not None else dict(pair_cfg.prompt_sets)
        share = (cfg.max_seconds - (time.perf_counter() - start)) / (len(pairs) - i)  # unused time carries over
        results = run_comparison(selected_specs(cfg), cfg.temperatures, pair_overrides, sets,
                                 out / name if selection else out, settings, max_seconds=share, config_name="main")
        tables[name] = {k: [asdict(r) for r in v] for k, v in results.items()}
    (out / "tables.json").write_text(json.dumps(tables, indent=2) + "\n")  # pair -> prompt set -> rows
    print(f"\ntotal {time.perf_counter() - start:.1f}s; records and tables.json in {out}")
    if not any(r["responses"] for sets in tables.values() for rows in sets.values() for r in rows):
        raise NothingDecodedError(
            f"decoded nothing: every prompt was skipped as too long for the target's context with "
            f"max_new_tokens={cfg.max_new_tokens} (the warnings above name them); lower max_new_tokens or "
            f"max_prompt_tokens={cfg.max_prompt_tokens}")
    return 0


@hydra.main(version_base="1.3", config_path="../configs", config_name="main")
@reported
def main(cfg: DictConfig) -> int:
    return run(cfg, Path(HydraConfig.get().runtime.output_dir), list(HydraConfig.get().overrides.task))


if __name__ == "__main__":
    run_cli(main, knob_advice="main.py sets each strategy's knobs in strategy_specs, e.g. "
                              "'strategy_specs.ddtree-64=[experiment=ddtree,tree.budget=128]'")
