"""The main job: every strategy on the shipped pair, over prompt sets, at T = 0 and T = 1.

    python experiments/main.py                                      # assets/pair, configs/main.yaml
    python experiments/main.py max_new_tokens=32 prompt_sets.humaneval.limit=2 prompt_sets.heldout.limit=2
    python experiments/main.py data=jsonl data.path=my_prompts.jsonl # your prompts instead
    python experiments/main.py target.dir=/path/to/pair              # another pair directory
    python experiments/main.py strategies='[ar,ddtree-64]' temperatures='[0]'
    python experiments/main.py "+strategy_specs.mtp-tree=['experiment=mtp_tree','tree.budget=16']"

Strategies are the presets of configs/experiment/ (``strategy_specs`` in configs/main.yaml says
which, with which knobs); each is composed exactly as ``experiments/run.py`` would compose it,
and all share one loaded target. Every strategy decodes every prompt in turn; records go to
``outputs/main/<overrides>/<set>/<strategy>_T<t>/`` in the format ``make_tables.py`` reads, and a
rerun of the same command resumes there. The tables give tau (mean acceptance length, bonus
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


def run(cfg: DictConfig, out: Path, overrides: list[str]) -> int:
    torch.set_num_threads(cfg.threads)
    start = time.perf_counter()
    sets = {cfg.data.name: cfg.data} if cfg.get("data") is not None else dict(cfg.prompt_sets)
    settings = RunSettings(max_new_tokens=cfg.max_new_tokens, seed=cfg.seed, warmup_tokens=cfg.warmup_tokens,
                           progress=cfg.progress, max_prompt_tokens=cfg.max_prompt_tokens)
    results = run_comparison(selected_specs(cfg), cfg.temperatures, overrides, sets, out, settings,
                             max_seconds=cfg.max_seconds, config_name="main")
    (out / "tables.json").write_text(json.dumps({k: [asdict(r) for r in v] for k, v in results.items()}, indent=2) + "\n")
    print(f"\ntotal {time.perf_counter() - start:.1f}s; records and tables.json in {out}")
    if not any(r.responses for rows in results.values() for r in rows):
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
