"""The pair pipeline's settings (configs/pipeline/) and what its app does before the stages run.

The stages themselves run end to end in tests/integration/test_training.py.
"""

import importlib.util
import sys
from pathlib import Path

import pytest

from ddtree import presets
from ddtree.training.loop import Budget
from ddtree.training.pair import METRICS, read_json, tiny_pair, write_json

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def app():
    """experiments/shipped_pair.py as a module (it imports its sibling pair_pipeline.py)."""
    spec = importlib.util.spec_from_file_location("shipped_pair", ROOT / "experiments" / "shipped_pair.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_default_is_the_committed_h200_build_and_smoke_shrinks_it(app, tmp_path):
    cfg = app.load_config([f"work={tmp_path}"])
    assert cfg.work == tmp_path and cfg.pair == tmp_path / "pair" and cfg.corpus == ROOT / ".corpus" / "stdlib.jsonl"
    assert cfg.assets == ROOT / "assets" / "pair" and cfg.continue_from is None and cfg.strategies is None
    assert cfg.stages == ("tokenizer", "target", "regenerate", "dflash", "mtp", "evaluate")
    assert cfg.target.hidden_size == 384 and cfg.lm.optim.lr == 2e-3 and cfg.dflash.optim.lr == 6e-4
    assert cfg.dflash_budget == Budget(max_steps=50_000, max_seconds=380) and cfg.temperatures == (0.0, 0.0, 0.0, 1.0)
    smoke = app.load_config([f"work={tmp_path}", "pipeline/preset=smoke", "assets=null", "dflash_budget.max_steps=3"])
    assert smoke.assets is None and smoke.target.vocab_size == 320 and smoke.target.num_hidden_layers == 4
    assert smoke.dflash_budget == Budget(max_steps=3) and smoke.mtp.depth == 2 and smoke.mtp.optim.lr == 1e-3
    assert smoke.strategies == ("ar", "mtp", "dflash", "ddtree-16")


def test_the_card_measures_the_main_jobs_strategies(app):
    pipeline = sys.modules["pair_pipeline"]
    main = presets.compose(None, [], "main").strategy_specs
    assert pipeline.strategy_specs(None) == {name: list(spec) for name, spec in main.items()}
    assert pipeline.strategy_specs(("ar", "ddtree-16")) == {"ar": ["experiment=ar"],
                                                           "ddtree-16": ["experiment=ddtree", "tree.budget=16"]}
    with pytest.raises(ValueError, match="unknown strategies"):
        pipeline.strategy_specs(("ddtree-7",))


@pytest.mark.parametrize(("change", "message"), [("docstring_fraction=1.5", "docstring_fraction is a share"),
                                                  ("temperatures=[0.0,-1.0]", "temperatures must be"),
                                                  ("stages=[target,drafter]", "unknown stages")])
def test_pipeline_config_refuses_bad_knobs(app, tmp_path, change, message):
    with pytest.raises(ValueError, match=message):
        app.load_config([f"work={tmp_path}", change])


def test_redo_forgets_a_stage_and_every_later_one(app, tmp_path):
    cfg = app.load_config([f"work={tmp_path}"])
    for name in ("tokenizer", "target", "regenerate", "dflash", "mtp", "evaluate"):
        write_json({}, tmp_path / f"stage_{name}.json")
    (tmp_path / "tokens_train.safetensors").write_bytes(b"")
    app.forget(cfg, ["mtp", "dflash"])
    assert sorted(p.name for p in tmp_path.glob("stage_*")) == [
        "stage_regenerate.json", "stage_target.json", "stage_tokenizer.json"]
    app.forget(cfg, [])
    assert (tmp_path / "tokens_train.safetensors").is_file()
    app.forget(cfg, ["tokenizer"])  # the token streams came from the old tokenizer
    assert not list(tmp_path.iterdir())
    with pytest.raises(ValueError, match="cannot redo unknown stages"):
        app.forget(cfg, ["drafter"])


def test_reuse_target_starts_a_work_directory_from_a_finished_pair(app, tmp_path):
    pair = tiny_pair(tmp_path / "pair")
    write_json({"target": {"parameters": 1, "heldout_perplexity": 9.0}, "tokenizer": {"vocab_size": 300},
                "environment": {"device": "CPU"}}, pair / METRICS)
    cfg = app.load_config([f"work={tmp_path / 'work'}", "device=cpu"])
    app.reuse_target(cfg, pair)
    assert (cfg.pair / "target" / "config.json").is_file() and (cfg.pair / "tokenizer" / "tokenizer.json").is_file()
    record = read_json(cfg.work / "stage_target.json")
    assert record["parameters"] == 1 and "heldout_perplexity" not in record and record["environment"] == {"device": "CPU"}
    assert read_json(cfg.work / "stage_tokenizer.json")["vocab_size"] == 300
    with pytest.raises(FileNotFoundError, match="holds no finished pair"):
        app.reuse_target(cfg, tmp_path / "nothing")
