"""The prompt text of every benchmark, character for character, and the registry's protocol table.

Expected strings are written out in full rather than built from ``ddtree.data.templates``: they
pin the protocol's text, so a template edit that changes a single newline fails here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ddtree.data import DATASETS, Prompt, load_prompts
from ddtree.data.templates import HUMANEVAL_HEADER

BOXED = "\nPlease reason step by step, and put your final answer within \\boxed{}."

LCB_HEAD = (
    "You are an expert Python programmer. You will be given a question (problem specification) and "
    "will generate a correct Python program that matches the specification and passes all tests. "
    "You will NOT return anything except for the program\n\n### Question:\n"
)

# name, fixture (file or hub-layout folder), row position, expected id, expected turns
CASES = [
    ("gsm8k", "gsm8k", 0, "0",
     ("Mira has 3 apples and buys 4 more. How many apples does she have?" + BOXED,)),
    ("math500", "math500.jsonl", 0, "test/prealgebra/101.json",
     ("Compute $\\frac{6}{3} + 1$." + BOXED,)),
    ("aime24", "aime24.jsonl", 0, "60",
     ("Let $n$ be the least positive integer with $n^2 \\equiv 1 \\pmod{8}$ and $n > 1$. Find $n$."
      + BOXED,)),
    ("aime25", "aime25.jsonl", 1, "2",
     ("How many ways can $4$ books be ordered on a shelf?" + BOXED,)),
    ("humaneval", "humaneval.jsonl", 0, "HumanEval/0",
     ("Write a solution to the following problem and make sure that it passes the tests:\n"
      "```python\n\n\ndef add_one(x: int) -> int:\n    \"\"\" Return x plus one.\n    >>> add_one(1)\n"
      "    2\n    \"\"\"\n\n```",)),
    ("mbpp", "mbpp", 0, "11",
     ("Write a python function to count the vowels in a string.",)),
    ("livecodebench", "livecodebench.jsonl", 0, "abc001_a",
     (LCB_HEAD + "Given two integers A and B, print A+B.\n\nInput\n\nA B\n\n"
      "### Format: Write your code in the following format:\n```python\n# YOUR CODE HERE\n```\n\n"
      "### Answer: (use the provided format with backticks)",)),
    ("livecodebench", "livecodebench.jsonl", 1, "9001",
     (LCB_HEAD + "Return the largest element of nums.\n\n"
      "### Format: Use the following code structure:\n```python\nclass Solution:\n"
      "    def largest(self, nums: List[int]) -> int:\n        \n```\n\n"
      "### Answer: (use the provided format with backticks)",)),
    ("swe-bench", "swe_bench", 0, "example__widgets-101",
     ("Problem Statement:\nWidget.size() returns 0 for a new widget\nIt should return 1.\n"
      "\nPlease fix the issue described above.",)),
    ("mt-bench", "mt_bench.json", 0, "10001",
     ("Write a two-line poem about rain.", "Now rewrite it so every word starts with R.")),
    ("alpaca", "alpaca.jsonl", 0, "0",
     ("Give three tips for staying focused.",)),
    ("alpaca", "alpaca.jsonl", 1, "1",
     ("Translate the sentence to French.\n\nInput:\nThe cat sleeps.",)),
]


@pytest.mark.parametrize(("name", "fixture", "position", "ident", "turns"), CASES)
def test_prompt_text_matches_protocol(
    fixtures: Path, name: str, fixture: str, position: int, ident: str, turns: tuple[str, ...]
) -> None:
    prompts = load_prompts(name, path=fixtures / fixture)
    assert all(isinstance(p, Prompt) and p.dataset == name for p in prompts)
    prompt = prompts[position]
    assert prompt.id == ident
    assert prompt.index == position  # fewer rows than the protocol count: source order, no shuffle
    assert prompt.turns == turns


def test_metadata_stays_out_of_the_prompt(fixtures: Path) -> None:
    gsm8k = load_prompts("gsm8k", path=fixtures / "gsm8k")[0]
    assert gsm8k.reference == ("3 + 4 = <<3+4=7>>7\n#### 7",)
    assert "####" not in gsm8k.turns[0]
    mt = load_prompts("mt-bench", path=fixtures / "mt_bench.json")
    assert [p.reference for p in mt] == [(), ("56", "14")]
    assert [p.category for p in mt] == ["writing", "math"]
    assert load_prompts("aime25", path=fixtures / "aime25.jsonl")[0].reference == ("28",)
    lcb = load_prompts("livecodebench", path=fixtures / "livecodebench.jsonl")
    assert [p.category for p in lcb] == ["easy", "medium", "hard"]
    assert lcb[0].reference == ()  # hidden tests are not a reference answer


def test_hub_layout_folders_pick_one_config_and_one_split(fixtures: Path) -> None:
    # gsm8k/ also holds socratic/test.jsonl; swe_bench/data/ also holds a dev split.
    assert len(load_prompts("gsm8k", path=fixtures / "gsm8k")) == 3
    assert [p.id for p in load_prompts("swe-bench", path=fixtures / "swe_bench")] == [
        "example__widgets-101",
        "example__gadgets-7",
    ]
    dev = load_prompts("swe-bench", split="dev", path=fixtures / "swe_bench")
    assert [p.turns[0] for p in dev] == [
        "Problem Statement:\nA dev-split issue\nPlease fix the issue described above."
    ]


PROTOCOL = {  # name: (hub id, config, split, Table 2 count)
    "gsm8k": ("openai/gsm8k", "main", "test", 128),
    "math500": ("HuggingFaceH4/MATH-500", None, "test", 128),
    "aime24": ("HuggingFaceH4/aime_2024", None, "train", 30),
    "aime25": ("MathArena/aime_2025", None, "train", 30),
    "humaneval": ("openai/openai_humaneval", None, "test", 164),
    "mbpp": ("google-research-datasets/mbpp", "sanitized", "test", 128),
    "livecodebench": ("livecodebench/code_generation_lite", None, "test", 128),
    "swe-bench": ("princeton-nlp/SWE-bench_Lite", None, "test", 128),
    "mt-bench": ("HuggingFaceH4/mt_bench_prompts", None, "train", 80),
    "alpaca": ("tatsu-lab/alpaca", None, "train", 128),
}


def table_of(name: str) -> tuple:
    spec = DATASETS[name]
    return spec.hub_id, spec.config, spec.split, spec.count


def test_registry_matches_the_paper_protocol() -> None:
    table = {
        name: (spec.hub_id, spec.config, spec.split, spec.count)
        for name, spec in DATASETS.items()
        if name not in ("jsonl", "humaneval-code")  # a user's file; HumanEval's rows as bare stubs
    }
    assert table == PROTOCOL
    assert table_of("humaneval-code") == PROTOCOL["humaneval"]  # the same rows, so the same subset
    assert DATASETS["livecodebench"].hub_files == tuple(
        f"test{suffix}.jsonl" for suffix in ("", "2", "3", "4", "5", "6")
    )


def test_humaneval_code_is_the_protocol_subset_without_header_and_fence() -> None:
    fenced = load_prompts("humaneval", limit=4)
    bare = load_prompts("humaneval-code", limit=4)
    assert [p.id for p in bare] == [p.id for p in fenced]
    for f, b in zip(fenced, bare):
        assert f.turns[0] == f"{HUMANEVAL_HEADER}```python\n{b.turns[0]}\n```"
