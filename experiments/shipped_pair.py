"""Train the shipped pair, stage by stage, in one process: a Hydra app over ``pair_pipeline.py``.

    python experiments/shipped_pair.py work=/tmp/pair_work                     # every stage, H200 sizes
    python experiments/shipped_pair.py work=W 'stages=[evaluate]' device=cpu tau_seconds=300   # the card
    python experiments/shipped_pair.py work=W pipeline/preset=smoke device=cpu assets=null     # toy size

Settings: ``configs/pipeline/shipped_pair.yaml`` (every knob, at the committed build's sizes) and
``configs/pipeline/preset/smoke.yaml``; any of them on the command line, e.g.
``dflash_budget.max_seconds=330 regen_prompts=16384``. Stages: tokenizer, target, regenerate,
dflash, mtp, evaluate. A finished stage leaves ``stage_<name>.json`` in the work directory and is
skipped on the next run; ``redo=[dflash]`` names stages to run again (with every stage after them,
since those were built from the old outputs). ``reuse_target=assets/pair`` starts from a finished
pair's tokenizer and target, so that only the drafters are trained again; ``continue_from=assets/pair``
starts those drafters from that pair's weights instead of fresh ones (with ``seed=1``, on newly
drawn prompts). The pair lands in ``<work>/pair``; ``make_shipped_pair.sh`` packs it. Hydra keeps
the working directory and writes nothing of its own.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable, Sequence

import hydra
import torch
import transformers
from omegaconf import DictConfig, OmegaConf

from ddtree import presets
from ddtree.errors import reported, run_cli

if str(Path(__file__).resolve().parent) not in sys.path:  # loaded by path (tests): find the sibling
    sys.path.append(str(Path(__file__).resolve().parent))
from pair_pipeline import STAGES, PipelineConfig, reuse_target, run_pipeline  # noqa: E402

CONFIG = "pipeline/shipped_pair"  # in configs/
APP_KEYS = ("redo", "reuse_target")  # what the app does before the stages, not settings of the run

presets.register_resolvers()


def compose(overrides: Sequence[str] = ()) -> DictConfig:
    """The app's config with command-line style ``overrides``, from Python (tests, notebooks)."""
    return presets.compose(None, overrides, CONFIG)


def from_config(cfg: DictConfig) -> PipelineConfig:
    """The ``PipelineConfig`` of a composed config: its ``_target_`` nodes built, paths made Paths."""
    from hydra.utils import instantiate

    values = {k: v for k, v in OmegaConf.to_container(cfg, resolve=True).items() if k not in APP_KEYS}
    values = {k: instantiate(v, _convert_="all") if isinstance(v, dict) else v for k, v in values.items()}
    return PipelineConfig(**{
        **values, "corpus": Path(values["corpus"]), "work": Path(values["work"]),
        **{k: Path(values[k]) if values[k] else None for k in ("assets", "continue_from")},
        "device": values["device"] or ("cuda" if torch.cuda.is_available() else "cpu"),
        "stages": tuple(values["stages"]), "temperatures": tuple(values["temperatures"]),
        "strategies": tuple(values["strategies"]) if values["strategies"] else None,
        "dflash_tap_layers": tuple(values["dflash_tap_layers"]) if values["dflash_tap_layers"] else None,
    })


def load_config(overrides: Sequence[str] = ()) -> PipelineConfig:
    """``from_config(compose(overrides))``: one run's settings."""
    return from_config(compose(overrides))


def forget(cfg: PipelineConfig, stages: Sequence[str]) -> None:
    """Delete the records of ``stages`` and of every stage after them, so the next run does them again."""
    unknown = [s for s in stages if s not in STAGES]
    if unknown:
        raise ValueError(f"cannot redo unknown stages {unknown}; choose from {STAGES}")
    first = min((STAGES.index(s) for s in stages), default=len(STAGES))
    for stage in STAGES[first:]:
        (cfg.work / f"stage_{stage}.json").unlink(missing_ok=True)
    if first == 0:
        for tokens in cfg.work.glob("tokens_*.safetensors"):  # tokenised with the old tokenizer
            tokens.unlink()


def run(cfg: DictConfig, log: Callable[[str], None] = print) -> dict:
    """Forget the stages ``cfg.redo`` names, start from ``cfg.reuse_target`` if set, run the stages."""
    pipeline = from_config(cfg)
    forget(pipeline, list(cfg.redo or ()))
    if cfg.reuse_target:
        reuse_target(pipeline, Path(cfg.reuse_target))
    metrics = run_pipeline(pipeline, log)
    log(f"pair written to {pipeline.pair} ({metrics['weight_megabytes']:.1f} MB of weights)")
    return metrics


@hydra.main(version_base="1.3", config_path="../configs", config_name=CONFIG)
@reported
def main(cfg: DictConfig) -> None:
    transformers.utils.logging.disable_progress_bar()  # one line per stage event, not per shard
    run(cfg)


if __name__ == "__main__":
    run_cli(main)
