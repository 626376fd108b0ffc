"""Train a drafter (DFlash or MTP) on a frozen target: a thin Hydra entry over ``ddtree.training``.

    python experiments/train_drafter.py target=assets/pair/target data=DIR/regenerated.safetensors out=/tmp/dflash
    python experiments/train_drafter.py --config-name mtp target=... data=... out=/tmp/mtp budget.max_steps=500

Configs: ``configs/train/{dflash,mtp}.yaml``. The drafter is built by ``drafter`` (called with
the target model), trained by ``fit`` with ``train`` and ``budget``, and saved in the layout its
decoding side loads (``DFlashDraftModel.from_pretrained`` / ``MTPHead.from_pretrained``). The
pair pipeline's dflash and mtp stages (``experiments/pair_pipeline.py``) call the same functions.
"""

from __future__ import annotations

from pathlib import Path

import hydra
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig
from transformers import AutoModelForCausalLM

from ddtree.errors import reported, run_cli
from ddtree.training.sequences import SequenceSet

CONFIGS = str(Path(__file__).resolve().parents[1] / "configs" / "train")


def train(cfg: DictConfig):
    """Build, train and save the drafter ``cfg`` describes; returns it (eval mode)."""
    model = AutoModelForCausalLM.from_pretrained(cfg.target, attn_implementation="sdpa", use_safetensors=True).to(cfg.device).eval()
    data = SequenceSet.load(cfg.data)
    drafter = instantiate(cfg.drafter)(model).to(cfg.device, torch.float32)  # float32 master weights
    result = instantiate(cfg.fit)(drafter, model, data, instantiate(cfg.train, _convert_="all"),
                                  instantiate(cfg.budget))
    drafter.to(getattr(torch, cfg.dtype)).save_pretrained(Path(cfg.out))
    print(f"{result.steps} steps, {result.seconds:.1f}s, final loss {result.losses[-1]:.4f} -> {cfg.out}")
    return drafter


@hydra.main(config_path=CONFIGS, config_name="dflash", version_base="1.3")
@reported
def main(cfg: DictConfig) -> None:
    train(cfg)


if __name__ == "__main__":
    run_cli(main)
