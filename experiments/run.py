"""Run one strategy over one dataset's prompts under the papers' protocol; one record per response.

    python experiments/run.py                                           # AR, tiny random target, HumanEval
    python experiments/run.py experiment=ddtree drafter=dflash_random data.limit=4 max_new_tokens=64
    python experiments/run.py -m 'experiment=[paper_qwen3_8b,ddtree]' data=math500 temperature=0 \
        tree.budget=16,32,64,128,256,512,1024
    torchrun --nproc_per_node 8 experiments/run.py 'experiment=[paper_qwen3_8b,ddtree]' data=math500

The target and drafter load once per run (the target once per sweep process, while it does not
change); AR runs through the same loop as every other strategy. Records go to the Hydra run
directory as JSON lines (``ddtree.eval.records``): a rerun of the same command resumes there and
computes only the missing responses. Under ``torchrun``/``accelerate launch`` each rank takes
every WORLD_SIZE-th prompt and writes its own records file; ``make_tables.py`` gathers them.

A prompt longer than the target's context (with ``max_new_tokens``) is skipped with a warning
that names it; any other error stops the run.
"""

from __future__ import annotations

import gc
import json
import logging
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationToMissingValueError, MissingMandatoryValue

from ddtree import presets
from ddtree.errors import NothingDecodedError, reported, run_cli
from ddtree.eval import (
    RecordWriter,
    RunSettings,
    Shard,
    build_engine,
    check_run_dir,
    describe_parts,
    eos_stop_tokens,
    read_records,
    response_key,
    run_prompts,
    write_json,
)

log = logging.getLogger("run")
presets.register_resolvers()  # ${run_dirname:...} in configs/config.yaml, ${repo_path:...} in target=pair
run_dirname = presets.run_dirname

# Knobs that change no response: a rerun that differs only in these resumes the same run.
NOT_IDENTITY = ("stop_after", "progress", "record_rounds")

# The last target loaded, reused by the next job of a sweep while its config does not change.
_loaded: dict = {}


def identity(cfg: DictConfig) -> dict:
    """The resolved config that defines a run's responses (written to run.json, checked on resume)."""
    try:
        resolved = OmegaConf.to_container(cfg, resolve=True)
    except (MissingMandatoryValue, InterpolationToMissingValueError) as err:  # e.g. no DFlash checkpoint
        key = getattr(err, "full_key", "") or "a value"
        if not key.startswith(("drafter", "target.drafters")):  # other keys: the generic line of ddtree.errors
            raise
        raise ValueError(
            f"{str(err).splitlines()[0]} (needed by {key}). Set it on the "
            "command line, e.g. target.drafters.dflash=NAME_OR_DIR; tiny targets have no checkpoints: "
            "use drafter=dflash_random or drafter=mtp_random"
        ) from None
    for key in NOT_IDENTITY:
        resolved.pop(key, None)
    return resolved


def load_target(cfg: DictConfig):
    """The target adapter and its tokenizer, reusing the previous job's when the config matches."""
    key = json.dumps(OmegaConf.to_container(cfg.target, resolve=True), sort_keys=True)
    if _loaded.get("key") != key:
        _loaded.clear()
        gc.collect()  # free the previous target before the next one loads
        log.info("loading target %s", cfg.target.name)
        tokenizer = instantiate(cfg.target.tokenizer)  # before the weights: a missing tokenizer fails at once
        _loaded.update(key=key, target=instantiate(cfg.target.model), tokenizer=tokenizer)
        target = _loaded["target"]
        log.info("target %s as %s on %s%s", cfg.target.name, type(target).__name__, target.input_device,
                 " (CUDA graphs)" if getattr(target, "cuda_graphs", False) else "")
    return _loaded["target"], _loaded["tokenizer"]


def run(cfg: DictConfig, run_dir: Path):
    """Decode this rank's missing responses of the configured run into ``run_dir``."""
    shard = Shard.from_env()
    ident = identity(cfg)

    # 1. The cheap parts first: a bad knob (budget < 0, temperature < 0, max_new_tokens < 1) or an
    #    unreadable checkpoint fails before any weights load.
    settings = RunSettings(max_new_tokens=cfg.max_new_tokens, seed=cfg.seed, warmup_tokens=cfg.warmup_tokens,
                           stop_after=cfg.stop_after, progress=cfg.progress, accounting=instantiate(cfg.accounting),
                           record_rounds=cfg.record_rounds)
    tree, mask, verifier = instantiate(cfg.tree), instantiate(cfg.mask), instantiate(cfg.verifier)
    if float(getattr(verifier, "temperature", cfg.temperature)) != float(cfg.temperature):
        raise ValueError(
            f"{type(verifier).__name__} decodes at temperature {verifier.temperature:g} but temperature="
            f"{cfg.temperature}; use verifier=sampling"
        )
    prompts = instantiate(cfg.data)
    presets.check_files(cfg)

    # 2. Resume: what this rank still has to decode.
    check_run_dir(run_dir, ident)
    done = read_records(run_dir)
    pending = [key for prompt in shard.select(prompts) for turn in range(len(prompt.turns))
               if (key := response_key(prompt.index, turn)) not in done]
    if not pending:
        log.info("%s: all responses of rank %d are recorded; nothing to do", run_dir, shard.rank)
        return None

    # 3. Weights, the engine, and the run's description (what the tables group by).
    cfg.device = shard.device(cfg.device)
    target, tokenizer = load_target(cfg)
    engine = build_engine(target, instantiate(cfg.drafter), tree, mask, verifier, eos_stop_tokens(tokenizer),
                          tokenizer=tokenizer)
    write_json(run_dir / "run.json", {"config": ident, "parts": describe_parts(engine), "preset": cfg.strategy,
                                      "model": cfg.target.name,
                                      "dataset": cfg.data.name, "world_size": shard.world_size})
    log.info("%s: %d responses recorded, %d of this rank's to decode", run_dir, len(done), len(pending))
    with RecordWriter(run_dir / shard.records_name) as writer:
        summary = run_prompts(engine, tokenizer, prompts, writer, done, settings, shard)
    log.info("%s: computed %d, reused %d, skipped %d%s", run_dir, summary.computed, summary.reused,
             len(summary.skipped), " (stopped early: stop_after)" if summary.stopped_early else "")
    for reason in summary.skipped:
        log.warning("skipped %s", reason)
    if summary.skipped and not (summary.computed or summary.reused):
        raise NothingDecodedError(
            f"{run_dir}: decoded nothing, every prompt was skipped ({summary.skipped[0]}); shorten the prompts "
            f"or lower max_new_tokens={cfg.max_new_tokens}")
    return summary


@hydra.main(version_base="1.3", config_path="../configs", config_name="config")
@reported
def main(cfg: DictConfig) -> None:
    run(cfg, Path(HydraConfig.get().runtime.output_dir))


if __name__ == "__main__":
    run_cli(main)
