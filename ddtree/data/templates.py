"""The benchmark protocol's prompt templates: one source row in, the user turns out.

The text of every template is part of the protocol that the DDTree and DFlash papers report on
(their ``load_and_process_dataset``), so it is reproduced character for character: a changed
newline changes the prompt tokens, the target's outputs, and with them tau and the speedup.
Each function takes one row in the column layout of the dataset's Hugging Face hub copy.

    >>> gsm8k({"question": "What is 2 + 2?"})[0].splitlines()[0]
    'What is 2 + 2?'
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

Row = Mapping[str, Any]

# Math prompts end with the Qwen-style boxed-answer instruction (a literal "\boxed{}").
MATH_SUFFIX = "\nPlease reason step by step, and put your final answer within \\boxed{}."

HUMANEVAL_HEADER = "Write a solution to the following problem and make sure that it passes the tests:\n"

SWE_BENCH_HEADER = "Problem Statement:\n"
SWE_BENCH_FOOTER = "\nPlease fix the issue described above."

# LiveCodeBench's own code-generation prompt, folded into the user turn (no system message).
LCB_INSTRUCTION = (
    "You are an expert Python programmer. You will be given a question (problem specification) "
    "and will generate a correct Python program that matches the specification and passes all tests. "
    "You will NOT return anything except for the program"
)
LCB_FORMAT_STARTER = "### Format: Use the following code structure:"
LCB_FORMAT_FREE = "### Format: Write your code in the following format:"
LCB_FREE_CODE = "```python\n# YOUR CODE HERE\n```"
LCB_FOOTER = "### Answer: (use the provided format with backticks)"


def gsm8k(row: Row) -> tuple[str]:
    """openai/gsm8k: the question, then the boxed-answer instruction."""
    return (f"{row['question']}{MATH_SUFFIX}",)


def math_problem(row: Row) -> tuple[str]:
    """MATH-500, AIME 2024, AIME 2025: the ``problem`` column, then the boxed-answer instruction."""
    return (f"{row['problem']}{MATH_SUFFIX}",)


def humaneval(row: Row) -> tuple[str]:
    """openai/openai_humaneval: the function stub inside a python code fence."""
    return (f"{HUMANEVAL_HEADER}```python\n{row['prompt']}\n```",)


def humaneval_code(row: Row) -> tuple[str]:
    """HumanEval for base code models: the function stub alone, to be continued."""
    return (str(row["prompt"]),)


def mbpp(row: Row) -> tuple[str]:
    """MBPP sanitized: the task sentence as is (the tests are not shown)."""
    return (str(row["prompt"]),)


def livecodebench(row: Row) -> tuple[str]:
    """LiveCodeBench: instruction, question, a format block (starter code when there is one), footer."""
    starter = row.get("starter_code")
    if starter:
        fmt, code = LCB_FORMAT_STARTER, f"```python\n{starter}\n```"
    else:
        fmt, code = LCB_FORMAT_FREE, LCB_FREE_CODE
    question = f"### Question:\n{row['question_content']}"
    return (f"{LCB_INSTRUCTION}\n\n{question}\n\n{fmt}\n{code}\n\n{LCB_FOOTER}",)


def swe_bench(row: Row) -> tuple[str]:
    """SWE-bench Lite: the issue text between a header and a fix request (no repository context)."""
    return (f"{SWE_BENCH_HEADER}{row['problem_statement']}{SWE_BENCH_FOOTER}",)


def mt_bench(row: Row) -> tuple[str, ...]:
    """MT-Bench: the two user turns as they are; turn 2 is asked after the model's turn-1 reply."""
    return tuple(str(turn) for turn in row["prompt"])


def alpaca(row: Row) -> tuple[str]:
    """Alpaca: the instruction, plus an ``Input:`` block only when the row has an input."""
    if row.get("input"):
        return (f"{row['instruction']}\n\nInput:\n{row['input']}",)
    return (str(row["instruction"]),)


def user_jsonl(row: Row) -> tuple[str, ...]:
    """A user's own prompts: ``{"prompt": "..."}`` or ``{"text": "..."}`` (one turn), or
    ``{"turns": ["...", ...]}``."""
    turns = row.get("turns")
    if turns:
        return tuple(str(turn) for turn in turns)
    prompt = row.get("prompt") or row.get("text")
    if prompt is None or prompt == "":
        raise ValueError(
            f"a jsonl prompt row needs a 'prompt' (or 'text') string or a 'turns' list, got keys {sorted(row)}"
        )
    return (str(prompt),)
