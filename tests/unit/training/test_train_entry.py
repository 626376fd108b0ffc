"""The Hydra entry point: both train configs compose, bind, and train a drafter that reloads."""

import importlib.util
import inspect
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import get_method

from ddtree.models import DFlashDraftModel
from ddtree.models.mtp import MTPHead
from ddtree.training.pair import TARGET, load_pair, tiny_pair
from ddtree.training.sequences import SequenceSet

ROOT = Path(__file__).resolve().parents[3]
CONFIGS = ROOT / "configs" / "train"


def _entry():
    spec = importlib.util.spec_from_file_location("train_drafter", ROOT / "experiments" / "train_drafter.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _compose(name, *overrides):
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return compose(config_name=name, overrides=list(overrides))


@pytest.mark.parametrize("name", ["dflash", "mtp"])
def test_configs_bind_to_their_targets(name):
    cfg = _compose(name)
    for key in ("drafter", "fit", "train", "train.optim", "budget"):
        node = cfg
        for part in key.split("."):
            node = node[part]
        kwargs = {k: None for k in node if not k.startswith("_")}
        signature = inspect.signature(get_method(node["_target_"]))
        if node.get("_partial_"):
            signature.bind_partial(**kwargs)
        else:
            signature.bind(**kwargs)


@pytest.mark.parametrize("name,loader", [("dflash", DFlashDraftModel.from_pretrained), ("mtp", MTPHead.from_pretrained)])
def test_entry_trains_and_saves_a_loadable_drafter(tmp_path, name, loader):
    pair = tiny_pair(tmp_path / "pair")
    ids = torch.randint(3, 250, (8, 24), generator=torch.Generator().manual_seed(0))
    SequenceSet.from_tokens(ids, 4).save(tmp_path / "data.safetensors")
    overrides = [f"target={pair / TARGET}", f"data={tmp_path / 'data.safetensors'}", f"out={tmp_path / name}",
                 "budget.max_steps=3", "train.batch_size=4"]
    if name == "dflash":
        mask = load_pair(pair).tokenizer.mask_token_id
        overrides += [f"drafter.mask_token_id={mask}", "drafter.block_size=4", "drafter.num_layers=1",
                      "drafter.num_taps=2", "train.anchors=2"]
    drafter = _entry().train(_compose(name, *overrides))
    loaded = loader(tmp_path / name)
    for (key, a), (_, b) in zip(drafter.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), key
