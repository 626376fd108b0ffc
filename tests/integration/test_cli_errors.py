"""A bad input to an entry point gets one line: what was wrong, which file or knob, what to do;
exit status 2 and no traceback (``HYDRA_FULL_ERROR=1`` brings it back). Each case is one a new
user met (issue 18). The scripts run in this process (the ``cli`` fixture of tests/conftest.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAIR = ROOT / "assets" / "pair"


def the_line(out) -> str:
    """The one error line; the run failed with status 2 and printed no traceback."""
    errors = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
    assert out.returncode == 2, out.stderr[-3000:]
    assert len(errors) == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    return errors[0]


@pytest.fixture
def main_job(cli, tmp_path):
    return lambda *args: cli("main.py", *args, "progress=false", "threads=1", f"hydra.run.dir={tmp_path / 'out'}",
                             cwd=tmp_path)


@pytest.fixture
def truncated_pair(tmp_path) -> Path:
    """The shipped pair, its DFlash drafter's weights cut short (the rest linked, not copied)."""
    pair = tmp_path / "pair"
    (pair / "dflash").mkdir(parents=True)
    for name in ("target", "mtp", "tokenizer", "heldout_prompts.jsonl"):
        (pair / name).symlink_to(PAIR / name)
    (pair / "dflash" / "config.json").symlink_to(PAIR / "dflash" / "config.json")
    (pair / "dflash" / "model.safetensors").write_bytes((PAIR / "dflash" / "model.safetensors").read_bytes()[:5000])
    return pair


def test_a_truncated_drafter_checkpoint_is_named_before_any_weights_load(truncated_pair, main_job):
    out = main_job(f"target.dir={truncated_pair}")
    line = the_line(out)
    assert str(truncated_pair / "dflash" / "model.safetensors") in line and "truncated" in line
    assert "HFTarget" not in out.stdout  # the target was not loaded


def test_max_new_tokens_0_is_refused_before_the_checkpoints_are_read(truncated_pair, main_job):
    line = the_line(main_job(f"target.dir={truncated_pair}", "max_new_tokens=0"))
    assert "max_new_tokens must be an integer >= 1, got 0" in line and "max_new_tokens=N" in line


def test_a_malformed_prompt_file_names_the_file_and_the_line(main_job, tmp_path):
    prompts = tmp_path / "mine.jsonl"
    prompts.write_text('{"prompt": "def f():"}\n{"prompt": "def g(\n')
    line = the_line(main_job("data=jsonl", f"data.path={prompts}"))
    assert f"{prompts}, line 2: not valid JSON" in line and '{"prompt": "..."}' in line


def test_data_jsonl_without_a_path_names_the_knob(main_job):
    line = the_line(main_job("data=jsonl"))
    assert "data.path is required" in line and "data.path=" in line


def test_a_budget_on_the_chain_config_points_at_the_tree_configs_not_at_plus(main_job):
    out = main_job("tree.budget=-1")
    line = the_line(out)
    assert "tree.budget is not a knob" in line and "tree=best_first" in line and "strategy_specs" in line
    assert "+tree.budget" not in out.stderr


def test_an_unknown_config_name_lists_the_options(cli, tmp_path):
    line = the_line(cli("run.py", "experiment=ddtre", f"hydra.run.dir={tmp_path}", cwd=tmp_path))
    assert "Could not find 'experiment/ddtre'" in line and "ddtree" in line


def test_a_run_that_decoded_nothing_fails(main_job, tmp_path):
    prompts = tmp_path / "long.jsonl"
    prompts.write_text(json.dumps({"prompt": "def f(x):\n    return x\n" * 8}) + "\n")
    out = main_job("data=jsonl", f"data.path={prompts}", "strategies=[ar]", "temperatures=[0]", "warmup_tokens=0",
                   "max_new_tokens=32", "target.model.max_length=40")
    line = the_line(out)
    assert "decoded nothing" in line and "max_new_tokens=32" in line


def test_make_tables_refuses_two_sweeps_mixed_in_one_line(cli, tmp_path):
    for sweep, tpot in (("limit2", 0.1), ("limit4", 0.2)):
        run = tmp_path / "multirun" / sweep / "experiment=dflash"
        run.mkdir(parents=True)
        (run / "run.json").write_text(json.dumps({"config": {}, "dataset": "humaneval", "model": "tiny", "parts": {
            "drafter": "DFlashDrafter", "tree": "ChainTreeBuilder", "budget": None, "temperature": 0.0}}))
        (run / "records.jsonl").write_text(json.dumps(
            {"key": "0:0", "index": 0, "turn": 0, "acceptance_lengths": [2], "tpot": tpot}) + "\n")
    line = the_line(cli("make_tables.py", "multirun/", "--no-plots", cwd=tmp_path))
    assert "two runs of one cell" in line and "hydra.sweep.dir=multirun/NAME" in line


def test_the_traceback_stays_with_hydra_full_error(cli, tmp_path):
    with pytest.raises(Exception, match="experiment/ddtre"):  # raised, not reported: Python prints the traceback
        cli("run.py", "experiment=ddtre", f"hydra.run.dir={tmp_path}", cwd=tmp_path, debug=True)


def test_a_target_directory_without_its_tokenizer_says_where_the_tokenizer_is(cli, tmp_path):
    out = cli("run.py", "target=hf", f"target.path={PAIR / 'target'}", f"hydra.run.dir={tmp_path}", cwd=tmp_path)
    line = the_line(out)
    assert f"{PAIR / 'target'} holds no tokenizer" in line and f"name_or_path={PAIR / 'tokenizer'}" in line
    assert " as HFTarget" not in out.stdout + out.stderr  # refused before the weights load
