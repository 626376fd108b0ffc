"""Every config composes, and every ``_target_`` binds to its signature, without loading weights."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import MissingConfigException
from omegaconf import OmegaConf

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
GROUPS = ("target", "drafter", "tree", "mask", "verifier", "data", "accounting", "experiment")
STRATEGIES = ("ar", "mtp", "dflash", "ddtree")
PAIRS = ("paper_qwen3_4b", "paper_qwen3_8b", "paper_qwen3_coder_30b")
HYDRA_KEYS = {"_target_", "_partial_", "_recursive_", "_convert_", "_args_"}
NEEDS_MTP = {"drafter=mtp", "drafter=mtp_random", "experiment=mtp"}


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONFIGS / group).glob("*.yaml"))


def composed(*overrides: str):
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def resolve_target(path: str):
    """The object a ``_target_`` names (module attribute, or a classmethod of a class in it)."""
    module, _, name = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except ModuleNotFoundError:
        owner, _, cls = module.rpartition(".")
        return getattr(getattr(importlib.import_module(owner), cls), name)


def bind_all(node, where: str = "") -> list[str]:
    """Bind every ``_target_`` node's keys to its signature; partials must accept ``target=``."""
    bound = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key not in HYDRA_KEYS:
                bound += bind_all(value, f"{where}.{key}" if where else key)
        if "_target_" in node:
            fn = resolve_target(node["_target_"])
            kwargs = {k: None for k in node if k not in HYDRA_KEYS}
            signature = inspect.signature(fn)
            if node.get("_partial_"):
                # the builder calls drafter factories with target= (ddtree.eval.build.bind_drafter)
                signature.bind(**kwargs, target=None)
            else:
                signature.bind(**kwargs)
            bound.append(f"{where or '<root>'} -> {node['_target_']}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            bound += bind_all(value, f"{where}[{i}]")
    return bound


CASES = [f"{g}={o}" for g in GROUPS for o in options(g)] + [f"experiment=[{p},{s}]" for p in PAIRS for s in STRATEGIES]


@pytest.mark.parametrize("override", CASES)
def test_every_config_composes_and_binds(override: str) -> None:
    if override in NEEDS_MTP or override.endswith(",mtp]"):
        pytest.importorskip("ddtree.models.mtp", reason="the MTP head (ddtree.models.mtp) is not written yet")
    cfg = composed(override)
    tree = OmegaConf.to_container(cfg, resolve=False)  # values may be ??? (a checkpoint to supply)
    bound = bind_all(tree)
    for group in ("target.model", "target.tokenizer", "drafter", "tree", "mask", "verifier", "data", "accounting"):
        assert any(b.startswith(f"{group} ->") for b in bound), (group, bound)


def test_the_groups_and_presets_the_issue_asks_for() -> None:
    assert {"tiny_qwen3", "tiny_llama", "qwen3_4b", "qwen3_8b", "qwen3_coder_30b"} <= set(options("target"))
    assert {"none", "dflash", "dflash_random", "oracle", "mtp"} <= set(options("drafter"))
    assert set(STRATEGIES) | set(PAIRS) <= set(options("experiment"))
    from ddtree.data import DATASETS

    assert set(options("data")) == set(DATASETS)
    for option in options("data"):
        assert composed(f"data={option}").data.name == option


def test_strategies_choose_drafter_and_tree() -> None:
    expect = {"ar": ("NullDrafter", "ChainTreeBuilder"), "dflash": ("DFlashDrafter", "ChainTreeBuilder"),
              "ddtree": ("DFlashDrafter", "BestFirstTreeBuilder"), "mtp": ("MTPDrafter", "ChainTreeBuilder")}
    for strategy, (drafter, tree) in expect.items():
        cfg = composed(f"experiment={strategy}")
        assert cfg.drafter._target_.endswith(drafter) and cfg.tree._target_.endswith(tree)


def test_paper_pairs_match_the_published_pairs() -> None:
    from ddtree.eval import load_paper_numbers

    pairs = load_paper_numbers()["pairs"]
    for preset in PAIRS:
        cfg = composed(f"experiment=[{preset},ddtree]")
        assert pairs[cfg.target.name] == {"target": cfg.target.path, "dflash": cfg.target.drafters.dflash}
        # block_size null: the drafter checkpoint's own (16 for the paper's b16 drafters)
        assert (cfg.dtype, cfg.block_size, cfg.drafter.block_size, cfg.max_new_tokens) == ("bfloat16", None, None, 2048)
        assert cfg.drafter.model.name_or_path == cfg.target.drafters.dflash  # the pair's drafter is the one loaded


def test_shared_knobs_interpolate_from_one_place() -> None:
    cfg = composed("experiment=ddtree", "drafter=dflash_random", "temperature=0.7", "block_size=8",
                   "dtype=bfloat16", "seed=3", "device=cuda")
    assert cfg.verifier.temperature == 0.7
    assert (cfg.drafter.block_size, cfg.drafter.seed) == (8, 3)
    assert cfg.target.model.model.dtype.name == "bfloat16"
    assert cfg.device_map == "cuda"
    real = composed("experiment=[paper_qwen3_8b,ddtree]", "dtype=float16")
    assert real.drafter.model.dtype.name == real.target.model.model.dtype == "float16"


def test_tiny_configs_instantiate_without_downloads() -> None:
    from hydra.utils import instantiate

    from ddtree.eval import bind_drafter

    cfg = composed("experiment=ddtree", "drafter=dflash_random", "tree.budget=8")
    target, tokenizer = instantiate(cfg.target.model), instantiate(cfg.target.tokenizer)
    assert max(tokenizer.encode("Hello, world!\n", add_special_tokens=False)) < target.vocab_size
    assert tokenizer.eos_token_id is not None
    drafter = bind_drafter(instantiate(cfg.drafter), target)
    assert cfg.block_size is None and drafter.block_size == 8  # null: the random drafter's default
    assert instantiate(cfg.tree).budget == 8
    oracle = bind_drafter(instantiate(composed("drafter=oracle").drafter), target)
    assert oracle.depth == 7


@pytest.mark.parametrize(("override", "option", "available"), [
    ("experiment=nope", "experiment/nope", ["ar", "ddtree", "dflash", "paper_qwen3_8b"]),
    ("tree=bestfirst", "tree/bestfirst", ["best_first", "chain"]),
])
def test_unknown_option_names_it_and_lists_the_available_ones(override, option, available) -> None:
    with pytest.raises(MissingConfigException) as info:
        composed(override)
    message = str(info.value)
    assert f"Could not find '{option}'" in message
    listed = message.split("Available options", 1)[1]
    assert all(f"\t{name}\n" in listed for name in available), message


def test_configs_never_reach_for_hydra_inside_the_library() -> None:
    # The parts never read a config; ddtree.presets (behind ddtree.load) is the one door to the presets.
    library = Path(__file__).resolve().parents[2] / "ddtree"
    offenders = [str(p.relative_to(library)) for p in library.rglob("*.py")
                 if "import hydra" in p.read_text() or "from hydra" in p.read_text()]
    assert offenders == ["presets.py"], offenders


def test_the_real_loaders_read_local_checkpoints(tmp_path) -> None:
    """target=hf and drafter=dflash load from local directories the way hub names would load."""
    import torch
    from hydra.utils import instantiate

    from ddtree.eval import build_engine, eos_stop_tokens
    from ddtree.testing import tiny_dflash, tiny_target, tiny_tokenizer

    model = tiny_target("llama")
    model.save_pretrained(tmp_path / "target")
    tiny_tokenizer().save_pretrained(tmp_path / "target")
    tiny_dflash(model, block_size=4).save_pretrained(tmp_path / "dflash")
    cfg = composed("target=hf", f"target.path={tmp_path / 'target'}", f"target.drafters.dflash={tmp_path / 'dflash'}",
                   "experiment=ddtree", "tree.budget=6", "block_size=4")
    target, tokenizer = instantiate(cfg.target.model), instantiate(cfg.target.tokenizer)
    assert target.config.architectures == ["LlamaForCausalLM"] and cfg.target.name == str(tmp_path / "target")
    engine = build_engine(target, instantiate(cfg.drafter), instantiate(cfg.tree), instantiate(cfg.mask),
                          instantiate(cfg.verifier), eos_stop_tokens(tokenizer))
    ids = tokenizer.encode("Hello", add_special_tokens=False)
    reference = model.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False, eos_token_id=None)[0, len(ids):]
    result = engine.generate(ids, max_new_tokens=8)
    assert result.tokens == reference.tolist()[: len(result.tokens)]  # lossless at T = 0
